"""TLS on the Kafka door: an ``ssl.SSLContext`` per SSL / SASL_SSL listener of
``kafka.listeners``, from the same ``listener.name.<l>.ssl.*`` / ``ssl.*`` settings and
PEM stores as the gRPC listeners (:mod:`kbroker.security.tls`), and the principal of a
connection's client certificate.

- ``ssl.client.auth``: ``required`` (a verified client certificate or no handshake),
  ``requested`` (asked for and verified when given; a client without one connects as
  ``User:ANONYMOUS`` or authenticates with SASL: Kafka's meaning, which Python's ``ssl``
  can express where gRPC's cannot), ``none``.
- Rotation: every ClientHello runs a callback that re-reads the key and trust stores when
  their files changed (:meth:`ServerTls.reload`) and hands the handshake a context built
  from the new ones; open connections keep theirs. Files that do not load are logged and
  the old context stays.
- Principal: ``User:<subject DN, RFC 2253 order>`` of the verified client certificate
  (:func:`kbroker.security.tls.certificate_principal`, as on gRPC), else ``User:ANONYMOUS``.

Thread safety: contexts are used on the loop thread; :class:`ServerTls` locks its reload.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import tempfile
from collections.abc import Mapping

from cryptography import x509

from kbroker.security.listeners import EndPoint
from kbroker.security.principal import ANONYMOUS, KafkaPrincipal
from kbroker.security.tls import KeyMaterial, ServerTls, SslConfig, certificate_principal

_VERIFY = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def server_context(material: KeyMaterial, client_auth: str) -> ssl.SSLContext:
    """A server-side context (TLS 1.2+) holding ``material``."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory(prefix="kbroker-tls-") as d:  # load_cert_chain reads files only
        path = os.path.join(d, "keystore.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(material.certificate_chain + material.private_key)
        ctx.load_cert_chain(path)
    if material.root_certificates is not None:
        ctx.load_verify_locations(cadata=material.root_certificates.decode("ascii"))
        ctx.verify_mode = _VERIFY.get(client_auth, ssl.CERT_NONE)
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class ListenerTls:
    """The TLS context of one Kafka listener, swapped for a new one when its files change."""

    def __init__(self, config: SslConfig, listener: str) -> None:
        self._tls = ServerTls(config, listener)
        self._client_auth = config.client_auth
        self.context = self._build(self._tls.material)

    @property
    def reloads(self) -> int:
        return self._tls.reloads

    def _build(self, material: KeyMaterial) -> ssl.SSLContext:
        ctx = server_context(material, self._client_auth)
        ctx.sni_callback = self._on_client_hello  # called with or without SNI
        return ctx

    def _on_client_hello(self, conn: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        material = self._tls.reload()
        if material is not None:
            self.context = self._build(material)
        if conn.context is not self.context:
            conn.context = self.context


def listener_contexts(
    endpoints: tuple[EndPoint, ...] | list[EndPoint], props: Mapping[str, str]
) -> dict[str, ListenerTls]:
    """A :class:`ListenerTls` per TLS endpoint (``props``: ``BrokerConfig.security_props``);
    an InvalidConfigError names a store that does not load."""
    return {
        e.listener_name: ListenerTls(SslConfig.for_listener(props, e.listener_name), e.listener_name)
        for e in endpoints
        if e.uses_tls
    }


def peer_principal(writer: asyncio.StreamWriter) -> KafkaPrincipal:
    """The principal of a TLS connection's verified client certificate, else ANONYMOUS."""
    sslobj = writer.get_extra_info("ssl_object")
    der = sslobj.getpeercert(binary_form=True) if sslobj is not None else None
    if not der:
        return ANONYMOUS
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        return ANONYMOUS
    return KafkaPrincipal.parse(certificate_principal(cert))
