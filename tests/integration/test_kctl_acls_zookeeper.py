"""``kctl acls --zookeeper`` as a real subprocess against a real ZooKeeper, watched by an AclAuthorizer."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest

from kbroker.cluster.zk_client import ZkClient
from kbroker.security.acl import AclOperation, ResourceType
from kbroker.security.authorizer import AclAuthorizer
from tests.integration.test_kctl import fails, kctl, ok

pytestmark = pytest.mark.integration

Op, RT = AclOperation, ResourceType


@pytest.fixture
def broker_authorizer(zk_connect: str) -> Iterator[AclAuthorizer]:
    zk = ZkClient(zk_connect)
    zk.start()
    a = AclAuthorizer(zk)
    a.start()
    yield a
    a.stop()
    zk.close()


def eventually(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s}s: {what}"
        time.sleep(0.05)


def acl_znodes(zk: ZkClient) -> dict[str, object]:
    out: dict[str, object] = {}
    for root in ("/kafka-acl", "/kafka-acl-extended/prefixed"):
        for rtype in zk.kazoo.get_children(root) if zk.kazoo.exists(root) else []:
            for name in zk.kazoo.get_children(f"{root}/{rtype}"):
                out[f"{root}/{rtype}/{name}"] = json.loads(zk.kazoo.get(f"{root}/{rtype}/{name}")[0])
    return out


def test_kctl_acls_add_list_remove_round_trip(zk_connect: str, broker_authorizer: AclAuthorizer) -> None:
    zk = f"--zookeeper {zk_connect}"
    out = ok(kctl("acls --add --allow-principal User:alice --operation Read --topic t", zk))
    topic_t = "ResourcePattern(resourceType=TOPIC, name=t, patternType=LITERAL)"
    assert out.startswith(f"Adding ACLs for resource `{topic_t}`: \n")
    assert f"Current ACLs for resource `{topic_t}`: \n \t(principal=User:alice, host=*, operation=READ" in out
    eventually(lambda: broker_authorizer.authorize("User:alice", "10.0.0.1", Op.READ, RT.TOPIC, "t"), "broker sees it")

    # kafka-acls.sh's own way to name ZooKeeper; the verb form; a prefixed producer grant.
    ok(
        kctl(
            f"acls add --producer --allow-principal User:p --topic logs- --resource-pattern-type prefixed "
            f"--authorizer-properties zookeeper.connect={zk_connect}"
        )
    )
    eventually(lambda: broker_authorizer.authorize("User:p", "h", Op.WRITE, RT.TOPIC, "logs-eu"), "prefixed producer")
    listing = ok(kctl("acls --list", zk))
    assert listing.count("Current ACLs for resource") == 2
    assert "(principal=User:p, host=*, operation=CREATE, permissionType=ALLOW)" in listing
    assert ok(kctl("acls --list --topic logs-eu --resource-pattern-type match", zk)).count("Current ACLs") == 1

    # Bad input: one line, exit 2, nothing written.
    client = ZkClient(zk_connect)
    client.start()
    before = acl_znodes(client)
    fails(kctl("acls --add --allow-principal User:x --operation Write --group g", zk), code=2, mentions="GROUP")
    fails(kctl("acls --add --allow-principal alice --topic t", zk), code=2, mentions="TYPE:NAME")
    fails(kctl("acls --remove --topic t", zk), code=2, mentions="--force")  # stdin is no terminal
    assert acl_znodes(client) == before

    ok(kctl("acls --remove --force --allow-principal User:alice --operation Read --topic t", zk))
    eventually(lambda: not broker_authorizer.authorize("User:alice", "h", Op.READ, RT.TOPIC, "t"), "removal seen")
    ok(kctl("acls remove --force --topic logs- --resource-pattern-type prefixed", zk))
    assert ok(kctl("acls --list", zk)) == ""
    assert acl_znodes(client) == {}
    client.close()
    eventually(lambda: broker_authorizer.describe_acls() == [], "broker cache empty")


def test_kctl_acls_zookeeper_unreachable_is_one_line() -> None:
    fails(kctl("acls --list --zookeeper 127.0.0.1:1"), code=1, mentions="ZooKeeper")
