"""End-to-end throughput on a local cluster: one producer, then one consumer.

    .venv/bin/python tests/bench/bench_cluster.py [--records 200000] [--brokers 1]
        [--acks 1] [--replication 1] [--partitions 1] [--value-size 100]
        [--bulk] [--chunk 10000] [--repeat 3] [--no-consume]

``--bulk`` produces with ``Producer.send_batch`` (``--chunk`` records per call) instead
of one ``send`` per record; ``--repeat`` runs the produce step that many times and
prints the best.

Starts a real ZooKeeper (local jars) and real broker processes under a temporary
directory, like kafka-producer-perf-test.sh / kafka-consumer-perf-test.sh prints the
figures, and tears everything down. Never a test: it only prints.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from kbroker.local.cluster import LocalCluster
from kbroker.local.zookeeper import ZooKeeperEnsemble
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition


def produce(
    bootstrap: str, topic: str, n: int, size: int, acks: str, linger_ms: int, batch_size: int, bulk: int = 0
) -> float:
    """Records/s of one run; ``bulk`` > 0 sends with send_batch, ``bulk`` records per call."""
    value = b"x" * size
    with Producer(bootstrap_servers=bootstrap, acks=acks, linger_ms=linger_ms, batch_size=batch_size) as p:
        p.partitions_for(topic)
        start = time.perf_counter()
        last: Any = None
        if bulk:
            chunk = [value] * bulk
            for i in range(0, n, bulk):
                last = p.send_batch(topic, chunk[: min(bulk, n - i)])  # type: ignore[attr-defined]
        else:
            for _ in range(n):
                last = p.send(topic, value)
        p.flush()
        assert last is not None
        last.get(60)
        took = time.perf_counter() - start
    api = f"send_batch x{bulk}" if bulk else "send"
    print(
        f"producer ({api}): {n} records sent, {n / took:,.0f} records/sec ({n * size / took / 1e6:.2f} MB/sec), "
        f"acks={acks}, batch.size={batch_size}, linger.ms={linger_ms}"
    )
    return n / took


def consume(bootstrap: str, topic: str, partitions: int, n: int, size: int) -> None:
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", max_poll_records=10000) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        got = 0
        start = time.perf_counter()
        while got < n:
            for recs in c.poll(timeout_ms=1000).values():
                got += len(recs)
        took = time.perf_counter() - start
    print(f"consumer: {got} records read, {got / took:,.0f} records/sec ({got * size / took / 1e6:.2f} MB/sec)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--brokers", type=int, default=1)
    ap.add_argument("--replication", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--acks", default="1")
    ap.add_argument("--linger-ms", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=65536)
    ap.add_argument("--min-insync", type=int, default=1)
    ap.add_argument("--bulk", action="store_true", help="produce with send_batch")
    ap.add_argument("--chunk", type=int, default=10000, help="records per send_batch call")
    ap.add_argument("--repeat", type=int, default=1, help="produce runs; the best is printed")
    ap.add_argument("--no-consume", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        zk = ZooKeeperEnsemble(Path(tmp) / "zk")
        zk.start()
        cluster = LocalCluster(Path(tmp), zk.connect_string + "/bench")
        try:
            cluster.start(args.brokers)
            with AdminClient(cluster.bootstrap) as admin:
                admin.create_topics(
                    [
                        NewTopic(
                            "bench",
                            args.partitions,
                            args.replication,
                            topic_configs={"min.insync.replicas": str(args.min_insync)},
                        )
                    ]
                )
            print(
                f"{args.brokers} broker(s), topic 'bench': {args.partitions} partition(s), RF {args.replication}, "
                f"{args.value_size}-byte values"
            )
            bulk = args.chunk if args.bulk else 0
            rates = [
                produce(
                    cluster.bootstrap,
                    "bench",
                    args.records,
                    args.value_size,
                    args.acks,
                    args.linger_ms,
                    args.batch_size,
                    bulk,
                )
                for _ in range(args.repeat)
            ]
            if args.repeat > 1:
                print(f"producer best of {args.repeat}: {max(rates):,.0f} records/sec")
            if not args.no_consume:
                consume(cluster.bootstrap, "bench", args.partitions, args.records * args.repeat, args.value_size)
        finally:
            cluster.stop()
            zk.stop()


if __name__ == "__main__":
    main()
