"""The Kafka door's codec: kio entities built from plain values for every version, and the
length guard that keeps a mutated length prefix from aborting the broker inside kio."""

from __future__ import annotations

import dataclasses
import datetime
import io
import subprocess
import sys
import typing
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.index import api_key_map
from kio.schema.request_header.v2.header import RequestHeader
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from kbroker.doors.kafka import length_guard
from kbroker.doors.kafka.codec import (
    _unwrap_optional,
    build,
    encode_response,
    read_header,
    read_request,
)


def _sample(cls: type[Any], depth: int = 0) -> Any:
    """An entity with every field set: two elements in arrays, short strings and bytes."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        t, _ = _unwrap_optional(hints[f.name])
        values[f.name] = _value(t, f.metadata.get("kafka_type"), depth)
    return cls(**values)


def _value(t: Any, kafka_type: str | None, depth: int) -> Any:
    if typing.get_origin(t) is tuple:
        inner = typing.get_args(t)[0]
        return tuple(_value(inner, kafka_type, depth + 1) for _ in range(2 if depth < 3 else 0))
    if dataclasses.is_dataclass(t):
        return _sample(t, depth + 1)  # type: ignore[arg-type]
    if kafka_type in ("string",):
        return "ab"
    if kafka_type in ("bytes", "records"):
        return b"xyz"
    if kafka_type == "uuid":
        return uuid.uuid4()
    if kafka_type == "bool":
        return True
    if kafka_type == "error_code":
        from kio.schema.errors import ErrorCode

        return ErrorCode.none
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=5)
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(1_700_000_000, datetime.UTC)
    if kafka_type == "float64":
        return 1.5
    return 1


def _request_schemas() -> list[tuple[int, int]]:
    out = []
    for key in sorted(api_key_map):
        for version in range(0, 20):
            try:
                load_request_schema(key, version)
            except Exception:
                continue
            out.append((key, version))
    return out


@pytest.mark.parametrize(("key", "version"), _request_schemas())
def test_the_length_guard_walks_every_request_schema_as_kio_reads_it(key: int, version: int) -> None:
    schema = load_request_schema(key, version)
    buf = io.BytesIO()
    entity_writer(schema)(buf, _sample(schema))
    data = buf.getvalue()
    assert length_guard.check(schema, data, 0) == len(data)
    _, size = entity_reader(schema)(data, 0)
    assert size == len(data)


def test_a_request_frame_round_trips_through_the_header_and_payload_readers() -> None:
    schema = load_request_schema(3, 12)
    buf = io.BytesIO()
    header = RequestHeader(request_api_key=i16(3), request_api_version=i16(12), correlation_id=i32(77), client_id="me")
    entity_writer(RequestHeader)(buf, header)  # type: ignore[arg-type]
    entity_writer(schema)(buf, build(schema, {"topics": [{"name": "t", "topic_id": uuid.UUID(int=0)}]}))
    frame = buf.getvalue()
    h, start = read_header(frame)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (3, 12, 77, "me")
    request = read_request(3, 12, frame, start)
    assert [t.name for t in request.topics] == ["t"]
    # Trailing bytes are ignored, as Kafka does (librdkafka 2.16 sends three after
    # Metadata v12 for every topic).
    assert [t.name for t in read_request(3, 12, frame + b"\x01\x00\x00", start).topics] == ["t"]


def test_huge_length_prefixes_are_refused_before_kio_reads_them() -> None:
    # A ListOffsets v7 frame whose topics array claims ~3.5 billion elements made kio's
    # native reader abort the process. Run it in a child: an abort must not kill pytest.
    frame = bytes.fromhex(
        "000200070000000900097769"
        "72652d74657374002fea96b5fecbf5e08d0de5e2165ab7ffffffff00020566757a7a"
        "0200000000ffffffffffffffffffffffff000000"
    )
    code = (
        "from kbroker.doors.kafka.codec import read_header, read_request, MalformedRequest\n"
        f"frame = bytes.fromhex({frame.hex()!r})\n"
        "h, start = read_header(frame)\n"
        "try:\n"
        "    read_request(h.api_key, h.api_version, frame, start)\n"
        "except MalformedRequest as exc:\n"
        "    print('refused:', exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout and "elements" in proc.stdout


@pytest.mark.parametrize("key", [0, 1, 2, 3, 18, 22, 23, 60])
def test_build_fills_every_version_of_a_response_from_plain_values(key: int) -> None:
    for version in range(0, 17):
        try:
            cls = load_response_schema(key, version)
        except Exception:
            continue
        response = build(cls, {"error_code": 35, "throttle_time": 0, "unknown_field": 1})
        frame = encode_response(9, response)
        assert int.from_bytes(frame[0:4], "big") == len(frame) - 4
        assert int.from_bytes(frame[4:8], "big") == 9
        start = 8 + (1 if cls.__flexible__ and key != 18 else 0)
        decoded, _ = entity_reader(cls)(frame, start)
        if hasattr(decoded, "error_code"):
            assert int(decoded.error_code) == 35


def test_build_converts_nested_plain_values_and_keeps_schema_defaults() -> None:
    cls = load_response_schema(1, 12)
    response = build(
        cls,
        {
            "session_id": 0,
            "responses": [{"topic": "t", "partitions": [{"partition_index": 3, "error_code": 1, "high_watermark": 9}]}],
        },
    )
    p = response.responses[0].partitions[0]
    assert (int(p.partition_index), int(p.error_code), int(p.high_watermark)) == (3, 1, 9)
    assert int(p.preferred_read_replica) == -1 and int(p.last_stable_offset) == -1  # the schema's defaults
    assert response.throttle_time == datetime.timedelta(0)
    produce = build(
        load_response_schema(0, 9), {"responses": [{"name": "t", "partition_responses": [{"log_append_time": -1}]}]}
    )
    assert produce.responses[0].partition_responses[0].log_append_time is None


def test_every_known_response_schema_builds_an_unsupported_version_answer() -> None:
    from kbroker.doors.kafka.apis import ApiTable
    from kbroker.doors.kafka.codec import Header

    table = ApiTable([])
    for key in sorted(api_key_map):
        for version in range(0, 20):
            frame = table.unsupported(Header(key, version, 5, None))
            assert int.from_bytes(frame[4:8], "big") == 5
    bare = table.unsupported(Header(999, 0, 6, None))
    assert bare == (6).to_bytes(4, "big") + b"\x00\x00\x00\x06" + (35).to_bytes(2, "big")
