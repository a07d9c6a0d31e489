"""Produce v0-2 on the Kafka door: their schemas, and the up-conversion of the message
sets they carry (magic 0 and 1) to the RecordBatch v2 kbroker stores.

kio (made from Kafka 4's message definitions) has no schema for Produce v0-2: Kafka 4
dropped them. Kafka 2.8, whose API versions the door serves, answers them, and old
clients still send them (librdkafka with ``api.version.request=false`` and
``broker.version.fallback=0.9.0.0`` sends Produce v1 with magic-0 messages; test 0052).
The classes below are kio entities of the same shape as kio's Produce v3 ones, so kio
reads and writes them and :func:`~kbroker.doors.kafka.codec.build` fills them:

- request v0-2: ``acks``, ``timeout``, ``topic_data`` (no ``transactional_id``);
- response v0: ``responses`` of (index, error_code, base_offset); v1 adds
  ``throttle_time`` at the end; v2 adds ``log_append_time`` to each partition.

Up-conversion (:func:`upconvert`) is what Kafka 2.8's LogValidator does when a topic's
``message.format.version`` is 2.x: every message of the set, compressed wrappers
opened, becomes a record of one v2 batch, in order. A magic-0 message has no timestamp:
its record gets -1 (NO_TIMESTAMP), which a consumer reads as "no timestamp"; on a
``LogAppendTime`` topic the broker stamps the batch as for any other. The batch is
compressed with the wrappers' codec (the topic's ``compression.type`` then applies as
for a v2 batch). Errors, per partition as Kafka answers them:

- a CRC mismatch, a message cut short or a size that does not fit: CORRUPT_MESSAGE;
- a magic above 1 after a magic 0/1 message, a compressed message inside a compressed
  wrapper, zstd (which needs magic 2) or an unknown codec id: INVALID_RECORD;
- wrappers that inflate past :data:`MAX_INFLATED_BYTES` in all: MESSAGE_TOO_LARGE
  (inflation stops there; pre-1.0 clients' sets are far smaller).

A v2 RecordBatch sent with Produce v0-2 is passed on as it is (Kafka 2.8 accepts it).
A magic-0 LZ4 wrapper carries Kafka 0.8's miscomputed frame header checksum (librdkafka
writes it so for a MsgVersion 0 producer); Kafka ignores it for magic 0, and so does
the up-conversion: the checksum is recomputed before the frame is read.

No ``from __future__ import annotations`` here: kio reads the field types at run time.

Thread safety: pure functions; the classes are immutable.
"""

import struct
import zlib
from dataclasses import dataclass, field
from typing import ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.schema.types import TopicName
from kio.static.constants import EntityType
from kio.static.primitive import Records, TZAware, i16, i32, i32Timedelta, i64

from kclient.errors import CorruptRecordError, InvalidRecordError, MessageSizeTooLargeError
from kclient.records import (
    COMPRESSION_CODEC_MASK,
    MAGIC_OFFSET,
    TIMESTAMP_TYPE_MASK,
    Compression,
    decompress,
    encode_batch,
)

PRODUCE_KEY = 0

NO_TIMESTAMP = -1

MAX_INFLATED_BYTES = 32 * 1024 * 1024
"""The most bytes the compressed wrappers of one message set may inflate to; beyond,
MESSAGE_TOO_LARGE (a small wrapper must not make the broker hold gigabytes)."""

_MESSAGE_HEAD = struct.Struct(">qi")  # offset, message size
_CRC_MAGIC_ATTRS = struct.Struct(">Ibb")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_MAGIC_POS = MAGIC_OFFSET  # offset (8) + size (4) + crc (4) in a v0/v1 message: a v2 batch's magic byte


# --- schemas ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionProduceData:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(PRODUCE_KEY)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    index: i32 = field(metadata={"kafka_type": "int32"})
    records: Records | None = field(metadata={"kafka_type": "records"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicProduceData:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(PRODUCE_KEY)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    partition_data: tuple[PartitionProduceData, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequestV0:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(PRODUCE_KEY)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    acks: i16 = field(metadata={"kafka_type": "int16"})
    timeout: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    topic_data: tuple[TopicProduceData, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequestV1(ProduceRequestV0):
    __version__: ClassVar[i16] = i16(1)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequestV2(ProduceRequestV0):
    __version__: ClassVar[i16] = i16(2)


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionProduceResponseV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(PRODUCE_KEY)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    index: i32 = field(metadata={"kafka_type": "int32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    base_offset: i64 = field(metadata={"kafka_type": "int64"})


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionProduceResponseV2:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(PRODUCE_KEY)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    index: i32 = field(metadata={"kafka_type": "int32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    base_offset: i64 = field(metadata={"kafka_type": "int64"})
    log_append_time: TZAware | None = field(metadata={"kafka_type": "datetime_i64"}, default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicProduceResponseV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(PRODUCE_KEY)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    partition_responses: tuple[PartitionProduceResponseV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicProduceResponseV2:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(PRODUCE_KEY)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    name: TopicName = field(metadata={"kafka_type": "string"})
    partition_responses: tuple[PartitionProduceResponseV2, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponseV0:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(PRODUCE_KEY)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    responses: tuple[TopicProduceResponseV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponseV1:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(PRODUCE_KEY)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    responses: tuple[TopicProduceResponseV0, ...]
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponseV2:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(2)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(PRODUCE_KEY)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    responses: tuple[TopicProduceResponseV2, ...]
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})


REQUEST_SCHEMAS: dict[tuple[int, int], type] = {
    (PRODUCE_KEY, 0): ProduceRequestV0,
    (PRODUCE_KEY, 1): ProduceRequestV1,
    (PRODUCE_KEY, 2): ProduceRequestV2,
}
"""(API key, version) -> request class, for the versions kio has no schema for."""

RESPONSE_SCHEMAS: dict[tuple[int, int], type] = {
    (PRODUCE_KEY, 0): ProduceResponseV0,
    (PRODUCE_KEY, 1): ProduceResponseV1,
    (PRODUCE_KEY, 2): ProduceResponseV2,
}
"""(API key, version) -> response class, for the versions kio has no schema for."""


# --- up-conversion -----------------------------------------------------------------------


@dataclass
class _Converted:
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    codec: Compression = Compression.NONE
    inflated: int = 0
    """Bytes the wrappers inflated to so far."""


def is_legacy(records: bytes) -> bool:
    """Whether ``records`` is a message set of magic 0 or 1 (not a v2 RecordBatch)."""
    return len(records) > _MAGIC_POS and records[_MAGIC_POS] in (0, 1)


def upconvert(records: bytes) -> bytes:
    """The magic 0/1 message set ``records`` as one v2 RecordBatch (see the module
    docstring); ``records`` itself when it is not a legacy message set (a v2 batch, or
    nothing). Raises CorruptRecordError or InvalidRecordError; nothing is kept."""
    if not is_legacy(records):
        return records
    out = _Converted()
    _read_set(memoryview(records), out, wrapper=None)
    if not out.values:
        raise InvalidRecordError("a message set without messages")
    return encode_batch(out.values, out.keys, None, out.timestamps, compression=out.codec)


def _read_set(buf: memoryview, out: _Converted, wrapper: tuple[int, int | None] | None) -> None:
    """Append the messages of ``buf`` to ``out``. ``wrapper``: the magic of the compressed
    message ``buf`` came out of and its LogAppendTime timestamp (None: CreateTime, the
    inner messages keep theirs); None at the top level."""
    pos, end = 0, len(buf)
    while pos < end:
        if end - pos < _MESSAGE_HEAD.size:
            raise CorruptRecordError(f"a message set cut short: {end - pos} bytes left at position {pos}")
        _, size = _MESSAGE_HEAD.unpack_from(buf, pos)
        body = pos + _MESSAGE_HEAD.size
        if size < _CRC_MAGIC_ATTRS.size + 8 or body + size > end:
            raise CorruptRecordError(f"a message of {size} bytes at position {pos} does not fit the message set")
        _read_message(buf[body : body + size], out, wrapper)
        pos = body + size


def _read_message(msg: memoryview, out: _Converted, wrapper: tuple[int, int | None] | None) -> None:
    crc, magic, attributes = _CRC_MAGIC_ATTRS.unpack_from(msg, 0)
    if magic not in (0, 1):
        raise InvalidRecordError(f"a message of magic {magic} in a message set of magic 0/1")
    if zlib.crc32(msg[4:]) != crc:
        raise CorruptRecordError(f"a message of magic {magic} failed its CRC check")
    p = _CRC_MAGIC_ATTRS.size
    timestamp = NO_TIMESTAMP
    if magic == 1:
        if len(msg) < p + 8 + 8:
            raise CorruptRecordError("a magic-1 message cut short")
        (timestamp,) = _I64.unpack_from(msg, p)
        p += 8
    key, p = _bytes(msg, p)
    value, p = _bytes(msg, p)
    if p != len(msg):
        raise CorruptRecordError(f"a message of magic {magic} has {len(msg) - p} bytes after its value")
    codec_id = attributes & COMPRESSION_CODEC_MASK
    if codec_id == Compression.NONE:
        if wrapper is not None:
            wrapper_magic, log_append_time = wrapper
            if wrapper_magic == 0:
                timestamp = NO_TIMESTAMP
            elif log_append_time is not None:
                timestamp = log_append_time
        out.keys.append(key)
        out.values.append(value)
        out.timestamps.append(timestamp)
        return
    if wrapper is not None:
        raise InvalidRecordError("a compressed message inside a compressed message")
    if codec_id not in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4):
        raise InvalidRecordError(f"compression codec id {codec_id} is not valid for magic {magic}")
    if value is None:
        raise InvalidRecordError("a compressed message without a value")
    if codec_id == Compression.LZ4 and magic == 0:
        value = _fix_lz4_header_checksum(value)
    inner = _inflate(Compression(codec_id), value, MAX_INFLATED_BYTES - out.inflated)
    out.inflated += len(inner)
    out.codec = Compression(codec_id)
    log_append = magic == 1 and bool(attributes & TIMESTAMP_TYPE_MASK)
    _read_set(memoryview(inner), out, (magic, timestamp if log_append else None))


def _bytes(msg: memoryview, p: int) -> tuple[bytes | None, int]:
    if len(msg) < p + 4:
        raise CorruptRecordError("a message cut short")
    (n,) = _I32.unpack_from(msg, p)
    p += 4
    if n < 0:
        return None, p
    if len(msg) < p + n:
        raise CorruptRecordError("a message cut short")
    return bytes(msg[p : p + n]), p + n


def _too_large() -> MessageSizeTooLargeError:
    return MessageSizeTooLargeError(f"the message set's compressed messages inflate past {MAX_INFLATED_BYTES} bytes")


def _inflate(codec: Compression, data: bytes, budget: int) -> bytes:
    """``data`` decompressed, at most ``budget`` bytes (MessageSizeTooLargeError past it,
    CorruptRecordError when it does not decompress): the records package's bounded
    decompression, with this door's words."""
    try:
        return decompress(codec, data, max_size=budget)
    except MessageSizeTooLargeError:
        raise _too_large() from None
    except CorruptRecordError as exc:
        raise CorruptRecordError(f"a {codec.name.lower()} wrapper does not decompress: {exc}") from None


_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _fix_lz4_header_checksum(frame: bytes) -> bytes:
    """``frame`` with its LZ4 frame descriptor's checksum byte made right (Kafka 0.8's
    framing computed it over the magic too); unchanged when it is no LZ4 frame."""
    if len(frame) < 7 or not frame.startswith(_LZ4_MAGIC):
        return frame
    flg = frame[4]
    end = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)  # content size, dictionary id
    if end >= len(frame):
        return frame
    checksum = (_xxh32(frame[4:end]) >> 8) & 0xFF
    return frame if frame[end] == checksum else frame[:end] + bytes([checksum]) + frame[end + 1 :]


def _xxh32(data: bytes) -> int:
    """XXH32 with seed 0 of fewer than 16 bytes (an LZ4 frame descriptor)."""
    assert len(data) < 16

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & _M32

    h = (_P5 + len(data)) & _M32
    p = 0
    while p + 4 <= len(data):
        h = (h + int.from_bytes(data[p : p + 4], "little") * _P3) & _M32
        h = (rotl(h, 17) * _P4) & _M32
        p += 4
    for b in data[p:]:
        h = (h + b * _P5) & _M32
        h = (rotl(h, 11) * _P1) & _M32
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    h ^= h >> 16
    return h
