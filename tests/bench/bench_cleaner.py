"""Throughput of the log cleaner: MB/s of dirty log cleaned (Kafka's ``LogCleaner`` stats).

Run: ``.venv/bin/python tests/bench/bench_cleaner.py [--mb 64] [--keys 10000] [--codec none]``

Builds one compacted partition log in a temporary directory: ~16 KiB batches of
100-byte values over ``--keys`` distinct keys (so most records are superseded), rolled
so that everything but an empty active segment is dirty. Then one cleaning (as many
passes as the offset map needs) with a 128 MiB dedupe buffer, and prints the MB/s of
dirty log cleaned (dirty bytes / seconds), the bytes read and written, and the records
kept. :func:`measure` is what ``scripts/bench`` can call. Not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from kbroker.storage.cleaner import Cleaner, first_uncleanable_offset
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kbroker.storage.offset_map import OffsetMap
from kclient.records import BatchBuilder, Compression

MIB = 1024 * 1024
BATCH_BYTES = 16 * 1024
RECORD_BYTES = 100


class CleanerResult(NamedTuple):
    dirty_mb: float
    seconds: float
    read_mb: float
    written_mb: float
    records_read: int
    records_kept: int
    passes: int

    @property
    def mb_per_s(self) -> float:
        return self.dirty_mb / self.seconds if self.seconds else 0.0


def _fill(log: Log, mb: int, keys: int, codec: Compression) -> None:
    n = 0
    now = int(time.time() * 1000)
    while log.size_in_bytes < mb * MIB:
        builder = BatchBuilder(codec)
        while builder.estimated_size() + RECORD_BYTES + 20 <= BATCH_BYTES:
            builder.append(now, b"key-%08d" % (n % keys), os.urandom(RECORD_BYTES // 2).hex().encode())
            n += 1
        log.append_as_leader(builder.build(), 0)
    log.roll()


def measure(
    mb: int = 64,
    keys: int = 10_000,
    codec: Compression = Compression.NONE,
    dir: Path | None = None,
    dedupe_buffer_size: int = 128 * MIB,
) -> CleanerResult:
    """Build a dirty log of ``mb`` MiB and clean it once; the figures of that cleaning."""
    root = Path(tempfile.mkdtemp(prefix="bench-cleaner-", dir=dir))
    try:
        config = LogConfig(cleanup_policy="compact", segment_bytes=16 * MIB, file_delete_delay_ms=0)
        log = Log.open(root / "bench-0", config)
        try:
            _fill(log, mb, keys, codec)
            dirty = log.size_in_bytes
            cleaner = Cleaner(OffsetMap(dedupe_buffer_size))
            now = int(time.time() * 1000)
            upper = first_uncleanable_offset(log, now)
            first_dirty, passes = 0, 0
            read = written = records_read = 0
            started = time.perf_counter()
            while first_dirty < upper:
                first_dirty, stats = cleaner.clean(log, first_dirty, upper, now)
                passes += 1
                read += stats.bytes_read
                written += stats.bytes_written
                records_read += stats.records_read
            seconds = time.perf_counter() - started
            kept = sum(1 for s in log.segments for _, h in s.iter_headers() for _ in range(h.record_count))
            return CleanerResult(dirty / MIB, seconds, read / MIB, written / MIB, records_read, kept, passes)
        finally:
            log.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--codec", default="none", choices=["none", "gzip", "lz4", "zstd"])
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    r = measure(args.mb, args.keys, Compression.from_name(args.codec), args.dir)
    print(
        f"cleaner: {r.mb_per_s:.1f} MB/s of dirty log cleaned ({r.dirty_mb:.0f} MiB in {r.seconds:.2f} s, "
        f"{r.passes} pass(es); read {r.read_mb:.0f} MiB, wrote {r.written_mb:.1f} MiB; "
        f"{r.records_kept} of {r.records_read} records kept; codec {args.codec})"
    )


if __name__ == "__main__":
    main()
