"""Offset commits per second into ZooKeeper (one multi-op transaction per request).

    .venv/bin/python tests/bench/bench_commits.py [--requests 2000] [--partitions 1 10 50]

Starts a real ZooKeeper and one broker, then commits standalone (generation -1)
offsets for a topic with as many partitions as asked, sequentially from one client,
and prints commit requests/s and partition offsets/s. Never a test: it only prints.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import grpc

from kbroker.local.cluster import LocalCluster
from kbroker.local.zookeeper import ZooKeeperEnsemble
from kclient import AdminClient, NewTopic
from kclient.proto.kbroker.v1 import broker_pb2_grpc, group_pb2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--partitions", type=int, nargs="+", default=[1, 10, 50])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        zk = ZooKeeperEnsemble(Path(tmp) / "zk")
        zk.start()
        cluster = LocalCluster(Path(tmp), zk.connect_string + "/bench")
        try:
            cluster.start(1)
            with AdminClient(cluster.bootstrap) as admin:
                admin.create_topics([NewTopic("c", max(args.partitions), 1)])
            stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.bootstrap))
            for n in args.partitions:
                group = f"bench-{n}"
                start = time.perf_counter()
                for i in range(args.requests):
                    req = group_pb2.CommitOffsetsRequest(group_id=group, generation_id=-1)
                    t = req.topics.add(name="c")
                    for p in range(n):
                        t.partitions.add(index=p, offset=i)
                    resp = stub.CommitOffsets(req, timeout=10)
                    assert all(pe.error_code == 0 for tr in resp.topics for pe in tr.partitions), resp
                took = time.perf_counter() - start
                print(
                    f"{n:3d} partition(s) per commit: {args.requests / took:,.0f} commits/s, "
                    f"{args.requests * n / took:,.0f} partition offsets/s"
                )
        finally:
            cluster.stop()
            zk.stop()


if __name__ == "__main__":
    main()
