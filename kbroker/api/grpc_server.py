"""The broker's gRPC server: an asyncio (``grpc.aio``) server on its own event-loop thread.

Request handlers are coroutines. Their blocking parts (disk, ZooKeeper, locks) run on a
bounded thread pool (``offload``); their waits (long-poll Fetch, acks=all Produce,
JoinGroup, SyncGroup) park in a purgatory and hold no thread at all, so idle consumers
cannot starve the broker and a cancelled call is forgotten at once.

Limits: a request message is at most ``socket.request.max.bytes``; the request bytes in
flight at once are bounded by ``queued.max.request.bytes`` (beyond it a call fails
with RESOURCE_EXHAUSTED, retriable). An undecodable request gets INVALID_ARGUMENT and
one log line (at most one every 10 s), never a traceback.

Thread safety: :meth:`start` and :meth:`stop` are called from the main thread; everything
else runs on the loop thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import grpc

from kclient.errors import KafkaError
from kclient.proto.kbroker.v1 import broker_pb2_grpc
from kclient.transport import SERVER_KEEPALIVE_OPTIONS

log = logging.getLogger(__name__)


class InFlightBytes:
    """A byte budget for requests being served (Kafka's queued.max.request.bytes).

    Thread safety: used from the event loop thread only.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def try_acquire(self, n: int) -> bool:
        # One request larger than the whole budget still runs when nothing else does.
        if self.used and self.used + n > self.limit:
            return False
        self.used += n
        return True

    def release(self, n: int) -> None:
        self.used -= n


class _Budget(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps every unary handler: refuse a request while the byte budget is spent, and
    answer an undecodable one without gRPC's traceback. The wrappers are made once per
    method (this runs for every call)."""

    def __init__(self, budget: InFlightBytes) -> None:
        self._budget = budget
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        wrapped = self._wrapped.get(details.method)
        if wrapped is None:
            handler = await continuation(details)
            if handler is None or handler.unary_unary is None:
                return handler
            wrapped = self._wrapped[details.method] = self._wrap(details.method, handler)
        return wrapped

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        inner = handler.unary_unary
        budget = self._budget
        decode = handler.request_deserializer

        def sized_decode(data: bytes) -> tuple[Any, int]:
            try:
                return decode(data), len(data)
            except Exception as exc:
                return _Undecodable(method, len(data), exc), len(data)

        async def behaviour(request: tuple[Any, int], context: grpc.aio.ServicerContext) -> Any:
            message, size = request
            if isinstance(message, _Undecodable):
                _GARBAGE.report(message)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {method} message")
            if not budget.try_acquire(size):
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"broker busy: {budget.used} request bytes in flight (queued.max.request.bytes="
                    f"{budget.limit}); retry after a back-off",
                )
            try:
                return await inner(message, context)
            finally:
                budget.release(size)

        return grpc.unary_unary_rpc_method_handler(
            behaviour,
            request_deserializer=sized_decode,
            response_serializer=handler.response_serializer,
        )


class _Undecodable:
    """What the deserializer hands on instead of raising: gRPC would print a traceback."""

    def __init__(self, method: str, size: int, error: Exception) -> None:
        self.method, self.size, self.error = method, size, error


class _GarbageLog:
    """One WARNING line per undecodable request, at most one every ``every_s`` seconds."""

    def __init__(self, every_s: float = 10.0) -> None:
        self._every_s = every_s
        self._last = -every_s
        self._dropped = 0

    def report(self, bad: _Undecodable) -> None:
        now = time.monotonic()
        if now - self._last < self._every_s:
            self._dropped += 1
            return
        self._last = now
        more = f" ({self._dropped} more since the last report)" if self._dropped else ""
        self._dropped = 0
        log.warning("refused an undecodable %s request of %d bytes: %s%s", bad.method, bad.size, bad.error, more)


_GARBAGE = _GarbageLog()


class GrpcServer:
    """Serves a ``kbroker.v1.Broker`` servicer on ``host:port`` (port 0 picks a free one)."""

    def __init__(
        self,
        make_servicer: Callable[[Callable[..., Awaitable[Any]]], broker_pb2_grpc.BrokerServicer],
        host: str,
        port: int,
        *,
        workers: int,
        max_request_bytes: int,
        queued_max_request_bytes: int,
    ) -> None:
        self._make_servicer = make_servicer
        self._host, self._want_port = host, port
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="request")
        self._budget = InFlightBytes(queued_max_request_bytes)
        self._options = [
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.max_send_message_length", 128 * 1024 * 1024),
            ("grpc.so_reuseport", 0),
            *SERVER_KEEPALIVE_OPTIONS,  # accept the clients' keepalive pings; ping them too
        ]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc-loop", daemon=True)
        self._server: grpc.aio.Server | None = None
        self.port = -1

    async def offload(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a blocking call on the request pool and await its result."""
        return await self._loop.run_in_executor(self._pool, partial(fn, *args, **kwargs))

    async def _start(self) -> int:
        server = grpc.aio.server(options=self._options, interceptors=[_Budget(self._budget)])
        broker_pb2_grpc.add_BrokerServicer_to_server(self._make_servicer(self.offload), server)
        port = server.add_insecure_port(f"{self._host}:{self._want_port}")
        await server.start()
        self._server = server
        return int(port)

    def start(self) -> int:
        self._thread.start()
        try:
            self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        except Exception as exc:
            raise KafkaError(f"cannot listen on {self._host}:{self._want_port}: {exc}") from exc
        if self.port == 0:
            raise KafkaError(f"cannot listen on {self._host}:{self._want_port}")
        return self.port

    def stop(self, grace_s: float) -> None:
        """Stop accepting calls, give running ones ``grace_s``, then cancel the rest."""
        if self._server is not None and self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._server.stop(grace_s), self._loop).result(grace_s + 5)
            except Exception:
                log.warning("gRPC server did not stop cleanly", exc_info=True)
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
