"""AdminClient's transaction methods (KIP-664: describe_transactions, list_transactions)
against a fake transport: the requests they send, where, and the answers they decode."""

from __future__ import annotations

from typing import Any

import pytest

from kclient.admin import AdminClient, TransactionDescription, TransactionListing
from kclient.errors import KafkaConnectionError, TransactionalIdAuthorizationFailedError, TransactionalIdNotFoundError
from kclient.proto.kbroker.v1 import group_pb2, txn_pb2
from kclient.structs import TopicPartition
from tests.support import FakeMetadata, FakeTransport


def _admin(answers: dict[str, Any], addresses: list[str] | None = None) -> tuple[AdminClient, FakeTransport]:
    admin = AdminClient.__new__(AdminClient)
    transport = FakeTransport(answers)
    admin._transport = transport  # type: ignore[assignment]
    admin._metadata = FakeMetadata(addresses=addresses or ["b1:1", "b2:1"])  # type: ignore[assignment]
    admin._timeout_ms = 1000
    return admin, transport


def _coordinator(request: group_pb2.FindCoordinatorRequest) -> group_pb2.FindCoordinatorResponse:
    assert request.key_type == group_pb2.TRANSACTION
    return group_pb2.FindCoordinatorResponse(node_id=2, host="b2", port=1)


def _described(request: txn_pb2.DescribeTransactionsRequest) -> txn_pb2.DescribeTransactionsResponse:
    resp = txn_pb2.DescribeTransactionsResponse()
    [tid] = request.transactional_ids
    if tid == "gone":
        resp.transaction_states.add(transactional_id=tid, error_code=105, error_message="not known")  # type: ignore[arg-type]
        return resp
    d = resp.transaction_states.add(
        transactional_id=tid,
        transaction_state="Ongoing",
        transaction_timeout_ms=60000,
        transaction_start_time_ms=1234,
        producer_id=7,
        producer_epoch=3,
    )
    d.topics.add(name="t", partitions=[1, 0])
    return resp


def test_describe_transactions_asks_each_ids_coordinator() -> None:
    admin, transport = _admin({"FindCoordinator": _coordinator, "DescribeTransactions": _described})
    [d] = admin.describe_transactions(["tx"])
    assert d == TransactionDescription(
        "tx", 2, "Ongoing", 7, 3, 60000, 1234, [TopicPartition("t", 0), TopicPartition("t", 1)]
    )
    assert [(a, m) for a, m, _ in transport.calls] == [("any", "FindCoordinator"), ("b2:1", "DescribeTransactions")]


def test_describe_transactions_finds_a_moved_coordinator_again() -> None:
    moved = txn_pb2.DescribeTransactionsResponse()
    moved.transaction_states.add(transactional_id="tx", error_code=16)  # type: ignore[arg-type]
    admin, transport = _admin({"FindCoordinator": _coordinator})
    transport.on("DescribeTransactions", moved, _described)
    [d] = admin.describe_transactions(["tx"])
    assert d.state == "Ongoing"
    assert transport.methods().count("FindCoordinator") == 2


def test_describe_transactions_raises_the_ids_error() -> None:
    admin, _ = _admin({"FindCoordinator": _coordinator, "DescribeTransactions": _described})
    with pytest.raises(TransactionalIdNotFoundError, match="not known"):
        admin.describe_transactions(["gone"])
    refused = group_pb2.FindCoordinatorResponse(error_code=53, error_message="denied")  # type: ignore[arg-type]
    admin, _ = _admin({"FindCoordinator": refused})
    with pytest.raises(TransactionalIdAuthorizationFailedError):
        admin.describe_transactions(["tx"])


def test_list_transactions_merges_every_brokers_answer() -> None:
    def listed(request: txn_pb2.ListTransactionsRequest) -> txn_pb2.ListTransactionsResponse:
        assert list(request.state_filters) == ["Ongoing"] and list(request.producer_id_filters) == [7, 8]
        resp = txn_pb2.ListTransactionsResponse()
        n = len(transport.requests("ListTransactions"))
        resp.transaction_states.add(transactional_id=f"tx-{n}", producer_id=6 + n, transaction_state="Ongoing")
        return resp

    admin, transport = _admin({"ListTransactions": listed})
    got = admin.list_transactions(states=["Ongoing"], producer_ids=[7, 8])
    assert got == [TransactionListing("tx-1", 7, "Ongoing"), TransactionListing("tx-2", 8, "Ongoing")]
    assert transport.addresses() == ["b1:1", "b2:1"]


def test_list_transactions_tolerates_a_broker_down_but_not_all() -> None:
    admin, transport = _admin({"ListTransactions": txn_pb2.ListTransactionsResponse()})
    transport.down.add("b1:1")
    assert admin.list_transactions() == []
    transport.down.add("b2:1")
    with pytest.raises(KafkaConnectionError):
        admin.list_transactions()
