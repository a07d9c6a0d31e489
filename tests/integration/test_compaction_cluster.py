"""Compaction of a replicated topic: every replica cleans its own copy, across a leader failover."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.local.cluster import BrokerProcess, LocalCluster
from kbroker.storage import files
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient import AdminClient, NewTopic, Producer
from kclient.records import Record
from tests.integration.test_compaction import COMPACT, FAST_CLEANER, cleaned_to, update_many, wait_until

pytestmark = pytest.mark.integration


def leader_of(bootstrap: str, topic: str) -> int:
    with AdminClient(bootstrap) as admin:
        return int(admin.describe_topics([topic])[0].partitions[0].leader)


def full_isr(bootstrap: str, topic: str) -> bool:
    try:
        with AdminClient(bootstrap) as admin:
            p = admin.describe_topics([topic])[0].partitions[0]
        return p.leader >= 0 and len(p.isr) == len(p.replicas)
    except Exception:
        return False


def partition_dir(broker: BrokerProcess, topic: str) -> Path:
    return broker.data_dir / files.partition_dir_name(topic, 0)


def active_base(broker: BrokerProcess, topic: str) -> int:
    return max(files.offset_from_filename(p.name) for p in partition_dir(broker, topic).glob("*.log"))


def replica_records(broker: BrokerProcess, topic: str) -> list[Record]:
    """Every record of the broker's (stopped) replica, read from its files."""
    from kclient.records import decode_batches

    log = Log.open(partition_dir(broker, topic), LogConfig(), clean_shutdown=True)
    try:
        out: list[Record] = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            info = log.read(offset, 1 << 20)
            for _, records in decode_batches(info.records):
                out.extend(r for r in records if r.offset >= offset)
            offset = info.next_offset
        return out
    finally:
        log.close()


def test_replicas_clean_their_own_copies_and_agree_after_a_leader_failover(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(3, **FAST_CLEANER)
    topic = "replicated"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 3, topic_configs={**COMPACT, "min.insync.replicas": "2"})])
    wait_until("a full ISR", lambda: full_isr(cluster.bootstrap, topic))
    first_leader = cluster.brokers[leader_of(cluster.bootstrap, topic)]
    latest: dict[bytes, bytes] = {}
    with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, delivery_timeout_ms=60_000) as p:
        latest.update(update_many(p, topic, 20_000, 200))
        # The cleaners are at work on the rolled segments: the leader dies meanwhile.
        time.sleep(0.3)
        first_leader.kill()
        latest.update(update_many(p, topic, 20_000, 200))
        wait_until("a new leader", lambda: leader_of(cluster.bootstrap, topic) != first_leader.broker_id)
        first_leader.start()
        wait_until("a full ISR again", lambda: full_isr(cluster.bootstrap, topic), timeout_s=60)
        time.sleep(1.1)
        sentinel = p.send(topic, b"end", key=b"sentinel", partition=0).get(10).offset
        latest[b"sentinel"] = b"end"
    brokers = list(cluster.brokers.values())
    for b in brokers:
        wait_until(
            f"broker {b.broker_id}'s cleaner",
            lambda b=b: cleaned_to(b, topic) >= sentinel and cleaned_to(b, topic) == active_base(b, topic),
            timeout_s=60,
        )
    cluster.stop()
    replicas = {b.broker_id: replica_records(b, topic) for b in brokers}
    by_offset: dict[int, tuple[bytes | None, bytes | None]] = {}
    for broker_id, records in replicas.items():
        offsets = [r.offset for r in records]
        assert offsets == sorted(set(offsets)), f"broker {broker_id}: duplicate offsets"
        assert {r.key: r.value for r in records} == latest, f"broker {broker_id}: wrong latest values"
        assert len(records) == len(latest), f"broker {broker_id} is not compacted"
        for r in records:
            # Replicas agree on every offset they both still hold.
            assert by_offset.setdefault(r.offset, (r.key, r.value)) == (r.key, r.value)
