"""Transactions on the Kafka door (KIP-98, KIP-447, KIP-664): InitProducerId,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, DescribeTransactions and
ListTransactions. Each is Kafka's request -> one call of the core's
:class:`~kbroker.api.txn_api.TransactionApi` (an InitProducerId without a transactional
id: :meth:`LogApi.init_producer_id <kbroker.api.log_api.LogApi.init_producer_id>`, the
idempotent producer) -> Kafka's response. FindCoordinator for key type TRANSACTION is
:mod:`~kbroker.doors.kafka.group_apis`'.

Versions: InitProducerId 0-4 (v3+ carries the producer the client holds, KIP-360: its
epoch is bumped, a stale one fenced), AddPartitionsToTxn 0-3 (v4+ is KIP-890's
broker-to-broker batch, not served), AddOffsetsToTxn 0-3, TxnOffsetCommit 0-3, EndTxn
0-3, DescribeTransactions 0, ListTransactions 0. WriteTxnMarkers (27) is inter-broker
(the coordinator calls each partition leader's core directly) and not served here.

A whole-request refusal (NOT_COORDINATOR, TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
PRODUCER_FENCED, CONCURRENT_TRANSACTIONS, ...) is the response's ``error_code``, or, for
AddPartitionsToTxn and TxnOffsetCommit, which have none, the code of every partition, as
Kafka answers them. PRODUCER_FENCED (90, KIP-588) reaches a client of a version older
than it as INVALID_PRODUCER_EPOCH (47), as Kafka's handlers answer: InitProducerId before
v4, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn before v2, TxnOffsetCommit before v3.

Not done: TxnOffsetCommit v3's group member fields (KIP-447's generation, member id and
instance id) are read but not checked against the group.

Thread safety: everything runs on the door's loop thread; core calls go to the request
pool (``offload``).
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kbroker.api.apis import BrokerApis
from kbroker.api.txn_api import CommittedOffset, TransactionApi, TransactionMetadata, TxnState
from kbroker.doors.kafka.codec import build, millis, response_class
from kbroker.doors.kafka.server import Api, KafkaRequest
from kclient.errors import BrokerResponseError, InvalidProducerEpochError, ProducerFencedError, as_response_error

INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 65, 66
FENCED_SINCE = {INIT_PRODUCER_ID: 4, ADD_PARTITIONS_TO_TXN: 2, ADD_OFFSETS_TO_TXN: 2, END_TXN: 2, TXN_OFFSET_COMMIT: 3}
"""The first version of each API whose clients know PRODUCER_FENCED (KIP-588)."""

TopicPartition = tuple[str, int]


def _code(api_key: int, version: int, exc: BaseException | None) -> int:
    """The Kafka error code of a core failure (0: none) as ``version`` of the API knows it."""
    if exc is None:
        return 0
    errno = int(as_response_error(exc).errno)  # type: ignore[arg-type]
    if errno == ProducerFencedError.errno and version < FENCED_SINCE.get(api_key, 0):
        return int(InvalidProducerEpochError.errno)
    return errno


def _start_time(start_ms: int) -> datetime.datetime:
    """DescribeTransactions' start time: epoch milliseconds, -1 for a transaction not
    begun (kio writes the datetime's milliseconds as they are)."""
    return datetime.datetime.fromtimestamp(start_ms / 1000, datetime.UTC)


class TxnApis:
    """The transaction APIs over the core's :class:`TransactionApi` (``txn``, looked up at
    each request, so a table can be listed over a core without one)."""

    def __init__(self, core: BrokerApis, txn: Callable[[], TransactionApi]) -> None:
        self._core = core
        self._txn = txn
        self._offload = core.offload

    def apis(self) -> list[Api]:
        return [
            Api(INIT_PRODUCER_ID, "InitProducerId", 0, 4, self.init_producer_id),
            Api(ADD_PARTITIONS_TO_TXN, "AddPartitionsToTxn", 0, 3, self.add_partitions_to_txn),
            Api(ADD_OFFSETS_TO_TXN, "AddOffsetsToTxn", 0, 3, self.add_offsets_to_txn),
            Api(END_TXN, "EndTxn", 0, 3, self.end_txn),
            Api(TXN_OFFSET_COMMIT, "TxnOffsetCommit", 0, 3, self.txn_offset_commit),
            Api(DESCRIBE_TRANSACTIONS, "DescribeTransactions", 0, 0, self.describe_transactions),
            Api(LIST_TRANSACTIONS, "ListTransactions", 0, 0, self.list_transactions),
        ]

    async def init_producer_id(self, req: KafkaRequest) -> Any:
        p = req.payload
        tid = p.transactional_id
        try:
            if tid:
                pid, epoch = await self._offload(
                    self._txn().init_producer_id,
                    tid,
                    millis(p.transaction_timeout),
                    int(getattr(p, "producer_id", -1)),
                    int(getattr(p, "producer_epoch", -1)),
                )
            else:  # an idempotent producer (a KIP-360 bump gets a new producer id)
                pid, epoch = await self._offload(self._core.log.init_producer_id, None)
            code = 0
        except Exception as exc:
            pid, epoch, code = -1, -1, _code(INIT_PRODUCER_ID, req.version, exc)
        return build(
            response_class(INIT_PRODUCER_ID, req.version),
            {"error_code": code, "producer_id": pid, "producer_epoch": epoch},
        )

    async def add_partitions_to_txn(self, req: KafkaRequest) -> Any:
        p = req.payload
        wanted = [(t.name, int(x)) for t in p.v3_and_below_topics or () for x in t.partitions or ()]
        results: Mapping[TopicPartition, BaseException | None]
        try:
            results = await self._offload(
                self._txn().add_partitions,
                p.v3_and_below_transactional_id,
                int(p.v3_and_below_producer_id),
                int(p.v3_and_below_producer_epoch),
                wanted,
            )
        except Exception as exc:
            results = dict.fromkeys(wanted, exc)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for tp in wanted:
            code = _code(ADD_PARTITIONS_TO_TXN, req.version, results[tp])
            by_topic.setdefault(tp[0], []).append({"partition_index": tp[1], "partition_error_code": code})
        return build(
            response_class(ADD_PARTITIONS_TO_TXN, req.version),
            {
                "results_by_topic_v3_and_below": [
                    {"name": name, "results_by_partition": parts} for name, parts in by_topic.items()
                ]
            },
        )

    async def add_offsets_to_txn(self, req: KafkaRequest) -> Any:
        p = req.payload
        code = await self._answer(
            ADD_OFFSETS_TO_TXN,
            req.version,
            self._txn().add_offsets,
            p.transactional_id,
            int(p.producer_id),
            int(p.producer_epoch),
            p.group_id,
        )
        return build(response_class(ADD_OFFSETS_TO_TXN, req.version), {"error_code": code})

    async def end_txn(self, req: KafkaRequest) -> Any:
        p = req.payload
        code = await self._answer(
            END_TXN,
            req.version,
            self._txn().end_txn,
            p.transactional_id,
            int(p.producer_id),
            int(p.producer_epoch),
            bool(p.committed),
        )
        return build(response_class(END_TXN, req.version), {"error_code": code})

    async def _answer(self, api_key: int, version: int, fn: Callable[..., Any], *args: Any) -> int:
        try:
            await self._offload(fn, *args)
        except Exception as exc:
            return _code(api_key, version, exc)
        return 0

    async def txn_offset_commit(self, req: KafkaRequest) -> Any:
        p = req.payload
        offsets = {
            (t.name, int(x.partition_index)): CommittedOffset(int(x.committed_offset), x.committed_metadata or "")
            for t in p.topics
            for x in t.partitions
        }
        results: Mapping[TopicPartition, BaseException | None]
        try:
            results = await self._offload(
                functools.partial(
                    self._txn().commit_offsets,
                    member_id=getattr(p, "member_id", "") or "",  # v3+ (KIP-447)
                    generation_id=int(getattr(p, "generation_id", -1)),
                    group_instance_id=getattr(p, "group_instance_id", None),
                ),
                p.transactional_id,
                int(p.producer_id),
                int(p.producer_epoch),
                p.group_id,
                offsets,
            )
        except Exception as exc:
            results = dict.fromkeys(offsets, exc)
        return build(
            response_class(TXN_OFFSET_COMMIT, req.version),
            {
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            {
                                "partition_index": int(x.partition_index),
                                "error_code": _code(
                                    TXN_OFFSET_COMMIT, req.version, results.get((t.name, int(x.partition_index)))
                                ),
                            }
                            for x in t.partitions
                        ],
                    }
                    for t in p.topics
                ]
            },
        )

    async def describe_transactions(self, req: KafkaRequest) -> Any:
        described = await self._offload(self._txn().describe, list(req.payload.transactional_ids))
        return build(
            response_class(DESCRIBE_TRANSACTIONS, req.version),
            {"transaction_states": [_described(tid, err, meta) for tid, err, meta in described]},
        )

    async def list_transactions(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(LIST_TRANSACTIONS, req.version)
        try:
            unknown, listed = await self._offload(
                self._txn().list_transactions, list(p.state_filters), [int(x) for x in p.producer_id_filters]
            )
        except Exception as exc:
            return build(cls, {"error_code": _code(LIST_TRANSACTIONS, req.version, exc)})
        return build(
            cls,
            {
                "error_code": 0,
                "unknown_state_filters": unknown,
                "transaction_states": [
                    {"transactional_id": m.transactional_id, "producer_id": m.producer_id, "transaction_state": m.state}
                    for m in listed
                ],
            },
        )


def _described(tid: str, err: BrokerResponseError | None, meta: TransactionMetadata | None) -> dict[str, Any]:
    if err is not None:  # Kafka's defaults beside the code
        return {"error_code": err.errno, "transactional_id": tid, "transaction_start_time": _start_time(0)}
    if meta is None:
        # an id never initialised: Kafka answers TRANSACTIONAL_ID_NOT_FOUND (105), which
        # the error table does not have yet; here it is an Empty transaction of producer -1
        return {
            "error_code": 0,
            "transactional_id": tid,
            "transaction_state": str(TxnState.EMPTY),
            "transaction_start_time": _start_time(-1),
            "producer_id": -1,
            "producer_epoch": -1,
        }
    return {
        "error_code": 0,
        "transactional_id": tid,
        "transaction_state": str(meta.state),
        "transaction_timeout": meta.timeout_ms,
        "transaction_start_time": _start_time(meta.start_ms),
        "producer_id": meta.producer_id,
        "producer_epoch": meta.producer_epoch,
        "topics": _by_topic(meta.partitions),
    }


def _by_topic(partitions: Iterable[TopicPartition]) -> list[dict[str, Any]]:
    topics: dict[str, list[int]] = {}
    for t, i in sorted(partitions):
        topics.setdefault(t, []).append(i)
    return [{"topic": t, "partitions": parts} for t, parts in topics.items()]
