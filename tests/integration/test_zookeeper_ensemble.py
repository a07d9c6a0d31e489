"""Brokers on a 3-node ZooKeeper ensemble: one node down changes nothing; with the
quorum lost, existing leaders keep serving reads and writes; the cluster recovers
when ZooKeeper returns."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.local.cluster import LocalCluster
from kbroker.local.zookeeper import ZooKeeperEnsemble, ZooKeeperNotFound, classpath
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tests.support import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    try:
        classpath()
    except ZooKeeperNotFound as exc:
        pytest.skip(str(exc))
    zk = ZooKeeperEnsemble(tmp_path / "ensemble", size=3)
    zk.start(timeout_s=90)
    try:
        yield zk
    finally:
        zk.stop()


def produce(bootstrap: str, topic: str, values: list[bytes], acks: str | int = "all") -> None:
    with Producer(bootstrap_servers=bootstrap, acks=acks, request_timeout_ms=5000, delivery_timeout_ms=30000) as p:
        futures = [p.send(topic, v, partition=0) for v in values]
        p.flush(60)
        for f in futures:
            f.get(1)


def consume(bootstrap: str, topic: str, n: int) -> list[bytes]:
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", request_timeout_ms=5000) as c:
        c.assign([TopicPartition(topic, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(out) < n and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                out.extend(r.value for r in recs)
        return out


def test_cluster_survives_zookeeper_node_and_quorum_loss(ensemble: ZooKeeperEnsemble, tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path / "brokers",
        ensemble.connect_string + "/kb",
        {"zookeeper.session.timeout.ms": "6000", "replica.lag.time.max.ms": "6000"},
    )
    cluster.start(3)
    try:
        with AdminClient(cluster.bootstrap) as admin:
            admin.create_topics([NewTopic("zk", 1, 3, topic_configs={"min.insync.replicas": "2"})])
            wait_until(lambda: len(admin.describe_topics(["zk"])[0].partitions[0].isr) == 3, what="full ISR")
        produce(cluster.bootstrap, "zk", [b"a%d" % i for i in range(50)])
        with AdminClient(cluster.bootstrap) as admin:
            admin.alter_consumer_group_offsets("keeper", {TopicPartition("zk", 0): 42})

        ensemble.servers[0].kill()  # one of three: the quorum holds
        produce(cluster.bootstrap, "zk", [b"b%d" % i for i in range(50)])
        with AdminClient(cluster.bootstrap) as admin:
            admin.create_topics([NewTopic("zk2", 1, 3)])
        assert len(consume(cluster.bootstrap, "zk", 100)) == 100

        ensemble.servers[1].kill()  # quorum lost: metadata frozen, data path keeps going
        time.sleep(2)
        produce(cluster.bootstrap, "zk", [b"c%d" % i for i in range(50)])
        assert consume(cluster.bootstrap, "zk", 150)[-1] == b"c49"
        assert all(b.running() for b in cluster.brokers.values())

        ensemble.servers[0].start()
        ensemble.servers[1].start()
        ensemble.wait_ready(90)
        with AdminClient(cluster.bootstrap) as admin:
            wait_until(lambda: _create(admin, "after"), timeout_s=90, what="topic creation after recovery")
            wait_until(lambda: admin.describe_topics(["after"])[0].partitions[0].leader >= 0, what="leader")
        produce(cluster.bootstrap, "after", [b"ok"])
        assert consume(cluster.bootstrap, "after", 1) == [b"ok"]
        assert len(consume(cluster.bootstrap, "zk", 150)) == 150

        # The whole ensemble restarts: committed offsets are persistent znodes.
        ensemble.stop()
        for server in ensemble.servers:
            server.start()
        ensemble.wait_ready(90)
        with AdminClient(cluster.bootstrap) as admin:
            wait_until(
                lambda: admin.list_consumer_group_offsets("keeper")[TopicPartition("zk", 0)].offset == 42,
                what="committed offset after a full ZooKeeper restart",
            )
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()


def _create(admin: AdminClient, name: str) -> bool:
    from kclient.errors import TopicAlreadyExistsError

    try:
        admin.create_topics([NewTopic(name, 1, 3)], timeout_ms=10000)
    except TopicAlreadyExistsError:
        pass
    return True


def test_a_zookeeper_that_loses_its_port_to_another_is_not_taken_for_ready(tmp_path: Path) -> None:
    """Two local clusters racing for 2181: the loser must not take the winner's answers
    for its own (scripts/run then retries on a free port)."""
    try:
        classpath()
    except ZooKeeperNotFound as exc:
        pytest.skip(str(exc))
    first = ZooKeeperEnsemble(tmp_path / "first", size=1)
    first.start()
    try:
        port = first.servers[0].client_port
        second = ZooKeeperEnsemble(tmp_path / "second", size=1, client_ports=[port])
        try:
            with pytest.raises(RuntimeError, match="Address already in use"):
                second.start(timeout_s=60)
        finally:
            second.stop()
    finally:
        first.stop()
