"""Fetch sessions (KIP-227) on real broker processes: the gRPC Fetch's session rules
(full, incremental, errors, a restart forgetting every session), and replication through
follower sessions losing nothing acknowledged across leader changes and a frozen leader."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import grpc
import pytest

from kbroker.local.cluster import BrokerProcess, LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.proto.kbroker.v1 import broker_pb2_grpc, common_pb2, log_pb2
from tests.support import wait_until

pytestmark = pytest.mark.integration


def describe(bootstrap: str, topic: str) -> list:
    with AdminClient(bootstrap) as admin:
        return admin.describe_topics([topic])[0].partitions


def full_isr(bootstrap: str, topic: str) -> bool:
    try:
        return all(len(p.isr) == len(p.replicas) and p.leader >= 0 for p in describe(bootstrap, topic))
    except Exception:
        return False


def named(resp: log_pb2.FetchResponse) -> dict[tuple[str, int], log_pb2.FetchPartitionResponse]:
    return {(t.name, p.index): p for t in resp.topics for p in t.partitions}


def test_the_fetch_session_rules_over_grpc(cluster: LocalCluster) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("fs", 3, 1)])
    wait_until(lambda: full_isr(cluster.bootstrap, "fs"), what="leaders")
    broker = cluster.brokers[0]

    def stub() -> broker_pb2_grpc.BrokerStub:
        return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(broker.address))

    def fetch(session_id: int, epoch: int, offsets: dict[int, int], wait_ms: int = 0) -> log_pb2.FetchResponse:
        req = log_pb2.FetchRequest(max_wait_ms=wait_ms, session_id=session_id, session_epoch=epoch)
        if offsets:
            t = req.topics.add(name="fs")
            for index, offset in offsets.items():
                t.partitions.add(index=index, fetch_offset=offset)
        return stub().Fetch(req, timeout=30)  # type: ignore[no-any-return]

    full = fetch(0, 0, {0: 0, 1: 0, 2: 0})
    assert full.error_code == 0 and full.session_id > 0 and sorted(named(full)) == [("fs", 0), ("fs", 1), ("fs", 2)]
    sid = full.session_id
    idle = fetch(sid, 1, {}, wait_ms=300)
    assert idle.error_code == 0 and idle.session_id == sid and not idle.topics
    with Producer(bootstrap_servers=cluster.bootstrap, acks=1) as p:
        p.send("fs", b"news", partition=1).get(10)
    news = fetch(sid, 2, {}, wait_ms=5000)
    assert list(named(news)) == [("fs", 1)] and named(news)[("fs", 1)].records
    assert not fetch(sid, 3, {1: 1}).topics  # caught up: nothing new, nothing named
    stale = fetch(sid, 3, {})
    assert stale.error_code == common_pb2.INVALID_FETCH_SESSION_EPOCH and not stale.topics
    sessionless = stub().Fetch(log_pb2.FetchRequest(max_wait_ms=0, topics=[log_pb2.FetchTopic(name="fs")]))
    assert sessionless.session_id == 0 and sessionless.error_code == 0
    assert broker.stop() == 0
    broker.start()
    wait_until(lambda: full_isr(cluster.bootstrap, "fs"), what="leaders after the restart")
    gone = fetch(sid, 4, {})
    assert gone.error_code == common_pb2.FETCH_SESSION_ID_NOT_FOUND and gone.session_id == 0


def produce_until(stop: threading.Event, bootstrap: str, topic: str, acked: list[bytes], errors: list[str]) -> None:
    """acks=all, one record at a time (each either acknowledged or failed)."""
    with Producer(bootstrap_servers=bootstrap, acks="all", retries=10, delivery_timeout_ms=60000) as p:
        i = 0
        while not stop.is_set():
            value = f"r{i}".encode()
            try:
                p.send(topic, value, partition=i % 4).get(65)
                acked.append(value)
            except Exception as exc:
                errors.append(repr(exc))
            i += 1


def read_all(bootstrap: str, topic: str, partitions: int, want: set[bytes], timeout_s: float = 60) -> set[bytes]:
    got: set[bytes] = set()
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        while not want <= got and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                got.update(r.value for r in recs if r.value is not None)
    return got


def test_replication_through_sessions_loses_nothing_across_leader_changes(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(3, **{"leader.imbalance.check.interval.seconds": "2"})
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("lossless", 4, 3, topic_configs={"min.insync.replicas": "2"})])
    wait_until(lambda: full_isr(cluster.bootstrap, "lossless"), what="full ISR")
    acked: list[bytes] = []
    errors: list[str] = []
    stop = threading.Event()
    bootstrap = ",".join(b.address for b in cluster.brokers.values())
    writer = threading.Thread(target=produce_until, args=(stop, bootstrap, "lossless", acked, errors))
    writer.start()
    try:
        wait_until(lambda: len(acked) > 50, 60, "records before the first change")
        victim = describe(cluster.bootstrap, "lossless")[0].leader
        cluster.brokers[victim].kill()  # a leader lost
        survivor = next(b for b in cluster.brokers.values() if b.broker_id != victim)
        wait_until(lambda: describe(survivor.address, "lossless")[0].leader not in (victim, -1), 60, "failover")
        n = len(acked)
        wait_until(lambda: len(acked) > n + 50, 60, "records after the failover")
        cluster.brokers[victim].start()  # back: it catches up through new sessions
        wait_until(lambda: full_isr(survivor.address, "lossless"), 60, "ISR healed")
        other = describe(survivor.address, "lossless")[1].leader
        assert cluster.brokers[other].stop() == 0  # a controlled shutdown moves leadership
        n = len(acked)
        wait_until(lambda: len(acked) > n + 50, 60, "records after the controlled shutdown")
        cluster.brokers[other].start()
        wait_until(lambda: full_isr(cluster.brokers[victim].address, "lossless"), 60, "ISR healed again")
        n = len(acked)
        wait_until(lambda: len(acked) > n + 50, 60, "records at the end")
    finally:
        stop.set()
        writer.join(90)
    want = set(acked)
    got = read_all(bootstrap, "lossless", 4, want)
    assert want <= got, f"lost {len(want - got)} acknowledged record(s); errors: {errors[:5]}"
    # Every replica holds the same log: the followers ended in sync through their sessions.
    wait_until(lambda: full_isr(bootstrap, "lossless"), 60, "full ISR at the end")

    def log_bytes(b: BrokerProcess) -> int:
        return sum(f.stat().st_size for f in b.data_dir.glob("lossless-*/*.log"))

    wait_until(lambda: len({log_bytes(b) for b in cluster.brokers.values()}) == 1, 30, "equal logs on every broker")


def test_followers_start_a_new_session_after_a_frozen_leader(cluster_factory: Callable[..., LocalCluster]) -> None:
    # The ZooKeeper session outlives the freeze (the leader keeps its partitions) while the
    # followers' fetches time out (replica.fetch.wait.max.ms + 5 s): connection errors.
    cluster = cluster_factory(3, **{"zookeeper.session.timeout.ms": "30000", "replica.lag.time.max.ms": "30000"})
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("frozen", 3, 3, topic_configs={"min.insync.replicas": "3"})])
    wait_until(lambda: full_isr(cluster.bootstrap, "frozen"), what="full ISR")
    leader = describe(cluster.bootstrap, "frozen")[0].leader
    followers = [b for b in cluster.brokers.values() if b.broker_id != leader]
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as p:
        p.send("frozen", b"before", partition=0).get(20)
    logged = {f.broker_id: f.log_path.stat().st_size for f in followers}

    def since_paused(f: BrokerProcess) -> str:
        with f.log_path.open("rb") as log:
            log.seek(logged[f.broker_id])
            return log.read().decode(errors="replace")

    cluster.brokers[leader].pause()
    try:  # until both followers' fetches have failed (each after replica.fetch.wait.max.ms + 5 s)
        for f in followers:
            wait_until(lambda f=f: "cannot reach leader" in since_paused(f), 25, f"broker {f.broker_id} failing")
    finally:
        cluster.brokers[leader].resume()
    for f in followers:
        wait_until(lambda f=f: "reachable again" in since_paused(f), 30, f"broker {f.broker_id} reconnecting")
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as p:
        # min.insync.replicas = 3: answered only once both followers fetched it.
        assert p.send("frozen", b"after", partition=0).get(30).offset == 1
    assert describe(cluster.bootstrap, "frozen")[0].leader == leader


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_consumer_fetches_in_a_session_and_survives_a_broker_restart(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    # A fixed port: the consumer's bootstrap address stays valid across the restart.
    cluster = cluster_factory(1, listeners=f"PLAINTEXT://127.0.0.1:{free_port()}")
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("cs", 4, 1)])
    wait_until(lambda: full_isr(cluster.bootstrap, "cs"), what="leaders")
    broker = cluster.brokers[0]
    with Consumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=200) as c:
        c.assign([TopicPartition("cs", p) for p in range(4)])
        with Producer(bootstrap_servers=cluster.bootstrap, acks=1) as p:
            for i in range(8):
                p.send("cs", f"a{i}".encode(), partition=i % 4)
            p.flush()
        assert len(read_from(c, 8)) == 8
        sessions = c._fetcher._sessions
        wait_until(lambda: any(s.incremental for s in sessions.values()), 10, "an incremental session")
        assert broker.stop() == 0
        broker.start()
        wait_until(lambda: full_isr(cluster.bootstrap, "cs"), what="leaders after the restart")
        with Producer(bootstrap_servers=cluster.bootstrap, acks=1) as p:
            for i in range(8):
                p.send("cs", f"b{i}".encode(), partition=i % 4)
            p.flush()
        assert sorted(r.value for r in read_from(c, 8)) == [f"b{i}".encode() for i in range(8)]


def read_from(c: Consumer, n: int, timeout_s: float = 30) -> list:
    out: list = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n and time.monotonic() < deadline:
        for recs in c.poll(timeout_ms=300).values():
            out.extend(recs)
    return out
