"""Record-level checks of a producer's batch (the record part of Kafka's LogValidator).

A batch whose header and CRC are valid may still hold garbage: a record count that
the body does not hold, repeated offset deltas, record lengths that do not match
their fields, or a small compressed body that inflates to gigabytes. Every batch a
leader accepts is one that kclient (and Kafka's clients) can decode record by record.

The records are walked, never decoded (:func:`kclient.records.walk_records`, compiled
with the codec): the walk reads each varint length and skips keys, values and
headers, without building objects or copying bytes.

Compressed bodies are inflated by a streaming decompressor that stops one byte past
the limit, so a bomb costs at most ``max.message.bytes`` of memory.
"""

from __future__ import annotations

import zlib

import lz4.frame as _lz4f
import zstandard as _zstd

from kclient.errors import CorruptRecordError, InvalidRecordError, MessageSizeTooLargeError, UnsupportedCodecError
from kclient.records import HEADER_SIZE, LOG_OVERHEAD, BatchHeader, Compression, decompress, walk_records

Buffer = bytes | bytearray | memoryview

MIN_RECORD_SIZE = 7
"""Bytes of the smallest record: length, attributes, timestampDelta, offsetDelta,
keyLength, valueLength and headerCount, one byte each."""
_CODEC_MASK = 0x07
_CHUNK = 256 * 1024


def check_records(buf: Buffer, pos: int, header: BatchHeader, max_message_bytes: int | None) -> None:
    """Check the records of the batch at ``pos`` (header, CRC and offset range already checked).

    - the body holds exactly ``recordCount`` records and nothing after them;
    - record ``i`` has offsetDelta ``i`` (so deltas run 0..recordCount-1);
    - each record's length varint covers exactly its fields (key, value, headers);
      header keys are not null and are UTF-8;
    - a compressed body inflates to at most ``max.message.bytes`` minus the batch
      header (when ``max_message_bytes`` is given).

    Raises InvalidRecordError for records that are not what the header says,
    CorruptRecordError for a body that does not decompress, MessageSizeTooLargeError
    for one that inflates beyond the limit. Snappy bodies are only checked if a
    snappy library is importable (the broker cannot read them otherwise).
    """
    count = header.record_count
    start = pos + HEADER_SIZE
    end = pos + header.batch_length + LOG_OVERHEAD
    codec = header.attributes & _CODEC_MASK
    data: Buffer = buf
    if codec:
        limit = None if max_message_bytes is None else max(max_message_bytes - HEADER_SIZE, 0)
        with memoryview(buf) as view:
            inflated = _inflate(codec, view[start:end], limit, pos, max_message_bytes)
        if inflated is None:
            return
        data, start, end = inflated, 0, len(inflated)
    if count * MIN_RECORD_SIZE > end - start:
        raise InvalidRecordError(
            f"batch at position {pos} declares {count} records, but its {end - start} bytes of "
            f"records hold at most {(end - start) // MIN_RECORD_SIZE}"
        )
    try:
        walked = walk_records(data, start, end, count)
    except ValueError as exc:
        raise InvalidRecordError(f"batch at position {pos} holds a malformed record: {exc}") from None
    if walked != end:
        raise InvalidRecordError(
            f"batch at position {pos}: its {count} records take {walked - start} bytes but the batch holds "
            f"{end - start} bytes of records (the record count is wrong)"
        )


def _inflate(codec: int, body: memoryview, limit: int | None, pos: int, max_message_bytes: int | None) -> bytes | None:
    """The decompressed body, at most ``limit`` bytes; None if it cannot be read here (snappy)."""
    cap = -1 if limit is None else limit + 1
    out: bytes | None
    try:
        if codec == Compression.ZSTD:
            out = _zstd_inflate(body, cap)
        elif codec == Compression.LZ4:
            out = _lz4_inflate(body, cap)
        elif codec == Compression.GZIP:
            out = _gzip_inflate(body, cap)
        elif codec == Compression.SNAPPY:
            out = _snappy_inflate(body)
        else:
            raise CorruptRecordError(f"batch at position {pos} has unknown compression codec {codec}")
    except (zlib.error, RuntimeError, ValueError, EOFError, _zstd.ZstdError) as exc:
        name = Compression(codec).name.lower()
        raise CorruptRecordError(f"batch at position {pos}: cannot decompress its {name} records: {exc}") from None
    if out is not None and limit is not None and len(out) > limit:
        raise MessageSizeTooLargeError(
            f"batch at position {pos} decompresses to more than {limit + HEADER_SIZE} bytes, "
            f"larger than max.message.bytes={max_message_bytes}"
        )
    return out


def _zstd_inflate(body: memoryview, cap: int) -> bytes:
    # As kclient reads it: every frame, one after the other.
    reader = _zstd.ZstdDecompressor().stream_reader(body, read_across_frames=True)
    parts: list[bytes] = []
    total = 0
    while cap < 0 or total < cap:
        chunk = reader.read(_CHUNK if cap < 0 else min(_CHUNK, cap - total))
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
    return b"".join(parts)


def _lz4_inflate(body: memoryview, cap: int) -> bytes:
    # As kclient reads it: the first frame; it must be complete.
    decompressor = _lz4f.LZ4FrameDecompressor()
    out: bytes = decompressor.decompress(body, max_length=cap)
    parts = [out]
    total = len(out)
    while not decompressor.eof and (cap < 0 or total < cap):
        more: bytes = decompressor.decompress(b"", max_length=-1 if cap < 0 else cap - total)
        if not more:
            break
        parts.append(more)
        total += len(more)
    if not decompressor.eof and (cap < 0 or total < cap):
        raise EOFError("truncated lz4 frame")
    return b"".join(parts)


def _gzip_inflate(body: memoryview, cap: int) -> bytes:
    # As kclient (and Java's GZIPInputStream) read it: concatenated members.
    parts: list[bytes] = []
    total = 0
    rest: bytes | memoryview = body
    while True:
        decompressor = zlib.decompressobj(31)
        out = decompressor.decompress(rest, 0 if cap < 0 else cap - total)
        parts.append(out)
        total += len(out)
        while decompressor.unconsumed_tail and (cap < 0 or total < cap):
            out = decompressor.decompress(decompressor.unconsumed_tail, 0 if cap < 0 else cap - total)
            parts.append(out)
            total += len(out)
        if 0 <= cap <= total:
            break
        if not decompressor.eof:
            raise EOFError("truncated gzip data")
        rest = decompressor.unused_data
        if not rest:
            break
    return b"".join(parts)


def _snappy_inflate(body: memoryview) -> bytes | None:
    # Snappy expands at most ~21 times, so a request-sized body is no bomb: decoded whole,
    # by kclient's xerial reader, if a snappy library is installed.
    try:
        return decompress(Compression.SNAPPY, body)
    except UnsupportedCodecError:
        return None
