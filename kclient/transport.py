"""gRPC channels to brokers, and the one place where gRPC errors become kclient errors.

One channel per broker address, created on first use and shared by every request to
that broker (gRPC multiplexes calls on it). ``map_rpc_error`` is the boundary: a
``grpc.RpcError`` never escapes kclient.

Every channel (client, follower fetcher, inter-broker) is made with ``CHANNEL_OPTIONS``:
HTTP/2 keepalive pings find a dead TCP connection within ``keepalive_time +
keepalive_timeout`` (instead of TCP's retransmission backoff), and reconnect attempts
back off at most ``MAX_RECONNECT_BACKOFF_MS``. A channel whose call timed out
(DEADLINE_EXCEEDED) is closed and made again on next use, so a half-dead connection is
never reused. The servers must accept those pings: ``SERVER_KEEPALIVE_OPTIONS`` is what a
broker's ``grpc.server`` needs (without it the server answers a ping sent while a call
is silent with GOAWAY ``too_many_pings`` after three of them).

The transport also remembers when each broker last failed (connection error, timeout,
or a broker-side REQUEST_TIMED_OUT reported by the caller through ``mark_failed``):
``call_any`` asks the brokers that failed least recently first, rotating among the
healthy ones, so a Metadata refresh after a failure goes to another broker when there
is one (Kafka's least-loaded-node choice).

Security (:class:`~kclient.security.SecurityConfig`): SSL and SASL_SSL channels are
TLS channels (``grpc.secure_channel``, same options); on SASL_PLAINTEXT and SASL_SSL
every channel carries a :class:`~kclient.security.SessionInterceptor`, so each broker is
logged in to on its first call and every call (``call``, ``call_any``, and the stubs
callers use directly, ``.future`` included) sends the broker's session token.

Thread safety: safe from any thread.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import grpc

from kclient.errors import (
    BrokerResponseError,
    InvalidRequestError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NoBrokersAvailable,
    SaslAuthenticationFailedError,
    for_code,
)
from kclient.proto.kbroker.v1 import broker_pb2_grpc
from kclient.retry import retry
from kclient.security import (
    BrokerSession,
    LocalCallError,
    SaslSessionExpiredError,
    SecurityConfig,
    SessionInterceptor,
    sasl_login,
)

log = logging.getLogger(__name__)

ERROR_CODE_METADATA_KEY = "kbroker-error-code"

KEEPALIVE_TIME_MS = 10000
KEEPALIVE_TIMEOUT_MS = 5000
MAX_RECONNECT_BACKOFF_MS = 1000
KEEPALIVE_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
]
"""Keepalive and bounded reconnect backoff: part of every channel's options."""

CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", 128 * 1024 * 1024),
    # What a client sends is bounded by its own settings (max_request_size); the broker's
    # limit (socket.request.max.bytes) then decides, answered as MessageSizeTooLargeError.
    ("grpc.max_send_message_length", -1),
    ("grpc.enable_retries", 0),
    *KEEPALIVE_OPTIONS,
]
"""Options of every channel to a broker (kclient, the follower fetcher, inter-broker calls)."""

SERVER_KEEPALIVE_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
]
"""What a broker's ``grpc.server`` needs so the clients' keepalive pings are accepted."""


def parse_servers(servers: str | Iterable[str]) -> list[str]:
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = [s.strip() for s in items if s and s.strip()]
    if not out:
        raise KafkaError("bootstrap_servers is empty")
    for s in out:
        host, sep, port = s.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise KafkaError(f"bootstrap server {s!r} is not HOST:PORT")
    return out


def map_rpc_error(exc: grpc.RpcError, address: str) -> KafkaError:
    """Translate a failed gRPC call into the kclient exception tree.

    INVALID_ARGUMENT, PERMISSION_DENIED and UNAUTHENTICATED carry the Kafka error code in
    the trailing metadata ``kbroker-error-code``; UNAUTHENTICATED with
    SASL_AUTHENTICATION_FAILED (or no code) is a refused session token:
    :class:`~kclient.security.SaslSessionExpiredError` (retriable: the next call logs in).
    """
    if isinstance(exc, LocalCallError):
        return exc.error
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        trailing = dict(exc.trailing_metadata() or ()) if hasattr(exc, "trailing_metadata") else {}
        raw = trailing.get(ERROR_CODE_METADATA_KEY)
        if code == grpc.StatusCode.UNAUTHENTICATED and (not raw or int(raw) == SaslSessionExpiredError.errno):
            return SaslSessionExpiredError(details or f"broker {address} refused the SASL session")
        cls: type[BrokerResponseError] = for_code(int(raw)) if raw else InvalidRequestError
        return cls(details or "")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return KafkaTimeoutError(f"request to {address} timed out")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (details or ""):
        # gRPC's own message-size limit, on either side: the broker's is socket.request.max.bytes.
        return MessageSizeTooLargeError(f"request to {address} is too large: {details}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        tls_failure = _tls_failure(details or "")
        if tls_failure:
            return KafkaConnectionError(f"TLS handshake with broker {address} failed: {tls_failure}")
        return KafkaConnectionError(f"broker {address} is unavailable: {details}")
    return KafkaError(f"request to {address} failed: {code.name if code else '?'}: {details}")


def _tls_failure(details: str) -> str | None:
    """What a TLS handshake failure in ``details`` (gRPC's text) means, else None."""
    if "Hostname Verification Check failed" in details or "Peer name" in details:
        return (
            "the broker's certificate does not name the host dialled (connect by a name it holds, "
            "or set ssl_check_hostname=False)"
        )
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return (
            "the broker's certificate is not trusted (ssl_cafile must hold the CA that signed it): "
            + details.rsplit("CERTIFICATE_VERIFY_FAILED:", 1)[-1].strip().removesuffix(": OK")
        )
    if "handshake failed" in details.lower():
        return details.rsplit("ipv4:", 1)[-1] + " (is the listener TLS, and does it require a client certificate?)"
    return None


class Transport:
    """Stubs by broker address, and when each broker last failed.

    ``security`` ``None`` is PLAINTEXT. SASL sessions live as long as their channel: a
    dropped channel logs in again on its next call.
    """

    def __init__(
        self,
        bootstrap_servers: str | Iterable[str],
        request_timeout_ms: int = 30000,
        security: SecurityConfig | None = None,
    ) -> None:
        self.bootstrap = parse_servers(bootstrap_servers)
        self.request_timeout_s = request_timeout_ms / 1000.0
        self.security = security
        self._credentials = security.channel_credentials() if security is not None and security.uses_tls else None
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[grpc.Channel, broker_pb2_grpc.BrokerStub]] = {}
        self._sessions: dict[str, BrokerSession] = {}
        self._failed_at: dict[str, float] = {}
        self._rotation = itertools.count()
        self._closed = False

    def stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        with self._lock:
            if self._closed:
                raise KafkaError("client is closed")
            entry = self._channels.get(address)
            if entry is not None:
                return entry[1]
        channel, stub, session = self._open(address)  # outside the lock: it may connect (certificate_name)
        if channel is None:
            return stub  # fails every call; not cached, so the next call tries again
        with self._lock:
            entry = self._channels.get(address)
            if entry is None and not self._closed:
                self._channels[address] = entry = (channel, stub)
                if session is not None:
                    self._sessions[address] = session
                return stub
        channel.close()
        if entry is None:
            raise KafkaError("client is closed")
        return entry[1]

    def _open(self, address: str) -> tuple[grpc.Channel | None, broker_pb2_grpc.BrokerStub, BrokerSession | None]:
        """A new channel to ``address`` and its stub (and SASL session); channel None: the
        stub fails every call with why the channel cannot be made."""
        security = self.security
        if self._credentials is None or security is None:
            channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        else:
            options: list[tuple[str, Any]] = list(CHANNEL_OPTIONS)
            if not security.ssl_check_hostname:
                try:
                    name = security.certificate_name(address, self.request_timeout_s)
                except KafkaError as exc:
                    # Not cached: the next call looks again (the broker may be starting).
                    self.mark_failed(address)
                    return None, _failing_stub(exc), None
                options.append(("grpc.ssl_target_name_override", name))
            channel = grpc.secure_channel(address, self._credentials, options=options)
        if security is None or not security.uses_sasl:
            return channel, broker_pb2_grpc.BrokerStub(channel), None
        raw = broker_pb2_grpc.BrokerStub(channel)
        config = security

        def login_call(method: str, request: Any) -> Any:
            try:
                return getattr(raw, method)(request, timeout=self.request_timeout_s)
            except grpc.RpcError as exc:
                raise self.failed(address, exc) from None

        session = BrokerSession(address, lambda: sasl_login(login_call, config))
        intercepted = grpc.intercept_channel(channel, SessionInterceptor(session))
        return channel, broker_pb2_grpc.BrokerStub(intercepted), session

    def session(self, address: str) -> BrokerSession | None:
        """The SASL session with ``address`` (None before its channel is made, or without SASL)."""
        with self._lock:
            return self._sessions.get(address)

    def mark_failed(self, address: str) -> None:
        """``address`` failed a request: ``call_any`` asks the others first for a while."""
        with self._lock:
            self._failed_at[address] = time.monotonic()

    def failed(self, address: str, exc: BaseException) -> KafkaError:
        """Record a failed call to ``address`` (from ``call`` or a future) and map its error.

        A timed-out call drops the channel: the next call connects afresh instead of
        queueing behind a connection that may be dead.
        """
        if isinstance(exc, grpc.RpcError):
            err = map_rpc_error(exc, address)
        else:
            err = exc if isinstance(exc, KafkaError) else KafkaError(str(exc))
        if isinstance(err, SaslSessionExpiredError) and (self.security is None or not self.security.uses_sasl):
            protocol = self.security.security_protocol if self.security else "PLAINTEXT"
            err = SaslAuthenticationFailedError(
                f"{err.message} (this client's security_protocol is {protocol}: the broker's listener at "
                f"{address} needs SASL_PLAINTEXT or SASL_SSL with sasl_mechanism and credentials)"
            )
        if isinstance(err, KafkaConnectionError | KafkaTimeoutError):
            self.mark_failed(address)
        if isinstance(err, KafkaTimeoutError):
            self.drop(address)
        return err

    def drop(self, address: str) -> None:
        """Close the channel to ``address`` (its calls in flight fail); the next call opens a new one.

        The close runs on a thread of its own: called from a call's done-callback (as a
        producer's response handler does), which runs on the channel's own thread,
        ``close()`` would wait for that thread forever, and no other call of the channel
        would ever complete.
        """
        with self._lock:
            entry = self._channels.pop(address, None)
            self._sessions.pop(address, None)
        if entry is not None:
            log.debug("dropping the channel to %s after a timed-out call", address)
            threading.Thread(target=entry[0].close, name=f"kclient-close-{address}", daemon=True).start()

    def call(self, address: str, method: str, request: Any, timeout_s: float | None = None) -> Any:
        rpc = getattr(self.stub(address), method)
        try:
            return rpc(request, timeout=timeout_s or self.request_timeout_s)
        except grpc.RpcError as exc:
            raise self.failed(address, exc) from exc

    def candidates(self, addresses: Iterable[str] = ()) -> list[str]:
        """Known brokers then bootstrap servers, deduplicated; the least recently failed
        first, and the healthy ones rotated so that load and staleness spread."""
        seen: dict[str, None] = {}
        for a in [*addresses, *self.bootstrap]:
            seen.setdefault(a, None)
        order = list(seen)
        if len(order) > 1:
            k = next(self._rotation) % len(order)
            order = order[k:] + order[:k]
        with self._lock:
            failed = dict(self._failed_at)
        return sorted(order, key=lambda a: failed.get(a, 0.0))

    def call_any(
        self,
        method: str,
        request: Any,
        addresses: Iterable[str] = (),
        timeout_s: float | None = None,
        deadline: float | None = None,
        backoff_s: float = 0.1,
    ) -> Any:
        """Call the first broker that answers (see ``candidates``).

        Without ``deadline`` every candidate is tried once; with it, rounds are repeated
        (``backoff_s`` apart) until one answers or the deadline passes. Each call waits at
        most ``timeout_s`` (default: the request timeout), and never past ``deadline``.
        Raises NoBrokersAvailable when none answered.
        """
        tried: list[str] = []
        addresses = list(addresses)

        def one_round() -> Any:
            last: KafkaError | None = None
            for address in self.candidates(addresses):
                if address not in tried:
                    tried.append(address)
                per_call = timeout_s or self.request_timeout_s
                if deadline is not None:
                    per_call = min(per_call, max(deadline - time.monotonic(), 0.05))
                try:
                    return self.call(address, method, request, per_call)
                except (KafkaConnectionError, KafkaTimeoutError) as exc:
                    last = exc
                if deadline is not None and time.monotonic() >= deadline:
                    break
            raise NoBrokersAvailable(f"no broker answered among {tried}: {last}")

        if deadline is None:
            return one_round()
        return retry(one_round, what=method, deadline=deadline, backoff_s=backoff_s, raise_last=True)

    def close(self, wait: bool = True) -> None:
        """Close every channel (their calls in flight fail). Without ``wait`` the channels
        close on a thread of their own, for a caller that may be on a channel's thread."""
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._sessions.clear()
        closing = [channel for channel, _ in channels]
        if not wait:
            threading.Thread(target=_close_all, args=(closing,), name="kclient-close", daemon=True).start()
            return
        _close_all(closing)


def _close_all(channels: list[grpc.Channel]) -> None:
    for channel in channels:
        channel.close()


class _FailCalls(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, error: KafkaError) -> None:
        self.error = error

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        raise LocalCallError(self.error)


_UNUSED_CHANNEL: grpc.Channel | None = None


def _failing_stub(error: KafkaError) -> broker_pb2_grpc.BrokerStub:
    """A stub whose every call fails with ``error`` without connecting anywhere (the one
    channel under such stubs is never used: its calls never reach it)."""
    global _UNUSED_CHANNEL
    if _UNUSED_CHANNEL is None:
        _UNUSED_CHANNEL = grpc.insecure_channel("localhost:9")
    return broker_pb2_grpc.BrokerStub(grpc.intercept_channel(_UNUSED_CHANNEL, _FailCalls(error)))
