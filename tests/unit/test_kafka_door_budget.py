"""The Kafka door's request memory and request order, on a door over fake APIs (no
broker): frames a client abandons give their pool bytes back, concurrent large frames
never deadlock the pool, time waiting for the pool is not read time, and a connection's
requests run one at a time in arrival order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from kbroker.api.request_budget import RequestPool
from kbroker.doors.kafka import server as door_server
from kbroker.doors.kafka.server import Api, KafkaProtocolServer, KafkaRequest
from kbroker.security.listeners import EndPoint
from kbroker.security.principal import KafkaPrincipal

KIB = 1024
MIB = 1024 * KIB
PRODUCE, SASL_HANDSHAKE, SASL_AUTHENTICATE = 0, 17, 36


@pytest.fixture(autouse=True)
def _raw_payloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Payloads are not decoded and responses are the handler's bytes, so a frame can be
    any size and a handler answers anything."""
    monkeypatch.setattr(door_server, "read_request", lambda key, version, frame, start: frame[start:])
    monkeypatch.setattr(
        door_server,
        "encode_response",
        lambda cid, response: (4 + len(response)).to_bytes(4, "big") + cid.to_bytes(4, "big") + response,
    )


def frame(size: int, correlation: int = 1, api_key: int = PRODUCE) -> bytes:
    """A request frame of ``size`` bytes after its size prefix (header v1, null client id)."""
    head = api_key.to_bytes(2, "big") + (3).to_bytes(2, "big") + correlation.to_bytes(4, "big") + b"\xff\xff"
    return size.to_bytes(4, "big") + head + b"\0" * (size - len(head))


async def read_response(reader: asyncio.StreamReader) -> int:
    """The correlation id of the next response."""
    size = int.from_bytes(await reader.readexactly(4), "big")
    return int.from_bytes((await reader.readexactly(size))[:4], "big")


Handler = Callable[[KafkaRequest], Awaitable[Any]]


async def start_door(
    pool: RequestPool,
    produce: Handler,
    *,
    protocol: str = "PLAINTEXT",
    read_timeout_s: float = 5.0,
    max_request_bytes: int = 8 * MIB,
) -> tuple[KafkaProtocolServer, int]:
    async def handshake(request: KafkaRequest) -> bytes:
        return b"ok"

    async def authenticate(request: KafkaRequest) -> bytes:  # anyone is alice
        request.connection.authenticated = True
        request.connection.principal = KafkaPrincipal.user("alice")
        return b"ok"

    apis = {
        PRODUCE: Api(PRODUCE, "Produce", 0, 9, produce),
        SASL_HANDSHAKE: Api(SASL_HANDSHAKE, "SaslHandshake", 0, 9, handshake),
        SASL_AUTHENTICATE: Api(SASL_AUTHENTICATE, "SaslAuthenticate", 0, 9, authenticate),
    }
    server = KafkaProtocolServer(
        apis,
        lambda header: b"",
        max_request_bytes=max_request_bytes,
        budget=pool,
        read_timeout_s=read_timeout_s,
        idle_timeout_s=30.0,
    )
    port = await server.start(EndPoint("DOOR", "127.0.0.1", 0, protocol))
    return server, port


async def connect(port: int, sasl: bool = False) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if sasl:
        writer.write(frame(16, 900, SASL_HANDSHAKE) + frame(16, 901, SASL_AUTHENTICATE))
        assert [await read_response(reader) for _ in range(2)] == [900, 901]
    return reader, writer


async def answer(request: KafkaRequest) -> bytes:
    return b"done"


def test_a_client_hanging_up_mid_frame_gives_its_pool_bytes_back() -> None:
    """Before: every hang-up inside a frame left its bytes taken (0.86, 1.72, 2.59 MB)."""

    async def run() -> None:
        pool = RequestPool("client", 8 * MIB, 8 * MIB)
        server, port = await start_door(pool, answer)
        try:
            for _ in range(3):
                reader, writer = await connect(port)
                writer.write(frame(1_000_000)[: 4 + 600_000])  # a 1 MB frame, 600 KB of it, then gone
                await writer.drain()
                await asyncio.sleep(0.3)
                writer.close()
                await asyncio.sleep(0.3)
                assert pool.used == 0, f"{pool.used} bytes of an abandoned frame still held"
            reader, writer = await connect(port)  # and the door still serves
            writer.write(frame(1_000_000, 7))
            assert await asyncio.wait_for(read_response(reader), 5) == 7
            writer.close()
        finally:
            await server.stop()
        assert pool.used == 0

    asyncio.run(run())


@pytest.mark.parametrize("sasl", [False, True], ids=["anyone", "identified"])
def test_concurrent_large_frames_never_deadlock_the_pool(sasl: bool) -> None:
    """4 MiB pool, 4 connections each sending a 1.2 MiB frame at once. Before: each
    connection took its bytes 256 KiB at a time, the pool filled with four incomplete
    frames (used 4,194,304) and all four were closed at the read timeout."""

    async def run() -> None:
        pool = RequestPool("client", 4 * MIB, 4 * MIB)
        server, port = await start_door(
            pool, answer, protocol="SASL_PLAINTEXT" if sasl else "PLAINTEXT", read_timeout_s=3.0
        )
        try:
            clients = [await connect(port, sasl) for _ in range(4)]
            size = int(1.2 * MIB)

            async def send(i: int) -> int:
                reader, writer = clients[i]
                writer.write(frame(size, i))
                await writer.drain()
                return await read_response(reader)

            got = await asyncio.wait_for(asyncio.gather(*(send(i) for i in range(4))), 10)
            assert got == [0, 1, 2, 3]
            await asyncio.sleep(0.1)
            assert pool.used == 0
            for _, writer in clients:
                writer.close()
        finally:
            await server.stop()

    asyncio.run(run())


def test_an_identified_principal_reserves_its_whole_frame_at_once() -> None:
    """A SASL-authenticated connection's frame takes its declared size before its body
    is read (Kafka's MemoryPool); an anonymous one's size header takes nothing."""

    async def run() -> None:
        for sasl, expected in ((True, 2 * MIB), (False, 0)):
            pool = RequestPool("client", 4 * MIB, 4 * MIB)
            server, port = await start_door(pool, answer, protocol="SASL_PLAINTEXT" if sasl else "PLAINTEXT")
            try:
                _reader, writer = await connect(port, sasl)
                writer.write(frame(2 * MIB)[:4])  # the size, nothing of the body
                await writer.drain()
                await asyncio.sleep(0.3)
                assert pool.used == expected
                writer.close()
                await asyncio.sleep(0.3)
                assert pool.used == 0
            finally:
                await server.stop()

    asyncio.run(run())


@pytest.mark.parametrize("sasl", [False, True], ids=["anyone", "identified"])
def test_time_waiting_for_the_pool_is_not_read_time(sasl: bool) -> None:
    """A parked request holds most of the pool for three read timeouts; a frame waiting
    for room is then read and answered, not closed. Before: closed at the read timeout."""

    async def run() -> None:
        parked = asyncio.Event()
        release = asyncio.Event()

        async def produce(request: KafkaRequest) -> bytes:
            if request.header.correlation_id == 1:  # a parked acks=all Produce
                parked.set()
                await release.wait()
            return b"done"

        pool = RequestPool("client", 1 * MIB, 1 * MIB)
        server, port = await start_door(
            pool, produce, protocol="SASL_PLAINTEXT" if sasl else "PLAINTEXT", read_timeout_s=0.5
        )
        try:
            (r1, w1), (r2, w2) = await connect(port, sasl), await connect(port, sasl)
            w1.write(frame(900 * KIB, 1))
            await asyncio.wait_for(parked.wait(), 5)
            w2.write(frame(900 * KIB, 2))
            waiting = asyncio.ensure_future(read_response(r2))
            await asyncio.sleep(1.5)
            assert not waiting.done()  # muted, not closed
            release.set()
            assert await asyncio.wait_for(read_response(r1), 5) == 1
            assert await asyncio.wait_for(waiting, 5) == 2
            for w in (w1, w2):
                w.close()
        finally:
            await server.stop()

    asyncio.run(run())


def test_a_connections_requests_run_one_at_a_time_in_arrival_order() -> None:
    """Pipelined requests whose handlers take different times: each starts only after
    the previous one ended, and the responses come in request order. Before: all ran at
    once and finished in any order."""

    async def run() -> None:
        events: list[tuple[str, int]] = []

        async def produce(request: KafkaRequest) -> bytes:
            cid = request.header.correlation_id
            events.append(("start", cid))
            await asyncio.sleep(0.02 * ((7 * cid) % 5))  # later requests are often quicker
            events.append(("end", cid))
            return b"done"

        pool = RequestPool("client", 8 * MIB, 8 * MIB)
        server, port = await start_door(pool, produce)
        try:
            reader, writer = await connect(port)
            writer.write(b"".join(frame(64, i) for i in range(20)))
            got = [await asyncio.wait_for(read_response(reader), 5) for _ in range(20)]
            assert got == list(range(20))
            assert events == [(what, i) for i in range(20) for what in ("start", "end")]
            writer.close()
        finally:
            await server.stop()

    asyncio.run(run())


def test_behind_a_request_that_closes_the_connection_nothing_runs() -> None:
    async def run() -> None:
        ran: list[int] = []

        async def produce(request: KafkaRequest) -> bytes:
            cid = request.header.correlation_id
            ran.append(cid)
            if cid == 2:
                raise door_server.CloseConnection()
            return b"done"

        pool = RequestPool("client", 8 * MIB, 8 * MIB)
        server, port = await start_door(pool, produce)
        try:
            reader, writer = await connect(port)
            writer.write(b"".join(frame(64, i) for i in range(6)))
            assert [await asyncio.wait_for(read_response(reader), 5) for _ in range(2)] == [0, 1]
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed after request 2
            await asyncio.sleep(0.1)
            assert ran == [0, 1, 2]
            assert pool.used == 0
            writer.close()
        finally:
            await server.stop()

    asyncio.run(run())
