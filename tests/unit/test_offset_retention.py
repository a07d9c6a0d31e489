"""Committed-offset retention (offsets.retention.minutes, KIP-211) in the group
coordinator, against an in-memory group store with commit times: which offsets one
check expires for an Empty group, a group with consumer members, a standalone
committer, and a commit racing the check."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from kbroker.cluster.group_store import StoredGroup, StoredOffset
from kbroker.cluster.zkdata import CommittedOffset
from kbroker.config import build_config
from kbroker.group.coordinator import GroupCoordinator
from kbroker.group.group import GroupState
from kclient.errors import InvalidConfigError
from kclient.proto.kbroker.v1 import group_pb2

TP = tuple[str, int]
MINUTE_MS = 60_000
RETENTION_MINUTES = 10


class TimedStore:
    """GroupStore's surface the coordinator uses, in memory, with commit times."""

    def __init__(self) -> None:
        self.offsets: dict[str, dict[TP, StoredOffset]] = {}
        self.generations: dict[str, int] = {}
        self.now_ms = 1_000_000_000_000.0
        self.race: TP | None = None
        """A partition committed again between the check's read and its delete."""

    def groups(self) -> list[str]:
        return sorted(set(self.offsets) | set(self.generations))

    def exists(self, group: str) -> bool:
        return group in self.offsets or group in self.generations

    def generation(self, group: str) -> int:
        return self.generations.get(group, 0)

    def stored_group(self, group: str) -> StoredGroup | None:
        if not self.exists(group):
            return None
        return StoredGroup(self.generations.get(group, 0), "consumer", 0)

    def set_generation(self, group: str, generation: int, protocol_type: str) -> None:
        self.generations[group] = generation

    def commit(self, group: str, offsets: Mapping[TP, CommittedOffset]) -> None:
        mine = self.offsets.setdefault(group, {})
        for tp, c in offsets.items():
            old = mine.get(tp)
            mine[tp] = StoredOffset(c, int(self.now_ms), old.version + 1 if old else 0)

    def fetch(self, group: str, partitions: Iterable[TP] | None = None) -> dict[TP, CommittedOffset]:
        have = self.offsets.get(group, {})
        wanted = list(have) if partitions is None else list(partitions)
        return {tp: have[tp].committed for tp in wanted if tp in have}

    def offsets_with_times(self, group: str) -> dict[TP, StoredOffset]:
        found = dict(self.offsets.get(group, {}))
        if self.race is not None:
            self.commit(group, {self.race: CommittedOffset(99)})
            self.race = None
        return found

    def expire_offsets(self, group: str, expired: Mapping[TP, int]) -> bool:
        have = self.offsets.get(group, {})
        if any(tp not in have or have[tp].version != v for tp, v in expired.items()):
            return False
        for tp in expired:
            del have[tp]
        return True

    def delete_group(self, group: str) -> None:
        self.offsets.pop(group, None)
        self.generations.pop(group, None)

    def members(self, group: str) -> list[str]:
        return []

    def add_member(self, *args: Any) -> None:
        pass

    def remove_member(self, *args: Any) -> None:
        pass

    def set_owners(self, *args: Any) -> None:
        pass

    def clear_owners(self, *args: Any) -> None:
        pass


def coordinator(store: TimedStore) -> GroupCoordinator:
    return GroupCoordinator(
        1,
        store,  # type: ignore[arg-type]
        SimpleNamespace(snapshot=lambda: SimpleNamespace(brokers={1: None})),  # type: ignore[arg-type]
        initial_rebalance_delay_ms=0,
        offsets_retention_minutes=RETENTION_MINUTES,
    )


def join(c: GroupCoordinator, group: str, *topics: str) -> str:
    sub = group_pb2.ConsumerSubscription(topics=list(topics)).SerializeToString()
    g, member_id, my_round = c.join_begin(
        group,
        "",
        client_id="c",
        client_host="h",
        session_timeout_ms=10000,
        rebalance_timeout_ms=10000,
        protocol_type="consumer",
        protocols=[("range", sub)],
    )
    for _ in range(100):
        result, _ = g.join_poll(member_id, my_round)
        if result is not None:
            break
        time.sleep(0.01)
    g.call_done(member_id)
    return member_id


def test_a_standalone_committer_loses_each_offset_by_its_own_commit_time() -> None:
    store = TimedStore()
    c = coordinator(store)
    c.commit("solo", "", -1, {("t", 0): CommittedOffset(5)})
    store.now_ms += 5 * MINUTE_MS
    c.commit("solo", "", -1, {("t", 1): CommittedOffset(6)})
    assert c.expire_offsets(store.now_ms + 4 * MINUTE_MS) == 0
    assert c.expire_offsets(store.now_ms + 5 * MINUTE_MS) == 1  # t-0 is 10 minutes old
    assert set(store.fetch("solo")) == {("t", 1)}
    assert c.expire_offsets(store.now_ms + 10 * MINUTE_MS) == 1
    assert not store.exists("solo")  # no member ever, no offset left: removed


def test_an_empty_group_keeps_every_offset_until_empty_for_the_retention() -> None:
    store = TimedStore()
    c = coordinator(store)
    member = join(c, "g", "t")
    g, state, _ = c.describe("g")
    assert state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
    g.sync_begin(member, g.generation, {member: b""})
    c.commit("g", member, g.generation, {("t", 0): CommittedOffset(5), ("u", 0): CommittedOffset(7)})
    store.now_ms += 60 * MINUTE_MS  # old commits, but the group is not Empty yet
    c.leave("g", member)
    left = g.empty_since_ms
    assert c.describe("g")[1] == GroupState.EMPTY
    assert c.expire_offsets(left + RETENTION_MINUTES * MINUTE_MS - 1) == 0
    assert c.expire_offsets(left + RETENTION_MINUTES * MINUTE_MS) == 2  # all at once
    assert not store.exists("g")


def test_a_consumer_group_with_members_loses_only_unsubscribed_topics() -> None:
    store = TimedStore()
    c = coordinator(store)
    member = join(c, "g", "t")
    g, _, _ = c.describe("g")
    g.sync_begin(member, g.generation, {member: b""})
    c.commit("g", member, g.generation, {("t", 0): CommittedOffset(5), ("old", 0): CommittedOffset(7)})
    assert c.expire_offsets(store.now_ms + RETENTION_MINUTES * MINUTE_MS) == 1
    assert set(store.fetch("g")) == {("t", 0)}  # subscribed: kept however old
    assert c.describe("g")[1] == GroupState.STABLE


def test_a_loaded_group_that_had_members_counts_from_its_load() -> None:
    """Members live in the coordinator's memory: a group loaded here (after a restart or
    a coordinator move) looks Empty while its members reconnect, so its Empty time
    starts at the load, never at its old commits."""
    store = TimedStore()
    store.generations["g"] = 4
    store.commit("g", {("t", 0): CommittedOffset(5)})
    store.now_ms += 100 * MINUTE_MS
    c = coordinator(store)
    now = time.time() * 1000.0
    assert c.expire_offsets(now + (RETENTION_MINUTES - 1) * MINUTE_MS) == 0
    assert c.expire_offsets(now + (RETENTION_MINUTES + 1) * MINUTE_MS) == 1


def test_an_offset_committed_during_the_check_is_kept() -> None:
    store = TimedStore()
    c = coordinator(store)
    c.commit("solo", "", -1, {("t", 0): CommittedOffset(5)})
    store.race = ("t", 0)
    assert c.expire_offsets(store.now_ms + RETENTION_MINUTES * MINUTE_MS) == 0
    assert store.fetch("solo") == {("t", 0): CommittedOffset(99)}


def test_the_settings_default_to_kafkas() -> None:
    cfg = build_config({"broker.id": "0", "zookeeper.connect": "127.0.0.1:2181", "log.dirs": "/tmp/x"})
    assert (cfg.offsets_retention_minutes, cfg.offsets_retention_check_interval_ms) == (10080, 600000)
    cfg = build_config(
        {
            "broker.id": "0",
            "zookeeper.connect": "127.0.0.1:2181",
            "log.dirs": "/tmp/x",
            "offsets.retention.minutes": "1",
            "offsets.retention.check.interval.ms": "500",
        }
    )
    assert (cfg.offsets_retention_minutes, cfg.offsets_retention_check_interval_ms) == (1, 500)


@pytest.mark.parametrize("minutes", [0, -1])
def test_the_retention_must_be_at_least_a_minute(minutes: int) -> None:
    with pytest.raises(InvalidConfigError, match=r"offsets\.retention\.minutes"):
        build_config(
            {
                "broker.id": "0",
                "zookeeper.connect": "127.0.0.1:2181",
                "log.dirs": "/tmp/x",
                "offsets.retention.minutes": str(minutes),
            }
        )
