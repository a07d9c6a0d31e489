"""Record-level checks of a producer's batch (the record part of Kafka's LogValidator).

A batch whose header and CRC are valid may still hold garbage: a record count that
the body does not hold, repeated offset deltas, record lengths that do not match
their fields, or a small compressed body that inflates to gigabytes. Every batch a
leader accepts is one that kclient (and Kafka's clients) can decode record by record.

The records are walked, never decoded (:func:`kclient.records.walk_records`, compiled
with the codec): the walk reads each varint length and skips keys, values and
headers, without building objects or copying bytes.

Compressed bodies are inflated by kclient's bounded decompression
(:func:`kclient.records.batch_body` with a size cap), which stops one byte past the
limit, so a bomb costs at most ``max.message.bytes`` of memory.
"""

from __future__ import annotations

from kclient.errors import CorruptRecordError, InvalidRecordError, MessageSizeTooLargeError, UnsupportedCodecError
from kclient.records import (
    COMPRESSION_CODEC_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_RECORD_SIZE,
    BatchHeader,
    batch_body,
    walk_records,
)

Buffer = bytes | bytearray | memoryview


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
    data: Buffer = buf
    if header.attributes & COMPRESSION_CODEC_MASK:
        limit = None if max_message_bytes is None else max(max_message_bytes - HEADER_SIZE, 0)
        try:
            data = batch_body(buf, pos, header, limit)
        except UnsupportedCodecError:
            return
        except MessageSizeTooLargeError:
            assert limit is not None
            raise MessageSizeTooLargeError(
                f"batch at position {pos} decompresses to more than {limit + HEADER_SIZE} bytes, "
                f"larger than max.message.bytes={max_message_bytes}"
            ) from None
        except CorruptRecordError as exc:
            raise CorruptRecordError(f"batch at position {pos}: {exc}") from None
        start, end = 0, len(data)
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
