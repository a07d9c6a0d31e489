"""Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, Metadata, InitProducerId and
DescribeCluster on the Kafka door: Kafka's request -> the servicer's protobuf request ->
the same handler as gRPC -> Kafka's response. Record batches pass through untouched
(both doors carry Kafka's RecordBatch v2 bytes).

Versions: Produce 0-9 (v0-2 carry message sets of magic 0/1, up-converted to a v2
RecordBatch per partition by :mod:`~kbroker.doors.kafka.legacy_produce`, as Kafka 2.8 does;
a set that cannot be converted fails its partition only, with CORRUPT_MESSAGE or
INVALID_RECORD; v10+ gets UNSUPPORTED_VERSION on each partition in its own schema) and
Fetch 4-12 (RecordBatch v2 only; topic ids from Fetch 13 on are not served),
ListOffsets 1-6 (v7 exists for MAX_TIMESTAMP, KIP-734, not served),
OffsetForLeaderEpoch 2-4 (kio has no schema for 0-1), Metadata 0-12,
InitProducerId 0-4, DescribeCluster 0. Fetch v7+ carries fetch sessions (KIP-227): the
session id, epoch and forgotten partitions go to the same session cache as gRPC's (one
cache, ``max.incremental.fetch.session.cache.slots``), so an idle incremental fetch names
no partitions; v4-6 fetch without a session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kbroker.doors.grpc.servicer import BrokerService
from kbroker.doors.kafka.codec import build, millis, response_class, topic_uuid
from kbroker.doors.kafka.legacy_produce import upconvert
from kbroker.doors.kafka.server import Api, CloseConnection, KafkaRequest
from kbroker.doors.kafka.service_call import RequestRefused
from kclient.errors import KafkaError
from kclient.proto.kbroker.v1 import cluster_pb2, log_pb2

PRODUCE, FETCH, LIST_OFFSETS, METADATA, OFFSET_FOR_LEADER_EPOCH = 0, 1, 2, 3, 23
INIT_PRODUCER_ID, DESCRIBE_CLUSTER = 22, 60


class LogApis:
    """The log and metadata APIs over one :class:`BrokerService`."""

    def __init__(self, service: BrokerService) -> None:
        self._service = service

    def apis(self) -> list[Api]:
        return [
            Api(PRODUCE, "Produce", 0, 9, self.produce, refuse=self.refuse_produce),
            Api(FETCH, "Fetch", 4, 12, self.fetch),
            Api(LIST_OFFSETS, "ListOffsets", 1, 6, self.list_offsets),  # v7 means MAX_TIMESTAMP (-3)
            Api(METADATA, "Metadata", 0, 12, self.metadata),
            Api(INIT_PRODUCER_ID, "InitProducerId", 0, 4, self.init_producer_id),
            Api(OFFSET_FOR_LEADER_EPOCH, "OffsetForLeaderEpoch", 2, 4, self.offset_for_leader_epoch),
            Api(DESCRIBE_CLUSTER, "DescribeCluster", 0, 0, self.describe_cluster),
        ]

    # --- Produce --------------------------------------------------------------------

    async def produce(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = log_pb2.ProduceRequest(acks=int(p.acks), timeout_ms=millis(p.timeout))
        # Produce v0-2: message sets of magic 0/1, up-converted here; a partition whose set
        # cannot be converted is answered with its error and not produced.
        unconverted = log_pb2.ProduceResponse()
        for t in p.topic_data:
            pt = proto.topics.add(name=t.name)
            failed: log_pb2.ProduceTopicResponse | None = None
            for part in t.partition_data:
                records = bytes(part.records or b"")
                if req.version < 3:
                    try:
                        # off the loop: opening a compressed wrapper can take a while
                        records = await self._service._offload(upconvert, records)
                    except KafkaError as exc:
                        if failed is None:
                            failed = unconverted.topics.add(name=t.name)
                        failed.partitions.add(
                            index=int(part.index),
                            error_code=getattr(exc, "errno", 87),
                            error_message=exc.message,
                            base_offset=-1,
                            log_append_time_ms=-1,
                            log_start_offset=-1,
                        )
                        continue
                pt.partitions.add(index=int(part.index), records=records)
        if unconverted.topics:
            kept = [t for t in proto.topics if t.partitions]
            del proto.topics[:]
            proto.topics.extend(kept)
        try:
            if not proto.topics:
                resp = log_pb2.ProduceResponse()
            else:
                resp = await self._service.Produce(proto, req.service_context())  # type: ignore[arg-type]
        except RequestRefused as exc:
            if p.acks == 0:
                raise CloseConnection() from exc  # as Kafka: the client refreshes its metadata
            return self._produce_response(req, proto, exc, unconverted)
        _merge(resp, unconverted)
        if p.acks == 0:
            # Kafka sends nothing back for acks=0, and closes the connection when a
            # partition failed (not the leader any more, ...) so that the client refreshes
            # its metadata instead of sending on into the void.
            if any(r.error_code for t in resp.topics for r in t.partitions):
                raise CloseConnection()
            return None
        return self._produce_answer(req, resp)

    def refuse_produce(self, req: KafkaRequest, errno: int) -> Any:
        """``errno`` on every partition of a Produce of a version not served (v10+), in
        that version's schema; acks=0 closes the connection (no answer is awaited)."""
        p = req.payload
        if int(p.acks) == 0:
            raise CloseConnection()
        refused = log_pb2.ProduceResponse()
        for t in p.topic_data:
            tr = refused.topics.add(name=t.name)
            for part in t.partition_data:
                tr.partitions.add(
                    index=int(part.index), error_code=errno, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1
                )
        return self._produce_answer(req, refused)

    @staticmethod
    def _produce_answer(req: KafkaRequest, resp: log_pb2.ProduceResponse) -> Any:
        return build(
            response_class(PRODUCE, req.version),
            {
                "responses": [
                    {
                        "name": t.name,
                        "partition_responses": [
                            {
                                "index": r.index,
                                "error_code": r.error_code,
                                "error_message": r.error_message or None,
                                "base_offset": r.base_offset,
                                "log_append_time": r.log_append_time_ms,
                                "log_start_offset": r.log_start_offset,
                                "record_errors": [  # v8+ (KIP-467)
                                    {"batch_index": e.batch_index, "batch_index_error_message": e.message or None}
                                    for e in r.record_errors
                                ],
                            }
                            for r in t.partitions
                        ],
                    }
                    for t in resp.topics
                ],
            },
        )

    def _produce_response(
        self,
        req: KafkaRequest,
        proto: log_pb2.ProduceRequest,
        exc: RequestRefused,
        unconverted: log_pb2.ProduceResponse,
    ) -> Any:
        both = log_pb2.ProduceResponse()
        for t in proto.topics:
            tr = both.topics.add(name=t.name)
            for part in t.partitions:
                tr.partitions.add(
                    index=part.index,
                    error_code=exc.errno,
                    error_message=exc.message,
                    base_offset=-1,
                    log_append_time_ms=-1,
                    log_start_offset=-1,
                )
        _merge(both, unconverted)
        return self._produce_answer(req, both)

    # --- Fetch ----------------------------------------------------------------------

    async def fetch(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(FETCH, req.version)
        proto = log_pb2.FetchRequest(
            replica_id=int(p.replica_id),
            max_wait_ms=millis(p.max_wait),
            min_bytes=int(p.min_bytes),
            max_bytes=int(getattr(p, "max_bytes", 0x7FFFFFFF)),
        )
        if req.version >= 7:  # v4-6 have no session fields: a sessionless fetch
            proto.session_id = int(p.session_id)
            proto.session_epoch = int(p.session_epoch)
            for t in p.forgotten_topics_data:
                proto.forgotten_topics_data.add(name=t.topic, partitions=[int(x) for x in t.partitions])
        for t in p.topics:
            ft = proto.topics.add(name=t.topic)
            for part in t.partitions:
                ft.partitions.add(
                    index=int(part.partition),
                    fetch_offset=int(part.fetch_offset),
                    partition_max_bytes=int(part.partition_max_bytes),
                    current_leader_epoch=int(getattr(part, "current_leader_epoch", -1)),
                )
        try:
            resp = await self._service.Fetch(proto, req.service_context())  # type: ignore[arg-type]
        except RequestRefused as exc:
            # The code at the top (v7+) and on every partition (v4-6 have no top-level one).
            refused = [
                {"topic": t.name, "partitions": [{"partition_index": x.index, "error_code": exc.errno,
                                                  "high_watermark": -1} for x in t.partitions]}
                for t in proto.topics
            ]  # fmt: skip
            return build(cls, {"error_code": exc.errno, "session_id": 0, "responses": refused})
        if resp.error_code:  # the session's own error (unknown session, wrong epoch): no partitions
            return build(cls, {"error_code": int(resp.error_code), "session_id": 0})
        return build(
            cls,
            {
                "error_code": 0,
                "session_id": int(resp.session_id),
                "responses": [
                    {
                        "topic": t.name,
                        "partitions": [
                            {
                                "partition_index": r.index,
                                "error_code": r.error_code,
                                "high_watermark": r.high_watermark,
                                "last_stable_offset": r.high_watermark,  # no transactions
                                "log_start_offset": r.log_start_offset,
                                "preferred_read_replica": -1,
                                "records": r.records,
                            }
                            for r in t.partitions
                        ],
                    }
                    for t in resp.topics
                ],
            },
        )

    # --- offsets ----------------------------------------------------------------------

    async def list_offsets(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = log_pb2.ListOffsetsRequest(replica_id=int(p.replica_id))
        for t in p.topics:
            lt = proto.topics.add(name=t.name)
            for part in t.partitions:
                lt.partitions.add(
                    index=int(part.partition_index),
                    timestamp=int(part.timestamp),
                    current_leader_epoch=int(getattr(part, "current_leader_epoch", -1)),
                )
        cls = response_class(LIST_OFFSETS, req.version)
        try:
            resp = await self._service.ListOffsets(proto, req.service_context())  # type: ignore[arg-type]
        except RequestRefused as exc:
            errno = exc.errno
            return build(cls, _per_partition(proto.topics, lambda i: {"partition_index": i, "error_code": errno}))
        return build(
            cls,
            {
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            {
                                "partition_index": r.index,
                                "error_code": r.error_code,
                                "timestamp": r.timestamp,
                                "offset": r.offset,
                                "leader_epoch": r.leader_epoch,
                            }
                            for r in t.partitions
                        ],
                    }
                    for t in resp.topics
                ]
            },
        )

    async def offset_for_leader_epoch(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = log_pb2.OffsetForLeaderEpochRequest(replica_id=int(getattr(p, "replica_id", -1)))
        if proto.replica_id == -2:  # Kafka's "a debugging consumer" default
            proto.replica_id = -1
        for t in p.topics:
            ot = proto.topics.add(name=t.topic)
            for part in t.partitions:
                ot.partitions.add(
                    index=int(part.partition),
                    current_leader_epoch=int(getattr(part, "current_leader_epoch", -1)),
                    leader_epoch=int(part.leader_epoch),
                )
        resp = await self._service.OffsetForLeaderEpoch(proto, req.service_context())  # type: ignore[arg-type]
        return build(
            response_class(OFFSET_FOR_LEADER_EPOCH, req.version),
            {
                "topics": [
                    {
                        "topic": t.name,
                        "partitions": [
                            {
                                "partition": r.index,
                                "error_code": r.error_code,
                                "leader_epoch": r.leader_epoch,
                                "end_offset": r.end_offset,
                            }
                            for r in t.partitions
                        ],
                    }
                    for t in resp.topics
                ]
            },
        )

    # --- metadata -----------------------------------------------------------------------

    async def metadata(self, req: KafkaRequest) -> Any:
        p = req.payload
        service = self._service
        if service.metadata_is_stale():
            raise CloseConnection()  # as gRPC's UNAVAILABLE: the client asks another broker
        wanted = None if p.topics is None else [t.name for t in p.topics if t.name is not None]
        if req.version == 0 and wanted == []:
            wanted = None  # v0: an empty list means every topic
        allow = bool(getattr(p, "allow_auto_topic_creation", True))
        if wanted is None:
            names: list[str] | None = []
        elif not wanted:
            names = None  # v1+: an empty list asks for no topic (brokers only)
        else:
            names = wanted
        resp = await service._offload(service.metadata_of, names, allow)
        return build(
            response_class(METADATA, req.version),
            {
                "brokers": [
                    {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack or None} for b in resp.brokers
                ],
                "cluster_id": resp.cluster_id,
                "controller_id": resp.controller_id,
                "topics": [
                    {
                        "error_code": t.error_code,
                        "name": t.name,
                        "topic_id": topic_uuid(t.topic_id),
                        "is_internal": False,
                        "partitions": [
                            {
                                "error_code": m.error_code,
                                "partition_index": m.index,
                                "leader_id": m.leader_id,
                                "leader_epoch": m.leader_epoch,
                                "replica_nodes": list(m.replica_nodes),
                                "isr_nodes": list(m.isr_nodes),
                                "offline_replicas": list(m.offline_replicas),
                            }
                            for m in t.partitions
                        ],
                    }
                    for t in resp.topics
                ],
            },
        )

    async def describe_cluster(self, req: KafkaRequest) -> Any:
        service = self._service
        resp = await service._offload(service.metadata_of, None)
        return build(
            response_class(DESCRIBE_CLUSTER, req.version),
            {
                "error_code": 0,
                "cluster_id": resp.cluster_id,
                "controller_id": resp.controller_id,
                "brokers": [
                    {"broker_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack or None}
                    for b in resp.brokers
                ],
            },
        )

    # --- producer ids ---------------------------------------------------------------------

    async def init_producer_id(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = cluster_pb2.InitProducerIdRequest(
            transactional_id=p.transactional_id or "", transaction_timeout_ms=millis(p.transaction_timeout)
        )
        resp = await self._service.InitProducerId(proto, req.service_context())  # type: ignore[arg-type]
        return build(
            response_class(INIT_PRODUCER_ID, req.version),
            {"error_code": resp.error_code, "producer_id": resp.producer_id, "producer_epoch": resp.producer_epoch},
        )


def _merge(resp: log_pb2.ProduceResponse, more: log_pb2.ProduceResponse) -> None:
    """Add the partitions of ``more`` to ``resp``, under the same topic entry when there is
    one (a topic is answered once)."""
    topics = {t.name: t for t in resp.topics}
    for t in more.topics:
        into = topics.get(t.name)
        if into is None:
            into = topics[t.name] = resp.topics.add(name=t.name)
        into.partitions.extend(t.partitions)


def _per_partition(topics: Any, partition: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    return {"topics": [{"name": t.name, "partitions": [partition(p.index) for p in t.partitions]} for t in topics]}
