"""Log compaction (cleanup.policy=compact) against real broker processes."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import grpc
import pytest

from kbroker.local.cluster import BrokerProcess, LocalCluster
from kbroker.storage import files
from kbroker.storage.cleaner import PAUSE_ENV
from kbroker.storage.cleaner_manager import CLEANER_CHECKPOINT
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.errors import InvalidRecordError
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2
from kclient.records import BatchHeader, Record, decode_batches

pytestmark = pytest.mark.integration

FAST_CLEANER = {"log.cleaner.backoff.ms": "100"}
COMPACT = {
    "cleanup.policy": "compact",
    "segment.bytes": "65536",
    "segment.ms": "1000",
    "min.cleanable.dirty.ratio": "0.01",
    "file.delete.delay.ms": "0",
}


def create(cluster: LocalCluster, name: str, **configs: str) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, 1, 1, topic_configs={**COMPACT, **configs})])


@functools.cache
def stub_for(address: str) -> broker_pb2_grpc.BrokerStub:
    return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(address))


def fetch_all(address: str, topic: str) -> list[tuple[BatchHeader, list[Record]]]:
    """Every batch of partition 0 from offset 0, by raw Fetch (following batch ends over gaps)."""
    out: list[tuple[BatchHeader, list[Record]]] = []
    offset = 0
    while True:
        req = log_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, max_bytes=8 << 20)
        req.topics.add(name=topic).partitions.add(index=0, fetch_offset=offset, partition_max_bytes=8 << 20)
        pr = stub_for(address).Fetch(req, timeout=10).topics[0].partitions[0]
        assert pr.error_code == 0, pr.error_message
        if not pr.records:
            return out
        for header, records in decode_batches(pr.records):
            if header.last_offset >= offset:
                out.append((header, [r for r in records if r.offset >= offset]))
                offset = header.next_offset


def leads(address: str, topic: str) -> bool:
    """Does the broker at ``address`` lead partition 0 (a restarted broker leads once the
    controller's LeaderAndIsr reached it)?"""
    req = log_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, max_bytes=1)
    req.topics.add(name=topic).partitions.add(index=0, fetch_offset=0, partition_max_bytes=1)
    return stub_for(address).Fetch(req, timeout=10).topics[0].partitions[0].error_code == 0


def records_of(batches: list[tuple[BatchHeader, list[Record]]]) -> list[Record]:
    return [r for _, rs in batches for r in rs]


def consume_all(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record, read by a fresh kclient Consumer."""
    tp = TopicPartition(topic, 0)
    out: list[tuple[int, bytes | None, bytes | None]] = []
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", max_poll_records=10_000) as c:
        c.assign([tp])
        c.seek_to_beginning(tp)
        end = c.end_offsets([tp])[tp]
        deadline = time.monotonic() + timeout_s
        while c.position(tp) < end:
            assert time.monotonic() < deadline, f"consumer stuck at {c.position(tp)} of {end}"
            for recs in c.poll(timeout_ms=200).values():
                out.extend((r.offset, r.key, r.value) for r in recs)
    return out


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def cleaned_to(broker: BrokerProcess, topic: str) -> int:
    """The broker's cleaner checkpoint of partition 0 (-1 if none yet)."""
    try:
        saved = files.read_offsets_checkpoint(broker.data_dir / CLEANER_CHECKPOINT)
    except Exception:
        return -1
    return saved.get((topic, 0), -1)


def roll_with_sentinel(producer: Producer, topic: str) -> int:
    """Wait out segment.ms and append one record: every earlier one is now in a closed
    segment (cleanable). Returns the sentinel's offset."""
    time.sleep(1.1)
    return producer.send(topic, b"end", key=b"sentinel").get(10).offset


def update_many(producer: Producer, topic: str, n: int, keys: int) -> dict[bytes, bytes]:
    latest: dict[bytes, bytes] = {}
    chunk = 500
    futures = []
    for start in range(0, n, chunk):
        ks = [f"key-{i % keys:04d}".encode() for i in range(start, min(start + chunk, n))]
        vs = [f"value-{i}".encode() for i in range(start, min(start + chunk, n))]
        futures.append(producer.send_batch(topic, vs, keys=ks, partition=0))
        latest.update(zip(ks, vs, strict=True))
    for f in futures:
        f.get(30)
    return latest


def test_a_changelog_is_compacted_to_the_latest_value_of_every_key(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(1, **FAST_CLEANER)
    broker = cluster.brokers[0]
    create(cluster, "changelog")
    with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5, compression_type="lz4") as p:
        latest = update_many(p, "changelog", 100_000, 1_000)
        sentinel = roll_with_sentinel(p, "changelog")
    wait_until("the cleaner", lambda: cleaned_to(broker, "changelog") == sentinel)
    records = consume_all(cluster.bootstrap, "changelog")
    offsets = [o for o, _, _ in records]
    assert offsets == sorted(set(offsets)), "increasing offsets, no duplicates"
    assert len(records) == 1_001
    assert {k: v for _, k, v in records if k != b"sentinel"} == latest
    # The offsets are the original ones: the last update of key-0999 was record 99,999.
    assert (99_999, b"key-0999", b"value-99999") in records
    # A fetch at a compacted-away offset answers from the next record on.
    batches = fetch_all(broker.address, "changelog")
    assert records_of(batches)[0].offset > 0
    # ListOffsets stays right: the first record stamped at or after the sentinel's time is it.
    with Consumer(bootstrap_servers=cluster.bootstrap) as c:
        tp = TopicPartition("changelog", 0)
        ts = next(r.timestamp for r in records_of(batches) if r.key == b"sentinel")
        assert c.offsets_for_times({tp: ts})[tp].offset == sentinel


def test_tombstones_delete_keys_and_go_after_delete_retention(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST_CLEANER)
    broker = cluster.brokers[0]
    create(cluster, "deletes", **{"delete.retention.ms": "5000"})
    with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=1) as p:
        latest = update_many(p, "deletes", 200, 10)
        for k in (b"key-0003", b"key-0007"):
            p.send("deletes", None, key=k).get(10)
        sentinel = roll_with_sentinel(p, "deletes")
    wait_until("the cleaner", lambda: cleaned_to(broker, "deletes") == sentinel)
    seen = {r.key: r.value for r in records_of(fetch_all(broker.address, "deletes"))}
    assert seen[b"key-0003"] is None and seen[b"key-0007"] is None, "tombstones stay for delete.retention.ms"
    assert len(seen) == 11
    cleaned_at = time.monotonic()

    def tombstones_gone() -> bool:
        return b"key-0003" not in {r.key for r in records_of(fetch_all(broker.address, "deletes"))}

    wait_until("the tombstones to go", tombstones_gone, timeout_s=40)
    assert time.monotonic() - cleaned_at > 1.0  # kept a while (5 s after the pass that first saw them)
    records = records_of(fetch_all(broker.address, "deletes"))
    expected = {k: v for k, v in latest.items() if k not in (b"key-0003", b"key-0007")}
    assert {r.key: r.value for r in records} == {**expected, b"sentinel": b"end"}
    assert len(records) == 9


def test_a_consumer_reads_past_batches_emptied_by_cleaning(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST_CLEANER)
    broker = cluster.brokers[0]
    create(cluster, "emptied", **{"delete.retention.ms": "300"})
    with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=1) as p:
        p.send("emptied", b"1", key=b"a", partition=0).get(10)
        p.send("emptied", None, key=b"b", partition=0).get(10)  # the segment's last batch, a tombstone
        sentinel = roll_with_sentinel(p, "emptied")

    def tombstone_gone() -> bool:
        return [r.key for r in records_of(fetch_all(broker.address, "emptied"))] == [b"a", b"sentinel"]

    wait_until("the tombstone to go", tombstone_gone, timeout_s=20)
    assert sentinel == 2
    # Offset 1 is now an empty batch (it ends the cleaned segment).
    assert [(o, k) for o, k, _ in consume_all(cluster.bootstrap, "emptied", timeout_s=5)] == [
        (0, b"a"),
        (2, b"sentinel"),
    ]


def test_a_keyless_record_to_a_compacted_topic_is_refused(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST_CLEANER)
    create(cluster, "keyed")
    with Producer(bootstrap_servers=cluster.bootstrap) as p:
        with pytest.raises(InvalidRecordError):
            p.send("keyed", b"no key", partition=0).get(10)
        assert p.send("keyed", b"v", key=b"k", partition=0).get(10).offset == 0


def test_compressed_batches_and_an_idempotent_producer_survive_cleaning(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(1, **FAST_CLEANER)
    broker = cluster.brokers[0]
    create(cluster, "zipped")
    with Producer(bootstrap_servers=cluster.bootstrap, compression_type="gzip", enable_idempotence=True) as p:
        latest = update_many(p, "zipped", 5_000, 50)
        sentinel = roll_with_sentinel(p, "zipped")
        wait_until("the cleaner", lambda: cleaned_to(broker, "zipped") == sentinel)
        # The producer keeps going after its batches were cleaned: no sequence error.
        assert p.send("zipped", b"after", key=b"key-0001", partition=0).get(10).offset == sentinel + 1
    batches = fetch_all(broker.address, "zipped")
    assert {h.compression.name for h, rs in batches if rs and h.producer_id >= 0} == {"GZIP"}
    seen = {r.key: r.value for r in records_of(batches)}
    assert seen == {**latest, b"sentinel": b"end", b"key-0001": b"after"}
    assert len(records_of(batches)) == 52


@pytest.mark.parametrize("stage", ["after-cleaned", "after-swap", "after-delete", "after-replace"])
def test_sigkill_at_each_swap_stage_loses_nothing(
    cluster_factory: Callable[..., LocalCluster], monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    monkeypatch.setenv(PAUSE_ENV, stage)
    cluster = cluster_factory(1, **FAST_CLEANER)
    broker = cluster.brokers[0]
    # Cleaning starts once the producer is done: a pause inside the swap holds the log's lock.
    create(cluster, "crashy", **{"min.compaction.lag.ms": "2500"})
    with Producer(bootstrap_servers=cluster.bootstrap, linger_ms=5) as p:
        latest = update_many(p, "crashy", 20_000, 100)
        sentinel = roll_with_sentinel(p, "crashy")
    marker = broker.data_dir / f"cleaner-paused-{stage}"
    wait_until(f"the cleaner to pause {stage}", marker.exists)
    broker.kill()
    monkeypatch.delenv(PAUSE_ENV)
    marker.unlink()
    broker.start()
    wait_until("the restarted broker to lead", lambda: leads(broker.address, "crashy"))
    # Straight after the restart: everything is there, once per offset.
    records = records_of(fetch_all(broker.address, "crashy"))
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets)), "no duplicate offsets"
    assert {r.key: r.value for r in records} == {**latest, b"sentinel": b"end"}
    assert offsets[-1] == sentinel
    # And the cleaner finishes the job.
    wait_until("the cleaner", lambda: cleaned_to(broker, "crashy") == sentinel)
    records = records_of(fetch_all(broker.address, "crashy"))
    assert len(records) == 101 and {r.key: r.value for r in records} == {**latest, b"sentinel": b"end"}
