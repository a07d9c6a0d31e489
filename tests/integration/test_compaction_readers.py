"""Readers over a compacted log whose offsets have gaps: a consumer group (positions,
commits and a second generation land on compacted-away offsets) on real brokers."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import Consumer, Producer, TopicPartition
from tests.integration.compaction_support import FAST_CLEANER, compacted_topic_with_gaps

pytestmark = pytest.mark.integration


def drain(consumer: Consumer, want: int, timeout_s: float = 30) -> list[tuple[int, int, bytes, bytes]]:
    out: list[tuple[int, int, bytes, bytes]] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < want:
        assert time.monotonic() < deadline, f"read {len(out)} of {want}"
        for recs in consumer.poll(timeout_ms=200).values():
            out.extend((r.partition, r.offset, r.key, r.value) for r in recs)
    return out


def test_a_consumer_group_reads_and_commits_across_offset_gaps(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST_CLEANER)
    latest = compacted_topic_with_gaps(cluster.bootstrap, "table")
    group = {"group_id": "restore", "auto_offset_reset": "earliest", "enable_auto_commit": False}
    with Consumer(bootstrap_servers=cluster.bootstrap, **group) as consumer:
        consumer.subscribe(["table"])
        got = drain(consumer, len(latest))
        # At least one record per key, each key's last value last, offsets rising with gaps.
        seen: dict[tuple[int, bytes], tuple[int, bytes]] = {}
        for p, offset, key, value in got:
            assert (p, key) not in seen or seen[(p, key)][0] < offset
            seen[(p, key)] = (offset, value)
        assert seen == latest
        assert len(got) < 2 * 4001, "nothing was compacted away"
        for p in (0, 1):
            offsets = [o for q, o, _, _ in got if q == p]
            assert offsets == sorted(offsets) and offsets[:10] == list(range(10)) and offsets[10] > 10
        consumer.commit()
        committed = {p: consumer.committed(TopicPartition("table", p)) for p in (0, 1)}
        assert committed == {0: 4001, 1: 4001}
    with Producer(bootstrap_servers=cluster.bootstrap) as producer:
        producer.send("table", b"new", key=b"key-000", partition=0).get(10)
    # The next generation resumes from the committed offsets: only the new record.
    with Consumer(bootstrap_servers=cluster.bootstrap, **group) as consumer:
        consumer.subscribe(["table"])
        again = drain(consumer, 1)
        time.sleep(0.5)
        again += [(r.partition, r.offset, r.key, r.value) for rs in consumer.poll(timeout_ms=300).values() for r in rs]
        assert again == [(0, 4001, b"key-000", b"new")]
