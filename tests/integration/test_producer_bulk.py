"""Producer.send_batch against a real broker: keys land where send() puts them, every
record's reported offset holds that record, idempotent batches keep their sequences."""

from __future__ import annotations

import time

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition

pytestmark = pytest.mark.integration


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 30) -> list:
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", max_poll_records=10000) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        out: list = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                out.extend(recs)
        return out


def test_send_batch_with_keys_matches_send_and_reports_offsets(cluster: LocalCluster) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("bulk", 4, 1)])
    n = 3000
    keys = [f"user-{i % 97}".encode() for i in range(n)]
    vals = [f"value-{i}".encode() * 10 for i in range(n)]
    with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=2) as p:
        one_by_one = [p.send("bulk", b"probe", key=k) for k in keys[:97]]
        bulk = p.send_batch("bulk", vals, keys=keys)
        keyless = p.send_batch("bulk", [b"k"] * 500)
        meta = bulk.get(30)
        expected = {k: f.get(30).partition for k, f in zip(keys[:97], one_by_one, strict=True)}
        keyless_meta = keyless.get(30)
    assert [expected[k] for k in keys] == meta.partitions
    assert len(set(keyless_meta.partitions)) == 1  # one batch, the sticky partition
    records = consume_all(cluster.bootstrap, "bulk", 4, 97 + n + 500)
    found = {(r.partition, r.offset): r for r in records}
    for i in range(n):
        r = found[(meta.partitions[i], meta.offsets[i])]
        assert (r.key, r.value) == (keys[i], vals[i])
    index = {v: i for i, v in enumerate(vals)}
    for p in range(4):  # in input order within each partition
        in_partition = sorted((r for r in records if r.partition == p), key=lambda r: r.offset)
        mine = [index[r.value] for r in in_partition if r.value in index]
        assert mine == sorted(mine)
