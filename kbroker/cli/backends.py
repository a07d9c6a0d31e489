"""The cluster operations ``kctl`` needs, over ZooKeeper or over the gRPC admin API.

``--zookeeper`` reads and writes the znodes directly, as ``kafka-topics.sh
--zookeeper`` did (through :class:`~kbroker.cluster.topic_admin.TopicAdmin`; the
controller reacts through its watches). ``--bootstrap-server`` asks a broker through
:class:`kclient.AdminClient`. Both return the same small views, so each command is
written once.

On a cluster with ``zookeeper.set.acl``, ``--zookeeper`` authenticates with the
ZooKeeper credential of the environment (``$KBROKER_ZK_DIGEST``, or the JAAS file named
in ``$KAFKA_OPTS``; see :mod:`kbroker.security.zk_credential`) and gives what it creates the
secure ACLs, as Kafka's tools do when JAAS is configured. Without it, a write is refused
with one line naming NoAuth. ZooKeeper failures arrive as
:mod:`kbroker.cluster.zk_errors`' types (``kctl`` runs every command inside
:func:`~kbroker.cluster.zk_errors.mapped`).

Thread safety: none; one command owns a backend for its lifetime.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kbroker.cli.common import CliError, UsageError, check_bootstrap, check_zookeeper
from kbroker.cluster import zkdata
from kbroker.cluster.preferred_election import ElectionInProgressError, request_preferred_election
from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zk_errors import ZooKeeperError, ZooKeeperNoAuthError, ZooKeeperTimeoutError, mapped
from kbroker.security.zk_credential import ZkCredential, ZkCredentialError, no_auth_message, resolve_credential
from kclient import AdminClient, NewTopic, TopicPartition
from kclient.errors import KafkaError, PreferredLeaderNotAvailableError, UnknownTopicOrPartitionError
from kclient.proto.kbroker.v1 import config_pb2
from kclient.topic_name import validate_topic_name

ZK_CONNECT_TIMEOUT_S = 10.0
NO_LEADER = -1

MIN_INSYNC_REPLICAS = "min.insync.replicas"
DEFAULT_MIN_INSYNC_REPLICAS = 1

ElectionResults = dict[tuple[str, int], Exception | None]
"""(topic, partition) -> None if its preferred replica leads now, else why not."""


@dataclass(frozen=True)
class PartitionView:
    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]
    adding: list[int] = field(default_factory=list)
    """While the partition is being moved: the replicas being added (and removed)."""
    removing: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class TopicView:
    name: str
    partitions: list[PartitionView]
    configs: dict[str, str] = field(default_factory=dict)
    marked_for_deletion: bool = False
    topic_id: str | None = None
    """The topic's id (Kafka 2.8's TopicId), where the backend knows it: the topic znode has
    it; the gRPC DescribeTopics response does not carry it yet."""

    @property
    def replication_factor(self) -> int:
        """Of the first partition, not counting replicas being added (Kafka 2.8's TopicCommand)."""
        if not self.partitions:
            return 0
        first = self.partitions[0]
        return len(first.replicas) - len(first.adding)


@dataclass(frozen=True)
class BrokerView:
    broker_id: int
    host: str
    port: int
    rack: str | None


class Backend(ABC):
    """One connection to a cluster, closed by ``close`` (or ``with``)."""

    @abstractmethod
    def list_topics(self) -> list[str]: ...

    def pending_deletion(self) -> set[str]:
        """Topics marked for deletion but not deleted yet (known with ZooKeeper only)."""
        return set()

    @abstractmethod
    def describe_topics(self, names: Sequence[str] | None = None) -> list[TopicView]:
        """``names`` (each must exist), or every topic; sorted by name."""

    def min_insync_replicas(self, topics: Sequence[TopicView]) -> dict[str, int]:
        """Each topic's effective ``min.insync.replicas``: its override, else Kafka's default 1
        (over gRPC, the broker's answer, which includes the broker-wide default)."""
        return {t.name: _as_int(t.configs.get(MIN_INSYNC_REPLICAS), DEFAULT_MIN_INSYNC_REPLICAS) for t in topics}

    @abstractmethod
    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        assignment: Mapping[int, list[int]] | None,
        configs: Mapping[str, str],
    ) -> None: ...

    @abstractmethod
    def delete_topic(self, name: str) -> None: ...

    @abstractmethod
    def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> None: ...

    @abstractmethod
    def alter_config(self, name: str, configs: Mapping[str, str]) -> None: ...

    @abstractmethod
    def brokers(self) -> tuple[list[BrokerView], int]:
        """(live brokers sorted by id, controller id or -1)."""

    @abstractmethod
    def elect_preferred_leaders(self, partitions: Sequence[tuple[str, int]] | None, timeout_ms: int) -> ElectionResults:
        """Move each partition's leadership to its first replica; ``None`` = every partition.

        Waits up to ``timeout_ms`` for the controller, then reports every partition asked
        for (or every partition of every topic).
        """

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _as_int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def zookeeper_credential() -> ZkCredential | None:
    """The ZooKeeper credential of kctl's environment, if any (CliError if malformed)."""
    try:
        return resolve_credential()
    except ZkCredentialError as exc:
        raise CliError(str(exc)) from None


def connect_zookeeper(
    connect: str,
    timeout_s: float = ZK_CONNECT_TIMEOUT_S,
    *,
    credential: ZkCredential | None = None,
    set_acl: bool | None = None,
    session_timeout_ms: int = 18000,
) -> ZkClient:
    """A started ZkClient for ``kctl --zookeeper``, or a CliError saying why not.

    ``credential`` authenticates the session; ``set_acl`` (default: whether there is a
    credential) gives the znodes it creates the secure ACLs.
    """
    zk = ZkClient(
        connect,
        session_timeout_ms=session_timeout_ms,
        auth_digest=credential.digest if credential is not None else None,
        set_acl=credential is not None if set_acl is None else set_acl,
    )
    try:
        with mapped():
            zk.start(timeout_s)
    except (ZooKeeperError, OSError) as exc:
        try:
            zk.close()
        except Exception:  # the session never opened
            pass
        if isinstance(exc, ZooKeeperTimeoutError):
            raise CliError(f"cannot connect to ZooKeeper at {connect} (no answer within {timeout_s:g}s)") from None
        if isinstance(exc, ZooKeeperNoAuthError):
            raise CliError(no_auth_message(credential)) from None
        cause = exc.__cause__ if isinstance(exc, ZooKeeperError) and exc.__cause__ is not None else exc
        raise CliError(f"cannot connect to ZooKeeper at {connect}: {type(cause).__name__} {cause}".rstrip()) from None
    _hint_other_chroot(zk)
    return zk


def _hint_other_chroot(zk: ZkClient) -> None:
    """One stderr line when ``--zookeeper`` names no chroot, no broker is registered at the
    root, and some are under a chroot of the ensemble (``--zookeeper host:2181`` for a
    cluster at ``/kbroker``). A chroot named explicitly gets no hint: it may be a cluster
    with its brokers down, or one being set up."""
    if zk.chroot:
        return
    try:
        with mapped():
            if zk.live_brokers():
                return
    except (ZooKeeperError, OSError):
        return
    line = other_chroot_hint(zk.connect, [c for c in zk.chroots_with_brokers() if c != (zk.chroot or "/")])
    if line:
        print(line, file=sys.stderr)


def other_chroot_hint(connect: str, elsewhere: Sequence[str]) -> str | None:
    """The hint for ``connect`` when brokers are registered under the chroots ``elsewhere``
    (scripts/run's ``/kbroker`` first), or None."""
    if not elsewhere:
        return None
    chroots = sorted(elsewhere, key=lambda c: (c != "/kbroker", c))
    named = ", ".join(chroots[:3]) + (f" and {len(chroots) - 3} more" if len(chroots) > 3 else "")
    hosts = connect.partition("/")[0]
    first = chroots[0] if chroots[0] != "/" else ""
    return (
        f"kctl: no broker is registered at {connect}; brokers are registered under {named} "
        f"(use --zookeeper {hosts}{first})"
    )


def refused_write_message() -> str:
    """The one line for a ZooKeeperNoAuthError that reached ``kctl``'s top level, naming whether
    the environment gave a credential (for main.py's handler)."""
    try:
        credential = resolve_credential()
    except ZkCredentialError:
        credential = None
    return no_auth_message(credential)


@contextmanager
def refused_writes(credential: ZkCredential | None) -> Iterator[None]:
    """Turn ZooKeeper's NoAuth (a secured znode, no or another credential) into one CliError line."""
    try:
        with mapped():
            yield
    except ZooKeeperNoAuthError:
        raise CliError(no_auth_message(credential)) from None


class ZooKeeperBackend(Backend):
    """The znodes themselves, like ``kafka-topics.sh --zookeeper``."""

    def __init__(self, connect: str, timeout_s: float = ZK_CONNECT_TIMEOUT_S) -> None:
        self.connect = connect
        self._zk = connect_zookeeper(connect, timeout_s, credential=zookeeper_credential())
        self._admin = TopicAdmin(self._zk)

    def list_topics(self) -> list[str]:
        return self._zk.topics()

    def pending_deletion(self) -> set[str]:
        return set(self._zk.topics_pending_deletion())

    def describe_topics(self, names: Sequence[str] | None = None) -> list[TopicView]:
        explicit = names is not None
        pending = self.pending_deletion()
        out: list[TopicView] = []
        for name in sorted(names) if names is not None else self.list_topics():
            if explicit:
                validate_topic_name(name)
            found = self._zk.topic_znode(name)
            if found is None:
                if explicit:
                    raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
                continue  # deleted while we were reading
            znode, _ = found
            partitions = []
            for p, replicas in sorted(znode.partitions.items()):
                state = self._zk.partition_state(name, p)
                partitions.append(
                    PartitionView(
                        p,
                        state.leader if state is not None else NO_LEADER,
                        list(replicas),
                        list(state.isr) if state is not None else [],
                        list(znode.adding.get(p, [])),
                        list(znode.removing.get(p, [])),
                    )
                )
            out.append(TopicView(name, partitions, self._zk.topic_config(name), name in pending, znode.topic_id))
        return out

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        assignment: Mapping[int, list[int]] | None,
        configs: Mapping[str, str],
    ) -> None:
        with refused_writes(self._zk.credential):
            self._admin.create_topic(name, partitions, replication_factor, assignment=assignment, configs=configs)

    def delete_topic(self, name: str) -> None:
        with refused_writes(self._zk.credential):
            self._admin.delete_topic(name)

    def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> None:
        with refused_writes(self._zk.credential):
            self._admin.create_partitions(name, total, validate_only=validate_only)

    def alter_config(self, name: str, configs: Mapping[str, str]) -> None:
        with refused_writes(self._zk.credential):
            self._admin.alter_config(name, configs)

    def brokers(self) -> tuple[list[BrokerView], int]:
        live = self._zk.live_brokers()
        views = [BrokerView(b.broker_id, b.host, b.port, b.rack) for _, b in sorted(live.items())]
        return views, self._zk.controller_id()

    def elect_preferred_leaders(self, partitions: Sequence[tuple[str, int]] | None, timeout_ms: int) -> ElectionResults:
        """Kafka's old ``kafka-preferred-replica-election.sh --zookeeper``: request the
        election and wait for the controller (:func:`request_preferred_election`), then read
        back each partition's leader."""
        wanted = None if partitions is None else [(t, p) for t, p in partitions]
        try:
            with refused_writes(self._zk.credential):
                pending = not request_preferred_election(self._zk, wanted, timeout_ms / 1000.0)
        except ElectionInProgressError as exc:
            raise CliError(exc.message) from None
        if wanted is None:
            skip = self.pending_deletion()
            wanted = []
            for topic in self.list_topics():
                found = self._zk.topic_assignment(topic)
                if topic not in skip and found is not None:
                    wanted.extend((topic, p) for p in sorted(found[0]))
        timed_out = ""
        if pending:
            timed_out = (
                f"the controller did not complete the election within {timeout_ms / 1000.0:g}s"
                f" (the request stays pending in {zkdata.PREFERRED_REPLICA_ELECTION})"
            )
            if not wanted:
                raise CliError(timed_out)
        live = set(self._zk.live_brokers())
        assignments: dict[str, zkdata.Assignment | None] = {}
        results: ElectionResults = {}
        for topic, p in wanted:
            if topic not in assignments:
                found = self._zk.topic_assignment(topic)
                assignments[topic] = found[0] if found is not None else None
            replicas = (assignments[topic] or {}).get(p)
            if not replicas:
                results[(topic, p)] = UnknownTopicOrPartitionError(f"{topic}-{p} does not exist")
                continue
            state = self._zk.partition_state(topic, p)
            results[(topic, p)] = _preferred_outcome(topic, p, replicas[0], state, live, timed_out)
        return results

    def close(self) -> None:
        self._zk.close()


def _preferred_outcome(
    topic: str, partition: int, preferred: int, state: zkdata.LeaderAndIsr | None, live: set[int], timed_out: str
) -> Exception | None:
    """None if ``preferred`` leads ``topic-partition``, else a PreferredLeaderNotAvailableError saying why."""
    if state is not None and state.leader == preferred:
        return None
    leader = "none" if state is None or state.leader == NO_LEADER else str(state.leader)
    if timed_out:
        why = timed_out
    elif preferred not in live:
        why = f"preferred replica {preferred} is not alive"
    elif state is None or preferred not in state.isr:
        isr = ",".join(str(b) for b in state.isr) if state is not None else ""
        why = f"preferred replica {preferred} is not in the ISR [{isr}]"
    else:
        why = f"preferred replica {preferred} was not elected"
    return PreferredLeaderNotAvailableError(f"{topic}-{partition}: {why} (leader is {leader})")


class AdminBackend(Backend):
    """The gRPC admin API of any broker (``kclient.AdminClient``)."""

    def __init__(self, bootstrap: str, configs: Mapping[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self._admin = AdminClient(bootstrap, **dict(configs or {}))

    def list_topics(self) -> list[str]:
        return self._admin.list_topics()

    def describe_topics(self, names: Sequence[str] | None = None) -> list[TopicView]:
        for name in names or ():
            validate_topic_name(name)
        out = []
        described = self._admin.describe_topics(list(names) if names is not None else None)
        try:  # moves under way, from the controller (best effort: describe works without one)
            moving = self._admin.list_partition_reassignments(timeout_ms=5000)
        except KafkaError:
            moving = {}
        for d in described:
            parts = []
            for p in sorted(d.partitions, key=lambda p: p.partition):
                _, adding, removing = moving.get(TopicPartition(d.name, p.partition), ([], [], []))
                parts.append(PartitionView(p.partition, p.leader, list(p.replicas), list(p.isr), adding, removing))
            out.append(TopicView(d.name, parts, dict(d.configs), topic_id=d.topic_id or None))
        return sorted(out, key=lambda t: t.name)

    def min_insync_replicas(self, topics: Sequence[TopicView]) -> dict[str, int]:
        out = super().min_insync_replicas(topics)
        for t in topics:
            try:
                entries = self._admin.describe_configs([(config_pb2.TOPIC, t.name)])[(config_pb2.TOPIC, t.name)]
            except KafkaError:
                continue  # deleted meanwhile: the override or the default
            entry = entries.get(MIN_INSYNC_REPLICAS)
            if entry is not None:
                out[t.name] = _as_int(entry.value, out[t.name])
        return out

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        assignment: Mapping[int, list[int]] | None,
        configs: Mapping[str, str],
    ) -> None:
        topic = NewTopic(
            name, partitions, replication_factor, replica_assignments=assignment, topic_configs=dict(configs)
        )
        self._admin.create_topics([topic])

    def delete_topic(self, name: str) -> None:
        self._admin.delete_topics([name])

    def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> None:
        self._admin.create_partitions({name: total}, validate_only=validate_only)

    def alter_config(self, name: str, configs: Mapping[str, str]) -> None:
        ops = [(k, config_pb2.SET, v) for k, v in configs.items()]
        self._admin.incremental_alter_configs({(config_pb2.TOPIC, name): ops})

    def brokers(self) -> tuple[list[BrokerView], int]:
        brokers, controller, _ = self._admin.describe_cluster()
        return [BrokerView(b.node_id, b.host, b.port, b.rack) for b in sorted(brokers)], controller

    def elect_preferred_leaders(self, partitions: Sequence[tuple[str, int]] | None, timeout_ms: int) -> ElectionResults:
        results = self._admin.elect_leaders(partitions, timeout_ms)
        return {(tp.topic, tp.partition): err for tp, err in results.items()}

    def close(self) -> None:
        self._admin.close()


def open_group_admin(
    zookeeper: str | None, bootstrap: str | None, configs: Mapping[str, Any] | None = None
) -> AdminClient:
    """An AdminClient for the consumer-group commands, which exist over gRPC only
    (``configs``: the client settings, :func:`kbroker.cli.common.client_configs`)."""
    if bootstrap is None:
        raise UsageError("groups needs --bootstrap-server")
    if zookeeper is not None:
        raise UsageError("groups talks to brokers: give --bootstrap-server, not --zookeeper")
    return AdminClient(check_bootstrap(bootstrap), **dict(configs or {}))


def open_backend(zookeeper: str | None, bootstrap: str | None, configs: Mapping[str, Any] | None = None) -> Backend:
    """The backend for exactly one of ``--zookeeper`` / ``--bootstrap-server``
    (``configs``: the client settings for the brokers, :func:`kbroker.cli.common.client_configs`)."""
    if (zookeeper is None) == (bootstrap is None):
        which = "both" if zookeeper is not None else "neither"
        raise UsageError(f"give exactly one of --zookeeper or --bootstrap-server ({which} given)")
    if zookeeper is not None:
        return ZooKeeperBackend(check_zookeeper(zookeeper))
    assert bootstrap is not None
    return AdminBackend(check_bootstrap(bootstrap), configs)
