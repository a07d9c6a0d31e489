"""Batch headers: the broker's side of the format (no record is decoded here).

:class:`BatchHeader` is the 61-byte header field for field (layout in
:mod:`kclient.records.layout`). The broker reads headers (:func:`read_header`,
:func:`iter_headers`), checks a batch's shape and CRC (:func:`check_batch`), stamps
the base offset and leader epoch outside the CRC (:func:`stamp_batch`), and rewrites
the fields inside it with a new CRC (:func:`set_log_append_time`, :func:`assemble_batch`).
:func:`batch_body` gives a batch's records as bytes, decompressed if need be, for the
few places the broker reads them (its record checks, the log cleaner, recompression).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

from kclient.errors import CorruptRecordError
from kclient.records.compression import Compression, decompress
from kclient.records.layout import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MAX_TIMESTAMP_OFFSET,
    MIN_BATCH_LENGTH,
    NO_SEQUENCE,
    PARTITION_LEADER_EPOCH_OFFSET,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    Buffer,
    TimestampType,
)
from kclient.records.native import crc32c

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_MAX_INT32 = 0x7FFFFFFF


class BatchHeader(NamedTuple):
    """The 61-byte header of a record batch, field for field."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch, log overhead included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        codec = self.attributes & COMPRESSION_CODEC_MASK
        try:
            return Compression(codec)
        except ValueError:
            raise CorruptRecordError(f"unknown compression codec id {codec}") from None

    @property
    def timestamp_type(self) -> TimestampType:
        if self.attributes & TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record (wraps at Int.MAX to 0), or NO_SEQUENCE."""
        base = self.base_sequence
        if base == NO_SEQUENCE:
            return NO_SEQUENCE
        delta = self.last_offset_delta
        if base > _MAX_INT32 - delta:
            return delta - (_MAX_INT32 - base) - 1
        return base + delta


_unpack_header = HEADER.unpack_from
tuple_new: Any = tuple.__new__
"""``tuple_new(BatchHeader, fields)``: a NamedTuple without its ``__new__``'s argument handling."""


def read_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """The header of the batch at ``pos`` (no CRC check).

    Raises CorruptRecordError if fewer than HEADER_SIZE bytes are left.
    """
    if len(buf) - pos < HEADER_SIZE or pos < 0:
        raise CorruptRecordError(
            f"incomplete batch header at position {pos}: {HEADER_SIZE} bytes needed, {max(len(buf) - pos, 0)} available"
        )
    header: BatchHeader = tuple_new(BatchHeader, _unpack_header(buf, pos))
    return header


def iter_headers(buf: Buffer) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of every complete batch in ``buf``, in order.

    Stops silently at an incomplete tail (a torn write, or a fetch response cut at
    max_bytes). A batchLength too small for any batch cannot be stepped over and
    raises CorruptRecordError. Nothing is checked beyond that: see check_batch.
    """
    n = len(buf)
    pos = 0
    unpack = _unpack_header
    new = tuple_new
    header_type = BatchHeader
    while n - pos >= HEADER_SIZE:
        fields = unpack(buf, pos)
        length = fields[1]
        if length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"batch at position {pos} has batchLength {length}, less than the minimum {MIN_BATCH_LENGTH}"
            )
        end = pos + length + LOG_OVERHEAD
        if end > n:
            return
        yield pos, new(header_type, fields)
        pos = end


def check_shape(buf: Buffer, pos: int, header: BatchHeader) -> None:
    """Magic 2, batchLength >= MIN_BATCH_LENGTH and the batch inside ``buf`` (check_batch without the CRC)."""
    if header.magic != MAGIC:
        raise CorruptRecordError(f"batch at position {pos} has magic {header.magic}, only magic {MAGIC} is supported")
    length = header.batch_length
    if length < MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"batch at position {pos} has batchLength {length}, less than the minimum {MIN_BATCH_LENGTH}"
        )
    if pos < 0 or pos + length + LOG_OVERHEAD > len(buf):
        raise CorruptRecordError(
            f"batch at position {pos} of {length + LOG_OVERHEAD} bytes runs past the end "
            f"of the buffer ({len(buf)} bytes)"
        )


def check_batch(buf: Buffer, pos: int, header: BatchHeader) -> None:
    """Validate the batch at ``pos`` whose header is ``header``.

    Checks magic == 2, batchLength >= 49, that the batch lies inside ``buf``, a
    non-negative record count, a known codec id and the CRC-32C. Raises
    CorruptRecordError naming the first problem found.
    """
    check_shape(buf, pos, header)
    if header.record_count < 0:
        raise CorruptRecordError(f"batch at position {pos} has a negative record count {header.record_count}")
    codec = header.attributes & COMPRESSION_CODEC_MASK
    if codec > Compression.ZSTD:
        raise CorruptRecordError(f"batch at position {pos} has unknown compression codec {codec}")
    with memoryview(buf) as view:
        crc = crc32c(view[pos + ATTRIBUTES_OFFSET : pos + header.batch_length + LOG_OVERHEAD])
    if crc != header.crc:
        raise CorruptRecordError(
            f"batch at position {pos} (base offset {header.base_offset}) fails its CRC check: "
            f"stored 0x{header.crc:08x}, computed 0x{crc:08x}"
        )


def stamp_batch(buf: bytearray, pos: int, base_offset: int, partition_leader_epoch: int) -> None:
    """Overwrite baseOffset and partitionLeaderEpoch in place (outside the CRC)."""
    _I64.pack_into(buf, pos, base_offset)
    _I32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, partition_leader_epoch)


def set_log_append_time(head: bytearray, body: Buffer, header: BatchHeader, append_time_ms: int) -> BatchHeader:
    """Mark the batch whose 61-byte header is ``head`` and whose records are ``body`` as
    LOG_APPEND_TIME at ``append_time_ms``: the timestamp-type bit, maxTimestamp and a new
    CRC are written into ``head`` (Kafka's ``DefaultRecordBatch.setMaxTimestamp``).
    Returns ``header`` with those fields changed."""
    attributes = header.attributes | TIMESTAMP_TYPE_MASK
    _I16.pack_into(head, ATTRIBUTES_OFFSET, attributes)
    _I64.pack_into(head, MAX_TIMESTAMP_OFFSET, append_time_ms)
    crc = crc32c(body, crc32c(memoryview(head)[ATTRIBUTES_OFFSET:HEADER_SIZE]))
    _U32.pack_into(head, CRC_OFFSET, crc)
    return header._replace(attributes=attributes, max_timestamp=append_time_ms, crc=crc)


def assemble_batch(header: BatchHeader, body: Buffer) -> bytes:
    """A batch with ``header``'s fields around ``body`` (its records, already compressed
    if the attributes name a codec); batchLength and the CRC are computed here, the
    header's own are ignored."""
    head = bytearray(HEADER.pack(*header._replace(batch_length=HEADER_SIZE - LOG_OVERHEAD + len(body), crc=0)))
    crc = crc32c(body, crc32c(memoryview(head)[ATTRIBUTES_OFFSET:]))
    _U32.pack_into(head, CRC_OFFSET, crc)
    return bytes(head) + bytes(body)


def batch_body(buf: Buffer, pos: int, header: BatchHeader, max_size: int | None = None) -> Buffer:
    """The records of the batch at ``pos``: a view of ``buf``, or decompressed (at most
    ``max_size`` bytes, see :func:`~kclient.records.compression.decompress`)."""
    view = memoryview(buf)[pos + HEADER_SIZE : pos + header.batch_length + LOG_OVERHEAD]
    codec = header.attributes & COMPRESSION_CODEC_MASK
    if not codec:
        return view
    return decompress(codec, view, max_size)
