"""Who is calling: the authenticated principal, the listener and the client host of the
RPC being served (Kafka's ``RequestContext``), and how a call gets one.

Each listener's :class:`ListenerAuthenticator` decides the principal before a handler
runs (:mod:`kbroker.doors.grpc.server` calls it for every call):

- ``PLAINTEXT``: ``User:ANONYMOUS``;
- ``SSL``: ``User:<subject DN>`` of a verified client certificate, else ``User:ANONYMOUS``;
- ``SASL_PLAINTEXT`` / ``SASL_SSL``: the principal of the session token in the call's
  ``kbroker-session`` metadata; without a valid one only SaslHandshake and
  SaslAuthenticate are served, anything else fails with SASL_AUTHENTICATION_FAILED
  (Kafka serves nothing but the SASL requests on an unauthenticated SASL connection).
  A token is valid only on the connection it was issued on (``CallContext.channel``,
  :func:`kbroker.security.sasl.channel_binding`): one replayed from another connection
  is refused the same way.

The result lives in a context variable for the duration of the call: handlers and the
blocking work they offload (``GrpcServer.offload`` copies the context) read it with
:func:`current`. Thread safety: a context variable is per asyncio task / per copied
context; the authenticator's certificate cache is guarded by a lock.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kbroker.security.listeners import EndPoint
from kbroker.security.principal import ANONYMOUS, KafkaPrincipal
from kbroker.security.sasl import SessionBindingError, SessionStore, channel_binding
from kbroker.security.tls import mtls_principal
from kclient.errors import SaslAuthenticationFailedError

Offload = Callable[..., Awaitable[Any]]
"""Runs a blocking function on the request pool, in the call's context, and awaits it
(``GrpcServer.offload``): how a door runs the core's blocking requests."""

SESSION_METADATA_KEY = "kbroker-session"
SASL_METHODS = frozenset({"/kbroker.v1.Broker/SaslHandshake", "/kbroker.v1.Broker/SaslAuthenticate"})


@dataclass(frozen=True, slots=True)
class CallContext:
    principal: KafkaPrincipal
    listener: str
    security_protocol: str
    client_host: str = ""
    door: str = "grpc"
    """Which protocol the call came through: ``"grpc"`` or ``"kafka"`` (kafka.listeners)."""
    channel: str = ""
    """On a gRPC SASL listener, the connection the call came on
    (:func:`~kbroker.security.sasl.channel_binding`): a session token issued by this
    call's SaslAuthenticate is valid on it only. "" elsewhere."""


INTERNAL = CallContext(ANONYMOUS, "", "PLAINTEXT")
"""Outside any RPC (tests, tools calling handlers directly): anonymous on no listener."""

_CURRENT: contextvars.ContextVar[CallContext] = contextvars.ContextVar("kbroker_call", default=INTERNAL)


def current() -> CallContext:
    """The context of the RPC this code serves."""
    return _CURRENT.get()


def bind(call: CallContext) -> contextvars.Token[CallContext]:
    return _CURRENT.set(call)


def unbind(token: contextvars.Token[CallContext]) -> None:
    _CURRENT.reset(token)


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string (``ipv4:127.0.0.1:5555``, ``ipv6:[::1]:5555``)."""
    _, _, rest = peer.partition(":")
    host = rest.rsplit(":", 1)[0] if ":" in rest else rest
    return host.strip("[]")


class ListenerAuthenticator:
    """Authenticates the calls of one listener (see the module docstring)."""

    _CACHE_LIMIT = 1024

    def __init__(self, endpoint: EndPoint, sessions: SessionStore | None) -> None:
        self.endpoint = endpoint
        self._sessions = sessions
        self._lock = threading.Lock()
        self._by_certificate: dict[bytes, KafkaPrincipal] = {}

    def __call__(self, method: str, context: Any) -> CallContext:
        e = self.endpoint
        peer = context.peer() or ""
        channel = ""
        if e.uses_sasl:
            channel = channel_binding(e.listener_name, peer, context.auth_context() if e.uses_tls else None)
            principal = self._session_principal(method, context.invocation_metadata() or (), channel)
        elif e.uses_tls:
            principal = self._certificate_principal(context.auth_context())
        else:
            principal = ANONYMOUS
        return CallContext(principal, e.listener_name, e.security_protocol, peer_host(peer), channel=channel)

    def _session_principal(self, method: str, metadata: Sequence[Any], channel: str) -> KafkaPrincipal:
        token = next((str(m.value) for m in metadata if m.key == SESSION_METADATA_KEY), None)
        try:
            principal = self._sessions.lookup(token, channel) if token and self._sessions is not None else None
        except SessionBindingError:
            if method in SASL_METHODS:  # logging in again on this connection
                return ANONYMOUS
            raise
        if principal is not None:
            return principal
        if method in SASL_METHODS:
            return ANONYMOUS
        if token:
            raise SaslAuthenticationFailedError(
                "the session has expired or was revoked (credentials changed or deleted): authenticate again"
            )
        raise SaslAuthenticationFailedError(
            f"listener {self.endpoint.listener_name} ({self.endpoint.security_protocol}) needs SASL "
            "authentication (SaslHandshake, SaslAuthenticate) before any other request"
        )

    def _certificate_principal(self, auth: Mapping[str, Sequence[bytes]]) -> KafkaPrincipal:
        pems = auth.get("x509_pem_cert")
        if not pems:
            return ANONYMOUS
        key = bytes(pems[0])
        with self._lock:
            found = self._by_certificate.get(key)
        if found is None:
            name = mtls_principal(auth)
            found = KafkaPrincipal.parse(name) if name else ANONYMOUS
            with self._lock:
                if len(self._by_certificate) >= self._CACHE_LIMIT:
                    self._by_certificate.clear()
                self._by_certificate[key] = found
        return found
