"""Throughput of the RecordBatch v2 codec (kclient.records), single thread.

Run: ``python tests/bench/bench_records.py [--seconds S] [--codecs none,lz4,...]``

Records carry a 100-byte value and no key, as ``kafka-producer-perf-test.sh
--record-size 100`` sends them (its payload is random upper-case letters, so it
compresses a little). Batches are either ~16 KiB (the producer's default
``batch.size`` = 16384, about 130 records) or 1000 records. For each codec:

- encode: BatchBuilder.append per record + build (compression, CRC)
- decode: decode_batch with the CRC check (what a consumer does)
- broker: iter_headers + check_batch over a buffer of batches (what a leader or a
  follower does; no record decoding)

MB/s counts value bytes (payload), as Kafka's perf tools do; "wire" is the batch
size per record. This is a script, not a pytest test.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable

from kclient.records import (
    HEADER_SIZE,
    BatchBuilder,
    Compression,
    check_batch,
    decode_batch,
    iter_headers,
)

VALUE_SIZE = 100
BATCH_BYTES = 16384
TIMESTAMP = 1_700_000_000_000


def make_values(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    letters = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return [bytes(rng.choices(letters, k=VALUE_SIZE)) for _ in range(n)]


def records_per_16k() -> int:
    builder = BatchBuilder()
    count = 0
    while True:
        builder.append(TIMESTAMP, None, b"x" * VALUE_SIZE)
        if builder.estimated_size() > BATCH_BYTES:
            return count
        count += 1


def build(codec: Compression, values: list[bytes]) -> bytes:
    builder = BatchBuilder(codec)
    append = builder.append
    for value in values:
        append(TIMESTAMP, None, value)
    return builder.build()


def measure(func: Callable[[], object], seconds: float) -> float:
    """Best time of one call to ``func`` over repeated runs lasting ~``seconds``."""
    best = float("inf")
    deadline = time.perf_counter() + seconds
    runs = 0
    while runs < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - start)
        runs += 1
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    parser.add_argument("--codecs", default="none,lz4,zstd,gzip")
    args = parser.parse_args(argv)
    codecs = [Compression.from_name(name) for name in args.codecs.split(",")]

    per_16k = records_per_16k()
    sizes = [("16KiB", per_16k), ("1000rec", 1000)]
    batches_per_run = 20  # records per timed run: 20 batches
    print(
        f"python {sys.version.split()[0]}, value {VALUE_SIZE} B, no key; "
        f"16 KiB batch = {per_16k} records; best of runs over {args.seconds:.1f}s each"
    )
    header = f"{'codec':<6} {'batch':<8} {'op':<7} {'records/s':>12} {'MB/s':>9} {'us/batch':>10} {'wire B/rec':>10}"
    print(header)
    print("-" * len(header))
    for codec in codecs:
        for label, count in sizes:
            value_sets = [make_values(count, seed) for seed in range(batches_per_run)]
            batches = [build(codec, values) for values in value_sets]
            wire = sum(len(b) for b in batches) / (count * batches_per_run)
            total_records = count * batches_per_run

            def encode(vs: list[list[bytes]] = value_sets, c: Compression = codec) -> None:
                for values in vs:
                    build(c, values)

            def decode(bs: list[bytes] = batches) -> None:
                for batch in bs:
                    decode_batch(batch)

            log = b"".join(batches)

            def broker(buf: bytes = log) -> None:
                for pos, h in iter_headers(buf):
                    check_batch(buf, pos, h)

            for op, func in (("encode", encode), ("decode", decode), ("broker", broker)):
                elapsed = measure(func, args.seconds)
                rate = total_records / elapsed
                mbps = rate * VALUE_SIZE / 1e6
                per_batch = elapsed / batches_per_run * 1e6
                print(
                    f"{codec.name.lower():<6} {label:<8} {op:<7} {rate:>12,.0f} {mbps:>9.1f} "
                    f"{per_batch:>10.1f} {wire:>10.1f}"
                )
    print(f"(wire B/rec includes the {HEADER_SIZE}-byte batch header share)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
