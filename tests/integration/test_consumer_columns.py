"""Columnar polls against one real broker: poll_columns, poll_buffers and
poll_arrow return exactly the produced records, in order, with keys, headers and
timestamps (null keys and values, compressed batches, several responses per poll);
poll() and poll_columns() mixed keep positions (and what a commit saves) right."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.records import RecordColumns

pytestmark = pytest.mark.integration

N = 5000


def produce(cluster: LocalCluster, topic: str, partitions: int) -> dict[int, list[tuple[bytes | None, bytes, int]]]:
    """N records spread round-robin by explicit partition; per partition, in offset order
    (the acknowledged offsets), (key, value, timestamp)."""
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    sent: list[tuple[Any, tuple[bytes | None, bytes, int]]] = []
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all", linger_ms=2, batch_size=16384) as p:
        for i in range(N):
            key = None if i % 10 == 0 else f"k{i}".encode()
            value = f"v{i}".encode() + b"x" * 90
            ts = 1_700_000_000_000 + i
            future = p.send(
                topic, value, key=key, partition=i % partitions, timestamp_ms=ts, headers=[("i", b"%d" % i)]
            )
            sent.append((future, (key, value, ts)))
        p.flush()
    by_offset: dict[int, dict[int, tuple[bytes | None, bytes, int]]] = {part: {} for part in range(partitions)}
    for future, record in sent:
        meta = future.get(10)
        by_offset[meta.partition][meta.offset] = record
    out = {part: [recs[o] for o in sorted(recs)] for part, recs in by_offset.items()}
    for part, recs in by_offset.items():
        assert sorted(recs) == list(range(len(recs))), f"partition {part}: offsets not dense"
    return out


def columns_until(c: Consumer, n: int, max_records: int = 700) -> dict[TopicPartition, RecordColumns]:
    got: dict[TopicPartition, RecordColumns] = {}
    deadline = time.monotonic() + 30
    while sum(len(cols.offsets) for cols in got.values()) < n and time.monotonic() < deadline:
        for tp, cols in c.poll_columns(timeout_ms=500, max_records=max_records).items():
            acc = got.setdefault(tp, RecordColumns([], [], [], [], [], []))
            for dst, src in zip(acc, cols, strict=True):
                dst.extend(src)
    return got


def test_poll_columns_returns_exactly_the_produced_records(cluster: LocalCluster) -> None:
    sent = produce(cluster, "cols", 3)
    with Consumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest") as c:
        tps = [TopicPartition("cols", p) for p in range(3)]
        c.assign(tps)
        got = columns_until(c, N)
        assert sum(len(cols.offsets) for cols in got.values()) == N
        for tp in tps:
            cols = got[tp]
            expected = sent[tp.partition]
            assert cols.offsets == list(range(len(expected)))
            assert cols.keys == [k for k, _, _ in expected]
            assert cols.values == [v for _, v, _ in expected]
            assert cols.timestamps == [t for _, _, t in expected]
            assert set(cols.timestamp_types) == {0}
            assert [h[0][0] for h in cols.headers] == ["i"] * len(expected)
            assert c.position(tp) == len(expected)
        assert c.poll_columns(timeout_ms=200) == {}


def test_poll_arrow_returns_exactly_the_produced_records(cluster: LocalCluster) -> None:
    pa = pytest.importorskip("pyarrow")
    sent = produce(cluster, "arrow", 2)
    with Consumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("arrow", p) for p in range(2)])
        batches = []
        deadline = time.monotonic() + 30
        while sum(b.num_rows for b in batches) < N and time.monotonic() < deadline:
            batches.append(c.poll_arrow(timeout_ms=500, max_records=1000))
        table = pa.Table.from_batches(batches)
        assert table.num_rows == N
        assert table.schema.names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
        rows = table.to_pydict()
        assert set(rows["topic"]) == {"arrow"}
        for part in range(2):
            idx = [i for i, p in enumerate(rows["partition"]) if p == part]
            expected = sent[part]
            assert [rows["offset"][i] for i in idx] == list(range(len(expected)))
            assert [rows["key"][i] for i in idx] == [k for k, _, _ in expected]
            assert [rows["value"][i] for i in idx] == [v for _, v, _ in expected]
            stamps = [int(rows["timestamp"][i].timestamp() * 1000) for i in idx]
            assert stamps == [t for _, _, t in expected]


def test_mixed_poll_and_poll_columns_keep_positions(cluster: LocalCluster) -> None:
    sent = produce(cluster, "mixed", 1)
    tp = TopicPartition("mixed", 0)
    values = [v for _, v, _ in sent[0]]
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="mixers", auto_offset_reset="earliest") as c:
        c.assign([tp])
        seen: list[bytes | None] = []
        deadline = time.monotonic() + 30
        turn = 0
        while len(seen) < N and time.monotonic() < deadline:
            turn += 1
            if turn % 2:
                seen.extend(r.value for r in c.poll(timeout_ms=500, max_records=333).get(tp, []))
            else:
                cols = c.poll_columns(timeout_ms=500, max_records=777).get(tp)
                seen.extend(cols.values if cols else [])
            assert c.position(tp) == len(seen)
            if turn == 6:
                c.commit()
                assert c.committed(tp) == len(seen)
        assert seen == values
    # A second consumer of the group resumes from the last commit.
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="mixers", enable_auto_commit=False) as c2:
        c2.assign([tp])
        assert c2.position(tp) == N


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_poll_buffers_mixed_with_poll_columns_returns_exactly_the_produced_records(
    cluster: LocalCluster, compression: str
) -> None:
    """poll_buffers (zero-copy ColumnBuffers) with null keys, headers, compressed batches,
    several fetch responses per poll, and poll_columns between its calls."""
    topic = f"buffers-{compression}"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all", batch_size=4096, compression_type=compression) as p:
        values = [None if i % 7 == 3 else b"v%d" % i for i in range(N)]
        keys = [None if i % 5 == 0 else b"k%d" % i for i in range(N)]
        headers = [[("h", b"%d" % i)] if i % 11 == 0 else [] for i in range(N)]
        for future in [p.send(topic, v, key=k, headers=h) for v, k, h in zip(values, keys, headers, strict=True)]:
            future.get(10)
    tp = TopicPartition(topic, 0)
    got = RecordColumns([], [], [], [], [], [])
    with Consumer(
        bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest", max_partition_fetch_bytes=16384
    ) as c:
        c.assign([tp])
        deadline = time.monotonic() + 30
        turn = 0
        while len(got.offsets) < N and time.monotonic() < deadline:
            turn += 1
            if turn % 3:
                cb = c.poll_buffers(timeout_ms=500, max_records=1500).get(tp)
                part = cb.to_columns() if cb is not None else None
            else:
                part = c.poll_columns(timeout_ms=500, max_records=500).get(tp)
            if part is not None:
                for dst, src in zip(got, part, strict=True):
                    dst.extend(src)
            assert c.position(tp) == len(got.offsets)
    assert got.offsets == list(range(N))
    assert got.keys == keys
    assert got.values == values
    assert got.headers == headers
