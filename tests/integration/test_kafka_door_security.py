"""TLS, SASL and ACLs on the Kafka-protocol door with real clients: confluent-kafka
(librdkafka) over SASL_SSL and SASL_PLAINTEXT with SCRAM, a wrong password, ACLs enforced
as on gRPC, the ACL admin APIs, an mTLS listener whose principal is the certificate's DN,
and the SASL session lifetime (KIP-368) with raw frames."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kbroker.local.cluster import LocalCluster
from kbroker.security import certs
from kclient import AdminClient, NewTopic
from kclient.scram import ScramClient, ScramMechanism
from tests.kafka_wire import WireClient
from tests.support import set_scram_passwords, wait_until

ck = pytest.importorskip("confluent_kafka")
ck_admin = pytest.importorskip("confluent_kafka.admin")

pytestmark = pytest.mark.integration

PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}


class Secure:
    """A two-broker cluster whose Kafka door has a SASL_SSL (KSECURE), a SASL_PLAINTEXT
    (KSCRAM) and an mTLS (KMTLS) listener; replication runs over an mTLS gRPC listener."""

    def __init__(self, cluster: LocalCluster, ca: certs.CertificateAuthority, pki: Path) -> None:
        self.cluster, self.ca, self.pki = cluster, ca, pki

    def sasl(self, user: str, *, listener: str = "KSECURE", mechanism: str = "SCRAM-SHA-512", **extra: Any) -> dict:
        conf: dict[str, Any] = {
            "bootstrap.servers": self.cluster.kafka_bootstrap(listener),
            "security.protocol": "SASL_SSL" if listener == "KSECURE" else "SASL_PLAINTEXT",
            "sasl.mechanisms": mechanism,
            "sasl.username": user,
            "sasl.password": PASSWORDS.get(user, "?"),
            **extra,
        }
        if listener == "KSECURE":
            conf["ssl.ca.location"] = str(self.ca.cert_path)
        return conf

    def mtls(self, subject: str, name: str) -> dict:
        cert = certs.issue(self.ca, self.pki, name, subject)
        return {
            "bootstrap.servers": self.cluster.kafka_bootstrap("KMTLS"),
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.ca.cert_path),
            "ssl.certificate.location": str(cert.cert_path),
            "ssl.key.location": str(cert.key_path),
        }


@pytest.fixture
def secure(cluster_factory: Callable[..., LocalCluster], tmp_path: Path) -> Secure:
    pki = tmp_path / "pki"
    ca = certs.make_ca(pki)
    broker = certs.issue(ca, pki, "broker", "CN=broker")
    cluster = cluster_factory(
        2,
        **{
            # KMTLS is also a gRPC listener only because config.py accepts listener.name.<l>.*
            # keys for gRPC listeners alone
            "listeners": "INTERNAL://127.0.0.1:0,KMTLS://127.0.0.1:0",
            "listener.security.protocol.map": "INTERNAL:SSL,KSECURE:SASL_SSL,KSCRAM:SASL_PLAINTEXT,KMTLS:SSL",
            "inter.broker.listener.name": "INTERNAL",
            "kafka.listeners": "KSECURE://127.0.0.1:0,KSCRAM://127.0.0.1:0,KMTLS://127.0.0.1:0",
            "ssl.keystore.location": str(broker.keystore_path),
            "ssl.truststore.location": str(broker.ca_path),
            "listener.name.internal.ssl.client.auth": "required",
            "listener.name.kmtls.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": "User:CN=broker;User:admin",
        },
    )
    set_scram_passwords(cluster.zk_connect, PASSWORDS)
    return Secure(cluster, ca, pki)


def _results(futures: dict[Any, Any], timeout_s: float = 60) -> dict[Any, Any]:
    return {k: f.result(timeout_s) for k, f in futures.items()}


def _allow(principal: str, topic: str, *operations: Any) -> list[Any]:
    return [
        ck_admin.AclBinding(
            ck_admin.ResourceType.TOPIC,
            topic,
            ck_admin.ResourcePatternType.LITERAL,
            principal,
            "*",
            op,
            ck_admin.AclPermissionType.ALLOW,
        )
        for op in operations
    ]


def _produce(conf: dict[str, Any], topic: str, n: int) -> tuple[int, list[Any]]:
    """(records acknowledged, delivery errors) of ``n`` records."""
    producer = ck.Producer({**conf, "acks": "all", "message.timeout.ms": 20000})
    acked, errors = [0], []

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            acked[0] += 1
        else:
            errors.append(err)

    for i in range(n):
        producer.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode(), on_delivery=delivered)
    producer.flush(40)
    return acked[0], errors


def _read(conf: dict[str, Any], topic: str, partitions: int, n: int) -> list[bytes]:
    consumer = ck.Consumer({**conf, "group.id": "reader", "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    deadline = time.monotonic() + 40
    while len(values) < n and time.monotonic() < deadline:
        m = consumer.poll(1.0)
        if m is not None and m.error() is None:
            values.append(m.value())
    consumer.close()
    return values


def _sees_everywhere(secure: Secure, user: str, topic: str, password: str | None = None) -> None:
    """Wait until every broker's Kafka door logs ``user`` in and answers his metadata of
    ``topic`` without an error (his credential and his DESCRIBE reached it)."""
    for address in secure.cluster.kafka_bootstrap("KSCRAM").split(","):

        def sees(address: str = address) -> bool:
            with WireClient(address) as wire:
                if _login(wire, user, password or PASSWORDS[user]).error_code != 0:
                    return False
                (t,) = wire.call(METADATA, 1, {"topics": [{"name": topic}]}).topics
                return t.error_code == 0

        wait_until(sees, 30, f"the ACLs of {user} on {address}")


def test_scram_over_sasl_ssl_and_sasl_plaintext_with_acls_enforced(secure: Secure) -> None:
    admin = ck_admin.AdminClient(secure.sasl("admin"))
    assert _results(admin.create_topics([ck_admin.NewTopic("secured", 2, 2)], operation_timeout=30)) == {
        "secured": None
    }
    _results(
        admin.create_acls(
            _allow("User:alice", "secured", ck_admin.AclOperation.WRITE, ck_admin.AclOperation.READ)
            + _allow("User:bob", "secured", ck_admin.AclOperation.DESCRIBE)
        )
    )

    # ACLs reach each broker by ZooKeeper's change notification, a moment after they are
    # written (Kafka's tests wait for them on every broker too).
    _sees_everywhere(secure, "alice", "secured")
    _sees_everywhere(secure, "bob", "secured")

    # alice writes over SASL_SSL (SCRAM-SHA-512) and reads over SASL_PLAINTEXT (SCRAM-SHA-256)
    acked, errors = _produce(secure.sasl("alice"), "secured", 100)
    assert (acked, errors) == (100, [])
    reader = secure.sasl("alice", listener="KSCRAM", mechanism="SCRAM-SHA-256")
    assert sorted(_read(reader, "secured", 2, 100)) == sorted(f"v{i}".encode() for i in range(100))

    # bob may DESCRIBE, not WRITE: TOPIC_AUTHORIZATION_FAILED, as on gRPC
    acked, errors = _produce(secure.sasl("bob"), "secured", 3)
    assert acked == 0 and errors
    assert {e.code() for e in errors} == {ck.KafkaError.TOPIC_AUTHORIZATION_FAILED}

    # a wrong password: an authentication failure on the client
    seen: list[Any] = []
    producer = ck.Producer({**secure.sasl("alice", **{"sasl.password": "wrong"}), "error_cb": seen.append})
    producer.produce("secured", value=b"never")
    wait_until(lambda: producer.poll(0.2) is not None and bool(seen), timeout_s=30, what="an authentication error")
    assert seen[0].code() == ck.KafkaError._AUTHENTICATION
    assert "invalid credentials" in seen[0].str()
    producer.purge()
    producer.flush(0)


def test_acl_admin_apis_create_describe_delete(secure: Secure) -> None:
    admin = ck_admin.AdminClient(secure.sasl("admin"))
    bindings = _allow("User:alice", "acl-topic", ck_admin.AclOperation.READ, ck_admin.AclOperation.WRITE)
    assert _results(admin.create_acls(bindings)) == {b: None for b in bindings}

    match = ck_admin.AclBindingFilter(
        ck_admin.ResourceType.TOPIC,
        "acl-topic",
        ck_admin.ResourcePatternType.LITERAL,
        None,
        None,
        ck_admin.AclOperation.ANY,
        ck_admin.AclPermissionType.ANY,
    )
    described = admin.describe_acls(match).result(30)
    assert sorted(b.operation.name for b in described) == ["READ", "WRITE"]
    assert {b.principal for b in described} == {"User:alice"}

    only_write = ck_admin.AclBindingFilter(
        ck_admin.ResourceType.TOPIC,
        "acl-topic",
        ck_admin.ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        ck_admin.AclOperation.WRITE,
        ck_admin.AclPermissionType.ALLOW,
    )
    deleted = _results(admin.delete_acls([only_write]))[only_write]
    assert [b.operation.name for b in deleted] == ["WRITE"]
    wait_until(
        lambda: [b.operation.name for b in admin.describe_acls(match).result(30)] == ["READ"], what="WRITE deleted"
    )

    # alice is no super user: she may not alter ACLs (CLUSTER_AUTHORIZATION_FAILED)
    alice = ck_admin.AdminClient(secure.sasl("alice"))
    refused = alice.create_acls(_allow("User:alice", "acl-topic", ck_admin.AclOperation.ALTER))
    with pytest.raises(ck.KafkaException) as info:
        _results(refused)
    assert info.value.args[0].code() == ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_mtls_listener_principal_is_the_certificate_dn(secure: Secure) -> None:
    admin = ck_admin.AdminClient(secure.sasl("admin"))
    _results(admin.create_topics([ck_admin.NewTopic("by-cert", 1, 2)], operation_timeout=30))
    carol = "CN=carol,OU=eng,O=kbroker"
    _results(admin.create_acls(_allow(f"User:{carol}", "by-cert", ck_admin.AclOperation.WRITE)))

    # Each broker learns a new ACL from its ZooKeeper watch, a moment after CreateAcls
    # answers (as in Kafka): refused sends write nothing, so carol simply tries again.
    deadline = time.monotonic() + 30
    while True:
        acked, errors = _produce(secure.mtls(carol, "carol"), "by-cert", 20)
        if acked or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert (acked, errors) == (20, [])
    acked, errors = _produce(secure.mtls("CN=dave", "dave"), "by-cert", 2)
    assert acked == 0 and {e.code() for e in errors} == {ck.KafkaError.TOPIC_AUTHORIZATION_FAILED}


# --- the SASL session on one connection, with raw frames --------------------------------

SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA = 17, 36, 3


def _login(wire: WireClient, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> Any:
    """A SCRAM exchange on ``wire``; the last SaslAuthenticate v2 response."""
    hs = wire.call(SASL_HANDSHAKE, 1, {"mechanism": mechanism})
    assert hs.error_code == 0 and mechanism in hs.mechanisms
    client = ScramClient(ScramMechanism(mechanism), user, password)
    first = wire.call(SASL_AUTHENTICATE, 2, {"auth_bytes": client.first_message()})
    if first.error_code != 0:
        return first
    final = wire.call(SASL_AUTHENTICATE, 2, {"auth_bytes": client.final_message(first.auth_bytes)})
    if final.error_code == 0:
        client.verify_server_final(final.auth_bytes)
    return final


def test_sasl_session_lifetime_reauthentication_and_expiry(cluster_factory: Callable[..., LocalCluster]) -> None:
    lifetime_ms = 5000  # room for a re-login in time on a loaded machine
    cluster = cluster_factory(
        1,
        **{"kafka.listeners": "SASL_PLAINTEXT://127.0.0.1:0", "connections.max.reauth.ms": str(lifetime_ms)},
    )
    set_scram_passwords(cluster.zk_connect, PASSWORDS)
    with AdminClient(bootstrap_servers=cluster.bootstrap) as grpc_admin:
        grpc_admin.create_topics([NewTopic("reauth", 1, 1)])
    address = cluster.kafka_bootstrap("SASL_PLAINTEXT")

    with WireClient(address) as wire:  # nothing but SASL before authentication
        wire.send_raw(wire.frame(METADATA, 1, {"topics": None}))
        with pytest.raises(ConnectionError):
            wire.read_frame()

    with WireClient(address) as wire:
        hs = wire.call(SASL_HANDSHAKE, 1, {"mechanism": "GSSAPI"})
        assert hs.error_code == 33 and set(hs.mechanisms) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
        failed = _login(wire, "alice", "wrong")
        assert failed.error_code == 58 and "invalid credentials" in failed.error_message

    with WireClient(address) as wire:
        done = _login(wire, "alice", PASSWORDS["alice"])
        assert done.error_code == 0 and done.session_lifetime.total_seconds() * 1000 == lifetime_ms
        began = time.monotonic()
        assert wire.call(METADATA, 1, {"topics": None}).brokers
        time.sleep(lifetime_ms / 1000 * 0.6)
        assert _login(wire, "alice", PASSWORDS["alice"]).error_code == 0  # re-authenticated in time
        time.sleep(max(0.0, began + lifetime_ms / 1000 + 0.3 - time.monotonic()))
        assert wire.call(METADATA, 1, {"topics": None}).brokers  # past the first session's end
        other = _login(wire, "bob", PASSWORDS["bob"])  # re-authentication may not change the principal
        assert other.error_code == 58
        time.sleep(lifetime_ms / 1000 + 0.2)
        wire.send_raw(wire.frame(METADATA, 1, {"topics": None}))
        with pytest.raises(ConnectionError):  # expired: the connection is closed
            wire.read_frame()

    # librdkafka re-authenticates (KIP-368) and keeps producing across several lifetimes
    conf = {
        "bootstrap.servers": address,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": PASSWORDS["alice"],
    }
    producer = ck.Producer({**conf, "acks": "all"})
    acked: list[int] = []
    errors: list[Any] = []
    deadline = time.monotonic() + 2.5 * lifetime_ms / 1000
    i = 0
    while time.monotonic() < deadline:
        producer.produce(
            "reauth", value=str(i).encode(), on_delivery=lambda e, m: errors.append(e) if e else acked.append(1)
        )
        producer.poll(0.2)
        i += 1
    assert producer.flush(30) == 0
    assert not errors and len(acked) == i


def test_kafka_python_over_sasl_ssl(secure: Secure, caplog: pytest.LogCaptureFixture) -> None:
    kafka = pytest.importorskip("kafka")
    kafka_admin = pytest.importorskip("kafka.admin")
    settings = {
        "bootstrap_servers": secure.cluster.kafka_bootstrap("KSECURE"),
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "admin",
        "sasl_plain_password": PASSWORDS["admin"],
        "ssl_cafile": str(secure.ca.cert_path),
    }
    admin = kafka_admin.KafkaAdminClient(**settings)
    try:
        admin.create_topics([kafka_admin.NewTopic("kp-secure", 1, 2)])
        assert "kp-secure" in admin.list_topics()
        # SCRAM users (KIP-554): the client salts the password; the new user then logs in
        upsert = kafka_admin.UserScramCredentialUpsertion("erin", "SCRAM-SHA-256", "erin-secret", iterations=8192)
        assert admin.alter_user_scram_credentials([upsert]) == {"erin": None}
        described = admin.describe_user_scram_credentials(["erin", "nobody"])
        assert described["erin"]["credential_infos"] == [
            {"mechanism": kafka_admin.ScramMechanism.SCRAM_SHA_256, "iterations": 8192}
        ]
        assert described["nobody"]["error"]  # RESOURCE_NOT_FOUND
    finally:
        admin.close()
    confluent = ck_admin.AdminClient(secure.sasl("admin"))
    users = confluent.describe_user_scram_credentials(["erin"])["erin"].result(30)
    assert [(c.mechanism, c.iterations) for c in users.scram_credential_infos] == [
        (ck_admin.ScramMechanism.SCRAM_SHA_256, 8192)
    ]
    _results(confluent.create_acls(_allow("User:erin", "kp-secure", ck_admin.AclOperation.WRITE)))
    _sees_everywhere(secure, "erin", "kp-secure", "erin-secret")  # the controller knew first; the rest by notification
    erin = {**secure.sasl("erin", mechanism="SCRAM-SHA-256"), "sasl.password": "erin-secret"}
    assert _produce(erin, "kp-secure", 5) == (5, [])
    producer = kafka.KafkaProducer(acks="all", **settings)
    try:
        assert producer.send("kp-secure", b"over tls and scram").get(30).offset == 5  # after erin's five
    finally:
        producer.close()
    caplog.set_level(logging.WARNING, logger="kafka")  # whatever an earlier test in this process set
    with pytest.raises(kafka.errors.KafkaTimeoutError):  # kafka-python retries, then gives up bootstrapping
        kafka_admin.KafkaAdminClient(**{**settings, "sasl_plain_password": "wrong", "bootstrap_timeout_ms": 5000})
    # The broker answers SASL_AUTHENTICATION_FAILED, then closes the connection (as Kafka
    # does); kafka-python logs the answer or, when it sees the close first, the disconnect.
    assert "invalid credentials" in caplog.text or "socket disconnected" in caplog.text, caplog.text
