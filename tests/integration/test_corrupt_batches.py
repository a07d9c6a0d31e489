"""A record batch that went bad on disk, through a real broker process: one partition's
corrupt batch raises CorruptRecordError for that partition only (naming it and the
offset), the consumer's healthy partitions keep delivering, the application can seek
past it, a Kafka-door Fetch of both partitions returns the healthy one's records, and a
log found corrupt after an unclean shutdown is cut at the bad batch (Kafka's log loader).

Setup (every test): one broker, topic ``corrupt`` with 2 partitions of 3 one-record
batches each; the broker is stopped, one byte of the second batch of partition 0 (a
record value byte, inside the CRC) is flipped, and the broker started again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.local.cluster import BrokerProcess, LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.errors import CorruptRecordError
from kclient.records import decode_batches, iter_headers
from tests.kafka_wire import WireClient
from tests.support import wait_until

pytestmark = pytest.mark.integration

TOPIC = "corrupt"
P0, P1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}


def _write(cluster: LocalCluster) -> None:
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 2, 1)])
    with Producer(bootstrap_servers=cluster.bootstrap, acks=1) as producer:
        for i in range(3):
            for p in (0, 1):
                producer.send(TOPIC, b"p%d-v%d" % (p, i), partition=p)
            producer.flush()  # one record per batch


def _flip_byte_in_second_batch(broker: BrokerProcess) -> int:
    """Flip a value byte of partition 0's second batch; returns that batch's base offset."""
    (segment,) = sorted(Path(broker.data_dir, f"{TOPIC}-0").glob("*.log"))
    data = bytearray(segment.read_bytes())
    batches = list(iter_headers(data))
    assert len(batches) == 3
    pos, header = batches[1]
    at = pos + header.size - 2  # the last byte of the record value (the record's header count follows)
    data[at] ^= 0xFF
    segment.write_bytes(bytes(data))
    return header.base_offset


def _corrupted(cluster_factory: Callable[..., LocalCluster], *, clean: bool) -> LocalCluster:
    cluster = cluster_factory(1, **DOOR)
    _write(cluster)
    broker = cluster.brokers[0]
    if clean:
        broker.stop()
    else:
        broker.kill()
    assert _flip_byte_in_second_batch(broker) == 1
    broker.start()
    wait_until(lambda: _led(cluster), 30, "the restarted broker to lead again")  # after its LeaderAndIsr
    return cluster


def _led(cluster: LocalCluster) -> bool:
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        return all(p.leader == 0 for p in admin.describe_topics([TOPIC])[0].partitions)


@pytest.fixture
def corrupted(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    """Stopped cleanly: the broker trusts its files (as Kafka does) and serves the batch."""
    return _corrupted(cluster_factory, clean=True)


def _poll_both(
    consumer: Consumer, polls: int, until: Callable[[dict[int, list[int]]], bool] | None = None
) -> tuple[dict[int, list[int]], list[str]]:
    """``polls`` calls of ``poll(100)`` (the issue's measure); with ``until``, polls for up
    to 20 s until it holds (a poll that raises returns at once, as Kafka's: a standing
    error is raised before new records have had time to arrive)."""
    got: dict[int, list[int]] = {0: [], 1: []}
    errors: list[str] = []
    deadline = time.monotonic() + 20
    n = 0
    while (n < polls) if until is None else not until(got) and time.monotonic() < deadline:
        n += 1
        try:
            for tp, records in consumer.poll(timeout_ms=100).items():
                got[tp.partition] += [r.offset for r in records]
        except CorruptRecordError as exc:
            errors.append(str(exc))
            if until is not None:
                time.sleep(0.05)
    return got, errors


def test_a_corrupt_batch_stops_only_its_own_partition(corrupted: LocalCluster) -> None:
    with Consumer(bootstrap_servers=corrupted.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([P0, P1])
        # The measure was 30 polls of poll(100); polled by time here, since a poll
        # that raises returns at once (a loaded machine may need more of them).
        got, errors = _poll_both(consumer, 0, until=lambda got: len(got[1]) >= 3)
        if not errors:
            errors = _poll_both(consumer, 5)[1]
    assert got[1] == [0, 1, 2]  # before: 0 of 3
    assert got[0] == [0]
    assert errors, "the corrupt batch never raised"
    assert all(f"{TOPIC}-0" in e and "offset 1" in e for e in errors), errors


def test_healthy_partitions_keep_flowing_while_the_error_stands(corrupted: LocalCluster) -> None:
    with Consumer(bootstrap_servers=corrupted.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([P0, P1])
        got, errors = _poll_both(consumer, 20)
        assert errors and got[1] == [0, 1, 2]
        with Producer(bootstrap_servers=corrupted.bootstrap, acks=1) as producer:
            for i in range(3, 6):
                producer.send(TOPIC, b"p1-v%d" % i, partition=1)
                producer.flush()
        more, more_errors = _poll_both(consumer, 0, until=lambda got: len(got[1]) >= 3)
        assert more[1] == [3, 4, 5]
        assert more_errors  # partition 0 still raises: nothing was skipped behind the application's back
        assert more[0] == []
        assert consumer.position(P0) == 1


def test_the_application_seeks_past_the_corrupt_offset(corrupted: LocalCluster) -> None:
    with Consumer(
        bootstrap_servers=corrupted.bootstrap, auto_offset_reset="earliest", value_deserializer=bytes.decode
    ) as consumer:
        consumer.assign([P0, P1])
        values: dict[int, list[str]] = {0: [], 1: []}
        skipped: list[str] = []
        deadline = time.monotonic() + 30
        while len(values[0]) + len(values[1]) < 5 and time.monotonic() < deadline:
            try:
                for tp, records in consumer.poll(timeout_ms=100).items():
                    values[tp.partition] += [r.value for r in records]
            except CorruptRecordError as exc:
                skipped.append(str(exc))
                consumer.seek(P0, consumer.position(P0) + 1)  # the error stands at the position
    assert values == {0: ["p0-v0", "p0-v2"], 1: ["p1-v0", "p1-v1", "p1-v2"]}
    assert len(skipped) == 1 and f"{TOPIC}-0 at offset 1" in skipped[0]


def test_a_kafka_door_fetch_of_both_partitions_returns_the_healthy_one(corrupted: LocalCluster) -> None:
    address = corrupted.kafka_bootstrap().split(",")[0]
    with WireClient(address) as w:
        resp = w.call(
            1,
            12,
            {
                "replica_id": -1,
                "max_wait": 100,
                "min_bytes": 1,
                "max_bytes": 1 << 20,
                "isolation_level": 0,
                "topics": [
                    {
                        "topic": TOPIC,
                        "partitions": [
                            {"partition": p, "fetch_offset": 0, "partition_max_bytes": 1 << 20} for p in (0, 1)
                        ],
                    }
                ],
            },
        )
    (topic,) = resp.responses
    by_partition = {int(p.partition_index): p for p in topic.partitions}
    assert int(by_partition[1].error_code) == 0
    healthy = [r.value for _, recs in decode_batches(bytes(by_partition[1].records)) for r in recs]
    assert healthy == [b"p1-v0", b"p1-v1", b"p1-v2"]
    # Partition 0: its bytes as stored (Kafka serves what a clean shutdown left, and its
    # consumer's CRC check finds the bad batch), the first batch intact.
    bad = by_partition[0]
    assert int(bad.error_code) == 0
    decoded = decode_batches(bytes(bad.records))
    assert [r.value for r in next(decoded)[1]] == [b"p0-v0"]
    with pytest.raises(CorruptRecordError):
        next(decoded)


def test_an_unclean_shutdown_cuts_the_log_at_the_corrupt_batch(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = _corrupted(cluster_factory, clean=False)
    broker = cluster.brokers[0]
    with Consumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([P0, P1])
        assert consumer.end_offsets([P0, P1]) == {P0: 1, P1: 3}
        got, errors = _poll_both(consumer, 20)
    assert got == {0: [0], 1: [0, 1, 2]} and errors == []
    log_text = broker.log_path.read_text()
    assert "fails its CRC check" in log_text and "truncating" in log_text
    assert broker.running()
    # The partition takes writes again from the cut.
    with Producer(bootstrap_servers=cluster.bootstrap, acks=1) as producer:
        assert producer.send(TOPIC, b"again", partition=0).get(timeout=30).offset == 1
