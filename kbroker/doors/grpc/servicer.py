"""The gRPC ``kbroker.v1.Broker`` servicer: decode, delegate, encode. No logic.

Handlers are coroutines on the server's event loop (:mod:`kbroker.doors.grpc.server`):
blocking core calls go through ``offload`` (a bounded thread pool); long polls
(Fetch, acks=all Produce, JoinGroup, SyncGroup) park in the core's purgatories and hold
no thread.

Per-partition problems travel as error codes inside the response; a malformed request
as a whole fails with gRPC status INVALID_ARGUMENT (plus the Kafka code in the
``kbroker-error-code`` trailing metadata) and changes nothing. Every ``optional``
proto field that is unset takes the default the .proto documents (Kafka's).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, NoReturn, TypeVar

import grpc

from kbroker.api.access import Access
from kbroker.api.call_context import Offload, current
from kbroker.api.group_api import GroupApi
from kbroker.api.log_dirs import describe_log_dirs
from kbroker.cluster import zkdata
from kbroker.cluster.config_admin import AlterOp, ConfigAdmin, OpType, ResourceType, static_broker_configs
from kbroker.cluster.controller import Controller
from kbroker.cluster.controller_channel import PartitionStateUpdate
from kbroker.cluster.metadata_cache import ClusterSnapshot, MetadataCache
from kbroker.cluster.preferred_election import request_preferred_election
from kbroker.cluster.producer_ids import ProducerIdManager
from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zk_errors import mapped
from kbroker.doors.grpc.group_rpcs import GroupRpcs
from kbroker.doors.grpc.rpc import blocking, opt, set_error
from kbroker.doors.grpc.security_rpcs import SecurityRpcs
from kbroker.group.coordinator import GroupCoordinator
from kbroker.metrics import BrokerMetrics, count_records, error_name
from kbroker.replication.fetch_session import FINAL_EPOCH, INVALID_SESSION_ID, FetchContext
from kbroker.replication.replica_manager import (
    DeleteRecordsResult,
    FetchResult,
    FetchSpec,
    OffsetResult,
    ReplicaManager,
)
from kbroker.security.acl import AclOperation as Op
from kbroker.security.acl import ResourceType as AclResourceType
from kbroker.security.authorizer import AclAuthorizer
from kbroker.security.credentials import CredentialStore
from kbroker.security.sasl import SaslAuthenticator
from kclient.errors import (
    BrokerResponseError,
    ClusterAuthorizationFailedError,
    InvalidFetchSizeError,
    InvalidRequestError,
    KafkaError,
    LeaderNotAvailableError,
    NotControllerError,
    PreferredLeaderNotAvailableError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    as_response_error,
)
from kclient.proto.kbroker.v1 import (
    admin_pb2,
    broker_pb2_grpc,
    cluster_pb2,
    config_pb2,
    log_pb2,
    metadata_pb2,
    reassignment_pb2,
)
from kclient.topic_name import validate_topic_name

log = logging.getLogger(__name__)

ERROR_CODE_METADATA_KEY = "kbroker-error-code"


DEFAULT_ACKS = -1
DEFAULT_REQUEST_TIMEOUT_MS = 30000
DEFAULT_REASSIGNMENT_TIMEOUT_MS = 60000
DEFAULT_FETCH_MAX_WAIT_MS = 500
MAX_FETCH_WAIT_MS = 30000
DEFAULT_FETCH_MIN_BYTES = 1
DEFAULT_FETCH_MAX_BYTES = 52428800
DEFAULT_PARTITION_MAX_BYTES = 1048576
CONSUMER = -1
"""replica_id of a consumer (and of any client that leaves the field unset)."""


async def _abort(context: grpc.aio.ServicerContext, exc: BrokerResponseError) -> NoReturn:
    context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, str(exc.errno)),))
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    raise AssertionError("context.abort returned")  # pragma: no cover


TRANSACTIONS_REFUSED = 53
"""TRANSACTIONAL_ID_AUTHORIZATION_FAILED: the answer to every transactional request until
transactions exist. Kafka's clients treat it as fatal at once (librdkafka's
``init_transactions`` fails with the message; COORDINATOR_NOT_AVAILABLE would be retried
until the call times out)."""
NO_TRANSACTIONS = "transactions are not supported by this broker (only idempotent producers): unset transactional.id"


def _no_duplicates(pairs: list[tuple[str, int]]) -> BrokerResponseError | None:
    repeated = [tp for tp, n in Counter(pairs).items() if n > 1]
    if repeated:
        t, p = repeated[0]
        return InvalidRequestError(f"{t}-{p} appears more than once in the request")
    return None


def _advertised(b: zkdata.BrokerInfo) -> tuple[str, int] | None:
    """Where a client of the listener serving this call reaches broker ``b``: the address
    ``b`` advertises for that listener (its inter-broker one outside any RPC)."""
    call = current()
    if not call.listener:
        return b.host, b.port
    e = b.door_endpoint(call.door, call.listener)
    return (e.host, e.port) if e is not None else None


def _code(exc: BrokerResponseError | None) -> tuple[int, str]:
    return (0, "") if exc is None else (exc.errno, exc.message)


def partition_metadata(
    snap: ClusterSnapshot, topic: str, fenced: Callable[[str, int], bool] = lambda t, p: False
) -> list[metadata_pb2.PartitionMetadata]:
    """Partition metadata from a snapshot; a partition this broker must not lead now
    (``fenced``) names no leader."""
    info = snap.topics[topic]
    out = []
    for p, replicas in sorted(info.assignment.items()):
        state = info.states.get(p)
        leader = state.leader if state and not fenced(topic, p) else -1
        code = 0 if leader >= 0 and leader in snap.brokers else LeaderNotAvailableError.errno
        out.append(
            metadata_pb2.PartitionMetadata(
                error_code=code,  # type: ignore[arg-type]
                index=p,
                leader_id=leader if leader in snap.brokers else -1,
                leader_epoch=state.leader_epoch if state else -1,
                replica_nodes=replicas,
                isr_nodes=state.isr if state else [],
                offline_replicas=[r for r in replicas if r not in snap.brokers],
            )
        )
    return out


class BrokerService(GroupRpcs, SecurityRpcs, broker_pb2_grpc.BrokerServicer):
    def __init__(
        self,
        broker_id: int,
        cluster_id: Callable[[], str],
        replicas: ReplicaManager,
        metadata: MetadataCache,
        zk: ZkClient,
        admin: TopicAdmin,
        producer_ids: ProducerIdManager,
        controller: Controller,
        groups: GroupCoordinator,
        offload: Offload,
        *,
        auto_create_topics: bool = False,
        credentials: CredentialStore,
        sasl: Callable[[str], SaslAuthenticator | None] = lambda listener: None,
        authorizer: AclAuthorizer | None = None,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self._metrics = metrics
        self.parked = {"Produce": 0, "Fetch": 0}
        """Produce (acks=all) and long-poll Fetch calls waiting now (the purgatory sizes)."""
        self._offload = self.offload = offload
        self._credentials = credentials
        self._sasl = sasl
        self._acls = authorizer
        self._access = Access(authorizer)
        self._auto_create = auto_create_topics
        self._groups = groups
        self._producer_ids = producer_ids
        self._controller = controller
        self._broker_id = broker_id
        self._cluster_id = cluster_id
        self._replicas = replicas
        self._metadata = metadata
        self._zk = zk
        self._admin = admin
        self.groups_api = GroupApi(groups, metadata, self._access, offload, _advertised)

    # --- authorization (kbroker.api.access) ----------------------------------------

    def _refuse_cluster(self, resp: Any, operation: Op) -> bool:
        """True, with CLUSTER_AUTHORIZATION_FAILED in ``resp``, if the caller may not
        ``operation`` the Cluster."""
        if self._access.cluster(operation):
            return False
        set_error(resp, self._access.cluster_error(operation))
        return True

    # --- log -----------------------------------------------------------------------

    async def Produce(
        self, request: log_pb2.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.ProduceResponse:
        acks = opt(request, "acks", DEFAULT_ACKS)
        timeout_ms = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)
        if timeout_ms < 0:
            await _abort(context, InvalidRequestError(f"timeout_ms must be >= 0, got {timeout_ms}"))
        refused: dict[tuple[str, int], BrokerResponseError] = {}
        entries = []
        counts = Counter((t.name, p.index) for t in request.topics for p in t.partitions)
        unauthorized = self._access.refused_topics(Op.WRITE, (t.name for t in request.topics))
        for t in request.topics:
            bad_name = unauthorized.get(t.name) or _topic_name_error(t.name)
            for p in t.partitions:
                tp = (t.name, p.index)
                if bad_name is not None:
                    refused[tp] = bad_name
                elif counts[tp] > 1:
                    refused[tp] = InvalidRequestError(f"{t.name}-{p.index} appears more than once in the request")
                else:
                    entries.append((tp, p.records))
        if self._auto_create:
            known = self._metadata.snapshot().topics
            missing = {tp[0] for tp, _ in entries if tp[0] not in known}
            if missing:
                await self._offload(lambda: self._create_missing(self._access.creatable(missing)))
        # No await before this: appends are queued in the order requests arrived.
        parked = acks == -1
        if parked:
            self.parked["Produce"] += 1
        try:
            results = await self._replicas.append_async(acks, timeout_ms, entries)
        finally:
            if parked:
                self.parked["Produce"] -= 1
        if self._metrics is not None:
            self._count_produce(entries, results)
        resp = log_pb2.ProduceResponse()
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                tp = (t.name, p.index)
                if tp in refused:
                    tr.partitions.add(index=p.index, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1)
                    set_error(tr.partitions[-1], refused[tp])
                    continue
                r = results[tp]
                code, msg = _code(r.error)
                tr.partitions.add(
                    index=p.index,
                    error_code=code,  # type: ignore[arg-type]
                    error_message=msg,
                    base_offset=r.base_offset,
                    log_append_time_ms=r.log_append_time,
                    log_start_offset=r.log_start_offset,
                )
                for index, message in getattr(r.error, "record_errors", ()):  # KIP-467
                    tr.partitions[-1].record_errors.add(batch_index=index, message=message)
        return resp

    def _count_produce(self, entries: list[tuple[tuple[str, int], bytes]], results: dict[Any, Any]) -> None:
        assert self._metrics is not None
        for tp, records in entries:
            r = results[tp]
            if r.error is not None:
                self._metrics.request("Produce").error(error_name(r.error))
                continue
            c = self._metrics.topic(tp[0])
            c.messages_in.inc(count_records(records))
            c.bytes_in.inc(len(records))

    def _create_missing(self, topics: set[str]) -> None:
        """auto.create.topics.enable: create unknown topics with the broker defaults."""
        snap = self._metadata.snapshot()
        for name in sorted(topics):
            if name in snap.topics:
                continue
            try:
                self._admin.create_topic(name, -1, -1)  # num.partitions, default.replication.factor
                log.info("auto-created topic %s", name)
            except TopicAlreadyExistsError:
                pass  # another broker or client was first
            except KafkaError as exc:
                log.warning("cannot auto-create topic %s: %s", name, exc)

    async def Fetch(self, request: log_pb2.FetchRequest, context: grpc.aio.ServicerContext) -> log_pb2.FetchResponse:
        replica_id = opt(request, "replica_id", CONSUMER)
        max_wait_ms = opt(request, "max_wait_ms", DEFAULT_FETCH_MAX_WAIT_MS)
        min_bytes = opt(request, "min_bytes", DEFAULT_FETCH_MIN_BYTES)
        max_bytes = opt(request, "max_bytes", DEFAULT_FETCH_MAX_BYTES)
        if replica_id < CONSUMER:
            await _abort(context, InvalidRequestError(f"replica_id must be -1 (a consumer) or >= 0, got {replica_id}"))
        if max_wait_ms < 0 or min_bytes < 0:
            await _abort(context, InvalidRequestError("max_wait_ms and min_bytes must be >= 0"))
        if max_bytes <= 0:
            await _abort(context, InvalidFetchSizeError(f"max_bytes must be > 0, got {max_bytes}"))
        specs = []
        for t in request.topics:
            for p in t.partitions:
                part_max = opt(p, "partition_max_bytes", DEFAULT_PARTITION_MAX_BYTES)
                if part_max <= 0:
                    await _abort(context, InvalidFetchSizeError(f"{t.name}-{p.index}: partition_max_bytes must be > 0"))
                epoch = opt(p, "current_leader_epoch", -1)
                start = opt(p, "log_start_offset", -1)
                specs.append(FetchSpec(t.name, p.index, p.fetch_offset, part_max, epoch, start))
        dup = _no_duplicates([(s.topic, s.partition) for s in specs])
        if dup is not None:
            await _abort(context, dup)
        session_id = opt(request, "session_id", INVALID_SESSION_ID)
        session_epoch = opt(request, "session_epoch", FINAL_EPOCH)
        if session_id != INVALID_SESSION_ID or session_epoch != FINAL_EPOCH:
            forgotten = [(t.name, p) for t in request.forgotten_topics_data for p in t.partitions]
            ctx = self._replicas.fetch_sessions.new_context(session_id, session_epoch, specs, forgotten, replica_id)
            if ctx.error is not None:
                code, msg = _code(ctx.error)
                return log_pb2.FetchResponse(error_code=code, error_message=msg)  # type: ignore[arg-type]
            if ctx.session is not None:
                return await self._session_fetch(replica_id, max_wait_ms, min_bytes, max_bytes, ctx)
        refused = self._fetch_refusals(replica_id, specs)
        allowed = [s for s in specs if s.topic not in refused] if refused else specs
        parked = max_wait_ms > 0 and min_bytes > 0
        if parked:
            self.parked["Fetch"] += 1
        try:
            results = await self._replicas.fetch_async(
                self._offload, replica_id, min(max_wait_ms, MAX_FETCH_WAIT_MS), min_bytes, max_bytes, allowed
            )
        finally:
            if parked:
                self.parked["Fetch"] -= 1
        if refused:
            done = iter(results)
            results = [FetchResult(refused[s.topic]) if s.topic in refused else next(done) for s in specs]
        return self._fetch_response(replica_id, zip(specs, results, strict=True))

    async def _session_fetch(
        self, replica_id: int, max_wait_ms: int, min_bytes: int, max_bytes: int, ctx: FetchContext
    ) -> log_pb2.FetchResponse:
        """A full or incremental fetch in ``ctx.session`` (KIP-227): the answer names what
        the session's rules say, and the session id."""
        session = ctx.session
        assert session is not None
        parked = max_wait_ms > 0 and min_bytes > 0
        if parked:
            self.parked["Fetch"] += 1
        try:
            entries = await self._replicas.fetch_session_async(
                self._offload,
                replica_id,
                min(max_wait_ms, MAX_FETCH_WAIT_MS),
                min_bytes,
                max_bytes,
                ctx,
                self._session_refusals(replica_id, session.topic_names()),
            )
        finally:
            if parked:
                self.parked["Fetch"] -= 1
        resp = self._fetch_response(replica_id, entries)
        resp.session_id = session.id
        return resp

    def _session_refusals(self, replica_id: int, topics: list[str]) -> dict[str, BrokerResponseError]:
        """:meth:`_fetch_refusals` for a session's topics, checked at every fetch (an ACL
        change applies to a session at once): one check per topic, or one for a follower."""
        if not self._access.enabled:
            return {}
        if replica_id < 0:
            return self._access.refused_topics(Op.READ, topics)
        if self._access.cluster(Op.CLUSTER_ACTION):
            return {}
        return {t: self._access.topic_error(Op.CLUSTER_ACTION, t) for t in topics}

    def _fetch_response(
        self, replica_id: int, entries: Iterable[tuple[FetchSpec, FetchResult]]
    ) -> log_pb2.FetchResponse:
        resp = log_pb2.FetchResponse()
        metrics = self._metrics
        by_topic: dict[str, Any] = {}
        for spec, r in entries:
            tr = by_topic.get(spec.topic)
            if tr is None:
                tr = by_topic[spec.topic] = resp.topics.add(name=spec.topic)
            code, msg = _code(r.error)
            pr = tr.partitions.add(index=spec.partition, error_code=code, error_message=msg)
            if r.read is not None:
                pr.high_watermark = r.read.high_watermark
                pr.log_start_offset = r.read.log_start_offset
                pr.log_end_offset = r.read.log_end_offset
                pr.records = r.read.records
                if metrics is not None and r.read.records:
                    c = metrics.topic(spec.topic)
                    (c.bytes_out if replica_id == CONSUMER else c.replication_bytes_out).inc(len(r.read.records))
            else:
                pr.high_watermark = pr.log_start_offset = pr.log_end_offset = -1
                if metrics is not None and r.error is not None:
                    metrics.request("Fetch").error(error_name(r.error))
        return resp

    def _fetch_refusals(self, replica_id: int, specs: list[FetchSpec]) -> dict[str, BrokerResponseError]:
        """Kafka's Fetch rule: a follower needs CLUSTER_ACTION on the Cluster (refused, every
        partition answers TOPIC_AUTHORIZATION_FAILED), a consumer READ on each topic."""
        if not self._access.enabled:
            return {}
        if replica_id < 0:
            return self._access.refused_topics(Op.READ, (s.topic for s in specs))
        if self._access.cluster(Op.CLUSTER_ACTION):
            return {}
        return {s.topic: self._access.topic_error(Op.CLUSTER_ACTION, s.topic) for s in specs}

    async def ListOffsets(
        self, request: log_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.ListOffsetsResponse:
        replica_id = opt(request, "replica_id", CONSUMER)
        if replica_id < CONSUMER:
            await _abort(context, InvalidRequestError(f"replica_id must be -1 (a consumer) or >= 0, got {replica_id}"))
        wanted = [
            (t.name, p.index, opt(p, "timestamp", -1), opt(p, "current_leader_epoch", -1))
            for t in request.topics
            for p in t.partitions
        ]
        refused = self._access.refused_topics(Op.DESCRIBE, (t.name for t in request.topics))

        def lookup() -> list[Any]:
            return [
                OffsetResult(refused[t]) if t in refused else self._replicas.list_offset(t, i, ts, replica_id, epoch)
                for t, i, ts, epoch in wanted
            ]

        found = iter(await self._offload(lookup))
        resp = log_pb2.ListOffsetsResponse()
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                r = next(found)
                code, msg = _code(r.error)
                tr.partitions.add(
                    index=p.index,
                    error_code=code,
                    error_message=msg,  # type: ignore[arg-type]
                    timestamp=r.timestamp,
                    offset=r.offset,
                    leader_epoch=r.leader_epoch,
                )
        return resp

    async def OffsetForLeaderEpoch(
        self, request: log_pb2.OffsetForLeaderEpochRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.OffsetForLeaderEpochResponse:
        replica_id = opt(request, "replica_id", CONSUMER)
        resp = log_pb2.OffsetForLeaderEpochResponse()
        # Kafka (KIP-320): CLUSTER_ACTION on the Cluster (a follower) or DESCRIBE on the topic.
        names = (t.name for t in request.topics)
        refused = {} if self._access.cluster(Op.CLUSTER_ACTION) else self._access.refused_topics(Op.DESCRIBE, names)
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                pr = tr.partitions.add(index=p.index, leader_epoch=-1, end_offset=-1)
                if t.name in refused:
                    set_error(pr, refused[t.name])
                    continue
                found = _answer(pr, partial(self._epoch_end, t.name, p, replica_id))
                if found is not None:
                    pr.leader_epoch, pr.end_offset = found
        return resp

    async def DeleteRecords(
        self, request: log_pb2.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.DeleteRecordsResponse:
        """Kafka's handleDeleteRecordsRequest: DELETE on each topic (refused: its partitions
        answer TOPIC_AUTHORIZATION_FAILED), unknown partitions UNKNOWN_TOPIC_OR_PARTITION;
        the leader moves the rest and answers once the ISR followed (the wait parks in the
        purgatory, no thread held)."""
        timeout_ms = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)
        if timeout_ms < 0:
            await _abort(context, InvalidRequestError(f"timeout_ms must be >= 0, got {timeout_ms}"))
        dup = _no_duplicates([(t.name, p.index) for t in request.topics for p in t.partitions])
        if dup is not None:
            await _abort(context, dup)
        snap = self._metadata.snapshot()
        refused = self._access.refused_topics(Op.DELETE, (t.name for t in request.topics))
        results: dict[tuple[str, int], DeleteRecordsResult] = {}
        offsets: dict[tuple[str, int], int] = {}
        for t in request.topics:
            info = snap.topics.get(t.name)
            for p in t.partitions:
                tp = (t.name, p.index)
                if t.name in refused:
                    results[tp] = DeleteRecordsResult(refused[t.name])
                elif info is None or p.index not in info.assignment:
                    results[tp] = DeleteRecordsResult(
                        UnknownTopicOrPartitionError(f"{t.name}-{p.index} does not exist")
                    )
                else:
                    offsets[tp] = p.offset
        if offsets:
            results.update(await self._replicas.delete_records_async(self._offload, timeout_ms, offsets))
        resp = log_pb2.DeleteRecordsResponse()
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                r = results[(t.name, p.index)]
                code, msg = _code(r.error)
                tr.partitions.add(
                    index=p.index,
                    low_watermark=r.low_watermark if r.error is None else -1,
                    error_code=code,  # type: ignore[arg-type]
                    error_message=msg,
                )
        return resp

    def _epoch_end(self, topic: str, p: log_pb2.OffsetForLeaderEpochPartition, replica_id: int) -> tuple[int, int]:
        part = self._replicas.partition(topic, p.index)
        if replica_id >= 0:
            part.check_replica(replica_id)
        part.check_leader_epoch(opt(p, "current_leader_epoch", -1))
        return part.log.leader_epoch_cache.end_offset_for(p.leader_epoch, part.log.log_end_offset)

    # --- metadata ------------------------------------------------------------------

    def metadata_of(
        self, topics: list[str] | None, allow_auto_create: bool = True
    ) -> metadata_pb2.MetadataResponse:
        """Kafka's Metadata rules: all topics (``[]``) lists the ones the caller may
        DESCRIBE; a named topic it may not answers TOPIC_AUTHORIZATION_FAILED (existing or
        not), and so does a missing one it may not create (CREATE on the Cluster or the
        topic) when auto-creation is on (and the caller allows it). ``None``: brokers only."""
        if topics is None:
            return self._metadata_response(self._metadata.snapshot())
        refused = self._access.refused_topics(Op.DESCRIBE, topics)
        if self._auto_create and allow_auto_create and topics:
            known = self._metadata.snapshot().topics
            missing = {t for t in topics if t not in refused and t not in known and _topic_name_error(t) is None}
            creatable = self._access.creatable(missing)
            refused.update((t, self._access.topic_error(Op.CREATE, t)) for t in missing - creatable)
            self._create_missing(creatable)
        snap = self._metadata.snapshot()
        resp = self._metadata_response(snap)
        if not topics:
            topics = sorted(snap.topics)
            if self._access.enabled:
                topics = [t for t in topics if self._access.topic(Op.DESCRIBE, t, quiet=True)]
        for name in topics:
            tm = resp.topics.add(name=name)
            err = refused.get(name) or _topic_name_error(name)
            if err is None and name not in snap.topics:
                err = (
                    LeaderNotAvailableError(f"topic {name!r} is being created")
                    if self._auto_create and allow_auto_create
                    else UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
                )
            if err is not None:
                set_error(tm, err)
                continue
            tm.partitions.extend(partition_metadata(snap, name, self._replicas.fenced_partition))
            tm.topic_id = snap.topics[name].topic_id or ""
        return resp

    def metadata_is_stale(self) -> bool:
        """Cut off from ZooKeeper and from followers: this broker's view is stale; clients
        should ask another broker."""
        return self._replicas.any_fenced()

    def _metadata_response(self, snap: ClusterSnapshot) -> metadata_pb2.MetadataResponse:
        """The cluster id, the controller and the brokers, as the caller reaches them."""
        resp = metadata_pb2.MetadataResponse(cluster_id=self._cluster_id(), controller_id=snap.controller_id)
        for b in sorted(snap.brokers.values(), key=lambda b: b.broker_id):
            where = _advertised(b)
            if where is not None:  # a broker without this listener is left out, as in Kafka
                resp.brokers.add(node_id=b.broker_id, host=where[0], port=where[1], rack=b.rack or "")
        return resp

    async def Metadata(
        self, request: metadata_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> metadata_pb2.MetadataResponse:
        if self.metadata_is_stale():
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"broker {self._broker_id} is cut off from ZooKeeper; its metadata is stale: ask another broker",
            )
        return await self._offload(self.metadata_of, list(request.topics))  # type: ignore[no-any-return]

    # --- admin ---------------------------------------------------------------------

    def _wait(self, predicate: Callable[[ClusterSnapshot], bool], timeout_ms: int) -> bool:
        return self._metadata.wait_for(predicate, max(timeout_ms, 0) / 1000.0)

    def _wait_for_leaders(self, topic: str, partitions: int, timeout_ms: int) -> None:
        if self._leaderless({topic: partitions}, timeout_ms):
            raise RequestTimedOutError(f"topic {topic!r} was written but not every partition has a leader yet")

    def _leaderless(self, expected: Mapping[str, int], timeout_ms: int) -> list[str]:
        """Wait (up to ``timeout_ms``) until each topic of ``expected`` has that many
        partitions with a leader; the topics that still have not, in order."""

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

    @staticmethod
    def _topic_results(
        names: list[str],
        action: Callable[[str, int], None],
        results: Any,
        refused: Mapping[str, BrokerResponseError],
    ) -> None:
        """Run ``action(name, index)`` per topic but the ``refused`` ones (their error is
        their answer); failures become that topic's error code."""
        for i, name in enumerate(names):
            result = results.add(name=name)
            if name in refused:
                set_error(result, refused[name])
                continue
            try:
                action(name, i)
            except KafkaError as exc:
                set_error(result, as_response_error(exc))

    @blocking
    def CreateTopics(self, request: admin_pb2.CreateTopicsRequest) -> admin_pb2.CreateTopicsResponse:
        resp = admin_pb2.CreateTopicsResponse()
        timeout = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)

        def create(name: str, i: int) -> None:
            t = request.topics[i]
            assignment = {p: list(r.broker_ids) for p, r in t.assignments.items()} or None
            chosen = self._admin.create_topic(
                name,
                opt(t, "num_partitions", -1),
                opt(t, "replication_factor", -1),
                assignment=assignment,
                configs=dict(t.configs),
                validate_only=request.validate_only,
            )
            if not request.validate_only:
                written[name] = (i, len(chosen))

        names = [t.name for t in request.topics]
        creatable = self._access.creatable(names)
        refused = {n: self._access.topic_error(Op.CREATE, n) for n in names if n not in creatable}
        written: dict[str, tuple[int, int]] = {}
        self._topic_results(names, create, resp.topics, refused)
        # Every topic written first, then one wait for all their leaders (Kafka's
        # DelayedCreatePartitions): the controller sets them up in batches meanwhile.
        for name in self._leaderless({n: count for n, (_, count) in written.items()}, timeout):
            err = RequestTimedOutError(f"topic {name!r} was written but not every partition has a leader yet")
            set_error(resp.topics[written[name][0]], err)
        return resp

    @blocking
    def DeleteTopics(self, request: admin_pb2.DeleteTopicsRequest) -> admin_pb2.DeleteTopicsResponse:
        resp = admin_pb2.DeleteTopicsResponse()
        timeout = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)

        def delete(name: str, _: int) -> None:
            self._admin.delete_topic(name)
            if not self._wait(lambda snap: name not in snap.topics, timeout):
                raise RequestTimedOutError(f"topic {name!r} is marked for deletion but not deleted yet")

        names = list(request.topics)
        self._topic_results(names, delete, resp.topics, self._access.refused_topics(Op.DELETE, names))
        return resp

    @blocking
    def DescribeTopics(self, request: admin_pb2.DescribeTopicsRequest) -> admin_pb2.DescribeTopicsResponse:
        """DESCRIBE on each topic (all topics: the describable ones); the configs only with
        DESCRIBE_CONFIGS on the topic, as DescribeConfigs would."""
        snap = self._metadata.snapshot()
        resp = admin_pb2.DescribeTopicsResponse()
        names = list(request.topics)
        refused = self._access.refused_topics(Op.DESCRIBE, names)
        if not names:
            names = [n for n in sorted(snap.topics) if self._access.topic(Op.DESCRIBE, n, quiet=True)]
        for name in names:
            d = resp.topics.add(name=name)
            info = snap.topics.get(name)
            if name in refused:
                set_error(d, refused[name])
                continue
            if info is None:
                d.error_code = UnknownTopicOrPartitionError.errno  # type: ignore[assignment]
                d.error_message = f"topic {name!r} does not exist"
                continue
            d.partitions.extend(partition_metadata(snap, name))
            d.topic_id = info.topic_id or ""
            if self._access.topic(Op.DESCRIBE_CONFIGS, name, quiet=True):
                d.configs.update(info.config)
        return resp

    @blocking
    def DescribeLogDirs(self, request: admin_pb2.DescribeLogDirsRequest) -> admin_pb2.DescribeLogDirsResponse:
        if not self._access.cluster(Op.DESCRIBE):  # the response has a code, no message
            return admin_pb2.DescribeLogDirsResponse(
                broker_id=self._broker_id,
                error_code=ClusterAuthorizationFailedError.errno,  # type: ignore[arg-type]
            )
        return describe_log_dirs(self._broker_id, self._replicas, request)

    def _check_config_access(self, operation: Op, resource_type: int, name: str) -> None:
        """DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic, or on the Cluster for a broker."""
        if resource_type == ResourceType.BROKER:
            self._access.check_cluster(operation)
        elif resource_type == ResourceType.TOPIC:
            self._access.check_topic(operation, name)

    def _config_admin(self) -> ConfigAdmin:
        static = static_broker_configs(self._replicas.log_manager.default_config)
        return ConfigAdmin(self._zk, broker_id=self._broker_id, static_broker=static)

    @blocking
    def DescribeConfigs(self, request: config_pb2.DescribeConfigsRequest) -> config_pb2.DescribeConfigsResponse:
        configs, resp = self._config_admin(), config_pb2.DescribeConfigsResponse()
        for res in request.resources:
            result = resp.results.add(resource_type=res.resource_type, resource_name=res.resource_name)

            def describe(res: Any = res, result: Any = result) -> None:
                if res.resource_type not in set(ResourceType):
                    raise InvalidRequestError(f"Unsupported resource type {res.resource_type}")
                self._check_config_access(Op.DESCRIBE_CONFIGS, res.resource_type, res.resource_name)
                keys = list(res.configuration_keys)
                for e in configs.describe(ResourceType(res.resource_type), res.resource_name, keys):
                    entry = result.configs.add(
                        name=e.name, read_only=e.read_only, is_default=e.is_default, config_source=int(e.source)
                    )
                    if e.value is not None:
                        entry.value = e.value
                    for syn in e.synonyms if request.include_synonyms else ():
                        s = entry.synonyms.add(name=syn.name, source=int(syn.source))
                        if syn.value is not None:
                            s.value = syn.value

            _answer(result, describe)
        return resp

    @blocking
    def IncrementalAlterConfigs(
        self, request: config_pb2.IncrementalAlterConfigsRequest
    ) -> config_pb2.IncrementalAlterConfigsResponse:
        configs, resp = self._config_admin(), config_pb2.IncrementalAlterConfigsResponse()
        seen = Counter((r.resource_type, r.resource_name) for r in request.resources)
        for res in request.resources:
            result = resp.responses.add(resource_type=res.resource_type, resource_name=res.resource_name)

            def alter(res: Any = res) -> None:
                if seen[(res.resource_type, res.resource_name)] > 1:
                    raise InvalidRequestError("Duplicate resources in request are not allowed")
                if res.resource_type not in set(ResourceType):
                    raise InvalidRequestError(f"Unsupported resource type {res.resource_type}")
                self._check_config_access(Op.ALTER_CONFIGS, res.resource_type, res.resource_name)
                unknown = [c.name for c in res.configs if c.config_operation not in set(OpType)]
                if unknown:
                    raise InvalidRequestError(f"Unknown config operation for {unknown[0]}")
                ops = [
                    AlterOp(c.name, OpType(c.config_operation), c.value if c.HasField("value") else None)
                    for c in res.configs
                ]
                configs.incremental_alter(
                    ResourceType(res.resource_type), res.resource_name, ops, validate_only=request.validate_only
                )

            _answer(result, alter)
        return resp

    @blocking
    def CreatePartitions(self, request: admin_pb2.CreatePartitionsRequest) -> admin_pb2.CreatePartitionsResponse:
        resp = admin_pb2.CreatePartitionsResponse()
        timeout = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)

        def grow(name: str, i: int) -> None:
            count = request.topics[i].count
            assignments = [list(r.broker_ids) for r in request.topics[i].assignments]
            self._admin.create_partitions(name, count, validate_only=request.validate_only, assignments=assignments)
            if not request.validate_only:
                self._wait_for_leaders(name, count, timeout)

        names = [t.name for t in request.topics]
        self._topic_results(names, grow, resp.topics, self._access.refused_topics(Op.ALTER, names))
        return resp

    # --- producer ids --------------------------------------------------------------

    @blocking
    def InitProducerId(self, request: cluster_pb2.InitProducerIdRequest) -> cluster_pb2.InitProducerIdResponse:
        """An idempotent producer's id: IDEMPOTENT_WRITE on the Cluster or WRITE on any topic
        (Kafka's KIP-679 rule), else CLUSTER_AUTHORIZATION_FAILED. A transactional id is
        refused at once (no transactions yet): see :data:`TRANSACTIONS_REFUSED`."""
        if request.transactional_id:
            return cluster_pb2.InitProducerIdResponse(
                error_code=TRANSACTIONS_REFUSED,  # type: ignore[arg-type]
                error_message=NO_TRANSACTIONS,
                producer_id=-1,
                producer_epoch=-1,
            )
        try:
            if not self._access.cluster(Op.IDEMPOTENT_WRITE) and not self._access.any_of_type(
                Op.WRITE, AclResourceType.TOPIC
            ):
                raise self._access.cluster_error(Op.IDEMPOTENT_WRITE)
            pid, epoch = self._producer_ids.generate()
        except KafkaError as exc:
            err = as_response_error(exc)
            return cluster_pb2.InitProducerIdResponse(
                error_code=err.errno,  # type: ignore[arg-type]
                error_message=err.message,
                producer_id=-1,
                producer_epoch=-1,
            )
        return cluster_pb2.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)

    # --- cluster -------------------------------------------------------------------

    @blocking
    def ControlledShutdown(
        self, request: cluster_pb2.ControlledShutdownRequest
    ) -> cluster_pb2.ControlledShutdownResponse:
        resp = cluster_pb2.ControlledShutdownResponse()
        if self._refuse_cluster(resp, Op.CLUSTER_ACTION):
            return resp
        if not self._controller.is_active:
            err: BrokerResponseError = NotControllerError(f"broker {self._broker_id} is not the controller")
            set_error(resp, err)
            return resp
        try:
            remaining = self._controller.controlled_shutdown(request.broker_id, opt(request, "broker_epoch", -1))
        except Exception as exc:
            set_error(resp, as_response_error(exc))
            return resp
        for topic, p in remaining:
            resp.remaining.add(topic=topic, partition=p)
        return resp

    @blocking
    def LeaderAndIsr(self, request: cluster_pb2.LeaderAndIsrRequest) -> cluster_pb2.LeaderAndIsrResponse:
        """The controller's roles for this broker's replicas (controller channel)."""
        resp = cluster_pb2.LeaderAndIsrResponse()
        self._apply_controller_states(request, resp)
        return resp

    @blocking
    def UpdateMetadata(self, request: cluster_pb2.UpdateMetadataRequest) -> cluster_pb2.UpdateMetadataResponse:
        """The controller's partition states for this broker's metadata (controller channel)."""
        resp = cluster_pb2.UpdateMetadataResponse()
        self._apply_controller_states(request, resp)
        return resp

    def _apply_controller_states(self, request: Any, resp: Any) -> None:
        if self._refuse_cluster(resp, Op.CLUSTER_ACTION):
            return
        try:
            self._metadata.apply_controller_states(
                request.controller_id,
                request.controller_epoch,
                request.broker_epoch,
                [PartitionStateUpdate.from_proto(m) for m in request.partition_states],
            )
        except Exception as exc:
            set_error(resp, as_response_error(exc))

    @blocking
    def AlterPartitionReassignments(
        self, request: reassignment_pb2.AlterPartitionReassignmentsRequest
    ) -> reassignment_pb2.AlterPartitionReassignmentsResponse:
        """Start, replace or cancel (``replicas`` unset) moves; the controller only."""
        resp = reassignment_pb2.AlterPartitionReassignmentsResponse()
        if self._refuse_cluster(resp, Op.ALTER):
            return resp
        targets: dict[tuple[str, int], list[int] | None] = {}
        for t in request.topics:
            for p in t.partitions:
                if (t.name, p.partition_index) in targets:
                    set_error(resp, InvalidRequestError(f"{t.name}-{p.partition_index} appears more than once"))
                    return resp
                targets[(t.name, p.partition_index)] = list(p.replicas.broker_ids) if p.HasField("replicas") else None
        if not self._controller.is_active:
            set_error(resp, NotControllerError(f"broker {self._broker_id} is not the controller"))
            return resp
        timeout_s = opt(request, "timeout_ms", DEFAULT_REASSIGNMENT_TIMEOUT_MS) / 1000.0
        results = _answer(resp, lambda: self._controller.alter_partition_reassignments(targets, timeout_s))
        if results is None:
            return resp
        for t in request.topics:
            topic = resp.responses.add(name=t.name)
            for p in t.partitions:
                err = results.get((t.name, p.partition_index))
                code, message = _code(as_response_error(err) if err is not None else None)
                topic.partitions.add(
                    partition_index=p.partition_index,
                    error_code=code,  # type: ignore[arg-type]
                    error_message=message,
                )
        return resp

    @blocking
    def ListPartitionReassignments(
        self, request: reassignment_pb2.ListPartitionReassignmentsRequest
    ) -> reassignment_pb2.ListPartitionReassignmentsResponse:
        """Ongoing moves (of the named partitions, or all); the controller only."""
        resp = reassignment_pb2.ListPartitionReassignmentsResponse()
        if self._refuse_cluster(resp, Op.DESCRIBE):
            return resp
        if not self._controller.is_active:
            set_error(resp, NotControllerError(f"broker {self._broker_id} is not the controller"))
            return resp
        tps = [(t.name, p) for t in request.topics for p in t.partition_indexes] if request.topics else None
        timeout_s = opt(request, "timeout_ms", DEFAULT_REASSIGNMENT_TIMEOUT_MS) / 1000.0
        ongoing = _answer(resp, lambda: self._controller.list_partition_reassignments(tps, timeout_s))
        if ongoing is None:
            return resp
        topic: Any = None
        for (name, p), (replicas, adding, removing) in sorted(ongoing.items()):
            if topic is None or topic.name != name:
                topic = resp.topics.add(name=name)
            topic.partitions.add(
                partition_index=p, replicas=replicas, adding_replicas=adding, removing_replicas=removing
            )
        return resp

    @blocking
    def ElectLeaders(self, request: cluster_pb2.ElectLeadersRequest) -> cluster_pb2.ElectLeadersResponse:
        """ALTER on the Cluster; refused, every partition asked for (or, for all of them,
        one entry with no topic and partition -1) answers CLUSTER_AUTHORIZATION_FAILED."""
        wanted = [(r.topic, r.partition) for r in request.partitions]
        resp = cluster_pb2.ElectLeadersResponse()
        if not self._access.cluster(Op.ALTER):
            refusal = self._access.cluster_error(Op.ALTER)
            for t, p in wanted or [("", -1)]:
                set_error(resp.results.add(topic=t, partition=p), refusal)
            return resp
        snap = self._metadata.snapshot()
        unknown = [(t, p) for t, p in wanted if t not in snap.topics or p not in snap.topics[t].assignment]
        for t, p in unknown:
            resp.results.add(
                topic=t,
                partition=p,
                error_code=UnknownTopicOrPartitionError.errno,  # type: ignore[arg-type]
                error_message=f"{t}-{p} does not exist",
            )
        known = [tp for tp in wanted if tp not in unknown]
        if wanted and not known:
            return resp
        timeout_s = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS) / 1000.0
        deadline = time.monotonic() + timeout_s
        request_preferred_election(self._zk, known or None, timeout_s, join_pending=True)  # or wait for a pending one
        self._metadata.sync()
        snap = self._metadata.snapshot()
        targets = known or [(t, p) for t, info in sorted(snap.topics.items()) for p in sorted(info.assignment)]
        # The outcome as ZooKeeper has it (pipelined reads): this broker's own metadata
        # learns it from the controller's UpdateMetadata, a moment later.
        with mapped():  # ZooKeeper out of reach: a typed ZooKeeperError, as the request above
            states = self._zk.partition_states(targets)
        for t, p in targets:
            info = snap.topics.get(t)
            state = states.get((t, p))
            preferred = info.assignment[p][0] if info and info.assignment.get(p) else -1
            if state is not None and state.leader == preferred:
                resp.results.add(topic=t, partition=p)
            else:
                err = PreferredLeaderNotAvailableError(
                    f"{t}-{p}: preferred leader {preferred} is not alive and in sync"
                    if time.monotonic() < deadline
                    else f"{t}-{p}: election did not finish within {timeout_s:.0f}s"
                )
                resp.results.add(
                    topic=t,
                    partition=p,
                    error_code=err.errno,
                    error_message=err.message,  # type: ignore[arg-type]
                )
        return resp


def _topic_name_error(name: str) -> BrokerResponseError | None:
    try:
        validate_topic_name(name)
    except BrokerResponseError as exc:
        return exc
    return None


T = TypeVar("T")


def _answer(resp: Any, call: Callable[[], T]) -> T | None:
    """``call()``'s result, or None with its failure written into ``resp`` as an error code."""
    try:
        return call()
    except Exception as exc:
        set_error(resp, as_response_error(exc))
        return None
