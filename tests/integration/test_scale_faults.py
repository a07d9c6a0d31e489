"""Faults at 2,000 partitions (RF 3, 3 brokers, real processes): a controlled shutdown
leaves no partition without a live leader at any moment; after a SIGKILL every partition
gets a live leader; an acks=all producer over all 2,000 partitions loses no acknowledged
record through a leader SIGKILL and a controller SIGKILL.

These check behaviour, not times: ``scripts/scale`` measures those."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest

from kbroker.cluster.zk_client import ZkClient
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from tests.integration.test_faults import NumberedProducer, read_everything, validate
from tests.support import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC, PARTITIONS = "scale", 2000
SETTINGS = {"zookeeper.session.timeout.ms": "6000", "replica.lag.time.max.ms": "10000"}


def _states(zk: ZkClient) -> dict[int, tuple[int, list[int]]]:
    found = zk.partition_states([(TOPIC, p) for p in range(PARTITIONS)])
    return {p: (s.leader, s.isr) for (_, p), s in found.items() if s is not None}


def _leaderless(zk: ZkClient) -> list[int]:
    live = set(zk.live_brokers())
    states = _states(zk)
    return [p for p in range(PARTITIONS) if p not in states or states[p][0] not in live]


def _full_isr(zk: ZkClient) -> bool:
    states = _states(zk)
    return len(states) == PARTITIONS and all(len(isr) == 3 for _, isr in states.values())


def _restart(cluster: LocalCluster, broker_id: int, zk: ZkClient) -> None:
    cluster.brokers[broker_id].start()
    wait_until(lambda: _full_isr(zk), 180, f"every ISR full again after broker {broker_id} restarted")


def test_2000_partitions_through_a_controlled_shutdown_and_sigkills(
    cluster_factory: Callable[..., LocalCluster], zk_connect: str
) -> None:
    cluster = cluster_factory(3, **SETTINGS)
    with AdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=120000) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, topic_configs={"min.insync.replicas": "2"})])
    zk = ZkClient(zk_connect)
    zk.start()
    try:
        wait_until(lambda: _full_isr(zk), 180, "2,000 partitions led with full ISRs")

        # A controlled shutdown: sampled throughout, no partition is ever without a live leader.
        leaving = 1
        proc = cluster.brokers[leaving].proc
        assert proc is not None
        cluster.brokers[leaving].signal(signal.SIGTERM)
        worst: list[int] = []
        started = time.monotonic()
        while proc.poll() is None and time.monotonic() - started < 120:
            worst = max(worst, _leaderless(zk), key=len)
        assert proc.wait(60) == 0, "the broker exits cleanly"
        assert worst == [], f"{len(worst)} partition(s) without a live leader during the shutdown"
        _restart(cluster, leaving, zk)

        producer = NumberedProducer(cluster.bootstrap, TOPIC)
        producer.start()
        wait_until(lambda: len(producer.acked) > 2000, 120, "the producer under way")

        # SIGKILL a leader (not the controller), then the controller.
        controller = zk.controller_id()
        victim = next(b for b in (2, 0, 1) if b != controller)
        cluster.brokers[victim].kill()
        wait_until(lambda: victim not in zk.live_brokers(), 60, f"broker {victim}'s session ends")
        wait_until(lambda: _leaderless(zk) == [], 60, "every partition led after the SIGKILL")
        acked = len(producer.acked)
        wait_until(lambda: len(producer.acked) > acked + 1000, 120, "acks=all writes go on")
        _restart(cluster, victim, zk)

        cluster.brokers[controller].kill()
        wait_until(lambda: zk.controller_id() not in (-1, controller), 60, "a new controller")
        wait_until(lambda: controller not in zk.live_brokers(), 60, "the old controller's session ends")
        wait_until(lambda: _leaderless(zk) == [], 60, "every partition led after the controller's SIGKILL")
        acked = len(producer.acked)
        wait_until(lambda: len(producer.acked) > acked + 1000, 120, "acks=all writes go on")
        _restart(cluster, controller, zk)

        producer.stop.set()
        producer.join(180)
        assert not producer.is_alive()
        validate(producer, read_everything(cluster.bootstrap, TOPIC, PARTITIONS))
    finally:
        zk.close()
