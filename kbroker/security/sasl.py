"""The server side of SASL over gRPC (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) and the session
tokens a client carries afterwards.

gRPC calls are unary and carry no connection state, so an exchange is tied together by
an ``exchange_id`` (Kafka ties it to the connection)::

    SaslHandshake(mechanism)                       -> enabled mechanisms of this listener
    SaslAuthenticate(mechanism, client-first, "")  -> server-first, exchange_id     (SCRAM)
    SaslAuthenticate(mechanism, client-final, id)  -> server-final, session token, lifetime
    SaslAuthenticate("PLAIN", "\\0user\\0password", "") -> b"", session token, lifetime

Later calls send the token (metadata ``kbroker-session``); :meth:`SessionStore.lookup`
turns it into the caller's :class:`KafkaPrincipal`. Tokens live in this broker's memory
only, expire after ``connections.max.reauth.ms``, and are revoked when the user's
credentials change or are deleted (``CredentialStore(on_user_changed=sessions.revoke_user)``).

Channel binding: a token is bound to the connection whose SaslAuthenticate completed the
exchange, and a call on any other connection that carries it is refused
(:class:`SessionBindingError`, SASL_AUTHENTICATION_FAILED, UNAUTHENTICATED on gRPC), so a
token seen in one call's metadata cannot be replayed from another connection. A SCRAM
exchange in progress is bound the same way: its next message is taken only from the
connection it started on, so one who sees an ``exchange_id`` can neither end the
client's login nor finish it (a replayed client-final) on their own connection. Kafka ties
authentication to the connection; gRPC calls carry no connection, and grpcio gives a
servicer neither the TLS exporter (RFC 5705/9266) nor the TLS session, only
``context.peer()`` (``ipv4:<client ip>:<client port>``, one TCP connection while it is
open) and ``context.auth_context()`` (on TLS: the verified client certificate, if any).
:func:`channel_binding` is therefore listener + peer address and port + a digest of the
client certificate. What this does not stop is written in docs/security.md ("SASL: SCRAM
users and session tokens").

Listener rules: SASL is served on ``SASL_PLAINTEXT`` and ``SASL_SSL`` listeners only
(elsewhere ILLEGAL_SASL_STATE, as Kafka answers a SaslHandshake on a non-SASL listener);
PLAIN only on ``SASL_SSL`` (it carries the password). PLAIN is checked against the user's
SCRAM credential (SCRAM-SHA-512, else SCRAM-SHA-256) by recomputing its salted keys.

Errors (kclient.errors, each with its ``errno``): SaslAuthenticationFailedError 58 (wrong
credentials, unknown user, malformed message), UnsupportedSaslMechanismError 33 (mechanism
not enabled on this listener; PLAIN off SASL_SSL), IllegalSaslStateError 34 (unknown or
expired exchange, another mechanism or listener than the exchange's, SASL on a non-SASL
listener).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kbroker.security.principal import KafkaPrincipal
from kclient.errors import (
    IllegalSaslStateError,
    InvalidConfigError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)
from kclient.scram import (
    ScramCredential,
    ScramError,
    ScramMechanism,
    ScramServer,
    password_matches,
)

log = logging.getLogger(__name__)

PLAIN = "PLAIN"
SUPPORTED_MECHANISMS = (PLAIN, ScramMechanism.SCRAM_SHA_256.value, ScramMechanism.SCRAM_SHA_512.value)
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SASL_SSL = "SASL_SSL"
SASL_PROTOCOLS = (SASL_PLAINTEXT, SASL_SSL)

DEFAULT_EXCHANGE_TIMEOUT_MS = 30_000
DEFAULT_MAX_EXCHANGES = 10_000
DEFAULT_MAX_REAUTH_MS = 3_600_000
"""``connections.max.reauth.ms`` here (Kafka's default 0 means never; a token needs a bound)."""


def invalid_credentials_message(mechanism: str) -> str:
    """Kafka's message for a refused SASL exchange."""
    return f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"


def check_mechanisms(enabled: Iterable[str]) -> list[str]:
    """``sasl.enabled.mechanisms`` checked (deduplicated, in order); InvalidConfigError if one
    is not supported here (GSSAPI and OAUTHBEARER are not)."""
    out: list[str] = []
    for name in enabled:
        name = name.strip()
        if not name:
            continue
        if name not in SUPPORTED_MECHANISMS:
            raise InvalidConfigError(
                f"sasl.enabled.mechanisms: {name} is not supported; supported: {', '.join(SUPPORTED_MECHANISMS)}"
            )
        if name not in out:
            out.append(name)
    return out


# --- sessions ----------------------------------------------------------------------------


def channel_binding(listener: str, peer: str, auth_context: Mapping[str, Sequence[bytes]] | None = None) -> str:
    """What a gRPC call's session token is bound to: ``<listener>|<peer>[|x509:<sha256>]``.

    ``peer`` is ``ServicerContext.peer()`` (``ipv4:127.0.0.1:53412``: the client end of
    the TCP connection the call came on; grpcio exposes nothing finer, see the module
    docstring). ``auth_context`` is ``ServicerContext.auth_context()``: with a verified
    client certificate (mTLS) its SHA-256 is part of the binding too, so a client
    reusing a closed connection's address and port must also hold that certificate.
    """
    binding = f"{listener}|{peer}"
    pems = (auth_context or {}).get("x509_pem_cert")
    if pems:
        binding += "|x509:" + hashlib.sha256(bytes(pems[0])).hexdigest()
    return binding


def binding_peer(binding: str) -> str:
    """The peer part of a :func:`channel_binding` (for log lines; never a secret)."""
    parts = binding.split("|")
    return parts[1] if len(parts) > 1 else binding


class SessionBindingError(SaslAuthenticationFailedError):
    """A live session token came on another connection than the one it was issued on
    (a replayed token, or the client's connection was re-established): authenticate
    again on this connection."""


@dataclass(frozen=True)
class Session:
    principal: KafkaPrincipal
    mechanism: str
    expires_at: float
    """On the store's clock (monotonic seconds)."""
    binding: str = ""
    """The connection the session belongs to (:func:`channel_binding`); "" for one made
    outside a gRPC call (the Kafka door, which revokes it at once: the connection is the
    session there)."""
    credential: object = None
    """The credential the user authenticated with: a change notification that leaves it
    current (the notification of its own creation, read late) keeps the session."""


class SessionStore:
    """Session token -> (principal, mechanism, expiry), in memory.

    Tokens are 32 random bytes, URL-safe base64 (43 characters). A session expires
    ``max_reauth_ms`` after it was made (``connections.max.reauth.ms``); an expired token
    looks up as None and is purged at the latest a minute later.

    Thread-safe: one lock around the map. :meth:`revoke_user` and :meth:`create` exclude
    each other, which :class:`SaslAuthenticator` relies on to close the race between an
    exchange finishing and the user's credential changing.
    """

    PURGE_INTERVAL_S = 60.0

    def __init__(self, max_reauth_ms: int = DEFAULT_MAX_REAUTH_MS, *, clock: Callable[[], float] = time.monotonic):
        if max_reauth_ms <= 0:
            raise InvalidConfigError(f"connections.max.reauth.ms must be positive here, got {max_reauth_ms}")
        self.max_reauth_ms = max_reauth_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._next_purge = clock() + self.PURGE_INTERVAL_S

    def create(
        self, principal: KafkaPrincipal, mechanism: str, binding: str = "", credential: object = None
    ) -> tuple[str, int]:
        """A new session bound to ``binding`` (:func:`channel_binding`), made with
        ``credential``; (token, lifetime in ms)."""
        token = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            if now >= self._next_purge:
                self._purge(now)
            self._sessions[token] = Session(
                principal, mechanism, now + self.max_reauth_ms / 1000.0, binding, credential
            )
        return token, self.max_reauth_ms

    def session(self, token: str) -> Session | None:
        """The live session of ``token``; None if unknown, expired or revoked."""
        now = self._clock()
        with self._lock:
            found = self._sessions.get(token)
            if found is None:
                return None
            if now >= found.expires_at:
                del self._sessions[token]
                return None
            return found

    def lookup(self, token: str, binding: str = "") -> KafkaPrincipal | None:
        """The principal of a live session token presented on the connection ``binding``;
        None if the token is unknown, expired or revoked.

        SessionBindingError if the session is live but bound to another connection. The
        session is not revoked then: whoever sees a token on a plaintext listener could
        otherwise log its owner out at will; it stays usable on its own connection only.
        """
        found = self.session(token)
        if found is None:
            return None
        if found.binding != binding:
            log.info(
                "refused the SASL session token of %s issued to %s: presented by %s",
                found.principal,
                binding_peer(found.binding) or "no connection",
                binding_peer(binding) or "no connection",
            )
            raise SessionBindingError(
                "the session token was issued on another connection (a replayed token, or this client "
                "reconnected): authenticate again on this connection"
            )
        return found.principal

    def revoke(self, token: str) -> bool:
        with self._lock:
            return self._sessions.pop(token, None) is not None

    def revoke_user(self, user: str, current: Callable[[], Iterable[object]] = tuple) -> int:
        """End every session of ``User:<user>`` made with a credential not among ``current()``
        (the user's credentials now; none: every session ends); how many ended."""
        still = list(current())
        with self._lock:
            gone = [
                t
                for t, s in self._sessions.items()
                if s.principal.type == "User" and s.principal.name == user and s.credential not in still
            ]
            for token in gone:
                del self._sessions[token]
        if gone:
            log.info("revoked %d SASL session(s) of user %r", len(gone), user)
        return len(gone)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _purge(self, now: float) -> None:
        for token in [t for t, s in self._sessions.items() if now >= s.expires_at]:
            del self._sessions[token]
        self._next_purge = now + self.PURGE_INTERVAL_S


# --- the exchange --------------------------------------------------------------------------

CredentialLookup = Callable[[str, ScramMechanism], ScramCredential | None]
"""(user, mechanism) -> credential or None; e.g. ``CredentialStore.lookup``."""


class SaslResult(NamedTuple):
    """One SaslAuthenticate answer. ``session_token`` is set when the exchange completed."""

    auth_bytes: bytes
    exchange_id: str
    session_token: str | None
    session_lifetime_ms: int


@dataclass
class _Exchange:
    server: ScramServer
    listener_protocol: str
    deadline: float
    binding: str = ""
    """The connection the exchange started on (:func:`channel_binding`): only a message
    from that connection continues it."""


class SaslAuthenticator:
    """Runs SASL exchanges for one broker (Kafka's ``SaslServerAuthenticator``).

    ``enabled_mechanisms`` is ``sasl.enabled.mechanisms``; ``lookup`` finds a user's SCRAM
    credential; completed exchanges get a token from ``sessions``. A SCRAM exchange in
    progress is kept ``exchange_timeout_ms`` (30 s) after its last message, at most
    ``max_exchanges`` at once (the oldest are dropped).

    Thread-safe: an exchange is taken out of the table while one of its messages is
    handled, so a concurrent message of the same exchange gets ILLEGAL_SASL_STATE.
    """

    def __init__(
        self,
        *,
        enabled_mechanisms: Iterable[str],
        lookup: CredentialLookup,
        sessions: SessionStore,
        exchange_timeout_ms: int = DEFAULT_EXCHANGE_TIMEOUT_MS,
        max_exchanges: int = DEFAULT_MAX_EXCHANGES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled_mechanisms = check_mechanisms(enabled_mechanisms)
        self._lookup = lookup
        self.sessions = sessions
        self._timeout_s = exchange_timeout_ms / 1000.0
        self._max_exchanges = max_exchanges
        self._clock = clock
        self._lock = threading.Lock()
        self._exchanges: OrderedDict[str, _Exchange] = OrderedDict()

    def mechanisms(self, listener_protocol: str) -> list[str]:
        """The mechanisms a client may use on a listener of this security protocol."""
        if listener_protocol not in SASL_PROTOCOLS:
            return []
        return [m for m in self.enabled_mechanisms if m != PLAIN or listener_protocol == SASL_SSL]

    def handshake(self, mechanism: str, listener_protocol: str) -> list[str]:
        """SaslHandshake: the listener's mechanisms if ``mechanism`` is among them, else
        UnsupportedSaslMechanismError (answer :meth:`mechanisms` with it); IllegalSaslStateError
        off SASL listeners."""
        self._check_listener(listener_protocol)
        allowed = self.mechanisms(listener_protocol)
        if mechanism not in allowed:
            if mechanism == PLAIN and mechanism in self.enabled_mechanisms:
                why = f"PLAIN is accepted only on {SASL_SSL} listeners, not on {listener_protocol}"
            else:
                why = f"Unsupported SASL mechanism {mechanism}; enabled: {', '.join(allowed)}"
            raise UnsupportedSaslMechanismError(why)
        return allowed

    def authenticate(
        self, mechanism: str, exchange_id: str, auth_bytes: bytes, listener_protocol: str, binding: str = ""
    ) -> SaslResult:
        """SaslAuthenticate: one client message of an exchange (``exchange_id`` "" starts one).

        ``binding`` (:func:`channel_binding` of the call) is the connection the session
        token, once issued, is valid on. Raises SaslAuthenticationFailedError,
        UnsupportedSaslMechanismError or IllegalSaslStateError; a failed exchange is over
        (start again).
        """
        self.handshake(mechanism, listener_protocol)
        if mechanism == PLAIN:
            if exchange_id:
                raise IllegalSaslStateError("PLAIN takes a single SaslAuthenticate without an exchange id")
            return self._plain(auth_bytes, binding)
        scram = ScramMechanism(mechanism)
        if exchange_id:
            exchange = self._take(exchange_id, scram, listener_protocol, binding)
        else:
            exchange_id = secrets.token_urlsafe(16)
            server = ScramServer(scram, lambda user: self._lookup(user, scram))
            exchange = _Exchange(server, listener_protocol, 0.0, binding)
        try:
            answer = exchange.server.evaluate(auth_bytes)
        except ScramError as exc:
            log.info("SASL %s authentication failed: %s", mechanism, exc)
            raise SaslAuthenticationFailedError(invalid_credentials_message(mechanism)) from None
        if not exchange.server.complete:
            exchange.deadline = self._clock() + self._timeout_s
            self._put(exchange_id, exchange)
            return SaslResult(answer, exchange_id, None, 0)
        server = exchange.server
        token, lifetime_ms = self._session(
            server.username, mechanism, server.credential, lambda: self._lookup(server.username, scram), binding
        )
        return SaslResult(answer, exchange_id, token, lifetime_ms)

    # --- PLAIN ---------------------------------------------------------------------------

    def _plain(self, auth_bytes: bytes, binding: str) -> SaslResult:
        failed = SaslAuthenticationFailedError("Authentication failed: Invalid username or password")
        try:
            authzid, user, password = auth_bytes.decode("utf-8").split("\0")
        except (UnicodeDecodeError, ValueError):
            raise SaslAuthenticationFailedError("Invalid SASL/PLAIN response: expected 3 tokens") from None
        if not user:
            raise SaslAuthenticationFailedError("Authentication failed: username not specified")
        if not password:
            raise SaslAuthenticationFailedError("Authentication failed: password not specified")
        if authzid and authzid != user:
            raise SaslAuthenticationFailedError(
                "Authentication failed: Client requested an authorization id that is different from username"
            )
        found = self._plain_credential(user)
        if found is None or not password_matches(found[0], found[1], password):
            log.info("SASL PLAIN authentication of user %r failed", user)
            raise failed
        token, lifetime_ms = self._session(user, PLAIN, found[1], lambda: self._plain_credential_only(user), binding)
        return SaslResult(b"", "", token, lifetime_ms)

    def _plain_credential(self, user: str) -> tuple[ScramMechanism, ScramCredential] | None:
        for scram in (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256):
            credential = self._lookup(user, scram)
            if credential is not None:
                return scram, credential
        return None

    def _plain_credential_only(self, user: str) -> ScramCredential | None:
        found = self._plain_credential(user)
        return None if found is None else found[1]

    # --- shared --------------------------------------------------------------------------

    def _session(
        self,
        user: str,
        mechanism: str,
        used: ScramCredential,
        current: Callable[[], ScramCredential | None],
        binding: str,
    ) -> tuple[str, int]:
        """A session for ``user`` bound to ``binding``, unless the credential changed while
        the exchange ran.

        The session is made first and the credential re-read after: a change notified
        before the re-read is seen by it, one notified after revokes the new session.
        """
        token, lifetime_ms = self.sessions.create(KafkaPrincipal.user(user), mechanism, binding, used)
        if current() != used:
            self.sessions.revoke(token)
            log.info("SASL %s authentication of user %r refused: its credential changed meanwhile", mechanism, user)
            raise SaslAuthenticationFailedError(invalid_credentials_message(mechanism))
        return token, lifetime_ms

    def _check_listener(self, listener_protocol: str) -> None:
        if listener_protocol not in SASL_PROTOCOLS:
            raise IllegalSaslStateError(f"SASL authentication is not enabled on a {listener_protocol} listener")

    def _take(self, exchange_id: str, mechanism: ScramMechanism, listener_protocol: str, binding: str) -> _Exchange:
        """The exchange ``exchange_id``, taken out of the table, if ``binding`` is the
        connection it started on. A message from any other connection leaves it in place
        (one who saw the exchange id can neither end the client's login nor finish it on
        their own connection: the session token would be bound there)."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            exchange = self._exchanges.get(exchange_id)
            if exchange is not None and secrets.compare_digest(exchange.binding, binding):
                del self._exchanges[exchange_id]
            elif exchange is not None:
                log.info(
                    "SASL exchange continued from %s, not the connection it started on (%s): refused",
                    binding_peer(binding),
                    binding_peer(exchange.binding),
                )
                raise IllegalSaslStateError("The SASL exchange was started on another connection; start a new one")
        if exchange is None:
            raise IllegalSaslStateError("Unknown or expired SASL exchange; start a new one")
        if exchange.server.mechanism is not mechanism or exchange.listener_protocol != listener_protocol:
            raise IllegalSaslStateError("The SASL exchange was started with another mechanism or on another listener")
        return exchange

    def _put(self, exchange_id: str, exchange: _Exchange) -> None:
        with self._lock:
            self._expire(exchange.deadline - self._timeout_s)
            while len(self._exchanges) >= self._max_exchanges:
                self._exchanges.popitem(last=False)
            self._exchanges[exchange_id] = exchange

    def _expire(self, now: float) -> None:
        # Insertion order is deadline order (every deadline is now + the same timeout).
        while self._exchanges:
            first = next(iter(self._exchanges.values()))
            if first.deadline > now:
                break
            self._exchanges.popitem(last=False)

    def pending_exchanges(self) -> int:
        with self._lock:
            return len(self._exchanges)
