"""SaslHandshake / SaslAuthenticate on one Kafka-door connection (kbroker.doors.kafka.security_apis)
with the real SaslAuthenticator and a fake servicer: the connection carries the exchange,
takes the principal, keeps no session token, and gets the session's end."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kio.index import load_request_schema

from kbroker.api.call_context import bind, unbind
from kbroker.doors.kafka.codec import NO_TOPIC_ID, Header, build, topic_uuid
from kbroker.doors.kafka.security_apis import SASL_AUTHENTICATE, SASL_HANDSHAKE, SecurityApis
from kbroker.doors.kafka.server import CloseConnection, Connection, KafkaRequest
from kbroker.security.listeners import EndPoint
from kbroker.security.principal import ANONYMOUS, KafkaPrincipal
from kbroker.security.sasl import SaslAuthenticator, SessionStore
from kclient.scram import ScramClient, ScramCredential, ScramMechanism, generate_credential

USERS = {name: generate_credential(ScramMechanism.SCRAM_SHA_256, f"{name}-secret", 4096) for name in ("alice", "bob")}


class FakeCore:
    """The core as the SASL APIs use it: its offload only (SASL runs in the door)."""

    security = None

    async def offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


def lookup(user: str, mechanism: ScramMechanism) -> ScramCredential | None:
    return USERS.get(user) if mechanism is ScramMechanism.SCRAM_SHA_256 else None


@pytest.fixture
def sessions() -> SessionStore:
    return SessionStore(max_reauth_ms=60_000)


@pytest.fixture
def apis(sessions: SessionStore) -> SecurityApis:
    sasl = SaslAuthenticator(enabled_mechanisms=["SCRAM-SHA-256"], lookup=lookup, sessions=sessions)
    return SecurityApis(FakeCore(), lambda listener: sasl if listener == "KSCRAM" else None)  # type: ignore[arg-type]


def _connection(protocol: str = "SASL_PLAINTEXT", name: str = "KSCRAM") -> Connection:
    return Connection(EndPoint(name, "127.0.0.1", 9093, protocol), "127.0.0.1")


def _call(apis: SecurityApis, conn: Connection, key: int, version: int, values: dict[str, Any]) -> Any:
    payload = build(load_request_schema(key, version), values)
    handler = apis.sasl_handshake if key == SASL_HANDSHAKE else apis.sasl_authenticate

    async def run() -> Any:
        token = bind(conn.call())
        try:
            return await handler(KafkaRequest(Header(key, version, 1, "t"), payload, conn))
        finally:
            unbind(token)

    return asyncio.run(run())


def _login(apis: SecurityApis, conn: Connection, user: str, password: str) -> Any:
    assert _call(apis, conn, SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-256"}).error_code == 0
    client = ScramClient(ScramMechanism.SCRAM_SHA_256, user, password)
    first = _call(apis, conn, SASL_AUTHENTICATE, 2, {"auth_bytes": client.first_message()})
    if first.error_code != 0:
        return first
    return _call(apis, conn, SASL_AUTHENTICATE, 2, {"auth_bytes": client.final_message(first.auth_bytes)})


def test_a_scram_exchange_authenticates_the_connection(apis: SecurityApis, sessions: SessionStore) -> None:
    conn = _connection()
    before = time.monotonic()
    done = _login(apis, conn, "alice", "alice-secret")
    assert done.error_code == 0 and done.session_lifetime.total_seconds() == 60
    assert conn.authenticated and conn.principal == KafkaPrincipal.user("alice")
    assert conn.session_expiry is not None and before + 59 < conn.session_expiry < time.monotonic() + 61
    assert len(sessions) == 0 and conn.sasl == {}  # the connection is the session: no token kept


def test_a_wrong_password_is_answered_then_the_connection_closes(apis: SecurityApis) -> None:
    conn = _connection()
    with pytest.raises(CloseConnection) as closed:  # Kafka: the answer, then the close
        _login(apis, conn, "alice", "nope")
    failed = closed.value.response
    assert failed.error_code == 58 and "invalid credentials" in failed.error_message
    assert not conn.authenticated and conn.principal == ANONYMOUS and conn.sasl == {}
    assert _login(apis, _connection(), "alice", "alice-secret").error_code == 0  # a new connection


def test_reauthentication_keeps_the_principal(apis: SecurityApis) -> None:
    conn = _connection()
    assert _login(apis, conn, "alice", "alice-secret").error_code == 0
    first_expiry = conn.session_expiry
    time.sleep(0.01)
    assert _login(apis, conn, "alice", "alice-secret").error_code == 0
    assert conn.session_expiry is not None and first_expiry is not None and conn.session_expiry > first_expiry
    with pytest.raises(CloseConnection) as closed:  # KIP-368: another principal ends the connection
        _login(apis, conn, "bob", "bob-secret")
    assert closed.value.response.error_code == 58 and conn.principal == KafkaPrincipal.user("alice")


def test_out_of_order_and_unknown_mechanisms(apis: SecurityApis) -> None:
    conn = _connection()
    early = _call(apis, conn, SASL_AUTHENTICATE, 1, {"auth_bytes": b"n,,n=alice,r=abc"})
    assert early.error_code == 34  # ILLEGAL_SASL_STATE: no handshake yet
    unknown = _call(apis, conn, SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    assert unknown.error_code == 33 and list(unknown.mechanisms) == ["SCRAM-SHA-256"]
    plaintext = _connection("PLAINTEXT", "PLAINTEXT")
    assert _call(apis, plaintext, SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-256"}).error_code == 34


def test_topic_ids_become_kafka_uuids() -> None:
    raw = uuid.uuid4()
    text = base64.urlsafe_b64encode(raw.bytes).decode().rstrip("=")
    assert topic_uuid(text) == raw
    assert topic_uuid("") == NO_TOPIC_ID and topic_uuid("not base64!") == NO_TOPIC_ID
