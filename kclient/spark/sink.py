"""The kbroker data source for PySpark: batch and streaming writes.

``df.write.format("kbroker")`` and ``df.writeStream.format("kbroker")`` take the
columns of Spark's Kafka sink:

========== ====================================== ===========================================
column     type                                   meaning
========== ====================================== ===========================================
value      binary or string (required)            the record value (null: a tombstone)
key        binary or string                       the record key (null or absent: no key)
topic      string                                 the topic, unless the ``topic`` option is set
                                                  (the option wins over the column)
partition  int                                    the partition (null or absent: by key, as Kafka)
headers    array<struct<key string, value binary>> record headers
========== ====================================== ===========================================

Other columns are ignored. The columns are checked on the driver when the write starts.
Each write task sends its rows through one batching ``kclient.Producer`` (acks=all
unless ``kafka.acks`` says otherwise, idempotent by default), flushes at the end and
fails if any record was not acknowledged, so a finished task has landed every row.
Delivery is at least once, as with Spark's Kafka sink: a retried task or micro-batch
sends its rows again.

Thread safety: a writer object is pickled to the executors; each ``write`` call owns
its producer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from kclient.errors import KafkaError
from kclient.spark.errors import KbrokerOptionError, UnacknowledgedRecordsError
from kclient.spark.options import SinkOptions

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("kclient.spark")

_COLUMNS = ("value", "key", "topic", "partition", "headers")


@dataclass
class KbrokerCommitMessage(WriterCommitMessage):
    """What one write task landed: acknowledged records per ``topic-partition``."""

    records: int = 0
    per_partition: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Layout:
    """Where each sink column is in the input rows (None: absent) and whether it is text."""

    value: str
    key: str | None
    topic: str | None
    partition: str | None
    headers: str | None


def check_columns(schema: StructType, opts: SinkOptions) -> _Layout:
    """The input columns, checked as Spark's Kafka sink checks them (raises KbrokerOptionError)."""
    by_name = {f.name.lower(): f for f in schema.fields}
    binary_or_string = (BinaryType(), StringType())

    def column(name: str, allowed: tuple[Any, ...], what: str) -> str | None:
        f = by_name.get(name)
        if f is None:
            return None
        if f.dataType not in allowed:
            raise KbrokerOptionError(f"column {f.name!r} must be {what}, not {f.dataType.simpleString()}")
        return f.name

    value = column("value", binary_or_string, "binary or string")
    if value is None:
        raise KbrokerOptionError("required column 'value' not found (columns: " + ", ".join(schema.fieldNames()) + ")")
    topic = column("topic", (StringType(),), "string")
    if topic is None and opts.topic is None:
        raise KbrokerOptionError("no 'topic' column and no 'topic' option: say which topic to write to")
    headers_type = ArrayType(
        StructType().add("key", StringType()).add("value", BinaryType()),
    )
    headers_f = by_name.get("headers")
    if headers_f is not None and not _same_headers_type(headers_f.dataType, headers_type):
        raise KbrokerOptionError(
            f"column 'headers' must be array<struct<key:string,value:binary>>, not {headers_f.dataType.simpleString()}"
        )
    return _Layout(
        value=value,
        key=column("key", binary_or_string, "binary or string"),
        topic=None if opts.topic is not None else topic,
        partition=column("partition", (IntegerType(),), "int"),
        headers=headers_f.name if headers_f is not None else None,
    )


def _same_headers_type(actual: Any, expected: ArrayType) -> bool:
    if not isinstance(actual, ArrayType) or not isinstance(actual.elementType, StructType):
        return False
    fields = [(f.name.lower(), f.dataType) for f in actual.elementType.fields]
    return fields == [(f.name, f.dataType) for f in expected.elementType.fields]  # type: ignore[attr-defined]


def _bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8")
    return bytes(v)


def _headers(hdrs: Any) -> list[tuple[str, bytes | None]] | None:
    return [(h["key"], _bytes(h["value"])) for h in hdrs] if hdrs else None


class _Acks:
    """Counts the outcomes of a task's records (callbacks run on the producer's thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.acked = 0
        self.failed = 0
        self.first_error: BaseException | None = None
        self.per_partition: dict[str, int] = {}

    def ok_batch(self, meta: Any) -> None:
        with self._lock:
            for partition, _base, count in meta.runs:
                key = f"{meta.topic}-{partition}"
                self.acked += count
                self.per_partition[key] = self.per_partition.get(key, 0) + count

    def error(self, exc: BaseException) -> None:
        with self._lock:
            self.failed += 1
            if self.first_error is None:
                self.first_error = exc


def write_rows(opts: SinkOptions, layout: _Layout, batches: Iterator[pa.RecordBatch]) -> KbrokerCommitMessage:
    """Send every row of ``batches``; return only when the brokers acknowledged all of them."""
    from kclient.producer import Producer

    acks = _Acks()
    sent = 0
    producer = Producer(**opts.producer_config())
    try:
        for batch in batches:
            if acks.first_error is not None:
                break
            cols = batch.to_pydict()
            n = batch.num_rows
            topics = cols[layout.topic] if layout.topic else [opts.topic] * n
            parts = cols[layout.partition] if layout.partition else [None] * n
            if None in topics:
                raise KbrokerOptionError("a row has a null 'topic': set the 'topic' option or fill the column")
            # One send_batch per (topic, partition) of the Arrow batch (usually just one).
            groups: dict[tuple[str, int | None], list[int]] = {}
            for i, where in enumerate(zip(topics, parts, strict=True)):
                groups.setdefault(where, []).append(i)
            values, keys, headers = cols[layout.value], cols.get(layout.key or ""), cols.get(layout.headers or "")
            for (topic, partition), rows in groups.items():
                fut = producer.send_batch(
                    topic,
                    [_bytes(values[i]) for i in rows],
                    keys=[_bytes(keys[i]) for i in rows] if keys is not None else None,
                    partition=partition,
                    headers=[_headers(headers[i]) for i in rows] if headers is not None else None,
                )
                fut.add_callback(acks.ok_batch)
                fut.add_errback(acks.error)
                sent += len(rows)
        producer.flush()
    finally:
        producer.close(timeout=30)
    if acks.first_error is not None or acks.acked != sent:
        raise UnacknowledgedRecordsError(
            f"{sent - acks.acked} of {sent} records were not acknowledged"
            + (f"; first error: {acks.first_error}" if acks.first_error is not None else "")
        )
    return KbrokerCommitMessage(records=sent, per_partition=dict(acks.per_partition))


def _check_topic_exists(opts: SinkOptions) -> None:
    if opts.topic is None:
        return
    from kclient.admin import AdminClient

    try:
        with AdminClient(**opts.admin_config()) as admin:
            topics = admin.list_topics()
    except KafkaError as exc:
        raise KbrokerOptionError(f"cannot reach the brokers at {opts.bootstrap}: {exc}") from exc
    if opts.topic not in topics:
        raise KbrokerOptionError(f"option 'topic': unknown topic {opts.topic!r}")


class _WriterBase:
    def __init__(self, opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise KbrokerOptionError("save mode 'overwrite' is not allowed: a topic can only be appended to")
        self.opts = opts
        self.layout = check_columns(schema, opts)
        _check_topic_exists(opts)

    def _write(self, iterator: Iterator[pa.RecordBatch]) -> KbrokerCommitMessage:
        return write_rows(self.opts, self.layout, iterator)


class KbrokerBatchWriter(_WriterBase, DataSourceArrowWriter):
    """``df.write.format("kbroker")``."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KbrokerCommitMessage:  # type: ignore[override]
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.records for m in messages if isinstance(m, KbrokerCommitMessage))
        log.info("kbroker: batch write landed %d records", total)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        landed = sum(m.records for m in messages if isinstance(m, KbrokerCommitMessage))
        log.warning("kbroker: batch write aborted; %d records from finished tasks were already written", landed)


class KbrokerStreamWriter(_WriterBase, DataSourceStreamArrowWriter):
    """``df.writeStream.format("kbroker")``: at-least-once, like Spark's Kafka sink."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KbrokerCommitMessage:  # type: ignore[override]
        return self._write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        total = sum(m.records for m in messages if isinstance(m, KbrokerCommitMessage))
        log.info("kbroker: micro-batch %d landed %d records", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        landed = sum(m.records for m in messages if isinstance(m, KbrokerCommitMessage))
        log.warning("kbroker: micro-batch %d aborted; %d records were already written", batchId, landed)
