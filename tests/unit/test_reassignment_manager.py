"""Reassignment: the planning algebra and the ReassignmentManager over an
in-memory store (every step, resume after a crash at each step boundary, cancel,
refusals, replication-factor changes)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kazoo.exceptions import BadVersionError, NoNodeError

from kbroker.cluster.reassignment import (
    Moves,
    ReassignmentManager,
    Refusal,
    Step,
    plan_completion,
    plan_update,
    reassign_to,
)
from kbroker.cluster.zkdata import LeaderAndIsr, Reassignment, TopicZNode
from kclient.errors import (
    InvalidReplicaAssignmentError,
    NoReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)


class InMemoryStore:
    """ZooKeeper's reassignment-relevant znodes, with versions and all-or-nothing steps."""

    def __init__(self) -> None:
        self.znodes: dict[str, tuple[TopicZNode, int]] = {}
        self.states: dict[tuple[str, int], LeaderAndIsr] = {}
        self.request: tuple[Reassignment, int] | None = None
        self.pending_deletion: set[str] = set()
        self.commits = 0

    def add_topic(self, topic: str, parts: dict[int, list[int]], isr: dict[int, list[int]] | None = None) -> None:
        self.znodes[topic] = (TopicZNode(parts, topic_id="id"), 0)
        for p, rs in parts.items():
            in_sync = (isr or {}).get(p, rs)
            self.states[(topic, p)] = LeaderAndIsr(in_sync[0], 0, list(in_sync), 1, 0)

    def write_request(self, parts: Reassignment) -> None:
        self.request = (dict(parts), 0 if self.request is None else self.request[1] + 1)

    def join_isr(self, topic: str, p: int, broker: int) -> None:
        """What the leader does when a follower catches up (a CAS of its own)."""
        s = self.states[(topic, p)]
        if broker not in s.isr:
            self.states[(topic, p)] = replace(s, isr=[*s.isr, broker], zk_version=s.zk_version + 1)

    # --- ReassignmentStore -------------------------------------------------------------

    def topics(self) -> list[str]:
        return sorted(self.znodes)

    def topics_pending_deletion(self) -> list[str]:
        return sorted(self.pending_deletion)

    def topic_znode(self, topic: str) -> tuple[TopicZNode, int] | None:
        return self.znodes.get(topic)

    def partition_state(self, topic: str, partition: int) -> LeaderAndIsr | None:
        return self.states.get((topic, partition))

    def reassignment_request(self) -> tuple[Reassignment, int] | None:
        return None if self.request is None else (dict(self.request[0]), self.request[1])

    def set_reassignment_request(self, parts: Reassignment, version: int) -> int:
        if self.request is None:
            raise NoNodeError()
        if self.request[1] != version:
            raise BadVersionError()
        self.request = (dict(parts), version + 1)
        return version + 1

    def delete_reassignment_request(self, version: int) -> None:
        if self.request is None:
            raise NoNodeError()
        if self.request[1] != version:
            raise BadVersionError()
        self.request = None

    def commit_reassignment_step(
        self,
        topic: str,
        znode: TopicZNode,
        topic_version: int,
        states: dict[int, LeaderAndIsr],
        request: tuple[Reassignment | None, int] | None = None,
    ) -> int:
        if self.znodes[topic][1] != topic_version:
            raise BadVersionError()
        for p, s in states.items():
            if self.states[(topic, p)].zk_version != s.zk_version:
                raise BadVersionError()
        if request is not None and (self.request is None or self.request[1] != request[1]):
            raise BadVersionError()
        self.commits += 1
        self.znodes[topic] = (znode, topic_version + 1)
        for p, s in states.items():
            self.states[(topic, p)] = replace(s, zk_version=s.zk_version + 1)
        if request is not None:
            self.request = None if request[0] is None else (dict(request[0]), request[1] + 1)
        return topic_version + 1


def state(leader: int, isr: list[int], epoch: int = 5) -> LeaderAndIsr:
    return LeaderAndIsr(leader, epoch, isr, 1, 7)


# --- algebra ---------------------------------------------------------------------------


def test_reassign_to_puts_the_target_first_and_cancel_restores_the_origin_set() -> None:
    idle = Moves([1, 2, 3])
    moving = reassign_to(idle, [3, 4, 5])
    assert moving == Moves([3, 4, 5, 1, 2], [4, 5], [1, 2])
    assert moving.origin == [3, 1, 2] and moving.target == [3, 4, 5]
    # Replacing an in-flight move plans from the origin, not from the union.
    assert reassign_to(moving, [1, 6]) == Moves([1, 6, 3, 2], [6], [3, 2])
    cancelled = reassign_to(moving, moving.origin)
    assert cancelled == Moves([3, 1, 2]) and not cancelled.reassigning
    assert reassign_to(idle, [2, 1, 3]) == Moves([2, 1, 3])  # a reorder moves nothing


def test_plan_update_bumps_the_epoch_once_and_is_a_no_op_on_resume() -> None:
    step = plan_update(Moves([1, 2, 3]), state(1, [1, 2, 3]), [3, 4, 5], {1, 2, 3, 4, 5}, 9)
    assert isinstance(step, Step) and step.state is not None
    assert step.state == LeaderAndIsr(1, 6, [1, 2, 3], 9, 7)
    assert plan_update(step.moves, step.state, [3, 4, 5], {1, 2, 3, 4, 5}, 9) is None


def test_plan_update_re_elects_when_a_replacement_drops_the_leader_and_refuses_when_nothing_is_in_sync() -> None:
    moving = Moves([4, 5, 1, 2], [4, 5], [1, 2])
    # 4 joined the ISR and leads; replacing the target with [1, 2] drops 4 and 5.
    step = plan_update(moving, state(4, [1, 2, 4]), [1, 2], {1, 2, 4, 5}, 9)
    assert isinstance(step, Step) and step.state is not None
    assert step.moves == Moves([1, 2]) and step.state.leader == 1 and step.state.isr == [1, 2]
    # Only 4 and 5 are in sync: a cancel back to [1, 2] would leave no in-sync replica.
    refused = plan_update(moving, state(4, [4, 5]), [1, 2], {1, 2, 4, 5}, 9)
    assert isinstance(refused, Refusal)


@pytest.mark.parametrize(
    ("moves", "st", "live", "expect"),
    [
        (Moves([3, 4, 5, 1, 2], [4, 5], [1, 2]), state(1, [1, 2, 3, 4]), {1, 2, 3, 4, 5}, None),  # 5 not in sync
        (Moves([3, 4, 5, 1, 2], [4, 5], [1, 2]), state(3, [1, 2, 3, 4, 5]), {1, 2, 3, 4, 5}, (3, [3, 4, 5])),
        (Moves([3, 4, 5, 1, 2], [4, 5], [1, 2]), state(1, [1, 2, 3, 4, 5]), {1, 2, 3, 4, 5}, (3, [3, 4, 5])),
        (Moves([3, 4, 5, 1, 2], [4, 5], [1, 2]), state(1, [1, 2, 3, 4, 5]), {1, 2, 4, 5}, (4, [3, 4, 5])),
        (Moves([3, 4, 5, 1, 2], [4, 5], [1, 2]), state(1, [1, 3, 4, 5]), {1}, None),  # no live target
        (Moves([1, 2, 3], [], [3]), state(3, [1, 2, 3]), {1, 2, 3}, (1, [1, 2])),  # RF 3 -> 2 at once
        (Moves([1, 2, 3], [2, 3], []), state(1, [1, 2]), {1, 2, 3}, None),  # RF 1 -> 3 waits for 3
        (Moves([1, 2, 3], [2, 3], []), state(1, [1, 2, 3]), {1, 2, 3}, (1, [1, 2, 3])),
    ],
)
def test_plan_completion(moves: Moves, st: LeaderAndIsr, live: set[int], expect: tuple[int, list[int]] | None) -> None:
    step = plan_completion(moves, st, live, 9)
    if expect is None:
        assert step is None
        return
    assert step is not None and step.state is not None
    assert (step.state.leader, step.state.isr) == expect
    assert step.moves == Moves(expect[1]) and step.state.leader_epoch == st.leader_epoch + 1


# --- the manager -----------------------------------------------------------------------

LIVE = {1, 2, 3, 4, 5}


def idle(store: InMemoryStore, topic: str, p: int) -> tuple[list[int], LeaderAndIsr]:
    znode = store.znodes[topic][0]
    assert not znode.reassigning(p)
    return znode.partitions[p], store.states[(topic, p)]


def test_a_full_move_through_the_request_znode() -> None:
    store = InMemoryStore()
    store.add_topic("t", {0: [1, 2, 3], 1: [1, 2, 3]})
    store.write_request({("t", 0): [3, 4, 5]})
    m = ReassignmentManager(store, 2)
    assert m.process_request(LIVE) == [("t", 0)]
    znode = store.znodes["t"][0]
    assert znode.partitions[0] == [3, 4, 5, 1, 2] and znode.adding == {0: [4, 5]} and znode.removing == {0: [1, 2]}
    assert store.states[("t", 0)].leader_epoch == 1 and store.request is not None
    assert m.try_complete(LIVE) == []  # 4 and 5 are not in sync yet
    store.join_isr("t", 0, 4)
    assert m.try_complete(LIVE) == []
    store.join_isr("t", 0, 5)
    assert m.try_complete(LIVE) == [("t", 0)]
    replicas, st = idle(store, "t", 0)
    assert replicas == [3, 4, 5] and st.isr == [3, 4, 5] and st.leader == 3 and st.leader_epoch == 2
    assert store.request is None  # the last entry took the znode with it
    assert idle(store, "t", 1)[0] == [1, 2, 3] and m.ongoing() == {}


def _run_to_completion(store: InMemoryStore, crash_at: int) -> None:
    """Drive a move; at step boundary ``crash_at`` replace the manager (a new controller)."""
    managers = iter([ReassignmentManager(store, 2), ReassignmentManager(store, 3)])
    m = next(managers)
    boundary = 0

    def maybe_crash() -> None:
        nonlocal m, boundary
        if boundary == crash_at:
            m = next(managers)
            m.process_request(LIVE)  # what a new controller does first
        boundary += 1

    m.process_request(LIVE)
    maybe_crash()
    store.join_isr("t", 0, 4)
    m.try_complete(LIVE)
    maybe_crash()
    store.join_isr("t", 0, 5)
    maybe_crash()
    m.try_complete(LIVE)
    maybe_crash()
    m.try_complete(LIVE)


@pytest.mark.parametrize("crash_at", [0, 1, 2, 3])
def test_a_new_controller_resumes_at_every_step_boundary_without_re_bumping(crash_at: int) -> None:
    reference = InMemoryStore()
    reference.add_topic("t", {0: [1, 2, 3]})
    reference.write_request({("t", 0): [3, 4, 5]})
    _run_to_completion(reference, crash_at=-1)
    store = InMemoryStore()
    store.add_topic("t", {0: [1, 2, 3]})
    store.write_request({("t", 0): [3, 4, 5]})
    _run_to_completion(store, crash_at)
    assert store.znodes["t"][0] == reference.znodes["t"][0]
    assert store.states[("t", 0)].leader_epoch == reference.states[("t", 0)].leader_epoch == 2
    assert store.states[("t", 0)].isr == [3, 4, 5] and store.request is None and store.commits == 2


def test_cancel_through_the_znode_and_through_the_api_restores_the_original_set() -> None:
    for via_api in (False, True):
        store = InMemoryStore()
        store.add_topic("t", {0: [1, 2]})
        m = ReassignmentManager(store, 2)
        assert m.alter({("t", 0): [2, 3]}, LIVE) == {("t", 0): None}
        assert store.znodes["t"][0].adding == {0: [3]}
        store.join_isr("t", 0, 3)  # even an in-sync adding replica is dropped by a cancel
        if via_api:
            assert m.alter({("t", 0): None}, LIVE) == {("t", 0): None}
        else:
            store.write_request({("t", 0): [1, 2]})
            m.process_request(LIVE)
        replicas, st = idle(store, "t", 0)
        assert set(replicas) == {1, 2} and st.isr == [1, 2] and st.leader == 1
        assert store.request is None and m.ongoing() == {}
        assert isinstance(m.alter({("t", 0): None}, LIVE)[("t", 0)], NoReassignmentInProgressError)


def test_a_down_target_broker_makes_the_znode_move_wait_and_the_api_refuse() -> None:
    store = InMemoryStore()
    store.add_topic("t", {0: [1, 2]})
    store.write_request({("t", 0): [2, 3]})
    m = ReassignmentManager(store, 2)
    live = {1, 2}
    assert m.process_request(live) == [("t", 0)]
    assert m.try_complete(live) == [] and store.request is not None
    assert isinstance(m.alter({("t", 1): [2, 3]}, live)[("t", 1)], UnknownTopicOrPartitionError)
    store.add_topic("u", {0: [1]})
    assert isinstance(m.alter({("u", 0): [3]}, live)[("u", 0)], InvalidReplicaAssignmentError)
    live.add(3)  # broker 3 starts, catches up
    store.join_isr("t", 0, 3)
    assert m.try_complete(live) == [("t", 0)]
    assert idle(store, "t", 0)[0] == [2, 3] and store.request is None


def test_the_api_replaces_the_znode_entry_in_the_same_step() -> None:
    store = InMemoryStore()
    store.add_topic("t", {0: [1, 2], 1: [1, 2]})
    store.write_request({("t", 0): [2, 3], ("t", 1): [2, 3]})
    m = ReassignmentManager(store, 2)
    m.process_request(LIVE)
    assert m.alter({("t", 0): [1, 4]}, LIVE) == {("t", 0): None}
    assert store.request is not None and store.request[0] == {("t", 1): [2, 3]}
    assert store.znodes["t"][0].adding == {0: [4], 1: [3]}


def test_invalid_entries_are_dropped_and_the_znode_deleted_when_empty(caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryStore()
    store.add_topic("t", {0: [1, 2]})
    store.write_request({("t", 0): [1, 1], ("t", 5): [1], ("nope", 0): [1]})
    m = ReassignmentManager(store, 2)
    assert m.process_request(LIVE) == []
    assert store.request is None and "dropped" in caplog.text
    store.write_request({("t", 0): [1, 2], ("t", 1): [-1]})  # nothing to do + negative id
    assert m.process_request(LIVE) == [] and store.request is None and store.commits == 0


def test_bad_version_propagates_and_a_retry_converges() -> None:
    store = InMemoryStore()
    store.add_topic("t", {0: [1, 2]})
    store.write_request({("t", 0): [2, 3]})
    m = ReassignmentManager(store, 2)
    m.process_request(LIVE)
    store.join_isr("t", 0, 3)
    real = store.commit_reassignment_step
    calls = {"n": 0}

    def racing(*args: object, **kwargs: object) -> int:
        if calls["n"] == 0:
            calls["n"] += 1
            store.join_isr("t", 0, 99)  # the leader's CAS lands first
            raise BadVersionError()
        return real(*args, **kwargs)  # type: ignore[arg-type]

    store.commit_reassignment_step = racing  # type: ignore[method-assign]
    with pytest.raises(BadVersionError):
        m.try_complete(LIVE)
    assert m.try_complete(LIVE) == [("t", 0)]  # the controller's retry re-reads
    assert idle(store, "t", 0)[0] == [2, 3]


def test_a_deleted_topic_loses_its_entries_and_unknown_topics_are_dropped() -> None:
    store = InMemoryStore()
    store.add_topic("t", {0: [1, 2]})
    store.add_topic("u", {0: [1, 2]})
    store.write_request({("t", 0): [2, 3], ("u", 0): [2, 3]})
    m = ReassignmentManager(store, 2)
    m.drop_topic("t")
    assert store.request is not None and list(store.request[0]) == [("u", 0)]
    store.pending_deletion.add("u")
    assert isinstance(m.alter({("u", 0): [1]}, LIVE)[("u", 0)], UnknownTopicOrPartitionError)
    m.process_request(LIVE)
    assert store.request is None


def test_replication_factor_up_and_down() -> None:
    store = InMemoryStore()
    store.add_topic("t", {0: [1]})
    m = ReassignmentManager(store, 2)
    m.alter({("t", 0): [1, 2, 3]}, LIVE)
    assert store.znodes["t"][0].adding == {0: [2, 3]} and m.try_complete(LIVE) == []
    store.join_isr("t", 0, 2)
    store.join_isr("t", 0, 3)
    assert m.try_complete(LIVE) == [("t", 0)]
    assert idle(store, "t", 0)[0] == [1, 2, 3]
    # 3 -> 2 completes in the same event: the target is in sync already.
    m.alter({("t", 0): [2, 3]}, LIVE)
    assert m.try_complete(LIVE) == [("t", 0)]
    replicas, st = idle(store, "t", 0)
    assert replicas == [2, 3] and st.isr == [2, 3] and st.leader == 2


def test_a_partition_without_state_gets_the_topic_znode_only() -> None:
    store = InMemoryStore()
    store.add_topic("t", {0: [1, 2]})
    del store.states[("t", 0)]
    m = ReassignmentManager(store, 2)
    assert m.alter({("t", 0): [2, 3]}, LIVE) == {("t", 0): None}
    assert store.znodes["t"][0].adding == {0: [3]} and ("t", 0) not in store.states
    assert m.try_complete(LIVE) == []
