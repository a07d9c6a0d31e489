"""ColumnBuffers: decoded records in Arrow's memory layout, and Spark's Kafka schema in Arrow.

What :func:`~kclient.records.decode_buffers` fills: one buffer per column and no object
per record, so ``Consumer.poll_arrow`` and the Spark source hand Arrow the buffers
themselves. The order of the buffers in ``ColumnBuffers._parts`` (OFFSETS ... HEADERS
below) is shared with kclient/_crecords.c, which appends to them.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from kclient.records.layout import Buffer
from kclient.records.native import Codec
from kclient.records.record import Header, RecordColumns

if TYPE_CHECKING:
    import pyarrow as pa


# ColumnBuffers._parts: the buffers in this order (kclient/_crecords.c has the same enum)
OFFSETS, TIMESTAMPS, TYPES = 0, 1, 2
KEY_VALID, KEY_OFFS, KEY_DATA = 3, 4, 5
VALUE_VALID, VALUE_OFFS, VALUE_DATA = 6, 7, 8
HEADERS = 9
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
    _codec: ClassVar[Codec]
    """The implementation in use (set by :mod:`kclient.records.twins`)."""

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
        return self._fixed(OFFSETS, "q")

    @property
    def timestamps(self) -> memoryview:
        return self._fixed(TIMESTAMPS, "q")

    @property
    def timestamp_types(self) -> memoryview:
        return self._fixed(TYPES, "i")

    @property
    def headers(self) -> list[list[Header]] | None:
        """Each record's headers, or ``None`` when no record has any."""
        h = self._parts[HEADERS]
        return None if h is None else h[self._start : self._start + self._length]

    def _data_size(self, slot: int) -> int:
        offs = memoryview(self._parts[slot + 1]).cast("i")
        return int(offs[self._start + self._length] - offs[self._start])

    @property
    def key_bytes(self) -> int:
        """Bytes of all keys (from the offsets: no record is visited)."""
        return self._data_size(KEY_VALID)

    @property
    def value_bytes(self) -> int:
        """Bytes of all values (from the offsets: no record is visited)."""
        return self._data_size(VALUE_VALID)

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
        kv, ko, kd = self._binary(KEY_VALID)
        vv, vo, vd = self._binary(VALUE_VALID)
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
        return RecordColumns(*self._codec.columns_of(self._parts, self._start, self._length))

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
        stamps = pa.Array.from_buffers(pa.timestamp("ms", tz=stamp_type.tz), n, [None, buf(p[TIMESTAMPS])], 0, s)
        arrays = [
            binary(KEY_VALID),
            binary(VALUE_VALID),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.Array.from_buffers(pa.int64(), n, [None, buf(p[OFFSETS])], 0, s),
            stamps if stamps.type == stamp_type else stamps.cast(stamp_type),
            pa.Array.from_buffers(pa.int32(), n, [None, buf(p[TYPES])], 0, s),
        ]
        if "headers" in schema.names:
            header_type = schema.field("headers").type
            h = p[HEADERS]
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
        for part, width in ((OFFSETS, 8), (TIMESTAMPS, 8), (TYPES, 4)):
            p[part] = bytearray().join(
                memoryview(c._parts[part])[c._start * width : (c._start + c._length) * width] for c in parts
            )
        for slot in (KEY_VALID, VALUE_VALID):
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
            if base > INT32_MAX:
                raise OverflowError("a ColumnBuffers binary column holds at most 2 GiB")
            if any(valid is not None for valid, _, _ in pieces):
                p[slot] = bytearray(bits.to_bytes((at + 7) // 8, "little"))
            p[slot + 1] = bytearray().join(offsets)
            p[slot + 2] = bytearray().join(data for _, _, data in pieces)
        if any(c._parts[HEADERS] is not None for c in parts):
            headers: list[list[Header]] = []
            for c in parts:
                h = c.headers
                headers.extend([[] for _ in range(c._length)] if h is None else h)
            p[HEADERS] = headers
        out._length = len(p[OFFSETS]) >> 3
        return out


_INT32_ZERO = bytes(4)
INT32_MAX = 2**31 - 1


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
