"""One record inside a batch: its layout, its decoded form, its encoded size.

Record layout (varint = zigzag varint, :mod:`kclient.records.varint`; varlong the same,
64-bit)::

    length varint | attributes int8 (unused, 0) | timestampDelta varlong |
    offsetDelta varint | keyLen varint | key | valueLen varint | value |
    headerCount varint | headers: [keyLen varint | key utf-8 | valLen varint | val]

``length`` counts the bytes after itself. A length of -1 means null (key, value,
header value); a header key is never null. In a batch from a producer, record ``i``
has offsetDelta ``i``; a compacted batch may have gaps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from kclient.records.varint import varint_size

Header = tuple[str, bytes | None]

MIN_RECORD_SIZE = 7
"""Bytes of the smallest record: length, attributes, timestampDelta, offsetDelta,
keyLength, valueLength and headerCount, one byte each."""
MAX_RECORD_OVERHEAD = 21
"""Bytes a record may need beyond its key, value and headers (Kafka's DefaultRecord.MAX_RECORD_OVERHEAD)."""


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


def _headers_size(headers: Sequence[Header]) -> int:
    size = varint_size(len(headers) << 1)
    for name, value in headers:
        n = len(name.encode("utf-8"))
        size += varint_size(n << 1) + n
        size += 1 if value is None else varint_size(len(value) << 1) + len(value)
    return size


def record_size_in_bytes(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header] = (),
) -> int:
    """Encoded bytes of one record, length prefix included (Kafka's DefaultRecord.sizeInBytes)."""
    body = 1 + varint_size((timestamp_delta << 1) ^ (timestamp_delta >> 63)) + varint_size(offset_delta << 1)
    body += 1 if key is None else varint_size(len(key) << 1) + len(key)
    body += 1 if value is None else varint_size(len(value) << 1) + len(value)
    body += _headers_size(headers) if headers else 1
    return varint_size(body << 1) + body
