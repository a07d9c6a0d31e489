from pathlib import Path

import pytest

from kbroker.storage import index as index_module
from kbroker.storage.index import CorruptIndexError, OffsetIndex, TimeIndex


def test_offset_index_floor_lookup(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "a.index", 100, 1024)
    assert index.lookup(150) == (100, 0)
    for offset, position in [(104, 400), (109, 900), (120, 2000)]:
        index.append(offset, position)
    assert index.lookup(99) == (100, 0)
    assert index.lookup(100) == (100, 0)
    assert index.lookup(103) == (100, 0)
    assert index.lookup(104) == (104, 400)
    assert index.lookup(108) == (104, 400)
    assert index.lookup(109) == (109, 900)
    assert index.lookup(10**12) == (120, 2000)
    assert index.entries == 3 and index.last_entry == (120, 2000)
    assert (tmp_path / "a.index").stat().st_size == 24
    index.sanity_check()
    index.close()


def test_offset_index_persists_big_endian(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    index = OffsetIndex(path, 5, 1024)
    index.append(6, 70)
    index.close()
    assert path.read_bytes() == b"\x00\x00\x00\x01\x00\x00\x00\x46"
    again = OffsetIndex(path, 5, 1024)
    assert again.lookup(6) == (6, 70)
    again.close()


def test_offset_index_rejects_out_of_order_and_full(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "a.index", 0, 16)
    assert index.max_entries == 2
    index.append(5, 100)
    with pytest.raises(ValueError):
        index.append(5, 200)
    with pytest.raises(ValueError):
        index.append(6, 100)
    index.append(6, 200)
    assert index.is_full
    with pytest.raises(ValueError):
        index.append(7, 300)
    with pytest.raises(ValueError):
        OffsetIndex(tmp_path / "b.index", 10, 16).append(9, 1)
    index.close()


def test_offset_index_truncate(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    index = OffsetIndex(path, 0, 1024)
    for i in range(1, 6):
        index.append(i * 10, i * 100)
    index.truncate_to(30)
    assert index.entries == 2 and index.last_entry == (20, 200)
    assert path.stat().st_size == 16
    index.truncate_to(31)
    assert index.entries == 2
    index.append(35, 300)
    index.reset()
    assert index.entries == 0 and path.stat().st_size == 0
    index.close()


def test_offset_index_sanity_check(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    path.write_bytes(b"\x00\x00\x00\x05\x00\x00\x01\x00" + b"\x00\x00\x00\x03\x00\x00\x02\x00")
    index = OffsetIndex(path, 0, 1024)
    with pytest.raises(CorruptIndexError, match="corrupt"):
        index.sanity_check()
    index.close()
    path.write_bytes(b"\x00" * 9)
    index = OffsetIndex(path, 0, 1024)
    with pytest.raises(CorruptIndexError, match="multiple"):
        index.sanity_check()
    index.close()


def test_time_index(tmp_path: Path) -> None:
    path = tmp_path / "a.timeindex"
    index = TimeIndex(path, 100, 1024)
    assert index.lookup(5000) == (-1, 100)
    assert not index.maybe_append(-1, 100)  # no timestamp: no entry
    assert index.maybe_append(1000, 104)
    assert not index.maybe_append(1000, 105)  # not newer
    assert not index.maybe_append(900, 106)
    assert index.maybe_append(2000, 110)
    assert index.maybe_append(3000, 110)
    with pytest.raises(ValueError):
        index.maybe_append(4000, 109)  # offsets never go back
    assert index.lookup(999) == (-1, 100)
    assert index.lookup(1000) == (1000, 104)
    assert index.lookup(2500) == (2000, 110)
    assert index.lookup(10**15) == (3000, 110)
    assert path.stat().st_size == 36
    index.sanity_check()
    index.close()
    again = TimeIndex(path, 100, 1024)
    assert again.last_entry == (3000, 110)
    again.truncate_to(110)
    assert again.entries == 1 and again.last_entry == (1000, 104)
    assert path.stat().st_size == 12
    again.close()


def test_time_index_full_and_skip_full_check(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "a.timeindex", 0, 12)
    assert index.maybe_append(1, 1)
    assert index.is_full
    with pytest.raises(ValueError):
        index.maybe_append(2, 2)
    assert index.maybe_append(2, 2, skip_full_check=True)
    index.close()


def test_time_index_sanity_check(tmp_path: Path) -> None:
    path = tmp_path / "a.timeindex"
    path.write_bytes(
        (5000).to_bytes(8, "big") + (1).to_bytes(4, "big") + (4000).to_bytes(8, "big") + (2).to_bytes(4, "big")
    )
    index = TimeIndex(path, 0, 1024)
    with pytest.raises(CorruptIndexError):
        index.sanity_check()
    index.close()


def test_offset_index_floor_by_position(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "a.index", 0, 1024)
    assert index.floor_entry_by_position(10**6) is None
    for offset, position in [(4, 400), (9, 900), (20, 2000)]:
        index.append(offset, position)
    assert index.floor_entry_by_position(399) is None
    assert index.floor_entry_by_position(400) == (4, 400)
    assert index.floor_entry_by_position(1999) == (9, 900)
    assert index.floor_entry_by_position(5000) == (20, 2000)
    assert index.floor_entry_by_position(5000, max_offset=19) == (9, 900)
    assert index.floor_entry_by_position(5000, max_offset=3) is None
    index.close()


def _no_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("the index file was written")

    monkeypatch.setattr(index_module.os, "pwrite", refuse)
    monkeypatch.setattr(index_module.os, "ftruncate", refuse)


@pytest.mark.parametrize("kind", ["offset", "time"])
def test_a_rebuild_that_finds_the_same_entries_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A recovery rebuilds every index it checks; an unchanged one is not cut and rewritten
    (that cost a journal transaction per file and slowed unclean starts)."""
    path = tmp_path / "a.index"
    entries = [(104, 400), (109, 900), (120, 2000)]

    def build(index: OffsetIndex | TimeIndex) -> None:
        for a, b in entries:
            if isinstance(index, OffsetIndex):
                index.append(a, b)
            else:
                index.maybe_append(b, a)

    cls = OffsetIndex if kind == "offset" else TimeIndex
    index = cls(path, 100, 1024)
    build(index)
    index.close()
    before = path.read_bytes()
    index = cls(path, 100, 1024)
    with monkeypatch.context() as m:
        _no_writes(m)
        index.begin_rebuild()
        assert index.entries == 0
        build(index)
        index.end_rebuild()
    assert index.entries == 3 and path.read_bytes() == before
    # A rebuild that finds fewer entries cuts the file; one that finds others rewrites it.
    index.begin_rebuild()
    entries = entries[:2]
    build(index)
    index.end_rebuild()
    assert path.read_bytes() == before[: 2 * index.entry_size]
    index.begin_rebuild()
    entries = [(101, 50), (102, 60), (103, 70), (130, 3000)]
    build(index)
    index.end_rebuild()
    index.close()
    reopened = cls(path, 100, 1024)
    assert [tuple(reopened.entry(i)) for i in range(reopened.entries)] == (
        entries if kind == "offset" else [(b, a) for a, b in entries]
    )
    reopened.sanity_check()
    reopened.close()
