"""kclient's transactional producer (KIP-98) through gRPC against real brokers: a committed
transaction is visible to read_committed consumers, an aborted one only to
read_uncommitted ones, offsets sent to the transaction become the group's when it
commits and never when it aborts, and a second producer with the same transactional id
fences the first."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.errors import IllegalGenerationError, InvalidProducerEpochError, ProducerFencedError

pytestmark = pytest.mark.integration


def create(cluster: LocalCluster, name: str, partitions: int = 1) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])


def producer(cluster: LocalCluster, transactional_id: str) -> Producer:
    return Producer(
        bootstrap_servers=cluster.bootstrap, transactional_id=transactional_id, linger_ms=0, max_block_ms=60000
    )


def read(
    cluster: LocalCluster, topic: str, partitions: int, isolation_level: str, timeout_s: float = 30
) -> list[bytes]:
    """Every value a fresh consumer with ``isolation_level`` reads up to the end offsets
    (the last stable offsets for read_committed), in offset order per partition. A
    read_committed read first waits until every transaction is decided (the last stable
    offsets reach the high watermarks): a commit returns once it is decided, and its
    markers follow."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: dict[TopicPartition, list[tuple[int, bytes]]] = {tp: [] for tp in tps}
    deadline = time.monotonic() + timeout_s
    with Consumer(
        bootstrap_servers=cluster.bootstrap, isolation_level=isolation_level, auto_offset_reset="earliest"
    ) as c:
        c.assign(tps)
        c.seek_to_beginning(*tps)
        end = c.end_offsets(tps)
        if isolation_level == "read_committed":
            with Consumer(bootstrap_servers=cluster.bootstrap) as plain:
                high = plain.end_offsets(tps)
            while end != high:
                assert time.monotonic() < deadline, f"undecided: last stable offsets {end}, high watermarks {high}"
                time.sleep(0.1)
                end = c.end_offsets(tps)
        while any(c.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"stuck at {[c.position(tp) for tp in tps]} of {end}"
            for tp, recs in c.poll(timeout_ms=200).items():
                out[tp].extend((r.offset, r.value or b"") for r in recs)
    return [v for tp in tps for _, v in sorted(out[tp])]


def test_committed_records_are_visible_and_aborted_ones_only_read_uncommitted(cluster: LocalCluster) -> None:
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    create(cluster, topic, 2)
    p = producer(cluster, "tx-commit-abort")
    try:
        p.init_transactions()
        p.begin_transaction()
        for i in range(10):
            p.send(topic, f"c{i}".encode(), partition=i % 2)
        p.commit_transaction()

        p.begin_transaction()
        for i in range(5):
            p.send(topic, f"a{i}".encode(), partition=i % 2)
        p.flush()  # written to the logs, then aborted
        p.abort_transaction()

        p.begin_transaction()
        p.send(topic, b"last", partition=0)
        p.commit_transaction()
    finally:
        p.close()
    committed = read(cluster, topic, 2, "read_committed")
    assert sorted(committed) == sorted([f"c{i}".encode() for i in range(10)] + [b"last"])
    uncommitted = read(cluster, topic, 2, "read_uncommitted")
    assert sorted(uncommitted) == sorted(
        [f"c{i}".encode() for i in range(10)] + [f"a{i}".encode() for i in range(5)] + [b"last"]
    )


def test_offsets_sent_to_a_transaction_are_committed_with_it_only(cluster: LocalCluster) -> None:
    topic = f"txn-out-{uuid.uuid4().hex[:8]}"
    source = f"txn-in-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    create(cluster, topic)
    create(cluster, source)
    p = producer(cluster, "tx-offsets")
    tp = TopicPartition(source, 0)
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"x", partition=0)
        p.send_offsets_to_transaction({tp: 5}, group)
        p.abort_transaction()
        with AdminClient(cluster.bootstrap) as admin:
            assert tp not in admin.list_consumer_group_offsets(group)

        p.begin_transaction()
        p.send(topic, b"y", partition=0)
        p.send_offsets_to_transaction({tp: 7}, group)
        p.commit_transaction()
    finally:
        p.close()
    with AdminClient(cluster.bootstrap) as admin:
        deadline = time.monotonic() + 30
        while admin.list_consumer_group_offsets(group).get(tp) is None:
            assert time.monotonic() < deadline, "the committed transaction's offsets never appeared"
            time.sleep(0.2)
        assert admin.list_consumer_group_offsets(group)[tp].offset == 7
    assert read(cluster, topic, 1, "read_committed") == [b"y"]


def test_a_second_producer_with_the_same_id_fences_the_first(cluster: LocalCluster) -> None:
    topic = f"txn-fence-{uuid.uuid4().hex[:8]}"
    create(cluster, topic)
    old = producer(cluster, "tx-fenced")
    new = producer(cluster, "tx-fenced")
    try:
        old.init_transactions()
        old.begin_transaction()
        old.send(topic, b"zombie", partition=0)
        old.flush()
        new.init_transactions()  # aborts the old producer's open transaction
        with pytest.raises((ProducerFencedError, InvalidProducerEpochError)):
            old.send(topic, b"zombie-2", partition=0).get(30)
            old.commit_transaction()
        with pytest.raises((ProducerFencedError, InvalidProducerEpochError)):
            old.commit_transaction()
        new.begin_transaction()
        new.send(topic, b"fresh", partition=0)
        new.commit_transaction()
        with AdminClient(cluster.bootstrap) as admin:
            deadline = time.monotonic() + 30  # the commit is decided; its markers follow
            while (described := admin.describe_transactions(["tx-fenced"])[0]).state != "CompleteCommit":
                assert time.monotonic() < deadline, f"the commit is still {described.state}"
                time.sleep(0.1)
            listed = admin.list_transactions(producer_ids=[described.producer_id])
            assert [t.transactional_id for t in listed] == ["tx-fenced"]
    finally:
        old.close(1)
        new.close()
    assert read(cluster, topic, 1, "read_committed") == [b"fresh"]


FAST = {"zookeeper.session.timeout.ms": "3000", "replica.lag.time.max.ms": "3000"}


def test_commit_survives_a_sigkill_of_the_transaction_coordinator(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    """The producer finds the new coordinator (another live broker) after a SIGKILL of its
    coordinator mid-transaction; the new one reads the transaction from ZooKeeper and
    commits it: every record visible to read_committed, once."""
    cluster = cluster_factory(3, **FAST)
    topic = f"txn-kill-{uuid.uuid4().hex[:8]}"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 3, 3)])
    tid = f"tx-kill-{uuid.uuid4().hex[:8]}"
    p = Producer(
        bootstrap_servers=cluster.bootstrap, transactional_id=tid, linger_ms=0, max_block_ms=120000,
        request_timeout_ms=10000,
    )  # fmt: skip
    try:
        p.init_transactions()
        p.begin_transaction()
        for i in range(30):
            p.send(topic, f"v{i}".encode(), partition=i % 3)
        p.flush()
        with AdminClient(cluster.bootstrap) as admin:
            coordinator, _ = admin.find_transaction_coordinator(tid)
        cluster.brokers[coordinator].kill()
        p.commit_transaction(120)
    finally:
        p.close(5)
    assert sorted(read(cluster, topic, 3, "read_committed", timeout_s=90)) == sorted(
        f"v{i}".encode() for i in range(30)
    )


def test_a_zombie_consumers_offsets_are_refused(cluster: LocalCluster) -> None:
    """KIP-447: send_offsets_to_transaction with the consumer's group metadata; a member
    or generation the group no longer has is refused, and nothing of it is committed."""
    topic = f"txn-zombie-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    create(cluster, topic)
    tp = TopicPartition(topic, 0)
    with Consumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group, enable_auto_commit=False) as c:
        deadline = time.monotonic() + 30
        while not c.assignment():
            assert time.monotonic() < deadline, "the consumer never joined"
            c.poll(timeout_ms=200)
        current = c.group_metadata()
        assert current.group_id == group and current.generation_id >= 1 and current.member_id
        p = producer(cluster, f"tx-zombie-{uuid.uuid4().hex[:8]}")
        try:
            p.init_transactions()
            p.begin_transaction()
            p.send_offsets_to_transaction({tp: 5}, current)
            p.commit_transaction()
            stale = current._replace(generation_id=current.generation_id - 1)
            p.begin_transaction()
            with pytest.raises(IllegalGenerationError):
                p.send_offsets_to_transaction({tp: 9}, stale)
            p.abort_transaction()
        finally:
            p.close()
        assert c.committed(tp) == 5
