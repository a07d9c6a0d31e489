"""ZooKeeper I/O for kbroker (Kafka's ``KafkaZkClient``), over kazoo.

Paths and codecs come from :mod:`kbroker.cluster.zkdata`; this class only reads and
writes them. Controller writes are fenced: each is sent in one ZooKeeper transaction
together with a version check of ``/controller_epoch``, so a deposed controller's
write fails atomically (:class:`ControllerMovedError`).

Thread safety: kazoo clients are thread-safe; so is this wrapper.
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError, RolledBackError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from kbroker.cluster import zk_acl, zkdata
from kbroker.cluster.zk_errors import mapped
from kbroker.cluster.zk_request_timer import time_requests
from kbroker.cluster.zkdata import Assignment, BrokerInfo, LeaderAndIsr, Reassignment, TopicZNode
from kbroker.security.zk_credential import NO_AUTH_HINT, ZkCredential
from kclient.errors import (
    BrokerResponseError,
    InvalidRequestError,
    KafkaError,
    NotControllerError,
    ReassignmentInProgressError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

log = logging.getLogger(__name__)


CONNECTION_WAIT_S = 5.0
"""How long a client's request waits for a lost ZooKeeper connection before it is refused
(:meth:`ZkClient.await_connection`), changing nothing."""


class ControllerMovedError(NotControllerError):
    """This broker's controller epoch is stale, or it is not the controller (NOT_CONTROLLER)."""


class ReplicaShuttingDownError(BadVersionError):
    """A leader's ISR expansion named a replica whose registration the controller marked
    as in controlled shutdown (or that is not registered): refused, nothing written."""


class SessionState(StrEnum):
    """A ZooKeeper session's state, as :attr:`ZkClient.state` and the state listeners give it
    (kazoo's ``KazooState`` values are these strings)."""

    CONNECTED = "CONNECTED"
    SUSPENDED = "SUSPENDED"
    LOST = "LOST"


class BrokerIdInUseError(KafkaError):
    """Another live broker holds ``/brokers/ids/<id>``."""


def split_connect_string(connect: str) -> tuple[str, str]:
    """``"h1:2181,h2:2181/kafka"`` -> (``"h1:2181,h2:2181"``, ``"/kafka"``)."""
    hosts, slash, chroot = connect.partition("/")
    return hosts, (slash + chroot).rstrip("/")


class ZkClient:
    """kbroker's znodes over one kazoo session (chroot aware)."""

    def __init__(
        self,
        connect: str,
        *,
        session_timeout_ms: int = 18000,
        auth_digest: str | None = None,
        set_acl: bool = False,
    ) -> None:
        """``auth_digest`` (``user:password``): the session authenticates with ZooKeeper's
        digest scheme. ``set_acl`` (Kafka's ``zookeeper.set.acl``, needs ``auth_digest``):
        every znode this client creates, the chroot included, gets the secure ACLs of
        :mod:`kbroker.cluster.zk_acl` (ALL for this identity, world READ on non-sensitive
        paths). Existing znodes keep theirs (``kctl zookeeper-security-migration``)."""
        hosts, chroot = split_connect_string(connect)
        if not hosts:
            raise KafkaError(f"bad ZooKeeper connect string {connect!r}")
        credential = ZkCredential.parse(auth_digest) if auth_digest else None
        if set_acl and credential is None:
            raise KafkaError(f"zookeeper.set.acl is true, but no ZooKeeper credential was given; {NO_AUTH_HINT}")
        self.connect = connect
        self.chroot = chroot
        self.write_timeout_s = 5.0
        self.credential = credential
        self.set_acl = set_acl
        self._hosts = hosts
        self.kazoo = self._kazoo(
            hosts + chroot,
            timeout=session_timeout_ms / 1000.0,
            connection_retry={"max_tries": -1, "delay": 0.2, "max_delay": 2},
        )

    def _kazoo(self, hosts: str, **kwargs: Any) -> KazooClient:
        """A kazoo client with this client's authentication and ACL policy."""
        if self.set_acl and self.credential is not None:
            return zk_acl.AclKazooClient(self.credential, hosts=hosts, **kwargs)
        if self.credential is not None:
            kwargs["auth_data"] = self.credential.auth_data
        return KazooClient(hosts=hosts, **kwargs)

    # --- session -------------------------------------------------------------------

    def start(self, timeout_s: float = 15.0) -> None:
        if self.chroot:
            root = self._kazoo(self._hosts, timeout=10.0)
            root.start(timeout=timeout_s)
            try:
                root.ensure_path(self.chroot)
            finally:
                root.stop()
                root.close()
        self.kazoo.start(timeout=timeout_s)

    def chroots_with_brokers(self, timeout_s: float = 5.0) -> list[str]:
        """The chroots of this ensemble (the root and its children) where brokers are
        registered, for a hint when this client's own chroot holds none."""
        root = self._kazoo(self._hosts, timeout=10.0)
        found: list[str] = []
        try:
            root.start(timeout=timeout_s)
            candidates = [""] + [f"/{c}" for c in sorted(root.get_children("/")) if c != "zookeeper"]
            for chroot in candidates:
                try:
                    if root.get_children(chroot + zkdata.BROKER_IDS):
                        found.append(chroot or "/")
                except NoNodeError:
                    pass
        except (KazooException, KazooTimeoutError, OSError):
            return found
        finally:
            root.stop()
            root.close()
        return found

    def close(self) -> None:
        try:
            self.kazoo.stop()
        finally:
            self.kazoo.close()

    def add_state_listener(self, listener: Callable[[KazooState], object]) -> None:
        self.kazoo.add_listener(listener)

    def remove_state_listener(self, listener: Callable[[KazooState], object]) -> None:
        self.kazoo.remove_listener(listener)

    @property
    def connected(self) -> bool:
        """Is the connection to ZooKeeper up right now (kazoo's CONNECTED state)?"""
        return bool(self.kazoo.connected)

    def time_requests(self, observe: Callable[[float], object]) -> None:
        """Call ``observe(milliseconds)`` once per request from now on, from queued to
        answered (:mod:`kbroker.cluster.zk_request_timer`; Kafka's ZooKeeperRequestLatencyMs)."""
        time_requests(self.kazoo, observe)

    def await_connection(self, wait_s: float) -> bool:
        """Is the connection up, or back within ``wait_s``? A request path asks this before
        it calls kazoo: kazoo queues a call made while disconnected and blocks until the
        connection returns, which would pin a request thread for a whole outage (a quorum
        lost) and make the write land long after its caller gave up."""
        deadline = time.monotonic() + wait_s
        while not self.connected:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def require_connection(
        self, what: str, error: type[KafkaError] = RequestTimedOutError, wait_s: float = CONNECTION_WAIT_S
    ) -> None:
        """Return once the connection is up (:meth:`await_connection`); else raise ``error``
        saying ``what`` was refused, nothing changed. Request paths call it after their
        argument checks and before their first ZooKeeper call: RequestTimedOutError for an
        admin request (topics, configs, ACLs, SCRAM users, reassignments, elections),
        CoordinatorNotAvailableError for a coordinator's (groups, transactions), both
        retriable."""
        if not self.await_connection(wait_s):
            raise error(f"{what}: no ZooKeeper connection for {wait_s:g} s (is its quorum lost?); nothing was changed")

    @property
    def state(self) -> SessionState:
        """The session's state now (CONNECTED, SUSPENDED or LOST)."""
        return SessionState(self.kazoo.state)

    @property
    def session_id(self) -> int:
        session = self.kazoo.client_id
        return session[0] if session else -1

    def check_request_size(
        self, ops: list[tuple[str, bytes]], what: str, error: type[BrokerResponseError] = InvalidRequestError
    ) -> None:
        """Refuse, before sending, a write whose ``(path, data)`` ops would approach
        ``jute.maxbuffer`` (ZooKeeper would drop this broker's session)."""
        size = sum(zkdata.request_bytes(self.chroot + path, data) for path, data in ops)
        if size > zkdata.MAX_REQUEST_BYTES:
            raise error(f"{what} is {size} bytes in ZooKeeper; the limit is {zkdata.MAX_REQUEST_BYTES}")

    def ensure_persistent_paths(self) -> None:
        for path in zkdata.PERSISTENT_PATHS:
            self.kazoo.ensure_path(path)

    # --- cluster id ----------------------------------------------------------------

    def get_or_create_cluster_id(self) -> str:
        try:
            data, _ = self.kazoo.get(zkdata.CLUSTER_ID)
            return zkdata.decode_cluster_id(data)
        except NoNodeError:
            pass
        new_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        try:
            self.kazoo.create(zkdata.CLUSTER_ID, zkdata.encode_cluster_id(new_id), makepath=True)
            return new_id
        except NodeExistsError:
            data, _ = self.kazoo.get(zkdata.CLUSTER_ID)
            return zkdata.decode_cluster_id(data)

    # --- brokers -------------------------------------------------------------------

    def register_broker(self, info: BrokerInfo) -> int:
        """Create the ephemeral registration; returns the broker epoch (czxid).

        If the znode already exists and belongs to this very session (a retried create
        after a connection blip) it is accepted; any other owner is a live broker with
        the same id and :class:`BrokerIdInUseError` is raised.
        """
        path = zkdata.broker_path(info.broker_id)
        try:
            self.kazoo.create(path, zkdata.encode_broker(info), ephemeral=True, makepath=True)
        except NodeExistsError:
            _, stat = self.kazoo.get(path)
            if stat.ephemeralOwner != self.session_id:
                raise BrokerIdInUseError(
                    f"broker id {info.broker_id} is already registered by a live broker "
                    f"(ZooKeeper session 0x{stat.ephemeralOwner:x})"
                ) from None
            return int(stat.czxid)
        _, stat = self.kazoo.get(path)
        return int(stat.czxid)

    def broker_epoch(self, broker_id: int) -> int:
        """The broker's epoch: the czxid of its current ``/brokers/ids/<id>``, -1 if absent.

        Each registration (a new session, or a re-registration) creates the znode anew,
        so the epoch grows; a request carrying an older one comes from a past life.
        """
        stat = self.kazoo.exists(zkdata.broker_path(broker_id))
        return -1 if stat is None else int(stat.czxid)

    def broker_registration_owner(self, broker_id: int) -> int | None:
        """The ZooKeeper session that holds ``/brokers/ids/<id>``, if any."""
        stat = self.kazoo.exists(zkdata.broker_path(broker_id))
        return None if stat is None else int(stat.ephemeralOwner)

    def mark_broker_shutting_down(self, broker_id: int, broker_epoch: int, epoch_zk_version: int) -> bool:
        """Controller: mark the registration ``broker_epoch`` (its czxid) of ``broker_id`` as
        in controlled shutdown; False if that registration is gone.

        The mark is the registration znode's data version: a fresh registration has
        version 0, and the controller rewrites the same data (fenced by the controller
        epoch), so the JSON stays Kafka's and the mark ends with the registration. Leaders
        check it when they write an ISR (:meth:`update_partition_state`), so they do not
        put a departing broker back into the ISRs the controller has just removed it from
        (as Kafka refuses ISR expansion to a shutting-down broker).
        """
        path = zkdata.broker_path(broker_id)
        try:
            data, stat = self.kazoo.get(path)
        except NoNodeError:
            return False
        if int(stat.czxid) != broker_epoch:
            return False
        if int(stat.version) > 0:
            return True
        try:
            self._fenced(epoch_zk_version, lambda tx: tx.set_data(path, data, version=stat.version))  # type: ignore[attr-defined]
        except BadVersionError:
            pass  # marked meanwhile
        except NoNodeError:
            return False
        return True

    def deregister_broker(self, broker_id: int) -> None:
        try:
            self.kazoo.delete(zkdata.broker_path(broker_id))
        except NoNodeError:
            pass

    def broker(self, broker_id: int) -> BrokerInfo | None:
        try:
            data, stat = self.kazoo.get(zkdata.broker_path(broker_id))
        except NoNodeError:
            return None
        return zkdata.decode_broker(broker_id, data, int(stat.czxid))

    def live_brokers(self) -> dict[int, BrokerInfo]:
        out: dict[int, BrokerInfo] = {}
        try:
            children = self.kazoo.get_children(zkdata.BROKER_IDS)
        except NoNodeError:
            return out
        for child in children:
            if not child.isdigit():
                continue
            info = self.broker(int(child))
            if info is not None:
                out[info.broker_id] = info
        return out

    # --- controller ----------------------------------------------------------------

    def controller_id(self) -> int:
        try:
            data, _ = self.kazoo.get(zkdata.CONTROLLER)
        except NoNodeError:
            return -1
        return zkdata.decode_controller(data)

    def controller_epoch(self) -> tuple[int, int]:
        """(epoch, znode version) of ``/controller_epoch``; (0, -1) if absent."""
        try:
            data, stat = self.kazoo.get(zkdata.CONTROLLER_EPOCH)
        except NoNodeError:
            return 0, -1
        return zkdata.decode_controller_epoch(data), int(stat.version)

    def try_become_controller(self, broker_id: int) -> tuple[int, int] | None:
        """Create ``/controller`` and bump ``/controller_epoch`` in one transaction.

        Returns (new epoch, epoch znode version) or None if another broker won.
        """
        while True:
            epoch, version = self.controller_epoch()
            if version < 0:
                try:
                    self.kazoo.create(zkdata.CONTROLLER_EPOCH, zkdata.encode_controller_epoch(0))
                except NodeExistsError:
                    pass
                continue
            tx = self.kazoo.transaction()
            tx.create(zkdata.CONTROLLER, zkdata.encode_controller(broker_id), ephemeral=True)
            tx.set_data(zkdata.CONTROLLER_EPOCH, zkdata.encode_controller_epoch(epoch + 1), version=version)
            results = tx.commit()
            failure = next((r for r in results if isinstance(r, Exception)), None)
            if failure is None:
                return epoch + 1, version + 1
            if isinstance(results[0], NodeExistsError):
                return None
            if isinstance(failure, BadVersionError):
                continue
            raise failure

    def controller_held_by_this_session(self) -> tuple[int, int] | None:
        """(epoch, epoch znode version) if ``/controller`` is this session's ephemeral."""
        stat = self.kazoo.exists(zkdata.CONTROLLER)
        if stat is None or stat.ephemeralOwner != self.session_id:
            return None
        epoch, version = self.controller_epoch()
        return (epoch, version) if version >= 0 else None

    def _fenced(self, epoch_zk_version: int, build: Callable[[object], None]) -> None:
        tx = self.kazoo.transaction()
        tx.check(zkdata.CONTROLLER_EPOCH, epoch_zk_version)
        build(tx)
        results = tx.commit()
        if isinstance(results[0], (BadVersionError, NoNodeError)):
            raise ControllerMovedError("controller epoch changed: this broker is no longer controller")
        failure = next((r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None)
        if failure is not None:
            raise failure

    # --- topics --------------------------------------------------------------------

    def topics(self) -> list[str]:
        try:
            return sorted(zkdata.decode_segment(c) for c in self.kazoo.get_children(zkdata.BROKER_TOPICS))
        except NoNodeError:
            return []

    def topic_exists(self, topic: str) -> bool:
        return self.kazoo.exists(zkdata.topic_path(topic)) is not None

    def topic_znode(self, topic: str) -> tuple[TopicZNode, int] | None:
        """(the whole topic znode, its version), or None if the topic does not exist."""
        try:
            data, stat = self.kazoo.get(zkdata.topic_path(topic))
        except NoNodeError:
            return None
        return zkdata.decode_topic_znode(data), int(stat.version)

    def topic_assignment(self, topic: str) -> tuple[Assignment, int] | None:
        """(each partition's full replica set, znode version), or None if the topic does not exist."""
        found = self.topic_znode(topic)
        return None if found is None else (found[0].partitions, found[1])

    def topic_znodes(self, topics: list[str]) -> dict[str, tuple[TopicZNode, int] | None]:
        """:meth:`topic_znode` of each of ``topics``, read with pipelined requests."""
        pending = [(t, self.kazoo.get_async(zkdata.topic_path(t))) for t in topics]
        out: dict[str, tuple[TopicZNode, int] | None] = {}
        for topic, result in pending:
            try:
                data, stat = result.get(timeout=self.write_timeout_s * 6)
            except NoNodeError:
                out[topic] = None
                continue
            out[topic] = (zkdata.decode_topic_znode(data), int(stat.version))
        return out

    def all_topic_znodes(self) -> dict[str, TopicZNode]:
        """Every topic's znode, read with pipelined requests."""
        return {t: found[0] for t, found in self.topic_znodes(self.topics()).items() if found is not None}

    def all_assignments(self) -> dict[str, Assignment]:
        """Every topic's assignment (full replica sets), read with pipelined requests."""
        return {t: z.partitions for t, z in self.all_topic_znodes().items()}

    def topic_config(self, topic: str) -> dict[str, str]:
        try:
            data, _ = self.kazoo.get(zkdata.topic_config_path(topic))
        except NoNodeError:
            return {}
        return zkdata.decode_topic_config(data)

    def create_topic(self, topic: str, assignment: Assignment, config: dict[str, str]) -> None:
        """Write ``/config/topics/<t>`` and ``/brokers/topics/<t>`` (with a new topic id) atomically.

        Raises InvalidRequestError, writing nothing, if the two znodes are too large.
        """
        config_path, config_data = zkdata.topic_config_path(topic), zkdata.encode_topic_config(config)
        path, data = zkdata.topic_path(topic), zkdata.encode_assignment(assignment, zkdata.new_topic_id())
        self.check_request_size([(config_path, config_data), (path, data)], f"topic {topic!r}")
        tx = self.kazoo.transaction()
        if self.kazoo.exists(config_path) is None:
            tx.create(config_path, config_data)
        else:
            tx.set_data(config_path, config_data)
        tx.create(path, data)
        results = tx.commit()
        if any(isinstance(r, NodeExistsError) for r in results):
            raise TopicAlreadyExistsError(f"topic {topic!r} already exists")
        failure = next((r for r in results if isinstance(r, Exception)), None)
        if failure is not None:
            raise failure

    def set_topic_assignment(self, topic: str, assignment: Assignment, version: int) -> None:
        """Compare-and-set the replica sets (adding partitions), keeping the topic id and
        every in-flight move whose replicas are still in the partition's new replica set."""
        found = self.topic_znode(topic)
        if found is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        current, stored = found
        if stored != version:
            raise BadVersionError()

        def kept(moves: Assignment) -> Assignment:
            return {p: rs for p, rs in moves.items() if p in assignment and set(rs) <= set(assignment[p])}

        znode = TopicZNode(dict(assignment), kept(current.adding), kept(current.removing), current.topic_id)
        self.set_topic_znode(topic, znode, version)

    def set_topic_znode(self, topic: str, znode: TopicZNode, version: int) -> int:
        """Compare-and-set the whole topic znode; returns the new version.

        Raises ``BadVersionError`` if it changed since read (re-read and re-apply),
        UnknownTopicOrPartitionError if it is gone, InvalidRequestError if too large.
        """
        path = zkdata.topic_path(topic)
        data = zkdata.encode_topic_znode(znode)
        self.check_request_size([(path, data)], f"the assignment of topic {topic!r}")
        try:
            stat = self.kazoo.set(path, data, version=version)
        except NoNodeError:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist") from None
        return int(stat.version)

    def topic_id(self, topic: str) -> str | None:
        found = self.topic_znode(topic)
        return None if found is None else found[0].topic_id

    def set_topic_config(self, topic: str, config: dict[str, str]) -> None:
        path = zkdata.topic_config_path(topic)
        data = zkdata.encode_topic_config(config)
        self.check_request_size([(path, data)], f"the configuration of topic {topic!r}")
        try:
            self.kazoo.set(path, data)
        except NoNodeError:
            self.kazoo.create(path, data, makepath=True)

    # --- entity configs and change notifications (/config/<type>/<name>, /config/changes) --

    def entity_config(self, entity_type: str, name: str) -> tuple[dict[str, str], int]:
        """(config, znode version) of a topic or broker entity; version -1 if it has none."""
        try:
            data, stat = self.kazoo.get(zkdata.entity_config_path(entity_type, name))
        except NoNodeError:
            return {}, -1
        return zkdata.decode_entity_config(data), int(stat.version)

    def set_entity_config(self, entity_type: str, name: str, config: dict[str, str], version: int) -> int:
        """Create (``version`` -1) or compare-and-set an entity's config together with a
        ``config_change_`` notification, in one transaction; returns the new version.

        ``NodeExistsError`` / ``BadVersionError`` if the znode changed since read: the
        caller re-reads and re-applies its changes (no lost update under concurrent alters).
        """
        path, data = zkdata.entity_config_path(entity_type, name), zkdata.encode_entity_config(config)
        change_path, change = zkdata.config_change_path(), zkdata.encode_config_change(entity_type, name)
        self.check_request_size([(path, data), (change_path, change)], f"the configuration of {entity_type} {name!r}")
        for parent in (path.rsplit("/", 1)[0], zkdata.CONFIG_CHANGES):
            self.kazoo.ensure_path(parent)  # a cluster whose brokers predate them
        tx = self.kazoo.transaction()
        if version < 0:
            tx.create(path, data)
        else:
            tx.set_data(path, data, version=version)
        tx.create(change_path, change, sequence=True)
        results = tx.commit()
        failure = next((r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None)
        if failure is not None:
            raise failure
        return version + 1

    def config_changes(self) -> list[str]:
        """The ``config_change_NNNNNNNNNN`` children, oldest first."""
        children = [c for c in self._children(zkdata.CONFIG_CHANGES) if zkdata.config_change_seq(c) >= 0]
        return sorted(children, key=zkdata.config_change_seq)

    def config_change(self, child: str) -> tuple[zkdata.ConfigEntityType, str, int] | None:
        """(entity type, entity name, creation time in ms) of one notification; None if gone.

        A malformed notification raises InvalidRequestError (the caller skips it).
        """
        try:
            data, stat = self.kazoo.get(f"{zkdata.CONFIG_CHANGES}/{child}")
        except NoNodeError:
            return None
        entity_type, name = zkdata.decode_config_change(data)
        return entity_type, name, int(stat.ctime)

    def delete_config_change(self, child: str) -> None:
        try:
            self.kazoo.delete(f"{zkdata.CONFIG_CHANGES}/{child}")
        except NoNodeError:
            pass

    def mark_topic_for_deletion(self, topic: str) -> None:
        try:
            self.kazoo.create(zkdata.delete_topic_path(topic), b"", makepath=True)
        except NodeExistsError:
            pass

    def topics_pending_deletion(self) -> list[str]:
        try:
            return sorted(zkdata.decode_segment(c) for c in self.kazoo.get_children(zkdata.DELETE_TOPICS))
        except NoNodeError:
            return []

    def delete_topic_znodes(self, topic: str, epoch_zk_version: int) -> None:
        """Controller: remove a topic's assignment, states and config, then its marker."""

        def build(tx: object) -> None:
            assert hasattr(tx, "delete")
            for p in self._children(zkdata.partitions_path(topic)):
                p_int = int(p)
                if self.kazoo.exists(zkdata.partition_state_path(topic, p_int)):
                    tx.delete(zkdata.partition_state_path(topic, p_int))
                tx.delete(zkdata.partition_path(topic, p_int))
            if self.kazoo.exists(zkdata.partitions_path(topic)):
                tx.delete(zkdata.partitions_path(topic))
            if self.kazoo.exists(zkdata.topic_path(topic)):
                tx.delete(zkdata.topic_path(topic))
            if self.kazoo.exists(zkdata.topic_config_path(topic)):
                tx.delete(zkdata.topic_config_path(topic))
            if self.kazoo.exists(zkdata.delete_topic_path(topic)):
                tx.delete(zkdata.delete_topic_path(topic))

        self._fenced(epoch_zk_version, build)

    def _children(self, path: str) -> list[str]:
        try:
            return list(self.kazoo.get_children(path))
        except NoNodeError:
            return []

    # --- /admin/reassign_partitions ------------------------------------------------

    def reassignment_request(self) -> tuple[Reassignment, int] | None:
        """(the pending reassignment request, znode version), or None if there is none.

        A malformed znode raises InvalidRequestError (the caller decides to delete it).
        """
        try:
            data, stat = self.kazoo.get(zkdata.REASSIGN_PARTITIONS)
        except NoNodeError:
            return None
        return zkdata.decode_reassignment(data), int(stat.version)

    def create_reassignment_request(self, parts: Reassignment) -> None:
        """Write a new request; ReassignmentInProgressError if one is pending already."""
        data = zkdata.encode_reassignment(parts)
        self.check_request_size([(zkdata.REASSIGN_PARTITIONS, data)], "the reassignment")
        try:
            self.kazoo.create(zkdata.REASSIGN_PARTITIONS, data, makepath=True)
        except NodeExistsError:
            raise ReassignmentInProgressError("a partition reassignment is in progress") from None

    def set_reassignment_request(self, parts: Reassignment, version: int) -> int:
        """Compare-and-set the pending request; returns the new version.

        ``BadVersionError`` if it changed since read, ``NoNodeError`` if it is gone.
        """
        data = zkdata.encode_reassignment(parts)
        self.check_request_size([(zkdata.REASSIGN_PARTITIONS, data)], "the reassignment")
        return int(self.kazoo.set(zkdata.REASSIGN_PARTITIONS, data, version=version).version)

    def delete_reassignment_request(self, version: int) -> None:
        """Delete the request if unchanged since read (``BadVersionError`` otherwise)."""
        self.kazoo.delete(zkdata.REASSIGN_PARTITIONS, version=version)

    def commit_reassignment_step(
        self,
        epoch_zk_version: int,
        topic: str,
        znode: TopicZNode,
        topic_version: int,
        states: dict[int, LeaderAndIsr],
        request: tuple[Reassignment | None, int] | None = None,
    ) -> int:
        """Controller: one fenced multi writing a reassignment step; returns the topic znode's new version.

        CAS the topic znode against ``topic_version``, each state znode against its
        ``zk_version``, and, with ``request`` = (parts, version), CAS
        ``/admin/reassign_partitions`` to ``parts`` or delete it when ``parts`` is None.
        Either all of it happens or none: ControllerMovedError if deposed;
        ``BadVersionError`` / ``NoNodeError`` as-is if a znode changed (re-read and retry).
        """
        path, data = zkdata.topic_path(topic), zkdata.encode_topic_znode(znode)
        ops: list[tuple[str, bytes]] = [(path, data)]
        ops += [(zkdata.partition_state_path(topic, p), zkdata.encode_leader_and_isr(s)) for p, s in states.items()]
        request_data = None
        if request is not None and request[0] is not None:
            request_data = zkdata.encode_reassignment(request[0])
            ops.append((zkdata.REASSIGN_PARTITIONS, request_data))
        self.check_request_size(ops, f"a reassignment step of topic {topic!r}")

        def build(tx: object) -> None:
            assert hasattr(tx, "set_data") and hasattr(tx, "delete")
            tx.set_data(path, data, version=topic_version)
            for p, state in sorted(states.items()):
                tx.set_data(
                    zkdata.partition_state_path(topic, p), zkdata.encode_leader_and_isr(state), version=state.zk_version
                )
            if request is not None:
                if request_data is None:
                    tx.delete(zkdata.REASSIGN_PARTITIONS, version=request[1])
                else:
                    tx.set_data(zkdata.REASSIGN_PARTITIONS, request_data, version=request[1])

        self._fenced(epoch_zk_version, build)
        return topic_version + 1

    # --- partition state -----------------------------------------------------------

    def partition_state(self, topic: str, partition: int) -> LeaderAndIsr | None:
        try:
            data, stat = self.kazoo.get(zkdata.partition_state_path(topic, partition))
        except NoNodeError:
            return None
        return zkdata.decode_leader_and_isr(data, int(stat.version))

    def partition_states(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], LeaderAndIsr | None]:
        """Many partition states at once: the reads are pipelined (kazoo's async API), one
        round trip for all of them rather than one per partition."""
        pending = [(tp, self.kazoo.get_async(zkdata.partition_state_path(*tp))) for tp in partitions]
        out: dict[tuple[str, int], LeaderAndIsr | None] = {}
        for tp, result in pending:
            try:
                data, stat = result.get()
            except NoNodeError:
                out[tp] = None
                continue
            out[tp] = zkdata.decode_leader_and_isr(data, int(stat.version))
        return out

    # --- ISR change notifications (leaders -> controller) ---------------------------

    def announce_isr_changes(self, partitions: list[tuple[str, int]]) -> None:
        """A leader wrote these partitions' ISRs: one sequential notification znode for
        all of them, which the controller reads, forwards and deletes."""
        self.kazoo.create(
            zkdata.isr_change_path(zkdata.ISR_CHANGE_PREFIX), zkdata.encode_isr_change(partitions), sequence=True
        )

    def isr_change_notifications(self) -> list[str]:
        """The pending notification znodes' names, oldest first."""
        try:
            return sorted(self.kazoo.get_children(zkdata.ISR_CHANGE_NOTIFICATION))
        except NoNodeError:
            return []

    def take_isr_changes(self, children: list[str]) -> set[tuple[str, int]]:
        """Controller: read the notifications ``children`` (pipelined), delete them
        (pipelined) and return every partition they name. A malformed one is dropped."""
        paths = [zkdata.isr_change_path(c) for c in children]
        reads = [(path, self.kazoo.get_async(path)) for path in paths]
        out: set[tuple[str, int]] = set()
        for path, result in reads:
            try:
                data, _ = result.get(timeout=self.write_timeout_s * 6)
                out.update(zkdata.decode_isr_change(data))
            except NoNodeError:
                continue
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("dropping malformed ISR change notification %s: %r", path, exc)
        for result in [self.kazoo.delete_async(path) for path in paths]:
            try:
                result.get(timeout=self.write_timeout_s * 6)
            except NoNodeError:
                pass
        return out

    def create_partition_state(self, topic: str, partition: int, state: LeaderAndIsr, epoch_zk_version: int) -> None:
        """Controller: create a new partition's state znode (and its parents)."""
        for path in (zkdata.partitions_path(topic), zkdata.partition_path(topic, partition)):
            try:
                self.kazoo.create(path, b"")
            except NodeExistsError:
                pass

        def build(tx: object) -> None:
            assert hasattr(tx, "create")
            tx.create(zkdata.partition_state_path(topic, partition), zkdata.encode_leader_and_isr(state))

        self._fenced(epoch_zk_version, build)

    def update_partition_state(
        self, topic: str, partition: int, state: LeaderAndIsr, epoch_zk_version: int | None
    ) -> int:
        """Compare-and-set ``state`` against ``state.zk_version``; returns the new version.

        With ``epoch_zk_version`` the write is fenced by the controller epoch (controller
        writes); without it only the znode version guards it (leader ISR changes).
        Raises ``BadVersionError`` if the znode changed since it was read.

        A leader's ISR change also checks, in the same transaction (one round trip, as
        before), that every other member of the new ISR is registered and not in a
        controlled shutdown (:meth:`mark_broker_shutting_down`); otherwise it is refused
        with ReplicaShuttingDownError (a ``BadVersionError``). So a leader cannot put a
        departing broker back into the ISRs the controller has just removed it from, as
        Kafka refuses ISR expansion to a shutting-down broker; the controller removes such
        a member itself, after which the leader's next ISR change goes through.
        """
        path = zkdata.partition_state_path(topic, partition)
        data = zkdata.encode_leader_and_isr(state)
        others = sorted({r for r in state.isr if r != state.leader})
        if epoch_zk_version is None and others:
            tx = self.kazoo.transaction()
            for r in others:
                tx.check(zkdata.broker_path(r), 0)
            tx.set_data(path, data, version=state.zk_version)
            results = tx.commit_async().get(timeout=self.write_timeout_s)
            for r, result in zip(others, results, strict=False):
                if isinstance(result, (BadVersionError, NoNodeError)):
                    raise ReplicaShuttingDownError(f"broker {r} is shutting down or not registered")
            failure = next(
                (r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None
            )
            if failure is not None:
                raise failure
            return int(results[-1].version)
        if epoch_zk_version is None:
            # Bounded wait: while ZooKeeper is unreachable the caller must not hang (it holds
            # a partition's lock); a timeout means the outcome is unknown.
            stat = self.kazoo.set_async(path, data, version=state.zk_version).get(timeout=self.write_timeout_s)
            return int(stat.version)

        def build(tx: object) -> None:
            assert hasattr(tx, "set_data")
            tx.set_data(path, data, version=state.zk_version)

        self._fenced(epoch_zk_version, build)
        return state.zk_version + 1

    def write_isr(self, topic: str, partition: int, state: LeaderAndIsr) -> int | None:
        """A leader's ISR change (:meth:`update_partition_state` without the controller's
        fence): the new znode version, or None if ZooKeeper refused it (the state changed
        since ``state.zk_version``, a new member is shutting down or not registered, or
        the partition is gone). Any other failure leaves the outcome unknown and is
        raised as a :class:`~kbroker.cluster.zk_errors.ZooKeeperError`."""
        with mapped():
            try:
                return self.update_partition_state(topic, partition, state, None)
            except (BadVersionError, NoNodeError):  # (ReplicaShuttingDownError is one)
                return None

    # --- batched controller writes (pipelined, each fenced) ----------------------------

    def _fenced_batch(
        self, epoch_zk_version: int, ops: list[tuple[Any, Callable[[Any], None]]]
    ) -> dict[Any, int | Exception]:
        """Send one small fenced transaction per key, all pipelined (kazoo's async API),
        then collect them: per key the new znode version of its last op or its exception
        (``BadVersionError``, ``NoNodeError``, ``NodeExistsError``...).

        ZooKeeper answers one session's requests in order, so N writes cost about one
        round trip, not N. Each transaction checks ``/controller_epoch`` first; if any
        fails that check, ControllerMovedError is raised after all answers are in.
        """
        pending = []
        for key, build in ops:
            tx = self.kazoo.transaction()
            tx.check(zkdata.CONTROLLER_EPOCH, epoch_zk_version)
            build(tx)
            pending.append((key, tx.commit_async()))
        out: dict[Any, int | Exception] = {}
        moved = False
        for key, result in pending:
            try:
                results = result.get(timeout=self.write_timeout_s * 6)
            except Exception as exc:  # the connection dropped: outcome unknown
                out[key] = exc
                continue
            if isinstance(results[0], (BadVersionError, NoNodeError)):
                moved = True
                continue
            failure = next(
                (r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None
            )
            if failure is not None:
                out[key] = failure
                continue
            last = results[-1]
            out[key] = int(last.version) if hasattr(last, "version") else 0
        if moved:
            raise ControllerMovedError("controller epoch changed: this broker is no longer controller")
        return out

    def update_partition_states(
        self, states: dict[tuple[str, int], LeaderAndIsr], epoch_zk_version: int
    ) -> dict[tuple[str, int], int | Exception]:
        """Controller: compare-and-set many partition states, pipelined, each fenced by the
        controller epoch; per partition its new znode version, or ``BadVersionError`` (it
        changed since read: re-read and decide again), ``NoNodeError`` (deleted) or another
        exception (outcome unknown). ControllerMovedError if this controller is deposed.
        """

        def op(tp: tuple[str, int], state: LeaderAndIsr) -> Callable[[Any], None]:
            path, data = zkdata.partition_state_path(*tp), zkdata.encode_leader_and_isr(state)
            return lambda tx: tx.set_data(path, data, version=state.zk_version)

        return self._fenced_batch(epoch_zk_version, [(tp, op(tp, s)) for tp, s in states.items()])

    def create_partition_states(
        self, states: dict[tuple[str, int], LeaderAndIsr], epoch_zk_version: int
    ) -> dict[tuple[str, int], int | Exception]:
        """Controller: create many new partitions' state znodes (and their parents),
        pipelined, each fenced by the controller epoch; per partition 0 or its exception
        (``NodeExistsError``: created meanwhile). ControllerMovedError if deposed.

        The parents are created first in the same pipeline (ZooKeeper applies one
        session's requests in order); that they exist already is fine.
        """
        parents: list[Any] = []
        for topic in sorted({t for t, _ in states}):
            parents.append(self.kazoo.create_async(zkdata.partitions_path(topic), b""))
        for topic, p in states:
            parents.append(self.kazoo.create_async(zkdata.partition_path(topic, p), b""))

        def op(tp: tuple[str, int], state: LeaderAndIsr) -> Callable[[Any], None]:
            path, data = zkdata.partition_state_path(*tp), zkdata.encode_leader_and_isr(state)
            return lambda tx: tx.create(path, data)

        out = self._fenced_batch(epoch_zk_version, [(tp, op(tp, s)) for tp, s in states.items()])
        for result in parents:
            try:
                result.get(timeout=self.write_timeout_s * 6)
            except (NodeExistsError, NoNodeError):
                pass
        return {tp: (0 if isinstance(r, int) else r) for tp, r in out.items()}
