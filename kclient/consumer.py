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

import logging
import queue
import re
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, overload

import grpc

from kclient.coordinator import CommitCallback, ConsumerCoordinator, ConsumerRebalanceListener
from kclient.errors import (
    CorruptRecordError,
    IllegalStateError,
    InvalidConfigError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    for_code,
)
from kclient.metadata import ClusterMetadata
from kclient.proto.kbroker.v1 import log_pb2
from kclient.records import decode_batches
from kclient.structs import ConsumerRecord, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition
from kclient.transport import Transport

log = logging.getLogger(__name__)

EARLIEST = -2
LATEST = -1
_IDLE_WAKE_S = 0.1
"""How often a waiting poll looks again at backed-off partitions, resets and the group."""


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


@dataclass
class _Request:
    """One Fetch or ListOffsets in flight: its broker, its future and, per partition, the
    fetch offset (Fetch) or the reset target (ListOffsets) it was sent for."""

    kind: str  # "fetch" or "offsets"
    address: str
    future: Any
    partitions: dict[TopicPartition, int]


class Fetcher:
    """Fetches and offset lookups for the assigned partitions, each failing per partition.

    At most one Fetch per leader is in flight; a request outlives the ``poll`` that sent
    it and its response is taken by a later one (KIP-266: ``poll`` returns within its
    timeout). A response is used only for partitions whose position is still the one it
    was fetched from. A partition that fails (no leader, its leader unreachable, a
    retriable error) is retried after a backoff (``retry_backoff_ms``, doubling up to
    1 s) while the others keep flowing; every such failure asks for a metadata refresh.
    A batch that does not decode becomes a ``CorruptRecordError`` for its partition only,
    raised by ``drain`` when the position reaches it, and again until the application
    seeks elsewhere.

    Thread safety: application thread only; gRPC callbacks only enqueue completions.
    """

    def __init__(
        self, transport: Transport, metadata: ClusterMetadata, subs: SubscriptionState, cfg: dict[str, Any]
    ) -> None:
        self._transport = transport
        self._metadata = metadata
        self._subs = subs
        self._cfg = cfg
        # Fetched records, one chunk [partition, records in offset order, next index,
        # (error, offset) or None] per partition per response: per-record work is
        # building the record, nothing more.
        self._buffer: deque[list[Any]] = deque()
        self._fetches: dict[str, _Request] = {}
        self._listing: list[_Request] = []
        self._completed: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._backoff_s = cfg["retry_backoff_ms"] / 1000.0
        self._retry_at: dict[TopicPartition, tuple[float, int]] = {}  # partition -> (retry at, failures)

    # --- buffer -------------------------------------------------------------------

    def clear(self, tps: Iterable[TopicPartition] | None = None) -> None:
        if tps is None:
            self._buffer.clear()
            self._retry_at.clear()
        else:
            drop = set(tps)
            self._buffer = deque(c for c in self._buffer if c[0] not in drop)
            for tp in drop:
                self._retry_at.pop(tp, None)

    def drain(self, max_records: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Up to ``max_records`` buffered records, advancing each partition's position.

        Raises the CorruptRecordError of a partition whose position reached a batch that
        did not decode, unless records were collected first (then the next call raises).
        """
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        n = 0
        buffer = self._buffer
        partitions = self._subs.partitions
        while buffer and n < max_records:
            chunk = buffer[0]
            tp, records, i, error = chunk
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
            chunk[2] = i
            if i < len(records):
                continue
            if error is not None and st.position == error[1]:
                if out:
                    break
                raise error[0]
            buffer.popleft()
        return out

    def has_buffered(self) -> bool:
        return bool(self._buffer)

    # --- backoff --------------------------------------------------------------------

    def _failed(self, tps: Iterable[TopicPartition]) -> None:
        now = time.monotonic()
        for tp in tps:
            _, failures = self._retry_at.get(tp, (0.0, 0))
            delay = min(self._backoff_s * (2**failures), max(self._backoff_s, 1.0))
            self._retry_at[tp] = (now + delay, failures + 1)

    def _ready(self, tp: TopicPartition, now: float) -> bool:
        entry = self._retry_at.get(tp)
        return entry is None or entry[0] <= now

    # --- requests -------------------------------------------------------------------

    def _send(self, kind: str, address: str, method: str, request: Any, partitions: dict[TopicPartition, int]) -> None:
        timeout = self._transport.request_timeout_s
        if kind == "fetch":
            timeout += request.max_wait_ms / 1000.0
        future = getattr(self._transport.stub(address), method).future(request, timeout=timeout)
        pending = _Request(kind, address, future, partitions)
        if kind == "fetch":
            self._fetches[address] = pending
        else:
            self._listing.append(pending)
        future.add_done_callback(lambda _f: self._completed.put(pending))

    def _by_leader(self, tps: Iterable[TopicPartition], busy: set[TopicPartition]) -> dict[str, list[TopicPartition]]:
        now = time.monotonic()
        out: dict[str, list[TopicPartition]] = {}
        for tp in tps:
            if tp in busy or not self._ready(tp, now):
                continue
            addr = self._metadata.leader_address(tp)
            if addr is None:
                self._metadata.request_update()
                self._failed([tp])
                continue
            out.setdefault(addr, []).append(tp)
        return out

    def send_fetches(self) -> None:
        """A Fetch to every leader without one in flight, for its ready partitions."""
        busy = {tp for r in self._fetches.values() for tp in r.partitions}
        busy.update(c[0] for c in self._buffer)
        for addr, tps in self._by_leader(self._subs.fetchable(), busy).items():
            if addr in self._fetches:
                continue
            req = log_pb2.FetchRequest(
                replica_id=-1,
                max_wait_ms=self._cfg["fetch_max_wait_ms"],
                min_bytes=self._cfg["fetch_min_bytes"],
                max_bytes=self._cfg["fetch_max_bytes"],
            )
            topics: dict[str, Any] = {}
            offsets: dict[TopicPartition, int] = {}
            for tp in tps:
                t = topics.get(tp.topic)
                if t is None:
                    t = topics[tp.topic] = req.topics.add(name=tp.topic)
                offsets[tp] = position = self._subs.partitions[tp].position or 0
                t.partitions.add(
                    index=tp.partition,
                    fetch_offset=position,
                    partition_max_bytes=self._cfg["max_partition_fetch_bytes"],
                    current_leader_epoch=-1,
                )
            self._send("fetch", addr, "Fetch", req, offsets)

    def send_list_offsets(self, targets: Mapping[TopicPartition, int]) -> None:
        """ListOffsets for partitions waiting for a reset (``targets``: partition ->
        EARLIEST / LATEST / a timestamp), one request per leader; answers set positions."""
        busy = {tp for r in self._listing for tp in r.partitions}
        for addr, tps in self._by_leader(targets, busy).items():
            req = log_pb2.ListOffsetsRequest(replica_id=-1)
            for tp in tps:
                req.topics.add(name=tp.topic).partitions.add(
                    index=tp.partition, timestamp=targets[tp], current_leader_epoch=-1
                )
            self._send("offsets", addr, "ListOffsets", req, {tp: targets[tp] for tp in tps})

    def in_flight(self) -> bool:
        return bool(self._fetches or self._listing)

    def wait(self, until: float) -> bool:
        """Handle completed requests, waiting until ``until`` for the first one; ``True``
        when at least one was handled."""
        handled = False
        while True:
            left = until - time.monotonic()
            try:
                if handled or left <= 0:
                    req = self._completed.get_nowait()
                else:
                    req = self._completed.get(timeout=left)
            except queue.Empty:
                return handled
            handled = True
            self._complete(req)

    def _complete(self, req: _Request) -> None:
        if req.kind == "fetch":
            if self._fetches.get(req.address) is req:
                del self._fetches[req.address]
        elif req in self._listing:
            self._listing.remove(req)
        try:
            resp = req.future.result()
        except Exception as exc:
            if isinstance(exc, KafkaError):
                err = exc
            elif isinstance(exc, grpc.RpcError):
                err = self._transport.failed(req.address, exc)
            else:  # cancelled at close
                err = KafkaConnectionError(f"request to {req.address} did not complete: {exc!r}")
            if not (err.retriable or err.invalid_metadata):
                raise err from exc
            log.debug("%s to %s failed: %s", req.kind, req.address, err)
            self._metadata.request_update()
            self._failed(req.partitions)
            return
        if req.kind == "fetch":
            self._handle_fetch(req, resp)
        else:
            self._handle_offsets(req, resp)

    def _partition_error(self, tp: TopicPartition, err: KafkaError) -> None:
        if err.invalid_metadata or err.retriable:
            self._metadata.request_update()
            self._failed([tp])
            return
        raise err

    def _handle_offsets(self, req: _Request, resp: log_pb2.ListOffsetsResponse) -> None:
        for t in resp.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.index)
                st = self._subs.partitions.get(tp)
                target = req.partitions.get(tp)
                if st is None or st.position is not None or target is None or self._subs.reset_target(st) != target:
                    continue  # re-positioned meanwhile
                if p.error_code:
                    self._partition_error(tp, for_code(p.error_code)(f"{tp.topic}-{tp.partition}: {p.error_message}"))
                elif p.offset < 0 and target >= 0:
                    st.reset_to = LATEST  # by timestamp and nothing that late: go to the end
                else:
                    st.position, st.reset_to = p.offset, None
                    self._retry_at.pop(tp, None)

    def _handle_fetch(self, req: _Request, resp: log_pb2.FetchResponse) -> None:
        for t in resp.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.index)
                st = self._subs.partitions.get(tp)
                position = req.partitions.get(tp)
                if st is None or st.position is None or st.position != position:
                    continue  # unassigned or re-positioned since the request was sent
                if p.error_code:
                    err = for_code(p.error_code)(f"{tp.topic}-{tp.partition}: {p.error_message}")
                    if isinstance(err, OffsetOutOfRangeError):
                        if self._subs.default_reset == "none":
                            raise err
                        st.position = None
                        st.reset_to = EARLIEST if self._subs.default_reset == "earliest" else LATEST
                    else:
                        self._partition_error(tp, err)
                    continue
                self._retry_at.pop(tp, None)
                st.high_watermark = p.high_watermark
                if p.records:
                    self._decode(tp, p.records, position)

    def _decode(self, tp: TopicPartition, data: bytes, position: int) -> None:
        name, index = tp
        chunk: list[ConsumerRecord] = []
        error: tuple[CorruptRecordError, int] | None = None
        try:
            for header, records in decode_batches(data):
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
        except Exception as exc:  # this partition only: the others of the response still deliver
            at = chunk[-1].offset + 1 if chunk else position
            why = exc.message if isinstance(exc, KafkaError) else repr(exc)
            error = (CorruptRecordError(f"{name}-{index} at offset {at}: {why}"), at)
            log.warning("%s", error[0])
        if chunk or error is not None:
            self._buffer.append([tp, chunk, 0, error])


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
        "default_api_timeout_ms": 60000,
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
        self._metadata = ClusterMetadata(self._transport, cfg["metadata_max_age_ms"], cfg["retry_backoff_ms"])
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

    def _timeout_s(self, timeout_ms: int | None) -> float:
        """A call's time limit: ``timeout_ms``, else ``default_api_timeout_ms`` (Kafka's)."""
        return (self.config["default_api_timeout_ms"] if timeout_ms is None else max(timeout_ms, 0)) / 1000.0

    def topics(self, timeout_ms: int | None = None) -> set[str]:
        """Every topic of the cluster; KafkaTimeoutError when no broker answers in time."""
        try:
            self._metadata.refresh(all_topics=True, deadline=time.monotonic() + self._timeout_s(timeout_ms))
        except KafkaError as exc:
            if not exc.retriable:
                raise
            raise KafkaTimeoutError(f"topics not listed within the timeout: {exc}") from exc
        return self._metadata.topics()

    def partitions_for_topic(self, topic: str, timeout_ms: int | None = None) -> set[int] | None:
        """The topic's partitions; ``None`` when it does not exist. Waits up to
        ``timeout_ms`` (default ``request_timeout_ms``) for a new topic's metadata; raises
        KafkaTimeoutError when no broker answered in that time."""
        timeout_s = (self.config["request_timeout_ms"] if timeout_ms is None else max(timeout_ms, 0)) / 1000.0
        try:
            return self._metadata.wait_for_partitions(topic, timeout_s)
        except KafkaTimeoutError:
            raise
        except KafkaError:
            return None

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Take exactly these partitions (no group management); not with ``subscribe()``.

        Does no I/O: the next ``poll`` finds the leaders and positions."""
        self._check_open()
        tps = [TopicPartition(*tp) for tp in partitions]
        if self._subs.partitions_auto_assigned():
            raise IllegalStateError("assign() and subscribe() are mutually exclusive: call unsubscribe() first")
        topics = {tp.topic for tp in tps}
        if not topics <= self._metadata.topics():
            self._metadata.add_topics(topics)
            self._metadata.request_update()
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

    def commit(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None, timeout_ms: int | None = None
    ) -> None:
        """Commit and wait: the positions of every assigned partition (records returned by
        ``poll``), or ``offsets`` ({TopicPartition: OffsetAndMetadata(next offset, metadata)}).

        Raises ``CommitFailedError`` when the group has rebalanced past this member, and
        KafkaTimeoutError when not done within ``timeout_ms`` (``default_api_timeout_ms``).
        """
        coordinator = self._group("commit()")
        coordinator.commit_offsets_sync(
            self._subs.all_consumed() if offsets is None else self._offsets(offsets), self._timeout_s(timeout_ms)
        )

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
    def committed(
        self, partition: TopicPartition, metadata: Literal[False] = False, timeout_ms: int | None = None
    ) -> int | None: ...

    @overload
    def committed(
        self, partition: TopicPartition, metadata: Literal[True], timeout_ms: int | None = None
    ) -> OffsetAndMetadata | None: ...

    def committed(
        self, partition: TopicPartition, metadata: bool = False, timeout_ms: int | None = None
    ) -> int | OffsetAndMetadata | None:
        """The group's committed offset for ``partition`` (``None`` if nothing is committed);
        KafkaTimeoutError after ``timeout_ms`` (``default_api_timeout_ms``)."""
        tp = TopicPartition(*partition)
        om = self._group("committed()").fetch_committed_offsets([tp], self._timeout_s(timeout_ms))[tp]
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

    def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        """The offset of the next record ``poll`` returns for ``partition``, looked up
        (committed offset, then ``auto_offset_reset``) when unknown; KafkaTimeoutError
        after ``timeout_ms`` (``default_api_timeout_ms``)."""
        tp = TopicPartition(*partition)
        st = self._subs.state(tp)
        deadline = time.monotonic() + self._timeout_s(timeout_ms)
        while st.position is None:
            self._metadata.maybe_refresh(max(deadline - time.monotonic(), 0.05))
            self._update_positions(deadline)
            if st.position is not None:
                break
            if time.monotonic() >= deadline:
                raise KafkaTimeoutError(f"no position for {tp.topic}-{tp.partition} within the timeout")
            self._fetcher.wait(min(deadline, time.monotonic() + _IDLE_WAKE_S))
            self._subs.state(tp)  # still assigned
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

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in self._list_offsets(partitions, EARLIEST, timeout_ms).items()}

    def end_offsets(
        self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
    ) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in self._list_offsets(partitions, LATEST, timeout_ms).items()}

    def offsets_for_times(
        self, timestamps: dict[TopicPartition, int], timeout_ms: int | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        for tp, ts in timestamps.items():
            if ts < 0:
                raise ValueError(f"timestamps must be >= 0, got {ts} for {tp}")
        deadline = time.monotonic() + self._timeout_s(timeout_ms)
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp, ts in timestamps.items():
            left_ms = int(max(deadline - time.monotonic(), 0) * 1000)
            ((offset, found_ts),) = self._list_offsets([tp], ts, left_ms).values()
            out[TopicPartition(*tp)] = OffsetAndTimestamp(offset, found_ts) if offset >= 0 else None
        return out

    def _list_offsets(
        self, partitions: Iterable[TopicPartition], timestamp: int, timeout_ms: int | None
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets at each partition's leader, retried per partition until every one
        answered or the timeout (``default_api_timeout_ms``) passed: KafkaTimeoutError."""
        tps = [TopicPartition(*tp) for tp in partitions]
        self._metadata.add_topics({tp.topic for tp in tps})
        out: dict[TopicPartition, tuple[int, int]] = {}
        deadline = time.monotonic() + self._timeout_s(timeout_ms)
        pending = list(tps)
        last: KafkaError | None = None
        backoff = self.config["retry_backoff_ms"] / 1000.0
        while True:
            by_leader: dict[str, list[TopicPartition]] = {}
            retry: list[TopicPartition] = []
            for tp in pending:
                addr = self._metadata.leader_address(tp)
                if addr is None:
                    parts = self._metadata.partitions_for(tp.topic)
                    if parts is not None and tp.partition not in parts:
                        raise for_code(3)(f"topic {tp.topic!r} has no partition {tp.partition}")
                    code = self._metadata.topic_error(tp.topic)
                    if code and not for_code(code).retriable:
                        raise for_code(code)(f"topic {tp.topic!r}")
                    retry.append(tp)
                    continue
                by_leader.setdefault(addr, []).append(tp)
            for addr, group in by_leader.items():
                req = log_pb2.ListOffsetsRequest(replica_id=-1)
                for tp in group:
                    req.topics.add(name=tp.topic).partitions.add(
                        index=tp.partition, timestamp=timestamp, current_leader_epoch=-1
                    )
                timeout_s = min(self._transport.request_timeout_s, max(deadline - time.monotonic(), 0.05))
                try:
                    resp = self._transport.call(addr, "ListOffsets", req, timeout_s)
                except KafkaError as exc:
                    if not exc.retriable:
                        raise
                    last = exc
                    retry.extend(group)
                    continue
                for t in resp.topics:
                    for p in t.partitions:
                        tp = TopicPartition(t.name, p.index)
                        if p.error_code:
                            err = for_code(p.error_code)(f"{t.name}-{p.index}: {p.error_message}")
                            if not err.retriable:
                                raise err
                            last = err
                            retry.append(tp)
                        else:
                            out[tp] = (p.offset, p.timestamp)
            pending = retry
            if not pending:
                return out
            if time.monotonic() + backoff >= deadline:
                names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in pending)
                raise KafkaTimeoutError(f"offsets of {names} not found within the timeout (last error: {last})")
            time.sleep(backoff)
            self._metadata.request_update()
            self._metadata.maybe_refresh(max(deadline - time.monotonic(), 0.05))

    def _update_positions(self, deadline: float) -> None:
        """Start positioning the partitions that have none: committed offset first (with a
        group), then ``auto_offset_reset`` (or the pending seek_to_beginning/end) through
        ListOffsets, answered asynchronously and per partition (see ``Fetcher``)."""
        partitions = self._subs.partitions
        tps = self._subs.needs_reset()
        if self._coordinator is not None:
            need = [tp for tp in tps if partitions[tp].reset_to is None]
            if need:
                timeout_s = min(self._transport.request_timeout_s, max(deadline - time.monotonic(), 0.2))
                try:
                    committed = self._coordinator.fetch_committed_offsets(need, timeout_s)
                except KafkaError as exc:
                    if not exc.retriable:
                        raise
                    log.debug("committed offsets not fetched yet: %s", exc)
                    return
                for tp, om in committed.items():
                    st = partitions.get(tp)
                    if st is None or st.position is not None:
                        continue
                    if om is not None:
                        st.position = om.offset
                    else:
                        st.reset_to = self._subs.reset_target(st)
        targets: dict[TopicPartition, int] = {}
        for tp in tps:
            st = partitions.get(tp)
            if st is None or st.position is not None:
                continue
            target = self._subs.reset_target(st)
            if target is None:
                raise NoOffsetForPartitionError(
                    f"no position for {tp.topic}-{tp.partition} and auto_offset_reset is 'none'"
                )
            targets[tp] = target
        if targets:
            self._fetcher.send_list_offsets(targets)

    # --- polling -------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records fetched for the assigned partitions, waiting up to ``timeout_ms``.

        Returns within about ``timeout_ms`` (KIP-266): a group join, a fetch or an offset
        lookup still in progress then continues on the next call. A partition whose
        leader is unreachable is retried in the background while the others deliver.
        Raises CorruptRecordError for a partition whose next batch does not decode.
        """
        self._check_open()
        limit = max_records or self.config["max_poll_records"]
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000.0
        coordinator = self._coordinator
        fetcher = self._fetcher
        while True:
            if coordinator is not None:
                coordinator.poll(deadline)
            self._metadata.maybe_refresh(max(deadline - time.monotonic(), 0.1))
            if self._subs.needs_reset():
                self._update_positions(deadline)
            if fetcher.has_buffered():
                out = fetcher.drain(limit)
                if out:
                    return self._deserialize(out)
            fetcher.send_fetches()
            now = time.monotonic()
            if now >= deadline:
                if fetcher.wait(now) and fetcher.has_buffered():
                    out = fetcher.drain(limit)
                    if out:
                        return self._deserialize(out)
                return {}
            fetcher.wait(min(deadline, now + _IDLE_WAKE_S))

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

    def close(self, autocommit: bool = True, timeout_ms: int | None = None) -> None:
        """Commit (with auto-commit and ``autocommit``), leave the group promptly, release
        the channels; within about ``timeout_ms`` (default 30 s, as Kafka)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._coordinator is not None:
                self._coordinator.close(autocommit, (30000 if timeout_ms is None else max(timeout_ms, 0)) / 1000.0)
        finally:
            self._transport.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("consumer is closed")
