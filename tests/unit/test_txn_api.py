"""The core's transaction requests (kbroker.api.txn_api), without sockets: the
TransactionalId ACLs, NOT_COORDINATOR for an id another broker coordinates, and
AddPartitionsToTxn's all-or-nothing answer."""

from __future__ import annotations

import pytest

from kbroker.api.access import Access
from kbroker.api.txn_api import TransactionApi
from kbroker.cluster.zkdata import CommittedOffset, TxnState
from kclient.errors import (
    GroupAuthorizationFailedError,
    NotCoordinatorError,
    OperationNotAttemptedError,
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
