"""Builds message sets of magic 0 and 1 (Kafka's formats before RecordBatch v2), as old
clients send them with Produce v0-2, for tests of their up-conversion."""

from __future__ import annotations

import struct
import zlib

from kclient.records import Compression, compress


def message(
    key: bytes | None,
    value: bytes | None,
    *,
    magic: int = 0,
    timestamp: int = -1,
    attributes: int = 0,
    offset: int = 0,
) -> bytes:
    """One message with its offset and size prefix (a message set of one)."""
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    for field in (key, value):
        body += struct.pack(">i", -1) if field is None else struct.pack(">i", len(field)) + field
    crc = zlib.crc32(body)
    msg = struct.pack(">I", crc) + body
    return struct.pack(">qi", offset, len(msg)) + msg


def message_set(records: list[tuple[bytes | None, bytes | None]], *, magic: int = 0, timestamp: int = -1) -> bytes:
    return b"".join(message(k, v, magic=magic, timestamp=timestamp, offset=i) for i, (k, v) in enumerate(records))


def compressed(inner: bytes, codec: Compression, *, magic: int = 0, timestamp: int = -1) -> bytes:
    """A wrapper message whose value is ``inner`` (a message set) compressed."""
    return message(None, compress(codec, inner), magic=magic, timestamp=timestamp, attributes=int(codec))
