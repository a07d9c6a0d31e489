"""Kafka's binary request/response encoding, through ``kio`` (schemas generated from
Kafka's own JSON message definitions): request headers v1/v2, payloads of any version,
and :func:`build`, which makes a response entity of one exact version from plain values.

A frame is ``int32 size`` + ``size`` bytes; a request frame is a header then the
payload. The header version follows the request's: v2 (tagged fields) for a flexible
request version, else v1. A response header is v1 for a flexible response, else v0,
except ApiVersions, whose response header is always v0 (a client reads it before it
knows which versions the broker speaks).

:func:`build` takes a kio response class and a mapping of field name -> value (nested
entities as mappings or sequences of mappings, plain ``int`` for error codes, int
milliseconds for durations) and fills every field of that version: values for fields the
version lacks are dropped, missing ones take the schema default or the type's zero.
So one translation serves every version of an API.

Thread safety: pure functions; the per-class field plans are cached (immutable).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import io
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from functools import cache
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32Timedelta, i64Timedelta

from kbroker.doors.kafka.legacy_produce import REQUEST_SCHEMAS as LEGACY_REQUESTS
from kbroker.doors.kafka.legacy_produce import RESPONSE_SCHEMAS as LEGACY_RESPONSES
from kbroker.doors.kafka.length_guard import LengthError, check_header
from kbroker.doors.kafka.length_guard import check as check_lengths

API_VERSIONS_KEY = 18


class MalformedRequest(Exception):
    """A frame that cannot be read as a Kafka request: its connection is closed."""


@dataclass(frozen=True, slots=True)
class Header:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def read_header(frame: bytes) -> tuple[Header, int]:
    """The request header of ``frame`` and the payload's start. The first four bytes
    (api key, version) decide the header version; an unknown API or version is read as
    header v1 (its payload is never decoded)."""
    if len(frame) < 8:
        raise MalformedRequest(f"a request frame of {len(frame)} bytes has no header")
    key = int.from_bytes(frame[0:2], "big", signed=True)
    version = int.from_bytes(frame[2:4], "big", signed=True)
    schema = RequestHeaderV2 if request_is_flexible(key, version) else RequestHeaderV1
    try:
        check_header(frame, schema is RequestHeaderV2)
    except LengthError as exc:
        raise MalformedRequest(f"unreadable request header: {exc}") from exc
    try:
        h, size = entity_reader(schema)(frame, 0)
    except Exception as exc:
        raise MalformedRequest(f"unreadable request header: {exc}") from exc
    head: Any = h
    return Header(
        int(head.request_api_key), int(head.request_api_version), int(head.correlation_id), head.client_id
    ), size


def request_schema(api_key: int, version: int) -> type[Any]:
    """The kio request class of ``api_key`` ``version``: kio's own, or one of
    :mod:`~kbroker.doors.kafka.legacy_produce` for the versions Kafka 4 dropped (Produce
    v0-2). Raises kio's UnknownAPIKey / UnknownEntity."""
    legacy = LEGACY_REQUESTS.get((api_key, version))
    return legacy if legacy is not None else load_request_schema(api_key, version)


def request_is_flexible(api_key: int, version: int) -> bool:
    try:
        return bool(request_schema(api_key, version).__flexible__)
    except (UnknownAPIKey, UnknownEntity):
        # ApiVersions above the newest kio knows: flexible from v3 on, as Kafka reads it.
        return api_key == API_VERSIONS_KEY and version >= 3


def read_request(api_key: int, version: int, frame: bytes, start: int) -> Any:
    """The request payload at ``frame[start:]`` (a kio dataclass of that version)."""
    try:
        schema = request_schema(api_key, version)
    except (UnknownAPIKey, UnknownEntity) as exc:
        raise MalformedRequest(f"no schema for API {api_key} v{version}") from exc
    try:
        check_lengths(schema, frame, start)  # before kio sizes anything from the frame
    except LengthError as exc:
        raise MalformedRequest(f"{schema.__name__} v{version}: {exc}") from exc
    try:
        payload, _ = entity_reader(schema)(frame, start)
    except Exception as exc:
        raise MalformedRequest(f"unreadable {schema.__name__} v{version}: {exc}") from exc
    # Bytes after the payload are ignored, as Kafka's parsers do (librdkafka 2.x sends a
    # few after some requests).
    return payload


def response_class(api_key: int, version: int) -> type[Any]:
    """The kio response class of ``api_key`` ``version`` (kio's, or a legacy one as for
    :func:`request_schema`)."""
    legacy = LEGACY_RESPONSES.get((api_key, version))
    return legacy if legacy is not None else load_response_schema(api_key, version)


def encode_response(correlation_id: int, response: Any) -> bytes:
    """The whole response frame (size prefix, header, payload)."""
    flexible = response.__flexible__ and response.__api_key__ != API_VERSIONS_KEY
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    if flexible:
        entity_writer(ResponseHeaderV1)(buf, ResponseHeaderV1(correlation_id=correlation_id))  # type: ignore[arg-type]
    else:
        entity_writer(ResponseHeaderV0)(buf, ResponseHeaderV0(correlation_id=correlation_id))  # type: ignore[arg-type]
    entity_writer(type(response))(buf, response)
    out = buf.getbuffer()
    out[0:4] = (len(out) - 4).to_bytes(4, "big")
    return bytes(out)


# --- build: plain values -> a kio entity of one version -----------------------------

Coerce = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    coerce: Coerce
    default: Callable[[], Any]


def _is_entity(t: Any) -> bool:
    return isinstance(t, type) and hasattr(t, "__dataclass_fields__")


def _zero(t: Any, nullable: bool) -> Callable[[], Any]:
    if nullable:
        return lambda: None
    if _is_entity(t):
        return lambda: build(t, {})
    origin = typing.get_origin(t)
    if origin is tuple:
        return tuple
    if isinstance(t, type):
        if issubclass(t, ErrorCode):
            return lambda: ErrorCode.none
        if issubclass(t, bool):
            return lambda: False
        if issubclass(t, (i32Timedelta, i64Timedelta)):
            return lambda: datetime.timedelta(0)
        if issubclass(t, bytes):
            return bytes
        if issubclass(t, str):
            return str
        if issubclass(t, int):
            return int
        if issubclass(t, uuid.UUID):
            return lambda: uuid.UUID(int=0)
        if issubclass(t, datetime.datetime):
            return lambda: datetime.datetime.fromtimestamp(0, datetime.UTC)
    return lambda: None


def _coercer(t: Any) -> Coerce:
    if _is_entity(t):
        return lambda v: v if isinstance(v, t) else build(t, v)
    if typing.get_origin(t) is tuple:
        inner = _coercer(typing.get_args(t)[0])
        return lambda v: tuple(inner(x) for x in v)
    if isinstance(t, type):
        if issubclass(t, ErrorCode):
            return lambda v: v if isinstance(v, ErrorCode) else ErrorCode(int(v))
        if issubclass(t, (i32Timedelta, i64Timedelta)):
            return lambda v: v if isinstance(v, datetime.timedelta) else datetime.timedelta(milliseconds=int(v))
        if issubclass(t, datetime.datetime):
            return _timestamp
    return lambda v: v


def _timestamp(v: Any) -> datetime.datetime | None:
    """Epoch milliseconds (-1: none) as the timezone-aware datetime kio writes."""
    if isinstance(v, datetime.datetime) or v is None:
        return v
    return None if v < 0 else datetime.datetime.fromtimestamp(v / 1000, datetime.UTC)


def _unwrap_optional(t: Any) -> tuple[Any, bool]:
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return t, False


def _constant(value: Any) -> Callable[[], Any]:
    return lambda: value


@cache
def _plan(cls: type[Any]) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        t, nullable = _unwrap_optional(hints[f.name])
        coerce = _coercer(t)
        if f.default is not MISSING:
            default: Callable[[], Any] = _constant(f.default)
        elif f.default_factory is not MISSING:
            default = f.default_factory
        else:
            default = _zero(t, nullable)
        wrapped = coerce if not nullable else (lambda v, c=coerce: None if v is None else c(v))
        out.append(_Field(f.name, wrapped, default))
    return tuple(out)


def build(cls: type[Any], values: Mapping[str, Any]) -> Any:
    """A ``cls`` entity from ``values`` (see the module docstring)."""
    kwargs = {}
    for f in _plan(cls):  # type: ignore[arg-type]
        v = values.get(f.name, MISSING)
        kwargs[f.name] = f.default() if v is MISSING else f.coerce(v)
    return cls(**kwargs)


NO_TOPIC_ID = uuid.UUID(int=0)
"""Kafka's "no topic id"."""


def topic_uuid(topic_id: str) -> uuid.UUID:
    """The servicer's topic id (22 characters of URL-safe base64) as Kafka's UUID; the
    zero UUID for none."""
    if not topic_id:
        return NO_TOPIC_ID
    try:
        return uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4)))
    except (ValueError, binascii.Error):
        return NO_TOPIC_ID


def millis(value: Any) -> int:
    """A duration field of a request (a ``timedelta`` in kio) as int milliseconds."""
    if isinstance(value, datetime.timedelta):
        return int(value / datetime.timedelta(milliseconds=1))
    return int(value)
