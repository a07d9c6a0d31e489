"""murmur2 and key partitioning, against Kafka's published vectors and kafka-python."""

from __future__ import annotations

import random

import pytest
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from kclient.partitioner import murmur2, partition_for_key

# org.apache.kafka.common.utils.UtilsTest#testMurmur2 (signed Java ints)
JAVA_UTILS_TEST = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

# values of Utils.murmur2 quoted by other ports (akka's Murmur2Spec)
JAVA_OTHER = {
    b"1": -1993445489,
    b"12": 126087238,
    b"123": -267702483,
    b"1234": -1614185708,
    b"12345": -1188365604,
}


@pytest.mark.parametrize("key,expected", sorted({**JAVA_UTILS_TEST, **JAVA_OTHER}.items()))
def test_java_vectors(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_matches_kafka_python_on_random_keys() -> None:
    rng = random.Random(42)
    keys = [rng.randbytes(n) for n in range(0, 70) for _ in range(30)]
    keys += [rng.randbytes(rng.randint(70, 2000)) for _ in range(200)]
    keys += [b"", b"\x00", b"\xff" * 4, b"\xff" * 7, b"\x80\x00\x00\x00"]
    for key in keys:
        ours = murmur2(key)
        assert -(2**31) <= ours < 2**31
        assert ours & 0xFFFFFFFF == kafka_python_murmur2(key), key


def test_bytes_like_inputs() -> None:
    for key in JAVA_UTILS_TEST:
        expected = JAVA_UTILS_TEST[key]
        assert murmur2(bytearray(key)) == murmur2(memoryview(key)) == expected  # type: ignore[arg-type]


def test_partition_for_key_matches_java_formula() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        key = rng.randbytes(rng.randint(0, 40))
        n = rng.randint(1, 1000)
        expected = (kafka_python_murmur2(key) & 0x7FFFFFFF) % n
        assert partition_for_key(key, n) == expected
        assert 0 <= partition_for_key(key, n) < n


def test_partition_for_key_known_values() -> None:
    # toPositive(-973932308) = 1173551340
    assert partition_for_key(b"21", 1) == 0
    assert partition_for_key(b"21", 10) == 1173551340 % 10 == 0
    assert partition_for_key(b"foobar", 3) == (-790332482 & 0x7FFFFFFF) % 3
    assert partition_for_key(b"abc", 100) == 479470107 % 100 == 7


def test_partition_for_key_rejects_no_partitions() -> None:
    with pytest.raises(ValueError):
        partition_for_key(b"k", 0)
