"""The metadata cache: partition states come from the controller (LeaderAndIsr and
UpdateMetadata), topics and configs from ZooKeeper watches.

A batch of N states costs O(N) work, not O(N x partitions of the cluster), with one
summary log line; requests from an older controller or for an older registration of the
broker change nothing; states wait for their topic's incarnation."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

import pytest
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from kbroker.cluster import metadata_cache, zkdata
from kbroker.cluster.controller_channel import PartitionStateUpdate
from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.zkdata import LeaderAndIsr
from kclient.errors import StaleBrokerEpochError, StaleControllerEpochError
from tests.support import FakeZooKeeper

TOPICS, SIZE = 40, 50  # 2,000 partitions


def _states(cache: MetadataCache, updates: list[PartitionStateUpdate]) -> None:
    """A controller request as the event thread receives it (applied by ``_step``)."""
    cache._events.put(("controller", updates, threading.Event()))


def _update(topic: str, p: int, state: LeaderAndIsr, topic_id: str | None = None) -> PartitionStateUpdate:
    return PartitionStateUpdate(topic, p, "id-" + topic if topic_id is None else topic_id, state)


def _cluster(broker_epoch: int = -1) -> tuple[FakeZooKeeper, MetadataCache, list[tuple[str, int]]]:
    zk = FakeZooKeeper()
    for t in range(TOPICS):
        topic = f"t{t:02d}"
        zk.set(zkdata.topic_path(topic), zkdata.encode_assignment({p: [0, 1, 2] for p in range(SIZE)}, "id-" + topic))
    cache = MetadataCache(zk, broker_epoch=lambda: broker_epoch)  # type: ignore[arg-type]
    calls: list[tuple[str, int]] = []
    cache.on_partition_change(lambda topic, p, *_: calls.append((topic, p)))
    cache._events.put(("resync",))
    _states(
        cache,
        [_update(f"t{t:02d}", p, LeaderAndIsr(0, 0, [0, 1, 2], 1, 0)) for t in range(TOPICS) for p in range(SIZE)],
    )
    cache._step(block=False)
    assert len(set(calls)) == TOPICS * SIZE
    assert all(len(info.states) == SIZE for info in cache.snapshot().topics.values())
    return zk, cache, calls


def _counting(monkeypatch: pytest.MonkeyPatch, counts: Counter[str], module: Any, name: str) -> None:
    real = getattr(module, name)

    def counted(*args: Any) -> Any:
        counts[name] += 1
        return real(*args)

    monkeypatch.setattr(module, name, counted)


@pytest.mark.parametrize("n", [1, 30])
def test_a_batch_of_controller_states_costs_o_changed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, n: int
) -> None:
    zk, cache, calls = _cluster()
    calls.clear()
    zk.reads.clear()
    counts: Counter[str] = Counter()
    _counting(monkeypatch, counts, metadata_cache, "_partition_view")
    changed = [(f"t{(i * 7) % TOPICS:02d}", (i * 13) % SIZE) for i in range(n)]
    caplog.set_level(logging.INFO, logger="kbroker.cluster.metadata_cache")
    # Two requests (LeaderAndIsr, then UpdateMetadata with the same states) in one batch.
    _states(cache, [_update(t, p, LeaderAndIsr(1, 1, [1, 2], 2, 1)) for t, p in changed])
    _states(cache, [_update(t, p, LeaderAndIsr(1, 1, [1, 2], 2, 1)) for t, p in changed])

    cache._step(block=False)  # one batch: the whole burst

    assert cache._events.empty()
    assert sorted(calls) == sorted(changed)  # each changed partition notified once, no other
    assert sum(zk.reads.values()) == 0  # nothing read from ZooKeeper
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
    _states(cache, [_update("t03", 4, LeaderAndIsr(0, 0, [0, 1], 1, 1))])
    cpath = zkdata.topic_config_path("t05")
    zk.set(cpath, zkdata.encode_entity_config({"retention.ms": "1000"}))
    cache._watch(WatchedEvent(EventType.CREATED, KazooState.CONNECTED, cpath))
    cache._step(block=False)
    assert sorted(calls) == [("t03", 4)] + [("t05", p) for p in range(SIZE)]
    assert not [r for r in caplog.records if r.name == "kbroker.cluster.metadata_cache"]  # INFO: nothing
    assert cache.snapshot().topics["t05"].config == {"retention.ms": "1000"}
    assert cache.snapshot().topics["t03"].states[4].isr == [0, 1]


def test_an_older_state_of_a_partition_is_ignored() -> None:
    _, cache, calls = _cluster()
    calls.clear()
    _states(cache, [_update("t01", 0, LeaderAndIsr(2, 3, [2], 2, 5))])
    cache._step(block=False)
    # Late: an older epoch, and the same epoch with an older znode version.
    _states(
        cache, [_update("t01", 0, LeaderAndIsr(1, 2, [1], 2, 9)), _update("t01", 0, LeaderAndIsr(2, 3, [2, 1], 2, 4))]
    )
    cache._step(block=False)
    assert calls == [("t01", 0)]
    assert cache.snapshot().topics["t01"].states[0] == LeaderAndIsr(2, 3, [2], 2, 5)


def test_stale_controller_and_broker_epochs_are_refused_and_change_nothing() -> None:
    _, cache, _ = _cluster(broker_epoch=100)
    update = [_update("t01", 0, LeaderAndIsr(2, 3, [2], 2, 5))]
    cache._controller_epoch = 7
    with pytest.raises(StaleControllerEpochError):
        cache.apply_controller_states(1, 6, 100, update)
    with pytest.raises(StaleBrokerEpochError):
        cache.apply_controller_states(1, 8, 99, update)  # addressed to an older registration
    assert cache._events.empty() and cache._controller_epoch == 7


def test_states_wait_for_their_topic_incarnation() -> None:
    zk, cache, calls = _cluster()
    deleted: list[str] = []
    cache.on_topic_deleted(deleted.append)
    tpath = zkdata.topic_path("t07")
    for path in [p for p in zk.nodes if p.startswith(tpath)]:
        del zk.nodes[path]
    # The controller sends the new incarnation's states before this broker reads its znode.
    _states(cache, [_update("t07", 0, LeaderAndIsr(1, 0, [1], 2, 0), "id-new")])
    cache._step(block=False)
    assert cache.snapshot().topics["t07"].states[0].leader == 0  # not applied to the old incarnation
    cache._watch(WatchedEvent(EventType.CHILD, KazooState.CONNECTED, zkdata.BROKER_TOPICS))
    cache._watch(WatchedEvent(EventType.DELETED, KazooState.CONNECTED, tpath))
    cache._step(block=False)
    assert deleted == ["t07"] and "t07" not in cache.snapshot().topics
    assert not any(key[1] == "t07" for key in cache._paths.values())
    calls.clear()
    zk.set(tpath, zkdata.encode_assignment({0: [0, 1], 1: [0]}, "id-new"))
    cache._watch(WatchedEvent(EventType.CHILD, KazooState.CONNECTED, zkdata.BROKER_TOPICS))
    cache._step(block=False)
    assert sorted(calls) == [("t07", 0), ("t07", 1)]
    info = cache.snapshot().topics["t07"]
    assert info.topic_id == "id-new" and info.states[0].leader == 1 and 1 not in info.states


def test_a_deleted_incarnations_late_state_does_not_reach_its_recreation() -> None:
    """The controller sent t07's shrunken ISR (epoch 1), then deleted t07; the state arrives
    after the deletion, and t07 is recreated with a znode that has no id yet (the controller
    adds one a moment later). The new incarnation must not start at the old epoch 1."""
    zk, cache, _ = _cluster()
    seen: list[tuple[str, int, LeaderAndIsr | None, str | None]] = []
    cache.on_partition_change(lambda topic, p, _r, state, _c, topic_id: seen.append((topic, p, state, topic_id)))
    tpath = zkdata.topic_path("t07")
    for path in [p for p in zk.nodes if p.startswith(tpath)]:
        del zk.nodes[path]
    cache._watch(WatchedEvent(EventType.CHILD, KazooState.CONNECTED, zkdata.BROKER_TOPICS))
    cache._watch(WatchedEvent(EventType.DELETED, KazooState.CONNECTED, tpath))
    cache._step(block=False)
    assert "t07" not in cache.snapshot().topics
    _states(cache, [_update("t07", 0, LeaderAndIsr(0, 1, [0], 2, 1))])  # late: the old id, "id-t07"
    cache._step(block=False)
    zk.set(tpath, zkdata.encode_assignment({0: [0, 1]}))  # recreated without an id
    cache._watch(WatchedEvent(EventType.CHILD, KazooState.CONNECTED, zkdata.BROKER_TOPICS))
    cache._step(block=False)
    assert seen == [("t07", 0, None, None)]
    zk.set(tpath, zkdata.encode_assignment({0: [0, 1]}, "id-again"))
    cache._watch(WatchedEvent(EventType.CHANGED, KazooState.CONNECTED, tpath))
    _states(cache, [_update("t07", 0, LeaderAndIsr(0, 0, [0, 1], 2, 0), "id-again")])
    cache._step(block=False)
    assert seen[-1] == ("t07", 0, LeaderAndIsr(0, 0, [0, 1], 2, 0), "id-again")
    assert all(state is None or state.leader_epoch == 0 for _t, _p, state, _id in seen)


def test_the_cache_is_loaded_once_its_first_read_of_the_cluster_is_done() -> None:
    """Until then its snapshot is empty, not the cluster's: the doors refuse Metadata
    (is_stale), so a client that reaches a just-started broker asks another one."""
    from kbroker.api.metadata_api import MetadataApi

    zk = FakeZooKeeper()
    zk.set(zkdata.topic_path("t"), zkdata.encode_assignment({0: [0]}, "id-t"))
    cache = MetadataCache(zk, broker_epoch=lambda: -1)  # type: ignore[arg-type]
    api = MetadataApi(lambda: "c", cache, None, None, lambda t, p: False, lambda: False)  # type: ignore[arg-type]
    assert not cache.loaded() and not cache.wait_loaded(0.01) and api.is_stale()
    assert cache.snapshot().topics == {}
    cache._events.put(("resync",))
    cache._step(block=False)
    assert cache.loaded() and not api.is_stale()
    assert set(cache.snapshot().topics) == {"t"}
