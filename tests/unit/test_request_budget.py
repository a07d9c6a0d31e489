"""The request pool (queued.max.request.bytes): its limit, a connection's share, bytes
taken as they arrive, waiting rather than failing, reading only with room for the
largest message, giving freed memory back, and the settings that configure it."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from kbroker.api.call_context import CallContext
from kbroker.api.request_budget import INTER_BROKER_METADATA_KEY, MemoryReclaimer, RequestBudgets, RequestPool
from kbroker.config import build_config
from kbroker.doors.grpc.server import GrpcServer
from kbroker.security.listeners import EndPoint
from kbroker.security.principal import KafkaPrincipal
from kclient.errors import InvalidConfigError
from kclient.proto.kbroker.v1 import broker_pb2_grpc, metadata_pb2

BASE = {"broker.id": "0", "zookeeper.connect": "127.0.0.1:2181", "log.dirs": "/tmp/x"}


def test_the_pool_takes_what_fits_and_one_oversized_request_alone() -> None:
    pool = RequestPool("client", 100, 100)
    assert pool.try_acquire(60) and not pool.try_acquire(50) and pool.try_acquire(40)
    assert pool.free == 0
    pool.release(100)
    assert pool.try_acquire(500)  # larger than the pool, admitted while nothing else is held
    assert not pool.try_acquire(1)


def test_one_connection_holds_at_most_its_share() -> None:
    pool = RequestPool("client", 100, 40)
    a, b = pool.holder(), pool.holder()
    assert pool.take_up_to(64, a) == 40  # bytes about to be read: only what the share allows
    assert pool.take_up_to(64, a) == 0
    assert pool.take_up_to(64, b) == 40
    assert pool.take_up_to(64, pool.holder()) == 20  # and only what the pool has left
    pool.release(40, a)
    assert a.held == 0 and pool.used == 60 and pool.take_up_to(10, a) == 10


def test_a_waiting_request_is_admitted_when_bytes_are_released() -> None:
    async def run() -> None:
        pool = RequestPool("client", 100, 100)
        assert pool.try_acquire(90)
        waiter = asyncio.ensure_future(pool.acquire(50))
        await asyncio.sleep(0.01)
        assert not waiter.done()  # waits, does not fail
        pool.release(90)
        await asyncio.wait_for(waiter, 5)
        assert pool.used == 50

    asyncio.run(run())


def test_a_read_starts_only_with_room_for_the_largest_message() -> None:
    mib = 1 << 20
    pool = RequestPool("client", 256 * mib, 128 * mib)
    a, b = pool.holder(), pool.holder()
    assert pool.may_read(100 * mib, a)
    pool.try_acquire(95 * mib, a)  # one 95 MiB request held: its connection reads no other
    assert not pool.may_read(100 * mib, a)
    assert pool.may_read(100 * mib, b)
    pool.try_acquire(95 * mib, b)  # 190 MiB held: 100 MiB more would not fit the pool
    assert not pool.may_read(100 * mib, pool.holder())
    pool.release(95 * mib, a)
    assert pool.may_read(100 * mib, a)
    # Next to nothing held (a parked long poll): the next request is read whatever it is.
    small = RequestPool("client", 4 * mib, 4 * mib)
    c = small.holder()
    small.try_acquire(300, c)
    assert small.may_read(4 * mib, c)
    small.try_acquire(2 * mib, c)
    assert not small.may_read(4 * mib, c) and small.may_read(1 * mib, c)
    tiny = RequestPool("client", 1000, 1000)  # a quarter of the pool counts as next to nothing
    tiny.try_acquire(300)
    assert not tiny.may_read(1000) and tiny.may_read(700)
    tiny.try_acquire(700)
    assert not tiny.may_read(1)


def test_released_request_bytes_are_given_back_once_enough_add_up() -> None:
    calls: list[str] = []

    async def run() -> None:
        reclaimer = MemoryReclaimer(
            100,
            0.05,
            collect_interval_s=0.5,
            collect=lambda: calls.append("collect"),
            trim=lambda: calls.append("trim"),
        )
        budgets = RequestBudgets(1000, 1000, 1000, reclaimer)
        budgets.client.try_acquire(90)
        budgets.client.release(90)
        await asyncio.sleep(0.01)
        assert calls == []  # 90 bytes: not worth a collection
        budgets.inter_broker.try_acquire(20)
        budgets.inter_broker.release(20)  # both pools add up
        await asyncio.sleep(0.01)  # later, not inside release: the caller still holds the request
        assert calls == ["collect", "trim"] and reclaimer.reclaims == 1
        for _ in range(3):  # a burst: one more reclaim, no sooner than the interval
            budgets.client.try_acquire(200)
            budgets.client.release(200)
        await asyncio.sleep(0.01)
        assert reclaimer.reclaims == 1
        await asyncio.sleep(0.1)
        assert reclaimer.reclaims == 2 and calls.count("trim") == 2
        # A full collection on the loop only rarely (COLLECT_INTERVAL_S): trims do the rest,
        # and one more collection follows once the interval is over.
        assert calls.count("collect") == 1 and reclaimer.collections == 1
        await asyncio.sleep(0.5)
        assert calls.count("collect") == 2 and reclaimer.reclaims == 2
        await reclaimer.received(50)  # a small request read: no trim
        assert calls.count("trim") == 2
        await reclaimer.received(500)  # a large one: trimmed before it is decoded
        assert calls.count("trim") == 3

    asyncio.run(run())


class _Recording(broker_pb2_grpc.BrokerServicer):  # type: ignore[misc]
    """Metadata answers empty and notes which pool held the request meanwhile."""

    def __init__(self, budgets: RequestBudgets) -> None:
        self.budgets = budgets
        self.pools: list[str] = []

    async def Metadata(self, request: Any, context: Any) -> metadata_pb2.MetadataResponse:
        held = [p.name for p in (self.budgets.client, self.budgets.inter_broker) if p.used]
        self.pools.append(",".join(held))
        return metadata_pb2.MetadataResponse()


@pytest.mark.parametrize("dedicated", [False, True], ids=["shared listener", "dedicated listener"])
def test_only_a_trusted_broker_is_served_from_the_inter_broker_budget(dedicated: bool) -> None:
    """The server's routing: the marker (or, on a dedicated inter-broker listener, any
    call) counts only for a caller allowed ClusterAction; a client adding the marker is
    served from the client budget. Before: anyone with the marker got the inter-broker
    budget, and two listeners made the inter-broker one "dedicated" by their count."""
    budgets = RequestBudgets(1 << 20, 1 << 20, 1 << 20)
    servicer = _Recording(budgets)

    def authenticate(method: str, context: Any) -> CallContext:
        who = dict(context.invocation_metadata()).get("who", "User:ANONYMOUS")
        return CallContext(KafkaPrincipal.parse(who), "INTERNAL", "PLAINTEXT", "127.0.0.1")

    listeners = [
        (EndPoint("INTERNAL", "127.0.0.1", 0, "PLAINTEXT"), authenticate),
        (EndPoint("CLIENTS", "127.0.0.1", 0, "PLAINTEXT"), authenticate),
    ]
    server = GrpcServer(
        lambda offload: servicer,
        listeners,
        workers=1,
        max_request_bytes=1 << 20,
        budgets=budgets,
        inter_broker_listener="INTERNAL",
        dedicated_inter_broker_listener=dedicated,
        trusted_broker=lambda call: str(call.principal) == "User:broker",
    )
    ports = server.start()
    try:
        for listener, metadata in [
            ("INTERNAL", [(INTER_BROKER_METADATA_KEY, "1"), ("who", "User:broker")]),  # the broker
            ("INTERNAL", [(INTER_BROKER_METADATA_KEY, "1"), ("who", "User:alice")]),  # a client with the marker
            ("INTERNAL", [("who", "User:broker")]),  # the broker, unmarked
            ("INTERNAL", [("who", "User:alice")]),
            ("CLIENTS", [(INTER_BROKER_METADATA_KEY, "1"), ("who", "User:broker")]),
        ]:
            with grpc.insecure_channel(f"127.0.0.1:{ports[listener]}") as channel:
                broker_pb2_grpc.BrokerStub(channel).Metadata(
                    metadata_pb2.MetadataRequest(topics=["t"]), metadata=metadata, timeout=10
                )
    finally:
        server.stop(1)
    unmarked_broker = "inter-broker" if dedicated else "client"
    assert servicer.pools == ["inter-broker", "client", unmarked_broker, "client", "client"]


def test_the_request_memory_settings() -> None:
    cfg = build_config(BASE)
    assert cfg.connections_max_idle_ms == 600000 and cfg.request_read_timeout_ms == 30000
    assert cfg.per_connection_request_bytes == 134217728  # half the 256 MiB pool
    assert cfg.inter_broker_queued_max_request_bytes == 67108864
    small = build_config({**BASE, "queued.max.request.bytes": "3145728", "socket.request.max.bytes": "2097152"})
    assert small.per_connection_request_bytes == 2097152  # at least one largest request
    set_ = build_config({**BASE, "queued.max.request.bytes.per.connection": "1048576"})
    assert set_.per_connection_request_bytes == 1048576
    with pytest.raises(InvalidConfigError, match=r"connections\.max\.idle\.ms"):
        build_config({**BASE, "connections.max.idle.ms": "0"})


def test_a_dedicated_inter_broker_listener_is_one_named_by_configuration() -> None:
    two = {**BASE, "listeners": "INTERNAL://127.0.0.1:9092,CLIENTS://127.0.0.1:9093"}
    two["listener.security.protocol.map"] = "INTERNAL:PLAINTEXT,CLIENTS:PLAINTEXT"
    assert build_config({**two, "inter.broker.listener.name": "INTERNAL"}).dedicated_inter_broker_listener
    assert not build_config(BASE).dedicated_inter_broker_listener  # one listener: shared with clients
    one = {**BASE, "listeners": "PLAINTEXT://127.0.0.1:9092", "security.inter.broker.protocol": "PLAINTEXT"}
    assert not build_config(one).dedicated_inter_broker_listener
    defaulted = {**two, "listeners": "PLAINTEXT://127.0.0.1:9092,CLIENTS://127.0.0.1:9093"}
    defaulted["listener.security.protocol.map"] = "PLAINTEXT:PLAINTEXT,CLIENTS:PLAINTEXT"
    assert not build_config(defaulted).dedicated_inter_broker_listener  # two listeners alone say nothing
