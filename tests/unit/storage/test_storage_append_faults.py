"""A failed append leaves the log exactly as before, or takes it offline.

A fault-injecting ``os`` (a disk with a given room left per file suffix, failing
ftruncate and fsync) drives the exact failures: a short or refused write of the
``.log``, of an ``.index`` or ``.timeindex`` entry, a cut-back that fails, an fsync
that fails. The real full-disk test is tests/integration/test_storage_faults_disk_full.py.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_testutil import crash, make_batch, read_all, small_config

from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kbroker.storage.segment import AppendUndoError
from kclient.errors import KafkaStorageError


class FaultyDisk:
    """Replaces os.pwrite / os.pwritev / os.ftruncate / os.fsync for files whose names end with a suffix.

    ``room[suffix]``: bytes that may still be written to such files; a larger write is
    short (it writes what fits), a write with no room left raises ENOSPC.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.room: dict[str, int] = {}
        self.fail_truncate = False
        self.fail_fsync = False
        self.short_writes = 0
        self._pwrite = os.pwrite
        self._ftruncate = os.ftruncate
        self._fsync = os.fsync
        monkeypatch.setattr(os, "pwrite", self.pwrite)
        monkeypatch.setattr(os, "pwritev", self.pwritev)
        monkeypatch.setattr(os, "ftruncate", self.ftruncate)
        monkeypatch.setattr(os, "fsync", self.fsync)

    @staticmethod
    def _suffix(fd: int) -> str:
        return os.path.splitext(os.readlink(f"/proc/self/fd/{fd}"))[1]

    def pwritev(self, fd: int, buffers: list[memoryview], position: int) -> int:
        """As the kernel does: one write of the buffers' concatenation, possibly short."""
        return self.pwrite(fd, b"".join(buffers), position)

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, position: int) -> int:
        suffix = self._suffix(fd)
        room = self.room.get(suffix)
        if room is None:
            return self._pwrite(fd, data, position)
        if room == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = memoryview(data)[:room]
        written = self._pwrite(fd, view, position)
        if written < len(data):
            self.short_writes += 1
        self.room[suffix] = room - written
        return written

    def ftruncate(self, fd: int, length: int) -> None:
        if self.fail_truncate:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self._ftruncate(fd, length)

    def fsync(self, fd: int) -> None:
        if self.fail_fsync:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self._fsync(fd)

    def heal(self) -> None:
        self.room.clear()
        self.fail_truncate = self.fail_fsync = False


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FaultyDisk:
    return FaultyDisk(monkeypatch)


def config() -> LogConfig:
    # An offset index entry after every batch, so every append writes both indexes.
    return small_config(segment_bytes=1 << 20, index_interval_bytes=0)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    log = Log.open(tmp_path / "t-0", config())
    yield log
    log.close()


def files_of(dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dir.iterdir()) if p.is_file()}


class Producer:
    """Appends batches of one record, each with a distinct increasing timestamp, and
    remembers what was acknowledged."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.acked: list[tuple[int, bytes]] = []
        self.n = 0

    def send(self, epoch: int = 0) -> int:
        self.n += 1
        value = b"record-%d" % self.n
        info = self.log.append_as_leader(make_batch(1, timestamp=1000 + self.n, prefix=f"{self.n}:"), epoch)
        self.acked.append((info.first_offset, value))
        return info.first_offset

    def check(self, log: Log) -> None:
        """Every acknowledged record is in ``log``, once, at its offset, in order."""
        got = [(r.offset, r.value) for r in read_all(log)]
        assert [o for o, _ in got] == list(range(log.log_start_offset, log.log_end_offset))
        assert [o for o, _ in got] == [o for o, _ in self.acked]


def reopen_after_crash(log: Log) -> Log:
    """Drop the log as a killed broker would, then load it with full recovery."""
    crash(log)
    return Log.open(log.dir, config(), recovery_point=0, clean_shutdown=False)


@pytest.mark.parametrize(
    "room",
    [
        {".index": 0},
        {".index": 3},  # a short write: 3 of the 8 bytes of the entry
        {".timeindex": 0},
        {".timeindex": 5},
        {".log": 0},
        {".log": 30},  # a short write of the batch
    ],
    ids=["index-full", "index-short", "timeindex-full", "timeindex-short", "log-full", "log-short"],
)
def test_failed_append_leaves_the_log_as_before(log: Log, disk: FaultyDisk, room: dict[str, int]) -> None:
    producer = Producer(log)
    for _ in range(3):
        producer.send()
    before = (log.log_end_offset, log.size_in_bytes, files_of(log.dir))
    disk.room.update(room)
    for _ in range(3):  # the disk stays full: every attempt fails, nothing changes
        with pytest.raises(KafkaStorageError, match=r"No space left|short write"):
            producer.send()
        assert (log.log_end_offset, log.size_in_bytes, files_of(log.dir)) == before
    assert not log.offline
    disk.heal()
    for _ in range(3):  # space freed: appends continue at the next offset
        producer.send()
    assert [o for o, _ in producer.acked] == list(range(6))
    producer.check(log)
    recovered = reopen_after_crash(log)
    try:
        producer.check(recovered)
        assert recovered.append_as_leader(make_batch(1), 0).first_offset == 6
    finally:
        recovered.close()


def test_failed_append_forgets_the_new_leader_epoch(log: Log, disk: FaultyDisk) -> None:
    producer = Producer(log)
    producer.send(epoch=0)
    disk.room[".index"] = 0
    with pytest.raises(KafkaStorageError):
        producer.send(epoch=3)
    assert log.leader_epoch_cache.entries() == [(0, 0)]
    disk.heal()
    producer.send(epoch=3)
    assert log.leader_epoch_cache.entries() == [(0, 0), (3, 1)]


def test_failed_follower_append_leaves_the_log_as_before(tmp_path: Path, disk: FaultyDisk) -> None:
    leader = Log.open(tmp_path / "leader-0", config())
    follower = Log.open(tmp_path / "follower-0", config())
    producer = Producer(leader)
    for _ in range(4):
        producer.send()
    follower.append_as_follower(leader.read(0, 1 << 20, max_offset=2).records)
    before = files_of(follower.dir)
    disk.room[".index"] = 0
    with pytest.raises(KafkaStorageError):
        follower.append_as_follower(leader.read(2, 1 << 20).records)
    assert follower.log_end_offset == 2 and files_of(follower.dir) == before
    disk.heal()
    follower.append_as_follower(leader.read(2, 1 << 20).records)
    producer.check(follower)
    leader.close()
    follower.close()


def test_failed_append_after_a_roll(tmp_path: Path, disk: FaultyDisk) -> None:
    """The batch that rolls a new segment fails: the new segment stays empty, offsets go on."""
    log = Log.open(tmp_path / "t-0", config().replace(segment_bytes=300))
    producer = Producer(log)
    producer.send()
    producer.send()
    segments = log.num_segments
    disk.room[".log"] = 0
    with pytest.raises(KafkaStorageError):
        for _ in range(10):
            producer.send()
    assert log.num_segments >= segments
    disk.heal()
    for _ in range(5):
        producer.send()
    producer.check(log)
    recovered = reopen_after_crash(log)
    producer.check(recovered)
    recovered.close()


def test_append_that_cannot_be_undone_takes_the_log_offline(log: Log, disk: FaultyDisk) -> None:
    producer = Producer(log)
    for _ in range(3):
        producer.send()
    disk.room[".index"] = 0
    disk.fail_truncate = True
    with pytest.raises(KafkaStorageError, match="cutting the files back") as info:
        producer.send()
    assert isinstance(info.value, AppendUndoError)
    assert log.offline and "cutting the files back" in (log.offline_reason or "")
    disk.heal()  # even with space back, the log stays offline until a restart
    with pytest.raises(KafkaStorageError, match="offline"):
        producer.send()
    with pytest.raises(KafkaStorageError, match="offline"):
        log.read(0, 1 << 20)
    with pytest.raises(KafkaStorageError, match="offline"):
        log.flush()
    assert not log.flush_if_due() and log.delete_old_segments() == 0
    files = files_of(log.dir)
    log.close()  # writes nothing: no snapshot, no final index entry
    assert files_of(log.dir) == files
    recovered = Log.open(log.dir, config(), recovery_point=0, clean_shutdown=False)
    try:
        # The failed batch may survive (it was never acknowledged); acknowledged ones all do,
        # and no offset is used twice.
        got = [r.offset for r in read_all(recovered)]
        assert got == list(range(recovered.log_end_offset))
        assert got[:3] == [0, 1, 2]
        assert recovered.append_as_leader(make_batch(1), 0).first_offset == recovered.log_end_offset - 1
    finally:
        recovered.close()


def test_failed_fsync_takes_the_log_offline(log: Log, disk: FaultyDisk) -> None:
    producer = Producer(log)
    producer.send()
    disk.fail_fsync = True
    with pytest.raises(KafkaStorageError, match="flushing"):
        log.flush()
    assert log.offline and log.recovery_point == 0
    with pytest.raises(KafkaStorageError, match="offline"):
        producer.send()


def test_failed_flush_messages_fsync_takes_the_log_offline(tmp_path: Path, disk: FaultyDisk) -> None:
    log = Log.open(tmp_path / "t-0", config().replace(flush_messages=1))
    log.append_as_leader(make_batch(1), 0)
    disk.fail_fsync = True
    with pytest.raises(KafkaStorageError, match="flushing"):
        log.append_as_leader(make_batch(1), 0)
    assert log.offline and log.recovery_point == 1
    log.close()
