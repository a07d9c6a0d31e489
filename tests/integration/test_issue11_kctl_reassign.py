"""kctl partitions reassign (generate, execute, verify, list) and kctl brokers decommission,
as real subprocesses against real brokers: a cluster grows by one broker, then one is
drained and stopped with nothing under-replicated."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic, Producer
from tests.integration.test_kctl import fails, kctl, ok
from tests.support import wait_until

pytestmark = pytest.mark.integration


def replicas(bootstrap: str, topic: str) -> dict[int, list[int]]:
    with AdminClient(bootstrap) as admin:
        return {p.partition: list(p.replicas) for p in admin.describe_topics([topic])[0].partitions}


def in_sync(bootstrap: str, topic: str) -> bool:
    with AdminClient(bootstrap) as admin:
        return all(
            len(p.isr) == len(p.replicas) and p.leader >= 0 for p in admin.describe_topics([topic])[0].partitions
        )


def test_grow_then_drain_a_broker_with_kctl(cluster_factory: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cluster = cluster_factory(3)
    z = f"--zookeeper {cluster.zk_connect}"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("grow", 6, 2)])
    wait_until(lambda: in_sync(cluster.bootstrap, "grow"), what="grow in sync")
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as p:
        for i in range(600):
            p.send("grow", b"%d" % i, partition=i % 6)
        p.flush(30)
    cluster.add_broker()  # broker 3: registered, holds nothing yet
    topics = tmp_path / "topics.json"
    topics.write_text(json.dumps({"version": 1, "topics": [{"topic": "grow"}]}))
    out = ok(kctl(z, f"partitions reassign --generate --topics-to-move-json-file {topics} --broker-list 0,1,2,3"))
    lines = out.splitlines()
    assert (
        lines[0] == "Current partition replica assignment"
        and lines[3] == "Proposed partition reassignment configuration"
    )
    proposed = json.loads(lines[4])
    load: dict[int, int] = {}
    for e in proposed["partitions"]:
        for b in e["replicas"]:
            load[b] = load.get(b, 0) + 1
    assert load == {0: 3, 1: 3, 2: 3, 3: 3}, proposed
    plan = tmp_path / "plan.json"
    plan.write_text(lines[4])

    started = ok(kctl(z, f"partitions reassign --execute --reassignment-json-file {plan}"))
    assert started.splitlines()[-1].startswith("Successfully started partition reassignment")
    wait_until(
        lambda: kctl(z, f"partitions reassign --verify --reassignment-json-file {plan}").returncode == 0,
        timeout_s=90,
        what="the reassignment to complete",
    )
    verified = ok(kctl(z, f"partitions reassign --verify --reassignment-json-file {plan}"))
    assert verified.count("is complete.") == 6, verified
    assert ok(kctl(z, "partitions reassign --list")) == "No partition reassignments found.\n"
    want = {e["partition"]: e["replicas"] for e in proposed["partitions"]}
    assert replicas(cluster.bootstrap, "grow") == want
    wait_until(lambda: in_sync(cluster.bootstrap, "grow"), what="in sync after the move")

    # Drain broker 0, stop it: nothing is under-replicated, every record is still there.
    drained = ok(kctl(z, "brokers decommission 0 --timeout-ms 120000"))
    assert drained.splitlines()[-1] == "Broker 0 holds no partition replicas; it can be stopped.", drained
    assert all(0 not in rs for rs in replicas(cluster.bootstrap, "grow").values())
    cluster.brokers[0].stop()
    others = ",".join(cluster.brokers[b].address for b in (1, 2, 3))
    wait_until(lambda: in_sync(others, "grow"), what="every partition fully in sync without broker 0")
    under = ok(kctl(f"--bootstrap-server {others}", "topics describe --topic grow --under-replicated-partitions"))
    assert under == "", under
    again = ok(kctl(z, "brokers decommission 0"))
    assert again == "Broker 0 holds no partition replicas; it can be stopped.\n"

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "partitions": [{"topic": "grow", "partition": 0, "replicas": [1, 1]}]}))
    fails(kctl(z, f"partitions reassign --execute --reassignment-json-file {bad}"), mentions="duplicate")
    fails(
        kctl(z, f"partitions reassign --verify --reassignment-json-file {tmp_path / 'none.json'}"),
        mentions="cannot read",
    )
