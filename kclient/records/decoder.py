"""The decoders: batches in, records out, in the shape the caller wants.

- :func:`decode_batch` / :func:`decode_batches`: header and :class:`Record` objects
  (absolute offsets and timestamps), control and compressed batches included;
- :func:`decode_consumer_records`: a fetch response as ConsumerRecords (the consumer's
  ``poll``), control batches skipped, deserializers applied;
- :func:`decode_columns`: the same as parallel lists (:class:`RecordColumns`);
- :func:`decode_buffers`: the same in Arrow's memory layout (:class:`ColumnBuffers`);
- :func:`walk_records`: the broker's check of a producer's records, without decoding.

Every decoder checks each batch's CRC before its records are read, skips records below
``start_offset`` and ignores an incomplete tail (a fetch response cut at max_bytes);
a bad batch raises CorruptRecordError with the records of the batches before it kept.
They run the implementation chosen in :mod:`kclient.records.twins`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from kclient.records.buffers import OFFSETS, ColumnBuffers
from kclient.records.header import BatchHeader
from kclient.records.layout import Buffer
from kclient.records.record import Record, RecordColumns
from kclient.records.twins import CODEC, decode_batch_with, decode_batches_with
from kclient.structs import ConsumerRecord


def decode_consumer_records(
    buf: Buffer,
    topic: str,
    partition: int,
    start_offset: int = 0,
    key_deserializer: Callable[[bytes], Any] | None = None,
    value_deserializer: Callable[[bytes], Any] | None = None,
    out: list[ConsumerRecord] | None = None,
) -> list[ConsumerRecord]:
    """The records of every complete batch in ``buf`` (a fetch response), as ConsumerRecords.

    Each batch's CRC is checked; control batches and records with an offset below
    ``start_offset`` are skipped; an incomplete tail is ignored. The deserializers
    apply to non-null keys and values. Records are appended to ``out`` (a new list if
    None) batch by batch, so when a batch raises CorruptRecordError the records of
    the batches before it are in ``out``.
    """
    return CODEC.decode_consumer_records(
        buf, topic, partition, start_offset, key_deserializer, value_deserializer, [] if out is None else out
    )


def decode_columns(buf: Buffer, start_offset: int = 0, out: RecordColumns | None = None) -> RecordColumns:
    """decode_consumer_records as columns: parallel lists, one entry per record.

    Same checks and skips; appends to ``out``'s lists when given (batch by batch, so
    a CorruptRecordError leaves the columns of the batches before it).
    """
    return CODEC.decode_columns(buf, start_offset, out)


def decode_buffers(buf: Buffer, start_offset: int = 0, out: ColumnBuffers | None = None) -> ColumnBuffers:
    """decode_columns into Arrow-layout buffers (:class:`ColumnBuffers`): no object per record.

    Same checks and skips; appends to ``out`` when given (a whole ColumnBuffers, not a
    slice, that nothing views yet), batch by batch, so a CorruptRecordError leaves the
    records of the batches before it.
    """
    cols = ColumnBuffers() if out is None else out
    if cols._start or cols._length != len(cols._parts[OFFSETS]) >> 3:
        raise ValueError("decode_buffers appends to a whole ColumnBuffers, not to a slice")
    try:
        CODEC.decode_buffers(buf, start_offset, cols._parts)
    finally:
        cols._length = len(cols._parts[OFFSETS]) >> 3
    return cols


def decode_batch(buf: Buffer, pos: int = 0, *, check_crc: bool = True) -> tuple[BatchHeader, list[Record]]:
    """Header and records (absolute offsets and timestamps) of the batch at ``pos``.

    With ``check_crc`` the batch goes through :func:`check_batch` first; without it
    only magic and bounds are checked. Compressed and control batches decode too.
    Raises CorruptRecordError (or UnsupportedCodecError for snappy without a library).
    """
    return decode_batch_with(CODEC, buf, pos, check_crc=check_crc)


def decode_batches(buf: Buffer, *, check_crc: bool = True) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """decode_batch over every complete batch of ``buf`` (an incomplete tail is ignored)."""
    return decode_batches_with(CODEC, buf, check_crc=check_crc)


def walk_records(data: Buffer, start: int, end: int, count: int) -> int:
    """Walk ``count`` records from ``start`` without decoding them (the broker's check of a
    producer's batch); returns the position after the last record.

    Checks that record ``i`` has offsetDelta ``i``, that each record's length covers
    exactly its fields, and that header keys are non-null UTF-8. Raises ValueError
    (the message says what is wrong) for a malformed record or one running past ``end``.
    """
    return CODEC.walk_records(data, start, end, count)
