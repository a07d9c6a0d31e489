"""A bounds check of a request payload's length prefixes before kio decodes it.

kio's native reader sizes an array from its length prefix before reading the elements;
a mutated prefix of a few billion makes that allocation fail, and a failed allocation in
Rust aborts the whole process. So a frame is walked first, with kio's own field
classification (:mod:`kio.serial._introspect`), reading only lengths: every array,
string and bytes length must fit in the bytes left (an array element takes at least one
byte). Only lengths are read, so the walk costs microseconds per request; record batches
are skipped by their size.

A frame that fails the check is malformed (its connection is closed). The walk accepts
every well-formed frame: a test compares it with kio's own reading.

Thread safety: pure functions over cached, immutable plans.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

_FIXED = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}


class LengthError(Exception):
    """A length prefix that reaches past the frame."""


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise LengthError("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _int(buf: bytes, pos: int, size: int) -> tuple[int, int]:
    if pos + size > len(buf):
        raise LengthError("truncated")
    return int.from_bytes(buf[pos : pos + size], "big", signed=True), pos + size


@dataclasses.dataclass(frozen=True, slots=True)
class _Step:
    kind: str  # "fixed", "string", "bytes", "entity", "array_fixed", "array_string", "array_bytes", "array_entity"
    size: int = 0
    entity: type[Any] | None = None


def _sized_kind(kafka_type: str) -> str:
    return "string" if kafka_type == "string" else "bytes"  # bytes and records


@cache
def _plan(cls: type[Any]) -> tuple[tuple[_Step, ...], bool]:
    steps = []
    for f in dataclasses.fields(cls):
        if get_field_tag(f) is not None and cls.__flexible__:
            continue  # tagged fields live in the tag section, skipped by size
        kind = classify_field(f)
        match kind:
            case PrimitiveField():
                t = get_schema_field_type(f)
                steps.append(_Step("fixed", _FIXED[t]) if t in _FIXED else _Step(_sized_kind(t)))
            case PrimitiveTupleField():
                t = get_schema_field_type(f)
                steps.append(_Step("array_fixed", _FIXED[t]) if t in _FIXED else _Step("array_" + _sized_kind(t)))
            case EntityTupleField(entity):
                steps.append(_Step("array_entity", entity=entity))
            case EntityField(entity):
                steps.append(_Step("nullable_entity" if is_optional(f) else "entity", entity=entity))
    return tuple(steps), bool(cls.__flexible__)


def check(cls: type[Any], buf: bytes, pos: int) -> int:
    """Walk one ``cls`` entity at ``buf[pos:]``; the position after it."""
    steps, flexible = _plan(cls)  # type: ignore[arg-type]
    for step in steps:
        if step.kind == "fixed":
            pos += step.size
        elif step.kind in ("string", "bytes"):
            pos = _skip_sized(buf, pos, flexible, step.kind == "string")
        elif step.kind == "entity":
            assert step.entity is not None
            pos = check(step.entity, buf, pos)
        elif step.kind == "nullable_entity":  # KIP-893: an int8 marker, -1 = null
            assert step.entity is not None
            marker, pos = _int(buf, pos, 1)
            if marker >= 0:
                pos = check(step.entity, buf, pos)
        else:
            n, pos = _array_length(buf, pos, flexible)
            if step.kind == "array_fixed":
                pos += n * step.size
            elif step.kind in ("array_string", "array_bytes"):
                for _ in range(n):
                    pos = _skip_sized(buf, pos, flexible, step.kind == "array_string")
            else:
                assert step.entity is not None
                for _ in range(n):
                    pos = check(step.entity, buf, pos)
        if pos > len(buf):
            raise LengthError(f"{cls.__name__} reaches past the frame")
    return _skip_tags(buf, pos) if flexible else pos


def check_header(buf: bytes, flexible: bool) -> int:
    """Walk a request header (v1, or v2 with ``flexible``); the payload's start. Its
    ``client_id`` is a legacy string in both (Kafka special-cases it)."""
    pos = _skip_sized(buf, 8, flexible=False, string=True)
    return _skip_tags(buf, pos) if flexible else pos


def _skip_tags(buf: bytes, pos: int) -> int:
    count, pos = _uvarint(buf, pos)
    if count > len(buf) - pos:
        raise LengthError("tagged-field count past the frame")
    for _ in range(count):
        _, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise LengthError("tagged field past the frame")
    return pos


def _array_length(buf: bytes, pos: int, flexible: bool) -> tuple[int, int]:
    if flexible:
        n, pos = _uvarint(buf, pos)
        n -= 1  # 0 = null
    else:
        n, pos = _int(buf, pos, 4)
    if n > len(buf) - pos:
        raise LengthError(f"an array of {n} elements in {len(buf) - pos} bytes")
    return max(n, 0), pos


def _skip_sized(buf: bytes, pos: int, flexible: bool, string: bool) -> int:
    """Skip a compact (flexible) or legacy (int16 string, int32 bytes) value; -1 is null."""
    if flexible:
        n, pos = _uvarint(buf, pos)
        n -= 1
    else:
        n, pos = _int(buf, pos, 2 if string else 4)
    if n > len(buf) - pos:
        raise LengthError(f"{n} bytes announced, {len(buf) - pos} left")
    return pos + max(n, 0)
