"""Transactions in the log: control records and a read_committed consumer's filter.

A transaction ends, on every partition it wrote, with a control batch (attributes
CONTROL | TRANSACTIONAL) holding one control record: its key is the ControlRecordType
(int16 version, int16 type: ABORT or COMMIT), its value the EndTransactionMarker (int16
version, int32 coordinator epoch). :func:`~kclient.records.builder.build_control_batch`
writes one; :func:`control_type` and :func:`read_control_record` read one back.

:func:`drop_aborted` is a read_committed consumer's batch-level filter (Java's
``CompletedFetch``, librdkafka's ``rd_kafka_aborted_txns``): the Fetch answer's aborted
transactions in, the answer's bytes without the batches of aborted transactions out,
before anything is decoded, so every decoder (records, columns, Arrow buffers, either
codec twin) gets it alike.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from kclient.errors import CorruptRecordError, KafkaError
from kclient.records.header import BatchHeader, batch_body, check_batch, read_header
from kclient.records.layout import (
    CONTROL_FLAG_MASK,
    CONTROL_TYPE_ABORT,
    CONTROL_TYPE_COMMIT,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    TRANSACTIONAL_FLAG_MASK,
    Buffer,
)
from kclient.records.varint import read_varint
from kclient.structs import AbortedTransaction

__all__ = [
    "CONTROL_TYPE_ABORT",
    "CONTROL_TYPE_COMMIT",
    "ControlRecord",
    "control_type",
    "drop_aborted",
    "read_control_record",
]

_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_MARKER = struct.Struct(">hi")
_MAX_CONTROL_BODY = 1 << 16
"""A control batch's records are a few bytes; a body inflating past this is corrupt."""


class ControlRecord(NamedTuple):
    """The control record of a transaction marker."""

    key_version: int
    type: int
    """CONTROL_TYPE_ABORT or CONTROL_TYPE_COMMIT (other values: a type this client does not know)."""
    value_version: int | None
    """None when the record has no value (or one too short for an EndTransactionMarker)."""
    coordinator_epoch: int | None


def read_control_record(buf: Buffer, pos: int = 0, header: BatchHeader | None = None) -> ControlRecord:
    """The first record of the control batch at ``pos``, as a ControlRecord (no CRC check).

    Raises CorruptRecordError when the batch is not a control batch, holds no record, or
    its first record's key is not a control key (at least 4 bytes: int16 version, int16 type).
    """
    if header is None:
        header = read_header(buf, pos)
    if not header.attributes & CONTROL_FLAG_MASK:
        raise CorruptRecordError(f"batch at offset {header.base_offset} is not a control batch")
    if header.record_count < 1:
        raise CorruptRecordError(f"control batch at offset {header.base_offset} holds no record")
    if header.batch_length < MIN_BATCH_LENGTH or pos + header.batch_length + LOG_OVERHEAD > len(buf):
        raise CorruptRecordError(f"control batch at offset {header.base_offset} runs past the buffer")
    body = batch_body(buf, pos, header, _MAX_CONTROL_BODY)
    try:
        _, p = read_varint(body, 0)  # length
        p += 1  # attributes
        _, p = read_varint(body, p)  # timestampDelta
        _, p = read_varint(body, p)  # offsetDelta
        key_len, p = read_varint(body, p)
        if key_len < _CONTROL_KEY.size or p + key_len > len(body):
            raise CorruptRecordError(
                f"control batch at offset {header.base_offset} has a control key of {key_len} bytes"
            )
        key_version, kind = _CONTROL_KEY.unpack_from(body, p)
        p += key_len
        value_len, p = read_varint(body, p)
        value_version: int | None = None
        coordinator_epoch: int | None = None
        if value_len >= _END_TXN_MARKER.size and p + value_len <= len(body):
            value_version, coordinator_epoch = _END_TXN_MARKER.unpack_from(body, p)
    except (IndexError, struct.error) as exc:
        raise CorruptRecordError(
            f"control batch at offset {header.base_offset} has a malformed control record: {exc}"
        ) from None
    return ControlRecord(key_version, kind, value_version, coordinator_epoch)


def control_type(buf: Buffer, pos: int = 0) -> int:
    """The ControlRecordType of the control batch at ``pos``: CONTROL_TYPE_ABORT (0) or
    CONTROL_TYPE_COMMIT (1). Raises CorruptRecordError as :func:`read_control_record`."""
    return read_control_record(buf, pos).type


def drop_aborted(records: Buffer, aborted: Sequence[AbortedTransaction]) -> Buffer:
    """``records`` (one partition of a Fetch answer) without the batches of aborted
    transactions, as a read_committed consumer sees them (Java's ``CompletedFetch``).

    ``aborted`` is the answer's aborted transactions (producer id, first offset), in any
    order. The batches are walked in offset order: once a batch's last offset reaches an
    aborted transaction's first offset, its producer is in an aborted transaction; that
    producer's transactional batches are dropped whole until its ABORT marker (a control
    batch), which ends it. Batches without a producer id, non-transactional batches and
    the other producers' batches are kept, and so are the control batches themselves (the
    decoders skip them, and the consumer's position moves past them).

    Returns ``records`` itself, not a copy, when nothing is dropped (always when
    ``aborted`` is empty); otherwise new bytes, the kept batches in order and an
    incomplete tail as it was. A batch about to be dropped that fails its CRC, and
    everything from a header that cannot be walked, are kept, so the decoders raise
    CorruptRecordError for them as they would without the filter.
    """
    if not aborted:
        return records
    pending = sorted(aborted, key=lambda t: t.first_offset)
    next_txn = 0
    open_pids: set[int] = set()
    kept: list[tuple[int, int]] = []  # (start, end) runs of bytes kept
    run_start = 0
    dropped = False
    n = len(records)
    pos = 0
    while n - pos >= HEADER_SIZE:
        header = read_header(records, pos)
        length = header.batch_length
        if length < MIN_BATCH_LENGTH:
            break  # cannot be stepped over: kept, for the decoder to raise
        end = pos + length + LOG_OVERHEAD
        if end > n:
            break  # an incomplete tail
        pid = header.producer_id
        if pid >= 0:
            last = header.base_offset + header.last_offset_delta
            while next_txn < len(pending) and pending[next_txn].first_offset <= last:
                open_pids.add(pending[next_txn].producer_id)
                next_txn += 1
            if pid in open_pids:
                attributes = header.attributes
                if attributes & CONTROL_FLAG_MASK:
                    try:
                        if read_control_record(records, pos, header).type == CONTROL_TYPE_ABORT:
                            open_pids.discard(pid)
                    except KafkaError:
                        break  # kept from here on: the decoders raise for it, or skip it
                elif attributes & TRANSACTIONAL_FLAG_MASK and _intact(records, pos, header):
                    if pos > run_start:
                        kept.append((run_start, pos))
                    run_start = end
                    dropped = True
        pos = end
    if not dropped:
        return records
    if n > run_start:
        kept.append((run_start, n))
    with memoryview(records) as view:
        return b"".join([view[a:b] for a, b in kept])


def _intact(buf: Buffer, pos: int, header: BatchHeader) -> bool:
    try:
        check_batch(buf, pos, header)
    except KafkaError:
        return False
    return True


CONTROL_TYPES = {CONTROL_TYPE_ABORT: "ABORT", CONTROL_TYPE_COMMIT: "COMMIT"}
"""A ControlRecordType's name, for messages."""
