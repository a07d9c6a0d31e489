"""Transactions are not served yet (a later issue): a transactional client gets a clear
error at once instead of a timeout. confluent-kafka's ``init_transactions`` raises
within a second or two; the transactional APIs answer their error code at once on the
wire."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from kbroker.local.cluster import LocalCluster
from kclient.errors import TransactionalIdAuthorizationFailedError
from tests.kafka_wire import WireClient

ck = pytest.importorskip("confluent_kafka")
TRANSACTIONS_UNSUPPORTED = TransactionalIdAuthorizationFailedError.errno

pytestmark = pytest.mark.integration

DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}


@pytest.fixture
def door(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(1, **DOOR)


def test_confluent_init_transactions_fails_at_once(door: LocalCluster) -> None:
    producer = ck.Producer({"bootstrap.servers": door.kafka_bootstrap(), "transactional.id": "tx-1"})
    started = time.monotonic()
    with pytest.raises(ck.KafkaException) as info:
        producer.init_transactions(5)
    took = time.monotonic() - started
    err = info.value.args[0]
    assert err.code() != ck.KafkaError._TIMED_OUT, err
    assert took < 4, f"init_transactions took {took:.1f} s: {err}"
    assert "transactions are not supported" in err.str(), err


def test_init_producer_id_with_a_transactional_id_is_refused(door: LocalCluster) -> None:
    with WireClient(door.kafka_bootstrap()) as c:
        r = c.call(
            22, 3, {"transactional_id": "tx-1", "transaction_timeout": 60_000, "producer_id": -1, "producer_epoch": -1}
        )
        assert r.error_code == TRANSACTIONS_UNSUPPORTED
        assert (r.producer_id, r.producer_epoch) == (-1, -1)
        ok = c.call(
            22, 3, {"transactional_id": None, "transaction_timeout": 60_000, "producer_id": -1, "producer_epoch": -1}
        )
        assert ok.error_code == 0 and ok.producer_id >= 0  # idempotent producers still get an id


def test_find_coordinator_for_a_transaction_is_refused(door: LocalCluster) -> None:
    with WireClient(door.kafka_bootstrap()) as c:
        r = c.call(10, 3, {"key": "tx-1", "key_type": 1})
        assert r.error_code == TRANSACTIONS_UNSUPPORTED
        assert r.error_message and "transaction" in r.error_message


def test_transaction_apis_are_not_advertised_and_answer_at_once(door: LocalCluster) -> None:
    with WireClient(door.kafka_bootstrap()) as c:
        listed = {
            int(a.api_key)
            for a in c.call(18, 3, {"client_software_name": "t", "client_software_version": "1"}).api_keys
        }
        assert not listed & {24, 25, 26, 28}  # AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit
        r = c.call(26, 1, {"transactional_id": "tx-1", "producer_id": 1, "producer_epoch": 0, "committed": True})
        assert r.error_code == 35  # UNSUPPORTED_VERSION
