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

Request memory (:mod:`kbroker.api.request_budget`). gRPC gives no hook to count bytes as
they arrive, so memory is bounded around the message instead:

- HTTP/2: no BDP window growth and a 64 KiB stream window (``grpc.http2.lookahead_bytes``),
  so a request the broker has not started to read holds at most that much; at most
  ``MAX_CONCURRENT_STREAMS`` calls per connection;
- a message is at most ``socket.request.max.bytes`` (and the listener's budget), refused
  with RESOURCE_EXHAUSTED by gRPC itself before it is decoded;
- each handler reads its own request (a stream handler reading one message, which is
  the same on the wire): a connection's requests are read one at a time, and only while
  the budget (and the connection's share of it) would still hold a message of the
  largest size (:meth:`RequestPool.may_read`); otherwise the call waits, unread (Kafka's
  muted channel) -- it does not fail. The message is taken from the budget as soon as
  it is received, before the connection's next read starts. A message must arrive within
  ``request.read.timeout.ms`` once its read starts (else DEADLINE_EXCEEDED);
- once read, the message is held at its decoded size with unknown fields dropped (a
  parked long poll padded with an unknown field holds only what it means), until the
  call ends.

So the broker holds at most ``max(budget, largest message + 1 MiB)``, plus one message
per connection being read. gRPC holds a message three times while it receives it (its
receive buffers, the bytearray it joins them into, the bytes it hands over); those
buffers go back to the OS (``malloc_trim``) before a large message is decoded, and
released request bytes are reclaimed (:class:`MemoryReclaimer`), so ten concurrent
95 MiB requests cost idle + ~3 x 95 MiB at their peak, and nothing afterwards.
Calls on the inter-broker listener that carry ``kbroker-inter-broker`` metadata (what a
broker's own channels send), and every call on a dedicated inter-broker listener (one
named by ``inter.broker.listener.name`` or ``security.inter.broker.protocol`` beside
other listeners), use the inter-broker budget, so replication never waits behind
clients -- but only for a caller the broker trusts as a broker: allowed ClusterAction on
the cluster (a super user is), or anyone when no authorizer is configured (as Kafka
trusts a replica_id then). Anyone else's call uses the client budget, marker or not. Connections with no
call for ``connections.max.idle.ms`` are closed (``grpc.max_connection_idle_ms``).

An undecodable request gets INVALID_ARGUMENT and one log line (at most one every 10 s),
never a traceback.

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
from kbroker.api.request_budget import INTER_BROKER_METADATA_KEY, Holder, RequestBudgets, RequestPool
from kbroker.metrics import BrokerMetrics
from kbroker.security.listeners import EndPoint
from kbroker.security.tls import add_listener_port
from kclient.errors import BrokerResponseError, KafkaError
from kclient.proto.kbroker.v1 import broker_pb2_grpc
from kclient.transport import ERROR_CODE_METADATA_KEY, SERVER_KEEPALIVE_OPTIONS

Authenticate = Callable[[str, Any], CallContext]
"""A listener's authenticator: (method, servicer context) -> the caller, or a
BrokerResponseError (SASL_AUTHENTICATION_FAILED) to refuse the call."""

TrustedBroker = Callable[[CallContext], bool]
"""Whether a caller may use the inter-broker budget: allowed ClusterAction on the cluster
(or no authorizer configured)."""


def _everyone(call: CallContext) -> bool:
    return True


log = logging.getLogger(__name__)

T = TypeVar("T")


MAX_CONCURRENT_STREAMS = 256
"""Calls at once on one gRPC connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS)."""

STREAM_WINDOW_BYTES = 64 * 1024
"""What gRPC buffers of a request not yet being read (HTTP/2 stream window, no BDP growth)."""


class _Connections:
    """Per gRPC connection (peer address): the lock that reads its requests one at a time
    and its share of each pool. Entries live while the connection has calls.

    Thread safety: event loop thread only.
    """

    def __init__(self) -> None:
        self._by_peer: dict[str, tuple[asyncio.Lock, dict[str, Holder], list[int]]] = {}

    def enter(self, peer: str, pool: RequestPool) -> tuple[asyncio.Lock, Holder]:
        entry = self._by_peer.get(peer)
        if entry is None:
            entry = self._by_peer[peer] = (asyncio.Lock(), {}, [0])
        lock, holders, refs = entry
        refs[0] += 1
        holder = holders.get(pool.name)
        if holder is None:
            holder = holders[pool.name] = pool.holder()
        return lock, holder

    def leave(self, peer: str) -> None:
        entry = self._by_peer.get(peer)
        if entry is not None:
            entry[2][0] -= 1
            if entry[2][0] <= 0:
                del self._by_peer[peer]


class _Guard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps every unary handler of one listener: name the caller (or refuse the call),
    refuse a request while the byte budget is spent, and answer an undecodable one
    without gRPC's traceback. The wrappers are made once per method (this runs for every
    call). With ``metrics``, each call counts once: requests, latency, and its gRPC
    status when it fails (kbroker.metrics)."""

    def __init__(
        self,
        budgets: RequestBudgets,
        authenticate: Authenticate,
        metrics: BrokerMetrics | None = None,
        *,
        inter_broker: str = "",
        read_timeout_s: float = 30.0,
        connections: _Connections | None = None,
        max_request_bytes: int = 100 * 1024 * 1024,
        trusted: TrustedBroker = _everyone,
    ) -> None:
        self._budgets = budgets
        self._trusted = trusted
        self._authenticate = authenticate
        self._metrics = metrics
        self._inter_broker = inter_broker
        """"all": every trusted call is inter-broker (a dedicated inter-broker listener);
        "marked": trusted calls with the inter-broker metadata are; "": none."""
        self._read_timeout_s = read_timeout_s
        self._max_request_bytes = max_request_bytes
        """socket.request.max.bytes: with a pool's limit and share, the largest message."""
        self._connections = connections if connections is not None else _Connections()
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

    def _pool(self, context: grpc.aio.ServicerContext, call: CallContext) -> RequestPool:
        """The inter-broker budget for a broker's call (see the module), else the client one."""
        if self._inter_broker == "all":
            inter = True
        elif self._inter_broker == "marked":
            inter = any(key == INTER_BROKER_METADATA_KEY for key, _ in context.invocation_metadata() or ())
        else:
            inter = False
        return self._budgets.inter_broker if inter and self._trusted(call) else self._budgets.client

    async def _read(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        pool: RequestPool,
        lock: asyncio.Lock,
        holder: Holder,
        decode: Callable[[bytes], Any],
    ) -> tuple[Any, int]:
        """Read the call's one request message once the pool and the connection's share
        have room for a message of the largest size (a connection's requests one at a
        time); the message and the bytes taken for it (from ``pool`` and ``holder``).

        The message's bytes are taken as soon as it is received, before the lock lets
        the connection's next request be read, so that read sees them; once decoded
        (unknown fields dropped) it is held at its decoded size."""
        largest = min(self._max_request_bytes, pool.limit, pool.per_connection)
        async with lock:
            while not pool.may_read(largest, holder):
                await pool.released()  # not read meanwhile: HTTP/2 flow control holds it back
            try:
                raw = await asyncio.wait_for(context.read(), self._read_timeout_s)
            except TimeoutError:
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the request did not arrive within request.read.timeout.ms ({int(self._read_timeout_s * 1000)})",
                )
            if raw is grpc.aio.EOF or not isinstance(raw, bytes):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no {method} request message")
            size = len(raw)
            pool.hold(size, holder)  # it arrived while the pool had room: held even past the limit
        try:
            if pool.reclaimer is not None:  # gRPC's receive buffers, freed by now, go back first
                await pool.reclaimer.received(size)
            try:
                message = decode(raw)
            except Exception as exc:
                _GARBAGE.report(_Undecodable(method, size, exc))
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid {method} message")
            del raw
            discard = getattr(message, "DiscardUnknownFields", None)
            if discard is not None:
                discard()
                decoded = message.ByteSize()
                if decoded < size:
                    pool.release(size - decoded, holder)
                    size = decoded
        except BaseException:
            pool.release(size, holder)
            raise
        return message, size

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        inner = handler.unary_unary
        authenticate = self._authenticate
        decode = handler.request_deserializer or (lambda data: data)
        stats = self._metrics.request(method.rsplit("/", 1)[-1]) if self._metrics is not None else None
        clock = time.perf_counter

        async def behaviour(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            if stats is None:
                return await guarded(context)
            start = clock()
            try:
                return await guarded(context)
            except BaseException:
                code = context.code()
                stats.error(code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN")
                raise
            finally:
                stats.done((clock() - start) * 1000.0)

        async def guarded(context: grpc.aio.ServicerContext) -> Any:
            try:
                call = authenticate(method, context)
            except BrokerResponseError as exc:
                context.set_trailing_metadata(((ERROR_CODE_METADATA_KEY, str(exc.errno)),))
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
            pool = self._pool(context, call)
            peer = context.peer() or ""
            lock, holder = self._connections.enter(peer, pool)
            try:
                message, size = await self._read(method, context, pool, lock, holder, decode)
                token = bind(call)
                try:
                    return await inner(message, context)
                finally:
                    unbind(token)
                    pool.release(size, holder)
            finally:
                self._connections.leave(peer)

        # A stream handler reads its request itself (the same call on the wire), so the
        # read waits for the budget and its bytes are counted before anything else.
        return grpc.stream_unary_rpc_method_handler(
            behaviour,
            request_deserializer=None,
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
        budgets: RequestBudgets,
        inter_broker_listener: str = "",
        dedicated_inter_broker_listener: bool = False,
        trusted_broker: TrustedBroker = _everyone,
        idle_timeout_ms: int = 600000,
        read_timeout_ms: int = 30000,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self._metrics = metrics
        self._make_servicer = make_servicer
        self._listeners = listeners
        self._security_props = security_props or {}
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="request")
        self._budgets = budgets
        self._inter_broker_listener = inter_broker_listener
        self._dedicated = dedicated_inter_broker_listener
        """The inter-broker listener is for brokers only (by configuration, see the module)."""
        self._trusted = trusted_broker
        self._max_request_bytes = max_request_bytes
        self._read_timeout_s = read_timeout_ms / 1000.0
        self._connections = _Connections()
        self._options = [
            ("grpc.max_send_message_length", 128 * 1024 * 1024),
            ("grpc.so_reuseport", 0),
            ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", STREAM_WINDOW_BYTES),
            ("grpc.max_connection_idle_ms", idle_timeout_ms),
            *SERVER_KEEPALIVE_OPTIONS,  # accept the clients' keepalive pings; ping them too
        ]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc-loop", daemon=True)
        self._servers: list[grpc.aio.Server] = []
        self._servicer: broker_pb2_grpc.BrokerServicer | None = None
        self.ports: dict[str, int] = {}
        """Bound port by listener name (after :meth:`start`)."""

    @property
    def budgets(self) -> RequestBudgets:
        """The request pools (queued.max.request.bytes and the inter-broker one), for the
        Kafka door too."""
        return self._budgets

    async def offload(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a blocking call on the request pool (in the calling RPC's context: the
        caller stays known there) and await its result."""
        ctx = contextvars.copy_context()
        return await self._loop.run_in_executor(self._pool, partial(ctx.run, fn, *args, **kwargs))

    async def _start(self, endpoint: EndPoint, authenticate: Authenticate) -> int:
        inter = ""
        if endpoint.listener_name == self._inter_broker_listener:
            inter = "all" if self._dedicated else "marked"
        guard = _Guard(
            self._budgets,
            authenticate,
            self._metrics,
            inter_broker=inter,
            read_timeout_s=self._read_timeout_s,
            connections=self._connections,
            max_request_bytes=self._max_request_bytes,
            trusted=self._trusted,
        )
        pool = self._budgets.client
        # The largest message: socket.request.max.bytes, within what the listener's budget
        # (and one connection's share of it) can hold; gRPC refuses more before decoding.
        largest = min(self._max_request_bytes, pool.limit, pool.per_connection)
        if inter:  # the broker's own calls come from the inter-broker budget here
            largest = max(largest, min(self._max_request_bytes, self._budgets.inter_broker.limit))
        options = [("grpc.max_receive_message_length", largest), *self._options]
        server = grpc.aio.server(options=options, interceptors=[guard])
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
