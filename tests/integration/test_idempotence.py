"""The idempotent producer (KIP-98) against real brokers: ids, duplicates, sequences, restarts."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import grpc
import pytest
from kazoo.client import KazooClient

from kbroker.cluster import zkdata
from kbroker.cluster.producer_ids import ProducerIdManager
from kbroker.cluster.zk_client import ZkClient
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.errors import InvalidConfigError, MessageSizeTooLargeError
from kclient.producer import batch as batch_module
from kclient.producer.sender import Sender
from kclient.proto.kbroker.v1 import broker_pb2_grpc, cluster_pb2, log_pb2
from kclient.records import BatchBuilder, BatchHeader, Record, decode_batches

pytestmark = pytest.mark.integration

OUT_OF_ORDER_SEQUENCE_NUMBER = 45


def create(cluster: LocalCluster, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs or {})])


@functools.cache
def stub_for(address: str) -> broker_pb2_grpc.BrokerStub:
    return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(address))


def init_producer_id(address: str) -> tuple[int, int]:
    resp = stub_for(address).InitProducerId(cluster_pb2.InitProducerIdRequest(), timeout=10)
    assert resp.error_code == 0, resp.error_message
    return resp.producer_id, resp.producer_epoch


def idempotent_batch(pid: int, seq: int, values: list[bytes], epoch: int = 0) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for v in values:
        builder.append(int(time.time() * 1000), None, v)
    return builder.build()


def produce(
    address: str, topic: str, records: bytes, *, retry_s: float = 0.0, acks: int = -1
) -> log_pb2.ProducePartitionResponse:
    """Produce ``records`` to partition 0; retries retriable errors for ``retry_s`` (after a restart)."""
    deadline = time.monotonic() + retry_s
    while True:
        req = log_pb2.ProduceRequest(acks=acks, timeout_ms=10000)
        req.topics.add(name=topic).partitions.add(index=0, records=records)
        try:
            r = stub_for(address).Produce(req, timeout=15).topics[0].partitions[0]
            if r.error_code in (0, OUT_OF_ORDER_SEQUENCE_NUMBER) or time.monotonic() > deadline:
                return r
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def fetch_batches(address: str, topic: str, partition: int) -> list[tuple[BatchHeader, list[Record]]]:
    """Every batch of a partition, decoded from the raw Fetch bytes."""
    out: list[tuple[BatchHeader, list[Record]]] = []
    offset = 0
    while True:
        req = log_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, max_bytes=8 << 20)
        req.topics.add(name=topic).partitions.add(index=partition, fetch_offset=offset, partition_max_bytes=8 << 20)
        pr = stub_for(address).Fetch(req, timeout=10).topics[0].partitions[0]
        assert pr.error_code == 0, pr.error_message
        if not pr.records:
            return out
        for header, records in decode_batches(pr.records):
            out.append((header, records))
            offset = header.next_offset


def values_in(address: str, topic: str, partition: int = 0) -> list[bytes | None]:
    return [r.value for _, records in fetch_batches(address, topic, partition) for r in records]


def end_offset(bootstrap: str, topic: str, partition: int = 0) -> int:
    tp = TopicPartition(topic, partition)
    with Consumer(bootstrap_servers=bootstrap) as c:
        return c.end_offsets([tp])[tp]


def consume_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 30) -> list:
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as c:
        parts = sorted(c.partitions_for_topic(topic) or ())
        c.assign([TopicPartition(topic, p) for p in parts])
        out: list = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                out.extend(recs)
        # Anything beyond ``expected`` (a duplicate) would show up in one more poll.
        for recs in c.poll(timeout_ms=500).values():
            out.extend(recs)
        return out


# --- producer ids --------------------------------------------------------------------


def test_init_producer_id_gives_distinct_ids(cluster: LocalCluster) -> None:
    ids = [init_producer_id(cluster.bootstrap) for _ in range(5)]
    assert [epoch for _, epoch in ids] == [0] * 5
    assert len({pid for pid, _ in ids}) == 5
    assert all(pid >= 0 for pid, _ in ids)


def test_producer_id_blocks_of_two_brokers_do_not_overlap(cluster_factory: Callable[..., LocalCluster]) -> None:
    c = cluster_factory(2)
    a, b = (c.brokers[i].address for i in (0, 1))
    from_a = [init_producer_id(a)[0] for _ in range(3)]
    from_b = [init_producer_id(b)[0] for _ in range(3)]
    from_a += [init_producer_id(a)[0] for _ in range(2)]
    assert len(set(from_a) | set(from_b)) == 8
    # Each broker hands out ids from its own block of 1000.
    assert len({pid // 1000 for pid in from_a}) == 1 and len({pid // 1000 for pid in from_b}) == 1
    assert from_a[0] // 1000 != from_b[0] // 1000
    zk = KazooClient(hosts=c.zk_connect)
    zk.start()
    try:
        data, _ = zk.get(zkdata.LATEST_PRODUCER_ID_BLOCK)
        block = zkdata.decode_producer_id_block(data)
        assert block.block_end == 1999 and block.block_end - block.block_start == 999
        assert block.broker in (0, 1)
    finally:
        zk.stop()


# --- duplicates and sequences over raw gRPC -----------------------------------------


def test_resent_batch_is_written_once(cluster: LocalCluster) -> None:
    create(cluster, "dedup")
    pid, epoch = init_producer_id(cluster.bootstrap)
    first = idempotent_batch(pid, 0, [b"a", b"b", b"c"], epoch)
    r1 = produce(cluster.bootstrap, "dedup", first)
    r2 = produce(cluster.bootstrap, "dedup", first)
    assert (r1.error_code, r2.error_code) == (0, 0)
    assert r1.base_offset == r2.base_offset == 0
    r3 = produce(cluster.bootstrap, "dedup", idempotent_batch(pid, 3, [b"d"], epoch))
    assert (r3.error_code, r3.base_offset) == (0, 3)
    assert produce(cluster.bootstrap, "dedup", first).base_offset == 0  # still among the last 5
    records = consume_all(cluster.bootstrap, "dedup", 4)
    assert [(r.offset, r.value) for r in records] == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]


def test_skipped_sequence_is_refused_and_writes_nothing(cluster: LocalCluster) -> None:
    create(cluster, "gaps")
    pid, epoch = init_producer_id(cluster.bootstrap)
    assert produce(cluster.bootstrap, "gaps", idempotent_batch(pid, 0, [b"x", b"y"], epoch)).error_code == 0
    r = produce(cluster.bootstrap, "gaps", idempotent_batch(pid, 3, [b"skipped-one"], epoch))
    assert r.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "sequence" in r.error_message
    assert end_offset(cluster.bootstrap, "gaps") == 2
    assert values_in(cluster.bootstrap, "gaps") == [b"x", b"y"]


# --- the Producer --------------------------------------------------------------------


def test_default_producer_delivers_exactly_once_in_order(cluster: LocalCluster) -> None:
    create(cluster, "exactly", 3)
    n = 5000
    with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=2, batch_size=4096) as p:
        assert p.config["enable_idempotence"] is True
        futures = [p.send("exactly", str(i).encode(), key=str(i % 11).encode()) for i in range(n)]
        p.flush()
        metas = [f.get(10) for f in futures]
    records = consume_all(cluster.bootstrap, "exactly", n)
    assert len(records) == n
    assert sorted(int(r.value) for r in records) == list(range(n))
    for part in range(3):
        in_partition = [int(r.value) for r in records if r.partition == part]
        assert in_partition == sorted(in_partition), "records of a partition must stay in send order"
    found = {(r.partition, r.offset): r.value for r in records}
    for i, m in enumerate(metas):
        assert found[(m.partition, m.offset)] == str(i).encode()
    producer_ids = set()
    for part in range(3):
        batches = fetch_batches(cluster.bootstrap, "exactly", part)
        assert batches
        expected_seq = 0
        for header, recs in batches:
            assert header.producer_id >= 0 and header.producer_epoch == 0
            assert header.base_sequence == expected_seq
            expected_seq += len(recs)
            producer_ids.add(header.producer_id)
    assert len(producer_ids) == 1


def test_idempotence_settings(cluster: LocalCluster) -> None:
    with pytest.raises(InvalidConfigError):
        Producer(bootstrap_servers=cluster.bootstrap, acks=1, enable_idempotence=True)
    with Producer(bootstrap_servers=cluster.bootstrap, acks=1) as p:
        assert p.config["enable_idempotence"] is False
    create(cluster, "plain")
    with Producer(bootstrap_servers=cluster.bootstrap, enable_idempotence=False) as p:
        p.send("plain", b"v").get(10)
    ((header, _),) = fetch_batches(cluster.bootstrap, "plain", 0)
    assert header.producer_id == -1 and header.base_sequence == -1


def test_a_refused_batch_restarts_the_partition_sequence(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    create(cluster, "refuse", configs={"max.message.bytes": "3000"})
    # Slow responses down so that batches queue up behind the refused one and have to
    # be resent with their new sequence (white box: the sender's and the batch's hooks).
    on_response, restamp = Sender._on_response, batch_module.restamp
    restamped: list[object] = []

    def slow_response(self: Sender, call: object, group: list, addr: str, *rest: object) -> None:
        time.sleep(0.2)
        on_response(self, call, group, addr, *rest)

    def counting_restamp(payload: bytes, stamp: tuple[int, int, int]) -> bytes:
        restamped.append(stamp)
        return restamp(payload, stamp)

    monkeypatch.setattr(Sender, "_on_response", slow_response)
    monkeypatch.setattr(batch_module, "restamp", counting_restamp)
    with Producer(bootstrap_servers=cluster.bootstrap, batch_size=1000, linger_ms=50) as p:
        p.send("refuse", b"before").get(10)
        big = p.send("refuse", b"B" * 5000)  # its own batch, refused by the broker
        after = [p.send("refuse", f"after-{i}".encode() * 10) for i in range(40)]  # queued behind it
        with pytest.raises(MessageSizeTooLargeError):
            big.get(10)
        metas = [f.get(10) for f in after]
        later = p.send("refuse", b"later").get(10)
    assert [m.offset for m in metas] == list(range(1, 41))
    assert later.offset == 41
    assert restamped, "batches queued behind the refused one get their new sequence"
    values = values_in(cluster.bootstrap, "refuse")
    assert values == [b"before", *(f"after-{i}".encode() * 10 for i in range(40)), b"later"]
    batches = fetch_batches(cluster.bootstrap, "refuse", 0)
    assert len(batches) > 3
    first = batches[0][0]
    assert (first.producer_epoch, first.base_sequence) == (0, 0)
    # After the refusal the stream restarted at sequence 0 in epoch 1, without gaps.
    expected_seq = 0
    for header, recs in batches[1:]:
        assert header.producer_id == first.producer_id and header.producer_epoch == 1
        assert header.base_sequence == expected_seq
        expected_seq += len(recs)


# --- restarts ------------------------------------------------------------------------


def test_duplicate_detected_after_sigkill_and_restart(cluster: LocalCluster) -> None:
    create(cluster, "survive", configs={"segment.bytes": "2000"})
    pid, epoch = init_producer_id(cluster.bootstrap)
    seq = 0
    last = b""
    for i in range(30):
        last = idempotent_batch(pid, seq, [f"{i}-{j}".encode() * 5 for j in range(3)], epoch)
        r = produce(cluster.bootstrap, "survive", last)
        assert (r.error_code, r.base_offset) == (0, 3 * i)
        seq += 3
    broker = cluster.brokers[0]
    broker.kill()
    broker.start()
    r = produce(cluster.bootstrap, "survive", last, retry_s=30)
    assert (r.error_code, r.base_offset) == (0, 87), r.error_message
    assert end_offset(cluster.bootstrap, "survive") == 90
    # The sequence continues where the log says it stopped.
    r = produce(cluster.bootstrap, "survive", idempotent_batch(pid, seq + 1, [b"gap"], epoch))
    assert r.error_code == OUT_OF_ORDER_SEQUENCE_NUMBER
    r = produce(cluster.bootstrap, "survive", idempotent_batch(pid, seq, [b"next"], epoch))
    assert (r.error_code, r.base_offset) == (0, 90)
    values = values_in(cluster.bootstrap, "survive")
    assert len(values) == 91 and values[-1] == b"next"


def test_concurrent_block_claims_never_overlap(zk_connect: str) -> None:
    """Two managers racing for blocks in one ZooKeeper: compare-and-set keeps ids unique."""
    clients = [ZkClient(zk_connect) for _ in range(2)]
    for c in clients:
        c.start()
    try:
        # An empty znode (as Kafka's broker creates it at start-up) means "nothing claimed".
        clients[0].kazoo.create(zkdata.LATEST_PRODUCER_ID_BLOCK, b"")
        managers = [ProducerIdManager(c, broker_id) for broker_id, c in enumerate(clients)]
        got: list[list[int]] = [[], []]

        def run(i: int) -> None:
            for _ in range(2500):
                pid, epoch = managers[i].generate()
                assert epoch == 0
                got[i].append(pid)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        everything = got[0] + got[1]
        assert len(everything) == 5000 and len(set(everything)) == 5000
        assert min(everything) == 0
        blocks = [{pid // 1000 for pid in g} for g in got]
        assert not blocks[0] & blocks[1] and len(blocks[0]) == len(blocks[1]) == 3
        data, _ = clients[0].kazoo.get(zkdata.LATEST_PRODUCER_ID_BLOCK)
        assert zkdata.decode_producer_id_block(data).block_end == 5999
    finally:
        for c in clients:
            c.close()
