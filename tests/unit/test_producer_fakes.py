"""Fakes for the producer's unit tests: an in-process leader behind a fake transport.

``FakeLeader`` keeps one log per partition and checks idempotent batches with the
broker's own ``ProducerStateManager`` (kbroker.storage.producer_state): duplicates of
the last 5 batches answered with their offsets, OUT_OF_ORDER_SEQUENCE_NUMBER for a gap,
a newer epoch must start at 0, an older one is fenced. Produce calls can be held
(``hold = True``) and completed one by one in any order, errors can be injected per
call, and an answer can be lost after the leader served the call (``complete(lost=True)``:
the producer sees a failed gRPC call, as after a connection reset).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from kbroker.storage.producer_state import ProducerStateManager
from kclient.errors import InvalidProducerEpochError, OutOfOrderSequenceNumberError
from kclient.proto.kbroker.v1 import cluster_pb2, log_pb2
from kclient.records import decode_batch, read_header
from tests.support import FakeMetadata, FakeTransport

OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
NOT_LEADER_OR_FOLLOWER = 6
REQUEST_TIMED_OUT = 7
ADDRESS = "fake:9092"


class LostAnswer(grpc.RpcError):
    """What the producer sees when a served call's answer is lost (a connection reset)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "Connection reset by peer"


class FakeCall:
    """A Produce call in flight: ``complete()`` answers it (callbacks run on the caller)."""

    def __init__(self, leader: FakeLeader, request: log_pb2.ProduceRequest) -> None:
        self.leader = leader
        self.request = request
        self.response: log_pb2.ProduceResponse | None = None
        self.lost = False
        self.delivered = False
        self.callbacks: list[Callable[[Any], None]] = []
        self.lock = threading.Lock()

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        with self.lock:
            if not self.delivered:
                self.callbacks.append(fn)
                return
        fn(self)

    def result(self) -> log_pb2.ProduceResponse:
        assert self.response is not None
        if self.lost:
            raise LostAnswer()
        return self.response

    def complete(self, error_code: int = 0, *, lost: bool = False, write: bool | None = None) -> None:
        """Answer the call: append its batches, or refuse every one with ``error_code``.
        ``write``: append them even so (an error after the write, like REQUEST_TIMED_OUT), or
        not at all; ``lost``: the producer sees a failed call instead of the answer."""
        self.serve(error_code, write=write)
        self.deliver(lost=lost)

    def serve(self, error_code: int = 0, *, write: bool | None = None) -> None:
        """The leader handles the call now; its answer waits for ``deliver``."""
        self.response = self.leader.handle(self.request, error_code, (not error_code) if write is None else write)

    def deliver(self, *, lost: bool = False) -> None:
        """The served call's answer reaches the producer (or is lost on the way)."""
        with self.lock:
            self.lost = lost
            self.delivered = True
            callbacks, self.callbacks = self.callbacks, []
        for fn in callbacks:
            fn(self)

    def partitions(self) -> list[tuple[str, int]]:
        return [(t.name, p.index) for t in self.request.topics for p in t.partitions]


class FakeLeader:
    """Leader of every partition, in process."""

    def __init__(self, partitions: int = 1) -> None:
        self.metadata = FakeMetadata(default_partitions=partitions, addresses=[ADDRESS])
        """The cluster metadata every producer made by ``install_fake_leader`` reads."""
        self.logs: dict[tuple[str, int], list[bytes | None]] = {}
        self.batch_headers: dict[tuple[str, int], list[Any]] = {}
        self.state: dict[tuple[str, int], ProducerStateManager] = {}
        self.hold = False
        self.held: list[FakeCall] = []
        self.calls: list[FakeCall] = []
        self.max_held = 0
        self.out_of_order = 0
        """OUT_OF_ORDER_SEQUENCE_NUMBER answers given."""
        self.lock = threading.Lock()

    @property
    def partitions(self) -> int:
        """The partition count of every topic."""
        return self.metadata.default_partitions or 0

    @partitions.setter
    def partitions(self, n: int) -> None:
        self.metadata.default_partitions = n

    @property
    def refresh_due(self) -> bool:
        """Set to make the producer's metadata due for a refresh (``refreshes`` counts them)."""
        return self.metadata.refresh_due

    @refresh_due.setter
    def refresh_due(self, due: bool) -> None:
        self.metadata.refresh_due = due

    @property
    def refreshes(self) -> int:
        return self.metadata.refreshes

    def produce(self, request: log_pb2.ProduceRequest) -> FakeCall:
        call = FakeCall(self, request)
        with self.lock:
            self.calls.append(call)
            if self.hold:
                self.held.append(call)
                self.max_held = max(self.max_held, len(self.held))
                return call
        call.complete()
        return call

    def take(self, i: int = 0) -> FakeCall:
        with self.lock:
            return self.held.pop(i)

    def handle(self, request: log_pb2.ProduceRequest, error_code: int, write: bool) -> log_pb2.ProduceResponse:
        resp = log_pb2.ProduceResponse()
        with self.lock:
            for t in request.topics:
                tr = resp.topics.add(name=t.name)
                for p in t.partitions:
                    code, base = self._append((t.name, p.index), p.records) if write else (error_code, -1)
                    self.out_of_order += code == OUT_OF_ORDER_SEQUENCE_NUMBER and not error_code
                    if error_code:
                        code, base = error_code, -1
                    tr.partitions.add(index=p.index, error_code=code, base_offset=base, log_append_time_ms=-1)
        return resp

    def _append(self, tp: tuple[str, int], records: bytes) -> tuple[int, int]:
        log = self.logs.setdefault(tp, [])
        header = read_header(records)
        state = self.state.get(tp)
        if state is None:
            state = self.state[tp] = ProducerStateManager(None, f"{tp[0]}-{tp[1]}")
        try:
            duplicate = state.check_leader_append([header])
        except OutOfOrderSequenceNumberError:
            return OUT_OF_ORDER_SEQUENCE_NUMBER, -1
        except InvalidProducerEpochError:
            return INVALID_PRODUCER_EPOCH, -1
        if duplicate is not None:
            return 0, duplicate.first_offset  # as the broker answers a retry it already wrote
        base = len(log)
        header = header._replace(base_offset=base)
        state.update([header])
        _, recs = decode_batch(records)
        log.extend(r.value for r in recs)
        self.batch_headers.setdefault(tp, []).append(header)
        return 0, base


def install_fake_leader(monkeypatch: pytest.MonkeyPatch) -> FakeLeader:
    """A FakeLeader of 1 partition; Producers made afterwards in the test talk to it."""
    from kclient.producer import producer as module

    fake = FakeLeader()

    def transport(*_: Any, **__: Any) -> FakeTransport:
        return FakeTransport(
            {"InitProducerId": cluster_pb2.InitProducerIdResponse(producer_id=7, producer_epoch=0)},
            futures={"Produce": fake.produce},
            failures=(LostAnswer,),
        )

    monkeypatch.setattr(module, "Transport", transport)
    monkeypatch.setattr(module, "ClusterMetadata", lambda *_, **__: fake.metadata)
    return fake
