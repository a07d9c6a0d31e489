"""A full disk during an append loses nothing that was acknowledged.

Real ENOSPC and short writes: each test mounts a small tmpfs (needs root), fills it
to exactly full and appends through the storage API (Log). A failed append must
leave the log exactly as before; after space is freed appends continue at the next
offset, and recovery after a crash keeps every acknowledged record.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient.errors import KafkaStorageError
from kclient.records import BatchBuilder, decode_batches

pytestmark = pytest.mark.integration

PAGE = 4096  # tmpfs allocates whole pages


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs, unmounted after the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k,mode=0755", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode:
            subprocess.run(["umount", "--lazy", str(mount_point)], check=True)


def fill(mount_point: Path) -> Path:
    """Write a filler file until the file system is exactly full; returns it."""
    filler = mount_point / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for chunk in (bytes(64 * 1024), bytes(PAGE), b"\x00"):
            while True:
                try:
                    if os.write(fd, chunk) < len(chunk):
                        break
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    stats = os.statvfs(mount_point)
    assert stats.f_bavail == 0
    return filler


def config() -> LogConfig:
    # One segment; an offset index entry after every batch (index.interval.bytes=0).
    return LogConfig(segment_bytes=1 << 20, index_interval_bytes=0, file_delete_delay_ms=0)


def batch(n: int, value_size: int, timestamp: int = 1_000) -> bytes:
    builder = BatchBuilder()
    builder.append(timestamp, b"k", b"%d:" % n + b"." * value_size)
    return builder.build()


class Producer:
    """Appends one-record batches and remembers what was acknowledged."""

    def __init__(self, log: Log, value_size: int) -> None:
        self.log = log
        self.value_size = value_size
        self.acked: list[tuple[int, bytes]] = []
        self.refused = 0

    def send(self, timestamp: int = 1_000) -> bool:
        n = len(self.acked) + self.refused
        data = batch(n, self.value_size, timestamp)
        try:
            info = self.log.append_as_leader(data, 0)
        except KafkaStorageError as exc:
            assert "No space left" in str(exc)
            self.refused += 1
            return False
        records = [r for _, rs in decode_batches(data) for r in rs]
        self.acked.append((info.first_offset, records[0].value or b""))
        return True

    def check(self, log: Log) -> None:
        """Every acknowledged record is in ``log``, once, at its offset, nothing else."""
        got: list[tuple[int, bytes]] = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            info = log.read(offset, 1 << 20)
            got += [(r.offset, r.value or b"") for _, rs in decode_batches(info.records) for r in rs]
            offset = info.next_offset
        assert got == self.acked
        assert [o for o, _ in got] == list(range(len(got)))


def state(log: Log) -> tuple[int, int, dict[str, bytes]]:
    files = {p.name: p.read_bytes() for p in sorted(log.dir.iterdir())}
    return log.log_end_offset, log.size_in_bytes, files


def recover(log: Log) -> Log:
    """Drop the log as a killed broker would, and load it with full recovery."""
    for segment in log.segments:
        segment._close_files()
    log._closed = True
    return Log.open(log.dir, config(), recovery_point=0, clean_shutdown=False)


def test_index_write_fails_on_a_full_disk_after_the_batch_was_written(tmpfs: Path) -> None:
    """The issue's case: the batch fits in the .log's last page, the index entry needs a
    new page. The producer gets KAFKA_STORAGE_ERROR and the batch must not stay behind."""
    # 513 batches make 512 offset index entries: exactly one page of .index. Pick a
    # batch size that leaves room for one more batch in the .log's last page.
    value_size = next(v for v in range(10, 200) if PAGE - (513 * len(batch(0, v))) % PAGE >= 2 * len(batch(0, v)) + 16)
    log = Log.open(tmpfs / "t-0", config())
    producer = Producer(log, value_size)
    try:
        for _ in range(513):
            assert producer.send()
        index = log.active_segment.offset_index.path
        assert index.stat().st_size == PAGE and log.active_segment.size % PAGE
        filler = fill(tmpfs)
        before = state(log)
        for _ in range(3):  # the .log write succeeds, the .index write does not
            assert not producer.send()
            assert state(log) == before
        assert not log.offline
        filler.unlink()
        for _ in range(20):
            assert producer.send()
        assert [o for o, _ in producer.acked] == list(range(533))
        producer.check(log)
        recovered = recover(log)
        producer.check(recovered)
        log = producer.log = recovered
        assert producer.send()
        producer.check(log)
    finally:
        log.close()


def test_every_append_on_an_exactly_full_disk(tmpfs: Path) -> None:
    """Every append is first tried on an exactly full disk, so each page boundary of the
    .log, .index and .timeindex is met by a real ENOSPC or short write: the append either
    fits in the slack or fails and changes nothing. Then a little space is freed and it
    must succeed. Finally a crash and recovery keep every acknowledged record."""
    log = Log.open(tmpfs / "t-0", config())
    producer = Producer(log, value_size=0)
    filler = tmpfs / "filler"
    failed_after_a_page = 0
    try:
        for i in range(700):
            producer.value_size = (i * 37) % 150  # batch sizes 72..221 bytes
            fill(tmpfs)
            before = state(log)
            if not producer.send(timestamp=1_000 + i):
                assert state(log) == before  # a failed append changes nothing
                assert not log.offline
                os.truncate(filler, filler.stat().st_size - 16 * PAGE)
                assert producer.send(timestamp=1_000 + i)
                failed_after_a_page += log.active_segment.offset_index.path.stat().st_size % PAGE == 8
        assert producer.refused > 20
        assert failed_after_a_page  # at least once, the .index was the file that needed a page
        producer.check(log)
        recovered = recover(log)
        producer.check(recovered)
        log = producer.log = recovered
        fill(tmpfs)
        producer.send(timestamp=5_000)  # full again, on a log loaded by recovery
        producer.check(log)
    finally:
        log.close()
