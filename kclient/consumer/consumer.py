"""The consumer facade: ``Consumer`` over subscription state, a fetcher and a group member.

``SubscriptionState`` (subscription_state.py) owns what is subscribed or assigned and
each partition's position (the next offset to return) and pause flags; ``Fetcher``
(fetcher.py) keeps one pipelined long-poll Fetch per leader in flight for the assigned
partitions and decodes what the application asks for, once, as records or as column
buffers (Arrow's layout, no object per record);
with a ``group_id``, ``ConsumerCoordinator`` (group.py) joins the group and heartbeats,
and its ``GroupOffsets`` (offsets.py) commits. Positions advance only over records
handed out by ``poll`` / ``poll_columns`` / ``poll_buffers`` / ``poll_arrow``, so whatever commits them
(``commit()``, auto-commit) commits exactly what the application has seen: at-least-once.

Two ways to get partitions, mutually exclusive as in Kafka: ``assign()`` (the
application picks them; a ``group_id`` is optional and only used for offsets) and
``subscribe()`` (topics or a regex pattern; the group spreads partitions over its members).

``isolation_level='read_committed'`` (kafka-python's and Kafka's setting; default
``'read_uncommitted'``) reads only below each partition's last stable offset, without the
records of aborted transactions; its "latest" (``seek_to_end``, ``end_offsets``,
``auto_offset_reset='latest'``) and its lag are the last stable offset's.

Thread safety: like Kafka's consumer, not thread-safe; use it from one thread (``close``
may be called from another). A group consumer runs one background heartbeat thread.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from kclient.compat import check_configs
from kclient.consumer.fetcher import Fetcher
from kclient.consumer.group import ConsumerCoordinator
from kclient.consumer.isolation import parse_isolation_level, to_proto
from kclient.consumer.listener import ConsumerRebalanceListener
from kclient.consumer.offsets import CommitCallback
from kclient.consumer.subscription_state import EARLIEST, LATEST, SubscriptionState
from kclient.errors import (
    IllegalStateError,
    KafkaError,
    KafkaTimeoutError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    for_code,
)
from kclient.metadata import ClusterMetadata
from kclient.proto.kbroker.v1 import log_pb2
from kclient.records import ColumnBuffers, RecordColumns, arrow_schema
from kclient.retry import retry
from kclient.security import DEFAULT_SECURITY_CONFIG, SecurityConfig
from kclient.structs import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    IsolationLevel,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
)
from kclient.transport import Transport

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

_IDLE_WAKE_S = 0.1
"""How often a waiting poll looks again at backed-off partitions, resets and the group."""

_T = TypeVar("_T")


class Consumer:
    """Read records from kbroker topics (kafka-python's ``KafkaConsumer`` shape)."""

    DEFAULT_CONFIG: dict[str, Any] = {
        "bootstrap_servers": "localhost:9092",
        "client_id": "kclient-consumer",
        "group_id": None,
        "auto_offset_reset": "latest",
        "isolation_level": "read_uncommitted",
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
        **DEFAULT_SECURITY_CONFIG,
    }

    def __init__(self, *topics: str, **configs: Any) -> None:
        check_configs("consumer", configs, self.DEFAULT_CONFIG)  # kafka-python's extras: logged, ignored
        self.config = cfg = {**self.DEFAULT_CONFIG, **configs}
        self._isolation = parse_isolation_level(cfg["isolation_level"])
        security = SecurityConfig.from_configs(cfg)
        self._transport = Transport(
            cfg["bootstrap_servers"], cfg["request_timeout_ms"], **({"security": security} if security else {})
        )
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

    def group_metadata(self) -> ConsumerGroupMetadata:
        """This consumer's group, generation and member id (Java's ``groupMetadata()``),
        for ``Producer.send_offsets_to_transaction``: a commit by a member that a
        rebalance has since replaced is refused (KIP-447)."""
        group = self._group("group_metadata()")
        return ConsumerGroupMetadata(group.group_id, group.generation, group.member_id)

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
        coordinator.offsets.commit_sync(
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
        coordinator.offsets.commit_async(
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
        om = self._group("committed()").offsets.fetch_committed([tp], self._timeout_s(timeout_ms))[tp]
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
        """The partition's high watermark from the last Fetch answer (``None`` before one),
        whatever the isolation level (see :meth:`current_lag`)."""
        hw = self._subs.state(TopicPartition(*partition)).high_watermark
        return hw if hw >= 0 else None

    def last_stable_offset(self, partition: TopicPartition) -> int | None:
        """The partition's last stable offset from the last Fetch answer: the first offset
        of its oldest open transaction, or the high watermark when none is open (``None``
        before a Fetch answered)."""
        lso = self._subs.state(TopicPartition(*partition)).last_stable_offset
        return lso if lso >= 0 else None

    def current_lag(self, partition: TopicPartition) -> int | None:
        """Records between the position and the end a ``poll`` may reach (Java's
        ``currentLag``, KIP-695): the high watermark, or for ``read_committed`` the last
        stable offset. ``None`` without a position or before a Fetch answered."""
        return self._lag(self._subs.state(TopicPartition(*partition)))

    def _lag(self, st: Any) -> int | None:
        end = st.last_stable_offset if self._isolation == IsolationLevel.READ_COMMITTED else st.high_watermark
        if st.position is None or end < 0:
            return None
        return int(end - st.position)

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

        def lookup() -> dict[TopicPartition, tuple[int, int]]:
            """One round at the leaders; the partitions still without an answer stay pending."""
            nonlocal pending
            last: KafkaError | None = None
            by_leader: dict[str, list[TopicPartition]] = {}
            retry_later: list[TopicPartition] = []
            for tp in pending:
                addr = self._metadata.leader_address(tp)
                if addr is None:
                    parts = self._metadata.partitions_for(tp.topic)
                    if parts is not None and tp.partition not in parts:
                        raise for_code(3)(f"topic {tp.topic!r} has no partition {tp.partition}")
                    code = self._metadata.topic_error(tp.topic)
                    if code and not for_code(code).retriable:
                        raise for_code(code)(f"topic {tp.topic!r}")
                    retry_later.append(tp)
                    continue
                by_leader.setdefault(addr, []).append(tp)
            for addr, group in by_leader.items():
                req = log_pb2.ListOffsetsRequest(replica_id=-1, isolation_level=to_proto(self._isolation))
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
                    retry_later.extend(group)
                    continue
                for t in resp.topics:
                    for p in t.partitions:
                        tp = TopicPartition(t.name, p.index)
                        if p.error_code:
                            err = for_code(p.error_code)(f"{t.name}-{p.index}: {p.error_message}")
                            if not err.retriable:
                                raise err
                            last = err
                            retry_later.append(tp)
                        else:
                            out[tp] = (p.offset, p.timestamp)
            pending = retry_later
            if pending:
                names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in pending)
                raise KafkaTimeoutError(f"no offsets yet for {names} (last error: {last})")
            return out

        def refresh(err: KafkaError) -> None:
            if err.retriable:  # leaders may have moved
                self._metadata.request_update()
                self._metadata.maybe_refresh(max(deadline - time.monotonic(), 0.05))

        return retry(
            lookup,
            what="offsets not found within the timeout",
            deadline=deadline,
            backoff_s=self.config["retry_backoff_ms"] / 1000.0,
            on_error=refresh,
        )

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
                    committed = self._coordinator.offsets.fetch_committed(need, timeout_s)
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
        return self._poll(timeout_ms, max_records, self._fetcher.drain)

    def poll_columns(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, RecordColumns]:
        """``poll`` for bulk consumers: per partition, the records as parallel lists
        (``RecordColumns``: offsets, timestamps, timestamp_types, keys, values, headers).

        Keys and values are the raw bytes (the deserializers do not apply). Waits,
        positions, commits and errors are exactly those of ``poll``; the two may be mixed.
        """
        return self._poll(timeout_ms, max_records, self._fetcher.drain_column_lists)

    def poll_buffers(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, ColumnBuffers]:
        """``poll_columns`` without a Python object per record: per partition, a
        ``ColumnBuffers`` (Arrow-layout buffers: ``offsets``, ``timestamps``, ``key_bytes``
        and ``value_bytes`` directly, ``to_arrow(topic, partition)`` zero-copy,
        ``to_columns()`` as lists). Waits, positions, commits and errors as ``poll``."""
        return self._poll(timeout_ms, max_records, self._fetcher.drain_columns)

    def poll_arrow(self, timeout_ms: int = 0, max_records: int | None = None, headers: bool = False) -> pa.RecordBatch:
        """``poll_columns`` as one ``pyarrow.RecordBatch`` with Spark's Kafka source schema
        (``arrow_schema(headers)``): key, value, topic, partition, offset, timestamp,
        timestampType (and headers), partition after partition. Keys, values, offsets and
        timestamps are not copied when one partition delivered. Zero rows when nothing
        came. Needs pyarrow."""
        schema = arrow_schema(headers)  # raises ImportError without pyarrow, before polling
        polled = self.poll_buffers(timeout_ms, max_records)
        batches = [cb.to_arrow(tp.topic, tp.partition, headers, schema) for tp, cb in polled.items()]
        if len(batches) == 1:
            return batches[0]
        import pyarrow as pa

        if not batches:
            return pa.RecordBatch.from_pylist([], schema=schema)
        return pa.Table.from_batches(batches, schema).combine_chunks().to_batches()[0]

    def metrics(self, raw: bool = False) -> dict[str, dict[str, float]]:
        """kafka-python's ``metrics()``: ``{"consumer-fetch-manager-metrics": {name: value}}``
        with records-consumed-rate/-total, bytes-consumed-rate/-total, fetch-latency-avg/-max
        (ms), fetch-size-avg/-max, fetch-total, records-per-poll-avg and records-lag-max (the
        largest high watermark - position over the assigned partitions now; the last stable
        offset - position for ``read_committed``). Rates are per second over the last
        30-60 s. ``raw`` is accepted and ignored."""
        lags = [lag for st in self._subs.partitions.values() if (lag := self._lag(st)) is not None]
        return self._fetcher.metrics.snapshot(float(max(lags, default=0)))

    def _poll(
        self, timeout_ms: int, max_records: int | None, drain: Callable[[int], dict[TopicPartition, _T]]
    ) -> dict[TopicPartition, _T]:
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
            fetcher.wait(0.0)  # take the responses already there (no waiting)
            # Pipelining: the next fetches go out before this poll decodes, so the brokers
            # prepare them while this poll and the application work.
            fetcher.send_fetches()
            if fetcher.has_buffered():
                out = drain(limit)
                if out:
                    fetcher.send_fetches()  # for partitions the drain freed a buffer slot of
                    return out
            now = time.monotonic()
            if now >= deadline:
                if fetcher.wait(now) and fetcher.has_buffered():
                    fetcher.send_fetches()
                    out = drain(limit)
                    if out:
                        fetcher.send_fetches()
                        return out
                return {}
            fetcher.wait(min(deadline, now + _IDLE_WAKE_S))

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
