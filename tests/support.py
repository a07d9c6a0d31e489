"""Small helpers shared by the tests: polling, and fakes for one role each."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import ZnodeStat

from kbroker.cluster import zkdata


def wait_until(predicate: Callable[[], object], timeout_s: float = 60, what: str = "condition") -> None:
    """Poll ``predicate`` until it is truthy; an exception counts as "not yet"."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


class FakeZooKeeper:
    """An in-memory stand-in for :class:`kbroker.cluster.zk_client.ZkClient` as the metadata
    cache uses it: kazoo's ``get_async``/``exists_async``/``get_children``/``exists`` (as
    ``.kazoo``), ``broker``, ``controller_epoch`` and ``add_state_listener``. Watches are
    not kept (a test fires them); ``reads`` counts the ``get_async`` calls per path."""

    def __init__(self) -> None:
        self.kazoo = self
        self.nodes: dict[str, bytes] = {}
        self.versions: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()

    def set(self, path: str, data: bytes) -> None:
        if path in self.nodes:
            self.versions[path] += 1
        self.nodes[path] = data

    def _stat(self, path: str) -> Any:
        return ZnodeStat(0, 0, 0, 0, self.versions[path], 0, 0, 0, len(self.nodes[path]), 0, 0)

    def get_async(self, path: str, watch: object = None) -> _Result:
        self.reads[path] += 1
        if path not in self.nodes:
            return _Result(error=NoNodeError(path))
        return _Result((self.nodes[path], self._stat(path)))

    def exists_async(self, path: str, watch: object = None) -> _Result:
        return _Result(self._stat(path) if path in self.nodes else None)

    def exists(self, path: str, watch: object = None) -> object:
        return self._stat(path) if path in self.nodes else None

    def get_children(self, path: str, watch: object = None) -> list[str]:
        prefix = path.rstrip("/") + "/"
        children = {p[len(prefix) :].split("/", 1)[0] for p in self.nodes if p.startswith(prefix)}
        if not children and path not in self.nodes:
            raise NoNodeError(path)
        return sorted(children)

    def broker(self, broker_id: int) -> Any:
        data = self.nodes.get(zkdata.broker_path(broker_id))
        return None if data is None else zkdata.decode_broker(broker_id, data)

    def controller_epoch(self) -> tuple[int, int]:
        return 0, -1

    def add_state_listener(self, listener: object) -> None:
        pass


class _Result:
    """A completed kazoo async result."""

    def __init__(self, value: Any = None, error: Exception | None = None) -> None:
        self._value, self._error = value, error

    def get(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


def serve_fetch(request: Any, leader_of: Callable[[str, int], Any]) -> Any:
    """A leader's Fetch answer, in process: each partition of ``request`` (a
    ``log_pb2.FetchRequest``) read from ``leader_of(topic, partition)`` (a
    ``kbroker.replication.partition.Partition``) as the broker's Fetch does, errors per
    partition. The shared body of the unit tests' LeaderEndPoint fakes."""
    from kclient.errors import BrokerResponseError
    from kclient.proto.kbroker.v1 import log_pb2

    resp = log_pb2.FetchResponse()
    for t in request.topics:
        tr = resp.topics.add(name=t.name)
        for p in t.partitions:
            pr = tr.partitions.add(index=p.index)
            leader = leader_of(t.name, p.index)
            try:
                leader.record_follower_fetch(request.replica_id, p.fetch_offset, p.current_leader_epoch)
                r = leader.read(p.fetch_offset, p.partition_max_bytes, request.replica_id)
            except BrokerResponseError as exc:
                pr.error_code = exc.errno
                pr.error_message = exc.message
                continue
            pr.high_watermark, pr.log_start_offset, pr.log_end_offset = (
                r.high_watermark,
                r.log_start_offset,
                r.log_end_offset,
            )
            pr.records = r.records
    return resp


class InProcessControllerChannel:
    """A controller channel (:class:`kbroker.cluster.controller.ChannelLike`) that hands
    LeaderAndIsr and UpdateMetadata straight to metadata caches in this process (broker id
    -> cache), with the same fencing as over gRPC; it records what it sent.

    ``maker`` is what :class:`~kbroker.cluster.controller.Controller` takes as ``channel``."""

    def __init__(self, caches: dict[int, Any]) -> None:
        self.caches = caches
        self.sent: list[tuple[str, int, list[Any]]] = []
        """(kind, broker id, updates) in the order sent."""
        self._known: set[int] = set()
        self._tenure: tuple[int, int] = (-1, -1)

    def maker(self, controller_id: int, epoch: int) -> InProcessControllerChannel:
        self._tenure = (controller_id, epoch)
        self._known = set()
        return self

    def set_brokers(self, live: dict[int, Any]) -> list[int]:
        added = sorted(set(live) - self._known)
        self._known = set(live)
        return added

    def send(self, leader_and_isr: dict[int, list[Any]], update_metadata: list[Any], to: Any = None) -> dict[int, Any]:
        from concurrent.futures import Future

        targets = set(leader_and_isr) | (self._known if to is None else set(to))
        out: dict[int, Future[None]] = {}
        for broker in sorted(targets & self._known):
            fut: Future[None] = Future()
            out[broker] = fut
            cache = self.caches.get(broker)
            try:
                for kind, updates in (
                    ("LeaderAndIsr", leader_and_isr.get(broker, [])),
                    ("UpdateMetadata", update_metadata),
                ):
                    if updates:
                        self.sent.append((kind, broker, list(updates)))
                        if cache is not None:
                            cache.apply_controller_states(self._tenure[0], self._tenure[1], -1, list(updates))
                fut.set_result(None)
            except Exception as exc:
                fut.set_exception(exc)
        return out

    def close(self) -> None:
        self._known = set()
