"""The broker's group state machine, driven through its non-blocking halves (no broker,
no ZooKeeper): rounds complete when every member rejoined or at the deadline, the
leader assigns, laggards are dropped, generations only grow, and every change wakes
parked requests."""

from __future__ import annotations

import time

import pytest

from kbroker.group.group import Group, GroupState
from kclient.errors import IllegalGenerationError, RebalanceInProgressError, UnknownMemberIdError


def new_group(initial_delay_s: float = 0.0) -> tuple[Group, list[int], list[int]]:
    persisted: list[int] = []
    wakes: list[int] = []
    g = Group(
        "g",
        0,
        initial_delay_s=initial_delay_s,
        on_change=lambda grp: persisted.append(grp.generation),
        on_wake=lambda grp: wakes.append(grp.version),
    )
    return g, persisted, wakes


def join(g: Group, member_id: str = "", rebalance_ms: int = 30000) -> tuple[str, int]:
    return g.join_begin(
        member_id,
        client_id="c",
        client_host="h",
        session_timeout_ms=10000,
        rebalance_timeout_ms=rebalance_ms,
        protocol_type="consumer",
        protocols=[("range", b"meta-" + member_id.encode())],
    )


def test_a_round_completes_when_every_member_has_rejoined() -> None:
    g, persisted, wakes = new_group()
    a, ra = join(g)
    result, _ = g.join_poll(a, ra)
    assert result is not None and result.generation == 1 and result.leader_id == a
    g.call_done(a)
    assert g.sync_begin(a, 1, {a: b"A"}) is None
    assert g.sync_poll(a, 1) == b"A" and g.state == GroupState.STABLE
    g.call_done(a)

    b, rb = join(g)  # a newcomer starts a rebalance; it waits for a
    assert g.join_poll(b, rb)[0] is None
    seen = g.version
    a2, ra2 = join(g, a)
    assert g.version > seen and wakes[-1] == g.version  # parked requests were woken
    ra_result, _ = g.join_poll(a2, ra2)
    rb_result, _ = g.join_poll(b, rb)
    assert ra_result is not None and rb_result is not None
    assert ra_result.generation == rb_result.generation == 2
    leader = ra_result if ra_result.member_id == ra_result.leader_id else rb_result
    assert sorted(m for m, _ in leader.members) == sorted([a, b])
    assert persisted and persisted[-1] == 2


def test_followers_wait_for_the_leaders_assignment() -> None:
    g, _, _ = new_group(initial_delay_s=0.1)  # both land in the first generation
    a, ra = join(g)
    b, rb = join(g)
    time.sleep(0.15)
    res_a, _ = g.join_poll(a, ra)
    res_b, _ = g.join_poll(b, rb)
    assert res_a is not None and res_b is not None
    leader, follower = (a, b) if res_a.leader_id == a else (b, a)
    g.sync_begin(follower, res_a.generation, {})
    assert g.sync_poll(follower, res_a.generation) is None  # parked until the leader syncs
    g.sync_begin(leader, res_a.generation, {leader: b"L", follower: b"F"})
    assert g.sync_poll(follower, res_a.generation) == b"F"
    assert g.sync_poll(leader, res_a.generation) == b"L"


def test_a_member_that_does_not_rejoin_is_dropped_at_the_deadline() -> None:
    g, _, _ = new_group()
    a, ra = join(g, rebalance_ms=200)
    g.join_poll(a, ra)
    g.call_done(a)
    b, rb = join(g, rebalance_ms=200)  # a never rejoins
    result, wait_s = g.join_poll(b, rb)
    assert result is None and 0 < wait_s <= 0.2
    time.sleep(wait_s + 0.05)
    result, _ = g.join_poll(b, rb)
    assert result is not None and result.leader_id == b and [m for m, _ in result.members] == [b]
    with pytest.raises(UnknownMemberIdError):
        g.heartbeat(a, result.generation)


def test_the_initial_delay_holds_a_new_group_open() -> None:
    g, _, _ = new_group(initial_delay_s=0.2)
    a, ra = join(g)
    assert g.join_poll(a, ra)[0] is None
    time.sleep(0.25)
    result, _ = g.join_poll(a, ra)
    assert result is not None and result.generation == 1


def test_stale_generations_and_rebalances_are_refused() -> None:
    g, _, _ = new_group()
    a, ra = join(g)
    result, _ = g.join_poll(a, ra)
    assert result is not None
    with pytest.raises(IllegalGenerationError):
        g.sync_begin(a, result.generation - 1, {})
    join(g)
    with pytest.raises(RebalanceInProgressError):
        g.heartbeat(a, result.generation)


def test_a_member_in_a_call_is_not_expired() -> None:
    g, _, _ = new_group()
    a, ra = join(g)
    g.join_poll(a, ra)
    assert g.expire(time.monotonic() + 3600) == []  # still in its JoinGroup call
    g.call_done(a)
    assert g.expire(time.monotonic() + 3600) == [a]


def test_the_next_expiry_is_the_earliest_session_deadline() -> None:
    """The reaper wakes at this deadline (not on a fixed tick), so a silent member is gone
    when its session timeout has passed, as Kafka's heartbeat purgatory does."""
    g, _, _ = new_group()
    assert g.next_expiry() is None
    a, ra = join(g)
    g.join_poll(a, ra)
    assert g.next_expiry() is None  # in its JoinGroup call: no deadline runs
    g.call_done(a)
    deadline = g.next_expiry()
    assert deadline is not None
    assert g.expire(deadline - 0.01) == []
    assert g.expire(deadline + 0.01) == [a]


def test_a_transactional_commit_is_checked_against_the_member_it_names() -> None:
    g, _, _ = new_group()
    a, ra = join(g)
    result, _ = g.join_poll(a, ra)
    assert result is not None
    g.check_txn_commit(a, result.generation)  # the current member and generation
    g.check_txn_commit("", -1)  # a producer that names only the group (KIP-447 allows it)
    with pytest.raises(IllegalGenerationError):
        g.check_txn_commit(a, result.generation - 1)  # a zombie's last generation
    with pytest.raises(UnknownMemberIdError):
        g.check_txn_commit("gone", result.generation)
