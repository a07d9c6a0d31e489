"""Key partitioning, identical to the Java client's so keys land on the same partitions.

``partition_for_key(key, n) = (murmur2(key) & 0x7fffffff) % n``, as
``DefaultPartitioner`` / ``BuiltInPartitioner.partitionForKey`` compute it with
``Utils.toPositive(Utils.murmur2(keyBytes)) % numPartitions``.
"""

from __future__ import annotations

import struct

__all__ = ["murmur2", "partition_for_key"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: MurmurHash2, seed 0x9747b28c, as a signed 32-bit int.

    Words are read little-endian; arithmetic wraps at 32 bits and shifts are logical
    (Java's ``>>>``), as in the Java code.
    """
    length = len(data)
    m = _M
    mask = _MASK
    h = (_SEED ^ length) & mask
    words = length >> 2
    if words:
        for k in struct.unpack_from(f"<{words}I", data):
            k = (k * m) & mask
            k ^= k >> _R
            k = (k * m) & mask
            h = ((h * m) & mask) ^ k
    tail = length & 3
    if tail:
        i = length - tail
        if tail == 3:
            h ^= data[i + 2] << 16
        if tail >= 2:
            h ^= data[i + 1] << 8
        h ^= data[i]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition of a non-null key among ``num_partitions``."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions
