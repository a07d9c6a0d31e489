"""Exactly-once consume-transform-produce under faults (KIP-98, KIP-447): a transactional
copier (its own process; confluent-kafka through the Kafka door, or kclient over gRPC)
copies an input topic to an output topic, committing its input offsets with
``send_offsets_to_transaction``, while a producer keeps writing the input.
Meanwhile the test SIGKILLs the copier, the transaction coordinator and the output
partitions' leaders, several times each. Afterwards a read_committed consumer sees every
input record exactly once in the output, nothing else, and the group's committed input
offsets are the input's end offsets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, TopicPartition
from tests.integration.test_faults import FAST, ZkView
from tests.support import wait_until

ck = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.integration

DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}
TXN_ID = "eos-copier"
GROUP = "eos-copier"
REPO = Path(__file__).resolve().parents[2]


class Copier:
    """The copier process (tests/integration/eos_copier.py), restartable; keeps its output."""

    def __init__(self, client: str, bootstrap: str, log: Path) -> None:
        self.client = client
        self.bootstrap = bootstrap
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = self.log.open("ab")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", "tests.integration.eos_copier", "--client", self.client]
        cmd += [self.bootstrap, "in", "out", GROUP, TXN_ID]
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        out.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def committed(self) -> int:
        """Transactions committed by every incarnation so far."""
        return sum(1 for line in self.log.read_text(errors="replace").splitlines() if line.startswith("committed"))

    def check_alive(self) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        assert code is None, f"the copier exited with {code}:\n{self.tail()}"

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-12000:]


class InputProducer(threading.Thread):
    """Writes "0", "1", ... to the input (idempotent, acks=all) until stopped."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.producer = ck.Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
        )
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        while not self.stop.is_set():
            for _ in range(20):
                try:
                    self.producer.produce("in", value=str(self.sent).encode(), partition=self.sent % 2)
                    self.sent += 1
                except BufferError:
                    break
            self.producer.poll(0.02)
        assert self.producer.flush(120) == 0


def read_all(bootstrap: str, topic: str, *, committed: bool) -> list[bytes]:
    """Every record of ``topic``'s two partitions up to their (stable) end."""
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{topic}-{time.monotonic_ns()}",
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        tps = [ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in (0, 1)]
        ends = {p: consumer.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=30)[1] for p in (0, 1)}
        consumer.assign(tps)
        values: list[bytes] = []
        done = {p: ends[p] == 0 for p in (0, 1)}
        deadline = time.monotonic() + 120
        while not all(done.values()) and time.monotonic() < deadline:
            for m in consumer.consume(500, 1.0):
                if m.error() is None:
                    values.append(m.value())
            for p in (0, 1):
                position = consumer.position([ck.TopicPartition(topic, p)])[0].offset
                done[p] = done[p] or position >= ends[p]
        assert all(done.values()), f"{topic}: not read to its end {ends} in time"
        return values
    finally:
        consumer.close()


def committed_offsets(bootstrap: str) -> dict[int, int]:
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        found = consumer.committed([ck.TopicPartition("in", p) for p in (0, 1)], timeout=30)
        return {tp.partition: tp.offset for tp in found}
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    try:
        return {p: consumer.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=30)[1] for p in (0, 1)}
    finally:
        consumer.close()


def read_committed_with_kclient(bootstrap: str, topic: str) -> list[bytes]:
    with Consumer(bootstrap_servers=bootstrap, isolation_level="read_committed", auto_offset_reset="earliest") as c:
        tps = [TopicPartition(topic, p) for p in (0, 1)]
        c.assign(tps)
        ends = c.end_offsets(tps)
        values: list[bytes] = []
        deadline = time.monotonic() + 120
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{topic}: not read to its end {ends} in time"
            for records in c.poll(timeout_ms=500).values():
                values += [r.value for r in records if r.value is not None]
        return values


@pytest.mark.parametrize("client", ["confluent", "kclient"])
def test_a_transactional_copier_copies_every_record_exactly_once_through_sigkills(
    client: str, cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    cluster = cluster_factory(
        3, **FAST, **DOOR, **{"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}
    )
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(t, 2, 3, topic_configs={"min.insync.replicas": "2"}) for t in ("in", "out")])
    view = ZkView(cluster.zk_connect)
    wait_until(lambda: all(len(view.state(t, p).isr) == 3 for t in ("in", "out") for p in (0, 1)), what="full ISR")
    bootstrap = cluster.kafka_bootstrap()
    feeder = InputProducer(bootstrap)
    feeder.start()
    copier = Copier(client, bootstrap if client == "confluent" else cluster.bootstrap, tmp_path / "copier.log")
    copier.start()

    def copies_after(before: int, what: str, timeout_s: float = 120) -> None:
        """Wait for a commit after ``before``; an exit or a timeout shows the copier's log."""
        deadline = time.monotonic() + timeout_s
        while copier.committed() <= before:
            copier.check_alive()
            assert time.monotonic() < deadline, (
                f"no copies {what} in {timeout_s:.0f}s; the copier's log:\n{copier.tail()}"
            )
            time.sleep(0.1)

    def bounce(broker: int) -> None:
        before = copier.committed()
        cluster.brokers[broker].kill()
        wait_until(lambda: broker not in view.live(), what=f"broker {broker} to leave ZooKeeper")
        cluster.brokers[broker].start()
        copies_after(before, f"after broker {broker} came back")

    try:
        copies_after(5, "at the start", timeout_s=60)
        with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
            coordinator = admin.find_transaction_coordinator(TXN_ID)[0]
        for round_ in range(2):
            # The copier itself, mid-transaction: its successor fences it and goes on.
            before = copier.committed()
            copier.kill()
            copier.start()
            copies_after(before, f"in round {round_} by the new copier")
            copier.check_alive()
            # The transaction coordinator.
            bounce(coordinator)
            copier.check_alive()
            with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
                coordinator = admin.find_transaction_coordinator(TXN_ID)[0]
            # The leader of an output partition.
            bounce(view.state("out", round_ % 2).leader)
            copier.check_alive()
        feeder.stop.set()
        feeder.join(150)
        assert not feeder.is_alive()
        wait_until(
            lambda: committed_offsets(bootstrap) == end_offsets(bootstrap, "in"),
            timeout_s=180,
            what="the copier to commit the whole input",
        )
    finally:
        feeder.stop.set()
        if copier.proc is not None and copier.proc.poll() is None:
            copier.kill()

    inputs = Counter(read_all(bootstrap, "in", committed=False))
    assert inputs and max(inputs.values()) == 1  # the idempotent feeder wrote each value once
    if client == "confluent":
        outputs = Counter(read_all(bootstrap, "out", committed=True))
    else:
        outputs = Counter(read_committed_with_kclient(cluster.bootstrap, "out"))
    expected = Counter(b"copy:" + v for v in inputs)
    assert outputs == expected, (
        f"{sum(inputs.values())} input records; missing {len(set(expected) - set(outputs))}, "
        f"duplicated {sum(1 for n in outputs.values() if n > 1)}, foreign {len(set(outputs) - set(expected))}"
    )
    uncommitted = Counter(read_all(bootstrap, "out", committed=False))
    assert sum(uncommitted.values()) >= sum(outputs.values())  # aborted copies are there, just not visible
