"""SCRAM (RFC 5802 / RFC 7677): Kafka's credential form, the RFC test vector, round trips."""

from __future__ import annotations

import base64

import pytest

from kclient.scram import (
    ScramAuthenticationError,
    ScramClient,
    ScramCredential,
    ScramCredentialError,
    ScramFormatError,
    ScramMechanism,
    ScramServer,
    ScramStateError,
    credential_from_salted_password,
    generate_credential,
    password_matches,
)

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512

# RFC 7677 section 3.
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _rfc_credential() -> ScramCredential:
    return generate_credential(SHA256, "pencil", 4096, salt=RFC_SALT)


def test_rfc7677_vector_server_side() -> None:
    users = {"user": _rfc_credential()}
    server = ScramServer(SHA256, users.get, nonce=RFC_SERVER_NONCE)
    assert server.evaluate(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert not server.complete
    assert server.evaluate(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.complete and server.username == "user" and server.credential == users["user"]


def test_rfc7677_vector_client_side() -> None:
    client = ScramClient(SHA256, "user", "pencil", nonce=RFC_CLIENT_NONCE)
    assert client.first_message() == RFC_CLIENT_FIRST
    assert client.final_message(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify_server_final(RFC_SERVER_FINAL)
    assert client.complete


def test_client_refuses_a_forged_server_signature() -> None:
    client = ScramClient(SHA256, "user", "pencil", nonce=RFC_CLIENT_NONCE)
    client.first_message()
    client.final_message(RFC_SERVER_FIRST)
    with pytest.raises(ScramAuthenticationError, match="server signature"):
        client.verify_server_final(b"v=" + base64.b64encode(b"x" * 32))


def test_client_refuses_low_iterations_and_foreign_nonce() -> None:
    client = ScramClient(SHA256, "user", "pencil", nonce=RFC_CLIENT_NONCE)
    client.first_message()
    with pytest.raises(ScramAuthenticationError, match="minimum 4096"):
        client.final_message(RFC_SERVER_FIRST.replace(b"i=4096", b"i=1000"))
    client = ScramClient(SHA256, "user", "pencil", nonce=RFC_CLIENT_NONCE)
    client.first_message()
    with pytest.raises(ScramAuthenticationError, match="nonce"):
        client.final_message(RFC_SERVER_FIRST.replace(b"r=rOpr", b"r=XXpr"))


def test_credential_string_is_kafkas() -> None:
    credential = _rfc_credential()
    text = str(credential)
    assert text.startswith("salt=W22ZaJ0SNY7soEsUEjb6gQ==,stored_key=") and text.endswith(",iterations=4096")
    assert [part.split("=", 1)[0] for part in text.split(",")] == ["salt", "stored_key", "server_key", "iterations"]
    assert ScramCredential.parse(text) == credential
    assert "pencil" not in text and "stored_key" not in repr(credential)
    for bad in ("", "salt=AAAA", "salt=!!,stored_key=AA==,server_key=AA==,iterations=4096", "x"):
        with pytest.raises(ScramFormatError):
            ScramCredential.parse(bad)
    with pytest.raises(ScramFormatError):
        ScramCredential.parse(text.replace("iterations=4096", "iterations=many"))


def test_iteration_bounds_and_empty_password() -> None:
    with pytest.raises(ScramCredentialError, match="less than the minimum 4096"):
        generate_credential(SHA256, "pw", 4095)
    with pytest.raises(ScramCredentialError, match="maximum 16384"):
        generate_credential(SHA512, "pw", 16385)
    with pytest.raises(ScramCredentialError):
        generate_credential(SHA512, "", 4096)
    assert generate_credential(SHA512, "pw", 16384).iterations == 16384


def test_salted_password_form_matches_password_form() -> None:
    salted = SHA512.salted_password("secret", b"salt", 4096)
    assert credential_from_salted_password(SHA512, b"salt", salted, 4096) == generate_credential(
        SHA512, "secret", 4096, salt=b"salt"
    )
    credential = generate_credential(SHA512, "secret")
    assert password_matches(SHA512, credential, "secret")
    assert not password_matches(SHA512, credential, "Secret")


def _exchange(mechanism: ScramMechanism, stored_password: str, password: str, user: str = "alice") -> ScramServer:
    users = {user: generate_credential(mechanism, stored_password)}
    server = ScramServer(mechanism, users.get)
    client = ScramClient(mechanism, user, password)
    final = client.final_message(server.evaluate(client.first_message()))
    client.verify_server_final(server.evaluate(final))
    assert client.complete
    return server


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_round_trip(mechanism: ScramMechanism) -> None:
    server = _exchange(mechanism, "alice-secret", "alice-secret")
    assert server.complete and server.username == "alice"


@pytest.mark.parametrize("mechanism", [SHA256, SHA512])
def test_wrong_password_is_refused(mechanism: ScramMechanism) -> None:
    with pytest.raises(ScramAuthenticationError, match="Invalid client credentials"):
        _exchange(mechanism, "alice-secret", "alice-wrong")


def test_user_names_with_comma_and_equals_are_escaped() -> None:
    server = _exchange(SHA256, "pw", "pw", user="a,b=c")
    assert server.username == "a,b=c"


def test_unknown_user_is_refused_at_the_first_message() -> None:
    nobody: dict[str, ScramCredential] = {}
    server = ScramServer(SHA256, nobody.get)
    with pytest.raises(ScramAuthenticationError, match="Invalid user credentials"):
        server.evaluate(b"n,,n=nobody,r=abc")
    with pytest.raises(ScramStateError):
        server.evaluate(b"n,,n=nobody,r=abc")  # a failed exchange cannot go on


def test_tampered_nonce_is_refused() -> None:
    users = {"user": _rfc_credential()}
    server = ScramServer(SHA256, users.get, nonce=RFC_SERVER_NONCE)
    server.evaluate(RFC_CLIENT_FIRST)
    with pytest.raises(ScramAuthenticationError, match="nonce"):
        server.evaluate(RFC_CLIENT_FINAL.replace(b"k0,p=", b"k1,p="))


def test_tampered_proof_and_channel_binding_are_refused() -> None:
    users = {"user": _rfc_credential()}
    server = ScramServer(SHA256, users.get, nonce=RFC_SERVER_NONCE)
    server.evaluate(RFC_CLIENT_FIRST)
    with pytest.raises(ScramAuthenticationError):
        server.evaluate(RFC_CLIENT_FINAL.replace(b"p=dHzb", b"p=dHzc"))
    server = ScramServer(SHA256, users.get, nonce=RFC_SERVER_NONCE)
    server.evaluate(RFC_CLIENT_FIRST)
    with pytest.raises(ScramAuthenticationError, match="channel binding"):
        server.evaluate(RFC_CLIENT_FINAL.replace(b"c=biws", b"c=" + base64.b64encode(b"y,,")))


def test_authzid_must_be_the_user_and_channel_binding_only_n() -> None:
    users = {"user": _rfc_credential()}
    with pytest.raises(ScramAuthenticationError, match="authorization id"):
        ScramServer(SHA256, users.get).evaluate(b"n,a=admin,n=user,r=abc")
    ScramServer(SHA256, users.get).evaluate(b"n,a=user,n=user,r=abc")  # equal: accepted
    for bad in (
        b"y,,n=user,r=abc",
        b"p=tls-unique,,n=user,r=abc",
        b"n,,r=abc",
        b"\xff",
        b"n,,n=,r=abc",
        b"n,,n=user,r=",
    ):
        with pytest.raises(ScramFormatError):
            ScramServer(SHA256, users.get).evaluate(bad)
    with pytest.raises(ScramAuthenticationError, match="delegation tokens"):
        ScramServer(SHA256, users.get).evaluate(b"n,,n=user,r=abc,tokenauth=true")


def test_server_refuses_a_third_message() -> None:
    users = {"user": _rfc_credential()}
    server = ScramServer(SHA256, users.get, nonce=RFC_SERVER_NONCE)
    server.evaluate(RFC_CLIENT_FIRST)
    server.evaluate(RFC_CLIENT_FINAL)
    with pytest.raises(ScramStateError):
        server.evaluate(RFC_CLIENT_FINAL)


def test_mechanism_names() -> None:
    assert ScramMechanism.from_name("SCRAM-SHA-256") is SHA256
    assert ScramMechanism.from_name("SCRAM-SHA-512") is SHA512
    assert ScramMechanism.from_name("PLAIN") is None
    assert SHA512.mechanism_name == "SCRAM-SHA-512" and SHA256.min_iterations == 4096
