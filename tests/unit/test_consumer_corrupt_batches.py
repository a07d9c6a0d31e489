"""The consumer's fetcher with a corrupt batch in one partition's response: the other
partitions' records are handed out whatever their order in the buffer, they keep
flowing while the error stands, the error names the partition and the bad batch's
offset (past empty batches before it), and a CORRUPT_MESSAGE answer from the broker is
that partition's CorruptRecordError too. With a broker that answers at once: a batch
that does not decode fails its partition only (CorruptRecordError with the partition and
offset), the other partitions of the same response still deliver, and the position does
not move past the bad batch until the application seeks."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

import pytest
from crc32c import crc32c

from kclient.consumer import Consumer, Fetcher, SubscriptionState
from kclient.errors import CorruptRecordError
from kclient.proto.kbroker.v1 import log_pb2
from kclient.records import ATTRIBUTES_OFFSET, CONTROL_FLAG_MASK, CRC_OFFSET, BatchBuilder
from kclient.structs import TopicPartition
from tests.support import FakeMetadata, FakeTransport
from tests.unit.test_consumer_fetcher import CFG, LEADER, T0, T1, TP, ManualFuture, batch, consumer_for, fetcher_for


def control_batch(base_offset: int) -> bytes:
    """A commit marker (control batch): no record a consumer sees."""
    b = BatchBuilder(base_offset=base_offset, producer_id=7, producer_epoch=0, is_transactional=True)
    b.append(1000, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", [])
    data = bytearray(b.build())
    struct.pack_into(
        ">h", data, ATTRIBUTES_OFFSET, struct.unpack_from(">h", data, ATTRIBUTES_OFFSET)[0] | CONTROL_FLAG_MASK
    )
    struct.pack_into(">I", data, CRC_OFFSET, crc32c(bytes(data[ATTRIBUTES_OFFSET:])))
    return bytes(data)


def answer(future: ManualFuture, records: dict[int, bytes], errors: dict[int, int] | None = None) -> None:
    """Complete ``future`` with ``records`` per partition and ``errors`` (error codes)."""
    resp = log_pb2.FetchResponse()
    for t in future.request.topics:
        tr = resp.topics.add(name=t.name)
        for p in t.partitions:
            code = (errors or {}).get(p.index, 0)
            tr.partitions.add(
                index=p.index,
                high_watermark=100,
                error_code=code,  # type: ignore[arg-type]
                error_message="batch at position 73 has batchLength 3" if code else "",
                records=records.get(p.index, b""),
            )
    future.value = resp
    for cb in future.callbacks:
        cb(future)


def test_the_healthy_partition_is_drained_when_the_corrupt_one_comes_first() -> None:
    fetcher, subs, transport = fetcher_for(T0, T1)
    fetcher.send_fetches()
    # Partition 0 first in the response: one good batch, then a corrupt one.
    answer(transport.issued["Fetch"][0], {0: batch(0, 1) + batch(1, 1, corrupt=True) + batch(2, 1), 1: batch(0, 3)})
    fetcher.wait(time.monotonic())
    out = fetcher.drain(100)
    assert {tp: [r.offset for r in recs] for tp, recs in out.items()} == {T0: [0], T1: [0, 1, 2]}  # before: {T0: [0]}
    with pytest.raises(CorruptRecordError, match=r"t-0 at offset 1: .*CRC.*seek past it"):
        fetcher.drain(100)
    assert subs.partitions[T0].position == 1 and subs.partitions[T1].position == 3


def test_healthy_partitions_keep_flowing_and_the_error_is_not_starved() -> None:
    fetcher, subs, transport = fetcher_for(T0, T1)
    fetcher.send_fetches()
    answer(transport.issued["Fetch"][0], {0: batch(0, 1, corrupt=True), 1: batch(0, 2)})
    fetcher.wait(time.monotonic())
    assert [r.offset for r in fetcher.drain(100)[T1]] == [0, 1]
    raised = delivered = 0
    for i in range(6):
        fetcher.send_fetches()
        assert transport.issued["Fetch"][-1].offsets() == {T1: 2 + i}  # partition 0 is not fetched meanwhile
        answer(transport.issued["Fetch"][-1], {1: batch(2 + i, 1)})
        fetcher.wait(time.monotonic())
        try:
            out = fetcher.drain(100)
        except CorruptRecordError as exc:
            assert "t-0 at offset 0" in str(exc)
            raised += 1
            out = fetcher.drain(100)  # the next drain hands out what came for partition 1
        assert set(out) == {T1}
        delivered += len(out[T1])
    assert delivered == 6 and raised == 6
    assert subs.partitions[T0].position == 0 and subs.partitions[T1].position == 8


def test_the_error_stands_at_the_bad_batch_past_empty_batches() -> None:
    fetcher, subs, transport = fetcher_for(T0)
    fetcher.send_fetches()
    answer(transport.issued["Fetch"][0], {0: batch(0, 2) + control_batch(2) + batch(3, 2, corrupt=True)})
    fetcher.wait(time.monotonic())
    assert [r.offset for r in fetcher.drain(100)[T0]] == [0, 1]
    with pytest.raises(CorruptRecordError, match=r"t-0 at offset 3: .*base offset 3"):
        fetcher.drain(100)
    assert subs.partitions[T0].position == 3  # over the control batch, at the bad one
    subs.partitions[T0].position = 5  # the application seeks past it
    fetcher.clear([T0])
    fetcher.send_fetches()
    assert transport.issued["Fetch"][-1].offsets() == {T0: 5}


def test_corrupt_message_from_the_broker_is_that_partitions_error() -> None:
    fetcher, subs, transport = fetcher_for(T0, T1)
    fetcher.send_fetches()
    answer(transport.issued["Fetch"][0], {1: batch(0, 2)}, errors={0: CorruptRecordError.errno})
    fetcher.wait(time.monotonic())
    assert [r.offset for r in fetcher.drain(100)[T1]] == [0, 1]
    for _ in range(2):  # before: retried in silence, for ever
        with pytest.raises(CorruptRecordError, match=r"t-0 at offset 0: .*batchLength 3"):
            fetcher.drain(100)
    fetcher.send_fetches()
    assert transport.issued["Fetch"][-1].offsets() == {T1: 2}
    answer(transport.issued["Fetch"][-1], {})
    fetcher.wait(time.monotonic())
    subs.partitions[T0].position = 1  # the application seeks past it
    fetcher.clear([T0])
    fetcher.send_fetches()
    assert transport.issued["Fetch"][-1].offsets() == {T0: 1, T1: 2}
    answer(transport.issued["Fetch"][-1], {0: batch(1, 1)})
    fetcher.wait(time.monotonic())
    assert [r.offset for r in fetcher.drain(100)[T0]] == [1]


def test_poll_returns_the_healthy_partition_then_raises_then_seek_goes_on() -> None:
    consumer, transport = consumer_for(T0, T1)
    logs = {0: batch(0, 1) + batch(1, 1, corrupt=True) + batch(2, 1), 1: batch(0, 3)}

    def respond() -> None:  # each partition's log from the fetch offset (whole batches of one record)
        for f in transport.issued["Fetch"]:
            if f.value is None:
                answer(f, {tp.partition: logs[tp.partition][offset * 72 :] for tp, offset in f.offsets().items()})

    try:
        polls: list[dict[TopicPartition, list[int]] | str] = []
        for _ in range(5):
            try:
                got = consumer.poll(timeout_ms=20)
                polls.append({tp: [r.offset for r in recs] for tp, recs in got.items()})
            except CorruptRecordError as exc:
                polls.append(str(exc))
            respond()
        got_first = next(p for p in polls if p)
        assert got_first == {T0: [0], T1: [0, 1, 2]}  # before: {T0: [0]}, then only errors
        after = polls[polls.index(got_first) + 1 :]
        assert after and all(isinstance(p, str) and "t-0 at offset 1" in p for p in after)
        assert consumer.position(T0) == 1
        consumer.seek(T0, 2)
        values: dict[TopicPartition, list[int]] = {}
        deadline = time.monotonic() + 5
        while not values and time.monotonic() < deadline:
            values = {tp: [r.offset for r in recs] for tp, recs in consumer.poll(timeout_ms=20).items()}
            respond()
        assert values == {T0: [2]}
    finally:
        consumer.close()


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


def answering_fetcher(data: dict[int, bytes]) -> tuple[Fetcher, SubscriptionState, FakeTransport]:
    subs = SubscriptionState("earliest")
    subs.assign_from_user([TP("t", 0), TP("t", 1)])
    for st in subs.partitions.values():
        st.position = 0
    transport = FakeTransport({"Fetch": respond_with(data)})
    fetcher = Fetcher(transport, FakeMetadata(addresses=[LEADER]), subs, CFG)  # type: ignore[arg-type]
    return fetcher, subs, transport


def test_corrupt_batch_fails_its_partition_only() -> None:
    # Partition 1: a good batch (offsets 0-1), then a corrupt one (offsets 2-4).
    fetcher, subs, transport = answering_fetcher({0: batch(0, 3), 1: batch(0, 2) + batch(2, 3, corrupt=True)})
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
    assert [(t.name, p.index) for t in transport.requests("Fetch")[-1].topics for p in t.partitions] == [("t", 0)]
    fetcher.wait(time.monotonic())
    # Seeking past the bad batch clears the error.
    subs.partitions[TP("t", 1)].position = 5
    fetcher.clear([TP("t", 1)])
    assert fetcher.drain(100) == {}


def test_garbage_records_raise_typed_error_not_anything_else() -> None:
    fetcher, subs, _ = answering_fetcher({0: batch(0, 1), 1: b"\x00" * 12 + b"\x00\x00\x00\x05" + b"\xff" * 60})
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
        transport = FakeTransport({"Fetch": respond_with({0: batch(0, 2), 1: batch(0, 2, corrupt=True)})})
        consumer._metadata = FakeMetadata(addresses=[LEADER])  # type: ignore[assignment]
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
