"""Shutdown is bounded when ZooKeeper is gone, a second SIGTERM exits at once, and
nothing flushed is lost either way (each test has a ZooKeeper of its own to kill)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kbroker.local.zookeeper import ZooKeeperEnsemble, classpath
from kbroker.storage import files
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient import AdminClient, NewTopic, Producer
from kclient.errors import NotLeaderForPartitionError
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2, metadata_pb2
from kclient.records import BatchBuilder, decode_batches
from tests.support import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def own_zookeeper(tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    try:
        classpath()
    except Exception as exc:
        pytest.skip(str(exc))
    zk = ZooKeeperEnsemble(tmp_path / "zk", size=1)
    zk.start()
    try:
        yield zk
    finally:
        zk.stop()


def start_with_records(zk: ZooKeeperEnsemble, root: Path, n: int, **overrides: str) -> LocalCluster:
    quick = {"zookeeper.session.timeout.ms": "6000", "controlled.shutdown.max.retries": "1"}
    cluster = LocalCluster(root, zk.connect_string, {**quick, **overrides}).start(2)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("t", replica_assignments={0: [0, 1]})])
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        for i in range(n):
            producer.send("t", f"v{i}".encode(), partition=0)
        producer.flush(30)
    return cluster


def values_on_disk(data_dir: Path) -> list[bytes]:
    log = Log.open(data_dir / "t-0", LogConfig.from_properties({}), recovery_point=0, clean_shutdown=False)
    try:
        data = log.read(0, 1 << 24).records
    finally:
        log.close()
    return [r.value or b"" for _, batch in decode_batches(data) for r in batch]


def stop_timed(cluster: LocalCluster, broker_id: int, second_signal_after_s: float | None = None) -> tuple[float, int]:
    b = cluster.brokers[broker_id]
    assert b.proc is not None
    start = time.monotonic()
    b.signal(signal.SIGTERM)
    if second_signal_after_s is not None:
        time.sleep(second_signal_after_s)
        b.signal(signal.SIGTERM)
    code = b.proc.wait(120)
    return time.monotonic() - start, code


def test_shutdown_without_zookeeper_is_bounded(own_zookeeper: ZooKeeperEnsemble, tmp_path: Path) -> None:
    cluster = start_with_records(
        own_zookeeper,
        tmp_path / "c",
        50,
        **{"controlled.shutdown.max.retries": "2", "controlled.shutdown.retry.backoff.ms": "1000"},
    )
    try:
        own_zookeeper.servers[0].kill()
        time.sleep(1)
        elapsed, code = stop_timed(cluster, 0)
        # 2 attempts, refused at once (the controller has no ZooKeeper connection) or cut
        # off by their timeout, 1 s apart, then the rest of the shutdown.
        assert code == 0, cluster.brokers[0].log_tail()
        assert elapsed < 20, f"took {elapsed:.1f}s"
        log_text = cluster.brokers[0].log_path.read_text()
        assert "controlled shutdown attempt 2 of 2 failed: " in log_text
        assert "failed: \n" not in log_text  # every failure names its reason
        data_dir = cluster.brokers[0].data_dir
        assert (data_dir / files.CLEAN_SHUTDOWN_FILE).exists()
        assert values_on_disk(data_dir) == [f"v{i}".encode() for i in range(50)]
    finally:
        cluster.stop()


def test_a_second_sigterm_exits_at_once(own_zookeeper: ZooKeeperEnsemble, tmp_path: Path) -> None:
    cluster = start_with_records(
        own_zookeeper,
        tmp_path / "c",
        20,
        **{"controlled.shutdown.max.retries": "10", "controlled.shutdown.retry.backoff.ms": "5000"},
    )
    try:
        own_zookeeper.servers[0].kill()
        time.sleep(1)
        elapsed, code = stop_timed(cluster, 0, second_signal_after_s=1.0)
        assert elapsed < 8, f"took {elapsed:.1f}s"  # 10 x 5 s of retries were skipped
        assert code in (0, 1)
        assert values_on_disk(cluster.brokers[0].data_dir) == [f"v{i}".encode() for i in range(20)]
    finally:
        cluster.brokers[1].kill()  # its own 10 x 5 s of retries are not this test's subject
        cluster.stop()


def test_a_leader_cut_off_from_zookeeper_and_its_followers_stops_leading(
    own_zookeeper: ZooKeeperEnsemble, tmp_path: Path
) -> None:
    """Without ZooKeeper a leader keeps serving while its followers keep fetching (the
    whole ensemble is down: nobody can have replaced it). Once they fall silent too it
    is most likely deposed: it refuses produce requests and Metadata (UNAVAILABLE), so
    clients go to other brokers; it leads again when they are back."""
    cluster = start_with_records(own_zookeeper, tmp_path / "c", 5)
    try:
        stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.brokers[0].address))

        def produce() -> int:
            b = BatchBuilder()
            b.append(int(time.time() * 1000), None, b"x")
            req = log_pb2.ProduceRequest(acks=1, timeout_ms=2000)
            req.topics.add(name="t").partitions.add(index=0, records=b.build())
            return stub.Produce(req, timeout=10).topics[0].partitions[0].error_code

        def leaders() -> list[int]:
            md = stub.Metadata(metadata_pb2.MetadataRequest(topics=["t"]), timeout=10)
            return [p.leader_id for p in md.topics[0].partitions]

        assert leaders() == [0] and produce() == 0
        own_zookeeper.servers[0].kill()
        time.sleep(8)  # past the session timeout: the follower still fetches, so keep leading
        assert leaders() == [0] and produce() == 0
        cluster.brokers[1].pause()
        try:
            wait_until(lambda: produce() == NotLeaderForPartitionError.errno, 10, "produce refused")
            with pytest.raises(grpc.RpcError) as info:
                leaders()
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # ask another broker
        finally:
            cluster.brokers[1].resume()
        wait_until(lambda: leaders() == [0] and produce() == 0, 30, "leading again once the follower is back")
    finally:
        cluster.stop()


def test_the_clean_shutdown_marker_through_sigterm_and_sigkill(
    own_zookeeper: ZooKeeperEnsemble, tmp_path: Path
) -> None:
    """Kafka's ``.kafka_cleanshutdown``: a SIGTERM leaves it (every log flushed and closed),
    the next start trusts the logs and removes it; a SIGKILL leaves none and the next
    start recovers from the recovery points. Logs load on num.recovery.threads.per.data.dir
    threads."""
    quick = {"zookeeper.session.timeout.ms": "6000", "num.recovery.threads.per.data.dir": "3"}
    cluster = LocalCluster(tmp_path / "c", own_zookeeper.connect_string, quick).start(1)
    try:
        with AdminClient(cluster.bootstrap) as admin:
            admin.create_topics([NewTopic("t", replica_assignments={p: [0] for p in range(6)})])
        with Producer(bootstrap_servers=cluster.bootstrap, acks=1) as producer:
            for i in range(60):
                producer.send("t", f"v{i}".encode(), partition=0 if i < 50 else 1 + i % 5)
            producer.flush(30)
        broker = cluster.brokers[0]
        marker = broker.data_dir / files.CLEAN_SHUTDOWN_FILE
        assert not marker.exists()
        assert broker.stop() == 0
        assert marker.exists()
        broker.start()
        assert not marker.exists()
        log_text = broker.log_path.read_text()
        assert "loaded 6 logs from" in log_text and "with 3 threads (clean shutdown)" in log_text
        broker.kill()
        assert not marker.exists()
        broker.start()
        log_text = broker.log_path.read_text()
        assert "with 3 threads (unclean shutdown, recovered)" in log_text
        assert not marker.exists()
        assert broker.stop() == 0
        assert marker.exists()
        assert values_on_disk(broker.data_dir) == [f"v{i}".encode() for i in range(50)]
    finally:
        cluster.stop()
