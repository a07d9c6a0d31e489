"""One real broker process on a real ZooKeeper: produce, consume, restart, bad input."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import grpc
import pytest
from kazoo.client import KazooClient

from kbroker.cluster import zkdata
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.errors import (
    InvalidReplicationFactorError,
    InvalidTopicError,
    MessageSizeTooLargeError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from kclient.partitioner import partition_for_key
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2
from kclient.records import BatchBuilder

pytestmark = pytest.mark.integration


def create(cluster: LocalCluster, name: str, partitions: int = 1, **configs: str) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs)])


def consume_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 30) -> list:
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as c:
        parts = sorted(c.partitions_for_topic(topic) or ())
        c.assign([TopicPartition(topic, p) for p in parts])
        out: list = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                out.extend(recs)
        return out


def stub(cluster: LocalCluster) -> broker_pb2_grpc.BrokerStub:
    return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.bootstrap))


def test_produce_then_consume_in_order(cluster: LocalCluster) -> None:
    create(cluster, "orders", 3)
    with Producer(bootstrap_servers=cluster.bootstrap, acks=1, linger_ms=2) as p:
        futures = [
            p.send("orders", f"v{i}".encode(), key=f"k{i % 7}".encode(), headers=[("h", b"x")]) for i in range(3000)
        ]
        p.flush()
        metas = [f.get(10) for f in futures]
    records = consume_all(cluster.bootstrap, "orders", 3000)
    assert len(records) == 3000
    by_key: dict[bytes, list[int]] = {}
    for r in records:
        assert r.partition == partition_for_key(r.key, 3)
        assert r.headers == [("h", b"x")]
        by_key.setdefault(r.key, []).append(int(r.value[1:]))
    for values in by_key.values():
        assert values == sorted(values), "records of one key must stay in send order"
    # Every acknowledged offset is where the consumer found the record.
    found = {(r.partition, r.offset): r.value for r in records}
    for i, m in enumerate(metas):
        assert found[(m.partition, m.offset)] == f"v{i}".encode()


def test_keyless_records_spread_evenly(cluster: LocalCluster) -> None:
    create(cluster, "spread", 4)
    with Producer(bootstrap_servers=cluster.bootstrap, batch_size=1024, linger_ms=0) as p:
        metas = [p.send("spread", b"x" * 100) for _ in range(4000)]
        p.flush()
        counts = [0] * 4
        for f in metas:
            counts[f.get(10).partition] += 1
    assert min(counts) > 4000 / 4 * 0.7, counts


def test_explicit_partition_and_unknown_partition(cluster: LocalCluster) -> None:
    create(cluster, "explicit", 2)
    with Producer(bootstrap_servers=cluster.bootstrap) as p:
        assert p.send("explicit", b"a", partition=1).get(10).partition == 1
        with pytest.raises(UnknownTopicOrPartitionError):
            p.send("explicit", b"a", partition=5)


def test_long_poll_returns_when_data_arrives(cluster: LocalCluster) -> None:
    create(cluster, "lp")
    with Consumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=15000) as c:
        c.assign([TopicPartition("lp", 0)])
        assert c.position(TopicPartition("lp", 0)) == 0

        def later() -> None:
            time.sleep(1.0)
            with Producer(bootstrap_servers=cluster.bootstrap) as p:
                p.send("lp", b"hello").get(10)

        t = threading.Thread(target=later)
        t.start()
        start = time.monotonic()
        got = c.poll(timeout_ms=20000)
        waited = time.monotonic() - start
        t.join()
    assert [r.value for r in got[TopicPartition("lp", 0)]] == [b"hello"]
    assert 0.5 < waited < 10.0  # answered when the record came, not at fetch_max_wait_ms


def test_seek_rewind_skip_and_offsets_for_times(cluster: LocalCluster) -> None:
    create(cluster, "seek")
    tp = TopicPartition("seek", 0)
    with Producer(bootstrap_servers=cluster.bootstrap) as p:
        for i in range(100):
            p.send("seek", str(i).encode(), timestamp_ms=1_000_000 + i * 10)
        p.flush()
    with Consumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        assert c.beginning_offsets([tp]) == {tp: 0}
        assert c.end_offsets([tp]) == {tp: 100}
        c.seek(tp, 40)
        first = c.poll(timeout_ms=5000, max_records=5)[tp]
        assert [r.offset for r in first] == [40, 41, 42, 43, 44]
        c.seek(tp, 10)  # rewind
        assert c.poll(timeout_ms=5000, max_records=1)[tp][0].value == b"10"
        c.seek_to_end(tp)
        assert c.position(tp) == 100
        c.seek_to_beginning(tp)
        assert c.position(tp) == 0
        found = c.offsets_for_times({tp: 1_000_000 + 555})
        assert found[tp] is not None and found[tp].offset == 56 and found[tp].timestamp == 1_000_560
        assert c.offsets_for_times({tp: 9_999_999_999})[tp] is None
        with pytest.raises(OffsetOutOfRangeError):
            c.seek(tp, -1)


def test_out_of_range_fetch_offset_resets_or_raises(cluster: LocalCluster) -> None:
    create(cluster, "oor")
    tp = TopicPartition("oor", 0)
    with Producer(bootstrap_servers=cluster.bootstrap) as p:
        p.send("oor", b"only").get(10)
    s = stub(cluster)
    for offset in (-5, 99):
        req = log_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, max_bytes=1 << 20)
        req.topics.add(name="oor").partitions.add(index=0, fetch_offset=offset, partition_max_bytes=1 << 20)
        resp = s.Fetch(req, timeout=10)
        assert resp.topics[0].partitions[0].error_code == OffsetOutOfRangeError.errno
    with Consumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="none") as c:
        c.assign([tp])
        with pytest.raises(NoOffsetForPartitionError):
            c.poll(timeout_ms=1000)
        c.seek(tp, 50)
        with pytest.raises(OffsetOutOfRangeError):
            c.poll(timeout_ms=2000)


def test_bad_batches_are_refused_and_change_nothing(cluster: LocalCluster) -> None:
    create(cluster, "strict", **{"max.message.bytes": "2000"})
    s = stub(cluster)

    def produce(records: bytes) -> log_pb2.ProducePartitionResponse:
        req = log_pb2.ProduceRequest(acks=1, timeout_ms=5000)
        req.topics.add(name="strict").partitions.add(index=0, records=records)
        return s.Produce(req, timeout=10).topics[0].partitions[0]

    good = BatchBuilder()
    good.append(1, None, b"fine")
    assert produce(good.build()).error_code == 0

    corrupt = bytearray(good.build())
    corrupt[-1] ^= 0xFF
    r = produce(bytes(corrupt))
    assert r.error_code == 2 and "crc" in r.error_message.lower()  # CORRUPT_MESSAGE

    big = BatchBuilder()
    big.append(1, None, b"x" * 5000)
    assert produce(big.build()).error_code == MessageSizeTooLargeError.errno

    assert produce(good.build()[:-3]).error_code == 2  # torn batch
    assert produce(b"").error_code == 2

    req = log_pb2.ProduceRequest(acks=1, timeout_ms=5000)
    req.topics.add(name="nope").partitions.add(index=0, records=good.build())
    assert s.Produce(req, timeout=10).topics[0].partitions[0].error_code == UnknownTopicOrPartitionError.errno

    req = log_pb2.ProduceRequest(acks=7, timeout_ms=5000)
    req.topics.add(name="strict").partitions.add(index=0, records=good.build())
    assert s.Produce(req, timeout=10).topics[0].partitions[0].error_code == 21  # INVALID_REQUIRED_ACKS

    with Consumer(bootstrap_servers=cluster.bootstrap) as c:
        assert c.end_offsets([TopicPartition("strict", 0)]) == {TopicPartition("strict", 0): 1}

    with (
        Producer(bootstrap_servers=cluster.bootstrap, max_request_size=1000) as p,
        pytest.raises(MessageSizeTooLargeError),
    ):
        p.send("strict", b"y" * 5000)


def test_malformed_request_gets_invalid_argument(cluster: LocalCluster) -> None:
    create(cluster, "malformed")
    req = log_pb2.FetchRequest(replica_id=-1, max_wait_ms=-1, max_bytes=10)
    with pytest.raises(grpc.RpcError) as info:
        stub(cluster).Fetch(req, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(info.value.trailing_metadata())["kbroker-error-code"] == "42"


def test_admin_errors(cluster: LocalCluster) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        for bad in ("bad name", "x" * 250, "..", "a/b", ""):
            with pytest.raises(InvalidTopicError):
                admin.create_topics([NewTopic(bad, 1, 1)])
        admin.create_topics([NewTopic("dup", 1, 1)])
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("dup", 1, 1)])
        with pytest.raises(InvalidReplicationFactorError):
            admin.create_topics([NewTopic("rf", 1, 3)])
        from kclient.errors import InvalidConfigurationError

        with pytest.raises(InvalidConfigurationError):
            admin.create_topics([NewTopic("cfg", 1, 1, topic_configs={"retention.ms": "soon"})])
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_topics(["never-was"])
        assert admin.list_topics() == ["dup"]


def test_metadata_and_topics_from_zookeeper_watches(cluster: LocalCluster) -> None:
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start()
    try:
        # Written directly into ZooKeeper, as kafka-topics.sh --zookeeper did.
        zk.create(zkdata.topic_config_path("direct"), zkdata.encode_topic_config({}), makepath=True)
        zk.create(zkdata.topic_path("direct"), zkdata.encode_assignment({0: [0], 1: [0]}), makepath=True)
        with AdminClient(cluster.bootstrap) as admin:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                d = admin.describe_topics(["direct"]) if "direct" in admin.list_topics() else []
                if d and all(p.leader == 0 for p in d[0].partitions):
                    break
                time.sleep(0.1)
            else:
                pytest.fail("topic written to ZooKeeper never got leaders")
            brokers, controller, cluster_id = admin.describe_cluster()
            assert [b.node_id for b in brokers] == [0] and controller == 0 and cluster_id
            state, _ = zk.get(zkdata.partition_state_path("direct", 1))
            assert zkdata.decode_leader_and_isr(state).isr == [0]
            with Producer(bootstrap_servers=cluster.bootstrap) as p:
                p.send("direct", b"v", partition=1).get(10)
            data_dir = cluster.brokers[0].data_dir
            assert (data_dir / "direct-1").is_dir()
            admin.delete_topics(["direct"])
            assert "direct" not in admin.list_topics()
            deadline = time.monotonic() + 10
            while (data_dir / "direct-1").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not (data_dir / "direct-1").exists()
            assert zk.exists(zkdata.topic_path("direct")) is None
    finally:
        zk.stop()


def test_sigkill_restart_keeps_acknowledged_records(cluster: LocalCluster) -> None:
    create(cluster, "durable", 2, **{"segment.bytes": "20000"})
    acked = []
    with Producer(bootstrap_servers=cluster.bootstrap, acks=1) as p:
        futures = [p.send("durable", f"{i}".encode(), key=str(i).encode()) for i in range(2000)]
        p.flush()
        acked = [f.get(10) for f in futures]
    broker = cluster.brokers[0]
    broker.kill()
    broker.start()
    records = consume_all(cluster.bootstrap, "durable", 2000)
    got = {(r.partition, r.offset): r.value for r in records}
    assert len(records) == 2000
    for i, m in enumerate(acked):
        assert got[(m.partition, m.offset)] == str(i).encode()
    # And the restarted broker appends after them.
    with Producer(bootstrap_servers=cluster.bootstrap) as p:
        m = p.send("durable", b"after", partition=0).get(10)
    assert m.offset == sum(1 for a in acked if a.partition == 0)


def test_sigterm_is_clean_and_deregisters(cluster: LocalCluster) -> None:
    create(cluster, "clean")
    broker = cluster.brokers[0]
    assert broker.stop() == 0
    assert (broker.data_dir / ".kafka_cleanshutdown").exists()
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start()
    try:
        assert zk.exists(zkdata.broker_path(0)) is None
    finally:
        zk.stop()
    broker.start()
    assert not (broker.data_dir / ".kafka_cleanshutdown").exists()


def test_second_broker_with_live_id_is_refused(cluster: LocalCluster, tmp_path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kbroker.server",
            "--broker-id",
            "0",
            "--zookeeper",
            cluster.zk_connect,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(tmp_path / "other"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "already registered" in proc.stderr
    assert cluster.brokers[0].running()


def test_bad_broker_config_is_one_line_and_nonzero(tmp_path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kbroker.server",
            "--broker-id",
            "1",
            "--zookeeper",
            "127.0.0.1:1",
            "--data-dir",
            str(tmp_path),
            "-o",
            "log.retention.ms=forever",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "retention.ms" in proc.stderr


@pytest.mark.parametrize("compression", ["gzip", "lz4", "zstd"])
def test_compressed_batches_round_trip(cluster: LocalCluster, compression: str) -> None:
    create(cluster, f"c-{compression}")
    with Producer(bootstrap_servers=cluster.bootstrap, compression_type=compression) as p:
        for i in range(500):
            p.send(f"c-{compression}", f"value-{i}".encode() * 3, key=b"k")
        p.flush()
    records = consume_all(cluster.bootstrap, f"c-{compression}", 500)
    assert [r.value for r in records] == [f"value-{i}".encode() * 3 for i in range(500)]
    assert [r.offset for r in records] == list(range(500))


def test_acks_zero_does_not_wait_but_delivers(cluster: LocalCluster) -> None:
    create(cluster, "fire")
    with Producer(bootstrap_servers=cluster.bootstrap, acks=0) as p:
        metas = [p.send("fire", str(i).encode()) for i in range(200)]
        p.flush()
        assert all(m.get(10).offset == -1 for m in metas)
    records = consume_all(cluster.bootstrap, "fire", 200)
    assert [r.value for r in records] == [str(i).encode() for i in range(200)]
