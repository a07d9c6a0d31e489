"""librdkafka through the Kafka door under faults: SIGKILL the partition leader while an
idempotent acks=all confluent-kafka producer streams; every acknowledged record is read
back exactly once (through the Kafka door, and through gRPC)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

from kbroker.local.cluster import LocalCluster
from tests.integration.test_faults import FAST, read_everything, start_topic
from tests.support import wait_until

ck = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.integration

DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}


class RdkafkaProducer(threading.Thread):
    """Produces "0", "1", ... with enable.idempotence and acks=all; records what was
    acknowledged (value -> partition, offset)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.producer = ck.Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 120000,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.acked: dict[int, tuple[int, int]] = {}
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.sent = 0

    def _delivered(self, err: object, msg: object) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.acked[int(msg.value())] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.producer.produce(self.topic, value=str(self.sent).encode(), on_delivery=self._delivered)
                self.sent += 1
            except BufferError:
                pass
            self.producer.poll(0.001 if self.sent % 50 else 0.01)
        self.producer.flush(120)


def test_sigkill_the_leader_under_an_idempotent_rdkafka_producer_loses_nothing(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(3, **FAST, **DOOR)
    view = start_topic(cluster, "door-bounce")
    producer = RdkafkaProducer(cluster.kafka_bootstrap(), "door-bounce")
    producer.start()
    try:
        wait_until(lambda: len(producer.acked) > 500, what="first acks")
        for round_ in range(3):
            target = view.state("door-bounce", round_ % 3).leader
            before = len(producer.acked)
            cluster.brokers[target].kill()
            wait_until(lambda t=target: t not in view.live(), what=f"broker {target} to leave ZooKeeper")
            wait_until(lambda b=before: len(producer.acked) > b + 300, timeout_s=90, what="acks after failover")
            cluster.brokers[target].start()
            wait_until(lambda: all(len(view.state("door-bounce", p).isr) == 3 for p in range(3)), what="ISR to heal")
    finally:
        producer.stop.set()
        producer.join(180)
        view.close()
    assert not producer.failed, producer.failed[:5]
    assert len(producer.acked) == producer.sent  # flushed: everything sent was acknowledged

    # Read back through gRPC: every acknowledged value once, at the offset it was acked at.
    by_partition = read_everything(cluster.bootstrap, "door-bounce", 3)
    seen = Counter(int(r.value) for records in by_partition.values() for r in records)
    duplicated = [v for v, n in seen.items() if n > 1]
    missing = [v for v in producer.acked if v not in seen]
    assert not missing and not duplicated, (missing[:10], duplicated[:10])
    where = {int(r.value): (p, r.offset) for p, records in by_partition.items() for r in records}
    assert all(where[v] == at for v, at in producer.acked.items())

    # And through the Kafka door, with librdkafka.
    consumer = ck.Consumer(
        {"bootstrap.servers": cluster.kafka_bootstrap(), "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([ck.TopicPartition("door-bounce", p, 0) for p in range(3)])
    values: Counter[int] = Counter()
    deadline = time.monotonic() + 60
    while sum(values.values()) < len(producer.acked) and time.monotonic() < deadline:
        for m in consumer.consume(1000, 1.0):
            if m.error() is None:
                values[int(m.value())] += 1
    consumer.close()
    assert values == Counter(producer.acked.keys())
