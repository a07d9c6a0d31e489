"""GroupCoordinator.delete_offsets (OffsetDelete, KIP-496) against an in-memory group store."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

import pytest

from kbroker.cluster.zkdata import CommittedOffset
from kbroker.group.coordinator import GroupCoordinator
from kclient.errors import (
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    NonEmptyGroupError,
    NotCoordinatorError,
)
from kclient.proto.kbroker.v1 import group_pb2
from tests.support import FakeMetadataCache

TP = tuple[str, int]


class FakeStore:
    """GroupStore's surface the coordinator uses, in memory."""

    def __init__(self) -> None:
        self.offsets: dict[str, dict[TP, CommittedOffset]] = {}
        self.generations: dict[str, int] = {}

    def exists(self, group: str) -> bool:
        return group in self.offsets or group in self.generations

    def generation(self, group: str) -> int:
        return self.generations.get(group, 0)

    def set_generation(self, group: str, generation: int, protocol_type: str) -> None:
        self.generations[group] = generation

    def commit(self, group: str, offsets: Mapping[TP, CommittedOffset]) -> None:
        self.offsets.setdefault(group, {}).update(offsets)

    def fetch(self, group: str, partitions: Iterable[TP] | None = None) -> dict[TP, CommittedOffset]:
        have = self.offsets.get(group, {})
        wanted = list(have) if partitions is None else list(partitions)
        return {tp: have[tp] for tp in wanted if tp in have}

    def delete_offsets(self, group: str, partitions: Collection[TP]) -> None:
        for tp in partitions:
            self.offsets.get(group, {}).pop(tp, None)

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


def coordinator(store: FakeStore, brokers: list[int] | None = None) -> GroupCoordinator:
    return GroupCoordinator(
        1,
        store,  # type: ignore[arg-type]
        FakeMetadataCache(brokers or [1]),  # type: ignore[arg-type]
    )


def subscription(*topics: str) -> bytes:
    return group_pb2.ConsumerSubscription(topics=list(topics)).SerializeToString()


def join(c: GroupCoordinator, group: str, protocol_type: str = "consumer", *topics: str) -> str:
    _, member_id, _ = c.join_begin(
        group,
        "",
        client_id="c",
        client_host="h",
        session_timeout_ms=10000,
        rebalance_timeout_ms=10000,
        protocol_type=protocol_type,
        protocols=[("range", subscription(*topics))],
    )
    return member_id


def committed(store: FakeStore, group: str, *tps: TP) -> None:
    store.commit(group, {tp: CommittedOffset(5, "") for tp in tps})


def test_an_unknown_group_is_group_id_not_found() -> None:
    with pytest.raises(GroupIdNotFoundError):
        coordinator(FakeStore()).delete_offsets("nobody", [("t", 0)])


def test_an_empty_group_without_offsets_is_group_id_not_found() -> None:
    store = FakeStore()
    store.generations["g"] = 3  # the group znode remains, no offsets
    with pytest.raises(GroupIdNotFoundError):
        coordinator(store).delete_offsets("g", [("t", 0)])


def test_an_empty_group_loses_exactly_the_partitions_asked_for() -> None:
    store = FakeStore()
    committed(store, "g", ("t", 0), ("t", 1), ("u", 0))
    c = coordinator(store)
    result = c.delete_offsets("g", [("t", 0), ("t", 7)])  # t-7: nothing committed, still fine
    assert result == {("t", 0): None, ("t", 7): None}
    assert set(store.fetch("g")) == {("t", 1), ("u", 0)}


def test_an_empty_group_that_loses_its_last_offset_is_removed() -> None:
    store = FakeStore()
    committed(store, "g", ("t", 0))
    store.generations["g"] = 2
    c = coordinator(store)
    assert c.delete_offsets("g", [("t", 0)]) == {("t", 0): None}
    assert not store.exists("g")
    with pytest.raises(GroupIdNotFoundError):
        c.delete_offsets("g", [("t", 0)])


def test_an_active_member_subscribed_to_the_topic_keeps_its_offsets() -> None:
    store = FakeStore()
    committed(store, "g", ("t", 0), ("t", 1), ("u", 0))
    c = coordinator(store)
    join(c, "g", "consumer", "t")
    result = c.delete_offsets("g", [("t", 0), ("t", 1), ("u", 0)])
    assert isinstance(result[("t", 0)], GroupSubscribedToTopicError)
    assert isinstance(result[("t", 1)], GroupSubscribedToTopicError)
    assert result[("u", 0)] is None
    assert set(store.fetch("g")) == {("t", 0), ("t", 1)}
    assert result[("t", 0)] is not None and result[("t", 0)].errno == 86


def test_members_of_another_protocol_type_make_the_group_non_empty() -> None:
    store = FakeStore()
    committed(store, "g", ("t", 0))
    c = coordinator(store)
    join(c, "g", "connect", "t")
    with pytest.raises(NonEmptyGroupError):
        c.delete_offsets("g", [("t", 0)])
    assert set(store.fetch("g")) == {("t", 0)}


def test_another_brokers_group_is_not_coordinator() -> None:
    store = FakeStore()
    committed(store, "g", ("t", 0))
    c = coordinator(store, brokers=[1, 2, 3])
    group = next(g for g in (f"g{i}" for i in range(100)) if c.coordinator_of(g) != 1)
    committed(store, group, ("t", 0))
    with pytest.raises(NotCoordinatorError):
        c.delete_offsets(group, [("t", 0)])
    assert set(store.fetch(group)) == {("t", 0)}
