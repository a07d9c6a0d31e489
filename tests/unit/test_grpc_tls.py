"""TLS on gRPC (kbroker.security.tls) against an in-process gRPC server with a
trivial echo handler, with certificates from the local CA (kbroker.security.certs)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from kbroker.security import certs, tls
from kbroker.security.listeners import EndPoint
from kclient.errors import InvalidConfigError
from kclient.tls import channel_credentials, pem_blocks

ALICE = "CN=alice,OU=eng,O=kbroker"


@dataclass
class Pki:
    root: Path
    ca: certs.CertificateAuthority
    server: certs.IssuedCert
    alice: certs.IssuedCert
    foreign_ca: certs.CertificateAuthority
    mallory: certs.IssuedCert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = certs.make_ca(root / "ca")
    foreign = certs.make_ca(root / "foreign", "foreign CA")
    return Pki(
        root,
        ca,
        certs.issue(ca, root / "certs", "broker", "CN=broker", client=False),
        certs.issue(ca, root / "certs", "alice", ALICE, sans=(), server=False),
        foreign,
        certs.issue(foreign, root / "foreign-certs", "mallory", "CN=alice,OU=eng,O=kbroker", sans=(), server=False),
    )


@dataclass
class Seen:
    auth_contexts: list[dict[str, Sequence[bytes]]] = field(default_factory=list)


Client = Callable[[grpc.ChannelCredentials | None], Awaitable[bytes]]


async def _echo_server(creds: grpc.ServerCredentials, seen: Seen) -> tuple[grpc.aio.Server, int]:
    async def echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        seen.auth_contexts.append(dict(context.auth_context()))
        return request

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("t.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    return server, port


async def _call(port: int, creds: grpc.ChannelCredentials | None) -> bytes:
    target = f"localhost:{port}"
    channel = grpc.aio.insecure_channel(target) if creds is None else grpc.aio.secure_channel(target, creds)
    async with channel:
        out: bytes = await channel.unary_unary("/t.Echo/Echo")(b"ping", timeout=5)
        return out


def run_against(server_tls: tls.ServerTls, body: Callable[[int, Seen], Awaitable[None]]) -> Seen:
    """Start an echo server on ``server_tls``'s credentials and run ``body(port, seen)``."""
    seen = Seen()

    async def main() -> None:
        server, port = await _echo_server(server_tls.credentials(), seen)
        try:
            await body(port, seen)
        finally:
            await server.stop(0)

    asyncio.run(main())
    return seen


async def refused(port: int, creds: grpc.ChannelCredentials | None) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(port, creds)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def server_tls(pki: Pki, client_auth: str = "none", **kwargs: Any) -> tls.ServerTls:
    return tls.ServerTls(
        tls.SslConfig(
            keystore_location=kwargs.pop("keystore", str(pki.server.keystore_path)),
            truststore_location=str(pki.ca.cert_path),
            client_auth=client_auth,
            **kwargs,
        )
    )


def test_handshake_with_the_right_ca_and_not_with_a_wrong_one(pki: Pki) -> None:
    async def body(port: int, seen: Seen) -> None:
        assert await _call(port, channel_credentials(str(pki.ca.cert_path))) == b"ping"
        await refused(port, channel_credentials(str(pki.foreign_ca.cert_path)))
        await refused(port, None)  # a plaintext client on the TLS port

    seen = run_against(server_tls(pki), body)
    assert len(seen.auth_contexts) == 1
    ctx = seen.auth_contexts[0]
    assert list(ctx["transport_security_type"]) == [b"ssl"]
    assert tls.mtls_principal(ctx) is None  # TLS without a client certificate


def test_required_client_auth_refuses_no_certificate_and_a_foreign_one(pki: Pki) -> None:
    ca = str(pki.ca.cert_path)

    async def body(port: int, seen: Seen) -> None:
        await refused(port, channel_credentials(ca))
        await refused(port, channel_credentials(ca, str(pki.mallory.cert_path), str(pki.mallory.key_path)))
        alice = channel_credentials(ca, str(pki.alice.cert_path), str(pki.alice.key_path))
        assert await _call(port, alice) == b"ping"
        # the key may sit in the certificate file (Python's load_cert_chain)
        assert await _call(port, channel_credentials(ca, str(pki.alice.keystore_path))) == b"ping"

    seen = run_against(server_tls(pki, "required"), body)
    assert [tls.mtls_principal(c) for c in seen.auth_contexts] == [f"User:{ALICE}"] * 2


def test_mtls_principal_is_the_subject_dn_in_rfc2253_order(pki: Pki) -> None:
    assert pki.alice.subject == ALICE
    pem = pki.alice.cert_path.read_bytes()
    ssl_ctx: dict[str, Sequence[bytes]] = {"transport_security_type": [b"ssl"], "x509_pem_cert": [pem]}
    assert tls.mtls_principal(ssl_ctx) == "User:CN=alice,OU=eng,O=kbroker"
    assert tls.mtls_principal({"transport_security_type": [b"insecure"], "x509_pem_cert": [pem]}) is None
    assert tls.mtls_principal({}) is None
    escaped = certs.issue(pki.ca, pki.root / "certs", "odd", "CN=a\\,b+UID=7,O=x", sans=(), server=False)
    ctx = {"transport_security_type": [b"ssl"], "x509_pem_cert": [escaped.cert_path.read_bytes()]}
    assert tls.mtls_principal(ctx) == "User:CN=a\\,b+UID=7,O=x"


def test_requested_client_auth_is_served_as_none(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    """grpc's Python API cannot ask for an optional client certificate (see tls.py)."""
    ca = str(pki.ca.cert_path)

    async def body(port: int, seen: Seen) -> None:
        assert await _call(port, channel_credentials(ca)) == b"ping"
        alice = channel_credentials(ca, str(pki.alice.cert_path), str(pki.alice.key_path))
        assert await _call(port, alice) == b"ping"

    with caplog.at_level(logging.WARNING, logger="kbroker.security.tls"):
        seen = run_against(server_tls(pki, "requested"), body)
    assert "ssl.client.auth=requested is served as none" in caplog.text
    assert [tls.mtls_principal(c) for c in seen.auth_contexts] == [None, None]


def test_rotation_new_handshakes_use_the_replaced_files(pki: Pki, tmp_path: Path) -> None:
    keystore = tmp_path / "broker.keystore.pem"
    keystore.write_bytes(pki.server.keystore_path.read_bytes())
    new_ca = certs.make_ca(tmp_path / "new-ca", "new CA")
    new_cert = certs.issue(new_ca, tmp_path / "new", "broker", "CN=broker", client=False)
    old_trust, new_trust = str(pki.ca.cert_path), str(new_ca.cert_path)
    server = server_tls(pki, keystore=str(keystore))

    async def body(port: int, seen: Seen) -> None:
        assert await _call(port, channel_credentials(old_trust)) == b"ping"
        await refused(port, channel_credentials(new_trust))
        # a half-written file is not taken: the old certificate stays in use
        certs.write_atomic(keystore, new_cert.cert_path.read_bytes())
        assert await _call(port, channel_credentials(old_trust)) == b"ping"
        assert server.reloads == 0
        certs.write_atomic(keystore, new_cert.keystore_path.read_bytes())
        assert await _call(port, channel_credentials(new_trust)) == b"ping"
        await refused(port, channel_credentials(old_trust))
        assert server.reloads == 1

    run_against(server, body)


def test_rotation_of_the_trust_store(pki: Pki, tmp_path: Path) -> None:
    trust = tmp_path / "truststore.pem"
    trust.write_bytes(pki.ca.cert_path.read_bytes())
    server = tls.ServerTls(
        tls.SslConfig(
            keystore_location=str(pki.server.keystore_path), truststore_location=str(trust), client_auth="required"
        )
    )
    ca = str(pki.ca.cert_path)

    async def body(port: int, seen: Seen) -> None:
        mallory = channel_credentials(ca, str(pki.mallory.cert_path), str(pki.mallory.key_path))
        await refused(port, mallory)
        certs.write_atomic(trust, pki.ca.cert_path.read_bytes() + pki.foreign_ca.cert_path.read_bytes())
        mallory = channel_credentials(ca, str(pki.mallory.cert_path), str(pki.mallory.key_path))
        assert await _call(port, mallory) == b"ping"

    run_against(server, body)


def test_encrypted_key_with_ssl_key_password(pki: Pki, tmp_path: Path) -> None:
    enc = certs.issue(pki.ca, tmp_path, "broker", "CN=broker", key_password="s3cret")
    assert b"ENCRYPTED PRIVATE KEY" in enc.keystore_path.read_bytes()
    with pytest.raises(InvalidConfigError, match=r"the private key is encrypted: set ssl\.key\.password"):
        tls.ServerTls(tls.SslConfig(keystore_location=str(enc.keystore_path)))
    with pytest.raises(InvalidConfigError, match=r"wrong ssl\.key\.password"):
        tls.ServerTls(tls.SslConfig(keystore_location=str(enc.keystore_path), key_password="nope"))
    with pytest.raises(InvalidConfigError, match=r"ssl\.key\.password is set but the private key is not encrypted"):
        tls.ServerTls(tls.SslConfig(keystore_location=str(pki.server.keystore_path), key_password="x"))
    server = tls.ServerTls(tls.SslConfig(keystore_location=str(enc.keystore_path), key_password="s3cret"))
    client = certs.issue(pki.ca, tmp_path, "client", "CN=client", sans=(), server=False, key_password="pw")

    async def body(port: int, seen: Seen) -> None:
        creds = channel_credentials(str(pki.ca.cert_path), str(client.cert_path), str(client.key_path), "pw")
        assert await _call(port, creds) == b"ping"

    run_against(server, body)
    with pytest.raises(InvalidConfigError, match="ssl_password"):
        channel_credentials(str(pki.ca.cert_path), str(client.cert_path), str(client.key_path))


def test_inline_pem_as_a_properties_file_gives_it(pki: Pki) -> None:
    """``ssl.keystore.certificate.chain`` / ``ssl.keystore.key`` on one line each, as a
    ``\\``-continued properties value arrives, and ``listener.name.<l>.`` overrides."""

    def one_line(pem: bytes) -> str:
        return " ".join(pem.decode().split("\n")).strip()

    props = {
        "ssl.keystore.location": "/elsewhere/keystore.pem",
        "ssl.truststore.certificates": one_line(pki.ca.cert_path.read_bytes()),
        "listener.name.internal.ssl.keystore.certificate.chain": one_line(pki.server.cert_path.read_bytes()),
        "listener.name.internal.ssl.keystore.key": one_line(pki.server.key_path.read_bytes()),
        "listener.name.internal.ssl.client.auth": "REQUIRED",
    }
    assert tls.SslConfig.for_listener(props, "EXTERNAL").keystore_location == "/elsewhere/keystore.pem"
    assert tls.SslConfig.for_listener(props, "EXTERNAL").client_auth == "none"
    cfg = tls.SslConfig.for_listener({k: v for k, v in props.items() if k != "ssl.keystore.location"}, "INTERNAL")
    assert cfg.client_auth == "required" and cfg.keystore_certificate_chain and cfg.keystore_key
    ca = str(pki.ca.cert_path)

    async def body(port: int, seen: Seen) -> None:
        alice = channel_credentials(ca, str(pki.alice.cert_path), str(pki.alice.key_path))
        assert await _call(port, alice) == b"ping"

    seen = run_against(tls.ServerTls(cfg, "INTERNAL"), body)
    assert tls.mtls_principal(seen.auth_contexts[0]) == f"User:{ALICE}"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: tls.SslConfig(keystore_location=str(p.root / "missing.pem")), "ssl.keystore.location: cannot read"),
        (lambda p: tls.SslConfig(keystore_location=str(p.server.cert_path)), "expected one private key, found 0"),
        (lambda p: tls.SslConfig(keystore_location=str(p.server.key_path)), "no certificate"),
        (
            lambda p: tls.SslConfig(keystore_location=str(p.server.keystore_path), client_auth="required"),
            "ssl.client.auth=required needs ssl.truststore",
        ),
        (
            lambda p: tls.SslConfig(
                keystore_certificate_chain=p.server.cert_path.read_text(), keystore_key=p.alice.key_path.read_text()
            ),
            "the private key does not match the first certificate",
        ),
    ],
)
def test_bad_stores_fail_at_start_with_the_key_named(
    pki: Pki, make: Callable[[Pki], tls.SslConfig], message: str
) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        tls.ServerTls(make(pki))


def test_pem_blocks_rewrap_one_line_pem(pki: Pki) -> None:
    pem = pki.ca.cert_path.read_bytes()
    squashed = b" ".join(pem.split(b"\n"))
    assert pem_blocks(squashed) == [(b"CERTIFICATE", pem)]


def test_add_listener_port_binds_plaintext_and_tls_listeners(pki: Pki) -> None:
    props = {
        "ssl.keystore.location": str(pki.alice.keystore_path),  # not a server certificate
        "listener.name.internal.ssl.keystore.location": str(pki.server.keystore_path),
        "listener.name.internal.ssl.truststore.location": str(pki.ca.cert_path),
        "listener.name.internal.ssl.client.auth": "required",
    }
    broker = certs.issue(pki.ca, pki.root / "certs", "broker-both", "CN=broker-1,OU=brokers")
    peer_props = {"ssl.keystore.location": str(broker.keystore_path), "ssl.truststore.location": str(pki.ca.cert_path)}

    async def main() -> None:
        seen = Seen()

        async def echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            seen.auth_contexts.append(dict(context.auth_context()))
            return request

        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler("t.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
        server.add_generic_rpc_handlers((handler,))
        plain = tls.add_listener_port(server, EndPoint("PLAINTEXT", "127.0.0.1", 0, "PLAINTEXT"), props)
        internal = tls.add_listener_port(server, EndPoint("INTERNAL", "127.0.0.1", 0, "SSL"), props)
        await server.start()
        try:
            assert plain != internal
            assert await _call(plain, None) == b"ping"
            await refused(internal, None)
            await refused(internal, channel_credentials(str(pki.ca.cert_path)))
            assert await _call(internal, tls.broker_channel_credentials(peer_props, "INTERNAL")) == b"ping"
        finally:
            await server.stop(0)
        assert tls.mtls_principal(seen.auth_contexts[0]) is None
        assert tls.mtls_principal(seen.auth_contexts[1]) == "User:CN=broker-1,OU=brokers"

    asyncio.run(main())


def test_certs_command_makes_a_ca_once_and_issues(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert certs.main([str(tmp_path), "broker"]) == 0
    ca_pem = (tmp_path / "ca.pem").read_bytes()
    assert certs.main([str(tmp_path), "alice", "--subject", "CN=alice,OU=eng", "--client-only"]) == 0
    assert (tmp_path / "ca.pem").read_bytes() == ca_pem  # the CA is reused
    assert "subject:  CN=alice,OU=eng" in capsys.readouterr().out
    server = tls.ServerTls(
        tls.SslConfig(
            keystore_location=str(tmp_path / "broker.keystore.pem"),
            truststore_location=str(tmp_path / "ca.pem"),
            client_auth="required",
        )
    )
    ca = str(tmp_path / "ca.pem")

    async def body(port: int, seen: Seen) -> None:
        alice = channel_credentials(ca, str(tmp_path / "alice.pem"), str(tmp_path / "alice-key.pem"))
        assert await _call(port, alice) == b"ping"

    seen = run_against(server, body)
    assert tls.mtls_principal(seen.auth_contexts[0]) == "User:CN=alice,OU=eng"
