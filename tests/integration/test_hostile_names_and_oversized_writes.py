"""Hostile names and oversized writes against a real ZooKeeper: names that
become path segments cannot reach another group's znodes, and a write too large for
ZooKeeper is refused with a typed error instead of dropping the broker's session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kbroker.cluster import zkdata
from kbroker.cluster.group_store import GroupStore
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import CommittedOffset
from kclient.errors import InvalidCommitOffsetSizeError, InvalidGroupIdError, InvalidRequestError

pytestmark = pytest.mark.integration

HOSTILE = [
    "victim/offsets",
    "victim/offsets/t",
    "victim/offsets/vt",
    "victim/",
    "/victim",
    "../victim",
    "victim/..",
    ".",
    "..",
    "...",
    "a\x00b",
    "tab\there",
    "\x7f\x9f",
    "\ue000private",
    "\ufff0",
    "%",
    "%2F",
    "%2E",
    "victim%2Foffsets",
    "ümlaut/ß/日本",
    "emoji 🦆",
    "g" * zkdata.MAX_GROUP_ID_LENGTH,
]


@pytest.fixture
def zk(zk_connect: str) -> Iterator[ZkClient]:
    client = ZkClient(zk_connect)
    client.start()
    client.ensure_persistent_paths()
    try:
        yield client
    finally:
        client.close()


def test_hostile_group_ids_cannot_touch_another_group(zk: ZkClient) -> None:
    store = GroupStore(zk)
    victim = {("t", 0): CommittedOffset(5, "mine"), ("vt", 1): CommittedOffset(9)}
    store.commit("victim", victim)
    for i, group in enumerate(HOSTILE):
        store.commit(group, {("t", 0): CommittedOffset(100 + i, group)})
        store.set_generation(group, 3, "consumer")
        store.add_member(group, f"{group}/m", {"client_id": group})
        store.set_owners(group, {("t", 0): f"{group}/m"})
        assert GroupStore(zk).fetch(group) == {("t", 0): CommittedOffset(100 + i, group)}, group
        assert store.generation(group) == 3 and store.members(group) == [f"{group}/m"]
    assert set(store.groups()) == {"victim", *HOSTILE}
    # A fresh store (no cache) scans the victim's offsets: no foreign znode under them.
    assert GroupStore(zk).fetch("victim") == victim
    store.commit("victim", {("t", 0): CommittedOffset(6)})
    for group in HOSTILE:
        store.delete_group(group)
        assert not store.exists(group)
    assert store.groups() == ["victim"]
    assert GroupStore(zk).fetch("victim") == {**victim, ("t", 0): CommittedOffset(6)}


def test_hostile_topic_names_in_an_offset_fetch_read_nothing(zk: ZkClient) -> None:
    store = GroupStore(zk)
    store.commit("victim", {("t", 0): CommittedOffset(5)})
    wanted = [("../victim/offsets/t", 0), ("..", 0), ("x" * 2_000_000, 0), ("t", 0)]
    assert store.fetch("other", wanted) == {}
    assert store.fetch("victim", wanted) == {("t", 0): CommittedOffset(5)}


def test_oversized_names_are_refused_and_the_session_survives(zk: ZkClient) -> None:
    store = GroupStore(zk)
    session = zk.session_id
    huge = "g" * (2 * 1024 * 1024)
    for call in (
        lambda: store.commit(huge, {("t", 0): CommittedOffset(1)}),
        lambda: store.generation(huge),
        lambda: store.fetch(huge),
        lambda: store.delete_group(huge),
        lambda: store.exists(""),
        lambda: store.commit("g" * (zkdata.MAX_GROUP_ID_LENGTH + 1), {("t", 0): CommittedOffset(1)}),
    ):
        with pytest.raises(InvalidGroupIdError):
            call()
    with pytest.raises(InvalidRequestError, match="member id"):
        store.add_member("g", "m" * (2 * 1024 * 1024), {})
    with pytest.raises(InvalidRequestError):
        store.add_member("g", "m", {"client_id": "c" * (2 * 1024 * 1024)})
    assert zk.session_id == session
    assert zk.kazoo.exists("/consumers") is not None


def test_a_commit_too_large_for_zookeeper_is_refused_whole(zk: ZkClient) -> None:
    store = GroupStore(zk)
    session = zk.session_id
    store.commit("g", {("t", 0): CommittedOffset(1)})
    big = {("t", p): CommittedOffset(10, "m" * 4000) for p in range(300)}  # ~1.2 MB
    with pytest.raises(InvalidCommitOffsetSizeError):
        store.commit("g", big)
    assert zk.session_id == session and zk.kazoo.connected
    assert store.fetch("g") == {("t", 0): CommittedOffset(1)}  # nothing of it was written
    half = dict(list(big.items())[:100])  # ~400 KB: one multi
    store.commit("g", half)
    assert GroupStore(zk).fetch("g") == {**half}
    assert zk.session_id == session


def test_large_ownership_is_written_in_bounded_multis(zk: ZkClient) -> None:
    store = GroupStore(zk)
    session = zk.session_id
    owners = {(f"topic-{i % 50}", i): "m" * 400 for i in range(3000)}  # ~1.5 MB of znodes
    store.set_owners("g", owners)
    assert len(zk.kazoo.get_children(zkdata.group_owners_path("g", "topic-7"))) == 60
    with pytest.raises(InvalidRequestError):
        store.set_owners("g", {("t", i): "m" * 500 for i in range(20000)})
    assert zk.session_id == session


def test_oversized_topic_znodes_are_refused(zk: ZkClient) -> None:
    session = zk.session_id
    big = {"x.custom": "v" * (2 * 1024 * 1024)}
    with pytest.raises(InvalidRequestError):
        zk.create_topic("t", {0: [0]}, big)
    assert not zk.topic_exists("t") and zk.session_id == session
    zk.create_topic("t", {0: [0]}, {})
    with pytest.raises(InvalidRequestError):
        zk.set_topic_config("t", big)
    assert zk.topic_config("t") == {} and zk.session_id == session
