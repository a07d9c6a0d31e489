"""TLS contexts of the Kafka door (kbroker.doors.kafka.tls): client auth as Kafka means it
(required / requested / none), the peer's DN as the principal, and key stores re-read
for new handshakes when their files change."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from kbroker.doors.kafka.tls import ListenerTls, peer_principal
from kbroker.security import certs
from kbroker.security.principal import ANONYMOUS, KafkaPrincipal
from kbroker.security.tls import SslConfig


class Pki:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = certs.make_ca(root)
        self.broker = certs.issue(self.ca, root, "broker", "CN=broker-one")
        self.client = certs.issue(self.ca, root, "client", "CN=alice,OU=eng,O=kbroker")

    def listener(self, client_auth: str) -> ListenerTls:
        return ListenerTls(
            SslConfig(
                keystore_location=str(self.broker.keystore_path),
                truststore_location=str(self.ca.cert_path),
                client_auth=client_auth,
            ),
            "KSSL",
        )


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


def _client_context(pki: Pki, with_cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert_path))
    ctx.check_hostname = False
    if with_cert:
        ctx.load_cert_chain(str(pki.client.cert_path), str(pki.client.key_path))
    return ctx


def _connect(tls: ListenerTls, client: ssl.SSLContext) -> tuple[KafkaPrincipal | None, str]:
    """(the principal the server saw, the subject of the server's certificate)."""

    async def run() -> tuple[KafkaPrincipal | None, str]:
        seen: list[KafkaPrincipal] = []

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(peer_principal(writer))
            writer.write(b"ok")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=tls.context)
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            await reader.read(2)
            writer.close()
        finally:
            server.close()
            await server.wait_closed()
        return (seen[0] if seen else None), x509.load_der_x509_certificate(der).subject.rfc4514_string()

    return asyncio.run(run())


def test_required_client_auth_gives_the_certificate_dn(pki: Pki) -> None:
    tls = pki.listener("required")
    principal, _ = _connect(tls, _client_context(pki, with_cert=True))
    assert principal == KafkaPrincipal.parse("User:CN=alice,OU=eng,O=kbroker")
    try:  # TLS 1.3: the client may finish its side before the server refuses it
        refused, _ = _connect(tls, _client_context(pki, with_cert=False))
    except (ssl.SSLError, ConnectionError):
        refused = None
    assert refused is None  # the server never accepted the connection


def test_requested_client_auth_accepts_a_client_without_certificate(pki: Pki) -> None:
    tls = pki.listener("requested")
    assert _connect(tls, _client_context(pki, with_cert=False))[0] == ANONYMOUS
    assert _connect(tls, _client_context(pki, with_cert=True))[0] == KafkaPrincipal.parse(
        "User:CN=alice,OU=eng,O=kbroker"
    )


def test_none_never_asks_for_a_certificate(pki: Pki) -> None:
    assert _connect(pki.listener("none"), _client_context(pki, with_cert=True))[0] == ANONYMOUS


def test_a_rotated_key_store_serves_new_handshakes(pki: Pki) -> None:
    tls = pki.listener("required")
    assert _connect(tls, _client_context(pki, with_cert=True))[1] == "CN=broker-one"
    certs.issue(pki.ca, pki.root, "broker", "CN=broker-two")  # replaces the key store file atomically
    principal, served = _connect(tls, _client_context(pki, with_cert=True))
    assert served == "CN=broker-two" and tls.reloads == 1
    assert principal == KafkaPrincipal.parse("User:CN=alice,OU=eng,O=kbroker")

    pki.broker.keystore_path.write_text("not a key store")  # a broken file: the old context stays
    assert _connect(tls, _client_context(pki, with_cert=True))[1] == "CN=broker-two"
