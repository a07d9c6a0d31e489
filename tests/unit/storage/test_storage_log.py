import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from crc32c import crc32c
from storage_testutil import (
    all_values,
    append_batches,
    log_files,
    make_batch,
    make_batches,
    offsets_of,
    read_all,
    records_of,
    small_config,
)

from kbroker.storage.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, Log
from kbroker.storage.log_config import LogConfig
from kclient.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    InvalidRecordError,
    MessageSizeTooLargeError,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
)
from kclient.records import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    HEADER_SIZE,
    RECORDS_COUNT_OFFSET,
    BatchBuilder,
    Compression,
    iter_headers,
    read_header,
)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    log = Log.open(tmp_path / "topic-0", small_config())
    yield log
    log.close()


def test_new_log(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "new-topic-3", LogConfig())
    assert log.log_start_offset == 0 and log.log_end_offset == 0
    assert log.num_segments == 1 and log.size_in_bytes == 0 and log.recovery_point == 0
    assert [p.name for p in log_files(log.dir)] == ["00000000000000000000.log"]
    assert log.read(0, 100).records == b""
    log.close()


def test_append_read_round_trip_across_many_segments(log: Log) -> None:
    expected = []
    for b in range(200):
        data = make_batch(3, value_size=40, prefix=f"{b}:", timestamp=1000 + b)
        info = log.append_as_leader(data, 0)
        assert (info.first_offset, info.last_offset) == (3 * b, 3 * b + 2)
        assert info.num_records == 3 and info.valid_bytes == len(data)
        assert info.max_timestamp == 1000 + b and info.offset_of_max_timestamp == 3 * b + 2
        expected += [f"{b}:{i}".encode().ljust(40, b".") for i in range(3)]
    assert log.log_end_offset == 600
    assert log.num_segments > 10
    assert len(log_files(log.dir)) == log.num_segments
    records = read_all(log, max_bytes=1000)
    assert [r.offset for r in records] == list(range(600))
    assert all_values(records) == expected
    # every offset, read on its own, comes back in the first batch returned
    for offset in range(0, 600, 7):
        fetched = log.read(offset, 1)
        first = read_header(fetched.records)
        assert first.base_offset <= offset <= first.last_offset
        assert fetched.first_offset == first.base_offset and fetched.next_offset == first.next_offset


def test_appended_batches_carry_offsets_and_epoch(log: Log) -> None:
    log.append_as_leader(make_batch(2), 7)
    log.append_as_leader(make_batch(3), 7)
    headers = [h for _, h in iter_headers(log.read(0, 1 << 20).records)]
    assert [(h.base_offset, h.last_offset, h.partition_leader_epoch) for h in headers] == [
        (0, 1, 7),
        (2, 4, 7),
    ]
    assert log.leader_epoch_cache.entries() == [(7, 0)]
    log.append_as_leader(make_batch(1), 9)
    assert log.leader_epoch_cache.entries() == [(7, 0), (9, 5)]
    with pytest.raises(FencedLeaderEpochError):
        log.append_as_leader(make_batch(1), 8)
    with pytest.raises(ValueError):
        log.append_as_leader(make_batch(1), -1)


def test_several_batches_in_one_append(log: Log) -> None:
    data = make_batches(5, per_batch=4)
    info = log.append_as_leader(data, 0)
    assert (info.first_offset, info.last_offset, info.num_records) == (0, 19, 20)
    assert offsets_of(log.read(0, 1 << 20).records) == list(range(20))


def test_read_at_end_and_out_of_range(log: Log) -> None:
    append_batches(log, 3, per_batch=2)
    end = log.read(6, 100)
    assert end.records == b"" and end.next_offset == 6 and end.log_end_offset == 6
    for bad in (7, 100, -1):
        with pytest.raises(OffsetOutOfRangeError) as info:
            log.read(bad, 100)
        assert "0 to 6" in str(info.value)
    log.maybe_increment_log_start_offset(2)
    with pytest.raises(OffsetOutOfRangeError, match="2 to 6"):
        log.read(1, 100)
    assert offsets_of(log.read(2, 1 << 20).records)[0] == 2


def test_read_max_bytes_and_min_one_batch(log: Log) -> None:
    big = make_batch(20, value_size=100)
    small = make_batch(1)
    log.append_as_leader(big, 0)
    log.append_as_leader(small, 0)
    log.append_as_leader(small, 0)
    info = log.read(0, 10)
    assert info.records == log.read(0, len(big)).records and len(info.records) == len(big)
    assert log.read(0, 10, min_one_batch=False).records == b""
    assert len(log.read(0, len(big) + len(small) + 5).records) == len(big) + len(small)
    assert len(log.read(0, 1 << 20).records) == len(big) + 2 * len(small)
    # mid-batch start returns the whole batch holding it
    assert offsets_of(log.read(5, 1).records) == list(range(20))


def test_read_respects_max_offset(log: Log) -> None:
    append_batches(log, 5, per_batch=2)  # batches 0-1, 2-3, 4-5, 6-7, 8-9
    assert offsets_of(log.read(0, 1 << 20, max_offset=6).records) == [0, 1, 2, 3, 4, 5]
    assert offsets_of(log.read(0, 1 << 20, max_offset=5).records) == [0, 1, 2, 3]
    hw = log.read(4, 1 << 20, max_offset=5)
    assert hw.records == b"" and hw.next_offset == 4
    assert log.read(6, 1 << 20, max_offset=6).records == b""
    assert log.read(0, 1, max_offset=1).records == b""  # not even min_one_batch


def test_read_after_roll_continues_in_next_segment(log: Log) -> None:
    append_batches(log, 2)
    log.roll()
    append_batches(log, 2)
    assert log.num_segments == 2
    first = log.read(0, 1 << 20)
    assert offsets_of(first.records) == [0, 1]  # one segment per read
    assert offsets_of(log.read(first.next_offset, 1 << 20).records) == [2, 3]


def snapshot(log: Log) -> tuple[int, int, list[tuple[str, bytes]]]:
    contents = [(p.name, p.read_bytes()) for p in sorted(log.dir.iterdir())]
    return log.log_end_offset, log.size_in_bytes, contents


def corrupt_crc(data: bytes) -> bytes:
    buf = bytearray(data)
    buf[-1] ^= 0x01
    return bytes(buf)


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: corrupt_crc(make_batch(3)), CorruptRecordError),
        (lambda: make_batch(3)[:-5], CorruptRecordError),
        (lambda: make_batch(3)[:40], CorruptRecordError),
        (lambda: make_batch(3) + b"\x00\x01garbage", CorruptRecordError),
        (lambda: make_batch(3) + make_batch(2)[:70], CorruptRecordError),
        (lambda: make_batch(2) + corrupt_crc(make_batch(2)), CorruptRecordError),
        (lambda: b"", CorruptRecordError),
        (lambda: make_batch(1, value_size=3000), MessageSizeTooLargeError),
        (lambda: make_batch(1) * 3 + make_batch(1, value_size=3000), MessageSizeTooLargeError),
        (lambda: make_batches(60, 1, value_size=60), RecordListTooLargeError),
    ],
)
def test_leader_append_validation(tmp_path: Path, make, error) -> None:  # type: ignore[no-untyped-def]
    log = Log.open(tmp_path / "t-0", small_config(max_message_bytes=2048))
    append_batches(log, 2)
    before = snapshot(log)
    with pytest.raises(error) as info:
        log.append_as_leader(make(), 1)
    assert str(info.value)
    assert snapshot(log) == before
    assert log.leader_epoch_cache.latest_epoch == 0
    info2 = log.append_as_leader(make_batch(1), 1)  # the log still works
    assert info2.first_offset == 2
    log.close()


def with_crc(buf: bytearray) -> bytes:
    buf[CRC_OFFSET:ATTRIBUTES_OFFSET] = crc32c(bytes(buf[ATTRIBUTES_OFFSET:])).to_bytes(4, "big")
    return bytes(buf)


def test_leader_append_rejects_inconsistent_batches(log: Log) -> None:
    bad_count = bytearray(make_batch(3))
    bad_count[RECORDS_COUNT_OFFSET:HEADER_SIZE] = (5).to_bytes(4, "big")
    with pytest.raises(InvalidRecordError, match="holds 5 records"):
        log.append_as_leader(with_crc(bad_count), 0)
    control = bytearray(make_batch(1))
    control[ATTRIBUTES_OFFSET : ATTRIBUTES_OFFSET + 2] = CONTROL_FLAG_MASK.to_bytes(2, "big")
    with pytest.raises(InvalidRecordError, match="control batch"):
        log.append_as_leader(with_crc(control), 0)
    bad_magic = bytearray(make_batch(1))
    bad_magic[16] = 1
    with pytest.raises(CorruptRecordError, match="magic"):
        log.append_as_leader(bytes(bad_magic), 0)
    assert log.log_end_offset == 0 and log.size_in_bytes == 0


def test_follower_append_keeps_offsets_and_epochs(tmp_path: Path) -> None:
    leader = Log.open(tmp_path / "leader-0", small_config())
    follower = Log.open(tmp_path / "follower-0", small_config())
    append_batches(leader, 3, per_batch=2, epoch=1)
    append_batches(leader, 2, per_batch=3, epoch=4)
    offset = 0
    while offset < leader.log_end_offset:
        fetched = leader.read(offset, 150)
        info = follower.append_as_follower(fetched.records)
        assert info.first_offset == offset
        offset = info.last_offset + 1
    assert follower.log_end_offset == leader.log_end_offset == 12
    assert follower.read(0, 1 << 20).records == leader.read(0, 1 << 20).records
    assert follower.leader_epoch_cache.entries() == [(1, 0), (4, 6)]
    with pytest.raises(OffsetOutOfRangeError, match="starts at offset 9 but the log end offset is 12"):
        follower.append_as_follower(leader.read(10, 1 << 20).records)
    with pytest.raises(CorruptRecordError):
        follower.append_as_follower(corrupt_crc(leader.read(9, 1 << 20).records))
    assert follower.log_end_offset == 12
    leader.close()
    follower.close()


def test_follower_append_requires_increasing_offsets(log: Log) -> None:
    one = BatchBuilder(base_offset=0)
    one.append(1, None, b"a")
    two = BatchBuilder(base_offset=0)
    two.append(1, None, b"b")
    with pytest.raises(CorruptRecordError, match="before the end"):
        log.append_as_follower(one.build() + two.build())
    assert log.log_end_offset == 0


def test_roll_by_size(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", small_config(segment_bytes=1000))
    batch = make_batch(1, value_size=200)
    for _ in range(10):
        log.append_as_leader(batch, 0)
    per_segment = 1000 // len(batch)
    assert all(s.size <= 1000 for s in log.segments)
    assert log.num_segments == -(-10 // per_segment)
    assert [s.base_offset for s in log.segments] == list(range(0, 10, per_segment))
    log.close()


def test_roll_by_segment_ms_uses_batch_timestamps(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", small_config(segment_bytes=1 << 20, segment_ms=1000))
    log.append_as_leader(make_batch(1, timestamp=10_000), 0, now_ms=10_000)
    log.append_as_leader(make_batch(1, timestamp=10_900), 0, now_ms=10_900)
    assert log.num_segments == 1
    log.append_as_leader(make_batch(1, timestamp=11_001), 0, now_ms=11_001)
    assert log.num_segments == 2 and log.active_segment.base_offset == 2
    log.close()


def test_roll_when_index_full(tmp_path: Path) -> None:
    config = small_config(segment_bytes=1 << 20, segment_index_bytes=24, index_interval_bytes=0)
    log = Log.open(tmp_path / "t-0", config)
    append_batches(log, 10)
    assert log.num_segments > 1
    assert all(s.offset_index.entries <= 3 for s in log.segments)
    assert [r.offset for r in read_all(log)] == list(range(10))
    log.close()


def test_explicit_roll(log: Log) -> None:
    assert log.roll() == 0  # empty active segment: nothing to do
    append_batches(log, 3)
    assert log.roll() == 3
    assert log.roll() == 3
    assert log.num_segments == 2


def test_flush_policy_messages(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", small_config(flush_messages=5))
    log.append_as_leader(make_batch(3), 0)
    assert log.recovery_point == 0
    log.append_as_leader(make_batch(3), 0)
    assert log.recovery_point == 6
    log.append_as_leader(make_batch(1), 0)
    assert log.recovery_point == 6
    log.close()
    every = Log.open(tmp_path / "t-1", small_config(flush_messages=1))
    for i in range(1, 4):
        every.append_as_leader(make_batch(2), 0)
        assert every.recovery_point == 2 * i
    every.close()


def test_flush_policy_default_leaves_it_to_the_os(log: Log) -> None:
    append_batches(log, 5)
    assert log.recovery_point == 0
    assert not log.flush_if_due()
    log.flush()
    assert log.recovery_point == 5


def test_flush_ms(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", small_config(flush_ms=1000))
    append_batches(log, 2)
    now = log._last_flush_ms
    assert not log.flush_if_due(now + 500)
    assert log.flush_if_due(now + 1000)
    assert log.recovery_point == 2
    assert not log.flush_if_due(now + 5000)  # nothing new to flush
    log.close()


def test_rolled_segment_is_flushed_in_the_background(log: Log) -> None:
    append_batches(log, 3)
    log.roll()
    append_batches(log, 2)
    assert log.recovery_point == 0
    assert log.flush_if_due()
    assert log.recovery_point == 3  # up to the rolled segment, not the active one
    assert not log.flush_if_due()


def test_truncate_to(log: Log) -> None:
    for epoch in (1, 2, 3):
        append_batches(log, 40, per_batch=2, epoch=epoch, value_size=40)
    assert log.num_segments > 3
    segments = log.num_segments
    assert log.leader_epoch_cache.entries() == [(1, 0), (2, 80), (3, 160)]
    assert log.truncate_to(161)  # inside a batch: the batch goes whole
    assert log.log_end_offset == 160
    assert log.leader_epoch_cache.entries() == [(1, 0), (2, 80)]
    assert log.truncate_to(100)
    assert log.log_end_offset == 100 and log.num_segments < segments
    assert not log.truncate_to(100)
    assert not log.truncate_to(1000)
    assert len(log_files(log.dir)) == log.num_segments
    assert [r.offset for r in read_all(log)] == list(range(100))
    info = log.append_as_leader(make_batch(2), 5)
    assert info.first_offset == 100
    assert log.leader_epoch_cache.entries() == [(1, 0), (2, 80), (5, 100)]
    assert [r.offset for r in read_all(log)] == list(range(102))


def test_truncate_to_zero(log: Log) -> None:
    append_batches(log, 50)
    assert log.truncate_to(0)
    assert log.log_end_offset == 0 and log.size_in_bytes == 0
    assert log.leader_epoch_cache.entries() == []
    assert log.append_as_leader(make_batch(1), 0).first_offset == 0


def test_truncate_fully_and_start_at(log: Log) -> None:
    append_batches(log, 50)
    log.truncate_fully_and_start_at(1000)
    assert log.log_start_offset == log.log_end_offset == 1000
    assert log.num_segments == 1 and log.size_in_bytes == 0
    assert [p.name for p in log_files(log.dir)] == ["00000000000000001000.log"]
    assert log.leader_epoch_cache.entries() == []
    assert log.append_as_leader(make_batch(1), 2).first_offset == 1000
    with pytest.raises(OffsetOutOfRangeError):
        log.read(999, 100)


def test_maybe_increment_log_start_offset(log: Log) -> None:
    append_batches(log, 100, epoch=3, value_size=100)
    segments = log.segments
    assert len(segments) > 3
    target = segments[2].base_offset + 1
    assert log.maybe_increment_log_start_offset(target)
    assert log.log_start_offset == target
    assert log.segments[0].base_offset == segments[2].base_offset  # two whole segments gone
    assert log.leader_epoch_cache.entries() == [(3, target)]
    assert not log.maybe_increment_log_start_offset(target - 1)
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(101)
    assert log.maybe_increment_log_start_offset(100)
    assert log.num_segments == 1 and log.log_start_offset == 100


def test_offset_for_timestamp(log: Log) -> None:
    for b in range(50):
        builder = BatchBuilder()
        for i in range(4):
            builder.append(100_000 + b * 1000 + i * 100, None, b"x" * 30)
        log.append_as_leader(builder.build(), 0)
    assert log.num_segments > 1
    assert log.offset_for_timestamp(0) == (0, 100_000)
    assert log.offset_for_timestamp(100_000) == (0, 100_000)
    assert log.offset_for_timestamp(100_001) == (1, 100_100)
    assert log.offset_for_timestamp(125_250) == (103, 125_300)
    assert log.offset_for_timestamp(125_301) == (104, 126_000)
    assert log.offset_for_timestamp(149_300) == (199, 149_300)
    assert log.offset_for_timestamp(149_301) is None
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (0, -1)
    assert log.offset_for_timestamp(LATEST_TIMESTAMP) == (200, -1)
    log.maybe_increment_log_start_offset(150)
    assert log.offset_for_timestamp(0) == (150, 137_200)


def test_offset_for_timestamp_out_of_order_and_compressed(log: Log) -> None:
    builder = BatchBuilder(Compression.LZ4)
    for ts in (5000, 3000, 9000, 7000):
        builder.append(ts, None, b"v")
    log.append_as_leader(builder.build(), 0)
    log.append_as_leader(make_batch(1, timestamp=4000), 0)
    assert log.offset_for_timestamp(6000) == (2, 9000)
    assert log.offset_for_timestamp(4000) == (0, 5000)
    assert log.offset_for_timestamp(9001) is None


def test_log_append_time(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", small_config(message_timestamp_type="LogAppendTime"))
    info = log.append_as_leader(make_batch(3, timestamp=5), 0, now_ms=1_700_000_000_000)
    assert info.log_append_time == 1_700_000_000_000
    assert info.max_timestamp == 1_700_000_000_000
    records = records_of(log.read(0, 1 << 20).records)  # decode checks the CRC
    assert [r.timestamp for r in records] == [1_700_000_000_000] * 3
    log.close()


def test_update_config(log: Log) -> None:
    log.update_config(log.config.replace(segment_bytes=300))
    append_batches(log, 10, value_size=100)
    assert log.num_segments >= 5


def test_closed_log_refuses_work(log: Log) -> None:
    append_batches(log, 1)
    log.close()
    log.close()
    with pytest.raises(Exception, match="closed"):
        log.read(0, 100)
    with pytest.raises(Exception, match="closed"):
        log.append_as_leader(make_batch(1), 0)


def test_delete_removes_directory(log: Log) -> None:
    append_batches(log, 10)
    log.delete()
    assert not log.dir.exists()


def test_concurrent_appends_and_reads(log: Log) -> None:
    log.update_config(log.config.replace(segment_bytes=20_000))
    total_batches = 400
    errors: list[BaseException] = []
    done = threading.Event()

    def writer() -> None:
        try:
            for b in range(total_batches):
                log.append_as_leader(make_batch(2, prefix=f"{b}-"), 0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            done.set()

    def reader() -> None:
        try:
            offset = 0
            while offset < 2 * total_batches:
                if offset >= log.log_end_offset:
                    if done.is_set() and offset >= log.log_end_offset:
                        break
                    continue
                info = log.read(offset, 3000)
                records = records_of(info.records)
                assert records and records[0].offset <= offset
                assert [r.offset for r in records] == list(range(records[0].offset, records[0].offset + len(records)))
                offset = info.next_offset
            assert offset == 2 * total_batches
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert log.log_end_offset == 2 * total_batches


def test_read_matches_a_reference_for_many_limits(tmp_path: Path) -> None:
    """Reads cut at the same batch boundaries as a naive scan of the whole log would."""
    log = Log.open(tmp_path / "t-0", small_config(segment_bytes=1 << 20, index_interval_bytes=300))
    sizes = [1, 5, 2, 9, 1, 1, 3, 7, 2, 4] * 8
    for i, count in enumerate(sizes):
        log.append_as_leader(make_batch(count, value_size=10 + 7 * (i % 5)), 0)
    whole = log.read(0, 1 << 30).records
    batches = [(pos, h) for pos, h in iter_headers(whole)]

    def reference(start: int, max_bytes: int, max_offset: int | None) -> bytes:
        chosen = [(p, h) for p, h in batches if h.last_offset >= start]
        out: list[tuple[int, int]] = []
        for p, h in chosen:
            if max_offset is not None and h.last_offset >= max_offset:
                break
            if out and p + h.size - out[0][0] > max_bytes:
                break
            if not out and h.size > max_bytes:
                out.append((p, p + h.size))  # min_one_batch
                break
            out.append((p, p + h.size))
        return whole[out[0][0] : out[-1][1]] if out else b""

    end = log.log_end_offset
    for start in range(0, end, 3):
        for max_bytes in (1, 100, 350, 700, 1500, 5000, 1 << 20):
            for max_offset in (None, start + 1, start + 10, end):
                got = log.read(start, max_bytes, max_offset=max_offset)
                assert got.records == reference(start, max_bytes, max_offset), (start, max_bytes, max_offset)
                if got.records:
                    last = [h for _, h in iter_headers(got.records)][-1]
                    assert got.next_offset == last.next_offset
                else:
                    assert got.next_offset == start
    log.close()
