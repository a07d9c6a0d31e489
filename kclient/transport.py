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
    NoBrokersAvailable,
    for_code,
)
from kclient.proto.kbroker.v1 import broker_pb2_grpc
from kclient.retry import retry

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
    ("grpc.max_send_message_length", 128 * 1024 * 1024),
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
    """Translate a failed gRPC call into the kclient exception tree."""
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        trailing = dict(exc.trailing_metadata() or ()) if hasattr(exc, "trailing_metadata") else {}
        raw = trailing.get(ERROR_CODE_METADATA_KEY)
        cls: type[BrokerResponseError] = for_code(int(raw)) if raw else InvalidRequestError
        return cls(details or "")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return KafkaTimeoutError(f"request to {address} timed out")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return KafkaConnectionError(f"broker {address} is unavailable: {details}")
    return KafkaError(f"request to {address} failed: {code.name if code else '?'}: {details}")


class Transport:
    """Stubs by broker address, and when each broker last failed."""

    def __init__(self, bootstrap_servers: str | Iterable[str], request_timeout_ms: int = 30000) -> None:
        self.bootstrap = parse_servers(bootstrap_servers)
        self.request_timeout_s = request_timeout_ms / 1000.0
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[grpc.Channel, broker_pb2_grpc.BrokerStub]] = {}
        self._failed_at: dict[str, float] = {}
        self._rotation = itertools.count()
        self._closed = False

    def stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        with self._lock:
            if self._closed:
                raise KafkaError("client is closed")
            entry = self._channels.get(address)
            if entry is None:
                channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
                entry = (channel, broker_pb2_grpc.BrokerStub(channel))
                self._channels[address] = entry
            return entry[1]

    def mark_failed(self, address: str) -> None:
        """``address`` failed a request: ``call_any`` asks the others first for a while."""
        with self._lock:
            self._failed_at[address] = time.monotonic()

    def failed(self, address: str, exc: BaseException) -> KafkaError:
        """Record a failed call to ``address`` (from ``call`` or a future) and map its error.

        A timed-out call drops the channel: the next call connects afresh instead of
        queueing behind a connection that may be dead.
        """
        err = map_rpc_error(exc, address) if isinstance(exc, grpc.RpcError) else KafkaError(str(exc))
        if isinstance(err, KafkaConnectionError | KafkaTimeoutError):
            self.mark_failed(address)
        if isinstance(err, KafkaTimeoutError):
            self.drop(address)
        return err

    def drop(self, address: str) -> None:
        """Close the channel to ``address`` (its calls in flight fail); the next call opens a new one."""
        with self._lock:
            entry = self._channels.pop(address, None)
        if entry is not None:
            log.debug("dropping the channel to %s after a timed-out call", address)
            entry[0].close()

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

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
        for channel, _ in channels:
            channel.close()
