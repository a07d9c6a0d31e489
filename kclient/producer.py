"""The producer: a thin facade over a record accumulator and a sender thread.

``send`` picks the partition (explicit; murmur2 of the key as Kafka does; keyless
records stick to one partition per batch and move round-robin to the next when that
batch closes, so they spread evenly), appends the record to that partition's open
batch and returns a future. The sender thread drains batches that are full, older than
``linger_ms`` or being flushed, groups them by partition leader and sends one Produce
RPC per broker. Retriable errors refresh metadata and put the batch back at the head
of its partition's queue; only one batch per partition is in flight, so retries never
reorder records within a partition.

Idempotence (KIP-98, ``enable_idempotence``, on by default; needs acks=all): before its
first batch the producer gets a producer id and epoch (InitProducerId RPC). Each
partition has a sequence stream; a batch is stamped with (producer id, epoch, base
sequence) when it is created, and the sequence advances by the batch's record count
when it is closed. A retry resends the very same bytes, so the leader recognises a
batch it already wrote and answers with the original offsets instead of writing it
twice. When a batch is sent for the first time its stamp is checked against the
partition's stream; they differ only after an earlier batch of the partition failed
for good (its outcome unknown or refused), which restarts the partition's stream at
sequence 0 with the epoch bumped by the producer itself, as Kafka 2.5+ does (KIP-360;
the producer id is ours alone, and when the 16-bit epoch runs out a new producer id is
fetched). Batches already queued then are rebuilt with their new stamp (decoded and
re-encoded: this only happens after a failure). DUPLICATE_SEQUENCE_NUMBER counts as
success; OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH and UNKNOWN_PRODUCER_ID
fail the batch with that error.

Thread safety: ``send``, ``flush`` and ``close`` may be called from any thread.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from kclient.errors import (
    DuplicateSequenceNumberError,
    IllegalStateError,
    InvalidConfigError,
    KafkaError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    MessageSizeTooLargeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
    for_code,
)
from kclient.metadata import ClusterMetadata
from kclient.partitioner import partition_for_key
from kclient.proto.kbroker.v1 import cluster_pb2, log_pb2
from kclient.records import HEADER_SIZE, NO_PRODUCER_ID, NO_SEQUENCE, BatchBuilder, Compression, decode_batch
from kclient.structs import RecordMetadata, TopicPartition
from kclient.transport import Transport

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes | None]]

_SEQUENCE_SPACE = 2**31
"""Sequences wrap from 2**31 - 1 to 0."""
_MAX_EPOCH = 2**15 - 1
_DUPLICATE_SEQUENCE = DuplicateSequenceNumberError.errno


class ProduceResult:
    """The outcome of one batch, shared by the futures of its records.

    One event per batch, not per record: a record's future is a few slots pointing here.
    Callbacks registered before completion run on the thread that completes the batch,
    after the outcome is set; those registered later run at once on the caller's thread.
    """

    __slots__ = ("_callbacks", "_event", "_lock", "base_offset", "error", "log_append_time")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        self._callbacks: list[tuple[FutureRecordMetadata, Callback]] | None = None

    def done(self, base_offset: int, log_append_time: int, error: BaseException | None) -> None:
        with self._lock:
            self.base_offset, self.log_append_time, self.error = base_offset, log_append_time, error
            self._event.set()
            callbacks, self._callbacks = self._callbacks or [], None
        for fut, cb in callbacks:
            fut._call(cb)

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)

    @property
    def is_done(self) -> bool:
        return self._event.is_set()

    def add_callback(self, fut: FutureRecordMetadata, cb: Callback) -> None:
        with self._lock:
            if not self._event.is_set():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append((fut, cb))
                return
        fut._call(cb)


Callback = tuple[Callable[..., Any], tuple[Any, ...], bool]


class FutureRecordMetadata:
    """The outcome of one ``send`` (kafka-python's ``FutureRecordMetadata``).

    ``get(timeout)`` returns :class:`RecordMetadata` or raises the delivery error;
    ``add_callback(fn, *args)`` / ``add_errback(fn, *args)`` run on the client's network
    thread when the batch completes (at once if it already has).
    """

    __slots__ = ("_index", "_result", "_timestamp", "_tp")

    def __init__(self, result: ProduceResult, tp: TopicPartition, index: int, timestamp: int) -> None:
        self._result = result
        self._tp = tp
        self._index = index
        self._timestamp = timestamp

    def _value(self) -> RecordMetadata:
        r = self._result
        offset = r.base_offset + self._index if r.base_offset >= 0 else -1
        ts = r.log_append_time if r.log_append_time > 0 else self._timestamp
        return RecordMetadata(self._tp.topic, self._tp.partition, offset, ts)

    def get(self, timeout: float | None = None) -> RecordMetadata:
        if not self._result.wait(timeout):
            raise KafkaTimeoutError(f"record not acknowledged within {timeout}s")
        if self._result.error is not None:
            raise self._result.error
        return self._value()

    result = get

    def is_done(self) -> bool:
        return self._result.is_done

    done = is_done

    def succeeded(self) -> bool:
        return self._result.is_done and self._result.error is None

    def failed(self) -> bool:
        return self._result.is_done and self._result.error is not None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._result.wait(timeout):
            raise KafkaTimeoutError(f"record not acknowledged within {timeout}s")
        return self._result.error

    def add_callback(self, fn: Callable[..., Any], *args: Any) -> FutureRecordMetadata:
        """``fn(*args, record_metadata)`` on success."""
        return self._add((fn, args, True))

    def add_errback(self, fn: Callable[..., Any], *args: Any) -> FutureRecordMetadata:
        """``fn(*args, exception)`` on failure."""
        return self._add((fn, args, False))

    def _add(self, cb: Callback) -> FutureRecordMetadata:
        self._result.add_callback(self, cb)
        return self

    def _call(self, cb: Callback) -> None:
        fn, args, on_success = cb
        err = self._result.error
        try:
            if on_success and err is None:
                fn(*args, self._value())
            elif not on_success and err is not None:
                fn(*args, err)
        except Exception:
            log.exception("producer callback failed")


@dataclass
class _Batch:
    tp: TopicPartition
    builder: BatchBuilder
    created: float
    result: ProduceResult = field(default_factory=ProduceResult)
    closed: bool = False
    attempts: int = 0
    retry_at: float = 0.0
    size: int = 0
    # Idempotence: the stamp in the builder's header, and whether the partition's
    # sequence stream has given the batch its place (at its first send; fixed then).
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    base_sequence: int = NO_SEQUENCE
    sequenced: bool = False
    restamp: bool = False

    def fail(self, exc: BaseException) -> None:
        if not self.result.is_done:
            self.result.done(-1, -1, exc)

    def succeed(self, base_offset: int, log_append_time: int) -> None:
        if not self.result.is_done:  # not after close() failed it
            self.result.done(base_offset, log_append_time, None)


@dataclass(slots=True)
class _Sequence:
    """The idempotent sequence stream of one partition."""

    producer_id: int
    epoch: int
    next_seq: int = 0
    """Base sequence of the next batch sent for the first time (authoritative)."""
    tail_seq: int = 0
    """Base sequence stamped on the next batch created (``next_seq`` plus the records of
    the closed batches not sent yet: the stamp the batch will get when sent)."""


def _acks(value: Any) -> int:
    if value in ("all", -1, "-1"):
        return -1
    if value in (0, 1, "0", "1"):
        return int(value)
    raise InvalidConfigError(f"acks must be 0, 1 or 'all', got {value!r}")


class Producer:
    """Publish records to kbroker topics (kafka-python's ``KafkaProducer`` shape)."""

    DEFAULT_CONFIG: dict[str, Any] = {
        "bootstrap_servers": "localhost:9092",
        "client_id": "kclient-producer",
        "acks": "all",
        "linger_ms": 5,
        "batch_size": 16384,
        "compression_type": None,
        "max_request_size": 1048576,
        "buffer_memory": 32 * 1024 * 1024,
        "max_block_ms": 60000,
        "request_timeout_ms": 30000,
        "delivery_timeout_ms": 120000,
        "retry_backoff_ms": 100,
        "metadata_max_age_ms": 300000,
        "key_serializer": None,
        "value_serializer": None,
        "enable_idempotence": True,
    }

    def __init__(self, **configs: Any) -> None:
        unknown = set(configs) - set(self.DEFAULT_CONFIG)
        if unknown:
            raise InvalidConfigError(f"unknown producer setting(s): {', '.join(sorted(unknown))}")
        cfg = {**self.DEFAULT_CONFIG, **configs}
        self.config = cfg
        self._acks = _acks(cfg["acks"])
        idempotent = bool(cfg["enable_idempotence"])
        if idempotent and self._acks != -1:
            if "enable_idempotence" in configs:
                raise InvalidConfigError(
                    f"enable_idempotence=True needs acks='all', got acks={cfg['acks']!r}: "
                    "set acks='all' or enable_idempotence=False"
                )
            idempotent = False  # acks=0/1 without a word about idempotence: off, as Kafka 3.x
        cfg["enable_idempotence"] = idempotent
        self._idempotent = idempotent
        self._compression = Compression.from_name(cfg["compression_type"] or "none")
        self._linger_s = cfg["linger_ms"] / 1000.0
        self._batch_size = int(cfg["batch_size"])
        self._key_serializer: Callable[[Any], bytes] | None = cfg["key_serializer"]
        self._value_serializer: Callable[[Any], bytes] | None = cfg["value_serializer"]
        self._transport = Transport(cfg["bootstrap_servers"], cfg["request_timeout_ms"])
        self._metadata = ClusterMetadata(self._transport, cfg["metadata_max_age_ms"], cfg["retry_backoff_ms"])
        self._lock = threading.Condition()
        self._queues: dict[TopicPartition, deque[_Batch]] = {}
        self._in_flight: set[TopicPartition] = set()
        self._buffered = 0
        self._pending_batches = 0
        self._flushing = 0
        self._closed = False
        self._aborted = False  # close() ran out of time: undelivered batches failed
        self._sticky: dict[str, int] = {}
        self._round_robin = itertools.count()
        self._needs_metadata = threading.Event()
        # Idempotence: producer id and epoch (fetched before the first batch), the
        # sequence stream of each partition, partitions waiting for a new producer id.
        self._needs_producer_id = idempotent
        self._producer_id = NO_PRODUCER_ID
        self._producer_epoch = -1
        self._producer_id_lock = threading.Lock()
        self._sequences: dict[TopicPartition, _Sequence] = {}
        self._awaiting_producer_id: set[TopicPartition] = set()
        self._producer_id_retry_at = 0.0
        self._sender = threading.Thread(target=self._run, name="kclient-producer-sender", daemon=True)
        self._sender.start()

    # --- public API ----------------------------------------------------------------

    def partitions_for(self, topic: str) -> set[int]:
        return self._metadata.wait_for_partitions(topic, self.config["max_block_ms"] / 1000.0)

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        headers: Headers | None = None,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        if self._closed:
            raise IllegalStateError("send after close")
        if self._value_serializer is not None and value is not None:
            value = self._value_serializer(value)
        if self._key_serializer is not None and key is not None:
            key = self._key_serializer(key)
        if value is not None and not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"value must be bytes or None (or set value_serializer), got {type(value).__name__}")
        if key is not None and not isinstance(key, bytes | bytearray | memoryview):
            raise TypeError(f"key must be bytes or None (or set key_serializer), got {type(key).__name__}")
        size = HEADER_SIZE + 21 + (len(value) if value else 0) + (len(key) if key else 0)
        if headers:
            size += sum(len(k) + (len(v) if v else 0) + 10 for k, v in headers)
        if size > self.config["max_request_size"]:
            raise MessageSizeTooLargeError(
                f"the record is {size} bytes, larger than max_request_size {self.config['max_request_size']}"
            )
        parts = self.partitions_for(topic)
        if partition is not None:
            if partition not in parts:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition}")
            p = partition
        elif key is not None:
            p = partition_for_key(bytes(key), len(parts))
        else:
            p = self._sticky_partition(topic, parts)
        ts = timestamp_ms if timestamp_ms is not None else int(time.time() * 1000)
        if self._needs_producer_id:
            self._init_producer_id()
        return self._append(TopicPartition(topic, p), ts, key, value, headers or (), size)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered and wait for every outcome."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._flushing += 1
            self._lock.notify_all()
            try:
                while self._pending_batches:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise KafkaTimeoutError(f"flush did not finish within {timeout}s")
                    self._lock.wait(left if left is not None else 1.0)
            finally:
                self._flushing -= 1

    def close(self, timeout: float | None = None) -> None:
        """Send what is buffered and wait up to ``timeout`` seconds (``None``: until every
        batch has its outcome), then release the connections. Returns within about
        ``timeout`` and does not raise for it: batches still undelivered then fail with
        KafkaTimeoutError on their futures."""
        if self._closed:
            return
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        try:
            self.flush(timeout)
        except KafkaTimeoutError:
            pass
        finally:
            self._abort(deadline)

    def _abort(self, deadline: float | None) -> None:
        with self._lock:
            self._closed = True
            aborted = [b for q in self._queues.values() for b in q]
            self._queues.clear()
            self._aborted = bool(self._pending_batches)
            self._lock.notify_all()
        err = KafkaTimeoutError("the producer was closed before the batch was acknowledged")
        for b in aborted:
            b.fail(err)
        left = 5.0 if deadline is None else max(deadline - time.monotonic(), 0.0)
        self._sender.join(timeout=min(left, 5.0))
        # Closing the channels cancels the calls in flight: their batches fail (see _retry_or_fail).
        self._transport.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- accumulator ---------------------------------------------------------------

    def _sticky_partition(self, topic: str, parts: set[int]) -> int:
        p = self._sticky.get(topic)
        if p is None or p not in parts:
            ordered = sorted(parts)
            p = ordered[next(self._round_robin) % len(ordered)]
            self._sticky[topic] = p
        return p

    def _advance_sticky(self, tp: TopicPartition) -> None:
        if self._sticky.get(tp.topic) == tp.partition:
            del self._sticky[tp.topic]

    def _append(
        self,
        tp: TopicPartition,
        ts: int,
        key: Any,
        value: Any,
        headers: Headers,
        size: int,
    ) -> FutureRecordMetadata:
        deadline = time.monotonic() + self.config["max_block_ms"] / 1000.0
        with self._lock:
            while self._buffered + size > self.config["buffer_memory"] and self._buffered > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KafkaTimeoutError("buffer_memory is full and max_block_ms passed")
                self._lock.wait(left)
            q = self._queues.get(tp)
            if q is None:
                q = self._queues[tp] = deque()
            batch = q[-1] if q and not q[-1].closed else None
            if batch is not None and batch.size + size > self._batch_size:
                self._close_batch(batch)
                self._advance_sticky(tp)
                batch = None
                self._lock.notify_all()
            if batch is None:
                now = time.monotonic()
                batch = (
                    self._new_batch(tp, now) if self._idempotent else _Batch(tp, BatchBuilder(self._compression), now)
                )
                q.append(batch)
                self._pending_batches += 1
                if len(q) == 1:
                    self._lock.notify_all()
            index = batch.builder.append(ts, key, value, headers)
            batch.size += size
            self._buffered += size
            return FutureRecordMetadata(batch.result, tp, index, ts)

    def _new_batch(self, tp: TopicPartition, created: float) -> _Batch:
        """A batch stamped with the partition's next sequence. Holds the lock."""
        seq = self._sequences.get(tp)
        if seq is None:
            seq = self._sequences[tp] = _Sequence(self._producer_id, self._producer_epoch)
        pid, epoch, base = seq.producer_id, seq.epoch, seq.tail_seq
        builder = BatchBuilder(self._compression, producer_id=pid, producer_epoch=epoch, base_sequence=base)
        return _Batch(tp, builder, created, producer_id=pid, producer_epoch=epoch, base_sequence=base)

    def _close_batch(self, b: _Batch) -> None:
        """No more records go into ``b``; its partition's next batch follows it. Holds the lock."""
        if b.closed:
            return
        b.closed = True
        if self._idempotent:
            seq = self._sequences[b.tp]
            seq.tail_seq = (seq.tail_seq + b.builder.record_count) % _SEQUENCE_SPACE

    def _ready(self, now: float) -> tuple[list[_Batch], float]:
        """Batches to send now, and how long to sleep otherwise. Holds the lock."""
        out: list[_Batch] = []
        wait = 0.1
        awaiting = self._awaiting_producer_id
        for tp, q in self._queues.items():
            if not q or tp in self._in_flight or (awaiting and tp in awaiting):
                continue
            b = q[0]
            if b.retry_at > now:
                wait = min(wait, b.retry_at - now)
                continue
            due = b.created + self._linger_s
            if b.closed or len(q) > 1 or self._flushing or self._closed or due <= now:
                out.append(b)
            else:
                wait = min(wait, due - now)
        return out, wait

    # --- sender --------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            if self._awaiting_producer_id and time.monotonic() >= self._producer_id_retry_at:
                self._renew_producer_id()
            with self._lock:
                if self._closed and (self._aborted or not self._pending_batches):
                    return
                batches, wait = self._ready(time.monotonic())
                if not batches:
                    self._lock.wait(wait)
                    continue
                for b in batches:
                    self._in_flight.add(b.tp)
                    self._queues[b.tp].popleft()
                    self._close_batch(b)
                    self._advance_sticky(b.tp)
                    if self._idempotent and not b.sequenced:
                        self._assign_sequence(b)
            if self._idempotent:
                batches = [b for b in batches if not b.restamp or self._restamp(b)]
            self._refresh_metadata()
            self._send(batches)

    # --- idempotence -----------------------------------------------------------------

    def _init_producer_id(self) -> None:
        """Get the producer id and epoch before the first batch (blocks up to max_block_ms)."""
        with self._producer_id_lock:
            if not self._needs_producer_id:
                return
            deadline = time.monotonic() + self.config["max_block_ms"] / 1000.0
            pid, epoch = self._fetch_producer_id(deadline)
            with self._lock:
                self._producer_id, self._producer_epoch = pid, epoch
            self._needs_producer_id = False
            log.debug("idempotent producer: producer id %d, epoch %d", pid, epoch)

    def _fetch_producer_id(self, deadline: float) -> tuple[int, int]:
        """InitProducerId on any broker, retrying retriable errors until ``deadline``."""
        backoff = self.config["retry_backoff_ms"] / 1000.0
        while True:
            try:
                resp = self._transport.call_any(
                    "InitProducerId", cluster_pb2.InitProducerIdRequest(), self._metadata.broker_addresses()
                )
                if not resp.error_code:
                    pid, epoch = int(resp.producer_id), int(resp.producer_epoch)
                    if pid < 0 or not 0 <= epoch <= _MAX_EPOCH:
                        raise KafkaError(f"InitProducerId returned an invalid producer id {pid} / epoch {epoch}")
                    return pid, epoch
                err: KafkaError = for_code(resp.error_code)(resp.error_message)
            except KafkaError as exc:
                err = exc
            if not err.retriable:
                raise err
            if time.monotonic() + backoff >= deadline:
                raise KafkaTimeoutError(f"could not get a producer id (InitProducerId): {err}") from err
            time.sleep(backoff)

    def _assign_sequence(self, b: _Batch) -> None:
        """Give a batch sent for the first time its place in the partition's stream. Holds the lock."""
        seq = self._sequences[b.tp]
        stamp = (seq.producer_id, seq.epoch, seq.next_seq)
        if (b.producer_id, b.producer_epoch, b.base_sequence) != stamp:
            b.producer_id, b.producer_epoch, b.base_sequence = stamp
            b.restamp = True
        b.sequenced = True
        seq.next_seq = (seq.next_seq + b.builder.record_count) % _SEQUENCE_SPACE

    def _restamp(self, b: _Batch) -> bool:
        """Rebuild a batch never sent with the stamp it got (after its stream restarted).

        Returns False if that failed (the batch then failed: it is not to be sent)."""
        try:
            _, records = decode_batch(b.builder.build(), check_crc=False)
            builder = BatchBuilder(
                self._compression,
                producer_id=b.producer_id,
                producer_epoch=b.producer_epoch,
                base_sequence=b.base_sequence,
            )
            for r in records:
                builder.append(r.timestamp, r.key, r.value, r.headers)
        except KafkaError as exc:  # pragma: no cover - our own batch always decodes
            log.exception("could not rebuild a batch for %s-%d", b.tp.topic, b.tp.partition)
            self._retry_or_fail(b, KafkaError(f"could not rebuild the batch with its new sequence: {exc}"))
            return False
        b.builder = builder
        b.restamp = False
        return True

    def _restart_sequence(self, tp: TopicPartition) -> None:
        """A sent batch of ``tp`` failed for good: whether the leader wrote it is unknown
        (or it refused it), so the stream restarts at sequence 0 in a new epoch
        (KIP-360's local epoch bump), or with a new producer id once the epoch is
        exhausted. Holds the lock; nothing of ``tp`` is in flight."""
        seq = self._sequences[tp]
        if 0 <= seq.epoch < _MAX_EPOCH:
            seq.epoch += 1
        else:
            seq.producer_id, seq.epoch = NO_PRODUCER_ID, -1
            self._awaiting_producer_id.add(tp)
        seq.next_seq = 0
        self._resync_tail(tp)
        log.info(
            "%s-%d: a batch failed; the partition's sequence restarts at 0 with producer id %d epoch %d",
            tp.topic,
            tp.partition,
            seq.producer_id,
            seq.epoch,
        )

    def _resync_tail(self, tp: TopicPartition) -> None:
        """Recompute the stamp of the next batch created after the stream changed. Holds the lock."""
        seq = self._sequences[tp]
        tail = seq.next_seq
        for b in self._queues.get(tp, ()):
            if b.closed and not b.sequenced:
                tail += b.builder.record_count
        seq.tail_seq = tail % _SEQUENCE_SPACE

    def _renew_producer_id(self) -> None:
        """Sender thread: a new producer id for the partitions whose epoch ran out."""
        try:
            pid, epoch = self._fetch_producer_id(time.monotonic())
        except KafkaError as exc:
            log.warning("could not get a new producer id: %s", exc)
            now = time.monotonic()
            self._producer_id_retry_at = now + self.config["retry_backoff_ms"] / 1000.0
            expired: list[_Batch] = []
            with self._lock:
                limit = self.config["delivery_timeout_ms"] / 1000.0
                for tp in self._awaiting_producer_id:
                    q = self._queues.get(tp)
                    while q and now - q[0].created > limit:
                        expired.append(q.popleft())
                    self._resync_tail(tp)
            for b in expired:
                b.fail(KafkaTimeoutError(f"batch for {b.tp.topic}-{b.tp.partition} expired waiting for a producer id"))
                self._done(b)
            return
        with self._lock:
            self._producer_id, self._producer_epoch = pid, epoch
            for tp in self._awaiting_producer_id:
                seq = self._sequences[tp]
                seq.producer_id, seq.epoch, seq.next_seq = pid, epoch, 0
                self._resync_tail(tp)
            self._awaiting_producer_id.clear()
            self._lock.notify_all()

    def _refresh_metadata(self) -> None:
        """Refresh when asked (a send failed) or every ``metadata_max_age_ms``."""
        if self._needs_metadata.is_set():
            self._needs_metadata.clear()
            self._metadata.request_update()
        if not self._metadata.maybe_refresh(self.config["request_timeout_ms"] / 1000.0):
            log.warning("metadata refresh failed; retrying after retry_backoff_ms")

    def _send(self, batches: list[_Batch]) -> None:
        by_leader: dict[str, list[_Batch]] = {}
        for b in batches:
            addr = self._metadata.leader_address(b.tp)
            if addr is None:
                self._needs_metadata.set()
                self._retry_or_fail(b, LeaderNotAvailableError(f"no leader known for {b.tp.topic}-{b.tp.partition}"))
                continue
            by_leader.setdefault(addr, []).append(b)
        for addr, group in by_leader.items():
            req = log_pb2.ProduceRequest(acks=self._acks, timeout_ms=self.config["request_timeout_ms"])
            topics: dict[str, Any] = {}
            for b in group:
                b.attempts += 1
                t = topics.get(b.tp.topic)
                if t is None:
                    t = topics[b.tp.topic] = req.topics.add(name=b.tp.topic)
                t.partitions.add(index=b.tp.partition, records=b.builder.build())
            try:
                call = self._transport.stub(addr).Produce.future(
                    req, timeout=self.config["request_timeout_ms"] / 1000.0 + 5
                )
            except KafkaError as exc:
                for b in group:
                    self._retry_or_fail(b, exc)
                continue
            call.add_done_callback(lambda c, g=group, a=addr: self._on_response(c, g, a))

    def _on_response(self, call: Any, group: list[_Batch], addr: str) -> None:
        try:
            resp = call.result()
        except grpc.RpcError as exc:
            err = self._transport.failed(addr, exc)
            self._needs_metadata.set()
            for b in group:
                self._retry_or_fail(b, err)
            return
        except Exception as exc:  # pragma: no cover - cancelled at close
            for b in group:
                self._retry_or_fail(b, KafkaError(str(exc)))
            return
        if self._acks == 0:
            # Nothing is acknowledged; the batch is done once the broker has it.
            for b in group:
                b.succeed(-1, -1)
                self._done(b)
            return
        by_tp = {(t.name, p.index): p for t in resp.topics for p in t.partitions}
        for b in group:
            pr = by_tp.get((b.tp.topic, b.tp.partition))
            if pr is None:
                self._retry_or_fail(b, KafkaError("partition missing from produce response"))
            elif pr.error_code and pr.error_code != _DUPLICATE_SEQUENCE:
                err = for_code(pr.error_code)(pr.error_message)
                if isinstance(err, RequestTimedOutError):
                    # The leader could not replicate in time: it may be cut off (from
                    # ZooKeeper or its followers) while another broker leads now.
                    self._transport.mark_failed(addr)
                    self._needs_metadata.set()
                elif err.invalid_metadata:
                    self._needs_metadata.set()
                self._retry_or_fail(b, err)
            else:
                b.succeed(pr.base_offset, pr.log_append_time_ms)
                self._done(b)

    def _retry_or_fail(self, b: _Batch, err: KafkaError) -> None:
        expired = time.monotonic() - b.created > self.config["delivery_timeout_ms"] / 1000.0
        if err.retriable and not expired and not self._closed:
            with self._lock:
                b.retry_at = time.monotonic() + self.config["retry_backoff_ms"] / 1000.0
                self._queues.setdefault(b.tp, deque()).appendleft(b)
                self._in_flight.discard(b.tp)
                self._lock.notify_all()
            return
        if self._aborted:
            err = KafkaTimeoutError("the producer was closed before the batch was acknowledged")
        elif expired and err.retriable:
            # Report why it kept failing, not just that time ran out.
            err = type(err)(f"{err.message} (gave up after delivery_timeout_ms={self.config['delivery_timeout_ms']})")
        if b.sequenced:
            with self._lock:
                self._restart_sequence(b.tp)
        b.fail(err)
        self._done(b)

    def _done(self, b: _Batch) -> None:
        with self._lock:
            self._in_flight.discard(b.tp)
            self._buffered -= b.size
            self._pending_batches -= 1
            self._lock.notify_all()
