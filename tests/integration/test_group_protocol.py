"""The group protocol over raw gRPC, as a client in another language would speak it."""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
import pytest
from kazoo.client import KazooClient

from kbroker.cluster import zkdata
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from kclient.proto.kbroker.v1 import broker_pb2_grpc, group_pb2

pytestmark = pytest.mark.integration

FAST = {"group.initial.rebalance.delay.ms": "100", "group.min.session.timeout.ms": "1000"}


def coordinator(cluster: LocalCluster, group: str) -> broker_pb2_grpc.BrokerStub:
    any_stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.bootstrap.split(",")[0]))
    r = any_stub.FindCoordinator(group_pb2.FindCoordinatorRequest(group_id=group), timeout=10)
    assert r.error_code == 0, r
    return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(f"{r.host}:{r.port}"))


def join(stub: broker_pb2_grpc.BrokerStub, group: str, member_id: str = "", topics: tuple[str, ...] = ("t",)):
    sub = group_pb2.ConsumerSubscription(topics=list(topics)).SerializeToString()
    return stub.JoinGroup(
        group_pb2.JoinGroupRequest(
            group_id=group,
            session_timeout_ms=3000,
            rebalance_timeout_ms=5000,
            member_id=member_id,
            protocol_type="consumer",
            client_id="raw",
            protocols=[group_pb2.JoinGroupProtocol(name="range", metadata=sub)],
        ),
        timeout=15,
    )


def assignment(partitions: list[int]) -> bytes:
    return group_pb2.ConsumerAssignment(
        partitions=[group_pb2.TopicPartitions(topic="t", partitions=partitions)]
    ).SerializeToString()


def test_join_sync_heartbeat_commit_leave(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("t", 2, 1)])
    stub = coordinator(cluster, "g")
    results: dict[str, group_pb2.JoinGroupResponse] = {}

    def member(name: str) -> None:
        results[name] = join(stub, "g")

    threads = [threading.Thread(target=member, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a, b = results["a"], results["b"]
    assert a.error_code == b.error_code == 0
    assert a.generation_id == b.generation_id >= 1 and a.leader_id == b.leader_id
    leader, follower = (a, b) if a.member_id == a.leader_id else (b, a)
    assert {m.member_id for m in leader.members} == {a.member_id, b.member_id} and not follower.members

    got: dict[str, bytes] = {}

    def sync(resp: group_pb2.JoinGroupResponse, assignments: list[group_pb2.SyncGroupAssignment]) -> None:
        r = stub.SyncGroup(
            group_pb2.SyncGroupRequest(
                group_id="g", generation_id=resp.generation_id, member_id=resp.member_id, assignments=assignments
            ),
            timeout=15,
        )
        assert r.error_code == 0, r
        got[resp.member_id] = r.assignment

    t = threading.Thread(target=sync, args=(follower, []))
    t.start()
    sync(
        leader,
        [
            group_pb2.SyncGroupAssignment(member_id=leader.member_id, assignment=assignment([0])),
            group_pb2.SyncGroupAssignment(member_id=follower.member_id, assignment=assignment([1])),
        ],
    )
    t.join()
    assert got[follower.member_id] == assignment([1])
    gen = leader.generation_id
    hb = stub.Heartbeat(group_pb2.HeartbeatRequest(group_id="g", generation_id=gen, member_id=leader.member_id))
    assert hb.error_code == 0

    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start()
    try:
        owners = {p: zk.get(zkdata.group_owner_path("g", "t", p))[0].decode() for p in (0, 1)}
        assert owners == {0: leader.member_id, 1: follower.member_id}
        assert sorted(zk.get_children("/consumers/g/ids")) == sorted([a.member_id, b.member_id])

        commit = group_pb2.CommitOffsetsRequest(group_id="g", generation_id=gen, member_id=leader.member_id)
        commit.topics.add(name="t").partitions.add(index=0, offset=42, metadata="m")
        assert stub.CommitOffsets(commit).topics[0].partitions[0].error_code == 0
        assert zk.get(zkdata.group_offset_path("g", "t", 0))[0] == b"42\nm"

        stale = group_pb2.CommitOffsetsRequest(group_id="g", generation_id=gen - 1, member_id=leader.member_id)
        stale.topics.add(name="t").partitions.add(index=0, offset=99)
        assert stub.CommitOffsets(stale).topics[0].partitions[0].error_code == 22  # ILLEGAL_GENERATION
        assert zk.get(zkdata.group_offset_path("g", "t", 0))[0] == b"42\nm"

        standalone = group_pb2.CommitOffsetsRequest(group_id="g", generation_id=-1)
        standalone.topics.add(name="t").partitions.add(index=1, offset=5)
        assert stub.CommitOffsets(standalone).topics[0].partitions[0].error_code == 25  # group is active

        fetched = stub.FetchOffsets(group_pb2.FetchOffsetsRequest(group_id="g"))
        assert [(t.name, p.index, p.offset, p.metadata) for t in fetched.topics for p in t.partitions] == [
            ("t", 0, 42, "m")
        ]
        d = stub.DescribeGroups(group_pb2.DescribeGroupsRequest(group_ids=["g"])).groups[0]
        assert d.state == "Stable" and d.generation_id == gen and len(d.members) == 2

        # A leave makes the rest rebalance: the survivor hears it in its heartbeat.
        assert stub.LeaveGroup(group_pb2.LeaveGroupRequest(group_id="g", member_id=follower.member_id)).error_code == 0
        hb = stub.Heartbeat(group_pb2.HeartbeatRequest(group_id="g", generation_id=gen, member_id=leader.member_id))
        assert hb.error_code in (27, 22)  # REBALANCE_IN_PROGRESS (or already a new generation)
        again = join(stub, "g", leader.member_id)
        assert again.error_code == 0 and again.generation_id > gen and len(again.members) == 1
        assert stub.LeaveGroup(group_pb2.LeaveGroupRequest(group_id="g", member_id=leader.member_id)).error_code == 0
        assert zk.get_children("/consumers/g/ids") == []
        deleted = stub.DeleteGroups(group_pb2.DeleteGroupsRequest(group_ids=["g"])).results[0]
        assert deleted.error_code == 0 and zk.exists("/consumers/g") is None
    finally:
        zk.stop()


def test_silent_member_is_expired(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("t", 1, 1)])
    stub = coordinator(cluster, "quiet")
    r = join(stub, "quiet")
    assert r.error_code == 0
    import time

    time.sleep(4.5)  # session timeout 3 s, no heartbeats
    hb = stub.Heartbeat(
        group_pb2.HeartbeatRequest(group_id="quiet", generation_id=r.generation_id, member_id=r.member_id)
    )
    assert hb.error_code == 25  # UNKNOWN_MEMBER_ID


def test_errors_for_bad_group_requests(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST)
    stub = coordinator(cluster, "g2")
    bad = stub.JoinGroup(
        group_pb2.JoinGroupRequest(
            group_id="g2",
            session_timeout_ms=10,
            protocol_type="consumer",
            protocols=[group_pb2.JoinGroupProtocol(name="range")],
        ),
        timeout=10,
    )
    assert bad.error_code == 26  # INVALID_SESSION_TIMEOUT
    assert stub.FindCoordinator(group_pb2.FindCoordinatorRequest(group_id="")).error_code == 24  # INVALID_GROUP_ID
    hb = stub.Heartbeat(group_pb2.HeartbeatRequest(group_id="nobody", generation_id=1, member_id="x"))
    assert hb.error_code == 25  # UNKNOWN_MEMBER_ID (a coordinator that never saw the member)
