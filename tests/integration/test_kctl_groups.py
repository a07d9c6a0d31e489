"""``kctl groups list|describe|delete|reset-offsets`` as a real subprocess against real brokers.

Groups are made over raw gRPC, as test_group_protocol.py does: an active member is a
JoinGroup + SyncGroup with a 30 s session (no heartbeats are needed during the test);
an inactive group has only offsets from a standalone commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic, Producer, TopicPartition
from kclient.errors import UnknownMemberIdError
from kclient.proto.kbroker.v1 import broker_pb2_grpc, group_pb2
from tests.integration.test_kctl import fails, kctl, ok, wait_for

pytestmark = pytest.mark.integration

FAST = {"group.initial.rebalance.delay.ms": "100", "group.min.session.timeout.ms": "1000"}
T0 = 1_700_000_000_000
"""The timestamp of each partition's first record; record i is T0 + i seconds."""
HEADER = "GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID".split()


def coordinator(cluster: LocalCluster, group: str) -> broker_pb2_grpc.BrokerStub:
    any_stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.bootstrap.split(",")[0]))
    r = any_stub.FindCoordinator(group_pb2.FindCoordinatorRequest(group_id=group), timeout=10)
    assert r.error_code == 0, r
    return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(f"{r.host}:{r.port}"))


def join_alone(cluster: LocalCluster, group: str, topic: str, partitions: list[int]) -> tuple[str, int]:
    """A member that joins, is its group's leader, takes ``partitions`` and then stays silent.

    Returns (member id, generation).
    """
    stub = coordinator(cluster, group)
    sub = group_pb2.ConsumerSubscription(topics=[topic]).SerializeToString()
    joined = stub.JoinGroup(
        group_pb2.JoinGroupRequest(
            group_id=group,
            session_timeout_ms=30000,
            rebalance_timeout_ms=30000,
            protocol_type="consumer",
            client_id="raw-client",
            protocols=[group_pb2.JoinGroupProtocol(name="range", metadata=sub)],
        ),
        timeout=15,
    )
    assert joined.error_code == 0, joined
    mine = group_pb2.ConsumerAssignment(partitions=[group_pb2.TopicPartitions(topic=topic, partitions=partitions)])
    synced = stub.SyncGroup(
        group_pb2.SyncGroupRequest(
            group_id=group,
            generation_id=joined.generation_id,
            member_id=joined.member_id,
            assignments=[
                group_pb2.SyncGroupAssignment(member_id=joined.member_id, assignment=mine.SerializeToString())
            ],
        ),
        timeout=15,
    )
    assert synced.error_code == 0, synced
    return joined.member_id, joined.generation_id


def commit(
    cluster: LocalCluster, group: str, offsets: dict[tuple[str, int], int], member: str = "", generation: int = -1
) -> None:
    req = group_pb2.CommitOffsetsRequest(group_id=group, generation_id=generation, member_id=member)
    for (topic, p), offset in offsets.items():
        req.topics.add(name=topic).partitions.add(index=p, offset=offset)
    resp = coordinator(cluster, group).CommitOffsets(req, timeout=15)
    assert all(p.error_code == 0 for t in resp.topics for p in t.partitions), resp


def produce(cluster: LocalCluster, topic: str, counts: dict[int, int]) -> None:
    with Producer(bootstrap_servers=cluster.bootstrap) as producer:
        for p, n in counts.items():
            for i in range(n):
                producer.send(topic, f"{p}-{i}".encode(), partition=p, timestamp_ms=T0 + i * 1000)
        producer.flush()


def create_topic(cluster: LocalCluster, topic: str, partitions: int) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])
        wait_for(
            lambda: all(p.leader >= 0 for d in admin.describe_topics([topic]) for p in d.partitions),
            f"leaders of {topic}",
        )


def committed(cluster: LocalCluster, group: str) -> dict[tuple[str, int], int]:
    with AdminClient(cluster.bootstrap) as admin:
        return {(tp.topic, tp.partition): om.offset for tp, om in admin.list_consumer_group_offsets(group).items()}


def rows(out: str) -> list[list[str]]:
    """The table of ``out`` (after the header), each row split on whitespace."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("GROUP "))
    return [line.split() for line in lines[start + 1 :] if line.strip()]


def test_list_describe_delete(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST)
    b = f"--bootstrap-server {cluster.bootstrap}"
    create_topic(cluster, "t", 3)
    produce(cluster, "t", {0: 10, 1: 5})

    member, generation = join_alone(cluster, "active", "t", [0, 1])
    commit(cluster, "active", {("t", 0): 4, ("t", 1): 5}, member, generation)
    commit(cluster, "idle", {("t", 0): 3, ("t", 2): 0})

    assert ok(kctl(b, "groups list")) == "active\nidle\n"
    assert [line.split() for line in ok(kctl(b, "groups list --state")).splitlines()] == [
        ["GROUP", "STATE"],
        ["active", "Stable"],
        ["idle", "Empty"],
    ]

    out = ok(kctl(b, "groups describe --group active"))
    lines = out.splitlines()
    assert lines[0].split() == HEADER, out
    assert lines[0].index("PARTITION") == lines[1].index(" 0 ") + 1  # columns line up
    assert rows(out) == [
        ["active", "t", "0", "4", "10", "6", member, "/127.0.0.1", "raw-client"],
        ["active", "t", "1", "5", "5", "0", member, "/127.0.0.1", "raw-client"],
    ]

    out = ok(kctl(b, "groups describe --group idle"))
    assert out.splitlines()[:3] == ["Consumer group 'idle' has no active members.", "", out.splitlines()[2]]
    assert out.splitlines()[2].split() == HEADER
    assert rows(out) == [
        ["idle", "t", "0", "3", "10", "7", "-", "-", "-"],
        ["idle", "t", "2", "0", "0", "0", "-", "-", "-"],
    ]

    fails(
        kctl(b, "groups describe --group nope"), mentions="GroupIdNotFoundError: Consumer group 'nope' does not exist"
    )

    # An active group: no reset, no delete, nothing changed.
    refused = fails(kctl(b, "groups reset-offsets --group active --all-topics --to-earliest --execute"))
    assert refused == (
        "kctl: Assignments can only be reset if the group 'active' is inactive, but the current state is Stable."
    )
    fails(kctl(b, "groups reset-offsets --group active --topic t --to-latest"), mentions="is inactive")
    fails(kctl(b, "groups delete --group active"), mentions="NonEmptyGroupError")
    assert committed(cluster, "active") == {("t", 0): 4, ("t", 1): 5}
    assert rows(ok(kctl(b, "groups describe --group active")))[0][:6] == ["active", "t", "0", "4", "10", "6"]

    assert ok(kctl(b, "groups delete --group idle")) == (
        "Deletion of requested consumer groups ('idle') was successful.\n"
    )
    assert committed(cluster, "idle") == {}
    assert ok(kctl(b, "groups list")) == "active\n"
    fails(kctl(b, "groups describe --group idle"), mentions="GroupIdNotFoundError")
    fails(kctl(b, "groups delete --group idle"), mentions="GroupIdNotFoundError")

    # Groups live on the brokers only.
    fails(kctl(f"--zookeeper {cluster.zk_connect}", "groups list"), code=2, mentions="groups needs --bootstrap-server")
    fails(kctl("groups describe --group active"), code=2, mentions="groups needs --bootstrap-server")


def test_reset_offsets(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST)
    b = f"--bootstrap-server {cluster.bootstrap}"
    create_topic(cluster, "r", 2)
    create_topic(cluster, "other", 1)
    produce(cluster, "r", {0: 10, 1: 10})
    commit(cluster, "g", {("r", 0): 5, ("r", 1): 6})
    before = {("r", 0): 5, ("r", 1): 6}

    def reset(*flags: str) -> list[list[str]]:
        out = ok(kctl(b, "groups reset-offsets --group g", *flags))
        assert out.splitlines()[0].split() == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], out
        return rows(out)

    # Dry runs (the default, or --dry-run) print the plan and change nothing.
    assert reset("--all-topics --to-earliest") == [["g", "r", "0", "0"], ["g", "r", "1", "0"]]
    assert reset("--topic r:1 --to-latest --dry-run") == [["g", "r", "1", "10"]]
    assert committed(cluster, "g") == before

    assert reset("--topic r --to-earliest --execute") == [["g", "r", "0", "0"], ["g", "r", "1", "0"]]
    assert committed(cluster, "g") == {("r", 0): 0, ("r", 1): 0}

    assert reset("--topic r:1 --to-latest --execute") == [["g", "r", "1", "10"]]
    assert committed(cluster, "g") == {("r", 0): 0, ("r", 1): 10}

    assert reset("--topic r:0,1 --to-offset 7 --execute") == [["g", "r", "0", "7"], ["g", "r", "1", "7"]]
    assert committed(cluster, "g") == {("r", 0): 7, ("r", 1): 7}
    assert reset("--topic r:0 --to-offset 100 --execute") == [["g", "r", "0", "10"]]  # clamped to the log end

    assert reset("--all-topics --shift-by -3 --execute") == [["g", "r", "0", "7"], ["g", "r", "1", "4"]]
    assert committed(cluster, "g") == {("r", 0): 7, ("r", 1): 4}
    assert reset("--all-topics --shift-by -100 --execute") == [["g", "r", "0", "0"], ["g", "r", "1", "0"]]
    assert reset("--topic r:1 --shift-by 4 --execute") == [["g", "r", "1", "4"]]
    assert committed(cluster, "g") == {("r", 0): 0, ("r", 1): 4}

    # Record i carries T0 + i s: the first record at or after T0 + 3.5 s is offset 4.
    at = datetime.fromtimestamp((T0 + 3500) / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    assert reset(f"--topic r --to-datetime {at} --execute") == [["g", "r", "0", "4"], ["g", "r", "1", "4"]]
    local = datetime.fromtimestamp((T0 + 6000) / 1000).strftime("%Y-%m-%dT%H:%M:%S")  # no zone: local time
    assert reset(f"--topic r:0 --to-datetime {local} --execute") == [["g", "r", "0", "6"]]
    later = datetime.fromtimestamp(time.time() + 3600, UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")
    assert reset(f"--topic r:1 --to-datetime {later} --execute") == [["g", "r", "1", "10"]]  # none: the log end
    assert committed(cluster, "g") == {("r", 0): 6, ("r", 1): 10}

    # A topic the group never committed: every partition from one request; a shift needs a commit.
    assert reset("--topic other --to-latest --execute") == [["g", "other", "0", "0"]]
    assert committed(cluster, "g") == {("other", 0): 0, ("r", 0): 6, ("r", 1): 10}
    fails(kctl(b, "groups reset-offsets --group fresh --topic r --shift-by 1"), mentions="no committed offset")

    # The describe of an inactive group reflects the reset.
    out = ok(kctl(b, "groups describe --group g"))
    assert out.startswith("Consumer group 'g' has no active members.\n\n")
    assert rows(out) == [
        ["g", "other", "0", "0", "0", "0", "-", "-", "-"],
        ["g", "r", "0", "6", "10", "4", "-", "-", "-"],
        ["g", "r", "1", "10", "10", "0", "-", "-", "-"],
    ]

    # Bad input changes nothing.
    snapshot = committed(cluster, "g")
    fails(kctl(b, "groups reset-offsets --group g --topic nope --to-earliest --execute"), mentions="nope")
    fails(kctl(b, "groups reset-offsets --group g --topic r:5 --to-earliest --execute"), mentions="no partition 5")
    fails(kctl(b, "groups reset-offsets --group g --topic r:x --to-earliest"), code=2, mentions="--topic")
    fails(kctl(b, "groups reset-offsets --group g --topic r --to-datetime yesterday"), code=2, mentions="--to-datetime")
    fails(kctl(b, "groups reset-offsets --group g --topic r"), code=2)
    fails(kctl(b, "groups reset-offsets --group g --topic r --to-earliest --dry-run --execute"), code=2)
    fails(kctl(b, "groups reset-offsets --group empty --all-topics --to-earliest"), mentions="no committed offsets")
    assert committed(cluster, "g") == snapshot

    # Once a member is active, its offsets are its own.
    join_alone(cluster, "g", "r", [0, 1])
    fails(kctl(b, "groups reset-offsets --group g --all-topics --to-earliest --execute"), mentions="Stable")
    with AdminClient(cluster.bootstrap) as admin:
        with pytest.raises(UnknownMemberIdError):
            admin.alter_consumer_group_offsets("g", {TopicPartition("r", 0): 1})
    assert committed(cluster, "g") == snapshot
