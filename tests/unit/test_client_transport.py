"""Channels with keepalive and bounded reconnect backoff, a timed-out channel
dropped (also from a call's done-callback, without hanging the channel's other calls),
metadata refreshed every metadata_max_age_ms and from a broker other than the one that
just failed; a broker-side REQUEST_TIMED_OUT makes the producer look again, and close()
does not wait out a slow broker's metadata refresh. Inside a send callback (on a
channel's thread or the sender's), close() closes at once and flush() is refused.

The brokers here are in-process fake gRPC servers (no ZooKeeper, no log)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from kclient import Producer
from kclient.errors import IllegalStateError, KafkaError, KafkaTimeoutError, LeaderNotAvailableError
from kclient.metadata import ClusterMetadata
from kclient.producer.sender import Sender
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2, metadata_pb2
from kclient.transport import CHANNEL_OPTIONS, SERVER_KEEPALIVE_OPTIONS, Transport

REQUEST_TIMED_OUT = 7


class FakeBroker(broker_pb2_grpc.BrokerServicer):
    """Answers Metadata with ``leader`` as the leader of t-0, and Produce with ``produce_error``."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.leader = node_id
        self.produce_error = 0
        self.slow_s = 0.0
        self.produce_slow_s = 0.0
        self.peers: dict[int, int] = {}  # node id -> port
        self.calls: list[str] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(4), options=SERVER_KEEPALIVE_OPTIONS)
        broker_pb2_grpc.add_BrokerServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self.server.start()

    def Metadata(self, request: Any, context: Any) -> metadata_pb2.MetadataResponse:
        self.calls.append("Metadata")
        if self.slow_s:
            time.sleep(self.slow_s)
        resp = metadata_pb2.MetadataResponse(cluster_id=f"seen-by-{self.node_id}", controller_id=0)
        for node, port in sorted(self.peers.items()):
            resp.brokers.add(node_id=node, host="127.0.0.1", port=port)
        t = resp.topics.add(name="t")
        t.partitions.add(index=0, leader_id=self.leader, replica_nodes=[self.leader], isr_nodes=[self.leader])
        return resp

    def Produce(self, request: Any, context: Any) -> log_pb2.ProduceResponse:
        self.calls.append("Produce")
        if self.produce_slow_s:
            time.sleep(self.produce_slow_s)
        resp = log_pb2.ProduceResponse()
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                tr.partitions.add(
                    index=p.index, error_code=self.produce_error, base_offset=-1 if self.produce_error else 42
                )
        return resp

    def stop(self) -> None:
        self.server.stop(0)


@pytest.fixture
def brokers() -> Iterator[tuple[FakeBroker, FakeBroker]]:
    a, b = FakeBroker(0), FakeBroker(1)
    for x in (a, b):
        x.peers = {0: a.port, 1: b.port}
    yield a, b
    a.stop()
    b.stop()


def test_every_channel_has_keepalive_and_bounded_reconnect_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    options = dict(CHANNEL_OPTIONS)
    assert 5000 <= options["grpc.keepalive_time_ms"] <= 10000
    assert options["grpc.keepalive_timeout_ms"] <= 5000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.http2.max_pings_without_data"] == 0
    assert options["grpc.max_reconnect_backoff_ms"] <= 1000
    seen: list[Any] = []
    real = grpc.insecure_channel
    monkeypatch.setattr(
        grpc, "insecure_channel", lambda addr, options=None: seen.append(options) or real(addr, options)
    )
    t = Transport("127.0.0.1:1")
    t.stub("127.0.0.1:1")
    t.close()
    assert seen == [CHANNEL_OPTIONS]


def test_a_timed_out_call_drops_its_channel(brokers: tuple[FakeBroker, FakeBroker]) -> None:
    a, _ = brokers
    t = Transport(a.address)
    try:
        first = t.stub(a.address)
        assert t.stub(a.address) is first
        a.slow_s = 1.0
        with pytest.raises(KafkaTimeoutError):
            t.call(a.address, "Metadata", metadata_pb2.MetadataRequest(), timeout_s=0.2)
        a.slow_s = 0.0
        assert t.stub(a.address) is not first, "the channel of a timed-out call is not reused"
        assert t.call(a.address, "Metadata", metadata_pb2.MetadataRequest()).cluster_id == "seen-by-0"
    finally:
        t.close()


def test_a_call_timing_out_in_a_callback_fails_the_channels_other_calls(
    brokers: tuple[FakeBroker, FakeBroker],
) -> None:
    """A future's done-callback maps its DEADLINE_EXCEEDED (as the producer's response
    handler does), which drops the channel: the other call in flight on it fails at once,
    and the callback returns (closing the channel on its own thread would hang both)."""
    a, _ = brokers
    a.slow_s = 5.0
    t = Transport(a.address)
    try:
        stub = t.stub(a.address)
        done: list[str] = []
        first_returned = threading.Event()

        def on_first(call: Any) -> None:
            try:
                call.result()
            except grpc.RpcError as exc:
                done.append(type(t.failed(a.address, exc)).__name__)
            first_returned.set()

        other = stub.Metadata.future(metadata_pb2.MetadataRequest(), timeout=30)
        other.add_done_callback(lambda call: done.append(str(call.code())))
        stub.Metadata.future(metadata_pb2.MetadataRequest(), timeout=0.3).add_done_callback(on_first)
        assert first_returned.wait(5), "the callback that dropped the channel never returned"
        deadline = time.monotonic() + 3
        while len(done) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(done) == ["KafkaTimeoutError", "StatusCode.CANCELLED"]
    finally:
        a.slow_s = 0.0
        t.close()


def test_metadata_comes_from_a_broker_that_did_not_just_fail(brokers: tuple[FakeBroker, FakeBroker]) -> None:
    a, b = brokers
    t = Transport([a.address, b.address])
    try:
        md = ClusterMetadata(t)
        for _ in range(4):
            t.mark_failed(a.address)
            md.refresh()
            assert md.cluster_id == "seen-by-1"
        # Healthy brokers take turns.
        t2 = Transport([a.address, b.address])
        md2 = ClusterMetadata(t2)
        seen = set()
        for _ in range(4):
            md2.refresh()
            seen.add(md2.cluster_id)
        t2.close()
        assert seen == {"seen-by-0", "seen-by-1"}
    finally:
        t.close()


def test_metadata_is_refreshed_every_max_age(brokers: tuple[FakeBroker, FakeBroker]) -> None:
    a, b = brokers

    def refreshes() -> int:
        return a.calls.count("Metadata") + b.calls.count("Metadata")

    t = Transport(a.address)
    try:
        md = ClusterMetadata(t, metadata_max_age_ms=300, retry_backoff_ms=10)
        md.refresh()
        n = refreshes()
        md.maybe_refresh()
        assert refreshes() == n
        time.sleep(0.35)
        md.maybe_refresh()
        assert refreshes() == n + 1
        md.request_update()
        time.sleep(0.02)
        md.maybe_refresh()
        assert refreshes() == n + 2
    finally:
        t.close()


def test_request_timed_out_makes_the_producer_find_the_new_leader(brokers: tuple[FakeBroker, FakeBroker]) -> None:
    """Broker 0 is cut off: it still claims t-0 and times every write out (REQUEST_TIMED_OUT);
    broker 1 leads t-0 now. The producer must refresh metadata, from broker 1, and deliver there."""
    a, b = brokers
    with Producer(
        bootstrap_servers=a.address,
        acks=1,
        enable_idempotence=False,
        linger_ms=0,
        retry_backoff_ms=20,
        delivery_timeout_ms=5000,
    ) as p:
        assert p.partitions_for("t") == {0}
        a.produce_error = REQUEST_TIMED_OUT
        b.leader = 1
        done = threading.Event()
        fut = p.send("t", b"x", partition=0)
        fut.add_callback(lambda _m: done.set())
        meta = fut.get(10)
    assert meta.offset == 42
    assert "Produce" in b.calls


def test_close_does_not_wait_out_a_metadata_refresh_with_nothing_to_send(
    brokers: tuple[FakeBroker, FakeBroker],
) -> None:
    """Every batch has its outcome, and the sender is in a metadata refresh that a slow
    broker answers only after seconds: close() cancels it instead of waiting it out."""
    a, b = brokers
    b.stop()  # one broker to ask, and it is slow
    p = Producer(bootstrap_servers=a.address, acks=1, enable_idempotence=False, request_timeout_ms=4000)
    try:
        assert p.send("t", b"x", partition=0).get(10).offset == 42
        a.slow_s = 3.0
        before = a.calls.count("Metadata")
        p._metadata.request_update()  # type: ignore[attr-defined]
        p._sender._needs_metadata.set()  # type: ignore[attr-defined]
        with p._accumulator.cond:  # type: ignore[attr-defined]
            p._accumulator.cond.notify_all()  # type: ignore[attr-defined]
        deadline = time.monotonic() + 5
        while a.calls.count("Metadata") == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert a.calls.count("Metadata") > before, "the sender did not start a refresh"
        started = time.monotonic()
        p.close()
        took = time.monotonic() - started
    finally:
        a.slow_s = 0.0
    assert took < 1.5, f"close() took {took:.1f} s behind a refresh of up to 3 s"


def test_close_inside_a_send_callback_closes_at_once(brokers: tuple[FakeBroker, FakeBroker]) -> None:
    """A callback runs on the producer's own threads (here a channel's, with an answer): a
    close() there closes without waiting for them, as Kafka's close(0); the batches not yet
    delivered fail. Before, close() waited for the callback's own batch forever."""
    a, b = brokers
    b.stop()
    p = Producer(bootstrap_servers=a.address, acks=1, enable_idempotence=False, linger_ms=0)
    closed = threading.Event()
    undelivered: list[Any] = []

    def close_here(_meta: object) -> None:
        a.produce_slow_s = 2.0  # were it sent before the close, no answer comes first
        undelivered.append(p.send("t", b"undelivered", partition=0))
        p.close()
        closed.set()

    assert p.send("t", b"first", partition=0).get(10).offset == 42
    first = p.send("t", b"x", partition=0)
    first.add_callback(close_here)
    assert closed.wait(5), "close() inside the callback did not return"
    assert first.get(1).offset == 42
    assert isinstance(undelivered[0].exception(1.5), KafkaTimeoutError), undelivered[0].exception(0)
    with pytest.raises(KafkaError):  # closed: a send after close() is refused
        p.send("t", b"late", partition=0)
    p.close()  # again, from the application: a no-op
    a.produce_slow_s = 0.0


def test_close_inside_an_errback_on_the_sender_thread_closes_at_once(brokers: tuple[FakeBroker, FakeBroker]) -> None:
    """A batch that expires without a leader fails on the producer's sender thread: its
    errback's close() must not join that thread (it is the caller's own)."""
    a, b = brokers
    b.stop()
    a.leader = -1  # t-0 has no leader
    p = Producer(
        bootstrap_servers=a.address,
        acks=1,
        enable_idempotence=False,
        request_timeout_ms=300,
        delivery_timeout_ms=400,
        retry_backoff_ms=20,
    )
    closed = threading.Event()
    failed: list[tuple[BaseException, str]] = []

    def close_here(err: BaseException) -> None:
        failed.append((err, threading.current_thread().name))
        p.close()
        closed.set()

    fut = p.send("t", b"x", partition=0)
    fut.add_errback(close_here)
    assert closed.wait(5), "close() inside the errback did not return"
    ((err, thread),) = failed
    assert isinstance(err, LeaderNotAvailableError), err
    assert thread == "kclient-producer-sender"
    p.close()


def test_flush_inside_a_send_callback_is_refused(brokers: tuple[FakeBroker, FakeBroker]) -> None:
    """Kafka's rule: flush() in the producer's own callback would wait for the callback's
    own batch. Another producer's flush() there is fine."""
    a, _ = brokers
    seen: list[str] = []

    def flush_here(_meta: object) -> None:
        try:
            p.flush()
        except IllegalStateError as exc:
            seen.append(str(exc))
        other.flush(5)
        seen.append("the other producer flushed")

    with Producer(bootstrap_servers=a.address, acks=1, enable_idempotence=False) as other:
        other.send("t", b"y", partition=0)
        with Producer(bootstrap_servers=a.address, acks=1, enable_idempotence=False) as p:
            fut = p.send("t", b"x", partition=0)
            fut.add_callback(flush_here)
            fut.get(10)
            deadline = time.monotonic() + 5
            while len(seen) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            p.flush()  # on the application's thread: fine
    assert len(seen) == 2 and "inside a send callback" in seen[0], seen


def test_close_with_a_timeout_returns_once_every_record_has_its_outcome(
    brokers: tuple[FakeBroker, FakeBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """close(timeout) with a batch the sender has taken from its queue but not yet sent:
    the sender fails it a moment later (the channels are closed), on its own thread, which
    close() does not wait for. Like Kafka's, close() returns only once every record has its
    outcome (CI once found a record still without one right after close(timeout=1))."""
    a, b = brokers
    b.stop()
    p = Producer(bootstrap_servers=a.address, acks=1, enable_idempotence=False, linger_ms=0)
    assert p.send("t", b"first", partition=0).get(10).offset == 42
    taken = threading.Event()
    send = Sender._send

    def send_late(self: Sender, addr: str, batches: list[Any]) -> None:
        taken.set()
        time.sleep(0.2)  # drained, not sent yet: close() runs meanwhile
        send(self, addr, batches)

    monkeypatch.setattr(Sender, "_send", send_late)
    fut = p.send("t", b"x", partition=0)
    assert taken.wait(5)
    started = time.monotonic()
    p.close(timeout=0.1)
    assert time.monotonic() - started < 3.0  # bounded (CANCELLED_BATCHES_WAIT_S), even on a loaded machine
    assert isinstance(fut.exception(0), KafkaTimeoutError), fut.exception(0)
