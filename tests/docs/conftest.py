"""Fixtures of the docs harness: one real cluster for the blocks of README.md and docs/, a
working directory per block, and the ``docs`` marker (see :mod:`tests.docs.doc_blocks`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kbroker.local.cluster import LocalCluster
from tests.conftest import FAST_BROKER
from tests.docs.doc_blocks import BROKERS, LINKED, ROOT


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "docs: runs the code blocks of README.md and docs/ against a real local cluster (tests/docs)"
    )


@dataclass(frozen=True)
class DocsCluster:
    cluster: LocalCluster
    zookeeper: str
    scratch: Path
    """Stands for the docs' /tmp/ (shared by the blocks of one run, fresh per run)."""

    @property
    def bootstrap(self) -> str:
        """One broker's address, as scripts/run prints it (the docs' examples give one)."""
        return self.cluster.brokers[0].address or self.cluster.bootstrap

    @property
    def kafka_bootstrap(self) -> str:
        """One broker's Kafka-protocol address (scripts/run opens the door on each)."""
        return self.cluster.brokers[0].kafka_listeners.get("PLAINTEXT") or self.cluster.kafka_bootstrap()


def _seed_demo(bootstrap: str, replication: int) -> None:
    """What scripts/run leaves: topic demo (3 partitions) with 9 records."""
    from kclient import AdminClient, NewTopic, Producer

    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic("demo", 3, replication)])
    with Producer(bootstrap_servers=bootstrap, acks="all") as producer:
        for i in range(9):
            producer.send("demo", f"hello {i}".encode(), key=f"user-{i % 3}".encode())
        producer.flush(30)


@pytest.fixture(scope="module")
def docs_cluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsCluster]:
    """ZooKeeper (the run's, in its own chroot) and three brokers, as scripts/run leaves them."""
    zk = f"{zookeeper}/kbroker-docs-{uuid.uuid4().hex[:8]}"
    door = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}  # as scripts/run opens it
    cluster = LocalCluster(tmp_path_factory.mktemp("docs-cluster"), zk, {**FAST_BROKER, **door})
    cluster.start(BROKERS)
    try:
        _seed_demo(cluster.bootstrap, min(BROKERS, 3))  # scripts/run's replication: min(brokers, 3)
        yield DocsCluster(cluster, zk, tmp_path_factory.mktemp("docs-scratch"))
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()


@pytest.fixture
def block_dir(tmp_path: Path) -> Path:
    """A fresh working directory in which the docs' relative paths resolve."""
    for name in LINKED:
        if (ROOT / name).exists():
            (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path
