"""Consumer groups against real brokers and a real ZooKeeper: pub-sub, queue, rebalances,
at-least-once across a SIGKILL, rewinds, offsets surviving restarts and coordinator moves."""

from __future__ import annotations

import concurrent.futures
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import (
    AdminClient,
    CommitFailedError,
    Consumer,
    ConsumerRebalanceListener,
    NewTopic,
    OffsetAndMetadata,
    Producer,
    TopicPartition,
)
from kclient.errors import IllegalGenerationError, NoOffsetForPartitionError
from tests.support import wait_until

pytestmark = pytest.mark.integration

TP = TopicPartition
FAST_GROUPS = {"group.initial.rebalance.delay.ms": "200", "group.min.session.timeout.ms": "1000"}
MEMBER: dict[str, Any] = {
    "auto_offset_reset": "earliest",
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 300,
    "fetch_max_wait_ms": 200,
    "request_timeout_ms": 10000,
}
ROOT = Path(__file__).resolve().parents[2]


def create(bootstrap: str, name: str, partitions: int, replication: int = 1, **configs: str) -> None:
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, replication, topic_configs=configs)])


def produce(bootstrap: str, topic: str, values: Iterable[str], acks: int | str = 1, spread: int | None = None) -> None:
    """Send ``values``; with ``spread=n``, round-robin over partitions 0..n-1."""
    with Producer(bootstrap_servers=bootstrap, acks=acks, linger_ms=2) as p:
        futures = [p.send(topic, v.encode(), partition=i % spread if spread else None) for i, v in enumerate(values)]
        p.flush()
        for f in futures:
            f.get(30)


class Listener(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, set[TopicPartition]]] = []

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.events.append(("revoked", revoked))

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.events.append(("assigned", assigned))


class Member(threading.Thread):
    """One group member polling in its own thread: JoinGroup blocks until every member
    has rejoined, so members of one group cannot share a thread. ``call`` runs a function
    on the member's thread (a consumer is not thread-safe)."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topics: list[str] | None = None,
        pattern: str | None = None,
        commit_each_batch: bool = False,
        **config: Any,
    ) -> None:
        super().__init__(daemon=True, name=f"member-{group}")
        self.bootstrap, self.group, self.topics, self.pattern = bootstrap, group, topics or [], pattern
        self.commit_each_batch = commit_each_batch
        self.config = {**MEMBER, **config}
        self.listener = Listener()
        self.lock = threading.Lock()
        self.records: list[Any] = []
        self.current: set[TopicPartition] = set()
        self.subscribed_at = 0.0
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._commands: queue.Queue[tuple[Callable[[Consumer], Any], concurrent.futures.Future[Any]]] = queue.Queue()
        self.close_on_stop = True

    def run(self) -> None:
        c = Consumer(bootstrap_servers=self.bootstrap, group_id=self.group, **self.config)
        try:
            self.subscribed_at = time.monotonic()
            c.subscribe(self.topics, pattern=self.pattern, listener=self.listener)
            while not self._halt.is_set():
                while not self._commands.empty():
                    fn, fut = self._commands.get()
                    try:
                        fut.set_result(fn(c))
                    except BaseException as exc:
                        fut.set_exception(exc)
                batch = c.poll(timeout_ms=100)
                with self.lock:
                    for recs in batch.values():
                        self.records.extend(recs)
                    self.current = c.assignment()
                if batch and self.commit_each_batch:
                    c.commit()
        except BaseException as exc:
            self.error = exc
        finally:
            if self.close_on_stop:
                c.close()

    def call(self, fn: Callable[[Consumer], Any], timeout_s: float = 30) -> Any:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._commands.put((fn, fut))
        return fut.result(timeout_s)

    def assignment(self) -> set[TopicPartition]:
        with self.lock:
            return set(self.current)

    def values(self) -> list[str]:
        with self.lock:
            return [(r.value or b"").decode() for r in self.records]

    def stop(self, close: bool = True) -> None:
        self.close_on_stop = close
        self._halt.set()
        self.join(30)
        assert not self.is_alive(), "member did not stop"
        if self.error is not None:
            raise self.error


@pytest.fixture
def members() -> Iterable[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        m._halt.set()
    for m in started:
        m.join(30)


def start(members: list[Member], *args: Any, **kwargs: Any) -> Member:
    m = Member(*args, **kwargs)
    members.append(m)
    m.start()
    return m


def test_pub_sub_every_group_gets_every_record(
    cluster_factory: Callable[..., LocalCluster], members: list[Member]
) -> None:
    cluster = cluster_factory(1, **FAST_GROUPS)
    create(cluster.bootstrap, "news", 3)
    values = [f"n{i}" for i in range(300)]
    produce(cluster.bootstrap, "news", values, spread=3)
    a = start(members, cluster.bootstrap, "readers-a", ["news"])
    b = start(members, cluster.bootstrap, "readers-b", ["news"])
    for m in (a, b):
        wait_until(lambda: len(set(m.values())) == 300, 30, f"{m.group} to read every record")  # noqa: B023
        assert sorted(set(m.values())) == sorted(values)
        assert m.assignment() == {TP("news", p) for p in range(3)}


def test_queue_splits_partitions_and_idle_member_takes_over(
    cluster_factory: Callable[..., LocalCluster], members: list[Member]
) -> None:
    cluster = cluster_factory(1, **FAST_GROUPS)
    create(cluster.bootstrap, "jobs", 4)
    everything = {TP("jobs", p) for p in range(4)}

    def sizes(ms: list[Member]) -> list[int]:
        return sorted(len(m.assignment()) for m in ms)

    def settled(ms: list[Member], expected: list[int]) -> bool:
        parts = [m.assignment() for m in ms]
        return sorted(map(len, parts)) == expected and set().union(*parts) == everything

    group: list[Member] = []
    sticky = {"partition_assignment_strategy": ["sticky"]}  # so the newcomer, not an old member, stays idle
    for expected in ([2, 2], [1, 1, 2]):
        while len(group) < len(expected):
            group.append(start(members, cluster.bootstrap, "workers", ["jobs"], **sticky))
        wait_until(lambda: settled(group, expected), 30, f"split {expected}, have {sizes(group)}")  # noqa: B023

    fourth = start(members, cluster.bootstrap, "workers", ["jobs"], **sticky)
    group.append(fourth)
    wait_until(lambda: settled(group, [1, 1, 1, 1]), 30, f"split 1/1/1/1, have {sizes(group)}")
    took_ms = (time.monotonic() - fourth.subscribed_at) * 1000
    print(f"\nrebalance of 4 members: {took_ms:.0f} ms (heartbeat_interval_ms={MEMBER['heartbeat_interval_ms']})")
    before = [m.assignment() for m in group]

    fifth = start(members, cluster.bootstrap, "workers", ["jobs"], **sticky)
    wait_until(lambda: fifth.listener.events[-1:] == [("assigned", set())], 30, "the fifth member to join")
    wait_until(lambda: settled(group, [1, 1, 1, 1]), 30, "the four to hold one partition each again")
    assert [m.assignment() for m in group] == before, "sticky: the four kept their partitions"
    produce(cluster.bootstrap, "jobs", [f"a{i}" for i in range(200)], spread=4)
    wait_until(lambda: sum(len(m.values()) for m in group) >= 200, 30, "the four to read the first batch")
    assert fifth.assignment() == set() and fifth.values() == [], "a fifth member on 4 partitions gets nothing"
    assert sorted(v for m in group for v in m.values()) == sorted(f"a{i}" for i in range(200))

    leaving = group.pop(0)
    freed = leaving.assignment()
    logged = {b.broker_id: b.log_path.stat().st_size for b in cluster.brokers.values()}
    left_at = time.monotonic()
    leaving.stop()  # close(): commits and sends LeaveGroup
    wait_until(lambda: fifth.assignment() == freed, 30, "the idle member to take over the freed partition")
    print(f"takeover after LeaveGroup: {time.monotonic() - left_at:.2f} s")
    since = [b.log_path.read_bytes()[logged[b.broker_id] :].decode() for b in cluster.brokers.values()]
    expired = [line for text in since for line in text.splitlines() if "expired (no heartbeat)" in line]
    assert expired == [], "LeaveGroup, not the session timeout, moved it"
    produce(cluster.bootstrap, "jobs", [f"b{i}" for i in range(200)], spread=4)
    wait_until(lambda: any(v.startswith("b") for v in fifth.values()), 30, "the new owner to read its partition")
    group.append(fifth)
    wait_until(
        lambda: {v for m in group for v in m.values() if v.startswith("b")} == {f"b{i}" for i in range(200)},
        30,
        "every record of the second batch",
    )
    # The leaving member committed on close: its partition was not re-read from the start.
    assert not [v for v in fifth.values() if v.startswith("a")]


WORKER = """
import sys, time
from kclient import Consumer
bootstrap, group, topic = sys.argv[1:4]
c = Consumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
             session_timeout_ms=3000, heartbeat_interval_ms=300, fetch_max_wait_ms=200, max_poll_records=20)
c.subscribe([topic])
print("READY", flush=True)
while True:
    for tp, recs in c.poll(timeout_ms=200).items():
        for r in recs:
            print("REC", r.value.decode(), flush=True)   # processing
            time.sleep(0.002)
    c.commit()                                            # after processing: at-least-once
"""


def test_at_least_once_across_rebalance_and_sigkill(
    cluster_factory: Callable[..., LocalCluster], members: list[Member], tmp_path: Path
) -> None:
    cluster = cluster_factory(1, **FAST_GROUPS)
    create(cluster.bootstrap, "events", 4)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    proc = subprocess.Popen(
        [sys.executable, str(script), cluster.bootstrap, "alo", "events"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        text=True,
    )
    worker_values: list[str] = []
    worker_lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            worker_lines.append(line.rstrip())
            if line.startswith("REC "):
                worker_values.append(line.split()[1])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_until(lambda: "READY" in worker_lines, 30, f"the worker to start: {worker_lines[-5:]}")
        a = start(
            members,
            cluster.bootstrap,
            "alo",
            ["events"],
            commit_each_batch=True,
            enable_auto_commit=False,
            session_timeout_ms=3000,
            max_poll_records=20,
        )
        total = 3000
        values = [f"e{i}" for i in range(total)]

        def produce_slowly() -> None:
            for i in range(0, total, 100):
                produce(cluster.bootstrap, "events", values[i : i + 100], spread=4)
                time.sleep(0.05)

        producing = threading.Thread(target=produce_slowly, daemon=True)
        producing.start()
        wait_until(lambda: len(worker_values) > 200 and len(a.values()) > 100, 60, "both members to make progress")
        b = start(
            members,
            cluster.bootstrap,
            "alo",
            ["events"],
            commit_each_batch=True,
            enable_auto_commit=False,
            session_timeout_ms=3000,
            max_poll_records=20,
        )  # a rebalance
        wait_until(lambda: len(b.values()) > 0, 60, "the third member to get records")
        before_kill = len(worker_values)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        producing.join(120)
        wait_until(
            lambda: set(values) <= set(worker_values) | set(a.values()) | set(b.values()),
            60,
            "every record to be processed by someone",
        )
        seen = worker_values + a.values() + b.values()
        duplicates = len(seen) - len(set(seen))
        print(
            f"\nat-least-once: {total} records, worker processed {before_kill}+ before SIGKILL, "
            f"{duplicates} processed twice (around the kill/rebalances)"
        )
        assert set(seen) == set(values)
        assert duplicates < total // 4
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_seek_rewind_and_committed(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST_GROUPS)
    create(cluster.bootstrap, "log", 1)
    produce(cluster.bootstrap, "log", [f"r{i}" for i in range(100)])
    tp = TP("log", 0)
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="rewinder", enable_auto_commit=False, **MEMBER) as c:
        assert c.committed(tp) is None
        c.subscribe(["log"])
        got: list[str] = []
        while len(got) < 100:
            got += [
                (r.value or b"").decode() for recs in c.poll(timeout_ms=1000, max_records=30).values() for r in recs
            ]
        assert got == [f"r{i}" for i in range(100)]
        c.commit({tp: OffsetAndMetadata(60, "checkpoint")})
        assert c.committed(tp) == 60
        assert c.committed(tp, metadata=True) == OffsetAndMetadata(60, "checkpoint")
        c.seek(tp, 10)
        again = [(r.value or b"").decode() for r in c.poll(timeout_ms=5000, max_records=5)[tp]]
        assert again == [f"r{i}" for i in range(10, 15)]
        c.seek_to_beginning(tp)
        assert c.poll(timeout_ms=5000, max_records=1)[tp][0].value == b"r0"
        c.commit()
        assert c.committed(tp) == 1
        c.pause(tp)
        produce(cluster.bootstrap, "log", ["late"])
        assert c.poll(timeout_ms=500) == {}
        c.resume(tp)
        assert c.position(tp) == 1
    # A new member of the group starts at the committed offset.
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="rewinder", **MEMBER) as c:
        c.subscribe(["log"])
        first = c.poll(timeout_ms=10000, max_records=1)
        assert first[tp][0].value == b"r1"


def test_committed_offsets_survive_broker_restart(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST_GROUPS)
    create(cluster.bootstrap, "durable", 2)
    produce(cluster.bootstrap, "durable", [f"d{i}" for i in range(50)], spread=2)
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="keeper", enable_auto_commit=False, **MEMBER) as c:
        c.subscribe(["durable"])
        n = 0
        while n < 50:
            n += sum(len(v) for v in c.poll(timeout_ms=1000).values())
        c.commit()
        committed = {tp: c.committed(tp) for tp in c.assignment()}
    assert sum(v or 0 for v in committed.values()) == 50
    cluster.brokers[0].stop()
    cluster.brokers[0].start()
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="keeper", **MEMBER) as c:
        assert {tp: c.committed(tp) for tp in committed} == committed
        c.subscribe(["durable"])
        assert c.poll(timeout_ms=3000) == {}, "nothing new past the committed offsets"


def test_coordinator_killed_group_continues(
    cluster_factory: Callable[..., LocalCluster], members: list[Member]
) -> None:
    cluster = cluster_factory(3, **FAST_GROUPS)
    bootstrap = cluster.bootstrap
    create(bootstrap, "ha", 4, replication=3, **{"min.insync.replicas": "2"})
    produce(bootstrap, "ha", [f"p{i}" for i in range(200)], acks="all", spread=4)
    cfg = {"enable_auto_commit": True, "auto_commit_interval_ms": 200, "session_timeout_ms": 4000}
    a = start(members, bootstrap, "survivors", ["ha"], **cfg)
    b = start(members, bootstrap, "survivors", ["ha"], **cfg)
    wait_until(lambda: len(set(a.values()) | set(b.values())) == 200, 60, "the first 200 records")
    with AdminClient(bootstrap) as admin:
        coordinator = admin.find_coordinator("survivors")
        wait_until(
            lambda: sum(o.offset for o in admin.list_consumer_group_offsets("survivors").values()) == 200,
            30,
            "the auto-commit of every consumed record",
        )
    victim = next(bid for bid, b_ in cluster.brokers.items() if b_.address == coordinator)
    cluster.brokers[victim].kill()
    alive = cluster.bootstrap
    produce(alive, "ha", [f"q{i}" for i in range(200)], acks="all", spread=4)
    wait_until(lambda: {f"q{i}" for i in range(200)} <= set(a.values()) | set(b.values()), 90, "records after the kill")
    with AdminClient(alive) as admin:
        assert admin.find_coordinator("survivors") != coordinator
        # The members rejoined at the new coordinator: their commits are accepted there.
        wait_until(
            lambda: sum(o.offset for o in admin.list_consumer_group_offsets("survivors").values()) == 400,
            30,
            "auto-commits at the new coordinator",
        )
        (described,) = admin.describe_consumer_groups(["survivors"])
        assert (described.state, len(described.members)) == ("Stable", 2)
    first = [v for v in a.values() + b.values() if v.startswith("p")]
    assert len(first) == 200, "committed offsets moved with the group: nothing before the kill was re-read"


def test_commit_from_an_old_generation_is_refused(
    cluster_factory: Callable[..., LocalCluster], members: list[Member]
) -> None:
    cluster = cluster_factory(1, **FAST_GROUPS)
    create(cluster.bootstrap, "fenced", 2)
    produce(cluster.bootstrap, "fenced", [f"f{i}" for i in range(20)], spread=2)
    a = start(members, cluster.bootstrap, "fence", ["fenced"], enable_auto_commit=False)
    wait_until(lambda: len(a.assignment()) == 2, 30, "the first member to own both partitions")
    old_generation = a.call(lambda c: c._coordinator.generation)  # type: ignore[union-attr]
    b = start(members, cluster.bootstrap, "fence", ["fenced"], enable_auto_commit=False)
    wait_until(lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1, 30, "the split")

    def stale_commit(c: Consumer) -> BaseException | None:
        coordinator = c._coordinator
        assert coordinator is not None and coordinator.generation > old_generation
        coordinator.generation = old_generation  # as if this member had missed the rebalance
        try:
            c.commit({tp: OffsetAndMetadata(1) for tp in c.assignment()})
        except CommitFailedError as exc:
            return exc
        return None

    err = a.call(stale_commit)
    assert isinstance(err, CommitFailedError), err
    assert isinstance(err.__cause__, IllegalGenerationError)
    assert f"generation {old_generation}" in str(err)
    wait_until(lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1, 30, "the member to rejoin")


def test_member_that_stops_polling_is_removed(
    cluster_factory: Callable[..., LocalCluster], members: list[Member]
) -> None:
    cluster = cluster_factory(1, **FAST_GROUPS)
    create(cluster.bootstrap, "slow", 2)
    slow = Consumer(
        bootstrap_servers=cluster.bootstrap,
        group_id="patience",
        enable_auto_commit=False,
        max_poll_interval_ms=2000,
        **MEMBER,
    )
    try:
        slow.subscribe(["slow"])
        wait_until(lambda: slow.poll(timeout_ms=100) is not None and len(slow.assignment()) == 2, 30, "assignment")
        other = start(members, cluster.bootstrap, "patience", ["slow"])
        # slow does not poll: after max_poll_interval_ms its heartbeat thread leaves the group
        wait_until(lambda: len(other.assignment()) == 2, 30, "the polling member to get every partition")
        with pytest.raises(CommitFailedError):
            slow.commit({TP("slow", 0): OffsetAndMetadata(0)})
        slow.poll(timeout_ms=100)  # rejoins
        wait_until(lambda: len(other.assignment()) == 1, 30, "the slow member to rejoin")
    finally:
        slow.close()


def test_no_commit_and_reset_none(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST_GROUPS)
    create(cluster.bootstrap, "strict", 1)
    produce(cluster.bootstrap, "strict", [f"s{i}" for i in range(10)])
    cfg = {**MEMBER, "auto_offset_reset": "none"}
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="strict-g", **cfg) as c:
        c.subscribe(["strict"])
        with pytest.raises(NoOffsetForPartitionError):
            c.poll(timeout_ms=5000)
    # The group is empty again: a consumer using assign() may commit for it (generation -1).
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="strict-g", **cfg) as c:
        c.assign([TP("strict", 0)])
        c.commit({TP("strict", 0): OffsetAndMetadata(7)})
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="strict-g", **cfg) as c:
        c.subscribe(["strict"])
        values: list[bytes | None] = []
        deadline = time.monotonic() + 30  # the join, then the fetch
        while len(values) < 3 and time.monotonic() < deadline:
            values += [r.value for records in c.poll(timeout_ms=1000).values() for r in records]
        assert values == [b"s7", b"s8", b"s9"]


def test_pattern_subscription_and_new_partitions(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST_GROUPS)
    create(cluster.bootstrap, "metrics-cpu", 1)
    create(cluster.bootstrap, "logs", 1)
    produce(cluster.bootstrap, "metrics-cpu", ["c0"])
    produce(cluster.bootstrap, "logs", ["l0"])
    listener = Listener()
    seen: list[tuple[str, int, bytes | None]] = []
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="watcher", metadata_max_age_ms=500, **MEMBER) as c:
        c.subscribe(pattern=r"metrics-.*", listener=listener)

        def poll_until(pred: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + 30
            while not pred():
                assert time.monotonic() < deadline, f"timed out waiting for {what}; assigned {c.assignment()}"
                seen.extend((r.topic, r.partition, r.value) for rs in c.poll(timeout_ms=200).values() for r in rs)

        poll_until(lambda: ("metrics-cpu", 0, b"c0") in seen, "the first matching topic")
        assert c.subscription() == {"metrics-cpu"}
        create(cluster.bootstrap, "metrics-mem", 1)
        produce(cluster.bootstrap, "metrics-mem", ["m0"])
        poll_until(lambda: ("metrics-mem", 0, b"m0") in seen, "the new matching topic")
        assert c.assignment() == {TP("metrics-cpu", 0), TP("metrics-mem", 0)}
        with AdminClient(cluster.bootstrap) as admin:
            admin.create_partitions({"metrics-mem": 2})
        produce(cluster.bootstrap, "metrics-mem", [f"m{i}" for i in range(1, 20)], spread=2)
        poll_until(lambda: TP("metrics-mem", 1) in c.assignment(), "the new partition")
        poll_until(lambda: any(t == "metrics-mem" and p == 1 for t, p, _ in seen), "records of the new partition")
    assert not any(t == "logs" for t, _, _ in seen)
    assert [e for e, _ in listener.events][:3] == ["assigned", "revoked", "assigned"]
    assert re.fullmatch(r"metrics-.*", "metrics-mem")


def test_reset_offsets_then_the_group_resumes_there(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **FAST_GROUPS)
    create(cluster.bootstrap, "replay", 1)
    produce(cluster.bootstrap, "replay", [f"r{i}" for i in range(50)])
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="replayer", **MEMBER) as c:
        c.subscribe(["replay"])
        seen = 0
        while seen < 50:
            seen += sum(len(v) for v in c.poll(timeout_ms=1000).values())
        c.commit()
    # The group is inactive now: rewind it with kctl, as an operator would.
    kctl = [sys.executable, "-m", "kbroker.cli", "--bootstrap-server", cluster.bootstrap, "groups", "reset-offsets"]
    proc = subprocess.run(
        [*kctl, "--group", "replayer", "--topic", "replay", "--to-offset", "20", "--execute"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="replayer", **MEMBER) as c:
        c.subscribe(["replay"])
        got: list[bytes] = []
        while len(got) < 30:
            got += [r.value or b"" for recs in c.poll(timeout_ms=5000).values() for r in recs]
        assert got == [f"r{i}".encode() for i in range(20, 50)]
