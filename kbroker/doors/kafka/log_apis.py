"""Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, Metadata and DescribeCluster on
the Kafka door: Kafka's request -> one call of the core
(:mod:`kbroker.api.log_api`, :mod:`kbroker.api.metadata_api`) -> Kafka's response. Record batches pass through untouched
(both doors carry Kafka's RecordBatch v2 bytes).

Versions: Produce 0-9 (v0-2 carry message sets of magic 0/1, up-converted to a v2
RecordBatch per partition by :mod:`~kbroker.doors.kafka.legacy_produce`, as Kafka 2.8
does; a set that cannot be converted fails its partition only, with CORRUPT_MESSAGE or
INVALID_RECORD; v10+ gets UNSUPPORTED_VERSION on each partition in its own schema) and
Fetch 4-12 (RecordBatch v2 only; topic ids from Fetch 13 on are not served), ListOffsets
1-6 (v7 exists for MAX_TIMESTAMP, KIP-734, not served), OffsetForLeaderEpoch 2-4 (kio
has no schema for 0-1), Metadata 0-12, DescribeCluster 0 (InitProducerId is
:mod:`~kbroker.doors.kafka.txn_apis`'). Fetch v7+ carries fetch sessions (KIP-227): the
session id, epoch and forgotten partitions go to the same session cache as gRPC's (one
cache, ``max.incremental.fetch.session.cache.slots``), so an idle incremental fetch
names no partitions; v4-6 fetch without a session.

Transactions (KIP-98): Produce v3+ passes its ``transactional_id`` to the core (WRITE on
it is checked there); Fetch passes its ``isolation_level`` and answers each partition's
last stable offset (the high watermark when the log does not know one) and, for a
read_committed fetch, its aborted transactions (null otherwise); ListOffsets v2+ passes
its ``isolation_level`` (read_committed: "latest" is the last stable offset).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kbroker.api.apis import BrokerApis
from kbroker.api.log_api import (
    AbortedTransaction,
    EpochEnd,
    EpochQuery,
    Fetch,
    FetchSpec,
    IsolationLevel,
    OffsetQuery,
    OffsetResult,
    ProduceResult,
    TopicPartition,
)
from kbroker.doors.kafka.codec import MalformedRequest, build, millis, response_class, topic_uuid
from kbroker.doors.kafka.legacy_produce import upconvert
from kbroker.doors.kafka.server import Api, CloseConnection, KafkaRequest
from kclient.errors import BrokerResponseError, InvalidRecordError, KafkaError, for_code

PRODUCE, FETCH, LIST_OFFSETS, METADATA, OFFSET_FOR_LEADER_EPOCH = 0, 1, 2, 3, 23
DESCRIBE_CLUSTER = 60


def isolation_level(value: object) -> IsolationLevel:
    """A request's isolation_level byte; any value but 0 and 1 cannot be read (Kafka's
    IsolationLevel.forId fails the request: the connection is closed)."""
    try:
        return IsolationLevel(int(value))  # type: ignore[call-overload]
    except ValueError:
        raise MalformedRequest(
            f"isolation_level {value} is neither 0 (read_uncommitted) nor 1 (read_committed)"
        ) from None


class LogApis:
    """The log and metadata APIs over the core's :class:`BrokerApis`."""

    def __init__(self, core: BrokerApis) -> None:
        self._log = core.log
        self._metadata = core.metadata
        self._offload = core.offload

    def apis(self) -> list[Api]:
        return [
            Api(PRODUCE, "Produce", 0, 9, self.produce, refuse=self.refuse_produce),
            Api(FETCH, "Fetch", 4, 12, self.fetch),
            Api(LIST_OFFSETS, "ListOffsets", 1, 6, self.list_offsets),  # v7 means MAX_TIMESTAMP (-3)
            Api(METADATA, "Metadata", 0, 12, self.metadata),
            Api(OFFSET_FOR_LEADER_EPOCH, "OffsetForLeaderEpoch", 2, 4, self.offset_for_leader_epoch),
            Api(DESCRIBE_CLUSTER, "DescribeCluster", 0, 0, self.describe_cluster),
        ]

    # --- Produce --------------------------------------------------------------------

    async def produce(self, req: KafkaRequest) -> Any:
        p = req.payload
        # Produce v0-2: message sets of magic 0/1, up-converted here; a partition whose set
        # cannot be converted is answered with its error and not produced.
        wanted: list[tuple[TopicPartition, bytes]] = []
        unconverted: dict[TopicPartition, ProduceResult] = {}
        for t in p.topic_data:
            for part in t.partition_data:
                tp = (t.name, int(part.index))
                records = bytes(part.records or b"")
                if req.version < 3:
                    try:
                        # off the loop: opening a compressed wrapper can take a while
                        records = await self._offload(upconvert, records)
                    except KafkaError as exc:
                        err = exc if isinstance(exc, BrokerResponseError) else InvalidRecordError(exc.message)
                        unconverted[tp] = ProduceResult(err)
                        continue
                wanted.append((tp, records))
        try:
            results = (
                await self._log.produce(
                    int(p.acks), millis(p.timeout), wanted, transactional_id=getattr(p, "transactional_id", None)
                )
                if wanted
                else {}
            )
        except BrokerResponseError as exc:
            if p.acks == 0:
                raise CloseConnection() from exc  # as Kafka: the client refreshes its metadata
            results = {tp: ProduceResult(exc) for tp, _ in wanted}
        results.update(unconverted)
        if p.acks == 0:
            # Kafka sends nothing back for acks=0, and closes the connection when a
            # partition failed (not the leader any more, ...) so that the client refreshes
            # its metadata instead of sending on into the void.
            if any(r.error is not None for r in results.values()):
                raise CloseConnection()
            return None
        return self._produce_answer(req, results)

    def refuse_produce(self, req: KafkaRequest, errno: int) -> Any:
        """``errno`` on every partition of a Produce of a version not served (v10+), in
        that version's schema; acks=0 closes the connection (no answer is awaited)."""
        p = req.payload
        if int(p.acks) == 0:
            raise CloseConnection()
        err = for_code(errno)()
        refused = {(t.name, int(part.index)): ProduceResult(err) for t in p.topic_data for part in t.partition_data}
        return self._produce_answer(req, refused, messages=False)

    @staticmethod
    def _produce_answer(
        req: KafkaRequest, results: dict[TopicPartition, ProduceResult], *, messages: bool = True
    ) -> Any:
        """The answer in the request's order, each topic once."""
        topics: dict[str, list[dict[str, Any]]] = {}
        for t in req.payload.topic_data:
            answered = topics.setdefault(t.name, [])
            for part in t.partition_data:
                r = results[(t.name, int(part.index))]
                answered.append(
                    {
                        "index": int(part.index),
                        "error_code": r.error.errno if r.error else 0,
                        "error_message": r.error.message if r.error and messages else None,
                        "base_offset": r.base_offset,
                        "log_append_time": r.log_append_time,
                        "log_start_offset": r.log_start_offset,
                        "record_errors": [  # v8+ (KIP-467)
                            {"batch_index": i, "batch_index_error_message": m or None}
                            for i, m in getattr(r.error, "record_errors", ())
                        ],
                    }
                )
        return build(
            response_class(PRODUCE, req.version),
            {"responses": [{"name": name, "partition_responses": parts} for name, parts in topics.items()]},
        )

    # --- Fetch ----------------------------------------------------------------------

    async def fetch(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(FETCH, req.version)
        specs = [
            FetchSpec(
                t.topic,
                int(part.partition),
                int(part.fetch_offset),
                int(part.partition_max_bytes),
                int(getattr(part, "current_leader_epoch", -1)),
            )
            for t in p.topics
            for part in t.partitions
        ]
        fetch = Fetch(
            specs,
            int(p.replica_id),
            millis(p.max_wait),
            int(p.min_bytes),
            int(getattr(p, "max_bytes", 0x7FFFFFFF)),
            isolation_level=isolation_level(p.isolation_level),
        )
        if req.version >= 7:  # v4-6 have no session fields: a sessionless fetch
            forgotten = [(t.topic, int(x)) for t in p.forgotten_topics_data for x in t.partitions]
            fetch = replace(
                fetch, session_id=int(p.session_id), session_epoch=int(p.session_epoch), forgotten=forgotten
            )
        try:
            answer = await self._log.fetch(fetch)
        except BrokerResponseError as exc:
            # The code at the top (v7+) and on every partition (v4-6 have no top-level one).
            refused: dict[str, list[dict[str, Any]]] = {}
            for s in specs:
                refused.setdefault(s.topic, []).append(
                    {"partition_index": s.partition, "error_code": exc.errno, "high_watermark": -1}
                )
            responses = [{"topic": t, "partitions": parts} for t, parts in refused.items()]
            return build(cls, {"error_code": exc.errno, "session_id": 0, "responses": responses})
        if answer.error is not None:  # the session's own error (unknown session, wrong epoch): no partitions
            return build(cls, {"error_code": answer.error.errno, "session_id": 0})
        topics: dict[str, list[dict[str, Any]]] = {}
        for spec, r in answer.partitions:
            read = r.read
            topics.setdefault(spec.topic, []).append(
                {
                    "partition_index": spec.partition,
                    "error_code": r.error.errno if r.error else 0,
                    "high_watermark": read.high_watermark if read else -1,
                    "last_stable_offset": _last_stable(read.last_stable_offset, read.high_watermark) if read else -1,
                    "aborted_transactions": _aborted(read.aborted_transactions) if read else None,
                    "log_start_offset": read.log_start_offset if read else -1,
                    "preferred_read_replica": -1,
                    "records": read.records if read else b"",
                }
            )
        return build(
            cls,
            {
                "error_code": 0,
                "session_id": answer.session_id,
                "responses": [{"topic": t, "partitions": parts} for t, parts in topics.items()],
            },
        )

    # --- offsets ----------------------------------------------------------------------

    async def list_offsets(self, req: KafkaRequest) -> Any:
        p = req.payload
        level = isolation_level(getattr(p, "isolation_level", 0))  # v2+
        queries = [
            OffsetQuery(
                t.name,
                int(part.partition_index),
                int(part.timestamp),
                int(getattr(part, "current_leader_epoch", -1)),
                isolation_level=level,
            )
            for t in p.topics
            for part in t.partitions
        ]
        try:
            found = await self._offload(self._log.list_offsets, int(p.replica_id), queries)
        except BrokerResponseError as exc:
            found = [OffsetResult(exc) for _ in queries]
        answers = iter(found)
        return build(
            response_class(LIST_OFFSETS, req.version),
            {
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [_offset(int(part.partition_index), next(answers)) for part in t.partitions],
                    }
                    for t in p.topics
                ]
            },
        )

    async def offset_for_leader_epoch(self, req: KafkaRequest) -> Any:
        p = req.payload
        replica_id = int(getattr(p, "replica_id", -1))
        if replica_id == -2:  # Kafka's "a debugging consumer" default
            replica_id = -1
        queries = [
            EpochQuery(
                t.topic,
                int(part.partition),
                int(part.leader_epoch),
                int(getattr(part, "current_leader_epoch", -1)),
            )
            for t in p.topics
            for part in t.partitions
        ]
        answers = iter(self._log.offset_for_leader_epoch(replica_id, queries))
        return build(
            response_class(OFFSET_FOR_LEADER_EPOCH, req.version),
            {
                "topics": [
                    {
                        "topic": t.topic,
                        "partitions": [_epoch_end(int(part.partition), next(answers)) for part in t.partitions],
                    }
                    for t in p.topics
                ]
            },
        )

    # --- metadata -----------------------------------------------------------------------

    async def metadata(self, req: KafkaRequest) -> Any:
        p = req.payload
        if self._metadata.is_stale():
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
        m = await self._offload(self._metadata.metadata, names, allow)
        return build(
            response_class(METADATA, req.version),
            {
                "brokers": [
                    {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack or None} for b in m.brokers
                ],
                "cluster_id": m.cluster_id,
                "controller_id": m.controller_id,
                "topics": [
                    {
                        "error_code": t.error.errno if t.error else 0,
                        "name": t.name,
                        "topic_id": topic_uuid(t.topic_id),
                        "is_internal": False,
                        "partitions": [
                            {
                                "error_code": x.error.errno if x.error else 0,
                                "partition_index": x.partition,
                                "leader_id": x.leader,
                                "leader_epoch": x.leader_epoch,
                                "replica_nodes": x.replicas,
                                "isr_nodes": x.isr,
                                "offline_replicas": x.offline_replicas,
                            }
                            for x in t.partitions
                        ],
                    }
                    for t in m.topics
                ],
            },
        )

    async def describe_cluster(self, req: KafkaRequest) -> Any:
        m = await self._offload(self._metadata.brokers)
        return build(
            response_class(DESCRIBE_CLUSTER, req.version),
            {
                "error_code": 0,
                "cluster_id": m.cluster_id,
                "controller_id": m.controller_id,
                "brokers": [
                    {"broker_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack or None} for b in m.brokers
                ],
            },
        )


def _last_stable(last_stable_offset: int, high_watermark: int) -> int:
    """A partition's last stable offset: the log's, or its high watermark when it knows
    none (-1)."""
    return last_stable_offset if last_stable_offset >= 0 else high_watermark


def _aborted(aborted: list[AbortedTransaction] | None) -> list[dict[str, int]] | None:
    if aborted is None:
        return None
    return [{"producer_id": a.producer_id, "first_offset": a.first_offset} for a in aborted]


def _offset(partition: int, r: OffsetResult) -> dict[str, Any]:
    return {
        "partition_index": partition,
        "error_code": r.error.errno if r.error else 0,
        "timestamp": r.timestamp,
        "offset": r.offset,
        "leader_epoch": r.leader_epoch,
    }


def _epoch_end(partition: int, r: EpochEnd) -> dict[str, Any]:
    return {
        "partition": partition,
        "error_code": r.error.errno if r.error else 0,
        "leader_epoch": r.leader_epoch,
        "end_offset": r.end_offset,
    }
