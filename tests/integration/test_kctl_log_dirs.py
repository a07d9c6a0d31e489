"""``kctl log-dirs --describe`` (kafka-log-dirs.sh) over the DescribeLogDirs RPC, on two
real brokers: sizes and offsets per partition, per directory, filtered by broker and topic."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import Producer
from tests.integration.test_kctl import fails, kctl, ok

pytestmark = pytest.mark.integration


def described(*words: str) -> dict[str, Any]:
    out = ok(kctl(*words)).splitlines()
    assert out[0] == "Querying brokers for log directories information", out
    assert out[1].startswith("Received log directory information from brokers "), out
    parsed: dict[str, Any] = json.loads(out[2])
    return parsed


def partitions(answer: dict[str, Any], broker: int) -> dict[str, dict[str, Any]]:
    (b,) = [b for b in answer["brokers"] if b["broker"] == broker]
    (d,) = b["logDirs"]
    return {p["partition"]: p for p in d["partitions"]}


def test_log_dirs_describe_sizes_offsets_and_filters(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(2)
    b = f"--bootstrap-server {cluster.bootstrap}"
    ok(kctl(b, "topics create --topic sized --partitions 2 --replication-factor 2"))
    ok(kctl(b, "topics create --topic other --partitions 1 --replication-factor 1"))
    ok(kctl(b, "topics create --topic table --partitions 1 --replication-factor 1 --config cleanup.policy=compact"))
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        for i in range(300):
            producer.send("sized", b"v" * 100, partition=i % 2)
        for i in range(50):
            producer.send("table", b"v", key=b"k%d" % (i % 5))
        producer.flush(30)

    everything = described(b, "log-dirs --describe")
    assert [x["broker"] for x in everything["brokers"]] == [0, 1]
    for broker in (0, 1):
        parts = partitions(everything, broker)
        for name in ("sized-0", "sized-1"):
            p = parts[name]
            assert p["logEndOffset"] == 150 and p["logStartOffset"] == 0 and p["segments"] == 1, p
            assert p["size"] > 150 * 100 and p["isFuture"] is False and "cleaner" not in p, p
        (d,) = next(x for x in everything["brokers"] if x["broker"] == broker)["logDirs"]
        assert d["error"] is None and d["size"] == sum(p["size"] for p in d["partitions"])
        assert d["totalBytes"] >= d["usableBytes"] > 0
    # "other" lives on one broker only.
    assert sum("other-0" in partitions(everything, broker) for broker in (0, 1)) == 1
    # A compacted topic shows the log cleaner's state.
    (table,) = [p for broker in (0, 1) for name, p in partitions(everything, broker).items() if name == "table-0"]
    cleaner = table["cleaner"]
    assert 0 <= cleaner["dirtyRatio"] <= 1 and cleaner["uncleanable"] is None, cleaner
    assert cleaner["firstUncleanableOffset"] <= table["logEndOffset"] == 50, table

    only = described(b, "log-dirs --describe --broker-list 1 --topic-list sized")
    assert [x["broker"] for x in only["brokers"]] == [1]
    assert sorted(partitions(only, 1)) == ["sized-0", "sized-1"]

    fails(kctl(b, "log-dirs --describe --broker-list 7"), mentions="broker 7")
    fails(kctl(b, "log-dirs --describe --broker-list one"), code=2, mentions="--broker-list")
    fails(kctl(f"--zookeeper {cluster.zk_connect}", "log-dirs --describe"), code=2, mentions="--bootstrap-server")
