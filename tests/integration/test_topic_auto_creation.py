"""Topic auto-creation through the Kafka door. kbroker keeps ``auto.create.topics.enable``
off by default (Kafka's default is on; see the Kafka -> kbroker table in docs/kafka-migration.md): a missing
topic is answered UNKNOWN_TOPIC_OR_PARTITION at once, and creates nothing. librdkafka
then fails the records after ``topic.metadata.propagation.max.ms`` (30 s by default), as
against Kafka with auto-creation off. With the setting on, kcat's first record creates
the topic."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable

import pytest

from kbroker.local.cluster import LocalCluster
from kclient.errors import UnknownTopicOrPartitionError
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.integration

DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}


def _kcat(*args: str, data: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (scripts/setup dev installs it)")
    return subprocess.run(["kcat", *args], input=data, capture_output=True, text=True, timeout=60)


def _metadata(cluster: LocalCluster, topic: str) -> int:
    with WireClient(cluster.kafka_bootstrap()) as c:
        r = c.call(
            3,
            9,
            {
                "topics": [{"name": topic}],
                "allow_auto_topic_creation": True,
                "include_cluster_authorized_operations": False,
                "include_topic_authorized_operations": False,
            },
        )
    return int(r.topics[0].error_code)


def test_missing_topic_is_unknown_at_once_by_default(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **DOOR)
    assert _metadata(cluster, "missing") == UnknownTopicOrPartitionError.errno
    started = time.monotonic()
    out = _kcat(
        "-b", cluster.kafka_bootstrap(), "-P", "-t", "missing", "-X", "topic.metadata.propagation.max.ms=1000",
        data="a\nb\n",
    )  # fmt: skip
    assert out.returncode != 0
    assert "Unknown topic or partition" in out.stderr, out.stderr
    assert time.monotonic() - started < 20
    assert _metadata(cluster, "missing") == UnknownTopicOrPartitionError.errno  # nothing was created


def test_kcat_creates_the_topic_when_auto_creation_is_on(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **DOOR, **{"auto.create.topics.enable": "true"})
    out = _kcat("-b", cluster.kafka_bootstrap(), "-P", "-t", "fresh", data="a\nb\n")
    assert out.returncode == 0, out.stderr
    out = _kcat("-b", cluster.kafka_bootstrap(), "-C", "-t", "fresh", "-o", "beginning", "-e", data="")
    assert out.stdout.split() == ["a", "b"], out.stderr
