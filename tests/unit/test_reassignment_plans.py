"""Reassignment plans: a balanced, rack-aware --generate that moves as little as it can,
and draining one broker (pure functions)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kbroker.cluster.assignment import assign_replicas
from kbroker.cluster.replica_plan import RACKS_INCOMPLETE, Plan, plan_decommission, propose_reassignment
from kclient.errors import InvalidReplicaAssignmentError, InvalidReplicationFactorError


def topic(name: str, partitions: int, rf: int, brokers: list[int], start: int = 0) -> Plan:
    placed = assign_replicas(brokers, partitions, rf, start_index=start, shift=0)
    return {(name, p): r for p, r in placed.items()}


def replica_load(plan: Plan) -> Counter[int]:
    return Counter(b for reps in plan.values() for b in reps)


def moved(before: Plan, after: Plan) -> int:
    return sum(len(set(after[tp]) - set(before[tp])) for tp in before)


def test_growing_from_three_to_four_brokers_moves_only_what_balance_needs() -> None:
    current = topic("orders", 12, 3, [1, 2, 3])
    plan = propose_reassignment(current, [1, 2, 3, 4])
    assert replica_load(plan) == {1: 9, 2: 9, 3: 9, 4: 9}
    assert Counter(reps[0] for reps in plan.values()) == {1: 3, 2: 3, 3: 3, 4: 3}
    assert all(len(set(reps)) == 3 for reps in plan.values())
    assert moved(current, plan) == 9  # exactly the replicas broker 4 takes over


def test_a_balanced_assignment_is_left_as_it_is() -> None:
    current = topic("orders", 6, 2, [1, 2, 3])
    assert propose_reassignment(current, [3, 1, 2]) == current


def test_replicas_on_brokers_off_the_list_move_and_the_plan_is_deterministic() -> None:
    current = {**topic("a", 4, 2, [1, 2, 3]), **topic("b", 3, 1, [1, 2, 3], start=1)}
    plan = propose_reassignment(current, [2, 3, 4])
    assert 1 not in replica_load(plan)
    assert max(replica_load(plan).values()) - min(replica_load(plan).values()) <= 1
    assert {tp: len(r) for tp, r in plan.items()} == {tp: len(r) for tp, r in current.items()}
    assert plan == propose_reassignment(current, [4, 3, 2])


def test_racks_spread_each_partition() -> None:
    racks: dict[int, str | None] = {1: "a", 2: "a", 3: "b", 4: "b"}
    current = {("t", p): [1, 2] for p in range(4)}  # every partition on rack a only
    plan = propose_reassignment(current, [1, 2, 3, 4], racks)
    assert all({racks[b] for b in reps} == {"a", "b"} for reps in plan.values()), plan
    assert replica_load(plan) == {1: 2, 2: 2, 3: 2, 4: 2}


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(InvalidReplicationFactorError, match="Replication factor: 3 larger than available brokers: 2"):
        propose_reassignment(topic("t", 2, 3, [1, 2, 3]), [1, 2])
    with pytest.raises(InvalidReplicaAssignmentError, match="duplicate"):
        propose_reassignment(topic("t", 2, 1, [1, 2]), [1, 1, 2])
    with pytest.raises(InvalidReplicaAssignmentError) as info:
        propose_reassignment(topic("t", 2, 1, [1, 2]), [1, 2], {1: "a", 2: None})
    assert str(info.value).endswith(RACKS_INCOMPLETE)
    with pytest.raises(InvalidReplicaAssignmentError, match="empty"):
        propose_reassignment(topic("t", 2, 1, [1, 2]), [])


@settings(max_examples=60, deadline=None)
@given(
    brokers=st.integers(2, 6),
    extra=st.integers(0, 3),
    partitions=st.integers(1, 20),
    rf=st.integers(1, 3),
    start=st.integers(0, 5),
)
def test_any_proposal_is_valid_and_balanced(brokers: int, extra: int, partitions: int, rf: int, start: int) -> None:
    old = list(range(1, brokers + 1))
    new = list(range(1, brokers + extra + 1))
    rf = min(rf, brokers)
    current = topic("t", partitions, rf, old, start=start % brokers)
    plan = propose_reassignment(current, new)
    load = replica_load(plan)
    counts = [load.get(b, 0) for b in new]
    assert max(counts) - min(counts) <= 1
    assert all(len(reps) == rf and len(set(reps)) == rf and set(reps) <= set(new) for reps in plan.values())
    leads = Counter(reps[0] for reps in plan.values())
    if partitions >= len(new):
        assert max(leads.values()) - min(leads.get(b, 0) for b in new) <= 1, plan


def test_decommission_replaces_the_broker_in_place_on_the_least_loaded() -> None:
    current = topic("orders", 8, 2, [1, 2, 3, 4])
    plan = plan_decommission(current, 4, {1: None, 2: None, 3: None, 4: None})
    assert set(plan) == {tp for tp, reps in current.items() if 4 in reps}
    for tp, reps in plan.items():
        old = current[tp]
        assert 4 not in reps and len(set(reps)) == 2
        i = old.index(4)
        assert [b for j, b in enumerate(reps) if j != i] == [b for j, b in enumerate(old) if j != i]
    after = {**current, **plan}
    load = replica_load(after)
    assert 4 not in load and max(load.values()) - min(load.values()) <= 1


def test_decommission_prefers_the_same_rack_and_fails_when_nowhere_is_free() -> None:
    live: dict[int, str | None] = {1: "a", 2: "b", 3: "a", 4: "b"}
    plan = plan_decommission({("t", 0): [1, 2]}, 2, live)
    assert plan == {("t", 0): [1, 4]}  # 4 shares rack b with 2
    with pytest.raises(InvalidReplicationFactorError, match="cannot move t-0 off broker 2"):
        plan_decommission({("t", 0): [1, 2]}, 2, {1: None, 2: None})
