"""Per-topic log configuration with Kafka's topic config names and defaults."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kclient.errors import InvalidConfigurationError

_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1

DEFAULT_SEGMENT_BYTES = 1024 * 1024 * 1024
DEFAULT_SEGMENT_MS = 7 * 24 * 60 * 60 * 1000
DEFAULT_SEGMENT_INDEX_BYTES = 10 * 1024 * 1024
DEFAULT_INDEX_INTERVAL_BYTES = 4096
DEFAULT_RETENTION_MS = 7 * 24 * 60 * 60 * 1000
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024 + 12
DEFAULT_FILE_DELETE_DELAY_MS = 60_000
DEFAULT_MIN_CLEANABLE_DIRTY_RATIO = 0.5
DEFAULT_DELETE_RETENTION_MS = 24 * 60 * 60 * 1000

CLEANUP_POLICIES = ("compact", "delete")
COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")
"""Kafka's ``compression.type`` values: ``producer`` keeps the producer's codec."""
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The settings of one partition's log, as Kafka's topic-level configs.

    Field ``segment_bytes`` is config ``segment.bytes`` and so on (see
    :data:`CONFIG_NAMES`). Immutable: change a log's settings with
    ``Log.update_config(config.replace(...))`` or :meth:`from_properties`.

    - ``flush_messages`` / ``flush_ms``: None (Kafka: Long.MAX_VALUE / unset) leaves
      flushing to the OS page cache.
    - ``retention_ms`` / ``retention_bytes``: -1 means unlimited.
    - ``cleanup_policy``: ``"delete"``, ``"compact"`` or ``"compact,delete"``: retention
      deletes old segments, the log cleaner keeps the latest record of every key
      (see :mod:`kbroker.storage.cleaner`), or both.
    - compaction: ``min_cleanable_dirty_ratio`` (a log is cleaned once its dirty part is
      at least this share of it), ``min_compaction_lag_ms`` (records younger than this
      are not cleaned), ``max_compaction_lag_ms`` (a log whose oldest dirty record is
      older than this is cleaned whatever its ratio; Kafka's Long.MAX_VALUE means never),
      ``delete_retention_ms`` (how long tombstones are kept once clean).
    - ``min_insync_replicas`` and ``unclean_leader_election_enable`` are read by the
      replication layer, not by the log.
    """

    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    segment_ms: int = DEFAULT_SEGMENT_MS
    segment_index_bytes: int = DEFAULT_SEGMENT_INDEX_BYTES
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES
    retention_ms: int = DEFAULT_RETENTION_MS
    retention_bytes: int = -1
    flush_messages: int | None = None
    flush_ms: int | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    file_delete_delay_ms: int = DEFAULT_FILE_DELETE_DELAY_MS
    cleanup_policy: str = "delete"
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    message_timestamp_type: str = "CreateTime"
    min_cleanable_dirty_ratio: float = DEFAULT_MIN_CLEANABLE_DIRTY_RATIO
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = _LONG_MAX
    delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS
    leader_replication_throttled_replicas: str = ""
    """Replicas (``partition:broker,...`` or ``*``) whose leader side a move throttles."""
    follower_replication_throttled_replicas: str = ""
    """Replicas (``partition:broker,...`` or ``*``) whose follower side a move throttles."""
    compression_type: str = "producer"
    """The codec batches are stored with: ``producer`` keeps the producer's; otherwise the
    leader recompresses a batch with another codec (see :func:`~.validator.recompress`)."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            name = CONFIG_NAMES[field.name]
            _VALIDATORS[field.name](name, getattr(self, field.name))

    @property
    def delete_enabled(self) -> bool:
        """cleanup.policy includes ``delete``: retention applies."""
        return "delete" in self.cleanup_policy.split(",")

    @property
    def compact_enabled(self) -> bool:
        return "compact" in self.cleanup_policy.split(",")

    @property
    def log_append_time(self) -> bool:
        """message.timestamp.type is LogAppendTime: the leader sets batch timestamps."""
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def codec(self) -> int | None:
        """The compression codec id batches are stored with; None for ``producer``."""
        if self.compression_type == "producer":
            return None
        if self.compression_type == "uncompressed":
            return 0
        return ("gzip", "snappy", "lz4", "zstd").index(self.compression_type) + 1

    def replace(self, **changes: Any) -> LogConfig:
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_properties(cls, props: Mapping[str, str], defaults: LogConfig | None = None) -> LogConfig:
        """A config from Kafka topic-config strings, over ``defaults`` (or Kafka's).

        Raises InvalidConfigurationError with one line naming the key for an unknown
        key or a bad value.
        """
        base = defaults if defaults is not None else cls()
        changes: dict[str, Any] = {}
        for key, raw in props.items():
            field = _FIELDS_BY_NAME.get(key)
            if field is None:
                raise InvalidConfigurationError(f"Unknown topic config name: {key}")
            if not isinstance(raw, str):
                raw = str(raw)
            changes[field] = _PARSERS[field](key, raw.strip())
        return dataclasses.replace(base, **changes)

    def to_properties(self) -> dict[str, str]:
        """Every setting as a Kafka topic-config string (round-trips through from_properties)."""
        out: dict[str, str] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                text = str(_LONG_MAX)
            elif isinstance(value, bool):
                text = "true" if value else "false"
            else:
                text = str(value)
            out[CONFIG_NAMES[field.name]] = text
        return out


CONFIG_NAMES: dict[str, str] = {
    "segment_bytes": "segment.bytes",
    "segment_ms": "segment.ms",
    "segment_index_bytes": "segment.index.bytes",
    "index_interval_bytes": "index.interval.bytes",
    "retention_ms": "retention.ms",
    "retention_bytes": "retention.bytes",
    "flush_messages": "flush.messages",
    "flush_ms": "flush.ms",
    "max_message_bytes": "max.message.bytes",
    "file_delete_delay_ms": "file.delete.delay.ms",
    "cleanup_policy": "cleanup.policy",
    "min_insync_replicas": "min.insync.replicas",
    "unclean_leader_election_enable": "unclean.leader.election.enable",
    "message_timestamp_type": "message.timestamp.type",
    "min_cleanable_dirty_ratio": "min.cleanable.dirty.ratio",
    "min_compaction_lag_ms": "min.compaction.lag.ms",
    "max_compaction_lag_ms": "max.compaction.lag.ms",
    "delete_retention_ms": "delete.retention.ms",
    "leader_replication_throttled_replicas": "leader.replication.throttled.replicas",
    "follower_replication_throttled_replicas": "follower.replication.throttled.replicas",
    "compression_type": "compression.type",
}
"""Python field name -> Kafka topic config name."""

_FIELDS_BY_NAME = {name: field for field, name in CONFIG_NAMES.items()}


# ---------------------------------------------------------------------------
# Validation (on the typed value) and parsing (from the config string)
# ---------------------------------------------------------------------------


def _bad(name: str, value: object, why: str) -> InvalidConfigurationError:
    return InvalidConfigurationError(f"Invalid value {value!r} for configuration {name}: {why}")


def _int_range(lo: int, hi: int) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(name, value, "not an integer")
        if not lo <= value <= hi:
            raise _bad(name, value, f"must be between {lo} and {hi}")

    return check


def _ratio(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(name, value, "not a number")
    if not 0.0 <= value <= 1.0:
        raise _bad(name, value, "must be between 0 and 1")


def _optional_positive(name: str, value: Any) -> None:
    if value is not None:
        _int_range(1, _LONG_MAX)(name, value)


def _bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise _bad(name, value, "not a boolean")


def _cleanup_policy(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise _bad(name, value, "not a string")
    parts = [p.strip() for p in value.split(",")]
    if not parts or any(p not in CLEANUP_POLICIES for p in parts) or len(set(parts)) != len(parts):
        raise _bad(name, value, "must be a list of 'delete' and/or 'compact'")
    if value != _normal_policy(parts):
        raise _bad(name, value, "use 'delete', 'compact' or 'compact,delete'")


def _normal_policy(parts: list[str]) -> str:
    return ",".join(sorted(set(parts)))


def _compression_type(name: str, value: Any) -> None:
    if value not in COMPRESSION_TYPES:
        raise _bad(name, value, "must be one of " + ", ".join(COMPRESSION_TYPES))


def _timestamp_type(name: str, value: Any) -> None:
    if value not in TIMESTAMP_TYPES:
        raise _bad(name, value, "must be CreateTime or LogAppendTime")


_REPLICA = re.compile(r"[0-9]+:[0-9]+")


def _throttled_replicas(name: str, value: Any) -> None:
    """Kafka's ThrottledReplicaListValidator: ``*`` or ``partition:broker`` entries."""
    if not isinstance(value, str):
        raise _bad(name, value, "not a string")
    if value in ("", "*"):
        return
    if not all(_REPLICA.fullmatch(entry) for entry in value.split(",")):
        raise _bad(
            name,
            value,
            "must be the literal '*' or a list of replicas in the following format: "
            "[partitionId]:[brokerId],[partitionId]:[brokerId],...",
        )


def _parse_replica_list(name: str, raw: str) -> str:
    return ",".join(entry.strip() for entry in raw.split(",")) if raw.strip() else ""


_VALIDATORS: dict[str, Callable[[str, Any], None]] = {
    # Kafka: segment.bytes >= 14 (one legacy record); here one batch header (61).
    "segment_bytes": _int_range(61, _INT_MAX),
    "segment_ms": _int_range(1, _LONG_MAX),
    # Kafka allows 4; one time index entry (12 bytes) is the useful minimum.
    "segment_index_bytes": _int_range(12, _INT_MAX),
    "index_interval_bytes": _int_range(0, _INT_MAX),
    "retention_ms": _int_range(-1, _LONG_MAX),
    "retention_bytes": _int_range(-1, _LONG_MAX),
    "flush_messages": _optional_positive,
    "flush_ms": _optional_positive,
    "max_message_bytes": _int_range(0, _INT_MAX),
    "file_delete_delay_ms": _int_range(0, _LONG_MAX),
    "cleanup_policy": _cleanup_policy,
    "min_insync_replicas": _int_range(1, _INT_MAX),
    "unclean_leader_election_enable": _bool,
    "message_timestamp_type": _timestamp_type,
    "min_cleanable_dirty_ratio": _ratio,
    "min_compaction_lag_ms": _int_range(0, _LONG_MAX),
    "max_compaction_lag_ms": _int_range(1, _LONG_MAX),
    "delete_retention_ms": _int_range(0, _LONG_MAX),
    "leader_replication_throttled_replicas": _throttled_replicas,
    "follower_replication_throttled_replicas": _throttled_replicas,
    "compression_type": _compression_type,
}


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw, 10)
    except ValueError:
        raise _bad(name, raw, "not an integer") from None


def _parse_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise _bad(name, raw, "not a number") from None
    if value != value:  # NaN
        raise _bad(name, raw, "not a number")
    return value


def _parse_flush(name: str, raw: str) -> int | None:
    value = _parse_int(name, raw)
    if value >= _LONG_MAX:
        return None  # Kafka's "never": leave flushing to the OS
    return value


def _parse_bool(name: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise _bad(name, raw, "must be true or false")


def _parse_policy(name: str, raw: str) -> str:
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not parts or any(p not in CLEANUP_POLICIES for p in parts):
        raise _bad(name, raw, "must be a list of 'delete' and/or 'compact'")
    return _normal_policy(parts)


def _parse_str(name: str, raw: str) -> str:
    return raw


def _validated(field: str, parse: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    def parse_and_check(name: str, raw: str) -> Any:
        value = parse(name, raw)
        _VALIDATORS[field](name, value)
        return value

    return parse_and_check


_PARSERS: dict[str, Callable[[str, str], Any]] = {
    field: _validated(
        field,
        {
            "flush_messages": _parse_flush,
            "flush_ms": _parse_flush,
            "unclean_leader_election_enable": _parse_bool,
            "cleanup_policy": _parse_policy,
            "message_timestamp_type": _parse_str,
            "compression_type": _parse_str,
            "min_cleanable_dirty_ratio": _parse_float,
            "leader_replication_throttled_replicas": _parse_replica_list,
            "follower_replication_throttled_replicas": _parse_replica_list,
        }.get(field, _parse_int),
    )
    for field in CONFIG_NAMES
}
