"""The reassignment's ZooKeeper layer against a real ZooKeeper: no writer of a topic znode erases a
reassignment in flight, and the reassignment znode helpers (create, CAS, fenced step)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from kazoo.exceptions import BadVersionError, NodeExistsError

from kbroker.cluster import zkdata
from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.cluster.zk_client import ControllerMovedError, ZkClient
from kbroker.cluster.zkdata import BrokerInfo, LeaderAndIsr, TopicZNode
from kbroker.local.cluster import LocalCluster
from kclient.errors import ReassignmentInProgressError
from tests.support import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def zk(zk_connect: str) -> Iterator[ZkClient]:
    """One ZooKeeper session that registers brokers 0, 1 and 2."""
    client = ZkClient(zk_connect)
    client.start()
    client.ensure_persistent_paths()
    for b in range(3):
        client.register_broker(BrokerInfo(b, "127.0.0.1", 9000 + b))
    try:
        yield client
    finally:
        client.close()


def _start_move(zk: ZkClient, topic: str) -> TopicZNode:
    """Partition 0 of ``topic`` (replicas [0]) moving to [1]: RS [1, 0], adding [1], removing [0]."""
    found = zk.topic_znode(topic)
    assert found is not None
    znode, version = found
    moving = TopicZNode({**znode.partitions, 0: [1, 0]}, {0: [1]}, {0: [0]}, znode.topic_id)
    zk.set_topic_znode(topic, moving, version)
    return moving


def test_persistent_paths_exist(zk: ZkClient) -> None:
    for path in ("/admin", "/config/brokers", "/config/changes"):
        assert zk.kazoo.exists(path) is not None


def test_create_partitions_is_refused_mid_move_and_keeps_the_move(zk: ZkClient) -> None:
    admin = TopicAdmin(zk)
    admin.create_topic("t", assignment={0: [0], 1: [2]})
    moving = _start_move(zk, "t")
    with pytest.raises(ReassignmentInProgressError, match="reassigned"):
        admin.create_partitions("t", 3)
    found = zk.topic_znode("t")
    assert found is not None and found[0] == moving


def test_set_topic_assignment_keeps_the_id_and_moves(zk: ZkClient) -> None:
    TopicAdmin(zk).create_topic("t", assignment={0: [0], 1: [2]})
    moving = _start_move(zk, "t")
    found = zk.topic_znode("t")
    assert found is not None
    zk.set_topic_assignment("t", {**moving.partitions, 2: [1]}, found[1])
    after = zk.topic_znode("t")
    assert after is not None
    assert after[0] == TopicZNode({0: [1, 0], 1: [2], 2: [1]}, {0: [1]}, {0: [0]}, moving.topic_id)
    assert moving.topic_id is not None and zk.topic_id("t") == moving.topic_id
    with pytest.raises(BadVersionError):
        zk.set_topic_znode("t", moving, found[1])


def test_metadata_cache_carries_adding_and_removing(zk: ZkClient) -> None:
    TopicAdmin(zk).create_topic("t", assignment={0: [0], 1: [2]})
    cache = MetadataCache(zk)
    cache.start()
    try:
        assert cache.wait_for(lambda s: "t" in s.topics, 20)
        assert cache.snapshot().topics["t"].adding == {} and cache.snapshot().topics["t"].removing == {}
        _start_move(zk, "t")
        assert cache.wait_for(lambda s: s.topics["t"].adding == {0: [1]}, 20)
        info = cache.snapshot().topics["t"]
        assert info.removing == {0: [0]} and info.assignment == {0: [1, 0], 1: [2]}
    finally:
        cache.stop()


def test_reassignment_request_create_set_and_fenced_step(zk: ZkClient) -> None:
    assert zk.reassignment_request() is None
    zk.create_reassignment_request({("t", 0): [1], ("t", 1): [0]})
    with pytest.raises(ReassignmentInProgressError):
        zk.create_reassignment_request({("u", 0): [1]})
    found = zk.reassignment_request()
    assert found == ({("t", 0): [1], ("t", 1): [0]}, 0)
    assert zk.set_reassignment_request({("t", 0): [1]}, 0) == 1
    with pytest.raises(BadVersionError):
        zk.set_reassignment_request({}, 0)

    TopicAdmin(zk).create_topic("t", assignment={0: [0], 1: [2]})
    became = zk.try_become_controller(0)
    assert became is not None
    epoch, epoch_version = became
    zk.create_partition_state("t", 0, LeaderAndIsr(0, 0, [0], epoch), epoch_version)
    state = zk.partition_state("t", 0)
    assert state is not None
    topic = zk.topic_znode("t")
    assert topic is not None
    moving = TopicZNode({0: [1, 0], 1: [2]}, {0: [1]}, {0: [0]}, topic[0].topic_id)
    bumped = LeaderAndIsr(0, 1, [0], epoch, state.zk_version)
    # A stale state version: nothing of the step is written.
    with pytest.raises(BadVersionError):
        zk.commit_reassignment_step(
            epoch_version, "t", moving, topic[1], {0: LeaderAndIsr(0, 1, [0], epoch, 7)}, (None, 1)
        )
    assert zk.topic_znode("t") == topic and zk.reassignment_request() is not None
    # The step: topic znode, state and request (deleted) together.
    assert zk.commit_reassignment_step(epoch_version, "t", moving, topic[1], {0: bumped}, (None, 1)) == topic[1] + 1
    assert zk.topic_znode("t") == (moving, topic[1] + 1)
    after = zk.partition_state("t", 0)
    assert after is not None and after.leader_epoch == 1
    assert zk.reassignment_request() is None
    # A deposed controller writes nothing.
    with pytest.raises(ControllerMovedError):
        zk.commit_reassignment_step(epoch_version + 1, "t", TopicZNode(moving.partitions), topic[1] + 1, {})


def test_controller_topic_id_backfill_keeps_a_move(cluster_factory: Callable[..., LocalCluster]) -> None:
    """A Kafka-era tool wrote a moving topic znode without an id: the controller's backfill
    gives it an id and keeps adding/removing."""
    cluster = cluster_factory(1)
    zk = ZkClient(cluster.zk_connect)
    zk.start()
    try:
        zk.kazoo.create(zkdata.topic_config_path("old"), zkdata.encode_entity_config({}), makepath=True)
        legacy = TopicZNode({0: [0, 5]}, {0: [0]}, {0: [5]})
        zk.kazoo.create(zkdata.topic_path("old"), zkdata.encode_topic_znode(legacy), makepath=True)
        wait_until(lambda: zk.topic_id("old") is not None, what="the controller's topic id")
        found = zk.topic_znode("old")
        assert found is not None
        znode, version = found
        if version == 1:  # the backfill's own write: the move is still there
            assert znode.adding == {0: [0]} and znode.removing == {0: [5]} and znode.partitions == {0: [0, 5]}
        else:  # the controller went on with the move it kept, and finished it (replica 0 is in sync)
            assert znode.partitions == {0: [0]} and not znode.adding and not znode.removing
    finally:
        zk.close()


def test_entity_configs_are_cas_written_with_a_change_notification(zk: ZkClient) -> None:
    assert zk.entity_config("brokers", "<default>") == ({}, -1)
    assert zk.set_entity_config("brokers", "<default>", {"log.cleaner.threads": "2"}, -1) == 0
    with pytest.raises(NodeExistsError):
        zk.set_entity_config("brokers", "<default>", {}, -1)
    assert zk.set_entity_config("brokers", "1", {"follower.replication.throttled.rate": "100"}, -1) == 0
    assert zk.set_entity_config("brokers", "1", {}, 0) == 1
    with pytest.raises(BadVersionError):
        zk.set_entity_config("brokers", "1", {"x": "y"}, 0)
    assert zk.entity_config("brokers", "<default>") == ({"log.cleaner.threads": "2"}, 0)
    assert zk.entity_config("brokers", "1") == ({}, 1)
    raw, _ = zk.kazoo.get("/config/brokers/<default>")
    assert raw == b'{"config":{"log.cleaner.threads":"2"},"version":1}'

    TopicAdmin(zk).create_topic("t", 1, 1)
    TopicAdmin(zk).alter_config("t", {"retention.ms": "1000"})
    assert zk.entity_config("topics", "t")[0] == {"retention.ms": "1000"} and zk.topic_config("t")["retention.ms"]
    children = zk.config_changes()
    # Three successful broker writes and the topic's: the failed CAS writes left none.
    assert len(children) == 4 and all(c.startswith("config_change_") and len(c) == 24 for c in children)
    entities = [zk.config_change(c) for c in children]
    assert [e[:2] for e in entities if e] == [
        ("brokers", "<default>"),
        ("brokers", "1"),
        ("brokers", "1"),
        ("topics", "t"),
    ]
    zk.delete_config_change(children[0])
    zk.delete_config_change(children[0])  # gone already: ignored
    assert zk.config_change(children[0]) is None and len(zk.config_changes()) == 3


def test_create_partitions_on_a_topic_znode_without_partitions_uses_the_default_rf(zk: ZkClient) -> None:
    zk.kazoo.create(zkdata.topic_path("e"), zkdata.encode_topic_znode(TopicZNode({})), makepath=True)
    added = TopicAdmin(zk, default_replication_factor=2).create_partitions("e", 2)
    assert sorted(added) == [0, 1] and all(len(r) == 2 for r in added.values())
