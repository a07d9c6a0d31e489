"""Client security on real brokers: kclient's Producer, Consumer (in a group) and
AdminClient with kafka-python's security settings over SASL_SSL and SASL_PLAINTEXT
(SCRAM-SHA-256/512, PLAIN on TLS only), replication over an SSL inter-broker listener,
the typed errors of a wrong password or a foreign CA, and a producer that keeps
working across a broker restart (its session token is gone: it logs in again) but not
after its user's password changed."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kbroker.local.cluster import LocalCluster
from kbroker.security import certs
from kclient import AdminClient, Consumer, NewTopic, Producer
from kclient.errors import KafkaError, NoBrokersAvailable, SaslAuthenticationFailedError
from tests.support import set_scram_passwords, wait_until

pytestmark = pytest.mark.integration

ADMIN, ADMIN_PASSWORD = "admin", "admin-secret"


def _authenticates(address: str, tls: dict[str, str]) -> bool:
    try:
        with AdminClient(address, 5000, **sasl("SASL_SSL", "SCRAM-SHA-512", **tls)) as admin:
            admin.list_topics()
        return True
    except SaslAuthenticationFailedError:
        return False


def sasl(protocol: str, mechanism: str, password: str = ADMIN_PASSWORD, **extra: Any) -> dict[str, Any]:
    return {
        "security_protocol": protocol,
        "sasl_mechanism": mechanism,
        "sasl_plain_username": ADMIN,
        "sasl_plain_password": password,
        **extra,
    }


def read_all(consumer: Consumer, n: int, timeout_s: float = 60) -> list[bytes]:
    values: list[bytes] = []

    def done() -> bool:
        for records in consumer.poll(timeout_ms=500).values():
            values.extend(r.value or b"" for r in records)
        return len(values) >= n

    wait_until(done, timeout_s=timeout_s, what=f"{n} records")
    return values


def test_producer_consumer_admin_over_sasl_ssl_and_sasl_plaintext(
    cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    ca = certs.make_ca(tmp_path / "ca")
    broker = certs.issue(ca, tmp_path / "ca", "broker", "CN=broker")
    foreign = certs.make_ca(tmp_path / "foreign", "foreign CA")
    cluster = cluster_factory(
        2,
        **{
            "listeners": "INTERNAL://127.0.0.1:0,SECURE://127.0.0.1:0,SCRAM://127.0.0.1:0",
            "listener.security.protocol.map": "INTERNAL:SSL,SECURE:SASL_SSL,SCRAM:SASL_PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL",
            "ssl.keystore.location": str(broker.keystore_path),
            "ssl.truststore.location": str(broker.ca_path),
            "listener.name.internal.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": f"User:CN=broker;User:{ADMIN}",
        },
    )
    set_scram_passwords(cluster.zk_connect, {ADMIN: ADMIN_PASSWORD})
    secure = ",".join(b.listeners["SECURE"] for b in cluster.brokers.values())
    scram_plaintext = ",".join(b.listeners["SCRAM"] for b in cluster.brokers.values())
    tls = {"ssl_cafile": str(ca.cert_path)}
    # A credential reaches the brokers by ZooKeeper's change notification, a moment after
    # it is written (Kafka's tests wait for it on every broker too).
    for b in cluster.brokers.values():
        wait_until(lambda b=b: _authenticates(b.listeners["SECURE"], tls), 30, f"the credential on {b.broker_id}")

    with AdminClient(secure, 30000, **sasl("SASL_SSL", "SCRAM-SHA-512", **tls)) as admin:
        admin.create_topics([NewTopic("secured", 2, 2)])
        wait_until(lambda: "secured" in admin.list_topics(), what="the topic")
    with AdminClient(secure, 30000, **sasl("SASL_SSL", "PLAIN", **tls)) as admin:
        assert "secured" in admin.list_topics()

    with Producer(bootstrap_servers=secure, **sasl("SASL_SSL", "SCRAM-SHA-512", **tls)) as producer:
        futures = [producer.send("secured", f"v{i}".encode(), key=f"k{i}".encode()) for i in range(200)]
        producer.flush(30)
        assert all(f.get(10).offset >= 0 for f in futures)

    consumer = Consumer(
        "secured",
        bootstrap_servers=scram_plaintext,
        group_id="secure-group",
        auto_offset_reset="earliest",
        **sasl("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    )
    try:
        assert sorted(read_all(consumer, 200)) == sorted(f"v{i}".encode() for i in range(200))
        consumer.commit()
    finally:
        consumer.close()

    with pytest.raises(SaslAuthenticationFailedError, match="invalid credentials"):
        with AdminClient(secure, 10000, **sasl("SASL_SSL", "SCRAM-SHA-256", password="wrong", **tls)) as admin:
            admin.list_topics()
    with pytest.raises(NoBrokersAvailable, match="not trusted"):
        foreign_tls = {"ssl_cafile": str(foreign.cert_path)}
        with AdminClient(secure, 5000, **sasl("SASL_SSL", "SCRAM-SHA-256", **foreign_tls)) as admin:
            admin.list_topics()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_producer_logs_in_again_after_a_broker_restart_but_not_after_a_password_change(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    client_port, internal_port = _free_port(), _free_port()
    cluster = cluster_factory(
        1,
        **{
            "listeners": f"INTERNAL://127.0.0.1:{internal_port},CLIENT://127.0.0.1:{client_port}",
            "listener.security.protocol.map": "INTERNAL:PLAINTEXT,CLIENT:SASL_PLAINTEXT",
            "inter.broker.listener.name": "INTERNAL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256",
        },
    )
    set_scram_passwords(cluster.zk_connect, {ADMIN: ADMIN_PASSWORD})
    address = f"127.0.0.1:{client_port}"
    security = sasl("SASL_PLAINTEXT", "SCRAM-SHA-256")
    with AdminClient(address, 30000, **security) as admin:
        admin.create_topics([NewTopic("restarts", 1, 1)])
    producer = Producer(bootstrap_servers=address, delivery_timeout_ms=60000, **security)
    try:
        assert all(f.get(30).offset >= 0 for f in [producer.send("restarts", f"a{i}".encode()) for i in range(20)])
        session = producer._transport.session(address)
        assert session is not None and session.logins == 1

        broker = cluster.brokers[0]
        broker.stop()
        broker.start()  # same ports; the broker's sessions are gone
        after = [producer.send("restarts", f"b{i}".encode()) for i in range(20)]
        assert all(f.get(60).offset >= 0 for f in after)
        renewed = producer._transport.session(address)
        assert renewed is not None and (renewed is not session or session.logins == 2)

        set_scram_passwords(cluster.zk_connect, {ADMIN: "changed"})  # revokes the session; the old password is refused
        refused: list[BaseException] = []

        def send_refused() -> bool:
            try:
                producer.send("restarts", b"c").get(30)
            except KafkaError as exc:
                refused.append(exc)
                return True
            return False

        wait_until(send_refused, timeout_s=30, what="a send refused after the password change")
        assert isinstance(refused[-1], SaslAuthenticationFailedError), refused[-1]
    finally:
        producer.close(timeout=5)

    consumer = Consumer(
        "restarts",
        bootstrap_servers=address,
        auto_offset_reset="earliest",
        **sasl("SASL_PLAINTEXT", "SCRAM-SHA-256", password="changed"),
    )
    try:
        values = read_all(consumer, 40)
        assert [v for v in values if v.startswith(b"a")] == [f"a{i}".encode() for i in range(20)]
        assert [v for v in values if v.startswith(b"b")] == [f"b{i}".encode() for i in range(20)]
    finally:
        consumer.close()
