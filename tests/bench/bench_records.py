"""Throughput of the RecordBatch v2 codec (kclient.records), single thread, per implementation.

Run: ``python tests/bench/bench_records.py [--seconds S] [--codecs none,lz4,...] [--impls c,python]``

Records carry a 100-byte value and no key, as ``kafka-producer-perf-test.sh
--record-size 100`` sends them (its payload is random upper-case letters, so it
compresses a little). Batches are either ~16 KiB (the producer's default
``batch.size`` = 16384, about 130 records) or 1000 records. For each implementation
("c": kclient._crecords, "python": the fallback) and codec:

- append:   BatchBuilder.append per record + build (compression, CRC)
- fill:     BatchBuilder(write_limit).try_append per record + build (the producer's send())
- bulk:     encode_batch(values) (the producer's send_batch)
- decode:   decode_batch with the CRC check (Record objects)
- old-poll: decode_batches + one ConsumerRecord per Record (the consumer before columnar polls)
- records:  decode_consumer_records (the consumer's poll)
- columns:  decode_columns (lists: what poll_columns hands out)
- buffers:  decode_buffers (Arrow-layout ColumnBuffers: poll_buffers, poll_arrow, Spark)
- arrow:    decode_buffers + ColumnBuffers.to_arrow (poll_arrow; skipped without pyarrow)
- broker:   iter_headers + check_batch over a buffer of batches (a leader's or follower's check)
- walk:     walk_records over each batch's records (the leader's record check; uncompressed only)

Every figure is the best of at least 3 timed runs (more within ``--seconds``).
MB/s counts value bytes (payload), as Kafka's perf tools do; "wire" is the batch
size per record. This is a script, not a pytest test.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable

from kclient import records
from kclient.records import HEADER_SIZE, CodecAPI, Compression, check_batch, iter_headers
from kclient.structs import ConsumerRecord

VALUE_SIZE = 100


def _has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


BATCH_BYTES = 16384
TIMESTAMP = 1_700_000_000_000


def make_values(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    letters = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return [bytes(rng.choices(letters, k=VALUE_SIZE)) for _ in range(n)]


def records_per_16k(api: CodecAPI) -> int:
    builder = api.BatchBuilder(write_limit=BATCH_BYTES)
    count = 0
    while builder.try_append(TIMESTAMP, None, b"x" * VALUE_SIZE) is not None:
        count += 1
    return count


def measure(func: Callable[[], object], seconds: float) -> float:
    """Best time of one call to ``func`` over repeated runs (at least 3) lasting ~``seconds``."""
    best = float("inf")
    deadline = time.perf_counter() + seconds
    runs = 0
    while runs < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - start)
        runs += 1
    return best


def operations(
    api: CodecAPI, codec: Compression, value_sets: list[list[bytes]]
) -> list[tuple[str, Callable[[], object]]]:
    builder_type = api.BatchBuilder

    def build(values: list[bytes]) -> bytes:
        builder = builder_type(codec)
        append = builder.append
        for value in values:
            append(TIMESTAMP, None, value)
        return builder.build()

    batches = [build(values) for values in value_sets]
    log = b"".join(batches)

    def append() -> None:
        for values in value_sets:
            build(values)

    def fill() -> None:
        for values in value_sets:
            builder = builder_type(codec, write_limit=1 << 30)
            try_append = builder.try_append
            for value in values:
                try_append(TIMESTAMP, None, value)
            builder.build()

    def bulk() -> None:
        for values in value_sets:
            api.encode_batch(values, base_timestamp=TIMESTAMP, compression=codec)

    def decode() -> None:
        for batch in batches:
            api.decode_batch(batch)

    def old_poll() -> None:
        out = []
        for header, recs in api.decode_batches(log):
            ts_type = header.timestamp_type
            out.extend(
                [ConsumerRecord("t", 0, r.offset, r.timestamp, ts_type, r.key, r.value, r.headers) for r in recs]
            )

    def consumer_records() -> None:
        api.decode_consumer_records(log, "t", 0)

    def columns() -> None:
        api.decode_columns(log)

    def buffers() -> None:
        api.decode_buffers(log)

    def arrow() -> None:
        api.decode_buffers(log).to_arrow("t", 0)

    def broker() -> None:
        for pos, h in iter_headers(log):
            check_batch(log, pos, h)

    ops: list[tuple[str, Callable[[], object]]] = [
        ("append", append),
        ("fill", fill),
        ("bulk", bulk),
        ("decode", decode),
        ("old-poll", old_poll),
        ("records", consumer_records),
        ("columns", columns),
        ("buffers", buffers),
        *([("arrow", arrow)] if _has_pyarrow() else []),
        ("broker", broker),
    ]
    if codec == Compression.NONE:
        bodies = [(b, len(b), records.read_header(b).record_count) for b in batches]

        def walk() -> None:
            for b, end, count in bodies:
                api.walk_records(b, HEADER_SIZE, end, count)

        ops.append(("walk", walk))
    return ops


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    parser.add_argument("--codecs", default="none,lz4,zstd,gzip")
    parser.add_argument("--impls", default=",".join(records.implementations()), help="c,python")
    parser.add_argument("--sizes", default="16KiB,1000rec")
    args = parser.parse_args(argv)
    codecs = [Compression.from_name(name) for name in args.codecs.split(",")]
    impls = records.implementations()
    apis = [impls[name] for name in args.impls.split(",")]

    per_16k = records_per_16k(apis[0])
    sizes = [s for s in [("16KiB", per_16k), ("1000rec", 1000)] if s[0] in args.sizes.split(",")]
    batches_per_run = 20  # records per timed run: 20 batches
    print(
        f"python {sys.version.split()[0]}, value {VALUE_SIZE} B, no key; "
        f"16 KiB batch = {per_16k} records; best of >= 3 runs over {args.seconds:.1f}s each"
    )
    header = (
        f"{'impl':<7} {'codec':<6} {'batch':<8} {'op':<9} {'records/s':>12} {'MB/s':>9} {'us/batch':>10} "
        f"{'wire B/rec':>10}"
    )
    print(header)
    print("-" * len(header))
    for api in apis:
        for codec in codecs:
            for label, count in sizes:
                value_sets = [make_values(count, seed) for seed in range(batches_per_run)]
                total_records = count * batches_per_run
                wire = sum(len(api.encode_batch(v, compression=codec)) for v in value_sets) / total_records
                for op, func in operations(api, codec, value_sets):
                    elapsed = measure(func, args.seconds)
                    rate = total_records / elapsed
                    print(
                        f"{api.name:<7} {codec.name.lower():<6} {label:<8} {op:<9} {rate:>12,.0f} "
                        f"{rate * VALUE_SIZE / 1e6:>9.1f} {elapsed / batches_per_run * 1e6:>10.1f} {wire:>10.1f}"
                    )
    print(f"(wire B/rec includes the {HEADER_SIZE}-byte batch header share)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
