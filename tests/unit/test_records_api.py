"""The record codec's APIs: exact batch sizes, hasRoomFor, decoding into the final record, columns, bulk encode."""

from __future__ import annotations

import pytest

from kclient.errors import CorruptRecordError, IllegalStateError
from kclient.records import (
    HEADER_SIZE,
    BatchBuilder,
    Compression,
    RecordColumns,
    decode_batches,
    decode_columns,
    decode_consumer_records,
    encode_batch,
    record_size_in_bytes,
    stamp_batch,
)
from kclient.structs import ConsumerRecord

TS = 1_700_000_000_000
Hdrs = list[tuple[str, bytes | None]]
Input = tuple[int, bytes | None, bytes | None, Hdrs]


def build(inputs: list[Input], **kw: int) -> bytes:
    b = BatchBuilder(**kw)  # type: ignore[arg-type]
    for ts, k, v, h in inputs:
        b.append(ts, k, v, h)
    return b.build()


INPUTS: list[Input] = [
    (TS, b"k1", b"v1", []),
    (TS + 5, None, b"null key", [("h", b"x"), ("n", None)]),
    (TS - 1000, b"k3", None, []),
    (TS + 200_000, b"\x00" * 300, b"v" * 20_000, [("ü", b"")]),
]


def test_size_in_bytes_is_exact_before_build() -> None:
    b = BatchBuilder()
    assert b.size_in_bytes() == HEADER_SIZE
    for i, (ts, k, v, h) in enumerate(INPUTS):
        before = b.size_in_bytes()
        b.append(ts, k, v, h)
        assert b.size_in_bytes() - before == record_size_in_bytes(i, ts - TS, k, v, h)
    size = b.size_in_bytes()
    assert len(b.build()) == size == b.size_in_bytes()


def test_has_room_for_uses_the_exact_record_size() -> None:
    first = record_size_in_bytes(0, 0, None, b"v" * 100)
    second = record_size_in_bytes(1, 0, None, b"v" * 100)
    b = BatchBuilder(write_limit=HEADER_SIZE + first + second)
    assert b.has_room_for(None, b"v" * 1000, timestamp_ms=TS)  # the first record always fits
    b.append(TS, None, b"v" * 100)
    assert b.has_room_for(None, b"v" * 100, timestamp_ms=TS)
    assert not b.has_room_for(None, b"v" * 101, timestamp_ms=TS)
    assert not b.has_room_for(b"k", b"v" * 100, timestamp_ms=TS)
    assert not b.has_room_for(None, b"v" * 100, [("h", None)], timestamp_ms=TS)
    assert not b.has_room_for(None, b"v" * 100, timestamp_ms=TS + 64)  # a 2-byte timestamp delta
    assert b.try_append(TS, None, b"v" * 101) is None
    assert b.record_count == 1
    assert b.try_append(TS, None, b"v" * 100) == 1
    assert b.size_in_bytes() == b.write_limit
    assert b.is_full()
    assert not b.has_room_for(None, b"", timestamp_ms=TS)
    b.build()
    assert not b.has_room_for(None, b"", timestamp_ms=TS)


def test_first_record_always_fits_and_no_limit_means_room() -> None:
    b = BatchBuilder(write_limit=10)
    assert b.try_append(TS, None, b"x" * 500) == 0
    assert not b.has_room_for(None, b"", timestamp_ms=TS)
    assert BatchBuilder().has_room_for(None, b"x" * 10**6)


def test_decode_consumer_records_skips_control_old_offsets_and_applies_deserializers() -> None:
    one = bytearray(build(INPUTS[:2]))
    stamp_batch(one, 0, 10, 0)
    two = bytearray(build(INPUTS[2:]))
    stamp_batch(two, 0, 12, 0)
    buf = bytes(one + two) + bytes(two[:30])  # an incomplete tail is ignored
    recs = decode_consumer_records(buf, "t", 3, start_offset=11)
    assert all(type(r) is ConsumerRecord for r in recs)
    assert [(r.topic, r.partition, r.offset) for r in recs] == [("t", 3, 11), ("t", 3, 12), ("t", 3, 13)]
    assert recs[0] == ConsumerRecord("t", 3, 11, TS + 5, 0, None, b"null key", [("h", b"x"), ("n", None)])
    upper = decode_consumer_records(buf, "t", 3, 0, key_deserializer=bytes.decode, value_deserializer=len)
    assert [(r.key, r.value) for r in upper] == [("k1", 2), (None, 8), ("k3", None), ("\x00" * 300, 20_000)]
    expected = [r for _, rs in decode_batches(buf) for r in rs]
    cols = decode_columns(buf)
    assert isinstance(cols, RecordColumns)
    assert cols.offsets == [r.offset for r in expected]
    assert cols.timestamps == [r.timestamp for r in expected]
    assert cols.timestamp_types == [0] * 4
    assert cols.keys == [r.key for r in expected]
    assert cols.values == [r.value for r in expected]
    assert cols.headers == [r.headers for r in expected]
    assert decode_columns(buf, 13).offsets == [13]


def test_decode_consumer_records_keeps_the_batches_before_a_corrupt_one() -> None:
    good = bytearray(build(INPUTS[:2]))
    bad = bytearray(build(INPUTS[2:]))
    stamp_batch(bad, 0, 2, 0)
    bad[-1] ^= 0xFF
    out: list[ConsumerRecord] = []
    with pytest.raises(CorruptRecordError):
        decode_consumer_records(bytes(good + bad), "t", 0, out=out)
    assert [r.offset for r in out] == [0, 1]
    cols = RecordColumns([], [], [], [], [], [])
    with pytest.raises(CorruptRecordError):
        decode_columns(bytes(good + bad), out=cols)
    assert cols.offsets == [0, 1]


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_encode_batch_equals_the_builder(codec: Compression) -> None:
    inputs = INPUTS * 3
    expected = build(inputs, compression=codec, producer_id=7, producer_epoch=2, base_sequence=40)
    got = encode_batch(
        [v for _, _, v, _ in inputs],
        [k for _, k, _, _ in inputs],
        [h for _, _, _, h in inputs],
        [t for t, _, _, _ in inputs],
        compression=codec,
        producer_id=7,
        producer_epoch=2,
        base_sequence=40,
    )
    assert got == expected
    plain = encode_batch([b"a", b"b"], base_timestamp=TS, compression=codec)
    assert plain == build([(TS, None, b"a", []), (TS, None, b"b", [])], compression=codec)


def test_encode_batch_refuses_empty_and_mismatched_input() -> None:
    with pytest.raises(IllegalStateError):
        encode_batch([])
    with pytest.raises(ValueError):
        encode_batch([b"a", b"b"], keys=[b"k"])
