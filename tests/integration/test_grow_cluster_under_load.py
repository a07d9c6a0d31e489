"""Growing a cluster without downtime (the headline test of reassignment): 3 -> 5 brokers while an
idempotent acks=all producer and a two-member consumer group run; half the partitions
move onto the new brokers. No acknowledged record is lost or written twice, the group
keeps consuming through the moves, and each partition's unavailability (the longest
gap between two acknowledged writes to it) is measured and printed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from itertools import pairwise

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tests.support import wait_until

pytestmark = pytest.mark.integration

TOPIC = "grow"
PARTITIONS = 6


class Writer:
    """One idempotent acks=all producer writing unique values to every partition in turn;
    remembers each acknowledged value and, per partition, when each ack arrived."""

    def __init__(self, bootstrap: str) -> None:
        self.acked: set[int] = set()
        self.ack_times: dict[int, list[float]] = {p: [] for p in range(PARTITIONS)}
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(bootstrap,), daemon=True)
        self._thread.start()

    def _run(self, bootstrap: str) -> None:
        v = 0
        with Producer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=2) as p:
            while not self._stop.is_set():
                batch = [(v + i, (v + i) % PARTITIONS) for i in range(PARTITIONS * 5)]
                v += len(batch)
                futures = [(value, part, p.send(TOPIC, b"%d" % value, partition=part)) for value, part in batch]
                for value, part, f in futures:
                    try:
                        f.get(60)
                    except Exception:
                        self.failed += 1
                        continue
                    self.acked.add(value)
                    self.ack_times[part].append(time.monotonic())
                time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    def longest_gaps(self, since: float) -> dict[int, float]:
        out = {}
        for part, times in self.ack_times.items():
            ts = [since] + [t for t in times if t >= since]
            out[part] = max((b - a for a, b in pairwise(ts)), default=float("inf"))
        return out


class GroupMember:
    """A consumer in group ``g`` that commits what it has read."""

    def __init__(self, bootstrap: str) -> None:
        self.values: set[int] = set()
        self.reads_at: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(bootstrap,), daemon=True)
        self._thread.start()

    def _run(self, bootstrap: str) -> None:
        with Consumer(
            bootstrap_servers=bootstrap, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False
        ) as c:
            c.subscribe([TOPIC])
            while not self._stop.is_set():
                got = c.poll(timeout_ms=200)
                n = 0
                for recs in got.values():
                    self.values.update(int(r.value or b"-1") for r in recs)
                    n += len(recs)
                if n:
                    self.reads_at.append(time.monotonic())
                    try:
                        c.commit()
                    except Exception:
                        pass  # a rebalance: the next poll rejoins

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def read_all(bootstrap: str) -> list[int]:
    """Every value in the topic's logs, duplicates included."""
    with AdminClient(bootstrap) as admin:
        assert admin.describe_topics([TOPIC])
    out: list[int] = []
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as c:
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        c.assign(tps)
        ends = c.end_offsets(tps)
        pos = dict.fromkeys(tps, 0)
        deadline = time.monotonic() + 60
        while any(pos[tp] < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for tp, recs in c.poll(timeout_ms=300).items():
                out.extend(int(r.value or b"-1") for r in recs)
                if recs:
                    pos[tp] = recs[-1].offset + 1
    return out


def test_three_to_five_brokers_under_load(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(3, **{"auto.leader.rebalance.enable": "false"})
    assignment = {p: [p % 3, (p + 1) % 3] for p in range(PARTITIONS)}
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, replica_assignments=assignment)])
    writer = Writer(cluster.bootstrap)
    members = [GroupMember(cluster.bootstrap), GroupMember(cluster.bootstrap)]
    try:
        wait_until(lambda: len(writer.acked) > 3000, what="first acks")
        wait_until(lambda: all(m.values for m in members), what="both members consuming")
        cluster.add_broker()
        cluster.add_broker()  # brokers 3 and 4
        # Half the partitions move: each gets one replica on a new broker, three lose their leader.
        targets = {0: [3, 1], 1: [4, 2], 2: [2, 3], 3: [4, 0], 4: [4, 3], 5: [3, 0]}
        moving = {p: targets[p] for p in (0, 1, 3)}
        started = time.monotonic()
        with AdminClient(cluster.bootstrap) as admin:
            errors = admin.alter_partition_reassignments({(TOPIC, p): rs for p, rs in moving.items()})
            assert all(e is None for e in errors.values()), errors
            wait_until(lambda: admin.list_partition_reassignments() == {}, timeout_s=90, what="the moves")

            def placed() -> dict[int, list[int]]:
                return {p.partition: list(p.replicas) for p in admin.describe_topics([TOPIC])[0].partitions}

            # Metadata reaches the answering broker's cache asynchronously (as in Kafka): a
            # broker may answer with the last step of a move for a moment after it ended.
            wait_until(lambda: placed() == {**assignment, **moving}, timeout_s=30, what="the new placement")
        moved_s = time.monotonic() - started
        n, reads = len(writer.acked), sum(len(m.reads_at) for m in members)
        wait_until(lambda: len(writer.acked) > n + 300, what="acks after the moves")
        wait_until(lambda: sum(len(m.reads_at) for m in members) > reads, what="the group reading after the moves")
        gaps = writer.longest_gaps(started)
    finally:
        writer.stop()
    try:
        wait_until(
            lambda: writer.acked <= members[0].values | members[1].values, timeout_s=60, what="the group to read all"
        )
    finally:
        for m in members:
            m.stop()
    print(
        f"moves done in {moved_s:.2f} s; longest gap between acks per partition (s): "
        + ", ".join(f"{p}: {g:.2f}" for p, g in sorted(gaps.items()))
    )
    values = read_all(cluster.brokers[3].address)
    assert len(values) == len(set(values)), "a record was written twice"
    assert writer.acked <= set(values), "an acknowledged record was lost"
    # Unavailability: leadership moves are a few hundred ms; a stall would be seconds.
    assert max(gaps.values()) < 10, gaps
