"""The transactional producer's state machine (Kafka's TransactionManager) over a fake
transport: a fake transaction coordinator answers FindCoordinator, InitProducerId,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn, and a fake leader
answers Produce. What is checked is the order and content of the requests (partitions
added, batched, before their first Produce; EndTxn after every batch's answer; offsets
to the group's coordinator) and the errors: retried, abortable or fatal."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kclient.errors import (
    ConcurrentTransactionsError,
    IllegalStateError,
    InvalidConfigError,
    KafkaTimeoutError,
    ProducerFencedError,
    TopicAuthorizationFailedError,
)
from kclient.producer import Producer
from kclient.producer import producer as producer_module
from kclient.producer.transactions import State, TransactionAbortedError
from kclient.proto.kbroker.v1 import cluster_pb2, group_pb2, log_pb2, txn_pb2
from kclient.records import TRANSACTIONAL_FLAG_MASK, read_header
from kclient.structs import OffsetAndMetadata, TopicPartition
from tests.support import FakeMetadata, FakeTransport

TXN_COORDINATOR = "txn:9092"
GROUP_COORDINATOR = "group:9092"
LEADER = "leader:9092"
CONCURRENT_TRANSACTIONS = 51
NOT_COORDINATOR = 16
PRODUCER_FENCED = 90
TOPIC_AUTHORIZATION_FAILED = 29


class FakeCluster:
    """The coordinator's and the leader's answers, scripted per test; ``log`` lists what
    reached them, in order, as (method, summary)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[tuple[str, Any]] = []
        self.epoch = 0
        self.offsets: dict[tuple[str, int], int] = {}
        self.produce_error: dict[tuple[str, int], int] = {}
        self.add_errors: list[int] = []
        """Top-level error codes the next AddPartitionsToTxn calls answer, one each."""
        self.init_errors: list[int] = []
        self.end_errors: list[int] = []

    def note(self, method: str, summary: Any) -> None:
        with self.lock:
            self.log.append((method, summary))

    def methods(self) -> list[str]:
        with self.lock:
            return [m for m, _ in self.log]

    def find_coordinator(self, request: group_pb2.FindCoordinatorRequest) -> group_pb2.FindCoordinatorResponse:
        self.note("FindCoordinator", (request.group_id, request.key_type))
        host, port = (TXN_COORDINATOR if request.key_type == group_pb2.TRANSACTION else GROUP_COORDINATOR).split(":")
        return group_pb2.FindCoordinatorResponse(node_id=1, host=host, port=int(port))

    def init_producer_id(self, request: cluster_pb2.InitProducerIdRequest) -> cluster_pb2.InitProducerIdResponse:
        held = (request.producer_id, request.producer_epoch) if request.HasField("producer_id") else None
        self.note("InitProducerId", (request.transactional_id, request.transaction_timeout_ms, held))
        if self.init_errors:
            return cluster_pb2.InitProducerIdResponse(error_code=self.init_errors.pop(0))  # type: ignore[arg-type]
        self.epoch += 1
        return cluster_pb2.InitProducerIdResponse(producer_id=42, producer_epoch=self.epoch)

    def add_partitions(self, request: txn_pb2.AddPartitionsToTxnRequest) -> txn_pb2.AddPartitionsToTxnResponse:
        asked = sorted((t.name, p) for t in request.topics for p in t.partitions)
        self.note("AddPartitionsToTxn", (request.producer_id, request.producer_epoch, asked))
        code = self.add_errors.pop(0) if self.add_errors else 0
        resp = txn_pb2.AddPartitionsToTxnResponse(error_code=code)  # type: ignore[arg-type]
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                tr.partitions.add(index=p, error_code=code)  # type: ignore[arg-type]
        return resp

    def add_offsets(self, request: txn_pb2.AddOffsetsToTxnRequest) -> txn_pb2.AddOffsetsToTxnResponse:
        self.note("AddOffsetsToTxn", request.group_id)
        return txn_pb2.AddOffsetsToTxnResponse()

    def txn_offset_commit(self, request: txn_pb2.TxnOffsetCommitRequest) -> txn_pb2.TxnOffsetCommitResponse:
        offsets = {(t.name, p.index): p.offset for t in request.topics for p in t.partitions}
        generation = request.generation_id if request.HasField("generation_id") else None
        self.note("TxnOffsetCommit", (request.group_id, generation, request.member_id, offsets))
        resp = txn_pb2.TxnOffsetCommitResponse()
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                tr.partitions.add(index=p.index)
        return resp

    def end_txn(self, request: txn_pb2.EndTxnRequest) -> txn_pb2.EndTxnResponse:
        self.note("EndTxn", (request.producer_epoch, request.committed))
        code = self.end_errors.pop(0) if self.end_errors else 0
        return txn_pb2.EndTxnResponse(error_code=code)  # type: ignore[arg-type]

    def produce(self, request: log_pb2.ProduceRequest) -> log_pb2.ProduceResponse:
        resp = log_pb2.ProduceResponse()
        seen = []
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                header = read_header(p.records)
                tp = (t.name, p.index)
                seen.append((tp, bool(header.attributes & TRANSACTIONAL_FLAG_MASK), header.producer_epoch))
                code = self.produce_error.get(tp, 0)
                if code:
                    tr.partitions.add(index=p.index, error_code=code, base_offset=-1)  # type: ignore[arg-type]
                    continue
                with self.lock:
                    base = self.offsets.get(tp, 0)
                    self.offsets[tp] = base + header.record_count
                tr.partitions.add(index=p.index, base_offset=base, log_append_time_ms=-1)
        self.note("Produce", (request.transactional_id, seen))
        return resp


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster()
    metadata = FakeMetadata(default_partitions=2, addresses=[LEADER])

    def transport(*_: Any, **__: Any) -> FakeTransport:
        t = FakeTransport(
            {
                "FindCoordinator": fake.find_coordinator,
                "InitProducerId": fake.init_producer_id,
                "AddPartitionsToTxn": fake.add_partitions,
                "AddOffsetsToTxn": fake.add_offsets,
                "TxnOffsetCommit": fake.txn_offset_commit,
                "EndTxn": fake.end_txn,
                "Produce": fake.produce,
            }
        )
        fake.transport = t  # type: ignore[attr-defined]
        return t

    monkeypatch.setattr(producer_module, "Transport", transport)
    monkeypatch.setattr(producer_module, "ClusterMetadata", lambda *_, **__: metadata)
    return fake


def _producer(**configs: Any) -> Producer:
    return Producer(
        transactional_id="tx-1", linger_ms=0, retry_backoff_ms=10, max_block_ms=5000, request_timeout_ms=2000, **configs
    )


def _wait(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# --- configuration and states --------------------------------------------------------------


def test_a_transactional_id_implies_idempotence_and_refuses_what_contradicts_it(cluster: FakeCluster) -> None:
    with pytest.raises(InvalidConfigError):
        Producer(transactional_id="tx", acks=1)
    with pytest.raises(InvalidConfigError):
        Producer(transactional_id="tx", enable_idempotence=False)
    p = _producer()
    try:
        assert p.config["enable_idempotence"] is True
    finally:
        p.close(0)


def test_transaction_calls_need_init_and_begin(cluster: FakeCluster) -> None:
    p = _producer()
    try:
        with pytest.raises(IllegalStateError, match="init_transactions"):
            p.send("t", b"v")
        with pytest.raises(IllegalStateError):
            p.begin_transaction()
        p.init_transactions()
        with pytest.raises(IllegalStateError, match="begin_transaction"):
            p.send("t", b"v")
        with pytest.raises(IllegalStateError):
            p.commit_transaction()
        with pytest.raises(IllegalStateError):
            p.init_transactions()
    finally:
        p.close(0)
    plain = Producer(linger_ms=0)
    try:
        with pytest.raises(IllegalStateError, match="transactional_id"):
            plain.init_transactions()
    finally:
        plain.close(0)


# --- the happy path -----------------------------------------------------------------------


def test_commit_adds_partitions_in_one_request_before_their_batches_then_ends_the_transaction(
    cluster: FakeCluster,
) -> None:
    p = _producer(transaction_timeout_ms=30000)
    try:
        p.init_transactions()
        assert cluster.log[:2] == [
            ("FindCoordinator", ("tx-1", group_pb2.TRANSACTION)),
            ("InitProducerId", ("tx-1", 30000, None)),
        ]
        p.begin_transaction()
        futures = [p.send("t", b"a", partition=0), p.send("t", b"b", partition=1), p.send("u", b"c", partition=0)]
        p.commit_transaction()
        assert all(f.get(1).offset >= 0 for f in futures)
    finally:
        p.close(0)
    methods = cluster.methods()
    assert methods.count("AddPartitionsToTxn") >= 1
    first_produce = methods.index("Produce")
    added: set[tuple[str, int]] = set()
    for method, summary in cluster.log:
        if method == "AddPartitionsToTxn":
            added.update(summary[2])
        if method == "Produce":
            tid, seen = summary
            assert tid == "tx-1"
            for tp, transactional, epoch in seen:
                assert tp in added, f"{tp} produced before it was added"
                assert transactional and epoch == 1
    assert methods.index("AddPartitionsToTxn") < first_produce
    assert methods[-1] == "EndTxn" and cluster.log[-1] == ("EndTxn", (1, True))
    assert added == {("t", 0), ("t", 1), ("u", 0)}


def test_an_empty_transaction_commits_without_end_txn(cluster: FakeCluster) -> None:
    p = _producer()
    try:
        p.init_transactions()
        p.begin_transaction()
        p.commit_transaction()
        p.begin_transaction()  # READY again
        p.abort_transaction()
    finally:
        p.close(0)
    assert "EndTxn" not in cluster.methods()


def test_partitions_are_added_again_in_the_next_transaction(cluster: FakeCluster) -> None:
    p = _producer()
    try:
        p.init_transactions()
        for _ in range(2):
            p.begin_transaction()
            p.send("t", b"x", partition=0)
            p.commit_transaction()
    finally:
        p.close(0)
    assert cluster.methods().count("AddPartitionsToTxn") == 2
    assert cluster.methods().count("EndTxn") == 2


def test_send_offsets_adds_the_group_then_commits_to_the_groups_coordinator(cluster: FakeCluster) -> None:
    class GroupMetadata:
        group_id = "g"
        generation_id = 5
        member_id = "m-1"
        group_instance_id = None

    p = _producer()
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send_offsets_to_transaction(
            {TopicPartition("in", 0): OffsetAndMetadata(10, ""), TopicPartition("in", 1): 7}, GroupMetadata()
        )
        p.commit_transaction()
    finally:
        p.close(0)
    assert cluster.methods()[-4:] == ["AddOffsetsToTxn", "FindCoordinator", "TxnOffsetCommit", "EndTxn"]
    assert cluster.log[-3][1] == ("g", group_pb2.GROUP)
    assert cluster.log[-2][1] == ("g", 5, "m-1", {("in", 0): 10, ("in", 1): 7})
    transport = cluster.transport  # type: ignore[attr-defined]
    assert [a for a, m, _ in transport.calls if m == "TxnOffsetCommit"] == [GROUP_COORDINATOR]
    assert {a for a, m, _ in transport.calls if m in ("AddOffsetsToTxn", "EndTxn")} == {TXN_COORDINATOR}


def test_send_offsets_with_a_group_id_sends_no_generation(cluster: FakeCluster) -> None:
    p = _producer()
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send_offsets_to_transaction({TopicPartition("in", 0): 3}, "g")
        p.commit_transaction()
    finally:
        p.close(0)
    [commit] = [s for m, s in cluster.log if m == "TxnOffsetCommit"]
    assert commit == ("g", None, "", {("in", 0): 3})


# --- retries ------------------------------------------------------------------------------


def test_init_retries_concurrent_transactions_and_finds_a_moved_coordinator_again(cluster: FakeCluster) -> None:
    cluster.init_errors = [CONCURRENT_TRANSACTIONS, NOT_COORDINATOR]
    p = _producer()
    try:
        p.init_transactions()
    finally:
        p.close(0)
    assert cluster.methods() == [
        "FindCoordinator",
        "InitProducerId",  # CONCURRENT_TRANSACTIONS: same coordinator, again
        "InitProducerId",  # NOT_COORDINATOR: find it again
        "FindCoordinator",
        "InitProducerId",
    ]


def test_init_that_keeps_failing_times_out_and_may_be_called_again(cluster: FakeCluster) -> None:
    cluster.init_errors = [CONCURRENT_TRANSACTIONS] * 30
    p = _producer()
    try:
        with pytest.raises(KafkaTimeoutError):
            p.init_transactions(0.1)
        cluster.init_errors = []
        p.init_transactions()
        p.begin_transaction()
    finally:
        p.close(0)


def test_add_partitions_retries_concurrent_transactions(cluster: FakeCluster) -> None:
    cluster.add_errors = [CONCURRENT_TRANSACTIONS, CONCURRENT_TRANSACTIONS]
    p = _producer()
    try:
        p.init_transactions()
        p.begin_transaction()
        f = p.send("t", b"x", partition=0)
        p.commit_transaction()
        assert f.get(1).offset == 0
    finally:
        p.close(0)
    assert cluster.methods().count("AddPartitionsToTxn") == 3


# --- abortable errors ----------------------------------------------------------------------


def test_a_failed_send_makes_the_transaction_abortable_and_the_abort_bumps_the_epoch(cluster: FakeCluster) -> None:
    cluster.produce_error[("t", 1)] = TOPIC_AUTHORIZATION_FAILED
    p = _producer()
    try:
        p.init_transactions()
        p.begin_transaction()
        ok = p.send("t", b"a", partition=0)
        bad = p.send("t", b"b", partition=1)
        with pytest.raises(TopicAuthorizationFailedError):
            p.commit_transaction()
        assert ok.get(1).offset == 0
        with pytest.raises(TopicAuthorizationFailedError):
            bad.get(1)
        with pytest.raises(TopicAuthorizationFailedError, match="abort"):
            p.send("t", b"c", partition=0)
        p.abort_transaction()
        assert cluster.log[-2] == ("EndTxn", (1, False))
        assert cluster.log[-1] == ("InitProducerId", ("tx-1", 60000, (42, 1)))  # KIP-360 bump
        del cluster.produce_error[("t", 1)]
        p.begin_transaction()
        again = p.send("t", b"d", partition=1)
        p.commit_transaction()
        assert again.get(1).offset == 0
    finally:
        p.close(0)
    last_produce = [s for m, s in cluster.log if m == "Produce"][-1]
    assert last_produce[1] == [(("t", 1), True, 2)]  # the new epoch


def test_a_refused_add_partitions_fails_the_batches_and_needs_an_abort(cluster: FakeCluster) -> None:
    cluster.add_errors = [TOPIC_AUTHORIZATION_FAILED]
    p = _producer()
    try:
        p.init_transactions()
        p.begin_transaction()
        f = p.send("t", b"x", partition=0)
        with pytest.raises(TopicAuthorizationFailedError):
            f.get(5)
        with pytest.raises(TopicAuthorizationFailedError):
            p.commit_transaction()
        p.abort_transaction()
        p.begin_transaction()
    finally:
        p.close(0)
    assert "Produce" not in cluster.methods()
    assert "EndTxn" not in cluster.methods()  # nothing was added: nothing to end


def test_abort_fails_the_batches_not_sent(cluster: FakeCluster) -> None:
    cluster.add_errors = [CONCURRENT_TRANSACTIONS] * 1000  # the partition never gets added
    p = _producer()
    try:
        p.init_transactions()
        p.begin_transaction()
        f = p.send("t", b"x", partition=0)
        _wait(lambda: "AddPartitionsToTxn" in cluster.methods())
        p.abort_transaction()
        with pytest.raises(TransactionAbortedError):
            f.get(1)
        assert p._txn is not None and p._txn.state is State.READY
    finally:
        p.close(0)
    assert "Produce" not in cluster.methods()


# --- fatal errors -------------------------------------------------------------------------


def test_a_fenced_producer_is_unusable(cluster: FakeCluster) -> None:
    cluster.end_errors = [PRODUCER_FENCED]
    p = _producer()
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send("t", b"x", partition=0)
        with pytest.raises(ProducerFencedError):
            p.commit_transaction()
        with pytest.raises(ProducerFencedError):
            p.send("t", b"y", partition=0)
        with pytest.raises(ProducerFencedError):
            p.abort_transaction()
        with pytest.raises(ProducerFencedError):
            p.begin_transaction()
    finally:
        p.close(0)


def test_a_fenced_produce_is_fatal(cluster: FakeCluster) -> None:
    cluster.produce_error[("t", 0)] = PRODUCER_FENCED
    p = _producer()
    try:
        p.init_transactions()
        p.begin_transaction()
        f = p.send("t", b"x", partition=0)
        with pytest.raises(ProducerFencedError):
            f.get(5)
        with pytest.raises(ProducerFencedError):
            p.commit_transaction()
        with pytest.raises(ProducerFencedError):
            p.abort_transaction()
    finally:
        p.close(0)


def test_a_concurrent_transactions_end_txn_is_retried(cluster: FakeCluster) -> None:
    cluster.end_errors = [CONCURRENT_TRANSACTIONS]
    p = _producer()
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send("t", b"x", partition=0)
        p.commit_transaction()
    finally:
        p.close(0)
    assert cluster.methods().count("EndTxn") == 2
    assert ConcurrentTransactionsError.retriable


def test_batches_of_a_partition_never_added_expire_after_the_delivery_timeout(cluster: FakeCluster) -> None:
    cluster.add_errors = [CONCURRENT_TRANSACTIONS] * 10000
    p = _producer(delivery_timeout_ms=300)
    try:
        p.init_transactions()
        p.begin_transaction()
        f = p.send("t", b"x", partition=0)
        with pytest.raises(KafkaTimeoutError, match="not added to the transaction"):
            f.get(5)
        with pytest.raises(KafkaTimeoutError):
            p.commit_transaction()  # the transaction failed
        p.abort_transaction()
    finally:
        p.close(0)
    assert "Produce" not in cluster.methods()
