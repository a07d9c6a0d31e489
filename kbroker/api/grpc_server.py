"""The broker's gRPC server: an asyncio (``grpc.aio``) server on its own event-loop thread.

Request handlers are coroutines. Their blocking parts (disk, ZooKeeper, locks) run on a
bounded thread pool (``offload``); their waits (long-poll Fetch, acks=all Produce,
JoinGroup, SyncGroup) park in a purgatory and hold no thread at all, so idle consumers
cannot starve the broker and a cancelled call is forgotten at once.

One ``grpc.aio`` server per listener (``listeners``), all on the same loop, thread pool
and servicer, each with the listener's TLS credentials. Before a handler runs, the
listener's authenticator names the caller and the listener
(:mod:`kbroker.api.call_context`; Metadata advertises that listener's addresses); a call
it refuses fails with UNAUTHENTICATED and the Kafka code in the ``kbroker-error-code``
trailing metadata.

Limits: a request message is at most ``socket.request.max.bytes``; the request bytes in
flight at once (over every listener) are bounded by ``queued.max.request.bytes`` (beyond
it a call fails with RESOURCE_EXHAUSTED, retriable). An undecodable request gets
INVALID_ARGUMENT and one log line (at most one every 10 s), never a traceback.

Thread safety: :meth:`start` and :meth:`stop` are called from the main thread; everything
else runs on the loop thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

import grpc

from kbroker.api.call_context import CallContext, bind, unbind
from kbroker.metrics import BrokerMetrics
from kbroker.security.listeners import EndPoint
from kbroker.security.tls import add_listener_port
from kclient.errors import BrokerResponseError, KafkaError
from kclient.proto.kbroker.v1 import broker_pb2_grpc
from kclient.transport import ERROR_CODE_METADATA_KEY, SERVER_KEEPALIVE_OPTIONS

Authenticate = Callable[[str, Any], CallContext]
"""A listener's authenticator: (method, servicer context) -> the caller, or a
BrokerResponseError (SASL_AUTHENTICATION_FAILED) to refuse the call."""

log = logging.getLogger(__name__)

T = TypeVar("T")


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


class _Guard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps every unary handler of one listener: name the caller (or refuse the call),
    refuse a request while the byte budget is spent, and answer an undecodable one
    without gRPC's traceback. The wrappers are made once per method (this runs for every
    call). With ``metrics``, each call counts once: requests, latency, and its gRPC
    status when it fails (kbroker.metrics)."""

    def __init__(self, budget: InFlightBytes, authenticate: Authenticate, metrics: BrokerMetrics | None = None) -> None:
        self._budget = budget
        self._authenticate = authenticate
        self._metrics = metrics
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
        authenticate = self._authenticate
        decode = handler.request_deserializer
        stats = self._metrics.request(method.rsplit("/", 1)[-1]) if self._metrics is not None else None
        clock = time.perf_counter

        def sized_decode(data: bytes) -> tuple[Any, int]:
            try:
                return decode(data), len(data)
            except Exception as exc:
                return _Undecodable(method, len(data), exc), len(data)

        async def behaviour(request: tuple[Any, int], context: grpc.aio.ServicerContext) -> Any:
            if stats is None:
                return await guarded(request, context)
            start = clock()
            try:
                return await guarded(request, context)
            except BaseException:
                code = context.code()
                stats.error(code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN")
                raise
            finally:
                stats.done((clock() - start) * 1000.0)

        async def guarded(request: tuple[Any, int], context: grpc.aio.ServicerContext) -> Any:
            message, size = request
            try:
                call = authenticate(method, context)
            except BrokerResponseError as exc:
                context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, str(exc.errno)),))
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
            if isinstance(message, _Undecodable):
                _GARBAGE.report(message)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {method} message")
            if not budget.try_acquire(size):
                await context.abort(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"broker busy: {budget.used} request bytes in flight (queued.max.request.bytes="
                    f"{budget.limit}); retry after a back-off",
                )
            token = bind(call)
            try:
                return await inner(message, context)
            finally:
                unbind(token)
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


MakeServicer = Callable[[Callable[..., Awaitable[Any]]], broker_pb2_grpc.BrokerServicer]
"""offload -> the servicer every listener's calls go to."""


class GrpcServer:
    """Serves ``kbroker.v1.Broker`` on each listener (port 0 picks a free one)."""

    def __init__(
        self,
        make_servicer: MakeServicer,
        listeners: list[tuple[EndPoint, Authenticate]],
        *,
        security_props: dict[str, str] | None = None,
        workers: int,
        max_request_bytes: int,
        queued_max_request_bytes: int,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self._metrics = metrics
        self._make_servicer = make_servicer
        self._listeners = listeners
        self._security_props = security_props or {}
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
        self._servers: list[grpc.aio.Server] = []
        self._servicer: broker_pb2_grpc.BrokerServicer | None = None
        self.ports: dict[str, int] = {}
        """Bound port by listener name (after :meth:`start`)."""

    @property
    def budget(self) -> InFlightBytes:
        """The request bytes in flight (queued.max.request.bytes), for the Kafka door too."""
        return self._budget

    async def offload(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a blocking call on the request pool (in the calling RPC's context: the
        caller stays known there) and await its result."""
        ctx = contextvars.copy_context()
        return await self._loop.run_in_executor(self._pool, partial(ctx.run, fn, *args, **kwargs))

    async def _start(self, endpoint: EndPoint, authenticate: Authenticate) -> int:
        guard = _Guard(self._budget, authenticate, self._metrics)
        server = grpc.aio.server(options=self._options, interceptors=[guard])
        if self._servicer is None:
            self._servicer = self._make_servicer(self.offload)
        broker_pb2_grpc.add_BrokerServicer_to_server(self._servicer, server)
        self._servers.append(server)
        port = add_listener_port(server, endpoint, self._security_props)
        await server.start()
        return port

    def start(self) -> dict[str, int]:
        self._thread.start()
        for endpoint, authenticate in self._listeners:
            where = f"{endpoint.listener_name} {endpoint.bind_host}:{endpoint.port}"
            try:
                port = asyncio.run_coroutine_threadsafe(self._start(endpoint, authenticate), self._loop).result(30)
            except KafkaError:
                raise
            except Exception as exc:
                raise KafkaError(f"cannot listen on {where}: {exc}") from exc
            if not port:
                raise KafkaError(f"cannot listen on {where}")
            self.ports[endpoint.listener_name] = port
        return dict(self.ports)

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        """Run ``coro`` on the server's loop (from another thread) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def stop(self, grace_s: float) -> None:
        """Stop accepting calls, give running ones ``grace_s``, then cancel the rest."""
        if self._servers and self._thread.is_alive():

            async def stop_all() -> None:
                await asyncio.gather(*(s.stop(grace_s) for s in self._servers))

            try:
                asyncio.run_coroutine_threadsafe(stop_all(), self._loop).result(grace_s + 5)
            except Exception:
                log.warning("gRPC server did not stop cleanly", exc_info=True)
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
