"""Batches that go bad on disk, as Kafka's log loader and reads treat them: a clean
shutdown is trusted (a batch failing its CRC is served as stored, for the consumer's CRC
check to find), an unclean one cuts the log at the first invalid batch, and a batch
header that went bad where a clean load did not look ends a read before it instead of
failing the reads of the good batches ahead of it."""

import struct
from pathlib import Path

import pytest
from storage_testutil import crash, flip_byte, log_files, make_batch

from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient.errors import CorruptRecordError
from kclient.records import check_batch, decode_batches, iter_headers

CONFIG = LogConfig(index_interval_bytes=1)  # an index entry at every batch after the first


def build(dir: Path, batches: int) -> Path:
    log = Log.open(dir, CONFIG)
    for b in range(batches):  # timestamps grow: a clean load scans only after the last index entry
        log.append_as_leader(make_batch(1, prefix=f"{b}-", timestamp=1000 + b), 0)
    log.close()  # a clean close (the log manager then writes the clean-shutdown marker)
    (segment,) = log_files(dir)
    return segment


def positions(segment: Path) -> list[int]:
    return [pos for pos, _ in iter_headers(segment.read_bytes())]


def values(data: bytes) -> list[bytes]:
    return [r.value or b"" for _, records in decode_batches(data, check_crc=False) for r in records]


def test_a_clean_shutdown_is_trusted_and_the_bad_batch_is_served_as_stored(tmp_path: Path) -> None:
    segment = build(tmp_path / "t-0", 3)
    second = positions(segment)[1]
    flip_byte(segment, second + 70)  # a value byte: the CRC no longer matches
    log = Log.open(tmp_path / "t-0", CONFIG, recovery_point=3, clean_shutdown=True)
    assert log.log_end_offset == 3  # nothing validated, nothing cut (Kafka's LogLoader)
    data = log.read(0, 1 << 20).records
    headers = list(iter_headers(data))
    assert [h.base_offset for _, h in headers] == [0, 1, 2]
    check_batch(data, *headers[0])
    with pytest.raises(CorruptRecordError, match=r"base offset 1\) fails its CRC check"):
        check_batch(data, *headers[1])  # what a consumer's CRC check finds
    log.close()


def test_an_unclean_shutdown_cuts_the_log_at_the_bad_batch(tmp_path: Path) -> None:
    segment = build(tmp_path / "t-0", 3)
    flip_byte(segment, positions(segment)[1] + 70)
    log = Log.open(tmp_path / "t-0", CONFIG, recovery_point=3, clean_shutdown=False)
    assert log.log_end_offset == 1
    assert values(log.read(0, 1 << 20).records) == [b"0-0......."]
    assert log.append_as_leader(make_batch(1), 0).first_offset == 1
    log.close()


def test_a_bad_header_where_a_clean_load_did_not_look_ends_reads_before_it(tmp_path: Path) -> None:
    segment = build(tmp_path / "t-0", 10)
    bad = positions(segment)[5]
    with segment.open("r+b") as f:
        f.seek(bad + 8)
        f.write(struct.pack(">i", 3))  # batchLength 3: no batch can be that short
    log = Log.open(tmp_path / "t-0", CONFIG, recovery_point=10, clean_shutdown=True)
    try:
        assert log.log_end_offset == 10  # the tail after the last index entry is sound
        # Served as stored when the offset index jumps over it (Kafka serves a slice of the
        # file): the reader walks batches 0-4 and then finds the bad header itself.
        seen: list[int] = []
        with pytest.raises(CorruptRecordError, match=f"batch at position {bad} has batchLength 3"):
            for _, h in iter_headers(log.read(0, 1 << 20).records):
                seen.append(h.base_offset)
        assert seen == [0, 1, 2, 3, 4]
        # A read whose scan meets it ends before it. Before: CorruptRecordError, for the
        # good batches 0-4 too.
        first = log.read(0, bad + 70)  # the scan reads the next header (61 bytes)
        assert [h.base_offset for _, h in iter_headers(first.records)] == [0, 1, 2, 3, 4]
        assert first.next_offset == 5
        with pytest.raises(CorruptRecordError, match=f"batch at position {bad} has length 3"):
            log.read(5, 1 << 20)
        # Past it, the offset index finds the batches again (a consumer that seeks past).
        assert [h.base_offset for _, h in iter_headers(log.read(6, 1 << 20).records)] == [6, 7, 8, 9]
    finally:
        log.close()


def test_an_unclean_shutdown_cuts_a_bad_header_too(tmp_path: Path) -> None:
    segment = build(tmp_path / "t-0", 10)
    bad = positions(segment)[5]
    with segment.open("r+b") as f:
        f.seek(bad + 8)
        f.write(struct.pack(">i", 3))
    log = Log.open(tmp_path / "t-0", CONFIG, recovery_point=0, clean_shutdown=False)
    assert log.log_end_offset == 5 and segment.stat().st_size == bad
    log.close()


def test_a_crash_then_corruption_never_stops_the_load(tmp_path: Path) -> None:
    """Whatever byte of a batch goes bad, the log opens (clean or not) and reads."""
    dir = tmp_path / "t-0"
    log = Log.open(dir, CONFIG)
    for b in range(3):
        log.append_as_leader(make_batch(1, prefix=f"{b}-"), 0)
    crash(log)
    (segment,) = log_files(dir)
    original = segment.read_bytes()
    second = positions(segment)[1]
    for at in range(second, second + len(make_batch(1))):
        for clean in (True, False):
            segment.write_bytes(original)
            flip_byte(segment, at)
            reopened = Log.open(dir, CONFIG, recovery_point=0, clean_shutdown=clean)
            try:
                end = reopened.log_end_offset
                assert 1 <= end <= 3 or at - second < 8  # only a flipped base offset moves the end
                if end:
                    reopened.read(0, 1 << 20)
            finally:
                reopened.close()
