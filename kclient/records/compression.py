"""The compression codecs of a record batch: one home for compressing and decompressing.

With a codec in attribute bits 0-2, everything after ``recordCount`` (all the records)
is compressed as one blob, written and read as Kafka's Java clients do:

- gzip: RFC 1952 framing at Deflater's default level 6 (Java's GZIPOutputStream); read
  as concatenated members (GZIPInputStream);
- snappy: xerial framing (snappy-java's SnappyOutputStream, 32 KiB blocks); a plain
  snappy block is read too. Only when ``cramjam`` or ``python-snappy`` is importable,
  else UnsupportedCodecError;
- lz4: one LZ4 frame of independent 64 KiB blocks, no content size, no checksums
  (KafkaLZ4BlockOutputStream);
- zstd: one zstd frame (level 3); read across frames.

:func:`decompress` serves the client (the whole body, as fast as the library goes) and,
with ``max_size``, the broker: a streaming decompressor stops one byte past the cap, so
a small body that inflates to gigabytes (a bomb) costs at most ``max_size + 1`` bytes
of memory. zstd contexts are per thread (they are not safe to share).
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable
from enum import IntEnum

import lz4.frame as _lz4f
import zstandard as _zstd

from kclient.errors import CorruptRecordError, InvalidConfigError, MessageSizeTooLargeError, UnsupportedCodecError
from kclient.records.layout import Buffer


class Compression(IntEnum):
    """Compression codec id, as stored in attribute bits 0-2."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def from_name(cls, name: str) -> Compression:
        """The codec for a ``compression.type`` value: none, gzip, snappy, lz4, zstd."""
        if isinstance(name, str) and name.islower() and name.upper() in cls.__members__:
            return cls[name.upper()]
        raise InvalidConfigError(f"unknown compression type {name!r}: expected one of none, gzip, snappy, lz4, zstd")


_snappy_compress_raw: Callable[[bytes], bytes] | None = None
_snappy_decompress_raw: Callable[[bytes], bytes] | None = None
try:  # pragma: no cover - not installed in our environment
    import cramjam as _cramjam

    def _cramjam_compress(data: bytes) -> bytes:
        return bytes(_cramjam.snappy.compress_raw(data))

    def _cramjam_decompress(data: bytes) -> bytes:
        return bytes(_cramjam.snappy.decompress_raw(data))

    _snappy_compress_raw = _cramjam_compress
    _snappy_decompress_raw = _cramjam_decompress
except ImportError:
    try:  # pragma: no cover
        import snappy as _snappy

        _snappy_compress_raw = _snappy.compress
        _snappy_decompress_raw = _snappy.uncompress
    except ImportError:
        pass

_I32 = struct.Struct(">i")
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
_CHUNK = 256 * 1024
"""Bytes inflated at a time by the bounded zstd reader."""

_tls = threading.local()  # zstd contexts are not safe to share between threads


def available(codec: int) -> bool:
    """Whether this process can compress and decompress ``codec`` (snappy needs a library)."""
    if codec == Compression.SNAPPY:
        return _snappy_compress_raw is not None and _snappy_decompress_raw is not None
    return Compression.NONE <= codec <= Compression.ZSTD


def require(codec: int, action: str) -> None:
    """Raise UnsupportedCodecError if ``codec`` cannot be used here to ``action`` (snappy without a library)."""
    if codec == Compression.SNAPPY:
        _snappy_library(action)


def _snappy_library(action: str) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    if _snappy_compress_raw is None or _snappy_decompress_raw is None:
        raise UnsupportedCodecError(f"cannot {action} snappy: install 'cramjam' or 'python-snappy' for snappy support")
    return _snappy_compress_raw, _snappy_decompress_raw


def _zstd_compressor() -> _zstd.ZstdCompressor:
    try:
        cctx: _zstd.ZstdCompressor = _tls.zstd_c
    except AttributeError:
        cctx = _tls.zstd_c = _zstd.ZstdCompressor(level=3)
    return cctx


def _zstd_decompressor() -> _zstd.ZstdDecompressor:
    try:
        dctx: _zstd.ZstdDecompressor = _tls.zstd_d
    except AttributeError:
        dctx = _tls.zstd_d = _zstd.ZstdDecompressor()
    return dctx


def compress(codec: int, data: Buffer) -> bytes:
    """``data`` (a batch's records) compressed with ``codec`` (not NONE)."""
    if codec == Compression.LZ4:
        # KafkaLZ4BlockOutputStream: LZ4 frame, independent 64 KiB blocks, no
        # content size, no checksums.
        out: bytes = _lz4f.compress(
            data,
            block_size=_lz4f.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=False,
            block_checksum=False,
            store_size=False,
        )
        return out
    if codec == Compression.ZSTD:
        return _zstd_compressor().compress(data)
    if codec == Compression.GZIP:
        # Java's GZIPOutputStream: gzip framing, Deflater default level (6).
        return zlib.compress(data, 6, wbits=31)
    if codec == Compression.SNAPPY:
        return _snappy_encode(memoryview(data))
    raise UnsupportedCodecError(f"unknown compression codec id {codec}")


def decompress(codec: int, data: Buffer, max_size: int | None = None) -> bytes:
    """``data`` (a batch's compressed records) decompressed.

    With ``max_size``, no more than ``max_size + 1`` bytes are ever inflated, and a body
    that holds more than ``max_size`` raises MessageSizeTooLargeError; snappy, whose
    blocks state their lengths up front, is measured by those before it is decoded. Raises
    CorruptRecordError for a body that does not decompress (the codec library's own
    error is the cause), UnsupportedCodecError for snappy without a library.
    """
    try:
        if max_size is None:
            if codec == Compression.LZ4:
                out: bytes = _lz4f.decompress(data)
                return out
            if codec == Compression.ZSTD:
                return _zstd_decompressor().decompressobj(read_across_frames=True).decompress(data)
            if codec == Compression.GZIP:
                return _gzip_decode(data)
            if codec == Compression.SNAPPY:
                return _snappy_decode(data)
        else:
            cap = max_size + 1
            if codec == Compression.ZSTD:
                out = _zstd_inflate(data, cap)
            elif codec == Compression.LZ4:
                out = _lz4_inflate(data, cap)
            elif codec == Compression.GZIP:
                out = _gzip_inflate(data, cap)
            elif codec == Compression.SNAPPY:
                if _snappy_declared_length(data) > max_size:  # measured before anything is inflated
                    raise MessageSizeTooLargeError(f"the snappy records decompress to more than {max_size} bytes")
                out = _snappy_decode(data)
            else:
                raise CorruptRecordError(f"unknown compression codec id {codec}")
            if len(out) > max_size:
                name = Compression(codec).name.lower()
                raise MessageSizeTooLargeError(f"the {name} records decompress to more than {max_size} bytes")
            return out
    except (CorruptRecordError, UnsupportedCodecError, MessageSizeTooLargeError):
        raise
    except Exception as exc:  # each codec library has its own (zlib.error, cramjam.DecompressionError, ...)
        name = Compression(codec).name.lower()
        raise CorruptRecordError(f"cannot decompress {name} record batch: {exc}") from exc
    raise CorruptRecordError(f"unknown compression codec id {codec}")


def _gzip_decode(data: Buffer) -> bytes:
    d = zlib.decompressobj(31)
    out = d.decompress(data)
    while d.unused_data:  # concatenated gzip members, as GZIPInputStream reads them
        rest = d.unused_data
        d = zlib.decompressobj(31)
        out += d.decompress(rest)
    if not d.eof:
        raise CorruptRecordError("truncated gzip data in record batch")
    return out


def _snappy_encode(data: memoryview) -> bytes:
    """xerial framing, as snappy-java's SnappyOutputStream used by Kafka writes it."""
    compress_block, _ = _snappy_library("encode")
    parts = [_XERIAL_HEADER]
    for start in range(0, len(data), _XERIAL_BLOCK):
        block = compress_block(bytes(data[start : start + _XERIAL_BLOCK]))
        parts.append(_I32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decode(data: Buffer) -> bytes:
    _, decompress_block = _snappy_library("decode")
    raw = bytes(data)
    if not raw.startswith(_XERIAL_MAGIC) or len(raw) < len(_XERIAL_HEADER):
        return decompress_block(raw)  # a plain snappy block
    out = bytearray()
    p = len(_XERIAL_HEADER)
    n = len(raw)
    while p < n:
        if n - p < 4:
            raise CorruptRecordError("truncated xerial snappy block length")
        (block_len,) = _I32.unpack_from(raw, p)
        p += 4
        if block_len < 0 or p + block_len > n:
            raise CorruptRecordError("truncated xerial snappy block")
        out += decompress_block(raw[p : p + block_len])
        p += block_len
    return bytes(out)


def _snappy_declared_length(data: Buffer) -> int:
    """The uncompressed length snappy ``data`` declares (xerial framing, or one plain
    block); CorruptRecordError if that cannot be read."""
    raw = bytes(data)
    try:
        if not raw.startswith(_XERIAL_MAGIC) or len(raw) < len(_XERIAL_HEADER):
            return _uvarint(raw, 0)
        total, p = 0, len(_XERIAL_HEADER)
        while p < len(raw):
            (n,) = _I32.unpack_from(raw, p)
            if n < 0 or p + 4 + n > len(raw):
                raise CorruptRecordError("truncated xerial snappy block")
            total += _uvarint(raw, p + 4)
            p += 4 + n
        return total
    except (struct.error, IndexError, ValueError) as exc:
        raise CorruptRecordError(f"cannot decompress snappy record batch: {exc}") from None


def _uvarint(data: bytes, p: int) -> int:
    """The unsigned varint at ``p`` (a snappy block's length prefix)."""
    value = shift = 0
    while True:
        if p >= len(data) or shift > 63:
            raise ValueError("a truncated varint")
        b = data[p]
        p += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value
        shift += 7


# The bounded readers: each reads as the unbounded one above and stops at ``cap`` bytes.


def _zstd_inflate(body: Buffer, cap: int) -> bytes:
    # Every frame, one after the other.
    reader = _zstd.ZstdDecompressor().stream_reader(body, read_across_frames=True)
    parts: list[bytes] = []
    total = 0
    while total < cap:
        chunk = reader.read(min(_CHUNK, cap - total))
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
    return b"".join(parts)


def _lz4_inflate(body: Buffer, cap: int) -> bytes:
    # The first frame; it must be complete.
    decompressor = _lz4f.LZ4FrameDecompressor()
    out: bytes = decompressor.decompress(body, max_length=cap)
    parts = [out]
    total = len(out)
    while not decompressor.eof and total < cap:
        more: bytes = decompressor.decompress(b"", max_length=cap - total)
        if not more:
            break
        parts.append(more)
        total += len(more)
    if not decompressor.eof and total < cap:
        raise EOFError("truncated lz4 frame")
    return b"".join(parts)


def _gzip_inflate(body: Buffer, cap: int) -> bytes:
    # Concatenated members, as GZIPInputStream reads them.
    parts: list[bytes] = []
    total = 0
    rest: Buffer = body
    while True:
        decompressor = zlib.decompressobj(31)
        out = decompressor.decompress(rest, cap - total)
        parts.append(out)
        total += len(out)
        while decompressor.unconsumed_tail and total < cap:
            out = decompressor.decompress(decompressor.unconsumed_tail, cap - total)
            parts.append(out)
            total += len(out)
        if cap <= total:
            break
        if not decompressor.eof:
            raise EOFError("truncated gzip data")
        rest = decompressor.unused_data
        if not rest:
            break
    return b"".join(parts)
