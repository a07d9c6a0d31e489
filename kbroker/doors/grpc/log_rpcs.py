"""The log and metadata RPCs of the ``kbroker.v1.Broker`` servicer: protobuf in, one call
of the core (:class:`~kbroker.api.log_api.LogApi`,
:class:`~kbroker.api.metadata_api.MetadataApi`), protobuf out.

A request malformed as a whole fails with gRPC status INVALID_ARGUMENT (the Kafka code in
the ``kbroker-error-code`` trailing metadata) and changes nothing; per-partition problems
travel as error codes inside the response. Unset ``optional`` fields take the defaults
the .proto documents (Kafka's).

Thread safety: handlers run on the server's loop; blocking ones on its request pool.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import grpc

from kbroker.api.log_api import (
    CONSUMER,
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    EpochQuery,
    Fetch,
    FetchAnswer,
    FetchResult,
    FetchSpec,
    IsolationLevel,
    LogApi,
    OffsetQuery,
    TxnMarker,
)
from kbroker.api.metadata_api import ClusterMetadata, MetadataApi, PartitionMetadata
from kbroker.doors.grpc.rpc import abort, opt, set_error
from kclient.errors import BrokerResponseError, CoordinatorNotAvailableError, InvalidRequestError, as_response_error
from kclient.proto.kbroker.v1 import cluster_pb2, log_pb2, metadata_pb2, txn_pb2

DEFAULT_ACKS = -1
DEFAULT_REQUEST_TIMEOUT_MS = 30000
DEFAULT_FETCH_MAX_WAIT_MS = 500
DEFAULT_FETCH_MIN_BYTES = 1
DEFAULT_FETCH_MAX_BYTES = 52428800
DEFAULT_PARTITION_MAX_BYTES = 1048576
DEFAULT_TRANSACTION_TIMEOUT_MS = 60000


WRITE_TXN_MARKERS_TIMEOUT_MS = 30000
"""How long a WriteTxnMarkers waits for the ISR (Kafka's request.timeout.ms of the
coordinator's marker channel); the coordinator retries what timed out."""


def _code(err: BrokerResponseError | None) -> tuple[int, str]:
    return (0, "") if err is None else (err.errno, err.message)


def isolation_level(request: Any) -> IsolationLevel:
    """A request's ``optional IsolationLevel isolation_level``: unset = READ_UNCOMMITTED;
    a value outside the enum raises INVALID_REQUEST."""
    value = opt(request, "isolation_level", IsolationLevel.READ_UNCOMMITTED)
    try:
        return IsolationLevel(value)
    except ValueError:
        raise InvalidRequestError(f"isolation_level must be 0 or 1, got {value}") from None


def partitions_pb(partitions: Iterable[PartitionMetadata]) -> list[metadata_pb2.PartitionMetadata]:
    return [
        metadata_pb2.PartitionMetadata(
            error_code=p.error.errno if p.error else 0,  # type: ignore[arg-type]
            index=p.partition,
            leader_id=p.leader,
            leader_epoch=p.leader_epoch,
            replica_nodes=p.replicas,
            isr_nodes=p.isr,
            offline_replicas=p.offline_replicas,
        )
        for p in partitions
    ]


def metadata_response(m: ClusterMetadata) -> metadata_pb2.MetadataResponse:
    resp = metadata_pb2.MetadataResponse(cluster_id=m.cluster_id, controller_id=m.controller_id)
    for b in m.brokers:
        resp.brokers.add(node_id=b.node_id, host=b.host, port=b.port, rack=b.rack or "")
    for t in m.topics:
        tm = resp.topics.add(name=t.name)
        if t.error is not None:
            set_error(tm, t.error)
            continue
        tm.topic_id = t.topic_id
        tm.partitions.extend(partitions_pb(t.partitions))
    return resp


class LogRpcs:
    """Mixin of the servicer: needs ``self.log_api``, ``self.metadata_api`` and
    ``self._offload``."""

    log_api: LogApi
    metadata_api: MetadataApi
    _offload: Any
    _broker_id: int

    async def Produce(
        self, request: log_pb2.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.ProduceResponse:
        wanted = [((t.name, p.index), p.records) for t in request.topics for p in t.partitions]
        # Named only when set: a plain or idempotent producer's call is unchanged.
        txn = {"transactional_id": request.transactional_id} if request.transactional_id else {}
        try:
            results = await self.log_api.produce(
                opt(request, "acks", DEFAULT_ACKS),
                opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS),
                wanted,
                **txn,
            )
        except BrokerResponseError as exc:
            await abort(context, exc)
        resp = log_pb2.ProduceResponse()
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                r = results[(t.name, p.index)]
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

    async def Fetch(self, request: log_pb2.FetchRequest, context: grpc.aio.ServicerContext) -> log_pb2.FetchResponse:
        specs = [
            FetchSpec(
                t.name,
                p.index,
                p.fetch_offset,
                opt(p, "partition_max_bytes", DEFAULT_PARTITION_MAX_BYTES),
                opt(p, "current_leader_epoch", -1),
                opt(p, "log_start_offset", -1),
            )
            for t in request.topics
            for p in t.partitions
        ]
        try:
            isolation = isolation_level(request)
        except BrokerResponseError as exc:
            await abort(context, exc)
        fetch = Fetch(
            specs,
            opt(request, "replica_id", CONSUMER),
            opt(request, "max_wait_ms", DEFAULT_FETCH_MAX_WAIT_MS),
            opt(request, "min_bytes", DEFAULT_FETCH_MIN_BYTES),
            opt(request, "max_bytes", DEFAULT_FETCH_MAX_BYTES),
            opt(request, "session_id", INVALID_SESSION_ID),
            opt(request, "session_epoch", FINAL_EPOCH),
            [(t.name, p) for t in request.forgotten_topics_data for p in t.partitions],
            isolation,
        )
        try:
            answer = await self.log_api.fetch(fetch)
        except BrokerResponseError as exc:
            await abort(context, exc)
        return fetch_response(answer)

    async def ListOffsets(
        self, request: log_pb2.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.ListOffsetsResponse:
        try:
            isolation = isolation_level(request)
        except BrokerResponseError as exc:
            await abort(context, exc)
        queries = [
            OffsetQuery(t.name, p.index, opt(p, "timestamp", -1), opt(p, "current_leader_epoch", -1), isolation)
            for t in request.topics
            for p in t.partitions
        ]
        try:
            found = iter(await self._offload(self.log_api.list_offsets, opt(request, "replica_id", CONSUMER), queries))
        except BrokerResponseError as exc:
            await abort(context, exc)
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
        queries = [
            EpochQuery(t.name, p.index, p.leader_epoch, opt(p, "current_leader_epoch", -1))
            for t in request.topics
            for p in t.partitions
        ]
        found = iter(self.log_api.offset_for_leader_epoch(opt(request, "replica_id", CONSUMER), queries))
        resp = log_pb2.OffsetForLeaderEpochResponse()
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                r = next(found)
                pr = tr.partitions.add(index=p.index, leader_epoch=r.leader_epoch, end_offset=r.end_offset)
                if r.error is not None:
                    set_error(pr, r.error)
        return resp

    async def DeleteRecords(
        self, request: log_pb2.DeleteRecordsRequest, context: grpc.aio.ServicerContext
    ) -> log_pb2.DeleteRecordsResponse:
        offsets = [((t.name, p.index), p.offset) for t in request.topics for p in t.partitions]
        try:
            results = await self.log_api.delete_records(opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS), offsets)
        except BrokerResponseError as exc:
            await abort(context, exc)
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

    async def WriteTxnMarkers(
        self, request: txn_pb2.WriteTxnMarkersRequest, context: grpc.aio.ServicerContext
    ) -> txn_pb2.WriteTxnMarkersResponse:
        """From a transaction coordinator (inter-broker): each marker on its partitions."""
        markers = [
            (
                TxnMarker(m.producer_id, m.producer_epoch, m.committed, m.coordinator_epoch),
                [(t.name, p) for t in m.topics for p in t.partitions],
            )
            for m in request.markers
        ]
        resp = txn_pb2.WriteTxnMarkersResponse()
        try:
            answers = await self.log_api.write_txn_markers(markers, WRITE_TXN_MARKERS_TIMEOUT_MS)
        except BrokerResponseError as exc:
            set_error(resp, exc)
            return resp
        for m, answer in zip(request.markers, answers, strict=True):
            mr = resp.markers.add(producer_id=m.producer_id)
            for t in m.topics:
                tr = mr.topics.add(name=t.name)
                for p in t.partitions:
                    code, msg = _code(answer.get((t.name, p)))
                    tr.partitions.add(index=p, error_code=code, error_message=msg)  # type: ignore[arg-type]
        return resp

    async def Metadata(
        self, request: metadata_pb2.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> metadata_pb2.MetadataResponse:
        if self.metadata_api.is_stale():
            if self.metadata_api.loaded():
                why = "is cut off from ZooKeeper; its metadata is stale"
            else:
                why = "has not read the cluster's metadata yet"
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"broker {self._broker_id} {why}: ask another broker")
        return metadata_response(await self._offload(self.metadata_api.metadata, list(request.topics)))

    async def InitProducerId(
        self, request: cluster_pb2.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> cluster_pb2.InitProducerIdResponse:
        try:
            if request.transactional_id:
                pid, epoch = await self._offload(self._init_transactional_producer, request)
            else:
                pid, epoch = await self._offload(self.log_api.init_producer_id, None)
        except Exception as exc:
            err = as_response_error(exc)
            return cluster_pb2.InitProducerIdResponse(
                error_code=err.errno,  # type: ignore[arg-type]
                error_message=err.message,
                producer_id=-1,
                producer_epoch=-1,
            )
        return cluster_pb2.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)

    def _init_transactional_producer(self, request: cluster_pb2.InitProducerIdRequest) -> tuple[int, int]:
        """The transaction coordinator's InitProducerId (KIP-98; KIP-360 when the caller
        names the producer id and epoch it holds)."""
        txn = getattr(self, "txn_api", None)
        if txn is None:
            raise CoordinatorNotAvailableError("this broker does not serve transactions")
        timeout_ms = opt(request, "transaction_timeout_ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
        return txn.init_producer_id(  # type: ignore[no-any-return]
            request.transactional_id,
            timeout_ms,
            opt(request, "producer_id", -1),
            opt(request, "producer_epoch", -1),
        )


def fetch_response(answer: FetchAnswer) -> log_pb2.FetchResponse:
    if answer.error is not None:
        code, msg = _code(answer.error)
        return log_pb2.FetchResponse(error_code=code, error_message=msg)  # type: ignore[arg-type]
    resp = log_pb2.FetchResponse()
    if answer.session_id != INVALID_SESSION_ID:
        resp.session_id = answer.session_id
    _fill_fetch(resp, answer.partitions)
    return resp


def _fill_fetch(resp: log_pb2.FetchResponse, entries: Iterable[tuple[FetchSpec, FetchResult]]) -> None:
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
            lso = r.read.last_stable_offset
            pr.last_stable_offset = r.read.high_watermark if lso < 0 else lso
            for a in r.read.aborted_transactions or ():
                pr.aborted_transactions.add(producer_id=a.producer_id, first_offset=a.first_offset)
        else:
            pr.high_watermark = pr.log_start_offset = pr.log_end_offset = pr.last_stable_offset = -1
