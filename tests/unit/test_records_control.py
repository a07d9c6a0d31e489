"""Transaction markers: build_control_batch writes a control batch that reads back field for field."""

from __future__ import annotations

import struct

import pytest

from kclient.errors import CorruptRecordError, InvalidConfigError
from kclient.records import (
    CONTROL_FLAG_MASK,
    CONTROL_TYPE_ABORT,
    CONTROL_TYPE_COMMIT,
    NO_SEQUENCE,
    TRANSACTIONAL_FLAG_MASK,
    Compression,
    ControlRecord,
    build_control_batch,
    check_batch,
    control_type,
    decode_batch,
    decode_columns,
    decode_consumer_records,
    encode_batch,
    read_control_record,
    read_header,
    stamp_batch,
)


@pytest.mark.parametrize("commit", [True, False])
def test_control_batch_decodes_back(commit: bool) -> None:
    batch = build_control_batch(42, 7, commit, 13, base_offset=100, timestamp_ms=1_700_000_000_123)
    header = read_header(batch)
    check_batch(batch, 0, header)  # CRC and shape
    assert header.magic == 2
    assert header.attributes == CONTROL_FLAG_MASK | TRANSACTIONAL_FLAG_MASK
    assert header.is_control and header.is_transactional
    assert header.compression is Compression.NONE
    assert (header.base_offset, header.last_offset_delta, header.record_count) == (100, 0, 1)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 7, NO_SEQUENCE)
    assert header.first_timestamp == header.max_timestamp == 1_700_000_000_123
    assert header.size == len(batch)
    _, records = decode_batch(batch)
    [record] = records
    kind = CONTROL_TYPE_COMMIT if commit else CONTROL_TYPE_ABORT
    assert record.offset == 100
    assert record.timestamp == 1_700_000_000_123
    assert record.key == struct.pack(">hh", 0, kind)
    assert record.value == struct.pack(">hi", 0, 13)
    assert record.headers == []
    assert control_type(batch) == kind
    assert read_control_record(batch) == ControlRecord(0, kind, 0, 13)


def test_control_batch_size_is_kafkas() -> None:
    # Kafka's EndTransactionMarker batch: 61-byte header, one record of key 4 and value 6 bytes.
    assert len(build_control_batch(1, 0, True, 0, timestamp_ms=0)) == 61 + 1 + 16


def test_control_batch_is_stamped_like_any_batch() -> None:
    buf = bytearray(build_control_batch(5, 1, False, 2, timestamp_ms=10))
    stamp_batch(buf, 0, 9_000, 4)
    header = read_header(buf)
    check_batch(buf, 0, header)  # baseOffset and leader epoch are outside the CRC
    assert (header.base_offset, header.partition_leader_epoch) == (9_000, 4)
    assert control_type(buf) == CONTROL_TYPE_ABORT


def test_control_batch_at_a_position_in_a_buffer() -> None:
    data = encode_batch([b"a", b"b"], base_timestamp=5, producer_id=5, is_transactional=True)
    marker = build_control_batch(5, 0, True, 3, base_offset=2, timestamp_ms=6)
    buf = data + marker
    assert control_type(buf, len(data)) == CONTROL_TYPE_COMMIT
    assert read_control_record(buf, len(data)).coordinator_epoch == 3


def test_control_batches_are_never_consumer_records() -> None:
    data = encode_batch([b"x"], base_timestamp=1, producer_id=5, is_transactional=True)
    buf = data + build_control_batch(5, 0, True, 0, base_offset=1, timestamp_ms=1)
    assert [r.value for r in decode_consumer_records(buf, "t", 0)] == [b"x"]
    assert decode_columns(buf).offsets == [0]


def test_timestamp_defaults_to_now() -> None:
    import time

    before = int(time.time() * 1000)
    header = read_header(build_control_batch(1, 0, True, 0))
    assert before <= header.max_timestamp <= int(time.time() * 1000)


@pytest.mark.parametrize(
    ("kwargs", "what"),
    [
        ({"producer_id": -1}, "producer id"),
        ({"producer_epoch": 1 << 15}, "out of range"),
        ({"coordinator_epoch": 1 << 31}, "out of range"),
    ],
)
def test_bad_fields_are_refused(kwargs: dict[str, int], what: str) -> None:
    args = {"producer_id": 1, "producer_epoch": 0, "commit": True, "coordinator_epoch": 0} | kwargs
    with pytest.raises(InvalidConfigError, match=what):
        build_control_batch(**args)  # type: ignore[arg-type]


def test_control_type_of_a_data_batch_raises() -> None:
    with pytest.raises(CorruptRecordError, match="not a control batch"):
        control_type(encode_batch([b"v"], producer_id=1, is_transactional=True))


def test_control_type_of_a_short_key_raises() -> None:
    # A control batch whose record key is 2 bytes: not a ControlRecordType.
    data = bytearray(encode_batch([b"v"], [b"\x00\x00"], base_timestamp=0, producer_id=1, is_transactional=True))
    data[22] |= CONTROL_FLAG_MASK  # attributes low byte; the CRC is not checked here
    with pytest.raises(CorruptRecordError, match="control key of 2 bytes"):
        control_type(data)
