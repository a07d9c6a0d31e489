"""The consumer: a thin facade over subscription state, a fetcher and a group coordinator.

``SubscriptionState`` owns what is subscribed or assigned and each partition's position
(the next offset to return) and pause flags; ``Fetcher`` sends one long-poll Fetch per
leader for the assigned partitions, decodes the returned batches and hands out records
in order; with a ``group_id``, ``ConsumerCoordinator`` (kclient/coordinator.py) joins
the group, heartbeats, and commits. Positions advance only over records handed out by
``poll``, so whatever commits them (``commit()``, auto-commit) commits exactly what the
application has seen: at-least-once.

Two ways to get partitions, mutually exclusive as in Kafka: ``assign()`` (the
application picks them; a ``group_id`` is optional and only used for offsets) and
``subscribe()`` (topics or a regex pattern; the group spreads partitions over its members).

Thread safety: like Kafka's consumer, not thread-safe; use it from one thread (``close``
may be called from another). A group consumer runs one background heartbeat thread.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

from kclient.coordinator import CommitCallback, ConsumerCoordinator, ConsumerRebalanceListener
from kclient.errors import (
    IllegalStateError,
    InvalidConfigError,
    KafkaError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    for_code,
)
from kclient.metadata import ClusterMetadata
from kclient.proto.kbroker.v1 import log_pb2
from kclient.records import decode_batches
from kclient.structs import ConsumerRecord, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition
from kclient.transport import Transport

EARLIEST = -2
LATEST = -1


@dataclass
class _PartitionState:
    position: int | None = None
    paused: bool = False
    high_watermark: int = -1
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

    def needs_reset(self) -> list[TopicPartition]:
        return [tp for tp, st in self.partitions.items() if st.position is None]

    def fetchable(self) -> list[TopicPartition]:
        return [tp for tp, st in self.partitions.items() if st.position is not None and not st.paused]

    def all_consumed(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """The position of every assigned partition that has one (what a commit saves)."""
        return {tp: OffsetAndMetadata(st.position, "") for tp, st in self.partitions.items() if st.position is not None}


class Fetcher:
    """Fetches for assigned partitions, one request per leader, and decodes batches."""

    def __init__(
        self, transport: Transport, metadata: ClusterMetadata, subs: SubscriptionState, cfg: dict[str, Any]
    ) -> None:
        self._transport = transport
        self._metadata = metadata
        self._subs = subs
        self._cfg = cfg
        # Fetched records, one chunk (partition, records in offset order, next index) per
        # partition per response: per-record work is building the record, nothing more.
        self._buffer: deque[list[Any]] = deque()

    def clear(self, tps: Iterable[TopicPartition] | None = None) -> None:
        if tps is None:
            self._buffer.clear()
        else:
            drop = set(tps)
            self._buffer = deque(c for c in self._buffer if c[0] not in drop)

    def drain(self, max_records: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Up to ``max_records`` buffered records, advancing each partition's position."""
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        n = 0
        buffer = self._buffer
        partitions = self._subs.partitions
        while buffer and n < max_records:
            chunk = buffer[0]
            tp, records, i = chunk
            st = partitions.get(tp)
            # Records of unassigned, paused or re-positioned partitions are dropped;
            # they are fetched again from the position when wanted.
            if st is None or st.paused or st.position is None:
                buffer.popleft()
                continue
            position = st.position
            while i < len(records) and records[i].offset < position:
                i += 1
            take = records[i : i + (max_records - n)]
            if take:
                out.setdefault(tp, []).extend(take)
                st.position = take[-1].offset + 1
                n += len(take)
                i += len(take)
            if i >= len(records):
                buffer.popleft()
            else:
                chunk[2] = i
        return out

    def has_buffered(self) -> bool:
        return bool(self._buffer)

    def fetch(self, max_wait_ms: int) -> None:
        """One round of Fetch requests (one per leader); fills the buffer."""
        by_leader: dict[str, list[TopicPartition]] = {}
        for tp in self._subs.fetchable():
            addr = self._metadata.leader_address(tp)
            if addr is None:
                self._metadata.refresh()
                addr = self._metadata.leader_address(tp)
                if addr is None:
                    continue
            by_leader.setdefault(addr, []).append(tp)
        if not by_leader:
            time.sleep(min(max_wait_ms, 100) / 1000.0)
            return
        calls = []
        for addr, tps in by_leader.items():
            req = log_pb2.FetchRequest(
                replica_id=-1,
                max_wait_ms=max_wait_ms,
                min_bytes=self._cfg["fetch_min_bytes"],
                max_bytes=self._cfg["fetch_max_bytes"],
            )
            topics: dict[str, Any] = {}
            for tp in tps:
                t = topics.get(tp.topic)
                if t is None:
                    t = topics[tp.topic] = req.topics.add(name=tp.topic)
                t.partitions.add(
                    index=tp.partition,
                    fetch_offset=self._subs.partitions[tp].position or 0,
                    partition_max_bytes=self._cfg["max_partition_fetch_bytes"],
                    current_leader_epoch=-1,
                )
            stub = self._transport.stub(addr)
            calls.append(
                (addr, stub.Fetch.future(req, timeout=max_wait_ms / 1000.0 + self._transport.request_timeout_s))
            )
        for addr, call in calls:
            try:
                resp = call.result()
            except Exception as exc:
                from kclient.transport import map_rpc_error

                err = map_rpc_error(exc, addr) if hasattr(exc, "code") else KafkaError(str(exc))
                if err.invalid_metadata or err.retriable:
                    self._metadata.refresh()
                    continue
                raise err from exc
            self._handle(resp)

    def _handle(self, resp: log_pb2.FetchResponse) -> None:
        refresh = False
        for t in resp.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.index)
                st = self._subs.partitions.get(tp)
                if st is None or st.position is None:
                    continue
                if p.error_code:
                    err = for_code(p.error_code)(p.error_message)
                    if isinstance(err, OffsetOutOfRangeError):
                        if self._subs.default_reset == "none":
                            raise err
                        st.position = None
                        st.reset_to = EARLIEST if self._subs.default_reset == "earliest" else LATEST
                    elif err.invalid_metadata or err.retriable:
                        refresh = True
                    else:
                        raise err
                    continue
                st.high_watermark = p.high_watermark
                if p.records:
                    position = st.position
                    name, index = t.name, p.index
                    chunk: list[ConsumerRecord] = []
                    for header, records in decode_batches(p.records):
                        if header.is_control or header.next_offset <= position:
                            continue
                        ts_type = header.timestamp_type
                        chunk.extend(
                            [
                                ConsumerRecord(name, index, r.offset, r.timestamp, ts_type, r.key, r.value, r.headers)
                                for r in records
                                if r.offset >= position
                            ]
                        )
                    if chunk:
                        self._buffer.append([tp, chunk, 0])
        if refresh:
            self._metadata.refresh()


class Consumer:
    """Read records from kbroker topics (kafka-python's ``KafkaConsumer`` shape)."""

    DEFAULT_CONFIG: dict[str, Any] = {
        "bootstrap_servers": "localhost:9092",
        "client_id": "kclient-consumer",
        "group_id": None,
        "auto_offset_reset": "latest",
        "fetch_min_bytes": 1,
        "fetch_max_wait_ms": 500,
        "fetch_max_bytes": 52428800,
        "max_partition_fetch_bytes": 1048576,
        "max_poll_records": 500,
        "request_timeout_ms": 30000,
        "metadata_max_age_ms": 300000,
        "consumer_timeout_ms": float("inf"),
        "key_deserializer": None,
        "value_deserializer": None,
        "retry_backoff_ms": 100,
        # consumer groups
        "enable_auto_commit": True,
        "auto_commit_interval_ms": 5000,
        "partition_assignment_strategy": ("range",),
        "session_timeout_ms": 10000,
        "heartbeat_interval_ms": 3000,
        "max_poll_interval_ms": 300000,
    }

    def __init__(self, *topics: str, **configs: Any) -> None:
        unknown = set(configs) - set(self.DEFAULT_CONFIG)
        if unknown:
            raise InvalidConfigError(f"unknown consumer setting(s): {', '.join(sorted(unknown))}")
        self.config = cfg = {**self.DEFAULT_CONFIG, **configs}
        self._transport = Transport(cfg["bootstrap_servers"], cfg["request_timeout_ms"])
        self._metadata = ClusterMetadata(self._transport, cfg["metadata_max_age_ms"])
        self._subs = SubscriptionState(cfg["auto_offset_reset"])
        self._fetcher = Fetcher(self._transport, self._metadata, self._subs, cfg)
        self._coordinator: ConsumerCoordinator | None = None
        if cfg["group_id"] is not None:
            try:
                self._coordinator = ConsumerCoordinator(self._transport, self._metadata, self._subs, self._fetcher, cfg)
            except Exception:
                self._transport.close()
                raise
        self._closed = False
        if topics and self._coordinator is not None:
            self.subscribe(list(topics))
        elif topics:
            self.assign([TopicPartition(t, p) for t in topics for p in sorted(self.partitions_for_topic(t) or ())])

    # --- assignment and metadata ---------------------------------------------------

    def topics(self) -> set[str]:
        self._metadata.refresh(all_topics=True)
        return self._metadata.topics()

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        try:
            return self._metadata.wait_for_partitions(topic, self.config["request_timeout_ms"] / 1000.0)
        except KafkaError:
            return None

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Take exactly these partitions (no group management); not with ``subscribe()``."""
        self._check_open()
        tps = [TopicPartition(*tp) for tp in partitions]
        if self._subs.partitions_auto_assigned():
            raise IllegalStateError("assign() and subscribe() are mutually exclusive: call unsubscribe() first")
        self._metadata.add_topics({tp.topic for tp in tps})
        self._metadata.refresh()
        self._subs.assign_from_user(tps)
        self._fetcher.clear([tp for tp in self._subs.partitions])

    def assignment(self) -> set[TopicPartition]:
        """The partitions assigned now (by ``assign()`` or by the group)."""
        return set(self._subs.partitions)

    def subscribe(
        self,
        topics: Iterable[str] = (),
        pattern: str | re.Pattern[str] | None = None,
        listener: ConsumerRebalanceListener | None = None,
    ) -> None:
        """Join the group for these topics, or for every topic matching ``pattern`` (full match).

        The group assigns the partitions on the next ``poll``; a rebalance happens when
        members come or go, subscribed topics gain partitions or a new topic matches the
        pattern. ``listener`` gets ``on_partitions_revoked`` / ``on_partitions_assigned``.
        Subscribing again replaces the subscription; an empty list unsubscribes.
        """
        self._check_open()
        if self._coordinator is None:
            raise IllegalStateError(
                "subscribe() needs a group_id (the group assigns partitions); use assign() without one"
            )
        topic_list = [topics] if isinstance(topics, str) else list(topics)
        if topic_list and pattern is not None:
            raise IllegalStateError("subscribe to a list of topics or to a pattern, not both")
        if listener is not None and not isinstance(listener, ConsumerRebalanceListener):
            if not (hasattr(listener, "on_partitions_revoked") and hasattr(listener, "on_partitions_assigned")):
                raise TypeError("listener must be a ConsumerRebalanceListener")
        if not topic_list and pattern is None:
            self.unsubscribe()
            return
        if pattern is not None:
            compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
            self._subs.subscribe_pattern(compiled, listener)
            self._coordinator.request_rejoin(f"subscribed to pattern {compiled.pattern!r}")
        elif self._subs.subscribe(topic_list, listener):
            self._coordinator.request_rejoin(f"subscribed to {sorted(topic_list)}")

    def subscription(self) -> set[str] | None:
        """The subscribed topics (resolved from the pattern), or ``None`` when not subscribed."""
        return set(self._subs.subscription) if self._subs.partitions_auto_assigned() else None

    def unsubscribe(self) -> None:
        """Leave the group (committing first with auto-commit) and drop every partition."""
        self._check_open()
        if self._coordinator is not None and self._subs.partitions_auto_assigned():
            self._coordinator.leave(autocommit=True)
        self._subs.unsubscribe()
        self._fetcher.clear()

    # --- offsets in the group ------------------------------------------------------

    def _group(self, what: str) -> ConsumerCoordinator:
        self._check_open()
        if self._coordinator is None:
            raise IllegalStateError(f"{what} needs a group_id: committed offsets belong to a consumer group")
        return self._coordinator

    @staticmethod
    def _offsets(offsets: Mapping[TopicPartition, OffsetAndMetadata | int]) -> dict[TopicPartition, OffsetAndMetadata]:
        out: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, om in offsets.items():
            om = OffsetAndMetadata(om) if isinstance(om, int) else OffsetAndMetadata(*om)
            if om.offset < 0:
                raise ValueError(f"cannot commit a negative offset ({om.offset}) for {tp}")
            out[TopicPartition(*tp)] = om
        return out

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None) -> None:
        """Commit and wait: the positions of every assigned partition (records returned by
        ``poll``), or ``offsets`` ({TopicPartition: OffsetAndMetadata(next offset, metadata)}).

        Raises ``CommitFailedError`` when the group has rebalanced past this member.
        """
        coordinator = self._group("commit()")
        coordinator.commit_offsets_sync(self._subs.all_consumed() if offsets is None else self._offsets(offsets))

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
        callback: CommitCallback | None = None,
    ) -> None:
        """Commit without waiting; ``callback(offsets, exception_or_None)`` runs on a later
        ``poll``/``commit``/``close`` (on this thread). Not retried."""
        coordinator = self._group("commit_async()")
        coordinator.commit_offsets_async(
            self._subs.all_consumed() if offsets is None else self._offsets(offsets), callback
        )

    @overload
    def committed(self, partition: TopicPartition, metadata: Literal[False] = False) -> int | None: ...

    @overload
    def committed(self, partition: TopicPartition, metadata: Literal[True]) -> OffsetAndMetadata | None: ...

    def committed(self, partition: TopicPartition, metadata: bool = False) -> int | OffsetAndMetadata | None:
        """The group's committed offset for ``partition`` (``None`` if nothing is committed)."""
        tp = TopicPartition(*partition)
        om = self._group("committed()").fetch_committed_offsets([tp])[tp]
        if om is None or metadata:
            return om
        return om.offset

    # --- positions -----------------------------------------------------------------

    def seek(self, partition: TopicPartition, offset: int) -> None:
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot seek to a negative offset ({offset})")
        st = self._subs.state(TopicPartition(*partition))
        st.position, st.reset_to = offset, None
        self._fetcher.clear([partition])

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._request_reset(partitions, EARLIEST)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._request_reset(partitions, LATEST)

    def _request_reset(self, partitions: tuple[TopicPartition, ...], to: int) -> None:
        tps = [TopicPartition(*tp) for tp in partitions] or list(self._subs.partitions)
        for tp in tps:
            st = self._subs.state(tp)
            st.position, st.reset_to = None, to
        self._fetcher.clear(tps)

    def position(self, partition: TopicPartition) -> int:
        tp = TopicPartition(*partition)
        st = self._subs.state(tp)
        if st.position is None:
            self._update_positions([tp])
        assert st.position is not None
        return st.position

    def highwater(self, partition: TopicPartition) -> int | None:
        hw = self._subs.state(TopicPartition(*partition)).high_watermark
        return hw if hw >= 0 else None

    def pause(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._subs.state(TopicPartition(*tp)).paused = True

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._subs.state(TopicPartition(*tp)).paused = False

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, st in self._subs.partitions.items() if st.paused}

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in self._list_offsets(partitions, EARLIEST).items()}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in self._list_offsets(partitions, LATEST).items()}

    def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp, ts in timestamps.items():
            if ts < 0:
                raise ValueError(f"timestamps must be >= 0, got {ts} for {tp}")
            ((offset, found_ts),) = self._list_offsets([tp], ts).values()
            out[TopicPartition(*tp)] = OffsetAndTimestamp(offset, found_ts) if offset >= 0 else None
        return out

    def _list_offsets(
        self, partitions: Iterable[TopicPartition], timestamp: int
    ) -> dict[TopicPartition, tuple[int, int]]:
        tps = [TopicPartition(*tp) for tp in partitions]
        self._metadata.add_topics({tp.topic for tp in tps})
        out: dict[TopicPartition, tuple[int, int]] = {}
        deadline = time.monotonic() + self.config["request_timeout_ms"] / 1000.0
        pending = list(tps)
        last: KafkaError | None = None
        while pending:
            if time.monotonic() > deadline:
                raise last or KafkaError("list offsets timed out")
            by_leader: dict[str, list[TopicPartition]] = {}
            for tp in pending:
                addr = self._metadata.leader_address(tp)
                if addr is None:
                    self._metadata.refresh()
                    addr = self._metadata.leader_address(tp)
                if addr is None:
                    if self._metadata.partitions_for(tp.topic) is not None and tp.partition not in (
                        self._metadata.partitions_for(tp.topic) or set()
                    ):
                        raise for_code(3)(f"topic {tp.topic!r} has no partition {tp.partition}")
                    if self._metadata.topic_error(tp.topic):
                        raise for_code(self._metadata.topic_error(tp.topic))(f"topic {tp.topic!r}")
                    continue
                by_leader.setdefault(addr, []).append(tp)
            retry: list[TopicPartition] = [tp for tp in pending if not any(tp in v for v in by_leader.values())]
            for addr, group in by_leader.items():
                req = log_pb2.ListOffsetsRequest(replica_id=-1)
                for tp in group:
                    req.topics.add(name=tp.topic).partitions.add(
                        index=tp.partition, timestamp=timestamp, current_leader_epoch=-1
                    )
                try:
                    resp = self._transport.call(addr, "ListOffsets", req)
                except KafkaError as exc:
                    last = exc
                    retry.extend(group)
                    continue
                for t in resp.topics:
                    for p in t.partitions:
                        tp = TopicPartition(t.name, p.index)
                        if p.error_code:
                            err = for_code(p.error_code)(p.error_message)
                            if not err.retriable:
                                raise err
                            last = err
                            retry.append(tp)
                        else:
                            out[tp] = (p.offset, p.timestamp)
            pending = retry
            if pending:
                self._metadata.refresh()
                time.sleep(0.05)
        return out

    def _update_positions(self, tps: list[TopicPartition]) -> None:
        """Position partitions that have none: committed offset first (with a group), then
        ``auto_offset_reset`` (or the pending seek_to_beginning/end)."""
        partitions = self._subs.partitions
        if self._coordinator is not None:
            need = [tp for tp in tps if partitions[tp].reset_to is None]
            if need:
                for tp, om in self._coordinator.fetch_committed_offsets(need).items():
                    st = partitions.get(tp)
                    if om is not None and st is not None and st.position is None:
                        st.position = om.offset
        rest = [tp for tp in tps if tp in partitions and partitions[tp].position is None]
        if rest:
            self._reset_positions(rest)

    def _reset_positions(self, tps: list[TopicPartition]) -> None:
        by_target: dict[int, list[TopicPartition]] = {}
        for tp in tps:
            st = self._subs.partitions[tp]
            target = st.reset_to
            if target is None:
                if self._subs.default_reset == "none":
                    raise NoOffsetForPartitionError(
                        f"no position for {tp.topic}-{tp.partition} and auto_offset_reset is 'none'"
                    )
                target = EARLIEST if self._subs.default_reset == "earliest" else LATEST
            by_target.setdefault(target, []).append(tp)
        for target, group in by_target.items():
            for tp, (offset, _) in self._list_offsets(group, target).items():
                st = self._subs.partitions[tp]
                if offset < 0:  # by timestamp and nothing that late: go to the end
                    offset = self._list_offsets([tp], LATEST)[tp][0]
                st.position, st.reset_to = offset, None

    # --- polling -------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        self._check_open()
        limit = max_records or self.config["max_poll_records"]
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000.0
        coordinator = self._coordinator
        while True:
            if coordinator is not None:
                coordinator.poll(deadline)
            if self._subs.needs_reset():
                self._update_positions(self._subs.needs_reset())
            if self._fetcher.has_buffered():
                out = self._fetcher.drain(limit)
                if out:
                    return self._deserialize(out)
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0 and timeout_ms > 0:
                return {}
            self._fetcher.fetch(max(0, min(self.config["fetch_max_wait_ms"], left_ms)))
            if not self._fetcher.has_buffered() and timeout_ms <= 0:
                return {}

    def _deserialize(
        self, out: dict[TopicPartition, list[ConsumerRecord]]
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        kd, vd = self.config["key_deserializer"], self.config["value_deserializer"]
        if kd is None and vd is None:
            return out
        return {
            tp: [
                r._replace(
                    key=kd(r.key) if kd and r.key is not None else r.key,
                    value=vd(r.value) if vd and r.value is not None else r.value,
                )
                for r in recs
            ]
            for tp, recs in out.items()
        }

    def __iter__(self) -> Iterator[ConsumerRecord]:
        idle_since = time.monotonic()
        while True:
            batch = self.poll(timeout_ms=200)
            if batch:
                idle_since = time.monotonic()
                for recs in batch.values():
                    yield from recs
            elif (time.monotonic() - idle_since) * 1000 >= self.config["consumer_timeout_ms"]:
                return

    def close(self, autocommit: bool = True) -> None:
        """Commit (with auto-commit and ``autocommit``), leave the group promptly, release the channels."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._coordinator is not None:
                self._coordinator.close(autocommit)
        finally:
            self._transport.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("consumer is closed")
