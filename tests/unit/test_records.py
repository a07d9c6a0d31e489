"""RecordBatch v2 codec: byte compatibility with kafka-python, corruption, stamping."""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from kclient import records as rec
from kclient.errors import (
    CorruptRecordError,
    IllegalStateError,
    InvalidConfigError,
    KafkaError,
    UnsupportedCodecError,
)
from kclient.records import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    HEADER_SIZE,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    PARTITION_LEADER_EPOCH_OFFSET,
    RECORDS_COUNT_OFFSET,
    TIMESTAMP_TYPE_MASK,
    BatchBuilder,
    BatchHeader,
    Compression,
    Record,
    TimestampType,
    check_batch,
    compression,
    decode_batch,
    decode_batches,
    iter_headers,
    read_header,
    stamp_batch,
)

Hdrs = list[tuple[str, bytes | None]]
Input = tuple[int, bytes | None, bytes | None, Hdrs]

CODECS = [Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD]

MIXED: list[Input] = [
    (1_700_000_000_000, b"key-1", b"value-1", []),
    (1_700_000_000_005, None, b"null key", []),
    (1_700_000_000_003, b"null value", None, []),
    (1_700_000_000_010, b"", b"", []),  # empty, not null
    (1_699_999_999_000, b"earlier", b"negative timestamp delta", []),
    (1_700_000_000_020, None, None, [("h1", b"v1"), ("null-header", None), ("empty", b"")]),
    (1_700_000_000_021, b"k", b"v", [("ключ-🔑-ü", b"unicode header key"), ("h1", b"dup")]),
    (1_700_000_000_022, b"\x00\xff" * 40, bytes(range(256)) * 40, []),  # 2- and 3-byte varints
]


def build_kclient(inputs: Sequence[Input], compression: Compression = Compression.NONE, **kwargs: int | bool) -> bytes:
    builder = BatchBuilder(compression, **kwargs)  # type: ignore[arg-type]
    for i, (ts, key, value, headers) in enumerate(inputs):
        assert builder.append(ts, key, value, headers) == i
    return builder.build()


def build_kafka_python(
    inputs: Sequence[Input],
    compression: Compression = Compression.NONE,
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    is_transactional: bool = False,
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(compression),
        is_transactional=is_transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for i, (ts, key, value, headers) in enumerate(inputs):
        assert builder.append(i, ts, key, value, headers) is not None
    return bytes(builder.build())


def recompute_crc(buf: bytearray, pos: int = 0) -> None:
    (length,) = struct.unpack_from(">i", buf, pos + LENGTH_OFFSET)
    crc = crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + length + LOG_OVERHEAD])
    struct.pack_into(">I", buf, pos + CRC_OFFSET, crc)


def set_attributes(batch: bytes, extra: int) -> bytearray:
    buf = bytearray(batch)
    (attributes,) = struct.unpack_from(">h", buf, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", buf, ATTRIBUTES_OFFSET, attributes | extra)
    recompute_crc(buf)
    return buf


def kafka_python_decode(batch: bytes) -> tuple[DefaultRecordBatch, list[Input]]:
    memory = MemoryRecords(batch)
    kbatch = memory.next_batch()
    assert memory.next_batch() is None
    assert kbatch.validate_crc()
    out = [(r.timestamp, r.key, r.value, list(r.headers)) for r in kbatch]
    return kbatch, out


def expected_records(inputs: Sequence[Input], base_offset: int = 0) -> list[Record]:
    return [
        Record(base_offset + i, ts, key, value, list(headers)) for i, (ts, key, value, headers) in enumerate(inputs)
    ]


def random_inputs(rng: random.Random, n: int) -> list[Input]:
    def maybe_bytes(max_len: int) -> bytes | None:
        if rng.random() < 0.1:
            return None
        return rng.randbytes(rng.choice([0, 1, rng.randint(0, max_len)]))

    base = rng.randint(0, 2**41)
    out: list[Input] = []
    for _ in range(n):
        ts = base + rng.choice([0, rng.randint(-100, 100), rng.randint(-(2**40), 2**40)])
        headers: Hdrs = [
            ("".join(rng.choice("aé中😀") for _ in range(rng.randint(0, 5))), maybe_bytes(20))
            for _ in range(rng.choice([0, 0, 1, 3]))
        ]
        out.append((ts, maybe_bytes(40), maybe_bytes(300), headers))
    return out


# ---------------------------------------------------------------------------
# Constants, enums, header
# ---------------------------------------------------------------------------


def test_constants() -> None:
    assert (rec.HEADER_SIZE, rec.LOG_OVERHEAD, rec.MAGIC) == (61, 12, 2)
    assert rec.NO_PRODUCER_ID == rec.NO_SEQUENCE == rec.NO_PARTITION_LEADER_EPOCH == -1
    assert DefaultRecordBatch.HEADER_STRUCT.size == HEADER_SIZE
    assert DefaultRecordBatch.HEADER_STRUCT.format == rec.HEADER.format
    assert [int(c) for c in Compression] == [0, 1, 2, 3, 4]
    assert (TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME) == (0, 1)


def test_layout_constants_are_kafkas() -> None:
    """The field offsets and attribute bits every other test (and the broker) uses by name,
    pinned to Kafka's DefaultRecordBatch: literally, and against kafka-python's."""
    offsets = (
        rec.BASE_OFFSET_OFFSET, rec.LENGTH_OFFSET, rec.PARTITION_LEADER_EPOCH_OFFSET, rec.MAGIC_OFFSET,
        rec.CRC_OFFSET, rec.ATTRIBUTES_OFFSET, rec.LAST_OFFSET_DELTA_OFFSET, rec.BASE_TIMESTAMP_OFFSET,
        rec.MAX_TIMESTAMP_OFFSET, rec.PRODUCER_ID_OFFSET, rec.PRODUCER_EPOCH_OFFSET, rec.BASE_SEQUENCE_OFFSET,
        rec.RECORDS_COUNT_OFFSET, rec.HEADER_SIZE,
    )  # fmt: skip
    assert offsets == (0, 8, 12, 16, 17, 21, 23, 27, 35, 43, 51, 53, 57, 61)
    fields = rec.HEADER.format.lstrip(">")
    assert offsets == tuple(struct.calcsize(">" + fields[:i]) for i in range(len(fields) + 1))
    assert rec.MIN_BATCH_LENGTH == 49
    masks = (
        rec.COMPRESSION_CODEC_MASK, rec.TIMESTAMP_TYPE_MASK, rec.TRANSACTIONAL_FLAG_MASK, rec.CONTROL_FLAG_MASK,
        rec.DELETE_HORIZON_FLAG_MASK,
    )  # fmt: skip
    assert masks == (0x07, 0x08, 0x10, 0x20, 0x40)
    kp = DefaultRecordBatch
    assert (kp.CRC_OFFSET, kp.ATTRIBUTES_OFFSET, kp.AFTER_LEN_OFFSET) == (rec.CRC_OFFSET, rec.ATTRIBUTES_OFFSET, 12)
    assert masks[:4] == (kp.CODEC_MASK, kp.TIMESTAMP_TYPE_MASK, kp.TRANSACTIONAL_MASK, kp.CONTROL_MASK)
    assert rec.MAX_RECORD_OVERHEAD == DefaultRecordBatchBuilder.MAX_RECORD_OVERHEAD == 21


@pytest.mark.parametrize(
    "name,codec",
    [("none", 0), ("gzip", 1), ("snappy", 2), ("lz4", 3), ("zstd", 4)],
)
def test_compression_from_name(name: str, codec: int) -> None:
    assert Compression.from_name(name) is Compression(codec)


@pytest.mark.parametrize("name", ["", "GZIP", "Zstd", "brotli", "uncompressed", "producer", " lz4"])
def test_compression_from_bad_name(name: str) -> None:
    with pytest.raises(InvalidConfigError, match="compression"):
        Compression.from_name(name)


def test_unsupported_codec_error_is_kafka_error() -> None:
    assert issubclass(UnsupportedCodecError, KafkaError)
    from kclient.errors import BrokerResponseError

    assert not issubclass(UnsupportedCodecError, BrokerResponseError)


def test_header_fields_and_properties() -> None:
    batch = build_kclient(
        MIXED[:3],
        Compression.LZ4,
        producer_id=4242,
        producer_epoch=7,
        base_sequence=100,
        is_transactional=True,
        partition_leader_epoch=9,
        base_offset=1000,
    )
    header = read_header(batch)
    assert isinstance(header, BatchHeader)
    assert header.base_offset == 1000
    assert header.batch_length == len(batch) - LOG_OVERHEAD
    assert header.size == len(batch)
    assert header.partition_leader_epoch == 9
    assert header.magic == 2
    assert header.compression is Compression.LZ4
    assert header.timestamp_type is TimestampType.CREATE_TIME
    assert header.is_transactional and not header.is_control
    assert header.last_offset_delta == 2 and header.record_count == 3
    assert (header.last_offset, header.next_offset) == (1002, 1003)
    assert header.first_timestamp == MIXED[0][0]
    assert header.max_timestamp == max(ts for ts, *_ in MIXED[:3])
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (4242, 7, 100)
    assert header.last_sequence == 102
    assert header.crc == crc32c(batch[ATTRIBUTES_OFFSET:])


def test_last_sequence_wraps() -> None:
    batch = build_kclient([(0, None, b"x", [])] * 5, producer_id=1, producer_epoch=0, base_sequence=2**31 - 2)
    header = read_header(batch)
    assert header.last_offset_delta == 4
    assert header.last_sequence == 2  # 2**31-2, 2**31-1, 0, 1, 2
    no_seq = read_header(build_kclient([(0, None, b"x", [])]))
    assert no_seq.last_sequence == rec.NO_SEQUENCE


def test_read_header_accepts_all_buffer_types() -> None:
    batch = build_kclient(MIXED)
    padded = b"\x00" * 7 + batch
    expected = read_header(batch)
    for buf in (batch, bytearray(batch), memoryview(batch)):
        assert read_header(buf) == expected
    for buf in (padded, bytearray(padded), memoryview(padded)):
        assert read_header(buf, 7) == expected


# ---------------------------------------------------------------------------
# Byte compatibility with kafka-python
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "inputs",
    [
        MIXED,
        [(0, None, None, [])],
        [(5, b"", b"", [])],
        [(-1, b"negative timestamp", b"x", [])],
        [(1000, b"k", b"v", []), (0, b"k", b"v", []), (2**45, b"k", b"v", [])],
        [(7, b"a" * 63, b"b" * 64, [("x" * 8191, b"y" * 8192)])],  # varint size boundaries
    ],
    ids=["mixed", "all-null", "empty", "negative-ts", "ts-deltas", "varint-boundaries"],
)
def test_uncompressed_bytes_identical_to_kafka_python(inputs: list[Input]) -> None:
    # kafka-python writes partitionLeaderEpoch 0; the Java producer (and our
    # default) write -1: that field lies outside the CRC.
    ours = build_kclient(inputs, partition_leader_epoch=0)
    assert ours == build_kafka_python(inputs)
    default = build_kclient(inputs)
    assert default[:PARTITION_LEADER_EPOCH_OFFSET] == ours[:PARTITION_LEADER_EPOCH_OFFSET]
    assert default[MAGIC_OFFSET:] == ours[MAGIC_OFFSET:]
    assert read_header(default).partition_leader_epoch == -1


def test_uncompressed_bytes_identical_with_producer_state() -> None:
    ours = build_kclient(
        MIXED,
        partition_leader_epoch=0,
        is_transactional=True,
        producer_id=123456789012,
        producer_epoch=3,
        base_sequence=77,
    )
    theirs = build_kafka_python(
        MIXED, is_transactional=True, producer_id=123456789012, producer_epoch=3, base_sequence=77
    )
    assert ours == theirs


def test_uncompressed_one_mib_value_identical() -> None:
    inputs: list[Input] = [(1, b"big", random.Random(1).randbytes(1 << 20), []), (2, None, b"small", [("h", None)])]
    ours = build_kclient(inputs, partition_leader_epoch=0)
    assert ours == build_kafka_python(inputs)
    _, records = decode_batch(ours)
    assert records == expected_records(inputs)


def test_many_records_identical_to_kafka_python() -> None:
    # offset deltas past the 1-, 2- and table-sized varint ranges
    inputs: list[Input] = [(1000 + i % 7, b"%d" % i, b"v" * (i % 5), []) for i in range(20_000)]
    ours = build_kclient(inputs, partition_leader_epoch=0)
    assert ours == build_kafka_python(inputs)
    _, records = decode_batch(ours)
    assert records == expected_records(inputs)


@pytest.mark.parametrize("seed", range(20))
def test_random_batches_identical_to_kafka_python(seed: int) -> None:
    rng = random.Random(seed)
    inputs = random_inputs(rng, rng.randint(1, 300))
    ours = build_kclient(inputs, partition_leader_epoch=0)
    assert ours == build_kafka_python(inputs)
    assert decode_batch(ours)[1] == expected_records(inputs)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_kclient_batches_decode_with_kafka_python(codec: Compression) -> None:
    inputs = [*MIXED, (1_700_000_000_100, None, b"1 MiB " + b"z" * (1 << 20), [])]
    batch = build_kclient(inputs, codec, producer_id=99, producer_epoch=2, base_sequence=5, is_transactional=True)
    kbatch, decoded = kafka_python_decode(batch)
    assert decoded == inputs
    assert kbatch.compression_type == codec
    assert (kbatch.producer_id, kbatch.producer_epoch, kbatch.base_sequence) == (99, 2, 5)
    assert kbatch.is_transactional and not kbatch.is_control_batch
    assert kbatch.records_count == len(inputs)
    assert kbatch.last_offset_delta == len(inputs) - 1
    assert kbatch.max_timestamp == max(ts for ts, *_ in inputs)
    assert kbatch.first_timestamp == inputs[0][0]
    if codec:
        assert len(batch) < 200_000  # really compressed
    # and offsets, once the broker stamps a base offset
    stamped = bytearray(batch)
    stamp_batch(stamped, 0, 500, 3)
    kb = next(iter(MemoryRecords(bytes(stamped))))
    assert kb.validate_crc()
    assert [r.offset for r in kb] == list(range(500, 500 + len(inputs)))
    assert kb.leader_epoch == 3


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_kafka_python_batches_decode_with_kclient(codec: Compression) -> None:
    inputs = [*MIXED, (1_700_000_000_100, b"big", b"compressible " * 80_000, [])]
    batch = build_kafka_python(inputs, codec, producer_id=7, producer_epoch=1, base_sequence=40, is_transactional=True)
    header, records = decode_batch(batch)
    assert header.compression is codec
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 1, 40)
    assert header.is_transactional
    assert header.record_count == len(inputs)
    assert records == expected_records(inputs)
    for buf in (bytearray(batch), memoryview(batch)):
        assert decode_batch(buf) == (header, records)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_roundtrip_random(codec: Compression) -> None:
    rng = random.Random(int(codec) + 100)
    inputs = random_inputs(rng, 500)
    batch = build_kclient(inputs, codec, base_offset=12345)
    header, records = decode_batch(batch)
    assert header.compression is codec
    assert records == expected_records(inputs, 12345)
    assert kafka_python_decode(batch)[1] == inputs


# ---------------------------------------------------------------------------
# Several batches, iteration, truncation
# ---------------------------------------------------------------------------


def make_log(codecs: Sequence[Compression] = tuple(CODECS)) -> tuple[bytearray, list[list[Input]]]:
    rng = random.Random(5)
    log = bytearray()
    all_inputs = []
    offset = 0
    for codec in codecs:
        inputs = random_inputs(rng, rng.randint(1, 50))
        pos = len(log)
        log += build_kclient(inputs, codec)
        stamp_batch(log, pos, offset, 1)
        offset += len(inputs)
        all_inputs.append(inputs)
    return log, all_inputs


def test_iter_headers_and_decode_batches() -> None:
    log, all_inputs = make_log()
    positions = [pos for pos, _ in iter_headers(log)]
    headers = [h for _, h in iter_headers(log)]
    assert len(positions) == len(all_inputs)
    assert positions[0] == 0
    for pos, nxt, h in zip(positions, [*positions[1:], len(log)], headers, strict=True):
        assert nxt - pos == h.size
        check_batch(log, pos, h)
    offset = 0
    for (h, records), inputs in zip(decode_batches(log), all_inputs, strict=True):
        assert h.base_offset == offset
        assert records == expected_records(inputs, offset)
        offset = h.next_offset
    # same through memoryview and bytes
    assert list(decode_batches(memoryview(log))) == list(decode_batches(bytes(log)))
    # kafka-python reads the whole log the same way
    kp = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for b in MemoryRecords(bytes(log)) for r in b]
    assert kp == [tuple(r) for _, rs in decode_batches(log) for r in rs]


def test_truncated_tail_is_ignored() -> None:
    log, _ = make_log()
    positions = [pos for pos, _ in iter_headers(log)]
    last = positions[-1]
    for cut in (len(log) - 1, last + HEADER_SIZE, last + HEADER_SIZE - 1, last + 13, last + 1):
        torn = log[:cut]
        assert [pos for pos, _ in iter_headers(torn)] == positions[:-1]
        assert len(list(decode_batches(torn))) == len(positions) - 1
    assert list(iter_headers(b"")) == []
    assert list(iter_headers(log[: HEADER_SIZE - 1])) == []


def test_read_header_rejects_short_buffer() -> None:
    batch = build_kclient(MIXED)
    with pytest.raises(CorruptRecordError, match="61 bytes needed"):
        read_header(batch[:60])
    with pytest.raises(CorruptRecordError):
        read_header(batch, len(batch) - 10)
    with pytest.raises(CorruptRecordError):
        decode_batch(batch[: HEADER_SIZE + 5])  # header complete, body cut


def test_batch_length_too_small_is_corrupt() -> None:
    log, _ = make_log(CODECS[:2])
    second = [pos for pos, _ in iter_headers(log)][1]
    struct.pack_into(">i", log, second + LENGTH_OFFSET, 10)
    with pytest.raises(CorruptRecordError, match="batchLength 10"):
        list(iter_headers(log))
    with pytest.raises(CorruptRecordError, match="batchLength"):
        check_batch(log, second, read_header(log, second))


def test_batch_past_end_of_buffer() -> None:
    batch = build_kclient(MIXED)
    cut = batch[:-1]
    with pytest.raises(CorruptRecordError, match="past the end"):
        check_batch(cut, 0, read_header(cut))
    with pytest.raises(CorruptRecordError, match="past the end"):
        decode_batch(cut, check_crc=False)


# ---------------------------------------------------------------------------
# Corruption and stamping
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_flipped_byte_fails_crc(codec: Compression) -> None:
    batch = build_kclient(MIXED, codec)
    for where in (ATTRIBUTES_OFFSET, 30, HEADER_SIZE, HEADER_SIZE + 10, len(batch) // 2, len(batch) - 1):
        buf = bytearray(batch)
        buf[where] ^= 0x01
        with pytest.raises(CorruptRecordError, match="CRC"):
            check_batch(buf, 0, read_header(buf))
        with pytest.raises(CorruptRecordError):
            decode_batch(buf)
        with pytest.raises(CorruptRecordError):
            list(decode_batches(buf))
    # the stored CRC itself
    buf = bytearray(batch)
    buf[CRC_OFFSET] ^= 0x80
    with pytest.raises(CorruptRecordError, match="CRC"):
        decode_batch(buf)


def test_flipped_value_byte_without_crc_check_decodes() -> None:
    batch = build_kclient([(1, b"k", b"hello", [])])
    buf = bytearray(batch)
    index = bytes(buf).index(b"hello")
    buf[index] = ord("j")
    assert decode_batch(buf, check_crc=False)[1][0].value == b"jello"


def test_stamp_batch_keeps_crc_valid() -> None:
    batch = build_kclient(MIXED, Compression.ZSTD)
    log = bytearray(b"\xaa" * 5) + batch
    stamp_batch(log, 5, 2**40 + 17, 12)
    header = read_header(log, 5)
    assert header.base_offset == 2**40 + 17
    assert header.partition_leader_epoch == 12
    assert header.crc == read_header(batch).crc
    check_batch(log, 5, header)
    assert log[5 + MAGIC_OFFSET :] == batch[MAGIC_OFFSET:]
    assert log[:5] == b"\xaa" * 5
    _, records = decode_batch(log, 5)
    assert [r.offset for r in records] == list(range(2**40 + 17, 2**40 + 17 + len(MIXED)))


def test_bad_magic_rejected() -> None:
    buf = bytearray(build_kclient(MIXED))
    for magic in (0, 1, 3, -1):
        buf[MAGIC_OFFSET] = magic & 0xFF
        with pytest.raises(CorruptRecordError, match="magic"):
            check_batch(buf, 0, read_header(buf))
        with pytest.raises(CorruptRecordError, match="magic"):
            decode_batch(buf, check_crc=False)


def test_unknown_codec_rejected() -> None:
    buf = set_attributes(build_kclient(MIXED), COMPRESSION_CODEC_MASK)
    with pytest.raises(CorruptRecordError, match="codec"):
        check_batch(buf, 0, read_header(buf))
    with pytest.raises(CorruptRecordError, match="codec"):
        read_header(buf).compression  # noqa: B018


def test_negative_record_count_rejected() -> None:
    buf = bytearray(build_kclient(MIXED))
    struct.pack_into(">i", buf, RECORDS_COUNT_OFFSET, -1)
    recompute_crc(buf)
    with pytest.raises(CorruptRecordError, match="record count"):
        check_batch(buf, 0, read_header(buf))


def test_inconsistent_record_structure_is_corrupt() -> None:
    batch = build_kclient([(1, b"k", b"v", []), (2, b"k2", b"v2", [])])
    # record count too high, too low
    for count in (3, 1, 100):
        buf = bytearray(batch)
        struct.pack_into(">i", buf, RECORDS_COUNT_OFFSET, count)
        recompute_crc(buf)
        with pytest.raises(CorruptRecordError):
            decode_batch(buf)
    # first record's length varint off by one (zigzag +2)
    buf = bytearray(batch)
    buf[HEADER_SIZE] += 2
    recompute_crc(buf)
    with pytest.raises(CorruptRecordError, match="declares"):
        decode_batch(buf)


@pytest.mark.parametrize("codec", CODECS[1:], ids=lambda c: c.name.lower())
def test_garbage_compressed_payload_is_corrupt(codec: Compression) -> None:
    buf = bytearray(build_kclient(MIXED))
    buf[HEADER_SIZE:] = b"this is not compressed data at all" * 3
    struct.pack_into(">i", buf, LENGTH_OFFSET, len(buf) - LOG_OVERHEAD)
    struct.pack_into(">h", buf, ATTRIBUTES_OFFSET, int(codec))
    recompute_crc(buf)
    with pytest.raises(CorruptRecordError, match=r"decompress|truncated"):
        decode_batch(buf)


# ---------------------------------------------------------------------------
# Control batches, log append time
# ---------------------------------------------------------------------------


def test_control_batch_decodes() -> None:
    # a COMMIT marker: key = version int16 0, type int16 1; value = version, coordinator epoch
    marker = build_kclient(
        [(1234, struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 5), [])],
        producer_id=10,
        producer_epoch=0,
        base_sequence=-1,
        is_transactional=True,
    )
    buf = set_attributes(marker, CONTROL_FLAG_MASK)
    header, records = decode_batch(buf)
    assert header.is_control and header.is_transactional
    assert records == [Record(0, 1234, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05", [])]
    kbatch = next(iter(MemoryRecords(bytes(buf))))
    assert kbatch.is_control_batch
    (control,) = list(kbatch)
    assert control.commit


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.LZ4], ids=["none", "lz4"])
def test_log_append_time(codec: Compression) -> None:
    batch = set_attributes(build_kclient(MIXED, codec), TIMESTAMP_TYPE_MASK)
    struct.pack_into(">q", batch, MAX_TIMESTAMP_OFFSET, 1_800_000_000_000)
    recompute_crc(batch)
    header, records = decode_batch(batch)
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert {r.timestamp for r in records} == {1_800_000_000_000}
    assert [r.value for r in records] == [value for _, _, value, _ in MIXED]
    kbatch = next(iter(MemoryRecords(bytes(batch))))
    assert [r.timestamp for r in kbatch] == [r.timestamp for r in records]


# ---------------------------------------------------------------------------
# BatchBuilder behaviour
# ---------------------------------------------------------------------------


def test_builder_empty_build_raises() -> None:
    with pytest.raises(IllegalStateError):
        BatchBuilder().build()
    with pytest.raises(IllegalStateError):
        BatchBuilder(Compression.GZIP).build()


def test_builder_build_once() -> None:
    builder = BatchBuilder(Compression.GZIP)
    builder.append(1, b"k", b"v")
    first = builder.build()
    assert builder.build() is first
    assert builder.record_count == 1
    assert builder.estimated_size() == len(first)
    with pytest.raises(IllegalStateError):
        builder.append(2, b"k", b"v")


def test_builder_estimated_size_is_exact_uncompressed() -> None:
    builder = BatchBuilder()
    assert builder.estimated_size() == HEADER_SIZE
    assert builder.record_count == 0
    for i, (ts, key, value, headers) in enumerate(MIXED):
        assert builder.append(ts, key, value, headers) == i
        assert builder.record_count == i + 1
    size = builder.estimated_size()
    assert size == len(builder.build())
    # compressed builders estimate the uncompressed size
    zbuilder = BatchBuilder(Compression.ZSTD)
    for ts, key, value, headers in MIXED:
        zbuilder.append(ts, key, value, headers)
    assert zbuilder.estimated_size() == size


def test_builder_accepts_bytes_like_and_int_codec() -> None:
    builder = BatchBuilder(Compression(3))
    headers: list[tuple[str, bytes | None]] = [("h", bytearray(b"hv"))]  # type: ignore[list-item]
    builder.append(1, bytearray(b"key"), memoryview(b"value"), headers)  # type: ignore[arg-type]
    _, records = decode_batch(builder.build())
    assert records == [Record(0, 1, b"key", b"value", [("h", b"hv")])]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"is_transactional": True},  # no producer id
        {"producer_epoch": 2**15},
        {"base_sequence": 2**31},
        {"partition_leader_epoch": -(2**31) - 1},
        {"base_offset": 2**63},
    ],
)
def test_builder_rejects_bad_arguments(kwargs: dict[str, int | bool]) -> None:
    with pytest.raises(InvalidConfigError):
        BatchBuilder(**kwargs)  # type: ignore[arg-type]


def test_builder_rejects_unknown_codec() -> None:
    with pytest.raises(InvalidConfigError):
        BatchBuilder(7)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError):
        BatchBuilder("gzip")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Snappy (optional library)
# ---------------------------------------------------------------------------


def test_snappy_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compression, "_snappy_compress_raw", None)
    monkeypatch.setattr(compression, "_snappy_decompress_raw", None)
    with pytest.raises(UnsupportedCodecError, match="snappy"):
        BatchBuilder(Compression.SNAPPY)
    buf = bytearray(build_kclient(MIXED))
    struct.pack_into(">h", buf, ATTRIBUTES_OFFSET, int(Compression.SNAPPY))
    recompute_crc(buf)
    check_batch(buf, 0, read_header(buf))  # the broker can still store it
    with pytest.raises(UnsupportedCodecError, match="snappy"):
        decode_batch(buf)


def test_snappy_xerial_framing(monkeypatch: pytest.MonkeyPatch) -> None:
    # a stand-in raw codec (reversal) to test the framing without a snappy library
    monkeypatch.setattr(compression, "_snappy_compress_raw", lambda data: bytes(data)[::-1])
    monkeypatch.setattr(compression, "_snappy_decompress_raw", lambda data: bytes(data)[::-1])
    inputs: list[Input] = [(i, b"k", b"x" * 1000, []) for i in range(100)]  # > one 32 KiB block
    batch = build_kclient(inputs, Compression.SNAPPY)
    assert batch[HEADER_SIZE : HEADER_SIZE + 16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    header, records = decode_batch(batch)
    assert header.compression is Compression.SNAPPY
    assert records == expected_records(inputs)
    # a plain (unframed) snappy block decodes too
    raw = build_kclient(inputs)
    buf = bytearray(raw[:HEADER_SIZE]) + raw[HEADER_SIZE:][::-1]
    struct.pack_into(">h", buf, ATTRIBUTES_OFFSET, int(Compression.SNAPPY))
    recompute_crc(buf)
    assert decode_batch(buf)[1] == records
