"""Fetch sessions (KIP-227) on the leader: the session cache's id, epoch and eviction rules,
and a ReplicaManager serving full and incremental fetches, where an idle incremental fetch
reads no partition and a parked one wakes only for its own partitions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import LeaderAndIsr
from kbroker.replication.fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    MAX_EPOCH,
    FetchContext,
    FetchSessionCache,
    FetchSpec,
    next_epoch,
)
from kbroker.replication.partition import Partition
from kbroker.replication.replica_manager import FetchResult, ReplicaManager
from kbroker.storage.log_config import LogConfig
from kbroker.storage.log_manager import LogManager
from kclient.errors import FetchSessionIdNotFoundError, InvalidFetchSessionEpochError, NotLeaderForPartitionError
from kclient.records import BatchBuilder
from tests.support import FakeClock

LEADER, FOLLOWER, OTHER = 1, 2, 3


def spec(topic: str, index: int, offset: int = 0, epoch: int = -1) -> FetchSpec:
    return FetchSpec(topic, index, offset, 1 << 20, epoch, -1)


def batch(values: list[bytes], epoch: int = 0) -> bytes:
    b = BatchBuilder(partition_leader_epoch=epoch)
    for v in values:
        b.append(1000, None, v)
    return b.build()


# --- the cache ---------------------------------------------------------------------


def test_epochs_go_one_two_and_wrap_to_one() -> None:
    assert next_epoch(INITIAL_EPOCH) == 1
    assert next_epoch(41) == 42
    assert next_epoch(MAX_EPOCH) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH


def test_a_full_fetch_opens_a_session_and_incremental_fetches_follow_its_epochs() -> None:
    cache = FetchSessionCache()
    ctx = cache.new_context(0, INITIAL_EPOCH, [spec("t", 0), spec("t", 1)], [], FOLLOWER)
    assert ctx.session is not None and ctx.full and ctx.session.id > 0 and ctx.session.epoch == 1
    sid = ctx.session.id
    again = cache.new_context(sid, 1, [], [], FOLLOWER)
    assert again.session is ctx.session and not again.full and again.changed == []
    assert ctx.session.epoch == 2
    stale = cache.new_context(sid, 1, [], [], FOLLOWER)  # the same epoch twice
    assert isinstance(stale.error, InvalidFetchSessionEpochError)
    unknown = cache.new_context(sid + 1, 2, [], [], FOLLOWER)
    assert isinstance(unknown.error, FetchSessionIdNotFoundError)
    other = cache.new_context(sid, 2, [], [], OTHER)  # somebody else's session
    assert isinstance(other.error, InvalidFetchSessionEpochError)


def test_an_incremental_fetch_adds_changes_and_forgets_partitions() -> None:
    cache = FetchSessionCache()
    session = cache.new_context(0, 0, [spec("t", 0), spec("t", 1)], [], FOLLOWER).session
    assert session is not None
    session.take_dirty()
    ctx = cache.new_context(session.id, 1, [spec("t", 0, offset=5), spec("u", 0), spec("t", 1)], [("t", 1)], FOLLOWER)
    assert [(s.topic, s.partition, s.offset) for s in ctx.changed] == [("t", 0, 5), ("u", 0, 0)]
    assert sorted(session.partitions) == [("t", 0), ("u", 0)]  # forgetting wins over a change
    assert sorted(cp.key for cp in session.take_dirty()) == [("t", 0), ("u", 0)]
    assert sorted(session.topic_names()) == ["t", "u"]


def test_forgetting_every_partition_closes_the_session() -> None:
    cache = FetchSessionCache()
    session = cache.new_context(0, 0, [spec("t", 0)], [], FOLLOWER).session
    assert session is not None
    ctx = cache.new_context(session.id, 1, [], [("t", 0)], FOLLOWER)
    assert ctx.session is None and ctx.error is None  # sessionless from now on
    assert cache.get(session.id) is None


def test_a_final_epoch_closes_the_session_and_a_new_full_fetch_replaces_it() -> None:
    cache = FetchSessionCache()
    first = cache.new_context(0, 0, [spec("t", 0)], [], FOLLOWER).session
    assert first is not None
    second = cache.new_context(first.id, 0, [spec("t", 0)], [], FOLLOWER).session
    assert second is not None and second.id != first.id and cache.get(first.id) is None
    ctx = cache.new_context(second.id, FINAL_EPOCH, [spec("t", 0)], [], FOLLOWER)
    assert ctx.session is None and ctx.specs == [spec("t", 0)] and len(cache) == 0


def test_a_full_cache_evicts_by_kafka_rules() -> None:
    clock = FakeClock(1_000_000.0)
    cache = FetchSessionCache(max_slots=2, eviction_ms=1000, clock=clock)
    consumer = cache.new_context(0, 0, [spec("t", 0)], [], -1).session
    follower = cache.new_context(0, 0, [spec("t", 0), spec("t", 1)], [], FOLLOWER).session
    assert consumer is not None and follower is not None
    # Full, nothing idle or old: another consumer gets no session (a sessionless fetch) ...
    assert cache.new_context(0, 0, [spec("t", 0)] * 5, [], -1).session is None
    # ... but a follower (privileged) evicts the smallest consumer session.
    newcomer = cache.new_context(0, 0, [spec("u", 0)], [], OTHER).session
    assert newcomer is not None and cache.get(consumer.id) is None and cache.evictions == 1
    # A session unused for min.incremental.fetch.session.eviction.ms goes for anybody.
    clock.now += 500
    cache.new_context(newcomer.id, 1, [], [], OTHER)  # newcomer was used just now
    clock.now += 600
    late = cache.new_context(0, 0, [spec("v", 0)], [], -1).session
    assert late is not None and cache.get(follower.id) is None and cache.get(newcomer.id) is newcomer


def test_no_slots_means_no_sessions() -> None:
    cache = FetchSessionCache(max_slots=0)
    ctx = cache.new_context(0, 0, [spec("t", 0)], [], FOLLOWER)
    assert ctx.session is None and ctx.error is None


def test_progress_marks_only_the_sessions_holding_the_partition() -> None:
    cache = FetchSessionCache()
    a = cache.new_context(0, 0, [spec("t", 0)], [], FOLLOWER).session
    b = cache.new_context(0, 0, [spec("t", 1)], [], OTHER).session
    assert a is not None and b is not None
    a.take_dirty()
    b.take_dirty()
    cache.on_progress(("t", 0))
    cache.on_progress("some-group")  # not a partition: nothing
    assert [cp.key for cp in a.take_dirty()] == [("t", 0)]
    assert b.take_dirty() == []


# --- the leader ----------------------------------------------------------------------


class Spy:
    """Counts the calls of a Partition's per-partition entry points."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: dict[str, int] = {"read": 0, "record_follower_fetch": 0, "available_to": 0}
        for name in self.calls:
            original = getattr(Partition, name)
            monkeypatch.setattr(Partition, name, self._counting(name, original))

    def _counting(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(p: Partition, *args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return original(p, *args, **kwargs)

        return counted

    def reset(self) -> None:
        for k in self.calls:
            self.calls[k] = 0

    def total(self) -> int:
        return sum(self.calls.values())


PARTITIONS = 20


def leader(tmp_path: Path, **kwargs: Any) -> ReplicaManager:
    logs = LogManager(tmp_path / "data", LogConfig())
    logs.startup()
    zk = SimpleNamespace(connected=True, write_isr=lambda *a: 1)
    rm = ReplicaManager(LEADER, logs, LogConfig(), cast(ZkClient, zk), lambda b: None, **kwargs)
    rm.start()
    for i in range(PARTITIONS):
        state = LeaderAndIsr(LEADER, 0, [LEADER, FOLLOWER], 1, 0)
        rm.on_partition_change("t", i, [LEADER, FOLLOWER], state, {})
    return rm


class Client:
    """Runs session fetches against a ReplicaManager the way BrokerService.Fetch does."""

    def __init__(self, rm: ReplicaManager, replica_id: int = FOLLOWER) -> None:
        self.rm = rm
        self.replica_id = replica_id
        self.session_id = 0
        self.epoch = 0

    def fetch(
        self, specs: list[FetchSpec], forgotten: list[tuple[str, int]] | None = None, max_wait_ms: int = 0
    ) -> list[tuple[FetchSpec, FetchResult]] | FetchContext:
        ctx = self.rm.fetch_sessions.new_context(self.session_id, self.epoch, specs, forgotten or [], self.replica_id)
        if ctx.error is not None or ctx.session is None:
            return ctx
        self.session_id = ctx.session.id
        self.epoch = next_epoch(self.epoch)

        async def run() -> list[tuple[FetchSpec, FetchResult]]:
            loop = asyncio.get_running_loop()

            async def offload(fn: Callable[..., Any], *args: Any) -> Any:
                return await loop.run_in_executor(None, fn, *args)

            return await self.rm.fetch_session_async(offload, self.replica_id, max_wait_ms, 1, 1 << 24, ctx, {})

        return asyncio.run(run())


def answered(entries: object) -> dict[tuple[str, int], FetchResult]:
    assert isinstance(entries, list)
    return {(s.topic, s.partition): r for s, r in entries}


def test_an_idle_incremental_fetch_reads_no_partition(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rm = leader(tmp_path)
    try:
        spy = Spy(monkeypatch)
        c = Client(rm)
        full = answered(c.fetch([spec("t", i) for i in range(PARTITIONS)]))
        assert len(full) == PARTITIONS  # a full answer names every partition
        assert spy.calls["read"] == PARTITIONS and spy.calls["record_follower_fetch"] == PARTITIONS
        spy.reset()
        for _ in range(3):
            assert answered(c.fetch([])) == {}
        assert spy.total() == 0
        parked = time.monotonic()
        assert answered(c.fetch([], max_wait_ms=200)) == {}  # parked, woken by nothing
        assert time.monotonic() - parked >= 0.19
        assert spy.total() == 0
    finally:
        rm.shutdown()


def test_an_incremental_answer_holds_exactly_what_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rm = leader(tmp_path)
    try:
        c = Client(rm)
        c.fetch([spec("t", i) for i in range(PARTITIONS)])
        spy = Spy(monkeypatch)
        rm.partition("t", 3).append_as_leader(batch([b"a", b"b"]), 1, 1)
        rm.purgatory.progress(("t", 3))  # as append_async does
        got = answered(c.fetch([]))
        assert list(got) == [("t", 3)]
        read = got[("t", 3)].read
        assert read is not None and read.records and read.log_end_offset == 2 and read.high_watermark == 0
        assert spy.calls["read"] == 1
        # The follower appended: it names the new offset; that moves the HW, which is news.
        spy.reset()
        got = answered(c.fetch([spec("t", 3, offset=2)]))
        assert list(got) == [("t", 3)]
        read = got[("t", 3)].read
        assert read is not None and not read.records and read.high_watermark == 2
        assert spy.calls["record_follower_fetch"] == 1 and spy.calls["read"] == 1
        # Nothing new since: nothing named, nothing read.
        spy.reset()
        assert answered(c.fetch([])) == {} and spy.total() == 0
    finally:
        rm.shutdown()


def test_a_parked_session_fetch_wakes_only_for_its_partitions(tmp_path: Path) -> None:
    rm = leader(tmp_path)
    try:
        c = Client(rm)
        c.fetch([spec("t", 0), spec("t", 1)])
        other = Client(rm, OTHER)
        rm.on_partition_change("t", 5, [LEADER, OTHER], LeaderAndIsr(LEADER, 0, [LEADER, OTHER], 1, 0), {})
        other.fetch([spec("t", 5)])

        def append_soon(index: int) -> None:
            time.sleep(0.2)
            rm.partition("t", index).append_as_leader(batch([b"x"]), 1, 1)
            rm.purgatory.progress(("t", index))

        import threading

        threading.Thread(target=append_soon, args=(5,)).start()  # not c's partition
        start = time.monotonic()
        assert answered(c.fetch([], max_wait_ms=1000)) == {}
        assert time.monotonic() - start >= 0.95  # it waited its whole max_wait
        threading.Thread(target=append_soon, args=(1,)).start()
        start = time.monotonic()
        got = answered(c.fetch([], max_wait_ms=5000))
        assert list(got) == [("t", 1)] and time.monotonic() - start < 2
        assert list(answered(other.fetch([]))) == [("t", 5)]  # its own news was kept for it
    finally:
        rm.shutdown()


def test_a_leadership_change_is_answered_as_an_error(tmp_path: Path) -> None:
    rm = leader(tmp_path)
    try:
        c = Client(rm)
        c.fetch([spec("t", i) for i in range(PARTITIONS)])
        rm.on_partition_change("t", 7, [LEADER, FOLLOWER], LeaderAndIsr(FOLLOWER, 1, [FOLLOWER], 1, 1), {})
        got = answered(c.fetch([], max_wait_ms=1000))
        assert list(got) == [("t", 7)] and isinstance(got[("t", 7)].error, NotLeaderForPartitionError)
        assert answered(c.fetch([])) == {}  # said once
    finally:
        rm.shutdown()


def test_a_partition_left_behind_by_the_size_limit_is_read_next_time(tmp_path: Path) -> None:
    rm = leader(tmp_path)
    try:
        c = Client(rm)
        c.fetch([FetchSpec("t", i, 0, 100, -1, -1) for i in range(2)])
        for i in range(2):
            rm.partition("t", i).append_as_leader(batch([b"y" * 200]), 1, 1)
            rm.purgatory.progress(("t", i))
        first = answered(c.fetch([]))  # each partition's limit (100) allows one whole batch only for the first
        with_records = [tp for tp, r in first.items() if r.read is not None and r.read.records]
        assert len(with_records) == 1
        (moved,) = with_records
        offset_spec = FetchSpec(moved[0], moved[1], 1, 100, -1, -1)
        second = answered(c.fetch([offset_spec]))
        assert any(r.read is not None and r.read.records for tp, r in second.items() if tp != moved)
    finally:
        rm.shutdown()


def test_a_consumer_session_sees_records_once_they_are_committed(tmp_path: Path) -> None:
    rm = leader(tmp_path)
    try:
        consumer = Client(rm, -1)
        consumer.fetch([spec("t", 0)])
        p = rm.partition("t", 0)
        p.append_as_leader(batch([b"c"]), 1, 1)
        rm.purgatory.progress(("t", 0))
        assert answered(consumer.fetch([])) == {}  # above the HW: nothing visible, nothing changed
        follower = Client(rm)
        follower.fetch([spec("t", 0, offset=1)])  # the follower has it: the HW moves
        got = answered(consumer.fetch([]))
        read = got[("t", 0)].read
        assert read is not None and read.records and read.high_watermark == 1
    finally:
        rm.shutdown()


def test_idle_follower_positions_are_refreshed_now_and_then(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rm = leader(tmp_path, replica_lag_time_max_ms=400)
    try:
        spy = Spy(monkeypatch)
        c = Client(rm)
        c.fetch([spec("t", i) for i in range(PARTITIONS)])
        spy.reset()
        c.fetch([])
        assert spy.calls["record_follower_fetch"] == 0
        time.sleep(0.15)  # > replica.lag.time.max.ms / 4
        c.fetch([])
        assert spy.calls["record_follower_fetch"] == PARTITIONS
    finally:
        rm.shutdown()


def test_while_zookeeper_is_out_of_reach_every_fetch_records_every_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rm = leader(tmp_path)
    try:
        c = Client(rm)
        c.fetch([spec("t", i) for i in range(PARTITIONS)])
        spy = Spy(monkeypatch)
        monkeypatch.setattr(rm._zk, "connected", False)  # fencing looks at the followers' last fetch
        c.fetch([])
        c.fetch([])
        assert spy.calls["record_follower_fetch"] == 2 * PARTITIONS
    finally:
        monkeypatch.setattr(rm._zk, "connected", True)
        rm.shutdown()


def test_a_throttled_partition_stays_dirty_until_the_leader_quota_lets_it_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rm = leader(tmp_path)
    try:
        monkeypatch.setattr(rm._zk, "write_isr", lambda *a: None)  # the follower stays out of the ISR
        throttled = {"leader.replication.throttled.replicas": f"0:{LEADER}"}
        rm.on_partition_change("t", 0, [LEADER, FOLLOWER], LeaderAndIsr(LEADER, 0, [LEADER], 1, 1), throttled)
        rm.set_replication_throttles(100, 2**63 - 1)
        c = Client(rm)
        c.fetch([spec("t", 0)])
        rm.partition("t", 0).append_as_leader(batch([b"z" * 1000]), 1, 1)
        rm.purgatory.progress(("t", 0))
        first = answered(c.fetch([]))  # a fresh quota lets it through
        assert first[("t", 0)].read is not None and first[("t", 0)].read.records
        rm.partition("t", 0).append_as_leader(batch([b"w" * 1000]), 1, 1)
        rm.purgatory.progress(("t", 0))
        held = answered(c.fetch([spec("t", 0, offset=1)]))  # out of the ISR, quota used up: held back
        assert all(r.read is None or not r.read.records for r in held.values())
        rm.set_replication_throttles(2**63 - 1, 2**63 - 1)  # no new mark: it stayed dirty
        later = answered(c.fetch([]))
        read = later[("t", 0)].read
        assert read is not None and read.records
    finally:
        rm.shutdown()
