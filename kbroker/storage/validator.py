"""Checks and stamps applied to record batches on their way into a log (Kafka's LogValidator).

The broker never decodes records into objects: batches from a producer have their
records walked (see :mod:`.record_checks`), everything else reads and writes batch
headers only (plus one CRC-32C when the topic uses LogAppendTime).
"""

from __future__ import annotations

from typing import NamedTuple

from kbroker.storage.batch_filter import build_batch, null_key_indices
from kbroker.storage.record_checks import check_records
from kclient.errors import CorruptRecordError, InvalidRecordError, MessageSizeTooLargeError
from kclient.records import (
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    BatchHeader,
    batch_body,
    check_batch,
    read_header,
    set_log_append_time,
    stamp_batch,
)

Buffer = bytes | bytearray | memoryview


NULL_KEY_MESSAGE = "Compacted topic cannot accept message without key."
"""Kafka's per-record message for a record without a key sent to a compacted topic."""


class RecordValidationError(InvalidRecordError):
    """INVALID_RECORD naming the bad records (Kafka's RecordValidationException, KIP-467).

    ``record_errors`` holds (batch index, message) per bad record: the record's position
    in its batch. The whole request's batches are refused, as Kafka does."""

    def __init__(self, record_errors: list[tuple[int, str]]) -> None:
        shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in record_errors[:3])
        super().__init__(
            f"One or more records have been rejected due to {len(record_errors)} record errors in total, "
            f"and only showing the first three errors at most: [{shown}]"
        )
        self.record_errors = record_errors


class BatchSummary(NamedTuple):
    """What an append needs to know about a list of validated batches."""

    batches: list[tuple[int, BatchHeader]]
    """(position in the buffer, header) of every batch, in order."""
    num_records: int
    max_timestamp: int
    """Largest batch max timestamp, -1 if none."""
    offset_of_max_timestamp: int
    """Last offset of the first batch holding ``max_timestamp``, -1 if none."""

    @property
    def first_offset(self) -> int:
        return self.batches[0][1].base_offset

    @property
    def last_offset(self) -> int:
        return self.batches[-1][1].last_offset


def summarize(batches: list[tuple[int, BatchHeader]]) -> BatchSummary:
    max_ts = -1
    offset_of_max = -1
    records = 0
    for _, header in batches:
        records += header.record_count
        if header.max_timestamp > max_ts:
            max_ts = header.max_timestamp
            offset_of_max = header.last_offset
    return BatchSummary(batches, records, max_ts, offset_of_max)


def validate_batches(
    records: Buffer, *, as_leader: bool, max_message_bytes: int | None, require_keys: bool = False
) -> list[tuple[int, BatchHeader]]:
    """(position, header) of every batch in ``records``, each one checked.

    ``records`` must be one or more complete batches and nothing else. Each batch
    passes ``check_batch`` (magic 2, length, CRC-32C) and has a consistent offset
    range. From a producer (``as_leader``) a batch must declare exactly
    ``lastOffsetDelta + 1`` records, must not be a control batch, and its records
    must be what the header says (:func:`~.record_checks.check_records`: the count,
    offset deltas 0..n-1, record lengths, the decompressed size). From a leader
    (follower side) offsets must increase from batch to batch, and fewer records
    than offsets are allowed (compacted batches); the leader checked the records.
    With ``require_keys`` (a compacted topic), a producer's record without a key is
    an InvalidRecordError, as Kafka's "Compacted topic cannot accept message without key".

    Raises, naming the batch's position, as Kafka does: CorruptRecordError for bytes
    that are not a valid batch (framing, CRC, undecompressable body);
    InvalidRecordError for a valid batch whose records or offsets are inconsistent;
    MessageSizeTooLargeError for a batch (or its decompressed records) larger than
    ``max_message_bytes`` (not checked when None).
    """
    total = len(records)
    if total == 0:
        raise CorruptRecordError("no record batches: the records are empty")
    batches: list[tuple[int, BatchHeader]] = []
    pos = 0
    previous_next = -1
    while pos < total:
        remaining = total - pos
        if remaining < HEADER_SIZE:
            raise CorruptRecordError(
                f"{remaining} trailing bytes at position {pos} are not a complete batch "
                f"(a batch header is {HEADER_SIZE} bytes)"
            )
        header = read_header(records, pos)
        if header.magic != MAGIC:
            raise CorruptRecordError(
                f"batch at position {pos} has magic {header.magic}, only magic {MAGIC} is supported"
            )
        if header.batch_length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"batch at position {pos} has batchLength {header.batch_length}, "
                f"less than the minimum {MIN_BATCH_LENGTH}"
            )
        size = header.batch_length + LOG_OVERHEAD
        if size > remaining:
            raise CorruptRecordError(
                f"batch at position {pos} declares {size} bytes but only {remaining} remain (truncated batch)"
            )
        if max_message_bytes is not None and size > max_message_bytes:
            raise MessageSizeTooLargeError(
                f"batch at position {pos} is {size} bytes, larger than max.message.bytes={max_message_bytes}"
            )
        check_batch(records, pos, header)
        delta = header.last_offset_delta
        count = header.record_count
        if delta < 0:
            raise InvalidRecordError(f"batch at position {pos} has a negative lastOffsetDelta {delta}")
        if as_leader:
            if count != delta + 1:
                raise InvalidRecordError(
                    f"batch at position {pos} holds {count} records but its offsets span "
                    f"{delta + 1} (lastOffsetDelta {delta})"
                )
            if header.attributes & CONTROL_FLAG_MASK:
                raise InvalidRecordError(f"batch at position {pos} is a control batch: clients cannot write those")
            check_records(records, pos, header, max_message_bytes)
            if require_keys:
                missing = null_key_indices(records, pos, header)
                if missing:
                    raise RecordValidationError([(i, NULL_KEY_MESSAGE) for i in missing])
        else:
            if count > delta + 1:
                raise CorruptRecordError(
                    f"batch at position {pos} holds {count} records, more than its {delta + 1} offsets"
                )
            if header.base_offset < 0 or header.base_offset < previous_next:
                raise CorruptRecordError(
                    f"batch at position {pos} starts at offset {header.base_offset}, "
                    f"before the end of the previous batch ({previous_next})"
                )
            previous_next = header.next_offset
        batches.append((pos, header))
        pos += size
    return batches


def recompress(
    records: Buffer, batches: list[tuple[int, BatchHeader]], codec: int, max_message_bytes: int | None
) -> tuple[Buffer, list[tuple[int, BatchHeader]]]:
    """The producer's (validated) batches with every batch stored in ``codec`` (topic config
    ``compression.type``), and their positions and headers in the result.

    Kafka's LogValidator does the same, and it is the one place where the broker
    re-encodes batches: a batch whose codec differs is decompressed and its record bytes
    recompressed as they are (kclient's codecs), in a new batch with the same offsets
    delta, timestamps, producer id, epoch, sequence and record count; only batchLength,
    the codec bits and the CRC change. Batches already in ``codec`` are kept as sent
    (``records`` itself is returned when all are). The cost is one decompression and one
    compression per recompressed batch on the append lane, and a copy of the request's
    batches. A recompressed batch larger than ``max_message_bytes`` is a
    MessageSizeTooLargeError, as in Kafka.
    """
    if all(h.attributes & COMPRESSION_CODEC_MASK == codec for _, h in batches):
        return records, batches
    view = memoryview(records)
    parts: list[bytes] = []
    out: list[tuple[int, BatchHeader]] = []
    at = 0
    for pos, header in batches:
        size = header.batch_length + LOG_OVERHEAD
        if header.attributes & COMPRESSION_CODEC_MASK == codec:
            data = bytes(view[pos : pos + size])
        else:
            body = bytes(batch_body(records, pos, header))
            attributes = (header.attributes & ~COMPRESSION_CODEC_MASK) | codec
            data = build_batch(header, body, header.record_count, attributes=attributes)
            if max_message_bytes is not None and len(data) > max_message_bytes:
                raise MessageSizeTooLargeError(
                    f"batch at position {pos} is {len(data)} bytes once recompressed for the topic's "
                    f"compression.type, larger than max.message.bytes={max_message_bytes}"
                )
        out.append((at, read_header(data, 0)))
        parts.append(data)
        at += len(data)
    return b"".join(parts), out


def stamp_headers(
    records: Buffer,
    batches: list[tuple[int, BatchHeader]],
    first_offset: int,
    leader_epoch: int,
    append_time_ms: int | None = None,
) -> tuple[list[Buffer], list[tuple[int, BatchHeader]]]:
    """The producer's batches as written: per batch, a stamped copy of its 61-byte header
    and a view of its records (the request itself is never copied or changed).

    Each header gets a base offset (consecutive from ``first_offset``) and the leader
    epoch, both outside the CRC; with ``append_time_ms`` (LogAppendTime topics) also the
    timestamp-type bit and that maxTimestamp, and a recomputed CRC, as Kafka's
    ``DefaultRecordBatch.setMaxTimestamp``. Returns the pieces to write, in order, and
    the stamped headers at their positions in the concatenation (which equal the
    positions in ``records``).
    """
    view = memoryview(records)
    pieces: list[Buffer] = []
    stamped: list[tuple[int, BatchHeader]] = []
    offset = first_offset
    for pos, header in batches:
        end = pos + header.batch_length + LOG_OVERHEAD
        head = bytearray(view[pos : pos + HEADER_SIZE])
        body = view[pos + HEADER_SIZE : end]
        stamp_batch(head, 0, offset, leader_epoch)
        h = header._replace(base_offset=offset, partition_leader_epoch=leader_epoch)
        if append_time_ms is not None:
            h = set_log_append_time(head, body, h, append_time_ms)
        pieces += (head, body)
        stamped.append((pos, h))
        offset += header.last_offset_delta + 1
    return pieces, stamped
