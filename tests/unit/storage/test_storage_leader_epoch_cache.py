from pathlib import Path

import pytest

from kbroker.storage import files
from kbroker.storage.leader_epoch import EpochEntry, LeaderEpochCache
from kclient.errors import KafkaStorageError


def cache_with(tmp_path: Path, *entries: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache.load(tmp_path)
    for epoch, offset in entries:
        assert cache.assign(epoch, offset)
    return cache


def test_assign_and_persist(tmp_path: Path) -> None:
    cache = LeaderEpochCache.load(tmp_path)
    assert cache.latest_epoch == -1 and cache.entries() == []
    assert cache.assign(0, 0)
    assert cache.assign(2, 10)
    assert not cache.assign(2, 20)  # same epoch
    assert not cache.assign(1, 30)  # older epoch
    assert not cache.assign(-1, 40)
    assert cache.latest_epoch == 2
    cache.flush()
    assert (tmp_path / files.LEADER_EPOCH_CHECKPOINT).read_text() == "0\n2\n0 0\n2 10\n"
    assert LeaderEpochCache.load(tmp_path).entries() == [EpochEntry(0, 0), EpochEntry(2, 10)]


def test_assign_replaces_epochs_that_wrote_nothing(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10))
    assert cache.assign(3, 10)  # epoch 2 never wrote a record
    assert cache.entries() == [(1, 0), (3, 10)]


def test_end_offset_for_kip_279(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10), (5, 20))
    leo = 30
    assert cache.end_offset_for(5, leo) == (5, 30)  # latest epoch: the LEO
    assert cache.end_offset_for(2, leo) == (2, 20)  # start of the next epoch
    assert cache.end_offset_for(1, leo) == (1, 10)
    assert cache.end_offset_for(3, leo) == (2, 20)  # unknown: largest epoch below it
    assert cache.end_offset_for(4, leo) == (2, 20)
    assert cache.end_offset_for(0, leo) == (0, 0)  # older than all: start of the first
    assert cache.end_offset_for(6, leo) == (-1, -1)  # newer than all
    assert cache.end_offset_for(-1, leo) == (-1, -1)
    assert LeaderEpochCache(None).end_offset_for(0, 10) == (-1, -1)


def test_epoch_for_offset(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 5), (2, 10))
    assert cache.epoch_for_offset(4) == -1
    assert cache.epoch_for_offset(5) == 1
    assert cache.epoch_for_offset(9) == 1
    assert cache.epoch_for_offset(10) == 2
    assert cache.epoch_for_offset(10**9) == 2


def test_truncate_from_end(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10), (3, 20))
    cache.truncate_from_end(25)
    assert cache.latest_epoch == 3
    cache.truncate_from_end(20)
    assert cache.entries() == [(1, 0), (2, 10)]
    cache.truncate_from_end(5)
    assert cache.entries() == [(1, 0)]
    assert LeaderEpochCache.load(tmp_path).entries() == [(1, 0)]
    cache.truncate_from_end(0)
    assert cache.entries() == []


def test_truncate_from_start(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10), (3, 20))
    cache.truncate_from_start(0)
    assert cache.entries() == [(1, 0), (2, 10), (3, 20)]
    cache.truncate_from_start(15)
    assert cache.entries() == [(2, 15), (3, 20)]
    cache.truncate_from_start(20)
    assert cache.entries() == [(3, 20)]
    cache.truncate_from_start(100)
    assert cache.entries() == [(3, 100)]
    assert LeaderEpochCache.load(tmp_path).entries() == [(3, 100)]


def test_clear(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0))
    cache.clear()
    assert LeaderEpochCache.load(tmp_path).entries() == []


@pytest.mark.parametrize("text", ["0\n2\n1 0\n1 5\n", "0\n1\n1\n", "garbage"])
def test_corrupt_checkpoint(tmp_path: Path, text: str) -> None:
    (tmp_path / files.LEADER_EPOCH_CHECKPOINT).write_text(text)
    with pytest.raises(KafkaStorageError):
        LeaderEpochCache.load(tmp_path)


def test_new_epochs_wait_for_flush_and_truncations_are_written_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader change (assign) touches no file; a truncation writes the checkpoint
    (a restart sees it) without an fsync; flush() writes what changed and makes it
    durable with one fsync, and only when something changed."""
    import os

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    path = tmp_path / files.LEADER_EPOCH_CHECKPOINT
    cache = LeaderEpochCache.load(tmp_path)
    for epoch in range(1, 6):
        assert cache.assign(epoch, epoch * 10)
    assert not path.exists() and synced == []
    cache.truncate_from_end(40)
    assert synced == []
    assert LeaderEpochCache.load(tmp_path).entries() == [EpochEntry(e, e * 10) for e in range(1, 4)]
    assert cache.assign(7, 40)
    assert LeaderEpochCache.load(tmp_path).entries() == [EpochEntry(e, e * 10) for e in range(1, 4)]
    cache.flush()
    assert len(synced) == 2  # the file and its directory
    assert LeaderEpochCache.load(tmp_path).entries() == [*(EpochEntry(e, e * 10) for e in range(1, 4)), (7, 40)]
    cache.flush()
    assert len(synced) == 2  # nothing new: no write


def test_a_log_flush_makes_the_epochs_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kbroker.storage.log import Log
    from kbroker.storage.log_config import LogConfig

    log = Log.open(tmp_path / "t-0", LogConfig())
    flushed: list[bool] = []
    real = LeaderEpochCache.flush
    monkeypatch.setattr(LeaderEpochCache, "flush", lambda self: (flushed.append(True), real(self))[1])
    log.leader_epoch_cache.assign(3, 0)
    log.flush()  # nothing to flush in the log itself: the epochs still are
    assert flushed == [True]
    assert LeaderEpochCache.load(tmp_path / "t-0").entries() == [(3, 0)]
    log.close()
