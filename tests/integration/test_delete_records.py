"""DeleteRecords (kctl delete-records, AdminClient.delete_records) and OffsetDelete
(kctl groups delete-offsets) against real brokers, and TopicId over --bootstrap-server."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.errors import OffsetOutOfRangeError
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2
from tests.integration.test_kctl import kctl, ok, wait_for
from tests.integration.test_kctl_groups import FAST, commit, join_alone

pytestmark = pytest.mark.integration

TP0 = TopicPartition("dr", 0)


def stub(address: str) -> broker_pb2_grpc.BrokerStub:
    return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(address))


def leader_of(bootstrap: str, tp: TopicPartition, *, full_isr: bool = True) -> int:
    """The partition's leader (-1 for none, or while the ISR is not full with ``full_isr``)."""
    with AdminClient(bootstrap) as admin:
        p = admin.describe_topics([tp.topic])[0].partitions[tp.partition]
        return p.leader if len(p.isr) == len(p.replicas) or not full_isr else -1


def raw_fetch_error(address: str, tp: TopicPartition, offset: int) -> int:
    req = log_pb2.FetchRequest(max_wait_ms=0)
    req.topics.add(name=tp.topic).partitions.add(index=tp.partition, fetch_offset=offset)
    return int(stub(address).Fetch(req, timeout=10).topics[0].partitions[0].error_code)


def first_offset_read(bootstrap: str, tp: TopicPartition) -> int:
    """A consumer positioned at 0 (below the log start) resets by auto_offset_reset=earliest."""
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        c.seek(tp, 0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            records = c.poll(timeout_ms=1000).get(tp)
            if records:
                return records[0].offset
    raise AssertionError(f"nothing read from {tp}")


def log_start_on(cluster: LocalCluster, broker: int, tp: TopicPartition) -> int:
    with AdminClient(cluster.bootstrap) as admin:
        resp = admin.describe_log_dirs([broker], [tp.topic])[broker]
    return next(
        p.log_start_offset
        for d in resp.results
        for t in d.topics
        for p in t.partitions
        if t.name == tp.topic and p.partition_index == tp.partition
    )


def offsets_file(tmp_path: Path, *entries: tuple[str, int, int]) -> Path:
    f = tmp_path / "offsets.json"
    doc = {"partitions": [{"topic": t, "partition": p, "offset": o} for t, p, o in entries], "version": 1}
    f.write_text(json.dumps(doc))
    return f


def test_deleted_records_stay_gone_on_leader_and_follower_after_a_leader_move_and_crashes(
    cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = cluster_factory(2, **{"auto.leader.rebalance.enable": "false", "replica.fetch.wait.max.ms": "200"})
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("dr", 1, 2, topic_configs={"segment.bytes": "1024"})])
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as p:
        for i in range(60):  # one batch each: many small segments
            p.send("dr", value=f"record-{i:03d}".encode() * 4, partition=0).get(timeout=30)
    leader = wait_for(lambda: leader_of(cluster.bootstrap, TP0) + 1, "a full ISR") - 1
    follower = 1 - leader
    segments_before = len(list((cluster.brokers[leader].data_dir).rglob("dr-0/*.log")))

    out = ok(
        kctl(
            f"delete-records --bootstrap-server {cluster.bootstrap} "
            f"--offset-json-file {offsets_file(tmp_path, ('dr', 0, 40))}"
        )
    )
    assert out.splitlines() == [
        "Executing records delete operation",
        "Records delete operation completed:",
        "partition: dr-0\tlow_watermark: 40",
    ]
    # The answer came once the follower had the new start too.
    assert log_start_on(cluster, follower, TP0) == 40
    segments_after = len(list((cluster.brokers[leader].data_dir).rglob("dr-0/*.log")))
    assert segments_after < segments_before
    leader_address = cluster.brokers[leader].address
    assert raw_fetch_error(leader_address, TP0, 10) == OffsetOutOfRangeError.errno
    assert first_offset_read(cluster.bootstrap, TP0) == 40

    # The leader dies (no clean shutdown): leadership moves to the follower, and the
    # records are gone there too.
    cluster.brokers[leader].kill()
    wait_for(lambda: leader_of(cluster.bootstrap, TP0, full_isr=False) == follower, "the follower to lead", 60)
    assert raw_fetch_error(cluster.brokers[follower].address, TP0, 10) == OffsetOutOfRangeError.errno
    assert first_offset_read(cluster.bootstrap, TP0) == 40

    # The new leader dies too; both come back: each checkpointed its log start offset
    # when it moved (DeleteRecords on one, the leader's fetch responses on the other).
    cluster.brokers[follower].kill()
    for b in (follower, leader):
        cluster.brokers[b].start()
    wait_for(lambda: leader_of(cluster.bootstrap, TP0) >= 0 or None, "a full ISR after the restarts", 60)
    for b in (leader, follower):
        assert log_start_on(cluster, b, TP0) == 40
    now_leader = leader_of(cluster.bootstrap, TP0)
    assert raw_fetch_error(cluster.brokers[now_leader].address, TP0, 10) == OffsetOutOfRangeError.errno
    assert first_offset_read(cluster.bootstrap, TP0) == 40


def test_delete_records_errors_and_minus_one(cluster: LocalCluster, tmp_path: Path) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("dr", 2, 1)])
        with Producer(bootstrap_servers=cluster.bootstrap) as p:
            for i in range(10):
                p.send("dr", value=b"v", partition=i % 2)
            p.flush()
        with pytest.raises(OffsetOutOfRangeError):
            admin.delete_records({TopicPartition("dr", 0): 6})  # the HW is 5
        assert admin.delete_records({TopicPartition("dr", 0): -1})[TopicPartition("dr", 0)].low_watermark == 5
    result = kctl(
        f"delete-records --bootstrap-server {cluster.bootstrap} "
        f"--offset-json-file {offsets_file(tmp_path, ('dr', 1, 99), ('dr', 0, 2), ('nope', 0, 1))}"
    )
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[:2] == ["Executing records delete operation", "Records delete operation completed:"]
    assert lines[2] == "partition: dr-0\tlow_watermark: 5"  # already at 5: nothing to move
    assert re.fullmatch(r"partition: dr-1\terror: \[Error 1\] OffsetOutOfRangeError: .*high watermark 5", lines[3])
    assert lines[4].startswith("partition: nope-0\terror: [Error 3] UnknownTopicOrPartitionError")
    assert result.stderr.startswith("kctl: records of 2 partition(s) were not deleted")

    # Only the leader deletes.
    req = log_pb2.DeleteRecordsRequest()
    req.topics.add(name="dr").partitions.add(index=0, offset=5)
    assert cluster.add_broker(1).wait_ready()
    other = stub(cluster.brokers[1].address).DeleteRecords(req, timeout=10)
    assert other.topics[0].partitions[0].error_code in (3, 6)  # no replica here


def test_groups_delete_offsets(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("t", 2, 1), NewTopic("u", 1, 1)])
        commit(cluster, "idle", {("t", 0): 3, ("t", 1): 4, ("u", 0): 5})
        out = ok(kctl(f"groups delete-offsets --bootstrap-server {cluster.bootstrap} --group idle --topic t:0"))
        assert out.splitlines() == [
            "Request succeed for deleting offsets with topic t:0 group idle",
            "",
            "TOPIC                          PARTITION       STATUS",
            "t                              0               Successful",
        ]
        left = admin.list_consumer_group_offsets("idle")
        assert set(left) == {TopicPartition("t", 1), TopicPartition("u", 0)}

        # An active member subscribed to t: t's offsets stay, u's go.
        member, generation = join_alone(cluster, "busy", "t", [0, 1])
        commit(cluster, "busy", {("t", 0): 1}, member, generation)
        commit(cluster, "busy", {("u", 0): 1}, member, generation)
        result = kctl(f"groups delete-offsets --bootstrap-server {cluster.bootstrap} --group busy --topic t --topic u")
        assert result.returncode == 1
        assert result.stdout.splitlines()[2:] == [
            "TOPIC                          PARTITION       STATUS",
            "t                              0               Error: Deleting offsets of a topic is forbidden while "
            "the consumer group is actively subscribed to it.",
            "t                              1               Error: Deleting offsets of a topic is forbidden while "
            "the consumer group is actively subscribed to it.",
            "u                              0               Successful",
        ]
        assert set(admin.list_consumer_group_offsets("busy")) == {TopicPartition("t", 0)}

        # The last offsets of an empty group: the group is gone.
        assert admin.delete_consumer_group_offsets("idle", [TopicPartition("t", 1), TopicPartition("u", 0)]) == {
            TopicPartition("t", 1): None,
            TopicPartition("u", 0): None,
        }
        assert "idle" not in dict(admin.list_consumer_groups())
    gone = kctl(f"groups delete-offsets --bootstrap-server {cluster.bootstrap} --group idle --topic t")
    assert gone.returncode == 1 and "GroupIdNotFoundError" in gone.stderr and gone.stdout == ""


def test_topics_describe_prints_the_topic_id_over_bootstrap(cluster: LocalCluster) -> None:
    ok(kctl(f"topics create --bootstrap-server {cluster.bootstrap} --topic withid --partitions 1"))
    over_grpc = ok(kctl(f"topics describe --bootstrap-server {cluster.bootstrap} --topic withid")).splitlines()[0]
    over_zk = ok(kctl(f"topics describe --zookeeper {cluster.zk_connect} --topic withid")).splitlines()[0]
    topic_id = re.search(r"\tTopicId: ([A-Za-z0-9_-]{22})\t", over_zk)
    assert topic_id is not None, over_zk
    assert f"\tTopicId: {topic_id.group(1)}\t" in over_grpc
