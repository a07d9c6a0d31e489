"""A leader stamps offsets, epochs and LogAppendTime on copies of the batch headers: the
producer's request is never copied whole nor changed, and what is stored decodes with
valid CRCs."""

from __future__ import annotations

from pathlib import Path

from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient.records import BatchBuilder, TimestampType, decode_batches


def request(n_batches: int = 3) -> bytearray:
    out = bytearray()
    for b in range(n_batches):
        builder = BatchBuilder()
        for i in range(4):
            builder.append(1000 + i, None, f"{b}-{i}".encode())
        out += builder.build()
    return out


def test_the_request_is_left_untouched_and_the_log_holds_stamped_batches(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig())
    log.append_as_leader(request(1), 3)
    data = request()
    original = bytes(data)
    info = log.append_as_leader(data, 5)
    assert data == original
    assert (info.first_offset, info.last_offset) == (4, 15)
    batches = list(decode_batches(log.read(4, 1 << 20).records))  # CRCs checked
    assert [h.base_offset for h, _ in batches] == [4, 8, 12]
    assert {h.partition_leader_epoch for h, _ in batches} == {5}
    assert [r.value for _, recs in batches for r in recs] == [f"{b}-{i}".encode() for b in range(3) for i in range(4)]


def test_log_append_time_is_stamped_with_a_valid_crc(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig.from_properties({"message.timestamp.type": "LogAppendTime"}))
    info = log.append_as_leader(request(), 0, now_ms=1_700_000_000_000)
    assert info.log_append_time == 1_700_000_000_000
    batches = list(decode_batches(log.read(0, 1 << 20).records))  # CRCs checked
    assert all(h.max_timestamp == 1_700_000_000_000 for h, _ in batches)
    assert all(h.timestamp_type == TimestampType.LOG_APPEND_TIME for h, _ in batches)
