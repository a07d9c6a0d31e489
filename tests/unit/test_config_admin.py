"""ConfigAdmin (DescribeConfigs / IncrementalAlterConfigs over ZooKeeper) against a fake ZkClient."""

from __future__ import annotations

import pytest
from kazoo.exceptions import BadVersionError

from kbroker.cli.common import UsageError
from kbroker.cli.configs import parse_add_config
from kbroker.cluster.config_admin import (
    AlterOp,
    ConfigAdmin,
    ConfigEntry,
    ConfigSource,
    OpType,
    ResourceType,
    apply_ops,
    static_broker_configs,
)
from kbroker.cluster.zk_client import ZkClient
from kbroker.storage.log_config import LogConfig
from kclient.errors import InvalidConfigurationError, InvalidRequestError, UnknownTopicOrPartitionError

TOPIC, BROKER = ResourceType.TOPIC, ResourceType.BROKER
SET, DELETE, APPEND, SUBTRACT = OpType.SET, OpType.DELETE, OpType.APPEND, OpType.SUBTRACT


class FakeZk:
    """The ZkClient calls ConfigAdmin makes (connected: ``require_connection`` passes);
    ``writes`` records each set_entity_config."""

    def __init__(self, topics: tuple[str, ...] = ("t",)) -> None:
        self.topics = set(topics)
        self.configs: dict[tuple[str, str], tuple[dict[str, str], int]] = {}
        self.writes: list[tuple[str, str, dict[str, str]]] = []
        self.conflicts = 0

    def await_connection(self, wait_s: float) -> bool:
        return True

    require_connection = ZkClient.require_connection

    def topic_exists(self, topic: str) -> bool:
        return topic in self.topics

    def entity_config(self, entity_type: str, name: str) -> tuple[dict[str, str], int]:
        config, version = self.configs.get((entity_type, name), ({}, -1))
        return dict(config), version

    def set_entity_config(self, entity_type: str, name: str, config: dict[str, str], version: int) -> int:
        if self.conflicts:
            self.conflicts -= 1
            current, v = self.configs.get((entity_type, name), ({}, -1))
            self.configs[(entity_type, name)] = ({**current, "retention.ms": "5"}, v + 1)  # a concurrent writer
            raise BadVersionError()
        assert self.configs.get((entity_type, name), ({}, -1))[1] == version
        self.configs[(entity_type, name)] = (dict(config), version + 1)
        self.writes.append((entity_type, name, dict(config)))
        return version + 1


def admin(zk: FakeZk, **kw: object) -> ConfigAdmin:
    return ConfigAdmin(zk, **kw)  # type: ignore[arg-type]


# --- apply_ops --------------------------------------------------------------------------


def test_apply_ops_set_delete_append_subtract() -> None:
    lists = frozenset({"cleanup.policy"})
    out = apply_ops(
        {"retention.ms": "1", "segment.ms": "9"},
        [AlterOp("retention.ms", SET, "2"), AlterOp("segment.ms", DELETE), AlterOp("absent", DELETE)],
        lists,
        {},
    )
    assert out == {"retention.ms": "2"}
    assert apply_ops({}, [AlterOp("cleanup.policy", APPEND, "compact")], lists, {"cleanup.policy": "delete"}) == {
        "cleanup.policy": "delete,compact"
    }
    assert apply_ops(
        {"cleanup.policy": "compact,delete"}, [AlterOp("cleanup.policy", SUBTRACT, "delete")], lists, {}
    ) == {"cleanup.policy": "compact"}
    # APPEND of an item already there adds nothing
    assert apply_ops({"cleanup.policy": "compact"}, [AlterOp("cleanup.policy", APPEND, "compact")], lists, {}) == {
        "cleanup.policy": "compact"
    }


@pytest.mark.parametrize(
    "ops, message",
    [
        ([AlterOp("a", SET, "1"), AlterOp("a", DELETE)], "duplicate config keys"),
        ([AlterOp("retention.ms", APPEND, "1")], "append is not allowed for config key: retention.ms"),
        ([AlterOp("retention.ms", SUBTRACT, "1")], "subtract is not allowed for config key: retention.ms"),
        ([AlterOp("retention.ms", SET, None)], "missing"),
    ],
)
def test_apply_ops_refuses(ops: list[AlterOp], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        apply_ops({}, ops, frozenset({"cleanup.policy"}), {})


# --- topic alter ------------------------------------------------------------------------


def test_topic_set_and_delete_written_once_with_notification_call() -> None:
    zk = FakeZk()
    a = admin(zk)
    a.incremental_alter(TOPIC, "t", [AlterOp("retention.ms", SET, "1000"), AlterOp("cleanup.policy", SET, "compact")])
    assert zk.writes == [("topics", "t", {"retention.ms": "1000", "cleanup.policy": "compact"})]
    a.incremental_alter(TOPIC, "t", [AlterOp("retention.ms", DELETE), AlterOp("cleanup.policy", APPEND, "delete")])
    assert zk.writes[-1] == ("topics", "t", {"cleanup.policy": "compact,delete"})


def test_topic_append_starts_from_the_broker_default() -> None:
    zk = FakeZk()
    admin(zk, static_broker={"log.cleanup.policy": "compact"}).incremental_alter(
        TOPIC, "t", [AlterOp("cleanup.policy", APPEND, "delete")]
    )
    assert zk.writes == [("topics", "t", {"cleanup.policy": "compact,delete"})]


@pytest.mark.parametrize(
    "op, error, message",
    [
        (AlterOp("no.such.config", SET, "1"), InvalidConfigurationError, "Unknown topic config name: no.such.config"),
        (AlterOp("retention.ms", SET, "soon"), InvalidConfigurationError, "retention.ms: not an integer"),
        (AlterOp("min.insync.replicas", SET, "0"), InvalidConfigurationError, "must be between 1 and"),
        (AlterOp("cleanup.policy", SET, "forever"), InvalidConfigurationError, "cleanup.policy"),
        (AlterOp("cleanup.policy", SUBTRACT, "delete"), InvalidConfigurationError, "cleanup.policy"),  # empty list
        (AlterOp("retention.ms", APPEND, "1"), InvalidRequestError, "append is not allowed"),
    ],
)
def test_topic_refused_changes_nothing(op: AlterOp, error: type[Exception], message: str) -> None:
    zk = FakeZk()
    zk.configs[("topics", "t")] = ({"retention.ms": "7"}, 0)
    with pytest.raises(error, match=message):
        admin(zk).incremental_alter(TOPIC, "t", [AlterOp("segment.ms", SET, "100"), op])
    assert zk.writes == []
    assert zk.configs[("topics", "t")] == ({"retention.ms": "7"}, 0)


def test_unknown_topic() -> None:
    zk = FakeZk()
    with pytest.raises(UnknownTopicOrPartitionError):
        admin(zk).incremental_alter(TOPIC, "nope", [AlterOp("retention.ms", SET, "1")])
    with pytest.raises(UnknownTopicOrPartitionError):
        admin(zk).describe(TOPIC, "nope")
    assert zk.writes == []


def test_delete_of_unset_key_is_fine_and_validate_only_writes_nothing() -> None:
    zk = FakeZk()
    a = admin(zk)
    a.incremental_alter(TOPIC, "t", [AlterOp("retention.ms", DELETE)])
    a.incremental_alter(TOPIC, "t", [AlterOp("retention.ms", SET, "1")], validate_only=True)
    assert zk.writes == []
    with pytest.raises(InvalidConfigurationError):
        a.incremental_alter(TOPIC, "t", [AlterOp("retention.ms", SET, "x")], validate_only=True)


def test_concurrent_change_is_reapplied_not_lost() -> None:
    zk = FakeZk()
    zk.conflicts = 1
    admin(zk).incremental_alter(TOPIC, "t", [AlterOp("segment.ms", SET, "100")])
    assert zk.configs[("topics", "t")][0] == {"retention.ms": "5", "segment.ms": "100"}


# --- broker alter -----------------------------------------------------------------------


def test_broker_per_id_and_default_entities() -> None:
    zk = FakeZk()
    a = admin(zk)
    a.incremental_alter(BROKER, "1", [AlterOp("log.retention.ms", SET, "1000")])
    a.incremental_alter(BROKER, "", [AlterOp("log.cleaner.threads", SET, "2")])
    a.incremental_alter(BROKER, "<default>", [AlterOp("follower.replication.throttled.rate", SET, "1048576")])
    assert zk.configs[("brokers", "1")][0] == {"log.retention.ms": "1000"}
    assert zk.configs[("brokers", "<default>")][0] == {
        "log.cleaner.threads": "2",
        "follower.replication.throttled.rate": "1048576",
    }
    a.incremental_alter(BROKER, "1", [AlterOp("log.retention.ms", DELETE)])
    assert zk.configs[("brokers", "1")][0] == {}


@pytest.mark.parametrize(
    "op, error, message",
    [
        (AlterOp("num.partitions", SET, "3"), InvalidRequestError, r"Cannot update these configs dynamically: \[num"),
        (AlterOp("log.cleaner.enable", SET, "false"), InvalidRequestError, "dynamically"),
        (AlterOp("log.retention.ms", SET, "x"), InvalidConfigurationError, "configuration log.retention.ms: not an"),
        (AlterOp("log.cleaner.threads", SET, "0"), InvalidConfigurationError, "log.cleaner.threads"),
        (AlterOp("leader.replication.throttled.rate", SET, "-5"), InvalidConfigurationError, "at least 0"),
        (AlterOp("unclean.leader.election.enable", SET, "maybe"), InvalidConfigurationError, "true or false"),
        (AlterOp("log.retention.ms", APPEND, "1"), InvalidRequestError, "append is not allowed"),
    ],
)
def test_broker_refused_changes_nothing(op: AlterOp, error: type[Exception], message: str) -> None:
    zk = FakeZk()
    with pytest.raises(error, match=message):
        admin(zk).incremental_alter(BROKER, "1", [AlterOp("log.segment.bytes", SET, "1048576"), op])
    assert zk.writes == []


def test_kafkas_dynamic_kerberos_settings_are_stored_without_effect() -> None:
    """librdkafka's admin test sets sasl.kerberos.min.time.before.relogin on a broker, as
    Kafka allows; kbroker has no GSSAPI, so it stores the value, which changes nothing."""
    zk = FakeZk()
    admin(zk).incremental_alter(BROKER, "1", [AlterOp("sasl.kerberos.min.time.before.relogin", SET, "58000")])
    assert zk.writes


def test_broker_name_must_be_an_id_or_default() -> None:
    with pytest.raises(InvalidRequestError):
        admin(FakeZk()).incremental_alter(BROKER, "one", [AlterOp("log.retention.ms", SET, "1")])


# --- describe sources -------------------------------------------------------------------


def _by_name(entries: list[ConfigEntry]) -> dict[str, ConfigEntry]:
    return {e.name: e for e in entries}


def test_topic_describe_every_config_with_its_source_and_synonyms() -> None:
    zk = FakeZk()
    zk.configs[("topics", "t")] = ({"retention.ms": "1000"}, 0)
    zk.configs[("brokers", "1")] = ({"log.segment.bytes": "2000000"}, 0)
    zk.configs[("brokers", "<default>")] = ({"log.segment.bytes": "3000000", "min.insync.replicas": "2"}, 0)
    static = static_broker_configs(LogConfig.from_properties({"segment.bytes": "4000000", "segment.ms": "60000"}))
    assert static == {"log.segment.bytes": "4000000", "log.roll.ms": "60000"}
    entries = _by_name(admin(zk, broker_id=1, static_broker=static).describe(TOPIC, "t"))
    assert set(entries) == set(LogConfig().to_properties())
    r = entries["retention.ms"]
    assert (r.value, r.source, r.is_default) == ("1000", ConfigSource.TOPIC_CONFIG, False)
    assert [(s.source, s.name, s.value) for s in r.synonyms] == [
        (ConfigSource.TOPIC_CONFIG, "retention.ms", "1000"),
        (ConfigSource.DEFAULT_CONFIG, "log.retention.ms", "604800000"),
    ]
    s = entries["segment.bytes"]
    assert (s.value, s.source) == ("2000000", ConfigSource.DYNAMIC_BROKER_CONFIG)
    assert [x.source for x in s.synonyms] == [
        ConfigSource.DYNAMIC_BROKER_CONFIG,
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
        ConfigSource.STATIC_BROKER_CONFIG,
        ConfigSource.DEFAULT_CONFIG,
    ]
    assert (entries["min.insync.replicas"].value, entries["min.insync.replicas"].source) == (
        "2",
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
    )
    assert (entries["segment.ms"].value, entries["segment.ms"].source) == ("60000", ConfigSource.STATIC_BROKER_CONFIG)
    f = entries["file.delete.delay.ms"]
    assert (f.value, f.source, f.is_default) == ("60000", ConfigSource.DEFAULT_CONFIG, True)
    # only the asked keys
    assert [e.name for e in admin(zk).describe(TOPIC, "t", ["retention.ms"])] == ["retention.ms"]


def test_broker_describe_sources_static_only_for_the_answering_broker() -> None:
    zk = FakeZk()
    zk.configs[("brokers", "1")] = ({"log.retention.ms": "1000"}, 0)
    zk.configs[("brokers", "<default>")] = ({"log.retention.ms": "2000", "log.cleaner.threads": "3"}, 0)
    a = admin(zk, broker_id=1, static_broker={"log.retention.bytes": "123", "log.cleanup.policy": "compact"})
    mine = _by_name(a.describe(BROKER, "1"))
    assert (mine["log.retention.ms"].value, mine["log.retention.ms"].source) == (
        "1000",
        ConfigSource.DYNAMIC_BROKER_CONFIG,
    )
    assert [x.value for x in mine["log.retention.ms"].synonyms] == ["1000", "2000", "604800000"]
    assert mine["log.cleaner.threads"].source is ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
    assert mine["log.retention.bytes"].source is ConfigSource.STATIC_BROKER_CONFIG
    assert mine["log.cleanup.policy"].read_only and not mine["log.retention.bytes"].read_only
    assert mine["message.max.bytes"].source is ConfigSource.DEFAULT_CONFIG
    other = _by_name(a.describe(BROKER, "2"))
    assert other["log.retention.bytes"].source is ConfigSource.DEFAULT_CONFIG
    assert other["log.retention.ms"].source is ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
    default = _by_name(a.describe(BROKER, ""))
    assert set(default) == {"log.retention.ms", "log.cleaner.threads"}
    assert all(e.source is ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG for e in default.values())


# --- kctl --add-config parsing ------------------------------------------------------------


def test_parse_add_config_brackets_hold_list_commas() -> None:
    assert parse_add_config("retention.ms=1000,cleanup.policy=[compact,delete], segment.ms = 5") == {
        "retention.ms": "1000",
        "cleanup.policy": "compact,delete",
        "segment.ms": "5",
    }
    with pytest.raises(UsageError, match="key=val"):
        parse_add_config("retention.ms")
