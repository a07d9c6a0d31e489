"""Broker logging: log.level / --log-level, log.file with rotation, the rate limiter,
the fetcher's rate-limited connection warnings, the membership lines, and the "leader
elected" line (with its reason) of a reassignment that moves leadership."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.reassignment import ReassignmentManager
from kbroker.cluster.zkdata import BrokerInfo
from kbroker.config import build_config, with_overrides
from kbroker.log_setup import LoggingConfig, RateLimiter, configure
from kbroker.purgatory import Purgatory
from kbroker.replication.fetcher import ReplicaFetcher
from kbroker.server import parse_args
from kclient.errors import InvalidConfigError, KafkaConnectionError
from kclient.proto.kbroker.v1 import log_pb2
from tests.support import FakeClock
from tests.unit.test_reassignment_manager import InMemoryStore

BASE = {"broker.id": "1", "zookeeper.connect": "127.0.0.1:2181", "log.dirs": "/tmp/x"}


def test_logging_defaults() -> None:
    cfg = build_config(BASE)
    assert cfg.logging_config() == LoggingConfig("INFO", None, 100 * 1024 * 1024, 10)


@pytest.mark.parametrize(("value", "level"), [("debug", "DEBUG"), ("WARN", "WARNING"), (" error ", "ERROR")])
def test_log_level_names(value: str, level: str) -> None:
    assert build_config({**BASE, "log.level": value}).log_level == level


def test_bad_log_settings_name_the_key() -> None:
    with pytest.raises(InvalidConfigError, match=r"log\.level"):
        build_config({**BASE, "log.level": "LOUD"})
    with pytest.raises(InvalidConfigError, match=r"log\.file\.max\.bytes"):
        build_config({**BASE, "log.file.max.bytes": "10"})
    with pytest.raises(InvalidConfigError, match=r"log\.file\.backups"):
        build_config({**BASE, "log.file.backups": "-1"})


def test_log_file_settings() -> None:
    cfg = build_config({**BASE, "log.file": "/var/log/k.log", "log.file.max.bytes": "4096", "log.file.backups": "2"})
    assert cfg.logging_config() == LoggingConfig("INFO", Path("/var/log/k.log"), 4096, 2)


def test_log_settings_are_static() -> None:
    with pytest.raises(InvalidConfigError, match="cannot be changed on a running broker"):
        with_overrides(build_config(BASE), {"log.level": "DEBUG"})


def test_flag_beats_the_file(tmp_path: Path) -> None:
    props = tmp_path / "server.properties"
    props.write_text("broker.id=1\nzookeeper.connect=127.0.0.1:2181\nlog.dirs=/tmp/x\nlog.level=ERROR\n")
    assert parse_args([str(props)]).log_level == "ERROR"
    assert parse_args([str(props), "--log-level", "debug"]).log_level == "DEBUG"


@pytest.fixture
def restore_logging() -> object:
    root = logging.getLogger()
    handlers, level, kazoo = list(root.handlers), root.level, logging.getLogger("kazoo").level
    yield None
    configure(LoggingConfig())  # removes the handlers configure() installed
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    for h in handlers:
        if h not in root.handlers:
            root.addHandler(h)
    root.setLevel(level)
    logging.getLogger("kazoo").setLevel(kazoo)


def test_configure_levels_and_kazoo(tmp_path: Path, restore_logging: object) -> None:
    configure(LoggingConfig("WARNING"), stream=io.StringIO())
    assert logging.getLogger().level == logging.WARNING
    assert logging.getLogger("kazoo").level == logging.WARNING
    configure(LoggingConfig("INFO"), stream=io.StringIO())
    assert logging.getLogger("kazoo").level == logging.WARNING  # kazoo stays quiet at INFO
    configure(LoggingConfig("DEBUG"), stream=io.StringIO())
    assert logging.getLogger("kazoo").level == logging.DEBUG


def test_log_file_rotates(tmp_path: Path, restore_logging: object) -> None:
    path = tmp_path / "logs" / "broker.log"
    configure(LoggingConfig("INFO", path, 2048, 2), stream=io.StringIO())
    for i in range(200):
        logging.getLogger("kbroker.test").info("line %d of the rotation test", i)
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["broker.log", "broker.log.1", "broker.log.2"]  # backups capped at 2
    assert all(p.stat().st_size <= 2048 for p in path.parent.iterdir())
    assert "line 199 of the rotation test" in path.read_text()
    assert "INFO [MainThread] kbroker.test:" in path.read_text()


def test_rate_limiter_counts_what_it_holds_back() -> None:
    clock = FakeClock(100.0)
    limiter = RateLimiter(10.0, clock)
    assert limiter.allow("a") == 0
    assert [limiter.allow("a") for _ in range(5)] == [None] * 5
    assert limiter.allow("b") == 0  # keys are independent
    clock.now += 9.9
    assert limiter.allow("a") is None
    clock.now += 0.1
    assert limiter.allow("a") == 6
    assert limiter.allow("a") is None
    assert limiter.reset("a") == 1
    assert limiter.allow("a") == 0  # after a reset the next one is reported at once


class DeadLeader:
    address = "127.0.0.1:1"

    def fetch(self, request: log_pb2.FetchRequest, timeout_s: float) -> log_pb2.FetchResponse:
        raise KafkaConnectionError("connection refused")

    def offset_for_leader_epoch(
        self, request: log_pb2.OffsetForLeaderEpochRequest, timeout_s: float
    ) -> log_pb2.OffsetForLeaderEpochResponse:
        raise KafkaConnectionError("connection refused")

    def close(self) -> None:
        pass


def test_fetcher_connection_errors_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(100.0)
    fetcher = ReplicaFetcher(
        2, 1, DeadLeader(), max_wait_ms=10, max_bytes=1024, purgatory=Purgatory(), error_log=RateLimiter(10.0, clock)
    )
    caplog.set_level(logging.INFO, logger="kbroker.replication.fetcher")
    for _ in range(100):
        fetcher._unreachable(KafkaConnectionError("connection refused"))
        clock.now += 0.05  # 5 s in all
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "cannot reach leader 1 at 127.0.0.1:1" in warnings[0].getMessage()
    clock.now += 5.1
    fetcher._unreachable(KafkaConnectionError("connection refused"))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "(99 more since the last report)" in warnings[1].getMessage()
    fetcher._reached()
    fetcher._reached()  # only the first success after failures is reported
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "leader 1 at 127.0.0.1:1 reachable again after 101 failed attempt(s)" in infos[0]


def test_membership_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kbroker.cluster.metadata_cache")
    a = {1: BrokerInfo(1, "h1", 9092, epoch=5), 2: BrokerInfo(2, "h2", 9093, epoch=6)}
    MetadataCache._log_membership({}, a)
    MetadataCache._log_membership(a, {2: a[2], 3: BrokerInfo(3, "h3", 9094, epoch=7)})
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        ("INFO", "live brokers: 1 at h1:9092, 2 at h2:9093"),
        ("WARNING", "broker 1 lost (was at h1:9092): its registration in ZooKeeper ended"),
        ("INFO", "broker 3 registered at h3:9094 (broker epoch 7)"),
    ]


def test_a_move_off_the_leader_logs_the_election_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kbroker.cluster.reassignment")
    store = InMemoryStore()
    store.add_topic("t", {0: [1, 2, 3]})
    store.write_request({("t", 0): [3, 4, 5]})
    m = ReassignmentManager(store, 2)
    m.process_request({1, 2, 3, 4, 5})
    store.join_isr("t", 0, 4)
    store.join_isr("t", 0, 5)
    m.try_complete({1, 2, 3, 4, 5})
    elections = [r.getMessage() for r in caplog.records if "elected" in r.getMessage()]
    want = "t-0: leader 3 elected (was 1), reason: reassignment; epoch 2, ISR [1, 2, 3, 4, 5] -> [3, 4, 5]"
    assert elections == [want]
