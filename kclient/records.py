"""Kafka RecordBatch v2 (magic 2) codec, byte-exact with Apache Kafka 0.11+.

Shared by the client (which encodes and decodes records) and the broker (which
only reads batch headers, checks CRCs and stamps offsets: it never decodes records).

Batch layout (big-endian, 61-byte header, ``DefaultRecordBatch.RECORD_BATCH_OVERHEAD``)::

    offset  size  field
         0     8  baseOffset            int64   (stamped by the leader)
         8     4  batchLength           int32   bytes after this field (size - 12)
        12     4  partitionLeaderEpoch  int32   (stamped by the leader)
        16     1  magic                 int8    = 2
        17     4  crc                   uint32  CRC-32C of bytes 21..end
        21     2  attributes            int16   bits 0-2 codec, 3 timestampType,
                                                4 isTransactional, 5 isControlBatch
        23     4  lastOffsetDelta       int32
        27     8  firstTimestamp        int64
        35     8  maxTimestamp          int64
        43     8  producerId            int64
        51     2  producerEpoch         int16
        53     4  baseSequence          int32
        57     4  recordCount           int32
        61     -  records

The CRC (Castagnoli) covers ``attributes`` to the end of the batch, so the leader can
overwrite ``baseOffset`` and ``partitionLeaderEpoch`` without recomputing it.
``baseOffset + batchLength`` (12 bytes) is the log overhead that precedes every batch.

Record layout (varint = protobuf zigzag varint; varlong the same, 64-bit)::

    length varint | attributes int8 (unused, 0) | timestampDelta varlong |
    offsetDelta varint | keyLen varint | key | valueLen varint | value |
    headerCount varint | headers: [keyLen varint | key utf-8 | valLen varint | val]

A length of -1 means null (key, value, header value). With a compression codec,
everything after ``recordCount`` (all the records) is compressed as one blob: gzip
(RFC 1952 framing, as Java's GZIPOutputStream), lz4 (LZ4 frame, independent 64 KiB
blocks, as KafkaLZ4BlockOutputStream), zstd (one zstd frame), snappy (xerial
framing; only when ``cramjam`` or ``python-snappy`` is importable).

Record offsets are ``baseOffset + offsetDelta``; timestamps are
``firstTimestamp + timestampDelta``, or ``maxTimestamp`` for every record when the
batch's timestamp type is LOG_APPEND_TIME.

Encoding (:class:`BatchBuilder`, :func:`encode_batch`) and decoding (:func:`decode_batch`,
:func:`decode_consumer_records`, :func:`decode_columns`, :func:`decode_buffers`) are the hot path of the whole
system. Their loops run in the compiled twin ``kclient._crecords`` (kclient/_crecords.c,
built by ``pip install``); the pure-Python code here is the fallback, used when the
module is missing or ``KBROKER_NO_EXTENSIONS=1``, and produces the same bytes and
records (tests/unit/test_records_twins.py). :data:`IMPLEMENTATION` says which one runs.
"""

from __future__ import annotations

import gc
import importlib
import os
import struct
import sys
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from enum import IntEnum
from functools import partial
from itertools import accumulate, pairwise
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, TypeVar

import lz4.frame as _lz4f
import zstandard as _zstd
from crc32c import crc32c as _crc32c

from kclient.errors import (
    CorruptRecordError,
    IllegalStateError,
    InvalidConfigError,
    UnsupportedCodecError,
)
from kclient.structs import ConsumerRecord

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "BatchBuilder",
    "BatchHeader",
    "ColumnBuffers",
    "Compression",
    "Record",
    "RecordColumns",
    "TimestampType",
    "arrow_schema",
    "check_batch",
    "decode_batch",
    "decode_batches",
    "decode_buffers",
    "decode_columns",
    "decode_consumer_records",
    "encode_batch",
    "iter_headers",
    "read_header",
    "record_size_in_bytes",
    "stamp_batch",
    "walk_records",
]

Buffer = bytes | bytearray | memoryview
_T = TypeVar("_T")
Header = tuple[str, bytes | None]

HEADER_SIZE = 61
"""Bytes of the batch header, records start here."""
LOG_OVERHEAD = 12
"""baseOffset + batchLength: the bytes not counted by batchLength."""
MAGIC = 2
NO_PRODUCER_ID = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")

_LENGTH_POS = 8
_EPOCH_POS = 12
_CRC_POS = 17
_ATTRIBUTES_POS = 21
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49: a batch with no records

_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_MASK = 0x08
_TRANSACTIONAL_MASK = 0x10
_CONTROL_MASK = 0x20
_MAX_INT32 = 0x7FFFFFFF


class Compression(IntEnum):
    """Compression codec id, as stored in attribute bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: str) -> Compression:
        """The codec for a ``compression.type`` value: none, gzip, snappy, lz4, zstd."""
        if isinstance(name, str) and name.islower() and name.upper() in cls.__members__:
            return cls[name.upper()]
        raise InvalidConfigError(f"unknown compression type {name!r}: expected one of none, gzip, snappy, lz4, zstd")


class TimestampType(IntEnum):
    """Attribute bit 3: who set the record timestamps."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


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
        codec = self.attributes & _CODEC_MASK
        try:
            return Compression(codec)
        except ValueError:
            raise CorruptRecordError(f"unknown compression codec id {codec}") from None

    @property
    def timestamp_type(self) -> TimestampType:
        if self.attributes & _TIMESTAMP_TYPE_MASK:
            return TimestampType.LOG_APPEND_TIME
        return TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_MASK)

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


class Record(NamedTuple):
    """One decoded record with its absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]


class RecordColumns(NamedTuple):
    """Decoded records as parallel lists (one entry per record), for columnar consumers."""

    offsets: list[int]
    timestamps: list[int]
    timestamp_types: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[Header]]


# ColumnBuffers._parts: the buffers in this order (kclient/_crecords.c has the same enum)
_OFFSETS, _TIMESTAMPS, _TYPES = 0, 1, 2
_KEY_VALID, _KEY_OFFS, _KEY_DATA = 3, 4, 5
_VALUE_VALID, _VALUE_OFFS, _VALUE_DATA = 6, 7, 8
_HEADERS = 9
_INT32_ONE = array("i", [1]).tobytes()


class ColumnBuffers:
    """Decoded records in Arrow's memory layout: one buffer per column, no object per record.

    The buffers (native byte order, which is little-endian wherever Arrow runs):

    - offsets, timestamps: int64 per record (timestamps in ms; a LOG_APPEND_TIME batch's
      records all carry the broker's time);
    - timestamp_types: int32 per record (0 CreateTime, 1 LogAppendTime);
    - keys and values, each an Arrow binary column: a validity bitmap (bit i, least
      significant first, set when record i is not null; bits past the last record are 0;
      ``None`` while no record is null), int32 offsets (records + 1 of them, the first 0)
      and one data buffer;
    - headers: ``None`` while no record has any, else one ``list[Header]`` per record.

    Like an Arrow array, a ColumnBuffers is a view: records ``[start, start + len)`` of
    its buffers. Slicing (``cb[i:j]``) shares the buffers; :meth:`concat` copies. Buffers
    only grow while :func:`decode_buffers` appends to a fresh one; after that nothing
    changes them, so views, memoryviews and Arrow arrays of them stay valid (and
    appending to buffers something still views raises BufferError). Immutable once
    decoded; share freely between threads.
    """

    __slots__ = ("_length", "_parts", "_start")

    def __init__(self) -> None:
        self._parts: list[Any] = [
            bytearray(), bytearray(), bytearray(),
            None, bytearray(4), bytearray(),
            None, bytearray(4), bytearray(),
            None,
        ]  # fmt: skip
        self._start = 0
        self._length = 0

    @classmethod
    def _view(cls, parts: list[Any], start: int, length: int) -> ColumnBuffers:
        view = cls.__new__(cls)
        view._parts, view._start, view._length = parts, start, length
        return view

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: slice) -> ColumnBuffers:
        if not isinstance(index, slice):
            raise TypeError("ColumnBuffers takes slices only (to_columns() gives the records as lists)")
        i, j, step = index.indices(self._length)
        if step != 1:
            raise ValueError("ColumnBuffers slices take no step")
        return self._view(self._parts, self._start + i, max(j - i, 0))

    def __repr__(self) -> str:
        first = f", offsets {self.offsets[0]}..{self.offsets[-1]}" if self._length else ""
        return f"ColumnBuffers({self._length} records{first})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ColumnBuffers):
            return NotImplemented
        return self.buffers() == other.buffers()

    __hash__ = None  # type: ignore[assignment]

    def _fixed(self, part: int, fmt: Literal["q", "i"]) -> memoryview:
        return memoryview(self._parts[part]).cast(fmt)[self._start : self._start + self._length]

    @property
    def offsets(self) -> memoryview:
        """The records' offsets (a memoryview of int64: index it, ``bisect`` it, ``tolist()``)."""
        return self._fixed(_OFFSETS, "q")

    @property
    def timestamps(self) -> memoryview:
        return self._fixed(_TIMESTAMPS, "q")

    @property
    def timestamp_types(self) -> memoryview:
        return self._fixed(_TYPES, "i")

    @property
    def headers(self) -> list[list[Header]] | None:
        """Each record's headers, or ``None`` when no record has any."""
        h = self._parts[_HEADERS]
        return None if h is None else h[self._start : self._start + self._length]

    def _data_size(self, slot: int) -> int:
        offs = memoryview(self._parts[slot + 1]).cast("i")
        return int(offs[self._start + self._length] - offs[self._start])

    @property
    def key_bytes(self) -> int:
        """Bytes of all keys (from the offsets: no record is visited)."""
        return self._data_size(_KEY_VALID)

    @property
    def value_bytes(self) -> int:
        """Bytes of all values (from the offsets: no record is visited)."""
        return self._data_size(_VALUE_VALID)

    def _binary(self, slot: int) -> tuple[bytes | None, bytes, memoryview]:
        """(validity, int32 offsets, data) of this view's keys or values, rebased to start at 0."""
        parts, start, n = self._parts, self._start, self._length
        offs = memoryview(parts[slot + 1]).cast("i")[start : start + n + 1]
        first = offs[0]
        validity = parts[slot]
        valid = None if validity is None else _bits(validity, start, n)
        return valid, _shift_offsets(offs, -first), memoryview(parts[slot + 2])[first : offs[n]]

    def buffers(self) -> tuple[Any, ...]:
        """The view's buffers as bytes, as if it were decoded alone: (offsets, timestamps,
        timestamp_types, key validity, key offsets, key data, value validity, value offsets,
        value data, headers). Copies; for tests and comparisons."""
        kv, ko, kd = self._binary(_KEY_VALID)
        vv, vo, vd = self._binary(_VALUE_VALID)
        return (
            self.offsets.tobytes(),
            self.timestamps.tobytes(),
            self.timestamp_types.tobytes(),
            kv, ko, kd.tobytes(),
            vv, vo, vd.tobytes(),
            self.headers,
        )  # fmt: skip

    def to_columns(self) -> RecordColumns:
        """The records as lists (``RecordColumns``, what ``decode_columns`` gives)."""
        return RecordColumns(*_CODEC.columns_of(self._parts, self._start, self._length))

    def to_arrow(
        self, topic: str, partition: int, headers: bool = False, schema: pa.Schema | None = None
    ) -> pa.RecordBatch:
        """The records as one ``pyarrow.RecordBatch`` with Spark's Kafka source schema
        (``arrow_schema(headers)``, or ``schema`` when given: a timestamp unit other than
        ms is cast). Keys, values, offsets, timestamps and their types are the buffers
        themselves (zero copy); topic and partition are filled. Needs pyarrow."""
        pa = _pyarrow()
        if schema is None:
            schema = arrow_schema(headers)
        p, s, n = self._parts, self._start, self._length
        buf = pa.py_buffer

        def binary(slot: int) -> Any:
            validity = p[slot]
            return pa.Array.from_buffers(
                pa.binary(),
                n,
                [None if validity is None else buf(validity), buf(p[slot + 1]), buf(p[slot + 2])],
                null_count=0 if validity is None else -1,
                offset=s,
            )

        stamp_type = schema.field("timestamp").type
        stamps = pa.Array.from_buffers(pa.timestamp("ms", tz=stamp_type.tz), n, [None, buf(p[_TIMESTAMPS])], 0, s)
        arrays = [
            binary(_KEY_VALID),
            binary(_VALUE_VALID),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.Array.from_buffers(pa.int64(), n, [None, buf(p[_OFFSETS])], 0, s),
            stamps if stamps.type == stamp_type else stamps.cast(stamp_type),
            pa.Array.from_buffers(pa.int32(), n, [None, buf(p[_TYPES])], 0, s),
        ]
        if "headers" in schema.names:
            header_type = schema.field("headers").type
            h = p[_HEADERS]
            if h is None:
                no_headers = pa.array([], header_type.value_type)
                zeros = pa.repeat(pa.scalar(0, pa.int32()), n + 1)
                arrays.append(pa.ListArray.from_arrays(zeros, no_headers, type=header_type))
            else:
                arrays.append(pa.array(h[s : s + n], header_type))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    @classmethod
    def concat(cls, parts: Sequence[ColumnBuffers]) -> ColumnBuffers:
        """One ColumnBuffers holding ``parts``' records in order (a copy; ``parts[0]``
        itself when there is only one)."""
        if len(parts) == 1:
            return parts[0]
        out = cls()
        p = out._parts
        for part, width in ((_OFFSETS, 8), (_TIMESTAMPS, 8), (_TYPES, 4)):
            p[part] = bytearray().join(
                memoryview(c._parts[part])[c._start * width : (c._start + c._length) * width] for c in parts
            )
        for slot in (_KEY_VALID, _VALUE_VALID):
            pieces = [c._binary(slot) for c in parts]
            base = 0
            offsets = [_INT32_ZERO]
            bits = 0
            at = 0
            for c, (valid, offs, data) in zip(parts, pieces, strict=True):
                offsets.append(_shift_offsets(memoryview(offs).cast("i")[1:], base))
                base += len(data)
                n = c._length
                bits |= (int.from_bytes(valid, "little") if valid is not None else (1 << n) - 1) << at
                at += n
            if base > _INT32_MAX:
                raise OverflowError("a ColumnBuffers binary column holds at most 2 GiB")
            if any(valid is not None for valid, _, _ in pieces):
                p[slot] = bytearray(bits.to_bytes((at + 7) // 8, "little"))
            p[slot + 1] = bytearray().join(offsets)
            p[slot + 2] = bytearray().join(data for _, _, data in pieces)
        if any(c._parts[_HEADERS] is not None for c in parts):
            headers: list[list[Header]] = []
            for c in parts:
                h = c.headers
                headers.extend([[] for _ in range(c._length)] if h is None else h)
            p[_HEADERS] = headers
        out._length = len(p[_OFFSETS]) >> 3
        return out


_INT32_ZERO = bytes(4)
_INT32_MAX = 2**31 - 1


def _shift_offsets(offsets: memoryview, delta: int) -> bytes:
    """int32 ``offsets`` (a memoryview of format "i"), each plus ``delta``, as bytes.

    No per-element loop: the array read as one big integer in base 2**32 (native order)
    gets ``delta * (1 + 2**32 + 2**64 + ...)`` added; as every result lies in [0, 2**31),
    no lane carries into the next."""
    raw = offsets.tobytes()
    if not delta or not raw:
        return raw
    order = sys.byteorder
    ones = int.from_bytes(_INT32_ONE * (len(raw) // 4), order)
    return (int.from_bytes(raw, order) + delta * ones).to_bytes(len(raw), order)


def _bits(bitmap: Buffer, start: int, n: int) -> bytes:
    """Bits ``[start, start + n)`` of an Arrow bitmap, as a bitmap of (n + 7) // 8 bytes."""
    value = (int.from_bytes(bitmap, "little") >> start) & ((1 << n) - 1)
    return value.to_bytes((n + 7) // 8, "little")


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError as exc:
        raise ImportError(
            "Arrow output (ColumnBuffers.to_arrow, Consumer.poll_arrow) needs pyarrow (pip install pyarrow); "
            "Consumer.poll_columns gives the same data as lists"
        ) from exc
    return pyarrow


def arrow_schema(headers: bool = False) -> pa.Schema:
    """Spark's Kafka source schema in Arrow: key and value binary, topic string, partition
    int32, offset int64, timestamp timestamp[ms, UTC], timestampType int32, and with
    ``headers`` a list of (key string, value binary) structs."""
    pa = _pyarrow()
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if headers:
        header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields.append(pa.field("headers", pa.list_(header)))
    return pa.schema(fields)


# ---------------------------------------------------------------------------
# Batch headers: the broker's side (no record decoding)
# ---------------------------------------------------------------------------

_unpack_header = _HEADER.unpack_from
_tuple_new: Any = tuple.__new__


def read_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """The header of the batch at ``pos`` (no CRC check).

    Raises CorruptRecordError if fewer than HEADER_SIZE bytes are left.
    """
    if len(buf) - pos < HEADER_SIZE or pos < 0:
        raise CorruptRecordError(
            f"incomplete batch header at position {pos}: {HEADER_SIZE} bytes needed, {max(len(buf) - pos, 0)} available"
        )
    header: BatchHeader = _tuple_new(BatchHeader, _unpack_header(buf, pos))
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
    new = _tuple_new
    header_type = BatchHeader
    while n - pos >= HEADER_SIZE:
        fields = unpack(buf, pos)
        length = fields[1]
        if length < _MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"batch at position {pos} has batchLength {length}, less than the minimum {_MIN_BATCH_LENGTH}"
            )
        end = pos + length + LOG_OVERHEAD
        if end > n:
            return
        yield pos, new(header_type, fields)
        pos = end


def _check_shape(buf: Buffer, pos: int, header: BatchHeader) -> None:
    if header.magic != MAGIC:
        raise CorruptRecordError(f"batch at position {pos} has magic {header.magic}, only magic {MAGIC} is supported")
    length = header.batch_length
    if length < _MIN_BATCH_LENGTH:
        raise CorruptRecordError(
            f"batch at position {pos} has batchLength {length}, less than the minimum {_MIN_BATCH_LENGTH}"
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
    _check_shape(buf, pos, header)
    if header.record_count < 0:
        raise CorruptRecordError(f"batch at position {pos} has a negative record count {header.record_count}")
    codec = header.attributes & _CODEC_MASK
    if codec > Compression.ZSTD:
        raise CorruptRecordError(f"batch at position {pos} has unknown compression codec {codec}")
    with memoryview(buf) as view:
        crc = _crc32c(view[pos + _ATTRIBUTES_POS : pos + header.batch_length + LOG_OVERHEAD])
    if crc != header.crc:
        raise CorruptRecordError(
            f"batch at position {pos} (base offset {header.base_offset}) fails its CRC check: "
            f"stored 0x{header.crc:08x}, computed 0x{crc:08x}"
        )


def stamp_batch(buf: bytearray, pos: int, base_offset: int, partition_leader_epoch: int) -> None:
    """Overwrite baseOffset and partitionLeaderEpoch in place (outside the CRC)."""
    _I64.pack_into(buf, pos, base_offset)
    _I32.pack_into(buf, pos + _EPOCH_POS, partition_leader_epoch)


# ---------------------------------------------------------------------------
# Varints
# ---------------------------------------------------------------------------

_VARINT_TABLE_SIZE = 1 << 14  # every zigzag value encoded in one or two bytes


def _build_varint_table() -> tuple[bytes, ...]:
    table = []
    for z in range(_VARINT_TABLE_SIZE):
        if z < 0x80:
            table.append(bytes((z,)))
        else:
            table.append(bytes((0x80 | (z & 0x7F), z >> 7)))
    return tuple(table)


_VARINTS: tuple[bytes, ...] = _build_varint_table()
"""_VARINTS[zigzag(v)] is the encoding of v, for zigzag(v) < 16384."""


def _encode_zigzag(z: int) -> bytes:
    """Encoding of an already zigzagged (non-negative) value."""
    out = bytearray()
    while z > 0x7F:
        out.append(0x80 | (z & 0x7F))
        z >>= 7
    out.append(z)
    return bytes(out)


def _encode_varint(value: int) -> bytes:
    z = (value << 1) ^ (value >> 63)
    return _VARINTS[z] if z < _VARINT_TABLE_SIZE else _encode_zigzag(z)


def _read_zigzag(data: Buffer, p: int) -> tuple[int, int]:
    """(raw zigzag value, next position) of the varint at ``p`` (any length)."""
    z = 0
    shift = 0
    while True:
        b = data[p]
        p += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return z, p
        shift += 7
        if shift > 63:
            raise CorruptRecordError(f"varint longer than 10 bytes at position {p}")


def read_varint(data: Buffer, p: int) -> tuple[int, int]:
    """(signed value, next position) of the zigzag varint at ``p``."""
    z, p = _read_zigzag(data, p)
    return (z >> 1) ^ -(z & 1), p


# ---------------------------------------------------------------------------
# Codecs
# ---------------------------------------------------------------------------

_snappy_compress_raw: Callable[[bytes], bytes] | None = None
_snappy_decompress_raw: Callable[[bytes], bytes] | None = None
try:  # pragma: no cover - not installed in our environment
    import cramjam as _cramjam

    def _cramjam_compress(data: bytes) -> bytes:
        return bytes(_cramjam.snappy.compress_raw(data))

    def _cramjam_decompress(data: bytes) -> bytes:
        return bytes(_cramjam.snappy.decompress_raw(data))

    _snappy_compress_raw = _cramjam_compress
    _snappy_decompress_raw = _cramjam_decompress
except ImportError:
    try:  # pragma: no cover
        import snappy as _snappy

        _snappy_compress_raw = _snappy.compress
        _snappy_decompress_raw = _snappy.uncompress
    except ImportError:
        pass

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024

_tls = threading.local()  # zstd contexts are not safe to share between threads


def _zstd_compressor() -> _zstd.ZstdCompressor:
    try:
        cctx: _zstd.ZstdCompressor = _tls.zstd_c
    except AttributeError:
        cctx = _tls.zstd_c = _zstd.ZstdCompressor(level=3)
    return cctx


def _zstd_decompressor() -> _zstd.ZstdDecompressor:
    try:
        dctx: _zstd.ZstdDecompressor = _tls.zstd_d
    except AttributeError:
        dctx = _tls.zstd_d = _zstd.ZstdDecompressor()
    return dctx


def _snappy_available(action: str) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    if _snappy_compress_raw is None or _snappy_decompress_raw is None:
        raise UnsupportedCodecError(f"cannot {action} snappy: install 'cramjam' or 'python-snappy' for snappy support")
    return _snappy_compress_raw, _snappy_decompress_raw


def _snappy_encode(data: memoryview) -> bytes:
    """xerial framing, as snappy-java's SnappyOutputStream used by Kafka writes it."""
    compress, _ = _snappy_available("encode")
    parts = [_XERIAL_HEADER]
    for start in range(0, len(data), _XERIAL_BLOCK):
        block = compress(bytes(data[start : start + _XERIAL_BLOCK]))
        parts.append(_I32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decode(data: memoryview) -> bytes:
    _, decompress = _snappy_available("decode")
    raw = bytes(data)
    if not raw.startswith(_XERIAL_MAGIC) or len(raw) < len(_XERIAL_HEADER):
        return decompress(raw)  # a plain snappy block
    out = bytearray()
    p = len(_XERIAL_HEADER)
    n = len(raw)
    while p < n:
        if n - p < 4:
            raise CorruptRecordError("truncated xerial snappy block length")
        (block_len,) = _I32.unpack_from(raw, p)
        p += 4
        if block_len < 0 or p + block_len > n:
            raise CorruptRecordError("truncated xerial snappy block")
        out += decompress(raw[p : p + block_len])
        p += block_len
    return bytes(out)


def _gzip_decode(data: memoryview) -> bytes:
    d = zlib.decompressobj(31)
    out = d.decompress(data)
    while d.unused_data:  # concatenated gzip members, as GZIPInputStream reads them
        rest = d.unused_data
        d = zlib.decompressobj(31)
        out += d.decompress(rest)
    if not d.eof:
        raise CorruptRecordError("truncated gzip data in record batch")
    return out


def _compress(codec: int, data: memoryview) -> bytes:
    if codec == Compression.LZ4:
        # KafkaLZ4BlockOutputStream: LZ4 frame, independent 64 KiB blocks, no
        # content size, no checksums.
        out: bytes = _lz4f.compress(
            data,
            block_size=_lz4f.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=False,
            block_checksum=False,
            store_size=False,
        )
        return out
    if codec == Compression.ZSTD:
        return _zstd_compressor().compress(data)
    if codec == Compression.GZIP:
        # Java's GZIPOutputStream: gzip framing, Deflater default level (6).
        return zlib.compress(data, 6, wbits=31)
    if codec == Compression.SNAPPY:
        return _snappy_encode(data)
    raise UnsupportedCodecError(f"unknown compression codec id {codec}")


def _decompress(codec: int, data: memoryview) -> bytes:
    try:
        if codec == Compression.LZ4:
            out: bytes = _lz4f.decompress(data)
            return out
        if codec == Compression.ZSTD:
            return _zstd_decompressor().decompressobj(read_across_frames=True).decompress(data)
        if codec == Compression.GZIP:
            return _gzip_decode(data)
        if codec == Compression.SNAPPY:
            return _snappy_decode(data)
    except (CorruptRecordError, UnsupportedCodecError):
        raise
    except Exception as exc:  # each codec library has its own (zlib.error, cramjam.DecompressionError, ...)
        name = Compression(codec).name.lower()
        raise CorruptRecordError(f"cannot decompress {name} record batch: {exc}") from exc
    raise CorruptRecordError(f"unknown compression codec id {codec}")


# ---------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------


def _py_decode_records(
    data: bytes, p: int, end: int, count: int, base_offset: int, first_ts: int, log_append_ts: int | None
) -> list[Record]:
    """The ``count`` records in ``data[p:end]`` of a checked batch (LOG_APPEND_TIME when ``log_append_ts``)."""
    offsets: list[int] = []
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[list[Header]] = []
    _py_records_into(
        data, p, end, count, base_offset, first_ts, log_append_ts, -1, offsets, timestamps, keys, values, headers
    )
    new = _tuple_new
    return [new(Record, r) for r in zip(offsets, timestamps, keys, values, headers, strict=True)]


def _decode_headers(data: bytes, p: int) -> tuple[list[Header], int]:
    z, p = _read_zigzag(data, p)
    count = (z >> 1) ^ -(z & 1)
    if count < 0:
        raise CorruptRecordError(f"invalid record header count {count}")
    headers: list[Header] = []
    for _ in range(count):
        z, p = _read_zigzag(data, p)
        if z & 1:
            raise CorruptRecordError("record header key cannot be null")
        z >>= 1
        key = data[p : p + z].decode("utf-8")
        p += z
        z, p = _read_zigzag(data, p)
        if z & 1:
            value = None
        else:
            z >>= 1
            value = data[p : p + z]
            p += z
        headers.append((key, value))
    return headers, p


def _batch_body(buf: Buffer, pos: int, header: BatchHeader) -> tuple[bytes, int, int]:
    """(data, start, end): the records of a checked batch, decompressed if need be."""
    size = header.batch_length + LOG_OVERHEAD
    codec = header.attributes & _CODEC_MASK
    if codec:
        with memoryview(buf) as view:
            data = _decompress(codec, view[pos + HEADER_SIZE : pos + size])
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
    data, p, end = _batch_body(buf, pos, header)
    log_append_ts = header.max_timestamp if header.attributes & _TIMESTAMP_TYPE_MASK else None
    _py_records_into(
        data, p, end, header.record_count, header.base_offset, header.first_timestamp, log_append_ts,
        start_offset, offsets, timestamps, keys, values, headers_out,
    )  # fmt: skip


def _py_records_into(
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
    slow = _read_zigzag
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


def _py_decode_consumer_records(
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
    new = _tuple_new
    record_type = ConsumerRecord
    for header, offsets, timestamps, keys, values, headers in _data_batches(buf, start_offset):
        if key_deserializer is not None:
            keys = [k if k is None else key_deserializer(k) for k in keys]
        if value_deserializer is not None:
            values = [v if v is None else value_deserializer(v) for v in values]
        ts_type = 1 if header.attributes & _TIMESTAMP_TYPE_MASK else 0
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
        if header.attributes & _CONTROL_MASK or header.base_offset + header.last_offset_delta < start_offset:
            continue
        offsets: list[int] = []
        timestamps: list[int] = []
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        headers: list[list[Header]] = []
        _decode_columns_into(buf, pos, header, start_offset, offsets, timestamps, keys, values, headers)
        yield header, offsets, timestamps, keys, values, headers


def _py_decode_columns(buf: Buffer, start_offset: int = 0, out: RecordColumns | None = None) -> RecordColumns:
    cols = RecordColumns([], [], [], [], [], []) if out is None else out
    offsets, timestamps, types, keys, values, headers = cols
    for pos, header in iter_headers(buf):
        check_batch(buf, pos, header)
        if header.attributes & _CONTROL_MASK or header.base_offset + header.last_offset_delta < start_offset:
            continue
        before = len(offsets)
        _decode_columns_into(buf, pos, header, start_offset, offsets, timestamps, keys, values, headers)
        types.extend([1 if header.attributes & _TIMESTAMP_TYPE_MASK else 0] * (len(offsets) - before))
    return cols


def _py_decode_buffers(buf: Buffer, start_offset: int, parts: list[Any]) -> None:
    _check_parts(parts)
    for header, offsets, timestamps, keys, values, headers in _data_batches(buf, start_offset):
        n = len(parts[_OFFSETS]) >> 3
        before = [len(part) if type(part) is bytearray else part for part in parts[:_HEADERS]]
        try:  # all or nothing: a buffer something views cannot grow (BufferError)
            parts[_OFFSETS] += array("q", offsets)
            parts[_TIMESTAMPS] += array("q", timestamps)
            parts[_TYPES] += array("i", [1 if header.attributes & _TIMESTAMP_TYPE_MASK else 0]) * len(offsets)
            _append_binary(parts, _KEY_VALID, keys, n)
            _append_binary(parts, _VALUE_VALID, values, n)
        except BaseException:
            for i, was in enumerate(before):
                if type(was) is int:
                    del parts[i][was:]
                else:
                    parts[i] = was
            raise
        if parts[_HEADERS] is not None or any(headers):
            if parts[_HEADERS] is None:
                parts[_HEADERS] = [[] for _ in range(n)]
            parts[_HEADERS].extend(headers)


def _check_parts(parts: list[Any]) -> None:
    """A ColumnBuffers' parts list whose buffers agree (what decode_buffers appends to)."""
    if type(parts) is not list or len(parts) != 10:
        raise TypeError("parts must be a list of the 10 ColumnBuffers parts")
    for i, part in enumerate(parts[:_HEADERS]):
        if type(part) is not bytearray and not (part is None and i in (_KEY_VALID, _VALUE_VALID)):
            raise TypeError(f"ColumnBuffers part {i} must be a bytearray")
    if parts[_HEADERS] is not None and type(parts[_HEADERS]) is not list:
        raise TypeError("ColumnBuffers headers must be a list or None")
    n = len(parts[_OFFSETS]) // 8
    ok = len(parts[_OFFSETS]) == 8 * n and len(parts[_TIMESTAMPS]) == 8 * n and len(parts[_TYPES]) == 4 * n
    for slot in (_KEY_VALID, _VALUE_VALID):
        valid, offs, data = parts[slot : slot + 3]
        ok = ok and len(offs) == 4 * (n + 1) and (valid is None or len(valid) == (n + 7) // 8)
        ok = ok and memoryview(offs).cast("i")[n] == len(data)
    if not ok or (parts[_HEADERS] is not None and len(parts[_HEADERS]) != n):
        raise ValueError("the ColumnBuffers parts do not agree in length")


def _append_binary(parts: list[Any], slot: int, column: list[bytes | None], n: int) -> None:
    """Append ``column`` to the binary column at ``slot`` of ``parts`` (holding ``n`` records)."""
    data = parts[slot + 2]
    lengths = [0 if v is None else len(v) for v in column]
    ends = array("i")
    ends.extend(accumulate(lengths, initial=len(data)))
    if ends[-1] > _INT32_MAX:
        raise OverflowError("a ColumnBuffers binary column holds at most 2 GiB")
    del ends[0]
    valid = parts[slot]
    if valid is not None or None in column:
        old = (1 << n) - 1 if valid is None else int.from_bytes(valid, "little")
        new = int("".join(["0" if v is None else "1" for v in reversed(column)]) or "0", 2)
        parts[slot] = bytearray((old | new << n).to_bytes((n + len(column) + 7) // 8, "little"))
    parts[slot + 1] += ends
    data += b"".join([v for v in column if v])


def _py_columns_of(parts: list[Any], start: int, n: int) -> tuple[list[Any], ...]:
    """Records ``[start, start + n)`` of a ColumnBuffers' parts as RecordColumns' lists."""
    if start < 0 or n < 0 or 8 * (start + n) > len(parts[_OFFSETS]):
        raise ValueError("ColumnBuffers: records outside the buffers")
    headers = parts[_HEADERS]
    return (
        memoryview(parts[_OFFSETS]).cast("q")[start : start + n].tolist(),
        memoryview(parts[_TIMESTAMPS]).cast("q")[start : start + n].tolist(),
        memoryview(parts[_TYPES]).cast("i")[start : start + n].tolist(),
        _binary_list(parts[_KEY_VALID], parts[_KEY_OFFS], parts[_KEY_DATA], start, n),
        _binary_list(parts[_VALUE_VALID], parts[_VALUE_OFFS], parts[_VALUE_DATA], start, n),
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


_py_decode_records = _gc_paused(_py_decode_records)
_py_decode_consumer_records = _gc_paused(_py_decode_consumer_records)
_py_decode_columns = _gc_paused(_py_decode_columns)
_py_decode_buffers = _gc_paused(_py_decode_buffers)
_py_columns_of = _gc_paused(_py_columns_of)


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
    return _CODEC.decode_consumer_records(
        buf, topic, partition, start_offset, key_deserializer, value_deserializer, [] if out is None else out
    )


def decode_columns(buf: Buffer, start_offset: int = 0, out: RecordColumns | None = None) -> RecordColumns:
    """decode_consumer_records as columns: parallel lists, one entry per record.

    Same checks and skips; appends to ``out``'s lists when given (batch by batch, so
    a CorruptRecordError leaves the columns of the batches before it).
    """
    return _CODEC.decode_columns(buf, start_offset, out)


def decode_buffers(buf: Buffer, start_offset: int = 0, out: ColumnBuffers | None = None) -> ColumnBuffers:
    """decode_columns into Arrow-layout buffers (:class:`ColumnBuffers`): no object per record.

    Same checks and skips; appends to ``out`` when given (a whole ColumnBuffers, not a
    slice, that nothing views yet), batch by batch, so a CorruptRecordError leaves the
    records of the batches before it.
    """
    cols = ColumnBuffers() if out is None else out
    if cols._start or cols._length != len(cols._parts[_OFFSETS]) >> 3:
        raise ValueError("decode_buffers appends to a whole ColumnBuffers, not to a slice")
    try:
        _CODEC.decode_buffers(buf, start_offset, cols._parts)
    finally:
        cols._length = len(cols._parts[_OFFSETS]) >> 3
    return cols


def _records_of(codec: _Codec, buf: Buffer, pos: int, header: BatchHeader) -> list[Record]:
    """The records of the checked batch at ``pos``, decoded by ``codec``."""
    attributes = header.attributes
    if attributes & _CODEC_MASK or not codec.reads_buffers:
        data, start, end = _batch_body(buf, pos, header)
    else:
        data, start, end = buf, pos + HEADER_SIZE, pos + header.batch_length + LOG_OVERHEAD  # type: ignore[assignment]
    return codec.decode_records(
        data, start, end, header.record_count, header.base_offset, header.first_timestamp,
        header.max_timestamp if attributes & _TIMESTAMP_TYPE_MASK else None,
    )  # fmt: skip


def _decode_batch(
    codec: _Codec, buf: Buffer, pos: int = 0, *, check_crc: bool = True
) -> tuple[BatchHeader, list[Record]]:
    header = read_header(buf, pos)
    if check_crc:
        check_batch(buf, pos, header)
    else:
        _check_shape(buf, pos, header)
    return header, _records_of(codec, buf, pos, header)


def _decode_batches(
    codec: _Codec, buf: Buffer, *, check_crc: bool = True
) -> Iterator[tuple[BatchHeader, list[Record]]]:
    for pos, header in iter_headers(buf):
        if check_crc:
            check_batch(buf, pos, header)
        else:
            _check_shape(buf, pos, header)
        yield header, _records_of(codec, buf, pos, header)


def decode_batch(buf: Buffer, pos: int = 0, *, check_crc: bool = True) -> tuple[BatchHeader, list[Record]]:
    """Header and records (absolute offsets and timestamps) of the batch at ``pos``.

    With ``check_crc`` the batch goes through :func:`check_batch` first; without it
    only magic and bounds are checked. Compressed and control batches decode too.
    Raises CorruptRecordError (or UnsupportedCodecError for snappy without a library).
    """
    return _decode_batch(_CODEC, buf, pos, check_crc=check_crc)


def decode_batches(buf: Buffer, *, check_crc: bool = True) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """decode_batch over every complete batch of ``buf`` (an incomplete tail is ignored)."""
    return _decode_batches(_CODEC, buf, check_crc=check_crc)


def walk_records(data: Buffer, start: int, end: int, count: int) -> int:
    """Walk ``count`` records from ``start`` without decoding them (the broker's check of a
    producer's batch); returns the position after the last record.

    Checks that record ``i`` has offsetDelta ``i``, that each record's length covers
    exactly its fields, and that header keys are non-null UTF-8. Raises ValueError
    (the message says what is wrong) for a malformed record or one running past ``end``.
    """
    return _CODEC.walk_records(data, start, end, count)


def _py_walk_records(data: Buffer, p: int, end: int, count: int) -> int:
    slow = _read_zigzag
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


# ---------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------


def _varint_size(z: int) -> int:
    """Bytes of the varint of an already zigzagged (non-negative) value."""
    n = 1
    while z > 0x7F:
        z >>= 7
        n += 1
    return n


def _headers_size(headers: Sequence[Header]) -> int:
    size = _varint_size(len(headers) << 1)
    for name, value in headers:
        n = len(name.encode("utf-8"))
        size += _varint_size(n << 1) + n
        size += 1 if value is None else _varint_size(len(value) << 1) + len(value)
    return size


def record_size_in_bytes(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header] = (),
) -> int:
    """Encoded bytes of one record, length prefix included (Kafka's DefaultRecord.sizeInBytes)."""
    body = 1 + _varint_size((timestamp_delta << 1) ^ (timestamp_delta >> 63)) + _varint_size(offset_delta << 1)
    body += 1 if key is None else _varint_size(len(key) << 1) + len(key)
    body += 1 if value is None else _varint_size(len(value) << 1) + len(value)
    body += _headers_size(headers) if headers else 1
    return _varint_size(body << 1) + body


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
    _codec: ClassVar[_Codec]
    _append_record: ClassVar[Callable[..., bool]]  # _codec.append_record, looked up once per call

    def __init__(
        self,
        compression: Compression = Compression.NONE,
        *,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = -1,
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
        if codec == Compression.SNAPPY:
            _snappy_available("encode")
        if is_transactional and producer_id == NO_PRODUCER_ID:
            raise InvalidConfigError("a transactional batch needs a producer id")
        try:  # fail now, not at build, on a field out of its range
            _HEADER.pack(
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
        attributes = codec | (_TRANSACTIONAL_MASK if self._is_transactional else 0)
        buf = self._buf
        if codec:
            with memoryview(buf) as view:
                payload = _compress(codec, view[HEADER_SIZE:])
            out = bytearray(HEADER_SIZE)
            out += payload
        else:
            out = buf
        _HEADER.pack_into(
            out, 0,
            self._base_offset, len(out) - LOG_OVERHEAD, self._partition_leader_epoch, MAGIC,
            0, attributes, count - 1, self._first_ts, self._max_ts,
            self._producer_id, self._producer_epoch, self._base_sequence, count,
        )  # fmt: skip
        with memoryview(out) as view:
            crc = _crc32c(view[_ATTRIBUTES_POS:])
        _U32.pack_into(out, _CRC_POS, crc)
        built = bytes(out)
        self._built = built
        self._buf = bytearray()
        return built


def _py_append_record(
    buf: bytearray,
    delta: int,
    ts_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
    limit: int,
) -> bool:
    """Append one record to ``buf`` unless ``limit`` >= 0 and it would grow past it."""
    table = _VARINTS
    size = _VARINT_TABLE_SIZE
    z = (ts_delta << 1) ^ (ts_delta >> 63)
    ts_b = table[z] if z < size else _encode_zigzag(z)
    z = delta << 1
    off_b = table[z] if z < size else _encode_zigzag(z)
    if key is None:
        key = b""
        key_b = b"\x01"
    else:
        z = len(key) << 1
        key_b = table[z] if z < size else _encode_zigzag(z)
    if value is None:
        value = b""
        value_b = b"\x01"
    else:
        z = len(value) << 1
        value_b = table[z] if z < size else _encode_zigzag(z)
    headers_b = _encode_headers(headers) if headers else b"\x00"
    body = b"".join((b"\x00", ts_b, off_b, key_b, key, value_b, value, headers_b))
    z = len(body) << 1
    length_b = table[z] if z < size else _encode_zigzag(z)
    if limit >= 0 and len(buf) + len(length_b) + len(body) > limit:
        return False
    buf += length_b
    buf += body
    return True


def _py_encode_records(
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
    append = _py_append_record
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
    parts = [_encode_varint(len(headers))]
    add = parts.append
    for name, value in headers:
        raw = name.encode("utf-8")
        add(_encode_varint(len(raw)))
        add(raw)
        if value is None:
            add(b"\x01")
        else:
            add(_encode_varint(len(value)))
            add(value)
    return b"".join(parts)


def encode_batch(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[Header]] | None = None,
    timestamps: Sequence[int] | None = None,
    *,
    base_timestamp: int | None = None,
    compression: Compression = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    base_offset: int = 0,
) -> bytes:
    """One whole batch from parallel sequences, in one call (the producer's ``send_batch``).

    Record ``i`` has value ``values[i]``, key ``keys[i]`` (all null without keys),
    headers ``headers[i]`` (none without headers) and timestamp ``timestamps[i]``
    (``base_timestamp`` for every record without timestamps; that defaults to now).
    The bytes equal those of a BatchBuilder fed the same records. Raises
    IllegalStateError for no values, ValueError for sequences of different lengths.
    """
    return _encode_batch(
        BatchBuilder, values, keys, headers, timestamps, base_timestamp, compression,
        producer_id, producer_epoch, base_sequence, is_transactional, partition_leader_epoch, base_offset,
    )  # fmt: skip


def _encode_batch(
    builder_type: type[BatchBuilder],
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
    headers: Sequence[Sequence[Header]] | None,
    timestamps: Sequence[int] | None,
    base_timestamp: int | None,
    compression: Compression,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    is_transactional: bool,
    partition_leader_epoch: int,
    base_offset: int,
) -> bytes:
    n = _check_lengths(values, keys, headers, timestamps)
    builder = builder_type(
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


def _check_lengths(
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


# ---------------------------------------------------------------------------
# The two implementations: compiled (kclient._crecords) and pure Python
# ---------------------------------------------------------------------------


class _Codec(NamedTuple):
    """The hot loops of one implementation (signatures as in kclient/_crecords.c)."""

    name: str
    reads_buffers: bool  # decode_records takes any buffer (else bytes only)
    append_record: Callable[..., bool]
    record_size: Callable[..., int]
    encode_records: Callable[..., tuple[int, int]]
    decode_records: Callable[..., list[Record]]
    decode_consumer_records: Callable[..., list[ConsumerRecord]]
    decode_columns: Callable[[Buffer, int, RecordColumns | None], RecordColumns]
    decode_buffers: Callable[[Buffer, int, list[Any]], None]
    columns_of: Callable[[list[Any], int, int], tuple[list[Any], ...]]
    walk_records: Callable[[Buffer, int, int, int], int]


_PY_CODEC = _Codec(
    "python",
    False,
    _py_append_record,
    record_size_in_bytes,
    _py_encode_records,
    _py_decode_records,
    _py_decode_consumer_records,
    _py_decode_columns,
    _py_decode_buffers,
    _py_columns_of,
    _py_walk_records,
)


def _load_extension() -> _Codec | None:
    if os.environ.get("KBROKER_NO_EXTENSIONS", "") not in ("", "0"):
        return None
    try:
        c = importlib.import_module("kclient._crecords")
    except ImportError:
        return None
    global _crc32c
    _crc32c = c.crc32c
    c.configure(Record, ConsumerRecord, CorruptRecordError, _decompress)

    def decode_columns(buf: Buffer, start_offset: int = 0, out: RecordColumns | None = None) -> RecordColumns:
        cols = RecordColumns([], [], [], [], [], []) if out is None else out
        c.decode_columns(buf, start_offset, *cols)
        return cols

    return _Codec(
        "c",
        True,
        c.append_record,
        c.record_size,
        c.encode_records,
        c.decode_records,
        c.decode_consumer_records,
        decode_columns,
        c.decode_buffers,
        c.columns_of,
        c.walk_records,
    )


_C_CODEC = _load_extension()
_CODEC = _C_CODEC or _PY_CODEC
BatchBuilder._codec = _CODEC
BatchBuilder._append_record = staticmethod(_CODEC.append_record)  # type: ignore[assignment]
IMPLEMENTATION = _CODEC.name
"""Which codec is in use: "c" (kclient._crecords) or "python" (KBROKER_NO_EXTENSIONS=1, or not built)."""


class CodecAPI(NamedTuple):
    """The codec's entry points bound to one implementation (for tests and benchmarks)."""

    name: str
    BatchBuilder: type[BatchBuilder]
    encode_batch: Callable[..., bytes]
    decode_batch: Callable[..., tuple[BatchHeader, list[Record]]]
    decode_batches: Callable[..., Iterator[tuple[BatchHeader, list[Record]]]]
    decode_consumer_records: Callable[..., list[ConsumerRecord]]
    decode_columns: Callable[..., RecordColumns]
    decode_buffers: Callable[..., ColumnBuffers]
    walk_records: Callable[[Buffer, int, int, int], int]
    record_size_in_bytes: Callable[..., int]


def _api(codec: _Codec) -> CodecAPI:
    builder_type = type(
        "BatchBuilder",
        (BatchBuilder,),
        {"__slots__": (), "_codec": codec, "_append_record": staticmethod(codec.append_record)},
    )

    def encode(
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[Sequence[Header]] | None = None,
        timestamps: Sequence[int] | None = None,
        *,
        base_timestamp: int | None = None,
        compression: Compression = Compression.NONE,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = -1,
        base_sequence: int = NO_SEQUENCE,
        is_transactional: bool = False,
        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
        base_offset: int = 0,
    ) -> bytes:
        return _encode_batch(
            builder_type, values, keys, headers, timestamps, base_timestamp, compression,
            producer_id, producer_epoch, base_sequence, is_transactional, partition_leader_epoch, base_offset,
        )  # fmt: skip

    def consumer_records(
        buf: Buffer,
        topic: str,
        partition: int,
        start_offset: int = 0,
        key_deserializer: Callable[[bytes], Any] | None = None,
        value_deserializer: Callable[[bytes], Any] | None = None,
        out: list[ConsumerRecord] | None = None,
    ) -> list[ConsumerRecord]:
        return codec.decode_consumer_records(
            buf, topic, partition, start_offset, key_deserializer, value_deserializer, [] if out is None else out
        )

    def columns(buf: Buffer, start_offset: int = 0, out: RecordColumns | None = None) -> RecordColumns:
        return codec.decode_columns(buf, start_offset, out)

    def buffers(buf: Buffer, start_offset: int = 0) -> ColumnBuffers:
        cols = ColumnBuffers()
        try:
            codec.decode_buffers(buf, start_offset, cols._parts)
        finally:
            cols._length = len(cols._parts[_OFFSETS]) >> 3
        return cols

    def size(
        offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None, headers: Sequence[Header] = ()
    ) -> int:
        return codec.record_size(offset_delta, timestamp_delta, key, value, headers)

    return CodecAPI(
        codec.name,
        builder_type,
        encode,
        partial(_decode_batch, codec),
        partial(_decode_batches, codec),
        consumer_records,
        columns,
        buffers,
        codec.walk_records,
        size,
    )


def implementations() -> dict[str, CodecAPI]:
    """Every available implementation by name: always "python", and "c" when the extension
    is built and not disabled."""
    out = {"python": _api(_PY_CODEC)}
    if _C_CODEC is not None:
        out["c"] = _api(_C_CODEC)
    return out
