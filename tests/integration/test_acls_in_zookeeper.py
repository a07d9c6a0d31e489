"""AclAuthorizer against a real ZooKeeper: two authorizers stand for two brokers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient

from kbroker.cluster import acl_store
from kbroker.cluster.zk_client import ZkClient, split_connect_string
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
    ResourceType,
)
from kbroker.security.authorizer import AclAuthorizer

pytestmark = pytest.mark.integration

Op, RT, PT = AclOperation, ResourceType, PatternType
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY


def binding(
    name: str, principal: str, op: AclOperation, perm: AclPermissionType = ALLOW, **kw: PatternType
) -> AclBinding:
    pattern = ResourcePattern(RT.TOPIC, name, kw.get("pattern_type", PT.LITERAL))
    return AclBinding(pattern, AccessControlEntry(principal, "*", op, perm))


def eventually(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> float:
    """Seconds until ``check()`` held; fails after ``timeout_s``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s}s: {what}"
        time.sleep(0.02)
    return time.monotonic() - start


@pytest.fixture
def zk_factory(zk_connect: str) -> Iterator[Callable[[], ZkClient]]:
    clients: list[ZkClient] = []

    def make() -> ZkClient:
        client = ZkClient(zk_connect, session_timeout_ms=6000)
        client.start()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.close()


@pytest.fixture
def brokers(zk_factory: Callable[[], ZkClient]) -> Iterator[tuple[AclAuthorizer, AclAuthorizer]]:
    a1 = AclAuthorizer(zk_factory(), super_users={"User:admin"})
    a2 = AclAuthorizer(zk_factory(), super_users={"User:admin"})
    a1.start()
    a2.start()
    yield a1, a2
    a1.stop()
    a2.stop()


def test_acl_change_reaches_the_other_broker_within_seconds(
    brokers: tuple[AclAuthorizer, AclAuthorizer], zk_factory: Callable[[], ZkClient]
) -> None:
    a1, a2 = brokers
    zk = zk_factory()

    def can_read(a: AclAuthorizer, name: str = "t") -> bool:
        return a.authorize("User:alice", "10.0.0.1", Op.READ, RT.TOPIC, name)

    assert not can_read(a1) and not can_read(a2)
    assert a1.create_acls([binding("t", "User:alice", Op.READ)]) == [None]
    assert can_read(a1)  # the writer's cache at once
    took = eventually(lambda: can_read(a2), "broker 2 sees the new ACL")
    assert took < 5

    # Kafka's znode and notification formats.
    data, _ = zk.kazoo.get("/kafka-acl/Topic/t")
    assert json.loads(data) == {
        "version": 1,
        "acls": [{"principal": "User:alice", "permissionType": "Allow", "operation": "Read", "host": "*"}],
    }
    changes = sorted(zk.kazoo.get_children("/kafka-acl-changes"))
    assert [zk.kazoo.get(f"/kafka-acl-changes/{c}")[0] for c in changes] == [b"Topic:t"]
    assert changes[0].startswith("acl_changes_") and len(changes[0]) == len("acl_changes_") + 10

    # A prefixed deny through broker 2 reaches broker 1 and wins.
    assert a2.create_acls([binding("t", "User:alice", Op.READ, DENY, pattern_type=PT.PREFIXED)]) == [None]
    eventually(lambda: not can_read(a1), "broker 1 sees the prefixed deny")
    assert not can_read(a1, "t2")
    extended = zk.kazoo.get_children("/kafka-acl-extended-changes")
    assert [json.loads(zk.kazoo.get(f"/kafka-acl-extended-changes/{c}")[0]) for c in extended] == [
        {"version": 1, "resourceType": "Topic", "name": "t", "patternType": "Prefixed"}
    ]
    assert zk.kazoo.exists("/kafka-acl-extended/prefixed/Topic/t") is not None

    # Removing through broker 1: the prefixed znode goes away with its last ACL.
    deny_filter = AclBindingFilter(
        ResourcePatternFilter(RT.TOPIC, "t", PT.PREFIXED), AccessControlEntryFilter(permission_type=DENY)
    )
    [result] = a1.delete_acls([deny_filter])
    assert result.error is None
    assert [str(b.entry) for b in result.deleted] == [
        "(principal=User:alice, host=*, operation=READ, permissionType=DENY)"
    ]
    assert zk.kazoo.exists("/kafka-acl-extended/prefixed/Topic/t") is None
    eventually(lambda: can_read(a2), "broker 2 sees the deny removed")
    assert a1.describe_acls() == a2.describe_acls() == [binding("t", "User:alice", Op.READ)]

    # Removing everything on a resource through a MATCH filter.
    [result] = a2.delete_acls([AclBindingFilter(ResourcePatternFilter(RT.TOPIC, "t", PT.MATCH))])
    assert len(result.deleted) == 1 and result.error is None
    assert zk.kazoo.exists("/kafka-acl/Topic/t") is None
    eventually(lambda: not can_read(a1), "broker 1 sees the allow removed")
    assert a1.describe_acls() == []
    # Super users never needed any of it.
    assert a1.authorize("User:admin", "h", Op.ALTER, RT.CLUSTER, "kafka-cluster")


def test_invalid_bindings_are_refused_one_by_one(brokers: tuple[AclAuthorizer, AclAuthorizer]) -> None:
    a1, a2 = brokers
    bad_cluster = AclBinding(ResourcePattern(RT.CLUSTER, "c"), AccessControlEntry("User:a", "*", Op.ALTER, ALLOW))
    results = a1.create_acls([bad_cluster, binding("ok", "User:a", Op.WRITE), binding("x", "User:a", Op.ANY)])
    assert results[1] is None
    assert results[0] is not None and "kafka-cluster" in str(results[0])
    assert results[2] is not None and "concrete operation" in str(results[2])
    eventually(lambda: a2.describe_acls() == [binding("ok", "User:a", Op.WRITE)], "only the good one stored")


def test_concurrent_adds_on_one_resource_lose_nothing(
    brokers: tuple[AclAuthorizer, AclAuthorizer], zk_factory: Callable[[], ZkClient]
) -> None:
    a1, a2 = brokers
    principals = [f"User:u{i}" for i in range(24)]
    barrier = threading.Barrier(len(principals))
    errors: list[object] = []

    def add(i: int, principal: str) -> None:
        barrier.wait()
        errors.extend(e for e in (a1 if i % 2 else a2).create_acls([binding("hot", principal, Op.WRITE)]) if e)

    threads = [threading.Thread(target=add, args=(i, p)) for i, p in enumerate(principals)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    zk = zk_factory()
    stored = json.loads(zk.kazoo.get("/kafka-acl/Topic/hot")[0])["acls"]
    assert sorted(a["principal"] for a in stored) == sorted(principals)
    for a in (a1, a2):
        eventually(
            lambda a=a: all(a.authorize(p, "h", Op.WRITE, RT.TOPIC, "hot") for p in principals),  # type: ignore[misc]
            "every broker sees every ACL",
        )


def test_existing_acls_load_at_start_and_old_notifications_are_purged(
    zk_factory: Callable[[], ZkClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    zk = zk_factory()
    # Written as Kafka wrote them (other key order), before any broker starts.
    zk.kazoo.create(
        "/kafka-acl/Group/g",
        b'{"version":1,"acls":[{"host":"*","operation":"Read","principal":"User:bob","permissionType":"Allow"}]}',
        makepath=True,
    )
    zk.kazoo.create("/kafka-acl-changes/acl_changes_", b"not a notification", sequence=True, makepath=True)
    a = AclAuthorizer(zk_factory())
    a.start()
    try:
        assert a.authorize("User:bob", "h", Op.READ, RT.GROUP, "g")
        assert a.authorize("User:bob", "h", Op.DESCRIBE, RT.GROUP, "g")
        monkeypatch.setattr(acl_store, "CHANGE_EXPIRATION_MS", -1)
        assert a.create_acls([binding("t", "User:bob", Op.READ)]) == [None]
        assert a.sync()
        assert zk.kazoo.get_children("/kafka-acl-changes") == []  # the malformed one too
        assert a.authorize("User:bob", "h", Op.READ, RT.TOPIC, "t")
    finally:
        a.stop()


def test_session_loss_reloads_everything_and_changes_still_arrive(
    brokers: tuple[AclAuthorizer, AclAuthorizer], zk_connect: str, zk_factory: Callable[[], ZkClient]
) -> None:
    a1, a2 = brokers
    # A change with no notification (as if it had been purged while broker 2 was away):
    # only a full reload can find it.
    zk_factory().kazoo.create(
        "/kafka-acl/Topic/silent",
        b'{"version":1,"acls":[{"principal":"User:dave","permissionType":"Allow","operation":"Read","host":"*"}]}',
    )
    assert a2.sync()
    assert not a2.authorize("User:dave", "h", Op.READ, RT.TOPIC, "silent")
    # Expire broker 2's session the way kazoo's test harness does: a second client on the
    # same session id closes it.
    zk2 = a2.store.zk
    session_id, password = zk2.kazoo.client_id
    hosts, chroot = split_connect_string(zk_connect)
    killer = KazooClient(hosts=hosts + chroot, client_id=(session_id, password))
    killer.start(timeout=10)
    killer.stop()
    killer.close()
    eventually(lambda: zk2.session_id not in (-1, session_id) and zk2.connected, "broker 2 has a new session", 30)
    eventually(lambda: a2.authorize("User:dave", "h", Op.READ, RT.TOPIC, "silent"), "reloaded after session loss")
    # Watches were re-armed on the new session.
    assert a1.create_acls([binding("after", "User:carol", Op.READ)]) == [None]
    eventually(lambda: a2.authorize("User:carol", "h", Op.READ, RT.TOPIC, "after"), "change after session loss")
