"""TLS for gRPC listeners: PEM key and trust stores, rotation, and the mTLS principal.

Server side (one :class:`ServerTls` per SSL / SASL_SSL listener):

- key store: ``ssl.keystore.location``, one PEM file holding the certificate chain and
  the private key, or inline ``ssl.keystore.certificate.chain`` + ``ssl.keystore.key``;
  an encrypted key (PKCS#8 ``ENCRYPTED PRIVATE KEY``, or legacy OpenSSL) is decrypted
  with ``ssl.key.password``;
- trust store: ``ssl.truststore.location`` (PEM file of CA certificates) or inline
  ``ssl.truststore.certificates``: the CAs that sign client certificates;
- ``ssl.client.auth``: ``required`` asks for a client certificate, verifies it against
  the trust store and refuses the handshake without one; ``none`` never asks.
  ``requested`` (Kafka: ask, verify one if given, accept none) is **not expressible** in
  grpc's Python API: ``grpc.ssl_server_credentials`` and
  ``grpc.dynamic_ssl_server_credentials`` take one boolean, which the Cython layer maps to
  ``GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY`` (True) or
  ``GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE`` (False); C-core's
  ``GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY`` is never reachable. ``requested``
  therefore behaves as ``none`` (no client is refused; a client certificate is not asked
  for, so such a client is ``User:ANONYMOUS`` unless it authenticates with SASL), and a
  warning says so when the listener starts.

Rotation: the credentials are ``grpc.dynamic_ssl_server_credentials``; gRPC calls the
fetcher before every new TLS handshake, and the fetcher re-reads the key and trust store
files when one's (mtime, size, inode) changed. New handshakes then use the new files;
open connections keep their session. A file that does not load (half written, key not
matching the certificate) is logged once and the previous material stays in use. Inline
values never change.

Client side: ``kclient.tls.channel_credentials`` (kafka-python's ``ssl_*``, shared PEM
helpers); :func:`broker_channel_credentials` for a broker calling another broker.

Principal: :func:`mtls_principal` reads a call's ``auth_context()``: on TLS with a
verified client certificate it is ``User:<subject DN, RFC 2253 order>``
(``User:CN=alice,OU=eng,O=kbroker``), as Kafka's ``DefaultKafkaPrincipalBuilder``.

Thread safety: :class:`ServerTls` may be called from any gRPC thread (a lock guards the
reload state); everything else is a pure function.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from kbroker.security.listeners import EndPoint, listener_config
from kclient.errors import InvalidConfigError
from kclient.tls import decrypt_key, pem_blocks, read_file

log = logging.getLogger(__name__)

_KEY_LABELS = (b"PRIVATE KEY", b"ENCRYPTED PRIVATE KEY", b"RSA PRIVATE KEY", b"EC PRIVATE KEY")


@dataclass(frozen=True)
class SslConfig:
    """The ``ssl.*`` settings of one listener (Kafka's names, PEM only)."""

    keystore_location: str | None = None
    keystore_certificate_chain: str | None = None
    keystore_key: str | None = None
    key_password: str | None = None
    truststore_location: str | None = None
    truststore_certificates: str | None = None
    client_auth: str = "none"

    @classmethod
    def for_listener(cls, props: Mapping[str, str], listener: str) -> SslConfig:
        """The settings of ``listener``: ``listener.name.<listener>.ssl.*`` over ``ssl.*``
        (``props`` is ``BrokerConfig.security_props`` or raw Kafka-named properties)."""

        def get(key: str) -> str | None:
            return listener_config(props, listener, key)

        return cls(
            keystore_location=get("ssl.keystore.location"),
            keystore_certificate_chain=get("ssl.keystore.certificate.chain"),
            keystore_key=get("ssl.keystore.key"),
            key_password=get("ssl.key.password"),
            truststore_location=get("ssl.truststore.location"),
            truststore_certificates=get("ssl.truststore.certificates"),
            client_auth=(get("ssl.client.auth") or "none").strip().lower(),
        )

    @property
    def files(self) -> tuple[str, ...]:
        """The files whose change triggers a reload."""
        return tuple(p for p in (self.keystore_location, self.truststore_location) if p)

    @property
    def require_client_auth(self) -> bool:
        return self.client_auth == "required"


@dataclass(frozen=True)
class KeyMaterial:
    """What one load of the stores gives gRPC: PEM bytes, the key decrypted."""

    certificate_chain: bytes
    private_key: bytes
    root_certificates: bytes | None


def _split_keystore(data: bytes, where: str) -> tuple[bytes, bytes]:
    certs = [pem for label, pem in pem_blocks(data) if label == b"CERTIFICATE"]
    keys = [pem for label, pem in pem_blocks(data) if label in _KEY_LABELS]
    if not certs:
        raise InvalidConfigError(f"{where}: no certificate (-----BEGIN CERTIFICATE-----)")
    if len(keys) != 1:
        raise InvalidConfigError(f"{where}: expected one private key, found {len(keys)}")
    return b"".join(certs), keys[0]


def _certificates(data: bytes, where: str) -> bytes:
    certs = [pem for label, pem in pem_blocks(data) if label == b"CERTIFICATE"]
    if not certs:
        raise InvalidConfigError(f"{where}: no certificate (-----BEGIN CERTIFICATE-----)")
    for pem in certs:
        try:
            x509.load_pem_x509_certificate(pem)
        except ValueError:
            raise InvalidConfigError(f"{where}: a certificate cannot be parsed") from None
    return b"".join(certs)


def load_key_material(cfg: SslConfig) -> KeyMaterial:
    """Read and check the stores; an :class:`InvalidConfigError` names the key at fault."""
    if cfg.keystore_location:
        data = read_file(cfg.keystore_location, "ssl.keystore.location")
        chain, key_pem = _split_keystore(data, cfg.keystore_location)
    elif cfg.keystore_certificate_chain and cfg.keystore_key:
        chain = _certificates(cfg.keystore_certificate_chain.encode(), "ssl.keystore.certificate.chain")
        keys = [pem for label, pem in pem_blocks(cfg.keystore_key.encode()) if label in _KEY_LABELS]
        if len(keys) != 1:
            raise InvalidConfigError("ssl.keystore.key: expected one PEM private key")
        key_pem = keys[0]
    else:
        raise InvalidConfigError(
            "no key store: set ssl.keystore.location or ssl.keystore.certificate.chain and ssl.keystore.key"
        )
    chain = _certificates(chain, "ssl.keystore")
    private_key = decrypt_key(key_pem, cfg.key_password, "ssl.key.password")
    leaf = x509.load_pem_x509_certificate(pem_blocks(chain)[0][1])
    try:
        public = serialization.load_pem_private_key(private_key, None).public_key()
    except (TypeError, ValueError):
        raise InvalidConfigError("ssl.keystore: the private key cannot be read (not a PEM key)") from None
    raw = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if leaf.public_key().public_bytes(*raw) != public.public_bytes(*raw):
        raise InvalidConfigError("ssl.keystore: the private key does not match the first certificate of the chain")
    roots: bytes | None = None
    if cfg.truststore_location:
        roots = _certificates(read_file(cfg.truststore_location, "ssl.truststore.location"), cfg.truststore_location)
    elif cfg.truststore_certificates:
        roots = _certificates(cfg.truststore_certificates.encode(), "ssl.truststore.certificates")
    if cfg.require_client_auth and roots is None:
        raise InvalidConfigError(
            "ssl.client.auth=required needs ssl.truststore.location or ssl.truststore.certificates"
        )
    return KeyMaterial(chain, private_key, roots)


def _stamp(paths: Sequence[str]) -> tuple[tuple[int, int, int] | None, ...]:
    out: list[tuple[int, int, int] | None] = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


def _certificate_configuration(material: KeyMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(material.private_key, material.certificate_chain)], material.root_certificates
    )


class ServerTls:
    """gRPC server credentials for one TLS listener, re-reading its files when they change.

    The constructor loads the stores once (an :class:`InvalidConfigError` if they are
    wrong, so a broker fails at start-up). ``reloads`` counts the successful reloads.
    Thread safety: the fetcher runs on gRPC's threads; ``_lock`` guards the stamp.
    """

    def __init__(self, config: SslConfig, listener: str = "SSL") -> None:
        self.config = config
        self.listener = listener
        self.reloads = 0
        self._lock = threading.Lock()
        self._stamp = _stamp(config.files)
        self.material = load_key_material(config)

    def credentials(self) -> grpc.ServerCredentials:
        """Credentials for ``server.add_secure_port``; one object per port."""
        if self.config.client_auth == "requested":
            log.warning(
                "listener %s: ssl.client.auth=requested is served as none: grpc's Python API can only require a "
                "client certificate or not ask for one; clients authenticate with SASL or are User:ANONYMOUS",
                self.listener,
            )
        return grpc.dynamic_ssl_server_credentials(
            _certificate_configuration(self.material),
            self._fetch,
            require_client_authentication=self.config.require_client_auth,
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's certificate configuration fetcher: ``None`` keeps the current one."""
        material = self.reload()
        return None if material is None else _certificate_configuration(material)

    def reload(self) -> KeyMaterial | None:
        """The new key material if the files changed and load, else ``None`` (keep the
        current one). Called before every new TLS handshake (gRPC's fetcher, the Kafka
        door's ClientHello callback)."""
        stamp = _stamp(self.config.files)
        with self._lock:
            if stamp == self._stamp:
                return None
            self._stamp = stamp
            try:
                material = load_key_material(self.config)
            except Exception as exc:  # keep serving the previous material
                log.warning("listener %s: TLS files changed but do not load (%s); kept the old", self.listener, exc)
                return None
            self.material = material
            self.reloads += 1
        log.info("listener %s: reloaded TLS key and trust stores", self.listener)
        return material


def add_listener_port(server: grpc.aio.Server, endpoint: EndPoint, props: Mapping[str, str]) -> int:
    """Bind ``endpoint`` on ``server``: a TLS port with the listener's ``ssl.*`` settings
    (``props``: ``BrokerConfig.security_props``) for SSL and SASL_SSL, a plaintext one
    otherwise. Returns the bound port (the chosen one for port 0)."""
    host = f"[{endpoint.bind_host}]" if ":" in endpoint.bind_host else endpoint.bind_host
    address = f"{host}:{endpoint.port}"
    if endpoint.uses_tls:
        server_tls = ServerTls(SslConfig.for_listener(props, endpoint.listener_name), endpoint.listener_name)
        port = server.add_secure_port(address, server_tls.credentials())
    else:
        port = server.add_insecure_port(address)
    if not port:
        raise OSError(f"listener {endpoint.listener_name}: cannot bind {address}")
    return int(port)


def broker_channel_credentials(props: Mapping[str, str], listener: str) -> grpc.ChannelCredentials:
    """What a broker uses to call another broker's TLS listener ``listener`` (the
    inter-broker one): its own key store as the client certificate and its trust store
    as the roots (gRPC's default roots without one). Read once: a channel made after a
    rotation picks the new files up."""
    material = load_key_material(SslConfig.for_listener(props, listener))
    return grpc.ssl_channel_credentials(
        root_certificates=material.root_certificates,
        private_key=material.private_key,
        certificate_chain=material.certificate_chain,
    )


def mtls_principal(auth_context: Mapping[str, Sequence[bytes]]) -> str | None:
    """``User:<subject DN>`` of a TLS call's verified client certificate, else ``None``.

    ``auth_context`` is ``ServicerContext.auth_context()``. gRPC puts the peer's leaf
    certificate in ``x509_pem_cert`` only after verifying it; the DN is rendered from
    it with ``cryptography`` in RFC 2253 (4514) order, most specific first.
    """
    if list(auth_context.get("transport_security_type", ())) != [b"ssl"]:
        return None
    pems = auth_context.get("x509_pem_cert")
    if not pems:
        return None
    try:
        cert = x509.load_pem_x509_certificate(bytes(pems[0]))
    except ValueError:
        return None
    return certificate_principal(cert)


def certificate_principal(cert: x509.Certificate) -> str:
    """``User:<subject DN, RFC 2253 order>`` of a verified peer certificate (Kafka's
    ``DefaultKafkaPrincipalBuilder``), for both doors."""
    return f"User:{cert.subject.rfc4514_string()}"
