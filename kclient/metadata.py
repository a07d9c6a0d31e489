"""The client's view of the cluster: brokers, partitions and their leaders.

Refreshed from any broker's Metadata RPC on demand (after an ``invalid_metadata``
error) and when older than ``metadata_max_age_ms``.

Thread safety: safe from any thread; a refresh swaps whole dictionaries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from kclient.errors import (
    KafkaTimeoutError,
    LeaderNotAvailableError,
    UnknownTopicOrPartitionError,
    for_code,
)
from kclient.proto.kbroker.v1 import metadata_pb2
from kclient.structs import BrokerMetadata, PartitionMetadata, TopicPartition
from kclient.transport import Transport

UNKNOWN_TOPIC_OR_PARTITION = 3


class ClusterMetadata:
    def __init__(self, transport: Transport, metadata_max_age_ms: int = 300000) -> None:
        self._transport = transport
        self._max_age_s = metadata_max_age_ms / 1000.0
        self._lock = threading.Lock()
        self.brokers: dict[int, BrokerMetadata] = {}
        self.controller_id = -1
        self.cluster_id = ""
        self._partitions: dict[str, dict[int, PartitionMetadata]] = {}
        self._topic_errors: dict[str, int] = {}
        self._topics_of_interest: set[str] = set()
        self._updated = 0.0

    # --- refresh -------------------------------------------------------------------

    def add_topics(self, topics: Iterable[str]) -> None:
        with self._lock:
            self._topics_of_interest.update(topics)

    def refresh(self, topics: Iterable[str] | None = None, *, all_topics: bool = False) -> None:
        names: list[str] = []
        if not all_topics:
            with self._lock:
                wanted = set(self._topics_of_interest)
            wanted.update(topics or ())
            names = sorted(wanted)
            if not names:
                all_topics = True
        resp = self._transport.call_any("Metadata", metadata_pb2.MetadataRequest(topics=names), self.broker_addresses())
        brokers = {b.node_id: BrokerMetadata(b.node_id, b.host, b.port, b.rack or None) for b in resp.brokers}
        partitions: dict[str, dict[int, PartitionMetadata]] = {}
        errors: dict[str, int] = {}
        for t in resp.topics:
            if t.error_code:
                errors[t.name] = t.error_code
                continue
            partitions[t.name] = {
                p.index: PartitionMetadata(
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
            }
        with self._lock:
            self.brokers = brokers
            self.controller_id = resp.controller_id
            self.cluster_id = resp.cluster_id
            if all_topics:
                self._partitions = partitions
            else:
                self._partitions = {**self._partitions, **partitions}
                for name in errors:
                    self._partitions.pop(name, None)
            self._topic_errors = errors
            self._updated = time.monotonic()

    # --- lookups -------------------------------------------------------------------

    def broker_addresses(self) -> list[str]:
        with self._lock:
            return [f"{b.host}:{b.port}" for b in self.brokers.values()]

    def address_of(self, node_id: int) -> str | None:
        b = self.brokers.get(node_id)
        return f"{b.host}:{b.port}" if b else None

    def topics(self) -> set[str]:
        with self._lock:
            return set(self._partitions)

    def partitions_for(self, topic: str) -> set[int] | None:
        with self._lock:
            parts = self._partitions.get(topic)
        return set(parts) if parts is not None else None

    def partition(self, tp: TopicPartition) -> PartitionMetadata | None:
        with self._lock:
            return self._partitions.get(tp.topic, {}).get(tp.partition)

    def leader_address(self, tp: TopicPartition) -> str | None:
        meta = self.partition(tp)
        if meta is None or meta.leader < 0:
            return None
        return self.address_of(meta.leader)

    def topic_error(self, topic: str) -> int:
        return self._topic_errors.get(topic, 0)

    def wait_for_partitions(self, topic: str, timeout_s: float) -> set[int]:
        """The topic's partitions, refreshing until they are known or time is up."""
        self.add_topics([topic])
        deadline = time.monotonic() + timeout_s
        while True:
            parts = self.partitions_for(topic)
            if parts:
                return parts
            if time.monotonic() >= deadline:
                code = self.topic_error(topic)
                if code and code != UNKNOWN_TOPIC_OR_PARTITION:
                    raise for_code(code)(f"topic {topic!r}")
                if code:
                    raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
                raise KafkaTimeoutError(f"no metadata for topic {topic!r} within {timeout_s:.1f}s")
            self.refresh([topic])
            parts = self.partitions_for(topic)
            if parts:
                return parts
            code = self.topic_error(topic)
            if code and for_code(code) not in (UnknownTopicOrPartitionError, LeaderNotAvailableError):
                raise for_code(code)(f"topic {topic!r}")
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
