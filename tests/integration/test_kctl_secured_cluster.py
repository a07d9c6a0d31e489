"""kctl against a secured cluster, as a real subprocess on real brokers: over
a SASL_SSL listener with ``--command-config admin.properties`` (Java client property
names, a PEM truststore, SCRAM with sasl.jaas.config), kctl creates and describes
topics, adds/lists/removes ACLs, creates/lists/deletes SCRAM users (``kctl users`` and
``kctl configs --entity-type users``), produces and consumes; the same with a wrong
password, or with no --command-config, fails in one line with exit 1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.local.cluster import LocalCluster
from kbroker.security import certs
from tests.integration.test_broker_listeners import (
    ADMIN,
    ADMIN_PASSWORD,
    secure_cluster,
)
from tests.integration.test_kctl import fails, kctl, ok
from tests.support import set_scram_passwords, wait_until

pytestmark = pytest.mark.integration

SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
TOPIC_T = "ResourcePattern(resourceType=TOPIC, name=t, patternType=LITERAL)"


def properties(path: Path, ca: Path, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> str:
    path.write_text(
        "# kctl --command-config: Java client property names\n"
        "security.protocol=SASL_SSL\n"
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={ca}\n"
        f"sasl.mechanism={mechanism}\n"
        f'sasl.jaas.config={SCRAM_MODULE} required username="{user}" password="{password}";\n'
    )
    return str(path)


@pytest.fixture
def secured(cluster_factory: Callable[..., LocalCluster], tmp_path: Path) -> tuple[LocalCluster, str, str]:
    """(cluster, SASL_SSL address of broker 0, admin.properties)."""
    ca = certs.make_ca(tmp_path / "ca")
    broker = certs.issue(ca, tmp_path / "ca", "broker", "CN=broker")
    cluster = secure_cluster(cluster_factory, broker, 2)
    set_scram_passwords(cluster.zk_connect, {ADMIN: ADMIN_PASSWORD})
    admin_props = properties(tmp_path / "admin.properties", broker.ca_path, ADMIN, ADMIN_PASSWORD)
    return cluster, cluster.brokers[0].listeners["SECURE"], admin_props


def test_kctl_admin_commands_over_sasl_ssl(secured: tuple[LocalCluster, str, str], tmp_path: Path) -> None:
    cluster, secure, admin_props = secured
    conn = f"--bootstrap-server {secure} --command-config {admin_props}"
    ca = Path(admin_props).read_text().split("ssl.truststore.location=")[1].split("\n")[0]

    # topics, with --command-config before the noun and after the verb
    ok(
        kctl(
            f"--command-config {admin_props} topics create --topic t --partitions 2 --replication-factor 2",
            f"--bootstrap-server {secure}",
        )
    )
    described = ok(kctl("topics describe --topic t", conn))
    assert "Topic: t" in described and "PartitionCount: 2" in described and "ReplicationFactor: 2" in described

    # users: create alice (SCRAM-SHA-256 only), list, then alice logs in with her password
    ok(kctl("users create alice --password alice-secret --mechanism SCRAM-SHA-256 --iterations 8192", conn))
    listed = ok(kctl("users list", conn))
    assert "SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-256=iterations=8192\n" in listed
    assert f"user-principal '{ADMIN}' are SCRAM-SHA-256=iterations=4096, SCRAM-SHA-512=iterations=4096" in listed
    assert "alice-secret" not in listed
    alice = properties(tmp_path / "alice.properties", Path(ca), "alice", "alice-secret", "SCRAM-SHA-256")
    as_alice = f"--bootstrap-server {secure} --command-config {alice}"
    assert ok(kctl("topics list", as_alice)) == ""  # authenticated, but may Describe nothing

    # acls: alice may Describe topic t; she sees it; the grant is listed, then removed
    added = ok(kctl("acls --add --allow-principal User:alice --operation Describe --topic t", conn))
    assert added.startswith(f"Adding ACLs for resource `{TOPIC_T}`: \n")
    assert f"Current ACLs for resource `{TOPIC_T}`: \n \t(principal=User:alice, host=*, operation=DESCRIBE" in added
    assert ok(kctl("topics list", as_alice)) == "t\n"
    listed = ok(kctl("acls list --topic t", conn))
    assert "(principal=User:alice, host=*, operation=DESCRIBE, permissionType=ALLOW)" in listed
    ok(kctl("acls --remove --force --allow-principal User:alice --operation Describe --topic t", conn))
    assert "User:alice" not in ok(kctl("acls --list", conn))

    # configs --entity-type users (kafka-configs.sh): add both mechanisms, describe, delete one
    add = "SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=alice-secret]"
    done = ok(kctl(f"configs --alter --entity-type users --entity-name alice --add-config {add}", conn))
    assert done == "Completed updating config for user alice.\n"
    described = ok(kctl("configs --describe --entity-type users --entity-name alice", conn))
    assert described == (
        "SCRAM credential configs for user-principal 'alice' are "
        "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096\n"
    )
    ok(kctl("configs --alter --entity-type users --entity-name alice --delete-config SCRAM-SHA-512", conn))
    described = ok(kctl(f"configs --describe --entity-type users --entity-name alice --zookeeper {cluster.zk_connect}"))
    assert described == "SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-256=iterations=8192\n"
    fails(
        kctl("configs --alter --entity-type users --entity-name alice --delete-config SCRAM-SHA-512", conn),
        mentions="does not exist",
    )

    # users delete: alice is gone and can no longer log in
    ok(kctl("users delete alice", conn))
    assert "'alice'" not in ok(kctl("users list", conn))
    # A broker that had her cached drops her by the change notification, a moment later.
    wait_until(lambda: kctl("topics list", as_alice).returncode != 0, 30, "alice refused")
    fails(kctl("topics list", as_alice), mentions="uthentication")


def test_kctl_refused_without_the_right_credentials(secured: tuple[LocalCluster, str, str], tmp_path: Path) -> None:
    _, secure, admin_props = secured
    ca = Path(admin_props).read_text().split("ssl.truststore.location=")[1].split("\n")[0]
    wrong = properties(tmp_path / "wrong.properties", Path(ca), ADMIN, "not-the-password")
    for command in ("topics list", "acls --list", "users list", "configs --describe --entity-type users"):
        line = fails(kctl(command, f"--bootstrap-server {secure} --command-config {wrong}"), code=1)
        assert "not-the-password" not in line
    # No --command-config on a SASL_SSL listener: one line too, with a hint.
    fails(kctl("topics list", f"--bootstrap-server {secure}"), code=1, mentions="needs --command-config")


def test_kctl_produce_and_consume_over_sasl_ssl(secured: tuple[LocalCluster, str, str]) -> None:
    _, secure, admin_props = secured
    conn = f"--bootstrap-server {secure} --command-config {admin_props}"
    ok(kctl("topics create --topic s --partitions 1 --replication-factor 2", conn))
    ok(kctl("produce --topic s", conn, stdin="one\ntwo\nthree\n"))
    out = ok(kctl("consume --topic s --from-beginning --max-messages 3 --timeout-ms 30000", conn))
    assert out == "one\ntwo\nthree\n"


def test_every_broker_command_takes_the_command_config(secured: tuple[LocalCluster, str, str]) -> None:
    _, secure, admin_props = secured
    conn = f"--bootstrap-server {secure} --command-config {admin_props}"
    ok(kctl("topics create --topic c --partitions 1 --replication-factor 2", conn))
    brokers = ok(kctl("brokers list", conn)).splitlines()
    assert [line.split()[0] for line in brokers] == ["0", "1"]
    assert secure.rpartition(":")[2] in brokers[0]  # the SECURE listener's addresses are advertised here
    assert "c" in ok(kctl("log-dirs --describe", conn))
    ok(kctl("configs --alter --entity-type topics --entity-name c --add-config retention.ms=60000", conn))
    assert "retention.ms=60000" in ok(kctl("configs --describe --entity-type topics --entity-name c", conn))
    ok(kctl("leaders elect --topic c", conn))
    ok(kctl("perf produce --topic c --num-records 50 --record-size 10 --throughput -1", conn))
    ok(kctl("perf consume --topic c --num-records 50 --timeout-ms 30000", conn))
    ok(kctl("groups list", conn))
