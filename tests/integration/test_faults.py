"""Fault tests on real processes: SIGKILL and SIGSTOP leaders and the controller while a
producer with acks=all keeps sending, then check that every acknowledged record is still
there, once, in order (Kafka's replication_test / validate_delivery).

The default tests run a few rounds; the ``slow`` soak variants run ``$KBROKER_FAULT_ROUNDS``
(default 20) rounds each and print the failover and rejoin times per round."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kazoo.client import KazooClient

from kbroker.cluster import zkdata
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tests.support import wait_until

pytestmark = pytest.mark.integration

FAST = {"zookeeper.session.timeout.ms": "3000", "replica.lag.time.max.ms": "3000"}
# Rounds of the slow (soak) variants; the default variants keep a few rounds for every CI run.
SOAK_ROUNDS = int(os.environ.get("KBROKER_FAULT_ROUNDS", "20"))


class ZkView:
    def __init__(self, connect: str) -> None:
        self.zk = KazooClient(hosts=connect)
        self.zk.start()

    def controller(self) -> int:
        data, _ = self.zk.get(zkdata.CONTROLLER)
        return zkdata.decode_controller(data)

    def state(self, topic: str, p: int) -> zkdata.LeaderAndIsr:
        data, stat = self.zk.get(zkdata.partition_state_path(topic, p))
        return zkdata.decode_leader_and_isr(data, stat.version)

    def live(self) -> set[int]:
        return {int(c) for c in self.zk.get_children(zkdata.BROKER_IDS)}

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()


class NumberedProducer(threading.Thread):
    """Sends 0, 1, 2, ... with acks=all and records what was acknowledged where.

    ``ack_log`` holds (time.monotonic(), partition) per acknowledgement, in arrival
    order, for availability measurements.
    """

    def __init__(self, bootstrap: str, topic: str, client: dict[str, Any] | None = None) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(
            bootstrap_servers=bootstrap,
            acks="all",
            linger_ms=2,
            request_timeout_ms=4000,
            delivery_timeout_ms=120000,
            **(client or {}),
        )
        self.topic = topic
        self.acked: dict[int, tuple[int, int]] = {}
        self.failed: dict[int, str] = {}
        self.ack_log: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            fut = self.producer.send(self.topic, str(i).encode())
            fut.add_callback(self._ok, i)
            fut.add_errback(self._bad, i)
            i += 1
            self.sent = i
            if i % 50 == 0:
                time.sleep(0.01)
        self.producer.flush(timeout=150)
        self.producer.close()

    def _ok(self, i: int, meta) -> None:  # type: ignore[no-untyped-def]
        self.acked[i] = (meta.partition, meta.offset)
        self.ack_log.append((time.monotonic(), meta.partition))

    def _bad(self, i: int, exc: BaseException) -> None:
        self.failed[i] = repr(exc)


def read_everything(
    bootstrap: str, topic: str, partitions: int, client: dict[str, Any] | None = None
) -> dict[int, list]:
    with Consumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", request_timeout_ms=10000, **(client or {})
    ) as c:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        ends = c.end_offsets(tps)
        out: dict[int, list] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and any(c.position(tp) < ends[tp] for tp in tps):
            for tp, recs in c.poll(timeout_ms=500).items():
                out[tp.partition].extend(recs)
        return out


def validate(producer: NumberedProducer, by_partition: dict[int, list]) -> None:
    seen: dict[int, tuple[int, int]] = {}
    duplicated = 0
    for p, recs in by_partition.items():
        values = [int(r.value) for r in recs]
        assert values == sorted(values), f"partition {p} is out of send order"
        for r in recs:
            v = int(r.value)
            if v in seen:
                duplicated += 1
            seen[v] = (p, r.offset)
    lost = [i for i in producer.acked if i not in seen]
    moved = [i for i, where in producer.acked.items() if i in seen and seen[i] != where]
    print(
        f"\nsent={producer.sent} acked={len(producer.acked)} failed={len(producer.failed)} "
        f"read={sum(len(v) for v in by_partition.values())} lost={len(lost)} "
        f"duplicated={duplicated} moved={len(moved)} "
        f"errors={sorted(set(producer.failed.values()))[:3]}"
    )
    assert not lost, f"acknowledged records lost: {lost[:20]}"
    assert not moved, f"acknowledged records found at other offsets: {moved[:20]}"
    assert duplicated == 0, "the idempotent producer must not write a record twice"
    assert len(producer.acked) > 1000


def start_topic(cluster: LocalCluster, topic: str, partitions: int = 3, client: dict[str, Any] | None = None) -> ZkView:
    with AdminClient(bootstrap_servers=cluster.bootstrap, **(client or {})) as admin:
        admin.create_topics([NewTopic(topic, partitions, 3, topic_configs={"min.insync.replicas": "2"})])
    view = ZkView(cluster.zk_connect)
    wait_until(lambda: all(len(view.state(topic, p).isr) == 3 for p in range(partitions)), what="full ISR")
    return view


def _summary(name: str, values: list[float]) -> str:
    v = sorted(values)
    return f"{name} median={v[len(v) // 2]:.2f}s max={v[-1]:.2f}s" if v else f"{name} -"


def sigkill_bounces(cluster: LocalCluster, victim: str, rounds: int, client: dict[str, Any] | None = None) -> None:
    """SIGKILL the leader of partition ``round % 3`` (or the controller) and restart it,
    ``rounds`` times; ``client``: the clients' (security) settings."""
    view = start_topic(cluster, "bounce", client=client)
    producer = NumberedProducer(cluster.bootstrap, "bounce", client)
    producer.start()
    failover: list[float] = []
    rejoin: list[float] = []
    try:
        wait_until(lambda: len(producer.acked) > 200, what="first acks")
        for round_ in range(rounds):
            target = view.state("bounce", round_ % 3).leader if victim == "leader" else view.controller()
            before = len(producer.acked)
            t0 = time.monotonic()
            cluster.brokers[target].kill()
            wait_until(lambda t=target: t not in view.live(), what=f"broker {target} to leave ZooKeeper")
            wait_until(lambda b=before: len(producer.acked) > b + 100, what="acks after failover")
            failover.append(time.monotonic() - t0)
            t1 = time.monotonic()
            cluster.brokers[target].start()
            wait_until(lambda: all(len(view.state("bounce", p).isr) == 3 for p in range(3)), what="ISR to heal")
            rejoin.append(time.monotonic() - t1)
    finally:
        producer.stop.set()
        producer.join(180)
    times = f"{_summary('kill->100 acks', failover)}, {_summary('restart->full ISR', rejoin)}"
    print(f"\n{rounds} SIGKILL rounds ({victim}): {times}")
    validate(producer, read_everything(cluster.bootstrap, "bounce", 3, client))
    view.close()


def sigstop_pauses(cluster: LocalCluster, rounds: int) -> None:
    """SIGSTOP a random leader (every third round the controller) past its session, then SIGCONT it."""
    view = start_topic(cluster, "pause")
    producer = NumberedProducer(cluster.bootstrap, "pause")
    producer.start()
    rng = random.Random(7)
    failover: list[float] = []
    rejoin: list[float] = []
    try:
        wait_until(lambda: len(producer.acked) > 200, what="first acks")
        for round_ in range(rounds):
            target = view.controller() if round_ % 3 == 1 else view.state("pause", rng.randrange(3)).leader
            before = len(producer.acked)
            t0 = time.monotonic()
            cluster.brokers[target].signal(signal.SIGSTOP)
            wait_until(lambda t=target: t not in view.live(), what=f"broker {target}'s session to expire")
            wait_until(lambda b=before: len(producer.acked) > b + 100, what="acks while it is stopped")
            failover.append(time.monotonic() - t0)
            t1 = time.monotonic()
            cluster.brokers[target].signal(signal.SIGCONT)
            wait_until(lambda t=target: t in view.live(), what=f"broker {target} to re-register")
            wait_until(lambda: all(len(view.state("pause", p).isr) == 3 for p in range(3)), what="ISR to heal")
            rejoin.append(time.monotonic() - t1)
    finally:
        producer.stop.set()
        producer.join(180)
    times = f"{_summary('stop->100 acks', failover)}, {_summary('SIGCONT->full ISR', rejoin)}"
    print(f"\n{rounds} SIGSTOP rounds: {times}")
    validate(producer, read_everything(cluster.bootstrap, "pause", 3))
    view.close()


@pytest.mark.parametrize("victim", ["leader", "controller"])
def test_sigkill_bounces_lose_nothing(cluster_factory: Callable[..., LocalCluster], victim: str) -> None:
    sigkill_bounces(cluster_factory(3, **FAST), victim, rounds=4)


def test_sigstop_past_session_expiry_loses_nothing(cluster_factory: Callable[..., LocalCluster]) -> None:
    sigstop_pauses(cluster_factory(3, **FAST), rounds=3)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("victim", ["leader", "controller"])
def test_sigkill_soak_loses_nothing(cluster_factory: Callable[..., LocalCluster], victim: str) -> None:
    sigkill_bounces(cluster_factory(3, **FAST), victim, rounds=SOAK_ROUNDS)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigstop_soak_loses_nothing(cluster_factory: Callable[..., LocalCluster]) -> None:
    sigstop_pauses(cluster_factory(3, **FAST), rounds=SOAK_ROUNDS)
