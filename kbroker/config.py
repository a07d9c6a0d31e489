"""Broker configuration: command-line flags and a Kafka-style properties file.

The file form is ``server.properties``: ``key=value`` lines, ``#`` comments, with
Kafka's key names. Flags given on the command line win over the file. Every value is
checked when the broker starts; a wrong one is a :class:`InvalidConfigError` with one
readable line naming the key.

Broker-wide log defaults use Kafka's ``log.*`` names and become the topic-level
defaults (``log.segment.bytes`` -> ``segment.bytes`` and so on); per-topic overrides
from ``/config/topics/<t>`` sit on top of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kbroker.storage.cleaner_manager import CleanerConfig
from kclient.errors import InvalidConfigError

# Broker key -> topic-level key, for the broker-wide log defaults.
LOG_DEFAULT_KEYS: dict[str, str] = {
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.index.size.max.bytes": "segment.index.bytes",
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.segment.delete.delay.ms": "file.delete.delay.ms",
    "log.cleanup.policy": "cleanup.policy",
    "log.message.timestamp.type": "message.timestamp.type",
    "message.max.bytes": "max.message.bytes",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
}

HOURS_MS = 3_600_000

LONG_MAX = 2**63 - 1

THROTTLE_RATE_KEYS = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
"""Dynamic-only broker configs (not valid in ``server.properties``, as in Kafka)."""


def _int(key: str, value: str, minimum: int | None = None) -> int:
    try:
        out = int(value)
    except ValueError:
        raise InvalidConfigError(f"{key}: {value!r} is not an integer") from None
    if minimum is not None and out < minimum:
        raise InvalidConfigError(f"{key}: {out} is below the minimum {minimum}")
    return out


def _float(key: str, value: str, minimum: float) -> float:
    try:
        out = float(value)
    except ValueError:
        raise InvalidConfigError(f"{key}: {value!r} is not a number") from None
    if not out >= minimum:  # NaN too
        raise InvalidConfigError(f"{key}: {value!r} is below the minimum {minimum}")
    return out


def _bool(key: str, value: str) -> bool:
    low = value.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise InvalidConfigError(f"{key}: {value!r} is not true or false")


def parse_host_port(key: str, value: str) -> tuple[str, int]:
    """``"127.0.0.1:9092"`` or ``"PLAINTEXT://h:9092"`` -> (host, port)."""
    text = value.split("://", 1)[-1].split(",", 1)[0]
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise InvalidConfigError(f"{key}: {value!r} is not HOST:PORT")
    return host, _int(key, port, 0)


@dataclass
class BrokerConfig:
    """Everything a broker process is configured with."""

    broker_id: int
    zookeeper_connect: str
    data_dir: Path
    listen_host: str = "127.0.0.1"
    listen_port: int = 9092
    advertised_host: str | None = None
    rack: str | None = None
    num_partitions: int = 1
    default_replication_factor: int = 1
    max_partitions_per_topic: int = 10000
    max_broker_partitions: int = 4000
    auto_create_topics: bool = False
    zookeeper_session_timeout_ms: int = 18000
    zookeeper_connection_timeout_ms: int = 15000
    replica_lag_time_max_ms: int = 30000
    replica_fetch_wait_max_ms: int = 500
    replica_fetch_max_bytes: int = 1048576
    retention_check_interval_ms: int = 300000
    controlled_shutdown: bool = True
    controlled_shutdown_max_retries: int = 3
    controlled_shutdown_retry_backoff_ms: int = 5000
    auto_leader_rebalance: bool = True
    leader_imbalance_check_interval_ms: int = 300000
    grpc_workers: int = 64
    """Threads that run requests' blocking parts; waiting requests hold none."""
    socket_request_max_bytes: int = 104857600
    """The largest request message accepted (Kafka's socket.request.max.bytes)."""
    queued_max_request_bytes: int = 268435456
    """Request bytes in flight at once; more waits for RESOURCE_EXHAUSTED (Kafka's
    queued.max.request.bytes, unbounded there by default)."""
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    log_defaults: dict[str, str] = field(default_factory=dict)
    """Topic-level default configs (topic key names), from the ``log.*`` keys."""
    log_cleaner_enable: bool = True
    """log.cleaner.enable: run the log cleaner (compaction of cleanup.policy=compact topics)."""
    log_cleaner_threads: int = 1
    log_cleaner_backoff_ms: int = 15000
    log_cleaner_dedupe_buffer_size: int = 134217728
    log_cleaner_io_max_bytes_per_second: float = float("inf")
    """Kafka's default is Double.MAX_VALUE: no throttle."""
    log_cleaner_io_buffer_load_factor: float = 0.9
    leader_replication_throttled_rate: int = LONG_MAX
    """Dynamic only: bytes/s a leader serves to throttled replicas (stored; not enforced yet)."""
    follower_replication_throttled_rate: int = LONG_MAX
    """Dynamic only: bytes/s a follower fetches for throttled replicas (stored; not enforced yet)."""

    def cleaner_config(self) -> CleanerConfig:
        """The ``log.cleaner.*`` settings for the log manager."""
        return CleanerConfig(
            enable=self.log_cleaner_enable,
            threads=self.log_cleaner_threads,
            backoff_ms=self.log_cleaner_backoff_ms,
            dedupe_buffer_size=self.log_cleaner_dedupe_buffer_size,
            io_max_bytes_per_second=self.log_cleaner_io_max_bytes_per_second,
            io_buffer_load_factor=self.log_cleaner_io_buffer_load_factor,
        )

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.listen_host


_SETTERS: dict[str, Callable[[dict[str, Any], str, str], None]] = {}


def _setter(*keys: str) -> Callable[[Callable[[dict[str, Any], str, str], None]], None]:
    def register(fn: Callable[[dict[str, Any], str, str], None]) -> None:
        for k in keys:
            _SETTERS[k] = fn

    return register


def _simple_int(attr: str, minimum: int | None = None) -> Callable[[dict[str, Any], str, str], None]:
    def set_it(out: dict[str, Any], key: str, value: str) -> None:
        out[attr] = _int(key, value, minimum)

    return set_it


for _key, _attr, _min in (
    ("num.partitions", "num_partitions", 1),
    ("default.replication.factor", "default_replication_factor", 1),
    ("max.partitions.per.topic", "max_partitions_per_topic", 1),
    ("max.broker.partitions", "max_broker_partitions", 1),
    ("zookeeper.session.timeout.ms", "zookeeper_session_timeout_ms", 1000),
    ("zookeeper.connection.timeout.ms", "zookeeper_connection_timeout_ms", 100),
    ("replica.lag.time.max.ms", "replica_lag_time_max_ms", 100),
    ("replica.fetch.wait.max.ms", "replica_fetch_wait_max_ms", 0),
    ("replica.fetch.max.bytes", "replica_fetch_max_bytes", 1),
    ("log.retention.check.interval.ms", "retention_check_interval_ms", 1),
    ("leader.imbalance.check.interval.seconds", "leader_imbalance_check_interval_ms", 1),
    ("grpc.workers", "grpc_workers", 4),
    ("controlled.shutdown.max.retries", "controlled_shutdown_max_retries", 1),
    ("controlled.shutdown.retry.backoff.ms", "controlled_shutdown_retry_backoff_ms", 0),
    ("socket.request.max.bytes", "socket_request_max_bytes", 1024),
    ("queued.max.request.bytes", "queued_max_request_bytes", 1024),
    ("group.initial.rebalance.delay.ms", "group_initial_rebalance_delay_ms", 0),
    ("group.min.session.timeout.ms", "group_min_session_timeout_ms", 1),
    ("group.max.session.timeout.ms", "group_max_session_timeout_ms", 1),
    ("log.cleaner.threads", "log_cleaner_threads", 1),
    ("log.cleaner.backoff.ms", "log_cleaner_backoff_ms", 0),
    ("log.cleaner.dedupe.buffer.size", "log_cleaner_dedupe_buffer_size", 1024),
):
    _SETTERS[_key] = _simple_int(_attr, _min)


@_setter("broker.id")
def _broker_id(out: dict[str, Any], key: str, value: str) -> None:
    out["broker_id"] = _int(key, value, 0)


@_setter("zookeeper.connect")
def _zk(out: dict[str, Any], key: str, value: str) -> None:
    if not value.strip() or ":" not in value:
        raise InvalidConfigError(f"{key}: {value!r} is not HOST:PORT[,HOST:PORT...][/chroot]")
    out["zookeeper_connect"] = value.strip()


@_setter("log.dirs", "log.dir")
def _log_dirs(out: dict[str, Any], key: str, value: str) -> None:
    dirs = [d for d in value.split(",") if d.strip()]
    if len(dirs) != 1:
        raise InvalidConfigError(f"{key}: exactly one data directory is supported, got {value!r}")
    out["data_dir"] = Path(dirs[0].strip())


@_setter("listeners", "listen")
def _listen(out: dict[str, Any], key: str, value: str) -> None:
    out["listen_host"], out["listen_port"] = parse_host_port(key, value)


@_setter("advertised.host.name", "advertised.host")
def _advertised(out: dict[str, Any], key: str, value: str) -> None:
    out["advertised_host"] = value.strip()


@_setter("broker.rack")
def _rack(out: dict[str, Any], key: str, value: str) -> None:
    out["rack"] = value.strip() or None


@_setter("auto.create.topics.enable")
def _auto_create(out: dict[str, Any], key: str, value: str) -> None:
    out["auto_create_topics"] = _bool(key, value)


@_setter("log.cleaner.enable")
def _cleaner_enable(out: dict[str, Any], key: str, value: str) -> None:
    out["log_cleaner_enable"] = _bool(key, value)


@_setter("log.cleaner.io.max.bytes.per.second")
def _cleaner_io_rate(out: dict[str, Any], key: str, value: str) -> None:
    out["log_cleaner_io_max_bytes_per_second"] = _float(key, value, 1.0)


@_setter("log.cleaner.io.buffer.load.factor")
def _cleaner_load_factor(out: dict[str, Any], key: str, value: str) -> None:
    factor = _float(key, value, 0.0)
    if not 0.0 < factor <= 1.0:
        raise InvalidConfigError(f"{key}: {value!r} must be above 0 and at most 1")
    out["log_cleaner_io_buffer_load_factor"] = factor


@_setter("controlled.shutdown.enable")
def _controlled(out: dict[str, Any], key: str, value: str) -> None:
    out["controlled_shutdown"] = _bool(key, value)


@_setter("auto.leader.rebalance.enable")
def _rebalance(out: dict[str, Any], key: str, value: str) -> None:
    out["auto_leader_rebalance"] = _bool(key, value)


@_setter("log.retention.hours", "log.retention.minutes")
def _retention_units(out: dict[str, Any], key: str, value: str) -> None:
    """As in Kafka, ``log.retention.ms`` wins over minutes, which win over hours."""
    minutes = key.endswith("minutes")
    amount = _int(key, value, -1)
    ms = amount if amount < 0 else amount * (60_000 if minutes else HOURS_MS)
    rank = 1 if minutes else 0
    if out.get("_retention_rank", -1) <= rank:
        out["_retention_rank"] = rank
        out.setdefault("log_defaults", {})["_units_retention_ms"] = str(ms)


def load_properties(path: Path) -> dict[str, str]:
    """Read a ``key=value`` properties file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    props: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise InvalidConfigError(f"{path}:{number}: expected key=value, got {raw!r}")
        props[key.strip()] = value.strip()
    return props


def with_overrides(config: BrokerConfig, props: Mapping[str, str]) -> BrokerConfig:
    """``config`` with Kafka-named ``props`` laid on top (the dynamic broker configs).

    ``log.*`` defaults replace the topic-level default they name; the throttle rates are
    accepted here only. A bad value raises :class:`InvalidConfigError` and nothing changes.
    """
    out: dict[str, Any] = {"log_defaults": dict(config.log_defaults)}
    for key, value in props.items():
        if key in LOG_DEFAULT_KEYS:
            out["log_defaults"][LOG_DEFAULT_KEYS[key]] = value
        elif key in THROTTLE_RATE_KEYS:
            out[key.replace(".", "_")] = _int(key, value, 0)
        elif key in _SETTERS:
            _SETTERS[key](out, key, value)
        else:
            raise InvalidConfigError(f"unknown broker setting {key!r}")
    out.pop("_retention_rank", None)
    out["log_defaults"].pop("_units_retention_ms", None)
    return replace(config, **out)


def build_config(props: Mapping[str, str]) -> BrokerConfig:
    """Turn Kafka-named properties into a checked :class:`BrokerConfig`."""
    out: dict[str, Any] = {"log_defaults": {}}
    for key, value in props.items():
        if key in LOG_DEFAULT_KEYS:
            out["log_defaults"][LOG_DEFAULT_KEYS[key]] = value
        elif key in _SETTERS:
            _SETTERS[key](out, key, value)
        else:
            raise InvalidConfigError(f"unknown broker setting {key!r}")
    units = out["log_defaults"].pop("_units_retention_ms", None)
    out.pop("_retention_rank", None)
    if units is not None and "retention.ms" not in out["log_defaults"]:
        out["log_defaults"]["retention.ms"] = units
    if "leader_imbalance_check_interval_ms" in out and "leader.imbalance.check.interval.seconds" in props:
        out["leader_imbalance_check_interval_ms"] *= 1000
    for required, name in (
        ("broker_id", "broker.id"),
        ("zookeeper_connect", "zookeeper.connect"),
        ("data_dir", "log.dirs"),
    ):
        if required not in out:
            raise InvalidConfigError(f"missing required setting {name}")
    return BrokerConfig(**out)
