"""Request memory budgets (queued.max.request.bytes) that no stranger can exhaust.

- A Kafka frame's bytes are taken from the budget as they arrive, never as its size
  header promises them; bytes read before SASL authentication never come from it.
- Silent connections are closed (connections.max.idle.ms); a request whose bytes stop
  arriving is closed too (request.read.timeout.ms).
- A parked request holds what it decodes to (unknown protobuf fields are dropped).
- Replication has its own budget: a follower keeps fetching while clients hold the whole
  client budget.
- Memory under ten concurrent ~95 MiB requests stays within a stated bound.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2, metadata_pb2
from kclient.records import BatchBuilder
from tests.support import wait_until

pytestmark = pytest.mark.integration

MIB = 1 << 20
DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}


def records(size: int) -> bytes:
    b = BatchBuilder()
    b.append(int(time.time() * 1000), None, b"v" * size)
    return b.build()


def produce(topic: str, payload: bytes, acks: int = -1, timeout_ms: int = 10000) -> log_pb2.ProduceRequest:
    req = log_pb2.ProduceRequest(acks=acks, timeout_ms=timeout_ms)
    req.topics.add(name=topic).partitions.add(index=0, records=payload)
    return req


def stub_of(address: str) -> broker_pb2_grpc.BrokerStub:
    options = [("grpc.max_send_message_length", 200 * MIB), ("grpc.max_receive_message_length", 200 * MIB)]
    return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(address, options=options))


def make_topic(cluster: LocalCluster, name: str, replicas: list[int] | None = None) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        if replicas is None:
            admin.create_topics([NewTopic(name, 1, 1)])
        else:
            admin.create_topics([NewTopic(name, replica_assignments={0: replicas})])


def connect(address: str, timeout_s: float = 30.0) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout_s)


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for s in opened:
        s.close()


def assert_broker_serves(stub: broker_pb2_grpc.BrokerStub, topic: str, size: int = 1000) -> None:
    stub.Metadata(metadata_pb2.MetadataRequest(), timeout=20)
    resp = stub.Produce(produce(topic, records(size)), timeout=20)
    assert resp.topics[0].partitions[0].error_code == 0


def test_frame_sizes_alone_take_nothing_from_the_budget(
    cluster_factory: Callable[..., LocalCluster], sockets: list[socket.socket]
) -> None:
    cluster = cluster_factory(1, **DOOR)
    make_topic(cluster, "t")
    door = cluster.brokers[0].kafka_listeners["PLAINTEXT"]
    # 12 bytes in all promise 256 MiB: the whole default queued.max.request.bytes.
    for size in (100 * MIB - 1, 100 * MIB - 1, 56 * MIB + 2):
        s = connect(door)
        s.sendall(size.to_bytes(4, "big"))
        sockets.append(s)
    time.sleep(1.0)
    stub = stub_of(cluster.bootstrap)
    for _ in range(3):
        assert_broker_serves(stub, "t")


def test_bytes_read_before_authentication_never_come_from_the_budget(
    cluster_factory: Callable[..., LocalCluster], sockets: list[socket.socket]
) -> None:
    cluster = cluster_factory(
        1,
        **{
            "kafka.listeners": "KSCRAM://127.0.0.1:0",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,KSCRAM:SASL_PLAINTEXT",
            "queued.max.request.bytes": str(2 * MIB),
        },
    )
    make_topic(cluster, "t")
    door = cluster.brokers[0].kafka_listeners["KSCRAM"]
    for _ in range(8):  # 8 unauthenticated frames of 512 KiB, nearly all sent
        s = connect(door)
        s.sendall((512 * 1024).to_bytes(4, "big") + b"\0" * (500 * 1024))
        sockets.append(s)
    time.sleep(1.0)
    assert_broker_serves(stub_of(cluster.bootstrap), "t", size=700 * 1024)


def test_silent_and_stalled_connections_are_closed(
    cluster_factory: Callable[..., LocalCluster], sockets: list[socket.socket]
) -> None:
    cluster = cluster_factory(1, **DOOR, **{"connections.max.idle.ms": "1500", "request.read.timeout.ms": "1500"})
    door = cluster.brokers[0].kafka_listeners["PLAINTEXT"]
    silent, stalled = connect(door, 20.0), connect(door, 20.0)
    sockets += [silent, stalled]
    stalled.sendall((1000).to_bytes(4, "big") + b"\0" * 10)  # a frame that never completes
    for s in (silent, stalled):
        try:
            got = s.recv(1)
        except ConnectionResetError:
            got = b""
        assert got == b"", "the broker kept a silent connection open"


def padded_fetch(topic: str, padding: int) -> bytes:
    """A long-poll Fetch with ``padding`` bytes in an unknown field (number 999)."""
    req = log_pb2.FetchRequest(max_wait_ms=20000, min_bytes=1)
    req.topics.add(name=topic).partitions.add(index=0, fetch_offset=0)
    field = bytearray()
    for value in (999 << 3 | 2, padding):  # the field's key, then its length, as varints
        while True:
            byte, value = value & 0x7F, value >> 7
            field.append(byte | (0x80 if value else 0))
            if not value:
                break
    return req.SerializeToString() + bytes(field) + b"\0" * padding


def test_parked_fetches_padded_with_unknown_fields_hold_no_budget(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(1, **{"queued.max.request.bytes": str(4 * MIB)})
    make_topic(cluster, "idle")
    make_topic(cluster, "t")
    channel = grpc.insecure_channel(cluster.bootstrap, options=[("grpc.max_send_message_length", 200 * MIB)])
    raw_fetch = channel.unary_unary("/kbroker.v1.Broker/Fetch")
    parked = [raw_fetch.future(padded_fetch("idle", int(1.8 * MIB)), timeout=40) for _ in range(2)]
    time.sleep(1.0)
    assert not any(f.done() for f in parked)
    assert_broker_serves(stub_of(cluster.bootstrap), "t", size=900 * 1024)
    for f in parked:
        f.cancel()
    channel.close()


def test_replication_is_served_while_clients_hold_the_whole_budget(
    cluster_factory: Callable[..., LocalCluster], sockets: list[socket.socket]
) -> None:
    limit = 3 * MIB
    cluster = cluster_factory(
        2,
        **DOOR,
        **{
            "queued.max.request.bytes": str(limit),
            "socket.request.max.bytes": str(2 * MIB),
            "min.insync.replicas": "2",  # the write is acknowledged only once the follower has it
            "replica.lag.time.max.ms": "30000",
            "zookeeper.session.timeout.ms": "30000",  # the paused follower stays in the ISR
            "request.read.timeout.ms": "120000",  # the clients' frames hold the budget throughout
        },
    )
    make_topic(cluster, "t", replicas=[0, 1])
    wait_until(lambda: cluster.brokers[1].running(), 5)
    stub = stub_of(cluster.brokers[0].address)
    assert stub.Produce(produce("t", records(100)), timeout=20).topics[0].partitions[0].error_code == 0
    # The follower stops: an acks=all write waits for it. Only once every thread of it has
    # stopped, though: SIGSTOP takes milliseconds to stop a process, and a follower still
    # running then takes the write (and the leader rightly acknowledges it).
    stopping = cluster.brokers[1].pause()
    try:
        waiting = produce("t", records(100), timeout_ms=40000)
        sent = time.monotonic()
        pending = stub.Produce.future(waiting, timeout=60)
        time.sleep(0.5)
        # Clients now hold all of the client budget the write left, with bytes really sent
        # (all but the last byte of each frame).
        door = cluster.brokers[0].kafka_listeners["PLAINTEXT"]
        for size in (2 * MIB, limit - 2 * MIB - waiting.ByteSize()):
            s = connect(door)
            sockets.append(s)
            data = size.to_bytes(4, "big") + b"\0" * (size - 1)
            threading.Thread(target=_send_quietly, args=(s, data), daemon=True).start()
        time.sleep(2.0)
        if pending.done():
            raise AssertionError(
                f"answered within {time.monotonic() - sent:.1f} s while the follower was stopped (all its "
                f"threads stopped {stopping * 1000:.1f} ms after SIGSTOP, before the write was sent); "
                f"ISR {isr_of(stub, 't')}: {pending.result()}"
            )
    finally:
        cluster.brokers[1].resume()
    resumed = time.monotonic()
    # The follower's fetches come from the inter-broker budget: the write is acknowledged
    # within seconds (with the client budget it would wait for the clients' frames, which
    # hold it past the write's 40 s timeout).
    resp = pending.result(timeout=60)
    assert resp.topics[0].partitions[0].error_code == 0
    assert time.monotonic() - resumed < 10, (
        f"acknowledged {time.monotonic() - resumed:.1f} s after the follower resumed"
    )


def isr_of(stub: broker_pb2_grpc.BrokerStub, topic: str) -> str:
    """The leader's ISR of ``topic``-0, or why it could not be read (the budget is full)."""
    try:
        md = stub.Metadata(metadata_pb2.MetadataRequest(topics=[topic]), timeout=5)
        return str(list(md.topics[0].partitions[0].isr_nodes))
    except grpc.RpcError as exc:
        return f"unknown ({exc.code().name})"


def _send_quietly(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
    except OSError:
        pass


def status_mib(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` size (VmRSS: resident now, VmHWM: its peak) in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) // 1024
    raise AssertionError(f"no {field}")


REQUEST_MIB = 95
PEAK_COPIES = 3
"""What one large request costs at once: while gRPC receives a message it holds it three
times (its receive buffers, the bytearray it joins them into, the bytes it hands over),
and each connection reads one such request at a time (the next only once its share
would still hold a request of socket.request.max.bytes). Decoded, a request costs
twice its size (the message and the records taken from it), less than its read."""

MARGIN_MIB = 64
"""For the allocator, thread stacks and the small requests around the test."""


@pytest.mark.slow
@pytest.mark.parametrize("connections", [1, 10])
def test_memory_stays_bounded_under_ten_concurrent_large_requests(
    cluster_factory: Callable[..., LocalCluster], connections: int
) -> None:
    """Ten concurrent 95 MiB Produce requests (refused for size: message.max.bytes), on one
    connection or on ten: the broker's RSS peaks within idle + 3 x 95 MiB + 64 MiB and is
    back within 32 MiB of idle afterwards. Measured: 358-364 MiB peak and 77-78 MiB after
    (idle 77 MiB); before the bound, 1,260-1,410 MiB peak and 1,080-1,236 MiB after."""
    cluster = cluster_factory(1)
    make_topic(cluster, "t")
    proc = cluster.brokers[0].proc
    assert proc is not None
    pid = proc.pid
    assert_broker_serves(stub_of(cluster.bootstrap), "t")
    time.sleep(0.5)
    idle = status_mib(pid, "VmRSS")
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # VmHWM starts again from VmRSS: the peak measured is this test's
    big = records(REQUEST_MIB * MIB)
    stubs = [stub_of(cluster.bootstrap) for _ in range(connections)]

    def send(i: int) -> str:
        try:
            resp = stubs[i % connections].Produce(produce("t", big), timeout=120)
            return str(resp.topics[0].partitions[0].error_code)
        except grpc.RpcError as exc:
            return exc.code().name

    with ThreadPoolExecutor(10) as pool:
        outcomes = list(pool.map(send, range(10)))
    peak = status_mib(pid, "VmHWM")
    after = [status_mib(pid, "VmRSS")]
    deadline = time.monotonic() + 10
    while after[-1] > idle + 32 and time.monotonic() < deadline:
        time.sleep(0.1)
        after.append(status_mib(pid, "VmRSS"))
    print(f"broker RSS idle {idle} MiB, peak {peak} MiB, after {after[-1]} MiB; outcomes {outcomes}")
    assert outcomes == ["10"] * 10  # MESSAGE_TOO_LARGE, each
    bound = idle + PEAK_COPIES * REQUEST_MIB + MARGIN_MIB
    assert peak <= bound, f"broker RSS peaked at {peak} MiB, over idle + 3 x {REQUEST_MIB} + {MARGIN_MIB} = {bound}"
    assert after[-1] <= idle + 32, f"broker RSS stayed at {after[-1]} MiB after the requests (idle {idle} MiB)"
    assert_broker_serves(stub_of(cluster.bootstrap), "t")
    assert os.path.exists(f"/proc/{pid}")
