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
    wait_until(lambda: replicas(cluster.bootstrap, "grow") == want, what="the plan in the metadata")
    wait_until(lambda: in_sync(cluster.bootstrap, "grow"), what="in sync after the move")

    # Drain broker 0, stop it: nothing is under-replicated, every record is still there.
    drained = ok(kctl(z, "brokers decommission 0 --timeout-ms 120000"))
    assert drained.splitlines()[-1] == "Broker 0 holds no partition replicas; it can be stopped.", drained
    wait_until(lambda: all(0 not in rs for rs in replicas(cluster.bootstrap, "grow").values()), what="0 drained")
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


def test_reassign_and_decommission_over_bootstrap_server(
    cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    # A broker is paused below; its ZooKeeper session must outlive the seven commands run meanwhile
    # (a few seconds each on a loaded machine).
    cluster = cluster_factory(3, **{"zookeeper.session.timeout.ms": "60000"})
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("boot", 4, 2)])
    wait_until(lambda: in_sync(cluster.bootstrap, "boot"), what="boot in sync")
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as p:
        for i in range(200):
            p.send("boot", b"%d" % i, partition=i % 4)
        p.flush(30)
    cluster.add_broker()  # broker 3
    b = f"--bootstrap-server {cluster.bootstrap}"
    topics = tmp_path / "topics.json"
    topics.write_text(json.dumps({"version": 1, "topics": [{"topic": "boot"}]}))
    gen = f"partitions reassign --generate --topics-to-move-json-file {topics} --broker-list"
    fails(kctl(b, f"{gen} 0,9"), mentions="Unknown broker id 9")
    lines = ok(kctl(b, f"{gen} 0,1,2,3")).splitlines()
    assert lines[0] == "Current partition replica assignment"
    assert lines[3] == "Proposed partition reassignment configuration"
    before = {e["partition"]: e["replicas"] for e in json.loads(lines[1])["partitions"]}
    assert before == replicas(cluster.bootstrap, "boot")
    proposed = json.loads(lines[4])
    assert any(3 in e["replicas"] for e in proposed["partitions"]), proposed
    plan = tmp_path / "plan.json"
    plan.write_text(lines[4])

    started = ok(kctl(b, f"partitions reassign --execute --reassignment-json-file {plan}"))
    assert started.splitlines()[-1].startswith("Successfully started partition reassignment")
    wait_until(
        lambda: kctl(b, f"partitions reassign --verify --reassignment-json-file {plan}").returncode == 0,
        timeout_s=90,
        what="the reassignment to complete",
    )
    verified = ok(kctl(b, f"partitions reassign --verify --reassignment-json-file {plan}"))
    assert verified.splitlines()[0] == "Status of partition reassignment:"
    assert verified.count("is complete.") == 4 and verified.endswith("complete.\n\n"), verified
    assert ok(kctl(b, "partitions reassign --list")) == "No partition reassignments found.\n"
    planned = {e["partition"]: e["replicas"] for e in proposed["partitions"]}
    wait_until(lambda: replicas(cluster.bootstrap, "boot") == planned, what="the plan in the metadata")
    nothing = ok(kctl(b, f"partitions reassign --cancel --reassignment-json-file {plan}"))
    assert nothing == (
        "None of the specified partition reassignments are active.\nNone of the specified partition moves are active.\n"
    )

    # A move onto a paused broker stays in progress: listed, blocks another --execute, cancelled.
    now = replicas(cluster.bootstrap, "boot")
    p0 = now[0]
    with AdminClient(cluster.bootstrap) as admin:
        controller = admin.describe_cluster()[1]
    spare = next(x for x in range(4) if x not in p0 and x != controller)
    b = "--bootstrap-server " + ",".join(cluster.brokers[x].address for x in range(4) if x != spare)
    move = tmp_path / "move.json"
    target = [spare, p0[0]]
    move.write_text(json.dumps({"version": 1, "partitions": [{"topic": "boot", "partition": 0, "replicas": target}]}))
    cluster.brokers[spare].pause()
    try:
        ok(kctl(b, f"partitions reassign --execute --reassignment-json-file {move}"))
        listed = ok(kctl(b, "partitions reassign --list")).splitlines()
        assert listed[0] == "Current partition reassignments:", listed
        assert listed[1].startswith("boot-0: replicas: ") and listed[1].endswith(
            f". adding: {spare}. removing: {p0[1]}."
        ), listed
        fails(kctl(b, f"partitions reassign --execute --reassignment-json-file {plan}"), mentions="existing")
        # topics describe shows the move (both ways), and ReplicationFactor leaves out the replica being added.
        z = f"--zookeeper {cluster.zk_connect}"
        for conn in (b, z):
            lines = ok(kctl(conn, "topics describe --topic boot")).splitlines()
            assert "\tReplicationFactor: 2\t" in lines[0], lines
            moving = next(line for line in lines if "\tPartition: 0\t" in line)
            assert moving.endswith(f"\tAdding Replicas: {spare}\tRemoving Replicas: {p0[1]}"), moving
            assert all("Adding Replicas" not in line for line in lines[1:] if line is not moving)
        still = kctl(b, f"partitions reassign --verify --reassignment-json-file {move}")
        assert still.returncode == 1 and still.stdout == (
            "Status of partition reassignment:\nReassignment of partition boot-0 is still in progress.\n\n"
        ), still
        cancelled = ok(kctl(b, f"partitions reassign --cancel --reassignment-json-file {move}"))
        assert cancelled == (
            "Successfully cancelled partition reassignment for: boot-0\n"
            "None of the specified partition moves are active.\n"
        )
    finally:
        cluster.brokers[spare].resume()
    b = f"--bootstrap-server {cluster.bootstrap}"
    wait_until(lambda: replicas(cluster.bootstrap, "boot")[0] == p0, what="boot-0 back on its replicas")
    assert ok(kctl(b, "partitions reassign --list")) == "No partition reassignments found.\n"

    # Drain broker 0 over gRPC, stop it: nothing under-replicated.
    drained = ok(kctl(b, "brokers decommission 0 --timeout-ms 120000"))
    assert drained.splitlines()[-1] == "Broker 0 holds no partition replicas; it can be stopped.", drained
    wait_until(lambda: all(0 not in rs for rs in replicas(cluster.bootstrap, "boot").values()), what="0 drained")
    cluster.brokers[0].stop()
    others = ",".join(cluster.brokers[x].address for x in (1, 2, 3))
    wait_until(lambda: in_sync(others, "boot"), what="boot fully in sync without broker 0")
    under = ok(kctl(f"--bootstrap-server {others}", "topics describe --topic boot --under-replicated-partitions"))
    assert under == "", under
