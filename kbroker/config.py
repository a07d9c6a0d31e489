"""Broker configuration: the table of settings, and ``server.properties`` / flags into a
:class:`BrokerConfig`.

:data:`BROKER_CONFIGS` defines every broker setting once (a :class:`~kbroker.config_def.ConfigDef`:
Kafka's name, type, default, validator, importance, documentation, update mode, and the
per-topic config it is the default of). Parsing (:func:`build_config`), dynamic changes
(:func:`with_overrides`, :mod:`kbroker.cluster.config_admin`), DescribeConfigs and
``docs/config-reference.md`` (``scripts/gen-config-docs``) all read it.

The file form is ``server.properties``: ``key=value`` lines, ``#`` comments, with
Kafka's key names. Flags given on the command line win over the file. Every value is
checked when the broker starts; a wrong one is a :class:`InvalidConfigError` with one
readable line naming the key.

Broker-wide log defaults use Kafka's ``log.*`` names and become the topic-level
defaults (``log.segment.bytes`` -> ``segment.bytes`` and so on); per-topic overrides
from ``/config/topics/<t>`` sit on top of them. Those settings' defaults and checks are
the topic configs' own (:class:`~kbroker.storage.log_config.LogConfig`).
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kbroker.config_def import (
    LONG_MAX,
    NO_DEFAULT,
    ConfigDef,
    ConfigKey,
    Importance,
    Range,
    Type,
    UpdateMode,
    parse_float,
    parse_int,
    reference_markdown,
)
from kbroker.log_setup import DEFAULT_FILE_BACKUPS, DEFAULT_FILE_MAX_BYTES, LoggingConfig, parse_level
from kbroker.security.listeners import (
    DEFAULT_PROTOCOL_MAP,
    EndPoint,
    build_listener_config,
    listener_config,
    parse_listeners,
    split_listener_key,
)
from kbroker.security.zk_credential import ZkCredential, ZkCredentialError
from kbroker.storage.cleaner_manager import CleanerConfig
from kbroker.storage.log_config import LogConfig
from kclient.errors import InvalidConfigError, KafkaError
from kclient.security import jaas_credentials, parse_jaas_config

__all__ = ["BROKER_CONFIGS", "LONG_MAX", "BrokerConfig", "build_config", "load_properties", "with_overrides"]

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""The SASL mechanisms kbroker implements (Kafka also has GSSAPI and OAUTHBEARER)."""

DEFAULT_SASL_MECHANISMS = "SCRAM-SHA-256,SCRAM-SHA-512"

ACL_AUTHORIZER_NAMES = (
    "kafka.security.authorizer.AclAuthorizer",
    "kafka.security.auth.SimpleAclAuthorizer",
    "kbroker.security.authorizer.AclAuthorizer",
)
"""``authorizer.class.name`` values that enable the ZooKeeper ACL authorizer."""

SSL_CLIENT_AUTH = ("required", "requested", "none")

# --- the parsers of settings that check more than a type and a range ----------------------


def parse_host_port(key: str, value: str) -> tuple[str, int]:
    """``"127.0.0.1:9092"`` or ``"PLAINTEXT://h:9092"`` -> (host, port)."""
    text = value.split("://", 1)[-1].split(",", 1)[0]
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise InvalidConfigError(f"{key}: {value!r} is not HOST:PORT")
    port_number = parse_int(key, port)
    Range(0)(key, port, port_number)
    return host, port_number


def _listen(key: str, value: str) -> str:
    parse_host_port(key, value)
    return value.strip()


def _zookeeper_connect(key: str, value: str) -> str:
    if not value.strip() or ":" not in value:
        raise InvalidConfigError(f"{key}: {value!r} is not HOST:PORT[,HOST:PORT...][/chroot]")
    return value.strip()


def _log_dirs(key: str, value: str) -> Path:
    dirs = [d for d in value.split(",") if d.strip()]
    if len(dirs) != 1:
        raise InvalidConfigError(f"{key}: exactly one data directory is supported, got {value!r}")
    return Path(dirs[0].strip())


def _optional_path(key: str, value: str) -> Path | None:
    return Path(value.strip()) if value.strip() else None


def _optional_str(key: str, value: str) -> str | None:
    return value.strip() or None


def _mechanisms(key: str, value: str) -> tuple[str, ...]:
    out = tuple(m.strip().upper() for m in value.split(",") if m.strip())
    for m in out:
        if m not in SASL_MECHANISMS:
            raise InvalidConfigError(
                f"{key}: SASL mechanism {m} is not supported (supported: {', '.join(SASL_MECHANISMS)})"
            )
    return out


def _pem_only(key: str, value: str) -> str:
    if value.strip().upper() != "PEM":
        raise InvalidConfigError(f"{key}: {value.strip()!r} is not supported; kbroker reads PEM only (set {key}=PEM)")
    return "PEM"


def _client_auth(key: str, value: str) -> str:
    if value.strip().lower() not in SSL_CLIENT_AUTH:
        raise InvalidConfigError(
            f"Invalid value {value.strip()} for configuration {key}: String must be one of: "
            + ", ".join(SSL_CLIENT_AUTH)
        )
    return value.strip().lower()


def _mechanism_list(key: str, value: str) -> str:
    return ",".join(_mechanisms(key, value))


def _path(key: str, value: str) -> str:
    if not value.strip():
        raise InvalidConfigError(f"{key}: empty path")
    return value.strip()


def _as_given(key: str, value: str) -> str:
    """Not checked nor stripped (an inline PEM's line breaks matter)."""
    return value


def _zookeeper_digest(key: str, value: str) -> str:
    try:
        ZkCredential.parse(value.strip())
    except ZkCredentialError as exc:
        raise InvalidConfigError(f"{key}: {exc}") from None
    return value.strip()


def _one_mechanism(key: str, value: str) -> str:
    mechanisms = _mechanisms(key, value)
    if len(mechanisms) != 1:
        raise InvalidConfigError(f"{key}: {value!r} is not one SASL mechanism")
    return mechanisms[0]


def _authorizer(key: str, value: str) -> str:
    name = value.strip()
    if name and name not in ACL_AUTHORIZER_NAMES:
        raise InvalidConfigError(f"{key}: {name!r} is not supported; use {ACL_AUTHORIZER_NAMES[0]} (or leave it empty)")
    return name


def _super_users(key: str, value: str) -> tuple[str, ...]:
    from kbroker.security.principal import KafkaPrincipal

    users = []
    for item in value.split(";"):
        if item.strip():
            try:
                users.append(str(KafkaPrincipal.parse(item.strip())))
            except KafkaError:
                raise InvalidConfigError(f"{key}: {item.strip()!r} is not a principal such as User:alice") from None
    return tuple(users)


def _load_factor(key: str, value: str) -> float:
    factor = parse_float(key, value)
    if not 0.0 < factor <= 1.0:
        raise InvalidConfigError(f"{key}: {value!r} must be above 0 and at most 1")
    return factor


def _rate(key: str, value: str) -> int:
    """A replication throttle rate (bytes/s); Kafka's messages."""
    try:
        rate = int(value.strip())
    except ValueError:
        raise InvalidConfigError(f"{key}: not an integer") from None
    if not 0 <= rate <= LONG_MAX:
        raise InvalidConfigError(f"{key}: must be at least 0")
    return rate


def _retention_minutes(minutes: int) -> int:
    return minutes if minutes < 0 else minutes * 60_000


def _retention_hours(hours: int) -> int:
    return hours if hours < 0 else hours * 3_600_000


# --- the table ------------------------------------------------------------------------------

H, M, L = Importance.HIGH, Importance.MEDIUM, Importance.LOW
_DYNAMIC = UpdateMode.CLUSTER_WIDE
_CLEANER = CleanerConfig()

_BROKER = "Broker and ZooKeeper"
_LISTENERS = "Listeners"
_SECURITY = "Security"
_LOG = "Log defaults (per-topic configs)"
_CLEANER_GROUP = "Log cleaner"
_REPLICATION = "Replication"
_REQUESTS = "Requests and connections"
_GROUPS = "Consumer groups and offsets"
_TRANSACTIONS = "Transactions"
_OPERATIONS = "Controller and shutdown"
_LOGGING = "Logging and metrics"
_KERBEROS = "Kerberos (accepted, no effect)"


def _topic(name: str, topic: str, type_: Type, importance: Importance, doc: str, *, dynamic: bool = False) -> ConfigKey:
    """A broker-wide default of the per-topic config ``topic`` (its default and checks)."""
    return ConfigKey(
        name,
        type_,
        NO_DEFAULT,
        importance,
        doc,
        _LOG,
        topic=topic,
        update=_DYNAMIC if dynamic else UpdateMode.READ_ONLY,
    )


def _security(
    name: str, type_: Type, doc: str, default: Any = None, *, parse: Any = None, valid: str = ""
) -> ConfigKey:
    """An ``ssl.*`` / ``sasl.*`` setting, also per listener (``listener.name.<l>.<name>``)."""
    return ConfigKey(
        name,
        type_,
        default,
        M,
        doc,
        _SECURITY,
        parse=parse,
        valid_values=valid,
        bucket="security_props",
        per_listener=True,
    )


def _listener(name: str, doc: str, default: Any = None, *, parse: Any = None, flag: str | None = None) -> ConfigKey:
    return ConfigKey(name, Type.STRING, default, H, doc, _LISTENERS, parse=parse, bucket="_listener_raw", flag=flag)


def _kerberos(name: str, type_: Type, default: Any) -> ConfigKey:
    return ConfigKey(
        name,
        type_,
        default,
        L,
        "Kafka's GSSAPI (Kerberos) setting: stored as Kafka stores it (Kafka's clients and tools set it); "
        "kbroker has no GSSAPI, so it changes nothing.",
        _KERBEROS,
        parse=_as_given,
        update=_DYNAMIC,
        dynamic_only=True,
        has_effect=False,
    )


# fmt: off
BROKER_CONFIGS = ConfigDef(
    [
        # --- broker and ZooKeeper
        ConfigKey("broker.id", Type.INT, NO_DEFAULT, H, "This broker's id, unique in the cluster.", _BROKER,
                  validator=Range(0), flag="--broker-id"),
        ConfigKey("zookeeper.connect", Type.STRING, NO_DEFAULT, H,
                  "The ZooKeeper ensemble, `HOST:PORT[,HOST:PORT...][/chroot]`; a chroot lets several clusters "
                  "share one ensemble.", _BROKER, parse=_zookeeper_connect, flag="--zookeeper"),
        ConfigKey("log.dirs", Type.STRING, NO_DEFAULT, H,
                  "The data directory (kbroker supports exactly one).", _BROKER, parse=_log_dirs,
                  attr="data_dir", aliases=("log.dir",), flag="--data-dir"),
        ConfigKey("broker.rack", Type.STRING, None, M,
                  "The rack of this broker; replica assignment spreads a partition's replicas over racks.",
                  _BROKER, parse=_optional_str, attr="rack", flag="--rack"),
        ConfigKey("zookeeper.session.timeout.ms", Type.INT, 18000, H,
                  "The ZooKeeper session timeout: a broker whose session expires leaves the cluster.", _BROKER,
                  validator=Range(1000)),
        ConfigKey("zookeeper.connection.timeout.ms", Type.INT, 15000, H,
                  "How long to wait for a connection to ZooKeeper.", _BROKER, validator=Range(100)),
        ConfigKey("zookeeper.set.acl", Type.BOOLEAN, False, H,
                  "Create znodes with ACLs that let only this cluster's brokers write them.", _BROKER),
        ConfigKey("zookeeper.auth.digest", Type.PASSWORD, None, H,
                  "user:password of the ZooKeeper digest credential (else KBROKER_ZK_DIGEST or a JAAS Client "
                  "section).", _BROKER, parse=_zookeeper_digest, valid_values="user:password"),
        ConfigKey("num.partitions", Type.INT, 1, M, "The partition count of automatically created topics.",
                  _BROKER, validator=Range(1)),
        ConfigKey("default.replication.factor", Type.INT, 1, M,
                  "The replication factor of automatically created topics.", _BROKER, validator=Range(1)),
        ConfigKey("auto.create.topics.enable", Type.BOOLEAN, False, H,
                  "Create a topic when a producer or consumer names one that does not exist.", _BROKER,
                  attr="auto_create_topics"),
        ConfigKey("max.partitions.per.topic", Type.INT, 10000, M,
                  "The most partitions one topic may have (kbroker's).", _BROKER, validator=Range(1)),
        ConfigKey("max.broker.partitions", Type.INT, 4000, M,
                  "The most partition replicas one broker may host.", _BROKER, validator=Range(1)),
        ConfigKey("num.recovery.threads.per.data.dir", Type.INT, 1, H,
                  "Threads that load (and after an unclean shutdown recover) the logs at start-up and flush "
                  "and close them at shutdown.", _BROKER, validator=Range(1)),
        ConfigKey("log.retention.check.interval.ms", Type.LONG, 300000, M,
                  "How often retention deletes old segments.", _BROKER, validator=Range(1),
                  attr="retention_check_interval_ms"),
        # --- listeners
        _listener("listeners",
                  "The gRPC listeners, NAME://HOST:PORT,... (port 0 picks a free one; an empty host binds "
                  "every interface).", "PLAINTEXT://127.0.0.1:9092"),
        _listener("listen", "kbroker's shorthand for listeners=PLAINTEXT://HOST:PORT: HOST:PORT to serve gRPC "
                  "on (port 0 picks a free one).", parse=_listen, flag="--listen"),
        _listener("advertised.listeners",
                  "What the broker registers in ZooKeeper for clients to connect to; unset: the listeners."),
        _listener("listener.security.protocol.map",
                  "Listener name -> security protocol, NAME:PROTOCOL,...", DEFAULT_PROTOCOL_MAP),
        _listener("inter.broker.listener.name",
                  "The listener brokers use to talk to each other; naming it (beside other listeners) makes it "
                  "brokers-only."),
        _listener("security.inter.broker.protocol",
                  "The security protocol between brokers (use inter.broker.listener.name or this).", "PLAINTEXT"),
        _listener("kafka.listeners",
                  "The Kafka-protocol listeners, in Kafka's listener syntax (each port differs from the gRPC "
                  "listeners'); unset: the Kafka door is closed (kbroker's)."),
        _listener("kafka.advertised.listeners",
                  "What the broker registers for the Kafka door; unset: kafka.listeners (kbroker's)."),
        ConfigKey("advertised.host.name", Type.STRING, None, L,
                  "Kafka's old name for the host advertised to clients; advertised.listeners is preferred.",
                  _LISTENERS, attr="advertised_host", aliases=("advertised.host",)),
        # --- security
        _security("ssl.keystore.type", Type.STRING, "The key store's format.", "PEM", parse=_pem_only, valid="[PEM]"),
        _security("ssl.keystore.location", Type.STRING,
                  "A PEM file with this broker's certificate chain and private key.", parse=_path),
        _security("ssl.keystore.certificate.chain", Type.PASSWORD,
                  "The certificate chain in PEM, inline (with ssl.keystore.key, instead of "
                  "ssl.keystore.location).", parse=_as_given),
        _security("ssl.keystore.key", Type.PASSWORD, "The private key in PEM, inline.", parse=_as_given),
        _security("ssl.key.password", Type.PASSWORD, "The password of an encrypted private key."),
        _security("ssl.truststore.type", Type.STRING, "The trust store's format.", "PEM", parse=_pem_only,
                  valid="[PEM]"),
        _security("ssl.truststore.location", Type.STRING, "A PEM file of the CAs whose client certificates "
                  "are trusted.", parse=_path),
        _security("ssl.truststore.certificates", Type.PASSWORD, "The trusted CAs in PEM, inline.",
                  parse=_as_given),
        _security("ssl.client.auth", Type.STRING, "Whether clients must present a certificate.", "none",
                  parse=_client_auth, valid="[" + ", ".join(SSL_CLIENT_AUTH) + "]"),
        _security("sasl.enabled.mechanisms", Type.LIST, "The SASL mechanisms a SASL listener offers.",
                  DEFAULT_SASL_MECHANISMS, parse=_mechanism_list, valid="[" + ", ".join(SASL_MECHANISMS) + "]"),
        _security("sasl.jaas.config", Type.PASSWORD,
                  "JAAS login configuration: on the inter-broker listener, the broker's own user "
                  "(also listener.name.<l>.<mechanism>.sasl.jaas.config)."),
        ConfigKey("sasl.mechanism.inter.broker.protocol", Type.STRING, "SCRAM-SHA-512", M,
                  "The SASL mechanism brokers log in to each other with (Kafka's default, GSSAPI, is not "
                  "implemented).", _SECURITY, parse=_one_mechanism,
                  valid_values="[" + ", ".join(SASL_MECHANISMS) + "]"),
        ConfigKey("connections.max.reauth.ms", Type.LONG, 3_600_000, M,
                  "The lifetime of a SASL session token (Kafka's default is 0 = no re-authentication).",
                  _SECURITY, validator=Range(1)),
        ConfigKey("authorizer.class.name", Type.CLASS, "", H,
                  "The authorizer: kafka.security.authorizer.AclAuthorizer (ACLs in ZooKeeper) or empty (none).",
                  _SECURITY, parse=_authorizer, valid_values="[" + ", ".join(ACL_AUTHORIZER_NAMES) + ", ]"),
        ConfigKey("super.users", Type.STRING, (), M,
                  "Principals allowed everything, User:alice;User:bob.", _SECURITY, parse=_super_users),
        ConfigKey("allow.everyone.if.no.acl.found", Type.BOOLEAN, False, M,
                  "With an authorizer: allow access to a resource that has no ACL.", _SECURITY),
        # --- log defaults: the broker-wide defaults of the per-topic configs
        _topic("log.segment.bytes", "segment.bytes", Type.INT, H, "The size of one log segment file.",
               dynamic=True),
        _topic("log.roll.ms", "segment.ms", Type.LONG, H,
               "Roll a new segment after this long, even if the current one is not full.", dynamic=True),
        _topic("log.index.interval.bytes", "index.interval.bytes", Type.INT, M,
               "Bytes of log between two offset index entries."),
        _topic("log.index.size.max.bytes", "segment.index.bytes", Type.INT, M,
               "The size of a segment's offset and time indexes."),
        _topic("log.retention.ms", "retention.ms", Type.LONG, H,
               "How long a log keeps a segment before deleting it (-1: no time limit).", dynamic=True),
        ConfigKey("log.retention.minutes", Type.INT, None, H,
                  "log.retention.ms in minutes (log.retention.ms wins).", _LOG, validator=Range(-1),
                  synonym_of="log.retention.ms", convert=_retention_minutes),
        ConfigKey("log.retention.hours", Type.INT, None, H,
                  "log.retention.ms in hours (log.retention.minutes and log.retention.ms win).", _LOG,
                  validator=Range(-1), synonym_of="log.retention.ms", convert=_retention_hours),
        _topic("log.retention.bytes", "retention.bytes", Type.LONG, H,
               "The size a partition's log may grow to before old segments are deleted (-1: no limit).",
               dynamic=True),
        _topic("log.flush.interval.messages", "flush.messages", Type.LONG, H,
               "Fsync a log after this many messages (the default leaves flushing to the OS)."),
        _topic("log.flush.interval.ms", "flush.ms", Type.LONG, H,
               "Fsync a log after this long (the default leaves flushing to the OS)."),
        _topic("log.segment.delete.delay.ms", "file.delete.delay.ms", Type.LONG, H,
               "How long a deleted segment's files stay before they are removed."),
        _topic("log.cleanup.policy", "cleanup.policy", Type.LIST, M,
               "delete (retention), compact (keep the latest record of each key) or compact,delete."),
        _topic("log.message.timestamp.type", "message.timestamp.type", Type.STRING, M,
               "CreateTime (the producer's) or LogAppendTime (the leader's)."),
        _topic("message.max.bytes", "max.message.bytes", Type.INT, H,
               "The largest record batch a log accepts.", dynamic=True),
        _topic("min.insync.replicas", "min.insync.replicas", Type.INT, H,
               "With acks=all, the fewest in-sync replicas that must have a write before it is acknowledged.",
               dynamic=True),
        _topic("unclean.leader.election.enable", "unclean.leader.election.enable", Type.BOOLEAN, H,
               "Elect a replica outside the ISR when no in-sync one is left (may lose acknowledged data).",
               dynamic=True),
        _topic("compression.type", "compression.type", Type.STRING, H,
               "The codec batches are stored with: producer keeps the producer's, or uncompressed, gzip, "
               "snappy, lz4, zstd."),
        _topic("log.cleaner.min.cleanable.ratio", "min.cleanable.dirty.ratio", Type.DOUBLE, M,
               "Clean a compacted log once its dirty part is at least this share of it.", dynamic=True),
        _topic("log.cleaner.min.compaction.lag.ms", "min.compaction.lag.ms", Type.LONG, M,
               "Records younger than this are not compacted."),
        _topic("log.cleaner.max.compaction.lag.ms", "max.compaction.lag.ms", Type.LONG, M,
               "A log whose oldest dirty record is older than this is cleaned whatever its ratio."),
        _topic("log.cleaner.delete.retention.ms", "delete.retention.ms", Type.LONG, M,
               "How long tombstones are kept once their log is clean.", dynamic=True),
        # --- log cleaner
        ConfigKey("log.cleaner.enable", Type.BOOLEAN, _CLEANER.enable, M,
                  "Run the log cleaner (compaction of cleanup.policy=compact topics).", _CLEANER_GROUP),
        ConfigKey("log.cleaner.threads", Type.INT, _CLEANER.threads, M, "Threads that clean logs.",
                  _CLEANER_GROUP, validator=Range(1), update=_DYNAMIC),
        ConfigKey("log.cleaner.backoff.ms", Type.LONG, _CLEANER.backoff_ms, M,
                  "How long a cleaner thread sleeps when no log needs cleaning.", _CLEANER_GROUP,
                  validator=Range(0), update=_DYNAMIC),
        ConfigKey("log.cleaner.dedupe.buffer.size", Type.LONG, _CLEANER.dedupe_buffer_size, M,
                  "Memory for the cleaners' offset maps, shared by the threads.", _CLEANER_GROUP,
                  validator=Range(1024), update=_DYNAMIC),
        ConfigKey("log.cleaner.io.max.bytes.per.second", Type.DOUBLE, _CLEANER.io_max_bytes_per_second, M,
                  "The cleaners' I/O (read plus write, all threads together); the default is no limit.",
                  _CLEANER_GROUP, validator=Range(1.0), update=_DYNAMIC),
        ConfigKey("log.cleaner.io.buffer.load.factor", Type.DOUBLE, _CLEANER.io_buffer_load_factor, M,
                  "How full a cleaner's offset map may get.", _CLEANER_GROUP, parse=_load_factor,
                  valid_values="(0,...,1]"),
        # --- replication
        ConfigKey("replica.lag.time.max.ms", Type.LONG, 30000, H,
                  "A follower that has not caught up for this long leaves the ISR.", _REPLICATION,
                  validator=Range(100)),
        ConfigKey("replica.fetch.wait.max.ms", Type.INT, 500, M,
                  "How long a follower's fetch waits at the leader for data.", _REPLICATION, validator=Range(0)),
        ConfigKey("replica.fetch.max.bytes", Type.INT, 1048576, M,
                  "Bytes a follower fetches per partition in one request.", _REPLICATION, validator=Range(1)),
        ConfigKey("leader.replication.throttled.rate", Type.LONG, LONG_MAX, M,
                  "Bytes/s a leader serves to throttled replicas (partition moves); dynamic only.", _REPLICATION,
                  parse=_rate, valid_values="[0,...]", update=_DYNAMIC, dynamic_only=True),
        ConfigKey("follower.replication.throttled.rate", Type.LONG, LONG_MAX, M,
                  "Bytes/s a follower fetches for throttled replicas (partition moves); dynamic only.",
                  _REPLICATION, parse=_rate, valid_values="[0,...]", update=_DYNAMIC, dynamic_only=True),
        # --- requests and connections
        ConfigKey("grpc.workers", Type.INT, 64, M,
                  "Threads that run requests' blocking parts; waiting requests hold none (kbroker's).",
                  _REQUESTS, validator=Range(4)),
        ConfigKey("socket.request.max.bytes", Type.INT, 104857600, H, "The largest request accepted.",
                  _REQUESTS, validator=Range(1024)),
        ConfigKey("queued.max.request.bytes", Type.LONG, 268435456, M,
                  "Client request bytes the broker holds at once, over both doors (Kafka's memory pool; "
                  "unbounded there by default). Bytes count as they arrive (a Kafka frame) or once received "
                  "(a gRPC message, at its decoded size); when it is spent the doors stop reading and wait.",
                  _REQUESTS, validator=Range(1024)),
        ConfigKey("queued.max.request.bytes.per.connection", Type.LONG, -1, M,
                  "The most of queued.max.request.bytes one connection holds; -1: half of it, but at least one "
                  "request of socket.request.max.bytes (kbroker's).", _REQUESTS, validator=Range(-1)),
        ConfigKey("inter.broker.queued.max.request.bytes", Type.LONG, 67108864, M,
                  "The inter-broker budget: follower fetches and controller calls never wait behind client "
                  "requests (kbroker's).", _REQUESTS, validator=Range(1024)),
        ConfigKey("connections.max.idle.ms", Type.LONG, 600000, M,
                  "Close a connection that has no request outstanding and sends nothing for this long "
                  "(gRPC: its max_connection_idle_ms).", _REQUESTS, validator=Range(1)),
        ConfigKey("request.read.timeout.ms", Type.LONG, 30000, M,
                  "A request must arrive whole within this of its first byte, else its connection is closed "
                  "(Kafka door) or the call fails DEADLINE_EXCEEDED (gRPC) (kbroker's).", _REQUESTS,
                  validator=Range(1)),
        ConfigKey("max.incremental.fetch.session.cache.slots", Type.INT, 1000, M,
                  "Fetch sessions (KIP-227) this broker keeps; 0: none.", _REQUESTS, validator=Range(0)),
        ConfigKey("min.incremental.fetch.session.eviction.ms", Type.INT, 120000, M,
                  "A fetch session unused this long may be evicted for a new one.", _REQUESTS,
                  validator=Range(0)),
        # --- consumer groups and offsets
        ConfigKey("group.initial.rebalance.delay.ms", Type.INT, 3000, M,
                  "How long a new group waits for more members before its first rebalance.", _GROUPS,
                  validator=Range(0)),
        ConfigKey("group.min.session.timeout.ms", Type.INT, 6000, M, "The shortest session timeout a member "
                  "may ask for.", _GROUPS, validator=Range(1)),
        ConfigKey("group.max.session.timeout.ms", Type.INT, 1800000, M, "The longest session timeout a member "
                  "may ask for.", _GROUPS, validator=Range(1)),
        ConfigKey("offsets.retention.minutes", Type.INT, 10080, H,
                  "Committed offsets expire once their group has been empty this long (KIP-211).", _GROUPS,
                  validator=Range(1)),
        ConfigKey("offsets.retention.check.interval.ms", Type.LONG, 600000, H,
                  "How often expired offsets are removed.", _GROUPS, validator=Range(1)),
        # --- transactions
        ConfigKey("transaction.max.timeout.ms", Type.INT, 900000, H,
                  "The largest transaction.timeout.ms a producer may ask for (INVALID_TRANSACTION_TIMEOUT above it).",
                  _TRANSACTIONS, validator=Range(1)),
        ConfigKey("transaction.abort.timed.out.transaction.cleanup.interval.ms", Type.INT, 10000, L,
                  "How often the coordinator aborts transactions past their timeout (and finishes those whose "
                  "markers are not all written yet).", _TRANSACTIONS, validator=Range(1),
                  attr="transaction_cleanup_interval_ms"),
        # --- controller and shutdown
        ConfigKey("controlled.shutdown.enable", Type.BOOLEAN, True, M,
                  "Move leadership away before shutting down.", _OPERATIONS, attr="controlled_shutdown"),
        ConfigKey("controlled.shutdown.max.retries", Type.INT, 3, M,
                  "Controlled shutdown attempts before an unclean shutdown.", _OPERATIONS, validator=Range(1)),
        ConfigKey("controlled.shutdown.retry.backoff.ms", Type.LONG, 5000, M,
                  "The wait between controlled shutdown attempts.", _OPERATIONS, validator=Range(0)),
        ConfigKey("auto.leader.rebalance.enable", Type.BOOLEAN, True, H,
                  "The controller moves leadership back to preferred replicas.", _OPERATIONS,
                  attr="auto_leader_rebalance"),
        ConfigKey("leader.imbalance.check.interval.seconds", Type.LONG, 300, H,
                  "How often the controller checks for leader imbalance.", _OPERATIONS, validator=Range(1),
                  attr="leader_imbalance_check_interval_ms", convert=lambda seconds: seconds * 1000),
        # --- logging and metrics
        ConfigKey("log.level", Type.STRING, "INFO", M,
                  "The broker's log level (Kafka sets levels in log4j.properties; kbroker's).", _LOGGING,
                  parse=parse_level, valid_values="[DEBUG, INFO, WARN, ERROR]", flag="--log-level"),
        ConfigKey("log.file", Type.STRING, None, M,
                  "Also log to this file, rotated at log.file.max.bytes (kbroker's).", _LOGGING,
                  parse=_optional_path),
        ConfigKey("log.file.max.bytes", Type.LONG, DEFAULT_FILE_MAX_BYTES, L,
                  "The size at which log.file is rotated (kbroker's).", _LOGGING, validator=Range(1024)),
        ConfigKey("log.file.backups", Type.INT, DEFAULT_FILE_BACKUPS, L,
                  "Rotated log files kept (kbroker's).", _LOGGING, validator=Range(0)),
        ConfigKey("metrics.port", Type.INT, -1, M,
                  "Port of the Prometheus /metrics endpoint on the inter-broker listener's host; -1: off, "
                  "0: a free port (kbroker's).", _LOGGING, validator=Range(-1)),
        # --- Kafka's dynamic Kerberos settings
        _kerberos("sasl.kerberos.service.name", Type.STRING, None),
        _kerberos("sasl.kerberos.kinit.cmd", Type.STRING, "/usr/bin/kinit"),
        _kerberos("sasl.kerberos.ticket.renew.window.factor", Type.DOUBLE, 0.8),
        _kerberos("sasl.kerberos.ticket.renew.jitter", Type.DOUBLE, 0.05),
        _kerberos("sasl.kerberos.min.time.before.relogin", Type.LONG, 60000),
        _kerberos("sasl.kerberos.principal.to.local.rules", Type.LIST, "DEFAULT"),
    ],
    topic_defaults=LogConfig().to_properties(),
)
# fmt: on
"""Every broker setting, once."""

LOG_DEFAULT_KEYS: dict[str, str] = {k.name: k.topic for k in BROKER_CONFIGS if k.topic is not None}
"""Broker key -> topic-level key, for the broker-wide log defaults."""

THROTTLE_RATE_KEYS = BROKER_CONFIGS.names(lambda k: k.dynamic_only and k.has_effect)
"""Dynamic-only broker configs (not valid in ``server.properties``, as in Kafka)."""


def _default(name: str) -> Any:
    """The default of setting ``name`` in its :class:`BrokerConfig` field's unit."""
    return BROKER_CONFIGS[name].field_default


_DEFAULT_PROTOCOL_MAP = dict(
    item.split(":", 1) for item in BROKER_CONFIGS["listener.security.protocol.map"].default.split(",")
)
_DEFAULT_LISTENER = parse_listeners(BROKER_CONFIGS["listeners"].default, _DEFAULT_PROTOCOL_MAP)[0]


@dataclass
class BrokerConfig:
    """Everything a broker process is configured with: the typed fields of
    :data:`BROKER_CONFIGS` (their defaults come from it; see the table for what each means),
    and what is derived from several settings (the listeners)."""

    broker_id: int
    zookeeper_connect: str
    data_dir: Path
    listen_host: str = _DEFAULT_LISTENER.host
    listen_port: int = _DEFAULT_LISTENER.port
    advertised_host: str | None = _default("advertised.host.name")
    rack: str | None = _default("broker.rack")
    num_partitions: int = _default("num.partitions")
    default_replication_factor: int = _default("default.replication.factor")
    max_partitions_per_topic: int = _default("max.partitions.per.topic")
    max_broker_partitions: int = _default("max.broker.partitions")
    auto_create_topics: bool = _default("auto.create.topics.enable")
    zookeeper_session_timeout_ms: int = _default("zookeeper.session.timeout.ms")
    zookeeper_connection_timeout_ms: int = _default("zookeeper.connection.timeout.ms")
    replica_lag_time_max_ms: int = _default("replica.lag.time.max.ms")
    replica_fetch_wait_max_ms: int = _default("replica.fetch.wait.max.ms")
    replica_fetch_max_bytes: int = _default("replica.fetch.max.bytes")
    max_incremental_fetch_session_cache_slots: int = _default("max.incremental.fetch.session.cache.slots")
    min_incremental_fetch_session_eviction_ms: int = _default("min.incremental.fetch.session.eviction.ms")
    retention_check_interval_ms: int = _default("log.retention.check.interval.ms")
    controlled_shutdown: bool = _default("controlled.shutdown.enable")
    controlled_shutdown_max_retries: int = _default("controlled.shutdown.max.retries")
    controlled_shutdown_retry_backoff_ms: int = _default("controlled.shutdown.retry.backoff.ms")
    auto_leader_rebalance: bool = _default("auto.leader.rebalance.enable")
    leader_imbalance_check_interval_ms: int = _default("leader.imbalance.check.interval.seconds")
    grpc_workers: int = _default("grpc.workers")
    socket_request_max_bytes: int = _default("socket.request.max.bytes")
    queued_max_request_bytes: int = _default("queued.max.request.bytes")
    queued_max_request_bytes_per_connection: int = _default("queued.max.request.bytes.per.connection")
    inter_broker_queued_max_request_bytes: int = _default("inter.broker.queued.max.request.bytes")
    connections_max_idle_ms: int = _default("connections.max.idle.ms")
    request_read_timeout_ms: int = _default("request.read.timeout.ms")
    group_initial_rebalance_delay_ms: int = _default("group.initial.rebalance.delay.ms")
    group_min_session_timeout_ms: int = _default("group.min.session.timeout.ms")
    group_max_session_timeout_ms: int = _default("group.max.session.timeout.ms")
    offsets_retention_minutes: int = _default("offsets.retention.minutes")
    offsets_retention_check_interval_ms: int = _default("offsets.retention.check.interval.ms")
    transaction_max_timeout_ms: int = _default("transaction.max.timeout.ms")
    transaction_cleanup_interval_ms: int = _default("transaction.abort.timed.out.transaction.cleanup.interval.ms")
    metrics_port: int = _default("metrics.port")
    log_defaults: dict[str, str] = field(default_factory=dict)
    """Topic-level default configs (topic key names), from the ``log.*`` keys."""
    log_cleaner_enable: bool = _default("log.cleaner.enable")
    num_recovery_threads_per_data_dir: int = _default("num.recovery.threads.per.data.dir")
    log_cleaner_threads: int = _default("log.cleaner.threads")
    log_cleaner_backoff_ms: int = _default("log.cleaner.backoff.ms")
    log_cleaner_dedupe_buffer_size: int = _default("log.cleaner.dedupe.buffer.size")
    log_cleaner_io_max_bytes_per_second: float = _default("log.cleaner.io.max.bytes.per.second")
    log_cleaner_io_buffer_load_factor: float = _default("log.cleaner.io.buffer.load.factor")
    leader_replication_throttled_rate: int = _default("leader.replication.throttled.rate")
    follower_replication_throttled_rate: int = _default("follower.replication.throttled.rate")
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
    inter_broker_listener_name: str = _default("security.inter.broker.protocol")
    inter_broker_listener_named: bool = False
    """``inter.broker.listener.name`` or ``security.inter.broker.protocol`` was set (the
    inter-broker listener was chosen, not defaulted); see :attr:`dedicated_inter_broker_listener`."""
    listener_security_protocol_map: dict[str, str] = field(default_factory=lambda: dict(_DEFAULT_PROTOCOL_MAP))
    security_props: dict[str, str] = field(default_factory=dict, repr=False)
    """The checked ``ssl.*`` and ``sasl.enabled.mechanisms`` keys and their per-listener
    ``listener.name.<name>.<key>`` forms, by Kafka name; read them with
    :meth:`listener_setting`. Left out of ``repr`` (``ssl.key.password``, inline keys)."""
    sasl_mechanism_inter_broker_protocol: str = _default("sasl.mechanism.inter.broker.protocol")
    connections_max_reauth_ms: int = _default("connections.max.reauth.ms")
    authorizer_class_name: str = _default("authorizer.class.name")
    super_users: tuple[str, ...] = _default("super.users")
    allow_everyone_if_no_acl_found: bool = _default("allow.everyone.if.no.acl.found")
    zookeeper_set_acl: bool = _default("zookeeper.set.acl")
    zookeeper_auth_digest: str | None = field(default=None, repr=False)
    """``user:password`` of the ZooKeeper digest credential (``zookeeper.auth.digest``; else
    ``KBROKER_ZK_DIGEST`` or a JAAS Client section, see :mod:`kbroker.security.zk_credential`)."""
    log_level: str = _default("log.level")
    log_file: Path | None = _default("log.file")  # noqa: RUF009 (None)
    log_file_max_bytes: int = _default("log.file.max.bytes")
    log_file_backups: int = _default("log.file.backups")

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
        inter-broker budget, marked or not (kbroker.doors.grpc.server)."""
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
        return (self.listener_setting(listener, "ssl.client.auth") or _default("ssl.client.auth")).lower()

    @property
    def authorizer_enabled(self) -> bool:
        return bool(self.authorizer_class_name)

    def logging_config(self) -> LoggingConfig:
        return LoggingConfig(self.log_level, self.log_file, self.log_file_max_bytes, self.log_file_backups)


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
        listeners = BROKER_CONFIGS["listeners"].default
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


def _jaas_credentials(props: Mapping[str, str], listener: str, mechanism: str) -> tuple[str, str] | None:
    text = listener_config(props, listener, f"{mechanism.lower()}.sasl.jaas.config") or listener_config(
        props, listener, "sasl.jaas.config"
    )
    return None if text is None else jaas_credentials(text, mechanism)


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


def _store(out: dict[str, Any], key: ConfigKey, given: str, raw: str) -> None:
    """Parse and check ``raw`` (setting ``key``, named ``given``) into the field values ``out``."""
    if key.topic is not None:  # checked with the topic configs (LogConfig.from_properties)
        out["log_defaults"][key.topic] = raw
        return
    value = key.parse_value(given, raw)
    if key.bucket is not None:
        out.setdefault(key.bucket, {})[key.name] = value
    elif key.attr is not None:
        out[key.attr] = key.field_value(value)
    else:  # a synonym, applied once every key is read
        out.setdefault("_synonyms", {})[key.name] = key.field_value(value)


def _apply_synonyms(out: dict[str, Any]) -> None:
    """A setting not given takes its highest-precedence synonym that is (``log.retention.ms``
    beats ``log.retention.minutes``, which beats ``log.retention.hours``)."""
    given: dict[str, Any] = out.pop("_synonyms", {})
    for key in BROKER_CONFIGS:
        found = [given[s] for s in key.synonyms if s in given]
        if not found:
            continue
        if key.topic is not None:
            out["log_defaults"].setdefault(key.topic, str(found[0]))
        elif key.attr is not None:
            out.setdefault(key.attr, found[0])


def with_overrides(config: BrokerConfig, props: Mapping[str, str]) -> BrokerConfig:
    """``config`` with Kafka-named ``props`` laid on top (the dynamic broker configs).

    Only dynamic settings are accepted (others: "cannot be changed on a running broker");
    those without effect in kbroker are skipped. A bad value raises
    :class:`InvalidConfigError` and nothing changes.
    """
    out: dict[str, Any] = {"log_defaults": dict(config.log_defaults)}
    for name, raw in props.items():
        key = BROKER_CONFIGS.get(name)
        if key is None and split_listener_key(name) is None:
            raise InvalidConfigError(f"unknown broker setting {name!r}")
        if key is None or not key.dynamic:
            raise InvalidConfigError(f"{name} cannot be changed on a running broker")
        if key.has_effect:
            _store(out, key, name, raw)
    return replace(config, **out)


def build_config(props: Mapping[str, str]) -> BrokerConfig:
    """Turn Kafka-named properties into a checked :class:`BrokerConfig`."""
    out: dict[str, Any] = {"log_defaults": {}}
    for name, raw in props.items():
        key = BROKER_CONFIGS.get(name)
        if key is not None and not key.dynamic_only:
            _store(out, key, name, raw)
        elif key is None and (split := split_listener_key(name)) is not None:
            inner = split[1] if split[1] in BROKER_CONFIGS else "sasl.jaas.config"  # <mechanism>.sasl.jaas.config
            out.setdefault("security_props", {})[name] = BROKER_CONFIGS[inner].parse_value(split[1], raw)
        else:
            raise InvalidConfigError(f"unknown broker setting {name!r}")
    _apply_synonyms(out)
    for key in BROKER_CONFIGS:
        if key.required and key.attr not in out:
            raise InvalidConfigError(f"missing required setting {key.name}")
    _finish_listeners(out)
    _finish_security(out)
    return BrokerConfig(**out)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The settings that have a flag of their own (``--broker-id``), on ``parser``."""
    for key in BROKER_CONFIGS:
        if key.flag is not None:
            parser.add_argument(
                key.flag,
                dest=key.name,
                type=int if key.type in (Type.INT, Type.LONG) else str,
                metavar=key.flag.lstrip("-").upper().replace("-", "_"),
                help=f"{key.name}: {key.doc}" + (f" (default {key.default_text})" if key.default_text else ""),
            )


def flag_settings(args: argparse.Namespace) -> dict[str, str]:
    """The settings given as flags (see :func:`add_flags`), by Kafka name."""
    return {k.name: str(v) for k in BROKER_CONFIGS if k.flag is not None and (v := getattr(args, k.name)) is not None}


REFERENCE_INTRO = """
Every broker setting, generated from the table in `kbroker/config.py` (`BROKER_CONFIGS`) by
`scripts/gen-config-docs`; a unit test fails when this page is stale. Edit the table, then
run the script.

Settings use Kafka's names. They are read from `server.properties` (`key=value` lines) and
`--override KEY=VALUE`; a flag (`--broker-id`, ...) beats both. A wrong value stops the
broker with one line naming the key.

**Update mode** is Kafka's: *read-only* settings change with a restart; *per-broker* and
*cluster-wide* ones are dynamic broker configs, set on a running cluster with
`kctl configs --alter --entity-type brokers (--entity-name ID | --entity-default)` or an
admin client's IncrementalAlterConfigs, and stored in ZooKeeper (`/config/brokers/<id>`,
`/config/brokers/<default>`). A value's precedence: per-broker dynamic, then cluster-wide
dynamic, then `server.properties` and flags, then the default.

A **per-topic config** setting is the broker-wide default of that topic config: a topic's
own override (`kctl configs --entity-type topics`, `/config/topics/<topic>`) beats it. Its
default and valid values are the topic config's.
"""


def config_reference() -> str:
    """``docs/config-reference.md``, generated from :data:`BROKER_CONFIGS` (and the per-topic
    configs' names and defaults, :class:`LogConfig`)."""
    by_topic = BROKER_CONFIGS.by_topic()
    lines = [
        "## Per-topic configs",
        "",
        "Set on a topic at creation or with `kctl configs --entity-type topics`; unset, a topic takes the "
        "broker-wide default.",
        "",
        "| Topic config | Default | Broker-wide default |",
        "|---|---|---|",
    ]
    for name, default in LogConfig().to_properties().items():
        broker = f"`{by_topic[name].name}`" if name in by_topic else "none"
        lines.append(f"| `{name}` | `{default}` | {broker} |" if default else f'| `{name}` | "" | {broker} |')
    table = reference_markdown(BROKER_CONFIGS, title="Configuration reference", intro=REFERENCE_INTRO)
    return table + "\n" + "\n".join(lines) + "\n"
