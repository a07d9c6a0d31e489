"""Parked requests against everything else: produce requests/s and Metadata latency
while idle consumers long-poll.

    .venv/bin/python tests/bench/bench_waits.py [--idle 0,60,256] [--seconds 5]

Starts a real ZooKeeper (local jars) and one broker, then for each count of idle
long-polling consumers (Fetch with max_wait_ms=500 on a topic nobody writes, re-issued
as each one answers, as a consumer's poll loop does) measures sequential acks=1
produce requests per second to another topic and Metadata round trips. Never a test:
it only prints.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import grpc

from kbroker.local.cluster import LocalCluster
from kbroker.local.zookeeper import ZooKeeperEnsemble
from kclient import AdminClient, NewTopic
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2, metadata_pb2
from kclient.records import BatchBuilder


def idle_pollers(address: str, n: int, stop: threading.Event) -> list[threading.Thread]:
    def loop() -> None:
        channel = grpc.insecure_channel(address)
        stub = broker_pb2_grpc.BrokerStub(channel)
        req = log_pb2.FetchRequest(max_wait_ms=500, min_bytes=1, max_bytes=1 << 20)
        req.topics.add(name="idle").partitions.add(index=0, fetch_offset=0, partition_max_bytes=1 << 20)
        while not stop.is_set():
            try:
                stub.Fetch(req, timeout=30)
            except grpc.RpcError:
                time.sleep(0.1)
        channel.close()

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def measure(address: str, seconds: float) -> tuple[float, float, float]:
    stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(address))
    b = BatchBuilder()
    b.append(int(time.time() * 1000), None, b"x" * 100)
    req = log_pb2.ProduceRequest(acks=1, timeout_ms=5000)
    req.topics.add(name="busy").partitions.add(index=0, records=b.build())
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        stub.Produce(req, timeout=30)
        n += 1
    latencies = []
    for _ in range(50):
        start = time.monotonic()
        stub.Metadata(metadata_pb2.MetadataRequest(), timeout=30)
        latencies.append(time.monotonic() - start)
    latencies.sort()
    return n / seconds, statistics.median(latencies) * 1000, latencies[int(len(latencies) * 0.99) - 1] * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", default="0,60,256")
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        zk = ZooKeeperEnsemble(Path(tmp) / "zk")
        zk.start()
        cluster = LocalCluster(Path(tmp) / "c", zk.connect_string).start(1)
        try:
            with AdminClient(cluster.bootstrap) as admin:
                admin.create_topics([NewTopic("idle", 1, 1), NewTopic("busy", 1, 1)])
            for count in (int(x) for x in args.idle.split(",")):
                stop = threading.Event()
                threads = idle_pollers(cluster.bootstrap, count, stop)
                time.sleep(1.0)
                rate, p50, p99 = measure(cluster.bootstrap, args.seconds)
                print(
                    f"idle long polls {count:4d}: produce {rate:7,.0f} requests/s, "
                    f"Metadata p50 {p50:6.1f} ms p99 {p99:7.1f} ms"
                )
                stop.set()
                for t in threads:
                    t.join(5)
        finally:
            cluster.stop()
            zk.stop()


if __name__ == "__main__":
    main()
