"""DeleteRecords on one partition (no processes): the leader moves its log start offset,
followers take it from fetch responses, the low watermark follows the ISR, and the new
start is checkpointed at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbroker.cluster.zkdata import LeaderAndIsr
from kbroker.replication.fetch_session import FetchSpec
from kbroker.replication.partition import Partition
from kbroker.replication.replica_manager import PendingDeletes, ReplicaManager
from kbroker.storage import files
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kbroker.storage.log_manager import LogManager
from kclient.errors import NotLeaderForPartitionError, OffsetOutOfRangeError, PolicyViolationError
from kclient.records import BatchBuilder

SMALL_SEGMENTS = LogConfig(segment_bytes=200, file_delete_delay_ms=0)


def batch(base_offset: int, n: int = 1, epoch: int = 0) -> bytes:
    b = BatchBuilder(base_offset=base_offset, partition_leader_epoch=epoch)
    for i in range(n):
        b.append(1000 + i, b"k", f"record-{base_offset + i}".encode())
    return b.build()


def leader(log: Log, isr: list[int], moved: list[int] | None = None) -> Partition:
    p = Partition(
        "t",
        0,
        1,
        log,
        isr_writer=lambda _p, s: s.zk_version + 1,
        on_log_start_moved=lambda part: moved.append(part.log.log_start_offset) if moved is not None else None,
    )
    p.make_leader(LeaderAndIsr(1, 0, isr, 1, 0), sorted({1, *isr}))
    return p


def filled_leader(tmp_path: Path, records: int, isr: list[int], moved: list[int] | None = None) -> Partition:
    p = leader(Log.open(tmp_path / "t-0", SMALL_SEGMENTS), isr, moved)
    for i in range(records):
        p.append_as_leader(batch(i), 1, 1)
    return p


def test_the_leader_moves_its_log_start_offset_and_drops_whole_segments_below(tmp_path: Path) -> None:
    moved: list[int] = []
    p = filled_leader(tmp_path, 20, [1], moved)
    segments_before = p.log.num_segments
    assert p.high_watermark == 20 and segments_before > 3
    assert p.delete_records(12) == 12
    assert p.log.log_start_offset == 12 and moved == [12]
    assert p.log.num_segments < segments_before
    assert all(s.next_offset > 12 for s in p.log.segments)
    assert p.low_watermark() == 12  # alone in the ISR
    with pytest.raises(OffsetOutOfRangeError):
        p.read(5, 1 << 20, -1)  # a consumer below the start
    assert p.read(12, 1 << 20, -1).records  # from the start on, still there
    assert p.delete_records(3) == 3 and p.log.log_start_offset == 12 and moved == [12]  # never backwards


def test_minus_one_means_the_high_watermark_and_above_it_is_out_of_range(tmp_path: Path) -> None:
    p = filled_leader(tmp_path, 10, [1, 2])
    p.record_follower_fetch(2, 6, -1)  # the HW is 6: follower 2 has 0..5
    assert p.high_watermark == 6
    with pytest.raises(OffsetOutOfRangeError):
        p.delete_records(7)
    with pytest.raises(OffsetOutOfRangeError):
        p.delete_records(-2)
    assert p.log.log_start_offset == 0
    assert p.delete_records(-1) == 6 and p.log.log_start_offset == 6


def test_a_compact_only_topic_refuses(tmp_path: Path) -> None:
    p = leader(Log.open(tmp_path / "t-0", LogConfig(cleanup_policy="compact")), [1])
    p.append_as_leader(batch(0), 1, 1)
    with pytest.raises(PolicyViolationError):
        p.delete_records(1)


def test_only_the_leader_deletes(tmp_path: Path) -> None:
    p = Partition("t", 0, 1, Log.open(tmp_path / "t-0", LogConfig()), isr_writer=lambda _p, s: 1)
    p.make_follower(LeaderAndIsr(2, 0, [2, 1], 1, 0), [2, 1])
    with pytest.raises(NotLeaderForPartitionError):
        p.delete_records(0)


def test_the_low_watermark_waits_for_every_in_sync_follower(tmp_path: Path) -> None:
    p = filled_leader(tmp_path, 10, [1, 2, 3])
    for r in (2, 3):
        p.record_follower_fetch(r, 10, -1, 0)
    p.delete_records(8)
    assert p.low_watermark() == 0
    assert p.record_follower_fetch(2, 10, -1, 8)  # a reported start that moved wakes waiters
    assert p.low_watermark() == 0  # 3 still starts at 0
    p.record_follower_fetch(3, 10, -1, 8)
    assert p.low_watermark() == 8


def test_a_follower_takes_the_leaders_log_start_offset(tmp_path: Path) -> None:
    moved: list[int] = []
    log = Log.open(tmp_path / "f-0", SMALL_SEGMENTS)
    f = Partition("t", 0, 2, log, isr_writer=lambda _p, s: 1, on_log_start_moved=lambda p: moved.append(1))
    f.make_follower(LeaderAndIsr(1, 0, [1, 2], 1, 0), [1, 2])
    f.append_as_follower(b"".join(batch(i) for i in range(10)), 10, 0, 0)
    assert log.log_start_offset == 0 and not moved
    f.append_as_follower(b"", 10, 0, 7)
    assert log.log_start_offset == 7 and moved == [1]
    assert all(s.next_offset > 7 for s in log.segments)
    f.append_as_follower(b"", 10, 0, 50)  # never past its own log end
    assert log.log_start_offset == 10


def test_a_parked_follower_fetch_answers_when_the_leaders_start_passes_the_followers(tmp_path: Path) -> None:
    p = filled_leader(tmp_path, 10, [1, 2])
    p.record_follower_fetch(2, 10, -1, 0)

    class Replicas:
        def partition(self, topic: str, index: int) -> Partition:
            return p

    spec = FetchSpec("t", 0, 10, 1 << 20, -1, log_start_offset=0)
    ready = ReplicaManager.fetch_ready.__get__(Replicas())
    assert not ready(2, 1, 1 << 20, [spec])  # the follower has everything
    p.delete_records(6)
    assert ready(2, 1, 1 << 20, [spec])


def test_pending_deletes_complete_when_the_isr_reaches_the_start(tmp_path: Path) -> None:
    p = filled_leader(tmp_path, 10, [1, 2])
    p.record_follower_fetch(2, 10, -1, 0)
    target = p.delete_records(5)
    pending = PendingDeletes({("t", 0): (p, target)})
    assert not ReplicaManager.deletes_ready(pending)
    results: dict = {}
    ReplicaManager.finish_deletes(pending, results, 100)
    assert results[("t", 0)].error is not None and results[("t", 0)].error.errno == 7  # REQUEST_TIMED_OUT
    p.record_follower_fetch(2, 10, -1, 5)
    assert ReplicaManager.deletes_ready(pending)
    ReplicaManager.finish_deletes(pending, results, 100)
    assert results[("t", 0)].error is None and results[("t", 0)].low_watermark == 5


def test_the_new_start_is_checkpointed_at_once(tmp_path: Path) -> None:
    logs = LogManager(tmp_path / "data", SMALL_SEGMENTS)
    logs.startup()
    try:
        log = logs.get_or_create("t", 0)
        p = leader(log, [1])
        p._on_log_start_moved = lambda _p: logs.checkpoint()
        for i in range(10):
            p.append_as_leader(batch(i), 1, 1)
        p.delete_records(7)
        saved = files.read_offsets_checkpoint(tmp_path / "data" / files.LOG_START_OFFSET_CHECKPOINT)
        assert saved[("t", 0)] == 7
    finally:
        logs.shutdown()
