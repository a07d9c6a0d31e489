"""Dynamic broker configs take effect in running brokers, survive a restart, and a bad
stored value is logged and ignored (real brokers and ZooKeeper)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from kbroker.cluster.zk_client import ZkClient
from kbroker.local.cluster import BrokerProcess, LocalCluster
from kclient import AdminClient, NewTopic, Producer
from kclient.proto.kbroker.v1 import config_pb2
from tests.integration.test_replication import describe, full_isr
from tests.support import wait_until

pytestmark = pytest.mark.integration

BROKER, SET, DELETE = config_pb2.BROKER, config_pb2.SET, config_pb2.DELETE
DAY_MS = "86400000"


@pytest.fixture
def zk(zk_connect: str) -> Iterator[ZkClient]:
    client = ZkClient(zk_connect)
    client.start()
    yield client
    client.close()


def segments(broker: BrokerProcess, topic: str, partition: int) -> int:
    return len(list((broker.data_dir / f"{topic}-{partition}").glob("*.log")))


def log_text(broker: BrokerProcess) -> str:
    return broker.log_path.read_text(errors="replace")


def restart(broker: BrokerProcess) -> str:
    """Stop and start ``broker``; the log of the new run up to ready."""
    broker.stop()
    before = broker.log_path.stat().st_size
    broker.start()
    return broker.log_path.read_bytes()[before:].decode(errors="replace")


def fill(bootstrap: str, topic: str, partitions: int, n: int = 40) -> None:
    with Producer(bootstrap_servers=bootstrap, acks="all") as p:
        for _ in range(n):  # one batch each: several segments of 1 KiB
            for part in range(partitions):
                p.send(topic, b"v" * 200, partition=part).get(10)


def test_retention_default_applies_live_per_broker_wins_and_survives_restart(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(
        2,
        **{
            "log.segment.bytes": "1024",
            "log.retention.check.interval.ms": "200",
            "auto.leader.rebalance.enable": "false",
        },
    )
    b0, b1 = cluster.brokers[0], cluster.brokers[1]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics(
            [
                NewTopic("ret", 2, 1, replica_assignments={0: [0], 1: [1]}),
                NewTopic("own", 1, 1, replica_assignments={0: [0]}, topic_configs={"retention.ms": DAY_MS}),
            ]
        )
        wait_until(lambda: full_isr(cluster.bootstrap, "ret") and full_isr(cluster.bootstrap, "own"), what="leaders")
        fill(cluster.bootstrap, "ret", 2)
        fill(cluster.bootstrap, "own", 1)
        assert min(segments(b0, "ret", 0), segments(b1, "ret", 1), segments(b0, "own", 0)) > 3
        time.sleep(0.5)  # the records age past 1 ms

        # Per-broker first (so broker 1 never sees the default alone), then the default.
        admin.incremental_alter_configs({(BROKER, "1"): [("log.retention.ms", SET, DAY_MS)]})
        admin.incremental_alter_configs({(BROKER, ""): [("log.retention.ms", SET, "1")]})
        wait_until(lambda: segments(b0, "ret", 0) <= 1, timeout_s=30, what="broker 0 deletes old segments")
        time.sleep(2.0)  # ten retention checks
        assert segments(b1, "ret", 1) > 3, "broker 1's own value (1 day) wins over <default>"
        assert segments(b0, "own", 0) > 3, "a topic override wins over the dynamic default"
        assert "log.retention.ms" in admin.describe_configs([(BROKER, "0")])[(BROKER, "0")]

    # A restart reads the values before the logs are loaded.
    assert "dynamic broker configs in force: retention.ms: None -> 1" in restart(b0)
    wait_until(lambda: full_isr(cluster.bootstrap, "ret"), what="leaders after restart")
    fill(cluster.bootstrap, "ret", 2)
    time.sleep(0.5)
    wait_until(lambda: segments(b0, "ret", 0) <= 1, timeout_s=30, what="retention after restart")
    assert segments(b1, "ret", 1) > 3

    # Deleting the per-broker value falls back to <default>: broker 1 deletes too.
    with AdminClient(cluster.bootstrap) as admin:
        admin.incremental_alter_configs({(BROKER, "1"): [("log.retention.ms", DELETE, None)]})
    wait_until(lambda: segments(b1, "ret", 1) <= 1, timeout_s=30, what="broker 1 falls back to <default>")


def test_cleaner_threads_bad_value_and_unclean_default(
    cluster_factory: Callable[..., LocalCluster], zk: ZkClient
) -> None:
    cluster = cluster_factory(2, **{"auto.leader.rebalance.enable": "false"})
    b0, b1 = cluster.brokers[0], cluster.brokers[1]
    # A bad value written behind the admin API's back: logged, ignored, never fatal.
    zk.set_entity_config("brokers", "<default>", {"log.cleaner.threads": "3", "log.retention.ms": "soon"}, -1)
    wait_until(
        lambda: all("log cleaner reconfigured: 3 thread(s)" in log_text(b) for b in (b0, b1)),
        what="cleaner threads = 3 on both brokers",
    )
    for b in (b0, b1):
        assert "dynamic config log.retention.ms='soon' at <default> ignored" in log_text(b)
        assert b.running()

    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("u", 1, 2, replica_assignments={0: [0, 1]})])
    wait_until(lambda: full_isr(cluster.bootstrap, "u"), what="full ISR")
    b1.kill()  # the follower: the ISR shrinks to [0]
    wait_until(lambda: describe(b0.address, "u")[0].isr == [0], what="ISR shrink")
    b0.kill()  # the only in-sync replica
    b1.start()
    # Broker 0's session expires: the partition goes offline (no unclean election while it is off).
    wait_until(lambda: describe(b1.address, "u")[0].leader == -1, what="the partition goes offline")
    time.sleep(1.0)
    assert describe(b1.address, "u")[0].leader == -1
    with AdminClient(b1.address) as admin:
        admin.incremental_alter_configs(
            {(BROKER, ""): [("unclean.leader.election.enable", SET, "true"), ("log.retention.ms", DELETE, None)]}
        )
    wait_until(lambda: describe(b1.address, "u")[0].leader == 1, what="unclean election of broker 1")
    with Producer(bootstrap_servers=b1.address, acks="all") as p:
        assert p.send("u", b"x").get(10).offset >= 0

    # Values survive a restart: the cleaner starts with 3 threads.
    tail = restart(b1)
    assert "log_cleaner_threads: 1 -> 3" in tail and "unclean.leader.election.enable: None -> true" in tail
