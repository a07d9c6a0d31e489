"""Transactions as the gRPC contract carries them, against real brokers: the coordinator,
markers on partitions led by the coordinator and by another broker, read_committed
fetches, the last stable offset, aborted transactions, fencing, expiry and recovery from
ZooKeeper after the coordinator is killed."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from kclient.proto.kbroker.v1 import broker_pb2_grpc, cluster_pb2, common_pb2, group_pb2, log_pb2, txn_pb2
from kclient.records import BatchBuilder, control_type, decode_batches, iter_headers

pytestmark = pytest.mark.integration

READ_COMMITTED = common_pb2.IsolationLevel.READ_COMMITTED
READ_UNCOMMITTED = common_pb2.IsolationLevel.READ_UNCOMMITTED
PRODUCER_FENCED = 90
INVALID_PRODUCER_EPOCH = 47
CONCURRENT_TRANSACTIONS = 51


@functools.cache
def stub(address: str) -> broker_pb2_grpc.BrokerStub:
    return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(address))


class Txn:
    """One transactional producer speaking the contract by hand."""

    def __init__(self, cluster: LocalCluster, transactional_id: str, timeout_ms: int = 60000) -> None:
        self.cluster = cluster
        self.tid = transactional_id
        self.timeout_ms = timeout_ms
        self.pid = self.epoch = -1
        self.seq: dict[tuple[str, int], int] = {}

    def coordinator(self) -> str:
        """Asked of each running broker in turn (one may be paused)."""
        request = group_pb2.FindCoordinatorRequest(group_id=self.tid, key_type=group_pb2.CoordinatorType.TRANSACTION)
        for address in self.cluster.bootstrap.split(","):
            try:
                resp = stub(address).FindCoordinator(request, timeout=2)
            except grpc.RpcError:
                continue
            assert resp.error_code == 0, resp.error_message
            return f"{resp.host}:{resp.port}"
        raise AssertionError("no broker answered FindCoordinator")

    def init(self, deadline_s: float = 30) -> None:
        deadline = time.monotonic() + deadline_s
        while True:
            resp = stub(self.coordinator()).InitProducerId(
                cluster_pb2.InitProducerIdRequest(transactional_id=self.tid, transaction_timeout_ms=self.timeout_ms),
                timeout=10,
            )
            if resp.error_code in (CONCURRENT_TRANSACTIONS, 15, 16) and time.monotonic() < deadline:
                time.sleep(0.2)  # the previous transaction is completing / the coordinator moved
                continue
            assert resp.error_code == 0, resp.error_message
            self.pid, self.epoch = resp.producer_id, resp.producer_epoch
            self.seq = {}
            return

    def add(self, topic: str, partitions: list[int]) -> txn_pb2.AddPartitionsToTxnResponse:
        return stub(self.coordinator()).AddPartitionsToTxn(
            txn_pb2.AddPartitionsToTxnRequest(
                transactional_id=self.tid,
                producer_id=self.pid,
                producer_epoch=self.epoch,
                topics=[txn_pb2.AddPartitionsToTxnTopic(name=topic, partitions=partitions)],
            ),
            timeout=10,
        )

    def send(self, topic: str, partition: int, values: list[bytes]) -> log_pb2.ProducePartitionResponse:
        seq = self.seq.get((topic, partition), 0)
        builder = BatchBuilder(
            producer_id=self.pid, producer_epoch=self.epoch, base_sequence=seq, is_transactional=True
        )
        for v in values:
            builder.append(int(time.time() * 1000), None, v)
        req = log_pb2.ProduceRequest(acks=-1, timeout_ms=10000, transactional_id=self.tid)
        req.topics.add(name=topic).partitions.add(index=partition, records=builder.build())
        resp = stub(leader_address(self.cluster, topic, partition)).Produce(req, timeout=15)
        result = resp.topics[0].partitions[0]
        if result.error_code == 0:
            self.seq[(topic, partition)] = seq + len(values)
        return result

    def end(self, commit: bool) -> txn_pb2.EndTxnResponse:
        return stub(self.coordinator()).EndTxn(
            txn_pb2.EndTxnRequest(
                transactional_id=self.tid, producer_id=self.pid, producer_epoch=self.epoch, committed=commit
            ),
            timeout=30,
        )


def leader_address(cluster: LocalCluster, topic: str, partition: int) -> str:
    with AdminClient(cluster.bootstrap) as admin:
        leader = admin.describe_topics([topic])[0].partitions[partition].leader
    return cluster.brokers[leader].address


def committed_lso(cluster: LocalCluster, topic: str, partition: int) -> int:
    return fetch(cluster, topic, partition, committed=True).last_stable_offset


def fetch(cluster: LocalCluster, topic: str, partition: int, *, committed: bool) -> log_pb2.FetchPartitionResponse:
    req = log_pb2.FetchRequest(max_wait_ms=0, isolation_level=READ_COMMITTED if committed else READ_UNCOMMITTED)
    req.topics.add(name=topic).partitions.add(index=partition, fetch_offset=0)
    resp = stub(leader_address(cluster, topic, partition)).Fetch(req, timeout=10)
    return resp.topics[0].partitions[0]


def data_values(records: bytes) -> list[bytes]:
    """The values of the data records (not the markers)."""
    return [r.value for h, rs in decode_batches(records) if not h.is_control for r in rs if r.value is not None]


def wait_for(check: Callable[[], bool], timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _readable(cluster: LocalCluster, partition: int) -> bool:
    return fetch(cluster, "tx", partition, committed=False).error_code == 0


@pytest.fixture
def two_brokers(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    cluster = cluster_factory(2, **{"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"})
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("tx", 2, 2)])
    for p in (0, 1):
        wait_for(functools.partial(_readable, cluster, p), what=f"tx-{p}")
    return cluster


def test_a_committed_transaction_becomes_visible_to_read_committed_on_every_partition(
    two_brokers: LocalCluster,
) -> None:
    txn = Txn(two_brokers, "t-commit")
    txn.init()
    assert all(p.error_code == 0 for t in txn.add("tx", [0, 1]).topics for p in t.partitions)
    for p in (0, 1):
        assert txn.send("tx", p, [f"a{p}".encode(), f"b{p}".encode()]).error_code == 0
        hidden = fetch(two_brokers, "tx", p, committed=True)
        assert (hidden.records, hidden.last_stable_offset, hidden.high_watermark) == (b"", 0, 2)
        assert data_values(fetch(two_brokers, "tx", p, committed=False).records) == [f"a{p}".encode(), f"b{p}".encode()]
    assert txn.end(commit=True).error_code == 0
    for p in (0, 1):  # one partition is led by the coordinator, the other by the other broker
        wait_for(lambda p=p: committed_lso(two_brokers, "tx", p) == 3, what="the marker")  # type: ignore[misc]
        seen = fetch(two_brokers, "tx", p, committed=True)
        assert data_values(seen.records) == [f"a{p}".encode(), f"b{p}".encode()]
        assert list(seen.aborted_transactions) == []
        [_, (marker_at, marker)] = list(iter_headers(seen.records))
        assert marker.is_control and control_type(seen.records, marker_at) == 1  # COMMIT


def test_an_aborted_transaction_is_named_to_read_committed_fetches(two_brokers: LocalCluster) -> None:
    txn = Txn(two_brokers, "t-abort")
    txn.init()
    txn.add("tx", [0])
    assert txn.send("tx", 0, [b"doomed"]).error_code == 0
    assert txn.end(commit=False).error_code == 0
    wait_for(lambda: fetch(two_brokers, "tx", 0, committed=True).last_stable_offset == 2, what="the abort marker")
    seen = fetch(two_brokers, "tx", 0, committed=True)
    assert [(a.producer_id, a.first_offset) for a in seen.aborted_transactions] == [(txn.pid, 0)]
    # The next transaction of the same producer commits, and only it is named committed.
    txn.add("tx", [0])
    assert txn.send("tx", 0, [b"kept"]).error_code == 0
    assert txn.end(commit=True).error_code == 0
    wait_for(lambda: fetch(two_brokers, "tx", 0, committed=True).last_stable_offset == 4, what="the commit marker")
    again = fetch(two_brokers, "tx", 0, committed=True)
    assert [(a.producer_id, a.first_offset) for a in again.aborted_transactions] == [(txn.pid, 0)]


def test_a_new_producer_of_the_id_fences_the_old_one(two_brokers: LocalCluster) -> None:
    zombie = Txn(two_brokers, "t-fence")
    zombie.init()
    zombie.add("tx", [1])
    assert zombie.send("tx", 1, [b"zombie"]).error_code == 0
    successor = Txn(two_brokers, "t-fence")
    successor.init()  # aborts the zombie's transaction (epoch bumped), then a newer epoch
    assert successor.epoch > zombie.epoch
    assert zombie.end(commit=True).error_code == PRODUCER_FENCED
    assert zombie.send("tx", 1, [b"late"]).error_code == INVALID_PRODUCER_EPOCH
    wait_for(lambda: fetch(two_brokers, "tx", 1, committed=True).last_stable_offset >= 2, what="the abort marker")
    seen = fetch(two_brokers, "tx", 1, committed=True)
    assert [(a.producer_id, a.first_offset) for a in seen.aborted_transactions] == [(zombie.pid, 0)]


def test_an_expired_transaction_is_aborted_by_the_coordinator(two_brokers: LocalCluster) -> None:
    txn = Txn(two_brokers, "t-expire", timeout_ms=5000)  # outlives the send on a loaded machine
    txn.init()
    txn.add("tx", [0])
    assert txn.send("tx", 0, [b"slow"]).error_code == 0
    wait_for(
        lambda: len(fetch(two_brokers, "tx", 0, committed=True).aborted_transactions) == 1,
        what="the coordinator to abort the expired transaction",
    )
    assert txn.end(commit=True).error_code == PRODUCER_FENCED


def test_a_decided_transaction_completes_after_its_coordinator_is_killed(two_brokers: LocalCluster) -> None:
    txn = Txn(two_brokers, "t-crash")
    txn.init()
    coordinator = next(b for b in two_brokers.brokers.values() if b.address == txn.coordinator())
    txn.add("tx", [0, 1])
    for p in (0, 1):
        assert txn.send("tx", p, [b"survives"]).error_code == 0
    other = next(b for b in two_brokers.brokers.values() if b is not coordinator)
    other.pause()  # the markers of partitions it leads cannot be written now
    try:
        assert txn.end(commit=True).error_code == 0  # decided: PrepareCommit is in ZooKeeper
    finally:
        coordinator.kill()
        other.resume()
    coordinator.start()
    for p in (0, 1):
        wait_for(
            lambda p=p: committed_lso(two_brokers, "tx", p) == 2,  # type: ignore[misc]
            timeout_s=60,
            what=f"the commit marker on tx-{p} from the recovered coordinator",
        )
        assert data_values(fetch(two_brokers, "tx", p, committed=True).records) == [b"survives"]
