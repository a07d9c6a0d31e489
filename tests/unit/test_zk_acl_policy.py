"""The ZooKeeper ACL policy (path -> ACLs) and where the ZooKeeper credential comes from."""

from __future__ import annotations

from pathlib import Path

import pytest
from kazoo.security import OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, Permissions, make_digest_acl_credential

from kbroker.cluster import zkdata
from kbroker.cluster.zk_acl import acls_for, digest_acl, is_sensitive
from kbroker.cluster.zk_client import ZkClient
from kbroker.security import zk_credential
from kbroker.security.zk_credential import ZkCredential, ZkCredentialError, resolve_credential
from kclient.errors import KafkaError

CRED = ZkCredential("kafka", "s3cr:et")
WORLD_READ = READ_ACL_UNSAFE[0]


def test_credential_acl_is_the_digest_id_with_all_permissions() -> None:
    acl = digest_acl(CRED)
    assert acl.id.scheme == "digest"
    assert acl.id.id == make_digest_acl_credential("kafka", "s3cr:et")
    assert acl.perms == Permissions.ALL
    assert CRED.auth_data == [("digest", "kafka:s3cr:et")]
    assert "s3cr" not in repr(CRED)


@pytest.mark.parametrize(
    "path",
    [
        "/",
        zkdata.BROKER_IDS + "/0",
        zkdata.topic_path("t"),
        zkdata.partition_state_path("t", 0),
        zkdata.CONFIG_TOPICS + "/t",
        zkdata.CONFIG_CHANGES + "/config_change_0000000001",
        zkdata.CONTROLLER,
        zkdata.CONTROLLER_EPOCH,
        zkdata.CLUSTER_ID,
        zkdata.REASSIGN_PARTITIONS,
        zkdata.CONSUMERS,
        zkdata.CONSUMERS + "/g/offsets/t/0",
        "/kafka-acl/Topic/t",
        "/kafka-acl-changes/acl_changes_0000000001",
        "/config/usersX",
    ],
)
def test_non_sensitive_paths_get_all_for_the_credential_and_world_read(path: str) -> None:
    assert not is_sensitive(path)
    assert acls_for(path, CRED) == [digest_acl(CRED), WORLD_READ]


@pytest.mark.parametrize(
    "path",
    ["/config/users", "/config/users/alice", "/config/brokers", "/config/brokers/<default>", "/delegation_token"],
)
def test_sensitive_paths_get_no_world_read(path: str) -> None:
    assert is_sensitive(path)
    assert acls_for(path, CRED) == [digest_acl(CRED)]


def test_without_a_credential_every_path_is_open() -> None:
    for path in ("/", "/config/users/alice", zkdata.BROKER_IDS):
        assert acls_for(path, None) == list(OPEN_ACL_UNSAFE)


def test_secure_roots_cover_every_kbroker_top_level_path() -> None:
    tops = {"/" + p.split("/")[1] for p in (*zkdata.PERSISTENT_PATHS, zkdata.CLUSTER_ID, zkdata.CONTROLLER)}
    assert tops <= set(zkdata.SECURE_ROOT_PATHS)
    assert {"/kafka-acl", "/kafka-acl-changes", "/kafka-acl-extended", "/kafka-acl-extended-changes"} <= set(
        zkdata.SECURE_ROOT_PATHS
    )
    assert "/zookeeper" not in zkdata.SECURE_ROOT_PATHS


@pytest.mark.parametrize("text", ["kafka", ":pw", "kafka:", ""])
def test_malformed_digest_is_refused(text: str) -> None:
    with pytest.raises(ZkCredentialError):
        ZkCredential.parse(text)


JAAS = """
// brokers and tools
KafkaServer {
    org.apache.kafka.common.security.scram.ScramLoginModule required
    username="admin" password="not-this";
};
Client {
    org.apache.zookeeper.server.auth.DigestLoginModule required
    username="kafka"
    password="kafka-secret";
};
Other { x required username="o" password="p"; };
"""


def test_credential_sources_in_order(tmp_path: Path) -> None:
    jaas = tmp_path / "jaas.conf"
    jaas.write_text(JAAS)
    opts = f"-Xmx1g -D{zk_credential.JAAS_PROPERTY}={jaas}"
    assert resolve_credential(None, {}) is None
    assert resolve_credential(None, {"KAFKA_OPTS": "-Xmx1g"}) is None
    assert resolve_credential(None, {"KAFKA_OPTS": opts}) == ZkCredential("kafka", "kafka-secret")
    other = {"KAFKA_OPTS": f"{opts} -D{zk_credential.JAAS_SECTION_PROPERTY}=Other"}
    assert resolve_credential(None, other) == ZkCredential("o", "p")
    env = {"KAFKA_OPTS": opts, zk_credential.DIGEST_ENV: "env:pw"}
    assert resolve_credential(None, env) == ZkCredential("env", "pw")
    assert resolve_credential("conf:pw", env) == ZkCredential("conf", "pw")


def test_unreadable_or_incomplete_jaas_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ZkCredentialError, match="cannot read"):
        zk_credential.read_jaas_credential(tmp_path / "missing.conf")
    bad = tmp_path / "bad.conf"
    bad.write_text('KafkaServer { x required username="a" password="b"; };')
    with pytest.raises(ZkCredentialError, match="no Client section"):
        zk_credential.read_jaas_credential(bad)
    bad.write_text('Client { x required username="a"; };')
    with pytest.raises(ZkCredentialError, match="needs username and password"):
        zk_credential.read_jaas_credential(bad)


def test_zk_client_refuses_set_acl_without_a_credential() -> None:
    with pytest.raises(KafkaError, match=r"zookeeper\.set\.acl is true"):
        ZkClient("127.0.0.1:2181", set_acl=True)


def test_zk_client_defaults_are_unchanged() -> None:
    zk = ZkClient("127.0.0.1:2181/x")
    assert zk.kazoo.default_acl is None
    assert not zk.kazoo.auth_data
    zk.kazoo.close()


def test_secure_zk_client_resolves_acls_per_path_in_transactions() -> None:
    zk = ZkClient("127.0.0.1:2181/x", auth_digest="kafka:pw", set_acl=True)
    assert list(zk.kazoo.auth_data) == [("digest", "kafka:pw")]
    tx = zk.kazoo.transaction()
    tx.create("/config/users/alice", b"{}")
    tx.create("/brokers/topics/t", b"{}")
    cred = ZkCredential("kafka", "pw")
    assert [op.acl for op in tx.operations] == [[digest_acl(cred)], [digest_acl(cred), WORLD_READ]]
    zk.kazoo.close()


def test_kctl_no_auth_line_names_the_missing_or_refused_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    from kbroker.cli.backends import refused_write_message

    monkeypatch.delenv("KAFKA_OPTS", raising=False)
    monkeypatch.delenv(zk_credential.DIGEST_ENV, raising=False)
    line = refused_write_message()
    assert line.startswith("ZooKeeper refused the write: no authentication") and "(NoAuth)" in line
    assert zk_credential.DIGEST_ENV in line and "\n" not in line
    monkeypatch.setenv(zk_credential.DIGEST_ENV, "bob:pw")
    line = refused_write_message()
    assert "'bob'" in line and "(NoAuth)" in line and ":pw" not in line
