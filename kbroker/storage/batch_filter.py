"""Records of a stored batch, read raw, and batches rebuilt from some of them (for the log cleaner).

The cleaner never re-encodes a record: a record's bytes hold its offset and timestamp
as deltas from the batch's base offset and first timestamp, and a rebuilt batch keeps
both (and its lastOffsetDelta, producer id, epoch and base sequence), so the bytes of
the records it keeps are copied as they are. Compressed bodies are decompressed and
the kept records recompressed with the same codec (kclient.records' compression).

What a rebuilt batch changes: recordCount, batchLength and the CRC; a batch left with
no record becomes an *empty batch*: header only, no codec, recordCount 0, its offsets
and producer fields kept (Kafka's ``DefaultRecordBatch.writeEmptyHeader``), which is how
producer state and the end of a cleaned segment survive.

Tombstones (KIP-534): the first time a batch holding a tombstone is cleaned, it gets a
*delete horizon* (cleaning time + delete.retention.ms): attribute bit 6 is set and the
firstTimestamp field holds the horizon; the records' timestamp deltas are re-encoded
against it, so every record keeps its timestamp for any reader. Once the horizon has
passed, a later cleaning drops the batch's tombstones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kclient.errors import CorruptRecordError
from kclient.records import (
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    DELETE_HORIZON_FLAG_MASK,
    LOG_OVERHEAD,
    BatchHeader,
    RecordColumns,
    assemble_batch,
    batch_body,
    compress,
    decode_columns,
    encode_varint,
    read_varint,
)

Buffer = bytes | bytearray | memoryview


class RawRecord(NamedTuple):
    """One record of a batch body, located but not decoded."""

    start: int
    end: int
    """``body[start:end]`` is the whole record, its length varint included."""
    rest: int
    """Where the fields after the timestamp delta start (offsetDelta onwards)."""
    timestamp_delta: int
    offset_delta: int
    key: bytes | None
    tombstone: bool
    """The value is null."""


def parse_records(body: Buffer, count: int) -> list[RawRecord]:
    """The ``count`` records of a (decompressed) batch body.

    Raises CorruptRecordError if they do not fit the body.
    """
    out: list[RawRecord] = []
    p = 0
    n = len(body)
    varint = read_varint
    try:
        for _ in range(count):
            length, q = varint(body, p)
            end = q + length
            if length < 0 or end > n:
                raise CorruptRecordError(f"record at body position {p} of length {length} runs past the batch")
            q += 1  # attributes
            ts_delta, q = varint(body, q)
            rest = q
            offset_delta, q = varint(body, q)
            key_len, q = varint(body, q)
            key: bytes | None = None
            if key_len >= 0:
                key = bytes(body[q : q + key_len])
                q += key_len
            value_len, q = varint(body, q)
            out.append(RawRecord(p, end, rest, ts_delta, offset_delta, key, value_len < 0))
            p = end
    except IndexError:
        raise CorruptRecordError("a record runs past the end of its batch") from None
    return out


def has_null_key(buf: Buffer, pos: int, header: BatchHeader) -> bool:
    """Whether any record of the (checked) batch at ``pos`` has no key."""
    return bool(null_key_indices(buf, pos, header))


def null_key_indices(buf: Buffer, pos: int, header: BatchHeader) -> list[int]:
    """Positions in the (checked) batch at ``pos`` of its records without a key (keys are
    decoded by kclient's compiled column decoder; values are not copied out)."""
    return [i for i, key in enumerate(batch_columns(buf, pos, header).keys) if key is None]


def rebase_timestamps(body: Buffer, records: list[RawRecord], old_first: int, new_first: int) -> bytes:
    """``records`` of ``body`` re-encoded with timestamp deltas from ``new_first``."""
    view = memoryview(body)
    parts: list[bytes] = []
    for r in records:
        inner = b"\x00" + encode_varint(old_first + r.timestamp_delta - new_first) + bytes(view[r.rest : r.end])
        parts.append(encode_varint(len(inner)) + inner)
    return b"".join(parts)


def build_batch(
    header: BatchHeader,
    records: bytes,
    count: int,
    *,
    first_timestamp: int | None = None,
    attributes: int | None = None,
) -> bytes:
    """A batch like ``header``'s with ``count`` records whose bytes are ``records``
    (uncompressed; compressed here with the header's codec). With no records, an
    empty batch (no codec). ``first_timestamp`` / ``attributes`` override the header's."""
    attributes = header.attributes if attributes is None else attributes
    if count == 0:
        attributes &= ~COMPRESSION_CODEC_MASK
        body = b""
    else:
        codec = attributes & COMPRESSION_CODEC_MASK
        body = compress(codec, records) if codec else records
    if first_timestamp is None:
        first_timestamp = header.first_timestamp
    return assemble_batch(
        header._replace(attributes=attributes, first_timestamp=first_timestamp, record_count=count), body
    )


class FilterResult(NamedTuple):
    data: bytes | None
    """The batch to write (the original bytes if every record is kept), None to drop it."""
    kept: int
    """Records kept."""
    horizon: int | None = None
    """The delete horizon of the batch if it keeps a tombstone that has one."""


def delete_horizon(header: BatchHeader) -> int | None:
    """The batch's delete horizon (ms), None if it has none yet."""
    return header.first_timestamp if header.attributes & DELETE_HORIZON_FLAG_MASK else None


def batch_columns(buf: Buffer, pos: int, header: BatchHeader) -> RecordColumns:
    """The records of the batch at ``pos`` as columns (kclient's compiled decoder).

    Control batches give no records."""
    with memoryview(buf) as view:
        return decode_columns(view[pos : pos + header.batch_length + LOG_OVERHEAD])


def filter_batch(
    buf: Buffer,
    pos: int,
    header: BatchHeader,
    keep: Sequence[bool],
    tombstones: Sequence[bool],
    *,
    keep_empty: bool,
    now_ms: int | None = None,
    delete_retention_ms: int = 0,
    discardable_marker: bool = False,
) -> FilterResult:
    """The batch at ``pos`` with only the records whose ``keep`` flag is set.

    ``keep`` and ``tombstones`` (value is null) hold one flag per record, in order.
    With ``now_ms`` (the cleaner), tombstones also follow the delete horizon: dropped
    once it has passed, and a batch that keeps a tombstone but has no horizon gets one
    (``now_ms + delete_retention_ms``). A batch whose records all go is dropped, or with
    ``keep_empty`` written as an empty batch. Control batches are kept whole, except a
    ``discardable_marker`` (a transaction marker with no data of its transaction left),
    which follows the delete horizon as a tombstone does (KIP-534): it gets one, then
    goes once it has passed.
    """
    size = header.batch_length + LOG_OVERHEAD
    horizon = delete_horizon(header)
    if header.attributes & CONTROL_FLAG_MASK:
        whole = bytes(memoryview(buf)[pos : pos + size])
        if not discardable_marker or now_ms is None:
            return FilterResult(whole, header.record_count)
        if horizon is not None:
            return FilterResult(None, 0) if now_ms >= horizon else FilterResult(whole, header.record_count, horizon)
        body = batch_body(buf, pos, header)
        marker = parse_records(body, header.record_count)
        new_first = now_ms + delete_retention_ms
        records = rebase_timestamps(body, marker, header.first_timestamp, new_first)
        data = build_batch(
            header,
            records,
            header.record_count,
            first_timestamp=new_first,
            attributes=header.attributes | DELETE_HORIZON_FLAG_MASK,
        )
        return FilterResult(data, header.record_count, new_first)
    if not (now_ms is None or horizon is None or now_ms < horizon):
        keep = [k and not t for k, t in zip(keep, tombstones, strict=True)]
    kept_count = sum(keep)
    kept_tombstone = any(k and t for k, t in zip(keep, tombstones, strict=True))
    set_horizon = now_ms is not None and horizon is None and kept_tombstone
    if kept_count == len(keep) and not set_horizon:
        if not keep and not keep_empty:
            return FilterResult(None, 0)
        return FilterResult(bytes(memoryview(buf)[pos : pos + size]), kept_count, horizon if kept_tombstone else None)
    if not kept_count:
        if keep_empty:
            return FilterResult(build_batch(header, b"", 0), 0)
        return FilterResult(None, 0)
    body = batch_body(buf, pos, header)
    kept = [r for r, k in zip(parse_records(body, header.record_count), keep, strict=True) if k]
    if set_horizon:
        assert now_ms is not None
        new_first = now_ms + delete_retention_ms
        records = rebase_timestamps(body, kept, header.first_timestamp, new_first)
        data = build_batch(
            header,
            records,
            kept_count,
            first_timestamp=new_first,
            attributes=header.attributes | DELETE_HORIZON_FLAG_MASK,
        )
        return FilterResult(data, kept_count, new_first)
    view = memoryview(body)
    records = b"".join(view[r.start : r.end] for r in kept)
    return FilterResult(build_batch(header, records, kept_count), kept_count, horizon if kept_tombstone else None)
