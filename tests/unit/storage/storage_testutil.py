"""Helpers for the storage tests: batches built with kclient.records, file surgery."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient.records import BatchBuilder, Compression, Record, decode_batches, iter_headers


def make_batch(
    count: int = 1,
    *,
    timestamp: int = 1_000,
    ts_step: int = 0,
    value_size: int = 10,
    prefix: str = "v",
    compression: Compression = Compression.NONE,
) -> bytes:
    """One batch of ``count`` records; values are ``<prefix><i>`` padded to ``value_size``."""
    builder = BatchBuilder(compression)
    for i in range(count):
        value = f"{prefix}{i}".encode().ljust(value_size, b".")
        builder.append(timestamp + i * ts_step, f"k{i}".encode(), value)
    return builder.build()


def make_batches(batches: int, per_batch: int = 1, *, timestamp: int = 1_000, value_size: int = 10) -> bytes:
    """``batches`` batches back to back, record i of batch b valued ``b<b>-<i>``."""
    return b"".join(
        make_batch(per_batch, timestamp=timestamp, value_size=value_size, prefix=f"b{b}-") for b in range(batches)
    )


def records_of(data: bytes) -> list[Record]:
    return [r for _, records in decode_batches(data) for r in records]


def offsets_of(data: bytes) -> list[int]:
    return [r.offset for r in records_of(data)]


def batch_sizes(data: bytes) -> list[int]:
    return [h.size for _, h in iter_headers(data)]


def small_config(**changes: object) -> LogConfig:
    """Small segments and dense indexes, immediate deletes."""
    base = LogConfig(segment_bytes=4096, index_interval_bytes=256, file_delete_delay_ms=0)
    return base.replace(**changes)


def read_all(log: Log, start: int | None = None, max_bytes: int = 1 << 20) -> list[Record]:
    """Every record from ``start`` (default: log start) to the log end, read batch-wise."""
    offset = log.log_start_offset if start is None else start
    out: list[Record] = []
    while offset < log.log_end_offset:
        info = log.read(offset, max_bytes)
        assert info.records, f"empty read at {offset} below the end {log.log_end_offset}"
        out.extend(records_of(info.records))
        assert info.next_offset > offset
        offset = info.next_offset
    return out


def append_batches(log: Log, count: int, per_batch: int = 1, epoch: int = 0, **kw: object) -> None:
    for _ in range(count):
        log.append_as_leader(make_batch(per_batch, **kw), epoch)  # type: ignore[arg-type]


def log_files(dir: Path, suffix: str = ".log") -> list[Path]:
    return sorted(p for p in dir.iterdir() if p.name.endswith(suffix))


def flip_byte(path: Path, position: int) -> None:
    with path.open("r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


def truncate_file(path: Path, remove: int) -> None:
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(size - remove)


def append_garbage(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


def all_values(records: Iterable[Record]) -> list[bytes | None]:
    return [r.value for r in records]


def crash(log: Log) -> None:
    """Drop a log as a killed process would: descriptors closed, nothing else written."""
    for segment in log.segments:
        segment._close_files()
    log._closed = True
