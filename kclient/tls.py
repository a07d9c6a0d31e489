"""Client TLS: gRPC channel credentials from PEM files (kafka-python's ``ssl_cafile``,
``ssl_certfile``, ``ssl_keyfile``, ``ssl_password``), and the name to verify a broker's
certificate against when ``ssl_check_hostname`` is off.

Only the standard library and grpc are needed, unless the private key is encrypted
(``ssl_password``): then ``cryptography`` decrypts it (gRPC takes unencrypted PEM only).

Hostname checks: gRPC always checks that the broker's certificate names the host the
channel targets, and its Python API cannot turn that off. ``ssl_check_hostname=False``
is served as close as gRPC allows: before the channel to a broker is made,
:func:`certificate_name` opens one TLS connection to it with Python's ``ssl``,
verifies the certificate chain against ``ssl_cafile`` (not the host name), and takes
a name the certificate holds (a DNS name of its subjectAltName, else an IP address, else
its CN); the channel then verifies against that name (``grpc.ssl_target_name_override``).
The chain is always verified: a certificate from another CA is still refused.

Thread safety: pure functions.
"""

from __future__ import annotations

import re
import socket
import ssl
from pathlib import Path
from typing import Any

import grpc

from kclient.errors import InvalidConfigError, KafkaConnectionError

_PEM = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.S)
_KEY_LABELS = (b"PRIVATE KEY", b"ENCRYPTED PRIVATE KEY", b"RSA PRIVATE KEY", b"EC PRIVATE KEY")


def pem_blocks(data: bytes) -> list[tuple[bytes, bytes]]:
    """Every ``-----BEGIN X-----`` block of ``data`` as (label, canonical PEM); legacy
    OpenSSL headers (``Proc-Type``/``DEK-Info``) are kept."""
    out = []
    for match in _PEM.finditer(data):
        label, body = match.group(1), match.group(2)
        headers = b""
        if b"Proc-Type:" in body:
            head, sep, rest = body.strip().partition(b"\n\n")
            headers, body = (head.strip() + b"\n\n", rest) if sep else (b"", body)
        b64 = b"".join(body.split())
        lines = b"\n".join(b64[i : i + 64] for i in range(0, len(b64), 64))
        out.append((label, b"-----BEGIN " + label + b"-----\n" + headers + lines + b"\n-----END " + label + b"-----\n"))
    return out


def read_file(path: str, key: str) -> bytes:
    """The bytes of ``path``; InvalidConfigError naming the setting ``key`` if unreadable."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidConfigError(f"{key}: cannot read {path}: {exc.strerror}") from None


def certificates(data: bytes, where: str) -> bytes:
    """The PEM certificates of ``data``; InvalidConfigError if there is none."""
    certs = [pem for label, pem in pem_blocks(data) if label == b"CERTIFICATE"]
    if not certs:
        raise InvalidConfigError(f"{where}: no certificate (-----BEGIN CERTIFICATE-----)")
    return b"".join(certs)


def _encrypted(pem: bytes) -> bool:
    return pem.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") or b"Proc-Type: 4,ENCRYPTED" in pem


def decrypt_key(pem: bytes, password: str | None, key: str = "ssl_password") -> bytes:
    """A PEM private key gRPC can load: as is when not encrypted, else decrypted with
    ``password`` (needs ``cryptography``)."""
    if not _encrypted(pem):
        if password:
            raise InvalidConfigError(f"{key} is set but the private key is not encrypted")
        return pem
    if not password:
        raise InvalidConfigError(f"the private key is encrypted: set {key}")
    try:
        from cryptography.hazmat.primitives import serialization
    except ImportError:  # pragma: no cover - cryptography is installed with kbroker
        raise InvalidConfigError(f"{key}: an encrypted private key needs the 'cryptography' package") from None
    try:
        loaded = serialization.load_pem_private_key(pem, password.encode())
    except (TypeError, ValueError):
        raise InvalidConfigError(f"the private key cannot be read (wrong {key}, or not a PEM key)") from None
    return loaded.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def client_key_pair(certfile: str, keyfile: str | None, password: str | None) -> tuple[bytes, bytes]:
    """(certificate chain, unencrypted private key) of the client certificate; the key
    comes from ``keyfile`` or, without one, from ``certfile`` itself (a keystore file)."""
    data = read_file(certfile, "ssl_certfile")
    chain = certificates(data, certfile)
    key_source = read_file(keyfile, "ssl_keyfile") if keyfile else data
    keys = [pem for label, pem in pem_blocks(key_source) if label in _KEY_LABELS]
    if len(keys) != 1:
        raise InvalidConfigError(f"{keyfile or certfile}: expected one PEM private key, found {len(keys)}")
    return chain, decrypt_key(keys[0], password)


def channel_credentials(
    cafile: str | None = None,
    certfile: str | None = None,
    keyfile: str | None = None,
    password: str | None = None,
) -> grpc.ChannelCredentials:
    """Client TLS credentials (kafka-python's ``ssl_cafile``, ``ssl_certfile``,
    ``ssl_keyfile``, ``ssl_password``).

    ``cafile`` ``None`` trusts gRPC's default roots. A client certificate is sent when
    ``certfile`` is given; its key comes from ``keyfile`` or, without one, from
    ``certfile`` itself (as Python's ``load_cert_chain``).
    """
    roots = certificates(read_file(cafile, "ssl_cafile"), cafile) if cafile else None
    if certfile is None:
        if keyfile is not None:
            raise InvalidConfigError("ssl_keyfile is set without ssl_certfile")
        return grpc.ssl_channel_credentials(root_certificates=roots)
    chain, key = client_key_pair(certfile, keyfile, password)
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=key, certificate_chain=chain)


def certificate_name(
    address: str,
    cafile: str | None,
    certfile: str | None = None,
    keyfile: str | None = None,
    password: str | None = None,
    timeout_s: float = 10.0,
) -> str:
    """A name the TLS certificate of the broker at ``address`` holds, its chain verified
    against ``cafile`` (system roots without one) but not its host name.

    KafkaConnectionError if the broker cannot be reached or its certificate is not
    trusted; the name preference is DNS subjectAltName, IP subjectAltName, CN.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    context = ssl.create_default_context(cafile=cafile)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    if certfile:
        context.load_cert_chain(certfile, keyfile, password)
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            with context.wrap_socket(sock, server_hostname=host) as tls:
                cert = tls.getpeercert()
    except ssl.SSLCertVerificationError as exc:
        raise KafkaConnectionError(f"broker {address}: TLS certificate not trusted: {exc.verify_message}") from None
    except (OSError, ssl.SSLError) as exc:
        raise KafkaConnectionError(f"broker {address}: TLS connection failed: {exc}") from None
    if not cert:
        raise KafkaConnectionError(f"broker {address} sent no TLS certificate")
    sans: Any = cert.get("subjectAltName", ())
    for kind in ("DNS", "IP Address"):
        for typ, value in sans:
            if typ == kind:
                return str(value).replace("*", "x", 1) if kind == "DNS" else str(value).strip()
    subject: Any = cert.get("subject", ())
    for rdn in subject:
        for attr, value in rdn:
            if attr == "commonName":
                return str(value)
    raise KafkaConnectionError(f"broker {address}: its TLS certificate names no host (no subjectAltName, no CN)")
