"""The core's group requests (kbroker.api.group_api), without sockets: authorization once
for both doors, the coordinator's validation of commits, and typed answers."""

from __future__ import annotations

from typing import Any

import pytest

from kbroker.api.access import Access
from kbroker.api.group_api import GroupApi, MemberOf
from kbroker.cluster.zkdata import CommittedOffset
from kbroker.group.coordinator import GroupCoordinator
from kclient.errors import (
    GroupAuthorizationFailedError,
    GroupIdNotFoundError,
    InvalidCommitOffsetSizeError,
    InvalidGroupIdError,
    OffsetMetadataTooLargeError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from tests.support import FakeAuthorizer, FakeMetadataCache
from tests.unit.test_delete_offsets import FakeStore


async def _offload(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _api(*denied: tuple[str, str, str]) -> tuple[GroupApi, FakeStore, FakeAuthorizer]:
    store = FakeStore()
    metadata = FakeMetadataCache([1], {"t": 3, "secret": 1})
    groups = GroupCoordinator(1, store, metadata)  # type: ignore[arg-type]
    authorizer = FakeAuthorizer(*denied)
    api = GroupApi(groups, metadata, Access(authorizer), _offload)  # type: ignore[arg-type]
    return api, store, authorizer


def test_a_commit_writes_the_valid_partitions_and_names_why_each_other_was_not() -> None:
    api, store, _ = _api(("READ", "TOPIC", "secret"))
    results = api.commit_offsets(
        MemberOf("g", ""),
        [
            (("t", 0), CommittedOffset(5, "m")),
            (("t", 1), CommittedOffset(-1)),
            (("t", 7), CommittedOffset(1)),
            (("secret", 0), CommittedOffset(1)),
            (("t", 2), CommittedOffset(6, "x" * 5000)),
        ],
    )
    assert isinstance(results[("t", 1)], InvalidCommitOffsetSizeError)
    assert isinstance(results[("t", 7)], UnknownTopicOrPartitionError)
    assert isinstance(results[("secret", 0)], TopicAuthorizationFailedError)
    assert isinstance(results[("t", 2)], OffsetMetadataTooLargeError)
    assert results[("t", 0)] is None and store.offsets == {"g": {("t", 0): CommittedOffset(5, "m")}}


def test_a_standalone_commit_is_written_and_read_back() -> None:
    api, store, _ = _api()
    assert api.commit_offsets(MemberOf("g", ""), [(("t", 1), CommittedOffset(9, "meta"))]) == {("t", 1): None}
    assert store.offsets["g"] == {("t", 1): CommittedOffset(9, "meta")}
    [entry] = api.fetch_offsets("g", [("t", 1)])
    assert (entry.topic, entry.partition, entry.committed, entry.error) == ("t", 1, CommittedOffset(9, "meta"), None)


def test_a_group_the_caller_may_not_read_refuses_every_partition_of_a_commit() -> None:
    api, store, _ = _api(("READ", "GROUP", "g"))
    results = api.commit_offsets(MemberOf("g", ""), [(("t", 0), CommittedOffset(1)), (("t", 9), CommittedOffset(1))])
    assert all(isinstance(e, GroupAuthorizationFailedError) for e in results.values()) and len(results) == 2
    assert store.offsets == {}


def test_fetching_all_offsets_leaves_out_topics_the_caller_may_not_describe() -> None:
    api, store, _ = _api(("DESCRIBE", "TOPIC", "secret"))
    store.commit("g", {("t", 0): CommittedOffset(3), ("secret", 0): CommittedOffset(4)})
    assert [(e.topic, e.partition) for e in api.fetch_offsets("g", None)] == [("t", 0)]
    named = api.fetch_offsets("g", [("secret", 0), ("t", 1)])
    assert isinstance(named[0].error, TopicAuthorizationFailedError) and named[0].committed is None
    assert named[1].error is None and named[1].committed is None  # nothing committed: offset -1


def test_group_level_refusals_are_raised() -> None:
    api, _, _ = _api(("DESCRIBE", "GROUP", "hidden"), ("DELETE", "GROUP", "hidden"))
    with pytest.raises(GroupAuthorizationFailedError):
        api.fetch_offsets("hidden", None)
    with pytest.raises(GroupAuthorizationFailedError):
        api.find_coordinator("hidden")
    with pytest.raises(GroupAuthorizationFailedError):
        api.delete_offsets("hidden", [("t", 0)])
    with pytest.raises(InvalidGroupIdError):
        api.find_coordinator("")
    with pytest.raises(GroupIdNotFoundError):
        api.delete_offsets("nobody", [("t", 0)])


def test_the_coordinator_is_the_broker_as_the_caller_reaches_it() -> None:
    api, _, _ = _api()
    node = api.find_coordinator("g")
    assert (node.node_id, node.host, node.port) == (1, "127.0.0.1", 9093)


def test_offset_delete_answers_unknown_and_refused_partitions_per_partition() -> None:
    api, store, _ = _api(("READ", "TOPIC", "secret"))
    store.commit("g", {("t", 0): CommittedOffset(3), ("t", 1): CommittedOffset(4)})
    results = api.delete_offsets("g", [("t", 0), ("t", 5), ("secret", 0)])
    assert results[("t", 0)] is None
    assert isinstance(results[("t", 5)], UnknownTopicOrPartitionError)
    assert isinstance(results[("secret", 0)], TopicAuthorizationFailedError)
    assert store.offsets["g"] == {("t", 1): CommittedOffset(4)}


def test_describe_and_delete_answer_each_group_on_its_own() -> None:
    api, store, _ = _api(("DESCRIBE", "GROUP", "hidden"), ("DELETE", "GROUP", "hidden"))
    store.commit("g", {("t", 0): CommittedOffset(3)})
    hidden, g = api.describe_groups(["hidden", "g"])
    assert isinstance(hidden.error, GroupAuthorizationFailedError)
    assert g.error is None and g.state == "Empty" and g.members == []
    deleted = api.delete_groups(["hidden", "g", "nobody"])
    assert [gid for gid, _ in deleted] == ["hidden", "g", "nobody"]
    assert isinstance(deleted[0][1], GroupAuthorizationFailedError)
    assert deleted[1][1] is None and "g" not in store.offsets
    assert isinstance(deleted[2][1], GroupIdNotFoundError)
