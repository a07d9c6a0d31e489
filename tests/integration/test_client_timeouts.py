"""Client timeouts (KIP-266): calls honour their timeouts, one offline partition does
not stall a consumer, and the client does not give up at once when no broker answers.
Real ZooKeeper, real broker processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kbroker.local.cluster import BrokerProcess, LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.errors import KafkaTimeoutError
from tests.support import wait_until

pytestmark = pytest.mark.integration

TP = TopicPartition
GROUPS = {"group.initial.rebalance.delay.ms": "200", "group.min.session.timeout.ms": "1000"}


def keep_port(broker: BrokerProcess) -> None:
    """Make ``broker`` listen again on the port it has now when it is restarted."""
    port = broker.address.rsplit(":", 1)[1]
    command = broker.command
    broker.command = lambda: [f"127.0.0.1:{port}" if a == "127.0.0.1:0" else a for a in command()]  # type: ignore[method-assign]


def produce(bootstrap: str, topic: str, n: int, partition: int | None = None, prefix: str = "v") -> None:
    with Producer(bootstrap_servers=bootstrap, acks=1, linger_ms=2) as p:
        futures = [p.send(topic, f"{prefix}{i}".encode(), partition=partition) for i in range(n)]
        for f in futures:
            f.get(30)


def test_one_thread_drives_five_members_with_short_polls(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **GROUPS)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("shared", 4, 1)])
    members = [
        Consumer(
            bootstrap_servers=cluster.bootstrap,
            group_id="five",
            auto_offset_reset="earliest",
            session_timeout_ms=10000,
            heartbeat_interval_ms=500,
            max_poll_interval_ms=60000,
        )
        for _ in range(5)
    ]
    try:
        for m in members:
            m.subscribe(["shared"])
        slowest = 0.0
        deadline = time.monotonic() + 90
        sizes: list[int] = []
        while time.monotonic() < deadline:
            for m in members:
                started = time.monotonic()
                m.poll(timeout_ms=200)
                slowest = max(slowest, time.monotonic() - started)
            sizes = sorted(len(m.assignment()) for m in members)
            owned = set().union(*(m.assignment() for m in members))
            if sizes == [0, 1, 1, 1, 1] and owned == {TP("shared", p) for p in range(4)}:
                break
        print(f"slowest poll(200): {slowest * 1000:.0f} ms; sizes {sizes}")
        assert sizes == [0, 1, 1, 1, 1]
        assert slowest < 3.0, f"a poll(timeout_ms=200) blocked {slowest:.1f}s"
    finally:
        for m in members:
            m.close(autocommit=False, timeout_ms=2000)


def offline_cluster(cluster_factory: Callable[..., LocalCluster]) -> tuple[LocalCluster, str]:
    """Two brokers; topic "split" with partition 0 on broker 0 only and partition 1 on
    broker 1 only; 50 records in each; then broker 1 is SIGKILLed."""
    cluster = cluster_factory(2, **GROUPS)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("split", 2, 1, replica_assignments={0: [0], 1: [1]})])
    produce(cluster.bootstrap, "split", 50, partition=0, prefix="a")
    produce(cluster.bootstrap, "split", 50, partition=1, prefix="b")
    cluster.brokers[1].kill()
    return cluster, cluster.brokers[0].address


def group_on_broker0(bootstrap: str) -> str:
    """A group id whose coordinator is broker 0 (the one that stays up)."""
    with AdminClient(bootstrap) as admin:
        for i in range(200):
            if admin.find_coordinator(f"g{i}") == bootstrap:
                return f"g{i}"
    raise AssertionError("no group id hashes to broker 0")


@pytest.mark.parametrize("mode", ["assign", "subscribe"])
def test_offline_partition_does_not_stall_the_others(cluster_factory: Callable[..., LocalCluster], mode: str) -> None:
    cluster, bootstrap = offline_cluster(cluster_factory)
    config: dict[str, Any] = {"bootstrap_servers": bootstrap, "auto_offset_reset": "earliest"}
    if mode == "subscribe":
        config.update(group_id=group_on_broker0(bootstrap), session_timeout_ms=6000, heartbeat_interval_ms=500)
    consumer = Consumer(**config)
    try:
        if mode == "assign":
            consumer.assign([TP("split", 0), TP("split", 1)])
        else:
            consumer.subscribe(["split"])
        got: dict[int, list[bytes]] = {0: [], 1: []}
        slowest = 0.0

        def poll() -> None:
            nonlocal slowest
            started = time.monotonic()
            for tp, recs in consumer.poll(timeout_ms=1000).items():
                got[tp.partition].extend(r.value or b"" for r in recs)
            slowest = max(slowest, time.monotonic() - started)

        deadline = time.monotonic() + 30
        while len(got[0]) < 50 and time.monotonic() < deadline:
            poll()
        assert got[0] == [f"a{i}".encode() for i in range(50)]
        # New records on the healthy partition keep flowing.
        produce(bootstrap, "split", 10, partition=0, prefix="c")
        deadline = time.monotonic() + 20
        while len(got[0]) < 60 and time.monotonic() < deadline:
            poll()
        assert got[0][50:] == [f"c{i}".encode() for i in range(10)]
        print(f"slowest poll(1000) with partition 1 offline: {slowest * 1000:.0f} ms")
        assert slowest < 5.0, f"poll(timeout_ms=1000) blocked {slowest:.1f}s"
        assert got[1] == []
        # The offline partition is retried in the background: back, it delivers.
        cluster.brokers[1].start()
        deadline = time.monotonic() + 60
        while len(got[1]) < 50 and time.monotonic() < deadline:
            poll()
        assert got[1] == [f"b{i}".encode() for i in range(50)]
    finally:
        consumer.close(timeout_ms=5000)


def test_position_and_end_offsets_time_out_on_an_offline_partition(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    _, bootstrap = offline_cluster(cluster_factory)
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP("split", 0), TP("split", 1)])
        assert consumer.position(TP("split", 0), timeout_ms=5000) == 0
        for call in (
            lambda: consumer.position(TP("split", 1), timeout_ms=1500),
            lambda: consumer.end_offsets([TP("split", 0), TP("split", 1)], timeout_ms=1500),
            lambda: consumer.beginning_offsets([TP("split", 1)], timeout_ms=1500),
        ):
            started = time.monotonic()
            with pytest.raises(KafkaTimeoutError):
                call()
            assert time.monotonic() - started < 5.0
        assert consumer.end_offsets([TP("split", 0)], timeout_ms=5000) == {TP("split", 0): 50}


def test_fresh_clients_wait_for_a_broker_that_comes_back(cluster: LocalCluster) -> None:
    """No broker answers when a fresh producer sends and a fresh consumer polls: both wait
    (max_block_ms, the poll timeout) instead of raising NoBrokersAvailable at once."""
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("later", 1, 1)])
    broker = cluster.brokers[0]
    bootstrap = broker.address
    keep_port(broker)
    broker.kill()
    restarter = threading.Timer(2.0, broker.start)
    restarter.start()
    try:
        with Producer(bootstrap_servers=bootstrap, acks=1, max_block_ms=30000, retry_backoff_ms=100) as p:
            meta = p.send("later", b"x").get(30)
        assert meta.offset == 0
    finally:
        restarter.join()
    broker.kill()
    restarter = threading.Timer(2.0, broker.start)
    restarter.start()
    try:
        with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", retry_backoff_ms=100) as c:
            c.assign([TP("later", 0)])
            got: list[Any] = []
            deadline = time.monotonic() + 40
            while not got and time.monotonic() < deadline:
                for recs in c.poll(timeout_ms=500).values():
                    got.extend(recs)
            assert [r.value for r in got] == [b"x"]
    finally:
        restarter.join()


def test_sends_recover_quickly_after_a_broker_restart(cluster: LocalCluster) -> None:
    """SIGKILL, 6 s down while the producer keeps sending, restart on the same port: the
    first acknowledgement comes soon after the broker is back (reconnect backoff is
    bounded at 1 s), well before a request to it could have timed out (15 s)."""
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("bounce", 1, 1)])
    broker = cluster.brokers[0]
    acked: list[float] = []
    with Producer(bootstrap_servers=cluster.bootstrap, acks=1, linger_ms=0, request_timeout_ms=15000) as p:
        p.send("bounce", b"warm").get(10)
        keep_port(broker)
        broker.kill()
        down_until = time.monotonic() + 6
        while time.monotonic() < down_until:
            p.send("bounce", b"while-down").add_callback(lambda _m: acked.append(time.monotonic()))
            time.sleep(0.05)
        broker.start()
        ready = time.monotonic()
        while not acked and time.monotonic() - ready < 30:
            p.send("bounce", b"after").add_callback(lambda _m: acked.append(time.monotonic()))
            time.sleep(0.05)
        assert acked, "nothing acknowledged within 30 s of the restart"
        recovered = max(min(acked) - ready, 0.0)
        print(f"first acknowledgement {recovered:.2f}s after the restarted broker was ready")
        # The broker is ready before its controller has elected the partition's leader:
        # about 1 s here, a few on a loaded machine.
        assert recovered < 8.0


def test_producer_close_with_timeout_returns_in_time(cluster: LocalCluster) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("stuck", 1, 1)])
    p = Producer(bootstrap_servers=cluster.bootstrap, acks=1, linger_ms=0, request_timeout_ms=5000)
    p.send("stuck", b"warm").get(10)
    cluster.brokers[0].kill()
    futures = [p.send("stuck", f"{i}".encode()) for i in range(10)]
    started = time.monotonic()
    p.close(timeout=2)
    took = time.monotonic() - started
    print(f"close(timeout=2) took {took:.2f}s")
    assert took < 2 + 1 + 2  # the timeout, the wait for the cancelled batches, the channels' close
    wait_until(lambda: all(f.is_done() for f in futures), 5, "the futures to fail")
    assert all(isinstance(f.exception(0), KafkaTimeoutError) for f in futures)


def test_group_calls_honour_their_timeouts_when_the_broker_is_gone(cluster: LocalCluster) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("gone", 1, 1)])
    produce(cluster.bootstrap, "gone", 5)
    c = Consumer(
        bootstrap_servers=cluster.bootstrap,
        group_id="gone-group",
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )
    c.subscribe(["gone"])
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        for recs in c.poll(timeout_ms=500).values():
            got.extend(recs)
    assert len(got) == 5
    cluster.brokers[0].kill()
    for name, call in (
        ("commit", lambda: c.commit(timeout_ms=1500)),
        ("committed", lambda: c.committed(TP("gone", 0), timeout_ms=1500)),
        ("end_offsets", lambda: c.end_offsets([TP("gone", 0)], timeout_ms=1500)),
    ):
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError):
            call()
        took = time.monotonic() - started
        print(f"{name}(timeout_ms=1500) raised after {took:.2f}s")
        assert took < 5.0, name
    started = time.monotonic()
    assert c.poll(timeout_ms=300) == {}
    assert time.monotonic() - started < 3.0
    started = time.monotonic()
    c.close(timeout_ms=2000)
    print(f"close(timeout_ms=2000) took {time.monotonic() - started:.2f}s")
    assert time.monotonic() - started < 6.0
