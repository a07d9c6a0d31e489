"""Issue 22: the metadata cache applies a batch of N partition-state events in O(N)
work, not O(N x partitions of the cluster), coalesces a burst of watch events into one
batch with one summary log line, and keeps derived views per snapshot."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from kbroker.cluster import metadata_cache, zkdata
from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.zkdata import LeaderAndIsr
from tests.support import FakeZooKeeper

TOPICS, SIZE = 40, 50  # 2,000 partitions


def _cluster() -> tuple[FakeZooKeeper, MetadataCache, list[tuple[str, int]]]:
    zk = FakeZooKeeper()
    for t in range(TOPICS):
        topic = f"t{t:02d}"
        zk.set(zkdata.topic_path(topic), zkdata.encode_assignment({p: [0, 1, 2] for p in range(SIZE)}, "id-" + topic))
        for p in range(SIZE):
            zk.set(zkdata.partition_state_path(topic, p), zkdata.encode_leader_and_isr(LeaderAndIsr(0, 0, [0, 1, 2])))
    cache = MetadataCache(zk)  # type: ignore[arg-type]
    calls: list[tuple[str, int]] = []
    cache.on_partition_change(lambda topic, p, *_: calls.append((topic, p)))
    cache._events.put(("resync",))
    cache._step(block=False)
    assert len(calls) == TOPICS * SIZE
    return zk, cache, calls


def _counting(monkeypatch: pytest.MonkeyPatch, counts: Counter[str], module: Any, name: str) -> None:
    real = getattr(module, name)

    def counted(*args: Any) -> Any:
        counts[name] += 1
        return real(*args)

    monkeypatch.setattr(module, name, counted)


@pytest.mark.parametrize("n", [1, 30])
def test_a_batch_of_state_events_costs_o_changed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, n: int
) -> None:
    zk, cache, calls = _cluster()
    calls.clear()
    zk.reads.clear()
    counts: Counter[str] = Counter()
    # The per-partition helpers the old cache called for every partition at every event.
    _counting(monkeypatch, counts, zkdata, "partition_state_path")
    _counting(monkeypatch, counts, metadata_cache, "_partition_view")
    changed = [(f"t{(i * 7) % TOPICS:02d}", (i * 13) % SIZE) for i in range(n)]
    caplog.set_level(logging.INFO, logger="kbroker.cluster.metadata_cache")
    for topic, p in changed:
        path = zkdata.partition_state_path(topic, p)
        zk.set(path, zkdata.encode_leader_and_isr(LeaderAndIsr(1, 1, [1, 2])))
        cache._watch(WatchedEvent(EventType.CHANGED, KazooState.CONNECTED, path))
    cache._watch(WatchedEvent(EventType.CHANGED, KazooState.CONNECTED, path))  # the same znode twice
    counts.clear()

    cache._step(block=False)  # one batch: the whole burst

    assert cache._events.empty()
    assert sorted(calls) == sorted(changed)  # each changed partition notified once, no other
    assert sum(zk.reads.values()) == n  # each changed znode read once (the duplicate coalesced)
    assert counts["partition_state_path"] == 0  # no scan of every partition's path
    assert counts["_partition_view"] <= 2 * n  # only changed partitions compared
    snap = cache.snapshot()
    assert all(snap.leader_of(t, p) == 1 for t, p in changed)
    assert snap.leader_counts == Counter({0: TOPICS * SIZE - n, 1: n})
    lines = [r.getMessage() for r in caplog.records if r.name == "kbroker.cluster.metadata_cache"]
    assert len(lines) == 1, lines  # one summary line for the batch
    assert f"applied {n} partition change(s)" in lines[0] and f"{n} new leader" in lines[0]


def test_isr_only_changes_log_at_debug_and_a_config_touches_its_topic_only(caplog: pytest.LogCaptureFixture) -> None:
    zk, cache, calls = _cluster()
    calls.clear()
    caplog.set_level(logging.INFO, logger="kbroker.cluster.metadata_cache")
    path = zkdata.partition_state_path("t03", 4)
    zk.set(path, zkdata.encode_leader_and_isr(LeaderAndIsr(0, 0, [0, 1])))
    cache._watch(WatchedEvent(EventType.CHANGED, KazooState.CONNECTED, path))
    cpath = zkdata.topic_config_path("t05")
    zk.set(cpath, zkdata.encode_entity_config({"retention.ms": "1000"}))
    cache._watch(WatchedEvent(EventType.CREATED, KazooState.CONNECTED, cpath))
    cache._step(block=False)
    assert sorted(calls) == [("t03", 4)] + [("t05", p) for p in range(SIZE)]
    assert not [r for r in caplog.records if r.name == "kbroker.cluster.metadata_cache"]  # INFO: nothing
    assert cache.snapshot().topics["t05"].config == {"retention.ms": "1000"}


def test_topic_deleted_and_recreated_forgets_and_rereads_its_znodes() -> None:
    zk, cache, calls = _cluster()
    deleted: list[str] = []
    cache.on_topic_deleted(deleted.append)
    tpath = zkdata.topic_path("t07")
    for path in [p for p in zk.nodes if p.startswith(tpath)]:
        del zk.nodes[path]
    cache._watch(WatchedEvent(EventType.CHILD, KazooState.CONNECTED, zkdata.BROKER_TOPICS))
    cache._watch(WatchedEvent(EventType.DELETED, KazooState.CONNECTED, tpath))
    cache._step(block=False)
    assert deleted == ["t07"] and "t07" not in cache.snapshot().topics
    assert not any(key[1] == "t07" for key in cache._paths.values())
    calls.clear()
    zk.set(tpath, zkdata.encode_assignment({0: [0], 1: [0]}, "id-new"))
    zk.set(zkdata.partition_state_path("t07", 0), zkdata.encode_leader_and_isr(LeaderAndIsr(0, 0, [0])))
    cache._watch(WatchedEvent(EventType.CHILD, KazooState.CONNECTED, zkdata.BROKER_TOPICS))
    cache._step(block=False)
    assert sorted(calls) == [("t07", 0), ("t07", 1)]
    info = cache.snapshot().topics["t07"]
    assert info.topic_id == "id-new" and info.states[0].leader == 0 and 1 not in info.states
