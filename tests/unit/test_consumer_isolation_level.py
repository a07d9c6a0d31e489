"""The consumer's isolation_level: kafka-python's setting and values, carried by every
Fetch and ListOffsets; read_committed drops the aborted transactions of each answer
before decoding (poll, poll_columns and poll_arrow alike), moves its position past what
it dropped, and measures its lag to the last stable offset."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from kclient.compat import check_configs
from kclient.consumer import Consumer, Fetcher
from kclient.consumer.isolation import parse_isolation_level
from kclient.errors import InvalidConfigError
from kclient.proto.kbroker.v1 import common_pb2, log_pb2
from kclient.records import build_control_batch, encode_batch
from kclient.structs import IsolationLevel, TopicPartition
from tests.support import FakeMetadata, FakeTransport

T0 = TopicPartition("t", 0)
LEADER = "leader:1"


class ManualFuture:
    """A Fetch in flight until the test calls ``complete``."""

    def __init__(self, request: log_pb2.FetchRequest) -> None:
        self.request = request
        self.value: log_pb2.FetchResponse | None = None
        self.callbacks: list[Callable[[ManualFuture], None]] = []

    def offsets(self) -> dict[TopicPartition, int]:
        return {TopicPartition(t.name, p.index): p.fetch_offset for t in self.request.topics for p in t.partitions}

    def complete(self, records: bytes, aborted: list[tuple[int, int]], hw: int = 100, lso: int = 100) -> None:
        resp = log_pb2.FetchResponse()
        for t in self.request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                part = tr.partitions.add(index=p.index, high_watermark=hw, last_stable_offset=lso, records=records)
                for pid, first in aborted:
                    part.aborted_transactions.add(producer_id=pid, first_offset=first)
        self.value = resp
        for cb in self.callbacks:
            cb(self)

    def result(self, timeout: float | None = None) -> Any:
        assert self.value is not None
        return self.value

    def add_done_callback(self, cb: Callable[[ManualFuture], None]) -> None:
        self.callbacks.append(cb)


def consumer_for(**cfg: Any) -> tuple[Consumer, FakeTransport]:
    consumer = Consumer(bootstrap_servers="127.0.0.1:1", auto_offset_reset="earliest", fetch_max_wait_ms=0, **cfg)
    consumer.assign([T0])
    consumer._subs.partitions[T0].position = 0
    transport = FakeTransport(futures={"Fetch": ManualFuture})
    consumer._metadata = FakeMetadata(addresses=[LEADER])  # type: ignore[assignment]
    consumer._transport = transport  # type: ignore[assignment]
    consumer._fetcher = Fetcher(transport, consumer._metadata, consumer._subs, consumer.config)  # type: ignore[arg-type]
    return consumer, transport


def txn_log() -> bytes:
    """0-1 pid 1 (aborted), 2 pid 2 (committed), 3 plain, 4 pid 1 (aborted), 5 ABORT(1),
    6 COMMIT(2), 7-8 pid 1 (its next transaction, aborted; the marker is in the next fetch)."""
    return b"".join(
        [
            encode_batch([b"a0", b"a1"], producer_id=1, is_transactional=True, base_offset=0, base_timestamp=1),
            encode_batch([b"c2"], producer_id=2, is_transactional=True, base_offset=2, base_timestamp=1),
            encode_batch([b"p3"], base_offset=3, base_timestamp=1),
            encode_batch([b"a4"], producer_id=1, is_transactional=True, base_offset=4, base_timestamp=1),
            build_control_batch(1, 0, False, 0, base_offset=5, timestamp_ms=1),
            build_control_batch(2, 0, True, 0, base_offset=6, timestamp_ms=1),
            encode_batch([b"b7", b"b8"], producer_id=1, is_transactional=True, base_offset=7, base_timestamp=1),
        ]
    )


ABORTED = [(1, 0), (1, 7)]


# --- the setting ---------------------------------------------------------------------


def test_default_is_read_uncommitted() -> None:
    consumer, _ = consumer_for()
    try:
        assert consumer.config["isolation_level"] == "read_uncommitted"
        assert consumer._isolation is IsolationLevel.READ_UNCOMMITTED
    finally:
        consumer.close()


@pytest.mark.parametrize("bad", ["READ_COMMITTED", "read-committed", "committed", "", 1, None])
def test_bad_values_are_a_config_error(bad: object) -> None:
    with pytest.raises(InvalidConfigError, match="isolation_level must be 'read_uncommitted' or 'read_committed'"):
        Consumer(bootstrap_servers="127.0.0.1:1", isolation_level=bad)


def test_parse_names_the_setting() -> None:
    assert parse_isolation_level("read_committed") is IsolationLevel.READ_COMMITTED
    assert parse_isolation_level(IsolationLevel.READ_UNCOMMITTED) is IsolationLevel.READ_UNCOMMITTED
    with pytest.raises(InvalidConfigError, match=r"kafka\.isolation\.level must be"):
        parse_isolation_level("x", "kafka.isolation.level")


def test_isolation_level_is_no_longer_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="kclient.compat"):
        ignored = check_configs("consumer", {"isolation_level": "read_committed"}, Consumer.DEFAULT_CONFIG)
    assert ignored == []
    assert "isolation_level" not in caplog.text


# --- the requests --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "wire"),
    [("read_uncommitted", common_pb2.READ_UNCOMMITTED), ("read_committed", common_pb2.READ_COMMITTED)],
)
def test_fetch_and_list_offsets_carry_it(level: str, wire: int) -> None:
    consumer, transport = consumer_for(isolation_level=level)
    transport.on(
        "ListOffsets",
        lambda req: log_pb2.ListOffsetsResponse(
            topics=[log_pb2.ListOffsetsTopicResponse(name="t", partitions=[{"index": 0, "offset": 42}])]
        ),
    )
    try:
        consumer.poll(timeout_ms=0)
        [fetch] = transport.issued["Fetch"]
        assert fetch.request.HasField("isolation_level")
        assert fetch.request.isolation_level == wire
        assert consumer.end_offsets([T0]) == {T0: 42}
        # seek_to_end / auto_offset_reset=latest: the fetcher's own ListOffsets
        consumer.seek_to_end(T0)
        consumer._fetcher.send_list_offsets({T0: -1})
        requests = transport.requests("ListOffsets")
        assert len(requests) == 2
        assert all(r.HasField("isolation_level") and r.isolation_level == wire for r in requests)
    finally:
        consumer.close()


# --- read_committed filtering --------------------------------------------------------


def poll_values(consumer: Consumer, kind: str) -> list[bytes | None]:
    if kind == "poll":
        return [r.value for r in consumer.poll(timeout_ms=100).get(T0, [])]
    if kind == "columns":
        cols = consumer.poll_columns(timeout_ms=100).get(T0)
        return [] if cols is None else list(cols.values)
    table = consumer.poll_arrow(timeout_ms=100)
    return [v for v in table.column("value").to_pylist()] if table.num_rows else []


@pytest.mark.parametrize("kind", ["poll", "columns", "arrow"])
def test_read_committed_drops_aborted_transactions(kind: str) -> None:
    consumer, transport = consumer_for(isolation_level="read_committed")
    try:
        consumer.poll(timeout_ms=0)
        transport.issued["Fetch"][0].complete(txn_log(), ABORTED, hw=9, lso=9)
        assert poll_values(consumer, kind) == [b"c2", b"p3"]
        # The position moved past the dropped batches and the markers, to the answer's end.
        assert consumer.position(T0) == 9
        assert transport.issued["Fetch"][-1].offsets() == {T0: 9}
        # The next fetch holds pid 1's ABORT marker; the broker lists (1, 7) again.
        transport.issued["Fetch"][-1].complete(
            build_control_batch(1, 0, False, 0, base_offset=9, timestamp_ms=1)
            + encode_batch([b"n10"], producer_id=1, is_transactional=True, base_offset=10, base_timestamp=1)
            + build_control_batch(1, 0, True, 0, base_offset=11, timestamp_ms=1),
            [(1, 7)],
            hw=12,
            lso=12,
        )
        got: list[bytes | None] = []
        while consumer.position(T0) < 12:
            got += poll_values(consumer, kind)
        assert got == [b"n10"]
    finally:
        consumer.close()


def test_read_uncommitted_sees_everything_even_with_a_list() -> None:
    consumer, transport = consumer_for()
    try:
        consumer.poll(timeout_ms=0)
        transport.issued["Fetch"][0].complete(txn_log(), ABORTED, hw=9, lso=2)
        assert poll_values(consumer, "poll") == [b"a0", b"a1", b"c2", b"p3", b"a4", b"b7", b"b8"]
    finally:
        consumer.close()


def test_an_answer_of_aborted_batches_only_moves_the_position() -> None:
    consumer, transport = consumer_for(isolation_level="read_committed")
    try:
        consumer.poll(timeout_ms=0)
        data = encode_batch([b"x", b"y"], producer_id=3, is_transactional=True, base_offset=0, base_timestamp=1)
        transport.issued["Fetch"][0].complete(data, [(3, 0)], hw=2, lso=2)
        assert consumer.poll(timeout_ms=100) == {}
        assert consumer.position(T0) == 2
    finally:
        consumer.close()


def test_no_aborted_transactions_keeps_the_answer_as_is() -> None:
    consumer, transport = consumer_for(isolation_level="read_committed")
    try:
        consumer.poll(timeout_ms=0)
        data = encode_batch([b"x"], producer_id=3, is_transactional=True, base_offset=0, base_timestamp=1)
        transport.issued["Fetch"][0].complete(data, [], hw=1, lso=1)
        consumer._fetcher.wait(0)
        [chunk] = consumer._fetcher._buffer
        assert chunk.data == data
        assert poll_values(consumer, "poll") == [b"x"]
    finally:
        consumer.close()


# --- lag -----------------------------------------------------------------------------


@pytest.mark.parametrize(("level", "lag"), [("read_uncommitted", 10), ("read_committed", 4)])
def test_lag_is_to_the_last_stable_offset_for_read_committed(level: str, lag: int) -> None:
    consumer, transport = consumer_for(isolation_level=level)
    try:
        assert consumer.current_lag(T0) is None
        consumer.poll(timeout_ms=0)
        transport.issued["Fetch"][0].complete(b"", [], hw=10, lso=4)
        consumer.poll(timeout_ms=50)
        assert consumer.highwater(T0) == 10
        assert consumer.last_stable_offset(T0) == 4
        assert consumer.current_lag(T0) == lag
        metrics = consumer.metrics()["consumer-fetch-manager-metrics"]
        assert metrics["records-lag-max"] == lag
    finally:
        consumer.close()
