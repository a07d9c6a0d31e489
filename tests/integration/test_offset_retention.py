"""Committed-offset retention (offsets.retention.minutes, KIP-211) on a real broker, with
Kafka's shortest retention (1 minute) and a check every second, through the Kafka door
with confluent-kafka (librdkafka):

- a group that joined, committed and left: every offset is deleted from ZooKeeper once
  the group has been Empty for the retention, and the group itself is removed;
- a standalone committer (no subscription, no generation): its offset is deleted once
  its commit is older than the retention;
- a live consumer group: its subscribed topic's offset stays however old; the offset it
  committed for a topic no member subscribes to is deleted.

One test (about 75 s): the three groups run side by side."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from kbroker.cluster import zkdata
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from tests.support import wait_until

ck = pytest.importorskip("confluent_kafka")

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SETTINGS = {
    "kafka.listeners": "PLAINTEXT://127.0.0.1:0",
    "offsets.retention.minutes": "1",
    "offsets.retention.check.interval.ms": "1000",
    "group.initial.rebalance.delay.ms": "0",
}
RETENTION_S = 60.0


def _consumer(cluster: LocalCluster, group: str) -> object:
    return ck.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": group,
            "enable.auto.commit": False,
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 500,
        }
    )


def _assigned(consumer: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not consumer.assignment():  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "no assignment"
        consumer.poll(0.2)  # type: ignore[attr-defined]


def _commit(consumer: object, *offsets: tuple[str, int, int]) -> None:
    tps = [ck.TopicPartition(t, p, o) for t, p, o in offsets]
    consumer.commit(offsets=tps, asynchronous=False)  # type: ignore[attr-defined]


def test_offsets_expire_as_kafka_2_8_expires_them(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **SETTINGS)
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("t", 1, 1), NewTopic("old", 1, 1)])
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start()
    try:
        # A group that commits and leaves.
        leaver = _consumer(cluster, "leaver")
        leaver.subscribe(["t"])
        _assigned(leaver)
        _commit(leaver, ("t", 0, 3))
        leaver.close()
        left = time.monotonic()

        # A standalone committer: no subscription, so no member and no generation.
        solo = _consumer(cluster, "solo")
        _commit(solo, ("t", 0, 4))
        solo.close()
        solo_committed = time.monotonic()

        # A live group that also commits for a topic it does not subscribe to.
        live = _consumer(cluster, "live")
        live.subscribe(["t"])
        _assigned(live)
        _commit(live, ("t", 0, 5), ("old", 0, 6))
        live_committed = time.monotonic()

        def offset_znode(group: str, topic: str) -> bool:
            return zk.exists(zkdata.group_offset_path(group, topic, 0)) is not None

        assert all(offset_znode(g, "t") for g in ("leaver", "solo", "live")) and offset_znode("live", "old")
        # Nothing expires before the retention (the leaver's clock started first).
        time.sleep(max(0.0, left + RETENTION_S - 5 - time.monotonic()))
        assert all(offset_znode(g, "t") for g in ("leaver", "solo", "live")) and offset_znode("live", "old")

        deadline_s = RETENTION_S + 20  # the retention, plus the check interval and slack
        wait_until(lambda: not offset_znode("solo", "t"), deadline_s - (time.monotonic() - solo_committed))
        wait_until(lambda: not offset_znode("leaver", "t"), deadline_s - (time.monotonic() - left))
        wait_until(lambda: not offset_znode("live", "old"), deadline_s - (time.monotonic() - live_committed))
        assert time.monotonic() - left >= RETENTION_S - 1
        # Empty and without offsets: removed (Kafka: Dead), as is the standalone group.
        wait_until(lambda: zk.exists(zkdata.group_path("leaver")) is None, 10)
        wait_until(lambda: zk.exists(zkdata.group_path("solo")) is None, 10)
        # The live group's subscribed topic keeps its offset, and the group its members.
        live.poll(0.5)
        assert offset_znode("live", "t")
        [tp] = live.committed([ck.TopicPartition("t", 0)], timeout=10)
        assert tp.offset == 5
        [gone] = live.committed([ck.TopicPartition("old", 0)], timeout=10)
        assert gone.offset < 0  # OFFSET_INVALID: nothing committed any more
        live.close()
    finally:
        zk.stop()
        zk.close()
