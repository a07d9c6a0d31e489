"""Broker request paths without a ZooKeeper connection (its quorum lost): each waits a
bounded time for it (:meth:`ZkClient.require_connection`), then refuses with a typed,
retriable Kafka error having read and written nothing, while malformed input still gets
its own validation error at once, without waiting.

The fake ZooKeeper here is down for good: ``await_connection`` answers False at once and
counts itself, and any other use of it (a kazoo call, a ZkClient read or write) is
recorded and fails the test.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from kbroker.api.access import Access
from kbroker.api.admin_api import AdminApi, ConfigChange, ConfigChanges, ConfigResource, NewPartitions, NewTopic
from kbroker.api.cluster_api import ClusterApi
from kbroker.api.txn_api import TransactionApi
from kbroker.cluster.acl_store import ZkAclStore
from kbroker.cluster.config_admin import AlterOp, ConfigAdmin, OpType, ResourceType
from kbroker.cluster.group_store import GroupStore
from kbroker.cluster.producer_ids import ProducerIdManager
from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.cluster.txn_store import TransactionStore
from kbroker.cluster.zk_client import CONNECTION_WAIT_S, ZkClient
from kbroker.cluster.zkdata import CommittedOffset, TransactionMetadata
from kbroker.security.acl import (
    AccessControlEntry,
    AccessControlEntryFilter,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourcePatternFilter,
)
from kbroker.security.acl import ResourceType as AclResourceType
from kbroker.security.authorizer import AclAuthorizer
from kbroker.security.credentials import (
    CredentialStore,
    ScramDeletion,
    ScramUpsertion,
    alter_user_scram_credentials,
    describe_user_scram_credentials,
    new_credential,
)
from kbroker.storage.log_config import LogConfig
from kbroker.txn.coordinator import TransactionCoordinator
from kclient.errors import (
    CoordinatorNotAvailableError,
    DuplicateResourceError,
    InvalidConfigurationError,
    InvalidGroupIdError,
    InvalidRequestError,
    InvalidTopicError,
    RequestTimedOutError,
    UnacceptableCredentialError,
)
from kclient.scram import ScramMechanism
from tests.support import FakeMetadataCache

OUTAGE = "no ZooKeeper connection"


class _DeadKazoo:
    """kazoo while disconnected: ``connected`` is False; any call is recorded and fails."""

    connected = False

    def __init__(self, calls: list[str]) -> None:
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        self._calls.append(f"kazoo.{name}")
        raise AssertionError(f"kazoo.{name} was called during the outage")


class DownZk:
    """A ZkClient whose ZooKeeper is gone: ``waits`` records each ``await_connection``'s
    ``wait_s``; ``calls`` every other use (which fails), but ZkClient's own
    ``require_connection`` and ``check_request_size`` (a size check, no I/O)."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.calls: list[str] = []
        self.kazoo = _DeadKazoo(self.calls)
        self.connected = False
        self.chroot = ""

    def await_connection(self, wait_s: float) -> bool:
        self.waits.append(wait_s)
        return False

    require_connection = ZkClient.require_connection
    check_request_size = ZkClient.check_request_size  # arithmetic, no I/O

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self.calls.append(name)
        raise AssertionError(f"ZkClient.{name} was called during the outage")


@pytest.fixture
def zk() -> DownZk:
    return DownZk()


def refused(
    zk: DownZk, error: type[Exception], call: Callable[[], object], wait_s: float = CONNECTION_WAIT_S
) -> Exception:
    """``call`` raises ``error`` for the outage after one wait of ``wait_s``, touching nothing."""
    with pytest.raises(error, match=OUTAGE) as caught:
        call()
    assert zk.waits == [wait_s]
    assert zk.calls == []
    assert "nothing was changed" in str(caught.value)
    return caught.value


def invalid(zk: DownZk, error: type[Exception], call: Callable[[], object]) -> None:
    """``call`` raises its own validation ``error``, without waiting or touching ZooKeeper."""
    with pytest.raises(error) as caught:
        call()
    assert OUTAGE not in str(caught.value)
    assert zk.waits == []
    assert zk.calls == []


# --- the helper --------------------------------------------------------------------------


def test_require_connection_raises_the_given_error_after_the_wait() -> None:
    client = ZkClient("127.0.0.1:1")  # never started: not connected
    with pytest.raises(RequestTimedOutError, match=r"creating x: no ZooKeeper connection for 0.05 s \(is its quorum"):
        client.require_connection("creating x", wait_s=0.05)
    with pytest.raises(CoordinatorNotAvailableError, match="nothing was changed"):
        client.require_connection("loading y", CoordinatorNotAvailableError, 0.0)
    assert RequestTimedOutError.retriable and CoordinatorNotAvailableError.retriable


# --- topics and groups (the first two users of the helper) --------------------------------


def test_topic_changes_are_refused_with_request_timed_out(zk: DownZk) -> None:
    admin = TopicAdmin(zk)  # type: ignore[arg-type]
    invalid(zk, InvalidTopicError, lambda: admin.create_topic("bad/name", 1, 1))
    refused(zk, RequestTimedOutError, lambda: admin.create_topic("t", 1, 1))


def test_group_store_is_refused_with_coordinator_not_available(zk: DownZk) -> None:
    store = GroupStore(zk)  # type: ignore[arg-type]
    invalid(zk, InvalidGroupIdError, lambda: store.commit("", {("t", 0): CommittedOffset(1)}))
    refused(zk, CoordinatorNotAvailableError, lambda: store.commit("g", {("t", 0): CommittedOffset(1)}))


# --- configs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda a: a.describe(ResourceType.TOPIC, "t"),
        lambda a: a.describe(ResourceType.BROKER, "1"),
        lambda a: a.describe(ResourceType.BROKER, ""),
        lambda a: a.incremental_alter(ResourceType.TOPIC, "t", [AlterOp("retention.ms", OpType.SET, "5")]),
        lambda a: a.incremental_alter(ResourceType.TOPIC, "t", [AlterOp("cleanup.policy", OpType.SUBTRACT, "delete")]),
        lambda a: a.incremental_alter(ResourceType.BROKER, "1", [AlterOp("log.cleaner.threads", OpType.SET, "2")]),
    ],
    ids=["describe-topic", "describe-broker", "describe-default", "alter-topic", "subtract-topic", "alter-broker"],
)
def test_configs_are_refused_with_request_timed_out(zk: DownZk, call: Callable[[ConfigAdmin], object]) -> None:
    refused(zk, RequestTimedOutError, lambda: call(ConfigAdmin(zk)))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("error", "call"),
    [
        (InvalidTopicError, lambda a: a.describe(ResourceType.TOPIC, "bad/name")),
        (InvalidRequestError, lambda a: a.describe(ResourceType.BROKER, "one")),
        (InvalidRequestError, lambda a: a.describe(3, "x")),
        (InvalidTopicError, lambda a: a.incremental_alter(ResourceType.TOPIC, "", [])),
        (
            InvalidRequestError,
            lambda a: a.incremental_alter(
                ResourceType.TOPIC,
                "t",
                [AlterOp("retention.ms", OpType.SET, "1"), AlterOp("retention.ms", OpType.DELETE)],
            ),
        ),
        (
            InvalidRequestError,
            lambda a: a.incremental_alter(ResourceType.TOPIC, "t", [AlterOp("retention.ms", OpType.SET)]),
        ),
        (
            InvalidRequestError,
            lambda a: a.incremental_alter(ResourceType.TOPIC, "t", [AlterOp("retention.ms", OpType.APPEND, "1")]),
        ),
        (
            InvalidConfigurationError,
            lambda a: a.incremental_alter(ResourceType.TOPIC, "t", [AlterOp("retention.ms", OpType.SET, "soon")]),
        ),
        (
            InvalidConfigurationError,
            lambda a: a.incremental_alter(ResourceType.TOPIC, "t", [AlterOp("no.such.config", OpType.SET, "1")]),
        ),
        (
            InvalidRequestError,
            lambda a: a.incremental_alter(ResourceType.BROKER, "1", [AlterOp("log.dirs", OpType.SET, "/x")]),
        ),
        (
            InvalidConfigurationError,
            lambda a: a.incremental_alter(ResourceType.BROKER, "1", [AlterOp("log.cleaner.threads", OpType.SET, "-1")]),
        ),
    ],
    ids=[
        "topic-name",
        "broker-name",
        "resource-type",
        "empty-topic",
        "repeated-name",
        "missing-value",
        "append-to-non-list",
        "bad-topic-value",
        "unknown-topic-config",
        "static-broker-config",
        "bad-broker-value",
    ],
)
def test_malformed_config_requests_are_refused_without_waiting(
    zk: DownZk, error: type[Exception], call: Callable[[ConfigAdmin], object]
) -> None:
    invalid(zk, error, lambda: call(ConfigAdmin(zk)))  # type: ignore[arg-type]


def _admin_api(zk: DownZk) -> AdminApi:
    replicas = SimpleNamespace(log_manager=SimpleNamespace(default_config=LogConfig()))
    return AdminApi(1, replicas, FakeMetadataCache(), zk, TopicAdmin(zk), Access())  # type: ignore[arg-type]


def test_a_config_request_of_many_resources_waits_once(zk: DownZk) -> None:
    api = _admin_api(zk)
    described = api.describe_configs(
        [ConfigResource(ResourceType.TOPIC, name) for name in ("a", "b", "bad/name")]
        + [ConfigResource(ResourceType.BROKER, "1")]
    )
    errors = [d.error for d in described]
    assert [type(e) for e in errors] == [
        RequestTimedOutError,
        RequestTimedOutError,
        InvalidTopicError,
        RequestTimedOutError,
    ]
    assert f"for {CONNECTION_WAIT_S:g} s" in str(errors[0]) and OUTAGE in str(errors[1])
    assert zk.waits == [CONNECTION_WAIT_S, 0.0, 0.0]  # one wait; the others only look
    assert zk.calls == []

    zk.waits.clear()
    altered = api.incremental_alter_configs(
        [
            ConfigChanges(ResourceType.TOPIC, "a", [ConfigChange("retention.ms", OpType.SET, "5")]),
            ConfigChanges(ResourceType.TOPIC, "b", [ConfigChange("retention.ms", OpType.SET, "x")]),
            ConfigChanges(ResourceType.TOPIC, "c", [ConfigChange("retention.ms", OpType.SET, "6")]),
        ]
    )
    assert [type(e) for _, e in altered] == [RequestTimedOutError, InvalidConfigurationError, RequestTimedOutError]
    assert zk.waits == [CONNECTION_WAIT_S, 0.0]
    assert zk.calls == []


# --- ACLs --------------------------------------------------------------------------------

TOPIC_T = ResourcePattern(AclResourceType.TOPIC, "t", PatternType.LITERAL)
READ_ALICE = AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)


def test_acl_changes_answer_request_timed_out_per_item_and_invalid_ones_their_own_error(zk: DownZk) -> None:
    store = ZkAclStore(zk)  # type: ignore[arg-type]
    bad = AclBinding(ResourcePattern(AclResourceType.TOPIC, "", PatternType.LITERAL), READ_ALICE)
    assert [type(e) for e in store.create_acls([bad])] == [InvalidRequestError]
    assert zk.waits == [] and zk.calls == []

    errors = store.create_acls([AclBinding(TOPIC_T, READ_ALICE), bad, AclBinding(TOPIC_T, READ_ALICE)])
    assert [type(e) for e in errors] == [RequestTimedOutError, InvalidRequestError, RequestTimedOutError]
    assert OUTAGE in str(errors[0])
    assert zk.waits == [CONNECTION_WAIT_S] and zk.calls == []

    zk.waits.clear()
    unknown = AclBindingFilter(
        ResourcePatternFilter(AclResourceType.UNKNOWN, None, PatternType.ANY), AccessControlEntryFilter()
    )
    results = store.delete_acls([AclBindingFilter.ANY, unknown])
    assert [type(r.error) for r in results] == [RequestTimedOutError, InvalidRequestError]
    assert [r.deleted for r in results] == [[], []]
    assert zk.waits == [CONNECTION_WAIT_S] and zk.calls == []


def test_the_authorizer_describes_acls_from_its_cache_and_refuses_changes(zk: DownZk) -> None:
    authorizer = AclAuthorizer(zk)  # type: ignore[arg-type]  # never started
    authorizer._set_resource(TOPIC_T, frozenset({READ_ALICE}))
    assert authorizer.describe_acls() == [AclBinding(TOPIC_T, READ_ALICE)]
    assert zk.waits == [] and zk.calls == []
    other = AccessControlEntry("User:bob", "*", AclOperation.READ, AclPermissionType.ALLOW)
    assert [type(e) for e in authorizer.create_acls([AclBinding(TOPIC_T, other)])] == [RequestTimedOutError]
    assert authorizer.describe_acls() == [AclBinding(TOPIC_T, READ_ALICE)]  # the cache is unchanged


# --- SCRAM users -------------------------------------------------------------------------


def test_scram_admin_is_refused_with_request_timed_out(zk: DownZk) -> None:
    store = CredentialStore(zk)  # type: ignore[arg-type]
    credential = new_credential(ScramMechanism.SCRAM_SHA_256, "pw")
    invalid(zk, UnacceptableCredentialError, lambda: store.set_credential("", ScramMechanism.SCRAM_SHA_256, credential))
    invalid(zk, InvalidRequestError, lambda: store.describe([""]))
    refused(zk, RequestTimedOutError, lambda: store.set_credential("alice", ScramMechanism.SCRAM_SHA_256, credential))
    zk.waits.clear()
    refused(zk, RequestTimedOutError, lambda: store.delete("alice"))
    zk.waits.clear()
    refused(zk, RequestTimedOutError, lambda: store.describe())


def test_alter_user_scram_credentials_waits_once_for_the_request(zk: DownZk) -> None:
    store = CredentialStore(zk)  # type: ignore[arg-type]
    ups = [ScramUpsertion(u, "SCRAM-SHA-256", 4096, b"salt", b"salted") for u in ("alice", "bob", "")]
    results = alter_user_scram_credentials(store, [ScramDeletion("carol", "SCRAM-SHA-512")], ups)
    assert {u: type(e) for u, e in results.items()} == {
        "carol": RequestTimedOutError,
        "alice": RequestTimedOutError,
        "bob": RequestTimedOutError,
        "": UnacceptableCredentialError,
    }
    assert f"for {CONNECTION_WAIT_S:g} s" in str(results["bob"])
    assert zk.waits == [CONNECTION_WAIT_S, 0.0, 0.0]
    assert zk.calls == []


def test_describe_user_scram_credentials_checks_names_then_refuses_the_request(zk: DownZk) -> None:
    store = CredentialStore(zk)  # type: ignore[arg-type]
    only_bad = describe_user_scram_credentials(store, ["x", "x", ""])
    assert [(u, type(e)) for u, e, _ in only_bad] == [("x", DuplicateResourceError), ("", InvalidRequestError)]
    assert zk.waits == [] and zk.calls == []
    refused(zk, RequestTimedOutError, lambda: describe_user_scram_credentials(store, ["alice", "x", "x"]))


# --- transactions and producer ids -------------------------------------------------------


class _Ids:
    def __init__(self) -> None:
        self.handed_out = 0

    def generate(self) -> tuple[int, int]:
        self.handed_out += 1
        return 1000, 0


def test_transaction_store_is_refused_with_coordinator_not_available(zk: DownZk) -> None:
    store = TransactionStore(zk)  # type: ignore[arg-type]
    refused(zk, CoordinatorNotAvailableError, lambda: store.load("tx"))
    zk.waits.clear()
    refused(zk, CoordinatorNotAvailableError, store.transactional_ids)
    zk.waits.clear()
    meta = TransactionMetadata("tx", 1000, 0, 60000)
    refused(zk, CoordinatorNotAvailableError, lambda: store.write(meta, 3), wait_s=1.0)


def test_init_producer_id_is_refused_before_any_id_is_handed_out(zk: DownZk) -> None:
    ids = _Ids()
    coordinator = TransactionCoordinator(TransactionStore(zk), ids, None, None)  # type: ignore[arg-type]
    invalid(zk, InvalidRequestError, lambda: coordinator.init_producer_id("", 60000))
    refused(zk, CoordinatorNotAvailableError, lambda: coordinator.init_producer_id("tx", 60000))
    assert ids.handed_out == 0
    zk.waits.clear()
    refused(zk, CoordinatorNotAvailableError, lambda: coordinator.add_partitions("tx", 1000, 0, [("t", 0)]))


def test_a_producer_id_block_claim_is_refused_and_nothing_is_handed_out(zk: DownZk) -> None:
    manager = ProducerIdManager(zk, broker_id=1)  # type: ignore[arg-type]
    refused(zk, CoordinatorNotAvailableError, manager.generate, wait_s=1.0)
    zk.waits.clear()
    refused(zk, CoordinatorNotAvailableError, manager.generate, wait_s=1.0)  # still nothing claimed


# --- reassignments and elections ---------------------------------------------------------


class _Controller:
    is_active = True

    def __init__(self) -> None:
        self.asked: list[str] = []

    def alter_partition_reassignments(self, moves: object, timeout_s: float) -> dict[Any, Any]:
        self.asked.append("alter")
        return {}

    def list_partition_reassignments(self, tps: object, timeout_s: float) -> dict[Any, Any]:
        self.asked.append("list")
        return {}


def test_reassignments_and_elections_are_refused_with_request_timed_out(zk: DownZk) -> None:
    controller = _Controller()
    api = ClusterApi(1, controller, FakeMetadataCache(topics={"t": 1}), zk, Access())  # type: ignore[arg-type]
    invalid(
        zk, InvalidRequestError, lambda: api.alter_partition_reassignments([(("t", 0), [1]), (("t", 0), None)], 1000)
    )
    refused(zk, RequestTimedOutError, lambda: api.alter_partition_reassignments([(("t", 0), [1])], 1000))
    zk.waits.clear()
    refused(zk, RequestTimedOutError, lambda: api.list_partition_reassignments(None, 1000))
    zk.waits.clear()
    refused(zk, RequestTimedOutError, lambda: api.elect_leaders([("t", 0)], 1000))
    assert controller.asked == []
    zk.waits.clear()
    unknown = api.elect_leaders([("nope", 0)], 1000)  # answered from the metadata cache alone
    assert zk.waits == [] and list(unknown) == [("nope", 0)]


def test_describe_transactions_waits_once_for_the_request(zk: DownZk) -> None:
    coordinator = TransactionCoordinator(TransactionStore(zk), _Ids(), None, None)  # type: ignore[arg-type]
    api = TransactionApi(1, coordinator, FakeMetadataCache(brokers=(1,)), Access())  # type: ignore[arg-type]
    described = api.describe(["a", "", "b"])
    assert [(tid, type(e)) for tid, e, _ in described] == [
        ("a", CoordinatorNotAvailableError),
        ("", InvalidRequestError),
        ("b", CoordinatorNotAvailableError),
    ]
    assert zk.waits == [CONNECTION_WAIT_S]
    assert zk.calls == []


def test_a_topic_request_of_many_topics_waits_once(zk: DownZk) -> None:
    api = _admin_api(zk)
    created = api.create_topics([NewTopic(n, 1, 1) for n in ("a", "bad/name", "b", "c")], 1000)
    assert [type(e) for _, e in created] == [
        RequestTimedOutError,
        InvalidTopicError,
        RequestTimedOutError,
        RequestTimedOutError,
    ]
    assert all(OUTAGE in str(e) for n, e in created if n != "bad/name")
    assert zk.waits == [CONNECTION_WAIT_S, 0.0, 0.0]

    for request in (
        lambda: api.delete_topics(["a", "b"], 1000),
        lambda: api.create_partitions([NewPartitions("a", 2), NewPartitions("b", 2)], 1000),
    ):
        zk.waits.clear()
        answers = request()
        assert [type(e) for _, e in answers] == [RequestTimedOutError, RequestTimedOutError]
        assert zk.waits == [CONNECTION_WAIT_S, 0.0]
    assert zk.calls == []
