"""KIP-467 record errors: a batch with records a topic cannot take (here: records without
a key sent to a compacted topic) fails whole with INVALID_RECORD, and the answer names
the bad records (batch index and message) so that a client can fail only those. Produce
v8+ on the Kafka door (``record_errors``, ``error_message``), and gRPC's
``ProducePartitionResponse.record_errors``."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from kclient.errors import InvalidRecordError
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2
from kclient.records import encode_batch
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.integration

DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}
TOPIC = "compacted"
INVALID_RECORD = InvalidRecordError.errno
KEYS = [b"a", None, b"c", None, b"e"]


@pytest.fixture
def door(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    cluster = cluster_factory(1, **DOOR)
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 1, topic_configs={"cleanup.policy": "compact"})])
    return cluster


def _batch() -> bytes:
    return encode_batch([b"v%d" % i for i in range(len(KEYS))], keys=KEYS)


def _kafka_produce(cluster: LocalCluster, version: int) -> object:
    with WireClient(cluster.kafka_bootstrap()) as c:
        resp = c.call(
            0,
            version,
            {
                "transactional_id": None,
                "acks": 1,
                "timeout": 10_000,
                "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": _batch()}]}],
            },
        )
    return resp.responses[0].partition_responses[0]


@pytest.mark.parametrize("version", [8, 9])
def test_kafka_door_names_the_records_without_a_key(door: LocalCluster, version: int) -> None:
    r = _kafka_produce(door, version)
    assert r.error_code == INVALID_RECORD
    assert [int(e.batch_index) for e in r.record_errors] == [1, 3]
    assert all("without key" in e.batch_index_error_message for e in r.record_errors)
    assert r.error_message and "2 record errors" in r.error_message
    assert r.base_offset == -1


def test_kafka_door_v7_has_only_the_error_code(door: LocalCluster) -> None:
    r = _kafka_produce(door, 7)
    assert r.error_code == INVALID_RECORD


def test_grpc_names_the_records_without_a_key(door: LocalCluster) -> None:
    stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(door.bootstrap))
    req = log_pb2.ProduceRequest(acks=1, timeout_ms=10_000)
    req.topics.add(name=TOPIC).partitions.add(index=0, records=_batch())
    r = stub.Produce(req, timeout=30).topics[0].partitions[0]
    assert r.error_code == INVALID_RECORD
    assert [e.batch_index for e in r.record_errors] == [1, 3]
    assert all("without key" in e.message for e in r.record_errors)
    # nothing was written: a batch with keys only goes in at offset 0
    req = log_pb2.ProduceRequest(acks=1, timeout_ms=10_000)
    req.topics.add(name=TOPIC).partitions.add(index=0, records=encode_batch([b"x"], keys=[b"k"]))
    ok = stub.Produce(req, timeout=30).topics[0].partitions[0]
    assert (ok.error_code, ok.base_offset) == (0, 0)
