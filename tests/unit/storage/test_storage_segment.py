import os
from pathlib import Path

import pytest
from storage_testutil import offsets_of, records_of

from kbroker.storage import files
from kbroker.storage.leader_epoch import LeaderEpochCache
from kbroker.storage.segment import LogSegment
from kclient.records import BatchBuilder, iter_headers


def batch_at(base_offset: int, count: int = 1, *, timestamp: int = 1000, epoch: int = 0, value_size: int = 50) -> bytes:
    builder = BatchBuilder(base_offset=base_offset, partition_leader_epoch=epoch)
    for i in range(count):
        builder.append(timestamp + i, None, b"x" * value_size)
    return builder.build()


def new_segment(dir: Path, base: int = 0, interval: int = 0, index_size: int = 4096) -> LogSegment:
    return LogSegment.open(dir, base, index_interval_bytes=interval, max_index_size=index_size, create=True)


def fill(segment: LogSegment, batches: int, per_batch: int = 2, ts0: int = 1000) -> list[bytes]:
    out = []
    offset = segment.next_offset
    for b in range(batches):
        data = batch_at(offset, per_batch, timestamp=ts0 + 10 * b)
        segment.append(data)
        out.append(data)
        offset += per_batch
    return out


def test_append_read_and_indexes(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, 100)
    assert seg.is_empty and seg.next_offset == 100
    written = fill(seg, 10)
    assert seg.size == sum(map(len, written))
    assert seg.next_offset == 120
    # interval 0: an index entry for every batch but the first
    assert seg.offset_index.entries == 9
    assert seg.offset_index.lookup(103) == (103, len(written[0]))  # batch 102..103
    assert seg.offset_index.lookup(104) == (103, len(written[0]))
    assert seg.max_timestamp_so_far == 1000 + 90 + 1
    assert seg.offset_of_max_timestamp == 119
    whole = seg.read(100, 1 << 20)
    assert whole is not None and whole.records == b"".join(written)
    assert whole.first_offset == 100 and whole.next_offset == 120 and whole.position == 0
    mid = seg.read(107, 1 << 20)
    assert mid is not None and offsets_of(mid.records)[0] == 106  # batch holding 107
    assert seg.read(120, 100) is None
    for suffix in (".log", ".index", ".timeindex"):
        assert (tmp_path / f"00000000000000000100{suffix}").exists()
    seg.close()


def test_read_limits(tmp_path: Path) -> None:
    seg = new_segment(tmp_path)
    written = fill(seg, 5)
    size = len(written[0])
    two = seg.read(0, 2 * size + 10)
    assert two is not None and two.records == written[0] + written[1] and two.next_offset == 4
    none = seg.read(0, size - 1)
    assert none is not None and none.records == b"" and none.first_offset == -1
    one = seg.read(0, size - 1, min_one_batch=True)
    assert one is not None and one.records == written[0]
    capped = seg.read(0, 1 << 20, max_offset=5)
    assert capped is not None and offsets_of(capped.records) == [0, 1, 2, 3]
    blocked = seg.read(4, 1 << 20, max_offset=5, min_one_batch=True)
    assert blocked is not None and blocked.records == b""
    bounded = seg.read(0, 1 << 20, max_position=3 * size)
    assert bounded is not None and bounded.records == b"".join(written[:3])
    seg.close()


def test_reopen_loads_state(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, 0, interval=200)
    fill(seg, 20)
    entries = seg.offset_index.entries
    seg.close()
    again = LogSegment.open(tmp_path, 0, index_interval_bytes=200, max_index_size=4096)
    again.sanity_check()
    assert again.load()
    assert again.next_offset == 40 and again.offset_index.entries == entries
    assert again.max_timestamp_so_far == 1000 + 190 + 1
    assert offsets_of(again.read(0, 1 << 20).records) == list(range(40))  # type: ignore[union-attr]
    again.close()


def test_recover_rebuilds_identical_indexes(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, 0, interval=300)
    fill(seg, 30)
    seg.on_become_inactive()
    index_bytes = files.offset_index_file(tmp_path, 0).read_bytes()
    cache = LeaderEpochCache(None)
    assert seg.recover(cache) == 0
    seg.on_become_inactive()
    assert files.offset_index_file(tmp_path, 0).read_bytes() == index_bytes
    assert seg.next_offset == 60
    assert cache.entries() == [(0, 0)]
    seg.close()


def test_recover_truncates_torn_tail(tmp_path: Path) -> None:
    seg = new_segment(tmp_path)
    written = fill(seg, 4)
    os.pwrite(seg._fd, written[0][:30], seg.size)  # half a batch header
    seg._size += 30
    assert seg.recover() == 30
    assert seg.size == sum(map(len, written)) and seg.next_offset == 8
    seg.close()


def test_recover_rejects_offsets_going_back(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, 10)
    seg.append(batch_at(10, 2))
    stale = batch_at(5, 2)  # valid CRC, wrong offsets
    os.pwrite(seg._fd, stale, seg.size)
    assert seg.recover() == len(stale)
    assert seg.next_offset == 12
    seg.close()


def test_truncate_to(tmp_path: Path) -> None:
    seg = new_segment(tmp_path)
    written = fill(seg, 5)
    removed = seg.truncate_to(5)  # offset 5 is inside the batch 4..5: it goes whole
    assert removed == 3 * len(written[0])
    assert seg.next_offset == 4 and seg.size == 2 * len(written[0])
    assert seg.offset_index.last_offset < 4
    assert seg.truncate_to(100) == 0
    seg.append(batch_at(4, 3))
    assert offsets_of(seg.read(0, 1 << 20).records) == list(range(7))  # type: ignore[union-attr]
    size = seg.size
    assert seg.truncate_to(0) == size
    assert seg.is_empty and seg.next_offset == 0 and seg.max_timestamp_so_far == -1
    seg.close()


def test_find_offset_by_timestamp(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, 0, interval=100)
    offset = 0
    for b in range(20):
        builder = BatchBuilder(base_offset=offset)
        for i in range(5):
            builder.append(10_000 + b * 100 + i * 10, None, b"v")
        seg.append(builder.build())
        offset += 5
    assert seg.find_offset_by_timestamp(0) == (0, 10_000)
    assert seg.find_offset_by_timestamp(10_000) == (0, 10_000)
    assert seg.find_offset_by_timestamp(10_001) == (1, 10_010)
    assert seg.find_offset_by_timestamp(10_735) == (39, 10_740)
    assert seg.find_offset_by_timestamp(10_741) == (40, 10_800)
    assert seg.find_offset_by_timestamp(10_000, starting_offset=42) == (42, 10_820)
    assert seg.find_offset_by_timestamp(99_999) is None
    seg.close()


def test_should_roll(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, 0, index_size=16)
    kw = dict(max_timestamp_in_messages=1000, max_offset_in_messages=1, now_ms=0, segment_bytes=10_000, segment_ms=1000)
    assert not seg.should_roll(messages_size=100_000, **kw)  # type: ignore[arg-type]
    seg.append(batch_at(0, 1, timestamp=1000))
    assert not seg.should_roll(messages_size=100, **kw)  # type: ignore[arg-type]
    assert seg.should_roll(messages_size=10_000, **kw)  # type: ignore[arg-type]
    late = dict(kw, max_timestamp_in_messages=2001)
    assert seg.should_roll(messages_size=100, **late)  # type: ignore[arg-type]
    huge_offset = dict(kw, max_offset_in_messages=2**31)
    assert seg.should_roll(messages_size=100, **huge_offset)  # type: ignore[arg-type]
    seg.close()


def test_create_refuses_to_overwrite(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, 7)
    seg.append(batch_at(7))
    seg.close()
    with pytest.raises(Exception, match="non-empty"):
        new_segment(tmp_path, 7)


def test_rename_and_delete(tmp_path: Path) -> None:
    seg = new_segment(tmp_path, 0)
    data = fill(seg, 2)
    seg.rename_with_suffix(".deleted")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00000000000000000000.index.deleted",
        "00000000000000000000.log.deleted",
        "00000000000000000000.timeindex.deleted",
    ]
    assert seg.read(0, 1 << 20).records == b"".join(data)  # type: ignore[union-attr]
    seg.delete()
    assert list(tmp_path.iterdir()) == []


def test_iter_headers(tmp_path: Path) -> None:
    seg = new_segment(tmp_path)
    data = fill(seg, 3)
    assert [h for _, h in seg.iter_headers()] == [h for _, h in iter_headers(b"".join(data))]
    assert records_of(b"".join(data))[0].offset == 0
    seg.close()
