"""The builder: records in, one RecordBatch v2 out (Kafka's MemoryRecordsBuilder).

:class:`BatchBuilder` appends records one at a time (the producer's accumulator, which
fills a batch up to ``batch.size`` by exact encoded size); :func:`encode_batch` builds a
whole batch from parallel sequences in one call (``send_batch``). Both give the same
bytes for the same records. The per-record loops are the implementation's
(:mod:`kclient.records.twins`); the header, compression and CRC are written here, once,
at :meth:`BatchBuilder.build`.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from typing import ClassVar

from kclient.errors import IllegalStateError, InvalidConfigError
from kclient.records.compression import Compression, compress, require
from kclient.records.layout import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    CONTROL_KEY_VERSION,
    CONTROL_TYPE_ABORT,
    CONTROL_TYPE_COMMIT,
    CRC_OFFSET,
    END_TXN_MARKER_VERSION,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TRANSACTIONAL_FLAG_MASK,
)
from kclient.records.native import Codec, crc32c
from kclient.records.record import Header

_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
_CONTROL_KEY = struct.Struct(">hh")
"""A control record's key: version, ControlRecordType."""
_END_TXN_MARKER = struct.Struct(">hi")
"""A transaction marker's value: version, coordinator epoch."""


def _now_ms() -> int:
    return int(time.time() * 1000)


class BatchBuilder:
    """Accumulates records into one RecordBatch v2 (CREATE_TIME timestamps).

    ``append`` records, then ``build`` the batch bytes (once; later calls return the
    same bytes and appending is refused). Offset deltas count from 0; the broker
    stamps the real base offset.

    ``write_limit`` (the producer's ``batch.size``) is what :meth:`has_room_for`
    and :meth:`try_append` measure against, as Kafka's MemoryRecordsBuilder does:
    the exact encoded (uncompressed) size, and the first record always fits.
    ``append`` itself never refuses a record for its size. Not thread safe.
    """

    __slots__ = (
        "_base_offset",
        "_base_sequence",
        "_buf",
        "_built",
        "_compression",
        "_count",
        "_first_ts",
        "_is_transactional",
        "_max_ts",
        "_partition_leader_epoch",
        "_producer_epoch",
        "_producer_id",
        "_write_limit",
    )
    _codec: ClassVar[Codec]
    """The implementation's loops (set by :mod:`kclient.records.twins`)."""
    _append_record: ClassVar[Callable[..., bool]]  # _codec.append_record, looked up once per call

    def __init__(
        self,
        compression: Compression = Compression.NONE,
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        is_transactional: bool = False,
        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
        base_offset: int = 0,
        write_limit: int | None = None,
    ) -> None:
        try:
            codec = Compression(compression)
        except ValueError:
            raise InvalidConfigError(f"unknown compression codec {compression!r}") from None
        require(codec, "encode")
        if is_transactional and producer_id == NO_PRODUCER_ID:
            raise InvalidConfigError("a transactional batch needs a producer id")
        try:  # fail now, not at build, on a field out of its range
            HEADER.pack(
                base_offset, 0, partition_leader_epoch, MAGIC, 0, 0, 0, 0, 0,
                producer_id, producer_epoch, base_sequence, 0,
            )  # fmt: skip
        except struct.error as exc:
            raise InvalidConfigError(f"batch header field out of range: {exc}") from None
        self._compression = codec
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        self._is_transactional = bool(is_transactional)
        self._partition_leader_epoch = partition_leader_epoch
        self._base_offset = base_offset
        self._write_limit = write_limit
        self._buf = bytearray(HEADER_SIZE)  # header placeholder, then the records
        self._count = 0
        self._first_ts = 0
        self._max_ts = 0
        self._built: bytes | None = None

    @property
    def record_count(self) -> int:
        return self._count

    @property
    def write_limit(self) -> int | None:
        return self._write_limit

    def size_in_bytes(self) -> int:
        """Exact bytes of the batch if built now without compression (header included);
        once built, the size of the built batch."""
        if self._built is not None:
            return len(self._built)
        return len(self._buf)

    estimated_size = size_in_bytes

    def is_full(self) -> bool:
        """Built, or holding records and at or past the write limit (Kafka's isFull)."""
        if self._built is not None:
            return True
        limit = self._write_limit
        return limit is not None and self._count > 0 and len(self._buf) >= limit

    def has_room_for(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] = (),
        timestamp_ms: int | None = None,
    ) -> bool:
        """Whether a record fits under the write limit (Kafka's MemoryRecordsBuilder.hasRoomFor).

        Exact: the record's encoded size as ``append`` would write it (its timestamp
        delta counts, ``timestamp_ms`` defaults to now). The first record always fits;
        nothing fits a built batch; without a write limit everything fits.
        """
        if self._built is not None:
            return False
        count = self._count
        limit = self._write_limit
        if not count or limit is None:
            return True
        if timestamp_ms is None:
            timestamp_ms = _now_ms()
        size: int = self._codec.record_size(count, timestamp_ms - self._first_ts, key, value, headers)
        return len(self._buf) + size <= limit

    def try_append(
        self,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] = (),
    ) -> int | None:
        """``append`` if the record fits (see has_room_for); its offset delta, or None if not."""
        if self._built is not None:
            raise IllegalStateError("cannot append to a batch that has been built")
        delta = self._count
        if delta:
            first_ts = self._first_ts
            limit = self._write_limit
            if not self._append_record(
                self._buf, delta, timestamp_ms - first_ts, key, value, headers, -1 if limit is None else limit
            ):
                return None
            if timestamp_ms > self._max_ts:
                self._max_ts = timestamp_ms
        else:
            self._append_record(self._buf, 0, 0, key, value, headers, -1)
            self._first_ts = self._max_ts = timestamp_ms
        self._count = delta + 1
        return delta

    def append(
        self,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[Header] = (),
    ) -> int:
        """Add a record; returns its offset delta in the batch."""
        if self._built is not None:
            raise IllegalStateError("cannot append to a batch that has been built")
        delta = self._count
        if delta:
            self._append_record(self._buf, delta, timestamp_ms - self._first_ts, key, value, headers, -1)
            if timestamp_ms > self._max_ts:
                self._max_ts = timestamp_ms
        else:
            self._append_record(self._buf, 0, 0, key, value, headers, -1)
            self._first_ts = self._max_ts = timestamp_ms
        self._count = delta + 1
        return delta

    def _extend(
        self,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[Sequence[Header]] | None,
        timestamps: Sequence[int] | None,
        base_timestamp: int,
    ) -> None:
        """Append len(values) records at once (lengths already checked)."""
        if self._built is not None:
            raise IllegalStateError("cannot append to a batch that has been built")
        self._first_ts, self._max_ts = self._codec.encode_records(
            self._buf, self._count, self._first_ts, self._max_ts, values, keys, headers, timestamps, base_timestamp
        )
        self._count += len(values)

    def build(self) -> bytes:
        """The finished batch (compressed if asked, CRC set)."""
        if self._built is not None:
            return self._built
        count = self._count
        if not count:
            raise IllegalStateError("cannot build an empty record batch")
        codec = self._compression
        attributes = codec | (TRANSACTIONAL_FLAG_MASK if self._is_transactional else 0)
        buf = self._buf
        if codec:
            with memoryview(buf) as view:
                payload = compress(codec, view[HEADER_SIZE:])
            out = bytearray(HEADER_SIZE)
            out += payload
        else:
            out = buf
        HEADER.pack_into(
            out, 0,
            self._base_offset, len(out) - LOG_OVERHEAD, self._partition_leader_epoch, MAGIC,
            0, attributes, count - 1, self._first_ts, self._max_ts,
            self._producer_id, self._producer_epoch, self._base_sequence, count,
        )  # fmt: skip
        with memoryview(out) as view:
            crc = crc32c(view[ATTRIBUTES_OFFSET:])
        _U32.pack_into(out, CRC_OFFSET, crc)
        built = bytes(out)
        self._built = built
        self._buf = bytearray()
        return built

    @classmethod
    def encode(
        cls,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Sequence[Header]] | None = None,
        timestamps: Sequence[int] | None = None,
        *,
        base_timestamp: int | None = None,
        compression: Compression = Compression.NONE,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        is_transactional: bool = False,
        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
        base_offset: int = 0,
    ) -> bytes:
        """One whole batch from parallel sequences, in one call (the producer's ``send_batch``;
        :func:`encode_batch` is this method of BatchBuilder).

        Record ``i`` has value ``values[i]``, key ``keys[i]`` (all null without keys),
        headers ``headers[i]`` (none without headers) and timestamp ``timestamps[i]``
        (``base_timestamp`` for every record without timestamps; that defaults to now).
        The bytes equal those of a BatchBuilder fed the same records. Raises
        IllegalStateError for no values, ValueError for sequences of different lengths.
        """
        n = check_lengths(values, keys, headers, timestamps)
        builder = cls(
            compression,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            is_transactional=is_transactional,
            partition_leader_epoch=partition_leader_epoch,
            base_offset=base_offset,
        )
        if not n:
            raise IllegalStateError("cannot build an empty record batch")
        builder._extend(values, keys, headers, timestamps, _now_ms() if base_timestamp is None else base_timestamp)
        return builder.build()


def check_lengths(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
    headers: Sequence[Sequence[Header]] | None,
    timestamps: Sequence[int] | None,
) -> int:
    n = len(values)
    for name, seq in (("keys", keys), ("headers", headers), ("timestamps", timestamps)):
        if seq is not None and len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries for {n} values")
    return n


encode_batch = BatchBuilder.encode


def build_control_batch(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    *,
    base_offset: int = 0,
    timestamp_ms: int | None = None,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A transaction marker: the control batch a WriteTxnMarkers writes to end a producer's
    transaction on a partition (Kafka's ``MemoryRecords.withEndTransactionMarker``).

    One RecordBatch v2, uncompressed, attributes CONTROL | TRANSACTIONAL, baseSequence
    NO_SEQUENCE, holding one record at offset delta 0 and ``timestamp_ms`` (now when None)
    whose key is the ControlRecordType (int16 version 0, int16 type: 0 ABORT, 1 COMMIT) and
    whose value is the EndTransactionMarker (int16 version 0, int32 coordinator epoch).
    ``base_offset`` and ``partition_leader_epoch`` are outside the CRC; the leader stamps
    them as for any batch. Raises InvalidConfigError for no producer id or a field out of range.
    """
    if producer_id < 0:
        raise InvalidConfigError(f"a transaction marker needs a producer id, not {producer_id}")
    try:
        key = _CONTROL_KEY.pack(CONTROL_KEY_VERSION, CONTROL_TYPE_COMMIT if commit else CONTROL_TYPE_ABORT)
        value = _END_TXN_MARKER.pack(END_TXN_MARKER_VERSION, coordinator_epoch)
    except struct.error as exc:
        raise InvalidConfigError(f"transaction marker field out of range: {exc}") from None
    builder = BatchBuilder(
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        is_transactional=True,
        partition_leader_epoch=partition_leader_epoch,
        base_offset=base_offset,
    )
    builder.append(_now_ms() if timestamp_ms is None else timestamp_ms, key, value)
    out = bytearray(builder.build())
    attributes = _I16.unpack_from(out, ATTRIBUTES_OFFSET)[0] | CONTROL_FLAG_MASK
    _I16.pack_into(out, ATTRIBUTES_OFFSET, attributes)
    with memoryview(out) as view:
        crc = crc32c(view[ATTRIBUTES_OFFSET:])
    _U32.pack_into(out, CRC_OFFSET, crc)
    return bytes(out)
