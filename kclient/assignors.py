"""Partition assignors of the classic consumer-group protocol, and their wire payloads.

The group leader runs one assignor over every member's subscription (decoded from the
JoinGroup metadata) and the partition count of every subscribed topic; the result goes
out in SyncGroup. Which assignor runs is chosen by the coordinator: the first one, in
the members' order of preference, that every member supports.

- ``RangeAssignor`` ("range"): per topic, the subscribed members sorted by id each get
  a contiguous range of ``partitions // members``; the first ``partitions % members``
  get one extra. Members subscribed to the same topics get the same partition numbers
  of every topic (co-partitioned joins), at the price of balance across topics.
- ``RoundRobinAssignor`` ("roundrobin"): every partition of every subscribed topic, in
  (topic, partition) order, dealt round-robin over the sorted members, skipping a member
  not subscribed to that partition's topic.
- ``StickyAssignor`` ("sticky"): as balanced as round robin, but every member keeps the
  partitions it owned in the previous generation (``ConsumerSubscription.owned_partitions``)
  wherever balance allows, so a rebalance moves as few partitions as possible. Claims of a
  member whose generation is older than the newest one reported are ignored (it missed a
  rebalance; its partitions may have moved since).

Invariant of every assignor: each partition of a topic someone subscribes to goes to
exactly one member, and only to a member subscribed to its topic.

Payloads (protocol type ``"consumer"``): ``ConsumerSubscription`` and
``ConsumerAssignment`` of ``protos/kbroker/v1/group.proto``, (de)serialised by the
helpers below.

Thread safety: assignors are stateless; safe from any thread.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kclient.errors import InvalidConfigError
from kclient.proto.kbroker.v1 import group_pb2
from kclient.structs import TopicPartition

PROTOCOL_TYPE = "consumer"


@dataclass
class Subscription:
    """What one member asks for (and holds), as carried in JoinGroup metadata."""

    topics: list[str]
    owned_partitions: list[TopicPartition] = field(default_factory=list)
    generation_id: int = -1
    user_data: bytes = b""


def _grouped(partitions: Iterable[TopicPartition]) -> list[group_pb2.TopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return [group_pb2.TopicPartitions(topic=t, partitions=sorted(ps)) for t, ps in sorted(by_topic.items())]


def _ungrouped(groups: Iterable[group_pb2.TopicPartitions]) -> list[TopicPartition]:
    return sorted(TopicPartition(g.topic, p) for g in groups for p in g.partitions)


def encode_subscription(sub: Subscription) -> bytes:
    msg = group_pb2.ConsumerSubscription(
        topics=sorted(set(sub.topics)),
        user_data=sub.user_data,
        owned_partitions=_grouped(sub.owned_partitions),
        generation_id=sub.generation_id,
    )
    return msg.SerializeToString()


def decode_subscription(data: bytes) -> Subscription:
    msg = group_pb2.ConsumerSubscription.FromString(data)
    return Subscription(list(msg.topics), _ungrouped(msg.owned_partitions), msg.generation_id, msg.user_data)


def encode_assignment(partitions: Iterable[TopicPartition], user_data: bytes = b"") -> bytes:
    return group_pb2.ConsumerAssignment(partitions=_grouped(partitions), user_data=user_data).SerializeToString()


def decode_assignment(data: bytes) -> list[TopicPartition]:
    return _ungrouped(group_pb2.ConsumerAssignment.FromString(data).partitions)


class AbstractPartitionAssignor(abc.ABC):
    """One partition assignment strategy; ``name`` is its protocol name on the wire."""

    name: str = ""

    @abc.abstractmethod
    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        """Member id -> its sorted partitions, for every member (possibly empty).

        ``partitions_per_topic`` holds the partition count of each existing topic;
        subscribed topics missing from it (or with 0 partitions) are skipped.
        """

    def subscription(
        self, topics: Iterable[str], owned: Iterable[TopicPartition] = (), generation_id: int = -1
    ) -> Subscription:
        """The JoinGroup metadata this member sends for this assignor."""
        return Subscription(sorted(set(topics)), sorted(owned), generation_id)

    def on_assignment(self, partitions: Sequence[TopicPartition], generation_id: int) -> None:  # noqa: B027
        """Called on every member with its share once SyncGroup returns (a hook)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _topic_partitions(
    partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
) -> list[TopicPartition]:
    """Every partition of every topic some member subscribes to, sorted."""
    topics = {t for s in subscriptions.values() for t in s.topics if partitions_per_topic.get(t, 0) > 0}
    return [TopicPartition(t, p) for t in sorted(topics) for p in range(partitions_per_topic[t])]


def _finish(assignment: dict[str, list[TopicPartition]]) -> dict[str, list[TopicPartition]]:
    return {m: sorted(tps) for m, tps in sorted(assignment.items())}


class RangeAssignor(AbstractPartitionAssignor):
    name = "range"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        out: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        for topic in topics:
            n = partitions_per_topic.get(topic, 0)
            if n <= 0:
                continue
            members = sorted(m for m, s in subscriptions.items() if topic in s.topics)
            per, extra = divmod(n, len(members))
            start = 0
            for i, m in enumerate(members):
                length = per + (1 if i < extra else 0)
                out[m].extend(TopicPartition(topic, p) for p in range(start, start + length))
                start += length
        return _finish(out)


class RoundRobinAssignor(AbstractPartitionAssignor):
    name = "roundrobin"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        out: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        members = sorted(subscriptions)
        topics_of = {m: set(subscriptions[m].topics) for m in members}
        i = 0
        for tp in _topic_partitions(partitions_per_topic, subscriptions):
            # Someone subscribes to tp.topic, so this finds a member within one lap.
            while tp.topic not in topics_of[members[i % len(members)]]:
                i += 1
            out[members[i % len(members)]].append(tp)
            i += 1
        return _finish(out)


class StickyAssignor(AbstractPartitionAssignor):
    """Balanced, and moving as few previously owned partitions as balance allows.

    1. Keep every valid claim: a partition that still exists, of a topic the claimant
       still subscribes to, claimed in the newest generation reported (claims from
       older generations are dropped; a partition claimed twice goes to the first
       claimant by member id).
    2. Hand each unowned partition to the least-loaded member subscribed to its topic
       (partitions with the fewest candidates first).
    3. While some member holds at least two more partitions than another member that
       could take one of them, move one over (from the most loaded first, preferring a
       partition it did not own before). Each move lowers the sum of squared loads, so
       this ends; with equal subscriptions it ends with loads differing by at most one,
       and only partitions above a member's fair share have moved.
    """

    name = "sticky"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        members = sorted(subscriptions)
        topics_of = {m: set(subscriptions[m].topics) for m in members}
        all_partitions = _topic_partitions(partitions_per_topic, subscriptions)
        exists = set(all_partitions)

        claimants = [m for m in members if subscriptions[m].owned_partitions]
        newest = max((subscriptions[m].generation_id for m in claimants), default=-1)
        owner: dict[TopicPartition, str] = {}
        for m in claimants:
            if subscriptions[m].generation_id != newest:
                continue
            for tp in sorted(set(subscriptions[m].owned_partitions)):
                if tp in exists and tp.topic in topics_of[m] and tp not in owner:
                    owner[tp] = m
        previous = dict(owner)

        load: dict[str, set[TopicPartition]] = {m: set() for m in members}
        for tp, m in owner.items():
            load[m].add(tp)

        candidates = {tp: [m for m in members if tp.topic in topics_of[m]] for tp in all_partitions if tp not in owner}
        for tp in sorted(candidates, key=lambda tp: (len(candidates[tp]), tp)):
            m = min(candidates[tp], key=lambda m: (len(load[m]), m))
            owner[tp] = m
            load[m].add(tp)

        while self._move_one(members, topics_of, load, owner, previous):
            pass
        return _finish({m: list(tps) for m, tps in load.items()})

    @staticmethod
    def _move_one(
        members: list[str],
        topics_of: dict[str, set[str]],
        load: dict[str, set[TopicPartition]],
        owner: dict[TopicPartition, str],
        previous: dict[TopicPartition, str],
    ) -> bool:
        for donor in sorted(members, key=lambda m: (-len(load[m]), m)):
            size = len(load[donor])
            # Partitions the donor did not own before move first: they cost no stickiness.
            for tp in sorted(load[donor], key=lambda tp: (previous.get(tp) == donor, tp)):
                takers = [m for m in members if m != donor and tp.topic in topics_of[m] and len(load[m]) <= size - 2]
                if takers:
                    taker = min(takers, key=lambda m: (len(load[m]), m))
                    load[donor].discard(tp)
                    load[taker].add(tp)
                    owner[tp] = taker
                    return True
        return False


ASSIGNORS: dict[str, type[AbstractPartitionAssignor]] = {
    cls.name: cls for cls in (RangeAssignor, RoundRobinAssignor, StickyAssignor)
}


def resolve_assignors(
    strategy: str | AbstractPartitionAssignor | type[AbstractPartitionAssignor] | Iterable[object],
) -> list[AbstractPartitionAssignor]:
    """Assignor instances from names ("range", "roundrobin", "sticky"), classes or instances."""
    items: list[object] = [strategy] if isinstance(strategy, str | AbstractPartitionAssignor | type) else list(strategy)
    out: list[AbstractPartitionAssignor] = []
    for item in items:
        if isinstance(item, str):
            cls = ASSIGNORS.get(item.lower())
            if cls is None:
                raise InvalidConfigError(
                    f"unknown partition assignment strategy {item!r} (known: {', '.join(sorted(ASSIGNORS))})"
                )
            assignor: AbstractPartitionAssignor = cls()
        elif isinstance(item, type) and issubclass(item, AbstractPartitionAssignor):
            assignor = item()
        elif isinstance(item, AbstractPartitionAssignor):
            assignor = item
        else:
            raise InvalidConfigError(f"not a partition assignor: {item!r}")
        if not assignor.name:
            raise InvalidConfigError(f"partition assignor {assignor!r} has no name")
        if any(a.name == assignor.name for a in out):
            raise InvalidConfigError(f"partition assignor {assignor.name!r} listed twice")
        out.append(assignor)
    if not out:
        raise InvalidConfigError("partition_assignment_strategy is empty")
    return out
