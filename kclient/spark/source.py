"""The kbroker data source for PySpark: batch and structured-streaming reads.

Shape (PySpark's Python Data Source API, ``pyspark.sql.datasource``):

- :class:`KbrokerDataSource` (name ``kbroker``) parses the options when the DataFrame is
  defined (``load()``), checks that the topics exist, and hands out readers and writers.
- :class:`KbrokerBatchReader` resolves starting and ending offsets on the driver and
  plans one :class:`KbrokerInputPartition` per topic-partition range (large ranges are
  cut into several).
- :class:`KbrokerStreamReader` uses per topic-partition offsets as the stream offsets
  (``{"topic": {"0": 23}}``, Spark's Kafka format), so Spark's checkpoint gives
  exactly-once ingestion across restarts. Each trigger discovers the current partitions
  (new partitions and new topics matching ``subscribePattern`` start at their earliest
  offset); ``maxOffsetsPerTrigger`` uses admission control (``latestOffset(start, limit)``
  + ``getDefaultReadLimit``); ``trigger(availableNow=True)`` is supported; with
  ``groupId`` the offsets of every committed micro-batch are committed to that consumer
  group so ``kctl groups describe`` shows the pipeline's lag.
- :func:`read_range` runs on executors: a ``kclient.Consumer`` assigned to the one
  partition (it fetches from that partition's leader) reads ``[start, end)`` and yields
  Arrow record batches in Spark's Kafka row schema.

Records removed by retention before they were read (the range starts below the log start
offset, or a partition or topic disappeared) raise :class:`DataLossError` unless
``failOnDataLoss=false``, in which case they are skipped with a warning.

Thread safety: Spark drives each reader from one thread. Readers keep their clients out
of their pickled state (the stream reader of the driver is long-lived; the copies that
Spark pickles to executors open their own consumer per range).
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kclient.errors import KafkaError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from kclient.spark.errors import DataLossError, KbrokerOptionError
from kclient.spark.offsets import (
    EARLIEST,
    LATEST,
    JsonOffsets,
    OffsetRange,
    PartitionOffsets,
    from_json_dict,
    rate_limit,
    split_ranges,
    to_json_dict,
)
from kclient.spark.options import OffsetSpec, SourceOptions, parse_sink_options, parse_source_options
from kclient.structs import TopicPartition

if TYPE_CHECKING:
    import pyarrow as pa

    from kclient.admin import AdminClient
    from kclient.consumer import Consumer
    from kclient.spark.sink import KbrokerBatchWriter, KbrokerStreamWriter

log = logging.getLogger("kclient.spark")

_T = TypeVar("_T")

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def kafka_schema(include_headers: bool = False) -> StructType:
    """Spark's Kafka source row schema (``headers`` only when asked)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)


def _name(tps: Sequence[TopicPartition] | set[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(tps))


def option_name(spec: OffsetSpec, prefix: str) -> str:
    """The option a starting (``prefix`` "starting") or ending position came from."""
    if spec.kind == "timestamp":
        return f"{prefix}Timestamp"
    if spec.kind == "timestamps":
        return f"{prefix}OffsetsByTimestamp"
    return f"{prefix}Offsets"


def report_data_loss(fail: bool, message: str) -> None:
    """Raise :class:`DataLossError`, or only log it when ``failOnDataLoss`` is false."""
    if fail:
        raise DataLossError(
            f"{message}. Some data may have been lost because it is no longer available in kbroker (retention, or "
            "a deleted topic). If you want the query to go on anyway, set the source option failOnDataLoss=false"
        )
    log.warning("kbroker: %s; records were skipped (failOnDataLoss=false)", message)


# --- the driver's view of the cluster -------------------------------------------------


class SourceCluster:
    """Partitions and offsets for a source, through one AdminClient and one Consumer.

    Lazily connected; :meth:`close` releases both. Failed lookups are retried
    ``fetchOffset.numRetries`` times, ``fetchOffset.retryIntervalMs`` apart.
    """

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._admin: AdminClient | None = None
        self._consumer: Consumer | None = None

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            from kclient.admin import AdminClient

            self._admin = AdminClient(**self.opts.admin_config())
        return self._admin

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            from kclient.consumer import Consumer

            self._consumer = Consumer(**self.opts.consumer_config())
        return self._consumer

    def close(self) -> None:
        for client in (self._admin, self._consumer):
            if client is not None:
                client.close()
        self._admin = self._consumer = None

    def _retry(self, what: str, fn: Callable[[], _T]) -> _T:
        attempts = self.opts.fetch_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return fn()
            except KbrokerOptionError:
                raise
            except KafkaError as exc:
                if attempt == attempts:
                    raise KafkaError(f"kbroker: {what} failed after {attempts} attempts: {exc}") from exc
                log.info("kbroker: %s failed (%s), retrying", what, exc)
                time.sleep(self.opts.fetch_retry_interval_ms / 1000.0)
        raise AssertionError("unreachable")

    # partitions

    def partitions(self, *, validate: bool = False) -> set[TopicPartition]:
        """The partitions the subscription covers now.

        ``validate``: raise :class:`KbrokerOptionError` for a subscribed or assigned
        topic (or partition) that does not exist.
        """
        return self._retry("listing partitions", lambda: self._partitions(validate))

    def _partitions(self, validate: bool) -> set[TopicPartition]:
        sub = self.opts.subscription
        existing = set(self.admin.list_topics())
        if sub.kind == "pattern":
            topics = sorted(t for t in existing if sub.matches(t))
        else:
            wanted = sub.topics if sub.kind == "subscribe" else tuple(dict.fromkeys(tp.topic for tp in sub.partitions))
            missing = [t for t in wanted if t not in existing]
            if missing and validate:
                raise KbrokerOptionError(
                    f"option {sub.kind!r}: unknown topic(s) {', '.join(missing)} (the cluster at "
                    f"{self.opts.bootstrap} has {len(existing)} topic(s))"
                )
            topics = [t for t in wanted if t in existing]
        if not topics:
            return set()
        try:
            descriptions = self.admin.describe_topics(topics)
        except UnknownTopicOrPartitionError:
            if validate:
                raise
            # deleted between the two calls: describe one by one
            descriptions = []
            for t in topics:
                try:
                    descriptions.extend(self.admin.describe_topics([t]))
                except UnknownTopicOrPartitionError:
                    pass
        found = {TopicPartition(d.name, p.partition) for d in descriptions for p in d.partitions}
        if sub.kind != "assign":
            return found
        unknown = sorted(set(sub.partitions) - found)
        if unknown and validate:
            raise KbrokerOptionError(f"option 'assign': unknown partition(s) {_name(unknown)}")
        return set(sub.partitions) & found

    # offsets

    def earliest(self, tps: set[TopicPartition] | Sequence[TopicPartition]) -> PartitionOffsets:
        if not tps:
            return {}
        return self._retry("fetching earliest offsets", lambda: dict(self.consumer.beginning_offsets(list(tps))))

    def latest(self, tps: set[TopicPartition] | Sequence[TopicPartition]) -> PartitionOffsets:
        if not tps:
            return {}
        return self._retry("fetching latest offsets", lambda: dict(self.consumer.end_offsets(list(tps))))

    def resolve(self, spec: OffsetSpec, tps: set[TopicPartition], *, option: str, ending: bool) -> PartitionOffsets:
        """Concrete offsets of ``tps`` for a starting or ending position."""
        if spec.kind == "earliest":
            return self.earliest(tps)
        if spec.kind == "latest":
            return self.latest(tps)
        if spec.kind in ("offsets", "timestamps"):
            given = set(spec.per_partition)
            if given != tps:
                missing, extra = sorted(tps - given), sorted(given - tps)
                problems = []
                if missing:
                    problems.append(f"it lacks {_name(missing)}")
                if extra:
                    problems.append(f"{_name(extra)} do(es) not exist or are not subscribed")
                hint = " (use -2 for earliest, -1 for latest)" if spec.kind == "offsets" else ""
                raise KbrokerOptionError(
                    f"option {option!r} must name every partition read: {'; '.join(problems)}{hint}"
                )
        if spec.kind == "offsets":
            per = dict(spec.per_partition)
            earliest = self.earliest([tp for tp, o in per.items() if o == EARLIEST])
            latest = self.latest([tp for tp, o in per.items() if o == LATEST])
            return {tp: earliest.get(tp, latest.get(tp, o)) if o < 0 else o for tp, o in per.items()}
        stamps = dict(spec.per_partition) if spec.kind == "timestamps" else dict.fromkeys(tps, spec.timestamp)
        if not stamps:
            return {}
        found = self._retry("looking up offsets by timestamp", lambda: self.consumer.offsets_for_times(stamps))
        out: PartitionOffsets = {}
        none = sorted(tp for tp, hit in found.items() if hit is None)
        if none and not ending and self.opts.timestamp_strategy == "error":
            raise KbrokerOptionError(
                f"option {option!r}: no record at or after the timestamp in {_name(none)} (set "
                "startingOffsetsByTimestampStrategy=latest to start at the end of such partitions)"
            )
        latest = self.latest(none)
        for tp, hit in found.items():
            out[TopicPartition(*tp)] = hit.offset if hit is not None else latest[tp]
        return out


# --- reading on executors --------------------------------------------------------------


class KbrokerInputPartition(InputPartition):
    """Offsets ``[start, end)`` of one topic-partition: the work of one Spark task."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    @classmethod
    def of(cls, r: OffsetRange) -> KbrokerInputPartition:
        return cls(r.topic, r.partition, r.start, r.end)

    def __repr__(self) -> str:
        return f"KbrokerInputPartition({self.topic}-{self.partition} [{self.start}, {self.end}))"


def read_range(opts: SourceOptions, part: InputPartition) -> Iterator[pa.RecordBatch]:
    """Read ``part``'s range from its partition's leader, as Arrow batches of Spark's Kafka rows."""
    if not isinstance(part, KbrokerInputPartition) or part.end <= part.start:
        return
    from pyspark.sql.pandas.types import to_arrow_schema

    from kclient.consumer import Consumer

    schema = to_arrow_schema(kafka_schema(opts.include_headers), timezone="UTC")
    tp = TopicPartition(part.topic, part.partition)
    position, end = part.start, part.end
    where = f"{tp.topic}-{tp.partition} [{part.start}, {end})"
    consumer = Consumer(**opts.consumer_config())
    try:
        consumer.assign([tp])
        consumer.seek(tp, position)
        deadline = time.monotonic() + opts.poll_timeout_ms / 1000.0
        while position < end:
            try:
                polled = consumer.poll_buffers(timeout_ms=500, max_records=min(end - position, 100_000))
            except OffsetOutOfRangeError:
                position = _recover_out_of_range(opts, consumer, tp, position, end, where)
                if position < end:
                    consumer.seek(tp, position)
                continue
            cols = polled.get(tp)
            moved = consumer.position(tp)  # also past batches compaction emptied
            if not cols:
                if moved > position:
                    position = moved
                    deadline = time.monotonic() + opts.poll_timeout_ms / 1000.0
                elif time.monotonic() > deadline:
                    raise KafkaError(
                        f"kbroker: reading {where} made no progress at offset {position} for "
                        f"kafkaConsumer.pollTimeoutMs={opts.poll_timeout_ms} ms"
                    )
                continue
            deadline = time.monotonic() + opts.poll_timeout_ms / 1000.0
            offsets = cols.offsets
            if offsets[0] > position:
                _check_gap(opts, consumer, tp, position, offsets[0])
            n = len(offsets) if offsets[-1] < end else bisect_left(offsets, end)
            position = end if n < len(offsets) else max(position, offsets[-1] + 1, moved)
            if n:
                yield (cols if n == len(cols) else cols[:n]).to_arrow(tp.topic, tp.partition, schema=schema)
    finally:
        consumer.close()


def _check_gap(opts: SourceOptions, consumer: Consumer, tp: TopicPartition, position: int, first: int) -> None:
    """Offsets ``position`` to ``first - 1`` were not returned. Below the log start
    offset they were removed (retention, delete-records): data loss. Above it they were
    compacted away (``cleanup.policy=compact``), which is no loss, as Spark's Kafka
    source treats such gaps."""
    earliest = consumer.beginning_offsets([tp])[tp]
    if earliest > position:
        report_data_loss(
            opts.fail_on_data_loss,
            f"offsets {position} to {min(earliest, first) - 1} of {tp.topic}-{tp.partition} are missing "
            f"(the log now starts at {earliest})",
        )


def _recover_out_of_range(
    opts: SourceOptions, consumer: Consumer, tp: TopicPartition, position: int, end: int, where: str
) -> int:
    """Where to go on after OFFSET_OUT_OF_RANGE at ``position`` (or raise DataLossError)."""
    earliest = consumer.beginning_offsets([tp])[tp]
    latest = consumer.end_offsets([tp])[tp]
    wait_until = time.monotonic() + min(opts.poll_timeout_ms / 1000.0, 10.0)
    while earliest <= position and position >= latest and time.monotonic() < wait_until:
        # a new leader may not have caught up with the old one's high watermark yet
        time.sleep(0.5)
        latest = consumer.end_offsets([tp])[tp]
    if position < earliest:
        report_data_loss(
            opts.fail_on_data_loss,
            f"offsets {position} to {min(earliest, end) - 1} of {tp.topic}-{tp.partition} were removed before they "
            f"were read (the log now starts at {earliest}; reading {where})",
        )
        return min(earliest, end)
    if position >= latest:
        report_data_loss(
            opts.fail_on_data_loss,
            f"offsets {position} to {end - 1} of {tp.topic}-{tp.partition} no longer exist (the log now ends at "
            f"{latest}; reading {where})",
        )
        return end
    return position  # in range again: fetch anew


def plan_ranges(
    opts: SourceOptions,
    cluster: SourceCluster,
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    *,
    new_partitions_from_earliest: bool,
) -> list[KbrokerInputPartition]:
    """Input partitions reading ``start`` to ``end`` (data loss checked against the log starts)."""
    new = sorted(set(end) - set(start))
    begin = cluster.earliest(sorted(end))
    if new and new_partitions_from_earliest:
        late = sorted(tp for tp in new if begin[tp] != 0)
        if late:
            report_data_loss(
                opts.fail_on_data_loss,
                "new partition(s) "
                + ", ".join(f"{tp.topic}-{tp.partition} (from {begin[tp]})" for tp in late)
                + " do not start at offset 0",
            )
    ranges: list[OffsetRange] = []
    for tp in sorted(end):
        s = start.get(tp, begin[tp])
        e = end[tp]
        if e < s:
            report_data_loss(
                opts.fail_on_data_loss,
                f"the end offset {e} of {tp.topic}-{tp.partition} is below its start offset {s} (was the topic "
                "deleted and created again?)",
            )
            continue
        if s < begin[tp] and s < e:
            report_data_loss(
                opts.fail_on_data_loss,
                f"offsets {s} to {min(begin[tp], e) - 1} of {tp.topic}-{tp.partition} were removed by retention "
                f"before they were read (the log now starts at {begin[tp]})",
            )
            s = min(begin[tp], e)
        ranges.append(OffsetRange(tp.topic, tp.partition, s, e))
    pieces = split_ranges(ranges, opts.max_records_per_partition, opts.min_partitions)
    return [KbrokerInputPartition.of(r) for r in pieces]


# --- batch ------------------------------------------------------------------------------


class KbrokerBatchReader(DataSourceReader):
    """``spark.read.format("kbroker")``: starting to ending offsets, planned on the driver."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        cluster = SourceCluster(self.opts)
        try:
            tps = cluster.partitions(validate=True)
            start = cluster.resolve(
                self.opts.starting, tps, option=option_name(self.opts.starting, "starting"), ending=False
            )
            end = cluster.resolve(self.opts.ending, tps, option=option_name(self.opts.ending, "ending"), ending=True)
            for tp in sorted(tps):
                if start[tp] > end[tp]:
                    raise KbrokerOptionError(
                        f"the starting offset {start[tp]} of {tp.topic}-{tp.partition} is after its ending offset "
                        f"{end[tp]}"
                    )
            return plan_ranges(self.opts, cluster, start, end, new_partitions_from_earliest=False)
        finally:
            cluster.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_range(self.opts, partition)


# --- streaming --------------------------------------------------------------------------


class KbrokerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("kbroker")``: stream offsets are per topic-partition offsets."""

    def __init__(self, opts: SourceOptions, error: KbrokerOptionError | None = None) -> None:
        self.opts = opts
        self._error = error
        self._cluster: SourceCluster | None = None
        self._checked = False
        self._target: PartitionOffsets | None = None  # Trigger.AvailableNow's end
        self._latest: PartitionOffsets = {}
        self._group_committed: PartitionOffsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles a stream reader to its executors: never its clients or driver state.
        return {"opts": self.opts, "error": self._error}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["opts"], state["error"])  # type: ignore[misc]

    @property
    def cluster(self) -> SourceCluster:
        if self._error is not None:  # a bad option: fail the query at its first step
            raise self._error
        if self._cluster is None:
            self._cluster = SourceCluster(self.opts)
        return self._cluster

    def _current_partitions(self) -> set[TopicPartition]:
        """The partitions read now; the first call (at query start) checks the topics exist."""
        tps = self.cluster.partitions(validate=not self._checked)
        self._checked = True
        return tps

    def initialOffset(self) -> JsonOffsets:
        spec = self.opts.starting
        tps = self._current_partitions()
        return to_json_dict(self.cluster.resolve(spec, tps, option=option_name(spec, "starting"), ending=False))

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.cluster.latest(self._current_partitions())

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None) -> JsonOffsets:
        cluster = self.cluster
        begin = from_json_dict(start or {})
        self._commit_group(begin)  # ``start`` is the end of the last committed micro-batch
        if self._target is not None:
            latest = dict(self._target)
        else:
            latest = cluster.latest(self._current_partitions())
            self._latest = latest
        gone = sorted(set(begin) - set(latest))
        if gone and self._target is None:
            report_data_loss(self.opts.fail_on_data_loss, f"partition(s) {_name(gone)} no longer exist")
        if start is None:  # the old latestOffset() call: no start, no admission control
            return to_json_dict(latest)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if max_rows is not None:
            new = sorted(set(latest) - set(begin))
            from_offsets = {**cluster.earliest(new), **begin}
            end = rate_limit(from_offsets, latest, max_rows)
        else:
            end = latest
        return to_json_dict(end)

    def reportLatestOffset(self) -> JsonOffsets | None:
        return to_json_dict(self._latest) if self._latest else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, stop = from_json_dict(start), from_json_dict(end)
        if begin == stop:
            return []
        return plan_ranges(self.opts, self.cluster, begin, stop, new_partitions_from_earliest=True)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_range(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._commit_group(from_json_dict(end))

    def _commit_group(self, offsets: PartitionOffsets) -> None:
        group = self.opts.group_id
        if group is None or not offsets or offsets == self._group_committed:
            return
        try:
            self.cluster.admin.alter_consumer_group_offsets(group, offsets)
        except KafkaError as exc:  # progress is in the checkpoint; the group only shows it
            log.warning("kbroker: could not commit the stream's offsets to group %r: %s", group, exc)
            return
        self._group_committed = dict(offsets)

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


# --- the data source -------------------------------------------------------------------


class KbrokerDataSource(DataSource):
    """``format("kbroker")``: read and write kbroker topics with Spark's Kafka options and row schema."""

    @classmethod
    def name(cls) -> str:
        return "kbroker"

    def schema(self) -> StructType:
        # Called when a read is defined (``load()``): the options are checked here, so a
        # bad option fails before any query runs.
        opts = parse_source_options(self.options)
        cluster = SourceCluster(opts)
        try:
            cluster.partitions(validate=True)
        except KafkaError as exc:
            if isinstance(exc, KbrokerOptionError):
                raise
            raise KbrokerOptionError(f"cannot reach the brokers at {opts.bootstrap}: {exc}") from exc
        finally:
            cluster.close()
        return kafka_schema(opts.include_headers)

    def _checked_source(self, schema: StructType, streaming: bool) -> SourceOptions:
        opts = parse_source_options(self.options, streaming=streaming)
        if schema != kafka_schema(opts.include_headers):
            raise KbrokerOptionError(
                "the kbroker source has a fixed schema (Spark's Kafka row schema) and cannot be given another one"
            )
        return opts

    def reader(self, schema: StructType) -> KbrokerBatchReader:
        return KbrokerBatchReader(self._checked_source(schema, streaming=False))

    def streamReader(self, schema: StructType) -> KbrokerStreamReader:
        try:
            return KbrokerStreamReader(self._checked_source(schema, streaming=True))
        except KbrokerOptionError as exc:
            # Raised from here, PySpark 4.3's stream runner hides it behind an UnboundLocalError
            # of its own (``reader.stop()`` in a ``finally``): fail at the first call instead.
            return KbrokerStreamReader(parse_source_options(self.options), error=exc)

    def writer(self, schema: StructType, overwrite: bool) -> KbrokerBatchWriter:
        from kclient.spark.sink import KbrokerBatchWriter

        return KbrokerBatchWriter(parse_sink_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> KbrokerStreamWriter:
        from kclient.spark.sink import KbrokerStreamWriter

        return KbrokerStreamWriter(parse_sink_options(self.options), schema, overwrite)
