"""Topic creation bounds and auto-creation against a real ZooKeeper."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import BrokerInfo
from kclient.errors import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    PolicyViolationError,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def zk(zk_connect: str) -> Iterator[ZkClient]:
    """One ZooKeeper session that registers brokers 0 and 1."""
    client = ZkClient(zk_connect)
    client.start()
    client.ensure_persistent_paths()
    client.register_broker(BrokerInfo(0, "127.0.0.1", 9000))
    client.register_broker(BrokerInfo(1, "127.0.0.1", 9001))
    try:
        yield client
    finally:
        client.close()


def test_zero_and_negative_counts_are_refused_and_minus_one_is_the_default(zk: ZkClient) -> None:
    admin = TopicAdmin(zk, default_partitions=3, default_replication_factor=2)
    for partitions in (0, -2, -1000):
        with pytest.raises(InvalidPartitionsError):
            admin.create_topic("t", partitions, 1)
    for rf in (0, -2):
        with pytest.raises(InvalidReplicationFactorError):
            admin.create_topic("t", 1, rf)
    with pytest.raises(InvalidReplicationFactorError, match="2 live broker"):
        admin.create_topic("t", 1, 3)
    assert zk.topics() == []
    chosen = admin.create_topic("t", -1, -1)
    assert len(chosen) == 3 and all(len(r) == 2 for r in chosen.values())


def test_partition_counts_are_bounded_with_typed_errors(zk: ZkClient) -> None:
    admin = TopicAdmin(zk)
    for partitions in (20_000, 10**6, 2**31 - 1):
        started = time.monotonic()
        with pytest.raises(InvalidPartitionsError, match=r"max\.partitions\.per\.topic"):
            admin.create_topic("huge", partitions, 1)
        assert time.monotonic() - started < 1
    # 2 brokers x max.broker.partitions (4,000) cannot hold 9,000 replicas.
    with pytest.raises(PolicyViolationError, match=r"max\.broker\.partitions"):
        admin.create_topic("huge", 9_000, 1)
    assert zk.topics() == []
    admin.create_topic("ok", 100, 2)
    with pytest.raises(InvalidPartitionsError, match=r"max\.partitions\.per\.topic"):
        admin.create_partitions("ok", 20_000)
    assert len(admin.create_partitions("ok", 150)) == 150


def test_max_broker_partitions_counts_every_topic(zk: ZkClient) -> None:
    admin = TopicAdmin(zk, max_broker_partitions=10)
    admin.create_topic("a", 8, 2)  # 8 replicas on each broker
    with pytest.raises(PolicyViolationError, match=r"max\.broker\.partitions=10"):
        admin.create_topic("b", 6, 1)  # 3 more on each: 11
    with pytest.raises(PolicyViolationError):
        admin.create_topic("b", assignment={0: [0], 1: [0], 2: [0]})
    assert zk.topics() == ["a"]
    admin.create_topic("c", 4, 1)  # 2 more on each: 10
    with pytest.raises(PolicyViolationError):
        admin.create_partitions("c", 6)
    assert sorted(zk.topics()) == ["a", "c"] and len(zk.topic_assignment("c") or ({}, 0)) == 2


def test_racing_auto_creations_all_succeed_quietly(zk: ZkClient, zk_connect: str) -> None:
    sessions = [ZkClient(zk_connect) for _ in range(4)]  # four "brokers" auto-creating at once
    for s in sessions:
        s.start()
    try:
        admins = [TopicAdmin(s, default_partitions=3, default_replication_factor=2) for s in sessions]
        results: list[bool] = []
        errors: list[Exception] = []
        go = threading.Barrier(len(admins))

        def create(admin: TopicAdmin) -> None:
            go.wait()
            try:
                results.append(admin.auto_create_topic("auto"))
            except Exception as exc:
                errors.append(exc)

        threads = [threading.Thread(target=create, args=(a,)) for a in admins]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and sorted(results) == [False, False, False, True]
        found = zk.topic_assignment("auto")
        assert found is not None and len(found[0]) == 3 and all(len(r) == 2 for r in found[0].values())
        assert admins[0].auto_create_topic("auto") is False
        with pytest.raises(InvalidTopicError):
            admins[0].auto_create_topic("bad/name")
        with pytest.raises(InvalidReplicationFactorError):
            TopicAdmin(zk, default_replication_factor=3).auto_create_topic("needs-three")
    finally:
        for s in sessions:
            s.close()
