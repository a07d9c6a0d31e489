"""DescribeConfigs / IncrementalAlterConfigs and ``kctl configs`` against real brokers and ZooKeeper."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from kbroker.cluster.zk_client import ZkClient
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from kclient.errors import InvalidConfigurationError, InvalidRequestError, UnknownTopicOrPartitionError
from kclient.proto.kbroker.v1 import broker_pb2_grpc, config_pb2
from tests.integration.test_kctl import conn, fails, kctl, ok

pytestmark = pytest.mark.integration

TOPIC, BROKER = config_pb2.TOPIC, config_pb2.BROKER
SET, DELETE, APPEND, SUBTRACT = config_pb2.SET, config_pb2.DELETE, config_pb2.APPEND, config_pb2.SUBTRACT
SRC = config_pb2.ConfigSource


@pytest.fixture
def zk(zk_connect: str) -> Iterator[ZkClient]:
    client = ZkClient(zk_connect)
    client.start()
    yield client
    client.close()


def _changes(zk: ZkClient) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for child in zk.config_changes():
        found = zk.config_change(child)
        if found is not None:
            out.append(found[:2])
    return out


def _source(entry: config_pb2.DescribeConfigsResourceResult) -> str:
    return SRC.Name(entry.config_source)


def _topic_config_on_broker(admin: AdminClient, topic: str, key: str, want: str | None) -> None:
    """Wait until the brokers' metadata (DescribeTopics) shows ``key`` = ``want`` (None: unset)."""
    deadline = time.monotonic() + 30
    while True:
        configs = admin.describe_topics([topic])[0].configs
        if configs.get(key) == want:
            return
        assert time.monotonic() < deadline, f"{topic} {key} is {configs.get(key)!r}, want {want!r}"
        time.sleep(0.2)


def test_topic_configs_round_trip_and_refusals(cluster_factory: Callable[..., LocalCluster], zk: ZkClient) -> None:
    cluster = cluster_factory(2, **{"log.segment.bytes": "2000000"})
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("cfg", 1, 2)])
        res = (TOPIC, "cfg")
        before = len(_changes(zk))

        admin.incremental_alter_configs({res: [("retention.ms", SET, "1000"), ("cleanup.policy", SET, "compact")]})
        assert zk.entity_config("topics", "cfg")[0] == {"retention.ms": "1000", "cleanup.policy": "compact"}
        assert _changes(zk)[before:] == [("topics", "cfg")]
        entries = admin.describe_configs([res], include_synonyms=True)[res]
        r = entries["retention.ms"]
        assert (r.value, _source(r), r.is_default, r.read_only, r.is_sensitive) == (
            "1000",
            "TOPIC_CONFIG",
            False,
            False,
            False,
        )
        assert [(SRC.Name(s.source), s.name, s.value) for s in r.synonyms] == [
            ("TOPIC_CONFIG", "retention.ms", "1000"),
            ("DEFAULT_CONFIG", "log.retention.ms", "604800000"),
        ]
        # The broker's static log.segment.bytes is the topic's default; Kafka's otherwise.
        s = entries["segment.bytes"]
        assert (s.value, _source(s)) == ("2000000", "STATIC_BROKER_CONFIG")
        assert (entries["segment.ms"].value, _source(entries["segment.ms"])) == ("604800000", "DEFAULT_CONFIG")
        assert entries["segment.ms"].is_default
        _topic_config_on_broker(admin, "cfg", "retention.ms", "1000")  # live: the brokers' cache sees it

        admin.incremental_alter_configs({res: [("cleanup.policy", APPEND, "delete")]})
        assert zk.entity_config("topics", "cfg")[0]["cleanup.policy"] == "compact,delete"
        admin.incremental_alter_configs({res: [("cleanup.policy", SUBTRACT, "compact")]})
        assert zk.entity_config("topics", "cfg")[0]["cleanup.policy"] == "delete"

        admin.incremental_alter_configs({res: [("retention.ms", DELETE, None), ("not.set.anywhere.ms", DELETE, None)]})
        assert zk.entity_config("topics", "cfg")[0] == {"cleanup.policy": "delete"}
        r = admin.describe_configs([res])[res]["retention.ms"]
        assert (r.value, _source(r), list(r.synonyms)) == ("604800000", "DEFAULT_CONFIG", [])
        _topic_config_on_broker(admin, "cfg", "retention.ms", None)
        assert _changes(zk)[before:] == [("topics", "cfg")] * 4

        # Refused: nothing written, no notification.
        znode = zk.entity_config("topics", "cfg")
        count = len(_changes(zk))
        with pytest.raises(InvalidConfigurationError, match=r"Unknown topic config name: retention\.mss"):
            admin.incremental_alter_configs({res: [("segment.ms", SET, "1000"), ("retention.mss", SET, "1")]})
        with pytest.raises(InvalidConfigurationError, match=r"min\.insync\.replicas"):
            admin.incremental_alter_configs({res: [("min.insync.replicas", SET, "zero")]})
        with pytest.raises(InvalidRequestError, match=r"append is not allowed for config key: retention\.ms"):
            admin.incremental_alter_configs({res: [("retention.ms", APPEND, "1")]})
        with pytest.raises(InvalidRequestError, match="duplicate"):
            admin.incremental_alter_configs({res: [("retention.ms", SET, "1"), ("retention.ms", DELETE, None)]})
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.incremental_alter_configs({(TOPIC, "no-such-topic"): [("retention.ms", SET, "1")]})
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.describe_configs([(TOPIC, "no-such-topic")])
        admin.incremental_alter_configs({res: [("retention.ms", SET, "5")]}, validate_only=True)
        assert zk.entity_config("topics", "cfg") == znode
        assert len(_changes(zk)) == count


def test_broker_configs_per_id_and_default(cluster_factory: Callable[..., LocalCluster], zk: ZkClient) -> None:
    cluster = cluster_factory(2, **{"log.retention.bytes": "123456789"})
    with AdminClient(cluster.bootstrap) as admin:
        before = len(_changes(zk))
        admin.incremental_alter_configs(
            {
                (BROKER, "1"): [
                    ("log.retention.ms", SET, "1000"),
                    ("follower.replication.throttled.rate", SET, "1024"),
                ],
                (BROKER, ""): [("log.retention.ms", SET, "2000"), ("log.cleaner.threads", SET, "2")],
            }
        )
        assert zk.entity_config("brokers", "1")[0] == {
            "log.retention.ms": "1000",
            "follower.replication.throttled.rate": "1024",
        }
        assert zk.entity_config("brokers", "<default>")[0] == {"log.retention.ms": "2000", "log.cleaner.threads": "2"}
        assert _changes(zk)[before:] == [("brokers", "1"), ("brokers", "<default>")]

        one = admin.describe_configs([(BROKER, "1")], include_synonyms=True)[(BROKER, "1")]
        e = one["log.retention.ms"]
        assert [(SRC.Name(s.source), s.value) for s in e.synonyms] == [
            ("DYNAMIC_BROKER_CONFIG", "1000"),
            ("DYNAMIC_DEFAULT_BROKER_CONFIG", "2000"),
            ("DEFAULT_CONFIG", "604800000"),
        ]
        assert (one["log.cleaner.threads"].value, _source(one["log.cleaner.threads"])) == (
            "2",
            "DYNAMIC_DEFAULT_BROKER_CONFIG",
        )
        assert (one["log.retention.bytes"].value, _source(one["log.retention.bytes"])) == (
            "123456789",
            "STATIC_BROKER_CONFIG",
        )
        zero = admin.describe_configs([(BROKER, "0")])[(BROKER, "0")]
        assert (zero["log.retention.ms"].value, _source(zero["log.retention.ms"])) == (
            "2000",
            "DYNAMIC_DEFAULT_BROKER_CONFIG",
        )
        default = admin.describe_configs([(BROKER, "")])[(BROKER, "")]
        assert sorted(default) == ["log.cleaner.threads", "log.retention.ms"]

        count = len(_changes(zk))
        with pytest.raises(InvalidRequestError, match="Cannot update these configs dynamically"):
            admin.incremental_alter_configs({(BROKER, "1"): [("num.partitions", SET, "3")]})
        with pytest.raises(InvalidConfigurationError, match=r"log\.retention\.ms"):
            admin.incremental_alter_configs({(BROKER, ""): [("log.retention.ms", SET, "soon")]})
        assert len(_changes(zk)) == count
        assert zk.entity_config("brokers", "<default>")[0] == {"log.retention.ms": "2000", "log.cleaner.threads": "2"}

        admin.incremental_alter_configs({(BROKER, "1"): [("log.retention.ms", DELETE, None)]})
        e = admin.describe_configs([(BROKER, "1")])[(BROKER, "1")]["log.retention.ms"]
        assert (e.value, _source(e)) == ("2000", "DYNAMIC_DEFAULT_BROKER_CONFIG")


@pytest.mark.parametrize("mode", ["bootstrap", "zookeeper"])
def test_kctl_configs(cluster: LocalCluster, mode: str) -> None:
    c = conn(cluster, mode)
    ok(kctl(c, "topics create --topic kc --partitions 1 --replication-factor 1"))
    alter = f"configs {c} --alter --entity-type topics --entity-name kc"
    describe = f"configs {c} --describe --entity-type topics --entity-name kc"
    out = ok(kctl(alter, "--add-config retention.ms=1000,cleanup.policy=[compact,delete]"))
    if mode == "bootstrap":
        assert out == "Completed updating config for topic kc.\n"
        assert ok(kctl(describe)).splitlines() == [
            "Dynamic configs for topic kc are:",
            "  cleanup.policy=compact,delete sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy="
            "compact,delete, DEFAULT_CONFIG:log.cleanup.policy=delete}",
            "  retention.ms=1000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=1000, "
            "DEFAULT_CONFIG:log.retention.ms=604800000}",
        ]
        all_lines = ok(kctl(describe, "--all")).splitlines()
        assert all_lines[0] == "All configs for topic kc are:"
        assert "  segment.ms=604800000 sensitive=false synonyms={DEFAULT_CONFIG:log.roll.ms=604800000}" in all_lines
    else:
        assert out == "Completed updating config for entity: topic 'kc'.\n"
        assert ok(kctl(describe)) == "Configs for topic 'kc' are cleanup.policy=compact,delete,retention.ms=1000\n"

    ok(kctl(alter, "--delete-config retention.ms"))
    if mode == "bootstrap":
        assert ok(kctl(describe)).splitlines()[1:] == [
            "  cleanup.policy=compact,delete sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy="
            "compact,delete, DEFAULT_CONFIG:log.cleanup.policy=delete}"
        ]
    else:
        assert ok(kctl(describe)) == "Configs for topic 'kc' are cleanup.policy=compact,delete\n"

    # Failures: one kctl: line, exit 1, nothing changed.
    fails(kctl(alter, "--delete-config retention.ms"), mentions="Invalid config(s): retention.ms")
    fails(kctl(alter, "--add-config retention.ms=soon"), mentions="retention.ms")
    fails(kctl(alter, "--add-config no.such=1"), mentions="Unknown topic config name: no.such")
    fails(kctl(f"configs {c} --alter --entity-type topics --entity-name nope --add-config retention.ms=1"))
    # Usage errors: exit 2.
    fails(kctl(alter, "--add-config retention.ms"), code=2, mentions="key=val")
    fails(kctl(alter), code=2, mentions="--add-config")
    fails(
        kctl(f"configs {c} --alter --entity-type brokers --add-config log.retention.ms=1"), code=2, mentions="--entity"
    )
    fails(kctl(f"configs {c} --describe --entity-type brokers --entity-name x"), code=2, mentions="broker is its id")
    fails(kctl(f"configs {c} --describe --entity-type topics --entity-name kc --entity-default"), code=2)
    fails(kctl("configs --describe --entity-type topics --entity-name kc"), code=2, mentions="neither")

    brokers = f"configs {c} --alter --entity-type brokers"
    if mode == "bootstrap":
        assert ok(kctl(brokers, "--entity-name 0 --add-config log.cleaner.threads=2")) == (
            "Completed updating config for broker 0.\n"
        )
        assert ok(kctl(brokers, "--entity-default --add-config log.retention.ms=1000")) == (
            "Completed updating default config for brokers in the cluster.\n"
        )
        assert ok(kctl(f"configs {c} --describe --entity-type brokers --entity-name 0")).splitlines() == [
            "Dynamic configs for broker 0 are:",
            "  log.cleaner.threads=2 sensitive=false synonyms={DYNAMIC_BROKER_CONFIG:log.cleaner.threads=2, "
            "DEFAULT_CONFIG:log.cleaner.threads=1}",
        ]
        assert ok(kctl(f"configs {c} --describe --entity-type brokers --entity-default")).splitlines() == [
            "Default configs for brokers in the cluster are:",
            "  log.retention.ms=1000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=1000, "
            "DEFAULT_CONFIG:log.retention.ms=604800000}",
        ]
    else:
        assert ok(kctl(brokers, "--entity-name 0 --add-config log.cleaner.threads=2")) == (
            "Completed updating config for entity: brokers '0'.\n"
        )
        assert ok(kctl(brokers, "--entity-default --add-config log.retention.ms=1000")) == (
            "Completed updating config for entity: brokers '<default>'.\n"
        )
        assert ok(kctl(f"configs {c} --describe --entity-type brokers --entity-name 0")) == (
            "Configs for brokers '0' are log.cleaner.threads=2\n"
        )
        assert ok(kctl(f"configs {c} --describe --entity-type brokers --entity-default")) == (
            "Configs for brokers '<default>' are log.retention.ms=1000\n"
        )
    fails(kctl(brokers, "--entity-name 0 --add-config num.partitions=3"), mentions="dynamically")

    # Without --entity-name: every entity (brokers: each broker, then the cluster default).
    every = ok(kctl(f"configs {c} --describe --entity-type brokers")).splitlines()
    topics = ok(kctl(f"configs {c} --describe --entity-type topics")).splitlines()
    if mode == "bootstrap":
        assert [line for line in every if not line.startswith("  ")] == [
            "Dynamic configs for broker 0 are:",
            "Default configs for brokers in the cluster are:",
        ]
        assert len(every) == 4
        assert topics[0] == "Dynamic configs for topic kc are:" and len(topics) == 2
    else:
        assert every == [
            "Configs for brokers '0' are log.cleaner.threads=2",
            "Configs for brokers '<default>' are log.retention.ms=1000",
        ]
        assert topics == ["Configs for topic 'kc' are cleanup.policy=compact,delete"]


def test_raw_requests_refuse_duplicates_unknown_types_and_ops(cluster: LocalCluster, zk: ZkClient) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("raw", 1, 1)])
    with grpc.insecure_channel(cluster.bootstrap.split(",")[0]) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        req = config_pb2.IncrementalAlterConfigsRequest()
        for _ in range(2):
            r = req.resources.add(resource_type=TOPIC, resource_name="raw")
            r.configs.add(name="retention.ms", value="1")
        r = req.resources.add(resource_type=3, resource_name="raw")
        r = req.resources.add(resource_type=BROKER, resource_name="0")
        r.configs.add(name="log.retention.ms", config_operation=9, value="1")
        r = req.resources.add(resource_type=BROKER, resource_name="one")
        resp = stub.IncrementalAlterConfigs(req, timeout=30)
        assert [(x.error_code, x.resource_name) for x in resp.responses] == [
            (InvalidRequestError.errno, "raw"),
            (InvalidRequestError.errno, "raw"),
            (InvalidRequestError.errno, "raw"),
            (InvalidRequestError.errno, "0"),
            (InvalidRequestError.errno, "one"),
        ]
        assert "Duplicate resources" in resp.responses[0].error_message
        assert "Unknown config operation" in resp.responses[3].error_message
        assert zk.entity_config("topics", "raw")[0] == {}
        assert zk.entity_config("brokers", "0") == ({}, -1)
        # Unset operation = SET; the answer keeps the request's order.
        req = config_pb2.IncrementalAlterConfigsRequest()
        req.resources.add(resource_type=TOPIC, resource_name="raw").configs.add(name="retention.ms", value="7")
        req.resources.add(resource_type=TOPIC, resource_name="gone").configs.add(name="retention.ms", value="7")
        resp = stub.IncrementalAlterConfigs(req, timeout=30)
        assert [x.error_code for x in resp.responses] == [0, UnknownTopicOrPartitionError.errno]
        assert zk.entity_config("topics", "raw")[0] == {"retention.ms": "7"}
        d = stub.DescribeConfigs(
            config_pb2.DescribeConfigsRequest(
                resources=[
                    config_pb2.DescribeConfigsResource(
                        resource_type=TOPIC, resource_name="raw", configuration_keys=["retention.ms"]
                    ),
                    config_pb2.DescribeConfigsResource(resource_type=0, resource_name="raw"),  # type: ignore[arg-type]
                ]
            ),
            timeout=30,
        )
        assert [(c.name, c.value) for c in d.results[0].configs] == [("retention.ms", "7")]
        assert list(d.results[0].configs[0].synonyms) == []  # include_synonyms unset = false
        assert d.results[1].error_code == InvalidRequestError.errno
