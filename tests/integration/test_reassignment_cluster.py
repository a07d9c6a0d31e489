"""Reassignment against real brokers: requests are written to
``/admin/reassign_partitions`` with kazoo, as Kafka's ops tools do (ZooKeeper era)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from kbroker.cluster import zkdata
from kbroker.cluster.controller import Controller
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import BrokerInfo
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.errors import (
    InvalidReplicaAssignmentError,
    NoReassignmentInProgressError,
    NotControllerError,
    UnknownTopicOrPartitionError,
)
from tests.support import wait_until

pytestmark = pytest.mark.integration

NO_REBALANCE = {"auto.leader.rebalance.enable": "false"}


@pytest.fixture
def zk(zk_connect: str) -> Iterator[ZkClient]:
    client = ZkClient(zk_connect)
    client.start()
    try:
        yield client
    finally:
        client.close()


def request_moves(zk: ZkClient, moves: dict[tuple[str, int], list[int]]) -> None:
    """Write Kafka's request JSON (create, or overwrite as a ``--zookeeper`` cancel does)."""
    body = {
        "version": 1,
        "partitions": [{"topic": t, "partition": p, "replicas": rs} for (t, p), rs in sorted(moves.items())],
    }
    data = json.dumps(body).encode()
    if zk.kazoo.exists(zkdata.REASSIGN_PARTITIONS) is None:
        zk.kazoo.create(zkdata.REASSIGN_PARTITIONS, data, makepath=True)
    else:
        zk.kazoo.set(zkdata.REASSIGN_PARTITIONS, data)


def moving(zk: ZkClient, topic: str, p: int = 0) -> bool:
    found = zk.topic_znode(topic)
    return found is not None and found[0].reassigning(p)


def finished(zk: ZkClient, topic: str, target: list[int], p: int = 0) -> bool:
    found = zk.topic_znode(topic)
    state = zk.partition_state(topic, p)
    return (
        zk.kazoo.exists(zkdata.REASSIGN_PARTITIONS) is None
        and found is not None
        and not found[0].reassigning(p)
        and found[0].partitions[p] == target
        and state is not None
        and sorted(state.isr) == sorted(target)
        and state.leader in target
    )


def create(cluster: LocalCluster, topic: str, replicas: list[int]) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, replica_assignments={0: replicas})])


def in_sync(zk: ZkClient, topic: str, replicas: list[int]) -> bool:
    state = zk.partition_state(topic, 0)
    return state is not None and sorted(state.isr) == sorted(replicas) and state.leader >= 0


def produce(bootstrap: str, topic: str, values: range) -> None:
    with Producer(bootstrap_servers=bootstrap, acks="all") as p:
        futures = [p.send(topic, str(i).encode(), partition=0) for i in values]
        p.flush()
        for f in futures:
            f.get(30)


def read_values(bootstrap: str, topic: str, expected: int, timeout_s: float = 30) -> list[int]:
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, 0)])
        out: list[int] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=300).values():
                out.extend(int(r.value or b"-1") for r in recs)
        # A short extra poll: duplicates beyond ``expected`` must show up too.
        for recs in c.poll(timeout_ms=500).values():
            out.extend(int(r.value or b"-1") for r in recs)
        return out


def log_dir_gone(cluster: LocalCluster, broker: int, topic: str) -> bool:
    return not (cluster.brokers[broker].data_dir / f"{topic}-0").exists()


class Load:
    """An idempotent acks=all producer thread writing unique values; remembers every ack."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.acked: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(bootstrap, topic), daemon=True)
        self._thread.start()

    def _run(self, bootstrap: str, topic: str) -> None:
        i = 0
        with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5) as p:
            while not self._stop.is_set():
                batch = [(v, p.send(topic, str(v).encode(), partition=0)) for v in range(i, i + 20)]
                i += 20
                for v, f in batch:
                    try:
                        f.get(60)
                        self.acked.append(v)
                    except Exception:
                        pass
                time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)


def test_move_onto_a_new_broker_under_acks_all_load(cluster_factory: Callable[..., LocalCluster], zk: ZkClient) -> None:
    cluster = cluster_factory(3, **NO_REBALANCE)
    create(cluster, "mv", [0, 1])
    wait_until(lambda: in_sync(zk, "mv", [0, 1]), what="ISR [0, 1]")
    load = Load(cluster.bootstrap, "mv")
    wait_until(lambda: len(load.acked) > 100, what="first acks")
    cluster.add_broker()  # broker 3
    request_moves(zk, {("mv", 0): [2, 3]})
    wait_until(lambda: finished(zk, "mv", [2, 3]), timeout_s=45, what="the move to [2, 3]")
    wait_until(lambda: log_dir_gone(cluster, 0, "mv") and log_dir_gone(cluster, 1, "mv"), what="old logs deleted")
    n = len(load.acked)
    wait_until(lambda: len(load.acked) > n + 100, what="acks after the move")
    load.stop()
    values = read_values(cluster.brokers[2].address, "mv", len(load.acked))
    assert len(values) == len(set(values)), "a record was written twice"
    assert set(load.acked) <= set(values), "an acknowledged record was lost"


def test_a_new_controller_finishes_a_move_started_by_a_killed_one(
    cluster_factory: Callable[..., LocalCluster], zk: ZkClient
) -> None:
    cluster = cluster_factory(3, **NO_REBALANCE)
    controller = zk.controller_id()
    origin = [b for b in (0, 1, 2) if b != controller]
    create(cluster, "fo", origin)
    wait_until(lambda: in_sync(zk, "fo", origin), what="ISR")
    produce(cluster.bootstrap, "fo", range(200))
    cluster.add_broker(start=False)  # broker 3 is down: the move stays after step U
    target = [origin[1], 3]
    epoch = zk.partition_state("fo", 0).leader_epoch  # type: ignore[union-attr]
    request_moves(zk, {("fo", 0): target})
    wait_until(lambda: moving(zk, "fo"), what="step U")
    cluster.brokers[controller].signal(signal.SIGKILL)
    cluster.brokers[controller].proc.wait(10)  # type: ignore[union-attr]
    cluster.brokers[3].start()
    wait_until(lambda: zk.controller_id() not in (-1, controller), what="a new controller")
    wait_until(lambda: finished(zk, "fo", target), timeout_s=45, what="the move, by the new controller")
    # Step U bumped the epoch once, step B once more: nobody re-bumped on resume.
    assert zk.partition_state("fo", 0).leader_epoch == epoch + 2  # type: ignore[union-attr]
    wait_until(lambda: log_dir_gone(cluster, origin[0], "fo"), what="the removed replica's log deleted")
    alive = cluster.brokers[origin[1]].address
    assert sorted(read_values(alive, "fo", 200)) == list(range(200))


def test_cancel_restores_the_original_replicas(cluster_factory: Callable[..., LocalCluster], zk: ZkClient) -> None:
    cluster = cluster_factory(3, **NO_REBALANCE)
    create(cluster, "cx", [0, 1])
    wait_until(lambda: in_sync(zk, "cx", [0, 1]), what="ISR")
    produce(cluster.bootstrap, "cx", range(50))
    cluster.add_broker(start=False)  # broker 3 never comes: the move cannot finish
    request_moves(zk, {("cx", 0): [2, 3]})
    wait_until(lambda: in_sync(zk, "cx", [0, 1, 2]), what="broker 2 in sync, 3 missing")
    assert moving(zk, "cx")
    request_moves(zk, {("cx", 0): [0, 1]})  # as a --zookeeper cancel: the original replicas
    wait_until(lambda: finished(zk, "cx", [0, 1]) or finished(zk, "cx", [1, 0]), what="the cancel")
    wait_until(lambda: log_dir_gone(cluster, 2, "cx"), what="the adding replica's log deleted")
    assert sorted(read_values(cluster.bootstrap, "cx", 50)) == list(range(50))


def test_replication_factor_one_to_three_and_back_to_two(
    cluster_factory: Callable[..., LocalCluster], zk: ZkClient
) -> None:
    cluster = cluster_factory(3, **NO_REBALANCE)
    create(cluster, "rf", [0])
    wait_until(lambda: in_sync(zk, "rf", [0]), what="ISR")
    produce(cluster.bootstrap, "rf", range(100))
    request_moves(zk, {("rf", 0): [0, 1, 2]})
    wait_until(lambda: finished(zk, "rf", [0, 1, 2]), timeout_s=45, what="RF 3")
    request_moves(zk, {("rf", 0): [1, 2]})
    wait_until(lambda: finished(zk, "rf", [1, 2]), timeout_s=45, what="RF 2")
    wait_until(lambda: log_dir_gone(cluster, 0, "rf"), what="broker 0's log deleted")
    produce(cluster.bootstrap, "rf", range(100, 110))
    assert sorted(read_values(cluster.bootstrap, "rf", 110)) == list(range(110))


def test_a_down_target_broker_makes_the_move_wait(cluster_factory: Callable[..., LocalCluster], zk: ZkClient) -> None:
    cluster = cluster_factory(3, **NO_REBALANCE)
    create(cluster, "dn", [0, 1])
    wait_until(lambda: in_sync(zk, "dn", [0, 1]), what="ISR")
    produce(cluster.bootstrap, "dn", range(50))
    cluster.brokers[2].stop()
    request_moves(zk, {("dn", 0): [1, 2]})
    wait_until(lambda: moving(zk, "dn"), what="step U")
    time.sleep(6)  # more than the controller's 5 s completion tick
    assert moving(zk, "dn") and zk.kazoo.exists(zkdata.REASSIGN_PARTITIONS) is not None
    cluster.brokers[2].start()
    wait_until(lambda: finished(zk, "dn", [1, 2]), timeout_s=45, what="the move once broker 2 is back")
    wait_until(lambda: log_dir_gone(cluster, 0, "dn"), what="broker 0's log deleted")
    assert sorted(read_values(cluster.bootstrap, "dn", 50)) == list(range(50))


def test_the_controller_api_starts_lists_completes_and_cancels(zk: ZkClient, zk_connect: str) -> None:
    """Controller.alter/list_partition_reassignments in process; ZooKeeper sessions stand in
    for brokers and a leader's ISR write stands in for a follower catching up."""
    sessions = []
    for b in (0, 1, 2, 3):
        s = ZkClient(zk_connect)
        s.start()
        s.ensure_persistent_paths()
        s.register_broker(BrokerInfo(b, "127.0.0.1", 9000 + b))
        sessions.append(s)
    ctl = Controller(sessions[0], 0, auto_leader_rebalance=False)
    idle_ctl = Controller(sessions[1], 1, auto_leader_rebalance=False)
    ctl.start()
    wait_until(lambda: ctl.is_active, 15, "controller elected")
    idle_ctl.start()
    try:
        zk.create_topic("api", {0: [0, 1], 1: [0, 1]}, {})
        wait_until(lambda: in_sync(zk, "api", [0, 1]), 15, "state created")
        with pytest.raises(NotControllerError):
            idle_ctl.alter_partition_reassignments({("api", 0): [2, 3]})
        result = ctl.alter_partition_reassignments(
            {("api", 0): [2, 3], ("api", 1): [1, 1], ("api", 7): [1], ("nope", 0): [1]}
        )
        assert result[("api", 0)] is None
        assert isinstance(result[("api", 1)], InvalidReplicaAssignmentError)
        assert isinstance(result[("api", 7)], UnknownTopicOrPartitionError)
        assert isinstance(result[("nope", 0)], UnknownTopicOrPartitionError)
        assert isinstance(
            ctl.alter_partition_reassignments({("api", 1): None})[("api", 1)], NoReassignmentInProgressError
        )
        assert ctl.list_partition_reassignments() == {("api", 0): ([2, 3, 0, 1], [2, 3], [0, 1])}
        assert ctl.list_partition_reassignments([("api", 1)]) == {}

        def join(broker: int) -> None:  # the leader adds a caught-up follower (its own CAS)
            state = zk.partition_state("api", 0)
            assert state is not None
            zk.update_partition_state("api", 0, replace(state, isr=[*state.isr, broker]), None)
            zk.announce_isr_changes([("api", 0)])  # and announces it, as leaders do

        join(2)
        ctl.request_preferred_election()  # 2 is preferred and in sync, but the partition moves
        ctl.list_partition_reassignments()  # (a barrier: events run in order)
        assert zk.partition_state("api", 0).leader == 0  # type: ignore[union-attr]
        join(3)  # the announcement reaches the controller: step B
        wait_until(lambda: finished(zk, "api", [2, 3]), 15, "the move completes")
        assert ctl.list_partition_reassignments() == {}

        # Cancel through the API restores the original replica set.
        assert ctl.alter_partition_reassignments({("api", 1): [1, 2]}) == {("api", 1): None}
        assert moving(zk, "api", 1)
        assert ctl.alter_partition_reassignments({("api", 1): None}) == {("api", 1): None}
        found = zk.topic_znode("api")
        assert found is not None and not found[0].reassigning(1) and set(found[0].partitions[1]) == {0, 1}
    finally:
        idle_ctl.stop()
        ctl.stop()
        for s in sessions:
            s.close()


def test_turning_unclean_election_on_elects_offline_partitions(zk: ZkClient, zk_connect: str) -> None:
    sessions: dict[int, ZkClient] = {}

    def register(b: int) -> None:
        s = ZkClient(zk_connect)
        s.start()
        s.ensure_persistent_paths()
        s.register_broker(BrokerInfo(b, "127.0.0.1", 9000 + b))
        sessions[b] = s

    register(0)
    register(1)
    ctl = Controller(sessions[0], 0, auto_leader_rebalance=False)
    ctl.start()
    try:
        wait_until(lambda: ctl.is_active, 15, "controller elected")
        zk.create_topic("un", {0: [1, 2]}, {})
        wait_until(lambda: in_sync(zk, "un", [1]), 15, "ISR [1]: broker 2 is not registered")
        register(2)
        sessions.pop(1).close()
        wait_until(lambda: zk.partition_state("un", 0).leader == zkdata.NO_LEADER, 15, "offline")  # type: ignore[union-attr]
        ctl.set_unclean_default(True)
        wait_until(lambda: zk.partition_state("un", 0).leader == 2, 15, "an unclean leader")  # type: ignore[union-attr]
    finally:
        ctl.stop()
        for s in sessions.values():
            s.close()
