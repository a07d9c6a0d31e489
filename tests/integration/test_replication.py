"""Replication across real broker processes: ISR, high watermark, acks=all, failover."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import grpc
import pytest
from kazoo.client import KazooClient

from kbroker.cluster import zkdata
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.errors import LeaderNotAvailableError, NotEnoughReplicasError
from kclient.proto.kbroker.v1 import broker_pb2_grpc, cluster_pb2
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


def read_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 60) -> list:
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        out: list = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                out.extend(recs)
        return out


def _outcome(future: Any) -> int | str:
    """A produced record's offset, or the error it failed with."""
    try:
        return int(future.get(0).offset)
    except Exception as exc:
        return repr(exc)


def _high_watermark(bootstrap: str, topic: str) -> int:
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap_servers=bootstrap) as c:
        return int(c.end_offsets([tp], 10000)[tp])


def _offsets(bootstrap: str, topic: str) -> str:
    """Partition 0's log start offset and high watermark, as a consumer gets them."""
    tp = TopicPartition(topic, 0)
    try:
        with Consumer(bootstrap_servers=bootstrap) as c:
            return f"log start {c.beginning_offsets([tp], 10000)[tp]}, high watermark {c.end_offsets([tp], 10000)[tp]}"
    except Exception as exc:
        return f"no offsets ({exc!r})"


def test_rf3_replicates_to_every_broker(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(3)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("rep", 3, 3, topic_configs={"min.insync.replicas": "2"})])
    wait_until(lambda: full_isr(cluster.bootstrap, "rep"), what="full ISR")
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as p:
        futures = [p.send("rep", f"{i}".encode(), key=str(i).encode()) for i in range(600)]
        p.flush()
        metas = [f.get(10) for f in futures]
    # acks=all covers the ISR of the moment: a follower slow past the lag bound rejoins later.
    wait_until(lambda: full_isr(cluster.bootstrap, "rep"), what="full ISR after the writes")
    for part in describe(cluster.bootstrap, "rep"):
        leader_count = sum(1 for m in metas if m.partition == part.partition)
        for b in cluster.brokers.values():
            log_dir = b.data_dir / f"rep-{part.partition}"
            wait_until(lambda d=log_dir: d.exists(), what=f"{log_dir}")
        assert sorted(part.isr) == [0, 1, 2]
        assert leader_count > 0
    records = read_all(cluster.bootstrap, "rep", 3, 600)
    assert sorted(int(r.value) for r in records) == list(range(600))


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


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    return {p.partition: p.leader for p in describe(bootstrap, topic)}


def test_controlled_shutdown_moves_leadership_before_leaving(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(3, **{"auto.leader.rebalance.enable": "false"})
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("cs", 6, 3, topic_configs={"min.insync.replicas": "2"})])
    wait_until(lambda: full_isr(cluster.bootstrap, "cs"), what="full ISR")
    before = {p.partition: p for p in describe(cluster.bootstrap, "cs")}
    victim = before[0].leader
    others = [b for b in cluster.brokers.values() if b.broker_id != victim]
    assert cluster.brokers[victim].stop() == 0
    assert "controlled shutdown: leadership moved away" in cluster.brokers[victim].log_path.read_text()
    after = {p.partition: p for p in describe(others[0].address, "cs")}
    for p, meta in after.items():
        assert meta.leader != victim and meta.leader >= 0
        assert victim not in meta.isr
        if before[p].leader == victim:
            assert meta.leader_epoch > before[p].leader_epoch
    with Producer(bootstrap_servers=others[0].address, acks="all") as prod:
        assert prod.send("cs", b"still writable", partition=0).get(10).offset >= 0


def test_preferred_leader_comes_back(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(3, **{"leader.imbalance.check.interval.seconds": "2"})
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("pref", 3, 3)])
    wait_until(lambda: full_isr(cluster.bootstrap, "pref"), what="full ISR")
    preferred = {p.partition: p.replicas[0] for p in describe(cluster.bootstrap, "pref")}
    assert leaders(cluster.bootstrap, "pref") == preferred
    victim = preferred[0]
    cluster.brokers[victim].kill()
    survivor = next(b for b in cluster.brokers.values() if b.broker_id != victim)
    wait_until(lambda: leaders(survivor.address, "pref")[0] not in (victim, -1), what="failover")
    cluster.brokers[victim].start()
    wait_until(lambda: full_isr(cluster.bootstrap, "pref"), what="ISR to heal")
    wait_until(lambda: leaders(cluster.bootstrap, "pref") == preferred, what="preferred leaders back")


def test_unclean_election_only_where_enabled(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(2, **{"auto.leader.rebalance.enable": "false"})
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics(
            [
                NewTopic("clean", 1, 2, replica_assignments={0: [0, 1]}),
                NewTopic(
                    "dirty",
                    1,
                    2,
                    replica_assignments={0: [0, 1]},
                    topic_configs={"unclean.leader.election.enable": "true"},
                ),
            ]
        )
    wait_until(lambda: full_isr(cluster.bootstrap, "clean") and full_isr(cluster.bootstrap, "dirty"), what="ISR")
    cluster.brokers[1].kill()  # the follower: ISR shrinks to [0]
    wait_until(lambda: describe(cluster.brokers[0].address, "clean")[0].isr == [0], what="ISR shrink")
    wait_until(lambda: describe(cluster.brokers[0].address, "dirty")[0].isr == [0], what="ISR shrink")
    cluster.brokers[0].kill()  # the only in-sync replica
    cluster.brokers[1].start()
    b1 = cluster.brokers[1].address
    wait_until(lambda: describe(b1, "dirty")[0].leader == 1, what="unclean election on 'dirty'")
    clean = describe(b1, "clean")[0]
    assert clean.leader == -1 and clean.error == 5  # LEADER_NOT_AVAILABLE: stays offline
    with Producer(bootstrap_servers=b1, acks="all", delivery_timeout_ms=2000) as p:
        assert p.send("dirty", b"x").get(10).offset >= 0
        with pytest.raises(LeaderNotAvailableError):
            p.send("clean", b"x").get(10)
    cluster.brokers[0].start()  # the ISR member returns: 'clean' comes back online
    wait_until(lambda: describe(b1, "clean")[0].leader == 0, what="'clean' back online")


def test_divergent_follower_truncates(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(
        3,
        **{
            "auto.leader.rebalance.enable": "false",
            "replica.lag.time.max.ms": "20000",
            "zookeeper.session.timeout.ms": "15000",  # the stopped followers stay in the ISR
        },
    )
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("div", 1, 3, replica_assignments={0: [0, 1, 2]})])
    wait_until(lambda: full_isr(cluster.bootstrap, "div"), what="full ISR")
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as p:
        for i in range(100):
            p.send("div", f"common-{i}".encode())
        p.flush()
    # Cut the followers off; the leader takes writes (acks=1) nobody else sees. A
    # follower frozen inside a long-poll fetch still receives the answer to it once it
    # resumes, so a first record goes out as bait for those pending fetches.
    for b in (1, 2):
        cluster.brokers[b].signal(signal.SIGSTOP)
    with Producer(bootstrap_servers=cluster.brokers[0].address, acks=1) as p:
        p.send("div", b"bait").get(10)
        time.sleep(0.5)
        for i in range(50):
            p.send("div", f"orphan-{i}".encode())
        p.flush()
    cluster.brokers[0].kill()
    for b in (1, 2):
        cluster.brokers[b].signal(signal.SIGCONT)
    b1 = cluster.brokers[1].address
    wait_until(lambda: describe(b1, "div")[0].leader in (1, 2), what="new leader")
    with Producer(bootstrap_servers=b1, acks="all") as p:
        for i in range(30):
            p.send("div", f"new-{i}".encode())
        p.flush()
    survivors = [r.value.decode() for r in read_all(b1, "div", 1, 131)]
    assert survivors[:100] == [f"common-{i}" for i in range(100)]
    assert survivors[-30:] == [f"new-{i}" for i in range(30)]
    assert not any(v.startswith("orphan") for v in survivors)

    cluster.brokers[0].start()  # comes back with 50 records the new leader never had
    wait_until(lambda: full_isr(b1, "div"), what="old leader back in the ISR")
    assert "truncating from 151 to" in cluster.brokers[0].log_path.read_text()
    # Make broker 0 the leader again: its log must now equal the survivors'.
    stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(b1))
    stub.ElectLeaders(cluster_pb2.ElectLeadersRequest(timeout_ms=20000), timeout=30)
    wait_until(lambda: describe(b1, "div")[0].leader == 0, what="broker 0 preferred leader again")
    values = [r.value.decode() for r in read_all(cluster.brokers[0].address, "div", 1, len(survivors))]
    assert values == survivors


def test_rack_aware_placement_from_broker_racks(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(0)
    racks = {0: "east", 1: "east", 2: "west", 3: "west"}
    for b, rack in racks.items():
        cluster.add_broker(b, start=False, **{"broker.rack": rack})
    for b in cluster.brokers.values():
        b.start(wait=False)
    for b in cluster.brokers.values():
        b.wait_ready()
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("racked", 8, 2)])
        brokers, _, _ = admin.describe_cluster()
    assert {b.node_id: b.rack for b in brokers} == racks
    for p in describe(cluster.bootstrap, "racked"):
        assert {racks[r] for r in p.replicas} == {"east", "west"}, p


def test_recreated_topic_replaces_a_stale_replica_log(cluster_factory: Callable[..., LocalCluster]) -> None:
    """A replica that was down while its topic was deleted and recreated under the same
    name must not keep the old records: the topic id (Kafka 2.8's) tells incarnations apart."""
    cluster = cluster_factory(2, **{"auto.leader.rebalance.enable": "false"})
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("again", 1, 2, replica_assignments={0: [0, 1]})])
    wait_until(lambda: full_isr(cluster.bootstrap, "again"), what="full ISR")
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as p:
        for i in range(50):
            p.send("again", f"old-{i}".encode()).get(10)  # one batch each: offsets line up record by record
    wait_until(lambda: (cluster.brokers[1].data_dir / "again-0" / "partition.metadata").exists(), what="topic id")
    cluster.brokers[1].kill()
    b0 = cluster.brokers[0].address
    with AdminClient(b0) as admin:
        admin.delete_topics(["again"])
    # Recreated straight in ZooKeeper (validation would refuse the dead broker 1, as Kafka's
    # does); the controller gives the new incarnation its topic id.
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start()
    try:
        zk.create(zkdata.topic_config_path("again"), zkdata.encode_topic_config({}), makepath=True)
        zk.create(zkdata.topic_path("again"), zkdata.encode_assignment({0: [0, 1]}), makepath=True)
        wait_until(lambda: zkdata.decode_topic_id(zk.get(zkdata.topic_path("again"))[0]) is not None, what="id")
    finally:
        zk.stop()
    wait_until(lambda: describe(b0, "again")[0].leader == 0, what="the new topic's leader")
    # Every write is checked: an unacknowledged one (its batch expired after the producer's
    # delivery_timeout_ms) leaves nothing for broker 1 to refetch, and the test would only
    # see an empty read at its end.
    started = time.monotonic()
    with Producer(bootstrap_servers=b0, acks=1) as p:
        futures = [p.send("again", f"new-{i}".encode()) for i in range(10)]
        p.flush()
    outcomes = [_outcome(f) for f in futures]
    assert outcomes == list(range(10)), (
        f"the new incarnation's writes to broker 0 (acks=1, {time.monotonic() - started:.1f} s): {outcomes}"
    )
    cluster.brokers[1].start()
    # Broker 1 has the ten records once it is in the ISR and broker 0's high watermark (the
    # smallest log end over the ISR) is 10. The ISR alone does not say it: a broker 1 whose
    # registration outlived the kill is in the new incarnation's first ISR, with nothing.
    try:
        wait_until(
            lambda: full_isr(b0, "again") and _high_watermark(b0, "again") == 10,
            what="broker 1 in the ISR with the 10 new records",
        )
    except AssertionError as exc:
        isr = describe(b0, "again")[0].isr
        raise AssertionError(f"{exc}; broker 0 says ISR {isr}, {_offsets(b0, 'again')}") from None
    cluster.brokers[0].kill()
    b1 = cluster.brokers[1].address
    wait_until(lambda: describe(b1, "again")[0].leader == 1, what="broker 1 leads")
    values = [r.value.decode() for r in read_all(b1, "again", 1, 10, timeout_s=20)]
    assert values == [f"new-{i}" for i in range(10)], f"read {values} from broker 1: {_offsets(b1, 'again')}"


def test_a_replica_removed_while_its_broker_was_down_deletes_its_log(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    """Broker 1 is down when the partition's replica set drops it (as a finished
    reassignment does): back up, it deletes the stray log instead of keeping it forever."""
    cluster = cluster_factory(2, **{"auto.leader.rebalance.enable": "false"})
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("moved", 1, 2, replica_assignments={0: [0, 1]})])
    wait_until(lambda: full_isr(cluster.bootstrap, "moved"), what="full ISR")
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as p:
        p.send("moved", b"x").get(10)
    stray = cluster.brokers[1].data_dir / "moved-0"
    assert stray.is_dir()
    cluster.brokers[1].kill()
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start()
    try:
        data, stat = zk.get(zkdata.topic_path("moved"))
        znode = zkdata.decode_topic_znode(data)
        zk.set(zkdata.topic_path("moved"), zkdata.encode_topic_znode(replace(znode, partitions={0: [0]})), stat.version)
    finally:
        zk.stop()
    wait_until(lambda: describe(cluster.brokers[0].address, "moved")[0].replicas == [0], what="replicas [0]")
    cluster.brokers[1].start()
    wait_until(lambda: not stray.exists(), timeout_s=30, what="broker 1 deleting its stray log")
