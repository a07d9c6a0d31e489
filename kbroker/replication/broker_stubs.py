"""gRPC stubs to the other brokers, one channel per address (the inter-broker calls that
are not replication: the group coordinator's ListOffsets for the lag metric, the
transaction coordinator's WriteTxnMarkers).

A call that fails should :meth:`BrokerStubs.forget` its address, so the next call opens a
new channel (a restarted broker, a dead TCP connection).

Thread safety: the cache has a lock; stubs may be used from any thread (grpc's are).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from kbroker.replication.fetcher import insecure_channel
from kclient.proto.kbroker.v1 import broker_pb2_grpc


class BrokerStubs:
    """``address`` -> a BrokerStub over a channel made by ``channel`` (see the module docstring)."""

    def __init__(self, channel: Callable[[str], grpc.Channel] | None = None) -> None:
        self._new_channel = channel or insecure_channel
        self._lock = threading.Lock()
        self._stubs: dict[str, tuple[grpc.Channel, broker_pb2_grpc.BrokerStub]] = {}

    def stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        with self._lock:
            found = self._stubs.get(address)
            if found is None:
                channel = self._new_channel(address)
                found = self._stubs[address] = (channel, broker_pb2_grpc.BrokerStub(channel))
            return found[1]

    def forget(self, address: str) -> None:
        with self._lock:
            found = self._stubs.pop(address, None)
        if found is not None:
            found[0].close()

    def close(self) -> None:
        with self._lock:
            stubs, self._stubs = self._stubs, {}
        for channel, _ in stubs.values():
            channel.close()
