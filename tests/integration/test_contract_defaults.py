"""The gRPC contract seen by a client in another language: raw stubs, every
``optional`` field left unset unless the test is about it (``SIZED`` spells out the
fetch size where a test is about another field), real broker processes.

Unset must mean Kafka's default and never something unsafe: a client that leaves out
``replica_id`` is a consumer (never broker 0's follower), ``acks`` is all, epochs and
generations are "unchecked"/-1, sizes and timeouts take Kafka's defaults; explicit
nonsense (0 partitions, a size of 0, a stale broker epoch) is refused with Kafka's codes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kclient.proto.kbroker.v1 import (
    admin_pb2,
    broker_pb2_grpc,
    cluster_pb2,
    common_pb2,
    group_pb2,
    log_pb2,
    metadata_pb2,
)
from kclient.records import BatchBuilder, decode_batches
from tests.support import wait_until

pytestmark = pytest.mark.integration

RPC_TIMEOUT_S = 30
QUICK_STOP = {"controlled.shutdown.retry.backoff.ms": "200"}
"""The last broker of a cluster cannot move its leaderships away: do not retry for 10 s."""
SLOW_ISR = {**QUICK_STOP, "replica.lag.time.max.ms": "30000", "zookeeper.session.timeout.ms": "30000"}
"""A paused follower stays in the ISR (and registered) for the whole test."""

SIZED: dict[str, Any] = {"partition_max_bytes": 1048576}
"""Kafka's max.partition.fetch.bytes, spelled out where a test is about another field
(the unset sizes are the subject of their own test)."""

Stub = broker_pb2_grpc.BrokerStub


@pytest.fixture
def connect() -> Iterator[Callable[[LocalCluster, int], Stub]]:
    """``connect(cluster, broker_id)``: a raw stub to that broker; channels closed at the end."""
    channels: list[grpc.Channel] = []

    def make(cluster: LocalCluster, broker_id: int) -> Stub:
        channel = grpc.insecure_channel(cluster.brokers[broker_id].address)
        channels.append(channel)
        return Stub(channel)

    yield make
    for channel in channels:
        channel.close()


def batch(*values: bytes) -> bytes:
    builder = BatchBuilder()
    now = int(time.time() * 1000)
    for v in values:
        builder.append(now, None, v)
    return builder.build()


def values(records: bytes, from_offset: int = 0) -> list[bytes | None]:
    return [r.value for _, rs in decode_batches(records) for r in rs if r.offset >= from_offset]


def produce(stub: Stub, topic: str, partition: int, records: bytes, **fields: Any) -> log_pb2.ProducePartitionResponse:
    req = log_pb2.ProduceRequest(**fields)
    req.topics.add(name=topic).partitions.add(index=partition, records=records)
    return stub.Produce(req, timeout=RPC_TIMEOUT_S).topics[0].partitions[0]


def fetch(
    stub: Stub, topic: str, partition: int, offset: int, request: dict[str, Any] | None = None, **fields: Any
) -> log_pb2.FetchPartitionResponse:
    """One partition; ``request`` sets FetchRequest fields, ``fields`` FetchPartition fields."""
    req = log_pb2.FetchRequest(**(request or {}))
    req.topics.add(name=topic).partitions.add(index=partition, fetch_offset=offset, **fields)
    return stub.Fetch(req, timeout=RPC_TIMEOUT_S).topics[0].partitions[0]


def list_offset(
    stub: Stub, topic: str, partition: int, replica_id: int | None = None, **fields: int
) -> log_pb2.ListOffsetsPartitionResponse:
    req = log_pb2.ListOffsetsRequest() if replica_id is None else log_pb2.ListOffsetsRequest(replica_id=replica_id)
    req.topics.add(name=topic).partitions.add(index=partition, **fields)
    return stub.ListOffsets(req, timeout=RPC_TIMEOUT_S).topics[0].partitions[0]


def high_watermark(stub: Stub, topic: str) -> int:
    """A measuring instrument, not a subject: it spells out the consumer's -1s so that it
    reads the HW on any broker (unset fields are the subject of the tests themselves)."""
    r = list_offset(stub, topic, 0, replica_id=-1, timestamp=-1, current_leader_epoch=-1)
    assert r.error_code == common_pb2.NONE, r.error_message
    return r.offset


def metadata(stub: Stub, *topics: str) -> metadata_pb2.MetadataResponse:
    return stub.Metadata(metadata_pb2.MetadataRequest(topics=list(topics)), timeout=RPC_TIMEOUT_S)


def create_topic(
    stub: Stub,
    name: str,
    assignments: dict[int, list[int]] | None = None,
    configs: dict[str, str] | None = None,
    **fields: Any,
) -> admin_pb2.TopicResult:
    topic = admin_pb2.CreatableTopic(name=name, configs=configs or {}, **fields)
    for p, brokers in (assignments or {}).items():
        topic.assignments[p].broker_ids.extend(brokers)
    return stub.CreateTopics(admin_pb2.CreateTopicsRequest(topics=[topic]), timeout=RPC_TIMEOUT_S).topics[0]


def partitions(stub: Stub, topic: str) -> list[metadata_pb2.PartitionMetadata]:
    """The topic's partitions as DescribeTopics sees them (never auto-creates); [] if unknown."""
    d = stub.DescribeTopics(admin_pb2.DescribeTopicsRequest(topics=[topic]), timeout=RPC_TIMEOUT_S).topics[0]
    return list(d.partitions) if d.error_code == common_pb2.NONE else []


def led(stub: Stub, topic: str) -> bool:
    found = partitions(stub, topic)
    return bool(found) and all(p.leader_id >= 0 for p in found)


def wait_for_cluster(stub: Stub, brokers: int) -> None:
    def ready() -> bool:
        m = metadata(stub)
        return len(m.brokers) == brokers and m.controller_id >= 0

    wait_until(ready, 30, f"{brokers} brokers registered and a controller")


def wait_in_sync(stub: Stub, topic: str, leader: int, isr: set[int]) -> metadata_pb2.PartitionMetadata:
    found: list[metadata_pb2.PartitionMetadata] = []

    def ready() -> bool:
        p = partitions(stub, topic)[0]
        found[:] = [p]
        return p.leader_id == leader and set(p.isr_nodes) == isr

    wait_until(ready, 30, f"{topic}-0 led by {leader} with ISR {sorted(isr)}")
    return found[0]


def replicated_topic(
    cluster_factory: Callable[..., LocalCluster], connect: Callable[[LocalCluster, int], Stub], topic: str
) -> tuple[LocalCluster, Stub]:
    """Two brokers; ``topic`` has one partition led by broker 1 and followed by broker 0, and
    holds one fully replicated record (HW = LEO = 1). Returns the cluster and a stub to 1."""
    cluster = cluster_factory(2, **SLOW_ISR)
    leader = connect(cluster, 1)
    wait_for_cluster(leader, 2)
    assert create_topic(leader, topic, {0: [1, 0]}).error_code == common_pb2.NONE
    wait_in_sync(leader, topic, 1, {0, 1})
    first = produce(leader, topic, 0, batch(b"replicated"), acks=-1, timeout_ms=10000)
    assert (first.error_code, first.base_offset) == (common_pb2.NONE, 0), first.error_message
    wait_until(lambda: high_watermark(leader, topic) == 1, 10, "HW 1")
    return cluster, leader


def rpc_error(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def error_code_metadata(err: grpc.RpcError) -> str | None:
    trailing = err.trailing_metadata() or ()  # type: ignore[attr-defined]
    return next((v for k, v in trailing if k == "kbroker-error-code"), None)


# --- replica_id ------------------------------------------------------------------------


def test_fetch_without_replica_id_is_a_consumer_and_never_completes_acks_all(
    cluster_factory: Callable[..., LocalCluster], connect: Callable[[LocalCluster, int], Stub]
) -> None:
    cluster, leader = replicated_topic(cluster_factory, connect, "solo-follower")
    answer: list[log_pb2.ProducePartitionResponse] = []
    cluster.brokers[0].pause()  # the only real follower
    try:
        writer = threading.Thread(
            target=lambda: answer.append(
                produce(leader, "solo-follower", 0, batch(b"needs-both"), acks=-1, timeout_ms=3000)
            )
        )
        writer.start()
        offset, seen, watermarks = 1, [], set()
        while writer.is_alive():
            # A consumer in another language: replica_id, max_wait_ms, min_bytes... unset.
            r = fetch(leader, "solo-follower", 0, offset, **SIZED)
            assert r.error_code == common_pb2.NONE, r.error_message
            watermarks.add(r.high_watermark)
            got = values(r.records, offset)
            if got:  # read on as a consumer would; with the bug this completed the write
                seen += got
                offset += len(got)
            time.sleep(0.02)
        writer.join()
    finally:
        cluster.brokers[0].resume()
    assert answer[0].error_code in (
        common_pb2.REQUEST_TIMED_OUT,
        common_pb2.NOT_ENOUGH_REPLICAS,
        common_pb2.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ), f"acks=all acknowledged without the follower: {answer[0]}"
    assert seen == [], "a consumer read above the high watermark"
    assert watermarks == {1}


def test_replica_fetch_from_a_broker_outside_the_replica_set_is_refused(
    cluster_factory: Callable[..., LocalCluster], connect: Callable[[LocalCluster, int], Stub]
) -> None:
    cluster, leader = replicated_topic(cluster_factory, connect, "outsider")
    cluster.brokers[0].pause()
    try:
        r = produce(leader, "outsider", 0, batch(b"unreplicated"), acks=1)
        assert (r.error_code, r.base_offset) == (common_pb2.NONE, 1), r.error_message
        assert high_watermark(leader, "outsider") == 1
        for offset in (1, 2):  # 1: above the HW; 2: as if broker 7 had the record
            f = fetch(leader, "outsider", 0, offset, {"replica_id": 7, "max_wait_ms": 0}, **SIZED)
            assert f.error_code == common_pb2.NOT_LEADER_OR_FOLLOWER, (offset, f)
            assert f.records == b""
        assert high_watermark(leader, "outsider") == 1
    finally:
        cluster.brokers[0].resume()


def test_list_offsets_without_replica_id_answers_the_high_watermark(
    cluster_factory: Callable[..., LocalCluster], connect: Callable[[LocalCluster, int], Stub]
) -> None:
    cluster, leader = replicated_topic(cluster_factory, connect, "watermark")
    cluster.brokers[0].pause()
    try:
        r = produce(leader, "watermark", 0, batch(b"above-hw"), acks=1)
        assert (r.error_code, r.base_offset) == (common_pb2.NONE, 1), r.error_message  # LEO 2, HW 1
        for fields in ({"timestamp": -1}, {}):  # timestamp unset = -1 (latest)
            latest = list_offset(leader, "watermark", 0, **fields)
            assert (latest.error_code, latest.offset) == (common_pb2.NONE, 1), (fields, latest)
        outsider = list_offset(leader, "watermark", 0, replica_id=7)
        assert outsider.error_code == common_pb2.NOT_LEADER_OR_FOLLOWER
        assert outsider.offset == -1
        follower = list_offset(leader, "watermark", 0, replica_id=0)  # a real replica: the LEO
        assert (follower.error_code, follower.offset) == (common_pb2.NONE, 2)
    finally:
        cluster.brokers[0].resume()


# --- Produce, Fetch --------------------------------------------------------------------


def test_produce_without_acks_means_acks_all(
    cluster: LocalCluster, connect: Callable[[LocalCluster, int], Stub]
) -> None:
    stub = connect(cluster, 0)
    wait_for_cluster(stub, 1)
    assert create_topic(stub, "strict", configs={"min.insync.replicas": "2"}).error_code == common_pb2.NONE
    r = produce(stub, "strict", 0, batch(b"refused"))  # acks and timeout_ms unset
    assert r.error_code == common_pb2.NOT_ENOUGH_REPLICAS, r
    assert r.base_offset == -1
    log_end = list_offset(stub, "strict", 0, replica_id=0)  # the leader's own LEO
    assert (log_end.error_code, log_end.offset) == (common_pb2.NONE, 0), "nothing appended"
    one = produce(stub, "strict", 0, batch(b"acks-1"), acks=1)  # the topic itself works
    assert (one.error_code, one.base_offset) == (common_pb2.NONE, 0), one


def test_fetch_with_only_offsets_set_returns_records_and_zero_sizes_are_refused(
    cluster: LocalCluster, connect: Callable[[LocalCluster, int], Stub]
) -> None:
    stub = connect(cluster, 0)
    wait_for_cluster(stub, 1)
    assert create_topic(stub, "plain").error_code == common_pb2.NONE
    assert produce(stub, "plain", 0, batch(b"a", b"b", b"c")).error_code == common_pb2.NONE
    r = fetch(stub, "plain", 0, 0)
    assert r.error_code == common_pb2.NONE, r.error_message
    assert (r.high_watermark, r.log_start_offset, r.log_end_offset) == (3, 0, 3)
    assert values(r.records) == [b"a", b"b", b"c"]
    assert values(fetch(stub, "plain", 0, 1).records, 1) == [b"b", b"c"]  # may start mid-batch

    for request, partition_fields in (({}, {"partition_max_bytes": 0}), ({"max_bytes": 0}, {})):
        err = rpc_error(partial(fetch, stub, "plain", 0, 0, request, **partition_fields))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (request, partition_fields, err)  # type: ignore[attr-defined]
        assert error_code_metadata(err) == str(common_pb2.INVALID_FETCH_SIZE)


def test_unset_current_leader_epoch_is_not_fenced_after_a_leader_change(
    cluster_factory: Callable[..., LocalCluster], connect: Callable[[LocalCluster, int], Stub]
) -> None:
    cluster = cluster_factory(2, **QUICK_STOP)
    survivor = connect(cluster, 1)
    wait_for_cluster(survivor, 2)
    assert create_topic(survivor, "moving", {0: [0, 1]}).error_code == common_pb2.NONE
    old_epoch = wait_in_sync(survivor, "moving", 0, {0, 1}).leader_epoch
    leader = connect(cluster, 0)
    wait_in_sync(leader, "moving", 0, {0, 1})  # its own view: the controller's LeaderAndIsr came first
    assert produce(leader, "moving", 0, batch(b"kept")).error_code == common_pb2.NONE
    cluster.brokers[0].stop()  # controlled shutdown: broker 1 leads in a newer epoch

    def led_by_1() -> bool:
        p = partitions(survivor, "moving")[0]
        return p.leader_id == 1 and p.leader_epoch > old_epoch

    wait_until(led_by_1, 30, "broker 1 leads in a new epoch")
    new_epoch = partitions(survivor, "moving")[0].leader_epoch
    wait_until(lambda: high_watermark(survivor, "moving") == 1, 10, "the new leader's HW covers the record")
    current = fetch(survivor, "moving", 0, 0, current_leader_epoch=new_epoch, **SIZED)
    assert (current.error_code, values(current.records)) == (common_pb2.NONE, [b"kept"]), current

    unset = fetch(survivor, "moving", 0, 0, **SIZED)  # current_leader_epoch unset = unchecked
    assert (unset.error_code, values(unset.records)) == (common_pb2.NONE, [b"kept"]), unset
    r = list_offset(survivor, "moving", 0)
    assert (r.error_code, r.offset, r.leader_epoch) == (common_pb2.NONE, 1, new_epoch), r

    stale_fetch = fetch(survivor, "moving", 0, 0, current_leader_epoch=old_epoch, **SIZED)
    assert stale_fetch.error_code == common_pb2.FENCED_LEADER_EPOCH, stale_fetch
    assert stale_fetch.records == b""
    stale_list = list_offset(survivor, "moving", 0, current_leader_epoch=old_epoch)
    assert stale_list.error_code == common_pb2.FENCED_LEADER_EPOCH, stale_list


# --- admin -----------------------------------------------------------------------------


def test_create_topics_defaults_and_explicit_zero(
    cluster_factory: Callable[..., LocalCluster], connect: Callable[[LocalCluster, int], Stub]
) -> None:
    cluster = cluster_factory(1, **{"num.partitions": "3"})
    stub = connect(cluster, 0)
    wait_for_cluster(stub, 1)
    r = create_topic(stub, "defaults")  # num_partitions, replication_factor, timeout_ms unset
    assert r.error_code == common_pb2.NONE, r.error_message
    # timeout_ms unset = 30 s: the call returned once every partition had a leader.
    (topic,) = metadata(stub, "defaults").topics
    assert topic.error_code == common_pb2.NONE
    assert [(p.index, p.error_code, p.leader_id, list(p.replica_nodes)) for p in topic.partitions] == [
        (i, common_pb2.NONE, 0, [0]) for i in range(3)
    ]
    explicit = create_topic(stub, "explicit", num_partitions=-1, replication_factor=-1)
    assert explicit.error_code == common_pb2.NONE, explicit.error_message
    assert len(partitions(stub, "explicit")) == 3

    assert create_topic(stub, "zero-partitions", num_partitions=0).error_code == common_pb2.INVALID_PARTITIONS
    assert create_topic(stub, "zero-rf", replication_factor=0).error_code == common_pb2.INVALID_REPLICATION_FACTOR
    assert partitions(stub, "zero-partitions") == partitions(stub, "zero-rf") == []


# --- groups ----------------------------------------------------------------------------


def test_group_calls_with_unset_timeouts_types_and_generations(
    cluster_factory: Callable[..., LocalCluster], connect: Callable[[LocalCluster, int], Stub]
) -> None:
    cluster = cluster_factory(1, **{"group.initial.rebalance.delay.ms": "0"})
    stub = connect(cluster, 0)
    wait_for_cluster(stub, 1)
    assert create_topic(stub, "grouped").error_code == common_pb2.NONE
    coordinator = stub.FindCoordinator(group_pb2.FindCoordinatorRequest(group_id="g"), timeout=RPC_TIMEOUT_S)
    assert (coordinator.error_code, coordinator.node_id) == (common_pb2.NONE, 0)

    subscription = group_pb2.ConsumerSubscription(topics=["grouped"]).SerializeToString()
    join = stub.JoinGroup(
        group_pb2.JoinGroupRequest(
            group_id="g", protocols=[group_pb2.JoinGroupProtocol(name="range", metadata=subscription)]
        ),
        timeout=RPC_TIMEOUT_S,
    )  # session_timeout_ms, rebalance_timeout_ms, protocol_type unset
    assert join.error_code == common_pb2.NONE, join.error_message
    assert join.member_id and join.leader_id == join.member_id and join.protocol_name == "range"
    assert [m.member_id for m in join.members] == [join.member_id]
    assert join.generation_id >= 0
    member = join.member_id

    assignment = group_pb2.ConsumerAssignment(
        partitions=[group_pb2.TopicPartitions(topic="grouped", partitions=[0])]
    ).SerializeToString()
    sync_request = group_pb2.SyncGroupRequest(
        group_id="g",
        member_id=member,
        assignments=[group_pb2.SyncGroupAssignment(member_id=member, assignment=assignment)],
    )
    unset_sync = stub.SyncGroup(sync_request, timeout=RPC_TIMEOUT_S)
    assert unset_sync.error_code == common_pb2.ILLEGAL_GENERATION, unset_sync
    sync_request.generation_id = join.generation_id
    sync = stub.SyncGroup(sync_request, timeout=RPC_TIMEOUT_S)
    assert (sync.error_code, sync.assignment) == (common_pb2.NONE, assignment), sync.error_message

    beat = group_pb2.HeartbeatRequest(group_id="g", member_id=member)
    assert stub.Heartbeat(beat, timeout=RPC_TIMEOUT_S).error_code == common_pb2.ILLEGAL_GENERATION
    beat.generation_id = join.generation_id
    assert stub.Heartbeat(beat, timeout=RPC_TIMEOUT_S).error_code == common_pb2.NONE
    (described,) = stub.DescribeGroups(group_pb2.DescribeGroupsRequest(group_ids=["g"]), timeout=RPC_TIMEOUT_S).groups
    assert (described.state, described.protocol_type) == ("Stable", "consumer")

    # assign() outside group management: generation_id and member_id unset.
    commit = stub.CommitOffsets(
        group_pb2.CommitOffsetsRequest(
            group_id="standalone",
            topics=[group_pb2.CommitTopic(name="grouped", partitions=[group_pb2.CommitPartition(index=0, offset=5)])],
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert [(p.index, p.error_code) for p in commit.topics[0].partitions] == [(0, common_pb2.NONE)], commit
    fetched = stub.FetchOffsets(group_pb2.FetchOffsetsRequest(group_id="standalone"), timeout=RPC_TIMEOUT_S)
    assert fetched.error_code == common_pb2.NONE
    assert [(t.name, p.index, p.offset) for t in fetched.topics for p in t.partitions] == [("grouped", 0, 5)]


# --- Produce answers -------------------------------------------------------------------


def test_produce_answers_log_append_time_repeated_partitions_and_bad_names(
    cluster: LocalCluster, connect: Callable[[LocalCluster, int], Stub]
) -> None:
    stub = connect(cluster, 0)
    wait_for_cluster(stub, 1)
    stamped = {"message.timestamp.type": "LogAppendTime"}
    assert create_topic(stub, "stamped", configs=stamped).error_code == common_pb2.NONE
    assert create_topic(stub, "created").error_code == common_pb2.NONE

    before = int(time.time() * 1000)
    r = produce(stub, "stamped", 0, batch(b"x"))
    after = int(time.time() * 1000)
    assert r.error_code == common_pb2.NONE, r.error_message
    assert before - 1000 <= r.log_append_time_ms <= after + 1000, (before, r.log_append_time_ms, after)
    ((header, _),) = decode_batches(fetch(stub, "stamped", 0, 0).records)
    assert header.max_timestamp == r.log_append_time_ms  # the stamp the batch carries
    created = produce(stub, "created", 0, batch(b"y"))
    assert (created.error_code, created.log_append_time_ms) == (common_pb2.NONE, -1), created

    twice_in_one_topic = log_pb2.ProduceRequest(
        topics=[
            log_pb2.ProduceTopic(
                name="created",
                partitions=[
                    log_pb2.ProducePartition(index=0, records=batch(b"dup-1")),
                    log_pb2.ProducePartition(index=0, records=batch(b"dup-2")),
                ],
            )
        ]
    )
    twice_in_two_topics = log_pb2.ProduceRequest(
        topics=[
            log_pb2.ProduceTopic(name="created", partitions=[log_pb2.ProducePartition(index=0, records=batch(b"d-1"))]),
            log_pb2.ProduceTopic(name="created", partitions=[log_pb2.ProducePartition(index=0, records=batch(b"d-2"))]),
        ]
    )
    for request in (twice_in_one_topic, twice_in_two_topics):
        answers = [p for t in stub.Produce(request, timeout=RPC_TIMEOUT_S).topics for p in t.partitions]
        assert [(p.error_code, p.base_offset) for p in answers] == [(common_pb2.INVALID_REQUEST, -1)] * 2, answers
    assert high_watermark(stub, "created") == 1, "a repeated partition appended nothing"

    bad = produce(stub, "bad/name", 0, batch(b"z"))
    assert (bad.error_code, bad.base_offset) == (common_pb2.INVALID_TOPIC_EXCEPTION, -1), bad


# --- ControlledShutdown ----------------------------------------------------------------


def test_controlled_shutdown_without_the_broker_epoch_changes_nothing(
    cluster_factory: Callable[..., LocalCluster], connect: Callable[[LocalCluster, int], Stub]
) -> None:
    cluster = cluster_factory(2, **QUICK_STOP)
    stubs = {b: connect(cluster, b) for b in (0, 1)}
    wait_for_cluster(stubs[0], 2)
    assert create_topic(stubs[0], "led", {0: [0, 1], 1: [1, 0]}).error_code == common_pb2.NONE

    def leadership() -> list[tuple[int, int, int, list[int]]]:
        return [(p.index, p.leader_id, p.leader_epoch, sorted(p.isr_nodes)) for p in partitions(stubs[0], "led")]

    wait_until(lambda: [(i, lead, isr) for i, lead, _, isr in leadership()] == [(0, 0, [0, 1]), (1, 1, [0, 1])], 30)
    before = leadership()
    controller_id = metadata(stubs[0]).controller_id
    controller, other = stubs[controller_id], stubs[1 - controller_id]

    for broker_id in (0, 1):
        for request in (
            cluster_pb2.ControlledShutdownRequest(broker_id=broker_id),  # broker_epoch unset
            cluster_pb2.ControlledShutdownRequest(broker_id=broker_id, broker_epoch=-1),
            cluster_pb2.ControlledShutdownRequest(broker_id=broker_id, broker_epoch=1 << 40),
        ):
            r = controller.ControlledShutdown(request, timeout=RPC_TIMEOUT_S)
            assert r.error_code == common_pb2.STALE_BROKER_EPOCH, (request, r)
            assert list(r.remaining) == []
    not_controller = other.ControlledShutdown(cluster_pb2.ControlledShutdownRequest(broker_id=0), timeout=RPC_TIMEOUT_S)
    assert not_controller.error_code == common_pb2.NOT_CONTROLLER

    time.sleep(0.5)  # a refused request must not start anything in the background either
    assert leadership() == before
    # Neither broker is marked as shutting down: each still takes new leaderships.
    assert create_topic(stubs[0], "after", {0: [0, 1], 1: [1, 0]}).error_code == common_pb2.NONE
    wait_until(lambda: [p.leader_id for p in partitions(stubs[0], "after")] == [0, 1], 30, "preferred leaders")


# --- auto.create.topics.enable ---------------------------------------------------------


def test_auto_create_topics_on_metadata_and_produce_only_where_enabled(
    cluster_factory: Callable[..., LocalCluster], connect: Callable[[LocalCluster, int], Stub]
) -> None:
    cluster = cluster_factory(1)  # broker 0: the default (auto.create.topics.enable=false)
    auto_create: dict[str, Any] = {"auto.create.topics.enable": "true"}
    cluster.add_broker(1, **auto_create)
    default, enabled = connect(cluster, 0), connect(cluster, 1)
    wait_for_cluster(default, 2)

    (unknown,) = metadata(default, "not-auto").topics
    assert unknown.error_code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
    refused = produce(default, "not-auto-produce", 0, batch(b"v"))
    assert refused.error_code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION, refused

    (created,) = metadata(enabled, "auto-metadata").topics
    assert created.error_code in (common_pb2.NONE, common_pb2.LEADER_NOT_AVAILABLE), created
    if created.error_code == common_pb2.NONE:
        assert [p.index for p in created.partitions] == [0]
    first = produce(enabled, "auto-produce", 0, batch(b"first"))
    assert first.error_code in (
        common_pb2.NONE,
        common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
        common_pb2.LEADER_NOT_AVAILABLE,
        common_pb2.NOT_LEADER_OR_FOLLOWER,
    ), first
    for name in ("auto-metadata", "auto-produce"):
        wait_until(partial(led, default, name), 15, f"{name} led")
        (topic,) = metadata(default, name).topics
        assert topic.error_code == common_pb2.NONE and len(topic.partitions) == 1  # num.partitions
        assert len(topic.partitions[0].replica_nodes) == 1  # default.replication.factor
    leader = connect(cluster, partitions(default, "auto-produce")[0].leader_id)
    wait_until(lambda: produce(leader, "auto-produce", 0, batch(b"next")).error_code == common_pb2.NONE, 10)
    time.sleep(0.5)  # broker 0 created nothing in the background either
    assert partitions(enabled, "not-auto") == partitions(enabled, "not-auto-produce") == []
