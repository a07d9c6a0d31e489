"""The Kafka-protocol door: TCP listeners (``kafka.listeners``) on the gRPC server's
event loop, serving Kafka's binary protocol with the same servicer.

Wire handling, per connection:

- frames are ``int32 size`` + request; a size above ``socket.request.max.bytes`` or below
  a header, or an unreadable header or payload, closes that connection only (one WARNING
  line, rate-limited) — never the listener or another connection;
- requests are read ahead (pipelined clients keep the socket busy) but served one at a
  time, in arrival order, for every API: a request starts only once the connection's
  previous one is done, as Kafka mutes a channel until its request is answered, so a
  later request (an OffsetCommit, a Produce) never takes effect before an earlier one.
  Responses are written in request order by one writer task. At most ``MAX_IN_FLIGHT``
  requests are outstanding per connection;
- request memory (:mod:`kbroker.api.request_budget`): a frame's bytes are held in the
  client pool (``queued.max.request.bytes``, shared with gRPC) until its request is
  answered; one connection holds at most ``queued.max.request.bytes.per.connection``.
  When a frame does not fit, the connection is not read (back-pressure through TCP), as
  Kafka mutes a channel; nothing fails for it. How a frame is admitted depends on who
  sent it:

  - an identified principal (SASL-authenticated, or a TLS client certificate): the whole
    declared frame is reserved in one step before its body is read, waiting unread until
    it fits (Kafka's MemoryPool). A frame being read always has all its bytes, so frames
    read together never wait for each other (no deadlock);
  - anyone else (PLAINTEXT, TLS without a client certificate): a size header takes
    nothing, so no stranger exhausts the pool with promises (issue 20). A new frame is
    read only while the pool and the connection's share would still hold its declared
    size; once started it is read to its end, its bytes counted as they arrive even past
    the limit, so partial frames never deadlock the pool. The trade-off: frames admitted
    at the same moment may together exceed the pool by up to one frame per connection
    (as on the gRPC listeners), for at most request.read.timeout.ms each, and only with
    bytes really sent;
  - before SASL authentication a frame is at most 512 KiB and its bytes never come from
    the pool (Kafka's rule);
- deadlines: a connection with no request outstanding that sends nothing for
  ``connections.max.idle.ms`` is closed, and so is one whose request frame does not
  arrive whole within ``request.read.timeout.ms`` of its admission (time waiting for the
  pool does not count: a muted connection is not slow), so partial frames cannot hold
  the pool for ever. A frame is at most ``socket.request.max.bytes``, the
  per-connection share and the pool, whichever is least;
- a request that closes the connection (a malformed payload, a failed SASL exchange, a
  failed acks=0 Produce) stops it there: what was read after it is never answered
  (requests already started behind it run to their end, as their effects are queued);
- Produce with acks=0 gets no response, as in Kafka;
- an API key or version not served gets UNSUPPORTED_VERSION (ApiVersions of an unknown
  version: a v0 answer listing what is served), never a dropped connection; an API
  with a ``refuse`` builder (Produce) puts it on each partition of the version's own
  response when the request reads (Produce with acks=0 closes the connection instead,
  as nothing is answered);
- on a SASL listener nothing but ApiVersions, SaslHandshake and SaslAuthenticate is
  served until the connection authenticated (Kafka's rule), and those are handled one
  at a time;
- after a SaslHandshake v0 (Kafka clients before 1.0, librdkafka without ApiVersions)
  the SASL tokens come as raw size-prefixed frames, no request header: while the
  exchange is under way (``Connection.sasl["raw_tokens"]``) each frame is one token for
  the SaslHandshake API's ``raw_tokens`` handler and its answer one raw frame back (an
  empty one where the mechanism has nothing to say, as Kafka sends for PLAIN). These
  frames have the pre-authentication limits of any other (at most 512 KiB, never from
  the pool, one at a time, the same deadlines); a failed exchange closes the
  connection without an answer, as Kafka does for v0.

Each request runs with a :class:`~kbroker.api.call_context.CallContext` naming the
connection's principal and listener with ``door="kafka"``, so authorization and the
advertised addresses (``kafka_endpoints`` of the broker znodes) follow the connection.

Thread safety: everything runs on the gRPC server's loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from kbroker.api.call_context import CallContext, bind, unbind
from kbroker.api.request_budget import Holder, RequestPool
from kbroker.doors.kafka.codec import Header, MalformedRequest, encode_response, read_header, read_request
from kbroker.metrics import BrokerMetrics
from kbroker.security.listeners import EndPoint
from kbroker.security.principal import ANONYMOUS, KafkaPrincipal
from kclient.errors import KafkaError

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 64
"""Requests outstanding on one connection before it stops being read."""

PRE_AUTH_MAX_BYTES = 512 * 1024
"""The largest frame before SASL authentication (Kafka's sasl.server.max.receive.size)."""

READ_CHUNK = 256 * 1024
"""The most bytes of a frame read (and taken from the pool) at once."""

SASL_HANDSHAKE_KEY = 17

UNSUPPORTED_VERSION = 35

SASL_STAGE_KEYS = frozenset({SASL_HANDSHAKE_KEY, 18, 36})
"""SaslHandshake, ApiVersions, SaslAuthenticate: served before authentication."""


@dataclass
class Connection:
    """One client connection's state (its principal changes once, after SASL)."""

    endpoint: EndPoint
    client_host: str
    principal: KafkaPrincipal = ANONYMOUS
    authenticated: bool = False
    sasl: dict[str, Any] = field(default_factory=dict)
    """The SASL exchange in progress (mechanism, exchange id), owned by the SASL APIs."""
    session_expiry: float | None = None
    """When the SASL session ends (``time.monotonic``); a request after it closes the
    connection unless the client re-authenticated first (KIP-368)."""
    holder: Holder | None = None
    """This connection's bytes in the request pool (set by the server)."""
    outstanding: int = 0
    """Requests read and not yet answered (the connection is not idle meanwhile)."""

    def call(self) -> CallContext:
        e = self.endpoint
        return CallContext(self.principal, e.listener_name, e.security_protocol, self.client_host, door="kafka")


@dataclass(frozen=True)
class KafkaRequest:
    header: Header
    payload: Any
    connection: Connection

    @property
    def version(self) -> int:
        return self.header.api_version


Handler = Callable[[KafkaRequest], Awaitable[Any]]
"""Serves one request: the response entity (a kio dataclass), or None for no response."""


Refuser = Callable[["KafkaRequest", int], Any]
"""Builds the response refusing a request with an error code (raises CloseConnection
where Kafka answers nothing)."""

RawTokenHandler = Callable[[Connection, bytes], Awaitable[bytes]]
"""Serves one raw SASL token (SaslHandshake v0): the server's token to send back."""


@dataclass(frozen=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    handle: Handler
    raw_tokens: RawTokenHandler | None = None
    """SaslHandshake only: serves the raw SASL tokens that follow a v0 handshake."""
    refuse: Refuser | None = None
    """Answers a request of a version not served whose payload still reads (a schema
    exists) with the error on each of its parts, in that version's schema (Produce:
    per partition); without it such a request gets the table's UNSUPPORTED_VERSION
    answer."""


class CloseConnection(Exception):
    """Raised by a handler: the connection is closed, after ``response`` when there is
    one (Kafka closes after a failed SASL authentication, and without an answer for a
    broker that must not serve, e.g. one cut off from ZooKeeper, or a failed acks=0
    Produce)."""

    def __init__(self, response: Any = None) -> None:
        super().__init__()
        self.response = response
        self.last: bytes | None = None
        """``response`` as the frame to write (set by the dispatcher)."""


Unsupported = Callable[[Header], bytes]
"""Builds the whole UNSUPPORTED_VERSION response frame for a request not served."""


class KafkaProtocolServer:
    """Serves ``apis`` on each Kafka-protocol listener (port 0 picks a free one)."""

    def __init__(
        self,
        apis: dict[int, Api],
        unsupported: Unsupported,
        *,
        max_request_bytes: int,
        budget: RequestPool | None = None,
        idle_timeout_s: float = 600.0,
        read_timeout_s: float = 30.0,
        ssl_context: Callable[[EndPoint], ssl.SSLContext | None] = lambda e: None,
        tls_principal: Callable[[asyncio.StreamWriter], KafkaPrincipal] = lambda w: ANONYMOUS,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self._apis = apis
        self._unsupported = unsupported
        self._max_request_bytes = max_request_bytes
        self._budget = (
            budget if budget is not None else RequestPool("client", max_request_bytes * 4, max_request_bytes * 2)
        )
        """Request bytes held (queued.max.request.bytes), shared with the gRPC listeners."""
        self._idle_timeout_s = idle_timeout_s
        self._read_timeout_s = read_timeout_s
        self._ssl_context = ssl_context
        self._tls_principal = tls_principal
        self._metrics = metrics
        self._servers: list[asyncio.base_events.Server] = []
        self._connections: set[asyncio.Task[None]] = set()
        self._last_warning = 0.0

    async def start(self, endpoint: EndPoint) -> int:
        """Listen on ``endpoint``; the bound port."""
        ctx = self._ssl_context(endpoint)
        if endpoint.uses_tls and ctx is None:
            raise KafkaError(
                f"kafka listener {endpoint.listener_name}: no TLS context for {endpoint.security_protocol}"
            )
        if endpoint.uses_sasl and 17 not in self._apis:
            raise KafkaError(f"kafka listener {endpoint.listener_name}: SASL is not served on this door")

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._connections.add(task)
            try:
                await self._serve(endpoint, reader, writer)
            finally:
                self._connections.discard(task)

        server = await asyncio.start_server(
            accept, endpoint.bind_host or None, endpoint.port, ssl=ctx, reuse_address=True
        )
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        for s in self._servers:
            s.close()
        for task in list(self._connections):
            task.cancel()
        for s in self._servers:
            with contextlib.suppress(Exception):
                await s.wait_closed()

    def _warn(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last_warning >= 10.0:
            self._last_warning = now
            log.warning(message, *args)

    async def _serve(self, endpoint: EndPoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername") or ("", 0)
        conn = Connection(endpoint, str(peer[0]))
        if endpoint.uses_tls:
            conn.principal = self._tls_principal(writer)
        conn.authenticated = not endpoint.uses_sasl
        conn.holder = self._budget.holder()
        replies: asyncio.Queue[asyncio.Task[bytes | None] | None] = asyncio.Queue(MAX_IN_FLIGHT)
        sender = asyncio.ensure_future(self._send(replies, writer))
        previous: asyncio.Task[bytes | None] | None = None
        try:
            while not sender.done():
                read = await self._read_frame(conn, reader, sender)
                if read is None:
                    break
                frame, pooled = read
                if conn.sasl.get("raw_tokens"):
                    conn.outstanding += 1
                    task = asyncio.ensure_future(self._raw_token(previous, conn, frame))
                    task.add_done_callback(partial(self._release, conn, pooled))
                    previous = task
                    await asyncio.wait([task])  # the SASL stage is served one frame at a time
                    if not await self._until_sender_ends(replies.put(task), sender):
                        break
                    continue
                try:
                    header, start = read_header(frame)
                except MalformedRequest as exc:
                    self._budget.release(pooled, conn.holder)
                    self._warn("kafka listener %s: closed %s: %s", endpoint.listener_name, conn.client_host, exc)
                    break
                conn.outstanding += 1
                task = asyncio.ensure_future(self._in_turn(previous, conn, header, frame, start))
                task.add_done_callback(partial(self._release, conn, pooled))
                previous = task
                if not conn.authenticated:
                    await asyncio.wait([task])  # the SASL stage is served one request at a time
                if not await self._until_sender_ends(replies.put(task), sender):
                    task.cancel()
                    break
        except TimeoutError:
            pass  # a deadline closed it (logged where it expired)
        finally:
            if not sender.done() and await self._until_sender_ends(replies.put(None), sender):
                await asyncio.wait([sender], timeout=30)  # what is queued is written, in order
            sender.cancel()
            while not replies.empty():  # never to be written: the connection is gone
                left = replies.get_nowait()
                if left is not None:
                    left.cancel()
            with contextlib.suppress(Exception):
                writer.close()

    async def _read_frame(
        self, conn: Connection, reader: asyncio.StreamReader, sender: asyncio.Future[None]
    ) -> tuple[bytes, int] | None:
        """The next request frame and the bytes of it taken from the pool (released when
        its request is done; 0 before authentication); None when the connection is to be
        closed. Raises TimeoutError when a deadline closes it."""
        head = await self._read_head(conn, reader, sender)
        if head is None:
            return None
        size = int.from_bytes(head, "big", signed=True)
        limit = (
            min(self._max_request_bytes, self._budget.limit, self._budget.per_connection)
            if conn.authenticated
            else min(self._max_request_bytes, PRE_AUTH_MAX_BYTES)
        )
        smallest = 0 if conn.sasl.get("raw_tokens") else 8  # a raw SASL token has no header
        if size < smallest or size > limit:
            self._warn(
                "kafka listener %s: closed %s: a request frame of %d bytes (at most %d%s)",
                conn.endpoint.listener_name,
                conn.client_host,
                size,
                limit,
                "" if conn.authenticated else " before SASL authentication",
            )
            return None
        pooled = conn.authenticated  # bytes before authentication never come from the pool
        reserve = pooled and conn.principal != ANONYMOUS
        taken = 0
        framed = False
        try:
            if reserve:
                # An identified principal (SASL, or a TLS client certificate): Kafka's
                # MemoryPool. The whole frame is reserved in one step before any of it is
                # read, waiting unread until it fits, so partial frames never hold the pool
                # between them (no deadlock).
                while not self._budget.try_acquire(size, conn.holder):
                    if not await self._until_sender_ends(self._budget.released(), sender):
                        return None
                taken = size
            elif pooled:
                # Anyone (PLAINTEXT, TLS without a client certificate): a size header takes
                # nothing. A new frame is read only while the pool and this connection's
                # share would still hold it; once started, it is read to its end, its bytes
                # counted as they arrive even past the limit, so frames started together
                # never wait for each other's bytes.
                while not self._budget.may_read(size, conn.holder):
                    if not await self._until_sender_ends(self._budget.released(), sender):
                        return None
            # The read deadline starts once the frame is admitted: time spent waiting for
            # the pool (muted, Kafka's term) is not the client's.
            deadline = time.monotonic() + self._read_timeout_s
            body = bytearray()
            while len(body) < size:
                want = min(size - len(body), READ_CHUNK)
                try:
                    chunk = await asyncio.wait_for(reader.read(want), max(deadline - time.monotonic(), 0.0))
                except TimeoutError:
                    self._warn(
                        "kafka listener %s: closed %s: %d of a %d-byte request arrived within "
                        "request.read.timeout.ms (%d)",
                        conn.endpoint.listener_name,
                        conn.client_host,
                        len(body),
                        size,
                        int(self._read_timeout_s * 1000),
                    )
                    raise
                except ConnectionError:
                    return None
                if not chunk:
                    return None  # the client hung up mid-frame
                body += chunk
                if pooled and not reserve:
                    self._budget.hold(len(chunk), conn.holder)
                    taken += len(chunk)
            framed = True
            return bytes(body), taken
        finally:
            if not framed:  # whatever ended the read (hang-up, deadline, cancel): give it back
                self._budget.release(taken, conn.holder)

    async def _read_head(
        self, conn: Connection, reader: asyncio.StreamReader, sender: asyncio.Future[None]
    ) -> bytes | None:
        """A frame's 4-byte size; None at the end of the connection. A connection with no
        request outstanding that sends nothing for connections.max.idle.ms is closed
        (TimeoutError); the size's own bytes must then arrive within request.read.timeout.ms."""
        while True:
            try:
                first = await asyncio.wait_for(reader.read(1), self._idle_timeout_s)
                break
            except TimeoutError:
                if sender.done():
                    return None
                if conn.outstanding:
                    continue  # not idle: requests are being served
                self._warn(
                    "kafka listener %s: closed %s: idle for connections.max.idle.ms (%d)",
                    conn.endpoint.listener_name,
                    conn.client_host,
                    int(self._idle_timeout_s * 1000),
                )
                raise
            except ConnectionError:
                return None
        if not first:
            return None
        try:
            rest = await asyncio.wait_for(reader.readexactly(3), self._read_timeout_s)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return first + rest

    def _release(self, conn: Connection, pooled: int, _: object) -> None:
        conn.outstanding -= 1
        self._budget.release(pooled, conn.holder)

    @staticmethod
    async def _until_sender_ends(step: Coroutine[Any, Any, None], sender: asyncio.Future[None]) -> bool:
        """Run ``step`` (a put on the reply queue) unless the sender ends first (then the
        queue is never read again); whether ``step`` completed."""
        put = asyncio.ensure_future(step)
        await asyncio.wait({put, sender}, return_when=asyncio.FIRST_COMPLETED)
        if put.done():
            return True
        put.cancel()
        return False

    async def _send(
        self, replies: asyncio.Queue[asyncio.Task[bytes | None] | None], writer: asyncio.StreamWriter
    ) -> None:
        """Write the responses in request order; close the connection when done (a request
        that must close it, or the reader's end), which also ends the reading loop."""
        try:
            while True:
                task = await replies.get()
                if task is None:
                    return
                try:
                    data = await task
                except CloseConnection as close:
                    if close.last is not None:  # the request's answer, then the end
                        writer.write(close.last)
                        with contextlib.suppress(ConnectionError):
                            await writer.drain()
                    return
                except asyncio.CancelledError:
                    return
                except Exception:
                    log.exception("kafka-protocol request failed; closing the connection")
                    return
                if data is not None:
                    writer.write(data)
                    try:
                        await writer.drain()
                    except ConnectionError:
                        return
        finally:
            writer.close()

    async def _in_turn(
        self, previous: asyncio.Task[bytes | None] | None, conn: Connection, header: Header, frame: bytes, start: int
    ) -> bytes | None:
        """Serve a request once the connection's previous one is done (Kafka mutes a
        channel until its request is answered): a connection's requests take effect one at
        a time, in arrival order. Behind a request that failed or closes the connection,
        none runs."""
        if previous is not None:
            await asyncio.wait([previous])
            if previous.cancelled() or previous.exception() is not None:
                raise asyncio.CancelledError()
        return await self._dispatch(conn, header, frame, start)

    @staticmethod
    def _refused(api: Api, conn: Connection, header: Header, frame: bytes, start: int) -> bytes | None:
        """UNSUPPORTED_VERSION on each part of a request whose version is not served but
        reads, in that version's response schema; None when it does not read."""
        assert api.refuse is not None
        try:
            payload = read_request(header.api_key, header.api_version, frame, start)
        except MalformedRequest:
            return None
        response = api.refuse(KafkaRequest(header, payload, conn), UNSUPPORTED_VERSION)
        return encode_response(header.correlation_id, response)

    async def _raw_token(
        self, previous: asyncio.Task[bytes | None] | None, conn: Connection, token: bytes
    ) -> bytes | None:
        """One raw SASL token after a SaslHandshake v0: the server's token as a raw
        size-prefixed frame. Raises CloseConnection (no answer) when the exchange fails."""
        if previous is not None:
            await asyncio.wait([previous])
            if previous.cancelled() or previous.exception() is not None:
                raise asyncio.CancelledError()
        api = self._apis.get(SASL_HANDSHAKE_KEY)
        if api is None or api.raw_tokens is None:
            raise CloseConnection()
        token_bind = bind(conn.call())
        try:
            answer = await api.raw_tokens(conn, token)
        finally:
            unbind(token_bind)
        return len(answer).to_bytes(4, "big") + answer

    async def _dispatch(self, conn: Connection, header: Header, frame: bytes, start: int) -> bytes | None:
        if conn.session_expiry is not None and time.monotonic() >= conn.session_expiry:
            self._warn(
                "kafka listener %s: closed %s: its SASL session expired (connections.max.reauth.ms)",
                conn.endpoint.listener_name,
                conn.client_host,
            )
            raise CloseConnection()
        api = self._apis.get(header.api_key)
        if api is None or not api.min_version <= header.api_version <= api.max_version:
            if api is not None and api.refuse is not None:
                refused = self._refused(api, conn, header, frame, start)
                if refused is not None:
                    return refused
            return self._unsupported(header)
        if not conn.authenticated and header.api_key not in SASL_STAGE_KEYS:
            self._warn(
                "kafka listener %s: closed %s: %s before SASL authentication",
                conn.endpoint.listener_name,
                conn.client_host,
                api.name,
            )
            raise CloseConnection()
        try:
            payload = read_request(header.api_key, header.api_version, frame, start)
        except MalformedRequest as exc:
            self._warn("kafka listener %s: closed %s: %s", conn.endpoint.listener_name, conn.client_host, exc)
            raise CloseConnection() from exc
        stats = self._metrics.request(api.name) if self._metrics is not None else None
        began = time.perf_counter()
        token = bind(conn.call())
        try:
            response = await api.handle(KafkaRequest(header, payload, conn))
        except CloseConnection as close:
            if close.response is not None:
                close.last = encode_response(header.correlation_id, close.response)
            raise
        except MalformedRequest as exc:  # a field the schema reads but no request may hold
            self._warn("kafka listener %s: closed %s: %s", conn.endpoint.listener_name, conn.client_host, exc)
            raise CloseConnection() from exc
        finally:
            unbind(token)
            if stats is not None:
                stats.done((time.perf_counter() - began) * 1000.0)
        return None if response is None else encode_response(header.correlation_id, response)
