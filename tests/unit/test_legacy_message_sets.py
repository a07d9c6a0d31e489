"""Message sets of magic 0 and 1 (Produce v0-2) up-converted to one v2 RecordBatch, as
Kafka 2.8's LogValidator does, and the errors Kafka gives for the ones it refuses."""

from __future__ import annotations

import pytest

from kbroker.doors.kafka import legacy_produce
from kbroker.doors.kafka.codec import build, encode_response, read_request, response_class
from kbroker.doors.kafka.legacy_produce import upconvert
from kclient.errors import CorruptRecordError, InvalidRecordError, MessageSizeTooLargeError
from kclient.records import Compression, compress, decode_batches, encode_batch
from tests.legacy_messages import compressed, message, message_set

RECORDS = [(b"k0", b"v0"), (None, b"v1"), (b"k2", None)]


def _decoded(batch: bytes) -> list[tuple[bytes | None, bytes | None, int]]:
    return [(r.key, r.value, r.timestamp) for _, records in decode_batches(batch) for r in records]


def test_magic_0_records_get_no_timestamp() -> None:
    out = upconvert(message_set(RECORDS))
    assert _decoded(out) == [(k, v, -1) for k, v in RECORDS]


def test_magic_1_records_keep_their_timestamps() -> None:
    out = upconvert(message_set(RECORDS, magic=1, timestamp=1_700_000_000_123))
    assert _decoded(out) == [(k, v, 1_700_000_000_123) for k, v in RECORDS]


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4])
def test_a_compressed_wrapper_becomes_a_batch_of_the_same_codec(codec: Compression) -> None:
    out = upconvert(compressed(message_set(RECORDS, magic=1, timestamp=5), codec, magic=1, timestamp=5))
    [(header, _)] = list(decode_batches(out))
    assert header.compression == codec
    assert _decoded(out) == [(k, v, 5) for k, v in RECORDS]


def test_a_v2_batch_passes_unchanged() -> None:
    batch = encode_batch([b"x"], keys=[b"k"])
    assert upconvert(batch) == batch
    assert upconvert(b"") == b""


def test_a_crc_mismatch_is_corrupt_message() -> None:
    bad = bytearray(message_set(RECORDS))
    bad[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        upconvert(bytes(bad))


def test_a_set_cut_short_is_corrupt_message() -> None:
    with pytest.raises(CorruptRecordError):
        upconvert(message_set(RECORDS)[:-3])


def test_nested_compression_is_invalid_record() -> None:
    inner = compressed(message_set(RECORDS), Compression.GZIP)
    with pytest.raises(InvalidRecordError, match="inside a compressed"):
        upconvert(compressed(inner, Compression.GZIP))


def test_zstd_needs_magic_2() -> None:
    wrapper = message(None, b"\x28\xb5\x2f\xfd", attributes=int(Compression.ZSTD))
    with pytest.raises(InvalidRecordError, match="codec id 4"):
        upconvert(wrapper)


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4])
def test_a_wrapper_that_inflates_too_far_is_message_too_large(
    codec: Compression, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small wrapper must not make the broker hold gigabytes: inflation stops at the
    bound (here lowered to 64 KiB; a 1 MiB value of zeros compresses to almost nothing)."""
    monkeypatch.setattr(legacy_produce, "MAX_INFLATED_BYTES", 64 * 1024)
    bomb = compressed(message_set([(None, bytes(1024 * 1024))]), codec)
    assert len(bomb) < 64 * 1024
    with pytest.raises(MessageSizeTooLargeError, match="inflate past"):
        upconvert(bomb)
    fits = compressed(message_set([(None, bytes(1024))] * 3), codec)
    assert len(_decoded(upconvert(fits))) == 3


def _kafka_0_8_lz4(inner: bytes) -> bytes:
    """An LZ4 frame with Kafka 0.8's header checksum (over the magic too), as librdkafka
    writes it for a MsgVersion 0 producer."""
    frame = bytearray(compress(Compression.LZ4, inner))
    end = 6 + (8 if frame[4] & 0x08 else 0)
    frame[end] = (legacy_produce._xxh32(bytes(frame[:end])) >> 8) & 0xFF
    return bytes(frame)


def test_a_magic_0_lz4_wrapper_with_kafka_0_8_framing_is_read() -> None:
    inner = message_set(RECORDS)
    wrapper = message(None, _kafka_0_8_lz4(inner), attributes=int(Compression.LZ4))
    assert _decoded(upconvert(wrapper)) == [(k, v, -1) for k, v in RECORDS]
    # magic 1 must carry the right checksum, as Kafka requires
    wrapper_v1 = message(None, _kafka_0_8_lz4(message_set(RECORDS, magic=1)), magic=1, attributes=int(Compression.LZ4))
    with pytest.raises(CorruptRecordError, match="lz4"):
        upconvert(wrapper_v1)


def test_a_wrapper_that_does_not_decompress_is_corrupt_message() -> None:
    with pytest.raises(CorruptRecordError, match="gzip"):
        upconvert(message(None, b"not gzip at all", attributes=int(Compression.GZIP)))


@pytest.mark.parametrize("version", [0, 1, 2])
def test_produce_v0_to_v2_request_and_response_shapes(version: int) -> None:
    """The request reads with the door's codec; the response has exactly the version's
    fields: v0 none after base_offset, v1 throttle_time, v2 also log_append_time."""
    body = (
        (1).to_bytes(2, "big")  # acks
        + (5000).to_bytes(4, "big")  # timeout
        + (1).to_bytes(4, "big")
        + (1).to_bytes(2, "big")
        + b"t"
        + (1).to_bytes(4, "big")
        + (0).to_bytes(4, "big")
        + (3).to_bytes(4, "big")
        + b"abc"
    )
    req = read_request(0, version, body, 0)
    assert req.acks == 1 and req.topic_data[0].name == "t" and req.topic_data[0].partition_data[0].records == b"abc"
    resp = build(
        response_class(0, version),
        {
            "responses": [
                {
                    "name": "t",
                    "partition_responses": [
                        {"index": 0, "error_code": 2, "base_offset": -1, "log_append_time": -1, "log_start_offset": 7}
                    ],
                }
            ]
        },
    )
    frame = encode_response(9, resp)
    # size, correlation id, topic array (1), "t", partition array (1), index, error, base offset
    expected = (
        (9).to_bytes(4, "big")
        + (1).to_bytes(4, "big")
        + (1).to_bytes(2, "big")
        + b"t"
        + (1).to_bytes(4, "big")
        + (0).to_bytes(4, "big")
        + (2).to_bytes(2, "big")
        + (-1).to_bytes(8, "big", signed=True)
    )
    if version == 2:
        expected += (-1).to_bytes(8, "big", signed=True)  # log_append_time
    if version >= 1:
        expected += (0).to_bytes(4, "big")  # throttle_time_ms
    assert frame == len(expected).to_bytes(4, "big") + expected
