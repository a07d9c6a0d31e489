"""Single-consumer throughput on a local one-broker cluster, records produced first.

    .venv/bin/python tests/bench/bench_consumer.py [--records 1000000] [--value-size 100]
        [--rounds 3] [--modes poll,columns,arrow] [--max-records 10000] [--partition-fetch-bytes 1048576]
        [--profile SECONDS]

Starts a real ZooKeeper and one broker under a temporary directory, produces the records
once, then reads them all ``--rounds`` times per mode with a fresh consumer and prints the
best round (records/s, MB/s of values), like kafka-consumer-perf-test.sh. Never a test.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from kbroker.local.cluster import LocalCluster
from kbroker.local.zookeeper import ZooKeeperEnsemble
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition

TOPIC = "bench"


def produce(bootstrap: str, n: int, size: int) -> None:
    value = b"x" * size
    with Producer(bootstrap_servers=bootstrap, acks="1", linger_ms=5, batch_size=262144) as p:
        start = time.perf_counter()
        for _ in range(n):
            p.send(TOPIC, value)
        p.flush()
        took = time.perf_counter() - start
    print(f"produced {n} records in {took:.1f} s")


def consume_once(bootstrap: str, n: int, mode: str, max_records: int, fetch_bytes: int = 1048576) -> float:
    """Seconds to read ``n`` records from the beginning with one consumer."""
    with Consumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        max_poll_records=max_records,
        max_partition_fetch_bytes=fetch_bytes,
    ) as c:
        tp = TopicPartition(TOPIC, 0)
        c.assign([tp])
        c.seek(tp, 0)
        got = 0
        start = time.perf_counter()
        while got < n:
            if mode == "poll":
                for recs in c.poll(timeout_ms=1000).values():
                    got += len(recs)
            elif mode == "columns":
                for cols in c.poll_columns(timeout_ms=1000).values():  # type: ignore[attr-defined]
                    got += len(cols.offsets)
            else:
                got += c.poll_arrow(timeout_ms=1000).num_rows  # type: ignore[attr-defined]
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="poll,columns,arrow")
    ap.add_argument("--max-records", type=int, default=10000)
    ap.add_argument("--partition-fetch-bytes", type=int, default=1048576, help="max_partition_fetch_bytes")
    ap.add_argument("--profile", type=float, default=0.0, help="only loop poll() this many seconds (for py-spy)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        zk = ZooKeeperEnsemble(Path(tmp) / "zk")
        zk.start()
        cluster = LocalCluster(Path(tmp), zk.connect_string + "/bench")
        try:
            cluster.start(1)
            with AdminClient(cluster.bootstrap) as admin:
                admin.create_topics([NewTopic(TOPIC, 1, 1)])
            produce(cluster.bootstrap, args.records, args.value_size)
            if args.profile:
                until = time.monotonic() + args.profile
                mode = args.modes.split(",")[0]
                while time.monotonic() < until:
                    consume_once(cluster.bootstrap, args.records, mode, args.max_records, args.partition_fetch_bytes)
                return
            for mode in args.modes.split(","):
                best = min(
                    consume_once(cluster.bootstrap, args.records, mode, args.max_records, args.partition_fetch_bytes)
                    for _ in range(args.rounds)
                )
                n = args.records
                print(
                    f"consume {mode:8s}: {n / best:12,.0f} records/s  {n * args.value_size / best / 1e6:7.1f} MB/s "
                    f"(best of {args.rounds}, max_records={args.max_records}, "
                    f"max_partition_fetch_bytes={args.partition_fetch_bytes})"
                )
        finally:
            cluster.stop()
            zk.stop()


if __name__ == "__main__":
    main()
