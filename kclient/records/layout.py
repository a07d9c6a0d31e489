"""The RecordBatch v2 (magic 2) byte layout: every offset, mask and size, defined once.

Kafka's ``DefaultRecordBatch`` constants, byte-exact with Apache Kafka 0.11+. Nothing
else in kclient or kbroker spells a header position or an attribute bit: they import
these. (kclient/_crecords.c, which cannot, repeats HEADER_SIZE and LOG_OVERHEAD.)

Batch layout (big-endian, 61-byte header, ``DefaultRecordBatch.RECORD_BATCH_OVERHEAD``)::

    offset  size  field
         0     8  baseOffset            int64   (stamped by the leader)
         8     4  batchLength           int32   bytes after this field (size - 12)
        12     4  partitionLeaderEpoch  int32   (stamped by the leader)
        16     1  magic                 int8    = 2
        17     4  crc                   uint32  CRC-32C of bytes 21..end
        21     2  attributes            int16   bits 0-2 codec, 3 timestampType,
                                                4 isTransactional, 5 isControlBatch,
                                                6 hasDeleteHorizon (KIP-534)
        23     4  lastOffsetDelta       int32
        27     8  firstTimestamp        int64   (the delete horizon when bit 6 is set)
        35     8  maxTimestamp          int64
        43     8  producerId            int64
        51     2  producerEpoch         int16
        53     4  baseSequence          int32
        57     4  recordCount           int32
        61     -  records

Invariants:

- The CRC (Castagnoli) covers ``attributes`` to the end of the batch, so the leader can
  overwrite ``baseOffset`` and ``partitionLeaderEpoch`` without recomputing it; any
  change at or after ATTRIBUTES_OFFSET needs a new CRC.
- ``baseOffset + batchLength`` (LOG_OVERHEAD, 12 bytes) precede every batch and are not
  counted by ``batchLength``, so a batch is ``batchLength + LOG_OVERHEAD`` bytes and its
  ``batchLength`` is at least MIN_BATCH_LENGTH (a batch with no records).
- Record offsets are ``baseOffset + offsetDelta``; timestamps are
  ``firstTimestamp + timestampDelta``, or ``maxTimestamp`` for every record when the
  batch's timestamp type is LOG_APPEND_TIME.

The layout of one record is in :mod:`kclient.records.record`.
"""

from __future__ import annotations

import struct
from enum import IntEnum

Buffer = bytes | bytearray | memoryview

BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
"""Where the CRC-32C starts: attributes to the end of the batch."""
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
PRODUCER_EPOCH_OFFSET = 51
BASE_SEQUENCE_OFFSET = 53
RECORDS_COUNT_OFFSET = 57
HEADER_SIZE = 61
"""Bytes of the batch header, records start here."""
LOG_OVERHEAD = 12
"""baseOffset + batchLength: the bytes not counted by batchLength."""
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
"""49: the batchLength of a batch with no records."""

HEADER = struct.Struct(">qiibIhiqqqhii")
"""The 61-byte header, field by field (the fields of :class:`~kclient.records.BatchHeader`)."""
assert HEADER.size == HEADER_SIZE

MAGIC = 2
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

# attributes
COMPRESSION_CODEC_MASK = 0x07
"""Bits 0-2: the :class:`~kclient.records.Compression` codec id."""
TIMESTAMP_TYPE_MASK = 0x08
"""Bit 3: set for LOG_APPEND_TIME."""
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40
"""Bit 6: firstTimestamp holds the batch's delete horizon (KIP-534)."""

# control records (a control batch holds one; Kafka's ControlRecordType, EndTransactionMarker)
CONTROL_KEY_VERSION = 0
"""The version (int16) that starts a control record's key: int16 version, int16 type."""
CONTROL_TYPE_ABORT = 0
"""ControlRecordType ABORT: the marker that ends an aborted transaction."""
CONTROL_TYPE_COMMIT = 1
"""ControlRecordType COMMIT: the marker that ends a committed transaction."""
END_TXN_MARKER_VERSION = 0
"""The version (int16) that starts a transaction marker's value: int16 version, int32 coordinator epoch."""


class TimestampType(IntEnum):
    """Attribute bit 3: who set the record timestamps."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1
