"""Spark ingestion rate: a batch read of a kbroker topic through ``format("kbroker")``.

    .venv/bin/python tests/bench/bench_spark.py [--records 1000000] [--partitions 4]
        [--value-size 100] [--brokers 1] [--master local[2]] [--bootstrap-server HOST:PORT]

Produces ``--records`` records of ``--value-size`` bytes with kclient's Producer into a
fresh topic of ``--partitions`` partitions, then times a Spark batch read of the whole
topic (every column materialised: ``write.format("noop")``) and prints the rows/s.
Starts a real ZooKeeper and broker processes under a temporary directory unless
``--bootstrap-server`` names a running cluster. Never a test: it only prints.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kbroker.local.cluster import LocalCluster
from kbroker.local.zookeeper import ZooKeeperEnsemble
from kclient import AdminClient, NewTopic, Producer


def produce(bootstrap: str, topic: str, n: int, size: int, partitions: int) -> None:
    value = b"x" * size
    start = time.perf_counter()
    with Producer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=512 * 1024) as p:
        for i in range(n):
            p.send(topic, value, partition=i % partitions)
        p.flush()
    took = time.perf_counter() - start
    print(f"produced {n:,} records of {size} bytes into {partitions} partitions in {took:.1f}s ({n / took:,.0f}/s)")


def read(bootstrap: str, topic: str, n: int, size: int, master: str, runs: int) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from kclient.spark import register

    spark = (
        SparkSession.builder.master(master)
        .appName("bench-spark")
        .config("spark.driver.memory", "1g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        df = spark.read.format("kbroker").option("bootstrap.servers", bootstrap).option("subscribe", topic).load()
        for run in range(1, runs + 1):
            start = time.perf_counter()
            got = df.count()
            took_count = time.perf_counter() - start
            start = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            took = time.perf_counter() - start
            assert got == n, f"read {got} rows, produced {n}"
            print(
                f"run {run}: batch read of {n:,} rows ({n * size / 1e6:.0f} MB of values), every column: {took:.1f}s = "
                f"{n / took:,.0f} rows/s ({n * size / took / 1e6:.1f} MB/s); count(): {took_count:.1f}s = "
                f"{n / took_count:,.0f} rows/s  [{master}]"
            )
    finally:
        spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--brokers", type=int, default=1)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--runs", type=int, default=2, help="timed reads (the first also warms Spark up)")
    ap.add_argument("--bootstrap-server", help="use this running cluster instead of starting one")
    args = ap.parse_args()
    topic = f"bench-spark-{uuid.uuid4().hex[:8]}"

    def bench(bootstrap: str) -> None:
        with AdminClient(bootstrap) as admin:
            admin.create_topics([NewTopic(topic, args.partitions, 1)])
        time.sleep(1)
        produce(bootstrap, topic, args.records, args.value_size, args.partitions)
        read(bootstrap, topic, args.records, args.value_size, args.master, args.runs)

    if args.bootstrap_server:
        bench(args.bootstrap_server)
        return
    with tempfile.TemporaryDirectory() as tmp:
        zk = ZooKeeperEnsemble(Path(tmp) / "zk")
        zk.start()
        cluster = LocalCluster(Path(tmp), zk.connect_string + "/bench")
        try:
            cluster.start(args.brokers)
            bench(cluster.bootstrap)
        finally:
            cluster.stop()
            zk.stop()


if __name__ == "__main__":
    main()
