"""Every ZooKeeper path kbroker uses, and the codec of each znode's content.

This module is the only place that names a znode path (Kafka's ``ZkData.scala``).
Contents are Kafka's own JSON shapes from its ZooKeeper era, so the layout reads the
same with ``zkCli.sh`` as a Kafka cluster's would:

=============================================== ==== =====================================
path                                            mode content
=============================================== ==== =====================================
/cluster/id                                     P    {"version":"1","id":"<22 chars>"}
/brokers/ids/<id>                               E    {"version":4,"host","port","rack",
                                                     "endpoints":["SSL://h:9093"],
                                                     "listener_security_protocol_map","timestamp"}
/controller                                     E    {"version":1,"brokerid","timestamp"}
/controller_epoch                               P    the epoch as a decimal string
/brokers/topics/<t>                             P    {"version":2,"partitions":{"0":[1,2]},
                                                     "adding_replicas":{},"removing_replicas":{},
                                                     "topic_id":"<22 chars>"} (v1 if no id, idle)
/brokers/topics/<t>/partitions/<p>/state        P    {"version":1,"leader","leader_epoch",
                                                     "isr","controller_epoch"}
/config/topics/<t>                              P    {"version":1,"config":{k: "v"}}
/config/brokers/<id> and /config/brokers/<default> P {"version":1,"config":{k: "v"}}
/config/users/<sanitized user>                  P    {"version":1,"config":{"SCRAM-SHA-256":
                                                     "salt=..,stored_key=..,server_key=..,iterations=N"}}
/config/changes/config_change_<10 digits>       PS   {"version":2,"entity_path":"topics/<t>"}
/admin/reassign_partitions                      P    {"version":1,"partitions":[{"topic","partition",
                                                     "replicas"}]}
/admin/delete_topics/<t>                        P    empty
/admin/preferred_replica_election               P    {"version":1,"partitions":[{"topic","partition"}]}
/latest_producer_id_block                       P    {"version":1,"broker","block_start","block_end"}
/consumers/<g>/ids/<member>                     E    JSON member metadata
/consumers/<g>/owners/<t>/<p>                   E    owning member id
/consumers/<g>/offsets/<t>/<p>                  P    decimal offset (+ optional metadata)
/transaction_state/<transactional id>           P    {"version":1,"producer_id","producer_epoch",
                                                     "last_producer_epoch","timeout_ms","state",
                                                     "partitions":{"t":[0]},"groups":["g"],
                                                     "pending_offsets":{"g":{"t":{"0":[o,"m"]}}},
                                                     "start_ms","update_ms"} (a kbroker path)
=============================================== ==== =====================================

**Names as path segments.** Every name that becomes a path segment (topic, group id,
member id) goes through :func:`name_segment`, and every listed child back through
:func:`decode_segment`. ZooKeeper refuses ``.``, ``..``, NUL, control characters and
some Unicode ranges in paths, and ``/`` would nest into another node, so those are
percent-encoded (UTF-8 bytes, ``%XX``), as is ``%`` itself; ``.`` and ``..`` become
``%2E`` and ``%2E%2E``. Every other name, including every legal topic name, is its own
segment, so znodes written before the encoding still read (only a pre-existing group
id containing ``%XX`` would now decode differently). Lengths are bounded
(:data:`MAX_GROUP_ID_LENGTH`, :data:`MAX_MEMBER_ID_LENGTH`, :data:`MAX_TOPIC_SEGMENT_LENGTH`
characters) because ZooKeeper refuses any packet over its ``jute.maxbuffer``.

**Request sizes.** ZooKeeper drops the session of a client that sends a packet over
``jute.maxbuffer`` (1 MiB by default). :func:`request_bytes` estimates a write's size
and writers refuse one over :data:`MAX_REQUEST_BYTES` (512 KiB: half the server's
default, room for a multi's framing and the chroot) before sending it.

Thread safety: everything here is a pure function of its arguments.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from kbroker.security.listeners import SECURITY_PROTOCOLS, EndPoint, create_end_point
from kclient.errors import BrokerResponseError, InvalidGroupIdError, InvalidRequestError, InvalidTopicError

CLUSTER_ID = "/cluster/id"
BROKER_IDS = "/brokers/ids"
BROKER_TOPICS = "/brokers/topics"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
CONFIG_TOPICS = "/config/topics"
CONFIG_BROKERS = "/config/brokers"
CONFIG_USERS = "/config/users"
CONFIG_CHANGES = "/config/changes"
ADMIN = "/admin"
REASSIGN_PARTITIONS = "/admin/reassign_partitions"
DELETE_TOPICS = "/admin/delete_topics"
PREFERRED_REPLICA_ELECTION = "/admin/preferred_replica_election"
LATEST_PRODUCER_ID_BLOCK = "/latest_producer_id_block"
CONSUMERS = "/consumers"
TRANSACTION_STATE = "/transaction_state"
"""kbroker's home of transaction state (Kafka keeps it in the __transaction_state topic):
one znode per transactional id, written compare-and-set by its coordinator."""
ISR_CHANGE_NOTIFICATION = "/isr_change_notification"
ISR_CHANGE_PREFIX = "isr_change_"
"""Leaders announce ISR changes they wrote as sequential children
``/isr_change_notification/isr_change_<seq>``; the controller reads, forwards (in
UpdateMetadata) and deletes them."""

PERSISTENT_PATHS = (
    BROKER_IDS,
    BROKER_TOPICS,
    CONFIG_TOPICS,
    CONFIG_BROKERS,
    CONFIG_CHANGES,
    ADMIN,
    DELETE_TOPICS,
    CONSUMERS,
    ISR_CHANGE_NOTIFICATION,
)
"""Parents that every broker makes sure exist at start-up."""

NO_LEADER = -1


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _loads(data: bytes) -> Any:
    return json.loads(data.decode())


def now_ms() -> int:
    return int(time.time() * 1000)


# --- names as path segments ----------------------------------------------------------

MAX_GROUP_ID_LENGTH = 255
"""Characters in a group id. Kafka sets no limit; a ZooKeeper path must fit in a packet."""
MAX_MEMBER_ID_LENGTH = 512
"""Characters in a member id (``<client.id>-<uuid>``): a client id up to ~475 characters."""
MAX_TOPIC_SEGMENT_LENGTH = 255
"""Characters in a topic name used in a path (legal topic names have at most 249)."""

MAX_TRANSACTIONAL_ID_LENGTH = 255
"""Characters of a transactional id (a path segment)."""
MAX_REQUEST_BYTES = 512 * 1024
"""Largest ZooKeeper write (one znode, or one multi) kbroker sends; jute.maxbuffer is 1 MiB."""


def _needs_escape(ch: str) -> bool:
    # ZooKeeper's PathUtils.validatePath refuses these UTF-16 code units (so also every
    # code point above U+FFFF: a surrogate pair); '/' nests, '%' escapes.
    c = ord(ch)
    return ch in "/%" or c < 0x20 or 0x7F <= c <= 0x9F or 0xD800 <= c <= 0xF8FF or c >= 0xFFF0


def encode_segment(name: str) -> str:
    """``name`` as one safe, reversible path segment (see the module docstring)."""
    if name in (".", ".."):
        return "%2E" * len(name)
    if not any(_needs_escape(ch) for ch in name):
        return name
    out: list[str] = []
    for ch in name:
        if _needs_escape(ch):
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
        else:
            out.append(ch)
    return "".join(out)


def decode_segment(segment: str) -> str:
    """The name a child segment stands for (inverse of :func:`encode_segment`)."""
    if "%" not in segment:
        return segment
    return urllib.parse.unquote(segment, errors="surrogatepass")


def name_segment(name: str, what: str, max_length: int, error: type[BrokerResponseError]) -> str:
    """Check ``name``'s length and encode it; the one gate for names in paths."""
    if not name:
        raise error(f"the {what} is empty")
    if len(name) > max_length:
        raise error(f"the {what} is {len(name)} characters long; the limit is {max_length}")
    return encode_segment(name)


def group_segment(group: str) -> str:
    return name_segment(group, "group id", MAX_GROUP_ID_LENGTH, InvalidGroupIdError)


def member_segment(member_id: str) -> str:
    return name_segment(member_id, "member id", MAX_MEMBER_ID_LENGTH, InvalidRequestError)


def topic_segment(topic: str) -> str:
    return name_segment(topic, "topic name", MAX_TOPIC_SEGMENT_LENGTH, InvalidTopicError)


def transactional_id_segment(transactional_id: str) -> str:
    return name_segment(transactional_id, "transactional id", MAX_TRANSACTIONAL_ID_LENGTH, InvalidRequestError)


def request_bytes(path: str, data: bytes = b"") -> int:
    """An upper estimate of one operation's bytes in a ZooKeeper request.

    Path and data as length-prefixed UTF-8, plus header, version, flags and an ACL.
    """
    return len(path.encode("utf-8", "surrogatepass")) + len(data) + 96


# --- /cluster/id ---------------------------------------------------------------------


def encode_cluster_id(cluster_id: str) -> bytes:
    return _dumps({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    return str(_loads(data)["id"])


# --- /brokers/ids/<id> ---------------------------------------------------------------


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


@dataclass(frozen=True)
class BrokerInfo:
    """A live broker as registered in ``/brokers/ids/<id>``.

    ``endpoints`` are its advertised listeners; ``host``/``port`` are those of its
    inter-broker listener (what replication and the controller connect to). Built
    without ``endpoints``, it has one PLAINTEXT endpoint at ``host:port``.
    """

    broker_id: int
    host: str
    port: int
    rack: str | None = None
    timestamp_ms: int = 0
    epoch: int = -1
    """The registration znode's czxid (Kafka's broker epoch, KIP-380); -1 if unknown."""
    endpoints: tuple[EndPoint, ...] = ()
    kafka_endpoints: tuple[EndPoint, ...] = ()
    """Its Kafka-protocol listeners (``kafka.advertised.listeners``), in the znode's
    ``kafka_endpoints`` (a kbroker field; Kafka's readers ignore unknown fields)."""

    def __post_init__(self) -> None:
        if not self.endpoints:
            object.__setattr__(self, "endpoints", (EndPoint("PLAINTEXT", self.host, self.port, "PLAINTEXT"),))

    @classmethod
    def of(
        cls,
        broker_id: int,
        endpoints: tuple[EndPoint, ...],
        inter_broker_listener: str,
        rack: str | None = None,
        kafka_endpoints: tuple[EndPoint, ...] = (),
    ) -> BrokerInfo:
        """A registration whose host/port are those of ``inter_broker_listener``."""
        inter = next((e for e in endpoints if e.listener_name == inter_broker_listener.upper()), None)
        if inter is None:
            raise ValueError(f"no endpoint for the inter-broker listener {inter_broker_listener}")
        return cls(broker_id, inter.host, inter.port, rack, endpoints=endpoints, kafka_endpoints=kafka_endpoints)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def endpoint(self, listener_name: str) -> EndPoint | None:
        """The advertised endpoint of listener ``listener_name`` (case-insensitive), if any."""
        want = listener_name.upper()
        return next((e for e in self.endpoints if e.listener_name == want), None)

    def door_endpoint(self, door: str, listener_name: str) -> EndPoint | None:
        """The advertised endpoint of ``listener_name`` on ``door`` ("grpc" or "kafka")."""
        if door != "kafka":
            return self.endpoint(listener_name)
        want = listener_name.upper()
        return next((e for e in self.kafka_endpoints if e.listener_name == want), None)


def encode_broker(info: BrokerInfo) -> bytes:
    """Kafka's v4 broker znode. Kafka writes ``host``/``port`` of the PLAINTEXT endpoint
    (null/-1 without one) for pre-0.10 clients; kbroker has none, and writes its
    inter-broker listener's there instead, which every reader of v4 ignores."""
    body: dict[str, Any] = {
        "version": 4,
        "host": info.host,
        "port": info.port,
        "jmx_port": -1,
        "endpoints": [e.connection_string() for e in info.endpoints],
        "listener_security_protocol_map": {e.listener_name: e.security_protocol for e in info.endpoints},
        "timestamp": str(info.timestamp_ms or now_ms()),
    }
    if info.rack is not None:
        body["rack"] = info.rack
    if info.kafka_endpoints:
        body["kafka_endpoints"] = [e.connection_string() for e in info.kafka_endpoints]
        body["kafka_listener_security_protocol_map"] = {
            e.listener_name: e.security_protocol for e in info.kafka_endpoints
        }
    return _dumps(body)


def decode_broker(broker_id: int, data: bytes, epoch: int = -1) -> BrokerInfo:
    """Versions 1-4. Without ``endpoints`` (v1) the broker has one PLAINTEXT endpoint at
    ``host:port``; an endpoint whose listener is missing from
    ``listener_security_protocol_map`` (v2) takes the protocol of its own name, as Kafka."""
    body = _loads(data)
    protocols: dict[str, str] = body.get("listener_security_protocol_map") or {}
    endpoints = tuple(
        create_end_point(text, {**{p: p for p in SECURITY_PROTOCOLS}, **protocols})
        for text in body.get("endpoints") or ()
    )
    kafka_protocols: dict[str, str] = body.get("kafka_listener_security_protocol_map") or {}
    kafka_endpoints = tuple(
        create_end_point(text, {**{p: p for p in SECURITY_PROTOCOLS}, **kafka_protocols})
        for text in body.get("kafka_endpoints") or ()
    )
    host, port = body.get("host"), body.get("port")
    if (host is None or port is None or int(port) < 0) and endpoints:
        host, port = endpoints[0].host, endpoints[0].port
    return BrokerInfo(
        broker_id=broker_id,
        host=str(host),
        port=int(port),
        rack=body.get("rack"),
        timestamp_ms=int(body.get("timestamp", 0)),
        epoch=epoch,
        endpoints=endpoints,
        kafka_endpoints=kafka_endpoints,
    )


# --- /controller and /controller_epoch -----------------------------------------------


def encode_controller(broker_id: int) -> bytes:
    return _dumps({"version": 1, "brokerid": broker_id, "timestamp": str(now_ms())})


def decode_controller(data: bytes) -> int:
    body = _loads(data)
    return int(body["brokerid"]) if isinstance(body, dict) else int(body)


def encode_controller_epoch(epoch: int) -> bytes:
    return str(epoch).encode()


def decode_controller_epoch(data: bytes) -> int:
    return int(data.decode())


# --- /brokers/topics/<t> -------------------------------------------------------------


def topic_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic_segment(topic)}"


Assignment = dict[int, list[int]]
"""Partition index -> replica broker ids; the first replica is the preferred leader."""


def new_topic_id() -> str:
    """A topic id as Kafka 2.8 writes it: a random UUID, url-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@dataclass(frozen=True)
class TopicZNode:
    """The whole content of ``/brokers/topics/<t>`` (Kafka's ``TopicZNode``, KIP-455).

    ``partitions`` is each partition's full replica set (during a move: target first,
    then the origin replicas not in the target); ``adding`` and ``removing`` hold a
    partition only while it moves (target = RS minus removing, origin = RS minus adding).
    Every writer of a topic znode goes through this type, so no write erases a move.
    """

    partitions: Assignment
    adding: Assignment = field(default_factory=dict)
    removing: Assignment = field(default_factory=dict)
    topic_id: str | None = None

    def reassigning(self, partition: int) -> bool:
        return bool(self.adding.get(partition) or self.removing.get(partition))

    @property
    def reassigning_partitions(self) -> list[int]:
        return sorted(p for p in self.partitions if self.reassigning(p))

    def target(self, partition: int) -> list[int]:
        """The replicas the partition ends up with (its replica set when idle)."""
        removing = self.removing.get(partition, [])
        return [r for r in self.partitions[partition] if r not in removing]

    def origin(self, partition: int) -> list[int]:
        """The replicas the partition had before its move (its replica set when idle)."""
        adding = self.adding.get(partition, [])
        return [r for r in self.partitions[partition] if r not in adding]


def _encode_parts(parts: Assignment, *, keep_empty: bool = True) -> dict[str, list[int]]:
    return {str(p): [int(b) for b in rs] for p, rs in sorted(parts.items()) if rs or keep_empty}


def _decode_parts(body: Any) -> Assignment:
    return {int(p): [int(b) for b in rs] for p, rs in (body or {}).items()}


def encode_topic_znode(znode: TopicZNode) -> bytes:
    """v1 when there is no id and nothing moves (Kafka-era shape); v2 otherwise, with
    both ``adding_replicas`` and ``removing_replicas`` always present."""
    body: dict[str, Any] = {"version": 1, "partitions": _encode_parts(znode.partitions)}
    if znode.topic_id or any(znode.adding.values()) or any(znode.removing.values()):
        body["version"] = 2
        body["adding_replicas"] = _encode_parts(znode.adding, keep_empty=False)
        body["removing_replicas"] = _encode_parts(znode.removing, keep_empty=False)
        if znode.topic_id:
            body["topic_id"] = znode.topic_id
    return _dumps(body)


def decode_topic_znode(data: bytes) -> TopicZNode:
    body = _loads(data)
    tid = body.get("topic_id")
    return TopicZNode(
        partitions=_decode_parts(body["partitions"]),
        adding={p: rs for p, rs in _decode_parts(body.get("adding_replicas")).items() if rs},
        removing={p: rs for p, rs in _decode_parts(body.get("removing_replicas")).items() if rs},
        topic_id=str(tid) if tid else None,
    )


def encode_assignment(assignment: Assignment, topic_id: str | None = None) -> bytes:
    """A topic znode with nothing moving (new topics; tests writing Kafka-era znodes)."""
    return encode_topic_znode(TopicZNode(dict(assignment), topic_id=topic_id))


def decode_assignment(data: bytes) -> Assignment:
    """The full replica set of each partition (old callers; see :func:`decode_topic_znode`)."""
    return decode_topic_znode(data).partitions


def decode_topic_id(data: bytes) -> str | None:
    """The topic's id (one per incarnation of a name), or None for Kafka-era znodes without one."""
    return decode_topic_znode(data).topic_id


# --- /brokers/topics/<t>/partitions/<p>/state ----------------------------------------


def partitions_path(topic: str) -> str:
    return f"{topic_path(topic)}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{topic_path(topic)}/partitions/{int(partition)}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{partition_path(topic, partition)}/state"


@dataclass(frozen=True)
class LeaderAndIsr:
    """A partition's leadership as written by the controller.

    ``zk_version`` is the znode's ``stat.version`` when read; writes are
    compare-and-set against it.
    """

    leader: int
    leader_epoch: int
    isr: list[int] = field(default_factory=list)
    controller_epoch: int = 0
    zk_version: int = -1

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER


def encode_leader_and_isr(state: LeaderAndIsr) -> bytes:
    return _dumps(
        {
            "version": 1,
            "leader": state.leader,
            "leader_epoch": state.leader_epoch,
            "isr": list(state.isr),
            "controller_epoch": state.controller_epoch,
        }
    )


def decode_leader_and_isr(data: bytes, zk_version: int = -1) -> LeaderAndIsr:
    body = _loads(data)
    return LeaderAndIsr(
        leader=int(body["leader"]),
        leader_epoch=int(body["leader_epoch"]),
        isr=[int(b) for b in body["isr"]],
        controller_epoch=int(body.get("controller_epoch", 0)),
        zk_version=zk_version,
    )


# --- /config/topics/<t>, /config/brokers/<id|<default>>, /config/users/<u> -----------

ConfigEntityType = Literal["topics", "brokers", "users"]
ENTITY_TYPES: tuple[ConfigEntityType, ...] = ("topics", "brokers", "users")
DEFAULT_BROKER_ENTITY = "<default>"
"""The entity name of the cluster-wide dynamic broker defaults."""


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS}/{topic_segment(topic)}"


def broker_config_path(broker: int | None) -> str:
    """``/config/brokers/<id>``, or ``/config/brokers/<default>`` for ``None``."""
    return f"{CONFIG_BROKERS}/{DEFAULT_BROKER_ENTITY if broker is None else int(broker)}"


def broker_entity(name: str) -> int | None:
    """A broker entity name as a broker id (``None`` = ``<default>``); InvalidRequestError otherwise."""
    if name == DEFAULT_BROKER_ENTITY:
        return None
    if not name.isascii() or not name.isdigit():
        raise InvalidRequestError(f"broker entity {name!r} is neither a broker id nor {DEFAULT_BROKER_ENTITY}")
    return int(name)


MAX_USER_NAME_LENGTH = 255
"""Characters in a user name stored in ZooKeeper (SCRAM credentials; Kafka sets no limit)."""

_SANITIZER_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def sanitize(name: str) -> str:
    """Kafka's ``Sanitizer.sanitize``: a user name as a znode name.

    ``URLEncoder`` (UTF-8) with ``*`` as ``%2A`` and space as ``%20``: every character but
    ASCII letters, digits, ``.``, ``_`` and ``-`` is percent-encoded (uppercase hex);
    ``.`` and ``..``, which ZooKeeper refuses as names, become ``%2E`` / ``%2E%2E``.
    """
    if name in (".", ".."):
        return "%2E" * len(name)
    return "".join(
        ch if ch in _SANITIZER_SAFE else "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
        for ch in name
    )


def desanitize(segment: str) -> str:
    """Kafka's ``Sanitizer.desanitize`` (``URLDecoder``: ``+`` is a space)."""
    return urllib.parse.unquote_plus(segment, errors="surrogatepass")


def user_segment(user: str) -> str:
    if not user:
        raise InvalidRequestError("the user name is empty")
    if len(user) > MAX_USER_NAME_LENGTH:
        raise InvalidRequestError(f"the user name is {len(user)} characters long; the limit is {MAX_USER_NAME_LENGTH}")
    return sanitize(user)


def user_config_path(user: str) -> str:
    """``/config/users/<user>``, the name sanitized as Kafka does (``alice@X`` -> ``alice%40X``)."""
    return f"{CONFIG_USERS}/{user_segment(user)}"


def entity_config_path(entity_type: str, name: str) -> str:
    """``/config/<type>/<name>``: topic names as path segments, broker names checked,
    user names sanitized as Kafka does."""
    if entity_type == "topics":
        return topic_config_path(name)
    if entity_type == "brokers":
        return broker_config_path(broker_entity(name))
    if entity_type == "users":
        return user_config_path(name)
    raise InvalidRequestError(f"unknown config entity type {entity_type!r}; expected one of {ENTITY_TYPES}")


def encode_entity_config(config: dict[str, str]) -> bytes:
    """Topic, broker and user config znodes alike: ``{"version":1,"config":{k: "v"}}``."""
    return _dumps({"version": 1, "config": {k: str(v) for k, v in config.items()}})


def decode_entity_config(data: bytes) -> dict[str, str]:
    if not data:
        return {}
    return {str(k): str(v) for k, v in _loads(data).get("config", {}).items()}


encode_topic_config = encode_entity_config
decode_topic_config = decode_entity_config


# --- /config/changes/config_change_<seq> ----------------------------------------------

CONFIG_CHANGE_PREFIX = "config_change_"


def config_change_path() -> str:
    """The prefix a sequential ``create`` appends its 10-digit counter to."""
    return f"{CONFIG_CHANGES}/{CONFIG_CHANGE_PREFIX}"


def encode_config_change(entity_type: str, name: str) -> bytes:
    """Kafka's v2 notification: ``{"version":2,"entity_path":"topics/<t>"}`` (users: sanitized)."""
    entity_config_path(entity_type, name)  # validates
    segment = topic_segment(name) if entity_type == "topics" else user_segment(name) if entity_type == "users" else name
    return _dumps({"version": 2, "entity_path": f"{entity_type}/{segment}"})


def decode_config_change(data: bytes) -> tuple[ConfigEntityType, str]:
    """(entity type, entity name) of a v2 or v1 notification; InvalidRequestError if malformed."""
    try:
        body = _loads(data)
        if int(body["version"]) == 1:
            entity_type, name = str(body["entity_type"]), str(body["entity_name"])
        else:
            entity_type, slash, segment = str(body["entity_path"]).partition("/")
            if not slash:
                raise ValueError("no '/' in entity_path")
            name = desanitize(segment) if entity_type == "users" else decode_segment(segment)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidRequestError(f"malformed config change notification {data[:200]!r}: {exc}") from None
    for known in ENTITY_TYPES:
        if entity_type == known:
            entity_config_path(known, name)  # validates the name
            return known, name
    raise InvalidRequestError(f"config change for unknown entity type {entity_type!r}")


def config_change_seq(child: str) -> int:
    """The sequence number of a ``config_change_NNNNNNNNNN`` child; -1 if not one."""
    digits = child[len(CONFIG_CHANGE_PREFIX) :] if child.startswith(CONFIG_CHANGE_PREFIX) else ""
    return int(digits) if digits.isascii() and digits.isdigit() else -1


# --- /admin/delete_topics/<t> --------------------------------------------------------


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS}/{topic_segment(topic)}"


# --- /admin/preferred_replica_election ------------------------------------------------


def encode_preferred_election(partitions: list[tuple[str, int]] | None) -> bytes:
    """``None`` = every partition (Kafka's tool wrote them all out; we allow empty)."""
    parts = [{"topic": t, "partition": p} for t, p in partitions or []]
    return _dumps({"version": 1, "partitions": parts, "all": partitions is None})


def decode_preferred_election(data: bytes) -> list[tuple[str, int]] | None:
    body: dict[str, Any] = _loads(data) if data else {"all": True}
    if body.get("all"):
        return None
    return [(str(e["topic"]), int(e["partition"])) for e in body.get("partitions", [])]


# --- /isr_change_notification --------------------------------------------------------


def isr_change_path(child: str) -> str:
    return f"{ISR_CHANGE_NOTIFICATION}/{child}"


def encode_isr_change(partitions: list[tuple[str, int]]) -> bytes:
    """Kafka's ``{"version":1,"partitions":[{"topic":..,"partition":..}]}``, sorted."""
    return _dumps({"version": 1, "partitions": [{"topic": t, "partition": p} for t, p in sorted(partitions)]})


def decode_isr_change(data: bytes) -> list[tuple[str, int]]:
    body: dict[str, Any] = _loads(data) if data else {}
    return [(str(e["topic"]), int(e["partition"])) for e in body.get("partitions", [])]


# --- /admin/reassign_partitions -----------------------------------------------------

Reassignment = dict[tuple[str, int], list[int]]
"""(topic, partition) -> target replicas, as requested in ``/admin/reassign_partitions``."""


def encode_reassignment(parts: Reassignment) -> bytes:
    """Kafka's JSON, entries sorted by (topic, partition); no ``log_dirs``."""
    entries = [
        {"topic": t, "partition": int(p), "replicas": [int(b) for b in rs]} for (t, p), rs in sorted(parts.items())
    ]
    return _dumps({"version": 1, "partitions": entries})


def decode_reassignment(data: bytes) -> Reassignment:
    """The request; a later duplicate entry wins (as Kafka's map). InvalidRequestError if malformed."""
    try:
        body = _loads(data)
        out: Reassignment = {}
        for e in body["partitions"]:
            replicas = e["replicas"]
            if not isinstance(replicas, list):
                raise TypeError("replicas is not a list")
            out[(str(e["topic"]), int(e["partition"]))] = [int(b) for b in replicas]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidRequestError(f"malformed reassignment {data[:200]!r}: {exc}") from None
    return out


# --- /latest_producer_id_block ---------------------------------------------------------


@dataclass(frozen=True)
class ProducerIdBlock:
    broker: int
    block_start: int
    block_end: int


def encode_producer_id_block(block: ProducerIdBlock) -> bytes:
    return _dumps(
        {"version": 1, "broker": block.broker, "block_start": str(block.block_start), "block_end": str(block.block_end)}
    )


def decode_producer_id_block(data: bytes) -> ProducerIdBlock:
    body = _loads(data)
    return ProducerIdBlock(int(body["broker"]), int(body["block_start"]), int(body["block_end"]))


# --- /consumers/<group>/... ----------------------------------------------------------


def group_path(group: str) -> str:
    return f"{CONSUMERS}/{group_segment(group)}"


def group_members_path(group: str) -> str:
    return f"{group_path(group)}/ids"


def group_member_path(group: str, member_id: str) -> str:
    return f"{group_members_path(group)}/{member_segment(member_id)}"


def group_owners_path(group: str, topic: str | None = None) -> str:
    base = f"{group_path(group)}/owners"
    return base if topic is None else f"{base}/{topic_segment(topic)}"


def group_owner_path(group: str, topic: str, partition: int) -> str:
    return f"{group_owners_path(group, topic)}/{int(partition)}"


def group_offsets_path(group: str, topic: str | None = None) -> str:
    base = f"{group_path(group)}/offsets"
    return base if topic is None else f"{base}/{topic_segment(topic)}"


def group_offset_path(group: str, topic: str, partition: int) -> str:
    return f"{group_offsets_path(group, topic)}/{int(partition)}"


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    metadata: str = ""


def encode_offset(committed: CommittedOffset) -> bytes:
    # Kafka wrote a bare decimal string; a metadata string rides after a newline so
    # Kafka-era tools that parse the first line still read the offset.
    text = str(committed.offset)
    if committed.metadata:
        text += "\n" + committed.metadata
    return text.encode()


def decode_offset(data: bytes) -> CommittedOffset:
    text = data.decode()
    offset, _, metadata = text.partition("\n")
    return CommittedOffset(int(offset), metadata)


# --- /transaction_state/<transactional id> ---------------------------------------------


class TxnState(StrEnum):
    """A transaction's state (Kafka's TransactionState)."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def open(self) -> bool:
        """No transaction under way: a new one may begin."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


@dataclass(frozen=True)
class TransactionMetadata:
    """One transactional id's state. ``partitions``: those the transaction wrote to;
    ``groups``: those AddOffsetsToTxn named; ``pending_offsets``: group -> partition ->
    offset, committed to the group exactly when the transaction commits."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[tuple[str, int]] = frozenset()
    groups: frozenset[str] = frozenset()
    pending_offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = field(default_factory=dict)
    start_ms: int = -1
    update_ms: int = -1
    last_producer_epoch: int = -1


def transaction_state_path(transactional_id: str) -> str:
    return f"{TRANSACTION_STATE}/{transactional_id_segment(transactional_id)}"


def encode_transaction(meta: TransactionMetadata) -> bytes:
    partitions: dict[str, list[int]] = {}
    for t, p in sorted(meta.partitions):
        partitions.setdefault(t, []).append(p)
    pending = {
        g: _by_topic({tp: [c.offset, c.metadata] for tp, c in offsets.items()})
        for g, offsets in sorted(meta.pending_offsets.items())
    }
    return _dumps(
        {
            "version": 1,
            "producer_id": meta.producer_id,
            "producer_epoch": meta.producer_epoch,
            "last_producer_epoch": meta.last_producer_epoch,
            "timeout_ms": meta.timeout_ms,
            "state": meta.state.value,
            "partitions": partitions,
            "groups": sorted(meta.groups),
            "pending_offsets": pending,
            "start_ms": meta.start_ms,
            "update_ms": meta.update_ms,
        }
    )


def _by_topic(values: dict[tuple[str, int], Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (t, p), v in sorted(values.items()):
        out.setdefault(t, {})[str(p)] = v
    return out


def decode_transaction(transactional_id: str, data: bytes) -> TransactionMetadata:
    body = _loads(data)
    return TransactionMetadata(
        transactional_id,
        int(body["producer_id"]),
        int(body["producer_epoch"]),
        int(body["timeout_ms"]),
        TxnState(body["state"]),
        frozenset((t, int(p)) for t, ps in body.get("partitions", {}).items() for p in ps),
        frozenset(body.get("groups", ())),
        {
            g: {(t, int(p)): CommittedOffset(int(v[0]), str(v[1])) for t, ps in topics.items() for p, v in ps.items()}
            for g, topics in body.get("pending_offsets", {}).items()
        },
        int(body.get("start_ms", -1)),
        int(body.get("update_ms", -1)),
        int(body.get("last_producer_epoch", -1)),
    )


# --- ACLs: /kafka-acl, /kafka-acl-extended/prefixed, and their change notifications --------
#
# /kafka-acl/<Type>/<name>                          P  {"version":1,"acls":[{"principal","permissionType",
#                                                       "operation","host"}]}  (LITERAL patterns)
# /kafka-acl-extended/prefixed/<Type>/<name>        P  the same                (PREFIXED patterns)
# /kafka-acl-changes/acl_changes_<10 digits>        PS "Topic:<name>"          (a LITERAL resource changed)
# /kafka-acl-extended-changes/acl_changes_<10 digits> PS {"version":1,"resourceType":"Topic","name":"<name>",
#                                                       "patternType":"Prefixed"}
#
# <Type> is Kafka's mixed-case resource type name (Topic, Group, Cluster, TransactionalId,
# DelegationToken). The ACL JSON codec lives with the model, kbroker.security.acl.

KAFKA_ACL = "/kafka-acl"
KAFKA_ACL_PREFIXED = "/kafka-acl-extended/prefixed"
KAFKA_ACL_CHANGES = "/kafka-acl-changes"
KAFKA_ACL_EXTENDED_CHANGES = "/kafka-acl-extended-changes"
ACL_CHANGE_PREFIX = "acl_changes_"


def acl_store_root(prefixed: bool) -> str:
    """The parent of the resource-type nodes of LITERAL (``/kafka-acl``) or PREFIXED patterns."""
    return KAFKA_ACL_PREFIXED if prefixed else KAFKA_ACL


def acl_type_path(type_name: str, prefixed: bool) -> str:
    return f"{acl_store_root(prefixed)}/{type_name}"


def acl_resource_path(type_name: str, name: str, prefixed: bool) -> str:
    """``/kafka-acl/Topic/<name>`` or ``/kafka-acl-extended/prefixed/Topic/<name>``."""
    return f"{acl_type_path(type_name, prefixed)}/{name_segment(name, 'ACL resource name', 4096, InvalidRequestError)}"


def acl_change_root(prefixed: bool) -> str:
    """Where notifications of LITERAL (Kafka 1.x layout) or PREFIXED resource changes go."""
    return KAFKA_ACL_EXTENDED_CHANGES if prefixed else KAFKA_ACL_CHANGES


def acl_change_path(prefixed: bool) -> str:
    """The prefix a sequential ``create`` appends its 10-digit counter to."""
    return f"{acl_change_root(prefixed)}/{ACL_CHANGE_PREFIX}"


def acl_change_seq(child: str) -> int:
    """The sequence number of an ``acl_changes_NNNNNNNNNN`` child; -1 if not one."""
    digits = child[len(ACL_CHANGE_PREFIX) :] if child.startswith(ACL_CHANGE_PREFIX) else ""
    return int(digits) if digits.isascii() and digits.isdigit() else -1


def encode_acl_change(type_name: str, name: str, pattern_name: str | None) -> bytes:
    """A notification: ``Topic:<name>`` for a LITERAL pattern (``pattern_name`` None), else
    Kafka's extended JSON with the pattern type's mixed-case name (``Prefixed``)."""
    if pattern_name is None:
        return f"{type_name}:{name}".encode()
    return _dumps({"version": 1, "resourceType": type_name, "name": name, "patternType": pattern_name})


def decode_acl_change(data: bytes, prefixed: bool) -> tuple[str, str, str | None]:
    """(type name, resource name, pattern type name or None for literal); InvalidRequestError if malformed."""
    try:
        if not prefixed:
            type_name, colon, name = data.decode().partition(":")
            if not colon or not type_name:
                raise ValueError("not <Type>:<name>")
            return type_name, name, None
        body = _loads(data)
        return str(body["resourceType"]), str(body["name"]), str(body["patternType"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidRequestError(f"malformed ACL change notification {data[:200]!r}: {exc}") from None


# --- ZooKeeper's own ACLs on these znodes (zookeeper.set.acl; policy in cluster/zk_acl.py) --

DELEGATION_TOKEN = "/delegation_token"

SENSITIVE_ROOT_PATHS = (CONFIG_USERS, CONFIG_BROKERS, DELEGATION_TOKEN)
"""Kafka's ``ZkData.SensitiveRootPaths``: these and everything under them get no world READ."""

ACL_ROOT_PATHS = (KAFKA_ACL, KAFKA_ACL_CHANGES, "/kafka-acl-extended", KAFKA_ACL_EXTENDED_CHANGES)


def _top(path: str) -> str:
    return "/" + path.split("/")[1]


SECURE_ROOT_PATHS = tuple(
    sorted(
        {_top(p) for p in (*PERSISTENT_PATHS, CLUSTER_ID, CONTROLLER, CONTROLLER_EPOCH, LATEST_PRODUCER_ID_BLOCK)}
        | set(ACL_ROOT_PATHS)
        | {DELEGATION_TOKEN, "/isr_change_notification", "/log_dir_event_notification"}
    )
)
"""Every top-level znode kbroker (or a Kafka cluster sharing its layout) may write; the
ZooKeeper ACL migration walks each that exists, recursively (Kafka's ``ZkData.SecureRootPaths``)."""
