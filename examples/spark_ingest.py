"""A Spark Structured Streaming pipeline over a kbroker topic: counts per key per minute, to Parquet.

    scripts/run                                   # a local cluster; prints the bootstrap address
    .venv/bin/python examples/spark_ingest.py --bootstrap-server 127.0.0.1:9092 --topic demo \\
        --output /tmp/demo-counts [--produce 5000] [--available-now | --run-seconds 60]

(``--bootstrap-server`` defaults to the address in ``.run/cluster.json``.) The pipeline:

1. reads ``--topic`` with ``spark.readStream.format("kbroker")`` from the earliest offset
   (``maxOffsetsPerTrigger`` caps each micro-batch), committing its progress to the
   consumer group ``--group-id`` after each micro-batch, so
   ``kctl groups describe --group spark-ingest`` shows the pipeline's lag;
2. counts records per key per 1-minute event-time window (the records' timestamps);
3. writes each micro-batch's counts as Parquet under ``--output``, one directory per
   micro-batch (``batch=<id>``, overwritten if Spark replays the batch after a crash),
   so with the checkpoint under ``<output>/_checkpoint`` every record is counted exactly
   once across restarts; the total of a window and key is the sum of its rows;
4. prints a line of progress per micro-batch (rows, rate, group lag) and, at the end,
   the totals read back from the Parquet files.

Per-batch partial counts are written rather than a stateful aggregation in append mode
because Spark emits such a window only once the watermark has passed it, so a short
run (``--available-now``) would write nothing for the last minutes.

``--produce N`` first sends N keyed records (``user-0`` .. ``user-9``) to the topic so
there is something to count. Stop a running pipeline with Ctrl-C; run it again and it
goes on where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any


def default_bootstrap() -> str | None:
    state = Path(__file__).resolve().parent.parent / ".run" / "cluster.json"
    if state.exists():
        return str(json.loads(state.read_text())["bootstrap"])
    return None


def produce(bootstrap: str, topic: str, n: int) -> None:
    from kclient import Producer

    with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=10) as producer:
        for i in range(n):
            producer.send(topic, f"event {i}".encode(), key=f"user-{i % 10}".encode())
        producer.flush()
    print(f"produced {n} records to {topic!r}")


def group_lag(bootstrap: str, group: str, topic: str) -> int | None:
    """Records of ``topic`` not yet committed by ``group`` (None before its first commit)."""
    from kclient import AdminClient, Consumer

    with AdminClient(bootstrap) as admin:
        committed = {tp: om.offset for tp, om in admin.list_consumer_group_offsets(group).items() if tp.topic == topic}
    if not committed:
        return None
    with Consumer(bootstrap_servers=bootstrap) as consumer:
        ends = consumer.end_offsets(list(committed))
    return sum(max(ends[tp] - off, 0) for tp, off in committed.items())


def build_query(spark: Any, args: argparse.Namespace) -> Any:
    from pyspark.sql import functions as F

    records = (
        spark.readStream.format("kbroker")
        .option("bootstrap.servers", args.bootstrap_server)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_per_trigger))
        .option("groupId", args.group_id)
        .load()
    )
    counts_dir = str(Path(args.output) / "counts")

    def write_counts(batch: Any, batch_id: int) -> None:
        counts = (
            batch.groupBy(F.window("timestamp", "1 minute").alias("window"), F.col("key").cast("string").alias("key"))
            .count()
            .select(
                F.col("window.start").alias("window_start"),
                F.col("window.end").alias("window_end"),
                "key",
                "count",
            )
        )
        counts.write.mode("overwrite").parquet(f"{counts_dir}/batch={batch_id}")

    writer = (
        records.writeStream.foreachBatch(write_counts)
        .queryName("kbroker-ingest")
        .option("checkpointLocation", str(Path(args.output) / "_checkpoint"))
    )
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{args.trigger_seconds} seconds")
    return writer.start()


def print_progress(progress: dict[str, Any], lag: int | None) -> None:
    rate = progress.get("processedRowsPerSecond") or 0.0
    print(
        f"batch {progress['batchId']:>4}: {progress['numInputRows']:>7} rows, {rate:>10,.0f} rows/s, "
        f"group lag {'-' if lag is None else lag}",
        flush=True,
    )


def print_totals(spark: Any, output: str) -> None:
    from pyspark.sql import functions as F

    counts_dir = Path(output) / "counts"
    if not counts_dir.exists():
        print("no counts written yet")
        return
    totals = (
        spark.read.parquet(str(counts_dir))
        .groupBy("window_start", "key")
        .agg(F.sum("count").alias("count"))
        .orderBy(F.col("window_start").desc(), "key")
    )
    total = totals.agg(F.sum("count")).first()[0] or 0
    print(f"totals in {counts_dir} ({total} records counted), latest windows first:")
    totals.show(20, truncate=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap-server", default=default_bootstrap(), help="host:port (default: .run/cluster.json)")
    ap.add_argument("--topic", default="demo")
    ap.add_argument("--output", default="/tmp/kbroker-spark-ingest", help="Parquet output (and checkpoint) directory")
    ap.add_argument("--group-id", default="spark-ingest", help="consumer group that shows the pipeline's progress")
    ap.add_argument("--max-per-trigger", type=int, default=100_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--trigger-seconds", type=int, default=5)
    ap.add_argument("--run-seconds", type=float, default=0, help="stop after this long (0: until Ctrl-C)")
    ap.add_argument("--available-now", action="store_true", help="process what is in the topic now, then stop")
    ap.add_argument("--produce", type=int, default=0, metavar="N", help="first send N demo records to the topic")
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args(argv)
    if not args.bootstrap_server:
        ap.error("--bootstrap-server is required (no .run/cluster.json: start a cluster with scripts/run)")

    if args.produce:
        produce(args.bootstrap_server, args.topic, args.produce)

    # Spark's Python workers must import kclient: run them with this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from kclient.spark import register

    spark = (
        SparkSession.builder.master(args.master)
        .appName("kbroker-spark-ingest")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    register(spark)

    query = build_query(spark, args)
    print(f"streaming {args.topic!r} from {args.bootstrap_server} into {args.output} (query {query.id})", flush=True)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    started = time.monotonic()
    seen = -1

    def report() -> None:
        nonlocal seen
        for progress in query.recentProgress:
            if progress["batchId"] > seen and progress["numInputRows"]:
                seen = progress["batchId"]
                print_progress(progress, group_lag(args.bootstrap_server, args.group_id, args.topic))

    try:
        while query.isActive and not stopping:
            if args.run_seconds and time.monotonic() - started > args.run_seconds:
                break
            query.awaitTermination(1)
            report()
        report()
        if query.exception() is not None:
            print(f"the query failed: {query.exception()}", file=sys.stderr)
            return 1
    finally:
        if query.isActive:
            query.stop()
    print_totals(spark, args.output)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
