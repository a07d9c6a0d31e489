"""Issue 8: a batch that does not decode fails its partition only (CorruptRecordError with
the partition and offset), the other partitions of the same response still deliver, and
the position does not move past the bad batch until the application seeks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from kclient.consumer import Consumer, Fetcher, SubscriptionState
from kclient.errors import CorruptRecordError
from kclient.proto.kbroker.v1 import log_pb2
from kclient.records import BatchBuilder
from kclient.structs import TopicPartition

TP = TopicPartition
LEADER = "leader:1"


def batch(base_offset: int, n: int, corrupt: bool = False) -> bytes:
    b = BatchBuilder(base_offset=base_offset)
    for i in range(n):
        b.append(1000 + i, None, f"r{base_offset + i}".encode(), [])
    data = bytearray(b.build())
    if corrupt:
        data[-1] ^= 0xFF  # the last record's bytes: the CRC no longer matches
    return bytes(data)


class DoneFuture:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> Any:
        return self.value

    def add_done_callback(self, cb: Callable[[DoneFuture], None]) -> None:
        cb(self)


class FakeTransport:
    """Answers every Fetch with ``respond(request)``."""

    request_timeout_s = 1.0

    def __init__(self, respond: Callable[[log_pb2.FetchRequest], log_pb2.FetchResponse]) -> None:
        self.respond = respond
        self.fetches: list[log_pb2.FetchRequest] = []

    def stub(self, address: str) -> Any:
        transport = self

        class _Fetch:
            def future(self, request: log_pb2.FetchRequest, timeout: float | None = None) -> DoneFuture:
                transport.fetches.append(request)
                return DoneFuture(transport.respond(request))

        class _Stub:
            Fetch = _Fetch()

        return _Stub()


class FakeMetadata:
    def leader_address(self, tp: TopicPartition) -> str:
        return LEADER

    def request_update(self) -> None:
        pass

    def maybe_refresh(self, timeout_s: float | None = None) -> bool:
        return True


def respond_with(data: dict[int, bytes]) -> Callable[[log_pb2.FetchRequest], log_pb2.FetchResponse]:
    def respond(req: log_pb2.FetchRequest) -> log_pb2.FetchResponse:
        resp = log_pb2.FetchResponse()
        for t in req.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                records = data[p.index] if p.fetch_offset == 0 else b""
                tr.partitions.add(index=p.index, high_watermark=10, records=records)
        return resp

    return respond


CFG = {
    **Consumer.DEFAULT_CONFIG,
    "fetch_max_wait_ms": 0,
}


def fetcher_for(data: dict[int, bytes]) -> tuple[Fetcher, SubscriptionState, FakeTransport]:
    subs = SubscriptionState("earliest")
    subs.assign_from_user([TP("t", 0), TP("t", 1)])
    for st in subs.partitions.values():
        st.position = 0
    transport = FakeTransport(respond_with(data))
    fetcher = Fetcher(transport, FakeMetadata(), subs, CFG)  # type: ignore[arg-type]
    return fetcher, subs, transport


def test_corrupt_batch_fails_its_partition_only() -> None:
    # Partition 1: a good batch (offsets 0-1), then a corrupt one (offsets 2-4).
    fetcher, subs, transport = fetcher_for({0: batch(0, 3), 1: batch(0, 2) + batch(2, 3, corrupt=True)})
    fetcher.send_fetches()
    assert fetcher.wait(time.monotonic())
    out = fetcher.drain(100)
    assert [r.value for r in out[TP("t", 0)]] == [b"r0", b"r1", b"r2"]
    assert [r.value for r in out[TP("t", 1)]] == [b"r0", b"r1"]
    for _ in range(2):  # raised on every poll until the application seeks
        with pytest.raises(CorruptRecordError, match=r"t-1 at offset 2: .*CRC"):
            fetcher.drain(100)
    assert subs.partitions[TP("t", 1)].position == 2
    assert subs.partitions[TP("t", 0)].position == 3
    # Partition 1 is not fetched again while its error is pending; partition 0 is.
    fetcher.send_fetches()
    assert [(t.name, p.index) for t in transport.fetches[-1].topics for p in t.partitions] == [("t", 0)]
    fetcher.wait(time.monotonic())
    # Seeking past the bad batch clears the error.
    subs.partitions[TP("t", 1)].position = 5
    fetcher.clear([TP("t", 1)])
    assert fetcher.drain(100) == {}


def test_garbage_records_raise_typed_error_not_anything_else() -> None:
    fetcher, subs, _ = fetcher_for({0: batch(0, 1), 1: b"\x00" * 12 + b"\x00\x00\x00\x05" + b"\xff" * 60})
    fetcher.send_fetches()
    fetcher.wait(time.monotonic())
    assert [r.value for r in fetcher.drain(100)[TP("t", 0)]] == [b"r0"]
    with pytest.raises(CorruptRecordError, match="t-1 at offset 0"):
        fetcher.drain(100)
    assert subs.partitions[TP("t", 1)].position == 0


def test_consumer_poll_delivers_good_partition_then_raises_for_bad_one() -> None:
    consumer = Consumer(bootstrap_servers="127.0.0.1:1", auto_offset_reset="earliest", fetch_max_wait_ms=0)
    try:
        consumer.assign([TP("t", 0), TP("t", 1)])
        for st in consumer._subs.partitions.values():
            st.position = 0
        transport = FakeTransport(respond_with({0: batch(0, 2), 1: batch(0, 2, corrupt=True)}))
        consumer._metadata = FakeMetadata()  # type: ignore[assignment]
        consumer._fetcher = Fetcher(transport, consumer._metadata, consumer._subs, consumer.config)  # type: ignore[arg-type]
        got = consumer.poll(timeout_ms=500)
        assert {tp: [r.value for r in recs] for tp, recs in got.items()} == {TP("t", 0): [b"r0", b"r1"]}
        with pytest.raises(CorruptRecordError, match="t-1 at offset 0"):
            consumer.poll(timeout_ms=100)
        assert consumer.position(TP("t", 1)) == 0
        consumer.seek(TP("t", 1), 2)
        assert consumer.poll(timeout_ms=100) == {}
    finally:
        consumer.close()
