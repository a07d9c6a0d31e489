"""The fetcher: pipelined long-poll Fetches and ListOffsets for the assigned partitions.

With ``isolation_level='read_committed'`` the Fetches and ListOffsets ask for it: the
leaders answer records below the last stable offset only, and "latest" is the last
stable offset; each answer's aborted transactions are dropped from its bytes, whole
batches at a time, before anything is decoded (:func:`kclient.records.drop_aborted`).

Records are decoded once, straight into what ``poll`` hands out (ConsumerRecords with
the deserializers applied, or, for the columnar polls, ColumnBuffers: Arrow-layout
buffers with no object per record), when the application first asks for them, not when
the response arrives.
"""

from __future__ import annotations

import logging
import queue
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import grpc

from kclient.consumer.isolation import parse_isolation_level, to_proto
from kclient.consumer.subscription_state import EARLIEST, LATEST, SubscriptionState
from kclient.errors import (
    CorruptRecordError,
    KafkaConnectionError,
    KafkaError,
    OffsetOutOfRangeError,
    for_code,
)
from kclient.fetch_session import FetchRequestData, FetchSessionHandler, PartitionData
from kclient.producer.metrics import Sensor
from kclient.proto.kbroker.v1 import log_pb2
from kclient.records import (
    ColumnBuffers,
    RecordColumns,
    check_batch,
    decode_buffers,
    decode_columns,
    decode_consumer_records,
    drop_aborted,
    iter_headers,
)
from kclient.structs import AbortedTransaction, ConsumerRecord, IsolationLevel, TopicPartition

if TYPE_CHECKING:
    from kclient.metadata import ClusterMetadata
    from kclient.transport import Transport

log = logging.getLogger(__name__)

_record_offset = itemgetter(2)


@dataclass
class _Request:
    """One Fetch or ListOffsets in flight: its broker, its future and, per partition, the
    fetch offset (Fetch) or the reset target (ListOffsets) it was sent for."""

    kind: str  # "fetch" or "offsets"
    address: str
    future: Any
    partitions: dict[TopicPartition, int]
    sent: float = 0.0
    session: FetchRequestData | None = None
    """A Fetch's session data (KIP-227): ``partitions`` holds every partition the answer
    may name, sent in this request or held by the session."""


class _Chunk:
    """One partition's share of one Fetch response (``data``, fetched from ``fetch_offset``).

    Decoded on first use, from the partition's position then, into ``decoded``: a list of
    ConsumerRecords (``poll``), a ColumnBuffers (``poll_buffers``, ``poll_arrow``) or a
    RecordColumns (``poll_columns``); decoded again, from the position, when the
    application switches between them. ``index`` is the next
    record to hand out. ``error`` is the CorruptRecordError of a batch that did not decode
    and the offset it stands at.
    """

    __slots__ = ("data", "decoded", "end", "error", "fetch_offset", "index", "tp")

    def __init__(self, tp: TopicPartition, data: bytes, fetch_offset: int) -> None:
        self.tp = tp
        self.data = data
        self.fetch_offset = fetch_offset
        self.end: int | None = -1  # -1: not computed yet; None: unknown (a corrupt header)
        # (a read_committed chunk whose aborted batches were dropped has it set from the
        # answer as it came, so the position moves past dropped batches too)
        self.decoded: Decoded | None = None
        self.index = 0
        self.error: tuple[CorruptRecordError, int] | None = None

    def next_fetch_offset(self) -> int | None:
        """The offset after the last complete batch of ``data`` (where the next fetch of
        this partition starts), or ``None`` when the batches cannot be walked."""
        if self.end == -1:
            end: int | None = None
            try:
                for _, header in iter_headers(self.data):
                    end = header.base_offset + header.last_offset_delta + 1
            except KafkaError:
                end = None
            self.end = end
        return self.end


def corrupt_record_error(tp: TopicPartition, offset: int, cause: Exception | str) -> CorruptRecordError:
    """The CorruptRecordError ``poll`` raises for ``tp``: it names the partition and the
    offset the position stands at (the bad batch), and how to go on."""
    why = cause if isinstance(cause, str) else cause.message if isinstance(cause, KafkaError) else repr(cause)
    return CorruptRecordError(
        f"{tp.topic}-{tp.partition} at offset {offset}: {why}. The partition's position stays at "
        f"offset {offset}; seek past it to continue consuming that partition"
    )


def _records(pieces: list[list[ConsumerRecord]]) -> list[ConsumerRecord]:
    return pieces[0] if len(pieces) == 1 else list(chain.from_iterable(pieces))


def _lists(pieces: list[RecordColumns]) -> RecordColumns:
    if len(pieces) == 1:
        return pieces[0]
    joined: list[list[Any]] = [list(chain.from_iterable(column)) for column in zip(*pieces, strict=True)]
    return RecordColumns(*joined)


def _slice(c: RecordColumns, i: int, j: int) -> RecordColumns:
    return RecordColumns(
        c.offsets[i:j], c.timestamps[i:j], c.timestamp_types[i:j], c.keys[i:j], c.values[i:j], c.headers[i:j]
    )


Decoded = list[ConsumerRecord] | ColumnBuffers | RecordColumns


class FetchMetrics:
    """What the fetcher counts, per response and per drain (application thread only)."""

    def __init__(self) -> None:
        self.records_consumed = Sensor()
        self.bytes_consumed = Sensor()
        self.fetch_latency_ms = Sensor()

    def snapshot(self, records_lag_max: float) -> dict[str, dict[str, float]]:
        return {
            "consumer-fetch-manager-metrics": {
                "records-consumed-total": self.records_consumed.total,
                "records-consumed-rate": self.records_consumed.rate(),
                "records-per-poll-avg": self.records_consumed.avg(),
                "bytes-consumed-total": self.bytes_consumed.total,
                "bytes-consumed-rate": self.bytes_consumed.rate(),
                "fetch-size-avg": self.bytes_consumed.avg(),
                "fetch-size-max": self.bytes_consumed.max,
                "fetch-total": float(self.fetch_latency_ms.count),
                "fetch-latency-avg": self.fetch_latency_ms.avg(),
                "fetch-latency-max": self.fetch_latency_ms.max,
                "records-lag-max": records_lag_max,
            }
        }


class Fetcher:
    """Fetches and offset lookups for the assigned partitions, each failing per partition.

    At most one Fetch per leader is in flight; a request outlives the ``poll`` that sent
    it and its response is taken by a later one (KIP-266: ``poll`` returns within its
    timeout). Fetches are pipelined: a partition is fetched again, from the end of what is
    buffered for it, while the application still processes the last response, as long as
    at most one response of it is buffered (so at most two responses of
    ``max_partition_fetch_bytes`` per partition are held, plus the one in flight). A
    response is used only for partitions whose position (or buffered end) is still the one
    it was fetched from. A partition that fails (no leader, its leader unreachable, a
    retriable error) is retried after a backoff (``retry_backoff_ms``, doubling up to 1 s)
    while the others keep flowing; every such failure asks for a metadata refresh. A batch
    that does not decode (or a CORRUPT_MESSAGE answer for a partition) becomes a
    ``CorruptRecordError`` for its partition only, naming it and the bad batch's offset,
    where the position then stays. ``drain`` raises it when the position reaches it,
    after the other partitions' buffered records have been handed out (then on the next
    call), and again until the application seeks elsewhere; that partition is not fetched
    meanwhile, the others are.

    Thread safety: application thread only; gRPC callbacks only enqueue completions.
    """

    def __init__(
        self, transport: Transport, metadata: ClusterMetadata, subs: SubscriptionState, cfg: Mapping[str, Any]
    ) -> None:
        self._transport = transport
        self._metadata = metadata
        self._subs = subs
        self._cfg = cfg
        self._isolation = parse_isolation_level(cfg.get("isolation_level", "read_uncommitted"))
        self._read_committed = self._isolation is IsolationLevel.READ_COMMITTED
        self._key_deserializer = cfg.get("key_deserializer")
        self._value_deserializer = cfg.get("value_deserializer")
        self._buffer: deque[_Chunk] = deque()  # responses in arrival order, per partition in offset order
        self._fetches: dict[str, _Request] = {}
        self._listing: list[_Request] = []
        self._completed: queue.SimpleQueue[_Request] = queue.SimpleQueue()
        self._backoff_s = cfg["retry_backoff_ms"] / 1000.0
        self._retry_at: dict[TopicPartition, tuple[float, int]] = {}  # partition -> (retry at, failures)
        self._error_due = False  # a drain returned records past a partition's standing error
        self._sessions: dict[str, FetchSessionHandler] = {}
        """The fetch session (KIP-227) with each leader fetched from, by address."""
        self.metrics = FetchMetrics()

    # --- buffer -------------------------------------------------------------------

    def clear(self, tps: Iterable[TopicPartition] | None = None) -> None:
        if tps is None:
            self._buffer.clear()
            self._retry_at.clear()
        else:
            drop = set(tps)
            self._buffer = deque(c for c in self._buffer if c.tp not in drop)
            for tp in drop:
                self._retry_at.pop(tp, None)

    def has_buffered(self) -> bool:
        return bool(self._buffer)

    def _decode(self, chunk: _Chunk, position: int, kind: type) -> Decoded:
        """Decode ``chunk`` from ``position`` as ``kind``: ``list`` (ConsumerRecords),
        ``ColumnBuffers`` or ``RecordColumns``."""
        tp = chunk.tp
        error: tuple[CorruptRecordError, int] | None = None
        decoded: Decoded
        if kind is ColumnBuffers:
            decoded = buffers = ColumnBuffers()
            try:
                decode_buffers(chunk.data, position, buffers)
            except Exception as exc:  # this partition only: the others still deliver
                error = self._corrupt(tp, exc, buffers.offsets[-1] + 1 if len(buffers) else position, chunk.data)
        elif kind is RecordColumns:
            decoded = cols = RecordColumns([], [], [], [], [], [])
            try:
                decode_columns(chunk.data, position, cols)
            except Exception as exc:
                error = self._corrupt(tp, exc, cols.offsets[-1] + 1 if cols.offsets else position, chunk.data)
        else:
            recs: list[ConsumerRecord] = []
            decoded = recs
            kd, vd = self._key_deserializer, self._value_deserializer
            try:
                decode_consumer_records(chunk.data, tp.topic, tp.partition, position, kd, vd, recs)
            except Exception as exc:
                error = self._corrupt(tp, exc, recs[-1].offset + 1 if recs else position, chunk.data)
        chunk.decoded = decoded
        chunk.index = 0
        if error is not None and chunk.error is None:
            chunk.error = error
            log.warning("%s", error[0])
        return decoded

    @staticmethod
    def _corrupt(tp: TopicPartition, exc: Exception, at: int, data: bytes = b"") -> tuple[CorruptRecordError, int]:
        """The error of a batch that did not decode, after the records up to ``at``: it
        stands at the bad batch's base offset (past batches with no record left for us
        before it, as ``drain`` moves over them too) when the headers can be walked."""
        if data:
            first: int | None = None
            try:
                for pos, header in iter_headers(data):
                    if header.base_offset + header.last_offset_delta < at:
                        continue
                    if first is None:
                        first = header.base_offset
                    try:
                        check_batch(data, pos, header)
                    except KafkaError:
                        first = header.base_offset
                        break
            except KafkaError:
                pass
            if first is not None:
                at = max(at, first)
        return corrupt_record_error(tp, at, exc), at

    def drain(self, max_records: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Up to ``max_records`` buffered records, advancing each partition's position.

        Raises the CorruptRecordError of a partition whose position reached a batch that
        did not decode, unless records were collected first (then the next call raises).
        """
        return {tp: _records(p) for tp, p in self._drain(max_records, list).items()}

    def drain_columns(self, max_records: int) -> dict[TopicPartition, ColumnBuffers]:
        """``drain`` as column buffers: raw keys and values (no deserializers), positions
        advanced exactly as ``drain`` does."""
        return {tp: ColumnBuffers.concat(p) for tp, p in self._drain(max_records, ColumnBuffers).items()}

    def drain_column_lists(self, max_records: int) -> dict[TopicPartition, RecordColumns]:
        """``drain_columns`` as lists (``RecordColumns``, decoded straight into lists)."""
        return {tp: _lists(p) for tp, p in self._drain(max_records, RecordColumns).items()}

    def _drain(self, max_records: int, kind: type) -> dict[TopicPartition, list[Any]]:
        """Per partition, the pieces (of responses decoded as ``kind``) of up to ``max_records`` records.

        A partition whose position reached a batch that did not decode is stepped over
        (its response stays buffered, the error standing) while the other partitions'
        responses, before or after it in the buffer, are drained. Its CorruptRecordError
        is raised when nothing else was collected, or by the next call (first thing) when
        something was: so the healthy partitions keep flowing and the error is not
        starved by them (Kafka's fetcher raises only once nothing was fetched, and again
        until the application seeks).
        """
        pieces: dict[TopicPartition, list[Any]] = {}
        n = 0
        buffer = self._buffer
        partitions = self._subs.partitions
        if self._error_due:
            self._error_due = False
            standing = self._standing_error()
            if standing is not None:
                raise standing
        blocked: set[TopicPartition] = set()
        error: CorruptRecordError | None = None
        k = 0  # the chunk looked at: chunks before it belong to blocked partitions
        while k < len(buffer) and n < max_records:
            chunk = buffer[k]
            tp = chunk.tp
            if tp in blocked:
                k += 1
                continue
            st = partitions.get(tp)
            # Records of unassigned, paused or re-positioned partitions are dropped;
            # they are fetched again from the position when wanted.
            if st is None or st.paused or st.position is None:
                del buffer[k]
                continue
            position = st.position
            decoded = chunk.decoded
            if decoded is None or type(decoded) is not kind:
                decoded = self._decode(chunk, position, kind)
            i = chunk.index
            if isinstance(decoded, list):
                size = len(decoded)
                if i < size and decoded[i].offset < position:
                    i = bisect_left(decoded, position, i, key=_record_offset)
                j = min(size, i + max_records - n)
                last = decoded[j - 1].offset if j > i else 0
            else:
                offsets = decoded.offsets
                size = len(offsets)
                if i < size and offsets[i] < position:
                    i = bisect_left(offsets, position, i)
                j = min(size, i + max_records - n)
                last = offsets[j - 1] if j > i else 0
            if j > i:
                if i == 0 and j == size:
                    take: Any = decoded
                elif isinstance(decoded, RecordColumns):
                    take = _slice(decoded, i, j)
                else:
                    take = decoded[i:j]
                got = pieces.get(tp)
                if got is None:
                    pieces[tp] = [take]
                else:
                    got.append(take)
                st.position = last + 1
                n += j - i
            chunk.index = j
            if j < size:
                continue
            if chunk.error is not None and st.position <= chunk.error[1]:
                # Every record before the bad batch is handed out: the position moves to
                # it (over batches with no record left for us) and stays there.
                st.position = chunk.error[1]
                blocked.add(tp)
                if error is None:
                    error = chunk.error[0]
                k += 1
                continue
            end = chunk.next_fetch_offset()
            if chunk.error is None and end is not None and end > st.position:
                # Past batches with no record left for us (emptied by compaction, control
                # batches), as Kafka's CompletedFetch moves to the last batch's next offset.
                st.position = end
            if k:
                del buffer[k]
            else:
                buffer.popleft()
        if n:
            self.metrics.records_consumed.record(n)
        if error is not None:
            if not pieces:
                raise error
            self._error_due = True
        return pieces

    def _standing_error(self) -> CorruptRecordError | None:
        """The error of the first buffered response whose partition's position stands at
        its bad batch (still assigned, not paused), if any."""
        partitions = self._subs.partitions
        for chunk in self._buffer:
            if chunk.error is None:
                continue
            st = partitions.get(chunk.tp)
            if st is not None and not st.paused and st.position == chunk.error[1]:
                return chunk.error[0]
        return None

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

    def _send(
        self,
        kind: str,
        address: str,
        method: str,
        request: Any,
        partitions: dict[TopicPartition, int],
        session: FetchRequestData | None = None,
    ) -> None:
        timeout = self._transport.request_timeout_s
        if kind == "fetch":
            timeout += request.max_wait_ms / 1000.0
        future = getattr(self._transport.stub(address), method).future(request, timeout=timeout)
        pending = _Request(kind, address, future, partitions, time.monotonic(), session)
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

    def _fetch_offsets(self) -> tuple[set[TopicPartition], dict[TopicPartition, int]]:
        """Partitions that may not be fetched now, and where the others' next fetch starts
        when something is buffered for them (else: their position)."""
        busy = {tp for r in self._fetches.values() for tp in r.partitions}
        counts: dict[TopicPartition, int] = {}
        ends: dict[TopicPartition, int] = {}
        for chunk in self._buffer:
            tp = chunk.tp
            counts[tp] = counts.get(tp, 0) + 1
            end = None if chunk.error is not None else chunk.next_fetch_offset()
            if end is None or counts[tp] > 1:
                busy.add(tp)
            else:
                ends[tp] = end
        return busy, ends

    def expected_fetch_offset(self, tp: TopicPartition, position: int) -> int:
        """Where a Fetch answered now for ``tp`` must have started to be usable."""
        expected = position
        for chunk in self._buffer:
            if chunk.tp == tp:
                end = chunk.next_fetch_offset()
                expected = -1 if end is None else end
        return expected

    def send_fetches(self) -> None:
        """A Fetch to every leader without one in flight, for its ready partitions: in a
        fetch session with that leader (KIP-227), the first one full, the next ones naming
        only the partitions whose fetch offset changed and those no longer fetched."""
        busy, ends = self._fetch_offsets()
        max_partition_bytes = self._cfg["max_partition_fetch_bytes"]
        for addr, tps in self._by_leader(self._subs.fetchable(), busy).items():
            if addr in self._fetches:
                continue
            offsets: dict[TopicPartition, int] = {}
            wanted: dict[tuple[str, int], PartitionData] = {}
            for tp in tps:
                position = ends.get(tp)
                if position is None:
                    position = self._subs.partitions[tp].position or 0
                offsets[tp] = position
                wanted[(tp.topic, tp.partition)] = PartitionData(position, -1, -1, max_partition_bytes)
            session = self._sessions.get(addr)
            if session is None:
                session = self._sessions[addr] = FetchSessionHandler()
            data = session.build_all(wanted)
            req = log_pb2.FetchRequest(
                replica_id=-1,
                max_wait_ms=self._cfg["fetch_max_wait_ms"],
                min_bytes=self._cfg["fetch_min_bytes"],
                max_bytes=self._cfg["fetch_max_bytes"],
                session_id=data.session_id,
                session_epoch=data.epoch,
                isolation_level=to_proto(self._isolation),
            )
            topics: dict[str, Any] = {}
            for (topic, index), d in data.to_send.items():
                t = topics.get(topic)
                if t is None:
                    t = topics[topic] = req.topics.add(name=topic)
                t.partitions.add(
                    index=index, fetch_offset=d.fetch_offset, partition_max_bytes=d.max_bytes, current_leader_epoch=-1
                )
            forgotten: dict[str, Any] = {}
            for topic, index in data.forgotten:
                f = forgotten.get(topic)
                if f is None:
                    f = forgotten[topic] = req.forgotten_topics_data.add(name=topic)
                f.partitions.append(index)
            self._send("fetch", addr, "Fetch", req, offsets, data)

    def send_list_offsets(self, targets: Mapping[TopicPartition, int]) -> None:
        """ListOffsets for partitions waiting for a reset (``targets``: partition ->
        EARLIEST / LATEST / a timestamp), one request per leader; answers set positions."""
        busy = {tp for r in self._listing for tp in r.partitions}
        for addr, tps in self._by_leader(targets, busy).items():
            req = log_pb2.ListOffsetsRequest(replica_id=-1, isolation_level=to_proto(self._isolation))
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
            self.metrics.fetch_latency_ms.record((time.monotonic() - req.sent) * 1000.0)
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
            if req.session is not None and (session := self._sessions.get(req.address)) is not None:
                session.reset()  # the next Fetch there is a full one
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

    @staticmethod
    def _committed_chunk(tp: TopicPartition, records: bytes, fetch_offset: int, aborted: Iterable[Any]) -> _Chunk:
        """A read_committed answer's chunk: ``records`` without the aborted transactions'
        batches, its end (where the next fetch starts) that of ``records`` as they came."""
        chunk = _Chunk(tp, records, fetch_offset)
        end = chunk.next_fetch_offset()
        txns = [AbortedTransaction(t.producer_id, t.first_offset) for t in aborted]
        kept = drop_aborted(records, txns)
        if kept is not records:
            chunk.data = bytes(kept)
        chunk.end = end
        return chunk

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
        session = self._sessions.get(req.address)
        if req.session is not None and session is not None:
            if not session.handle_response(req.session, resp.session_id, resp.error_code):
                # FETCH_SESSION_ID_NOT_FOUND (the broker restarted, or evicted it) or
                # INVALID_FETCH_SESSION_EPOCH: the next Fetch there is a full one, at once.
                log.debug("fetch session with %s ended: %s", req.address, for_code(resp.error_code)(resp.error_message))
                return
        fetched = 0
        for t in resp.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.index)
                st = self._subs.partitions.get(tp)
                fetch_offset = req.partitions.get(tp)
                if st is None or st.position is None or fetch_offset is None:
                    continue  # unassigned or re-positioned since the request was sent
                if fetch_offset != self.expected_fetch_offset(tp, st.position):
                    continue  # re-positioned, or what it followed was dropped
                if p.error_code:
                    if fetch_offset != st.position:
                        continue  # a prefetch: the error shows again once the buffer is consumed
                    err = for_code(p.error_code)(f"{tp.topic}-{tp.partition}: {p.error_message}")
                    if isinstance(err, CorruptRecordError):
                        # The leader could not read a batch there (Kafka's consumer raises for
                        # CORRUPT_MESSAGE): this partition's error, standing at its position
                        # until the application seeks, as for a batch that does not decode.
                        chunk = _Chunk(tp, b"", fetch_offset)
                        chunk.error = (corrupt_record_error(tp, fetch_offset, err), fetch_offset)
                        log.warning("%s", chunk.error[0])
                        self._buffer.append(chunk)
                        self._retry_at.pop(tp, None)
                    elif isinstance(err, OffsetOutOfRangeError):
                        if self._subs.default_reset == "none":
                            raise err
                        st.position = None
                        st.reset_to = EARLIEST if self._subs.default_reset == "earliest" else LATEST
                    else:
                        self._partition_error(tp, err)
                    continue
                self._retry_at.pop(tp, None)
                st.high_watermark = p.high_watermark
                st.last_stable_offset = p.last_stable_offset
                records = p.records  # each read of a bytes field is a copy
                if records:
                    if self._read_committed and p.aborted_transactions:
                        chunk = self._committed_chunk(tp, records, fetch_offset, p.aborted_transactions)
                    else:
                        chunk = _Chunk(tp, records, fetch_offset)
                    self._buffer.append(chunk)
                    fetched += len(records)
        self.metrics.bytes_consumed.record(fetched)
