import pytest

from kbroker.storage.log_config import CONFIG_NAMES, LogConfig
from kclient.errors import InvalidConfigurationError


def test_defaults_are_kafkas() -> None:
    c = LogConfig()
    assert c.segment_bytes == 1 << 30
    assert c.segment_ms == 7 * 24 * 3600 * 1000
    assert c.segment_index_bytes == 10 * 1024 * 1024
    assert c.index_interval_bytes == 4096
    assert c.retention_ms == 7 * 24 * 3600 * 1000
    assert c.retention_bytes == -1
    assert c.flush_messages is None and c.flush_ms is None
    assert c.max_message_bytes == 1048588
    assert c.file_delete_delay_ms == 60000
    assert c.cleanup_policy == "delete" and c.delete_enabled and not c.compact_enabled
    assert c.min_insync_replicas == 1
    assert c.unclean_leader_election_enable is False
    assert c.message_timestamp_type == "CreateTime" and not c.log_append_time


def test_from_properties_parses_every_name() -> None:
    c = LogConfig.from_properties(
        {
            "segment.bytes": "1048576",
            "segment.ms": "3600000",
            "segment.index.bytes": "4096",
            "index.interval.bytes": "100",
            "retention.ms": "-1",
            "retention.bytes": "5000000",
            "flush.messages": "1",
            "flush.ms": "1000",
            "max.message.bytes": "2000000",
            "file.delete.delay.ms": "0",
            "cleanup.policy": "delete,compact",
            "min.insync.replicas": "2",
            "unclean.leader.election.enable": "TRUE",
            "message.timestamp.type": "LogAppendTime",
        }
    )
    assert c == LogConfig(
        segment_bytes=1048576,
        segment_ms=3600000,
        segment_index_bytes=4096,
        index_interval_bytes=100,
        retention_ms=-1,
        retention_bytes=5000000,
        flush_messages=1,
        flush_ms=1000,
        max_message_bytes=2000000,
        file_delete_delay_ms=0,
        cleanup_policy="compact,delete",
        min_insync_replicas=2,
        unclean_leader_election_enable=True,
        message_timestamp_type="LogAppendTime",
    )
    assert c.compact_enabled and c.delete_enabled and c.log_append_time


def test_properties_round_trip() -> None:
    c = LogConfig(retention_bytes=10, flush_ms=5, cleanup_policy="compact")
    props = c.to_properties()
    assert set(props) == set(CONFIG_NAMES.values())
    assert props["flush.messages"] == str(2**63 - 1)
    assert props["unclean.leader.election.enable"] == "false"
    assert LogConfig.from_properties(props) == c
    assert LogConfig.from_properties(LogConfig().to_properties()) == LogConfig()


def test_overrides_apply_over_given_defaults() -> None:
    broker = LogConfig(retention_ms=1000, segment_bytes=2048)
    c = LogConfig.from_properties({"segment.bytes": "4096"}, defaults=broker)
    assert c.retention_ms == 1000 and c.segment_bytes == 4096
    assert LogConfig.from_properties({}, broker) == broker


def test_unknown_key_is_named() -> None:
    with pytest.raises(InvalidConfigurationError) as info:
        LogConfig.from_properties({"segment.byte": "1"})
    assert "segment.byte" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("segment.bytes", "abc"),
        ("segment.bytes", "10"),
        ("segment.bytes", str(2**31)),
        ("segment.ms", "0"),
        ("retention.ms", "-2"),
        ("retention.bytes", "1.5"),
        ("index.interval.bytes", "-1"),
        ("flush.messages", "0"),
        ("flush.ms", "soon"),
        ("max.message.bytes", ""),
        ("cleanup.policy", "remove"),
        ("cleanup.policy", ""),
        ("min.insync.replicas", "0"),
        ("unclean.leader.election.enable", "yes"),
        ("message.timestamp.type", "createtime"),
        ("segment.index.bytes", "4"),
    ],
)
def test_bad_value_is_named(key: str, value: str) -> None:
    with pytest.raises(InvalidConfigurationError) as info:
        LogConfig.from_properties({key: value})
    message = str(info.value)
    assert key in message
    assert "\n" not in message


def test_direct_construction_is_validated() -> None:
    with pytest.raises(InvalidConfigurationError, match=r"retention\.ms"):
        LogConfig(retention_ms=-5)
    with pytest.raises(InvalidConfigurationError, match=r"cleanup\.policy"):
        LogConfig(cleanup_policy="delete,compact")  # use the normal form
    with pytest.raises(InvalidConfigurationError, match=r"segment\.bytes"):
        LogConfig().replace(segment_bytes=0)


def test_config_is_frozen_and_hashable() -> None:
    c = LogConfig()
    with pytest.raises(AttributeError):
        c.segment_bytes = 5  # type: ignore[misc]
    assert hash(c) == hash(LogConfig())
