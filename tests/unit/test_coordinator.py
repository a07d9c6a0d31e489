"""ConsumerCoordinator against a scripted fake transport: join/sync, errors, commits, heartbeats."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from kclient.assignors import (
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from kclient.consumer import Consumer, ConsumerCoordinator, ConsumerRebalanceListener, MemberState, SubscriptionState
from kclient.errors import (
    CommitFailedError,
    IllegalStateError,
    InconsistentGroupProtocolError,
    InvalidConfigError,
    KafkaConnectionError,
)
from kclient.proto.kbroker.v1 import group_pb2
from kclient.structs import OffsetAndMetadata, TopicPartition
from tests.support import FakeMetadata, FakeTransport

TP = TopicPartition
COORD = "coord:1"
OTHER = "other:2"

Handler = Callable[[Any], Any]


def find_coordinator(address: str) -> group_pb2.FindCoordinatorResponse:
    host, port = address.split(":")
    return group_pb2.FindCoordinatorResponse(node_id=1, host=host, port=int(port))


class FakeFetcher:
    def __init__(self) -> None:
        self.cleared = 0

    def clear(self, tps: Any = None) -> None:
        self.cleared += 1


class Recorder(ConsumerRebalanceListener):
    def __init__(self, log: list[tuple[str, set[TopicPartition]]]) -> None:
        self.log = log

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.log.append(("revoked", revoked))

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.log.append(("assigned", assigned))


CONFIG: dict[str, Any] = {
    "group_id": "g",
    "client_id": "test",
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "max_poll_interval_ms": 30000,
    "enable_auto_commit": True,
    "auto_commit_interval_ms": 5000,
    "retry_backoff_ms": 1,
    "metadata_max_age_ms": 300000,
    "partition_assignment_strategy": ("range",),
}


def make(
    counts: dict[str, int] | None = None, heartbeat_thread: bool = True, **overrides: Any
) -> tuple[ConsumerCoordinator, FakeTransport, SubscriptionState, FakeMetadata]:
    transport = FakeTransport(
        {
            "FindCoordinator": find_coordinator(COORD),
            "Heartbeat": group_pb2.HeartbeatResponse(),
            "LeaveGroup": group_pb2.LeaveGroupResponse(),
        },
        request_timeout_s=2.0,
    )
    metadata = FakeMetadata(counts if counts is not None else {"t": 4}, addresses=[COORD])
    subs = SubscriptionState("earliest")
    coord = ConsumerCoordinator(
        transport,  # type: ignore[arg-type]
        metadata,  # type: ignore[arg-type]
        subs,
        FakeFetcher(),  # type: ignore[arg-type]
        {**CONFIG, **overrides},
    )
    if not heartbeat_thread:  # the test drives heartbeat turns itself
        setattr(coord, "_start_heartbeat_thread", lambda: None)  # noqa: B010
    return coord, transport, subs, metadata


def join_response(
    member: str, generation: int, leader: str, members: dict[str, Subscription] | None = None, protocol: str = "range"
) -> group_pb2.JoinGroupResponse:
    resp = group_pb2.JoinGroupResponse(
        generation_id=generation, protocol_name=protocol, leader_id=leader, member_id=member
    )
    for mid, sub in (members or {}).items():
        resp.members.add(member_id=mid, metadata=encode_subscription(sub))
    return resp


def sync_response(*tps: TopicPartition) -> group_pb2.SyncGroupResponse:
    return group_pb2.SyncGroupResponse(assignment=encode_assignment(tps))


def commit_ok(req: group_pb2.CommitOffsetsRequest) -> group_pb2.CommitOffsetsResponse:
    resp = group_pb2.CommitOffsetsResponse()
    for t in req.topics:
        tr = resp.topics.add(name=t.name)
        for p in t.partitions:
            tr.partitions.add(index=p.index)
    return resp


def commit_error(code: int) -> Handler:
    def handler(req: group_pb2.CommitOffsetsRequest) -> group_pb2.CommitOffsetsResponse:
        resp = commit_ok(req)
        for t in resp.topics:
            for p in t.partitions:
                p.error_code = code  # type: ignore[assignment]
                p.error_message = "refused"
        return resp

    return handler


def joined(coord: ConsumerCoordinator, transport: FakeTransport, subs: SubscriptionState, *tps: TopicPartition) -> None:
    """Drive a follower join of generation 1 with the given assignment."""
    subs.subscribe(["t"], None)
    transport.on("JoinGroup", join_response("m1", 1, "leader"))
    transport.on("SyncGroup", sync_response(*tps))
    assert coord.ensure_active_group(time.monotonic() + 5)


def test_leader_joins_assigns_and_syncs() -> None:
    coord, transport, subs, _ = make({"t": 4})
    events: list[tuple[str, set[TopicPartition]]] = []
    subs.subscribe(["t"], Recorder(events))
    members = {"m1": Subscription(["t"]), "m2": Subscription(["t"])}
    transport.on("JoinGroup", join_response("m1", 1, "m1", members))
    transport.on("SyncGroup", sync_response(TP("t", 0), TP("t", 1)))
    assert coord.ensure_active_group(time.monotonic() + 5)

    join = transport.requests("JoinGroup")[0]
    assert join.member_id == "" and join.protocol_type == "consumer"
    assert join.rebalance_timeout_ms == 30000 and join.session_timeout_ms == 6000
    assert [p.name for p in join.protocols] == ["range"]
    assert decode_subscription(join.protocols[0].metadata).topics == ["t"]
    sync = transport.requests("SyncGroup")[0]
    sent = {a.member_id: decode_assignment(a.assignment) for a in sync.assignments}
    assert sent == {"m1": [TP("t", 0), TP("t", 1)], "m2": [TP("t", 2), TP("t", 3)]}
    assert (sync.generation_id, sync.member_id) == (1, "m1")
    assert set(subs.partitions) == {TP("t", 0), TP("t", 1)}
    assert (coord.member_id, coord.generation, coord.state) == ("m1", 1, MemberState.STABLE)
    assert events == [("assigned", {TP("t", 0), TP("t", 1)})]
    assert not coord.need_rejoin()
    coord.close(autocommit=False)


def test_follower_sends_no_assignment() -> None:
    coord, transport, subs, _ = make()
    joined(coord, transport, subs, TP("t", 3))
    assert list(transport.requests("SyncGroup")[0].assignments) == []
    assert set(subs.partitions) == {TP("t", 3)}
    coord.close(autocommit=False)


def test_join_retries_unknown_member_and_moved_coordinator() -> None:
    coord, transport, subs, _ = make()
    subs.subscribe(["t"], None)
    with coord._lock:
        coord.member_id = "stale"
    transport.on(
        "JoinGroup",
        group_pb2.JoinGroupResponse(error_code=25, error_message="unknown"),  # type: ignore[arg-type]
        group_pb2.JoinGroupResponse(error_code=16, error_message="not me"),  # type: ignore[arg-type]
        join_response("m9", 4, "x"),
    )
    transport.on("SyncGroup", sync_response())
    assert coord.ensure_active_group(time.monotonic() + 5)
    joins = transport.requests("JoinGroup")
    assert [j.member_id for j in joins] == ["stale", "", ""]
    assert transport.methods().count("FindCoordinator") == 2
    assert coord.member_id == "m9"
    coord.close(autocommit=False)


def test_fatal_join_error_raises() -> None:
    coord, transport, subs, _ = make()
    subs.subscribe(["t"], None)
    transport.on("JoinGroup", group_pb2.JoinGroupResponse(error_code=23, error_message="no common assignor"))  # type: ignore[arg-type]
    with pytest.raises(InconsistentGroupProtocolError):
        coord.ensure_active_group(time.monotonic() + 5)


def test_rejoin_commits_then_revokes_and_reports_owned_partitions() -> None:
    coord, transport, subs, _ = make(partition_assignment_strategy=("sticky", "range"))
    events: list[tuple[str, set[TopicPartition]]] = []
    subs.subscribe(["t"], Recorder(events))
    transport.on("JoinGroup", join_response("m1", 1, "leader", protocol="sticky"))
    transport.on("SyncGroup", sync_response(TP("t", 0), TP("t", 1)))
    transport.on("CommitOffsets", commit_ok)
    coord.ensure_active_group(time.monotonic() + 5)
    subs.partitions[TP("t", 0)].position = 17  # records up to 16 were returned by poll
    coord.request_rejoin("test")
    transport.on("JoinGroup", join_response("m1", 2, "leader", protocol="sticky"))
    transport.on("SyncGroup", sync_response(TP("t", 1)))
    coord.ensure_active_group(time.monotonic() + 5)

    commit = transport.requests("CommitOffsets")[0]
    assert (commit.generation_id, commit.member_id) == (1, "m1")
    assert [(t.name, p.index, p.offset) for t in commit.topics for p in t.partitions] == [("t", 0, 17)]
    order = [m for m in transport.methods() if m in ("CommitOffsets", "JoinGroup")]
    assert order == ["JoinGroup", "CommitOffsets", "JoinGroup"]
    assert events == [
        ("assigned", {TP("t", 0), TP("t", 1)}),
        ("revoked", {TP("t", 0), TP("t", 1)}),
        ("assigned", {TP("t", 1)}),
    ]
    second = transport.requests("JoinGroup")[1]
    assert [p.name for p in second.protocols] == ["sticky", "range"]
    sub = decode_subscription(second.protocols[0].metadata)
    assert (sub.owned_partitions, sub.generation_id) == ([TP("t", 0), TP("t", 1)], 1)
    coord.close(autocommit=False)


@pytest.mark.parametrize("code", [22, 25, 27])
def test_commit_fenced_raises_commit_failed(code: int) -> None:
    coord, transport, subs, _ = make()
    joined(coord, transport, subs, TP("t", 0))
    transport.on("CommitOffsets", commit_error(code))
    with pytest.raises(CommitFailedError, match="generation 1 of this member is over"):
        coord.offsets.commit_sync({TP("t", 0): OffsetAndMetadata(5)})
    assert coord.need_rejoin()
    if code == 25:
        assert (coord.member_id, coord.generation) == ("", -1)
    if code == 22:
        assert (coord.member_id, coord.generation) == ("m1", -1)
    # Out of the generation: refused locally, without asking the broker.
    if code != 27:
        with pytest.raises(CommitFailedError, match="not part of an active generation"):
            coord.offsets.commit_sync({TP("t", 0): OffsetAndMetadata(5)})
    coord.close(autocommit=False)


def test_commit_follows_a_moved_coordinator() -> None:
    coord, transport, subs, _ = make()
    joined(coord, transport, subs, TP("t", 0))
    transport.on("CommitOffsets", KafkaConnectionError("gone"), commit_error(16), commit_ok)
    transport.on("FindCoordinator", find_coordinator(OTHER))
    coord.offsets.commit_sync({TP("t", 0): OffsetAndMetadata(5, "meta")})
    commits = [(a, r) for a, m, r in transport.calls if m == "CommitOffsets"]
    assert [a for a, _ in commits] == [COORD, OTHER, OTHER]
    assert commits[-1][1].topics[0].partitions[0].metadata == "meta"
    coord.close(autocommit=False)


def test_standalone_commit_for_assigned_partitions() -> None:
    coord, transport, subs, _ = make()
    subs.assign_from_user([TP("t", 2)])
    transport.on("CommitOffsets", commit_ok)
    coord.offsets.commit_sync({TP("t", 2): OffsetAndMetadata(9)})
    req = transport.requests("CommitOffsets")[0]
    assert (req.generation_id, req.member_id) == (-1, "")
    transport.on("CommitOffsets", commit_error(25))
    with pytest.raises(CommitFailedError, match="only while the group has no active members"):
        coord.offsets.commit_sync({TP("t", 2): OffsetAndMetadata(9)})


def test_commit_async_callback_runs_on_next_poll() -> None:
    coord, transport, subs, _ = make()
    joined(coord, transport, subs, TP("t", 0))
    got: list[tuple[dict[TopicPartition, OffsetAndMetadata], Exception | None]] = []
    transport.on("CommitOffsets", commit_ok)
    coord.offsets.commit_async({TP("t", 0): OffsetAndMetadata(3)}, lambda o, e: got.append((o, e)))
    assert got == [], "callbacks run on the application thread, from the next poll/commit/close"
    transport.on("CommitOffsets", commit_error(22))
    coord.offsets.commit_async({TP("t", 0): OffsetAndMetadata(4)}, lambda o, e: got.append((o, e)))
    assert got == [({TP("t", 0): OffsetAndMetadata(3)}, None)]
    coord.poll(time.monotonic())
    assert len(got) == 2 and isinstance(got[1][1], CommitFailedError)
    assert len(transport.requests("JoinGroup")) == 2, "ILLEGAL_GENERATION on a commit: poll() rejoined"
    coord.close(autocommit=False)


def test_auto_commit_only_changed_positions() -> None:
    coord, transport, subs, _ = make(auto_commit_interval_ms=1)
    joined(coord, transport, subs, TP("t", 0), TP("t", 1))
    transport.on("CommitOffsets", commit_ok)
    subs.partitions[TP("t", 0)].position = 10
    coord.offsets.maybe_auto_commit(time.monotonic() + 1)
    coord.offsets.maybe_auto_commit(time.monotonic() + 2)  # nothing new: no request
    subs.partitions[TP("t", 1)].position = 3
    coord.offsets.maybe_auto_commit(time.monotonic() + 3)
    sent = [[(p.index, p.offset) for t in r.topics for p in t.partitions] for r in transport.requests("CommitOffsets")]
    assert sent == [[(0, 10)], [(1, 3)]]
    coord.close(autocommit=False)


def test_fetch_committed_maps_minus_one_to_none() -> None:
    coord, transport, _, _ = make()
    resp = group_pb2.FetchOffsetsResponse()
    t = resp.topics.add(name="t")
    t.partitions.add(index=0, offset=42, metadata="m")
    t.partitions.add(index=1, offset=-1)
    transport.on("FetchOffsets", resp)
    got = coord.offsets.fetch_committed([TP("t", 1), TP("t", 0)])
    assert got == {TP("t", 0): OffsetAndMetadata(42, "m"), TP("t", 1): None}


def heartbeat_turn(coord: ConsumerCoordinator) -> None:
    with coord._lock:
        coord._next_heartbeat = 0.0
    assert coord._heartbeat_once()


@pytest.mark.parametrize(
    ("code", "member", "generation", "state"),
    [
        (0, "m1", 1, MemberState.STABLE),
        (27, "m1", 1, MemberState.STABLE),
        (22, "m1", -1, MemberState.UNJOINED),
        (25, "", -1, MemberState.UNJOINED),
    ],
)
def test_heartbeat_outcomes(code: int, member: str, generation: int, state: MemberState) -> None:
    coord, transport, subs, _ = make(heartbeat_thread=False)
    joined(coord, transport, subs, TP("t", 0))
    transport.on("Heartbeat", group_pb2.HeartbeatResponse(error_code=code))  # type: ignore[arg-type]
    heartbeat_turn(coord)
    req = transport.requests("Heartbeat")[-1]
    assert (req.member_id, req.generation_id) == ("m1", 1)
    assert (coord.member_id, coord.generation, coord.state) == (member, generation, state)
    assert coord.need_rejoin() == (code != 0)


def test_heartbeat_leaves_group_when_poll_is_late() -> None:
    coord, transport, subs, _ = make(heartbeat_thread=False, max_poll_interval_ms=50)
    joined(coord, transport, subs, TP("t", 0))
    with coord._lock:
        coord._last_poll = time.monotonic() - 1.0
    transport.on("LeaveGroup", group_pb2.LeaveGroupResponse())
    heartbeat_turn(coord)
    assert [r.member_id for r in transport.requests("LeaveGroup")] == ["m1"]
    assert (coord.member_id, coord.generation, coord.state) == ("", -1, MemberState.UNJOINED)
    assert coord.need_rejoin()


def test_metadata_change_triggers_rejoin() -> None:
    coord, transport, subs, metadata = make({"t": 4})
    joined(coord, transport, subs, TP("t", 0))
    coord._check_metadata(time.monotonic())
    assert not coord.need_rejoin()
    metadata.counts["t"] = 6
    coord._check_metadata(time.monotonic())
    assert coord.need_rejoin()
    coord.close(autocommit=False)


def test_subscribed_topic_created_later_triggers_rejoin() -> None:
    coord, transport, subs, metadata = make({})
    joined(coord, transport, subs)
    before = metadata.refreshes
    coord._check_metadata(time.monotonic())
    assert metadata.refreshes == before + 1, "a missing subscribed topic is looked for often"
    assert not coord.need_rejoin()
    metadata.counts["t"] = 2
    coord._check_metadata(time.monotonic() + 1.5)
    assert coord.need_rejoin()
    coord.close(autocommit=False)


def test_pattern_subscription_resolves_and_follows_new_topics() -> None:
    coord, transport, subs, metadata = make({"orders-eu": 2, "orders-us": 1, "other": 3})
    subs.subscribe_pattern(re.compile(r"orders-.*"), None)
    transport.on("JoinGroup", join_response("m1", 1, "m1", {"m1": Subscription(["orders-eu", "orders-us"])}))
    transport.on("SyncGroup", sync_response(TP("orders-eu", 0), TP("orders-eu", 1), TP("orders-us", 0)))
    coord.ensure_active_group(time.monotonic() + 5)
    join = transport.requests("JoinGroup")[0]
    assert decode_subscription(join.protocols[0].metadata).topics == ["orders-eu", "orders-us"]
    coord._check_metadata(time.monotonic())
    assert not coord.need_rejoin()
    metadata.counts["orders-asia"] = 2
    coord._check_metadata(time.monotonic())
    assert coord.need_rejoin()
    assert subs.subscription == {"orders-eu", "orders-us", "orders-asia"}
    coord.close(autocommit=False)


def test_close_commits_revokes_and_leaves() -> None:
    coord, transport, subs, _ = make()
    events: list[tuple[str, set[TopicPartition]]] = []
    joined(coord, transport, subs, TP("t", 0))
    subs.listener = Recorder(events)
    subs.partitions[TP("t", 0)].position = 8
    transport.on("CommitOffsets", commit_ok)
    transport.on("LeaveGroup", group_pb2.LeaveGroupResponse())
    coord.close()
    assert transport.methods()[-2:] == ["CommitOffsets", "LeaveGroup"]
    assert events == [("revoked", {TP("t", 0)})]
    assert coord._heartbeat_thread is not None and not coord._heartbeat_thread.is_alive()


def test_bad_settings_rejected() -> None:
    with pytest.raises(InvalidConfigError, match="heartbeat_interval_ms"):
        make(heartbeat_interval_ms=6000)
    with pytest.raises(InvalidConfigError, match="unknown partition assignment strategy"):
        make(partition_assignment_strategy=["fancy"])


def test_consumer_api_guards() -> None:
    with Consumer(bootstrap_servers="127.0.0.1:1") as c:
        with pytest.raises(IllegalStateError, match="needs a group_id"):
            c.subscribe(["t"])
        with pytest.raises(IllegalStateError, match="needs a group_id"):
            c.commit()
    with Consumer(bootstrap_servers="127.0.0.1:1", group_id="g") as c:
        c.subscribe(["t"])
        assert c.subscription() == {"t"}
        with pytest.raises(IllegalStateError, match="mutually exclusive"):
            c.assign([TP("t", 0)])
        with pytest.raises(IllegalStateError, match="not both"):
            c.subscribe(["t"], pattern="x.*")
        c._subs.unsubscribe()  # no broker here: skip the LeaveGroup of unsubscribe()
        c._subs.assign_from_user([TP("t", 0)])
        with pytest.raises(IllegalStateError, match="mutually exclusive"):
            c.subscribe(["t"])
        c.close(autocommit=False)
