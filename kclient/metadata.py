"""The client's view of the cluster: brokers, partitions and their leaders.

Refreshed from a broker's Metadata RPC on demand (``request_update`` after an
``invalid_metadata`` error, a REQUEST_TIMED_OUT, a connection error or a timeout) and
when older than ``metadata_max_age_ms`` (``maybe_refresh``). The broker asked is the one
that failed least recently (``Transport.candidates``), so a broker that just failed, and
may answer from a stale view, is asked last.

Thread safety: safe from any thread; a refresh swaps whole dictionaries.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from kclient.errors import (
    KafkaError,
    KafkaTimeoutError,
    UnknownTopicOrPartitionError,
    for_code,
)
from kclient.proto.kbroker.v1 import metadata_pb2
from kclient.retry import retry
from kclient.structs import BrokerMetadata, PartitionMetadata, TopicPartition
from kclient.transport import Transport

log = logging.getLogger(__name__)

UNKNOWN_TOPIC_OR_PARTITION = 3


class ClusterMetadata:
    def __init__(self, transport: Transport, metadata_max_age_ms: int = 300000, retry_backoff_ms: int = 100) -> None:
        self._transport = transport
        self._max_age_s = metadata_max_age_ms / 1000.0
        self._backoff_s = retry_backoff_ms / 1000.0
        self._need_update = False
        self._last_attempt = 0.0
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

    def request_update(self) -> None:
        """Ask for a refresh at the next ``maybe_refresh`` (cheap: sets a flag)."""
        self._need_update = True

    def needs_refresh(self, now: float) -> bool:
        """An update was requested, or the view is older than ``metadata_max_age_ms``
        (either way, not sooner than ``retry_backoff_ms`` after the last attempt)."""
        due = self._need_update or now - self._updated >= self._max_age_s
        return due and now - self._last_attempt >= self._backoff_s

    def maybe_refresh(self, timeout_s: float | None = None) -> bool:
        """Refresh when ``needs_refresh``; ``False`` if a due refresh failed (logged, retried later)."""
        if not self.needs_refresh(time.monotonic()):
            return True
        try:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            self.refresh(deadline=deadline)
        except KafkaError as exc:
            log.debug("metadata refresh failed: %s", exc)
            return False
        return True

    def refresh(
        self, topics: Iterable[str] | None = None, *, all_topics: bool = False, deadline: float | None = None
    ) -> None:
        """Fetch the metadata now. With ``deadline``, retries until a broker answers or
        the deadline passes (then NoBrokersAvailable); without, each broker is tried once."""
        self._last_attempt = time.monotonic()
        names: list[str] = []
        if not all_topics:
            with self._lock:
                wanted = set(self._topics_of_interest)
            wanted.update(topics or ())
            names = sorted(wanted)
            if not names:
                all_topics = True
        resp = self._transport.call_any(
            "Metadata",
            metadata_pb2.MetadataRequest(topics=names),
            self.broker_addresses(),
            deadline=deadline,
            backoff_s=self._backoff_s,
        )
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
            self._need_update = False

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
        """The topic's partitions, refreshing until they are known or time is up.

        Brokers that do not answer and topics still being created are retried until
        ``timeout_s``; then the last error is raised: NoBrokersAvailable,
        UnknownTopicOrPartitionError, or KafkaTimeoutError when metadata had no answer.
        """
        self.add_topics([topic])
        deadline = time.monotonic() + timeout_s

        def known_partitions() -> set[int]:
            parts = self.partitions_for(topic)
            if not parts:
                self.refresh([topic], deadline=deadline)
                parts = self.partitions_for(topic)
            if parts:
                return parts
            code = self.topic_error(topic)
            if code == UNKNOWN_TOPIC_OR_PARTITION:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
            if code:
                raise for_code(code)(f"topic {topic!r}")
            raise KafkaTimeoutError(f"no metadata for topic {topic!r} within {timeout_s:.1f}s")

        return retry(known_partitions, what=f"topic {topic!r}", deadline=deadline, backoff_s=0.1, raise_last=True)
