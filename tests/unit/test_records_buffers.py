"""ColumnBuffers (kclient.records): the Arrow-layout decode target of the columnar polls.

Its invariants beyond what the twin property tests check: appending only to a whole,
unviewed ColumnBuffers; parts that do not agree are refused by both codecs; slices are
views; Arrow arrays are the buffers themselves (zero copy)."""

from __future__ import annotations

import struct
import tracemalloc
from array import array

import pytest
from crc32c import crc32c

from kclient.errors import CorruptRecordError
from kclient.records import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    RECORDS_COUNT_OFFSET,
    ColumnBuffers,
    buffers,
    decode_buffers,
    encode_batch,
    stamp_batch,
    twins,
)


def log(n: int, base: int = 0, nulls: bool = False) -> bytes:
    values = [None if nulls and i % 2 else f"v{base + i}".encode() for i in range(n)]
    raw = bytearray(encode_batch(values, [f"k{base + i}".encode() for i in range(n)]))
    stamp_batch(raw, 0, base, 0)
    return bytes(raw)


CODECS = [c for c in (twins.PY_CODEC, twins.C_CODEC) if c is not None]


def test_slices_are_views_and_refuse_steps_and_indexes() -> None:
    cb = decode_buffers(log(10))
    view = cb[2:7]
    assert view._parts is cb._parts
    assert view.offsets.tolist() == [2, 3, 4, 5, 6]
    assert view[1:3].offsets.tolist() == [3, 4]
    assert len(cb[8:3]) == 0
    assert view.to_columns().values == [b"v2", b"v3", b"v4", b"v5", b"v6"]
    with pytest.raises(TypeError):
        cb[1]  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="step"):
        cb[::2]


def test_decode_appends_only_to_a_whole_column_buffers() -> None:
    cb = decode_buffers(log(4))
    decode_buffers(log(3, base=4), out=cb)
    assert cb.offsets.tolist() == list(range(7))
    with pytest.raises(ValueError, match="slice"):
        decode_buffers(log(2, base=7), out=cb[1:])
    before = cb.to_columns()
    for part in (buffers.OFFSETS, buffers.KEY_DATA, buffers.VALUE_OFFS):
        view = memoryview(cb._parts[part])  # a live view of a buffer: it must not move under it
        for codec in CODECS:
            with pytest.raises(BufferError):
                codec.decode_buffers(log(2, base=7), 0, cb._parts)
            assert cb.to_columns() == before  # unchanged
        view.release()


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_parts_that_do_not_agree_are_refused(codec: twins.Codec) -> None:
    parts = ColumnBuffers()._parts
    parts[buffers.OFFSETS] = bytearray(8)  # one offset, no timestamp
    with pytest.raises(ValueError, match="agree"):
        codec.decode_buffers(log(1), 0, parts)
    with pytest.raises(TypeError):
        codec.decode_buffers(log(1), 0, parts[:5])
    bad = ColumnBuffers()._parts
    bad[buffers.VALUE_DATA] = b""  # bytes cannot grow
    with pytest.raises(TypeError):
        codec.decode_buffers(log(1), 0, bad)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_columns_of_reads_records_of_the_buffers(codec: twins.Codec) -> None:
    cb = decode_buffers(log(9, nulls=True))
    offsets, _, types, keys, values, headers = codec.columns_of(cb._parts, 3, 4)
    assert (offsets, types, keys, headers) == ([3, 4, 5, 6], [0] * 4, [b"k3", b"k4", b"k5", b"k6"], [[]] * 4)
    assert values == [None, b"v4", None, b"v6"]
    assert codec.columns_of(cb._parts, 8, 1)[3] == [b"k8"]
    assert codec.columns_of(cb._parts, 9, 0) == ([], [], [], [], [], [])
    with pytest.raises(ValueError):
        codec.columns_of(cb._parts, 8, 2)


def test_arrow_arrays_are_the_buffers_themselves() -> None:
    pa = pytest.importorskip("pyarrow")
    cb = decode_buffers(log(50, nulls=True))
    batch = cb[10:20].to_arrow("t", 1)
    values = batch.column("value")
    assert values.offset == 10
    assert values.buffers()[2].address == pa.py_buffer(cb._parts[buffers.VALUE_DATA]).address
    assert batch.column("offset").buffers()[1].address == pa.py_buffer(cb._parts[buffers.OFFSETS]).address
    assert values.to_pylist() == [None if i % 2 else f"v{i}".encode() for i in range(10, 20)]
    assert values.null_count == 5
    batch.validate(full=True)


def test_shifted_offsets_are_exact_at_the_int32_edges() -> None:
    offsets = memoryview(bytearray(array("i", [5, 5, 2**31 - 10, 2**31 - 2]))).cast("i")
    assert memoryview(buffers._shift_offsets(offsets, -5)).cast("i").tolist() == [0, 0, 2**31 - 15, 2**31 - 7]
    assert memoryview(buffers._shift_offsets(offsets[:3], 7)).cast("i").tolist() == [12, 12, 2**31 - 3]


def test_concat_of_one_is_itself_and_of_none_nulls_keeps_no_bitmap() -> None:
    cb = decode_buffers(log(6))
    assert ColumnBuffers.concat([cb]) is cb
    joined = ColumnBuffers.concat([cb[4:], cb[:2]])
    assert joined.offsets.tolist() == [4, 5, 0, 1]
    assert joined._parts[buffers.KEY_VALID] is None and joined.headers is None
    with_nulls = decode_buffers(log(3, base=6, nulls=True))
    mixed = ColumnBuffers.concat([cb[:2], with_nulls])
    assert mixed.to_columns().values == [b"v0", b"v1", b"v6", None, b"v8"]
    assert mixed._parts[buffers.VALUE_VALID] == bytearray([0b10111])


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_a_record_count_the_batch_cannot_hold_is_corrupt_not_a_huge_allocation(codec: twins.Codec) -> None:
    raw = bytearray(log(3))
    struct.pack_into(">i", raw, RECORDS_COUNT_OFFSET, 2**31 - 1)  # with a CRC that agrees
    struct.pack_into(">I", raw, CRC_OFFSET, crc32c(bytes(raw[ATTRIBUTES_OFFSET:])))
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError):
            codec.decode_buffers(bytes(raw), 0, ColumnBuffers()._parts)
        assert tracemalloc.get_traced_memory()[1] < 10 * 2**20  # not 16 GiB of int64 offsets
    finally:
        tracemalloc.stop()
    parts = ColumnBuffers()._parts
    with pytest.raises(CorruptRecordError):
        codec.decode_buffers(log(2) + bytes(raw), 0, parts)
    assert len(parts[buffers.OFFSETS]) == 16  # the batch before it is kept
