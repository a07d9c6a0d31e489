"""A read_committed consumer against a real broker, through gRPC: aborted transactions of
interleaved producers are never returned (poll, poll_columns and poll_arrow alike) while
plain and committed records are, in offset order; an open transaction holds the consumer
at the last stable offset, which is its "latest" (end_offsets, auto_offset_reset) and
what its lag counts to; read_uncommitted sees everything up to the high watermark."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition

pytestmark = pytest.mark.integration


def new_topic(cluster: LocalCluster) -> TopicPartition:
    name = f"rc-{uuid.uuid4().hex[:8]}"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 1, 1)])
    return TopicPartition(name, 0)


@contextmanager
def txn_producer(cluster: LocalCluster, transactional_id: str) -> Iterator[Producer]:
    p = Producer(
        bootstrap_servers=cluster.bootstrap, transactional_id=transactional_id, linger_ms=0, max_block_ms=60000
    )
    try:
        p.init_transactions()
        yield p
    finally:
        p.close()


@contextmanager
def consumer(cluster: LocalCluster, tp: TopicPartition, **cfg: Any) -> Iterator[Consumer]:
    c = Consumer(bootstrap_servers=cluster.bootstrap, **{"auto_offset_reset": "earliest", **cfg})
    try:
        c.assign([tp])
        yield c
    finally:
        c.close()


def read_to_end(c: Consumer, tp: TopicPartition, how: str, timeout_s: float = 30) -> list[tuple[int, bytes]]:
    """(offset, value) of every record up to end_offsets, read with ``how``."""
    end = c.end_offsets([tp])[tp]
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout_s
    while c.position(tp) < end:
        assert time.monotonic() < deadline, f"stuck at {c.position(tp)} of {end}"
        if how == "poll":
            out += [(r.offset, r.value or b"") for r in c.poll(timeout_ms=200).get(tp, [])]
        elif how == "columns":
            cols = c.poll_columns(timeout_ms=200).get(tp)
            if cols is not None:
                out += [(o, v or b"") for o, v in zip(cols.offsets, cols.values, strict=True)]
        else:
            table = c.poll_arrow(timeout_ms=200)
            if table.num_rows:
                out += list(zip(table.column("offset").to_pylist(), table.column("value").to_pylist(), strict=True))
    return out


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["poll", "columns", "arrow"])
def test_interleaved_aborted_transactions_are_never_read(cluster: LocalCluster, how: str) -> None:
    tp = new_topic(cluster)
    plain = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0)
    try:
        with txn_producer(cluster, f"rc-a-{how}") as a, txn_producer(cluster, f"rc-b-{how}") as b:
            for round_ in range(3):
                a.begin_transaction()
                b.begin_transaction()
                for i in range(4):
                    a.send(tp.topic, f"a{round_}.{i}".encode(), partition=0)
                    a.flush()
                    b.send(tp.topic, f"b{round_}.{i}".encode(), partition=0)
                    b.flush()
                    plain.send(tp.topic, f"p{round_}.{i}".encode(), partition=0)
                    plain.flush()
                if round_ == 1:  # a commits its second transaction only, b aborts its third only
                    a.commit_transaction()
                else:
                    a.abort_transaction()
                if round_ == 2:
                    b.abort_transaction()
                else:
                    b.commit_transaction()
    finally:
        plain.close()
    expected = sorted(
        [f"p{r}.{i}".encode() for r in range(3) for i in range(4)]
        + [f"a1.{i}".encode() for i in range(4)]
        + [f"b{r}.{i}".encode() for r in (0, 1) for i in range(4)]
    )
    with consumer(cluster, tp, isolation_level="read_committed", max_partition_fetch_bytes=2048) as c:
        got = read_to_end(c, tp, how)
    offsets = [o for o, _ in got]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert sorted(v for _, v in got) == expected
    with consumer(cluster, tp) as c:
        everything = read_to_end(c, tp, how)
    assert len(everything) == 3 * 12  # read_uncommitted: the aborted records too, no markers


def test_an_open_transaction_holds_read_committed_at_the_last_stable_offset(cluster: LocalCluster) -> None:
    tp = new_topic(cluster)
    plain = Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0)
    try:
        for i in range(3):
            plain.send(tp.topic, f"before{i}".encode(), partition=0).get(timeout=30)  # 0-2
        with txn_producer(cluster, "rc-open") as t:
            t.begin_transaction()
            t.send(tp.topic, b"open0", partition=0)
            t.flush()  # offset 3: the open transaction's first
            for i in range(2):
                plain.send(tp.topic, f"after{i}".encode(), partition=0).get(timeout=30)  # 4-5
            with consumer(cluster, tp, isolation_level="read_committed") as rc, consumer(cluster, tp) as ru:
                assert rc.end_offsets([tp]) == {tp: 3}
                assert ru.end_offsets([tp]) == {tp: 6}
                assert [v for _, v in read_to_end(rc, tp, "poll")] == [b"before0", b"before1", b"before2"]
                # Nothing past the LSO arrives, however long it polls.
                for _ in range(5):
                    assert rc.poll(timeout_ms=100) == {}
                assert rc.position(tp) == 3
                assert rc.last_stable_offset(tp) == 3
                assert rc.highwater(tp) == 6
                assert rc.current_lag(tp) == 0
                assert len(read_to_end(ru, tp, "poll")) == 6
                assert ru.current_lag(tp) == 0

                with consumer(cluster, tp, isolation_level="read_committed", auto_offset_reset="latest") as late:
                    assert late.position(tp) == 3  # "latest" is the LSO
                rc.seek_to_end(tp)
                assert rc.position(tp) == 3

                t.commit_transaction()  # marker at 6: the LSO moves to the high watermark, 7
                got: list[bytes] = []
                wait_for(lambda: rc.end_offsets([tp])[tp] == 7, "the LSO did not move to 7 after the commit")
                while rc.position(tp) < 7:
                    got += [r.value or b"" for r in rc.poll(timeout_ms=200).get(tp, [])]
                assert got == [b"open0", b"after0", b"after1"]
    finally:
        plain.close()
