"""The producer facade (kafka-python's ``KafkaProducer`` shape) over its role objects.

``send`` serializes and checks one record, picks its partition (explicit; murmur2 of
the key as Kafka does; keyless records stick to one partition per batch and move
round-robin to the next when that batch closes) from a cached partition list, and
appends it to the partition's open batch in the :class:`RecordAccumulator` (one lock
acquisition; the returned future is a three-slot view on the batch's result).
``send_batch`` encodes whole sequences into batches in one call each. The
:class:`Sender` thread drains ready batches into Produce requests, several in flight
per broker, and handles their outcomes; :class:`Sequences` holds the idempotence state.
With ``transactional_id`` (which implies idempotence), :class:`TransactionManager` holds
the transaction's state: ``init_transactions``, ``begin_transaction``,
``send_offsets_to_transaction``, ``commit_transaction`` and ``abort_transaction`` are
kafka-python's and confluent-kafka's calls, and ``send`` is allowed inside a
transaction only.

The partition lists are cached per topic and rebuilt whenever the producer's metadata
is refreshed (the sender refreshes it when a send failed, or every
``metadata_max_age_ms``); a topic not cached yet is looked up (waiting up to
``max_block_ms``) by the call that needs it.

Thread safety: ``send``, ``send_batch``, ``flush`` and ``close`` may be called from any thread.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import operator
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kclient.compat import check_configs
from kclient.errors import (
    IllegalStateError,
    InvalidConfigError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    UnknownTopicOrPartitionError,
)
from kclient.metadata import ClusterMetadata
from kclient.partitioner import partition_for_key
from kclient.producer.accumulator import RecordAccumulator
from kclient.producer.futures import FutureBatchMetadata, FutureRecordMetadata, Run, in_send_callback
from kclient.producer.sender import Sender
from kclient.producer.sequences import MAX_IN_FLIGHT, Sequences, fetch_producer_id
from kclient.producer.transactions import TransactionManager
from kclient.records import HEADER_SIZE, MAX_RECORD_OVERHEAD, Compression, encode_batch
from kclient.security import DEFAULT_SECURITY_CONFIG, SecurityConfig
from kclient.structs import OffsetAndMetadata, TopicPartition
from kclient.transport import Transport

log = logging.getLogger(__name__)

CANCELLED_BATCHES_WAIT_S = 1.0
"""How long close() waits, after cancelling the calls in flight, for their batches to fail."""

Headers = Sequence[tuple[str, bytes | None]]

_RECORD_BOUND = HEADER_SIZE + MAX_RECORD_OVERHEAD
"""Bytes a record may need beyond its key, value and headers, batch header included."""
_REQUEST_OVERHEAD = 1024
"""Room left in a request for everything but the batch (topic names, framing)."""
_time_ns = time.time_ns


def _acks(value: Any) -> int:
    if value in ("all", -1, "-1"):
        return -1
    if value in (0, 1, "0", "1"):
        return int(value)
    raise InvalidConfigError(f"acks must be 0, 1 or 'all', got {value!r}")


def _varint_size(z: int) -> int:
    n = 1
    while z > 0x7F:
        z >>= 7
        n += 1
    return n


def _headers_bound(headers: Headers | None) -> int:
    if not headers:
        return 1
    return 5 + sum(len(k.encode()) + (len(v) if v else 0) + 10 for k, v in headers)


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
        "max_in_flight_requests_per_connection": 5,
        "key_serializer": None,
        "value_serializer": None,
        "enable_idempotence": True,
        "transactional_id": None,
        "transaction_timeout_ms": 60000,
        **DEFAULT_SECURITY_CONFIG,
    }

    def __init__(self, **configs: Any) -> None:
        check_configs("producer", configs, self.DEFAULT_CONFIG)  # kafka-python's extras: logged, ignored
        cfg = {**self.DEFAULT_CONFIG, **configs}
        self.config = cfg
        acks = _acks(cfg["acks"])
        transactional_id: str | None = cfg["transactional_id"] or None
        idempotent = bool(cfg["enable_idempotence"])
        if transactional_id is not None:
            # A transactional producer is idempotent (Kafka's rule): refuse what contradicts it.
            if "enable_idempotence" in configs and not idempotent:
                raise InvalidConfigError("transactional_id needs enable_idempotence=True")
            if acks != -1:
                raise InvalidConfigError(f"transactional_id needs acks='all', got acks={cfg['acks']!r}")
            if int(cfg["max_in_flight_requests_per_connection"]) > MAX_IN_FLIGHT:
                raise InvalidConfigError(
                    f"transactional_id needs max_in_flight_requests_per_connection <= {MAX_IN_FLIGHT}"
                )
            idempotent = True
        if idempotent and acks != -1:
            if "enable_idempotence" in configs:
                raise InvalidConfigError(
                    f"enable_idempotence=True needs acks='all', got acks={cfg['acks']!r}: "
                    "set acks='all' or enable_idempotence=False"
                )
            idempotent = False  # acks=0/1 without a word about idempotence: off, as Kafka 3.x
        max_in_flight = int(cfg["max_in_flight_requests_per_connection"])
        if max_in_flight < 1:
            raise InvalidConfigError(f"max_in_flight_requests_per_connection must be >= 1, got {max_in_flight}")
        if idempotent and max_in_flight > MAX_IN_FLIGHT:
            if "enable_idempotence" in configs:
                raise InvalidConfigError(
                    f"enable_idempotence=True needs max_in_flight_requests_per_connection <= {MAX_IN_FLIGHT}, "
                    f"got {max_in_flight}"
                )
            idempotent = False
        cfg["enable_idempotence"] = idempotent
        self._max_request_size = int(cfg["max_request_size"])
        self._batch_size = int(cfg["batch_size"])
        self._bulk_limit = max(self._batch_size, self._max_request_size - _REQUEST_OVERHEAD)
        self._max_block_s = cfg["max_block_ms"] / 1000.0
        self._compression = Compression.from_name(cfg["compression_type"] or "none")
        self._key_serializer: Callable[[Any], bytes] | None = cfg["key_serializer"]
        self._value_serializer: Callable[[Any], bytes] | None = cfg["value_serializer"]
        self._closed = False
        self._partitions: dict[str, tuple[int, ...]] = {}
        security = SecurityConfig.from_configs(cfg)
        self._transport = Transport(
            cfg["bootstrap_servers"], cfg["request_timeout_ms"], **({"security": security} if security else {})
        )
        self._metadata = ClusterMetadata(self._transport, cfg["metadata_max_age_ms"], cfg["retry_backoff_ms"])
        self._sequences = Sequences() if idempotent else None
        self._producer_id_lock = threading.Lock()
        self._accumulator = RecordAccumulator(
            batch_size=self._batch_size,
            buffer_memory=int(cfg["buffer_memory"]),
            linger_ms=cfg["linger_ms"],
            compression=self._compression,
            max_block_ms=cfg["max_block_ms"],
            sequences=self._sequences,
        )
        self._sender = Sender(
            self._accumulator,
            self._metadata,
            self._transport,
            self._sequences,
            acks=acks,
            request_timeout_ms=cfg["request_timeout_ms"],
            delivery_timeout_ms=cfg["delivery_timeout_ms"],
            retry_backoff_ms=cfg["retry_backoff_ms"],
            max_request_size=self._max_request_size,
            max_in_flight=max_in_flight,
            on_metadata=self._metadata_refreshed,
        )
        self._append = self._accumulator.append
        self._needs_producer_id = idempotent
        self._txn: TransactionManager | None = None
        if transactional_id is not None:
            self._accumulator.make_transactional()
            transport = self._transport
            metadata = self._metadata
            self._txn = TransactionManager(
                transactional_id,
                int(cfg["transaction_timeout_ms"]),
                self._accumulator,
                call=transport.call,
                call_any=lambda method, request, timeout_s=None: transport.call_any(
                    method, request, metadata.broker_addresses(), timeout_s=timeout_s
                ),
                retry_backoff_ms=cfg["retry_backoff_ms"],
                request_timeout_ms=cfg["request_timeout_ms"],
            )
            self._sender.txn = self._txn
            self._needs_producer_id = False  # init_transactions gets it
        self._sender.start()

    # --- transactions (KIP-98; kafka-python's and confluent-kafka's names) ------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        """Fence older producers of ``transactional_id``, finish (abort) their open
        transaction, and get this producer's id and epoch. Call once before the first
        transaction; after a KafkaTimeoutError it may be called again. ``timeout`` in
        seconds (default: ``max_block_ms``)."""
        txn = self._transactional("init_transactions")
        seqs = self._sequences
        assert seqs is not None

        def set_producer_id(pid: int, epoch: int) -> None:
            with self._accumulator.lock:
                seqs.set_producer_id(pid, epoch)

        txn.init_transactions(self._max_block_s if timeout is None else timeout, set_producer_id)

    def begin_transaction(self) -> None:
        """Start a transaction: the records sent until it commits or aborts belong to it."""
        self._transactional("begin_transaction").begin_transaction()

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
        consumer_group_metadata: Any,
        timeout: float | None = None,
    ) -> None:
        """Commit a consumer group's offsets (the next offset to read, per partition) as
        part of the transaction: they become the group's committed offsets when it commits,
        and never if it aborts. ``consumer_group_metadata``: the group id, or a consumer's
        group metadata (``group_id``, ``generation_id``, ``member_id``,
        ``group_instance_id``), which lets the group's coordinator fence a zombie member
        (KIP-447)."""
        self._transactional("send_offsets_to_transaction").send_offsets_to_transaction(
            offsets, consumer_group_metadata, self._max_block_s if timeout is None else timeout
        )

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Send every record of the transaction, then commit it. If a record failed, raises
        its error and the transaction must be aborted (``abort_transaction``). After a
        KafkaTimeoutError it may be called again."""
        self._transactional("commit_transaction").commit_transaction(
            self._max_block_s if timeout is None else timeout, self._flush_for_transaction
        )

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction: records not sent yet fail (TransactionAbortedError), those
        sent are never visible to read_committed consumers. After a KafkaTimeoutError it may
        be called again."""
        self._transactional("abort_transaction").abort_transaction(
            self._max_block_s if timeout is None else timeout, self._flush_for_transaction
        )

    def _transactional(self, what: str) -> TransactionManager:
        if self._txn is None:
            raise IllegalStateError(f"{what} needs a transactional producer (set transactional_id)")
        if self._closed:
            raise IllegalStateError(f"{what} after close")
        return self._txn

    def _flush_for_transaction(self, timeout: float) -> None:
        try:
            self.flush(timeout)
        except KafkaTimeoutError as exc:
            raise KafkaTimeoutError(f"the transaction's records were not all sent within {timeout:.1f}s") from exc

    # --- public API ----------------------------------------------------------------------

    def partitions_for(self, topic: str) -> set[int]:
        return self._metadata.wait_for_partitions(topic, self._max_block_s)

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        headers: Headers | None = None,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Queue one record; the future gives its RecordMetadata once acknowledged."""
        if self._closed:
            raise IllegalStateError("send after close")
        if self._txn is not None:
            self._txn.check_send()
        size = _RECORD_BOUND
        if value is not None:
            if self._value_serializer is not None:
                value = self._value_serializer(value)
            if type(value) is not bytes and not isinstance(value, bytearray | memoryview):
                raise TypeError(f"value must be bytes or None (or set value_serializer), got {type(value).__name__}")
            size += len(value)
        if key is not None:
            if self._key_serializer is not None:
                key = self._key_serializer(key)
            if type(key) is not bytes and not isinstance(key, bytearray | memoryview):
                raise TypeError(f"key must be bytes or None (or set key_serializer), got {type(key).__name__}")
            size += len(key)
        if headers:
            size += sum(len(k) + (len(v) if v else 0) + 10 for k, v in headers)
        if size > self._max_request_size:
            raise MessageSizeTooLargeError(
                f"the record is {size} bytes, larger than max_request_size {self._max_request_size}"
            )
        parts = self._partitions.get(topic)
        if parts is None:
            parts = self._load_partitions(topic)
        if partition is not None:
            if partition not in parts:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition}")
        elif key is not None:
            partition = partition_for_key(key if type(key) is bytes else bytes(key), len(parts))
        if timestamp_ms is None:
            timestamp_ms = _time_ns() // 1_000_000
        if self._needs_producer_id:
            self._init_producer_id()
        return self._append(topic, partition, parts, timestamp_ms, key, value, headers or (), size)

    def send_batch(
        self,
        topic: str,
        values: Sequence[Any],
        keys: Sequence[Any] | None = None,
        partition: int | None = None,
        headers: Sequence[Headers | None] | None = None,
        timestamps: Sequence[int] | None = None,
    ) -> FutureBatchMetadata:
        """Queue many records in one call: record ``i`` is ``values[i]`` with ``keys[i]``,
        ``headers[i]`` and ``timestamps[i]`` (each optional; timestamps default to now).

        Keyed records go to murmur2(key) as with ``send``; keyless ones (without
        ``partition``) go a whole batch at a time to the topic's sticky partition, which
        moves on after each batch, so they spread round-robin by batch. Each partition's
        records are encoded into as few batches as ``max_request_size`` allows (the
        records of one call are already batched by the caller, so neither ``linger_ms``
        nor ``batch_size`` holds them back). Returns one :class:`FutureBatchMetadata`
        whose value gives every record's partition and offset (``.partitions``,
        ``.offsets``, or item ``i`` as a RecordMetadata).

        Checked before anything is queued: the lengths of keys/headers/timestamps, the
        partition, and that no record exceeds ``max_request_size``. A value or key that
        is not bytes (or None) raises TypeError from the encoder, after the batches made
        from the records before it were queued. A batch the topic refuses as too large
        (its ``max.message.bytes`` below ``max_request_size``) fails with
        MessageSizeTooLargeError; it is not split again as Kafka's producer does.
        """
        if self._closed:
            raise IllegalStateError("send after close")
        if self._txn is not None:
            self._txn.check_send()
        n = len(values)
        for name, seq in (("keys", keys), ("headers", headers), ("timestamps", timestamps)):
            if seq is not None and len(seq) != n:
                raise ValueError(f"{name} has {len(seq)} entries for {n} values")
        if self._value_serializer is not None:
            ser = self._value_serializer
            values = [None if v is None else ser(v) for v in values]
        if keys is not None and self._key_serializer is not None:
            kser = self._key_serializer
            keys = [None if k is None else kser(k) for k in keys]
        parts = self._partitions.get(topic)
        if parts is None:
            parts = self._load_partitions(topic)
        if partition is not None and partition not in parts:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition}")
        if not n:
            return FutureBatchMetadata(topic, 0, [])
        if self._needs_producer_id:
            self._init_producer_id()
        groups: list[tuple[int | None, Sequence[int]]]
        if partition is not None or keys is None:
            groups = [(partition, range(n))]
        else:
            by_partition: dict[int | None, list[int]] = {}
            count = len(parts)
            for i, k in enumerate(keys):
                p = None if k is None else partition_for_key(k if type(k) is bytes else bytes(k), count)
                group = by_partition.get(p)
                if group is None:
                    group = by_partition[p] = []
                group.append(i)
            groups = list(by_partition.items())
        base_ts = int(time.time() * 1000)
        runs: list[Run] = []
        for p, indices in groups:
            for chunk, size in self._chunks(indices, values, keys, headers, timestamps):
                runs.append(self._send_chunk(topic, p, parts, chunk, size, values, keys, headers, timestamps, base_ts))
        return FutureBatchMetadata(topic, n, runs)

    def metrics(self, raw: bool = False) -> dict[str, dict[str, float]]:
        """kafka-python's ``metrics()``: ``{"producer-metrics": {name: value}}`` with
        record-send-rate/-total, record-retry-*, record-error-*, batch-size-avg/-max,
        outgoing-byte-*, request-*, request-latency-avg/-max (ms), requests-in-flight.
        Rates are per second over the last 30-60 s. ``raw`` is accepted and ignored."""
        with self._accumulator.lock:
            in_flight = sum(self._sender.requests_in_flight.values())
        return self._sender.metrics.snapshot(in_flight)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered and wait for every outcome.

        Raises IllegalStateError inside a send callback (as Kafka's producer does): the
        callback's own batch completes only once the callback returns."""
        if in_send_callback(self._accumulator):
            raise IllegalStateError("flush() inside a send callback is not permitted: it would wait for itself")
        acc = self._accumulator
        deadline = None if timeout is None else time.monotonic() + timeout
        with acc.cond:
            acc.flushing += 1
            acc.cond.notify_all()
            try:
                while acc.pending:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise KafkaTimeoutError(f"flush did not finish within {timeout}s")
                    acc.cond.wait(left if left is not None else 1.0)
            finally:
                acc.flushing -= 1

    def close(self, timeout: float | None = None) -> None:
        """Send what is buffered and wait up to ``timeout`` seconds (``None``: until every
        batch has its outcome), then release the connections. Returns within about
        ``timeout`` and does not raise for it: batches still undelivered then fail with
        KafkaTimeoutError on their futures.

        Inside a send callback it closes at once, as Kafka's ``close(0)``: a callback runs
        on the producer's own threads, which close() would otherwise wait for."""
        if self._closed:
            return
        if in_send_callback(self._accumulator):
            log.warning("close() called from a send callback: closing at once; undelivered batches fail")
            self._abort(time.monotonic(), wait=False)
            return
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        try:
            self.flush(timeout)
        except KafkaTimeoutError:
            pass
        finally:
            self._abort(deadline)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -----------------------------------------------------------------------

    def _abort(self, deadline: float | None, wait: bool = True) -> None:
        """Fail what is queued, stop the sender and close the channels; without ``wait``
        (from a callback, on the sender's or a channel's thread) nothing is joined."""
        self._closed = True
        acc = self._accumulator
        with acc.cond:
            acc.closed = True
            self._sender.aborted = bool(acc.pending)
            acc.cond.notify_all()
        aborted = acc.take_queued()
        err = KafkaTimeoutError("the producer was closed before the batch was acknowledged")
        for b in aborted:
            b.fail(err)
            acc.complete(b, in_flight=False)
        if not wait:
            self._transport.close(wait=False)  # the calls in flight fail; their callbacks run elsewhere
            return
        if not self._sender.aborted:
            # Nothing left to send: the sender may still be in a metadata refresh (or a
            # producer id request) of up to request_timeout_ms; closing the channels first
            # cancels it, so close() does not wait it out.
            self._transport.close()
        left = 5.0 if deadline is None else max(deadline - time.monotonic(), 0.0)
        self._sender.join(min(left, 5.0))
        # Closing the channels cancels the calls in flight: their batches fail on gRPC's
        # threads a moment later. Like Kafka's, close() returns once every record has its
        # outcome (bounded: a callback of the application's runs there too).
        self._transport.close()
        with acc.cond:
            acc.cond.wait_for(lambda: acc.pending <= 0, timeout=CANCELLED_BATCHES_WAIT_S)

    def _load_partitions(self, topic: str) -> tuple[int, ...]:
        parts = tuple(sorted(self._metadata.wait_for_partitions(topic, self._max_block_s)))
        self._partitions = {**self._partitions, topic: parts}
        return parts

    def _metadata_refreshed(self) -> None:
        """Sender thread, after a metadata refresh: rebuild the partition cache."""
        fresh: dict[str, tuple[int, ...]] = {}
        for topic in self._partitions:
            parts = self._metadata.partitions_for(topic)
            if parts:
                fresh[topic] = tuple(sorted(parts))
        self._partitions = fresh

    def _init_producer_id(self) -> None:
        """Get the producer id and epoch before the first batch (blocks up to max_block_ms)."""
        seqs = self._sequences
        assert seqs is not None
        with self._producer_id_lock:
            if not seqs.needs_producer_id:
                return
            deadline = time.monotonic() + self._max_block_s
            pid, epoch = fetch_producer_id(self._sender.call_any, deadline, self.config["retry_backoff_ms"] / 1000.0)
            with self._accumulator.lock:
                seqs.set_producer_id(pid, epoch)
            self._needs_producer_id = False
            log.debug("idempotent producer: producer id %d, epoch %d", pid, epoch)

    def _chunks(
        self,
        indices: Sequence[int],
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Headers | None] | None,
        timestamps: Sequence[int] | None,
    ) -> list[tuple[Sequence[int], int]]:
        """``indices`` cut into runs whose batch fits ``max_request_size``, with a size
        bound of each (from the lengths: exact enough to fill a batch to ~99 %)."""
        whole = type(indices) is range and len(indices) == len(values)
        vals = values if whole else [values[i] for i in indices]
        try:
            lens = list(map(len, vals))  # type: ignore[arg-type]
            min_value = min(lens)
        except TypeError:  # null values (anything else but bytes fails in the encoder)
            lens = [0 if v is None else len(v) for v in vals]
            min_value = -1
        max_value = max(lens)
        klens: list[int] | None = None
        if keys is not None:
            ks = keys if whole else [keys[i] for i in indices]
            klens = [0 if k is None else len(k) for k in ks]
        hbounds = None if headers is None else [_headers_bound(headers[i]) for i in indices]
        max_key = max(klens) if klens else 0
        max_headers = max(hbounds) if hbounds else 1
        ts_size = 1 if timestamps is None else 10
        key_size = 1 if keys is None else _varint_size(max_key << 1)
        body = 1 + ts_size + 3 + key_size + max_key + _varint_size(max_value << 1) + max_value + max_headers
        fixed = _varint_size(body << 1) + body - max_value - max_key - (max_headers if hbounds is not None else 0)
        biggest = fixed + max_value + max_key + (max_headers if hbounds is not None else 0)
        if HEADER_SIZE + biggest > self._max_request_size:
            raise MessageSizeTooLargeError(
                f"a record is up to {HEADER_SIZE + biggest} bytes, "
                f"larger than max_request_size {self._max_request_size}"
            )
        limit = self._bulk_limit - HEADER_SIZE
        out: list[tuple[Sequence[int], int]] = []
        n = len(vals)
        if min_value == max_value and klens is None and hbounds is None:
            # Every record has the same bound: cut by count, no running sums.
            per = max(limit // biggest, 1)
            for start in range(0, n, per):
                end = min(start + per, n)
                chunk = range(indices[start], indices[end - 1] + 1) if type(indices) is range else indices[start:end]
                out.append((chunk, HEADER_SIZE + (end - start) * biggest))
            return out
        sizes: Any = map(operator.add, lens, itertools.repeat(fixed))
        if klens is not None:
            sizes = map(operator.add, sizes, klens)
        if hbounds is not None:
            sizes = map(operator.add, sizes, hbounds)
        cum = list(itertools.accumulate(sizes))
        start, base = 0, 0
        while start < n:
            end = max(bisect.bisect_right(cum, base + limit, lo=start), start + 1)
            size = HEADER_SIZE + cum[end - 1] - base
            chunk = range(indices[start], indices[end - 1] + 1) if type(indices) is range else indices[start:end]
            out.append((chunk, size))
            base = cum[end - 1]
            start = end
        return out

    def _send_chunk(
        self,
        topic: str,
        partition: int | None,
        parts: tuple[int, ...],
        chunk: Sequence[int],
        size: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Headers | None] | None,
        timestamps: Sequence[int] | None,
        base_ts: int,
    ) -> Run:
        if type(chunk) is range:
            a, b = chunk.start, chunk.stop
            v = values[a:b]
            k = None if keys is None else keys[a:b]
            h = None if headers is None else headers[a:b]
            t = None if timestamps is None else timestamps[a:b]
        else:
            v = [values[i] for i in chunk]
            k = None if keys is None else [keys[i] for i in chunk]
            h = None if headers is None else [headers[i] for i in chunk]
            t = None if timestamps is None else [timestamps[i] for i in chunk]
        acc = self._accumulator
        tp, stamp = acc.reserve(topic, partition, parts, size, time.monotonic() + self._max_block_s)
        try:
            payload = encode_batch(
                v,
                k,
                None if h is None else [x or () for x in h],
                t,
                base_timestamp=base_ts,
                compression=self._compression,
                producer_id=stamp[0],
                producer_epoch=stamp[1],
                base_sequence=stamp[2],
                is_transactional=self._txn is not None,
            )
        except BaseException:
            acc.release(size)
            raise
        batch = acc.add_encoded(tp, payload, len(chunk), size, stamp)
        return Run(batch.result, chunk, base_ts, t)
