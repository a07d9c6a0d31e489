"""The pure-Python twin of kclient/_crecords.c: the codec's hot loops, one function each.

Each function here has a compiled equivalent in ``kclient._crecords`` with the same
signature, the same bytes out, the same records out and the same error classes on bad
input (tests/unit/test_records_twins.py compares them); :mod:`kclient.records.twins`
picks one set. Nothing outside this package calls them directly: the public entry points
are in :mod:`kclient.records.decoder` and :mod:`kclient.records.builder`.

The loops inline the one- and two-byte varint cases (the common ones) and fall back to
:func:`~kclient.records.varint.read_zigzag`; decoders run with the cyclic GC paused, as
the compiled ones do. Invariants they keep: a batch's records are appended to the
output all or nothing, and a record's length varint must cover exactly its fields.
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate, pairwise
from typing import Any, TypeVar

from kclient.errors import CorruptRecordError
from kclient.records.buffers import (
    HEADERS,
    INT32_MAX,
    KEY_DATA,
    KEY_OFFS,
    KEY_VALID,
    OFFSETS,
    TIMESTAMPS,
    TYPES,
    VALUE_DATA,
    VALUE_OFFS,
    VALUE_VALID,
)
from kclient.records.compression import decompress
from kclient.records.header import BatchHeader, check_batch, iter_headers, tuple_new
from kclient.records.layout import (
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    Buffer,
)
from kclient.records.record import Header, Record, RecordColumns
from kclient.records.varint import VARINT_TABLE_SIZE, VARINTS, encode_varint, encode_zigzag, read_zigzag
from kclient.structs import ConsumerRecord

_T = TypeVar("_T")


def decode_records(
    data: bytes, p: int, end: int, count: int, base_offset: int, first_ts: int, log_append_ts: int | None
) -> list[Record]:
    """The ``count`` records in ``data[p:end]`` of a checked batch (LOG_APPEND_TIME when ``log_append_ts``)."""
    offsets: list[int] = []
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[list[Header]] = []
    _records_into(
        data, p, end, count, base_offset, first_ts, log_append_ts, -1, offsets, timestamps, keys, values, headers
    )
    new = tuple_new
    return [new(Record, r) for r in zip(offsets, timestamps, keys, values, headers, strict=True)]


def _decode_headers(data: bytes, p: int) -> tuple[list[Header], int]:
    z, p = read_zigzag(data, p)
    count = (z >> 1) ^ -(z & 1)
    if count < 0:
        raise CorruptRecordError(f"invalid record header count {count}")
    headers: list[Header] = []
    for _ in range(count):
        z, p = read_zigzag(data, p)
        if z & 1:
            raise CorruptRecordError("record header key cannot be null")
        z >>= 1
        key = data[p : p + z].decode("utf-8")
        p += z
        z, p = read_zigzag(data, p)
        if z & 1:
            value = None
        else:
            z >>= 1
            value = data[p : p + z]
            p += z
        headers.append((key, value))
    return headers, p


def body_bytes(buf: Buffer, pos: int, header: BatchHeader) -> tuple[bytes, int, int]:
    """(data, start, end): the records of a checked batch, decompressed if need be."""
    size = header.batch_length + LOG_OVERHEAD
    codec = header.attributes & COMPRESSION_CODEC_MASK
    if codec:
        with memoryview(buf) as view:
            data = decompress(codec, view[pos + HEADER_SIZE : pos + size])
        return data, 0, len(data)
    if type(buf) is bytes:
        return buf, pos + HEADER_SIZE, pos + size
    with memoryview(buf) as view:
        data = view[pos + HEADER_SIZE : pos + size].tobytes()
    return data, 0, len(data)


def _decode_columns_into(
    buf: Buffer,
    pos: int,
    header: BatchHeader,
    start_offset: int,
    offsets: list[int],
    timestamps: list[int],
    keys: list[bytes | None],
    values: list[bytes | None],
    headers_out: list[list[Header]],
) -> None:
    """Append the records of a checked batch with offset >= start_offset to the columns."""
    data, p, end = body_bytes(buf, pos, header)
    log_append_ts = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None
    _records_into(
        data, p, end, header.record_count, header.base_offset, header.first_timestamp, log_append_ts,
        start_offset, offsets, timestamps, keys, values, headers_out,
    )  # fmt: skip


def _records_into(
    data: bytes,
    p: int,
    end: int,
    count: int,
    base_offset: int,
    first_ts: int,
    log_append_ts: int | None,
    start_offset: int,
    offsets: list[int],
    timestamps: list[int],
    keys: list[bytes | None],
    values: list[bytes | None],
    headers_out: list[list[Header]],
) -> None:
    """Decode the ``count`` records in ``data[p:end]`` of a checked batch, appending those
    with offset >= ``start_offset`` to the columns (all or, on CorruptRecordError, none).
    LOG_APPEND_TIME batches (``log_append_ts``) read as the broker's time."""
    first = len(offsets)
    add_offset = offsets.append
    add_ts = timestamps.append
    add_key = keys.append
    add_value = values.append
    add_headers = headers_out.append
    slow = read_zigzag
    try:
        for _ in range(count):
            zl = data[p]
            if zl < 0x80:
                p += 1
            else:
                b = data[p + 1]
                if b < 0x80:
                    zl = (zl & 0x7F) | (b << 7)
                    p += 2
                else:
                    zl, p = slow(data, p)
            start = p
            z = data[p + 1]
            if z < 0x80:
                p += 2
            else:
                b = data[p + 2]
                if b < 0x80:
                    z = (z & 0x7F) | (b << 7)
                    p += 3
                else:
                    z, p = slow(data, p + 1)
            timestamp = first_ts + ((z >> 1) ^ -(z & 1))
            z = data[p]
            if z < 0x80:
                p += 1
            else:
                b = data[p + 1]
                if b < 0x80:
                    z = (z & 0x7F) | (b << 7)
                    p += 2
                else:
                    z, p = slow(data, p)
            offset = base_offset + ((z >> 1) ^ -(z & 1))
            z = data[p]
            if z < 0x80:
                p += 1
            else:
                b = data[p + 1]
                if b < 0x80:
                    z = (z & 0x7F) | (b << 7)
                    p += 2
                else:
                    z, p = slow(data, p)
            if z & 1:
                key = None
            else:
                z >>= 1
                key = data[p : p + z]
                p += z
            z = data[p]
            if z < 0x80:
                p += 1
            else:
                b = data[p + 1]
                if b < 0x80:
                    z = (z & 0x7F) | (b << 7)
                    p += 2
                else:
                    z, p = slow(data, p)
            if z & 1:
                value = None
            else:
                z >>= 1
                value = data[p : p + z]
                p += z
            if data[p]:
                headers, p = _decode_headers(data, p)
            else:
                p += 1
                headers = []
            if (p - start) << 1 != zl:
                raise CorruptRecordError(
                    f"record at offset {offset} declares {(zl >> 1) ^ -(zl & 1)} bytes but holds {p - start}"
                )
            if offset >= start_offset:
                add_offset(offset)
                add_ts(timestamp)
                add_key(key)
                add_value(value)
                add_headers(headers)
    except (IndexError, UnicodeDecodeError) as exc:
        del offsets[first:], timestamps[first:], keys[first:], values[first:], headers_out[first:]
        raise CorruptRecordError(f"malformed record in batch at base offset {base_offset}: {exc}") from exc
    except CorruptRecordError:
        del offsets[first:], timestamps[first:], keys[first:], values[first:], headers_out[first:]
        raise
    if p != end:
        del offsets[first:], timestamps[first:], keys[first:], values[first:], headers_out[first:]
        raise CorruptRecordError(
            f"batch at base offset {base_offset}: {count} records decoded but {end - p:+d} bytes remain"
        )
    if log_append_ts is not None:  # LOG_APPEND_TIME: the broker's time
        timestamps[first:] = [log_append_ts] * (len(timestamps) - first)


def decode_consumer_records(
    buf: Buffer,
    topic: str,
    partition: int,
    start_offset: int = 0,
    key_deserializer: Callable[[bytes], Any] | None = None,
    value_deserializer: Callable[[bytes], Any] | None = None,
    out: list[ConsumerRecord] | None = None,
) -> list[ConsumerRecord]:
    if out is None:
        out = []
    add = out.append
    new = tuple_new
    record_type = ConsumerRecord
    for header, offsets, timestamps, keys, values, headers in _data_batches(buf, start_offset):
        if key_deserializer is not None:
            keys = [k if k is None else key_deserializer(k) for k in keys]
        if value_deserializer is not None:
            values = [v if v is None else value_deserializer(v) for v in values]
        ts_type = 1 if header.attributes & TIMESTAMP_TYPE_MASK else 0
        for offset, timestamp, key, value, hs in zip(offsets, timestamps, keys, values, headers, strict=True):
            add(new(record_type, (topic, partition, offset, timestamp, ts_type, key, value, hs)))
    return out


def _data_batches(
    buf: Buffer, start_offset: int
) -> Iterator[tuple[BatchHeader, list[int], list[int], list[bytes | None], list[bytes | None], list[list[Header]]]]:
    """Each checked data batch reaching ``start_offset``, decoded into column lists
    (control batches skipped); a bad batch raises when the iteration reaches it."""
    for pos, header in iter_headers(buf):
        check_batch(buf, pos, header)
        if header.attributes & CONTROL_FLAG_MASK or header.base_offset + header.last_offset_delta < start_offset:
            continue
        offsets: list[int] = []
        timestamps: list[int] = []
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        headers: list[list[Header]] = []
        _decode_columns_into(buf, pos, header, start_offset, offsets, timestamps, keys, values, headers)
        yield header, offsets, timestamps, keys, values, headers


def decode_columns(buf: Buffer, start_offset: int = 0, out: RecordColumns | None = None) -> RecordColumns:
    cols = RecordColumns([], [], [], [], [], []) if out is None else out
    offsets, timestamps, types, keys, values, headers = cols
    for pos, header in iter_headers(buf):
        check_batch(buf, pos, header)
        if header.attributes & CONTROL_FLAG_MASK or header.base_offset + header.last_offset_delta < start_offset:
            continue
        before = len(offsets)
        _decode_columns_into(buf, pos, header, start_offset, offsets, timestamps, keys, values, headers)
        types.extend([1 if header.attributes & TIMESTAMP_TYPE_MASK else 0] * (len(offsets) - before))
    return cols


def decode_buffers(buf: Buffer, start_offset: int, parts: list[Any]) -> None:
    _check_parts(parts)
    for header, offsets, timestamps, keys, values, headers in _data_batches(buf, start_offset):
        n = len(parts[OFFSETS]) >> 3
        before = [len(part) if type(part) is bytearray else part for part in parts[:HEADERS]]
        try:  # all or nothing: a buffer something views cannot grow (BufferError)
            parts[OFFSETS] += array("q", offsets)
            parts[TIMESTAMPS] += array("q", timestamps)
            parts[TYPES] += array("i", [1 if header.attributes & TIMESTAMP_TYPE_MASK else 0]) * len(offsets)
            _append_binary(parts, KEY_VALID, keys, n)
            _append_binary(parts, VALUE_VALID, values, n)
        except BaseException:
            for i, was in enumerate(before):
                if type(was) is int:
                    del parts[i][was:]
                else:
                    parts[i] = was
            raise
        if parts[HEADERS] is not None or any(headers):
            if parts[HEADERS] is None:
                parts[HEADERS] = [[] for _ in range(n)]
            parts[HEADERS].extend(headers)


def _check_parts(parts: list[Any]) -> None:
    """A ColumnBuffers' parts list whose buffers agree (what decode_buffers appends to)."""
    if type(parts) is not list or len(parts) != 10:
        raise TypeError("parts must be a list of the 10 ColumnBuffers parts")
    for i, part in enumerate(parts[:HEADERS]):
        if type(part) is not bytearray and not (part is None and i in (KEY_VALID, VALUE_VALID)):
            raise TypeError(f"ColumnBuffers part {i} must be a bytearray")
    if parts[HEADERS] is not None and type(parts[HEADERS]) is not list:
        raise TypeError("ColumnBuffers headers must be a list or None")
    n = len(parts[OFFSETS]) // 8
    ok = len(parts[OFFSETS]) == 8 * n and len(parts[TIMESTAMPS]) == 8 * n and len(parts[TYPES]) == 4 * n
    for slot in (KEY_VALID, VALUE_VALID):
        valid, offs, data = parts[slot : slot + 3]
        ok = ok and len(offs) == 4 * (n + 1) and (valid is None or len(valid) == (n + 7) // 8)
        ok = ok and memoryview(offs).cast("i")[n] == len(data)
    if not ok or (parts[HEADERS] is not None and len(parts[HEADERS]) != n):
        raise ValueError("the ColumnBuffers parts do not agree in length")


def _append_binary(parts: list[Any], slot: int, column: list[bytes | None], n: int) -> None:
    """Append ``column`` to the binary column at ``slot`` of ``parts`` (holding ``n`` records)."""
    data = parts[slot + 2]
    lengths = [0 if v is None else len(v) for v in column]
    ends = array("i")
    ends.extend(accumulate(lengths, initial=len(data)))
    if ends[-1] > INT32_MAX:
        raise OverflowError("a ColumnBuffers binary column holds at most 2 GiB")
    del ends[0]
    valid = parts[slot]
    if valid is not None or None in column:
        old = (1 << n) - 1 if valid is None else int.from_bytes(valid, "little")
        new = int("".join(["0" if v is None else "1" for v in reversed(column)]) or "0", 2)
        parts[slot] = bytearray((old | new << n).to_bytes((n + len(column) + 7) // 8, "little"))
    parts[slot + 1] += ends
    data += b"".join([v for v in column if v])


def columns_of(parts: list[Any], start: int, n: int) -> tuple[list[Any], ...]:
    """Records ``[start, start + n)`` of a ColumnBuffers' parts as RecordColumns' lists."""
    if start < 0 or n < 0 or 8 * (start + n) > len(parts[OFFSETS]):
        raise ValueError("ColumnBuffers: records outside the buffers")
    headers = parts[HEADERS]
    return (
        memoryview(parts[OFFSETS]).cast("q")[start : start + n].tolist(),
        memoryview(parts[TIMESTAMPS]).cast("q")[start : start + n].tolist(),
        memoryview(parts[TYPES]).cast("i")[start : start + n].tolist(),
        _binary_list(parts[KEY_VALID], parts[KEY_OFFS], parts[KEY_DATA], start, n),
        _binary_list(parts[VALUE_VALID], parts[VALUE_OFFS], parts[VALUE_DATA], start, n),
        [[] for _ in range(n)] if headers is None else headers[start : start + n],
    )


def _binary_list(valid: Buffer | None, offsets: Buffer, data: Buffer, start: int, n: int) -> list[bytes | None]:
    offs = memoryview(offsets).cast("i")[start : start + n + 1].tolist()
    if len(offs) != n + 1 or (valid is not None and len(valid) < (start + n + 7) // 8):
        raise ValueError("ColumnBuffers: records outside the buffers")
    first = offs[0]
    raw = bytes(memoryview(data)[first : offs[-1]])
    out: list[bytes | None] = [raw[a - first : b - first] for a, b in pairwise(offs)]
    if valid is not None:
        bits = int.from_bytes(valid, "little") >> start
        for i in range(n):
            if not (bits >> i) & 1:
                out[i] = None
    return out


def _gc_paused(func: Callable[..., _T]) -> Callable[..., _T]:
    """``func`` with the cyclic GC paused (the compiled decoders do the same): decoded
    records hold no cycles, and collections while thousands are made cost more than
    the decoding."""

    def paused(*args: Any) -> _T:
        if not gc.isenabled():
            return func(*args)
        gc.disable()
        try:
            return func(*args)
        finally:
            gc.enable()

    return paused


decode_records = _gc_paused(decode_records)
decode_consumer_records = _gc_paused(decode_consumer_records)
decode_columns = _gc_paused(decode_columns)
decode_buffers = _gc_paused(decode_buffers)
columns_of = _gc_paused(columns_of)


def walk_records(data: Buffer, p: int, end: int, count: int) -> int:
    slow = read_zigzag
    i = 0
    try:
        for i in range(count):
            if p >= end:
                raise ValueError(f"the records end after {i} of {count}")
            zl, q = slow(data, p)
            if q >= end:
                raise IndexError
            _, r = slow(data, q + 1)  # attributes, timestampDelta
            z, r = slow(data, r)
            if z != i << 1:
                raise ValueError(f"record {i} has offsetDelta {(z >> 1) ^ -(z & 1)}")
            for _ in range(2):  # key, value
                z, r = slow(data, r)
                if not z & 1:
                    r += z >> 1
            if r >= end:
                raise IndexError
            z, r = slow(data, r)
            if z & 1:
                raise ValueError(f"a negative header count {(z >> 1) ^ -1}")
            for _ in range(z >> 1):
                z, r = slow(data, r)
                if z & 1:
                    raise ValueError("a record header with a null key")
                key_end = r + (z >> 1)
                if key_end > end:
                    raise IndexError
                try:
                    bytes(data[r:key_end]).decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError("a record header key that is not valid utf-8") from None
                z, r = slow(data, key_end)
                if not z & 1:
                    r += z >> 1
            if r > end:
                raise IndexError
            if (r - q) << 1 != zl:
                raise ValueError(f"record {i} declares {(zl >> 1) ^ -(zl & 1)} bytes but its fields take {r - q}")
            p = r
    except IndexError:
        raise ValueError(f"record {i} is a record running past the end of the batch") from None
    except CorruptRecordError:
        raise ValueError(f"record {i} has a varint longer than 10 bytes") from None
    return p


def append_record(
    buf: bytearray,
    delta: int,
    ts_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
    limit: int,
) -> bool:
    """Append one record to ``buf`` unless ``limit`` >= 0 and it would grow past it."""
    table = VARINTS
    size = VARINT_TABLE_SIZE
    z = (ts_delta << 1) ^ (ts_delta >> 63)
    ts_b = table[z] if z < size else encode_zigzag(z)
    z = delta << 1
    off_b = table[z] if z < size else encode_zigzag(z)
    if key is None:
        key = b""
        key_b = b"\x01"
    else:
        z = len(key) << 1
        key_b = table[z] if z < size else encode_zigzag(z)
    if value is None:
        value = b""
        value_b = b"\x01"
    else:
        z = len(value) << 1
        value_b = table[z] if z < size else encode_zigzag(z)
    headers_b = _encode_headers(headers) if headers else b"\x00"
    body = b"".join((b"\x00", ts_b, off_b, key_b, key, value_b, value, headers_b))
    z = len(body) << 1
    length_b = table[z] if z < size else encode_zigzag(z)
    if limit >= 0 and len(buf) + len(length_b) + len(body) > limit:
        return False
    buf += length_b
    buf += body
    return True


def encode_records(
    buf: bytearray,
    count: int,
    first_ts: int,
    max_ts: int,
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
    headers: Sequence[Sequence[Header]] | None,
    timestamps: Sequence[int] | None,
    base_ts: int,
) -> tuple[int, int]:
    """Append the records to ``buf`` (offset deltas from ``count``); the new (first_ts, max_ts)."""
    append = append_record
    for i, value in enumerate(values):
        ts = base_ts if timestamps is None else timestamps[i]
        if count == 0:
            first_ts = max_ts = ts
        elif ts > max_ts:
            max_ts = ts
        append(buf, count, ts - first_ts, None if keys is None else keys[i], value,
               () if headers is None else headers[i], -1)  # fmt: skip
        count += 1
    return first_ts, max_ts


def _encode_headers(headers: Sequence[Header]) -> bytes:
    parts = [encode_varint(len(headers))]
    add = parts.append
    for name, value in headers:
        raw = name.encode("utf-8")
        add(encode_varint(len(raw)))
        add(raw)
        if value is None:
            add(b"\x01")
        else:
            add(encode_varint(len(value)))
            add(value)
    return b"".join(parts)
