"""Throughput of kbroker.storage.Log: append and read of ~16 KiB batches of 100-byte records.

Run: ``.venv/bin/python tests/bench/bench_log.py [--mb 256] [--dir /some/disk]``

Measures, on one partition log in a temporary directory:

- leader appends (validate + CRC, stamp offsets and epoch, write), one batch per call;
- leader appends of 64 batches per call (a produce request carrying many batches);
- follower appends of 1 MiB fetch responses (validate + write);
- sequential reads of 1 MiB (a consumer or follower fetch) and of one batch at a time;
- a final fsync of everything.

Reads come from the OS page cache (the data was just written): this is the
broker's CPU cost, not the disk's. Not a test: nothing here is collected by pytest.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient.records import BatchBuilder

BATCH_BYTES = 16 * 1024
RECORD_BYTES = 100
MIB = 1024 * 1024


def build_batches(count: int) -> list[bytes]:
    """``count`` distinct batches of ~16 KiB, each of 100-byte values (keys 8 bytes)."""
    batches = []
    now = int(time.time() * 1000)
    for b in range(count):
        builder = BatchBuilder()
        i = 0
        while builder.estimated_size() + RECORD_BYTES + 20 <= BATCH_BYTES:
            value = os.urandom(RECORD_BYTES // 2).hex().encode()
            builder.append(now + i, b"%08d" % i, value)
            i += 1
        batches.append(builder.build())
        now += b
    return batches


def timed(label: str, total_bytes: int, batches: int, fn: Callable[[], object]) -> None:
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    print(
        f"{label:<38} {total_bytes / MIB / elapsed:9.1f} MB/s {batches / elapsed:10.0f} batches/s"
        f"   ({total_bytes / MIB:.0f} MiB in {elapsed:.2f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="MiB to append per run (default 256)")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the logs (default: a temp dir)")
    args = parser.parse_args()

    batches = build_batches(64)
    batch_size = len(batches[0])
    count = args.mb * MIB // batch_size
    total = sum(len(batches[i % len(batches)]) for i in range(count))
    print(f"batch: {batch_size} bytes, {count} batches per run, {total / MIB:.0f} MiB per run")

    root = Path(tempfile.mkdtemp(prefix="bench-log-", dir=args.dir))
    config = LogConfig(segment_bytes=128 * MIB)
    try:
        leader = Log.open(root / "leader-0", config)

        def append_one_by_one() -> None:
            append = leader.append_as_leader
            for i in range(count):
                append(batches[i % len(batches)], 0)

        timed("leader append, 1 batch per call", total, count, append_one_by_one)

        many = Log.open(root / "many-0", config)
        request = b"".join(batches)

        def append_requests() -> None:
            for _ in range(count // len(batches)):
                many.append_as_leader(request, 0)

        rounded = count // len(batches) * len(batches)
        timed("leader append, 64 batches per call", len(request) * (count // len(batches)), rounded, append_requests)
        many.delete()

        def read_all(max_bytes: int) -> Callable[[], None]:
            def run() -> None:
                offset = 0
                end = leader.log_end_offset
                while offset < end:
                    offset = leader.read(offset, max_bytes).next_offset

            return run

        timed("read, 1 MiB per call", total, count, read_all(MIB))
        timed("read, 1 batch per call", total, count, read_all(1))

        follower = Log.open(root / "follower-0", config)
        fetches: list[bytes] = []
        offset = 0
        while offset < leader.log_end_offset:
            info = leader.read(offset, MIB)
            fetches.append(info.records)
            offset = info.next_offset

        def append_fetches() -> None:
            for records in fetches:
                follower.append_as_follower(records)

        timed("follower append, 1 MiB per call", total, count, append_fetches)
        assert follower.log_end_offset == leader.log_end_offset

        timed("flush (fsync) of the leader log", total, count, leader.flush)
        leader.close()
        follower.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
