"""Topic, partition, config and log-directory administration, protocol-neutral (Kafka's
``handleCreateTopicsRequest``, ``handleDeleteTopicsRequest``,
``handleCreatePartitionsRequest``, ``handleDescribeConfigsRequest``,
``handleIncrementalAlterConfigsRequest``, ``handleDescribeLogDirsRequest``): plain values
in, one answer per resource (None or its error) out, in request order.

Authorization is here (Kafka's rule per request, below); the work is the roles':
:class:`~kbroker.cluster.topic_admin.TopicAdmin` writes the topic znodes,
:class:`~kbroker.cluster.config_admin.ConfigAdmin` the config znodes, and
:mod:`kbroker.api.log_dirs` reads the log directory. Topic creation and growth wait
(up to the request's timeout) until every new partition has a leader, as Kafka's
DelayedCreatePartitions does. Without a ZooKeeper connection (its quorum lost), a
request on topics or configs waits for it once (5 s, :class:`TopicAdmin`,
:class:`ConfigAdmin`), then answers each of its resources that passed its own checks
REQUEST_TIMED_OUT.

Thread safety: every method blocks (ZooKeeper) and runs on a door's request pool; the
collaborators are thread-safe.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kbroker.api.access import Access
from kbroker.api.log_dirs import LogDir, describe_log_dirs
from kbroker.api.metadata_api import PartitionMetadata, partition_metadata
from kbroker.cluster.config_admin import AlterOp, ConfigAdmin, OpType, ResourceType, static_broker_configs
from kbroker.cluster.config_admin import ConfigEntry as ConfigEntry
from kbroker.cluster.metadata_cache import ClusterSnapshot, MetadataCache
from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.cluster.zk_client import ZkClient
from kbroker.replication.replica_manager import ReplicaManager
from kbroker.security.acl import AclOperation as Op
from kclient.errors import (
    BrokerResponseError,
    InvalidRequestError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
    as_response_error,
)

Outcome = tuple[str, BrokerResponseError | None]
"""A resource's name and its answer: None (done) or why not."""
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class NewTopic:
    name: str
    num_partitions: int = -1
    """-1: ``num.partitions``."""
    replication_factor: int = -1
    """-1: ``default.replication.factor``."""
    assignment: Mapping[int, list[int]] | None = None
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NewPartitions:
    name: str
    count: int
    """The topic's partition count afterwards."""
    assignments: list[list[int]] = field(default_factory=list)
    """The replicas of each new partition, in order (empty: placed by the broker)."""


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    error: BrokerResponseError | None = None
    topic_id: str = ""
    partitions: list[PartitionMetadata] = field(default_factory=list)
    configs: dict[str, str] | None = None
    """The topic's overrides; None without DESCRIBE_CONFIGS on it."""


@dataclass(frozen=True, slots=True)
class ConfigResource:
    resource_type: int
    name: str
    keys: list[str] = field(default_factory=list)
    """DescribeConfigs: the keys asked for (empty: all)."""


@dataclass(frozen=True, slots=True)
class DescribedConfigs:
    resource_type: int
    name: str
    error: BrokerResponseError | None = None
    entries: list[ConfigEntry] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ConfigChange:
    name: str
    operation: int
    """IncrementalAlterConfigs' config_operation (SET 0, DELETE 1, APPEND 2, SUBTRACT 3)."""
    value: str | None = None


@dataclass(frozen=True, slots=True)
class ConfigChanges:
    resource_type: int
    name: str
    changes: list[ConfigChange] = field(default_factory=list)


class AdminApi:
    """The administration requests of one broker (see the module docstring)."""

    def __init__(
        self,
        broker_id: int,
        replicas: ReplicaManager,
        metadata: MetadataCache,
        zk: ZkClient,
        admin: TopicAdmin,
        access: Access,
    ) -> None:
        self._broker_id = broker_id
        self._replicas = replicas
        self._metadata = metadata
        self._zk = zk
        self._admin = admin
        self._access = access

    # --- topics -------------------------------------------------------------------------

    def create_topics(self, topics: Sequence[NewTopic], timeout_ms: int, validate_only: bool = False) -> list[Outcome]:
        """CREATE on the Cluster or on each topic. Every topic is written first, then one
        wait for all their leaders: the controller sets them up in batches meanwhile."""
        creatable = self._access.creatable(t.name for t in topics)
        written: dict[str, int] = {}
        out: list[Outcome] = []
        one_wait = _OneWait()
        for t in topics:
            if t.name not in creatable:
                out.append((t.name, self._access.topic_error(Op.CREATE, t.name)))
                continue
            try:
                chosen = one_wait.run(
                    self._admin.create_topic,
                    t.name,
                    t.num_partitions,
                    t.replication_factor,
                    assignment=t.assignment or None,
                    configs=dict(t.configs),
                    validate_only=validate_only,
                )
            except Exception as exc:
                out.append((t.name, as_response_error(exc)))
                continue
            if not validate_only:
                written[t.name] = len(chosen)
            out.append((t.name, None))
        late = set(self._leaderless(written, timeout_ms))
        return [
            (name, RequestTimedOutError(f"topic {name!r} was written but not every partition has a leader yet"))
            if name in late and err is None
            else (name, err)
            for name, err in out
        ]

    def delete_topics(self, names: Sequence[str], timeout_ms: int) -> list[Outcome]:
        """DELETE on each topic; answered once the controller removed it (or timed out)."""
        refused = self._access.refused_topics(Op.DELETE, names)
        one_wait = _OneWait()

        def delete(name: str) -> None:
            one_wait.run(self._admin.delete_topic, name)
            if not self._wait(lambda snap: name not in snap.topics, timeout_ms):
                raise RequestTimedOutError(f"topic {name!r} is marked for deletion but not deleted yet")

        return [(n, refused[n]) if n in refused else (n, _outcome(delete, n)) for n in names]

    def create_partitions(
        self, topics: Sequence[NewPartitions], timeout_ms: int, validate_only: bool = False
    ) -> list[Outcome]:
        """ALTER on each topic; answered once every new partition has a leader."""
        refused = self._access.refused_topics(Op.ALTER, (t.name for t in topics))
        one_wait = _OneWait()

        def grow(t: NewPartitions) -> None:
            one_wait.run(
                self._admin.create_partitions, t.name, t.count, validate_only=validate_only, assignments=t.assignments
            )
            if not validate_only and self._leaderless({t.name: t.count}, timeout_ms):
                raise RequestTimedOutError(f"topic {t.name!r} was written but not every partition has a leader yet")

        return [(t.name, refused[t.name]) if t.name in refused else (t.name, _outcome(grow, t)) for t in topics]

    def describe_topics(self, names: Sequence[str]) -> list[TopicDescription]:
        """DESCRIBE on each topic (all topics, ``[]``: the describable ones); the configs
        only with DESCRIBE_CONFIGS on the topic, as DescribeConfigs would."""
        snap = self._metadata.snapshot()
        refused = self._access.refused_topics(Op.DESCRIBE, names)
        if not names:
            names = [n for n in sorted(snap.topics) if self._access.topic(Op.DESCRIBE, n, quiet=True)]
        out = []
        for name in names:
            info = snap.topics.get(name)
            if name in refused:
                out.append(TopicDescription(name, refused[name]))
            elif info is None:
                out.append(TopicDescription(name, UnknownTopicOrPartitionError(f"topic {name!r} does not exist")))
            else:
                configs = dict(info.config) if self._access.topic(Op.DESCRIBE_CONFIGS, name, quiet=True) else None
                out.append(TopicDescription(name, None, info.topic_id or "", partition_metadata(snap, name), configs))
        return out

    def _wait(self, predicate: Callable[[ClusterSnapshot], bool], timeout_ms: int) -> bool:
        return self._metadata.wait_for(predicate, max(timeout_ms, 0) / 1000.0)

    def _leaderless(self, expected: Mapping[str, int], timeout_ms: int) -> list[str]:
        """Wait (up to ``timeout_ms``) until each topic of ``expected`` has that many
        partitions with a leader; the topics that still have not, in order."""
        if not expected:
            return []

        def missing(snap: ClusterSnapshot) -> list[str]:
            out = []
            for topic, partitions in expected.items():
                info = snap.topics.get(topic)
                if info is None or sum(1 for s in info.states.values() if s.has_leader) < partitions:
                    out.append(topic)
            return out

        if self._wait(lambda snap: not missing(snap), timeout_ms):
            return []
        return missing(self._metadata.snapshot())

    # --- configs ------------------------------------------------------------------------

    def _configs(self) -> ConfigAdmin:
        static = static_broker_configs(self._replicas.log_manager.default_config)
        return ConfigAdmin(self._zk, broker_id=self._broker_id, static_broker=static)

    def _check_config_access(self, operation: Op, resource_type: int, name: str) -> None:
        """DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic, or on the Cluster for a broker."""
        if resource_type not in set(ResourceType):
            raise InvalidRequestError(f"Unsupported resource type {resource_type}")
        if resource_type == ResourceType.BROKER:
            self._access.check_cluster(operation)
        elif resource_type == ResourceType.TOPIC:
            self._access.check_topic(operation, name)

    def describe_configs(self, resources: Sequence[ConfigResource]) -> list[DescribedConfigs]:
        configs = self._configs()
        one_wait = _OneWait()
        out = []
        for r in resources:
            try:
                self._check_config_access(Op.DESCRIBE_CONFIGS, r.resource_type, r.name)
                entries = one_wait.run(configs.describe, ResourceType(r.resource_type), r.name, r.keys)
            except Exception as exc:
                out.append(DescribedConfigs(r.resource_type, r.name, as_response_error(exc)))
                continue
            out.append(DescribedConfigs(r.resource_type, r.name, None, entries))
        return out

    def incremental_alter_configs(
        self, resources: Sequence[ConfigChanges], validate_only: bool = False
    ) -> list[tuple[ConfigChanges, BrokerResponseError | None]]:
        """ALTER_CONFIGS per resource; a resource named twice is refused (both times)."""
        configs = self._configs()
        one_wait = _OneWait()
        seen = Counter((r.resource_type, r.name) for r in resources)

        def alter(r: ConfigChanges) -> None:
            if seen[(r.resource_type, r.name)] > 1:
                raise InvalidRequestError("Duplicate resources in request are not allowed")
            self._check_config_access(Op.ALTER_CONFIGS, r.resource_type, r.name)
            unknown = [c.name for c in r.changes if c.operation not in set(OpType)]
            if unknown:
                raise InvalidRequestError(f"Unknown config operation for {unknown[0]}")
            ops = [AlterOp(c.name, OpType(c.operation), c.value) for c in r.changes]
            one_wait.run(
                configs.incremental_alter, ResourceType(r.resource_type), r.name, ops, validate_only=validate_only
            )

        return [(r, _outcome(alter, r)) for r in resources]

    # --- log directories ----------------------------------------------------------------

    def describe_log_dirs(self, wanted: Mapping[str, set[int] | None] | None) -> list[LogDir]:
        """DESCRIBE on the Cluster (raised); ``wanted``: topic -> partitions (None: all of
        the topic's), None for everything."""
        self._access.check_cluster(Op.DESCRIBE)
        return describe_log_dirs(self._replicas, wanted)


class _OneWait:
    """One request's wait for a lost ZooKeeper connection, over all its resources: the
    first that needs ZooKeeper waits the role's time (5 s); once one was refused
    (REQUEST_TIMED_OUT), the rest only look (a wait of 0), each after its own argument
    checks, so a request naming many resources is refused after one wait, not one each."""

    def __init__(self) -> None:
        self.wait_s: float | None = None

    def run(self, action: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return action(*args, zookeeper_wait_s=self.wait_s, **kwargs)
        except RequestTimedOutError:
            self.wait_s = 0.0
            raise


def _outcome(action: Callable[..., object], *args: object) -> BrokerResponseError | None:
    try:
        action(*args)
    except Exception as exc:
        return as_response_error(exc)
    return None
