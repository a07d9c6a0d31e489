"""A leader validates the records of a producer's batch, not only its header and CRC.

Hand-crafted batches with a valid header and CRC but garbage records must be
refused with Kafka's errors and change nothing; whatever is accepted must decode.
"""

from __future__ import annotations

import random
import resource
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import lz4.frame
import pytest
import zstandard
from crc32c import crc32c
from storage_testutil import make_batch, small_config

from kbroker.storage.log import Log
from kbroker.storage.validator import validate_batches
from kclient.errors import CorruptRecordError, InvalidRecordError, MessageSizeTooLargeError
from kclient.records import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER,
    HEADER_SIZE,
    MIN_BATCH_LENGTH,
    BatchBuilder,
    Compression,
    available,
    decode_batch,
    decode_batches,
)

MIB = 1 << 20


def varint(value: int) -> bytes:
    z = (value << 1) ^ (value >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append(0x80 | (z & 0x7F))
        z >>= 7
    out.append(z)
    return bytes(out)


def record(
    offset_delta: int,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    *,
    headers: Sequence[tuple[bytes | None, bytes | None]] = (),
    extra_length: int = 0,
) -> bytes:
    """One record; ``extra_length`` makes its length varint lie."""
    fields = [b"\x00", varint(0), varint(offset_delta)]
    for blob in (key, value):
        fields += [varint(-1)] if blob is None else [varint(len(blob)), blob]
    fields.append(varint(len(headers)))
    for hkey, hvalue in headers:
        fields += [varint(-1)] if hkey is None else [varint(len(hkey)), hkey]
        fields += [varint(-1)] if hvalue is None else [varint(len(hvalue)), hvalue]
    body = b"".join(fields)
    return varint(len(body) + extra_length) + body


def batch(body: bytes, count: int, last_offset_delta: int | None = None, codec: int = Compression.NONE) -> bytes:
    """A batch around ``body`` (already compressed if ``codec``), with a valid CRC."""
    delta = count - 1 if last_offset_delta is None else last_offset_delta
    header = HEADER.pack(0, MIN_BATCH_LENGTH + len(body), -1, 2, 0, int(codec), delta, 1000, 1000, -1, -1, -1, count)
    data = bytearray(header + body)
    struct.pack_into(">I", data, CRC_OFFSET, crc32c(bytes(data[ATTRIBUTES_OFFSET:])))
    return bytes(data)


def records(n: int) -> bytes:
    return b"".join(record(i, f"k{i}".encode(), f"value-{i}".encode()) for i in range(n))


def validate(data: bytes, max_message_bytes: int | None = 1 << 20) -> None:
    validate_batches(data, as_leader=True, max_message_bytes=max_message_bytes)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    log = Log.open(tmp_path / "t-0", small_config(segment_bytes=1 << 20, max_message_bytes=64 * 1024))
    log.append_as_leader(make_batch(2), 0)
    yield log
    log.close()


def files_of(log: Log) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(log.dir.iterdir())}


def refused(log: Log, data: bytes, error: type[Exception], match: str = "") -> None:
    """``data`` is refused with ``error`` and the log (offsets and files) is as before."""
    before = (log.log_end_offset, files_of(log))
    with pytest.raises(error, match=match):
        log.append_as_leader(data, 0)
    assert (log.log_end_offset, files_of(log)) == before
    assert log.append_as_leader(make_batch(1), 0).first_offset == before[0]  # the log still works


# --------------------------------------------------------------------- the cases


def test_record_count_beyond_the_body_is_refused(log: Log) -> None:
    """recordCount consistent with lastOffsetDelta but not with the body: LEO +1000."""
    refused(log, batch(records(1), 1000), InvalidRecordError, "1000 records")
    refused(log, batch(records(3), 4), InvalidRecordError, "record")


def test_two_to_the_31_offsets_in_one_request_are_refused(log: Log) -> None:
    """Two batches each claiming 2^30 records (LEO +2^31 in one request), and one claiming Int.MAX."""
    huge = batch(records(2), 2**30)
    refused(log, huge + huge, InvalidRecordError, "records")
    refused(log, batch(records(2), 2**31 - 1), InvalidRecordError, "records")
    started = time.monotonic()
    with pytest.raises(InvalidRecordError):  # refused up front, not by walking 2^31 records
        validate(batch(records(20_000), 2**31 - 1), None)
    # Walking 2^31 records would take minutes; a loaded CI machine may take a second.
    assert time.monotonic() - started < 10


def test_fewer_records_than_declared_in_a_plausible_body_is_refused(log: Log) -> None:
    """The body could hold the count (>= 7 bytes a record) but holds fewer records."""
    body = record(0, b"k" * 100, b"v" * 100)
    refused(log, batch(body, 10), InvalidRecordError, "running past the end|end after 1 of 10")


def test_random_record_bytes_with_a_valid_crc_are_refused(log: Log) -> None:
    rng = random.Random(8)
    for count in (1, 2, 5, 40):
        for _ in range(50):
            body = rng.randbytes(rng.randrange(count * 7, count * 60))
            with pytest.raises(InvalidRecordError):
                validate(batch(body, count))
    refused(log, batch(rng.randbytes(300), 5), InvalidRecordError, "record")


def test_repeated_offset_deltas_are_refused(log: Log) -> None:
    body = record(0) + record(0) + record(1)
    refused(log, batch(body, 3), InvalidRecordError, "record 1 has offsetDelta 0")
    refused(log, batch(record(0) + record(2) + record(1), 3), InvalidRecordError, "offsetDelta 2")
    refused(log, batch(record(1) + record(2), 2), InvalidRecordError, "record 0 has offsetDelta 1")
    refused(log, batch(record(0) + record(-1), 2), InvalidRecordError, "offsetDelta -1")


def _zstd_bomb(record_bytes: int) -> bytes:
    """A zstd frame of one record whose value is ``record_bytes`` zeros."""
    compressor = zstandard.ZstdCompressor(level=1).compressobj()
    prefix = b"\x00" + varint(0) + varint(0) + varint(-1) + varint(record_bytes)
    parts = [compressor.compress(varint(len(prefix) + record_bytes + 1) + prefix)]
    zeros = bytes(MIB)
    for _ in range(record_bytes // MIB):
        parts.append(compressor.compress(zeros))
    parts.append(compressor.compress(b"\x00"))  # no headers
    parts.append(compressor.flush())
    return b"".join(parts)


def test_zstd_bomb_is_refused_without_inflating_it(log: Log) -> None:
    """A ~32 KB zstd frame holding a 1 GiB record: refused, with memory bounded by max.message.bytes."""
    frame = _zstd_bomb(1 << 30)
    assert len(frame) < 64 * 1024
    data = batch(frame, 1, codec=Compression.ZSTD)
    assert len(data) < 64 * 1024  # within max.message.bytes: only the decompressed size is too large
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    refused(log, data, MessageSizeTooLargeError, "decompresses to more than")
    assert time.monotonic() - started < 2
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mib < 64, f"the peak RSS grew by {grown_mib:.0f} MiB"


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_decompressed_size_is_bounded_by_max_message_bytes(codec: Compression) -> None:
    builder = BatchBuilder(codec)
    for i in range(40):
        builder.append(1000, None, bytes(4096) + bytes([i]))
    data = builder.build()
    assert len(data) < 4096  # small on the wire, ~160 KiB of records
    validate(data, 200 * 1024)
    with pytest.raises(MessageSizeTooLargeError, match=r"max\.message\.bytes=65536"):
        validate(data, 64 * 1024)


# --------------------------------------------------------------------- record structure


@pytest.mark.parametrize(
    ("body", "count", "match"),
    [
        (record(0, extra_length=1), 1, "running past the end|declares"),
        (record(0, extra_length=-1), 1, "declares"),
        (records(2) + b"\x00\x00", 2, "the record count is wrong"),
        (records(2) + b"\x01", 2, "the record count is wrong"),
        (record(0, headers=[(None, b"v")]), 1, "null key"),
        (record(0, headers=[(b"\xff\xfe", b"v")]), 1, "utf-8"),
        (record(0, b"\xff" * 3)[:-3] + b"\xff" * 11, 1, "longer than 10 bytes|running past|declares"),
        (varint(-5) + record(0)[1:], 1, "declares|running past"),
    ],
    ids=["long", "short", "trailing-zeros", "trailing-byte", "null-header-key", "bad-utf8", "long-varint", "neg-len"],
)
def test_malformed_records_are_refused(body: bytes, count: int, match: str) -> None:
    with pytest.raises(InvalidRecordError, match=match):
        validate(batch(body, count))


def test_nulls_and_headers_are_valid() -> None:
    body = (
        record(0, None, None)
        + record(1, b"", b"", headers=[(b"h", None), (b"", b"x")])
        + record(2, b"k" * 300, b"v" * 20_000, headers=[("ключ".encode(), b"\x00" * 200)])
    )
    data = batch(body, 3)
    validate(data)
    _, decoded = decode_batch(data)
    assert [r.offset for r in decoded] == [0, 1, 2]


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_compressed_garbage_is_refused(codec: Compression) -> None:
    good = BatchBuilder(codec)
    for i in range(10):
        good.append(1000 + i, b"k", b"value %d" % i)
    built = good.build()
    validate(built)
    compressed = built[HEADER_SIZE:]
    # A truncated body: gzip and lz4 say so; zstd yields what it has, too few records.
    with pytest.raises((CorruptRecordError, InvalidRecordError), match=r"cannot decompress|truncated|records"):
        validate(batch(compressed[: len(compressed) // 2], 10, codec=codec))
    with pytest.raises(InvalidRecordError):  # decompresses, but holds 10 records, not 11
        validate(batch(compressed, 11, codec=codec))
    garbage = {
        Compression.GZIP: zlib.compress(b"\x07" * 100, wbits=31),
        Compression.LZ4: lz4.frame.compress(b"\x07" * 100),
        Compression.ZSTD: zstandard.ZstdCompressor().compress(b"\x07" * 100),
    }[codec]
    with pytest.raises(InvalidRecordError):
        validate(batch(garbage, 3, codec=codec))


def test_accepted_batches_always_decode() -> None:
    """Fuzz: mutate valid batches (CRC fixed up); whatever the validator accepts, kclient decodes
    with consecutive offsets."""
    rng = random.Random(88)
    originals = [make_batch(5, value_size=30), records(12), record(0, headers=[(b"h", b"v")])]
    originals = [o if o[:8] == bytes(8) else batch(o, 12 if len(o) > 40 else 1) for o in originals]
    accepted = 0
    for _ in range(3000):
        buf = bytearray(rng.choice(originals))
        for _ in range(rng.randrange(1, 4)):
            buf[rng.randrange(HEADER_SIZE, len(buf))] = rng.randrange(256)
        struct.pack_into(">I", buf, CRC_OFFSET, crc32c(bytes(buf[ATTRIBUTES_OFFSET:])))
        data = bytes(buf)
        try:
            validate(data)
        except (InvalidRecordError, CorruptRecordError):
            continue
        accepted += 1
        for header, decoded in decode_batches(data):
            assert [r.offset for r in decoded] == list(range(header.record_count))
    assert accepted  # value bytes changed: still valid batches


def test_follower_appends_are_not_walked(tmp_path: Path) -> None:
    """A follower keeps the leader's bytes (compacted batches may have offset gaps)."""
    gappy = batch(record(0) + record(2), 2, last_offset_delta=2)
    follower = Log.open(tmp_path / "f-0", small_config())
    info = follower.append_as_follower(gappy)
    assert (info.first_offset, follower.log_end_offset) == (0, 3)
    follower.close()


def test_snappy_without_a_library_is_checked_by_header_only() -> None:
    """The broker cannot read snappy without cramjam/python-snappy: such batches keep the
    header and CRC checks (as before), they are not refused."""
    if available(Compression.SNAPPY):
        pytest.skip("a snappy library is installed: snappy batches are walked like the others")
    validate(batch(b"not really snappy", 1, codec=Compression.SNAPPY))
    with pytest.raises(InvalidRecordError):
        validate(batch(b"not really snappy", 2, last_offset_delta=0, codec=Compression.SNAPPY))
