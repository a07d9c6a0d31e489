"""gRPC channels to brokers, and the one place where gRPC errors become kclient errors.

One channel per broker address, created on first use and shared by every request to
that broker (gRPC multiplexes calls on it). ``map_rpc_error`` is the boundary: a
``grpc.RpcError`` never escapes kclient.

Thread safety: safe from any thread.
"""

from __future__ import annotations

import threading
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

ERROR_CODE_METADATA_KEY = "kbroker-error-code"
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 128 * 1024 * 1024),
    ("grpc.max_send_message_length", 128 * 1024 * 1024),
    ("grpc.enable_retries", 0),
]


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
    """Stubs by broker address."""

    def __init__(self, bootstrap_servers: str | Iterable[str], request_timeout_ms: int = 30000) -> None:
        self.bootstrap = parse_servers(bootstrap_servers)
        self.request_timeout_s = request_timeout_ms / 1000.0
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[grpc.Channel, broker_pb2_grpc.BrokerStub]] = {}
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

    def call(self, address: str, method: str, request: Any, timeout_s: float | None = None) -> Any:
        rpc = getattr(self.stub(address), method)
        try:
            return rpc(request, timeout=timeout_s or self.request_timeout_s)
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, address) from exc

    def call_any(self, method: str, request: Any, addresses: Iterable[str] = (), timeout_s: float | None = None) -> Any:
        """Call the first broker that answers: known brokers first, then bootstrap."""
        tried: list[str] = []
        last: KafkaError | None = None
        for address in [*addresses, *self.bootstrap]:
            if address in tried:
                continue
            tried.append(address)
            try:
                return self.call(address, method, request, timeout_s)
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                last = exc
        raise NoBrokersAvailable(f"no broker answered among {tried}: {last}")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
        for channel, _ in channels:
            channel.close()
