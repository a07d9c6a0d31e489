"""A SCRAM exchange in progress is bound to the connection it started on: one who sees
its exchange id (SASL_PLAINTEXT) can neither end the client's login by taking it nor
finish it on their own connection by replaying the client-final message first."""

from __future__ import annotations

import pytest

from kbroker.security.sasl import SaslAuthenticator, SessionStore, channel_binding
from kclient.errors import IllegalSaslStateError
from kclient.scram import ScramClient, ScramMechanism, generate_credential

SHA512 = ScramMechanism.SCRAM_SHA_512
VICTIM = channel_binding("SCRAM", "ipv4:10.0.0.5:40000")
ATTACKER = channel_binding("SCRAM", "ipv4:10.0.0.66:50000")


def _sasl() -> SaslAuthenticator:
    credential = generate_credential(SHA512, "alice-secret")
    return SaslAuthenticator(
        enabled_mechanisms=["SCRAM-SHA-512"],
        lookup=lambda user, m: credential if (user, m) == ("alice", SHA512) else None,
        sessions=SessionStore(60_000),
    )


def test_a_replayed_client_final_from_another_connection_gets_no_token_and_the_login_goes_on() -> None:
    """Before: the first to send the client-final message with the exchange id popped the
    exchange; an on-path attacker got a session token bound to their own connection and
    the client's own login failed."""
    sasl = _sasl()
    client = ScramClient(SHA512, "alice", "alice-secret")
    first = sasl.authenticate("SCRAM-SHA-512", "", client.first_message(), "SASL_PLAINTEXT", VICTIM)
    final_message = client.final_message(first.auth_bytes)
    with pytest.raises(IllegalSaslStateError, match="another connection"):
        sasl.authenticate("SCRAM-SHA-512", first.exchange_id, final_message, "SASL_PLAINTEXT", ATTACKER)
    assert sasl.pending_exchanges() == 1  # still there for its own connection
    final = sasl.authenticate("SCRAM-SHA-512", first.exchange_id, final_message, "SASL_PLAINTEXT", VICTIM)
    client.verify_server_final(final.auth_bytes)
    assert final.session_token
    assert sasl.sessions.lookup(final.session_token, VICTIM) is not None


def test_garbage_under_a_seen_exchange_id_does_not_end_the_login() -> None:
    sasl = _sasl()
    client = ScramClient(SHA512, "alice", "alice-secret")
    first = sasl.authenticate("SCRAM-SHA-512", "", client.first_message(), "SASL_PLAINTEXT", VICTIM)
    with pytest.raises(IllegalSaslStateError):
        sasl.authenticate("SCRAM-SHA-512", first.exchange_id, b"c=biws,r=x,p=AAAA", "SASL_PLAINTEXT", ATTACKER)
    final = sasl.authenticate(
        "SCRAM-SHA-512", first.exchange_id, client.final_message(first.auth_bytes), "SASL_PLAINTEXT", VICTIM
    )
    assert final.session_token
