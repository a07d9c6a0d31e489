"""The producer's role objects against an in-process fake leader (no broker, no network).

Pipelining (several requests in flight), order and sequence numbers across a retriable
failure in the middle, the out-of-order-sequence rules, batch fill by exact size, and
``send_batch`` offsets per record."""

from __future__ import annotations

import time

import pytest

from kclient import Producer
from kclient.partitioner import partition_for_key
from kclient.producer.accumulator import RecordAccumulator
from kclient.records import Compression
from tests.unit.test_producer_fakes import (
    NOT_LEADER_OR_FOLLOWER,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    FakeLeader,
    install_fake_leader,
)


@pytest.fixture
def leader(monkeypatch: pytest.MonkeyPatch) -> FakeLeader:
    return install_fake_leader(monkeypatch)


def wait_until(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def values(n: int, prefix: str = "v") -> list[bytes]:
    return [f"{prefix}{i:05d}".encode() * 10 for i in range(n)]


def test_five_requests_in_flight_and_a_retriable_failure_keeps_order(leader: FakeLeader) -> None:
    """Idempotent, 5 in flight: request 2 of 5 fails retriably; 3-5 then hit a sequence gap
    (OUT_OF_ORDER) and are resent after it, in order; every record lands once, in order."""
    leader.hold = True
    with Producer(bootstrap_servers="x:1", batch_size=1024, linger_ms=0, retry_backoff_ms=10) as p:
        # Until the leader acknowledged a batch of the stream, one is in flight at a time.
        futures = [p.send("t", values(200)[0], partition=0)]
        wait_until(lambda: len(leader.held) == 1)
        leader.take(0).complete()
        futures += [p.send("t", v, partition=0) for v in values(200)[1:]]
        wait_until(lambda: len(leader.held) == 5)
        time.sleep(0.05)
        assert len(leader.held) == 5, "no more than max_in_flight_requests_per_connection requests"
        first, second = leader.take(0), leader.take(0)
        first.complete()
        second.complete(NOT_LEADER_OR_FOLLOWER)
        for _ in range(3):  # sent after the failed one: a gap for the leader
            leader.take(0).complete()
        leader.hold = False
        while leader.held:
            leader.take(0).complete()
        p.flush(10)
        metas = [f.get(5) for f in futures]
    log = leader.logs[("t", 0)]
    assert log == values(200)
    assert [m.offset for m in metas] == list(range(200))
    headers = leader.batch_headers[("t", 0)]
    seq = 0
    for h in headers:
        assert (h.producer_id, h.producer_epoch, h.base_sequence) == (7, 0, seq)
        seq += h.record_count
    assert len(headers) > 5
    # Only the three batches sent behind the failed one hit the gap: the retries went
    # alone and in order, and nothing new overtook them.
    assert leader.out_of_order == 3


def test_out_of_order_for_the_first_unresolved_batch_restarts_the_epoch(leader: FakeLeader) -> None:
    """A gap the producer did not cause (the leader lost acknowledged records): the batch is
    resent at sequence 0 in the next epoch, as Kafka 2.5+ does."""
    leader.hold = True
    with Producer(bootstrap_servers="x:1", batch_size=1024, linger_ms=0, retry_backoff_ms=10) as p:
        f1 = p.send("t", b"a", partition=0)
        wait_until(lambda: len(leader.held) == 1)
        leader.take().complete()
        f1.get(5)
        f2 = p.send("t", b"b", partition=0)
        wait_until(lambda: len(leader.held) == 1)
        leader.take().complete(OUT_OF_ORDER_SEQUENCE_NUMBER)
        leader.hold = False
        while leader.held:
            leader.take().complete()
        assert f2.get(5).offset == 1
    (h1, h2) = leader.batch_headers[("t", 0)]
    assert (h1.producer_epoch, h1.base_sequence) == (0, 0)
    assert (h2.producer_epoch, h2.base_sequence) == (1, 0)


def test_without_idempotence_max_in_flight_one_sends_one_at_a_time(leader: FakeLeader) -> None:
    leader.hold = True
    with Producer(
        bootstrap_servers="x:1", acks=1, batch_size=1024, linger_ms=0, max_in_flight_requests_per_connection=1
    ) as p:
        futures = [p.send("t", v, partition=0) for v in values(30)]
        wait_until(lambda: len(leader.held) == 1)
        time.sleep(0.05)
        assert len(leader.held) == 1
        leader.hold = False
        while leader.held:
            leader.take().complete()
        p.flush(10)
        assert [f.get(5).offset for f in futures] == list(range(30))
    assert leader.max_held == 1
    assert all(h.producer_id == -1 for h in leader.batch_headers[("t", 0)])


def test_batches_are_filled_by_their_exact_size() -> None:
    """batch_size 16 KiB, 100-byte values: every closed batch is at least 95 % full."""
    acc = RecordAccumulator(
        batch_size=16384, buffer_memory=1 << 25, linger_ms=1000, compression=Compression.NONE, max_block_ms=1000
    )
    now = int(time.time() * 1000)
    for _ in range(2000):
        acc.append("t", 0, (0,), now, None, b"x" * 100, (), 200)
    batches = list(acc.queues[next(iter(acc.queues))].batches)
    full = batches[:-1]
    assert len(full) >= 10
    for b in full:
        assert b.closed
        assert b.size <= 16384
        assert b.size >= 0.95 * 16384, f"batch only {b.size / 16384:.0%} full"


def test_send_batch_reports_every_records_offset(leader: FakeLeader) -> None:
    leader.partitions = 3
    keys = [f"key-{i % 13}".encode() for i in range(500)]
    with Producer(bootstrap_servers="x:1", linger_ms=0) as p:
        before = p.send_batch("t", values(7, "w")).get(5)  # keyless: one batch, sticky partition
        meta = p.send_batch("t", values(500), keys=keys).get(5)
    assert len(before) == 7 and len(set(before.partitions)) == 1
    assert meta.partitions == [partition_for_key(k, 3) for k in keys]
    for i, m in enumerate(meta):
        assert leader.logs[("t", m.partition)][m.offset] == values(500)[i]
    assert meta[3] == list(meta)[3]
    assert sum(count for _, _, count in meta.runs) == 500


def test_send_batch_splits_at_max_request_size(leader: FakeLeader) -> None:
    with Producer(bootstrap_servers="x:1", acks=1, max_request_size=20000, batch_size=1024) as p:
        meta = p.send_batch("t", [b"y" * 100] * 1000).get(5)
    assert meta.offsets == list(range(1000))
    sizes = [h.size for h in leader.batch_headers[("t", 0)]]
    assert len(sizes) > 5
    assert max(sizes) <= 20000 - 1024
    assert min(sizes[:-1]) >= 0.95 * (20000 - 1024), sizes


def test_send_batch_checks_its_input(leader: FakeLeader) -> None:
    with Producer(bootstrap_servers="x:1", acks=1) as p:
        with pytest.raises(ValueError):
            p.send_batch("t", [b"a", b"b"], keys=[b"k"])
        with pytest.raises(TypeError):
            p.send_batch("t", [b"a", "b"])
        assert len(p.send_batch("t", []).get(1)) == 0
        meta = p.send_batch("t", [b"a", None], headers=[[("h", b"1")], None], timestamps=[5, 6]).get(5)
    assert meta.timestamps == [5, 6]
    assert leader.logs[("t", 0)] == [b"a", None]


def test_partition_lists_are_cached_and_follow_metadata_refreshes(leader: FakeLeader) -> None:
    """send() reads a cached partition list; a metadata refresh (here: due by age) rebuilds it."""
    with Producer(bootstrap_servers="x:1", acks=1, linger_ms=0) as p:
        assert p.send("t", b"a", key=b"k").get(5).partition == 0
        leader.partitions = 4
        assert p.send("t", b"b", key=b"k").get(5).partition == 0  # still the cached single partition
        leader.refresh_due = True
        wait_until(lambda: leader.refreshes == 1)
        wait_until(lambda: p.send("t", b"c", key=b"k").get(5).partition == partition_for_key(b"k", 4))


def test_concurrent_senders_keep_each_threads_order(leader: FakeLeader) -> None:
    import threading

    with Producer(bootstrap_servers="x:1", batch_size=2048, linger_ms=1) as p:

        def run(name: str) -> None:
            for i in range(2000):
                p.send("t", f"{name}-{i}".encode(), partition=0)

        threads = [threading.Thread(target=run, args=(str(n),)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        p.flush(10)
    log = leader.logs[("t", 0)]
    assert len(log) == 8000
    for n in range(4):
        mine = [int(v.split(b"-")[1]) for v in log if v is not None and v.startswith(f"{n}-".encode())]
        assert mine == list(range(2000))
