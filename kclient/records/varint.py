"""Zigzag varints, as records use them (protobuf's encoding: 7 bits a byte, low first).

A varint holds a 32-bit value, a varlong a 64-bit one; both are zigzagged first
(``(v << 1) ^ (v >> 63)``) so small negative values stay short. A record's lengths,
deltas and counts are varints; -1 (zigzag 1, the byte 0x01) is null.

The pure-Python encoder looks up every value whose zigzag is below 2**14 (one or two
bytes) in a table; the compiled twin (kclient/_crecords.c) does the same in C.
"""

from __future__ import annotations

from kclient.errors import CorruptRecordError
from kclient.records.layout import Buffer

VARINT_TABLE_SIZE = 1 << 14  # every zigzag value encoded in one or two bytes


def _build_varint_table() -> tuple[bytes, ...]:
    table = []
    for z in range(VARINT_TABLE_SIZE):
        if z < 0x80:
            table.append(bytes((z,)))
        else:
            table.append(bytes((0x80 | (z & 0x7F), z >> 7)))
    return tuple(table)


VARINTS: tuple[bytes, ...] = _build_varint_table()
"""VARINTS[zigzag(v)] is the encoding of v, for zigzag(v) < VARINT_TABLE_SIZE."""


def encode_zigzag(z: int) -> bytes:
    """Encoding of an already zigzagged (non-negative) value."""
    out = bytearray()
    while z > 0x7F:
        out.append(0x80 | (z & 0x7F))
        z >>= 7
    out.append(z)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Encoding of the signed ``value`` (zigzagged here)."""
    z = (value << 1) ^ (value >> 63)
    return VARINTS[z] if z < VARINT_TABLE_SIZE else encode_zigzag(z)


def varint_size(z: int) -> int:
    """Bytes of the varint of an already zigzagged (non-negative) value."""
    n = 1
    while z > 0x7F:
        z >>= 7
        n += 1
    return n


def read_zigzag(data: Buffer, p: int) -> tuple[int, int]:
    """(raw zigzag value, next position) of the varint at ``p`` (any length).

    Raises CorruptRecordError past 10 bytes, IndexError at the end of ``data``."""
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
    z, p = read_zigzag(data, p)
    return (z >> 1) ^ -(z & 1), p
