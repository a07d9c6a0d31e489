"""SASL session tokens are bound to the connection they were issued on, without a broker:
the binding of a gRPC call (listener, peer address and port, client certificate), the
session store refusing a live token presented elsewhere, and a listener's authenticator
refusing a replayed token while still letting that connection log in again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kbroker.api.call_context import SASL_METHODS, SESSION_METADATA_KEY, CallContext, ListenerAuthenticator
from kbroker.security.listeners import EndPoint
from kbroker.security.principal import ANONYMOUS, KafkaPrincipal
from kbroker.security.sasl import (
    SaslAuthenticator,
    SessionBindingError,
    SessionStore,
    channel_binding,
)
from kclient.errors import SaslAuthenticationFailedError
from kclient.scram import ScramClient, ScramMechanism, generate_credential

SHA512 = ScramMechanism.SCRAM_SHA_512
CERT_A = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
CERT_B = b"-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n"
METADATA = "/kbroker.v1.Broker/Metadata"
AUTHENTICATE = "/kbroker.v1.Broker/SaslAuthenticate"


@dataclass
class Meta:
    key: str
    value: str


@dataclass
class FakeContext:
    """The parts of a grpc.aio.ServicerContext the authenticator reads."""

    peer_address: str
    token: str | None = None
    certificate: bytes | None = None
    metadata: list[Meta] = field(default_factory=list)

    def peer(self) -> str:
        return self.peer_address

    def auth_context(self) -> dict[str, Sequence[bytes]]:
        if self.certificate is None:
            return {"transport_security_type": [b"ssl"]}
        return {"transport_security_type": [b"ssl"], "x509_pem_cert": [self.certificate]}

    def invocation_metadata(self) -> list[Meta]:
        return [Meta(SESSION_METADATA_KEY, self.token)] if self.token else []


def test_the_binding_names_the_listener_the_peer_port_and_the_client_certificate() -> None:
    one = channel_binding("SCRAM", "ipv4:10.0.0.5:40001")
    assert one == "SCRAM|ipv4:10.0.0.5:40001"
    assert channel_binding("SCRAM", "ipv4:10.0.0.5:40002") != one  # another connection of the same host
    assert channel_binding("OTHER", "ipv4:10.0.0.5:40001") != one  # another listener
    with_a = channel_binding("SECURE", "ipv4:10.0.0.5:40001", {"x509_pem_cert": [CERT_A]})
    with_b = channel_binding("SECURE", "ipv4:10.0.0.5:40001", {"x509_pem_cert": [CERT_B]})
    assert with_a != with_b and with_a.startswith("SECURE|ipv4:10.0.0.5:40001|x509:")
    assert channel_binding("SECURE", "ipv4:10.0.0.5:40001", {"transport_security_type": [b"ssl"]}) == (
        "SECURE|ipv4:10.0.0.5:40001"
    )


def test_a_live_token_presented_on_another_connection_is_refused_but_not_revoked() -> None:
    store = SessionStore(60_000)
    mine, other = channel_binding("L", "ipv4:10.0.0.5:40001"), channel_binding("L", "ipv4:10.0.0.6:40001")
    token, _ = store.create(KafkaPrincipal.user("alice"), "SCRAM-SHA-512", mine)
    assert store.lookup(token, mine) == KafkaPrincipal.user("alice")
    with pytest.raises(SessionBindingError, match="another connection") as refused:
        store.lookup(token, other)
    assert refused.value.errno == SaslAuthenticationFailedError.errno == 58
    with pytest.raises(SessionBindingError):
        store.lookup(token)  # unbound: no connection at all
    # The owner keeps its session: a replay cannot log it out.
    assert store.lookup(token, mine) == KafkaPrincipal.user("alice")
    assert store.lookup("not-a-token", mine) is None


def _authenticator(protocol: str) -> tuple[ListenerAuthenticator, SaslAuthenticator]:
    credential = generate_credential(SHA512, "alice-secret")
    sessions = SessionStore(60_000)
    sasl = SaslAuthenticator(
        enabled_mechanisms=["SCRAM-SHA-512"],
        lookup=lambda user, m: credential if (user, m) == ("alice", SHA512) else None,
        sessions=sessions,
    )
    return ListenerAuthenticator(EndPoint("SCRAM", "127.0.0.1", 9092, protocol), sessions), sasl


def _login(listener: ListenerAuthenticator, sasl: SaslAuthenticator, context: FakeContext) -> str:
    """A SCRAM exchange whose two SaslAuthenticate calls come on ``context``'s connection,
    as SecurityRpcs.SaslAuthenticate runs it (binding = the call's channel)."""
    client = ScramClient(SHA512, "alice", "alice-secret")
    call: CallContext = listener(AUTHENTICATE, context)
    assert call.principal == ANONYMOUS and call.channel
    first = sasl.authenticate("SCRAM-SHA-512", "", client.first_message(), call.security_protocol, call.channel)
    call = listener(AUTHENTICATE, context)
    final = sasl.authenticate(
        "SCRAM-SHA-512",
        first.exchange_id,
        client.final_message(first.auth_bytes),
        call.security_protocol,
        call.channel,
    )
    client.verify_server_final(final.auth_bytes)
    assert final.session_token
    return final.session_token


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_the_listener_refuses_a_token_replayed_from_another_connection(protocol: str) -> None:
    listener, sasl = _authenticator(protocol)
    token = _login(listener, sasl, FakeContext("ipv4:10.0.0.5:40001"))
    assert listener(METADATA, FakeContext("ipv4:10.0.0.5:40001", token)).principal == KafkaPrincipal.user("alice")

    for thief in ("ipv4:10.0.0.66:40001", "ipv4:10.0.0.5:40002", "ipv6:[::1]:40001"):
        with pytest.raises(SaslAuthenticationFailedError, match="another connection"):
            listener(METADATA, FakeContext(thief, token))
    # A connection carrying a stale token may still log in again (the SASL RPCs are served).
    assert AUTHENTICATE in SASL_METHODS
    again = listener(AUTHENTICATE, FakeContext("ipv4:10.0.0.5:40002", token))
    assert again.principal == ANONYMOUS
    # And the owner's connection is untouched.
    assert listener(METADATA, FakeContext("ipv4:10.0.0.5:40001", token)).principal == KafkaPrincipal.user("alice")


def test_on_sasl_ssl_the_client_certificate_is_part_of_the_binding() -> None:
    listener, sasl = _authenticator("SASL_SSL")
    token = _login(listener, sasl, FakeContext("ipv4:10.0.0.5:40001", certificate=CERT_A))
    ok = FakeContext("ipv4:10.0.0.5:40001", token, certificate=CERT_A)
    assert listener(METADATA, ok).principal == KafkaPrincipal.user("alice")
    for other in (CERT_B, None):  # the same address and port reused without that certificate
        with pytest.raises(SaslAuthenticationFailedError, match="another connection"):
            listener(METADATA, FakeContext("ipv4:10.0.0.5:40001", token, certificate=other))


def test_a_plaintext_listener_ignores_certificates_it_cannot_have() -> None:
    listener, _ = _authenticator("SASL_PLAINTEXT")
    context: Any = FakeContext("ipv4:10.0.0.5:40001", certificate=CERT_A)
    assert listener(AUTHENTICATE, context).channel == "SCRAM|ipv4:10.0.0.5:40001"
