"""What a consumer reads: the subscription or assignment, and each partition's position.

The fetcher, the group member and the facade all read and write this state, on the
application thread only; it imports no other part of the consumer but the listener type.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from kclient.consumer.listener import ConsumerRebalanceListener
from kclient.errors import IllegalStateError, InvalidConfigError
from kclient.structs import OffsetAndMetadata, TopicPartition

EARLIEST = -2
LATEST = -1


@dataclass
class _PartitionState:
    position: int | None = None
    paused: bool = False
    high_watermark: int = -1
    last_stable_offset: int = -1
    """From the last Fetch answer: the first offset a read_committed consumer may not read yet."""
    reset_to: int | None = None  # EARLIEST / LATEST / a timestamp while a reset is pending


class SubscriptionState:
    """What the consumer subscribes to, the assigned partitions, and their positions.

    ``mode`` is one of ``NONE``, ``AUTO_TOPICS`` / ``AUTO_PATTERN`` (``subscribe``: the
    group assigns) and ``USER_ASSIGNED`` (``assign``); switching between the two
    families needs ``unsubscribe()`` first.
    """

    NONE = "none"
    AUTO_TOPICS = "auto_topics"
    AUTO_PATTERN = "auto_pattern"
    USER_ASSIGNED = "user_assigned"

    def __init__(self, auto_offset_reset: str) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise InvalidConfigError(f"auto_offset_reset must be earliest, latest or none, got {auto_offset_reset!r}")
        self.default_reset = auto_offset_reset
        self.partitions: dict[TopicPartition, _PartitionState] = {}
        self.mode = self.NONE
        self.subscription: set[str] = set()
        self.pattern: re.Pattern[str] | None = None
        self.listener: ConsumerRebalanceListener | None = None

    def _set_mode(self, mode: str) -> None:
        auto = (self.AUTO_TOPICS, self.AUTO_PATTERN)
        if self.mode != self.NONE and (self.mode in auto) != (mode in auto):
            raise IllegalStateError(
                "subscribe() and assign() are mutually exclusive: call unsubscribe() before switching"
            )
        self.mode = mode

    def subscribe(self, topics: Iterable[str], listener: ConsumerRebalanceListener | None) -> bool:
        """Subscribe to a list of topics; ``True`` when the subscription changed."""
        self._set_mode(self.AUTO_TOPICS)
        self.pattern = None
        self.listener = listener
        return self.change_subscription(topics)

    def subscribe_pattern(self, pattern: re.Pattern[str], listener: ConsumerRebalanceListener | None) -> None:
        self._set_mode(self.AUTO_PATTERN)
        self.pattern = pattern
        self.listener = listener
        self.subscription = set()

    def change_subscription(self, topics: Iterable[str]) -> bool:
        new = set(topics)
        changed = new != self.subscription
        self.subscription = new
        return changed

    def partitions_auto_assigned(self) -> bool:
        return self.mode in (self.AUTO_TOPICS, self.AUTO_PATTERN)

    def unsubscribe(self) -> None:
        self.mode = self.NONE
        self.subscription = set()
        self.pattern = None
        self.listener = None
        self.partitions = {}

    def assign_from_user(self, tps: Iterable[TopicPartition]) -> None:
        tps = list(tps)
        self._set_mode(self.USER_ASSIGNED if tps else self.NONE)
        self.assign(tps)

    def assign_from_subscribed(self, tps: Iterable[TopicPartition]) -> None:
        """A new group assignment: fresh state (positions come from committed offsets)."""
        self.partitions = {tp: _PartitionState() for tp in sorted({TopicPartition(*tp) for tp in tps})}

    def assign(self, tps: Iterable[TopicPartition]) -> None:
        new = {TopicPartition(*tp) for tp in tps}
        self.partitions = {tp: self.partitions.get(tp) or _PartitionState() for tp in sorted(new)}

    def state(self, tp: TopicPartition) -> _PartitionState:
        st = self.partitions.get(tp)
        if st is None:
            raise IllegalStateError(f"partition {tp.topic}-{tp.partition} is not assigned to this consumer")
        return st

    def reset_target(self, st: _PartitionState) -> int | None:
        """Where a partition without a position goes: a pending seek, else
        ``auto_offset_reset`` (``None`` for "none")."""
        if st.reset_to is not None:
            return st.reset_to
        if self.default_reset == "none":
            return None
        return EARLIEST if self.default_reset == "earliest" else LATEST

    def needs_reset(self) -> list[TopicPartition]:
        return [tp for tp, st in self.partitions.items() if st.position is None]

    def fetchable(self) -> list[TopicPartition]:
        return [tp for tp, st in self.partitions.items() if st.position is not None and not st.paused]

    def all_consumed(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """The position of every assigned partition that has one (what a commit saves)."""
        return {tp: OffsetAndMetadata(st.position, "") for tp, st in self.partitions.items() if st.position is not None}
