"""A topic deleted and recreated under the same name is a new incarnation (a new topic id):
the replica manager must not carry the old incarnation's log, leader epochs or high
watermark into it, whether or not it saw the deletion."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import LeaderAndIsr
from kbroker.replication.replica_manager import ReplicaManager
from kbroker.storage.log_config import LogConfig
from kbroker.storage.log_manager import LogManager
from tests.unit.test_replica_fetcher import batch

BROKER = 0


def manager(data: Path) -> ReplicaManager:
    logs = LogManager(data, LogConfig())
    logs.startup()
    return ReplicaManager(BROKER, logs, LogConfig(), cast(ZkClient, None), lambda b: None)


def old_incarnation(rm: ReplicaManager) -> None:
    """Topic id "old": ten records, written under leader epochs 0 and 1."""
    rm.on_partition_change("t", 0, [BROKER], LeaderAndIsr(BROKER, 0, [BROKER], 0, 0), {}, "old")
    p = rm.partition("t", 0)
    p.append_as_leader(batch(0, [b"old"] * 5), 1, 1)
    rm.on_partition_change("t", 0, [BROKER], LeaderAndIsr(BROKER, 1, [BROKER], 0, 1), {}, "old")
    p.append_as_leader(batch(1, [b"old"] * 5), 1, 1)
    assert p.log.log_end_offset == 10 and p.log.latest_epoch == 1


def test_a_recreation_seen_only_as_a_new_topic_id_replaces_the_log(tmp_path: Path) -> None:
    rm = manager(tmp_path / "data")
    old_incarnation(rm)
    # No deletion was seen: the next read of the topic's znode already has the new id.
    rm.on_partition_change("t", 0, [BROKER], LeaderAndIsr(BROKER, 0, [BROKER], 0, 0), {}, "new")
    p = rm.partition("t", 0)
    assert p.log.log_end_offset == 0 and p.high_watermark == 0
    # The new incarnation's leader, at epoch 0, takes writes (the old log had epoch 1).
    p.append_as_leader(batch(0, [b"new"]), 1, 1)
    assert p.log.log_end_offset == 1
    assert (p.log.dir / "partition.metadata").read_text().split() == ["version:", "0", "topic_id:", "new"]


def test_the_same_topic_id_keeps_the_log(tmp_path: Path) -> None:
    rm = manager(tmp_path / "data")
    old_incarnation(rm)
    rm.on_partition_change("t", 0, [BROKER], LeaderAndIsr(BROKER, 2, [BROKER], 0, 2), {}, "old")
    assert rm.partition("t", 0).log.log_end_offset == 10


def test_a_topic_id_given_to_a_topic_without_one_keeps_the_log(tmp_path: Path) -> None:
    """The controller gives an id to a topic created without one: the same incarnation."""
    rm = manager(tmp_path / "data")
    rm.on_partition_change("t", 0, [BROKER], LeaderAndIsr(BROKER, 0, [BROKER], 0, 0), {})
    rm.partition("t", 0).append_as_leader(batch(0, [b"x"] * 3), 1, 1)
    rm.on_partition_change("t", 0, [BROKER], LeaderAndIsr(BROKER, 0, [BROKER], 0, 0), {}, "first")
    assert rm.partition("t", 0).log.log_end_offset == 3


def test_a_restarted_broker_does_not_give_the_new_incarnation_the_old_high_watermark(tmp_path: Path) -> None:
    rm = manager(tmp_path / "data")
    old_incarnation(rm)
    p = rm.partition("t", 0)
    assert p.high_watermark == 10
    rm.shutdown()  # checkpoints the high watermarks
    rm.log_manager.shutdown()
    again = manager(tmp_path / "data")
    again.on_partition_change("t", 0, [BROKER], LeaderAndIsr(BROKER, 0, [BROKER], 0, 0), {}, "new")
    fresh = again.partition("t", 0)
    assert fresh.log.log_end_offset == 0 and fresh.high_watermark == 0


def test_a_log_set_up_without_the_id_is_still_told_apart_by_its_recorded_id(tmp_path: Path) -> None:
    """The recreated topic's znode is first read without an id (the controller adds it a
    moment later) while the old incarnation's log is still on disk."""
    rm = manager(tmp_path / "data")
    old_incarnation(rm)
    rm.shutdown()
    rm.log_manager.shutdown()
    again = manager(tmp_path / "data")
    again.on_partition_change("t", 0, [BROKER], None, {})  # no id, no state yet
    again.on_partition_change("t", 0, [BROKER], LeaderAndIsr(BROKER, 0, [BROKER], 0, 0), {}, "new")
    p = again.partition("t", 0)
    assert p.log.log_end_offset == 0
    p.append_as_leader(batch(0, [b"new"]), 1, 1)
