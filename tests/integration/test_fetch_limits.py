"""Fetch response limits (KIP-74): a response stays within the request's ``max_bytes`` and
each partition within its ``partition_max_bytes``, except the first batch of the first
partition that has one, which is returned whole even when larger (so a consumer always
makes progress). Both doors: the Kafka door's Fetch and gRPC's Fetch share the core path."""

from __future__ import annotations

import os
from collections.abc import Callable

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2
from kclient.records import encode_batch
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.integration

DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}
TOPIC = "limits"
PARTITIONS = 3
BATCH = 600 * 1024  # one batch of ~600 KiB per partition, incompressible


@pytest.fixture
def door(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    cluster = cluster_factory(1, **DOOR)
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
    stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.bootstrap))
    req = log_pb2.ProduceRequest(acks=1, timeout_ms=10_000)
    t = req.topics.add(name=TOPIC)
    for p in range(PARTITIONS):
        t.partitions.add(index=p, records=encode_batch([os.urandom(BATCH)]))
    resp = stub.Produce(req, timeout=30)
    assert all(r.error_code == 0 for r in resp.topics[0].partitions), resp
    return cluster


def _kafka_fetch(cluster: LocalCluster, max_bytes: int, partition_max_bytes: int) -> list[int]:
    with WireClient(cluster.kafka_bootstrap(), timeout_s=30) as c:
        resp = c.call(
            1,
            11,
            {
                "replica_id": -1,
                "max_wait": 0,
                "min_bytes": 1,
                "max_bytes": max_bytes,
                "isolation_level": 0,
                "session_id": 0,
                "session_epoch": -1,
                "topics": [
                    {
                        "topic": TOPIC,
                        "partitions": [
                            {
                                "partition": p,
                                "current_leader_epoch": -1,
                                "fetch_offset": 0,
                                "log_start_offset": -1,
                                "partition_max_bytes": partition_max_bytes,
                            }
                            for p in range(PARTITIONS)
                        ],
                    }
                ],
                "forgotten_topics_data": [],
                "rack_id": "",
            },
        )
    assert resp.error_code == 0
    parts = sorted(resp.responses[0].partitions, key=lambda x: x.partition_index)
    assert all(x.error_code == 0 for x in parts)
    return [len(x.records or b"") for x in parts]


def _grpc_fetch(cluster: LocalCluster, max_bytes: int, partition_max_bytes: int) -> list[int]:
    stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.bootstrap))
    req = log_pb2.FetchRequest(max_wait_ms=0, min_bytes=1, max_bytes=max_bytes)
    t = req.topics.add(name=TOPIC)
    for p in range(PARTITIONS):
        t.partitions.add(index=p, fetch_offset=0, partition_max_bytes=partition_max_bytes)
    resp = stub.Fetch(req, timeout=30)
    parts = sorted(resp.topics[0].partitions, key=lambda x: x.index)
    assert all(x.error_code == 0 for x in parts)
    return [len(x.records) for x in parts]


FETCHES = {"kafka": _kafka_fetch, "grpc": _grpc_fetch}


@pytest.mark.parametrize("door_name", FETCHES)
def test_response_stays_within_max_bytes(door: LocalCluster, door_name: str) -> None:
    sizes = FETCHES[door_name](door, 1024 * 1024, 1024 * 1024)
    assert sizes[0] > BATCH  # the first partition's batch fits
    assert sizes[1:] == [0, 0]  # the next ones would go past 1 MiB: not returned
    assert sum(sizes) <= 1024 * 1024


@pytest.mark.parametrize("door_name", FETCHES)
def test_only_the_first_batch_may_exceed_the_limits(door: LocalCluster, door_name: str) -> None:
    sizes = FETCHES[door_name](door, 100 * 1024, 50 * 1024)
    assert sizes[0] > BATCH  # larger than both limits, returned whole (KIP-74)
    assert sizes[1:] == [0, 0]


@pytest.mark.parametrize("door_name", FETCHES)
def test_partition_max_bytes_applies_per_partition(door: LocalCluster, door_name: str) -> None:
    # Total room for all three, but a partition limit below the batch: the first partition
    # still gets its (first) batch, the others nothing.
    sizes = FETCHES[door_name](door, 10 * 1024 * 1024, 100 * 1024)
    assert sizes[0] > BATCH
    assert sizes[1:] == [0, 0]
