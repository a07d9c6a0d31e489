"""Replication throttling of a move (KIP-73), with real brokers and kctl: ``--throttle``
bounds how fast a partition's data reaches its new replica, while a partition replicating
normally through the same follower fetcher keeps up; ``--verify`` removes the throttles
when the move is done."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic, Producer
from kclient.proto.kbroker.v1 import config_pb2
from tests.integration.test_kctl import kctl, ok
from tests.support import wait_until

pytestmark = pytest.mark.integration

RECORD = b"v" * 1000
RECORDS = 6000  # ~6 MB
RATE = 300_000  # B/s: Kafka's rate starts as if 10 s had passed, so ~3 MB goes first


def configs(bootstrap: str, rtype: int, name: str) -> dict[str, str]:
    with AdminClient(bootstrap) as admin:
        entries = admin.describe_configs([(rtype, name)])[(rtype, name)]
    dynamic = (config_pb2.TOPIC_CONFIG, config_pb2.DYNAMIC_BROKER_CONFIG)
    return {k: e.value for k, e in entries.items() if e.config_source in dynamic}


def moved(admin: AdminClient, topic: str, target: list[int]) -> bool:
    (p,) = admin.describe_topics([topic])[0].partitions
    return list(p.replicas) == target and not admin.list_partition_reassignments()


def move_seconds(cluster: LocalCluster, topic: str, target: list[int]) -> float:
    """How long an unthrottled move of ``topic``-0 takes (started and watched over the RPCs)."""
    with AdminClient(cluster.bootstrap) as admin:
        start = time.monotonic()
        admin.alter_partition_reassignments({(topic, 0): target})
        wait_until(lambda: moved(admin, topic, target), timeout_s=120, what=f"the move of {topic}")
        return time.monotonic() - start


def fill(bootstrap: str, topic: str) -> None:
    with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5) as p:
        for _ in range(RECORDS):
            p.send(topic, RECORD, partition=0)
        p.flush(60)


def test_a_throttled_move_is_rate_bounded_and_normal_replication_is_not(
    cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = cluster_factory(2)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("fast", replica_assignments={0: [0]})])
        admin.create_topics([NewTopic("slow", replica_assignments={0: [0]})])
    fill(cluster.bootstrap, "fast")
    fill(cluster.bootstrap, "slow")
    cluster.add_broker()  # broker 2
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("live", replica_assignments={0: [0, 2]})])

    unthrottled = move_seconds(cluster, "fast", [2])

    z = f"--zookeeper {cluster.zk_connect}"
    plan = tmp_path / "slow.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [{"topic": "slow", "partition": 0, "replicas": [2]}]}))
    started = time.monotonic()
    out = ok(kctl(z, f"partitions reassign --execute --reassignment-json-file {plan} --throttle {RATE}"))
    assert "Warning: You must run --verify periodically" in out and f"set to {RATE} B/s" in out, out
    assert configs(cluster.bootstrap, config_pb2.TOPIC, "slow") == {
        "leader.replication.throttled.replicas": "0:0",
        "follower.replication.throttled.replicas": "0:2",
    }
    for b in ("0", "2"):
        assert configs(cluster.bootstrap, config_pb2.BROKER, b) == {
            "leader.replication.throttled.rate": str(RATE),
            "follower.replication.throttled.rate": str(RATE),
        }

    # Normal replication through the same leader -> broker 2 fetcher is not held back.
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as p:
        futures = [p.send("live", b"%d" % i) for i in range(200)]
        p.flush(30)
        assert all(f.get(1).offset >= 0 for f in futures)
    verify = f"partitions reassign --verify --reassignment-json-file {plan}"
    assert kctl(z, verify).returncode == 1, "the throttled move was already done"

    with AdminClient(cluster.bootstrap) as admin:
        wait_until(lambda: moved(admin, "slow", [2]), timeout_s=120, what="the throttled move")
    throttled = time.monotonic() - started
    size = RECORDS * len(RECORD)
    # Kafka's quota lets ~10 s worth through at once, then holds the rate.
    floor = (size - 10 * RATE) / RATE
    print(f"move of {size} B: unthrottled {unthrottled:.2f} s, throttled at {RATE} B/s {throttled:.2f} s")
    assert throttled >= 0.7 * floor, (throttled, floor, unthrottled)
    # The rate, not the machine, holds the throttled move: a loaded machine slows both.
    assert unthrottled < 0.6 * throttled, (throttled, floor, unthrottled)

    # The last --verify cleared the throttles on every broker and the topic.
    cleared = ok(kctl(z, verify))
    assert "Clearing broker-level throttles on brokers 0,1,2" in cleared, cleared
    assert "Clearing topic-level throttles on topic slow" in cleared, cleared
    assert configs(cluster.bootstrap, config_pb2.TOPIC, "slow") == {}
    for b in ("0", "1", "2"):
        assert configs(cluster.bootstrap, config_pb2.BROKER, b) == {}
