"""A ZooKeeper + broker cluster in network namespaces, and availability measurements.

``netns_cluster(tmp_path, n, **overrides)`` builds a :class:`kbroker.local.netns.Network`,
runs ZooKeeper in host ``zk`` and broker ``i`` in host ``b<i>``; the test process
reaches all of them over its veth. Everything is torn down on exit, also on a failure
or Ctrl-C (and a crashed run's namespaces are removed by the next one). The test is
skipped when namespaces cannot be made here (not root, no iptables).

``Figures`` collects the measured numbers, prints them (``pytest -s``) and writes them
as JSON into the test's tmp dir, and also appends them to ``$KBROKER_PARTITION_FIGURES``
when that names a file, so a CI run can keep them.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from kbroker.local import netns
from kbroker.local.cluster import LocalCluster
from kbroker.local.zookeeper import ZooKeeperEnsemble, ZooKeeperNotFound, classpath
from tests.integration.test_faults import NumberedProducer


@dataclass
class NetCluster:
    net: netns.Network
    zookeeper: ZooKeeperEnsemble
    cluster: LocalCluster

    def host(self, broker_id: int) -> netns.Host:
        return self.net.hosts[f"b{broker_id}"]


@contextmanager
def netns_cluster(tmp_path: Path, brokers: int, **overrides: str) -> Iterator[NetCluster]:
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    try:
        classpath()
    except ZooKeeperNotFound as exc:
        pytest.skip(str(exc))
    net = netns.Network()
    zk: ZooKeeperEnsemble | None = None
    cluster: LocalCluster | None = None
    try:
        zk = ZooKeeperEnsemble(tmp_path / "zookeeper", 1, [net.add_host("zk")])
        zk.start()
        cluster = LocalCluster(
            tmp_path / "cluster",
            zk.connect_string + "/kbroker",
            {"controlled.shutdown.retry.backoff.ms": "200", **overrides},
            network=net,
        )
        cluster.start(brokers)
        yield NetCluster(net, zk, cluster)
    except BaseException:
        if cluster is not None:
            print(cluster.logs())
            for b in cluster.brokers.values():
                b.kill()  # a failed or interrupted run ends at once
        raise
    finally:
        try:
            net.heal()  # a clean shutdown needs ZooKeeper and the controller
            if cluster is not None:
                for b in cluster.brokers.values():
                    b.stop(timeout_s=15)
            if zk is not None:
                zk.stop()
        finally:
            net.close()


def first_ack_after(producer: NumberedProducer, partition: int, t: float) -> float | None:
    """The time of the first acknowledgement on ``partition`` later than ``t``, if any."""
    for at, p in producer.ack_log:
        if p == partition and at > t:
            return at
    return None


def longest_gap(producer: NumberedProducer, partition: int, start: float, until: float) -> float | None:
    """The longest time without an ack on ``partition`` from ``start``, counted up to the
    first ack later than ``until`` (None when there is none: the gap has not ended)."""
    points = [start]
    for at, p in producer.ack_log:
        if p == partition and at >= start:
            points.append(at)
            if at > until:
                return max(b - a for a, b in itertools.pairwise(points))
    return None


def stalls(producer: NumberedProducer, partition: int, start: float, min_s: float = 0.5) -> list[list[float]]:
    """Every [from, to] (relative to ``start``) in which ``partition`` got no ack for ``min_s`` or more."""
    times = sorted(at for at, p in producer.ack_log if p == partition and at >= start)
    return [
        [round(a - start, 3), round(b - start, 3)] for a, b in itertools.pairwise([start, *times]) if b - a >= min_s
    ]


def wait_for(predicate: object, timeout_s: float, step_s: float = 0.02) -> float | None:
    """Poll ``predicate`` (a callable) until truthy; return when it became so, None on timeout."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return time.monotonic()
        except Exception:
            pass
        time.sleep(step_s)
    return None


class Figures:
    """Named measurements of one test, printed and written as JSON."""

    def __init__(self, tmp_path: Path, test: str, **context: object) -> None:
        self.path = tmp_path / "partition_figures.json"
        self.data: dict[str, object] = {"test": test, **context}

    def __setitem__(self, key: str, value: object) -> None:
        self.data[key] = round(value, 3) if isinstance(value, float) else value

    def __getitem__(self, key: str) -> object:
        return self.data[key]

    def write(self) -> None:
        text = json.dumps(self.data, sort_keys=True)
        print(f"\nPARTITION FIGURES {text}")
        self.path.write_text(json.dumps(self.data, indent=2, sort_keys=True) + "\n")
        extra = os.environ.get("KBROKER_PARTITION_FIGURES")
        if extra:
            with open(extra, "a") as out:
                out.write(text + "\n")
