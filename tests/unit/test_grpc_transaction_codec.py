"""The gRPC door's codec of the transaction work (issue 24) alone, over a fake core: the
isolation level of Fetch and ListOffsets reaches the core, the last stable offset and the
aborted transactions come out, a transactional Produce names its transactional id, and the
transaction RPCs (txn.proto, FindCoordinator key type TRANSACTION, InitProducerId with a
transactional id) make their one call of the TransactionApi and encode its answer or
refusal."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from kbroker.api.log_api import Fetch, FetchAnswer, OffsetQuery
from kbroker.api.metadata_api import Node
from kbroker.cluster.zkdata import TxnState
from kbroker.doors.grpc.servicer import BrokerService
from kbroker.replication.partition import ReadResult
from kbroker.replication.replica_manager import FetchResult, OffsetResult, ProduceResult
from kclient.errors import (
    ConcurrentTransactionsError,
    NotCoordinatorError,
    NotLeaderForPartitionError,
    ProducerFencedError,
    TopicAuthorizationFailedError,
)
from kclient.proto.kbroker.v1 import cluster_pb2, common_pb2, group_pb2, log_pb2, txn_pb2
from kclient.structs import AbortedTransaction, IsolationLevel
from kclient.transport import ERROR_CODE_METADATA_KEY
from tests.support import Aborted, FakeContext


class FakeLog:
    """The core's LogApi: answers each fetched partition with ``read`` and records what
    it was asked."""

    def __init__(self, read: ReadResult | None = None) -> None:
        self.read = read
        self.asked: list[Any] = []

    async def produce(self, acks: int, timeout_ms: int, entries: list[Any], **kwargs: Any) -> Any:
        self.asked.append((acks, timeout_ms, entries, kwargs))
        return {tp: ProduceResult(None, 7, -1, 0) for tp, _ in entries}

    async def fetch(self, fetch: Fetch) -> FetchAnswer:
        self.asked.append(fetch)
        if self.read is None:
            return FetchAnswer([(s, FetchResult(NotLeaderForPartitionError("moved"))) for s in fetch.partitions])
        return FetchAnswer([(s, FetchResult(None, self.read)) for s in fetch.partitions])

    def list_offsets(self, replica_id: int, queries: list[OffsetQuery]) -> list[OffsetResult]:
        self.asked.append(queries)
        return [OffsetResult(None, 42, -1, 3) for _ in queries]


async def _offload(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _service(log: FakeLog, txn_api: FakeTxn | None = None) -> BrokerService:
    core = SimpleNamespace(
        log=log,
        metadata=None,
        groups=None,
        admin=None,
        cluster=None,
        security=None,
        transactions=txn_api,
        txn_api=txn_api,  # the name before the core named the area "transactions"
        offload=_offload,
        broker_id=1,
    )
    return BrokerService(core)  # type: ignore[arg-type]


def _fetch_request(**fields: Any) -> log_pb2.FetchRequest:
    request = log_pb2.FetchRequest(**fields)
    request.topics.add(name="t").partitions.add(index=0, fetch_offset=5)
    return request


# --- Fetch --------------------------------------------------------------------------------


def test_fetch_isolation_unset_is_read_uncommitted() -> None:
    log = FakeLog()
    asyncio.run(_service(log).Fetch(_fetch_request(), FakeContext()))  # type: ignore[arg-type]
    [fetch] = log.asked
    assert fetch.isolation_level is IsolationLevel.READ_UNCOMMITTED


def test_fetch_read_committed_reaches_the_core_and_the_answer_carries_lso_and_aborted() -> None:
    read = ReadResult(b"recs", 20, 0, 25, 12, [AbortedTransaction(9, 6), AbortedTransaction(11, 8)])
    log = FakeLog(read)
    request = _fetch_request(isolation_level=common_pb2.READ_COMMITTED)
    resp = asyncio.run(_service(log).Fetch(request, FakeContext()))  # type: ignore[arg-type]
    [fetch] = log.asked
    assert fetch.isolation_level is IsolationLevel.READ_COMMITTED
    [p] = resp.topics[0].partitions
    assert (p.high_watermark, p.last_stable_offset, p.records) == (20, 12, b"recs")
    assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == [(9, 6), (11, 8)]


def test_fetch_unknown_lso_is_the_high_watermark_and_no_aborted_list_is_empty() -> None:
    log = FakeLog(ReadResult(b"", 20, 0, 25))
    resp = asyncio.run(_service(log).Fetch(_fetch_request(), FakeContext()))  # type: ignore[arg-type]
    [p] = resp.topics[0].partitions
    assert p.last_stable_offset == 20 and len(p.aborted_transactions) == 0


def test_fetch_error_partition_has_lso_minus_one() -> None:
    resp = asyncio.run(_service(FakeLog()).Fetch(_fetch_request(), FakeContext()))  # type: ignore[arg-type]
    [p] = resp.topics[0].partitions
    assert p.error_code == 6 and p.last_stable_offset == -1


def test_fetch_unknown_isolation_level_is_invalid_argument() -> None:
    log, ctx = FakeLog(), FakeContext()
    request = _fetch_request()
    request.isolation_level = 7  # type: ignore[assignment]
    with pytest.raises(Aborted):
        asyncio.run(_service(log).Fetch(request, ctx))  # type: ignore[arg-type]
    assert ctx.aborted is not None and ctx.aborted[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert ctx.trailing == ((ERROR_CODE_METADATA_KEY, "42"),) and log.asked == []


# --- ListOffsets --------------------------------------------------------------------------


def test_list_offsets_passes_the_isolation_level_to_every_query() -> None:
    log = FakeLog()
    request = log_pb2.ListOffsetsRequest(isolation_level=common_pb2.READ_COMMITTED)
    t = request.topics.add(name="t")
    t.partitions.add(index=0)
    t.partitions.add(index=1, timestamp=-2)
    resp = asyncio.run(_service(log).ListOffsets(request, FakeContext()))  # type: ignore[arg-type]
    [queries] = log.asked
    assert [q.isolation_level for q in queries] == [IsolationLevel.READ_COMMITTED] * 2
    assert [p.offset for p in resp.topics[0].partitions] == [42, 42]


def test_list_offsets_isolation_unset_is_read_uncommitted() -> None:
    log = FakeLog()
    request = log_pb2.ListOffsetsRequest()
    request.topics.add(name="t").partitions.add(index=0)
    asyncio.run(_service(log).ListOffsets(request, FakeContext()))  # type: ignore[arg-type]
    [[q]] = log.asked
    assert q.isolation_level is IsolationLevel.READ_UNCOMMITTED


# --- Produce ------------------------------------------------------------------------------


def test_produce_names_the_transactional_id_only_when_set() -> None:
    log = FakeLog()
    plain = log_pb2.ProduceRequest()
    plain.topics.add(name="t").partitions.add(index=0, records=b"x")
    txn = log_pb2.ProduceRequest(transactional_id="tx-1")
    txn.topics.add(name="t").partitions.add(index=0, records=b"y")
    asyncio.run(_service(log).Produce(plain, FakeContext()))  # type: ignore[arg-type]
    asyncio.run(_service(log).Produce(txn, FakeContext()))  # type: ignore[arg-type]
    assert [kw for *_, kw in log.asked] == [{}, {"transactional_id": "tx-1"}]


# --- the transaction RPCs -----------------------------------------------------------------


class FakeTxn:
    """The core's TransactionApi: records each call; ``refusal`` is raised by every call."""

    def __init__(self, refusal: Exception | None = None) -> None:
        self.refusal = refusal
        self.asked: list[tuple[str, tuple[Any, ...]]] = []

    def _call(self, name: str, *args: Any) -> None:
        self.asked.append((name, args))
        if self.refusal is not None:
            raise self.refusal

    def find_coordinator(self, tid: str) -> Node:
        self._call("find_coordinator", tid)
        return Node(3, "h3", 9093)

    def init_producer_id(self, tid: str, timeout_ms: int, pid: int = -1, epoch: int = -1) -> tuple[int, int]:
        self._call("init_producer_id", tid, timeout_ms, pid, epoch)
        return 77, 4

    def add_partitions(self, tid: str, pid: int, epoch: int, partitions: list[Any]) -> dict[Any, Any]:
        self._call("add_partitions", tid, pid, epoch, partitions)
        return {tp: (TopicAuthorizationFailedError("no") if tp[0] == "secret" else None) for tp in partitions}

    def add_offsets(self, tid: str, pid: int, epoch: int, group: str) -> None:
        self._call("add_offsets", tid, pid, epoch, group)

    def commit_offsets(
        self, tid: str, pid: int, epoch: int, group: str, offsets: dict[Any, Any], **member: Any
    ) -> dict[Any, Any]:
        self.member = member
        self._call("commit_offsets", tid, pid, epoch, group, offsets)
        return dict.fromkeys(offsets)

    def end_txn(self, tid: str, pid: int, epoch: int, commit: bool) -> None:
        self._call("end_txn", tid, pid, epoch, commit)

    def describe(self, ids: list[str]) -> list[Any]:
        self._call("describe", ids)
        meta = SimpleNamespace(
            state=TxnState.ONGOING,
            timeout_ms=60000,
            producer_id=77,
            producer_epoch=4,
            start_ms=1000,
            partitions=frozenset({("t", 1), ("t", 0), ("u", 2)}),
        )
        return [("a", None, meta), ("b", None, None), ("c", NotCoordinatorError("elsewhere"), None)]

    def list_transactions(self, states: list[str], pids: list[int]) -> tuple[list[str], list[Any]]:
        self._call("list_transactions", states, pids)
        return ["Bogus"], [SimpleNamespace(transactional_id="a", producer_id=77, state=TxnState.ONGOING)]


def _run(service: BrokerService, method: str, request: Any) -> Any:
    return asyncio.run(getattr(service, method)(request, FakeContext()))


def test_find_coordinator_key_type_transaction_asks_the_transaction_api() -> None:
    txn = FakeTxn()
    resp = _run(
        _service(FakeLog(), txn_api=txn),
        "FindCoordinator",
        group_pb2.FindCoordinatorRequest(group_id="tx", key_type=group_pb2.TRANSACTION),
    )
    assert txn.asked == [("find_coordinator", ("tx",))]
    assert (resp.error_code, resp.node_id, resp.host, resp.port) == (0, 3, "h3", 9093)


def test_find_coordinator_unknown_key_type_is_invalid_request() -> None:
    request = group_pb2.FindCoordinatorRequest(group_id="tx")
    request.key_type = 5  # type: ignore[assignment]
    resp = _run(_service(FakeLog(), txn_api=FakeTxn()), "FindCoordinator", request)
    assert resp.error_code == 42 and resp.node_id == -1


def test_a_core_without_transactions_answers_coordinator_not_available() -> None:
    service = _service(FakeLog())
    resp = _run(
        service, "FindCoordinator", group_pb2.FindCoordinatorRequest(group_id="tx", key_type=group_pb2.TRANSACTION)
    )
    assert resp.error_code == 15
    resp = _run(service, "EndTxn", txn_pb2.EndTxnRequest(transactional_id="tx"))
    assert resp.error_code == 15


def test_init_producer_id_with_a_transactional_id_goes_to_the_coordinator() -> None:
    txn = FakeTxn()
    service = _service(FakeLog(), txn_api=txn)
    resp = _run(service, "InitProducerId", cluster_pb2.InitProducerIdRequest(transactional_id="tx"))
    assert (resp.error_code, resp.producer_id, resp.producer_epoch) == (0, 77, 4)
    bump = cluster_pb2.InitProducerIdRequest(
        transactional_id="tx", transaction_timeout_ms=5000, producer_id=77, producer_epoch=4
    )
    _run(service, "InitProducerId", bump)
    assert txn.asked == [
        ("init_producer_id", ("tx", 60000, -1, -1)),  # unset timeout: 60000
        ("init_producer_id", ("tx", 5000, 77, 4)),
    ]


def test_init_producer_id_fenced_is_the_response_error() -> None:
    service = _service(FakeLog(), txn_api=FakeTxn(ProducerFencedError("newer")))
    resp = _run(service, "InitProducerId", cluster_pb2.InitProducerIdRequest(transactional_id="tx"))
    assert (resp.error_code, resp.producer_id, resp.producer_epoch) == (90, -1, -1)


def test_add_partitions_answers_each_partition() -> None:
    txn = FakeTxn()
    request = txn_pb2.AddPartitionsToTxnRequest(transactional_id="tx", producer_id=77, producer_epoch=4)
    request.topics.add(name="t", partitions=[0, 1])
    request.topics.add(name="secret", partitions=[0])
    resp = _run(_service(FakeLog(), txn_api=txn), "AddPartitionsToTxn", request)
    assert txn.asked == [("add_partitions", ("tx", 77, 4, [("t", 0), ("t", 1), ("secret", 0)]))]
    assert resp.error_code == 0
    got = {(t.name, p.index): p.error_code for t in resp.topics for p in t.partitions}
    assert got == {("t", 0): 0, ("t", 1): 0, ("secret", 0): 29}


def test_a_refused_add_partitions_carries_the_error_at_the_top_and_on_every_partition() -> None:
    request = txn_pb2.AddPartitionsToTxnRequest(transactional_id="tx")
    request.topics.add(name="t", partitions=[0, 1])
    resp = _run(
        _service(FakeLog(), txn_api=FakeTxn(ConcurrentTransactionsError("busy"))), "AddPartitionsToTxn", request
    )
    assert resp.error_code == 51 and resp.error_message == "busy"
    assert [p.error_code for p in resp.topics[0].partitions] == [51, 51]


def test_add_offsets_end_txn_and_txn_offset_commit_reach_the_core() -> None:
    txn = FakeTxn()
    service = _service(FakeLog(), txn_api=txn)
    _run(service, "AddOffsetsToTxn", txn_pb2.AddOffsetsToTxnRequest(transactional_id="tx", producer_id=7, group_id="g"))
    commit = txn_pb2.TxnOffsetCommitRequest(
        transactional_id="tx", group_id="g", producer_id=7, producer_epoch=1, generation_id=4, member_id="m-1"
    )
    commit.topics.add(name="in").partitions.add(index=2, offset=10, metadata="m")
    resp = _run(service, "TxnOffsetCommit", commit)
    _run(
        service, "EndTxn", txn_pb2.EndTxnRequest(transactional_id="tx", producer_id=7, producer_epoch=1, committed=True)
    )
    names = [name for name, _ in txn.asked]
    assert names == ["add_offsets", "commit_offsets", "end_txn"]
    assert txn.member == {"member_id": "m-1", "generation_id": 4, "group_instance_id": None}  # KIP-447
    assert txn.asked[0][1] == ("tx", 7, 0, "g")
    assert txn.asked[1][1][:4] == ("tx", 7, 1, "g")
    [(tp, committed)] = txn.asked[1][1][4].items()
    assert tp == ("in", 2) and (committed.offset, committed.metadata) == (10, "m")
    assert txn.asked[2][1] == ("tx", 7, 1, True)
    assert resp.error_code == 0 and resp.topics[0].partitions[0].index == 2


def test_a_fenced_end_txn_is_the_response_error() -> None:
    service = _service(FakeLog(), txn_api=FakeTxn(ProducerFencedError("fenced")))
    resp = _run(service, "EndTxn", txn_pb2.EndTxnRequest(transactional_id="tx", committed=False))
    assert resp.error_code == 90 and resp.error_message == "fenced"


def test_describe_transactions_encodes_state_partitions_and_per_id_errors() -> None:
    request = txn_pb2.DescribeTransactionsRequest(transactional_ids=["a", "b", "c"])
    resp = _run(_service(FakeLog(), txn_api=FakeTxn()), "DescribeTransactions", request)
    a, b, c = resp.transaction_states
    assert (a.transactional_id, a.error_code, a.transaction_state) == ("a", 0, "Ongoing")
    assert (a.producer_id, a.producer_epoch, a.transaction_timeout_ms, a.transaction_start_time_ms) == (
        77,
        4,
        60000,
        1000,
    )
    assert [(t.name, list(t.partitions)) for t in a.topics] == [("t", [0, 1]), ("u", [2])]
    assert (b.transactional_id, b.error_code) == ("b", 105)  # TRANSACTIONAL_ID_NOT_FOUND
    assert (c.transactional_id, c.error_code, c.error_message) == ("c", 16, "elsewhere")


def test_list_transactions_passes_the_filters_and_answers_unknown_states() -> None:
    txn = FakeTxn()
    request = txn_pb2.ListTransactionsRequest(state_filters=["Ongoing", "Bogus"], producer_id_filters=[77])
    resp = _run(_service(FakeLog(), txn_api=txn), "ListTransactions", request)
    assert txn.asked == [("list_transactions", (["Ongoing", "Bogus"], [77]))]
    assert list(resp.unknown_state_filters) == ["Bogus"]
    [listed] = resp.transaction_states
    assert (listed.transactional_id, listed.producer_id, listed.transaction_state) == ("a", 77, "Ongoing")
