"""The compiled codec (kclient._crecords) and the pure-Python one are twins.

Property tests (hypothesis): for any records, both build byte-identical batches (one
record at a time and in bulk), decode them to identical records, agree with the
input, and on corrupted input raise the same error class. Every test runs each
implementation available, so a run without the extension (KBROKER_NO_EXTENSIONS=1)
still checks the pure-Python path against the input.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from functools import partial
from itertools import pairwise
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from kclient import records as rec
from kclient.errors import CorruptRecordError, KafkaError
from kclient.records import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    HEADER_SIZE,
    MAX_TIMESTAMP_OFFSET,
    TIMESTAMP_TYPE_MASK,
    CodecAPI,
    Compression,
    RecordColumns,
    buffers,
    stamp_batch,
    twins,
)
from kclient.structs import ConsumerRecord

IMPLS = rec.implementations()
PY = IMPLS["python"]
OTHERS = list(IMPLS.values())
CODECS = [Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD]

Hdrs = list[tuple[str, bytes | None]]
Input = tuple[int, bytes | None, bytes | None, Hdrs]

SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

blobs = st.one_of(
    st.none(),
    st.binary(max_size=40),
    st.builds(lambda n, b: b * n, st.integers(60, 70), st.binary(min_size=1, max_size=3)),  # 2-byte varints
    st.builds(lambda n: bytes(range(256)) * 32 + b"x" * n, st.integers(-2, 2)),  # the 2/3-byte boundary
)
header_lists = st.lists(st.tuples(st.text(max_size=12), st.one_of(st.none(), st.binary(max_size=20))), max_size=3)
BASE_TS = 1_700_000_000_000
timestamps = st.one_of(
    st.integers(BASE_TS - 100, BASE_TS + 100),
    st.integers(0, 2**50),
    st.integers(-(2**40), 2**40),
)
inputs = st.lists(st.tuples(timestamps, blobs, blobs, header_lists), min_size=1, max_size=30)
producer_fields: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {
            "producer_id": st.integers(0, 2**63 - 1),
            "producer_epoch": st.integers(0, 2**15 - 1),
            "base_sequence": st.integers(0, 2**31 - 1),
            "is_transactional": st.booleans(),
        }
    ),
)


def build(api: CodecAPI, records: Sequence[Input], codec: Compression, fields: dict[str, Any]) -> bytes:
    builder = api.BatchBuilder(codec, **fields)
    for i, (ts, key, value, headers) in enumerate(records):
        assert builder.append(ts, key, value, headers) == i
    return builder.build()


def bulk(api: CodecAPI, records: Sequence[Input], codec: Compression, fields: dict[str, Any]) -> bytes:
    return api.encode_batch(
        [r[2] for r in records],
        [r[1] for r in records],
        [r[3] for r in records],
        [r[0] for r in records],
        compression=codec,
        **fields,
    )


def outcome(func: Callable[[], Any]) -> Any:
    """The result, or the class of the exception raised."""
    try:
        result = func()
        if isinstance(result, RecordColumns):
            return tuple(result)
        if not isinstance(result, (list, tuple, int)):
            return list(result)
        return result
    except Exception as exc:
        return type(exc)


def set_log_append_time(batch: bytes, max_ts: int) -> bytes:
    """The batch with the LOG_APPEND_TIME bit and maxTimestamp set, as a leader stamps it."""
    out = bytearray(batch)
    (attributes,) = struct.unpack_from(">h", out, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", out, ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
    struct.pack_into(">q", out, MAX_TIMESTAMP_OFFSET, max_ts)
    struct.pack_into(">I", out, CRC_OFFSET, crc32c(bytes(out[ATTRIBUTES_OFFSET:])))
    return bytes(out)


def test_the_extension_is_built_unless_disabled() -> None:
    disabled = os.environ.get("KBROKER_NO_EXTENSIONS", "") not in ("", "0")
    assert rec.IMPLEMENTATION == ("python" if disabled else "c")
    assert set(IMPLS) == ({"python"} if disabled else {"python", "c"})


@SETTINGS
@given(records=inputs, codec=st.sampled_from(CODECS), fields=producer_fields)
def test_every_implementation_builds_the_same_bytes(
    records: list[Input], codec: Compression, fields: dict[str, Any]
) -> None:
    expected = build(PY, records, Compression.NONE, fields)
    for api in OTHERS:
        assert build(api, records, Compression.NONE, fields) == expected, api.name
        assert bulk(api, records, Compression.NONE, fields) == expected, api.name
    if codec != Compression.NONE:  # compressed bytes: same compressor, same input
        compressed = build(PY, records, codec, fields)
        for api in OTHERS:
            assert build(api, records, codec, fields) == compressed, api.name
            assert bulk(api, records, codec, fields) == compressed, api.name


@SETTINGS
@given(records=inputs, fields=producer_fields)
def test_sizes_are_exact_and_agree(records: list[Input], fields: dict[str, Any]) -> None:
    for api in OTHERS:
        builder = api.BatchBuilder(**fields)
        first = records[0][0]
        for i, (ts, key, value, headers) in enumerate(records):
            size = api.record_size_in_bytes(i, ts - first, key, value, headers)
            assert size == PY.record_size_in_bytes(i, ts - first, key, value, headers)
            before = builder.size_in_bytes()
            builder.append(ts, key, value, headers)
            assert builder.size_in_bytes() - before == size
        assert len(builder.build()) == builder.size_in_bytes()


@SETTINGS
@given(
    records=inputs,
    limit=st.integers(HEADER_SIZE, 4000),
    codec=st.sampled_from(CODECS),
)
def test_try_append_fills_to_the_limit_identically(records: list[Input], limit: int, codec: Compression) -> None:
    results = []
    for api in OTHERS:
        builder = api.BatchBuilder(codec, write_limit=limit)
        taken = []
        for ts, key, value, headers in records:
            room = builder.has_room_for(key, value, headers, timestamp_ms=ts)
            delta = builder.try_append(ts, key, value, headers)
            assert (delta is not None) == room
            taken.append(delta)
        assert taken[0] == 0
        assert builder.record_count == 1 or builder.size_in_bytes() <= limit
        results.append((taken, builder.build()))
    assert all(r == results[0] for r in results)


def partial_tail(data: bytes, tail: int) -> bytes:
    """The first ``tail`` bytes of ``data``'s first batch, cut short of the whole batch:
    the incomplete batch a fetch response cut at max_bytes ends with. (A one-record
    batch can be as small as 68 bytes, so ``data[:tail]`` alone could be a whole batch.)"""
    first = next(rec.iter_headers(data))[1].size
    return data[: min(tail, first - 1)]


@SETTINGS
@given(
    batches=st.lists(st.tuples(inputs, st.sampled_from(CODECS), st.booleans(), st.booleans()), min_size=1, max_size=4),
    start=st.integers(0, 80),
    tail=st.integers(0, 70),
)
# 68 bytes of tail are a whole copy of this 68-byte batch, not an incomplete tail: partial_tail cuts them short.
@example(batches=[([(1_699_999_999_900, None, None, [])], Compression.NONE, False, False)], start=0, tail=68)
def test_every_implementation_decodes_the_same_records(
    batches: list[tuple[list[Input], Compression, bool, bool]], start: int, tail: int
) -> None:
    buf = bytearray()
    expected: list[ConsumerRecord] = []
    offset = 0
    for records, codec, log_append, control in batches:
        raw = bytearray(build(PY, records, codec, {"producer_id": 5} if control else {}))
        stamp_batch(raw, 0, offset, 3)
        if control:  # a control batch: attributes bit 5 (no real control records inside, ignored anyway)
            (attributes,) = struct.unpack_from(">h", raw, ATTRIBUTES_OFFSET)
            struct.pack_into(">h", raw, ATTRIBUTES_OFFSET, attributes | CONTROL_FLAG_MASK)
            struct.pack_into(">I", raw, CRC_OFFSET, crc32c(bytes(raw[ATTRIBUTES_OFFSET:])))
        batch = set_log_append_time(bytes(raw), 42) if log_append else bytes(raw)
        for i, (ts, key, value, headers) in enumerate(records):
            if not control and offset + i >= start:
                expected.append(
                    ConsumerRecord("t", 1, offset + i, 42 if log_append else ts, int(log_append), key, value, headers)
                )
        buf += batch
        offset += len(records)
    data = bytes(buf) + partial_tail(bytes(buf), tail)  # an incomplete tail is ignored
    for api in OTHERS:
        for view in (data, bytearray(data), memoryview(data)):
            assert api.decode_consumer_records(view, "t", 1, start) == expected, api.name
            cols = api.decode_columns(view, start)
            assert tuple(cols) == (
                [r.offset for r in expected],
                [r.timestamp for r in expected],
                [r.timestamp_type for r in expected],
                [r.key for r in expected],
                [r.value for r in expected],
                [r.headers for r in expected],
            ), api.name
        decoded = [(h, recs) for h, recs in api.decode_batches(data)]
        assert decoded == list(PY.decode_batches(data)), api.name
        assert api.decode_batch(memoryview(data)) == PY.decode_batch(data), api.name
    lengths = [(len(b[0]) if not b[3] else 0) for b in batches]
    assert len(expected) <= sum(lengths)


def test_a_batch_cut_short_at_the_end_is_ignored_by_every_implementation() -> None:
    """A fetch response ending in a batch cut anywhere short of its last byte gives the
    records of the batches before it and none of the cut one, in every implementation;
    68 bytes (61 of header, 7 of record) are a whole batch, which is no tail."""
    ts = 1_699_999_999_900
    raw = bytearray(build(PY, [(ts, None, None, [])], Compression.NONE, {}))
    stamp_batch(raw, 0, 0, 3)
    batch = bytes(raw)
    assert len(batch) == 68
    one = [ConsumerRecord("t", 1, 0, ts, 0, None, None, [])]
    for cut in range(len(batch)):
        data = batch + batch[:cut]
        for api in OTHERS:
            for view in (data, bytearray(data), memoryview(data)):
                assert api.decode_consumer_records(view, "t", 1, 0) == one, (api.name, cut)
                assert tuple(api.decode_columns(view, 0)) == ([0], [ts], [0], [None], [None], [[]]), (api.name, cut)
                assert api.decode_buffers(view, 0).offsets.tolist() == [0], (api.name, cut)
            assert [h for h, _ in api.decode_batches(data)] == [rec.read_header(batch)], (api.name, cut)
    whole = batch + batch  # the second copy is complete: a batch, decoded alike by every implementation
    for api in OTHERS:
        assert api.decode_consumer_records(whole, "t", 1, 0) == one + one, api.name
        assert api.decode_consumer_records(whole, "t", 1, 1) == [], api.name


@SETTINGS
@given(records=inputs)
def test_deserializers_apply_to_non_null_keys_and_values(records: list[Input]) -> None:
    data = build(PY, records, Compression.NONE, {})
    for api in OTHERS:
        got = api.decode_consumer_records(data, "t", 0, 0, len, lambda v: v[:1])
        assert [(r.key, r.value) for r in got] == [
            (None if k is None else len(k), None if v is None else v[:1]) for _, k, v, _ in records
        ]


@SETTINGS
@given(
    records=inputs,
    codec=st.sampled_from(CODECS),
    where=st.integers(0, 10**6),
    byte=st.integers(0, 255),
    fix_crc=st.booleans(),
    cut=st.integers(-1, 10**6),
)
def test_corrupt_input_raises_the_same_error_class(
    records: list[Input], codec: Compression, where: int, byte: int, fix_crc: bool, cut: int
) -> None:
    good = build(PY, records, codec, {})
    bad = bytearray(good)
    pos = ATTRIBUTES_OFFSET + where % (len(bad) - ATTRIBUTES_OFFSET) if fix_crc else where % len(bad)
    assume(bad[pos] != byte)
    bad[pos] = byte
    if fix_crc:  # corrupt the records, not just the checksum
        struct.pack_into(">I", bad, CRC_OFFSET, crc32c(bytes(bad[ATTRIBUTES_OFFSET:])))
    if cut >= 0:
        bad = bad[: cut % (len(bad) + 1)]
    data = bytes(bad)
    calls: list[Callable[[CodecAPI], Any]] = [
        lambda a: a.decode_consumer_records(data, "t", 0),
        lambda a: a.decode_columns(data),
        lambda a: list(a.decode_batches(data)),
        lambda a: list(a.decode_batches(data, check_crc=False)),
        lambda a: a.decode_batch(data, check_crc=False),
    ]
    for call in calls:
        results = [outcome(partial(call, api)) for api in OTHERS]
        assert all(r == results[0] for r in results), [api.name for api in OTHERS]
        if isinstance(results[0], type):
            assert issubclass(results[0], CorruptRecordError)


@SETTINGS
@given(records=inputs, where=st.integers(0, 10**6), byte=st.integers(0, 255), extra=st.integers(-2, 2))
def test_every_implementation_walks_records_alike(records: list[Input], where: int, byte: int, extra: int) -> None:
    body = build(PY, records, Compression.NONE, {})[HEADER_SIZE:]
    count = len(records)
    for api in OTHERS:
        assert api.walk_records(body, 0, len(body), count) == len(body)
        padded = b"xyz" + body + b"abc"
        assert api.walk_records(padded, 3, 3 + len(body), count) == 3 + len(body)
    bad = bytearray(body)
    pos = where % len(bad)
    bad[pos] = byte
    data = bytes(bad)
    n = max(count + extra, 0)
    expected = outcome(partial(PY.walk_records, data, 0, len(data), n))
    for api in OTHERS:
        assert outcome(partial(api.walk_records, data, 0, len(data), n)) == expected, api.name


def test_walk_records_errors_say_what_is_wrong() -> None:
    body = build(PY, [(0, None, b"v", [])] * 3, Compression.NONE, {})[HEADER_SIZE:]
    for api in OTHERS:
        with pytest.raises(ValueError, match="end after 3 of 4"):
            api.walk_records(body, 0, len(body), 4)
        with pytest.raises(ValueError, match="running past the end"):
            api.walk_records(body, 0, len(body) - 1, 3)
        with pytest.raises(ValueError, match="offsetDelta"):
            api.walk_records(body[8:], 0, len(body) - 8, 2)


def log_of(batches: list[tuple[list[Input], Compression, bool, bool]]) -> tuple[bytes, list[int]]:
    """The batches one after another as a fetch response holds them (offsets from 0; a
    control batch flagged), and the base offset of each."""
    buf = bytearray()
    bases = []
    offset = 0
    for records, codec, log_append, control in batches:
        raw = bytearray(build(PY, records, codec, {"producer_id": 5} if control else {}))
        stamp_batch(raw, 0, offset, 3)
        if control:
            (attributes,) = struct.unpack_from(">h", raw, ATTRIBUTES_OFFSET)
            struct.pack_into(">h", raw, ATTRIBUTES_OFFSET, attributes | CONTROL_FLAG_MASK)
            struct.pack_into(">I", raw, CRC_OFFSET, crc32c(bytes(raw[ATTRIBUTES_OFFSET:])))
        buf += set_log_append_time(bytes(raw), 42) if log_append else raw
        bases.append(offset)
        offset += len(records)
    return bytes(buf), bases


batch_lists = st.lists(st.tuples(inputs, st.sampled_from(CODECS), st.booleans(), st.booleans()), min_size=1, max_size=4)


@SETTINGS
@given(batches=batch_lists, start=st.integers(0, 80), tail=st.integers(0, 70))
def test_every_implementation_decodes_the_same_column_buffers(
    batches: list[tuple[list[Input], Compression, bool, bool]], start: int, tail: int
) -> None:
    data, _ = log_of(batches)
    data += partial_tail(data, tail)  # an incomplete tail is ignored
    expected = tuple(PY.decode_columns(data, start))
    reference = PY.decode_buffers(data, start)
    for api in OTHERS:
        for view in (data, bytearray(data), memoryview(data)):
            cb = api.decode_buffers(view, start)
            assert cb._parts == reference._parts, api.name  # byte-identical buffers
            assert tuple(cb.to_columns()) == expected, api.name
            assert cb.offsets.tolist() == expected[0]
            assert cb.key_bytes == sum(len(k or b"") for k in expected[3])
            assert cb.value_bytes == sum(len(v or b"") for v in expected[4])
            assert (cb.headers is None) == (not any(expected[5]))
            keys, values = cb._parts[buffers.KEY_VALID], cb._parts[buffers.VALUE_VALID]
            assert (keys is None) == (None not in expected[3])  # a bitmap only when there are nulls
            assert (values is None) == (None not in expected[4])


@SETTINGS
@given(batches=batch_lists, split=st.integers(0, 4), start=st.integers(0, 80))
def test_column_buffers_append_batch_by_batch(
    batches: list[tuple[list[Input], Compression, bool, bool]], split: int, start: int
) -> None:
    """Decoding a response in two calls into one ColumnBuffers (its bitmaps and headers
    already there or not) gives what one call gives."""
    data, _ = log_of(batches)
    cut = sum(len(b) for _, b in zip(range(split), iter_batches(data), strict=False))
    for api in OTHERS:
        whole = api.decode_buffers(data, start)
        out = rec.ColumnBuffers()
        codec = twins.C_CODEC if api.name == "c" else twins.PY_CODEC
        assert codec is not None
        for part in (data[:cut], data[cut:]):
            codec.decode_buffers(part, start, out._parts)
        out._length = len(out._parts[buffers.OFFSETS]) >> 3
        assert out._parts == whole._parts, api.name


def iter_batches(data: bytes) -> list[bytes]:
    return [data[pos : pos + header.size] for pos, header in rec.iter_headers(data)]


@SETTINGS
@given(
    records=inputs,
    codec=st.sampled_from(CODECS),
    where=st.integers(0, 10**6),
    byte=st.integers(0, 255),
    fix_crc=st.booleans(),
    good_first=st.booleans(),
)
# Attributes rewritten to snappy under a fixed CRC: cramjam's own error once escaped the
# pure-Python decoder instead of CorruptRecordError.
@example(records=[(1_699_999_999_900, None, None, [])], codec=Compression.NONE, where=1, byte=2, fix_crc=True,
         good_first=False)  # fmt: skip
def test_corrupt_column_buffers_keep_the_batches_before(
    records: list[Input], codec: Compression, where: int, byte: int, fix_crc: bool, good_first: bool
) -> None:
    good = build(PY, records, codec, {})
    bad = bytearray(good)
    pos = ATTRIBUTES_OFFSET + where % (len(bad) - ATTRIBUTES_OFFSET) if fix_crc else where % len(bad)
    assume(bad[pos] != byte)
    bad[pos] = byte
    if fix_crc:
        struct.pack_into(">I", bad, CRC_OFFSET, crc32c(bytes(bad[ATTRIBUTES_OFFSET:])))
    first = bytearray(build(PY, [(7, None, b"x", [("h", None)]), (8, b"k", None, [])], Compression.NONE, {}))
    stamp_batch(bad, 0, 2, 0)
    data = (bytes(first) if good_first else b"") + bytes(bad)
    results = []
    for api in OTHERS:
        codec_impl = twins.C_CODEC if api.name == "c" else twins.PY_CODEC
        assert codec_impl is not None
        out = rec.ColumnBuffers()
        error: type[Exception] | None = None
        try:
            codec_impl.decode_buffers(data, 0, out._parts)
        except Exception as exc:
            error = type(exc)
        columns = outcome(partial(api.decode_columns, data))
        assert (error is None) == (not isinstance(columns, type)), api.name
        out._length = len(out._parts[buffers.OFFSETS]) >> 3
        if error is not None:
            assert issubclass(error, KafkaError)  # CorruptRecordError, or a codec that is not installed
            partial_cols = RecordColumns([], [], [], [], [], [])
            with pytest.raises(error):
                api.decode_columns(data, 0, partial_cols)
            assert tuple(out.to_columns()) == tuple(partial_cols)  # the batches before it, nothing after
        results.append((error, out._parts))
    assert all(r == results[0] for r in results)


@SETTINGS
@given(batches=batch_lists, cuts=st.lists(st.integers(0, 200), max_size=4), data=st.data())
def test_column_buffers_slice_and_concat_like_lists(
    batches: list[tuple[list[Input], Compression, bool, bool]], cuts: list[int], data: st.DataObject
) -> None:
    log, _ = log_of(batches)
    for api in OTHERS:
        cb = api.decode_buffers(log)
        cols = tuple(cb.to_columns())
        n = len(cb)
        bounds = sorted({0, n, *(c % (n + 1) for c in cuts)})
        pieces = [cb[i:j] for i, j in pairwise(bounds)]
        for (i, j), piece in zip(pairwise(bounds), pieces, strict=True):
            assert len(piece) == j - i
            assert tuple(piece.to_columns()) == tuple(c[i:j] for c in cols)
            assert piece.value_bytes == sum(len(v or b"") for v in cols[4][i:j])
        joined = rec.ColumnBuffers.concat(pieces or [cb[0:0]])
        assert joined == cb
        assert joined.buffers() == cb.buffers()
        # a concatenation of slices of slices, out of order of the cuts
        i = data.draw(st.integers(0, n))
        j = data.draw(st.integers(i, n))
        k = data.draw(st.integers(0, n))
        mixed = rec.ColumnBuffers.concat([cb[i:][: j - i], cb[k:], cb[:0]])
        assert tuple(mixed.to_columns()) == tuple(c[i:j] + c[k:] for c in cols)
        again = rec.ColumnBuffers.concat([mixed[: j - i], mixed[j - i :]])
        assert again == mixed


@SETTINGS
@given(batches=batch_lists, i=st.integers(0, 200), j=st.integers(0, 200), headers=st.booleans())
def test_column_buffers_to_arrow_match_the_lists(
    batches: list[tuple[list[Input], Compression, bool, bool]], i: int, j: int, headers: bool
) -> None:
    pa = pytest.importorskip("pyarrow")
    log, _ = log_of(batches)
    for api in OTHERS:
        cb = api.decode_buffers(log)
        n = len(cb)
        a, b = sorted((i % (n + 1), j % (n + 1)))
        view = cb[a:b]
        cols = view.to_columns()
        batch = view.to_arrow("t", 4, headers)
        assert batch.schema == rec.arrow_schema(headers)
        got = {name: batch.column(name).to_pylist() for name in batch.schema.names if name != "timestamp"}
        assert got["key"] == cols.keys
        assert got["value"] == cols.values
        assert got["offset"] == cols.offsets
        assert got["topic"] == ["t"] * len(view)
        assert got["partition"] == [4] * len(view)
        assert batch.column("timestamp").cast(pa.int64()).to_pylist() == cols.timestamps
        assert got["timestampType"] == cols.timestamp_types
        if headers:
            assert got["headers"] == [[{"key": k, "value": v} for k, v in h] for h in cols.headers]
        batch.validate(full=True)
