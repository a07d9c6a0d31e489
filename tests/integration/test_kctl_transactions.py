"""``kctl transactions`` (kafka-transactions.sh) as a subprocess against a real broker:
list and describe an open transaction, and abort a hanging one (a transaction whose
coordinator state is gone, so nothing ever ends it) that holds back the last stable
offset, by its start offset."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from kbroker.cluster import zkdata
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.proto.kbroker.v1 import cluster_pb2, log_pb2, txn_pb2
from kclient.records import encode_batch
from kclient.transport import Transport
from tests.integration.test_kctl import fails, kctl, ok

pytestmark = pytest.mark.integration

TXN_TIMEOUT_MS = 5000
FAST_EXPIRY = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}
"""The coordinator looks for expired transactions every 0.5 s: one it knew would be
aborted within a second of its timeout."""


def _topic(cluster: LocalCluster) -> str:
    name = f"txn-kctl-{uuid.uuid4().hex[:8]}"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 1, 1)])
    return name


def _rows(out: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.split("\t")] for line in out.splitlines()]


def _end(cluster: LocalCluster, tp: TopicPartition, isolation_level: str) -> int:
    with Consumer(bootstrap_servers=cluster.bootstrap, isolation_level=isolation_level) as c:
        return int(c.end_offsets([tp])[tp])


def _values(cluster: LocalCluster, tp: TopicPartition, isolation_level: str) -> list[bytes]:
    with Consumer(
        bootstrap_servers=cluster.bootstrap, isolation_level=isolation_level, auto_offset_reset="earliest"
    ) as c:
        c.assign([tp])
        c.seek_to_beginning(tp)
        end = c.end_offsets([tp])[tp]
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while c.position(tp) < end:
            assert time.monotonic() < deadline, f"stuck at {c.position(tp)} of {end}"
            for recs in c.poll(timeout_ms=200).values():
                out.extend(r.value or b"" for r in recs)
        return out


def test_list_and_describe_an_open_transaction(cluster: LocalCluster) -> None:
    topic = _topic(cluster)
    tid = f"tx-open-{uuid.uuid4().hex[:6]}"
    b = f"--bootstrap-server {cluster.bootstrap}"
    p = Producer(bootstrap_servers=cluster.bootstrap, transactional_id=tid, linger_ms=0, max_block_ms=60000)
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send(topic, b"pending", partition=0)
        p.flush()

        rows = _rows(ok(kctl("transactions list", b)))
        assert rows[0] == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
        [mine] = [r for r in rows[1:] if r[0] == tid]
        assert mine[1] == "0" and mine[3] == "Ongoing" and int(mine[2]) >= 0

        rows = _rows(ok(kctl("transactions describe --transactional-id", tid, b)))
        assert rows[0] == [
            "CoordinatorId",
            "TransactionalId",
            "ProducerId",
            "ProducerEpoch",
            "TransactionState",
            "TransactionTimeoutMs",
            "CurrentTransactionStartTimeMs",
            "TransactionDurationMs",
            "TopicPartitions",
        ]
        coordinator, described, pid, epoch, state, timeout, start, duration, partitions = rows[1]
        assert (coordinator, described, pid, state, partitions) == ("0", tid, mine[2], "Ongoing", f"{topic}-0")
        assert int(epoch) >= 0 and int(timeout) > 0 and int(start) > 0 and int(duration) >= 0

        rows = _rows(ok(kctl("transactions list --duration-filter 3600000", b)))
        assert tid not in [r[0] for r in rows[1:]]  # open for less than an hour

        p.abort_transaction()
    finally:
        p.close()
    fails(kctl("transactions describe --transactional-id", f"never-{tid}", b), mentions="TransactionalIdNotFound")


def _hanging_transaction(cluster: LocalCluster, topic: str, tid: str) -> int:
    """A transaction on ``topic``-0 whose coordinator state is gone: InitProducerId,
    AddPartitionsToTxn and a transactional Produce over raw gRPC, then its
    ``/transaction_state`` znode deleted. Returns its start offset."""
    address = cluster.bootstrap.split(",")[0]
    t = Transport(address)
    try:
        init = t.call(
            address,
            "InitProducerId",
            cluster_pb2.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=TXN_TIMEOUT_MS),
        )
        assert init.error_code == 0, init
        added = t.call(
            address,
            "AddPartitionsToTxn",
            txn_pb2.AddPartitionsToTxnRequest(
                transactional_id=tid,
                producer_id=init.producer_id,
                producer_epoch=init.producer_epoch,
                topics=[txn_pb2.AddPartitionsToTxnTopic(name=topic, partitions=[0])],
            ),
        )
        assert added.error_code == 0 and all(p.error_code == 0 for r in added.topics for p in r.partitions), added
        batch = encode_batch(
            [b"hanging-1", b"hanging-2"],
            producer_id=init.producer_id,
            producer_epoch=init.producer_epoch,
            base_sequence=0,
            is_transactional=True,
        )
        req = log_pb2.ProduceRequest(acks=-1, transactional_id=tid)
        req.topics.add(name=topic).partitions.add(index=0, records=batch)
        [answer] = t.call(address, "Produce", req).topics[0].partitions
        assert answer.error_code == 0, answer
    finally:
        t.close()
    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start(timeout=15)
    try:
        zk.delete(zkdata.transaction_state_path(tid))
    finally:
        zk.stop()
        zk.close()
    return int(answer.base_offset)


def test_abort_a_hanging_transaction_by_its_start_offset(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST_EXPIRY)
    topic = _topic(cluster)
    tp = TopicPartition(topic, 0)
    b = f"--bootstrap-server {cluster.bootstrap}"
    with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=0) as plain:
        plain.send(topic, b"before", partition=0).get(30)
        start = _hanging_transaction(cluster, topic, f"tx-hang-{uuid.uuid4().hex[:6]}")
        plain.send(topic, b"after", partition=0).get(30)
    assert start == 1

    # Well past the transaction's timeout, with the coordinator scanning every 0.5 s: it no
    # longer knows the transaction, so nothing aborts it and read_committed is stuck.
    time.sleep(TXN_TIMEOUT_MS / 1000 + 3)
    assert _end(cluster, tp, "read_uncommitted") == 4
    assert _end(cluster, tp, "read_committed") == start
    assert _values(cluster, tp, "read_committed") == [b"before"]

    # What is no open transaction's start is refused, and nothing is written.
    fails(kctl(f"transactions abort --topic {topic} --partition 0 --start-offset 0", b), mentions="not transactional")
    fails(kctl(f"transactions abort --topic {topic} --partition 0 --start-offset 2", b), mentions="starts at 1")
    fails(
        kctl(f"transactions abort --topic {topic} --partition 0 --start-offset 1 --producer-id 5", b),
        code=2,
        mentions="cannot be combined",
    )
    assert _end(cluster, tp, "read_uncommitted") == 4

    ok(kctl(f"transactions abort --topic {topic} --partition 0 --start-offset {start}", b))

    # The ABORT marker (offset 4) closes it: the last stable offset is the high watermark.
    assert _end(cluster, tp, "read_uncommitted") == 5
    assert _end(cluster, tp, "read_committed") == 5
    assert _values(cluster, tp, "read_committed") == [b"before", b"after"]
    assert _values(cluster, tp, "read_uncommitted") == [b"before", b"hanging-1", b"hanging-2", b"after"]
    fails(kctl(f"transactions abort --topic {topic} --partition 0 --start-offset {start}", b), mentions="has completed")
