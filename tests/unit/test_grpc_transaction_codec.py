"""The gRPC door's codec of the transaction work (issue 24) alone, over a fake core: the
isolation level of Fetch and ListOffsets reaches the core, the last stable offset and the
aborted transactions come out, and a transactional Produce names its transactional id."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from kbroker.api.log_api import Fetch, FetchAnswer, OffsetQuery
from kbroker.doors.grpc.servicer import BrokerService
from kbroker.replication.partition import ReadResult
from kbroker.replication.replica_manager import FetchResult, OffsetResult, ProduceResult
from kclient.errors import NotLeaderForPartitionError
from kclient.proto.kbroker.v1 import common_pb2, log_pb2
from kclient.structs import AbortedTransaction, IsolationLevel
from kclient.transport import ERROR_CODE_METADATA_KEY


class Aborted(Exception):
    pass


class FakeContext:
    """The parts of a gRPC servicer context the codecs use."""

    def __init__(self) -> None:
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.aborted = (code, details)
        raise Aborted(details)


class FakeLog:
    """The core's LogApi: answers each fetched partition with ``read`` and records what
    it was asked."""

    def __init__(self, read: ReadResult | None = None) -> None:
        self.read = read
        self.asked: list[Any] = []

    async def produce(self, acks: int, timeout_ms: int, entries: list[Any], **kwargs: Any) -> Any:
        self.asked.append((acks, timeout_ms, entries, kwargs))
        return {tp: ProduceResult(None, 7, -1, 0) for tp, _ in entries}

    async def fetch(self, fetch: Fetch) -> FetchAnswer:
        self.asked.append(fetch)
        if self.read is None:
            return FetchAnswer([(s, FetchResult(NotLeaderForPartitionError("moved"))) for s in fetch.partitions])
        return FetchAnswer([(s, FetchResult(None, self.read)) for s in fetch.partitions])

    def list_offsets(self, replica_id: int, queries: list[OffsetQuery]) -> list[OffsetResult]:
        self.asked.append(queries)
        return [OffsetResult(None, 42, -1, 3) for _ in queries]


async def _offload(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _service(log: FakeLog, **areas: Any) -> BrokerService:
    core = SimpleNamespace(
        log=log,
        metadata=None,
        groups=None,
        admin=None,
        cluster=None,
        security=None,
        offload=_offload,
        broker_id=1,
        **areas,
    )
    return BrokerService(core)  # type: ignore[arg-type]


def _fetch_request(**fields: Any) -> log_pb2.FetchRequest:
    request = log_pb2.FetchRequest(**fields)
    request.topics.add(name="t").partitions.add(index=0, fetch_offset=5)
    return request


# --- Fetch --------------------------------------------------------------------------------


def test_fetch_isolation_unset_is_read_uncommitted() -> None:
    log = FakeLog()
    asyncio.run(_service(log).Fetch(_fetch_request(), FakeContext()))  # type: ignore[arg-type]
    [fetch] = log.asked
    assert fetch.isolation_level is IsolationLevel.READ_UNCOMMITTED


def test_fetch_read_committed_reaches_the_core_and_the_answer_carries_lso_and_aborted() -> None:
    read = ReadResult(b"recs", 20, 0, 25, 12, [AbortedTransaction(9, 6), AbortedTransaction(11, 8)])
    log = FakeLog(read)
    request = _fetch_request(isolation_level=common_pb2.READ_COMMITTED)
    resp = asyncio.run(_service(log).Fetch(request, FakeContext()))  # type: ignore[arg-type]
    [fetch] = log.asked
    assert fetch.isolation_level is IsolationLevel.READ_COMMITTED
    [p] = resp.topics[0].partitions
    assert (p.high_watermark, p.last_stable_offset, p.records) == (20, 12, b"recs")
    assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == [(9, 6), (11, 8)]


def test_fetch_unknown_lso_is_the_high_watermark_and_no_aborted_list_is_empty() -> None:
    log = FakeLog(ReadResult(b"", 20, 0, 25))
    resp = asyncio.run(_service(log).Fetch(_fetch_request(), FakeContext()))  # type: ignore[arg-type]
    [p] = resp.topics[0].partitions
    assert p.last_stable_offset == 20 and len(p.aborted_transactions) == 0


def test_fetch_error_partition_has_lso_minus_one() -> None:
    resp = asyncio.run(_service(FakeLog()).Fetch(_fetch_request(), FakeContext()))  # type: ignore[arg-type]
    [p] = resp.topics[0].partitions
    assert p.error_code == 6 and p.last_stable_offset == -1


def test_fetch_unknown_isolation_level_is_invalid_argument() -> None:
    log, ctx = FakeLog(), FakeContext()
    request = _fetch_request()
    request.isolation_level = 7  # type: ignore[assignment]
    with pytest.raises(Aborted):
        asyncio.run(_service(log).Fetch(request, ctx))  # type: ignore[arg-type]
    assert ctx.aborted is not None and ctx.aborted[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert ctx.trailing == ((ERROR_CODE_METADATA_KEY, "42"),) and log.asked == []


# --- ListOffsets --------------------------------------------------------------------------


def test_list_offsets_passes_the_isolation_level_to_every_query() -> None:
    log = FakeLog()
    request = log_pb2.ListOffsetsRequest(isolation_level=common_pb2.READ_COMMITTED)
    t = request.topics.add(name="t")
    t.partitions.add(index=0)
    t.partitions.add(index=1, timestamp=-2)
    resp = asyncio.run(_service(log).ListOffsets(request, FakeContext()))  # type: ignore[arg-type]
    [queries] = log.asked
    assert [q.isolation_level for q in queries] == [IsolationLevel.READ_COMMITTED] * 2
    assert [p.offset for p in resp.topics[0].partitions] == [42, 42]


def test_list_offsets_isolation_unset_is_read_uncommitted() -> None:
    log = FakeLog()
    request = log_pb2.ListOffsetsRequest()
    request.topics.add(name="t").partitions.add(index=0)
    asyncio.run(_service(log).ListOffsets(request, FakeContext()))  # type: ignore[arg-type]
    [[q]] = log.asked
    assert q.isolation_level is IsolationLevel.READ_UNCOMMITTED


# --- Produce ------------------------------------------------------------------------------


def test_produce_names_the_transactional_id_only_when_set() -> None:
    log = FakeLog()
    plain = log_pb2.ProduceRequest()
    plain.topics.add(name="t").partitions.add(index=0, records=b"x")
    txn = log_pb2.ProduceRequest(transactional_id="tx-1")
    txn.topics.add(name="t").partitions.add(index=0, records=b"y")
    asyncio.run(_service(log).Produce(plain, FakeContext()))  # type: ignore[arg-type]
    asyncio.run(_service(log).Produce(txn, FakeContext()))  # type: ignore[arg-type]
    assert [kw for *_, kw in log.asked] == [{}, {"transactional_id": "tx-1"}]
