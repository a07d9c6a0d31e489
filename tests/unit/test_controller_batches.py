"""The controller changes many partitions with pipelined, fenced writes.

A fake kazoo (an in-memory znode tree) counts the calls: blocking round trips
(``get``, ``set``, ``create``, ``exists``, ``get_children``, ``commit``) must not grow
with the number of partitions; the writes go through ``commit_async`` (one small fenced
transaction per partition, all in flight together).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kazoo.exceptions import BadVersionError

from kbroker.cluster import zkdata
from kbroker.cluster.controller import PARTITION_LINES_MAX, Controller
from kbroker.cluster.zk_client import ControllerMovedError, ReplicaShuttingDownError, ZkClient
from kbroker.cluster.zkdata import BrokerInfo, LeaderAndIsr
from tests.support import FakeKazoo, InProcessControllerChannel


def cluster(partitions: int, leader: int = 1) -> tuple[ZkClient, FakeKazoo, list[tuple[str, int]]]:
    zk = ZkClient("127.0.0.1:1")
    kz = FakeKazoo()
    zk.kazoo = kz  # type: ignore[assignment]
    kz.nodes[zkdata.CONTROLLER_EPOCH] = (zkdata.encode_controller_epoch(3), 2)
    for b in (1, 2, 3):
        kz.nodes[zkdata.broker_path(b)] = (zkdata.encode_broker(BrokerInfo(b, "h", 9000 + b)), 0)
    tps = []
    for t in range(max(1, partitions // 50)):
        topic = f"t{t}"
        assignment = {p: [leader, leader % 3 + 1, (leader + 1) % 3 + 1] for p in range(min(50, partitions))}
        kz.nodes[zkdata.topic_path(topic)] = (zkdata.encode_assignment(assignment, zkdata.new_topic_id()), 0)
        for p, replicas in assignment.items():
            state = LeaderAndIsr(replicas[0], 0, replicas, 3)
            kz.nodes[zkdata.partition_state_path(topic, p)] = (zkdata.encode_leader_and_isr(state), 0)
            tps.append((topic, p))
    return zk, kz, tps


def controller(zk: ZkClient) -> Controller:
    ctl = Controller(zk, 1)
    ctl.epoch, ctl._epoch_zk_version, ctl._active = 3, 2, True
    return ctl


def test_a_batch_of_state_writes_is_pipelined_and_fenced() -> None:
    zk, kz, tps = cluster(200)
    states = zk.partition_states(tps)
    new = {tp: LeaderAndIsr(2, s.leader_epoch + 1, [2, 3], 3, s.zk_version) for tp, s in states.items() if s}
    kz.calls.clear()
    results = zk.update_partition_states(new, 2)
    assert results == {tp: 1 for tp in tps}
    assert kz.calls["commit_async"] == 200 and kz.blocking() == 0
    # a partition changed meanwhile fails alone; the others are written
    stale = {tp: LeaderAndIsr(3, 2, [3], 3, 0) for tp in tps[:3]}
    stale.update({tp: LeaderAndIsr(3, 2, [3], 3, 1) for tp in tps[3:5]})
    results = zk.update_partition_states(stale, 2)
    assert all(isinstance(results[tp], BadVersionError) for tp in tps[:3])
    assert [results[tp] for tp in tps[3:5]] == [2, 2]


def test_a_deposed_controller_writes_nothing() -> None:
    zk, kz, tps = cluster(50)
    before = dict(kz.nodes)
    with pytest.raises(ControllerMovedError):
        zk.update_partition_states({tp: LeaderAndIsr(2, 1, [2], 3, 0) for tp in tps}, 1)
    assert kz.nodes == before


@pytest.mark.parametrize("what", ["controlled_shutdown", "broker_failure", "preferred"])
def test_controller_round_trips_do_not_grow_with_partitions(what: str) -> None:
    blocking = {}
    for n in (50, 500):
        zk, kz, tps = cluster(n)
        ctl = controller(zk)
        if what == "preferred":
            for tp in tps:  # every partition led by its second replica
                kz.nodes[zkdata.partition_state_path(*tp)] = (
                    zkdata.encode_leader_and_isr(LeaderAndIsr(2, 1, [1, 2, 3], 3)),
                    1,
                )
        kz.calls.clear()
        if what == "controlled_shutdown":
            assert ctl._controlled_shutdown(1, 7) == []
        elif what == "broker_failure":
            del kz.nodes[zkdata.broker_path(1)]
            ctl._on_brokers()
        else:
            ctl._elect_preferred(None)
        assert kz.calls["commit_async"] == n  # one fenced write per changed partition, in flight together
        # (a controlled shutdown first marks the broker's registration: one fenced commit)
        assert kz.calls["commit"] == (1 if what == "controlled_shutdown" else 0)
        blocking[n] = kz.blocking()
        states = zk.partition_states(tps)
        for tp in tps:
            s = states[tp]
            assert s is not None
            if what == "preferred":
                assert s.leader == 1 and s.leader_epoch == 2
            else:
                assert s.leader == 2 and s.isr == [2, 3] and s.controller_epoch == 3 and s.leader_epoch == 1
    assert blocking[50] == blocking[500], blocking


def test_new_partitions_are_created_in_one_pipelined_batch() -> None:
    zk, kz, _tps = cluster(50)
    assignment = {p: [1, 2, 3] for p in range(300)}
    kz.nodes[zkdata.topic_path("fresh")] = (zkdata.encode_assignment(assignment, zkdata.new_topic_id()), 0)
    ctl = controller(zk)
    kz.calls.clear()
    ctl._on_topic("fresh")
    assert kz.calls["commit_async"] == 300 and kz.calls["commit"] == 0
    assert kz.blocking() < 10
    states = zk.partition_states([("fresh", p) for p in range(300)])
    assert all(s is not None and s.leader == 1 and s.isr == [1, 2, 3] for s in states.values())


def test_a_state_changed_meanwhile_is_re_read_and_decided_again() -> None:
    zk, kz, tps = cluster(50)
    ctl = controller(zk)
    # A leader shrank one ISR after the controller read it: its first write fails the
    # version check, the controller re-reads it and decides from the fresh state.
    real = zk.partition_states
    raced = tps[7]

    def racing(parts: Any) -> Any:
        out = real(parts)
        path = zkdata.partition_state_path(*raced)
        if raced in out and kz.nodes[path][1] == 0:
            kz.nodes[path] = (zkdata.encode_leader_and_isr(LeaderAndIsr(1, 0, [1, 3], 3)), 1)
        return out

    zk.partition_states = racing  # type: ignore[method-assign]
    assert ctl._controlled_shutdown(1, 7) == []
    state = real([raced])[raced]
    assert state is not None and state.leader == 3 and state.isr == [3] and state.zk_version == 2


def test_leaders_cannot_add_a_broker_in_controlled_shutdown_to_an_isr() -> None:
    zk, kz, tps = cluster(50)
    ctl = controller(zk)
    tp = tps[0]
    assert ctl._controlled_shutdown(1, 7) == []
    state = zk.partition_states([tp])[tp]
    assert state is not None and state.leader == 2 and state.isr == [2, 3]
    # broker 1 still fetches and catches up: its leader's expansion is refused
    grown = LeaderAndIsr(2, state.leader_epoch, [1, 2, 3], 3, state.zk_version)
    with pytest.raises(ReplicaShuttingDownError):
        zk.update_partition_state(*tp, grown, None)
    assert zk.partition_states([tp])[tp] == state
    # a broker that is not shutting down is added as before (one transaction)
    kz.nodes[zkdata.partition_state_path(*tp)] = (zkdata.encode_leader_and_isr(LeaderAndIsr(2, 1, [2], 3)), 5)
    kz.calls.clear()
    assert zk.update_partition_state(*tp, LeaderAndIsr(2, 1, [2, 3], 3, 5), None) == 6
    assert kz.calls["commit_async"] == 1 and kz.blocking() == 0
    # a new registration of broker 1 (version 0 again) may be added
    kz.nodes[zkdata.broker_path(1)] = (kz.nodes[zkdata.broker_path(1)][0], 0)
    assert zk.update_partition_state(*tp, LeaderAndIsr(2, 1, [1, 2, 3], 3, 6), None) == 7


def test_a_failover_reads_states_once_and_sends_one_request_per_broker() -> None:
    """The controller's cache: the first event reads every state (pipelined), later ones
    read none; what a batch wrote goes out as one LeaderAndIsr per replica and one
    UpdateMetadata per live broker."""
    zk, kz, _ = cluster(500)
    channel = InProcessControllerChannel({})
    ctl = Controller(zk, 1, channel=channel.maker)
    ctl.epoch, ctl._epoch_zk_version, ctl._active = 3, 2, True
    ctl._channel = channel.maker(1, 3)
    ctl._on_brokers()  # the first round: loads the cache, every broker is new
    ctl._send_full_state()
    assert {(kind, b) for kind, b, _ in channel.sent} == {
        (k, b) for k in ("LeaderAndIsr", "UpdateMetadata") for b in (1, 2, 3)
    }
    assert all(len(updates) == 500 for _, _, updates in channel.sent)
    channel.sent.clear()
    kz.calls.clear()
    del kz.nodes[zkdata.broker_path(1)]  # broker 1 (every partition's leader) dies
    ctl._on_brokers()
    assert kz.calls["get_async"] == 0  # decided from the cache
    assert kz.calls["commit_async"] == 500
    assert sorted((kind, b, len(u)) for kind, b, u in channel.sent) == [
        ("LeaderAndIsr", 2, 500),
        ("LeaderAndIsr", 3, 500),
        ("UpdateMetadata", 2, 500),
        ("UpdateMetadata", 3, 500),
    ]
    assert all(u.state.leader == 2 and u.state.zk_version == 1 for _, _, updates in channel.sent for u in updates)


def test_a_big_batch_logs_a_bounded_number_of_lines(caplog: pytest.LogCaptureFixture) -> None:
    zk, kz, _ = cluster(500)
    ctl = controller(zk)
    caplog.set_level(logging.DEBUG, logger="kbroker.cluster.controller")
    del kz.nodes[zkdata.broker_path(1)]
    ctl._on_brokers()
    ctl._lines.emit()
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(info) <= PARTITION_LINES_MAX + 2, info
    assert "490 more partition line(s) of this event at DEBUG" in " ".join(info)
    assert any("500 partition state(s) changed in one batch" in line for line in info)
    assert len([line for line in debug if "leader 2 elected (was 1)" in line]) == 490
