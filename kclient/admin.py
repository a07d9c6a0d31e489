"""Topic administration over the gRPC admin API (kafka-python's ``KafkaAdminClient``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kclient.errors import for_code
from kclient.metadata import ClusterMetadata
from kclient.proto.kbroker.v1 import admin_pb2, cluster_pb2
from kclient.structs import BrokerMetadata, PartitionMetadata, TopicPartition
from kclient.topic_name import validate_topic_name
from kclient.transport import Transport


@dataclass
class NewTopic:
    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    replica_assignments: Mapping[int, list[int]] | None = None
    topic_configs: Mapping[str, str] = field(default_factory=dict)


@dataclass
class TopicDescription:
    name: str
    partitions: list[PartitionMetadata]
    configs: dict[str, str]


def _raise_first(results: Iterable[Any]) -> None:
    for r in results:
        if r.error_code:
            raise for_code(r.error_code)(r.error_message or f"topic {r.name!r}")


class AdminClient:
    """Create, delete, grow, list and describe topics."""

    def __init__(
        self, bootstrap_servers: str | Iterable[str] = "localhost:9092", request_timeout_ms: int = 30000, **_: Any
    ) -> None:
        self._transport = Transport(bootstrap_servers, request_timeout_ms)
        self._metadata = ClusterMetadata(self._transport)
        self._timeout_ms = request_timeout_ms

    def _call(self, method: str, request: Any) -> Any:
        return self._transport.call_any(
            method, request, self._metadata.broker_addresses(), self._timeout_ms / 1000.0 + 5
        )

    def create_topics(
        self, new_topics: Iterable[NewTopic], timeout_ms: int | None = None, validate_only: bool = False
    ) -> None:
        req = admin_pb2.CreateTopicsRequest(timeout_ms=timeout_ms or self._timeout_ms, validate_only=validate_only)
        for t in new_topics:
            validate_topic_name(t.name)
            ct = req.topics.add(name=t.name, num_partitions=t.num_partitions, replication_factor=t.replication_factor)
            for p, replicas in (t.replica_assignments or {}).items():
                ct.assignments[p].broker_ids.extend(replicas)
            ct.configs.update({k: str(v) for k, v in t.topic_configs.items()})
        _raise_first(self._call("CreateTopics", req).topics)

    def delete_topics(self, topics: Iterable[str], timeout_ms: int | None = None) -> None:
        req = admin_pb2.DeleteTopicsRequest(topics=list(topics), timeout_ms=timeout_ms or self._timeout_ms)
        _raise_first(self._call("DeleteTopics", req).topics)

    def create_partitions(
        self, counts: Mapping[str, int], timeout_ms: int | None = None, validate_only: bool = False
    ) -> None:
        req = admin_pb2.CreatePartitionsRequest(timeout_ms=timeout_ms or self._timeout_ms, validate_only=validate_only)
        for name, count in counts.items():
            req.topics.add(name=name, count=count)
        _raise_first(self._call("CreatePartitions", req).topics)

    def list_topics(self) -> list[str]:
        resp = self._call("DescribeTopics", admin_pb2.DescribeTopicsRequest())
        return sorted(t.name for t in resp.topics if not t.error_code)

    def describe_topics(self, topics: Iterable[str] | None = None) -> list[TopicDescription]:
        resp = self._call("DescribeTopics", admin_pb2.DescribeTopicsRequest(topics=list(topics or ())))
        out = []
        for t in resp.topics:
            if t.error_code:
                raise for_code(t.error_code)(t.error_message)
            parts = [
                PartitionMetadata(
                    t.name,
                    p.index,
                    p.leader_id,
                    p.leader_epoch,
                    list(p.replica_nodes),
                    list(p.isr_nodes),
                    list(p.offline_replicas),
                    p.error_code,
                )
                for p in t.partitions
            ]
            out.append(TopicDescription(t.name, parts, dict(t.configs)))
        return out

    def elect_leaders(
        self, partitions: Iterable[tuple[str, int]] | None = None, timeout_ms: int | None = None
    ) -> dict[TopicPartition, Exception | None]:
        """Preferred-leader election: move each partition's leadership to its first replica.

        ``partitions`` are ``(topic, partition)`` pairs; ``None`` (or empty) means every
        partition. Returns, per partition, ``None`` when its preferred replica leads now,
        else the error (``PreferredLeaderNotAvailableError`` when that replica is not
        alive and in sync, ``UnknownTopicOrPartitionError`` for a partition that does not
        exist). The broker waits up to ``timeout_ms`` for the controller.
        """
        timeout = timeout_ms or self._timeout_ms
        req = cluster_pb2.ElectLeadersRequest(timeout_ms=timeout)
        for topic, partition in partitions or ():
            req.partitions.add(topic=topic, partition=partition)
        resp = self._transport.call_any(
            "ElectLeaders", req, self._metadata.broker_addresses(), max(timeout, self._timeout_ms) / 1000.0 + 5
        )
        out: dict[TopicPartition, Exception | None] = {}
        for r in resp.results:
            tp = TopicPartition(r.topic, r.partition)
            out[tp] = for_code(r.error_code)(r.error_message) if r.error_code else None
        return out

    def describe_cluster(self) -> tuple[list[BrokerMetadata], int, str]:
        """(brokers, controller id, cluster id)."""
        self._metadata.refresh(all_topics=True)
        return sorted(self._metadata.brokers.values()), self._metadata.controller_id, self._metadata.cluster_id

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
