"""ZooKeeper znode codecs, replica placement, topic names and broker configuration."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from kbroker.cluster import zkdata
from kbroker.cluster.assignment import assign_replicas
from kbroker.config import build_config, load_properties
from kclient.errors import InvalidConfigError, InvalidReplicationFactorError, InvalidTopicError
from kclient.topic_name import validate_topic_name


def test_znode_json_is_kafkas_shape() -> None:
    state = zkdata.LeaderAndIsr(2, 5, [2, 1], 3)
    assert json.loads(zkdata.encode_leader_and_isr(state)) == {
        "version": 1,
        "leader": 2,
        "leader_epoch": 5,
        "isr": [2, 1],
        "controller_epoch": 3,
    }
    assert zkdata.decode_leader_and_isr(zkdata.encode_leader_and_isr(state), 7) == zkdata.LeaderAndIsr(
        2, 5, [2, 1], 3, 7
    )
    assert json.loads(zkdata.encode_assignment({1: [2, 3], 0: [1, 2]})) == {
        "version": 1,
        "partitions": {"0": [1, 2], "1": [2, 3]},
    }
    info = zkdata.BrokerInfo(4, "127.0.0.1", 9092, "r1", 123)
    body = json.loads(zkdata.encode_broker(info))
    assert body["endpoints"] == ["PLAINTEXT://127.0.0.1:9092"] and body["rack"] == "r1" and body["version"] == 4
    assert zkdata.decode_broker(4, zkdata.encode_broker(info), 99) == zkdata.BrokerInfo(
        4, "127.0.0.1", 9092, "r1", 123, 99
    )
    assert zkdata.decode_controller(zkdata.encode_controller(3)) == 3
    assert zkdata.decode_controller(b"3") == 3  # 0.8's bare integer
    assert zkdata.encode_controller_epoch(12) == b"12"
    assert zkdata.decode_offset(zkdata.encode_offset(zkdata.CommittedOffset(42, "meta"))) == zkdata.CommittedOffset(
        42, "meta"
    )
    assert zkdata.decode_offset(b"50793695368").offset == 50793695368
    assert zkdata.partition_state_path("t", 3) == "/brokers/topics/t/partitions/3/state"


def test_assignment_spreads_leaders_and_followers() -> None:
    a = assign_replicas([1, 2, 3], 6, 3, start_index=0, shift=0)
    assert a[0] == [1, 2, 3] and a[3] == [1, 3, 2]  # shift grows every n partitions
    assert Counter(r[0] for r in a.values()) == {1: 2, 2: 2, 3: 2}
    for replicas in assign_replicas([0, 1, 2, 3, 4], 50, 3).values():
        assert len(set(replicas)) == 3
    with pytest.raises(InvalidReplicationFactorError):
        assign_replicas([1, 2], 1, 3)


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "x" * 250, "t/1", "ümlaut", "a:b"])
def test_illegal_topic_names(name: str) -> None:
    with pytest.raises(InvalidTopicError):
        validate_topic_name(name)


@pytest.mark.parametrize("name", ["a", "A.b-c_d", "x" * 249, "__consumer_offsets"])
def test_legal_topic_names(name: str) -> None:
    validate_topic_name(name)


def test_broker_config_file_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "server.properties"
    f.write_text(
        "# comment\nbroker.id=3\nzookeeper.connect=127.0.0.1:2181/kafka\nlisteners=PLAINTEXT://127.0.0.1:0\n"
        f"log.dirs={tmp_path / 'data'}\nlog.retention.hours=2\nlog.segment.bytes=1048576\nnum.partitions=4\n"
    )
    cfg = build_config(load_properties(f))
    assert (cfg.broker_id, cfg.listen_host, cfg.listen_port, cfg.num_partitions) == (3, "127.0.0.1", 0, 4)
    assert cfg.log_defaults == {"retention.ms": str(2 * 3_600_000), "segment.bytes": "1048576"}
    with pytest.raises(InvalidConfigError, match=r"broker\.id"):
        build_config({"broker.id": "x", "zookeeper.connect": "h:1", "log.dirs": "/tmp/x"})
    with pytest.raises(InvalidConfigError, match="unknown broker setting 'bogus'"):
        build_config({"bogus": "1"})
    with pytest.raises(InvalidConfigError, match=r"zookeeper\.connect"):
        build_config({"broker.id": "1", "log.dirs": "/tmp/x"})
    bad = tmp_path / "bad.properties"
    bad.write_text("broker.id 3\n")
    with pytest.raises(InvalidConfigError, match="expected key=value"):
        load_properties(bad)


def test_rack_aware_assignment_spreads_each_partition_over_racks() -> None:
    from kbroker.cluster.assignment import assign_replicas_rack_aware, rack_alternated

    racks = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    assert rack_alternated(racks) == [0, 2, 4, 1, 3, 5]
    a = assign_replicas_rack_aware(racks, 12, 3, start_index=0, shift=0)
    for replicas in a.values():
        assert len({racks[b] for b in replicas}) == 3
    assert Counter(r[0] for r in a.values()) == dict.fromkeys(range(6), 2)
    two = assign_replicas_rack_aware({0: "a", 1: "a", 2: "b"}, 6, 3)
    for replicas in two.values():
        assert sorted(replicas) == [0, 1, 2] and {racks.get(b, "b") for b in replicas[:2]} == {"a", "b"}


def test_retention_ms_wins_over_minutes_over_hours() -> None:
    base = {"broker.id": "1", "zookeeper.connect": "h:1", "log.dirs": "/tmp/x"}
    assert build_config({**base, "log.retention.hours": "2"}).log_defaults == {"retention.ms": "7200000"}
    both = {**base, "log.retention.hours": "2", "log.retention.ms": "5", "log.retention.minutes": "3"}
    assert build_config(both).log_defaults == {"retention.ms": "5"}
    assert build_config({**base, "log.retention.minutes": "3", "log.retention.hours": "2"}).log_defaults == {
        "retention.ms": "180000"
    }
