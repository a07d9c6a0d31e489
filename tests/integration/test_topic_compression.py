"""Topic config ``compression.type`` through real clients: confluent-kafka's CreateTopics,
AlterConfigs (the whole-set API librdkafka 2.0 uses) and IncrementalAlterConfigs on the
Kafka door, kclient's admin over gRPC; the leader stores batches in the topic's codec,
and the broker-wide ``compression.type`` is the default of every topic."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2
from kclient.records import Compression, decode_batches, encode_batch
from tests.support import wait_until

ck = pytest.importorskip("confluent_kafka")
ck_admin = pytest.importorskip("confluent_kafka.admin")

pytestmark = pytest.mark.integration

DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}


@pytest.fixture
def door(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(1, **DOOR)


def _ck_admin(cluster: LocalCluster) -> object:
    return ck_admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap()})


def _topic_config(admin: object, topic: str) -> dict[str, str]:
    res = ck_admin.ConfigResource(ck_admin.ResourceType.TOPIC, topic)
    entries = admin.describe_configs([res])[res].result(timeout=30)  # type: ignore[attr-defined]
    return {k: v.value for k, v in entries.items()}


def _stored_codecs(cluster: LocalCluster, topic: str, batch: bytes) -> list[tuple[Compression, list[bytes | None]]]:
    stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.bootstrap))
    req = log_pb2.ProduceRequest(acks=1, timeout_ms=10_000)
    req.topics.add(name=topic).partitions.add(index=0, records=batch)
    r = stub.Produce(req, timeout=30).topics[0].partitions[0]
    assert r.error_code == 0, r
    fetch = log_pb2.FetchRequest(max_wait_ms=0)
    fetch.topics.add(name=topic).partitions.add(index=0, fetch_offset=r.base_offset)
    data = stub.Fetch(fetch, timeout=30).topics[0].partitions[0].records
    return [(h.compression, [x.value for x in recs]) for h, recs in decode_batches(data)]


VALUES = [b"payload-%d" % i * 10 for i in range(20)]


def test_create_topics_with_compression_type_on_the_kafka_door(door: LocalCluster) -> None:
    admin = _ck_admin(door)
    fs = admin.create_topics(  # type: ignore[attr-defined]
        [ck_admin.NewTopic("zipped", 1, 1, config={"compression.type": "gzip"})], operation_timeout=30
    )
    fs["zipped"].result(timeout=30)
    assert _topic_config(admin, "zipped")["compression.type"] == "gzip"
    assert _stored_codecs(door, "zipped", encode_batch(VALUES)) == [(Compression.GZIP, VALUES)]


def test_alter_configs_sets_compression_type(door: LocalCluster) -> None:
    admin = _ck_admin(door)
    fs = admin.create_topics([ck_admin.NewTopic("plain", 1, 1, config={"retention.ms": "12345"})])  # type: ignore[attr-defined]
    fs["plain"].result(timeout=30)
    assert _topic_config(admin, "plain")["compression.type"] == "producer"
    res = ck_admin.ConfigResource(ck_admin.ResourceType.TOPIC, "plain", set_config={"compression.type": "lz4"})
    admin.alter_configs([res])[res].result(timeout=30)  # type: ignore[attr-defined]
    after = _topic_config(admin, "plain")
    assert after["compression.type"] == "lz4"
    assert after["retention.ms"] == "604800000"  # AlterConfigs sets the whole set: the override is gone
    sent = encode_batch(VALUES, compression=Compression.ZSTD)
    # The log takes the new codec by the change notification, a moment after the answer.
    wait_until(lambda: _stored_codecs(door, "plain", sent) == [(Compression.LZ4, VALUES)], 30, "lz4 applied")


def test_incremental_alter_configs_sets_compression_type(door: LocalCluster) -> None:
    admin = _ck_admin(door)
    admin.create_topics([ck_admin.NewTopic("inc", 1, 1)])["inc"].result(timeout=30)  # type: ignore[attr-defined]
    res = ck_admin.ConfigResource(
        ck_admin.ResourceType.TOPIC,
        "inc",
        incremental_configs=[
            ck_admin.ConfigEntry(
                "compression.type", "uncompressed", incremental_operation=ck_admin.AlterConfigOpType.SET
            )
        ],
    )
    admin.incremental_alter_configs([res])[res].result(timeout=30)  # type: ignore[attr-defined]
    sent = encode_batch(VALUES, compression=Compression.GZIP)
    # The change reaches the partition's log by ZooKeeper's change notification, a moment
    # after the answer (as in Kafka): batches written meanwhile keep the old codec.
    wait_until(
        lambda: _stored_codecs(door, "inc", sent) == [(Compression.NONE, VALUES)], 30, "compression.type applied"
    )


def test_unknown_compression_type_is_refused(door: LocalCluster) -> None:
    with AdminClient(bootstrap_servers=door.bootstrap) as admin:
        with pytest.raises(Exception, match=r"compression\.type"):
            admin.create_topics([NewTopic("bad", 1, 1, topic_configs={"compression.type": "brotli"})])


def test_broker_compression_type_is_the_topic_default(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **{"compression.type": "zstd"})
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("defaulted", 1, 1)])
    assert _stored_codecs(cluster, "defaulted", encode_batch(VALUES)) == [(Compression.ZSTD, VALUES)]
