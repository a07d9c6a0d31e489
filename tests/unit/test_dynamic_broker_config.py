"""Dynamic broker configs: the merge (precedence, bad values), applying a change, the
cleaner's reconfiguration and the replica manager's new defaults, with fakes for ZooKeeper."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, cast

import pytest
from kazoo.protocol.states import EventType, WatchedEvent

from kbroker.cluster.zk_client import ZkClient
from kbroker.config import BrokerConfig, build_config
from kbroker.dynamic_config import CHANGE_EXPIRATION_MS, DynamicBrokerConfig, DynamicConfigApplier, merge
from kbroker.replication.replica_manager import ReplicaManager
from kbroker.storage.cleaner_manager import CleanerConfig, LogCleaner
from kbroker.storage.log_config import LogConfig
from kbroker.storage.log_manager import LogManager
from tests.support import FakeKazoo

BASE = {"broker.id": "1", "zookeeper.connect": "localhost:2181", "log.dirs": "/tmp/x"}


def static(**props: str) -> BrokerConfig:
    return build_config({**BASE, **{k.replace("_", "."): v for k, v in props.items()}})


def retention(cfg: BrokerConfig) -> int:
    return LogConfig.from_properties(cfg.log_defaults).retention_ms


def test_precedence_per_broker_over_default_over_static_over_kafka() -> None:
    st = static(log_retention_ms="100")
    assert retention(merge(st, {"log.retention.ms": "200"}, {"log.retention.ms": "300"})) == 300
    assert retention(merge(st, {"log.retention.ms": "200"}, {})) == 200
    assert retention(merge(st, {}, {})) == 100
    assert retention(merge(static(), {}, {})) == LogConfig().retention_ms
    # retention.hours in the file is a synonym the dynamic log.retention.ms still beats
    assert retention(merge(static(log_retention_hours="1"), {"log.retention.ms": "5"}, {})) == 5


def test_cleaner_and_throttle_keys_land_in_their_fields() -> None:
    out = merge(
        static(log_cleaner_threads="2"),
        {"log.cleaner.threads": "3", "log.cleaner.backoff.ms": "10"},
        {"leader.replication.throttled.rate": "1000", "log.cleaner.io.max.bytes.per.second": "5000"},
    )
    assert (out.log_cleaner_threads, out.log_cleaner_backoff_ms) == (3, 10)
    assert out.cleaner_config().io_max_bytes_per_second == 5000.0
    assert out.leader_replication_throttled_rate == 1000
    assert out.follower_replication_throttled_rate == 2**63 - 1


def test_bad_stored_values_are_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    st = static(log_retention_ms="100")
    with caplog.at_level(logging.ERROR):
        out = merge(
            st,
            {"log.retention.ms": "soon", "num.partitions": "7", "log.segment.bytes": "2000000"},
            {"log.cleaner.threads": "0"},
        )
    assert retention(out) == 100
    assert LogConfig.from_properties(out.log_defaults).segment_bytes == 2_000_000
    assert (out.num_partitions, out.log_cleaner_threads) == (1, 1)
    text = caplog.text
    assert "log.retention.ms" in text and "num.partitions" in text and "log.cleaner.threads" in text


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def applier(self) -> DynamicConfigApplier:
        return DynamicConfigApplier(
            set_log_defaults=lambda c: self.calls.append(("log", c.retention_ms)),
            set_unclean_default=lambda v: self.calls.append(("unclean", v)),
            reconfigure_cleaner=lambda c: self.calls.append(("cleaner", c.log_cleaner_threads)),
            set_replication_throttles=lambda leader, follower: self.calls.append(("throttle", (leader, follower))),
        )


def test_applier_calls_only_what_changed() -> None:
    rec = Recorder()
    apply = rec.applier()
    st = static()
    apply(st, merge(st, {"log.retention.ms": "50"}, {}))
    assert rec.calls == [("log", 50)]
    rec.calls.clear()
    apply(st, merge(st, {"unclean.leader.election.enable": "true", "log.cleaner.threads": "2"}, {}))
    assert rec.calls == [("log", LogConfig().retention_ms), ("unclean", True), ("cleaner", 2)]
    rec.calls.clear()
    apply(st, merge(st, {}, {"follower.replication.throttled.rate": "10"}))
    assert rec.calls == [("throttle", (2**63 - 1, 10))]


def test_cleaner_reconfigure_restarts_threads_keeps_enable(tmp_path: Path) -> None:
    cleaner = LogCleaner(tmp_path, dict, CleanerConfig(threads=1, backoff_ms=50))
    cleaner.startup()
    try:
        assert cleaner.thread_names() == ["log-cleaner-0"]
        cleaner.reconfigure(CleanerConfig(enable=False, threads=3, backoff_ms=50, dedupe_buffer_size=3 * 1024 * 1024))
        assert sorted(cleaner.thread_names()) == ["log-cleaner-0", "log-cleaner-1", "log-cleaner-2"]
        assert cleaner.config.enable and cleaner.config.threads == 3
        assert cleaner.new_cleaner() is not None
    finally:
        cleaner.shutdown()
    assert cleaner.thread_names() == []
    cleaner.reconfigure(CleanerConfig(threads=2))  # after shutdown: stored, no thread starts
    assert cleaner.thread_names() == [] and cleaner.config.threads == 2
    with pytest.raises(ValueError):
        cleaner.reconfigure(CleanerConfig(threads=0))


def test_cleaner_not_enabled_stays_stopped(tmp_path: Path) -> None:
    cleaner = LogCleaner(tmp_path, dict, CleanerConfig(enable=False))
    cleaner.startup()
    cleaner.reconfigure(CleanerConfig(threads=2))
    assert cleaner.thread_names() == [] and not cleaner.config.enable


def test_replica_manager_new_defaults_keep_topic_overrides(tmp_path: Path) -> None:
    defaults = LogConfig()
    logs = LogManager(tmp_path, defaults)
    logs.startup()
    replicas = ReplicaManager(0, logs, defaults, cast(ZkClient, None), lambda b: None)
    try:
        replicas.on_partition_change("plain", 0, [0], None, {})
        replicas.on_partition_change("own", 0, [0], None, {"retention.ms": "7"})
        new = LogConfig.from_properties({"retention.ms": "99", "min.insync.replicas": "2"})
        replicas.update_log_defaults(new)
        plain, own = logs.get("plain", 0), logs.get("own", 0)
        assert plain is not None and own is not None
        assert (plain.config.retention_ms, plain.config.min_insync_replicas) == (99, 2)
        assert (own.config.retention_ms, own.config.min_insync_replicas) == (7, 2)
        assert replicas.topic_config("plain").min_insync_replicas == 2
        assert replicas.topic_config("not-hosted").retention_ms == 99
        # a metadata event after the change computes from the new defaults too
        replicas.on_partition_change("plain", 1, [0], None, {})
        p1 = logs.get("plain", 1)
        assert p1 is not None and p1.config.retention_ms == 99
    finally:
        replicas.shutdown()
        logs.shutdown()


class FakeZk:
    """The ZkClient calls DynamicBrokerConfig makes, over dicts."""

    def __init__(self) -> None:
        self.kazoo = FakeKazoo()
        self.configs: dict[str, dict[str, str]] = {}
        self.changes: dict[str, int] = {}
        self.deleted: list[str] = []
        self.malformed: set[str] = set()

    def entity_config(self, entity_type: str, name: str) -> tuple[dict[str, str], int]:
        if name in self.malformed:
            raise ValueError("Expecting value: line 1 column 1 (char 0)")
        return dict(self.configs.get(name, {})), 0

    def config_changes(self) -> list[str]:
        return sorted(self.changes)

    def config_change(self, child: str) -> tuple[str, str, int] | None:
        return ("brokers", "<default>", self.changes[child])

    def delete_config_change(self, child: str) -> None:
        self.deleted.append(child)
        self.changes.pop(child, None)

    def add_state_listener(self, listener: Any) -> None:
        pass

    def remove_state_listener(self, listener: Any) -> None:
        pass


def test_dynamic_broker_config_loads_watches_and_notifies() -> None:
    zk = FakeZk()
    zk.configs["<default>"] = {"log.retention.ms": "200"}
    zk.configs["1"] = {"log.bogus": "1"}
    now = int(time.time() * 1000)
    zk.changes = {"config_change_0000000001": now - CHANGE_EXPIRATION_MS - 1000, "config_change_0000000002": now}
    dyn = DynamicBrokerConfig(static(log_retention_ms="100"), cast(ZkClient, zk))
    assert retention(dyn.load()) == 200
    seen: list[tuple[int, int]] = []
    dyn.on_change(lambda old, new: seen.append((retention(old), retention(new))))
    dyn.start()
    try:
        dyn.sync()
        assert seen == [] and zk.kazoo.watches  # nothing changed since load(); watches armed
        assert zk.deleted == ["config_change_0000000001"]  # expired notifications are purged
        zk.configs["1"] = {"log.retention.ms": "300"}
        zk.kazoo.watches[-1](WatchedEvent(EventType.CHILD, 3, "/config/changes"))
        dyn.sync()
        assert seen == [(200, 300)] and retention(dyn.effective()) == 300
        zk.configs.clear()
        zk.kazoo.watches[0](WatchedEvent(EventType.DELETED, 3, "/config/brokers/1"))
        dyn.sync()
        assert seen[-1] == (300, 100)
    finally:
        dyn.stop()


def test_malformed_znode_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    zk = FakeZk()
    zk.configs["<default>"] = {"log.retention.ms": "200"}
    zk.malformed.add("1")
    dyn = DynamicBrokerConfig(static(), cast(ZkClient, zk))
    with caplog.at_level(logging.ERROR):
        assert retention(dyn.load()) == 200
    assert "brokers/1 ignored: malformed znode" in caplog.text
