"""The settings table (kbroker.config.BROKER_CONFIGS): what derives from it agrees with it,
and docs/config-reference.md is fresh."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
from pathlib import Path

import pytest

from kbroker.cluster.config_admin import (
    DYNAMIC_BROKER_CONFIGS,
    KAFKA_BROKER_DEFAULTS,
    AlterOp,
    ConfigAdmin,
    ConfigSource,
    OpType,
    ResourceType,
    validate_broker_config,
)
from kbroker.cluster.zk_client import ZkClient
from kbroker.config import (
    BROKER_CONFIGS,
    LOG_DEFAULT_KEYS,
    THROTTLE_RATE_KEYS,
    BrokerConfig,
    add_flags,
    build_config,
    flag_settings,
    with_overrides,
)
from kbroker.config_def import NO_DEFAULT, ConfigDef, ConfigKey, Importance, Range, Type
from kbroker.dynamic_config import merge
from kbroker.security.listeners import PER_LISTENER_KEYS
from kbroker.storage.cleaner_manager import CleanerConfig
from kbroker.storage.log_config import LogConfig
from kclient.errors import InvalidConfigError, InvalidConfigurationError, InvalidRequestError

ROOT = Path(__file__).resolve().parents[2]
BASE = {"broker.id": "1", "zookeeper.connect": "localhost:2181", "log.dirs": "/tmp/x"}


def test_reference_is_fresh() -> None:
    proc = subprocess.run([str(ROOT / "scripts" / "gen-config-docs"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_field_setting_names_a_field_with_the_tables_default() -> None:
    fields = {f.name: f for f in dataclasses.fields(BrokerConfig)}
    for key in BROKER_CONFIGS:
        if key.attr is None:
            continue
        assert key.attr in fields, key.name
        if not key.required:
            assert fields[key.attr].default == key.field_default, key.name


def test_defaults_parse_back_to_themselves() -> None:
    for key in BROKER_CONFIGS:
        text = key.default_text
        if key.topic is not None or key.required or text is None or (key.type is Type.DOUBLE and text.endswith("E308")):
            continue
        assert key.parse_value(key.name, text) in (key.default, str(key.default)), key.name


def test_an_empty_config_is_the_tables_defaults() -> None:
    cfg = build_config(BASE)
    assert cfg.cleaner_config() == CleanerConfig()
    assert LogConfig.from_properties(cfg.log_defaults) == LogConfig()
    assert (cfg.listen_host, cfg.listen_port) == ("127.0.0.1", 9092)
    assert cfg.leader_imbalance_check_interval_ms == 300 * 1000


def test_topic_linked_settings_take_the_topic_configs_defaults() -> None:
    topic = LogConfig().to_properties()
    for name, topic_name in LOG_DEFAULT_KEYS.items():
        assert BROKER_CONFIGS[name].default == topic[topic_name]
    assert BROKER_CONFIGS["log.retention.ms"].synonyms == ("log.retention.minutes", "log.retention.hours")


def test_dynamic_settings_are_kafkas_that_kbroker_has() -> None:
    assert set(DYNAMIC_BROKER_CONFIGS) == {
        "log.cleaner.threads",
        "log.cleaner.backoff.ms",
        "log.cleaner.io.max.bytes.per.second",
        "log.cleaner.dedupe.buffer.size",
        "log.retention.ms",
        "log.retention.bytes",
        "log.segment.bytes",
        "log.roll.ms",
        "log.cleaner.min.cleanable.ratio",
        "log.cleaner.delete.retention.ms",
        "unclean.leader.election.enable",
        "min.insync.replicas",
        "message.max.bytes",
        "leader.replication.throttled.rate",
        "follower.replication.throttled.rate",
    }
    assert THROTTLE_RATE_KEYS == ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
    assert KAFKA_BROKER_DEFAULTS["log.cleaner.io.max.bytes.per.second"] == "1.7976931348623157E308"
    assert KAFKA_BROKER_DEFAULTS["leader.replication.throttled.rate"] == str(2**63 - 1)
    assert KAFKA_BROKER_DEFAULTS["log.retention.ms"] == "604800000"


def test_per_listener_settings_are_the_listener_modules() -> None:
    assert {k.name for k in BROKER_CONFIGS if k.per_listener} == set(PER_LISTENER_KEYS)


def test_every_setting_is_documented() -> None:
    for key in BROKER_CONFIGS:
        assert key.doc.strip().endswith("."), key.name
        assert isinstance(key.importance, Importance)


def test_a_name_is_defined_once() -> None:
    key = ConfigKey("a.b", Type.INT, 1, Importance.LOW, "A.", "g")
    with pytest.raises(ValueError, match="defined twice"):
        ConfigDef([key, dataclasses.replace(key, name="c", aliases=("a.b",))])
    with pytest.raises(ValueError, match="unknown"):
        ConfigDef([dataclasses.replace(key, synonym_of="nope")])
    assert ConfigDef([key])["a.b"].attr == "a_b"


def test_range_messages_name_the_key() -> None:
    with pytest.raises(InvalidConfigError, match=r"^InvalidConfigError: k: 0 is below the minimum 1$"):
        Range(1)("k", "0", 0)
    with pytest.raises(InvalidConfigError, match=r"k: 'nan' is below the minimum 1\.0"):
        Range(1.0)("k", "nan", float("nan"))
    assert str(Range(1)) == "[1,...]"
    assert NO_DEFAULT is BROKER_CONFIGS["broker.id"].default


# --- parsing -----------------------------------------------------------------------------------


def test_required_settings_in_table_order() -> None:
    with pytest.raises(InvalidConfigError, match=r"missing required setting broker\.id"):
        build_config({})
    with pytest.raises(InvalidConfigError, match=r"missing required setting log\.dirs"):
        build_config({"broker.id": "1", "zookeeper.connect": "h:1"})


@pytest.mark.parametrize(
    "props, retention_ms",
    [
        ({"log.retention.hours": "2"}, "7200000"),
        ({"log.retention.hours": "2", "log.retention.minutes": "3"}, "180000"),
        ({"log.retention.minutes": "3", "log.retention.hours": "2"}, "180000"),
        ({"log.retention.hours": "2", "log.retention.ms": "5"}, "5"),
        ({"log.retention.hours": "-1"}, "-1"),
    ],
)
def test_retention_synonyms_precedence(props: dict[str, str], retention_ms: str) -> None:
    assert build_config({**BASE, **props}).log_defaults["retention.ms"] == retention_ms


def test_aliases_and_units() -> None:
    cfg = build_config(
        {**BASE, "log.dir": "/y", "advertised.host": "h", "leader.imbalance.check.interval.seconds": "2"}
    )
    assert (cfg.data_dir, cfg.advertised_host, cfg.leader_imbalance_check_interval_ms) == (Path("/y"), "h", 2000)
    with pytest.raises(InvalidConfigError, match=r"^InvalidConfigError: log\.dir: exactly one"):
        build_config({**BASE, "log.dir": "/a,/b"})


def test_dynamic_only_and_unknown_settings_are_refused_at_start() -> None:
    for name in ("leader.replication.throttled.rate", "sasl.kerberos.service.name", "bogus"):
        with pytest.raises(InvalidConfigError, match=f"unknown broker setting '{name}'"):
            build_config({**BASE, name: "1"})


def test_flags_come_from_the_table() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(["--broker-id", "3", "--data-dir", "/d", "--listen", "h:0", "--log-level", "debug"])
    assert flag_settings(args) == {"broker.id": "3", "log.dirs": "/d", "listen": "h:0", "log.level": "debug"}
    with pytest.raises(SystemExit):
        parser.parse_args(["--broker-id", "x"])


# --- dynamic changes -------------------------------------------------------------------------


def test_with_overrides_takes_dynamic_settings_only() -> None:
    cfg = build_config(BASE)
    out = with_overrides(cfg, {"log.cleaner.threads": "2", "log.retention.ms": "5"})
    assert (out.log_cleaner_threads, out.log_defaults["retention.ms"]) == (2, "5")
    for name in ("num.partitions", "log.retention.hours", "listener.name.ssl.ssl.client.auth"):
        with pytest.raises(InvalidConfigError, match=f"{name} cannot be changed on a running broker"):
            with_overrides(cfg, {name: "1"})
    with pytest.raises(InvalidConfigError, match="unknown broker setting 'bogus'"):
        with_overrides(cfg, {"bogus": "1"})
    assert with_overrides(cfg, {"sasl.kerberos.service.name": "kafka"}) == cfg


def test_a_stored_kerberos_setting_does_not_void_the_other_dynamic_configs() -> None:
    out = merge(build_config(BASE), {"sasl.kerberos.service.name": "kafka", "log.retention.ms": "5"}, {})
    assert out.log_defaults["retention.ms"] == "5"


@pytest.mark.parametrize(
    "name, value, error, message",
    [
        ("num.partitions", "3", InvalidRequestError, r"Cannot update these configs dynamically: \[num.partitions\]"),
        ("bogus", "3", InvalidRequestError, "dynamically"),
        ("log.cleaner.threads", "0", InvalidConfigurationError, "for configuration log.cleaner.threads: 0 is below"),
        ("log.segment.bytes", "x", InvalidConfigurationError, "for configuration log.segment.bytes: not an integer"),
        ("follower.replication.throttled.rate", "-1", InvalidConfigurationError, "rate: must be at least 0"),
    ],
)
def test_dynamic_validation_without_a_whole_config(name: str, value: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        validate_broker_config(name, value)


# --- DescribeConfigs ---------------------------------------------------------------------------


class _Zk:
    def __init__(self, configs: dict[tuple[str, str], dict[str, str]]) -> None:
        self.configs = configs

    def await_connection(self, wait_s: float) -> bool:
        return True

    require_connection = ZkClient.require_connection

    def topic_exists(self, topic: str) -> bool:
        return True

    def entity_config(self, entity_type: str, name: str) -> tuple[dict[str, str], int]:
        return dict(self.configs.get((entity_type, name), {})), 0


def test_describe_carries_documentation_type_and_read_only_from_the_table() -> None:
    zk = _Zk({("brokers", "1"): {"log.cleaner.threads": "2", "sasl.kerberos.service.name": "kafka"}})
    admin = ConfigAdmin(zk, broker_id=1)  # type: ignore[arg-type]
    broker = {e.name: e for e in admin.describe(ResourceType.BROKER, "1")}
    threads = broker["log.cleaner.threads"]
    assert (threads.value, threads.source, threads.read_only) == ("2", ConfigSource.DYNAMIC_BROKER_CONFIG, False)
    assert threads.documentation == BROKER_CONFIGS["log.cleaner.threads"].doc
    assert threads.config_type == 3  # INT
    assert not broker["sasl.kerberos.service.name"].read_only
    topic = {e.name: e for e in admin.describe(ResourceType.TOPIC, "t")}
    assert topic["retention.ms"].documentation == BROKER_CONFIGS["log.retention.ms"].doc
    assert topic["retention.ms"].config_type == 5  # LONG
    assert topic["leader.replication.throttled.replicas"].documentation is None  # no broker-wide default
    assert not any(e.sensitive for e in (*broker.values(), *topic.values()))


def test_alter_of_a_read_only_setting_is_refused() -> None:
    zk = _Zk({})
    with pytest.raises(InvalidRequestError):
        ConfigAdmin(zk).incremental_alter(ResourceType.BROKER, "1", [AlterOp("log.dirs", OpType.SET, "/x")])  # type: ignore[arg-type]
