"""The C/Python twin dispatch: which loops run, and each implementation's API for tests.

The codec's hot loops exist twice, with the same signatures: compiled in
``kclient._crecords`` (kclient/_crecords.c) and in pure Python
(:mod:`kclient.records.pyrecords`). :mod:`kclient.records.native` finds the extension
(``KBROKER_NO_EXTENSIONS=1`` keeps it out); here each set becomes a :class:`Codec`, the
one in use (:data:`CODEC`, named by :data:`IMPLEMENTATION`) is given to the builder and
to ColumnBuffers, and the compiled module is configured with the Python types it builds
and the decompressor it calls back for compressed bodies.

:func:`implementations` gives every available implementation's entry points side by
side (:class:`CodecAPI`), which is how the twin tests (tests/unit/test_records_twins.py)
and the codec benchmark compare them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from types import ModuleType
from typing import Any, NamedTuple

import kclient.records.pyrecords as pyrecords
from kclient.errors import CorruptRecordError
from kclient.records.buffers import OFFSETS, ColumnBuffers
from kclient.records.builder import BatchBuilder
from kclient.records.compression import decompress
from kclient.records.header import BatchHeader, check_batch, check_shape, iter_headers, read_header
from kclient.records.layout import (
    COMPRESSION_CODEC_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    Buffer,
)
from kclient.records.native import EXTENSION, Codec
from kclient.records.record import Header, Record, RecordColumns, record_size_in_bytes
from kclient.structs import ConsumerRecord

PY_CODEC = Codec(
    "python",
    False,
    pyrecords.append_record,
    record_size_in_bytes,
    pyrecords.encode_records,
    pyrecords.decode_records,
    pyrecords.decode_consumer_records,
    pyrecords.decode_columns,
    pyrecords.decode_buffers,
    pyrecords.columns_of,
    pyrecords.walk_records,
)


def _compiled(c: ModuleType | None) -> Codec | None:
    """The compiled loops of ``c`` (kclient._crecords), configured; None without it."""
    if c is None:
        return None
    c.configure(Record, ConsumerRecord, CorruptRecordError, decompress)

    def decode_columns(buf: Buffer, start_offset: int = 0, out: RecordColumns | None = None) -> RecordColumns:
        cols = RecordColumns([], [], [], [], [], []) if out is None else out
        c.decode_columns(buf, start_offset, *cols)
        return cols

    return Codec(
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


C_CODEC = _compiled(EXTENSION)
CODEC = C_CODEC or PY_CODEC
"""The implementation in use."""
BatchBuilder._codec = CODEC
BatchBuilder._append_record = staticmethod(CODEC.append_record)  # type: ignore[assignment]
ColumnBuffers._codec = CODEC
IMPLEMENTATION = CODEC.name
"""Which codec is in use: "c" (kclient._crecords) or "python" (KBROKER_NO_EXTENSIONS=1, or not built)."""


def _records_of(codec: Codec, buf: Buffer, pos: int, header: BatchHeader) -> list[Record]:
    """The records of the checked batch at ``pos``, decoded by ``codec``."""
    attributes = header.attributes
    if attributes & COMPRESSION_CODEC_MASK or not codec.reads_buffers:
        data, start, end = pyrecords.body_bytes(buf, pos, header)
    else:
        data, start, end = buf, pos + HEADER_SIZE, pos + header.batch_length + LOG_OVERHEAD  # type: ignore[assignment]
    return codec.decode_records(
        data, start, end, header.record_count, header.base_offset, header.first_timestamp,
        header.max_timestamp if attributes & TIMESTAMP_TYPE_MASK else None,
    )  # fmt: skip


def decode_batch_with(
    codec: Codec, buf: Buffer, pos: int = 0, *, check_crc: bool = True
) -> tuple[BatchHeader, list[Record]]:
    """:func:`~kclient.records.decode_batch` run by ``codec``."""
    header = read_header(buf, pos)
    if check_crc:
        check_batch(buf, pos, header)
    else:
        check_shape(buf, pos, header)
    return header, _records_of(codec, buf, pos, header)


def decode_batches_with(
    codec: Codec, buf: Buffer, *, check_crc: bool = True
) -> Iterator[tuple[BatchHeader, list[Record]]]:
    """:func:`~kclient.records.decode_batches` run by ``codec``."""
    for pos, header in iter_headers(buf):
        if check_crc:
            check_batch(buf, pos, header)
        else:
            check_shape(buf, pos, header)
        yield header, _records_of(codec, buf, pos, header)


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


def _api(codec: Codec) -> CodecAPI:
    builder_type: type[BatchBuilder] = type(
        "BatchBuilder",
        (BatchBuilder,),
        {"__slots__": (), "_codec": codec, "_append_record": staticmethod(codec.append_record)},
    )

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
            cols._length = len(cols._parts[OFFSETS]) >> 3
        return cols

    def size(
        offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None, headers: Sequence[Header] = ()
    ) -> int:
        return codec.record_size(offset_delta, timestamp_delta, key, value, headers)

    return CodecAPI(
        codec.name,
        builder_type,
        builder_type.encode,
        partial(decode_batch_with, codec),
        partial(decode_batches_with, codec),
        consumer_records,
        columns,
        buffers,
        codec.walk_records,
        size,
    )


def implementations() -> dict[str, CodecAPI]:
    """Every available implementation by name: always "python", and "c" when the extension
    is built and not disabled."""
    out = {"python": _api(PY_CODEC)}
    if C_CODEC is not None:
        out["c"] = _api(C_CODEC)
    return out
