"""Znode codecs of reassignment and configs: topic znodes with moves, reassignment requests, config entities."""

from __future__ import annotations

import json

import pytest
from kazoo.exceptions import BadVersionError

from kbroker.cluster import zkdata
from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.cluster.zkdata import TopicZNode
from kclient import errors
from kclient.errors import InvalidRequestError, InvalidTopicError

TID = "AAAAAAAAAAAAAAAAAAAAAA"


def test_topic_znode_v2_is_kafkas_json_and_round_trips_every_field() -> None:
    znode = TopicZNode({0: [4, 5, 6, 1, 2, 3], 1: [2, 3]}, {0: [4, 5, 6]}, {0: [1, 2, 3]}, TID)
    data = zkdata.encode_topic_znode(znode)
    assert json.loads(data) == {
        "version": 2,
        "partitions": {"0": [4, 5, 6, 1, 2, 3], "1": [2, 3]},
        "adding_replicas": {"0": [4, 5, 6]},
        "removing_replicas": {"0": [1, 2, 3]},
        "topic_id": TID,
    }
    assert zkdata.decode_topic_znode(data) == znode
    assert znode.reassigning_partitions == [0] and znode.target(0) == [4, 5, 6] and znode.target(1) == [2, 3]
    # Old callers still read the full replica sets and the id.
    assert zkdata.decode_assignment(data) == znode.partitions and zkdata.decode_topic_id(data) == TID


def test_topic_znode_v1_when_idle_without_id_and_v2_maps_always_present() -> None:
    assert json.loads(zkdata.encode_topic_znode(TopicZNode({0: [1]}))) == {"version": 1, "partitions": {"0": [1]}}
    assert json.loads(zkdata.encode_topic_znode(TopicZNode({0: [1]}, topic_id=TID))) == {
        "version": 2,
        "partitions": {"0": [1]},
        "adding_replicas": {},
        "removing_replicas": {},
        "topic_id": TID,
    }
    # A move without an id (a Kafka 2.4+ tool) is v2 and keeps its maps.
    moving = TopicZNode({0: [2, 1]}, {0: [2]}, {0: [1]})
    assert zkdata.decode_topic_znode(zkdata.encode_topic_znode(moving)) == moving
    # Kafka's own v2 with empty lists reads as "not moving".
    kafka = b'{"version":2,"partitions":{"0":[1,2]},"adding_replicas":{"0":[]},"removing_replicas":{}}'
    assert zkdata.decode_topic_znode(kafka) == TopicZNode({0: [1, 2]})


def test_reassignment_request_is_kafkas_json() -> None:
    parts = {("t", 1): [3, 4], ("a", 0): [1]}
    data = zkdata.encode_reassignment(parts)
    assert json.loads(data) == {
        "version": 1,
        "partitions": [
            {"topic": "a", "partition": 0, "replicas": [1]},
            {"topic": "t", "partition": 1, "replicas": [3, 4]},
        ],
    }
    assert zkdata.decode_reassignment(data) == parts
    dup = (
        b'{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1]},'
        b'{"topic":"t","partition":0,"replicas":[2],"log_dirs":["any"]}]}'
    )
    assert zkdata.decode_reassignment(dup) == {("t", 0): [2]}
    for bad in (b"{", b'{"version":1}', b'{"partitions":[{"topic":"t","partition":0,"replicas":3}]}'):
        with pytest.raises(InvalidRequestError):
            zkdata.decode_reassignment(bad)
    assert zkdata.REASSIGN_PARTITIONS == "/admin/reassign_partitions"


def test_broker_and_topic_config_paths() -> None:
    assert zkdata.broker_config_path(3) == "/config/brokers/3"
    assert zkdata.broker_config_path(None) == "/config/brokers/<default>"
    assert zkdata.entity_config_path("brokers", "<default>") == "/config/brokers/<default>"
    assert zkdata.entity_config_path("brokers", "7") == "/config/brokers/7"
    assert zkdata.entity_config_path("topics", "t.1") == "/config/topics/t.1"
    for name in ("x", "-1", "", "1/2", "٣"):
        with pytest.raises(InvalidRequestError):
            zkdata.entity_config_path("brokers", name)
    with pytest.raises(InvalidRequestError):
        zkdata.entity_config_path("clients", "x")
    with pytest.raises(InvalidTopicError):
        zkdata.entity_config_path("topics", "")
    config = {"log.cleaner.threads": "2"}
    assert json.loads(zkdata.encode_entity_config(config)) == {"version": 1, "config": config}
    assert zkdata.decode_entity_config(zkdata.encode_entity_config(config)) == config
    assert zkdata.decode_topic_config(zkdata.encode_topic_config(config)) == config
    for path in (zkdata.CONFIG_BROKERS, zkdata.CONFIG_CHANGES, zkdata.ADMIN):
        assert path in zkdata.PERSISTENT_PATHS


def test_config_change_notifications_v2_written_v1_read() -> None:
    assert json.loads(zkdata.encode_config_change("topics", "t")) == {"version": 2, "entity_path": "topics/t"}
    assert json.loads(zkdata.encode_config_change("brokers", "<default>")) == {
        "version": 2,
        "entity_path": "brokers/<default>",
    }
    for entity in (("topics", "t.x"), ("brokers", "3"), ("brokers", "<default>")):
        assert zkdata.decode_config_change(zkdata.encode_config_change(*entity)) == entity
    assert zkdata.decode_config_change(b'{"version":1,"entity_type":"topics","entity_name":"t"}') == ("topics", "t")
    for bad in (b"x", b'{"version":2}', b'{"version":2,"entity_path":"clients/c"}', b'{"version":2,"entity_path":"t"}'):
        with pytest.raises(InvalidRequestError):
            zkdata.decode_config_change(bad)
    assert zkdata.config_change_path() == "/config/changes/config_change_"
    assert zkdata.config_change_seq("config_change_0000000042") == 42
    assert zkdata.config_change_seq("other") == -1 and zkdata.config_change_seq("config_change_") == -1


def test_reassignment_error_codes_are_kafkas() -> None:
    assert errors.for_code(60) is errors.ReassignmentInProgressError
    assert errors.for_code(85) is errors.NoReassignmentInProgressError
    assert not errors.ReassignmentInProgressError.retriable
    assert not errors.NoReassignmentInProgressError.retriable


class _RacingZk:
    """A fake ZkClient whose first config write loses a race to another alter."""

    def __init__(self) -> None:
        self.config: dict[str, str] = {"retention.ms": "1"}
        self.version = 0
        self.raced = False

    def topic_exists(self, name: str) -> bool:
        return True

    def entity_config(self, entity_type: str, name: str) -> tuple[dict[str, str], int]:
        return dict(self.config), self.version

    def set_entity_config(self, entity_type: str, name: str, config: dict[str, str], version: int) -> int:
        if not self.raced:
            self.raced = True
            self.config, self.version = {**self.config, "cleanup.policy": "compact"}, self.version + 1
        if version != self.version:
            raise BadVersionError()
        self.config, self.version = config, version + 1
        return self.version


def test_alter_config_reapplies_on_a_concurrent_change_instead_of_losing_it() -> None:
    zk = _RacingZk()
    TopicAdmin(zk).alter_config("t", {"retention.ms": "5"})  # type: ignore[arg-type]
    assert zk.config == {"retention.ms": "5", "cleanup.policy": "compact"} and zk.version == 2
