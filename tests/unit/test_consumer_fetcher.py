"""The consumer's fetcher against a fake transport whose Fetch answers the test releases:
pipelining (the next Fetch is in flight before the last response is consumed, bounded per
partition), stale prefetches dropped after a seek, columnar drains advancing positions as
``poll`` does (also mixed with ``poll``), and a corrupt batch isolated in columns too."""

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
from tests.support import FakeMetadata, FakeTransport

TP = TopicPartition
T0, T1 = TP("t", 0), TP("t", 1)
LEADER = "leader:1"


def batch(base_offset: int, n: int, corrupt: bool = False) -> bytes:
    b = BatchBuilder(base_offset=base_offset)
    for i in range(n):
        b.append(1000 + base_offset + i, f"k{base_offset + i}".encode(), f"r{base_offset + i}".encode(), [])
    data = bytearray(b.build())
    if corrupt:
        data[-1] ^= 0xFF  # the last record's bytes: the CRC no longer matches
    return bytes(data)


class ManualFuture:
    """A Fetch in flight until the test calls ``complete``."""

    def __init__(self, request: log_pb2.FetchRequest) -> None:
        self.request = request
        self.value: log_pb2.FetchResponse | None = None
        self.callbacks: list[Callable[[ManualFuture], None]] = []

    def offsets(self) -> dict[TopicPartition, int]:
        return {TP(t.name, p.index): p.fetch_offset for t in self.request.topics for p in t.partitions}

    def complete(self, records: dict[int, bytes]) -> None:
        resp = log_pb2.FetchResponse()
        for t in self.request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                tr.partitions.add(index=p.index, high_watermark=100, records=records.get(p.index, b""))
        self.value = resp
        for cb in self.callbacks:
            cb(self)

    def result(self, timeout: float | None = None) -> Any:
        assert self.value is not None
        return self.value

    def add_done_callback(self, cb: Callable[[ManualFuture], None]) -> None:
        self.callbacks.append(cb)


CFG = {**Consumer.DEFAULT_CONFIG, "fetch_max_wait_ms": 0}


def fetcher_for(*tps: TopicPartition) -> tuple[Fetcher, SubscriptionState, FakeTransport]:
    subs = SubscriptionState("earliest")
    subs.assign_from_user(list(tps))
    for st in subs.partitions.values():
        st.position = 0
    transport = FakeTransport(futures={"Fetch": ManualFuture})
    return Fetcher(transport, FakeMetadata(addresses=[LEADER]), subs, CFG), subs, transport  # type: ignore[arg-type]


def consumer_for(*tps: TopicPartition, **cfg: Any) -> tuple[Consumer, FakeTransport]:
    consumer = Consumer(bootstrap_servers="127.0.0.1:1", auto_offset_reset="earliest", fetch_max_wait_ms=0, **cfg)
    consumer.assign(list(tps))
    for st in consumer._subs.partitions.values():
        st.position = 0
    transport = FakeTransport(futures={"Fetch": ManualFuture})
    consumer._metadata = FakeMetadata(addresses=[LEADER])  # type: ignore[assignment]
    consumer._fetcher = Fetcher(transport, consumer._metadata, consumer._subs, consumer.config)  # type: ignore[arg-type]
    return consumer, transport


def values(polled: dict[TopicPartition, Any]) -> dict[TopicPartition, list[bytes]]:
    return {tp: [r.value for r in recs] for tp, recs in polled.items()}


def test_next_fetch_is_in_flight_before_the_last_response_is_consumed() -> None:
    consumer, transport = consumer_for(T0, max_poll_records=3)
    try:
        consumer.poll(timeout_ms=0)
        assert [f.offsets() for f in transport.issued["Fetch"]] == [{T0: 0}]
        transport.issued["Fetch"][0].complete({0: batch(0, 10)})
        got = consumer.poll(timeout_ms=100)
        assert values(got) == {T0: [b"r0", b"r1", b"r2"]}
        # Seven records are still buffered, and the fetch after them is already out.
        assert [f.offsets() for f in transport.issued["Fetch"]] == [{T0: 0}, {T0: 10}]
        transport.issued["Fetch"][1].complete({0: batch(10, 5)})
        # Two responses buffered: no third fetch until the first one is consumed.
        got = consumer.poll(timeout_ms=100)
        assert values(got) == {T0: [b"r3", b"r4", b"r5"]}
        assert len(transport.issued["Fetch"]) == 2
        seen = [r.offset for r in got[T0]]
        while len(transport.issued["Fetch"]) == 2:
            seen += [r.offset for r in consumer.poll(timeout_ms=100).get(T0, [])]
        # The poll that finished the first response (9, then 10 and 11 of the second) fetched
        # again, after the second.
        assert seen == list(range(3, 12))
        assert transport.issued["Fetch"][2].offsets() == {T0: 15}
        assert consumer.position(T0) == 12
        while consumer.position(T0) < 15:
            seen += [r.offset for r in consumer.poll(timeout_ms=100).get(T0, [])]
        assert seen == list(range(3, 15))
    finally:
        consumer.close()


def test_the_next_fetch_is_out_before_the_response_is_decoded() -> None:
    in_flight_at_decode: list[int] = []

    def value(v: bytes) -> bytes:
        in_flight_at_decode.append(len(transport.issued["Fetch"]))
        return v

    consumer, transport = consumer_for(T0, value_deserializer=value)
    try:
        consumer.poll(timeout_ms=0)
        transport.issued["Fetch"][0].complete({0: batch(0, 2)})
        assert len(consumer.poll(timeout_ms=100)[T0]) == 2
        assert in_flight_at_decode == [2, 2]  # the fetch from offset 2 was sent first
        assert transport.issued["Fetch"][1].offsets() == {T0: 2}
    finally:
        consumer.close()


def test_records_are_built_once_with_the_deserializers() -> None:
    consumer, transport = consumer_for(T0, key_deserializer=bytes.decode, value_deserializer=bytes.upper)
    try:
        consumer.poll(timeout_ms=0)
        transport.issued["Fetch"][0].complete({0: batch(0, 2)})
        (rec, rec2) = consumer.poll(timeout_ms=100)[T0]
        assert rec[:6] == ("t", 0, 0, 1000, 0, "k0")
        assert rec.value == b"R0"
        assert rec2.offset == 1
    finally:
        consumer.close()


def test_prefetch_is_dropped_after_a_seek() -> None:
    fetcher, subs, transport = fetcher_for(T0)
    fetcher.send_fetches()
    transport.issued["Fetch"][0].complete({0: batch(0, 10)})
    fetcher.wait(time.monotonic())
    assert [r.offset for r in fetcher.drain(4)[T0]] == [0, 1, 2, 3]
    fetcher.send_fetches()
    assert transport.issued["Fetch"][1].offsets() == {T0: 10}
    subs.partitions[T0].position = 2  # seek back
    fetcher.clear([T0])
    transport.issued["Fetch"][1].complete({0: batch(10, 5)})
    fetcher.wait(time.monotonic())
    assert not fetcher.has_buffered()  # fetched from 10, but the partition now reads from 2
    fetcher.send_fetches()
    assert transport.issued["Fetch"][2].offsets() == {T0: 2}
    transport.issued["Fetch"][2].complete({0: batch(0, 10)})
    fetcher.wait(time.monotonic())
    assert [r.offset for r in fetcher.drain(100)[T0]] == list(range(2, 10))


def test_columns_advance_positions_like_poll_and_mix_with_it() -> None:
    fetcher, subs, transport = fetcher_for(T0, T1)
    fetcher.send_fetches()
    transport.issued["Fetch"][0].complete({0: batch(0, 6), 1: batch(0, 3)})
    fetcher.wait(time.monotonic())
    cols = fetcher.drain_columns(4)
    assert list(cols) == [T0]
    c = cols[T0].to_columns()
    assert c.offsets == [0, 1, 2, 3]
    assert c.values == [b"r0", b"r1", b"r2", b"r3"]
    assert c.keys == [b"k0", b"k1", b"k2", b"k3"]
    assert c.timestamps == [1000, 1001, 1002, 1003]
    assert c.timestamp_types == [0, 0, 0, 0]
    assert c.headers == [[], [], [], []]
    assert subs.partitions[T0].position == 4
    # poll() after poll_columns() goes on from the position, and the other way round
    assert {tp: [r.offset for r in recs] for tp, recs in fetcher.drain(3).items()} == {T0: [4, 5], T1: [0]}
    assert subs.partitions[T1].position == 1
    assert fetcher.drain_columns(10)[T1].offsets.tolist() == [1, 2]
    assert (subs.partitions[T0].position, subs.partitions[T1].position) == (6, 3)
    assert fetcher.drain_columns(10) == {}


def test_corrupt_batch_isolated_in_columns() -> None:
    fetcher, subs, transport = fetcher_for(T0, T1)
    fetcher.send_fetches()
    transport.issued["Fetch"][0].complete({0: batch(0, 3), 1: batch(0, 2) + batch(2, 3, corrupt=True)})
    fetcher.wait(time.monotonic())
    out = fetcher.drain_columns(100)
    assert out[T0].offsets.tolist() == [0, 1, 2]
    assert out[T1].offsets.tolist() == [0, 1]
    for _ in range(2):
        with pytest.raises(CorruptRecordError, match=r"t-1 at offset 2: .*CRC"):
            fetcher.drain_columns(100)
    with pytest.raises(CorruptRecordError, match=r"t-1 at offset 2"):
        fetcher.drain(100)  # the same error through poll()
    assert (subs.partitions[T0].position, subs.partitions[T1].position) == (3, 2)
    fetcher.send_fetches()  # partition 1 is not fetched while its error is pending
    assert transport.issued["Fetch"][-1].offsets() == {T0: 3}


def test_poll_arrow_has_sparks_kafka_schema() -> None:
    pa = pytest.importorskip("pyarrow")
    consumer, transport = consumer_for(T0, T1)
    try:
        empty = consumer.poll_arrow(timeout_ms=0)
        assert empty.num_rows == 0
        assert empty.schema.names == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
        transport.issued["Fetch"][0].complete({0: batch(0, 2), 1: batch(5, 1)})
        rb = consumer.poll_arrow(timeout_ms=100)
        assert rb.schema.field("key").type == pa.binary()
        assert rb.schema.field("partition").type == pa.int32()
        assert rb.schema.field("offset").type == pa.int64()
        assert rb.schema.field("timestamp").type == pa.timestamp("ms", tz="UTC")
        assert rb.schema.field("timestampType").type == pa.int32()
        assert rb.to_pydict()["value"] == [b"r0", b"r1", b"r5"]
        assert rb.to_pydict()["partition"] == [0, 0, 1]
        assert rb.to_pydict()["offset"] == [0, 1, 5]
        assert rb.to_pydict()["topic"] == ["t", "t", "t"]
        assert rb.column("timestamp").cast(pa.int64()).to_pylist() == [1000, 1001, 1005]
        assert (consumer.position(T0), consumer.position(T1)) == (2, 6)
    finally:
        consumer.close()


def test_perf_columnar_auto_takes_poll_arrow_and_counts_bytes_from_offsets() -> None:
    pytest.importorskip("pyarrow")
    from kbroker.cli import perf

    consumer, transport = consumer_for(T0, T1)
    try:
        poll = perf.columnar_poll(consumer, "auto")
        assert poll.__name__ == "poll_arrow"
        poll(timeout_ms=0)
        transport.issued["Fetch"][0].complete({0: batch(0, 12), 1: batch(3, 2)})
        expected = sum(len(f"k{i}r{i}") for i in [*range(12), 3, 4])
        assert perf._column_counts(poll(timeout_ms=100, max_records=5)) == (5, sum(len(f"k{i}r{i}") for i in range(5)))
        rest = consumer.poll_buffers(timeout_ms=100)
        assert perf._column_counts(rest) == (9, expected - sum(len(f"k{i}r{i}") for i in range(5)))
    finally:
        consumer.close()


def test_a_columnar_drain_joins_two_responses_of_a_partition() -> None:
    fetcher, subs, transport = fetcher_for(T0, T1)
    fetcher.send_fetches()
    transport.issued["Fetch"][0].complete({0: batch(0, 5), 1: batch(0, 1)})
    fetcher.wait(time.monotonic())
    fetcher.send_fetches()  # pipelined: T0 again from 5, T1 from 1, while 0-4 are buffered
    assert transport.issued["Fetch"][1].offsets() == {T0: 5, T1: 1}
    transport.issued["Fetch"][1].complete({0: batch(5, 5)})
    fetcher.wait(time.monotonic())
    out = fetcher.drain_columns(8)
    assert {tp: cb.offsets.tolist() for tp, cb in out.items()} == {T0: [0, 1, 2, 3, 4, 5, 6], T1: [0]}
    assert out[T0].to_columns().values == [f"r{i}".encode() for i in range(7)]
    assert subs.partitions[T0].position == 7
    rest = fetcher.drain_columns(8)[T0]
    assert rest.to_columns().keys == [b"k7", b"k8", b"k9"]


def test_column_lists_join_two_responses_and_mix_with_buffers_and_records() -> None:
    fetcher, subs, transport = fetcher_for(T0)
    fetcher.send_fetches()
    transport.issued["Fetch"][0].complete({0: batch(0, 5)})
    fetcher.wait(time.monotonic())
    fetcher.send_fetches()
    transport.issued["Fetch"][1].complete({0: batch(5, 5)})
    fetcher.wait(time.monotonic())
    assert fetcher.drain_columns(2)[T0].offsets.tolist() == [0, 1]
    lists = fetcher.drain_column_lists(5)[T0]  # 2-4 of the first response, 5-6 of the second
    assert lists.offsets == [2, 3, 4, 5, 6]
    assert lists.values == [b"r2", b"r3", b"r4", b"r5", b"r6"]
    assert lists.headers == [[], [], [], [], []]
    assert [r.offset for r in fetcher.drain(1)[T0]] == [7]
    assert fetcher.drain_column_lists(10)[T0].keys == [b"k8", b"k9"]
    assert subs.partitions[T0].position == 10


def test_corrupt_batch_isolated_in_column_lists() -> None:
    fetcher, subs, transport = fetcher_for(T0)
    fetcher.send_fetches()
    transport.issued["Fetch"][0].complete({0: batch(0, 2) + batch(2, 3, corrupt=True)})
    fetcher.wait(time.monotonic())
    assert fetcher.drain_column_lists(100)[T0].offsets == [0, 1]
    with pytest.raises(CorruptRecordError, match=r"t-0 at offset 2: .*CRC"):
        fetcher.drain_column_lists(100)
    assert subs.partitions[T0].position == 2


def test_poll_arrow_joins_partitions_in_one_record_batch() -> None:
    pytest.importorskip("pyarrow")
    consumer, transport = consumer_for(T0, T1)
    try:
        consumer.poll(timeout_ms=0)
        transport.issued["Fetch"][0].complete({0: batch(0, 3), 1: batch(7, 2)})
        rb = consumer.poll_arrow(timeout_ms=100, headers=True)
        assert rb.to_pydict()["offset"] == [0, 1, 2, 7, 8]
        assert rb.to_pydict()["partition"] == [0, 0, 0, 1, 1]
        assert rb.to_pydict()["headers"] == [[]] * 5
        rb.validate(full=True)
    finally:
        consumer.close()
