"""The group state machine's Kafka 2.8 membership rules, driven through its non-blocking
halves (no broker, no ZooKeeper): static members (KIP-345), member ids handed out before
joining (KIP-394), protocol selection by vote, a rejoin that changes nothing, and commits
that no rebalance can overtake."""

from __future__ import annotations

import threading
import time

import pytest

from kbroker.cluster.zkdata import CommittedOffset
from kbroker.group.coordinator import GroupCoordinator
from kbroker.group.group import Group, GroupState, JoinResult, MemberIdNeeded
from kclient.errors import FencedInstanceIdError, UnknownMemberIdError
from tests.support import FakeMetadataCache
from tests.unit.test_delete_offsets import FakeStore


def new_group() -> Group:
    return Group("g", 0, initial_delay_s=0.0, on_change=lambda g: None)


def join(
    g: Group,
    member_id: str = "",
    instance: str | None = None,
    *,
    protocols: list[tuple[str, bytes]] | None = None,
    require_known: bool = False,
    session_ms: int = 10000,
    rebalance_ms: int = 30000,
) -> tuple[str, int]:
    return g.join_begin(
        member_id,
        client_id="c",
        client_host="h",
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
        protocol_type="consumer",
        protocols=protocols or [("range", b"sub")],
        group_instance_id=instance,
        require_known_member_id=require_known,
    )


def answered(g: Group, member_id: str, my_round: int) -> JoinResult:
    result, _ = g.join_poll(member_id, my_round)
    assert result is not None, f"{member_id} still waits"
    g.call_done(member_id)
    return result


def stable_pair(g: Group, rebalance_ms: int = 30000) -> tuple[str, str, int]:
    """Static members a (instance "ia") and b (instance "ib"), Stable, a leads."""
    a, ra = join(g, instance="ia", rebalance_ms=rebalance_ms)
    res_a = answered(g, a, ra)
    g.sync_begin(a, res_a.generation, {a: b"A"})
    g.call_done(a)
    b, rb = join(g, instance="ib", rebalance_ms=rebalance_ms)
    a2, ra2 = join(g, a, instance="ia", rebalance_ms=rebalance_ms)
    res_a, res_b = answered(g, a2, ra2), answered(g, b, rb)
    assert res_a.leader_id == a and res_a.instance_ids == {a: "ia", b: "ib"}
    g.sync_begin(a, res_a.generation, {a: b"A", b: b"B"}, "ia")
    g.call_done(a)
    assert g.sync_poll(b, res_b.generation) == b"B"
    assert g.state == GroupState.STABLE
    return a, b, res_a.generation


def test_a_restarted_static_member_gets_its_assignment_back_without_a_rebalance() -> None:
    g = new_group()
    a, b, generation = stable_pair(g)
    b2, rb2 = join(g, instance="ib")  # b restarted: unknown member id, same instance id
    res = answered(g, b2, rb2)
    assert b2 != b and res.generation == generation and g.state == GroupState.STABLE
    assert res.leader_id == a and res.members == []
    g.sync_begin(b2, generation, {}, "ib")
    assert g.sync_poll(b2, generation) == b"B"
    g.heartbeat(a, generation, "ia")  # the other member saw no rebalance
    assert g.generation == generation


def test_a_restarted_static_leader_is_not_told_to_assign_again() -> None:
    g = new_group()
    a, _, generation = stable_pair(g)
    a2, ra2 = join(g, instance="ia")
    res = answered(g, a2, ra2)
    assert res.leader_id == a != a2 and res.members == [] and g.leader_id == a2
    assert g.state == GroupState.STABLE and g.generation == generation


def test_the_replaced_member_id_is_fenced() -> None:
    g = new_group()
    _, b, generation = stable_pair(g)
    join(g, instance="ib")
    with pytest.raises(FencedInstanceIdError):
        g.heartbeat(b, generation, "ib")
    with pytest.raises(FencedInstanceIdError):
        g.check_commit(b, generation, "ib")
    with pytest.raises(FencedInstanceIdError):
        g.sync_begin(b, generation, {}, "ib")
    with pytest.raises(FencedInstanceIdError):
        join(g, b, instance="ib")
    with pytest.raises(FencedInstanceIdError):
        g.heartbeat(b, generation)  # without its instance id: still the replaced member


def test_a_static_member_that_does_not_rejoin_stays_until_its_session_times_out() -> None:
    g = new_group()
    a, b, _ = stable_pair(g, rebalance_ms=100)
    c, rc = join(g, rebalance_ms=100)  # a newcomer; neither a nor b rejoins
    time.sleep(0.15)
    res = answered(g, c, rc)
    assert set(g.members) == {a, b, c}  # static laggards are kept
    assert res.leader_id == c and {m for m, _ in res.members} == {a, b, c}
    assert sorted(g.expire(time.monotonic() + 11)) == sorted([a, b, c])
    assert "ia" not in g.static_members and "ib" not in g.static_members


def test_leave_by_instance_id_alone_removes_the_static_member() -> None:
    g = new_group()
    _, b, _ = stable_pair(g)
    g.leave("", "ib")
    assert b not in g.members and "ib" not in g.static_members
    assert g.state == GroupState.PREPARING_REBALANCE
    with pytest.raises(UnknownMemberIdError):
        g.leave("", "nobody")


def test_kip394_the_first_join_is_answered_member_id_required() -> None:
    g = new_group()
    with pytest.raises(MemberIdNeeded) as info:
        join(g, require_known=True)
    mid = info.value.member_id
    assert mid and info.value.errno == 79 and g.members == {} and g.state == GroupState.EMPTY
    joined, r = join(g, mid, require_known=True)
    assert joined == mid and answered(g, mid, r).leader_id == mid
    with pytest.raises(UnknownMemberIdError):
        join(g, "made-up", require_known=True)


def test_kip394_a_pending_member_id_lapses_after_its_session_timeout() -> None:
    g = new_group()
    with pytest.raises(MemberIdNeeded) as info:
        join(g, require_known=True, session_ms=10000)
    g.expire(time.monotonic() + 11)
    with pytest.raises(UnknownMemberIdError):
        join(g, info.value.member_id)


def test_kip394_a_round_waits_for_a_pending_member() -> None:
    g = new_group()
    a, ra = join(g)
    answered(g, a, ra)
    g.sync_begin(a, 1, {a: b"A"})
    g.call_done(a)
    with pytest.raises(MemberIdNeeded) as info:
        join(g, require_known=True)
    a2, ra2 = join(g, a)  # the leader rejoins (a rebalance); b is still pending
    assert g.join_poll(a2, ra2)[0] is None
    b, rb = join(g, info.value.member_id)
    assert answered(g, a2, ra2).generation == answered(g, b, rb).generation == 2


def test_the_protocol_with_most_first_choices_wins() -> None:
    g = Group("g", 0, initial_delay_s=0.05, on_change=lambda g: None)
    rounds = [
        join(g, protocols=[("range", b""), ("cooperative-sticky", b"")]),
        join(g, protocols=[("cooperative-sticky", b""), ("range", b"")]),
        join(g, protocols=[("cooperative-sticky", b""), ("range", b"")]),
    ]
    time.sleep(0.1)
    assert {answered(g, m, r).protocol for m, r in rounds} == {"cooperative-sticky"}


def test_an_unchanged_follower_rejoining_a_stable_group_causes_no_rebalance() -> None:
    g = new_group()
    _, b, generation = stable_pair(g)
    b2, rb = join(g, b, instance="ib")
    res = answered(g, b2, rb)
    assert res.generation == generation and g.state == GroupState.STABLE
    # A changed subscription (a cooperative member's owned partitions) starts a round.
    join(g, b, instance="ib", protocols=[("range", b"owns-less")])
    assert g.state == GroupState.PREPARING_REBALANCE


def test_no_rebalance_completes_between_a_commits_check_and_its_write() -> None:
    """A commit's check and write are one step: a member of generation N cannot write an
    offset after generation N+1 handed its partitions to someone else."""
    store = FakeStore()
    c = GroupCoordinator(1, store, FakeMetadataCache([1]), initial_rebalance_delay_ms=0)  # type: ignore[arg-type]
    g, a, ra = c.join_begin(
        "grp",
        "",
        client_id="c",
        client_host="h",
        session_timeout_ms=10000,
        rebalance_timeout_ms=10000,
        protocol_type="consumer",
        protocols=[("range", b"")],
    )
    res = answered(g, a, ra)
    g.sync_begin(a, res.generation, {a: b""})
    g.call_done(a)
    entered, release = threading.Event(), threading.Event()
    written_at: list[int] = []
    plain_commit = store.commit

    def slow_commit(group: str, offsets: dict[tuple[str, int], CommittedOffset]) -> None:
        entered.set()
        release.wait(5)
        written_at.append(g.generation)
        plain_commit(group, offsets)

    store.commit = slow_commit  # type: ignore[method-assign]
    committer = threading.Thread(target=c.commit, args=("grp", a, res.generation, {("t", 0): CommittedOffset(7)}))
    committer.start()
    assert entered.wait(5)

    def rebalance() -> None:
        g.leave(a)  # the group empties: generation N+1

    other = threading.Thread(target=rebalance)
    other.start()
    time.sleep(0.2)
    release.set()
    committer.join(5)
    other.join(5)
    assert written_at == [res.generation]  # written before the generation moved on
    assert g.generation == res.generation + 1
    with pytest.raises(UnknownMemberIdError):
        c.commit("grp", a, res.generation, {("t", 0): CommittedOffset(8)})
