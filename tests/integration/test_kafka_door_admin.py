"""Administration through the Kafka-protocol door with real admin clients: confluent-kafka's
AdminClient (librdkafka) and kafka-python's KafkaAdminClient, checked against what the
gRPC side (kclient) sees, since both doors serve the same core."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from tests.kafka_wire import WireClient
from tests.support import wait_until

ck = pytest.importorskip("confluent_kafka")
ck_admin = pytest.importorskip("confluent_kafka.admin")

pytestmark = pytest.mark.integration

DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}


def _results(futures: dict[object, object], timeout_s: float = 60) -> dict[object, object]:
    return {k: f.result(timeout_s) for k, f in futures.items()}  # type: ignore[attr-defined]


def _grpc_topics(cluster: LocalCluster) -> dict[str, object]:
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        return {t.name: t for t in admin.describe_topics()}


def _grpc_topics_once(cluster: LocalCluster, ready: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """The gRPC view once ``ready`` holds: the broker that answered the Kafka door's
    request has the change, another one learns it a moment later (as in Kafka, whose
    tests wait for every broker's metadata too)."""
    seen: dict[str, Any] = {}

    def check() -> bool:
        seen.clear()
        seen.update(_grpc_topics(cluster))
        return ready(seen)

    wait_until(check, what=what)
    return seen


@pytest.fixture
def cluster(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(2, **DOOR)


def test_confluent_admin_creates_describes_alters_and_deletes_topics(cluster: LocalCluster) -> None:
    admin = ck_admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap()})
    NewTopic_ = ck_admin.NewTopic

    # validate_only creates nothing; a bad config is refused per topic
    checked = admin.create_topics(
        [NewTopic_("dry", 3, 2, config={"retention.ms": "60000"})], validate_only=True, operation_timeout=30
    )
    assert _results(checked) == {"dry": None}
    bad = admin.create_topics([NewTopic_("bad", 1, 1, config={"no.such.config": "1"})], operation_timeout=30)
    with pytest.raises(ck.KafkaException) as info:
        bad["bad"].result(30)
    assert info.value.args[0].code() == ck.KafkaError.INVALID_CONFIG
    assert "dry" not in _grpc_topics(cluster) and "bad" not in _grpc_topics(cluster)

    created = admin.create_topics(
        [
            NewTopic_("events", 3, 2, config={"retention.ms": "60000", "cleanup.policy": "delete"}),
            NewTopic_("pinned", num_partitions=2, replica_assignment=[[0, 1], [1, 0]]),
        ],
        operation_timeout=30,
    )
    assert _results(created) == {"events": None, "pinned": None}
    seen = _grpc_topics_once(cluster, lambda t: {"events", "pinned"} <= set(t), "both topics over gRPC")
    assert len(seen["events"].partitions) == 3  # type: ignore[attr-defined]
    assert seen["events"].configs["retention.ms"] == "60000"  # type: ignore[attr-defined]
    assert [p.replicas for p in seen["pinned"].partitions] == [[0, 1], [1, 0]]  # type: ignore[attr-defined]
    again = admin.create_topics([NewTopic_("events", 3, 2)], operation_timeout=30)
    with pytest.raises(ck.KafkaException) as info:
        again["events"].result(30)
    assert info.value.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS

    md = admin.list_topics("events", timeout=30)
    assert len(md.topics["events"].partitions) == 3
    described = _results(admin.describe_topics(ck.TopicCollection(["events"])))
    assert [p.id for p in described["events"].partitions] == [0, 1, 2]  # type: ignore[attr-defined]

    # DescribeConfigs: topic (override + defaults with their sources) and broker
    topic_res = ck_admin.ConfigResource(ck_admin.ResourceType.TOPIC, "events")
    configs = _results(admin.describe_configs([topic_res]))[topic_res]
    assert configs["retention.ms"].value == "60000"  # type: ignore[index]
    assert configs["retention.ms"].source == ck_admin.ConfigSource.DYNAMIC_TOPIC_CONFIG.value  # type: ignore[index]
    assert configs["segment.bytes"].is_default  # type: ignore[index]
    broker_res = ck_admin.ConfigResource(ck_admin.ResourceType.BROKER, "1")
    broker_configs = _results(admin.describe_configs([broker_res]))[broker_res]
    assert broker_configs["log.segment.bytes"].value is not None  # type: ignore[index]

    # IncrementalAlterConfigs: SET and DELETE, then read back over gRPC
    alter = ck_admin.ConfigResource(
        ck_admin.ResourceType.TOPIC,
        "events",
        incremental_configs=[
            ck_admin.ConfigEntry("retention.ms", "120000", incremental_operation=ck_admin.AlterConfigOpType.SET),
            ck_admin.ConfigEntry("cleanup.policy", None, incremental_operation=ck_admin.AlterConfigOpType.DELETE),
        ],
    )
    _results(admin.incremental_alter_configs([alter]))
    wait_until(
        lambda: _grpc_topics(cluster)["events"].configs.get("retention.ms") == "120000",  # type: ignore[attr-defined]
        what="the altered config",
    )
    assert "cleanup.policy" not in _grpc_topics(cluster)["events"].configs  # type: ignore[attr-defined]

    # CreatePartitions
    _results(admin.create_partitions([ck_admin.NewPartitions("events", 5)], operation_timeout=30))
    _grpc_topics_once(cluster, lambda t: len(t["events"].partitions) == 5, "5 partitions over gRPC")
    fewer = admin.create_partitions([ck_admin.NewPartitions("events", 2)], operation_timeout=30)
    with pytest.raises(ck.KafkaException) as info:
        fewer["events"].result(30)
    assert info.value.args[0].code() == ck.KafkaError.INVALID_PARTITIONS
    # Explicit replicas of the new partitions (librdkafka's 0081 asks for them).
    rf = len(_grpc_topics(cluster)["events"].partitions[0].replicas)  # type: ignore[attr-defined]
    chosen = sorted(cluster.brokers)[-rf:]
    _results(
        admin.create_partitions(
            [ck_admin.NewPartitions("events", 6, replica_assignment=[chosen])], operation_timeout=30
        )
    )
    now = _grpc_topics_once(cluster, lambda t: len(t["events"].partitions) == 6, "6 partitions over gRPC")
    grown = {p.partition: list(p.replicas) for p in now["events"].partitions}
    assert len(grown) == 6 and grown[5] == chosen
    unknown = admin.create_partitions(
        [ck_admin.NewPartitions("events", 7, replica_assignment=[[99] * rf])], operation_timeout=30
    )
    with pytest.raises(ck.KafkaException) as info:
        unknown["events"].result(30)
    assert info.value.args[0].code() == ck.KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert len(_grpc_topics(cluster)["events"].partitions) == 6  # type: ignore[attr-defined]

    # DeleteTopics
    _results(admin.delete_topics(["events", "pinned"], operation_timeout=30))
    wait_until(lambda: not {"events", "pinned"} & set(_grpc_topics(cluster)), what="the topics gone")
    gone = admin.delete_topics(["events"], operation_timeout=30)
    with pytest.raises(ck.KafkaException) as info:
        gone["events"].result(30)
    assert info.value.args[0].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART


def test_confluent_admin_deletes_records(cluster: LocalCluster) -> None:
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("trim", 2, 2)])
    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap(), "acks": "all"})
    for i in range(20):
        producer.produce("trim", value=str(i).encode(), partition=i % 2)
    assert producer.flush(30) == 0

    admin = ck_admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap()})
    deleted = _results(
        admin.delete_records([ck.TopicPartition("trim", 0, 4), ck.TopicPartition("trim", 1, -1)], operation_timeout=30)
    )
    assert {tp.partition: r.low_watermark for tp, r in deleted.items()} == {0: 4, 1: 10}  # type: ignore[attr-defined]
    consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap(), "group.id": "unused"})
    low, high = consumer.get_watermark_offsets(ck.TopicPartition("trim", 0), timeout=30)
    consumer.close()
    assert (low, high) == (4, 10)
    beyond = admin.delete_records([ck.TopicPartition("trim", 0, 99)], operation_timeout=30)
    with pytest.raises(ck.KafkaException) as info:
        next(iter(beyond.values())).result(30)
    assert info.value.args[0].code() == ck.KafkaError.OFFSET_OUT_OF_RANGE


def test_kafka_python_admin_client(cluster: LocalCluster) -> None:
    kafka_admin = pytest.importorskip("kafka.admin")
    admin = kafka_admin.KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap(), request_timeout_ms=30000)
    try:
        admin.create_topics(
            [kafka_admin.NewTopic("kp", 2, 2, topic_configs={"retention.ms": "90000"})], timeout_ms=30000
        )
        assert "kp" in admin.list_topics()
        described = admin.describe_configs([kafka_admin.ConfigResource(kafka_admin.ConfigResourceType.TOPIC, "kp")])
        assert described["topic"]["kp"]["retention.ms"]["value"] == "90000", described
        admin.delete_topics(["kp"], timeout_ms=30000)
        wait_until(lambda: "kp" not in admin.list_topics(), what="kp deleted")
    finally:
        admin.close()


def test_wire_create_topics_v7_answers_counts_configs_and_topic_id(cluster: LocalCluster) -> None:
    address = cluster.kafka_bootstrap().split(",")[0]
    with WireClient(address) as wire:
        resp = wire.call(
            19,
            7,
            {
                "topics": [
                    {
                        "name": "wired",
                        "num_partitions": -1,
                        "replication_factor": -1,
                        "configs": [{"name": "retention.ms", "value": "70000"}],
                    }
                ],
                "timeout": 30000,
            },
        )
        [t] = resp.topics
        assert t.error_code == 0 and t.num_partitions >= 1 and t.replication_factor >= 1
        assert t.topic_id.int != 0
        configs = {c.name: c for c in t.configs}
        assert configs["retention.ms"].value == "70000" and configs["retention.ms"].config_source == 1
        assert str(t.topic_id) == str(_uuid_of(cluster, "wired"))

        dry = wire.call(
            19, 7, {"topics": [{"name": "dry", "num_partitions": 4, "replication_factor": 1}], "validate_only": True}
        )
        assert dry.topics[0].error_code == 0 and dry.topics[0].num_partitions == 4

        unclean = wire.call(43, 2, {"election_type": 1, "topic_partitions": None, "timeout": 1000})
        assert unclean.error_code == 42  # INVALID_REQUEST: only preferred elections
        preferred = wire.call(
            43, 2, {"election_type": 0, "topic_partitions": [{"topic": "wired", "partitions": [0]}], "timeout": 30000}
        )
        assert preferred.error_code == 0
        assert [
            (r.topic, [p.partition_id for p in r.partition_result]) for r in preferred.replica_election_results
        ] == [("wired", [0])]
        listed = wire.call(46, 0, {"topics": None, "timeout": 30000})
        assert listed.error_code in (0, 41)  # NOT_CONTROLLER when this broker is not the controller
        dirs = wire.call(35, 4, {"topics": None})
        assert dirs.error_code == 0 and dirs.results and dirs.results[0].total_bytes > 0


def _uuid_of(cluster: LocalCluster, topic: str) -> object:
    import base64
    import uuid

    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        [d] = admin.describe_topics([topic])
    tid = d.topic_id
    return uuid.UUID(bytes=base64.urlsafe_b64decode(tid + "=" * (-len(tid) % 4)))


def test_api_versions_lists_the_admin_and_security_apis(cluster: LocalCluster) -> None:
    address = cluster.kafka_bootstrap().split(",")[0]
    with WireClient(address) as wire:
        resp = wire.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
    served = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}
    for key, versions in {
        19: (2, 7),
        20: (1, 5),
        21: (0, 2),
        32: (1, 4),
        37: (0, 3),
        43: (0, 2),
        33: (0, 2),
        44: (0, 1),
        17: (0, 1),
        36: (0, 2),
        29: (1, 3),
        30: (1, 3),
        31: (1, 3),
        50: (0, 0),
        51: (0, 0),
    }.items():
        assert served[key] == versions, key
