"""A Spark batch read over a compacted topic whose offsets have gaps (real brokers with
a fast log cleaner): one row per surviving record, ranges that fall into a gap empty."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")

from kbroker.local.cluster import LocalCluster
from tests.integration.compaction_support import FAST_CLEANER, compacted_topic_with_gaps
from tests.spark.conftest import BROKER_OVERRIDES

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cleaning_cluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    zk_connect = f"{zookeeper}/kbroker-spark-compacted-{uuid.uuid4().hex[:12]}"
    cluster = LocalCluster(tmp_path_factory.mktemp("compacted"), zk_connect, {**BROKER_OVERRIDES, **FAST_CLEANER})
    cluster.start(1)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_batch_read_of_a_compacted_topic_with_offset_gaps(spark: Any, cleaning_cluster: LocalCluster) -> None:
    bootstrap = cleaning_cluster.bootstrap
    latest = compacted_topic_with_gaps(bootstrap, "compacted")
    df = (
        spark.read.format("kbroker")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", "compacted")
        .option("maxRecordsPerPartition", "500")  # many offset ranges, some wholly compacted away
        .load()
    )
    rows = df.select("partition", "offset", "key", "value").collect()
    by_key: dict[tuple[int, bytes], tuple[int, bytes]] = {}
    for p in (0, 1):
        mine = sorted((r.offset, bytes(r.key), bytes(r.value)) for r in rows if r.partition == p)
        assert len({o for o, _, _ in mine}) == len(mine), "an offset was read twice"
        assert [o for o, _, _ in mine[:11]] != list(range(11)), "no gap: nothing was compacted"
        for offset, key, value in mine:
            by_key[(p, key)] = (offset, value)
    assert by_key == latest
