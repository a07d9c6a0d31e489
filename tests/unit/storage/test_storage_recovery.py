"""Crash recovery, by damaging real segment files and reopening the log."""

import logging
import os
from pathlib import Path

import pytest
from storage_testutil import (
    append_garbage,
    crash,
    flip_byte,
    log_files,
    make_batch,
    read_all,
    small_config,
    truncate_file,
)

from kbroker.storage import files
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient.records import LENGTH_OFFSET, iter_headers

CONFIG = small_config(segment_bytes=2000, index_interval_bytes=100)


def build(dir: Path, batches: int = 60, per_batch: int = 2, epoch: int = 0) -> list[bytes]:
    """A crashed log of ``batches`` batches over several segments; returns the batches."""
    log = Log.open(dir, CONFIG)
    written = []
    for b in range(batches):
        data = make_batch(per_batch, value_size=30, prefix=f"{b}-", timestamp=1000 + b)
        log.append_as_leader(data, epoch + b // 20)
        written.append(data)
    assert log.num_segments >= 4
    crash(log)
    return written


def reopen(dir: Path, config: LogConfig = CONFIG, **kw: object) -> Log:
    return Log.open(dir, config, **kw)  # type: ignore[arg-type]


def batch_positions(path: Path) -> list[tuple[int, int, int]]:
    """(position, base offset, next offset) of every batch in a segment file."""
    return [(p, h.base_offset, h.next_offset) for p, h in iter_headers(path.read_bytes())]


def check_usable(log: Log, end: int) -> None:
    """Every offset below ``end`` reads back in order, and appends continue at ``end``."""
    assert log.log_end_offset == end
    assert [r.offset for r in read_all(log)] == list(range(end))
    assert log.append_as_leader(make_batch(3), 9).first_offset == end
    assert [r.offset for r in read_all(log)] == list(range(end + 3))


def test_half_written_last_batch(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    last = log_files(dir)[-1]
    batches = batch_positions(last)
    truncate_file(last, 20)  # the last batch loses its tail
    with caplog.at_level(logging.WARNING):
        log = reopen(dir)
    assert any("truncating" in r.getMessage() for r in caplog.records)
    check_usable(log, batches[-1][1])
    log.close()


def test_flipped_byte_in_the_middle_of_the_last_segment(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    last = log_files(dir)[-1]
    batches = batch_positions(last)
    victim = batches[len(batches) // 2]
    flip_byte(last, victim[0] + 70)  # inside the records: CRC mismatch
    log = reopen(dir)
    assert last.stat().st_size == victim[0]
    check_usable(log, victim[1])
    log.close()


def test_corruption_in_an_earlier_segment_drops_later_segments(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    segments = log_files(dir)
    second = segments[1]
    batches = batch_positions(second)
    victim = batches[2]
    flip_byte(second, victim[0] + 30)  # a header field under the CRC
    log = reopen(dir, recovery_point=0)
    assert log.num_segments == 2
    assert [p.name for p in log_files(dir)] == [p.name for p in segments[:2]]
    assert not any(files.offset_index_file(dir, files.offset_from_filename(p.name)).exists() for p in segments[2:])
    check_usable(log, victim[1])
    log.close()


def test_garbage_appended(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    last = log_files(dir)[-1]
    size = last.stat().st_size
    end = batch_positions(last)[-1][2]
    append_garbage(last, os.urandom(500))
    log = reopen(dir)
    assert last.stat().st_size == size
    check_usable(log, end)
    log.close()


def test_garbage_that_looks_like_a_huge_batch(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    last = log_files(dir)[-1]
    end = batch_positions(last)[-1][2]
    header = bytearray(make_batch(1))
    header[LENGTH_OFFSET : LENGTH_OFFSET + 4] = (2**31 - 1).to_bytes(4, "big")
    append_garbage(last, bytes(header))
    log = reopen(dir)
    check_usable(log, end)
    log.close()


def test_zeroes_after_the_data(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    last = log_files(dir)[-1]
    end = batch_positions(last)[-1][2]
    append_garbage(last, bytes(4096))  # file size grew, data never landed
    log = reopen(dir)
    check_usable(log, end)
    log.close()


def test_corrupt_first_batch_empties_the_segment(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = Log.open(dir, CONFIG)
    log.append_as_leader(make_batch(2), 0)
    log.append_as_leader(make_batch(2), 0)
    crash(log)
    flip_byte(log_files(dir)[0], 65)
    log = reopen(dir)
    assert log.leader_epoch_cache.entries() == []
    check_usable(log, 0)
    log.close()


def test_recovery_starts_at_the_recovery_point(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    segments = log_files(dir)
    flushed_end = files.offset_from_filename(segments[2].name)
    last = segments[-1]
    end = batch_positions(last)[-1][1]
    truncate_file(last, 5)
    with caplog.at_level(logging.INFO):
        log = reopen(dir, recovery_point=flushed_end)
    recovered = len(segments) - 2  # the segment holding the recovery point and later ones
    assert any(f"{recovered} segments recovered" in r.getMessage() for r in caplog.records)
    assert log.recovery_point == flushed_end
    check_usable(log, end)
    log.close()


@pytest.mark.parametrize("clean", [True, False])
def test_deleted_index_files_are_rebuilt(tmp_path: Path, clean: bool) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    first_index = files.offset_index_file(dir, 0)
    original = first_index.read_bytes()
    assert original
    first_index.unlink()
    time_index = log_files(dir, ".timeindex")[1]
    time_index.unlink()
    log = reopen(dir, clean_shutdown=clean, recovery_point=10**9)
    assert first_index.read_bytes() == original
    assert time_index.exists()
    check_usable(log, 120)
    assert log.offset_for_timestamp(1030) == (60, 1030)
    log.close()


@pytest.mark.parametrize("damage", ["garbage", "short", "pointing-nowhere"])
def test_corrupt_offset_index_is_rebuilt(tmp_path: Path, damage: str) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    index = files.offset_index_file(dir, 0)
    original = index.read_bytes()
    if damage == "garbage":
        index.write_bytes(os.urandom(len(original)))
    elif damage == "short":
        index.write_bytes(original[:-3])
    else:
        index.write_bytes(original[:-8] + (10_000).to_bytes(4, "big") + (10**6).to_bytes(4, "big"))
    log = reopen(dir, clean_shutdown=True)
    assert index.read_bytes() == original
    check_usable(log, 120)
    log.close()


def test_corrupt_time_index_is_rebuilt(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    path = files.time_index_file(dir, 0)
    path.write_bytes(bytes(24))  # two entries with equal timestamps
    log = reopen(dir, clean_shutdown=True)
    assert log.offset_for_timestamp(1003) == (6, 1003)
    check_usable(log, 120)
    log.close()


def test_torn_tail_detected_even_after_a_clean_shutdown(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    last = log_files(dir)[-1]
    end = batch_positions(last)[-1][1]
    truncate_file(last, 7)
    log = reopen(dir, clean_shutdown=True)
    check_usable(log, end)
    log.close()


def test_leftover_files_are_removed(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    leftovers = [
        "00000000000000000000.log.deleted",
        "00000000000000000000.index.deleted",
        "00000000000000000500.log.cleaned",
        "00000000000000000500.log.swap",
        "leader-epoch-checkpoint.tmp",
        "00000000000000099999.index",  # orphaned
        "00000000000000099999.timeindex",
    ]
    for name in leftovers:
        (dir / name).write_bytes(b"junk")
    (dir / "README").write_text("not ours")
    log = reopen(dir)
    names = {p.name for p in dir.iterdir()}
    assert not names & set(leftovers)
    assert "README" in names
    check_usable(log, 120)
    log.close()


def test_epoch_cache_rebuilt_when_checkpoint_missing_or_corrupt(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)  # epochs 0, 1, 2 starting at offsets 0, 40, 80
    expected = [(0, 0), (1, 40), (2, 80)]
    checkpoint = dir / files.LEADER_EPOCH_CHECKPOINT
    assert not checkpoint.exists()  # new epochs wait in memory for a flush: the crash lost them
    log = reopen(dir, clean_shutdown=True)
    assert log.leader_epoch_cache.entries() == expected
    assert files.read_epoch_checkpoint(checkpoint) == expected
    log.close()
    checkpoint.write_text("0\n3\nbroken\n")
    log = reopen(dir, clean_shutdown=True)
    assert log.leader_epoch_cache.entries() == expected
    log.close()


def test_epoch_cache_trimmed_to_the_recovered_log(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    last = log_files(dir)[-1]
    base = files.offset_from_filename(last.name)
    last.write_bytes(b"")  # the whole last segment was lost
    files.write_epoch_checkpoint(dir / files.LEADER_EPOCH_CHECKPOINT, [(0, 0), (1, 40), (2, 80), (7, 119)])
    log = reopen(dir)
    assert log.log_end_offset == base
    assert all(e.start_offset < base for e in log.leader_epoch_cache.entries())
    log.close()


def test_log_start_offset_beyond_the_data_resets_the_log(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    log = reopen(dir, log_start_offset=500)
    assert log.log_start_offset == log.log_end_offset == 500
    assert [p.name for p in log_files(dir)] == ["00000000000000000500.log"]
    assert log.append_as_leader(make_batch(1), 3).first_offset == 500
    log.close()


def test_log_start_offset_is_restored(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    log = reopen(dir, log_start_offset=45, clean_shutdown=True)
    assert log.log_start_offset == 45
    assert read_all(log)[0].offset == 44  # the batch holding 45 starts at 44
    log.close()


def test_clean_shutdown_keeps_everything(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = Log.open(dir, CONFIG)
    for b in range(30):
        log.append_as_leader(make_batch(2, timestamp=5000 + b), 1)
    log.flush()
    log.close()
    log = reopen(dir, clean_shutdown=True, recovery_point=60)
    assert log.recovery_point == 60
    assert log.offset_for_timestamp(5029) == (58, 5029)
    check_usable(log, 60)
    log.close()


def test_time_index_pointing_past_the_data_is_rebuilt(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    build(dir)
    path = files.time_index_file(dir, 0)
    path.write_bytes(path.read_bytes() + (10**12).to_bytes(8, "big") + (5000).to_bytes(4, "big"))
    log = reopen(dir, clean_shutdown=True)
    assert log.segments[0].max_timestamp_so_far < 10**12
    check_usable(log, 120)
    log.close()
