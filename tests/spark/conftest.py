"""Fixtures of the Spark tests: one SparkSession and one kbroker cluster for the whole run.

Spark runs in local mode (``local[2]``, small memory) with the virtualenv's Python as
its workers' Python, so executors import ``kclient``. The cluster is two real broker
processes on the session's real ZooKeeper (a chroot of its own); every test makes its
own topics (:func:`new_topic`). The brokers check retention every 200 ms so the
data-loss tests can watch old segments go.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.structs import ConsumerRecord

BROKER_OVERRIDES = {
    "zookeeper.session.timeout.ms": "6000",
    "log.retention.check.interval.ms": "200",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one SparkSession of the run, with the kbroker data source registered."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e .[dev])")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e .[dev])")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java (a JRE 17)")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    from kclient.spark import register

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("kbroker-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "768m")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stopTimeout", "10s")
    )
    try:
        session = builder.getOrCreate()
    except PySparkRuntimeError:
        # JAVA_GATEWAY_EXITED: the JVM's launcher died before it gave its port (seen once
        # with three test workers starting JVMs at once); one more start, not a loop.
        time.sleep(2)
        session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kcluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two real brokers on a fresh ZooKeeper chroot, shared by every Spark test."""
    zk_connect = f"{zookeeper}/kbroker-spark-{uuid.uuid4().hex[:12]}"
    cluster = LocalCluster(tmp_path_factory.mktemp("spark-cluster"), zk_connect, BROKER_OVERRIDES)
    cluster.start(2)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def _broker_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print the brokers' logs after a failed test that used the cluster."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and "kcluster" in request.fixturenames:
        print(request.getfixturevalue("kcluster").logs())


@pytest.fixture(scope="session")
def bootstrap(kcluster: LocalCluster) -> str:
    return kcluster.bootstrap


_names = itertools.count()


@pytest.fixture
def new_topic(bootstrap: str, request: pytest.FixtureRequest) -> Callable[..., str]:
    """``new_topic(partitions=3, prefix=None, **configs)``: create a fresh topic, return its name."""

    def make(partitions: int = 3, prefix: str | None = None, **configs: str) -> str:
        base = prefix or request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:40]
        name = f"{base}-{next(_names)}"
        with AdminClient(bootstrap) as admin:
            admin.create_topics(
                [NewTopic(name, partitions, 1, topic_configs={k.replace("_", "."): v for k, v in configs.items()})]
            )
        wait_for_leaders(bootstrap, name, partitions)
        return name

    return make


def wait_for_leaders(bootstrap: str, topic: str, partitions: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    with AdminClient(bootstrap) as admin:
        while True:
            try:
                (desc,) = admin.describe_topics([topic])
                if len(desc.partitions) == partitions and all(p.leader >= 0 for p in desc.partitions):
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} has no leaders after {timeout_s}s")
            time.sleep(0.1)


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[Mapping[str, Any]],
) -> list[tuple[int, int]]:
    """Send ``records`` (dicts of send() arguments) with acks=all; their (partition, offset)s."""
    with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, batch_size=64 * 1024) as producer:
        futures = [producer.send(topic, **r) for r in records]
        producer.flush()
        return [(m.partition, m.offset) for m in (f.get(30) for f in futures)]


def consume_all(bootstrap: str, topic: str, timeout_s: float = 30) -> list[ConsumerRecord]:
    """Every record of ``topic`` up to its current end, ordered by (partition, offset)."""
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as consumer:
        parts = sorted(consumer.partitions_for_topic(topic) or ())
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        out: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end {ends}")
            for recs in consumer.poll(timeout_ms=500).values():
                out.extend(recs)
        return sorted(out, key=lambda r: (r.partition, r.offset))
