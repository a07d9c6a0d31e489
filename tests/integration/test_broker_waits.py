"""Waiting requests hold no broker thread; requests are bounded; garbage is one log line.

Each test runs a real broker with only 4 request threads (``grpc.workers=4``), so a
request that pinned a thread while waiting would starve everything else at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from kclient.proto.kbroker.v1 import broker_pb2_grpc, group_pb2, log_pb2, metadata_pb2
from kclient.records import BatchBuilder
from tests.support import wait_until

pytestmark = pytest.mark.integration

FEW_THREADS = {"grpc.workers": "4"}


def records(n: int = 1, size: int = 10) -> bytes:
    b = BatchBuilder()
    for i in range(n):
        b.append(int(time.time() * 1000), None, bytes([65 + i % 26]) * size)
    return b.build()


def produce_request(topic: str, payload: bytes, acks: int = 1, timeout_ms: int = 5000) -> log_pb2.ProduceRequest:
    req = log_pb2.ProduceRequest(acks=acks, timeout_ms=timeout_ms)
    req.topics.add(name=topic).partitions.add(index=0, records=payload)
    return req


def fetch_request(topic: str, offset: int, max_wait_ms: int) -> log_pb2.FetchRequest:
    req = log_pb2.FetchRequest(max_wait_ms=max_wait_ms)
    req.topics.add(name=topic).partitions.add(index=0, fetch_offset=offset)
    return req


def timed(call: Callable[[], Any]) -> float:
    start = time.monotonic()
    call()
    return time.monotonic() - start


def make_topics(cluster: LocalCluster, *names: str, rf: int = 1) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(n, 1, rf) for n in names])


def test_idle_long_polls_do_not_starve_the_broker(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FEW_THREADS)
    make_topics(cluster, "idle", "busy")
    channel = grpc.insecure_channel(cluster.bootstrap)
    stub = broker_pb2_grpc.BrokerStub(channel)
    parked = [stub.Fetch.future(fetch_request("idle", 0, 20000), timeout=40) for _ in range(64)]
    time.sleep(0.5)
    assert not any(f.done() for f in parked)
    # 64 parked long polls on 4 threads: everything else still answers at once.
    assert timed(lambda: stub.Metadata(metadata_pb2.MetadataRequest(), timeout=10)) < 2.0
    for _ in range(5):
        resp = stub.Produce(produce_request("busy", records()), timeout=10)
        assert resp.topics[0].partitions[0].error_code == 0
    # An append to "idle" answers the parked fetches (and only now).
    assert not any(f.done() for f in parked)
    stub.Produce(produce_request("idle", records(3)), timeout=10)
    start = time.monotonic()
    answers = [f.result(timeout=10) for f in parked]
    assert time.monotonic() - start < 5.0
    assert all(a.topics[0].partitions[0].records for a in answers)
    channel.close()


def test_abandoned_long_polls_are_released(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FEW_THREADS)
    make_topics(cluster, "idle", "busy")
    channel = grpc.insecure_channel(cluster.bootstrap)
    stub = broker_pb2_grpc.BrokerStub(channel)
    for _ in range(3):
        calls = [stub.Fetch.future(fetch_request("idle", 0, 30000), timeout=60) for _ in range(64)]
        time.sleep(0.3)
        for c in calls:
            c.cancel()
    assert timed(lambda: stub.Produce(produce_request("busy", records()), timeout=10)) < 2.0
    assert timed(lambda: stub.Metadata(metadata_pb2.MetadataRequest(), timeout=10)) < 2.0
    channel.close()


@pytest.mark.slow
def test_a_consumer_long_poll_is_capped(cluster: LocalCluster) -> None:
    make_topics(cluster, "idle")
    stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.bootstrap))
    fut = stub.Fetch.future(fetch_request("idle", 0, 2_000_000_000), timeout=60)
    # Capped at 30 s: it answers (empty) well before the client's own 60 s deadline.
    resp = fut.result(timeout=45)
    assert resp.topics[0].partitions[0].error_code == 0
    assert resp.topics[0].partitions[0].records == b""


def test_waiting_joins_hold_no_thread(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FEW_THREADS, **{"group.initial.rebalance.delay.ms": "8000"})
    stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.bootstrap))
    joins = []
    for i in range(16):
        req = group_pb2.JoinGroupRequest(group_id=f"g{i}", session_timeout_ms=10000, protocol_type="consumer")
        req.protocols.add(name="range", metadata=b"")
        joins.append(stub.JoinGroup.future(req, timeout=30))
    time.sleep(0.5)
    assert not any(j.done() for j in joins)  # each waits out the initial rebalance delay
    assert timed(lambda: stub.Metadata(metadata_pb2.MetadataRequest(), timeout=10)) < 2.0
    for j in joins:
        resp = j.result(timeout=30)
        assert resp.error_code == 0 and resp.generation_id >= 1 and resp.leader_id == resp.member_id


def test_a_request_over_socket_request_max_bytes_is_refused(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **{"socket.request.max.bytes": str(1024 * 1024)})
    make_topics(cluster, "t")
    stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.bootstrap))
    with pytest.raises(grpc.RpcError) as info:
        stub.Produce(produce_request("t", records(1, 2 * 1024 * 1024)), timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    ok = stub.Produce(produce_request("t", records(1, 1000)), timeout=10)
    assert ok.topics[0].partitions[0].error_code == 0 and ok.topics[0].partitions[0].base_offset == 0


def test_request_bytes_in_flight_are_bounded(cluster_factory: Callable[..., LocalCluster]) -> None:
    """queued.max.request.bytes: with acks=all waits holding ~1 MiB each, the broker
    reads only what fits in its budget; the rest wait, unread, and are served as bytes
    are released -- none fails for it (Kafka's muted channels)."""
    cluster = cluster_factory(2, **{"queued.max.request.bytes": str(3 * 1024 * 1024)})
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("t", replica_assignments={0: [0, 1]})])
    wait_until(lambda: cluster.brokers[1].running(), 5)
    stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.brokers[0].address))
    cluster.brokers[1].pause()  # the follower stops: acks=all writes wait for it
    try:
        big = records(1, 900 * 1024)
        calls = [stub.Produce.future(produce_request("t", big, acks=-1, timeout_ms=2000), timeout=60) for _ in range(8)]
        answers = [c.result() for c in calls]  # none RESOURCE_EXHAUSTED
        assert len(answers) == 8
    finally:
        cluster.brokers[1].resume()


def test_garbage_requests_are_refused_with_one_log_line(cluster: LocalCluster) -> None:
    channel = grpc.insecure_channel(cluster.bootstrap)
    raw = channel.unary_unary("/kbroker.v1.Broker/Produce")
    before = cluster.brokers[0].log_path.read_text()
    for i in range(20):
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\xff\xff\xff\xfe garbage " + bytes([i]) * 50, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # The broker still serves.
    stub = broker_pb2_grpc.BrokerStub(channel)
    stub.Metadata(metadata_pb2.MetadataRequest(), timeout=10)
    logged = cluster.brokers[0].log_path.read_text()[len(before) :]
    assert "Traceback" not in logged
    lines = [line for line in logged.splitlines() if "undecodable" in line]
    assert len(lines) == 1 and "kbroker.v1.Broker/Produce" in lines[0]
