"""SaslHandshake v0 on the Kafka door: the SASL tokens follow the handshake as raw
size-prefixed frames (no SaslAuthenticate), as Kafka clients before 1.0 send them.
Hand-built exchanges over a socket (SCRAM over SASL_PLAINTEXT, PLAIN over SASL_SSL), a
failed one (the connection closes without an answer, as Kafka's v0), the
pre-authentication frame limit, and a real client: kafka-python pinned to an API version
before 1.0 (librdkafka never takes the v0 path against kbroker: see that test)."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kbroker.local.cluster import LocalCluster
from kbroker.security import certs
from kclient.scram import ScramClient, ScramMechanism
from tests.kafka_wire import WireClient
from tests.support import set_scram_passwords

pytestmark = pytest.mark.integration

PASSWORDS = {"alice": "alice-secret"}
SASL_HANDSHAKE, METADATA, SASL_AUTHENTICATE = 17, 3, 36
ILLEGAL_SASL_STATE = 34


@dataclass
class Door:
    cluster: LocalCluster
    ca: Path

    def scram(self) -> WireClient:
        return WireClient(self.cluster.kafka_bootstrap("KSCRAM"))

    def tls(self) -> WireClient:
        c = WireClient(self.cluster.kafka_bootstrap("KSECURE"))
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.check_hostname = False
        c.sock = ctx.wrap_socket(c.sock)
        return c


@pytest.fixture
def door(cluster_factory: Callable[..., LocalCluster], tmp_path: Path) -> Door:
    pki = tmp_path / "pki"
    ca = certs.make_ca(pki)
    broker = certs.issue(ca, pki, "broker", "CN=broker")
    cluster = cluster_factory(
        1,
        **{
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,KSECURE:SASL_SSL,KSCRAM:SASL_PLAINTEXT",
            "kafka.listeners": "KSECURE://127.0.0.1:0,KSCRAM://127.0.0.1:0",
            "ssl.keystore.location": str(broker.keystore_path),
            "ssl.truststore.location": str(broker.ca_path),
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
        },
    )
    set_scram_passwords(cluster.zk_connect, PASSWORDS)
    return Door(cluster, ca.cert_path)


def _raw(c: WireClient, token: bytes) -> None:
    c.send_raw(len(token).to_bytes(4, "big") + token)


def _handshake_v0(c: WireClient, mechanism: str) -> None:
    r = c.call(SASL_HANDSHAKE, 0, {"mechanism": mechanism})
    assert r.error_code == 0, r


def _metadata_works(c: WireClient) -> None:
    r = c.call(METADATA, 1, {"topics": []})
    assert [int(b.node_id) for b in r.brokers] == [0]


def _closed(c: WireClient) -> bool:
    c.sock.settimeout(10)
    try:
        return c.sock.recv(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True


@pytest.mark.parametrize("mechanism", [ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512])
def test_scram_raw_tokens_after_a_v0_handshake(door: Door, mechanism: ScramMechanism) -> None:
    client = ScramClient(mechanism, "alice", PASSWORDS["alice"])
    with door.scram() as c:
        _handshake_v0(c, mechanism.value)
        _raw(c, client.first_message())
        server_first = c.read_frame()
        _raw(c, client.final_message(server_first))
        client.verify_server_final(c.read_frame())
        assert client.complete
        _metadata_works(c)  # authenticated: Kafka requests again, with headers


def test_plain_raw_token_gets_an_empty_answer(door: Door) -> None:
    with door.tls() as c:
        _handshake_v0(c, "PLAIN")
        _raw(c, b"\0alice\0" + PASSWORDS["alice"].encode())
        assert c.read_frame() == b""  # PLAIN's answer: an empty token, as Kafka sends it
        _metadata_works(c)


def test_a_wrong_password_closes_the_connection_without_an_answer(door: Door) -> None:
    with door.tls() as c:
        _handshake_v0(c, "PLAIN")
        _raw(c, b"\0alice\0wrong")
        assert _closed(c)
    client = ScramClient(ScramMechanism.SCRAM_SHA_256, "alice", "wrong")
    with door.scram() as c:
        _handshake_v0(c, "SCRAM-SHA-256")
        _raw(c, client.first_message())
        _raw(c, client.final_message(c.read_frame()))
        assert _closed(c)


def test_a_raw_token_has_the_pre_authentication_limit(door: Door) -> None:
    with door.scram() as c:
        _handshake_v0(c, "SCRAM-SHA-256")
        c.send_raw((512 * 1024 + 1).to_bytes(4, "big"))
        assert _closed(c)


def test_no_request_is_served_in_place_of_a_token(door: Door) -> None:
    """After a v0 handshake the next frame is a token even when it looks like a request:
    a Metadata request is a malformed SCRAM client-first message, and closes."""
    with door.scram() as c:
        _handshake_v0(c, "SCRAM-SHA-256")
        c.send_raw(c.frame(METADATA, 1, {"topics": []}))
        assert _closed(c)


def test_v0_cannot_re_authenticate(door: Door) -> None:
    """KIP-368 re-authentication needs v1 (a v0 exchange has no session lifetime)."""
    client = ScramClient(ScramMechanism.SCRAM_SHA_256, "alice", PASSWORDS["alice"])
    with door.scram() as c:
        _handshake_v0(c, "SCRAM-SHA-256")
        _raw(c, client.first_message())
        _raw(c, client.final_message(c.read_frame()))
        client.verify_server_final(c.read_frame())
        r = c.call(SASL_HANDSHAKE, 0, {"mechanism": "SCRAM-SHA-256"})
        assert r.error_code == ILLEGAL_SASL_STATE
        _metadata_works(c)  # still the authenticated connection it was


def test_kafka_python_before_1_0_logs_in_over_v0(door: Door, monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka-python pinned to 0.10.2 sends SaslHandshake v0 and its tokens raw
    (``SaslBytesRequest``). librdkafka never does against kbroker: it asks ApiVersions
    whenever broker.version.fallback is 0.10 or later (kcat and confluent-kafka ignore
    api.version.request=false then), sees SaslHandshake v1 and SaslAuthenticate, and uses
    them; with a 0.9 fallback it has no SaslHandshake at all."""
    kafka = pytest.importorskip("kafka")
    connection = pytest.importorskip("kafka.net.connection")
    raw_tokens: list[int] = []
    raw_request = connection.SaslBytesRequest

    def counted(token: bytes) -> object:
        raw_tokens.append(len(token))
        return raw_request(token)

    monkeypatch.setattr(connection, "SaslBytesRequest", counted)
    admin = kafka.KafkaAdminClient(
        bootstrap_servers=door.cluster.kafka_bootstrap("KSCRAM"),
        api_version=(0, 10, 2),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="alice",
        sasl_plain_password=PASSWORDS["alice"],
        request_timeout_ms=20_000,
    )
    try:
        cluster = admin.describe_cluster()
    finally:
        admin.close()
    assert len(cluster["brokers"]) == 1, cluster
    assert len(raw_tokens) >= 2  # SCRAM's client-first and client-final, as raw frames


def test_the_raw_socket_helper_sees_a_closed_socket() -> None:
    """The helper _closed must not report an open, silent connection as closed."""
    a, b = socket.socketpair()
    c = WireClient.__new__(WireClient)
    c.sock = a
    b.sendall(b"x")
    assert not _closed(c)
    b.close()
    assert _closed(c)
    a.close()
