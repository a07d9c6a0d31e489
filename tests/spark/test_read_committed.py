"""``kafka.isolation.level`` through ``spark.read.format("kbroker")`` against real brokers:
read_committed rows are the plain and committed records only, and its "latest" end is the
last stable offset (an open transaction's records are not read); read_uncommitted rows
include the aborted records."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pyspark")

from kclient import Producer

pytestmark = pytest.mark.integration


def reader(spark: Any, bootstrap: str, **options: str) -> Any:
    r = spark.read.format("kbroker").option("bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r


def test_read_committed_batch_reads_committed_records_up_to_the_lso(
    spark: Any, bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(2)
    plain = Producer(bootstrap_servers=bootstrap, linger_ms=0)
    txn = Producer(bootstrap_servers=bootstrap, transactional_id=f"spark-{topic}", linger_ms=0, max_block_ms=60000)
    try:
        txn.init_transactions()
        txn.begin_transaction()
        for i in range(10):
            txn.send(topic, b"c%d" % i, partition=i % 2)
        txn.commit_transaction()
        txn.begin_transaction()
        for i in range(6):
            txn.send(topic, b"a%d" % i, partition=i % 2)
            plain.send(topic, b"p%d" % i, partition=i % 2)
        txn.flush()
        txn.abort_transaction()
        plain.flush()
        txn.begin_transaction()
        txn.send(topic, b"open", partition=0)
        txn.flush()  # open: partition 0's LSO stops here
        plain.send(topic, b"after-open", partition=0).get(timeout=30)

        def values(**options: str) -> list[bytes]:
            rows = reader(spark, bootstrap, subscribe=topic, **options).load().select("value").collect()
            return sorted(bytes(r.value) for r in rows)

        committed = sorted([b"c%d" % i for i in range(10)] + [b"p%d" % i for i in range(6)])
        assert values(**{"kafka.isolation.level": "read_committed"}) == committed
        everything = values()
        assert everything == sorted([*committed, *(b"a%d" % i for i in range(6)), b"open", b"after-open"])

        txn.commit_transaction()
        assert values(**{"kafka.isolation.level": "read_committed"}) == sorted([*committed, b"open", b"after-open"])
    finally:
        txn.close()
        plain.close()
