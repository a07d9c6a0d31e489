import os
import time
from pathlib import Path

import pytest
from storage_testutil import append_batches, log_files, make_batch, read_all, small_config

from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient.errors import OffsetOutOfRangeError
from kclient.records import BatchBuilder

HOUR = 3_600_000
NOW = 1_700_000_000_000


def segmented_log(dir: Path, config: LogConfig, timestamps: list[int]) -> Log:
    """One segment per timestamp (4 batches each), then an empty active segment... or not."""
    log = Log.open(dir, config)
    for ts in timestamps:
        append_batches(log, 4, per_batch=2, timestamp=ts, value_size=50)
        log.roll()
    return log


def test_retention_by_time(tmp_path: Path) -> None:
    config = small_config(retention_ms=HOUR)
    log = segmented_log(tmp_path / "t-0", config, [NOW - 5 * HOUR, NOW - 3 * HOUR, NOW - 30_000])
    append_batches(log, 1, timestamp=NOW - 10 * HOUR)  # active segment, expired: kept
    assert log.num_segments == 4
    third = log.segments[2].base_offset
    assert log.delete_old_segments(NOW) == 2
    assert log.num_segments == 2
    assert log.log_start_offset == third
    assert [p.name for p in log_files(log.dir)] == [f"{third:020d}.log", f"{24:020d}.log"]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)
    assert read_all(log)[0].offset == third
    assert log.delete_old_segments(NOW + HOUR + 30_001) == 1  # the third one now expires
    assert log.num_segments == 1 and log.log_start_offset == 24
    assert log.delete_old_segments(NOW + 100 * HOUR) == 0  # never the active segment
    assert log.num_segments == 1
    log.close()


def test_retention_stops_at_the_first_segment_to_keep(tmp_path: Path) -> None:
    config = small_config(retention_ms=HOUR)
    log = segmented_log(tmp_path / "t-0", config, [NOW, NOW - 5 * HOUR, NOW - 5 * HOUR])
    assert log.delete_old_segments(NOW) == 0
    log.close()


def test_retention_judges_by_the_largest_timestamp(tmp_path: Path) -> None:
    config = small_config(retention_ms=HOUR)
    log = Log.open(tmp_path / "t-0", config)
    builder = BatchBuilder()
    builder.append(NOW - 10 * HOUR, None, b"old")
    builder.append(NOW - 100, None, b"new")  # one fresh record keeps the segment
    log.append_as_leader(builder.build(), 0)
    log.roll()
    append_batches(log, 1, timestamp=NOW)
    assert log.delete_old_segments(NOW) == 0
    log.close()


def test_retention_by_mtime_when_there_are_no_timestamps(tmp_path: Path) -> None:
    config = small_config(retention_ms=HOUR)
    log = segmented_log(tmp_path / "t-0", config, [-1, -1])
    append_batches(log, 1, timestamp=-1)
    assert [s.max_timestamp_so_far for s in log.segments] == [-1, -1, -1]
    first = log.segments[0]
    now = time.time_ns() // 1_000_000
    assert log.delete_old_segments(now) == 0  # just written
    old = (now - 2 * HOUR) / 1000
    os.utime(first.log_path, (old, old))
    assert log.delete_old_segments(now) == 1
    assert log.log_start_offset == 8
    log.close()


def test_retention_ms_forever(tmp_path: Path) -> None:
    log = segmented_log(tmp_path / "t-0", small_config(retention_ms=-1), [1, 2, 3])
    assert log.delete_old_segments(NOW) == 0
    log.close()


def test_retention_by_size(tmp_path: Path) -> None:
    config = small_config(retention_ms=-1)
    log = segmented_log(tmp_path / "t-0", config, [NOW] * 5)
    append_batches(log, 2, timestamp=NOW)
    sizes = [s.size for s in log.segments]
    total = sum(sizes)
    # keep at most total - 2.5 segments' worth: the two oldest go, the third would overshoot
    limit = total - sizes[0] - sizes[1] - sizes[2] // 2
    log.update_config(config.replace(retention_bytes=limit))
    assert log.delete_old_segments(NOW) == 2
    assert log.size_in_bytes == total - sizes[0] - sizes[1]
    assert log.log_start_offset == 16
    log.update_config(config.replace(retention_bytes=0))
    assert log.delete_old_segments(NOW) == 3  # everything but the active segment
    assert log.num_segments == 1 and log.log_start_offset == log.active_segment.base_offset
    log.close()


def test_compact_only_policy_keeps_everything(tmp_path: Path) -> None:
    config = small_config(retention_ms=1, retention_bytes=0, cleanup_policy="compact")
    log = segmented_log(tmp_path / "t-0", config, [1, 2])
    assert log.delete_old_segments(NOW) == 0
    assert log.num_segments == 3
    log.close()


def test_high_watermark_limits_retention(tmp_path: Path) -> None:
    log = segmented_log(tmp_path / "t-0", small_config(retention_ms=HOUR), [1, 2, 3])
    assert log.delete_old_segments(NOW, high_watermark=10) == 1  # segment 8.. ends at 16 > 10
    assert log.log_start_offset == 8
    log.close()


def test_retention_advances_the_epoch_cache(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", small_config(retention_ms=HOUR))
    append_batches(log, 3, epoch=1, timestamp=1)
    log.roll()
    append_batches(log, 3, epoch=2, timestamp=1)
    log.roll()
    append_batches(log, 1, epoch=2, timestamp=NOW)
    assert log.leader_epoch_cache.entries() == [(1, 0), (2, 3)]
    assert log.delete_old_segments(NOW) == 2
    assert log.leader_epoch_cache.entries() == [(2, 6)]
    log.close()


def test_file_delete_delay(tmp_path: Path) -> None:
    config = small_config(retention_ms=HOUR, file_delete_delay_ms=60_000)
    log = segmented_log(tmp_path / "t-0", config, [1, 2])
    reader_view = log.segments[0]
    assert log.delete_old_segments(NOW) == 2
    deleted = sorted(p.name for p in log.dir.iterdir() if p.name.endswith(".deleted"))
    assert deleted == [
        "00000000000000000000.index.deleted",
        "00000000000000000000.log.deleted",
        "00000000000000000000.timeindex.deleted",
        "00000000000000000008.index.deleted",
        "00000000000000000008.log.deleted",
        "00000000000000000008.timeindex.deleted",
    ]
    result = reader_view.read(0, 1 << 20)  # a read in flight still works
    assert result is not None and result.records
    log.flush_if_due(NOW + 59_999)
    assert any(p.name.endswith(".deleted") for p in log.dir.iterdir())
    log.flush_if_due(NOW + 60_000)
    assert not any(p.name.endswith(".deleted") for p in log.dir.iterdir())
    log.close()


def test_close_removes_pending_deletes(tmp_path: Path) -> None:
    config = small_config(retention_ms=HOUR, file_delete_delay_ms=60_000)
    log = segmented_log(tmp_path / "t-0", config, [1])
    assert log.delete_old_segments(NOW) == 1
    log.close()
    assert not any(p.name.endswith(".deleted") for p in log.dir.iterdir())
    reopened = Log.open(log.dir, config, log_start_offset=log.log_start_offset)
    assert reopened.log_start_offset == 8 and reopened.log_end_offset == 8
    assert reopened.append_as_leader(make_batch(1), 0).first_offset == 8
    reopened.close()
