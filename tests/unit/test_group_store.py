"""GroupStore without a ZooKeeper connection: a malformed group id is refused at once with
InvalidGroupIdError (it never waits for the connection), and a well-formed one gets
CoordinatorNotAvailableError (retriable), having touched nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kbroker.cluster.group_store import GroupStore
from kclient.errors import CoordinatorNotAvailableError, InvalidGroupIdError
from tests.support import FakeZooKeeper

CALLS: dict[str, Callable[[GroupStore, str], object]] = {
    "exists": lambda s, g: s.exists(g),
    "generation": lambda s, g: s.generation(g),
    "stored_group": lambda s, g: s.stored_group(g),
    "set_generation": lambda s, g: s.set_generation(g, 1, "consumer"),
    "delete_group": lambda s, g: s.delete_group(g),
    "add_member": lambda s, g: s.add_member(g, "m-1", {"host": "h"}),
    "remove_member": lambda s, g: s.remove_member(g, "m-1"),
    "members": lambda s, g: s.members(g),
    "clear_owners": lambda s, g: s.clear_owners(g),
    "fetch": lambda s, g: s.fetch(g),
}


def offline_store() -> tuple[GroupStore, FakeZooKeeper]:
    zk = FakeZooKeeper()
    zk.connected = False
    return GroupStore(zk), zk  # type: ignore[arg-type]  # the fake has ZkClient's surface used here


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_malformed_group_id_is_refused_before_waiting_for_zookeeper(call: str) -> None:
    store, zk = offline_store()
    with pytest.raises(InvalidGroupIdError):
        CALLS[call](store, "")
    assert zk.connection_waits == 0
    assert zk.nodes == {}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_well_formed_group_id_gets_coordinator_not_available(call: str) -> None:
    store, zk = offline_store()
    with pytest.raises(CoordinatorNotAvailableError, match="no ZooKeeper connection"):
        CALLS[call](store, "billing")
    assert zk.connection_waits == 1
    assert zk.nodes == {}

