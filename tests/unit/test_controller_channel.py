"""The controller channel against in-process gRPC brokers (fakes of the broker's two
controller RPCs): UpdateMetadata waits for the batch's LeaderAndIsr answers, pending
states coalesce (newest wins), a refusal fails the call's future, and a broker that
cannot be reached yet gets the states once it can."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from kbroker.cluster.controller_channel import ControllerChannel, PartitionStateUpdate
from kbroker.cluster.zkdata import BrokerInfo, LeaderAndIsr
from kclient.errors import KafkaError, StaleControllerEpochError
from kclient.proto.kbroker.v1 import broker_pb2_grpc, cluster_pb2, common_pb2


class FakeBroker(broker_pb2_grpc.BrokerServicer):
    def __init__(self, broker_id: int, delay_s: float = 0.0, refuse: int = 0) -> None:
        self.broker_id = broker_id
        self.delay_s = delay_s
        self.refuse = refuse
        self.serving = threading.Event()
        """Set once the first request arrives."""
        self.calls: list[tuple[str, float, float, list[tuple[str, int, int]]]] = []
        """(kind, started, answered, [(topic, partition, leader epoch)])."""

    def _serve(self, kind: str, request: object) -> None:
        started = time.monotonic()
        self.serving.set()
        time.sleep(self.delay_s)
        states = [(m.topic, m.partition, m.leader_epoch) for m in request.partition_states]  # type: ignore[attr-defined]
        self.calls.append((kind, started, time.monotonic(), states))

    def LeaderAndIsr(
        self, request: cluster_pb2.LeaderAndIsrRequest, context: object
    ) -> cluster_pb2.LeaderAndIsrResponse:
        self._serve("LeaderAndIsr", request)
        return cluster_pb2.LeaderAndIsrResponse(error_code=self.refuse)  # type: ignore[arg-type]

    def UpdateMetadata(
        self, request: cluster_pb2.UpdateMetadataRequest, context: object
    ) -> cluster_pb2.UpdateMetadataResponse:
        self._serve("UpdateMetadata", request)
        return cluster_pb2.UpdateMetadataResponse(error_code=self.refuse)  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(fake: FakeBroker, port: int) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    broker_pb2_grpc.add_BrokerServicer_to_server(fake, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


@pytest.fixture
def servers() -> Iterator[list[grpc.Server]]:
    started: list[grpc.Server] = []
    yield started
    for server in started:
        server.stop(0)


def _update(p: int, epoch: int) -> PartitionStateUpdate:
    return PartitionStateUpdate("t", p, "id", LeaderAndIsr(1, epoch, [1, 2], 5, 0))


def test_update_metadata_waits_for_the_batch_s_leader_and_isr_answers(servers: list[grpc.Server]) -> None:
    slow, quick = FakeBroker(1, delay_s=0.5), FakeBroker(2)
    ports = {1: _free_port(), 2: _free_port()}
    servers += [_serve(slow, ports[1]), _serve(quick, ports[2])]
    channel = ControllerChannel(0, 5, grpc.insecure_channel)
    try:
        assert channel.set_brokers({b: BrokerInfo(b, "127.0.0.1", ports[b], epoch=10 + b) for b in ports}) == [1, 2]
        sent = channel.send({1: [_update(0, 1)]}, [_update(0, 1)])
        for fut in sent.values():
            fut.result(10)
        (lai,) = [c for c in slow.calls if c[0] == "LeaderAndIsr"]
        (um,) = [c for c in quick.calls if c[0] == "UpdateMetadata"]
        assert um[1] >= lai[2], "UpdateMetadata reached broker 2 before broker 1 answered LeaderAndIsr"
        assert [c[0] for c in slow.calls] == ["LeaderAndIsr", "UpdateMetadata"]
    finally:
        channel.close()


def test_pending_states_coalesce_and_a_refusal_fails_the_future(servers: list[grpc.Server]) -> None:
    busy = FakeBroker(1, delay_s=0.3)
    port = _free_port()
    servers.append(_serve(busy, port))
    channel = ControllerChannel(0, 5, grpc.insecure_channel)
    try:
        channel.set_brokers({1: BrokerInfo(1, "127.0.0.1", port, epoch=11)})
        first = channel.send({}, [_update(0, 1)])[1]
        assert busy.serving.wait(10)  # the first request is being served: the next ones wait, and merge
        channel.send({}, [_update(0, 2), _update(1, 1)])
        last = channel.send({}, [_update(0, 3)])[1]
        first.result(10)
        last.result(10)
        assert [c[3] for c in busy.calls] == [[("t", 0, 1)], [("t", 0, 3), ("t", 1, 1)]]
        busy.refuse = common_pb2.STALE_CONTROLLER_EPOCH
        with pytest.raises(StaleControllerEpochError):
            channel.send({}, [_update(0, 4)])[1].result(10)
    finally:
        channel.close()


def test_a_broker_not_reachable_yet_gets_the_states_once_it_is(servers: list[grpc.Server]) -> None:
    late = FakeBroker(1)
    port = _free_port()
    channel = ControllerChannel(0, 5, grpc.insecure_channel)
    try:
        channel.set_brokers({1: BrokerInfo(1, "127.0.0.1", port, epoch=11)})
        fut = channel.send({1: [_update(0, 1)]}, [_update(0, 1)])[1]
        time.sleep(1.0)
        assert not fut.done()
        servers.append(_serve(late, port))
        fut.result(30)
        assert [c[0] for c in late.calls] == ["LeaderAndIsr", "UpdateMetadata"]
    finally:
        channel.close()


def test_a_broker_gone_fails_what_was_pending_and_a_new_registration_is_new() -> None:
    earlier = set(threading.enumerate())
    channel = ControllerChannel(0, 5, grpc.insecure_channel)
    port = _free_port()  # nothing listens: the request stays pending
    try:
        channel.set_brokers({1: BrokerInfo(1, "127.0.0.1", port, epoch=11)})
        fut = channel.send({}, [_update(0, 1)])[1]
        assert channel.set_brokers({1: BrokerInfo(1, "127.0.0.1", port, epoch=12)}) == [1]  # re-registered
        with pytest.raises(KafkaError):
            fut.result(10)
        assert channel.set_brokers({}) == []
    finally:
        channel.close()
    # Each registration's sender ends once closed (the first one's call to nowhere may
    # still be timing out): none is left behind.
    senders = [t for t in set(threading.enumerate()) - earlier if t.name.startswith("controller-channel-")]
    for sender in senders:
        sender.join(30)
    assert not [t for t in senders if t.is_alive()]
