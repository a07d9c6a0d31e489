"""The core's transaction requests (kbroker.api.txn_api), without sockets: the
TransactionalId ACLs, NOT_COORDINATOR for an id another broker coordinates (for
TxnOffsetCommit: a group), AddPartitionsToTxn's all-or-nothing answer, KIP-360's
InitProducerId and ListTransactions."""

from __future__ import annotations

import pytest

from kbroker.api.access import Access
from kbroker.api.txn_api import TransactionApi
from kbroker.cluster.zkdata import CommittedOffset, TxnState
from kbroker.group.coordinator import coordinator_for
from kclient.errors import (
    GroupAuthorizationFailedError,
    IllegalGenerationError,
    NotCoordinatorError,
    OperationNotAttemptedError,
    ProducerFencedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from tests.support import FakeAuthorizer, FakeMetadataCache
from tests.unit.test_transaction_coordinator import Fixture


def _api(*denied: tuple[str, str, str], brokers: tuple[int, ...] = (1,)) -> tuple[TransactionApi, Fixture]:
    f = Fixture()
    metadata = FakeMetadataCache(brokers, {"out": 2, "secret": 1, "in": 1})
    api = TransactionApi(1, f.coordinator, metadata, Access(FakeAuthorizer(*denied)))  # type: ignore[arg-type]
    return api, f


def test_a_transaction_through_the_core() -> None:
    api, f = _api()
    node = api.find_coordinator("app")
    assert (node.node_id, node.host, node.port) == (1, "127.0.0.1", 9093)
    pid, epoch = api.init_producer_id("app", 10000)
    assert api.add_partitions("app", pid, epoch, [("out", 0), ("out", 1)]) == {("out", 0): None, ("out", 1): None}
    api.add_offsets("app", pid, epoch, "readers")
    assert api.commit_offsets("app", pid, epoch, "readers", {("in", 0): CommittedOffset(3)}) == {("in", 0): None}
    api.end_txn("app", pid, epoch, commit=True)
    assert f.state("app").state is TxnState.COMPLETE_COMMIT
    assert f.offsets.committed == {"readers": {("in", 0): CommittedOffset(3)}}
    [(tid, err, meta)] = api.describe(["app"])
    assert (tid, err) == ("app", None) and meta is not None and meta.producer_id == pid


def test_add_partitions_is_all_or_nothing() -> None:
    api, f = _api(("WRITE", "TOPIC", "secret"))
    pid, epoch = api.init_producer_id("app", 10000)
    results = api.add_partitions("app", pid, epoch, [("out", 0), ("secret", 0), ("out", 9)])
    assert isinstance(results[("secret", 0)], TopicAuthorizationFailedError)
    assert isinstance(results[("out", 9)], UnknownTopicOrPartitionError)
    assert isinstance(results[("out", 0)], OperationNotAttemptedError)
    assert f.state("app").state is TxnState.EMPTY  # nothing begun


def test_the_transactional_id_and_group_acls_are_checked() -> None:
    api, f = _api(("WRITE", "TRANSACTIONAL_ID", "app"), ("READ", "GROUP", "hidden"))
    with pytest.raises(TransactionalIdAuthorizationFailedError):
        api.init_producer_id("app", 10000)
    assert f.store.load("app") is None
    pid, epoch = api.init_producer_id("other", 10000)
    with pytest.raises(GroupAuthorizationFailedError):
        api.add_offsets("other", pid, epoch, "hidden")
    hidden, _ = _api(("DESCRIBE", "TRANSACTIONAL_ID", "app"))
    with pytest.raises(TransactionalIdAuthorizationFailedError):
        hidden.find_coordinator("app")


def test_an_id_another_broker_coordinates_answers_not_coordinator() -> None:
    api, _ = _api(brokers=tuple(range(1, 9)))
    elsewhere = next(t for t in (f"t{i}" for i in range(100)) if api.coordinator_of(t) != 1)
    with pytest.raises(NotCoordinatorError):
        api.init_producer_id(elsewhere, 10000)
    assert api.find_coordinator(elsewhere).node_id == api.coordinator_of(elsewhere)


def test_txn_offset_commit_is_served_by_the_groups_coordinator() -> None:
    api, f = _api(brokers=tuple(range(1, 9)))
    tid = next(t for t in (f"t{i}" for i in range(100)) if api.coordinator_of(t) != 1)
    mine = next(g for g in (f"g{i}" for i in range(100)) if coordinator_for(g, list(range(1, 9))) == 1)
    other = next(g for g in (f"g{i}" for i in range(100)) if coordinator_for(g, list(range(1, 9))) != 1)
    pid, epoch = f.coordinator.init_producer_id(tid, 10000)  # at the id's coordinator, another broker
    f.coordinator.add_offsets(tid, pid, epoch, mine)
    assert api.commit_offsets(tid, pid, epoch, mine, {("in", 0): CommittedOffset(4)}) == {("in", 0): None}
    assert f.state(tid).pending_offsets == {mine: {("in", 0): CommittedOffset(4)}}
    with pytest.raises(NotCoordinatorError):
        api.commit_offsets(tid, pid, epoch, other, {("in", 0): CommittedOffset(5)})


def test_init_producer_id_checks_the_producer_the_caller_holds() -> None:
    api, _ = _api()
    pid, epoch = api.init_producer_id("app", 10000)
    assert api.init_producer_id("app", 10000, pid, epoch) == (pid, epoch + 1)
    with pytest.raises(ProducerFencedError):
        api.init_producer_id("app", 10000, pid, epoch + 7)


def test_list_transactions_answers_the_ids_the_caller_may_describe() -> None:
    api, _ = _api(("DESCRIBE", "TRANSACTIONAL_ID", "hidden"))
    pid, epoch = api.init_producer_id("app", 10000)
    api.init_producer_id("hidden", 10000)
    api.add_partitions("app", pid, epoch, [("out", 0)])
    unknown, listed = api.list_transactions()
    assert unknown == [] and [m.transactional_id for m in listed] == ["app"]
    unknown, listed = api.list_transactions(["Ongoing", "Bogus", "Dead"], [pid])
    assert unknown == ["Bogus"] and [(m.transactional_id, m.state) for m in listed] == [("app", TxnState.ONGOING)]
    assert api.list_transactions(["Empty"]) == ([], [])
    assert api.list_transactions(["Dead"]) == ([], [])
    spread, _ = _api(brokers=tuple(range(1, 9)))
    ids = [f"t{i}" for i in range(20)]
    for t in ids:
        try:
            spread.init_producer_id(t, 10000)
        except NotCoordinatorError:
            pass
    assert [m.transactional_id for m in spread.list_transactions()[1]] == [
        t for t in sorted(ids) if spread.coordinator_of(t) == 1
    ]


def test_txn_offset_commit_checks_the_consumers_member_when_named() -> None:
    f = Fixture()
    metadata = FakeMetadataCache((1,), {"in": 1})
    checked: list[tuple[str, str, int, str | None]] = []

    def check(group: str, member: str, generation: int, instance: str | None) -> None:
        checked.append((group, member, generation, instance))
        if generation == 3:
            raise IllegalGenerationError("generation 3 is not the group's 4")

    api = TransactionApi(1, f.coordinator, metadata, Access(FakeAuthorizer()), check)  # type: ignore[arg-type]
    pid, epoch = api.init_producer_id("app", 10000)
    api.add_offsets("app", pid, epoch, "readers")
    offsets = {("in", 0): CommittedOffset(3)}
    assert api.commit_offsets("app", pid, epoch, "readers", offsets) == {("in", 0): None}
    assert checked == []  # a producer that names only the group is not checked
    assert api.commit_offsets("app", pid, epoch, "readers", offsets, member_id="m-1", generation_id=4) == {
        ("in", 0): None
    }
    with pytest.raises(IllegalGenerationError):  # a zombie consumer's producer
        api.commit_offsets(
            "app", pid, epoch, "readers", {("in", 0): CommittedOffset(9)}, member_id="m-1", generation_id=3
        )
    assert checked == [("readers", "m-1", 4, None), ("readers", "m-1", 3, None)]
    [(_, _, meta)] = api.describe(["app"])
    assert meta is not None and meta.pending_offsets["readers"][("in", 0)].offset == 3  # the refused one left nothing
