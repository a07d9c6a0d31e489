"""Partition reassignment (Kafka's KIP-455 algorithm, ZooKeeper era): pure planning and
the controller's state machine over a narrow store.

Per partition: RS = the topic znode's replica set, AR/RR = its adding/removing replicas,
S = the state znode, T = the target, O = the origin (RS before the move), L = live brokers.

* Step U (:func:`plan_update`): RS' = T then O (target first: its head is the preferred
  leader at once), AR' = T minus O, RR' = O minus T; the leader epoch goes up by one. A cancel is
  a move back to O. Brokers pick up RS' from the topic znode; the adding ones fetch from the
  leader until it adds them to the ISR.
* Step B (:func:`plan_completion`), once T ⊆ ISR: leadership moves into T if needed,
  RS = ISR = T, the epoch goes up, the request entry goes away (the request znode with its
  last entry). Removed brokers delete their logs when they see the topic znode.

Every step is one fenced ZooKeeper multi, so a controller killed at any instant leaves
ZooKeeper before or after a step; a new controller resumes from the topic znodes' AR/RR
without bumping epochs again (a step U whose result equals the stored znode writes nothing).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from kbroker.cluster.zkdata import LeaderAndIsr, Reassignment, TopicZNode
from kclient.errors import (
    InvalidReplicaAssignmentError,
    KafkaError,
    NoReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)

log = logging.getLogger(__name__)

TP = tuple[str, int]


# --- algebra -------------------------------------------------------------------------


def _dedupe(replicas: Iterable[int]) -> list[int]:
    out: list[int] = []
    for r in replicas:
        if r not in out:
            out.append(r)
    return out


@dataclass(frozen=True)
class Moves:
    """One partition's replica set with its adding/removing replicas (both empty when idle)."""

    replicas: list[int]
    adding: list[int] = field(default_factory=list)
    removing: list[int] = field(default_factory=list)

    @staticmethod
    def of(znode: TopicZNode, p: int) -> Moves:
        return Moves(list(znode.partitions[p]), list(znode.adding.get(p, [])), list(znode.removing.get(p, [])))

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def origin(self) -> list[int]:
        return [r for r in self.replicas if r not in self.adding]

    @property
    def target(self) -> list[int]:
        return [r for r in self.replicas if r not in self.removing]


def reassign_to(current: Moves, target: list[int]) -> Moves:
    """The replica set moving ``current`` to ``target`` (replacing an in-flight move)."""
    base = current.origin if current.reassigning else current.replicas
    return Moves(
        _dedupe(list(target) + base),
        [r for r in target if r not in base],
        [r for r in base if r not in target],
    )


def with_moves(znode: TopicZNode, p: int, moves: Moves) -> TopicZNode:
    """``znode`` with partition ``p`` replaced by ``moves`` (AR/RR keys only while moving)."""
    adding = {k: v for k, v in znode.adding.items() if k != p}
    removing = {k: v for k, v in znode.removing.items() if k != p}
    if moves.reassigning:
        adding[p], removing[p] = list(moves.adding), list(moves.removing)
    return replace(znode, partitions={**znode.partitions, p: list(moves.replicas)}, adding=adding, removing=removing)


def invalid_target(target: object) -> str | None:
    """Why a requested replica list is unusable (Kafka's validateReplicas), or None."""
    if not isinstance(target, list) or not target:
        return "the replica list is empty"
    if any(not isinstance(r, int) or r < 0 for r in target):
        return f"the replica list {target} has a negative broker id"
    if len(set(target)) != len(target):
        return f"the replica list {target} has duplicate broker ids"
    return None


@dataclass(frozen=True)
class Step:
    """A planned write of one partition: its new replica set and leadership."""

    moves: Moves
    state: LeaderAndIsr | None  # None: the partition has no state znode yet (U only)


@dataclass(frozen=True)
class Refusal:
    reason: str


def plan_update(
    current: Moves, state: LeaderAndIsr | None, target: list[int], live: set[int], controller_epoch: int
) -> Step | Refusal | None:
    """Step U: start, replace or cancel a move. None: nothing to write (already there)."""
    new = reassign_to(current, target)
    if new == current:
        return None
    if state is None:
        return Step(new, None)
    unneeded = [r for r in current.replicas if r not in new.replicas]
    isr = [r for r in state.isr if r not in unneeded]
    leader = state.leader
    if leader in unneeded:
        leader = next((r for r in new.replicas if r in live and r in isr), -1)
    if not isr or (leader < 0 and state.has_leader):
        return Refusal("no replica of the new replica set is in sync")
    return Step(new, LeaderAndIsr(leader, state.leader_epoch + 1, isr, controller_epoch, state.zk_version))


def plan_completion(current: Moves, state: LeaderAndIsr | None, live: set[int], controller_epoch: int) -> Step | None:
    """Step B: finish a move whose target is in sync, or None to wait."""
    if not current.reassigning or state is None:
        return None
    target = current.target
    if not set(target) <= set(state.isr):
        return None
    if state.leader in target and state.leader in live:
        leader = state.leader
    else:
        leader = next((r for r in target if r in live and r in state.isr), -1)
        if leader < 0:
            return None  # no live in-sync target replica: wait (a normal election comes first)
    return Step(
        Moves(list(target)),
        LeaderAndIsr(leader, state.leader_epoch + 1, list(target), controller_epoch, state.zk_version),
    )


# --- the state machine ---------------------------------------------------------------


def _log_election(topic: str, p: int, old: LeaderAndIsr | None, new: LeaderAndIsr | None) -> None:
    """The controller's "leader elected" line, when a reassignment step moves leadership."""
    if old is not None and new is not None and new.leader != old.leader and new.leader >= 0:
        log.info(
            "%s-%d: leader %d elected (was %d), reason: reassignment; epoch %d, ISR %s -> %s",
            topic, p, new.leader, old.leader, new.leader_epoch, old.isr, new.isr,
        )  # fmt: skip


class ReassignmentStore(Protocol):
    """What the manager reads and writes; the controller's adapter fences every write."""

    def topics(self) -> list[str]: ...

    def topics_pending_deletion(self) -> list[str]: ...

    def topic_znode(self, topic: str) -> tuple[TopicZNode, int] | None: ...

    def partition_state(self, topic: str, partition: int) -> LeaderAndIsr | None: ...

    def reassignment_request(self) -> tuple[Reassignment, int] | None: ...

    def set_reassignment_request(self, parts: Reassignment, version: int) -> int: ...

    def delete_reassignment_request(self, version: int) -> None: ...

    def commit_reassignment_step(
        self,
        topic: str,
        znode: TopicZNode,
        topic_version: int,
        states: dict[int, LeaderAndIsr],
        request: tuple[Reassignment | None, int] | None = None,
    ) -> int: ...


class ReassignmentManager:
    """The controller's reassignment work over a :class:`ReassignmentStore`.

    Holds no state of its own besides the controller epoch: everything is re-read from
    the store, so a fresh manager (a new controller) resumes exactly where the last left off.
    Not thread-safe: the controller's event thread is its only caller. ``BadVersionError``
    and ``NoNodeError`` propagate (the controller retries the event after re-reading).
    """

    def __init__(self, store: ReassignmentStore, controller_epoch: int) -> None:
        self._store = store
        self._epoch = controller_epoch

    # --- reads -----------------------------------------------------------------------

    def ongoing(self, tps: Iterable[TP] | None = None) -> dict[TP, Moves]:
        """Every reassigning partition (of ``tps`` when given) with its RS/AR/RR."""
        wanted = None if tps is None else set(tps)
        topics = self._store.topics() if wanted is None else sorted({t for t, _ in wanted})
        out: dict[TP, Moves] = {}
        for topic in topics:
            found = self._store.topic_znode(topic)
            if found is None:
                continue
            for p in found[0].reassigning_partitions:
                if wanted is None or (topic, p) in wanted:
                    out[(topic, p)] = Moves.of(found[0], p)
        return out

    # --- step U ------------------------------------------------------------------------

    def _update_topic(
        self, topic: str, targets: dict[int, list[int]], live: set[int], drop_entries: set[TP] | None = None
    ) -> dict[int, str | None]:
        """Step U for some partitions of one topic in one multi; per partition a refusal reason or None.

        ``drop_entries``: request entries to remove in the same multi (the API replacing
        them); entries of partitions the step leaves idle are removed too.
        """
        found = self._store.topic_znode(topic)
        if found is None:
            return {p: "unknown" for p in targets}
        znode, version = found
        states: dict[int, LeaderAndIsr] = {}
        result: dict[int, str | None] = {}
        for p, target in sorted(targets.items()):
            current = Moves.of(znode, p)
            old = self._store.partition_state(topic, p)
            step = plan_update(current, old, target, live, self._epoch)
            if isinstance(step, Refusal):
                result[p] = step.reason
                continue
            result[p] = None
            if step is None:
                continue
            znode = with_moves(znode, p, step.moves)
            if step.state is not None:
                states[p] = step.state
            log.info(
                "%s-%d: reassigning %s -> %s (replicas %s, adding %s, removing %s)",
                topic, p, current.origin if current.reassigning else current.replicas, target,
                step.moves.replicas, step.moves.adding, step.moves.removing,
            )  # fmt: skip
            _log_election(topic, p, old, step.state)
        # A request entry whose step leaves the partition idle (a cancel, a reorder) is done.
        done = {(topic, p) for p, why in result.items() if why is None and not znode.reassigning(p)}
        drop = done | (drop_entries or set())
        request = self._without(drop) if drop else None
        if states or znode != found[0] or request is not None:
            self._store.commit_reassignment_step(topic, znode, version, states, request)
        return result

    def _without(self, entries: set[TP]) -> tuple[Reassignment | None, int] | None:
        found = self._store.reassignment_request()
        if found is None or not entries & found[0].keys():
            return None
        rest = {tp: rs for tp, rs in found[0].items() if tp not in entries}
        return (rest or None, found[1])

    def process_request(self, live: set[int]) -> list[TP]:
        """The request znode changed (or a controller took over): start what it asks.

        Bad entries (unknown partition, empty/duplicate/negative replicas, a replacement
        that would leave no in-sync replica) and entries with nothing to do are removed
        (ERROR log for bad ones); the znode is deleted when empty. Returns the partitions
        whose move is under way.
        """
        found = self._store.reassignment_request()
        if found is None:
            return []
        request, _ = found
        pending = set(self._store.topics_pending_deletion())
        drop: set[TP] = set()
        by_topic: dict[str, dict[int, list[int]]] = {}
        for (topic, p), target in sorted(request.items()):
            why = invalid_target(target)
            zn = None if topic in pending else self._store.topic_znode(topic)
            if zn is None or p not in zn[0].partitions:
                why = why or "unknown topic or partition"
            if why is not None:
                log.error("reassignment of %s-%d to %s dropped: %s", topic, p, target, why)
                drop.add((topic, p))
                continue
            assert zn is not None
            current = Moves.of(zn[0], p)
            if not current.reassigning and current.replicas == target:
                drop.add((topic, p))  # nothing to do
                continue
            by_topic.setdefault(topic, {})[p] = target
        started: list[TP] = []
        for topic, targets in sorted(by_topic.items()):
            for p, why in self._update_topic(topic, targets, live).items():
                if why is None:
                    started.append((topic, p))  # (or finished at once: a cancel, a reorder)
                else:
                    log.error("reassignment of %s-%d to %s dropped: %s", topic, p, targets[p], why)
                    drop.add((topic, p))
        if drop:
            self._remove_entries(drop)
        return started

    def _remove_entries(self, entries: set[TP]) -> None:
        request = self._without(entries)
        if request is None:
            return
        parts, version = request
        if parts is None:
            self._store.delete_reassignment_request(version)
        else:
            self._store.set_reassignment_request(parts, version)

    def alter(self, targets: dict[TP, list[int] | None], live: set[int]) -> dict[TP, KafkaError | None]:
        """AlterPartitionReassignments: start/replace (a list) or cancel (None) per partition.

        Returns each partition's error or None; accepted partitions are written (step U,
        and their request znode entries removed: the API wins) before this returns.
        """
        pending = set(self._store.topics_pending_deletion())
        errors: dict[TP, KafkaError | None] = {}
        by_topic: dict[str, dict[int, list[int]]] = {}
        znodes: dict[str, TopicZNode | None] = {}
        for (topic, p), target in sorted(targets.items(), key=lambda kv: kv[0]):
            if topic not in znodes:
                zn = None if topic in pending else self._store.topic_znode(topic)
                znodes[topic] = None if zn is None else zn[0]
            znode = znodes[topic]
            if znode is None or p not in znode.partitions:
                errors[(topic, p)] = UnknownTopicOrPartitionError(f"{topic}-{p} does not exist")
                continue
            current = Moves.of(znode, p)
            if target is None:
                if not current.reassigning:
                    errors[(topic, p)] = NoReassignmentInProgressError(f"no reassignment of {topic}-{p} is in progress")
                    continue
                target = current.origin
            else:
                why = invalid_target(target)
                base = current.origin if current.reassigning else current.replicas
                dead = [r for r in target if r not in base and r not in live]
                if why is None and dead:
                    why = f"broker(s) {dead} of the replica list {target} are not alive"
                if why is not None:
                    errors[(topic, p)] = InvalidReplicaAssignmentError(f"{topic}-{p}: {why}")
                    continue
            by_topic.setdefault(topic, {})[p] = list(target)
        for topic, parts in sorted(by_topic.items()):
            drop = {(topic, p) for p in parts}
            for p, why in self._update_topic(topic, parts, live, drop).items():
                errors[(topic, p)] = (
                    None if why is None else InvalidReplicaAssignmentError(f"cannot reassign {topic}-{p}: {why}")
                )
        return errors

    # --- step B ------------------------------------------------------------------------

    def try_complete(self, live: set[int], tps: Iterable[TP] | None = None) -> list[TP]:
        """Finish every (given) reassigning partition whose target is in sync; returns those finished."""
        done: list[TP] = []
        for (topic, p), _ in sorted(self.ongoing(tps).items()):
            found = self._store.topic_znode(topic)
            if found is None or p not in found[0].partitions:
                continue
            znode, version = found
            current = Moves.of(znode, p)
            old = self._store.partition_state(topic, p)
            step = plan_completion(current, old, live, self._epoch)
            if step is None or step.state is None:
                continue
            request = self._request_without_done(topic, p, current.target)
            self._store.commit_reassignment_step(
                topic, with_moves(znode, p, step.moves), version, {p: step.state}, request
            )
            log.info(
                "%s-%d: reassignment complete, replicas %s, leader %d epoch %d",
                topic, p, step.moves.replicas, step.state.leader, step.state.leader_epoch,
            )  # fmt: skip
            _log_election(topic, p, old, step.state)
            done.append((topic, p))
        return done

    def _request_without_done(self, topic: str, p: int, target: list[int]) -> tuple[Reassignment | None, int] | None:
        found = self._store.reassignment_request()
        if found is None or found[0].get((topic, p)) != target:
            return None  # no entry, or a newer request for it not yet processed
        rest = {tp: rs for tp, rs in found[0].items() if tp != (topic, p)}
        return (rest or None, found[1])

    # --- topic deletion ------------------------------------------------------------------

    def drop_topic(self, topic: str) -> None:
        """A deleted topic's request entries go away."""
        found = self._store.reassignment_request()
        if found is not None:
            entries = {tp for tp in found[0] if tp[0] == topic}
            if entries:
                self._remove_entries(entries)
