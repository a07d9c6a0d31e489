"""The follower's fetch session (Kafka's FetchSessionHandler in the ReplicaFetcher) against
a leader ReplicaManager in this process: a full fetch, then incremental fetches naming only
what changed (none when idle, with no per-partition work on the follower either), forgotten
partitions, and a full fetch again after a session error or a connection error."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import LeaderAndIsr
from kbroker.purgatory import Purgatory
from kbroker.replication.fetch_session import FetchSessionCache, FetchSpec
from kbroker.replication.fetcher import ReplicaFetcher, ReplicaFetcherManager
from kbroker.replication.partition import Partition
from kbroker.replication.replica_manager import FetchResult, ReplicaManager
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kbroker.storage.log_manager import LogManager
from kclient.errors import BrokerResponseError, KafkaConnectionError
from kclient.fetch_session import FetchSessionHandler, PartitionData
from kclient.proto.kbroker.v1 import log_pb2
from tests.support import serve_offset_for_leader_epoch, wait_until
from tests.unit.test_fetch_sessions import FOLLOWER, LEADER, PARTITIONS, batch, leader


class SessionLeader:
    """A LeaderEndPoint over a leader ReplicaManager, serving Fetch as BrokerService does."""

    address = "in-process"

    def __init__(self, rm: ReplicaManager) -> None:
        self.rm = rm
        self.requests: list[log_pb2.FetchRequest] = []
        self.fail_next: Exception | None = None

    def fetch(self, request: log_pb2.FetchRequest, timeout_s: float) -> log_pb2.FetchResponse:
        self.requests.append(request)
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        specs = [
            FetchSpec(
                t.name, p.index, p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch, p.log_start_offset
            )
            for t in request.topics
            for p in t.partitions
        ]
        forgotten = [(t.name, i) for t in request.forgotten_topics_data for i in t.partitions]
        epoch = request.session_epoch if request.HasField("session_epoch") else -1
        ctx = self.rm.fetch_sessions.new_context(request.session_id, epoch, specs, forgotten, request.replica_id)
        resp = log_pb2.FetchResponse()
        if ctx.error is not None:
            resp.error_code = ctx.error.errno  # type: ignore[assignment]
            return resp
        wait = min(request.max_wait_ms, 200)

        async def run() -> list[tuple[FetchSpec, FetchResult]]:
            loop = asyncio.get_running_loop()

            async def offload(fn: Callable[..., Any], *args: Any) -> Any:
                return await loop.run_in_executor(None, fn, *args)

            if ctx.session is None:
                results = await self.rm.fetch_async(offload, request.replica_id, wait, 1, request.max_bytes, specs)
                return list(zip(specs, results, strict=True))
            return await self.rm.fetch_session_async(offload, request.replica_id, wait, 1, request.max_bytes, ctx, {})

        entries = asyncio.run(run())
        resp.session_id = ctx.session.id if ctx.session is not None else 0
        for s, r in entries:
            tr = resp.topics.add(name=s.topic)
            pr = tr.partitions.add(index=s.partition)
            if r.error is not None:
                assert isinstance(r.error, BrokerResponseError)
                pr.error_code = r.error.errno  # type: ignore[assignment]
            elif r.read is not None:
                pr.high_watermark = r.read.high_watermark
                pr.log_start_offset = r.read.log_start_offset
                pr.log_end_offset = r.read.log_end_offset
                pr.records = r.read.records
        return resp

    def offset_for_leader_epoch(
        self, request: log_pb2.OffsetForLeaderEpochRequest, timeout_s: float
    ) -> log_pb2.OffsetForLeaderEpochResponse:
        return serve_offset_for_leader_epoch(request, lambda topic, index: self.rm.partition(topic, index).log)

    def close(self) -> None:
        pass

    def named(self, request: log_pb2.FetchRequest) -> list[tuple[str, int]]:
        return [(t.name, p.index) for t in request.topics for p in t.partitions]


def followers(tmp_path: Path) -> dict[int, Partition]:
    out = {}
    for i in range(PARTITIONS):
        p = Partition(
            "t", i, FOLLOWER, Log.open(tmp_path / "follower" / f"t-{i}", LogConfig()), isr_writer=lambda _p, s: 1
        )
        p.make_follower(LeaderAndIsr(LEADER, 0, [LEADER, FOLLOWER], 1, 0), [LEADER, FOLLOWER])
        out[i] = p
    return out


@pytest.fixture
def setup(tmp_path: Path) -> Any:
    rm = leader(tmp_path)
    endpoint = SessionLeader(rm)
    parts = followers(tmp_path)
    fetcher = ReplicaFetcher(FOLLOWER, LEADER, endpoint, max_wait_ms=200, max_bytes=1 << 20, purgatory=Purgatory())
    for p in parts.values():
        fetcher.add(p, 0)
    yield rm, endpoint, parts, fetcher
    fetcher.shutdown()
    rm.shutdown()


def produce(rm: ReplicaManager, index: int, values: list[bytes]) -> None:
    rm.partition("t", index).append_as_leader(batch(values), 1, 1)
    rm.purgatory.progress(("t", index))


def test_the_handler_sends_what_changed_and_forgets() -> None:
    h = FetchSessionHandler()
    wanted = {("t", 0): PartitionData(0, 0, 0, 100), ("t", 1): PartitionData(0, 0, 0, 100)}
    first = h.build(wanted.get, lambda: list(wanted))
    assert first.full and first.epoch == 0 and first.session_id == 0 and len(first.to_send) == 2
    assert h.handle_response(first, 77, 0) and h.session_id == 77 and h.epoch == 1
    idle = h.build(wanted.get, lambda: list(wanted))
    assert not idle.full and idle.to_send == {} and idle.forgotten == [] and idle.epoch == 1
    assert h.handle_response(idle, 77, 0) and h.epoch == 2
    wanted[("t", 0)] = PartitionData(5, 0, 0, 100)
    h.touch(("t", 0))
    h.touch(("t", 1))  # touched but unchanged: not sent
    del wanted[("t", 1)]
    h.touch(("t", 1))
    step = h.build(wanted.get, lambda: list(wanted))
    assert step.to_send == {("t", 0): PartitionData(5, 0, 0, 100)} and step.forgotten == [("t", 1)]
    assert not h.handle_response(step, 0, 70)  # FETCH_SESSION_ID_NOT_FOUND
    again = h.build(wanted.get, lambda: list(wanted))
    assert again.full and again.session_id == 77 and again.epoch == 0  # closes 77, opens a new one
    assert list(again.to_send) == [("t", 0)]
    assert h.handle_response(again, 0, 0) and h.build(wanted.get, lambda: list(wanted)).full  # no room: full again


def test_a_follower_fetches_incrementally_and_idles_on_empty_fetches(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rm, endpoint, parts, fetcher = setup
    produce(rm, 2, [b"a", b"b"])
    fetcher.start()
    wait_until(lambda: parts[2].log.log_end_offset == 2 and parts[2].high_watermark == 2, 10, "caught up")
    first = endpoint.requests[0]
    assert first.session_epoch == 0 and len(endpoint.named(first)) == PARTITIONS
    wanted_calls = 0
    original = ReplicaFetcher._wanted

    def counting(self: ReplicaFetcher, *args: Any) -> Any:
        nonlocal wanted_calls
        wanted_calls += 1
        return original(self, *args)

    monkeypatch.setattr(ReplicaFetcher, "_wanted", counting)
    seen = len(endpoint.requests)
    wait_until(lambda: len(endpoint.requests) >= seen + 3, 10, "idle fetches")
    idle = endpoint.requests[-2:]
    assert all(r.session_id > 0 and r.session_epoch > 0 and not r.topics and not r.forgotten_topics_data for r in idle)
    assert wanted_calls == 0  # the follower looked at no partition either
    produce(rm, 5, [b"c"])
    wait_until(lambda: parts[5].log.log_end_offset == 1, 10, "the new record")
    wait_until(lambda: any(endpoint.named(r) == [("t", 5)] for r in endpoint.requests[seen:]), 10, "the new offset")
    assert all(len(endpoint.named(r)) <= 1 for r in endpoint.requests[seen:])


def test_a_follower_starts_a_full_fetch_again_after_a_session_error(setup: Any) -> None:
    rm, endpoint, parts, fetcher = setup
    fetcher.start()
    wait_until(lambda: fetcher.session.incremental, 10, "a session")
    old = fetcher.session.session_id
    rm.purgatory.remove_listener(rm.fetch_sessions.on_progress)
    rm.fetch_sessions = FetchSessionCache()  # the leader restarted: its sessions are gone
    rm.fetch_sessions.attach(rm.purgatory)
    wait_until(lambda: fetcher.session.session_id not in (0, old), 10, "a new session")
    produce(rm, 0, [b"x"])
    wait_until(lambda: parts[0].log.log_end_offset == 1, 10, "replicated through the new session")
    errors = [r for r in endpoint.requests if r.session_id == old and r.session_epoch > 0]
    assert errors  # the incremental fetch the leader no longer knew
    full = [r for r in endpoint.requests if r.session_epoch == 0]
    assert len(full) == 2 and len(endpoint.named(full[-1])) == PARTITIONS


def test_a_connection_error_closes_the_session_with_the_next_full_fetch(setup: Any) -> None:
    rm, endpoint, _, fetcher = setup
    fetcher.start()
    wait_until(lambda: fetcher.session.incremental, 10, "a session")
    old = fetcher.session.session_id
    endpoint.fail_next = KafkaConnectionError("connection reset")
    wait_until(lambda: fetcher.session.incremental and fetcher.session.session_id != old, 10, "a new session")
    full = [r for r in endpoint.requests if r.session_epoch == 0]
    assert full[-1].session_id == old  # named so that the leader closes it
    assert rm.fetch_sessions.get(old) is None and len(rm.fetch_sessions) == 1


def test_a_removed_partition_is_forgotten(setup: Any) -> None:
    rm, endpoint, parts, fetcher = setup
    fetcher.start()
    wait_until(lambda: fetcher.session.incremental, 10, "a session")
    fetcher.remove(("t", 3))
    wait_until(
        lambda: any(
            [(t.name, list(t.partitions)) for t in r.forgotten_topics_data] == [("t", [3])] for r in endpoint.requests
        ),
        10,
        "forgotten",
    )
    session = rm.fetch_sessions.get(fetcher.session.session_id)
    assert session is not None
    wait_until(lambda: ("t", 3) not in session.partitions, 10, "gone from the leader's session")
    produce(rm, 3, [b"gone"])
    time.sleep(0.5)
    assert parts[3].log.log_end_offset == 0


def test_a_new_leader_epoch_truncates_then_fetches_in_the_same_session(setup: Any) -> None:
    rm, endpoint, parts, fetcher = setup
    produce(rm, 4, [b"a"])
    fetcher.start()
    wait_until(lambda: parts[4].log.log_end_offset == 1 and fetcher.session.incremental, 10, "caught up")
    state = LeaderAndIsr(LEADER, 1, [LEADER, FOLLOWER], 1, 1)
    rm.on_partition_change("t", 4, [LEADER, FOLLOWER], state, {})  # a new epoch, same leader
    parts[4].make_follower(state, [LEADER, FOLLOWER])
    seen = len(endpoint.requests)
    fetcher.remove(("t", 4))
    fetcher.add(parts[4], 1)  # what ReplicaFetcherManager.follow does
    produce(rm, 4, [b"b"])
    wait_until(lambda: parts[4].log.log_end_offset == 2, 10, "fetched in the new epoch")
    later = endpoint.requests[seen:]
    # Truncated first (forgotten meanwhile if a fetch went out), then named with the new epoch.
    readded = [p for r in later for t in r.topics for p in t.partitions if p.index == 4]
    assert readded and readded[-1].current_leader_epoch == 1
    assert all(r.session_epoch > 0 for r in later)  # all in the same session


def test_a_change_in_the_broker_set_re_points_only_partitions_whose_leader_moved(tmp_path: Path) -> None:
    rm = leader(tmp_path)
    parts = followers(tmp_path)
    addresses = {LEADER: "leader:1"}
    endpoints: list[SessionLeader] = []

    class Counting(SessionLeader):
        truncations = 0

        def offset_for_leader_epoch(
            self, request: log_pb2.OffsetForLeaderEpochRequest, timeout_s: float
        ) -> log_pb2.OffsetForLeaderEpochResponse:
            self.truncations += 1
            return super().offset_for_leader_epoch(request, timeout_s)

    def endpoint(address: str) -> SessionLeader:
        e = Counting(rm)
        e.address = address
        endpoints.append(e)
        return e

    manager = ReplicaFetcherManager(FOLLOWER, addresses.get, Purgatory(), max_wait_ms=200, endpoint=endpoint)
    try:
        for p in parts.values():
            manager.follow(p, LEADER, 0)
        produce(rm, 0, [b"a"])
        wait_until(lambda: parts[0].log.log_end_offset == 1, 10, "fetched")
        first = endpoints[0]
        seen, truncations = len(first.requests), first.truncations
        for p in parts.values():  # same leader, address and epoch: nothing to re-point
            manager.repoint(p, LEADER, 0)
        produce(rm, 1, [b"b"])
        wait_until(lambda: parts[1].log.log_end_offset == 1, 10, "fetched after the re-point")
        assert len(endpoints) == 1 and first.truncations == truncations  # no truncation round
        later = first.requests[seen:]
        # The session went on: no full fetch naming every partition again, nothing forgotten.
        assert all(r.session_epoch > 0 and not r.forgotten_topics_data for r in later)
        addresses[LEADER] = "leader:2"  # the leader came back on a new address
        for p in parts.values():
            manager.repoint(p, LEADER, 0)
        assert [e.address for e in endpoints] == ["leader:1", "leader:2"]
        produce(rm, 2, [b"c"])
        wait_until(lambda: parts[2].log.log_end_offset == 1, 10, "fetched from the new address")
        assert sorted({i for r in endpoints[1].requests for _, i in endpoints[1].named(r)}) == sorted(parts)
    finally:
        manager.shutdown()
        rm.shutdown()


def test_a_broker_in_controlled_shutdown_stops_fetching_what_it_left_the_isr_of(tmp_path: Path) -> None:
    """The controller's controlled shutdown takes the leaving broker out of the ISRs; its
    fetches would only make the leaders try to add it back, so it stops them (Kafka's
    controller sends StopReplica); partitions it is still in the ISR of go on."""
    logs = LogManager(tmp_path / "data", LogConfig())
    logs.startup()
    zk = SimpleNamespace(connected=True, write_isr=lambda *a: 1)
    rm = ReplicaManager(FOLLOWER, logs, LogConfig(), cast(ZkClient, zk), {LEADER: "leader:1"}.get)
    rm.start()
    try:
        for i in range(2):
            rm.on_partition_change("t", i, [LEADER, FOLLOWER], LeaderAndIsr(LEADER, 0, [LEADER, FOLLOWER], 1, 0), {})
        assert sorted(rm.fetchers._owner) == [("t", 0), ("t", 1)]
        rm.begin_controlled_shutdown()
        rm.on_partition_change("t", 0, [LEADER, FOLLOWER], LeaderAndIsr(LEADER, 1, [LEADER], 1, 1), {})
        rm.on_partition_change("t", 1, [LEADER, FOLLOWER], LeaderAndIsr(LEADER, 1, [LEADER, FOLLOWER], 1, 1), {})
        assert sorted(rm.fetchers._owner) == [("t", 1)]
        assert rm.partition("t", 0).leader_epoch == 1  # the new state is applied all the same
        rm.on_brokers_change()  # a change in the set of brokers does not bring it back
        assert sorted(rm.fetchers._owner) == [("t", 1)]
    finally:
        rm.shutdown()
        logs.shutdown()
