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

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kbroker.log_setup import DEFAULT_FILE_BACKUPS, DEFAULT_FILE_MAX_BYTES, LoggingConfig, parse_level
from kbroker.security.listeners import (
    DEFAULT_PROTOCOL_MAP,
    PER_LISTENER_KEYS,
    EndPoint,
    build_listener_config,
    listener_config,
    parse_listeners,
    split_listener_key,
)
from kbroker.security.zk_credential import ZkCredential, ZkCredentialError
from kbroker.storage.cleaner_manager import CleanerConfig
from kclient.errors import InvalidConfigError, KafkaError
from kclient.security import jaas_credentials, parse_jaas_config

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
    "compression.type": "compression.type",
}

HOURS_MS = 3_600_000

LONG_MAX = 2**63 - 1

THROTTLE_RATE_KEYS = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
"""Dynamic-only broker configs (not valid in ``server.properties``, as in Kafka)."""

LISTENER_KEYS = (
    "listeners",
    "listen",
    "advertised.listeners",
    "listener.security.protocol.map",
    "inter.broker.listener.name",
    "security.inter.broker.protocol",
    "kafka.listeners",
    "kafka.advertised.listeners",
)
"""Checked together once every key is read (:func:`_finish_listeners`)."""

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""The SASL mechanisms kbroker implements (Kafka also has GSSAPI and OAUTHBEARER)."""

ACL_AUTHORIZER_NAMES = (
    "kafka.security.authorizer.AclAuthorizer",
    "kafka.security.auth.SimpleAclAuthorizer",
    "kbroker.security.authorizer.AclAuthorizer",
)
"""``authorizer.class.name`` values that enable the ZooKeeper ACL authorizer."""

SSL_CLIENT_AUTH = ("required", "requested", "none")

LOGGING_KEYS = ("log.level", "log.file", "log.file.max.bytes", "log.file.backups")
"""kbroker's own logging settings (Kafka uses log4j.properties): static, see :mod:`kbroker.log_setup`."""


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
    max_incremental_fetch_session_cache_slots: int = 1000
    """Fetch sessions (KIP-227) this broker keeps; 0: none (every fetch is a full one)."""
    min_incremental_fetch_session_eviction_ms: int = 120000
    """A fetch session unused this long may be evicted for a new one."""
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
    """Client request bytes the broker holds at once, over both doors (Kafka's
    queued.max.request.bytes, its memory pool; unbounded there by default). Bytes count
    as they arrive (a Kafka frame) or once received (a gRPC message, at its decoded size
    without unknown fields); when it is spent the doors stop reading and wait."""
    queued_max_request_bytes_per_connection: int = -1
    """The most of queued.max.request.bytes one connection holds (kbroker's); -1: half of
    it, but at least one request of socket.request.max.bytes."""
    inter_broker_queued_max_request_bytes: int = 67108864
    """The inter-broker budget (kbroker's): follower Fetches and controller calls of other
    brokers on the inter-broker listener never wait behind client requests."""
    connections_max_idle_ms: int = 600000
    """Close a connection that has no request outstanding and sends nothing for this long
    (Kafka's connections.max.idle.ms); gRPC: grpc.max_connection_idle_ms."""
    request_read_timeout_ms: int = 30000
    """A request must arrive whole within this of its first byte, else its connection is
    closed (Kafka door) or the call fails DEADLINE_EXCEEDED (gRPC) (kbroker's)."""
    group_initial_rebalance_delay_ms: int = 3000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    offsets_retention_minutes: int = 10080
    """Committed offsets expire after this (KIP-211: once their group has been Empty this
    long; see kbroker.group.coordinator)."""
    offsets_retention_check_interval_ms: int = 600000
    metrics_port: int = -1
    """Port of the Prometheus ``/metrics`` endpoint (kbroker.metrics) on the inter-broker
    listener's host; -1 = off (the default), 0 = a free port."""
    log_defaults: dict[str, str] = field(default_factory=dict)
    """Topic-level default configs (topic key names), from the ``log.*`` keys."""
    log_cleaner_enable: bool = True
    """log.cleaner.enable: run the log cleaner (compaction of cleanup.policy=compact topics)."""
    num_recovery_threads_per_data_dir: int = 1
    """Threads that load (and after an unclean shutdown recover) the logs at start-up
    and flush and close them at shutdown (Kafka's num.recovery.threads.per.data.dir)."""
    log_cleaner_threads: int = 1
    log_cleaner_backoff_ms: int = 15000
    log_cleaner_dedupe_buffer_size: int = 134217728
    log_cleaner_io_max_bytes_per_second: float = float("inf")
    """Kafka's default is Double.MAX_VALUE: no throttle."""
    log_cleaner_io_buffer_load_factor: float = 0.9
    leader_replication_throttled_rate: int = LONG_MAX
    """Dynamic only: bytes/s a leader serves to throttled replicas (partition moves)."""
    follower_replication_throttled_rate: int = LONG_MAX
    """Dynamic only: bytes/s a follower fetches for throttled replicas (partition moves)."""
    listeners: tuple[EndPoint, ...] = ()
    """The bound listeners; empty -> one PLAINTEXT listener at listen_host:listen_port."""
    advertised_listeners: tuple[EndPoint, ...] = ()
    """What the broker registers (advertised.listeners); empty -> the listeners."""
    kafka_listeners: tuple[EndPoint, ...] = ()
    """The Kafka-protocol listeners (``kafka.listeners``, Kafka's listener syntax and the
    same ``listener.security.protocol.map``); empty: the door is closed."""
    kafka_advertised_listeners: tuple[EndPoint, ...] = ()
    """What the broker registers for the Kafka door (``kafka.advertised.listeners``);
    empty -> kafka_listeners."""
    inter_broker_listener_name: str = "PLAINTEXT"
    inter_broker_listener_named: bool = False
    """``inter.broker.listener.name`` or ``security.inter.broker.protocol`` was set (the
    inter-broker listener was chosen, not defaulted); see :attr:`dedicated_inter_broker_listener`."""
    listener_security_protocol_map: dict[str, str] = field(
        default_factory=lambda: dict(item.split(":") for item in DEFAULT_PROTOCOL_MAP.split(","))
    )
    security_props: dict[str, str] = field(default_factory=dict, repr=False)
    """The checked ``ssl.*`` and ``sasl.enabled.mechanisms`` keys and their per-listener
    ``listener.name.<name>.<key>`` forms, by Kafka name; read them with
    :meth:`listener_setting`. Left out of ``repr`` (``ssl.key.password``, inline keys)."""
    sasl_mechanism_inter_broker_protocol: str = "SCRAM-SHA-512"
    """Kafka's default is GSSAPI, which kbroker does not implement."""
    connections_max_reauth_ms: int = 3_600_000
    """Lifetime of a SASL session token (Kafka's default is 0 = no re-authentication)."""
    authorizer_class_name: str = ""
    super_users: tuple[str, ...] = ()
    """Principals (``User:alice``) allowed everything, from ``super.users`` (``;``-separated)."""
    allow_everyone_if_no_acl_found: bool = False
    zookeeper_set_acl: bool = False
    zookeeper_auth_digest: str | None = field(default=None, repr=False)
    """``user:password`` of the ZooKeeper digest credential (``zookeeper.auth.digest``; else
    ``KBROKER_ZK_DIGEST`` or a JAAS Client section, see :mod:`kbroker.security.zk_credential`)."""
    log_level: str = "INFO"
    """log.level (kbroker's name; Kafka sets levels in log4j.properties); --log-level wins."""
    log_file: Path | None = None
    """log.file: also log to this file, rotated at log_file_max_bytes."""
    log_file_max_bytes: int = DEFAULT_FILE_MAX_BYTES
    log_file_backups: int = DEFAULT_FILE_BACKUPS

    def __post_init__(self) -> None:
        if not self.listeners:
            self.listeners = (EndPoint("PLAINTEXT", self.listen_host, self.listen_port, "PLAINTEXT"),)
        if not self.advertised_listeners:
            host = self.advertised_host
            self.advertised_listeners = tuple(replace(e, host=host) if host else e for e in self.listeners)

    @property
    def per_connection_request_bytes(self) -> int:
        """queued.max.request.bytes.per.connection in force (its default filled in)."""
        if self.queued_max_request_bytes_per_connection > 0:
            return self.queued_max_request_bytes_per_connection
        half = self.queued_max_request_bytes // 2
        return max(half, min(self.socket_request_max_bytes, self.queued_max_request_bytes))

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
        """The advertised host of the inter-broker listener."""
        found = self.advertised_listener(self.inter_broker_listener_name)
        if self.advertised_host:
            return self.advertised_host
        if found is None:
            return self.listen_host
        return found.host or socket.getfqdn()  # an empty host binds every interface

    @property
    def dedicated_inter_broker_listener(self) -> bool:
        """The inter-broker listener is for brokers only: named by configuration
        (inter.broker.listener.name / security.inter.broker.protocol) beside other
        listeners for clients. Then every call a trusted broker makes there uses the
        inter-broker budget, marked or not (kbroker.api.grpc_server)."""
        return self.inter_broker_listener_named and len(self.listeners) > 1

    def listener(self, name: str) -> EndPoint | None:
        """The bound listener called ``name``."""
        return next((e for e in self.listeners if e.listener_name == name.upper()), None)

    def advertised_listener(self, name: str) -> EndPoint | None:
        return next((e for e in self.advertised_listeners if e.listener_name == name.upper()), None)

    def listener_setting(self, listener: str, key: str) -> str | None:
        """``listener.name.<listener>.<key>`` if set, else ``key``, else ``None`` (``ssl.*``,
        ``sasl.enabled.mechanisms``); defaults are not filled in."""
        return listener_config(self.security_props, listener, key)

    def sasl_enabled_mechanisms(self, listener: str) -> tuple[str, ...]:
        """The mechanisms a SASL listener offers (default ``SCRAM-SHA-256,SCRAM-SHA-512``)."""
        value = self.listener_setting(listener, "sasl.enabled.mechanisms")
        return _mechanisms("sasl.enabled.mechanisms", value if value is not None else DEFAULT_SASL_MECHANISMS)

    def inter_broker_sasl_credentials(self) -> tuple[str, str] | None:
        """(username, password) this broker logs in with on a SASL inter-broker listener:
        ``listener.name.<l>.<mechanism>.sasl.jaas.config``, else ``listener.name.<l>.sasl.jaas.config``,
        else ``sasl.jaas.config``; None when the inter-broker listener is not SASL."""
        inter = self.inter_broker_listener_name
        if not self.listener_security_protocol_map.get(inter, "").startswith("SASL_"):
            return None
        return _jaas_credentials(self.security_props, inter, self.sasl_mechanism_inter_broker_protocol)

    def ssl_client_auth(self, listener: str) -> str:
        return (self.listener_setting(listener, "ssl.client.auth") or "none").lower()

    @property
    def authorizer_enabled(self) -> bool:
        return bool(self.authorizer_class_name)

    def logging_config(self) -> LoggingConfig:
        return LoggingConfig(self.log_level, self.log_file, self.log_file_max_bytes, self.log_file_backups)


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
    ("max.incremental.fetch.session.cache.slots", "max_incremental_fetch_session_cache_slots", 0),
    ("min.incremental.fetch.session.eviction.ms", "min_incremental_fetch_session_eviction_ms", 0),
    ("log.retention.check.interval.ms", "retention_check_interval_ms", 1),
    ("leader.imbalance.check.interval.seconds", "leader_imbalance_check_interval_ms", 1),
    ("grpc.workers", "grpc_workers", 4),
    ("controlled.shutdown.max.retries", "controlled_shutdown_max_retries", 1),
    ("controlled.shutdown.retry.backoff.ms", "controlled_shutdown_retry_backoff_ms", 0),
    ("socket.request.max.bytes", "socket_request_max_bytes", 1024),
    ("queued.max.request.bytes", "queued_max_request_bytes", 1024),
    ("queued.max.request.bytes.per.connection", "queued_max_request_bytes_per_connection", -1),
    ("inter.broker.queued.max.request.bytes", "inter_broker_queued_max_request_bytes", 1024),
    ("connections.max.idle.ms", "connections_max_idle_ms", 1),
    ("request.read.timeout.ms", "request_read_timeout_ms", 1),
    ("group.initial.rebalance.delay.ms", "group_initial_rebalance_delay_ms", 0),
    ("group.min.session.timeout.ms", "group_min_session_timeout_ms", 1),
    ("group.max.session.timeout.ms", "group_max_session_timeout_ms", 1),
    ("offsets.retention.minutes", "offsets_retention_minutes", 1),
    ("offsets.retention.check.interval.ms", "offsets_retention_check_interval_ms", 1),
    ("metrics.port", "metrics_port", -1),
    ("num.recovery.threads.per.data.dir", "num_recovery_threads_per_data_dir", 1),
    ("log.cleaner.threads", "log_cleaner_threads", 1),
    ("log.cleaner.backoff.ms", "log_cleaner_backoff_ms", 0),
    ("log.cleaner.dedupe.buffer.size", "log_cleaner_dedupe_buffer_size", 1024),
):
    _SETTERS[_key] = _simple_int(_attr, _min)


@_setter(*LOGGING_KEYS)
def _logging(out: dict[str, Any], key: str, value: str) -> None:
    if key == "log.level":
        out["log_level"] = parse_level(key, value)
    elif key == "log.file":
        out["log_file"] = Path(value.strip()) if value.strip() else None
    elif key == "log.file.max.bytes":
        out["log_file_max_bytes"] = _int(key, value, 1024)
    else:
        out["log_file_backups"] = _int(key, value, 0)


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


@_setter(*LISTENER_KEYS)
def _listener_key(out: dict[str, Any], key: str, value: str) -> None:
    if key == "listen":
        parse_host_port(key, value)
    out.setdefault("_listener_raw", {})[key] = value.strip()


def _finish_listeners(out: dict[str, Any]) -> None:
    """Check the listener keys together and set the listener fields (and listen_host/port:
    the inter-broker listener's). ``listen=HOST:PORT`` (``--listen``) is the shorthand for
    ``listeners=PLAINTEXT://HOST:PORT``."""
    raw: dict[str, str] = out.pop("_listener_raw", {})
    listeners = raw.get("listeners")
    if "listen" in raw:
        if listeners is not None:
            raise InvalidConfigError(
                "listen (--listen) and listeners are both set: --listen HOST:PORT is the shorthand for "
                "listeners=PLAINTEXT://HOST:PORT; use one of them"
            )
        host, port = parse_host_port("listen", raw["listen"])
        listeners = f"PLAINTEXT://{f'[{host}]' if ':' in host else host}:{port}"
    if listeners is None:
        listeners = f"PLAINTEXT://{BrokerConfig.listen_host}:{BrokerConfig.listen_port}"
    cfg = build_listener_config(
        listeners,
        raw.get("advertised.listeners"),
        raw.get("listener.security.protocol.map"),
        raw.get("inter.broker.listener.name"),
        raw.get("security.inter.broker.protocol"),
    )
    advertised = cfg.advertised_listeners
    legacy_host: str | None = out.get("advertised_host")
    if legacy_host and "advertised.listeners" not in raw:
        advertised = tuple(replace(e, host=legacy_host) for e in advertised)
    out["listeners"] = cfg.listeners
    out["advertised_listeners"] = advertised
    _finish_kafka_listeners(out, raw, cfg.protocol_map, legacy_host)
    out["inter_broker_listener_name"] = cfg.inter_broker_listener_name
    out["inter_broker_listener_named"] = (
        raw.get("inter.broker.listener.name") is not None or raw.get("security.inter.broker.protocol") is not None
    )
    out["listener_security_protocol_map"] = dict(cfg.protocol_map)
    inter = cfg.inter_broker
    out["listen_host"], out["listen_port"] = inter.bind_host, inter.port


def _finish_kafka_listeners(
    out: dict[str, Any], raw: Mapping[str, str], pmap: Mapping[str, str], legacy_host: str | None
) -> None:
    """``kafka.listeners`` / ``kafka.advertised.listeners``: the Kafka-protocol door, in
    Kafka's listener syntax, checked as ``listeners`` is. Their ports must differ from the
    gRPC listeners' (both doors bind)."""
    value = raw.get("kafka.listeners")
    if value is None:
        if "kafka.advertised.listeners" in raw:
            raise InvalidConfigError("kafka.advertised.listeners is set but kafka.listeners is not")
        return
    bound = parse_listeners(value, pmap, key="kafka.listeners")
    taken = {e.port for e in out["listeners"] if e.port}
    clash = [e for e in bound if e.port and e.port in taken]
    if clash:
        raise InvalidConfigError(
            f"kafka.listeners: port {clash[0].port} is already a gRPC listener's (listeners); "
            "each door needs its own port"
        )
    advertised_raw = raw.get("kafka.advertised.listeners")
    if advertised_raw is None:
        advertised = tuple(replace(e, host=legacy_host) if legacy_host else e for e in bound)
    else:
        advertised = parse_listeners(advertised_raw, pmap, key="kafka.advertised.listeners", distinct_ports=False)
        names = {e.listener_name for e in bound}
        extra = [e.listener_name for e in advertised if e.listener_name not in names]
        if extra:
            raise InvalidConfigError(
                f"kafka.advertised.listeners names {','.join(extra)}, which kafka.listeners does not define"
            )
    if any(e.host == "0.0.0.0" for e in advertised):
        raise InvalidConfigError(
            "kafka.advertised.listeners cannot use the nonroutable meta-address 0.0.0.0. Use a routable IP address."
        )
    out["kafka_listeners"] = bound
    out["kafka_advertised_listeners"] = advertised


DEFAULT_SASL_MECHANISMS = "SCRAM-SHA-256,SCRAM-SHA-512"


def _mechanisms(key: str, value: str) -> tuple[str, ...]:
    out = tuple(m.strip().upper() for m in value.split(",") if m.strip())
    for m in out:
        if m not in SASL_MECHANISMS:
            raise InvalidConfigError(
                f"{key}: SASL mechanism {m} is not supported (supported: {', '.join(SASL_MECHANISMS)})"
            )
    return out


def _jaas_credentials(props: Mapping[str, str], listener: str, mechanism: str) -> tuple[str, str] | None:
    text = listener_config(props, listener, f"{mechanism.lower()}.sasl.jaas.config") or listener_config(
        props, listener, "sasl.jaas.config"
    )
    return None if text is None else jaas_credentials(text, mechanism)


def _check_security_value(key: str, value: str) -> str:
    """One ``ssl.*`` / ``sasl.enabled.mechanisms`` value, checked; returns what to keep."""
    if key in ("ssl.keystore.type", "ssl.truststore.type"):
        if value.strip().upper() != "PEM":
            raise InvalidConfigError(
                f"{key}: {value.strip()!r} is not supported; kbroker reads PEM only (set {key}=PEM)"
            )
        return "PEM"
    if key == "ssl.client.auth":
        if value.strip().lower() not in SSL_CLIENT_AUTH:
            raise InvalidConfigError(
                f"Invalid value {value.strip()} for configuration {key}: String must be one of: "
                + ", ".join(SSL_CLIENT_AUTH)
            )
        return value.strip().lower()
    if key == "sasl.enabled.mechanisms":
        return ",".join(_mechanisms(key, value))
    if key in ("ssl.keystore.location", "ssl.truststore.location") and not value.strip():
        raise InvalidConfigError(f"{key}: empty path")
    return (
        value
        if key in ("ssl.keystore.certificate.chain", "ssl.keystore.key", "ssl.truststore.certificates")
        else value.strip()
    )


def _security_setter(out: dict[str, Any], key: str, value: str) -> None:
    out.setdefault("security_props", {})[key] = _check_security_value(key, value)


for _key in PER_LISTENER_KEYS:  # the ssl.* and sasl.* keys, plain or per listener
    _SETTERS[_key] = _security_setter


@_setter("zookeeper.auth.digest")
def _zookeeper_digest(out: dict[str, Any], key: str, value: str) -> None:
    try:
        ZkCredential.parse(value.strip())
    except ZkCredentialError as exc:
        raise InvalidConfigError(f"{key}: {exc}") from None
    out["zookeeper_auth_digest"] = value.strip()


@_setter("sasl.mechanism.inter.broker.protocol")
def _inter_broker_mechanism(out: dict[str, Any], key: str, value: str) -> None:
    mechanisms = _mechanisms(key, value)
    if len(mechanisms) != 1:
        raise InvalidConfigError(f"{key}: {value!r} is not one SASL mechanism")
    out["sasl_mechanism_inter_broker_protocol"] = mechanisms[0]


@_setter("connections.max.reauth.ms")
def _reauth(out: dict[str, Any], key: str, value: str) -> None:
    out["connections_max_reauth_ms"] = _int(key, value, 1)


@_setter("authorizer.class.name")
def _authorizer(out: dict[str, Any], key: str, value: str) -> None:
    name = value.strip()
    if name and name not in ACL_AUTHORIZER_NAMES:
        raise InvalidConfigError(f"{key}: {name!r} is not supported; use {ACL_AUTHORIZER_NAMES[0]} (or leave it empty)")
    out["authorizer_class_name"] = name


@_setter("super.users")
def _super_users(out: dict[str, Any], key: str, value: str) -> None:
    from kbroker.security.principal import KafkaPrincipal

    users = []
    for item in value.split(";"):
        if item.strip():
            try:
                users.append(str(KafkaPrincipal.parse(item.strip())))
            except KafkaError:
                raise InvalidConfigError(f"{key}: {item.strip()!r} is not a principal such as User:alice") from None
    out["super_users"] = tuple(users)


@_setter("allow.everyone.if.no.acl.found")
def _allow_everyone(out: dict[str, Any], key: str, value: str) -> None:
    out["allow_everyone_if_no_acl_found"] = _bool(key, value)


@_setter("zookeeper.set.acl")
def _zk_set_acl(out: dict[str, Any], key: str, value: str) -> None:
    out["zookeeper_set_acl"] = _bool(key, value)


_SECURITY_STATIC_KEYS = frozenset(
    k for k, fn in _SETTERS.items() if fn is _security_setter or k.startswith(("sasl.", "ssl."))
) | {
    "connections.max.reauth.ms",
    "authorizer.class.name",
    "super.users",
    "allow.everyone.if.no.acl.found",
    "zookeeper.auth.digest",
    "zookeeper.set.acl",
}
"""Security keys that only ``server.properties`` sets (a restart applies them)."""


def _finish_security(out: dict[str, Any]) -> None:
    """Cross-key checks of the ``ssl.*``/``sasl.*`` keys against the listeners."""
    props: dict[str, str] = out.setdefault("security_props", {})
    every = (*out["listeners"], *out.get("kafka_listeners", ()))  # both doors' listeners
    names = {e.listener_name for e in every}
    protocols = out["listener_security_protocol_map"]
    for key in props:
        split = split_listener_key(key)
        if split is not None and split[0] not in names:
            raise InvalidConfigError(f"{key}: there is no listener {split[0]} in listeners or kafka.listeners")
    for e in every:
        name, protocol = e.listener_name, protocols[e.listener_name]

        def get(k: str, name: str = name) -> str | None:
            return listener_config(props, name, k)

        if protocol in ("SSL", "SASL_SSL"):
            location, chain, inline_key = (
                get("ssl.keystore.location"),
                get("ssl.keystore.certificate.chain"),
                get("ssl.keystore.key"),
            )
            if location is not None and (chain is not None or inline_key is not None):
                raise InvalidConfigError(
                    f"listener {name}: set ssl.keystore.location or ssl.keystore.certificate.chain with "
                    "ssl.keystore.key, not both"
                )
            if location is None and (chain is None or inline_key is None):
                raise InvalidConfigError(
                    f"listener {name} ({protocol}) needs a key store: ssl.keystore.location (PEM file with the "
                    "certificate chain and the private key) or ssl.keystore.certificate.chain and ssl.keystore.key"
                )
            trusted = get("ssl.truststore.location") is not None or get("ssl.truststore.certificates") is not None
            if (get("ssl.client.auth") or "none") != "none" and not trusted:
                raise InvalidConfigError(
                    f"listener {name}: ssl.client.auth={get('ssl.client.auth')} needs ssl.truststore.location "
                    "or ssl.truststore.certificates (the CA that signs client certificates)"
                )
        if protocol.startswith("SASL_") and not _mechanisms(
            "sasl.enabled.mechanisms", get("sasl.enabled.mechanisms") or DEFAULT_SASL_MECHANISMS
        ):
            raise InvalidConfigError(f"listener {name} ({protocol}): sasl.enabled.mechanisms is empty")
    inter = out["inter_broker_listener_name"]
    for key, value in props.items():
        if key == "sasl.jaas.config" or key.endswith(".sasl.jaas.config"):
            parse_jaas_config(value)  # its errors name the key and never quote the password
    if protocols[inter].startswith("SASL_"):
        enabled = _mechanisms(
            "sasl.enabled.mechanisms",
            listener_config(props, inter, "sasl.enabled.mechanisms") or DEFAULT_SASL_MECHANISMS,
        )
        mechanism = out.get("sasl_mechanism_inter_broker_protocol", BrokerConfig.sasl_mechanism_inter_broker_protocol)
        if mechanism not in enabled:
            raise InvalidConfigError(
                "sasl.mechanism.inter.broker.protocol must be included in sasl.enabled.mechanisms when SASL is "
                f"used for inter-broker communication ({mechanism} is not in {','.join(enabled)})"
            )
        if _jaas_credentials(props, inter, mechanism) is None:
            raise InvalidConfigError(
                f"the inter-broker listener {inter} is {protocols[inter]}: set "
                f"listener.name.{inter.lower()}.{mechanism.lower()}.sasl.jaas.config (or sasl.jaas.config) to the "
                "broker's own user, e.g. org.apache.kafka.common.security.scram.ScramLoginModule required "
                'username="broker" password="...";'
            )


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
    pending = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = pending + raw.strip() if pending else raw.strip()
        if not pending and (not line or line.startswith(("#", "!"))):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # a Java properties continuation line (e.g. an inline PEM)
            pending = line[:-1]
            continue
        pending = ""
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
        elif key in LISTENER_KEYS or key in LOGGING_KEYS or key in _SECURITY_STATIC_KEYS or split_listener_key(key):
            raise InvalidConfigError(f"{key} cannot be changed on a running broker")
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
        elif (split := split_listener_key(key)) is not None:
            out.setdefault("security_props", {})[key] = _check_security_value(split[1], value)
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
    _finish_listeners(out)
    _finish_security(out)
    return BrokerConfig(**out)
