"""The SASL server state machine (PLAIN, SCRAM-SHA-256/512) and session tokens, without a broker."""

from __future__ import annotations

import threading

import pytest

from kbroker.security.principal import KafkaPrincipal
from kbroker.security.sasl import (
    IllegalSaslStateError,
    SaslAuthenticationFailedError,
    SaslAuthenticator,
    SessionStore,
    UnsupportedSaslMechanismError,
    check_mechanisms,
)
from kclient.errors import InvalidConfigError
from kclient.scram import ScramClient, ScramCredential, ScramMechanism, generate_credential
from tests.support import FakeClock

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
ALL = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class Users:
    """An in-memory credential table standing in for CredentialStore.lookup."""

    def __init__(self) -> None:
        self.table: dict[tuple[str, ScramMechanism], ScramCredential] = {}

    def set(self, user: str, password: str, mechanisms: tuple[ScramMechanism, ...] = (SHA256, SHA512)) -> None:
        for m in mechanisms:
            self.table[(user, m)] = generate_credential(m, password)

    def lookup(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return self.table.get((user, mechanism))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def users() -> Users:
    u = Users()
    u.set("alice", "alice-secret")
    return u


@pytest.fixture
def auth(users: Users, clock: FakeClock) -> SaslAuthenticator:
    return SaslAuthenticator(
        enabled_mechanisms=ALL, lookup=users.lookup, sessions=SessionStore(60_000, clock=clock), clock=clock
    )


def _scram(
    auth: SaslAuthenticator, mechanism: ScramMechanism, user: str, password: str, protocol: str = "SASL_PLAINTEXT"
) -> tuple[str, int]:
    client = ScramClient(mechanism, user, password)
    first = auth.authenticate(mechanism.value, "", client.first_message(), protocol)
    assert first.exchange_id and first.session_token is None
    final = auth.authenticate(mechanism.value, first.exchange_id, client.final_message(first.auth_bytes), protocol)
    client.verify_server_final(final.auth_bytes)
    assert final.session_token is not None
    return final.session_token, final.session_lifetime_ms


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_scram_exchange_gives_a_session_of_the_user(auth: SaslAuthenticator, mechanism: ScramMechanism) -> None:
    token, lifetime_ms = _scram(auth, mechanism, "alice", "alice-secret")
    assert lifetime_ms == 60_000 and len(token) == 43
    assert auth.sessions.lookup(token) == KafkaPrincipal("User", "alice")
    session = auth.sessions.session(token)
    assert session is not None and session.mechanism == mechanism.value
    assert auth.pending_exchanges() == 0


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_wrong_password_and_unknown_user_fail_with_kafkas_message(
    auth: SaslAuthenticator, mechanism: ScramMechanism
) -> None:
    message = (
        "Authentication failed during authentication due to invalid credentials with SASL mechanism " + mechanism.value
    )
    with pytest.raises(SaslAuthenticationFailedError) as wrong:
        _scram(auth, mechanism, "alice", "wrong")
    assert wrong.value.errno == 58 and wrong.value.message == message
    with pytest.raises(SaslAuthenticationFailedError) as unknown:
        _scram(auth, mechanism, "mallory", "x")
    assert unknown.value.message == message
    assert len(auth.sessions) == 0 and auth.pending_exchanges() == 0


def test_mechanisms_per_listener_and_handshake(users: Users) -> None:
    auth = SaslAuthenticator(
        enabled_mechanisms=["SCRAM-SHA-512", "PLAIN"], lookup=users.lookup, sessions=SessionStore()
    )
    assert auth.mechanisms("SASL_SSL") == ["SCRAM-SHA-512", "PLAIN"]
    assert auth.mechanisms("SASL_PLAINTEXT") == ["SCRAM-SHA-512"]
    assert auth.mechanisms("PLAINTEXT") == []
    assert auth.handshake("SCRAM-SHA-512", "SASL_PLAINTEXT") == ["SCRAM-SHA-512"]
    with pytest.raises(UnsupportedSaslMechanismError) as refused:
        auth.handshake("SCRAM-SHA-256", "SASL_SSL")
    assert refused.value.errno == 33 and "enabled: SCRAM-SHA-512, PLAIN" in refused.value.message
    with pytest.raises(UnsupportedSaslMechanismError):
        auth.authenticate("SCRAM-SHA-256", "", b"n,,n=alice,r=abc", "SASL_SSL")
    with pytest.raises(UnsupportedSaslMechanismError):
        auth.handshake("GSSAPI", "SASL_SSL")


def test_sasl_on_a_non_sasl_listener_is_illegal_state(auth: SaslAuthenticator) -> None:
    for protocol in ("PLAINTEXT", "SSL"):
        with pytest.raises(IllegalSaslStateError) as illegal:
            auth.handshake("SCRAM-SHA-256", protocol)
        assert illegal.value.errno == 34
        with pytest.raises(IllegalSaslStateError):
            auth.authenticate("SCRAM-SHA-256", "", b"n,,n=alice,r=abc", protocol)


def test_plain_is_refused_unless_the_listener_is_sasl_ssl(auth: SaslAuthenticator) -> None:
    with pytest.raises(UnsupportedSaslMechanismError, match="only on SASL_SSL"):
        auth.handshake("PLAIN", "SASL_PLAINTEXT")
    with pytest.raises(UnsupportedSaslMechanismError):
        auth.authenticate("PLAIN", "", b"\0alice\0alice-secret", "SASL_PLAINTEXT")
    assert len(auth.sessions) == 0


def test_plain_checks_the_password_against_the_scram_credential(auth: SaslAuthenticator, users: Users) -> None:
    result = auth.authenticate("PLAIN", "", b"\0alice\0alice-secret", "SASL_SSL")
    assert result.auth_bytes == b"" and result.session_token is not None
    assert auth.sessions.lookup(result.session_token) == KafkaPrincipal.user("alice")
    assert auth.authenticate("PLAIN", "", b"alice\0alice\0alice-secret", "SASL_SSL").session_token
    users.set("bob", "bob-secret", (SHA256,))  # only a SHA-256 credential: still usable for PLAIN
    assert auth.authenticate("PLAIN", "", b"\0bob\0bob-secret", "SASL_SSL").session_token
    for bad, match in (
        (b"\0alice\0wrong", "Invalid username or password"),
        (b"\0nobody\0x", "Invalid username or password"),
        (b"admin\0alice\0alice-secret", "authorization id"),
        (b"\0\0pw", "username not specified"),
        (b"\0alice\0", "password not specified"),
        (b"alice-secret", "expected 3 tokens"),
        (b"\xff\0a\0b", "expected 3 tokens"),
    ):
        with pytest.raises(SaslAuthenticationFailedError, match=match):
            auth.authenticate("PLAIN", "", bad, "SASL_SSL")
    with pytest.raises(IllegalSaslStateError):
        auth.authenticate("PLAIN", "some-id", b"\0alice\0alice-secret", "SASL_SSL")


def test_exchange_out_of_order_is_illegal_state(auth: SaslAuthenticator) -> None:
    with pytest.raises(IllegalSaslStateError):
        auth.authenticate("SCRAM-SHA-256", "no-such-exchange", b"c=biws,r=x,p=AAAA", "SASL_PLAINTEXT")
    client = ScramClient(SHA256, "alice", "alice-secret")
    first = auth.authenticate("SCRAM-SHA-256", "", client.first_message(), "SASL_PLAINTEXT")
    final_message = client.final_message(first.auth_bytes)
    with pytest.raises(IllegalSaslStateError):  # another mechanism: the exchange is gone
        auth.authenticate("SCRAM-SHA-512", first.exchange_id, final_message, "SASL_PLAINTEXT")
    with pytest.raises(IllegalSaslStateError):
        auth.authenticate("SCRAM-SHA-256", first.exchange_id, final_message, "SASL_PLAINTEXT")
    # A completed exchange cannot be replayed.
    client = ScramClient(SHA256, "alice", "alice-secret")
    first = auth.authenticate("SCRAM-SHA-256", "", client.first_message(), "SASL_PLAINTEXT")
    final_message = client.final_message(first.auth_bytes)
    assert auth.authenticate("SCRAM-SHA-256", first.exchange_id, final_message, "SASL_PLAINTEXT").session_token
    with pytest.raises(IllegalSaslStateError):
        auth.authenticate("SCRAM-SHA-256", first.exchange_id, final_message, "SASL_PLAINTEXT")


def test_exchange_on_another_listener_is_illegal_state(auth: SaslAuthenticator) -> None:
    client = ScramClient(SHA256, "alice", "alice-secret")
    first = auth.authenticate("SCRAM-SHA-256", "", client.first_message(), "SASL_SSL")
    with pytest.raises(IllegalSaslStateError):
        auth.authenticate("SCRAM-SHA-256", first.exchange_id, client.final_message(first.auth_bytes), "SASL_PLAINTEXT")


def test_exchange_expires_after_30_seconds(auth: SaslAuthenticator, clock: FakeClock) -> None:
    client = ScramClient(SHA512, "alice", "alice-secret")
    first = auth.authenticate("SCRAM-SHA-512", "", client.first_message(), "SASL_PLAINTEXT")
    assert auth.pending_exchanges() == 1
    clock.now += 30.5
    with pytest.raises(IllegalSaslStateError, match="expired"):
        auth.authenticate("SCRAM-SHA-512", first.exchange_id, client.final_message(first.auth_bytes), "SASL_PLAINTEXT")
    assert auth.pending_exchanges() == 0


def test_pending_exchanges_are_bounded(users: Users) -> None:
    auth = SaslAuthenticator(enabled_mechanisms=ALL, lookup=users.lookup, sessions=SessionStore(), max_exchanges=3)
    for _ in range(5):
        auth.authenticate("SCRAM-SHA-256", "", ScramClient(SHA256, "alice", "x").first_message(), "SASL_PLAINTEXT")
    assert auth.pending_exchanges() == 3


def test_credential_changed_during_the_exchange_gives_no_session(auth: SaslAuthenticator, users: Users) -> None:
    client = ScramClient(SHA256, "alice", "alice-secret")
    first = auth.authenticate("SCRAM-SHA-256", "", client.first_message(), "SASL_PLAINTEXT")
    users.set("alice", "new-secret")
    with pytest.raises(SaslAuthenticationFailedError):
        auth.authenticate("SCRAM-SHA-256", first.exchange_id, client.final_message(first.auth_bytes), "SASL_PLAINTEXT")
    assert len(auth.sessions) == 0


def test_sessions_expire_after_max_reauth(auth: SaslAuthenticator, clock: FakeClock) -> None:
    token, _ = _scram(auth, SHA256, "alice", "alice-secret")
    clock.now += 59.9
    assert auth.sessions.lookup(token) == KafkaPrincipal.user("alice")
    clock.now += 0.2
    assert auth.sessions.lookup(token) is None
    assert auth.sessions.lookup("not-a-token") is None


def test_expired_sessions_are_purged(clock: FakeClock) -> None:
    sessions = SessionStore(1000, clock=clock)
    for _ in range(10):
        sessions.create(KafkaPrincipal.user("u"), "SCRAM-SHA-256")
    clock.now += SessionStore.PURGE_INTERVAL_S + 1
    sessions.create(KafkaPrincipal.user("u"), "SCRAM-SHA-256")
    assert len(sessions) == 1


def test_revoke_user_ends_only_that_users_sessions(auth: SaslAuthenticator, users: Users) -> None:
    users.set("bob", "bob-secret")
    alice1, _ = _scram(auth, SHA256, "alice", "alice-secret")
    alice2, _ = _scram(auth, SHA512, "alice", "alice-secret")
    bob, _ = _scram(auth, SHA256, "bob", "bob-secret")
    assert auth.sessions.revoke_user("alice") == 2
    assert auth.sessions.lookup(alice1) is None and auth.sessions.lookup(alice2) is None
    assert auth.sessions.lookup(bob) == KafkaPrincipal.user("bob")
    assert auth.sessions.revoke(bob) and not auth.sessions.revoke(bob)


def test_a_late_notification_of_the_credential_used_keeps_the_session(auth: SaslAuthenticator, users: Users) -> None:
    """The user logs in before the broker has seen the notification of its credential's
    creation: that notification leaves the credential current, so the session stays; a
    changed password then ends it."""
    token, _ = _scram(auth, SHA256, "alice", "alice-secret")
    current = [users.table[("alice", m)] for m in (SHA256, SHA512)]
    assert auth.sessions.revoke_user("alice", lambda: current) == 0
    assert auth.sessions.lookup(token) == KafkaPrincipal.user("alice")
    users.set("alice", "new-secret")
    changed = [users.table[("alice", m)] for m in (SHA256, SHA512)]
    assert auth.sessions.revoke_user("alice", lambda: changed) == 1
    assert auth.sessions.lookup(token) is None


def test_sessions_are_thread_safe() -> None:
    sessions = SessionStore()
    tokens: list[str] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        for _ in range(200):
            token, _ = sessions.create(KafkaPrincipal.user(f"u{i % 2}"), "PLAIN")
            with lock:
                tokens.append(token)
            sessions.revoke_user("u0")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(tokens)) == 800
    assert all(sessions.lookup(t) in (None, KafkaPrincipal.user("u1")) for t in tokens)
    assert sessions.revoke_user("u1") == 400 and len(sessions) == 0


def test_config_checks() -> None:
    assert check_mechanisms(["SCRAM-SHA-512", " PLAIN", "SCRAM-SHA-512", ""]) == ["SCRAM-SHA-512", "PLAIN"]
    with pytest.raises(InvalidConfigError, match="GSSAPI"):
        check_mechanisms(["GSSAPI"])
    with pytest.raises(InvalidConfigError):
        SessionStore(0)
