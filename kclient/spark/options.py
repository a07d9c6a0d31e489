"""The options of the kbroker data source, parsed and checked into typed objects.

Names and meanings follow Spark's Kafka connector (``spark-sql-kafka-0-10``); option
names are case-insensitive, as Spark's are. Every problem raises one
:class:`~kclient.spark.errors.KbrokerOptionError` with a one-line message naming the
option. Parsing touches no network: whether topics exist is checked by the source
when the query starts.

Reading (``spark.read`` / ``spark.readStream``):

=====================================  ===============================================
``bootstrap.servers``                  ``host:port[,host:port...]``; ``kafka.bootstrap.servers`` too
``subscribe``                          comma list of topics            } exactly one
``subscribePattern``                   regular expression on topic names } of these
``assign``                             JSON ``{"topicA": [0, 1]}``      } three
``startingOffsets``                    ``earliest``, ``latest`` or JSON ``{"t": {"0": 23, "1": -2}}``
                                       (-2 earliest, -1 latest); default latest (stream), earliest (batch)
``startingTimestamp``                  epoch ms for every partition (wins over startingOffsets)
``startingOffsetsByTimestamp``         JSON ``{"t": {"0": ms}}`` (wins over both above)
``startingOffsetsByTimestampStrategy`` ``error`` (default) or ``latest``: when no record is that late
``endingOffsets``                      batch only: ``latest`` (default) or JSON (-1 latest)
``endingTimestamp``                    batch only: epoch ms for every partition
``endingOffsetsByTimestamp``           batch only: JSON ``{"t": {"0": ms}}``
``maxOffsetsPerTrigger``               stream only: at most this many records per micro-batch
``minPartitions``                      at least this many Spark partitions per batch
``maxRecordsPerPartition``             at most this many records per Spark partition (default 1000000)
``failOnDataLoss``                     ``true`` (default) or ``false``
``includeHeaders``                     ``false`` (default) or ``true``
``groupId``                            stream only, kbroker's own: commit progress to this group
``kafkaConsumer.pollTimeoutMs``        how long a task waits for records it knows exist (120000)
``fetchOffset.numRetries``             retries of a failed offset lookup on the driver (3)
``fetchOffset.retryIntervalMs``        pause between those retries (10)
``kafka.isolation.level``              ``read_uncommitted`` (default) or ``read_committed``: only
                                       committed records, and "latest" is the last stable offset
``kafka.<setting>``                    consumer settings (see ``CONSUMER_SETTINGS``)
=====================================  ===============================================

Writing (``df.write`` / ``df.writeStream``): ``bootstrap.servers``, ``topic`` (overrides
the ``topic`` column) and ``kafka.<setting>`` producer settings (see
``PRODUCER_SETTINGS``; ``kafka.acks`` defaults to ``all``).

Security, for both (Spark's Kafka connector names, PEM files only):
``kafka.security.protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL),
``kafka.ssl.truststore.location`` (PEM CA certificates), ``kafka.ssl.keystore.location``
(PEM certificate chain and key in one file), ``kafka.ssl.key.password``,
``kafka.ssl.truststore.type`` / ``kafka.ssl.keystore.type`` (PEM),
``kafka.ssl.endpoint.identification.algorithm`` (empty: no host name check),
``kafka.sasl.mechanism`` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and
``kafka.sasl.jaas.config`` (``...ScramLoginModule required username="..." password="...";``).
They are checked when the options are parsed (the files must be readable there and on
every executor) and passed to every client the source or sink makes.

Spark's own Kafka options that make no sense here (``kafka.group.id``,
``kafka.auto.offset.reset``, deserializers, ...) or are not supported yet
(``minOffsetsPerTrigger``, ``maxTriggerDelay``) are refused with the reason. Other
unknown options are ignored, as Spark does (they include Spark's own, such as
``checkpointLocation`` or ``path``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kclient.consumer.isolation import parse_isolation_level
from kclient.errors import InvalidConfigError
from kclient.security import JAVA_SECURITY_PROPERTIES, SecurityConfig, java_client_configs
from kclient.spark.errors import KbrokerOptionError
from kclient.spark.offsets import EARLIEST, LATEST, parse_assign, parse_partition_numbers
from kclient.structs import TopicPartition
from kclient.topic_name import validate_topic_name

DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000
DEFAULT_POLL_TIMEOUT_MS = 120_000
DEFAULT_MAX_PARTITION_FETCH_BYTES = 8 * 1024 * 1024
DEFAULT_FETCH_MAX_BYTES = 64 * 1024 * 1024


def _to_int(name: str, raw: str, lo: int | None = None) -> int:
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise KbrokerOptionError(f"option {name!r} must be an integer, got {raw!r}") from None
    if lo is not None and value < lo:
        raise KbrokerOptionError(f"option {name!r} must be at least {lo}, got {value}")
    return value


def _to_bool(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise KbrokerOptionError(f"option {name!r} must be true or false, got {raw!r}")


def _to_acks(name: str, raw: str) -> str | int:
    lowered = raw.strip().lower()
    if lowered in ("all", "-1"):
        return "all"
    if lowered in ("0", "1"):
        return int(lowered)
    raise KbrokerOptionError(f"option {name!r} must be all, -1, 0 or 1, got {raw!r}")


def _to_compression(name: str, raw: str) -> str | None:
    lowered = raw.strip().lower()
    if lowered in ("none", ""):
        return None
    if lowered in ("gzip", "lz4", "zstd", "snappy"):
        return lowered
    raise KbrokerOptionError(f"option {name!r} must be none, gzip, lz4, zstd or snappy, got {raw!r}")


def _to_isolation(name: str, raw: str) -> str:
    """Spark's ``kafka.isolation.level``: read_uncommitted or read_committed (the consumer's
    ``isolation_level``); read_committed reads committed records only, up to the last
    stable offset, which is then what "latest" means for the source's end offsets."""
    lowered = raw.strip().lower()
    try:
        parse_isolation_level(lowered)
    except InvalidConfigError:
        raise KbrokerOptionError(f"option {name!r} must be read_uncommitted or read_committed, got {raw!r}") from None
    return lowered


def _to_str(name: str, raw: str) -> str:
    return raw


def _positive(name: str, raw: str) -> int:
    return _to_int(name, raw, 1)


def _non_negative(name: str, raw: str) -> int:
    return _to_int(name, raw, 0)


Setting = tuple[str, Callable[[str, str], Any]]

CONSUMER_SETTINGS: dict[str, Setting] = {
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", _positive),
    "fetch.max.bytes": ("fetch_max_bytes", _positive),
    "fetch.max.wait.ms": ("fetch_max_wait_ms", _non_negative),
    "fetch.min.bytes": ("fetch_min_bytes", _non_negative),
    "max.poll.records": ("max_poll_records", _positive),
    "request.timeout.ms": ("request_timeout_ms", _positive),
    "metadata.max.age.ms": ("metadata_max_age_ms", _non_negative),
    "client.id": ("client_id", _to_str),
    "isolation.level": ("isolation_level", _to_isolation),
}
"""``kafka.<name>`` source options -> ``kclient.Consumer`` settings."""

PRODUCER_SETTINGS: dict[str, Setting] = {
    "acks": ("acks", _to_acks),
    "linger.ms": ("linger_ms", _non_negative),
    "batch.size": ("batch_size", _positive),
    "compression.type": ("compression_type", _to_compression),
    "max.request.size": ("max_request_size", _positive),
    "buffer.memory": ("buffer_memory", _positive),
    "max.block.ms": ("max_block_ms", _non_negative),
    "request.timeout.ms": ("request_timeout_ms", _positive),
    "delivery.timeout.ms": ("delivery_timeout_ms", _positive),
    "retry.backoff.ms": ("retry_backoff_ms", _non_negative),
    "metadata.max.age.ms": ("metadata_max_age_ms", _non_negative),
    "enable.idempotence": ("enable_idempotence", _to_bool),
    "client.id": ("client_id", _to_str),
}
"""``kafka.<name>`` sink options -> ``kclient.Producer`` settings."""

_REFUSED_SOURCE = {
    "kafka.group.id": "offsets live in Spark's checkpoint; use the option 'groupId' to also commit progress "
    "to a consumer group",
    "kafka.auto.offset.reset": "set the option 'startingOffsets' to 'earliest' or 'latest' instead",
    "kafka.enable.auto.commit": "the source never auto-commits; use the option 'groupId' to commit progress",
    "kafka.key.deserializer": "keys are always read as binary; cast or decode the 'key' column",
    "kafka.value.deserializer": "values are always read as binary; cast or decode the 'value' column",
    "kafka.interceptor.classes": "interceptors are not supported",
    "minoffsetspertrigger": "minOffsetsPerTrigger is not supported by the kbroker source (use a processing-time "
    "trigger)",
    "maxtriggerdelay": "maxTriggerDelay is not supported by the kbroker source",
}
_REFUSED_SINK = {
    "kafka.key.serializer": "keys are written as given: a binary or string 'key' column",
    "kafka.value.serializer": "values are written as given: a binary or string 'value' column",
    "kafka.interceptor.classes": "interceptors are not supported",
    "kafka.partitioner.class": "records go to the 'partition' column's partition, else by key (murmur2) as Kafka's "
    "default partitioner",
    "kafka.transactional.id": "transactions are not supported",
}


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def _bootstrap(opts: dict[str, str]) -> str:
    plain, prefixed = opts.get("bootstrap.servers"), opts.get("kafka.bootstrap.servers")
    if plain and prefixed and plain != prefixed:
        raise KbrokerOptionError(
            f"options 'bootstrap.servers' ({plain!r}) and 'kafka.bootstrap.servers' ({prefixed!r}) disagree: set one"
        )
    value = (plain or prefixed or "").strip()
    if not value:
        raise KbrokerOptionError(
            "option 'bootstrap.servers' (or 'kafka.bootstrap.servers') is required: the brokers' host:port list"
        )
    for s in value.split(","):
        host, sep, port = s.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise KbrokerOptionError(f"option 'bootstrap.servers': {s.strip()!r} is not host:port")
    return value


def _client_settings(
    opts: dict[str, str], table: dict[str, Setting], refused: dict[str, str], role: str
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in opts.items():
        if key in refused:
            raise KbrokerOptionError(f"option {key!r} is not supported: {refused[key]}")
        if not key.startswith("kafka.") or key == "kafka.bootstrap.servers" or key in _SECURITY_KEYS:
            continue
        name = key[len("kafka.") :]
        if name not in table:
            raise KbrokerOptionError(
                f"option {key!r} is not a {role} setting kbroker knows; supported: "
                + ", ".join([*(f"kafka.{n}" for n in sorted(table)), *sorted(_SECURITY_KEYS)])
            )
        attr, parse = table[name]
        out[attr] = parse(key, raw)
    return out


_SECURITY_KEYS = frozenset(
    f"kafka.{name}" for name in JAVA_SECURITY_PROPERTIES if name not in ("sasl.username", "sasl.password")
)
"""Spark's Kafka security options (credentials come in ``kafka.sasl.jaas.config``)."""


def _security_settings(opts: dict[str, str]) -> dict[str, Any]:
    """The kclient security settings of the ``kafka.security.protocol``, ``kafka.ssl.*`` and
    ``kafka.sasl.*`` options, checked (files read, PLAIN over SASL_PLAINTEXT refused)."""
    given = {k: v for k, v in opts.items() if k in _SECURITY_KEYS}
    try:
        out = java_client_configs(given, "kafka.")
        SecurityConfig.from_configs(out)
    except InvalidConfigError as exc:
        raise KbrokerOptionError(f"security options: {exc.message}") from None
    return out


# --- reading ------------------------------------------------------------------------


@dataclass(frozen=True)
class Subscription:
    """What to read: ``kind`` is ``subscribe`` (``topics``), ``pattern`` or ``assign`` (``partitions``)."""

    kind: Literal["subscribe", "pattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str = ""
    partitions: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.kind == "pattern":
            return re.fullmatch(self.pattern, topic) is not None
        if self.kind == "subscribe":
            return topic in self.topics
        return any(tp.topic == topic for tp in self.partitions)

    def describe(self) -> str:
        if self.kind == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.kind == "pattern":
            return f"subscribePattern={self.pattern}"
        return "assign=" + ",".join(f"{tp.topic}-{tp.partition}" for tp in self.partitions)


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends.

    ``kind``: ``earliest``, ``latest``, ``offsets`` (``per_partition`` holds offsets,
    -2 / -1 meaning earliest / latest), ``timestamp`` (``timestamp`` ms for every
    partition) or ``timestamps`` (``per_partition`` holds ms).
    """

    kind: Literal["earliest", "latest", "offsets", "timestamp", "timestamps"]
    per_partition: Mapping[TopicPartition, int] = field(default_factory=dict)
    timestamp: int = -1


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    timestamp_strategy: Literal["error", "latest"]
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    max_records_per_partition: int
    fail_on_data_loss: bool
    include_headers: bool
    group_id: str | None
    poll_timeout_ms: int
    fetch_retries: int
    fetch_retry_interval_ms: int
    consumer_settings: Mapping[str, Any]
    starting_given: bool
    ending_given: bool
    security_settings: Mapping[str, Any] = field(default_factory=dict)
    """kclient security settings (``security_protocol``, ``ssl_*``, ``sasl_*``), for every client."""

    def admin_config(self) -> dict[str, Any]:
        """Settings for the ``kclient.AdminClient`` of the driver."""
        return {"bootstrap_servers": self.bootstrap, "request_timeout_ms": 30000, **self.security_settings}

    def consumer_config(self) -> dict[str, Any]:
        """Settings for a ``kclient.Consumer`` reading for this source."""
        return {
            **self.security_settings,
            "bootstrap_servers": self.bootstrap,
            "client_id": "kbroker-spark-source",
            "auto_offset_reset": "none",
            "max_partition_fetch_bytes": DEFAULT_MAX_PARTITION_FETCH_BYTES,
            "fetch_max_bytes": DEFAULT_FETCH_MAX_BYTES,
            "max_poll_records": 100_000,
            **self.consumer_settings,
        }


def _subscription(opts: dict[str, str]) -> Subscription:
    names = {"subscribe": "subscribe", "subscribepattern": "subscribePattern", "assign": "assign"}
    given = [name for name in names if opts.get(name, "").strip()]
    if len(given) != 1:
        which = "none was given" if not given else f"got {len(given)}: " + ", ".join(names[g] for g in given)
        raise KbrokerOptionError(
            f"exactly one of the options 'subscribe', 'subscribePattern' or 'assign' must be set ({which})"
        )
    kind = given[0]
    raw = opts[kind].strip()
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
        if not topics:
            raise KbrokerOptionError("option 'subscribe' names no topic")
        for t in topics:
            _check_topic_name("subscribe", t)
        return Subscription("subscribe", topics=topics)
    if kind == "subscribepattern":
        try:
            re.compile(raw)
        except re.error as exc:
            raise KbrokerOptionError(
                f"option 'subscribePattern' is not a valid regular expression ({exc}): {raw!r}"
            ) from None
        return Subscription("pattern", pattern=raw)
    partitions = parse_assign(raw)
    for tp in partitions:
        _check_topic_name("assign", tp.topic)
    return Subscription("assign", partitions=tuple(partitions))


def _check_topic_name(option: str, topic: str) -> None:
    try:
        validate_topic_name(topic)
    except Exception as exc:
        raise KbrokerOptionError(f"option {option!r}: {getattr(exc, 'message', exc)}") from None


def _offsets_option(opts: dict[str, str], name: str, default: str) -> OffsetSpec:
    raw = opts.get(name.lower(), default).strip()
    lowered = raw.lower()
    if lowered == "earliest":
        return OffsetSpec("earliest")
    if lowered == "latest":
        return OffsetSpec("latest")
    if not raw.startswith("{"):
        raise KbrokerOptionError(
            f'option {name!r} must be earliest, latest or JSON such as {{"topicA": {{"0": 23, "1": -2}}}}; got {raw!r}'
        )
    per = parse_partition_numbers(raw, name)
    for tp, off in per.items():
        if off < EARLIEST:
            raise KbrokerOptionError(
                f"option {name!r}: offset {off} of {tp.topic}-{tp.partition} is invalid "
                "(use an offset >= 0, -2 for earliest or -1 for latest)"
            )
    return OffsetSpec("offsets", per)


def _timestamp_options(opts: dict[str, str], prefix: str) -> OffsetSpec | None:
    by_partition = opts.get(f"{prefix}offsetsbytimestamp", "").strip()
    global_ts = opts.get(f"{prefix}timestamp", "").strip()
    if by_partition:
        name = f"{prefix}OffsetsByTimestamp"
        per = parse_partition_numbers(by_partition, name)
        for tp, ts in per.items():
            if ts < 0:
                raise KbrokerOptionError(f"option {name!r}: timestamp {ts} of {tp.topic}-{tp.partition} is negative")
        return OffsetSpec("timestamps", per)
    if global_ts:
        return OffsetSpec("timestamp", timestamp=_to_int(f"{prefix}Timestamp", global_ts, 0))
    return None


def parse_source_options(options: Mapping[str, str], *, streaming: bool | None = None) -> SourceOptions:
    """Check and type the read options; ``streaming`` None checks what holds for both modes."""
    opts = _lower(options)
    bootstrap = _bootstrap(opts)
    subscription = _subscription(opts)
    consumer = _client_settings(opts, CONSUMER_SETTINGS, _REFUSED_SOURCE, "consumer")

    starting = _timestamp_options(opts, "starting") or _offsets_option(
        opts, "startingOffsets", "latest" if streaming else "earliest"
    )
    ending = _timestamp_options(opts, "ending") or _offsets_option(opts, "endingOffsets", "latest")
    ending_given = any(k in opts for k in ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp"))
    starting_given = any(k in opts for k in ("startingoffsets", "startingtimestamp", "startingoffsetsbytimestamp"))

    if ending.kind == "earliest":
        raise KbrokerOptionError("option 'endingOffsets' cannot be earliest (use latest or JSON offsets)")
    if ending.kind == "offsets" and any(o == EARLIEST for o in ending.per_partition.values()):
        raise KbrokerOptionError("option 'endingOffsets': -2 (earliest) is not allowed as an ending offset")
    if streaming and ending_given:
        raise KbrokerOptionError("ending offsets ('endingOffsets', 'endingTimestamp', ...) are for batch queries only")
    if streaming is False:
        if starting.kind == "latest":
            raise KbrokerOptionError("option 'startingOffsets' cannot be latest for a batch query")
        if starting.kind == "offsets" and any(o == LATEST for o in starting.per_partition.values()):
            raise KbrokerOptionError("option 'startingOffsets': -1 (latest) is not allowed in a batch query")
    if subscription.kind == "assign":
        assigned = set(subscription.partitions)
        for spec, name in ((starting, "starting offsets"), (ending, "ending offsets")):
            extra = sorted(set(spec.per_partition) - assigned)
            if extra:
                raise KbrokerOptionError(
                    f"the {name} name partitions that are not assigned: "
                    + ", ".join(f"{tp.topic}-{tp.partition}" for tp in extra)
                )

    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise KbrokerOptionError(
            f"option 'startingOffsetsByTimestampStrategy' must be error or latest, got {strategy!r}"
        )

    max_per_trigger = opts.get("maxoffsetspertrigger")
    min_partitions = opts.get("minpartitions")
    group_id = opts.get("groupid", "").strip() or None
    if group_id is not None and streaming is False:
        raise KbrokerOptionError("option 'groupId' commits a stream's progress: it is for streaming queries only")

    return SourceOptions(
        bootstrap=bootstrap,
        subscription=subscription,
        starting=starting,
        ending=ending,
        timestamp_strategy="latest" if strategy == "latest" else "error",
        max_offsets_per_trigger=_to_int("maxOffsetsPerTrigger", max_per_trigger, 1) if max_per_trigger else None,
        min_partitions=_to_int("minPartitions", min_partitions, 1) if min_partitions else None,
        max_records_per_partition=_to_int(
            "maxRecordsPerPartition", opts.get("maxrecordsperpartition", str(DEFAULT_MAX_RECORDS_PER_PARTITION)), 1
        ),
        fail_on_data_loss=_to_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        include_headers=_to_bool("includeHeaders", opts.get("includeheaders", "false")),
        group_id=group_id,
        poll_timeout_ms=_to_int(
            "kafkaConsumer.pollTimeoutMs", opts.get("kafkaconsumer.polltimeoutms", str(DEFAULT_POLL_TIMEOUT_MS)), 1
        ),
        fetch_retries=_to_int("fetchOffset.numRetries", opts.get("fetchoffset.numretries", "3"), 0),
        fetch_retry_interval_ms=_to_int(
            "fetchOffset.retryIntervalMs", opts.get("fetchoffset.retryintervalms", "10"), 0
        ),
        consumer_settings=consumer,
        starting_given=starting_given,
        ending_given=ending_given,
        security_settings=_security_settings(opts),
    )


# --- writing ------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    producer_settings: Mapping[str, Any]
    security_settings: Mapping[str, Any] = field(default_factory=dict)
    """kclient security settings (``security_protocol``, ``ssl_*``, ``sasl_*``), for every client."""

    def admin_config(self) -> dict[str, Any]:
        """Settings for the ``kclient.AdminClient`` that checks the topic."""
        return {"bootstrap_servers": self.bootstrap, **self.security_settings}

    def producer_config(self) -> dict[str, Any]:
        """Settings for the ``kclient.Producer`` of a write task (acks=all unless told)."""
        return {
            **self.security_settings,
            "bootstrap_servers": self.bootstrap,
            "client_id": "kbroker-spark-sink",
            "acks": "all",
            "linger_ms": 10,
            "batch_size": 256 * 1024,
            **self.producer_settings,
        }


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = _lower(options)
    bootstrap = _bootstrap(opts)
    producer = _client_settings(opts, PRODUCER_SETTINGS, _REFUSED_SINK, "producer")
    topic = opts.get("topic", "").strip() or None
    if topic is not None:
        _check_topic_name("topic", topic)
    if producer.get("enable_idempotence") and producer.get("acks", "all") != "all":
        raise KbrokerOptionError("option 'kafka.enable.idempotence=true' needs 'kafka.acks' = all")
    return SinkOptions(
        bootstrap=bootstrap, topic=topic, producer_settings=producer, security_settings=_security_settings(opts)
    )
