"""Plans that move existing replicas (kafka-reassign-partitions.sh --generate, and draining
a broker): pure, deterministic functions from the current assignment to a target one.

Kafka's ``--generate`` assigns every topic afresh at random and so moves nearly every
replica; :func:`propose_reassignment` keeps what already fits and moves as few replicas as
it takes to balance the brokers, which is what an operator growing a cluster wants. Both
plans respect racks when every broker has one: a partition's replicas use as many racks
as its replication factor allows, at most ``ceil(RF / racks)`` on one rack.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence

from kclient.errors import InvalidReplicaAssignmentError, InvalidReplicationFactorError

TopicPartition = tuple[str, int]
Plan = dict[TopicPartition, list[int]]

RACKS_INCOMPLETE = (
    "Not all brokers have rack information. Add --disable-rack-aware in command line to make replica "
    "assignment without rack information."
)


def _rack_map(brokers: Sequence[int], racks: Mapping[int, str | None] | None) -> dict[int, str]:
    """Each broker's rack, or {} for a rack-unaware plan; a partial map is an error (Kafka's)."""
    if not racks:
        return {}
    known = {b: racks.get(b) for b in brokers}
    if all(r is None for r in known.values()):
        return {}
    if any(r is None for r in known.values()):
        raise InvalidReplicaAssignmentError(RACKS_INCOMPLETE)
    return {b: r for b, r in known.items() if r is not None}


class _Racks:
    """The rack rule: at most ``ceil(RF / racks)`` replicas of a partition on one rack."""

    def __init__(self, rack_of: Mapping[int, str]) -> None:
        self.rack_of = rack_of
        self.count = len(set(rack_of.values()))

    def allows(self, replicas: Sequence[int], broker: int, rf: int) -> bool:
        if not self.count:
            return True
        rack = self.rack_of[broker]
        cap = -(-rf // self.count)
        return sum(1 for b in replicas if self.rack_of[b] == rack) < cap

    def valid(self, replicas: Sequence[int]) -> bool:
        return all(self.allows(replicas[:i], b, len(replicas)) for i, b in enumerate(replicas))


def propose_reassignment(
    current: Mapping[TopicPartition, Sequence[int]],
    brokers: Sequence[int],
    racks: Mapping[int, str | None] | None = None,
) -> Plan:
    """A balanced target for ``current`` over ``brokers``: every broker holds
    floor or ceil of (replicas / brokers) replicas, preferred leaders spread alike, each
    partition keeps its replication factor, and replicas already on a broker of the list
    stay where they are unless balance or the rack rule needs them elsewhere."""
    ids = sorted(brokers)
    if not ids:
        raise InvalidReplicaAssignmentError("the broker list is empty")
    if len(set(ids)) != len(ids):
        raise InvalidReplicaAssignmentError(f"duplicate broker ids in {list(brokers)}")
    rules = _Racks(_rack_map(ids, racks))
    for replicas in current.values():
        if len(replicas) > len(ids):
            raise InvalidReplicationFactorError(
                f"Replication factor: {len(replicas)} larger than available brokers: {len(ids)}."
            )
    live = set(ids)
    plan: Plan = {}
    load: Counter[int] = Counter({b: 0 for b in ids})
    for tp in sorted(current):  # keep what fits
        rf = len(current[tp])
        kept: list[int] = []
        for b in current[tp]:
            if b in live and b not in kept and rules.allows(kept, b, rf):
                kept.append(b)
        plan[tp] = kept
        load.update(kept)
    for tp in sorted(current):  # fill the gaps on the least loaded brokers
        reps, rf = plan[tp], len(current[tp])
        while len(reps) < rf:
            free = [b for b in ids if b not in reps]
            fitting = [b for b in free if rules.allows(reps, b, rf)] or free
            b = min(fitting, key=lambda x: (load[x], x))
            reps.append(b)
            load[b] += 1
    for _ in range(sum(load.values())):  # shed from the most to the least loaded, one at a time
        most = max(ids, key=lambda x: (load[x], -x))
        least = min(ids, key=lambda x: (load[x], x))
        if load[most] - load[least] <= 1:  # every broker at floor or ceil of the mean
            break
        for tp in sorted(plan):
            reps = plan[tp]
            if most in reps and least not in reps:
                trial = [least if b == most else b for b in reps]
                if rules.valid(trial):
                    plan[tp] = trial
                    load[most] -= 1
                    load[least] += 1
                    break
        else:
            break
    leads: Counter[int] = Counter()
    for tp in sorted(plan):  # preferred leaders: the fewest so far, else keep the current one
        reps = plan[tp]
        first = current[tp][0] if current[tp] else -1
        leader = min(reps, key=lambda x: (leads[x], x != first, x))
        reps.remove(leader)
        reps.insert(0, leader)
        leads[leader] += 1
    _even_out_leaders(plan, ids, leads)
    return plan


def _even_out_leaders(plan: Plan, ids: Sequence[int], leads: Counter[int]) -> None:
    """Move preferred leaderships from the brokers with the most to those with at least two
    fewer, along a chain of partitions (X leads one where Y follows, Y leads one where Z
    follows, ...), until the counts differ by at most one or no chain is left."""
    by_leader: dict[int, list[TopicPartition]] = {}
    for tp in sorted(plan):
        by_leader.setdefault(plan[tp][0], []).append(tp)
    for _ in range(len(plan)):
        top = max(leads[b] for b in ids)
        if top - min(leads[b] for b in ids) <= 1:
            return
        came_from: dict[int, tuple[int, TopicPartition] | None] = {b: None for b in ids if leads[b] == top}
        queue = deque(came_from)
        end = None
        while queue and end is None:
            x = queue.popleft()
            for tp in by_leader.get(x, ()):
                for y in plan[tp][1:]:
                    if y not in came_from:
                        came_from[y] = (x, tp)
                        queue.append(y)
                        if leads[y] <= top - 2:
                            end = y
                            break
                if end is not None:
                    break
        if end is None:
            return
        y = end
        step = came_from[y]
        while step is not None:
            x, tp = step
            plan[tp].remove(y)
            plan[tp].insert(0, y)
            by_leader[x].remove(tp)
            by_leader.setdefault(y, []).append(tp)
            y, step = x, came_from[x]
        leads[end] += 1
        leads[y] -= 1


def plan_decommission(
    current: Mapping[TopicPartition, Sequence[int]],
    leaving: int,
    live: Mapping[int, str | None],
) -> Plan:
    """Targets for every partition with a replica on ``leaving``: that replica replaced in
    place (so a preferred leader stays first) by a live broker outside the set — on the
    same rack when racks are known and one is free there, else on a rack the set does not
    use yet — choosing the least loaded (replicas, then leaderships for a first replica,
    then id). Partitions without ``leaving`` are not in the plan. ``live`` maps each live
    broker to its rack (or None)."""
    others = sorted(b for b in live if b != leaving)
    rack_of = _rack_map(others, live)
    leaving_rack = live.get(leaving) if rack_of else None
    load: Counter[int] = Counter({b: 0 for b in others})
    leads: Counter[int] = Counter()
    for replicas in current.values():
        load.update(b for b in replicas if b in load)
        if replicas and replicas[0] in load:
            leads[replicas[0]] += 1
    plan: Plan = {}
    for tp in sorted(current):
        reps = list(current[tp])
        if leaving not in reps:
            continue
        i = reps.index(leaving)
        free = [b for b in others if b not in reps]
        if not free:
            raise InvalidReplicationFactorError(
                f"cannot move {tp[0]}-{tp[1]} off broker {leaving}: every other live broker already holds it"
            )
        if rack_of:
            used = {rack_of[b] for b in reps if b in rack_of}
            same = [b for b in free if rack_of[b] == leaving_rack]
            new_rack = [b for b in free if rack_of[b] not in used]
            free = same or new_rack or free
        b = min(free, key=lambda x: (load[x], leads[x] if i == 0 else 0, x))
        reps[i] = b
        load[b] += 1
        if i == 0:
            leads[b] += 1
        plan[tp] = reps
    return plan
