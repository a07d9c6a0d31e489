"""The SCRAM server's check of the client-final nonce: the combined nonce (RFC 5802), or
older librdkafka's form (its own nonce again in front, as Debian's 2.0.2 sends it and
Kafka 2.x-3.x accepted); any other prefix or change is refused. The proof is computed
over what is sent, as a client does."""

from __future__ import annotations

import base64

import pytest

from kclient.scram import ScramAuthenticationError, ScramMechanism, ScramServer, generate_credential

SHA256 = ScramMechanism.SCRAM_SHA_256
CLIENT_NONCE = "cnonce0123456789"
SALT = b"0123456789abcdef"


def _exchange(prefix: str) -> ScramServer:
    users = {"user": generate_credential(SHA256, "pencil", 4096, salt=SALT)}
    server = ScramServer(SHA256, users.get, nonce="snonce")
    first_bare = f"n=user,r={CLIENT_NONCE}"
    server_first = server.evaluate(f"n,,{first_bare}".encode()).decode()
    without_proof = f"c=biws,r={prefix}{CLIENT_NONCE}snonce"
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    client_key = SHA256.client_key(SHA256.salted_password("pencil", SALT, 4096))
    signature = SHA256.hmac(SHA256.stored_key(client_key), auth_message)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server.evaluate(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
    return server


@pytest.mark.parametrize("prefix", ["", CLIENT_NONCE])
def test_combined_and_librdkafka_nonces_are_accepted(prefix: str) -> None:
    assert _exchange(prefix).complete


@pytest.mark.parametrize("prefix", ["x", "cnonce", CLIENT_NONCE + "x", CLIENT_NONCE * 2])
def test_other_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(ScramAuthenticationError, match="nonce"):
        _exchange(prefix)
