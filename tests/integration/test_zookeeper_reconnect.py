"""Watches with a bounded number of threads: a ZooKeeper reconnect with 1,500
watched partitions must not spawn a thread per znode, and the metadata cache and the
controller must still follow every change made after the reconnect."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from kazoo.protocol.connection import _CONNECTION_DROP, _SESSION_EXPIRED
from kazoo.protocol.states import KazooState

from kbroker.cluster.controller import Controller
from kbroker.cluster.metadata_cache import ClusterSnapshot, MetadataCache
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import BrokerInfo, LeaderAndIsr
from tests.support import InProcessControllerChannel, wait_until

pytestmark = pytest.mark.integration

TOPICS, PARTITIONS = 15, 100  # 1,500 partitions


@pytest.fixture
def zk(zk_connect: str) -> Iterator[ZkClient]:
    client = ZkClient(zk_connect)
    client.start()
    client.ensure_persistent_paths()
    client.register_broker(BrokerInfo(0, "127.0.0.1", 9000))
    try:
        yield client
    finally:
        client.close()


def all_led(snap: ClusterSnapshot, topics: int, partitions: int) -> bool:
    return len(snap.topics) == topics and all(
        len(info.states) == partitions and all(s.leader == 0 for s in info.states.values())
        for info in snap.topics.values()
    )


def drop_connection(zk: ZkClient) -> None:
    """Break the TCP connection as kazoo's own test harness does; the session survives."""
    lost, back = threading.Event(), threading.Event()

    def listener(state: KazooState) -> bool:
        if state == KazooState.SUSPENDED:
            lost.set()
        elif state == KazooState.CONNECTED and lost.is_set():
            back.set()
            return True
        return False

    zk.kazoo.add_listener(listener)
    zk.kazoo._call(_CONNECTION_DROP, None)
    assert lost.wait(5) and back.wait(15)


def test_a_reconnect_spawns_a_bounded_number_of_threads(zk: ZkClient) -> None:
    # What this process ran before (other tests on this worker) leaves threads of its
    # own: count from here.
    before = threading.active_count()
    cache = MetadataCache(zk)
    ctl = Controller(zk, 0, auto_leader_rebalance=False, channel=InProcessControllerChannel({0: cache}).maker)
    seen: list[tuple[str, int, LeaderAndIsr | None]] = []
    cache.on_partition_change(lambda t, p, _r, state, _c, _i: seen.append((t, p, state)))
    ctl.start()
    cache.start()
    try:
        wait_until(lambda: ctl.is_active, 15, "controller elected")
        for i in range(TOPICS):
            zk.create_topic(f"t{i}", {p: [0] for p in range(PARTITIONS)}, {})
        assert cache.wait_for(lambda s: all_led(s, TOPICS, PARTITIONS), 120), "1,500 partitions led"
        assert {(t, p) for t, p, state in seen if state is not None} == {
            (f"t{i}", p) for i in range(TOPICS) for p in range(PARTITIONS)
        }
        session = zk.session_id
        baseline = threading.active_count()

        peak = baseline
        sampling = True

        def sample() -> None:
            nonlocal peak
            while sampling:
                peak = max(peak, threading.active_count())
                time.sleep(0.001)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        seen.clear()
        drop_connection(zk)
        time.sleep(3)  # let the reconnect's work (re-reads, re-armed watches) run
        cache.sync()
        sampling = False
        sampler.join()
        assert zk.session_id == session
        print(f"one reconnect at {TOPICS * PARTITIONS} partitions: {baseline} -> peak {peak} threads")
        assert peak - baseline <= 10, f"{peak - baseline} threads spawned by one reconnect"
        assert peak - before < 30, f"{peak - before} threads for one ZooKeeper client, cache and controller"
        assert seen == []  # nothing changed meanwhile: listeners are not called for it

        # Changes after the reconnect still reach the cache (the controller's watches were
        # re-armed): a leader's ISR change, announced as a leader does ...
        state = zk.partition_state("t3", 42)
        assert state is not None
        zk.update_partition_state("t3", 42, LeaderAndIsr(0, state.leader_epoch, [0], 1, state.zk_version), None)
        zk.announce_isr_changes([("t3", 42)])
        assert cache.wait_for(lambda s: s.topics["t3"].states[42].zk_version == state.zk_version + 1, 10)
        assert [(t, p) for t, p, _ in seen] == [("t3", 42)]
        # ... and the controller's: a partition added to an existing topic gets a leader.
        found = zk.topic_assignment("t7")
        assert found is not None
        zk.set_topic_assignment("t7", {**found[0], PARTITIONS: [0]}, found[1])
        assert cache.wait_for(lambda s: PARTITIONS in s.topics["t7"].states, 15)
        zk.create_topic("late", {0: [0]}, {})
        assert cache.wait_for(lambda s: "late" in s.topics and 0 in s.topics["late"].states, 15)
        zk.mark_topic_for_deletion("t0")
        assert cache.wait_for(lambda s: "t0" not in s.topics, 15)
    finally:
        cache.stop()
        ctl.stop()


def test_the_cache_follows_changes_after_its_session_expired(zk: ZkClient, zk_connect: str) -> None:
    """The broker's session expires: its watches come back, and once it registers again (a
    new broker epoch) the controller sends it every partition's state again."""
    other = ZkClient(zk_connect)
    other.start()
    cache = MetadataCache(zk)
    channel = InProcessControllerChannel({0: cache})
    ctl = Controller(other, 9, auto_leader_rebalance=False, channel=channel.maker)
    ctl.start()
    cache.start()
    try:
        other.create_topic("t", {p: [0] for p in range(10)}, {})
        assert cache.wait_for(lambda s: "t" in s.topics and len(s.topics["t"].states) == 10, 15)
        session = zk.session_id
        lost, back = threading.Event(), threading.Event()

        def listener(state: KazooState) -> bool:
            if state == KazooState.LOST:
                lost.set()
            elif state == KazooState.CONNECTED and lost.is_set():
                back.set()
                return True
            return False

        zk.kazoo.add_listener(listener)
        zk.kazoo._call(_SESSION_EXPIRED, None)
        assert lost.wait(5) and back.wait(15) and zk.session_id != session
        # The registration went with the session: the partitions go offline (a broker not
        # registered is sent nothing), then come back when it registers again.
        # (ZooKeeper ends the old session after its 18 s timeout.)
        wait_until(lambda: not other.partition_state("t", 0).has_leader, 40, "t offline")  # type: ignore[union-attr]
        channel.sent.clear()
        zk.register_broker(BrokerInfo(0, "127.0.0.1", 9000))
        assert cache.wait_for(
            lambda s: all(st.leader == 0 and st.leader_epoch == 2 for st in s.topics["t"].states.values()), 15
        )
        # UpdateMetadata follows once the LeaderAndIsr of the batch was answered.
        wait_until(
            lambda: any(kind == "UpdateMetadata" and len(updates) == 10 for kind, _, updates in channel.sent),
            15,
            "UpdateMetadata of every partition",
        )
        # The new session re-armed every watch: later changes arrive.
        state = other.partition_state("t", 3)
        assert state is not None
        other.update_partition_state("t", 3, LeaderAndIsr(0, state.leader_epoch, [0], 1, state.zk_version), None)
        other.announce_isr_changes([("t", 3)])
        assert cache.wait_for(lambda s: s.topics["t"].states[3].zk_version == state.zk_version + 1, 15)
        other.create_topic("u", {0: [0]}, {})
        assert cache.wait_for(lambda s: "u" in s.topics and 0 in s.topics["u"].states, 15)
    finally:
        ctl.stop()
        cache.stop()
        other.close()
