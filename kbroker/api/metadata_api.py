"""Metadata, protocol-neutral (Kafka's ``handleTopicMetadataRequest``): the brokers as the
caller's listener reaches them, the controller, and each topic's partitions, with Kafka's
authorization and auto-creation rules. Both doors encode what :meth:`MetadataApi.metadata`
returns.

Thread safety: stateless beyond its collaborators, which are thread-safe; the calls
that may create topics block (ZooKeeper) and run on a door's request pool.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kbroker.api.access import Access
from kbroker.api.call_context import current
from kbroker.cluster import zkdata
from kbroker.cluster.metadata_cache import ClusterSnapshot, MetadataCache
from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.security.acl import AclOperation as Op
from kclient.errors import (
    BrokerResponseError,
    KafkaError,
    LeaderNotAvailableError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from kclient.topic_name import validate_topic_name

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Node:
    """A broker as the caller reaches it (its advertised address on the caller's listener)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    partition: int
    leader: int
    """-1: no live leader (the error says so)."""
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    offline_replicas: list[int]
    error: BrokerResponseError | None = None


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    error: BrokerResponseError | None = None
    topic_id: str = ""
    partitions: list[PartitionMetadata] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    cluster_id: str
    controller_id: int
    brokers: list[Node]
    topics: list[TopicMetadata] = field(default_factory=list)


def advertised(b: zkdata.BrokerInfo) -> tuple[str, int] | None:
    """Where a client of the listener serving this call reaches broker ``b``: the address
    ``b`` advertises for that listener (its inter-broker one outside any RPC)."""
    call = current()
    if not call.listener:
        return b.host, b.port
    e = b.door_endpoint(call.door, call.listener)
    return (e.host, e.port) if e is not None else None


def topic_name_error(name: str) -> BrokerResponseError | None:
    try:
        validate_topic_name(name)
    except BrokerResponseError as exc:
        return exc
    return None


def partition_metadata(
    snap: ClusterSnapshot, topic: str, fenced: Callable[[str, int], bool] = lambda t, p: False
) -> list[PartitionMetadata]:
    """A topic's partitions from a snapshot; a partition this broker must not lead now
    (``fenced``) names no leader."""
    info = snap.topics[topic]
    out = []
    for p, replicas in sorted(info.assignment.items()):
        state = info.states.get(p)
        leader = state.leader if state and not fenced(topic, p) else -1
        live = leader >= 0 and leader in snap.brokers
        out.append(
            PartitionMetadata(
                p,
                leader if live else -1,
                state.leader_epoch if state else -1,
                list(replicas),
                list(state.isr) if state else [],
                [r for r in replicas if r not in snap.brokers],
                None if live else LeaderNotAvailableError(""),
            )
        )
    return out


class MetadataApi:
    """Metadata requests over the broker's metadata cache (see the module docstring)."""

    def __init__(
        self,
        cluster_id: Callable[[], str],
        metadata: MetadataCache,
        admin: TopicAdmin,
        access: Access,
        fenced: Callable[[str, int], bool],
        any_fenced: Callable[[], bool],
        *,
        auto_create_topics: bool = False,
    ) -> None:
        self._cluster_id = cluster_id
        self._metadata = metadata
        self._admin = admin
        self._access = access
        self._fenced = fenced
        self._any_fenced = any_fenced
        self.auto_create_topics = auto_create_topics

    def is_stale(self) -> bool:
        """Not loaded yet (a broker just started: no brokers, no topics), or cut off from
        ZooKeeper and from followers: this broker's view is not the cluster's; clients
        should ask another broker."""
        return not self._metadata.loaded() or self._any_fenced()

    def loaded(self) -> bool:
        """Whether the first read of the cluster is done (a fresh broker's is not)."""
        return self._metadata.loaded()

    def brokers(self, snap: ClusterSnapshot | None = None) -> ClusterMetadata:
        """The cluster id, the controller and the brokers, as the caller reaches them (a
        broker without the caller's listener is left out, as in Kafka)."""
        snap = snap or self._metadata.snapshot()
        nodes = []
        for b in sorted(snap.brokers.values(), key=lambda b: b.broker_id):
            where = advertised(b)
            if where is not None:
                nodes.append(Node(b.broker_id, where[0], where[1], b.rack))
        return ClusterMetadata(self._cluster_id(), snap.controller_id, nodes)

    def metadata(self, topics: list[str] | None, allow_auto_create: bool = True) -> ClusterMetadata:
        """Kafka's Metadata rules: all topics (``[]``) lists the ones the caller may
        DESCRIBE; a named topic it may not answers TOPIC_AUTHORIZATION_FAILED (existing or
        not), and so does a missing one it may not create (CREATE on the Cluster or the
        topic) when auto-creation is on (and the caller allows it). ``None``: brokers only."""
        if topics is None:
            return self.brokers()
        refused = self._access.refused_topics(Op.DESCRIBE, topics)
        creating = self.auto_create_topics and allow_auto_create
        if creating and topics:
            known = self._metadata.snapshot().topics
            missing = {t for t in topics if t not in refused and t not in known and topic_name_error(t) is None}
            creatable = self._access.creatable(missing)
            refused.update((t, self._access.topic_error(Op.CREATE, t)) for t in missing - creatable)
            self.create_missing(creatable)
        snap = self._metadata.snapshot()
        out = self.brokers(snap)
        if not topics:
            topics = sorted(snap.topics)
            if self._access.enabled:
                topics = [t for t in topics if self._access.topic(Op.DESCRIBE, t, quiet=True)]
        for name in topics:
            err = refused.get(name) or topic_name_error(name)
            if err is None and name not in snap.topics:
                err = (
                    LeaderNotAvailableError(f"topic {name!r} is being created")
                    if creating
                    else UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
                )
            if err is not None:
                out.topics.append(TopicMetadata(name, err))
                continue
            parts = partition_metadata(snap, name, self._fenced)
            out.topics.append(TopicMetadata(name, None, snap.topics[name].topic_id or "", parts))
        return out

    def create_missing(self, topics: Iterable[str]) -> None:
        """auto.create.topics.enable: create unknown topics with the broker defaults."""
        snap = self._metadata.snapshot()
        for name in sorted(set(topics)):
            if name in snap.topics:
                continue
            try:
                self._admin.create_topic(name, -1, -1)  # num.partitions, default.replication.factor
                log.info("auto-created topic %s", name)
            except TopicAlreadyExistsError:
                pass  # another broker or client was first
            except KafkaError as exc:
                log.warning("cannot auto-create topic %s: %s", name, exc)
