"""ZooKeeper ACLs on kbroker's znodes (``zookeeper.set.acl``) against a real ZooKeeper:
what a secure ZkClient creates, what an unauthenticated kazoo client may then do, the
migration of an existing tree both ways, and kctl ``--zookeeper`` with and without the
credential."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, OPEN_ACL_UNSAFE

from kbroker.cli import zk_security
from kbroker.cli.common import CliError
from kbroker.cluster import zkdata
from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.cluster.zk_acl import acls_for, is_sensitive
from kbroker.cluster.zk_client import ZkClient, split_connect_string
from kbroker.cluster.zkdata import BrokerInfo, LeaderAndIsr
from kbroker.local.cluster import LocalCluster
from kbroker.security.zk_credential import DIGEST_ENV, ZkCredential
from kclient import AdminClient, NewTopic, Producer

pytestmark = pytest.mark.integration

DIGEST = "kafka:kafka-secret"
CRED = ZkCredential.parse(DIGEST)
USER_PATH = "/config/users/alice"
SCRAM = b'{"version":1,"config":{"SCRAM-SHA-256":"salt=c2FsdA==,stored_key=a2V5,server_key=a2V5,iterations=4096"}}'


def kazoo(connect: str, digest: str | None = None) -> KazooClient:
    client = KazooClient(hosts=connect, auth_data=[("digest", digest)] if digest else None)
    client.start(timeout=15)
    return client


@contextmanager
def session(connect: str, digest: str | None = None) -> Iterator[KazooClient]:
    client = kazoo(connect, digest)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def walk(client: KazooClient, path: str = "/") -> list[str]:
    """Every znode at and under ``path`` (chroot-relative)."""
    out = [path]
    for child in client.get_children(path):
        out.extend(walk(client, f"/{child}" if path == "/" else f"{path}/{child}"))
    return out


def same(acls: list[ACL], wanted: list[ACL]) -> bool:
    return sorted(map(repr, acls)) == sorted(map(repr, wanted))


@contextmanager
def kbroker_tree(connect: str, *, digest: str | None, set_acl: bool) -> Iterator[ZkClient]:
    """What brokers, the controller, kctl and the authorizer write, through ZkClient; the
    broker registration (ephemeral) lives while the block runs."""
    zk = ZkClient(connect, auth_digest=digest, set_acl=set_acl)
    zk.start()
    try:
        zk.ensure_persistent_paths()
        zk.get_or_create_cluster_id()
        zk.register_broker(BrokerInfo(0, "127.0.0.1", 9092))
        TopicAdmin(zk).create_topic("t", 2, 1, configs={"retention.ms": "1000"})
        won = zk.try_become_controller(0)
        assert won is not None
        epoch, epoch_version = won
        zk.create_partition_state("t", 0, LeaderAndIsr(0, 0, [0], epoch), epoch_version)
        zk.set_entity_config("brokers", "0", {"log.retention.ms": "1000"}, -1)
        zk.kazoo.create(USER_PATH, SCRAM, makepath=True)
        zk.kazoo.create("/kafka-acl/Topic/t", b'{"version":1,"acls":[]}', makepath=True)
        zk.kazoo.create("/kafka-acl-changes/acl_changes_", b"Topic:t", sequence=True, makepath=True)
        zk.kazoo.create("/consumers/g/offsets/t/0", b"5", makepath=True)
        zk.mark_topic_for_deletion("gone")
        yield zk
    finally:
        zk.close()


TREE = (USER_PATH, "/config/brokers/0", "/brokers/ids/0", "/consumers/g/offsets/t/0")


def assert_secured(connect: str, expected: tuple[str, ...] = TREE) -> int:
    """Every znode has the policy's ACLs; an unauthenticated and a wrongly authenticated
    client read only the non-sensitive ones and change nothing. Returns the count."""
    with session(connect, DIGEST) as holder:
        paths = walk(holder)
        for path in paths:
            acls, _ = holder.get_acls(path)
            assert same(acls, acls_for(path, CRED)), (path, acls)
    assert set(expected) <= set(paths)
    for digest in (None, "kafka:wrong"):
        with session(connect, digest) as other:
            for path in paths:
                if is_sensitive(path):
                    with pytest.raises(NoAuthError):
                        other.get(path)
                else:
                    other.get(path)
                with pytest.raises(NoAuthError):
                    other.set(path, b"x")
                with pytest.raises(NoAuthError):
                    other.create(f"{path.rstrip('/')}/intruder")
                with pytest.raises(NoAuthError):
                    other.set_acls(path, list(OPEN_ACL_UNSAFE))
                if path != "/":
                    with pytest.raises(NoAuthError):
                        other.delete(path, recursive=False)
    return len(paths)


def assert_open(connect: str) -> None:
    with session(connect) as anyone:
        for path in walk(anyone):
            acls, _ = anyone.get_acls(path)
            assert same(acls, list(OPEN_ACL_UNSAFE)), (path, acls)
        anyone.set(USER_PATH, SCRAM)
        anyone.create("/brokers/topics/t/intruder")
        anyone.delete("/brokers/topics/t/intruder")


def test_secure_zk_client_creates_every_znode_with_the_policy_acls(zk_connect: str) -> None:
    with kbroker_tree(zk_connect, digest=DIGEST, set_acl=True):
        assert assert_secured(zk_connect) > 20
    hosts, chroot = split_connect_string(zk_connect)
    with session(hosts, DIGEST) as root:  # ZooKeeper hides digests from others
        acls, _ = root.get_acls(chroot)
        assert same(acls, acls_for("/", CRED))


def test_the_credential_holder_reads_and_writes_a_secured_tree(zk_connect: str) -> None:
    with kbroker_tree(zk_connect, digest=DIGEST, set_acl=True):
        with session(zk_connect, DIGEST) as holder:
            assert holder.get(USER_PATH)[0] == SCRAM
            holder.set(USER_PATH, SCRAM)
            holder.create("/brokers/topics/t/extra")
            holder.delete("/brokers/topics/t/extra")
        # Authenticated without set_acl (a broker mid-rolling-restart) still writes; what
        # it creates is open, as in Kafka.
        zk = ZkClient(zk_connect, auth_digest=DIGEST)
        zk.start()
        try:
            TopicAdmin(zk).create_topic("u", 1, 1)
            assert same(zk.kazoo.get_acls(zkdata.topic_path("u"))[0], list(OPEN_ACL_UNSAFE))
        finally:
            zk.close()


def test_unsecured_client_tree_is_open_as_before(zk_connect: str) -> None:
    with kbroker_tree(zk_connect, digest=None, set_acl=False):
        assert_open(zk_connect)


def migration(connect: str, mode: str, *extra: str) -> int:
    """``kctl zookeeper-security-migration`` in process (the noun's own parser)."""
    parser = argparse.ArgumentParser()
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--zookeeper", default=argparse.SUPPRESS)
    connection.add_argument("--bootstrap-server", default=argparse.SUPPRESS)
    zk_security.add_parser(parser.add_subparsers(dest="noun", required=True), connection)
    args = parser.parse_args(
        [
            zk_security.NOUN,
            "--zookeeper.connect",
            connect,
            "--zookeeper.acl",
            mode,
            "--zookeeper.session.timeout",
            "10000",
            *extra,
        ]
    )
    return int(args.handler(args))


def test_migration_secures_then_unsecures_an_existing_tree(
    zk_connect: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KAFKA_OPTS", raising=False)
    monkeypatch.delenv(DIGEST_ENV, raising=False)
    with kbroker_tree(zk_connect, digest=None, set_acl=False):
        assert_open(zk_connect)
        with pytest.raises(CliError, match=DIGEST_ENV):
            migration(zk_connect, "secure")

        monkeypatch.setenv(DIGEST_ENV, DIGEST)
        assert migration(zk_connect, "secure") == 0
        count = assert_secured(zk_connect)
        assert capsys.readouterr().out == f"Set secure ACLs on {count} znodes under {zk_connect}\n"

        monkeypatch.setenv(DIGEST_ENV, "kafka:wrong")
        with pytest.raises(CliError, match=r"NoAuth"):
            migration(zk_connect, "unsecure")
        assert_secured(zk_connect)

        monkeypatch.setenv(DIGEST_ENV, DIGEST)
        assert migration(zk_connect, "unsecure") == 0
        assert_open(zk_connect)


def test_migration_path_check_on_a_wrong_chroot(
    zk_connect: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(DIGEST_ENV, DIGEST)
    with pytest.raises(CliError, match="do not exist"):
        migration(zk_connect, "secure", "--enable.path.check")
    assert migration(zk_connect, "secure") == 0
    captured = capsys.readouterr()
    assert "a wrong chroot?" in captured.err
    assert captured.out == f"Set secure ACLs on 1 znodes under {zk_connect}\n"


def kctl(*words: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in (DIGEST_ENV, "KAFKA_OPTS")}
    return subprocess.run(
        [sys.executable, "-m", "kbroker.cli", *(a for w in words for a in w.split())],
        capture_output=True,
        text=True,
        timeout=90,
        env={**clean, **(env or {})},
    )


def one_line_failure(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kctl: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_kctl_zookeeper_mode_with_and_without_the_credential(zk_connect: str, tmp_path: Path) -> None:
    create = "topics create --partitions 1 --replication-factor 1 --topic"
    with kbroker_tree(zk_connect, digest=DIGEST, set_acl=True):
        listed = kctl(f"--zookeeper {zk_connect} topics list")
        assert listed.returncode == 0 and listed.stdout.split() == ["t"], listed.stderr

        line = one_line_failure(kctl(f"--zookeeper {zk_connect} {create} u"))
        assert "ZooKeeper refused the write" in line and "(NoAuth)" in line and DIGEST_ENV in line, line
        line = one_line_failure(kctl(f"--zookeeper {zk_connect} {create} u", env={DIGEST_ENV: "kafka:wrong"}))
        assert "(NoAuth)" in line and "'kafka'" in line, line
        line = one_line_failure(kctl(f"--zookeeper {zk_connect} topics delete --topic t"))
        assert "(NoAuth)" in line, line

        made = kctl(f"--zookeeper {zk_connect} {create} u", env={DIGEST_ENV: DIGEST})
        assert made.returncode == 0, made.stderr
        jaas = tmp_path / "jaas.conf"
        jaas.write_text(
            "Client {\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n"
            '  username="kafka"\n  password="kafka-secret";\n};\n'
        )
        opts = {"KAFKA_OPTS": f"-Djava.security.auth.login.config={jaas}"}
        made = kctl(f"--zookeeper {zk_connect} {create} v", env=opts)
        assert made.returncode == 0, made.stderr
        assert_secured(zk_connect)  # kctl's znodes got the secure ACLs too
        with session(zk_connect) as anyone:
            assert {"u", "v"} <= set(anyone.get_children(zkdata.BROKER_TOPICS))


def test_broker_with_zookeeper_set_acl_secures_its_znodes(
    cluster_factory: Callable[..., LocalCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real broker (controller, topic creation, produce) with ``zookeeper.set.acl=true`` and
    the credential in its environment: every znode it writes is secured, and it works."""
    monkeypatch.delenv("KAFKA_OPTS", raising=False)
    monkeypatch.setenv(DIGEST_ENV, DIGEST)
    c = cluster_factory(1, **{"zookeeper.set.acl": "true"})
    with AdminClient(c.bootstrap) as admin:
        admin.create_topics([NewTopic("secured", 2, 1)])
    with Producer(bootstrap_servers=c.bootstrap, acks=-1) as p:
        assert p.send("secured", b"v", partition=0).get(30).offset == 0
    assert_secured(c.zk_connect, ("/brokers/ids/0", "/controller", zkdata.partition_state_path("secured", 1)))
    with session(c.zk_connect) as anyone:
        assert "secured" in anyone.get_children(zkdata.BROKER_TOPICS)
        assert anyone.exists(zkdata.partition_state_path("secured", 0)) is not None
