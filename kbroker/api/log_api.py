"""The log requests, protocol-neutral (Kafka's ``handleProduceRequest``,
``handleFetchRequest``, ``handleListOffsetRequest``, ``handleOffsetForLeaderEpochRequest``,
``handleDeleteRecordsRequest`` and ``handleInitProducerIdRequest``): plain values in,
per-partition results out; a request malformed as a whole raises the error table's
exception (InvalidRequestError, InvalidFetchSizeError) and changes nothing.

Authorization (Kafka's rule per request, below), the broker's request metrics
(``kafka_server_brokertopicmetrics_*``, per-request error counts) and the purgatory sizes
(:attr:`LogApi.parked`) live here once for both doors; appends, reads and waits are the
:class:`~kbroker.replication.replica_manager.ReplicaManager`'s, which also refuses a
partition named twice in one Produce.

Record batches pass through as bytes: the broker does not look inside them here. The
typed values of these requests (FetchSpec, FetchResult, ProduceResult, OffsetResult,
DeleteRecordsResult) are the replica manager's, re-exported here so that a door imports
nothing below the core.

Thread safety: the coroutines run on the server's event loop (long polls park in the
replica manager's purgatory and hold no thread); the plain methods block and run on a
door's request pool. ``parked`` is touched on the loop only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kbroker.api.access import Access
from kbroker.api.call_context import Offload
from kbroker.api.metadata_api import MetadataApi, topic_name_error
from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.producer_ids import ProducerIdManager
from kbroker.metrics import BrokerMetrics, count_records, error_name
from kbroker.replication.fetch_session import FINAL_EPOCH as FINAL_EPOCH
from kbroker.replication.fetch_session import INVALID_SESSION_ID as INVALID_SESSION_ID
from kbroker.replication.fetch_session import FetchSpec as FetchSpec
from kbroker.replication.replica_manager import DeleteRecordsResult as DeleteRecordsResult
from kbroker.replication.replica_manager import FetchResult as FetchResult
from kbroker.replication.replica_manager import OffsetResult as OffsetResult
from kbroker.replication.replica_manager import ProduceResult as ProduceResult
from kbroker.replication.replica_manager import ReplicaManager
from kbroker.replication.replica_manager import TopicPartition as TopicPartition
from kbroker.replication.replica_manager import TxnMarker as TxnMarker
from kbroker.security.acl import AclOperation as Op
from kbroker.security.acl import ResourceType
from kclient.errors import (
    BrokerResponseError,
    InvalidFetchSizeError,
    InvalidRequestError,
    TransactionalIdAuthorizationFailedError,
    as_response_error,
)
from kclient.structs import AbortedTransaction as AbortedTransaction
from kclient.structs import IsolationLevel as IsolationLevel

CONSUMER = -1
"""replica_id of a consumer (and of any client that leaves the field unset)."""
MAX_FETCH_WAIT_MS = 30000
"""The longest a Fetch parks, whatever it asks."""
NO_TRANSACTIONS = "transactions are not supported by this broker (only idempotent producers): unset transactional.id"


@dataclass(frozen=True, slots=True)
class Fetch:
    """A Fetch request (defaults: Kafka's)."""

    partitions: list[FetchSpec]
    replica_id: int = CONSUMER
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 52428800
    session_id: int = INVALID_SESSION_ID
    session_epoch: int = FINAL_EPOCH
    forgotten: list[TopicPartition] = field(default_factory=list)
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """What a Fetch answers: a session's own error (and no partitions), or the
    partitions with their outcome, in order, and the session id (0: none)."""

    partitions: list[tuple[FetchSpec, FetchResult]] = field(default_factory=list)
    session_id: int = INVALID_SESSION_ID
    error: BrokerResponseError | None = None


@dataclass(frozen=True, slots=True)
class OffsetQuery:
    topic: str
    partition: int
    timestamp: int = -1
    """-1 latest, -2 earliest, else the first offset at or after this time."""
    current_leader_epoch: int = -1
    isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED
    """READ_COMMITTED: "latest" is the last stable offset, and no answer passes it."""


@dataclass(frozen=True, slots=True)
class EpochQuery:
    topic: str
    partition: int
    leader_epoch: int
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class EpochEnd:
    error: BrokerResponseError | None = None
    leader_epoch: int = -1
    end_offset: int = -1


class LogApi:
    """The log requests of one broker (see the module docstring)."""

    def __init__(
        self,
        replicas: ReplicaManager,
        metadata: MetadataCache,
        topics: MetadataApi,
        producer_ids: ProducerIdManager,
        access: Access,
        offload: Offload,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self._replicas = replicas
        self._metadata = metadata
        self._topics = topics
        self._producer_ids = producer_ids
        self._access = access
        self._offload = offload
        self._metrics = metrics
        self.parked = {"Produce": 0, "Fetch": 0}
        """Produce (acks=all) and long-poll Fetch calls waiting now (the purgatory sizes)."""

    # --- Produce ------------------------------------------------------------------------

    async def produce(
        self,
        acks: int,
        timeout_ms: int,
        partitions: Sequence[tuple[TopicPartition, bytes]],
        *,
        transactional_id: str | None = None,
    ) -> dict[TopicPartition, ProduceResult]:
        """WRITE on each topic (refused: its partitions answer TOPIC_AUTHORIZATION_FAILED);
        with a ``transactional_id``, WRITE on it too (refused: the whole request raises
        TRANSACTIONAL_ID_AUTHORIZATION_FAILED); unknown topics are created first when
        ``auto.create.topics.enable`` (and the caller may). Appends are queued in the
        order requests arrive (no await before)."""
        if timeout_ms < 0:
            raise InvalidRequestError(f"timeout_ms must be >= 0, got {timeout_ms}")
        if transactional_id and not self._access.allows(Op.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
            raise TransactionalIdAuthorizationFailedError(
                self._access.denied(Op.WRITE, f"transactional id {transactional_id!r}")
            )
        refused = self._access.refused_topics(Op.WRITE, (tp[0] for tp, _ in partitions))
        results: dict[TopicPartition, ProduceResult] = {}
        entries = []
        for tp, records in partitions:
            err = refused.get(tp[0]) or topic_name_error(tp[0])
            if err is not None:
                results[tp] = ProduceResult(err)
            else:
                entries.append((tp, records))
        if self._topics.auto_create_topics:
            known = self._metadata.snapshot().topics
            missing = {tp[0] for tp, _ in entries if tp[0] not in known}
            if missing:
                await self._offload(self._topics.create_missing, self._access.creatable(missing))
        parked = acks == -1
        if parked:
            self.parked["Produce"] += 1
        try:
            appended = await self._replicas.append_async(acks, timeout_ms, entries)
        finally:
            if parked:
                self.parked["Produce"] -= 1
        if self._metrics is not None:
            self._count_produce(entries, appended)
        results.update(appended)
        return results

    def _count_produce(
        self, entries: list[tuple[TopicPartition, bytes]], results: dict[TopicPartition, ProduceResult]
    ) -> None:
        assert self._metrics is not None
        for tp, records in entries:
            r = results[tp]
            if r.error is not None:
                self._metrics.request("Produce").error(error_name(r.error))
                continue
            c = self._metrics.topic(tp[0])
            c.messages_in.inc(count_records(records))
            c.bytes_in.inc(len(records))

    # --- Fetch --------------------------------------------------------------------------

    async def fetch(self, req: Fetch) -> FetchAnswer:
        """Kafka's Fetch rule: a follower needs CLUSTER_ACTION on the Cluster (refused,
        every partition answers TOPIC_AUTHORIZATION_FAILED), a consumer READ on each
        topic. A session (KIP-227) is used when the request names one."""
        if req.replica_id < CONSUMER:
            raise InvalidRequestError(f"replica_id must be -1 (a consumer) or >= 0, got {req.replica_id}")
        if req.max_wait_ms < 0 or req.min_bytes < 0:
            raise InvalidRequestError("max_wait_ms and min_bytes must be >= 0")
        if req.max_bytes <= 0:
            raise InvalidFetchSizeError(f"max_bytes must be > 0, got {req.max_bytes}")
        seen: set[TopicPartition] = set()
        for s in req.partitions:
            if s.max_bytes <= 0:
                raise InvalidFetchSizeError(f"{s.topic}-{s.partition}: partition_max_bytes must be > 0")
            if (s.topic, s.partition) in seen:
                raise InvalidRequestError(f"{s.topic}-{s.partition} appears more than once in the request")
            seen.add((s.topic, s.partition))
        wait_ms = min(req.max_wait_ms, MAX_FETCH_WAIT_MS)
        parked = req.max_wait_ms > 0 and req.min_bytes > 0
        if req.session_id != INVALID_SESSION_ID or req.session_epoch != FINAL_EPOCH:
            ctx = self._replicas.fetch_sessions.new_context(
                req.session_id, req.session_epoch, req.partitions, req.forgotten, req.replica_id
            )
            if ctx.error is not None:
                return FetchAnswer(error=ctx.error)
            if ctx.session is not None:
                refused = self._refusals(req.replica_id, ctx.session.topic_names())
                if parked:
                    self.parked["Fetch"] += 1
                try:
                    entries = await self._replicas.fetch_session_async(
                        self._offload,
                        req.replica_id,
                        wait_ms,
                        req.min_bytes,
                        req.max_bytes,
                        ctx,
                        refused,
                        req.isolation_level,
                    )
                finally:
                    if parked:
                        self.parked["Fetch"] -= 1
                self._count_fetch(req.replica_id, entries)
                return FetchAnswer(entries, ctx.session.id)
        specs = req.partitions
        refused = self._refusals(req.replica_id, sorted({s.topic for s in specs}))
        allowed = [s for s in specs if s.topic not in refused] if refused else specs
        if parked:
            self.parked["Fetch"] += 1
        try:
            results = await self._replicas.fetch_async(
                self._offload, req.replica_id, wait_ms, req.min_bytes, req.max_bytes, allowed, req.isolation_level
            )
        finally:
            if parked:
                self.parked["Fetch"] -= 1
        if refused:
            done = iter(results)
            results = [FetchResult(refused[s.topic]) if s.topic in refused else next(done) for s in specs]
        answered = list(zip(specs, results, strict=True))
        self._count_fetch(req.replica_id, answered)
        return FetchAnswer(answered)

    def _refusals(self, replica_id: int, topics: list[str]) -> dict[str, BrokerResponseError]:
        """Checked at every fetch (an ACL change applies to a session at once): one check
        per topic, or one for a follower."""
        if not self._access.enabled:
            return {}
        if replica_id < 0:
            return self._access.refused_topics(Op.READ, topics)
        if self._access.cluster(Op.CLUSTER_ACTION):
            return {}
        return {t: self._access.topic_error(Op.CLUSTER_ACTION, t) for t in topics}

    def _count_fetch(self, replica_id: int, entries: list[tuple[FetchSpec, FetchResult]]) -> None:
        metrics = self._metrics
        if metrics is None:
            return
        for spec, r in entries:
            if r.read is not None:
                if r.read.records:
                    c = metrics.topic(spec.topic)
                    (c.bytes_out if replica_id == CONSUMER else c.replication_bytes_out).inc(len(r.read.records))
            elif r.error is not None:
                metrics.request("Fetch").error(error_name(r.error))

    # --- offsets ------------------------------------------------------------------------

    def list_offsets(self, replica_id: int, queries: Sequence[OffsetQuery]) -> list[OffsetResult]:
        """DESCRIBE on each topic; one answer per query, in order."""
        if replica_id < CONSUMER:
            raise InvalidRequestError(f"replica_id must be -1 (a consumer) or >= 0, got {replica_id}")
        refused = self._access.refused_topics(Op.DESCRIBE, (q.topic for q in queries))
        return [
            OffsetResult(refused[q.topic])
            if q.topic in refused
            else self._replicas.list_offset(
                q.topic, q.partition, q.timestamp, replica_id, q.current_leader_epoch, q.isolation_level
            )
            for q in queries
        ]

    def offset_for_leader_epoch(self, replica_id: int, queries: Sequence[EpochQuery]) -> list[EpochEnd]:
        """Kafka (KIP-320): CLUSTER_ACTION on the Cluster (a follower) or DESCRIBE on the
        topic. Each answer is the end offset of the asked epoch in the leader's log.
        Memory only: cheap enough for the event loop."""
        names = (q.topic for q in queries)
        refused = {} if self._access.cluster(Op.CLUSTER_ACTION) else self._access.refused_topics(Op.DESCRIBE, names)
        out = []
        for q in queries:
            if q.topic in refused:
                out.append(EpochEnd(refused[q.topic]))
                continue
            try:
                part = self._replicas.partition(q.topic, q.partition)
                if replica_id >= 0:
                    part.check_replica(replica_id)
                part.check_leader_epoch(q.current_leader_epoch)
                epoch, end = part.log.leader_epoch_cache.end_offset_for(q.leader_epoch, part.log.log_end_offset)
            except Exception as exc:
                out.append(EpochEnd(as_response_error(exc)))
                continue
            out.append(EpochEnd(None, epoch, end))
        return out

    async def delete_records(
        self, timeout_ms: int, offsets: Sequence[tuple[TopicPartition, int]]
    ) -> dict[TopicPartition, DeleteRecordsResult]:
        """Kafka's handleDeleteRecordsRequest: DELETE on each topic (refused: its
        partitions answer TOPIC_AUTHORIZATION_FAILED), unknown partitions
        UNKNOWN_TOPIC_OR_PARTITION; the leader moves the rest and answers once the ISR
        followed (the wait parks in the purgatory, no thread held)."""
        if timeout_ms < 0:
            raise InvalidRequestError(f"timeout_ms must be >= 0, got {timeout_ms}")
        seen: set[TopicPartition] = set()
        for tp, _ in offsets:
            if tp in seen:
                raise InvalidRequestError(f"{tp[0]}-{tp[1]} appears more than once in the request")
            seen.add(tp)
        refused = self._access.refused_topics(Op.DELETE, (tp[0] for tp, _ in offsets))
        results = {tp: DeleteRecordsResult(refused[tp[0]]) for tp, _ in offsets if tp[0] in refused}
        unknown = self._metadata.snapshot().unknown_partitions(tp for tp, _ in offsets if tp not in results)
        results.update((tp, DeleteRecordsResult(err)) for tp, err in unknown.items())
        wanted = {tp: offset for tp, offset in offsets if tp not in results}
        if wanted:
            results.update(await self._replicas.delete_records_async(self._offload, timeout_ms, wanted))
        return results

    # --- transaction markers --------------------------------------------------------------

    async def write_txn_markers(
        self, markers: Sequence[tuple[TxnMarker, Sequence[TopicPartition]]], timeout_ms: int
    ) -> list[dict[TopicPartition, BrokerResponseError | None]]:
        """WriteTxnMarkers (inter-broker): CLUSTER_ACTION on the Cluster; each marker
        appended to its partitions as their leader and replicated as acks=all. One
        answer per marker, in order: per partition None (written) or why not."""
        if not self._access.cluster(Op.CLUSTER_ACTION):
            raise self._access.cluster_error(Op.CLUSTER_ACTION)
        return [
            await self._replicas.write_markers_async(marker, list(partitions), timeout_ms)
            for marker, partitions in markers
        ]

    # --- producer ids -------------------------------------------------------------------

    def init_producer_id(self, transactional_id: str | None) -> tuple[int, int]:
        """An idempotent producer's id and epoch: IDEMPOTENT_WRITE on the Cluster or WRITE
        on any topic (Kafka's KIP-679 rule), else CLUSTER_AUTHORIZATION_FAILED. A
        transactional id is refused at once with TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        (no transactions yet): Kafka's clients treat it as fatal at once, where
        COORDINATOR_NOT_AVAILABLE would be retried until the call times out."""
        if transactional_id:
            raise TransactionalIdAuthorizationFailedError(NO_TRANSACTIONS)
        if not self._access.cluster(Op.IDEMPOTENT_WRITE) and not self._access.any_of_type(Op.WRITE, ResourceType.TOPIC):
            raise self._access.cluster_error(Op.IDEMPOTENT_WRITE)
        return self._producer_ids.generate()
