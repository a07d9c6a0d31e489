"""Small helpers shared by the tests: polling, and fakes for one role each."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError
from kazoo.protocol.states import ZnodeStat

from kbroker.cluster import zkdata
from kbroker.cluster.metadata_cache import ClusterSnapshot, TopicInfo
from kbroker.cluster.zk_client import ZkClient
from kbroker.security.credentials import CredentialStore, new_credential
from kclient.errors import KafkaConnectionError
from kclient.scram import ScramMechanism


def set_scram_passwords(zk_connect: str, passwords: dict[str, str]) -> None:
    """Give each user a SCRAM-SHA-256 and a SCRAM-SHA-512 credential from his password, in
    one write per user (one change notification, as ``kafka-configs --add-config
    'SCRAM-SHA-256=[...],SCRAM-SHA-512=[...]'``): a broker that reads the user between two
    writes would cache half of them until the second notification arrives."""
    zk = ZkClient(zk_connect)
    zk.start()
    try:
        store = CredentialStore(zk)
        for user, password in passwords.items():
            store.alter(user, upsert={m: new_credential(m, password) for m in ScramMechanism})
    finally:
        zk.close()


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
    not kept (a test fires them); ``reads`` counts the ``get_async`` calls per path.
    ``connected`` false plays a lost quorum: ``await_connection`` answers False at once
    and counts itself in ``connection_waits`` (``require_connection`` is ZkClient's own)."""

    def __init__(self) -> None:
        self.kazoo = self
        self.nodes: dict[str, bytes] = {}
        self.versions: Counter[str] = Counter()
        self.reads: Counter[str] = Counter()
        self.connected = True
        self.connection_waits = 0

    def await_connection(self, wait_s: float) -> bool:
        self.connection_waits += 1
        return self.connected

    require_connection = ZkClient.require_connection
    """ZkClient's own refusal, over this fake's :meth:`await_connection`."""

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


def serve_offset_for_leader_epoch(request: Any, log_of: Callable[[str, int], Any]) -> Any:
    """A leader's OffsetForLeaderEpoch answer, in process: each partition of ``request``
    answered from the leader-epoch cache of ``log_of(topic, partition)`` (a
    ``kbroker.storage.log.Log``). The shared body of the LeaderEndPoint fakes."""
    from kclient.proto.kbroker.v1 import log_pb2

    resp = log_pb2.OffsetForLeaderEpochResponse()
    for t in request.topics:
        tr = resp.topics.add(name=t.name)
        for p in t.partitions:
            log = log_of(t.name, p.index)
            epoch, end = log.leader_epoch_cache.end_offset_for(p.leader_epoch, log.log_end_offset)
            tr.partitions.add(index=p.index, leader_epoch=epoch, end_offset=end)
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


@dataclass
class KazooStat:
    """The fields of a kazoo ``ZnodeStat`` that :class:`FakeKazoo`'s callers read."""

    version: int
    czxid: int
    ephemeralOwner: int = 0


class FakeKazooTransaction:
    """A kazoo transaction over :class:`FakeKazoo`'s nodes: all or nothing, with kazoo's
    per-operation results (``RolledBackError`` for the operations of a failed one)."""

    def __init__(self, kz: FakeKazoo) -> None:
        self.kz = kz
        self.ops: list[tuple[str, str, bytes, int]] = []

    def check(self, path: str, version: int) -> None:
        self.ops.append(("check", path, b"", version))

    def set_data(self, path: str, data: bytes, version: int = -1) -> None:
        self.ops.append(("set", path, data, version))

    def create(self, path: str, data: bytes = b"", **_: Any) -> None:
        self.ops.append(("create", path, data, -1))

    def _apply(self) -> list[Any]:
        nodes = self.kz.nodes
        results: list[Any] = []
        for op, path, _data, version in self.ops:
            if op in ("check", "set"):
                if path not in nodes:
                    results.append(NoNodeError())
                elif version != -1 and nodes[path][1] != version:
                    results.append(BadVersionError())
                else:
                    results.append(True)
            else:
                results.append(NodeExistsError() if path in nodes else True)
            if isinstance(results[-1], Exception):
                return [r if isinstance(r, Exception) else RolledBackError() for r in results] + [
                    RolledBackError() for _ in self.ops[len(results) :]
                ]
        out: list[Any] = []
        for op, path, data, _version in self.ops:
            if op == "set":
                nodes[path] = (data, nodes[path][1] + 1)
                out.append(KazooStat(nodes[path][1], 1))
            elif op == "create":
                nodes[path] = (data, 0)
                out.append(path)
            else:
                out.append(True)
        return out

    def commit_async(self) -> _Result:
        self.kz.calls["commit_async"] += 1
        return _Result(self._apply())

    def commit(self) -> list[Any]:
        self.kz.calls["commit"] += 1
        return self._apply()


class FakeKazoo:
    """An in-memory kazoo client: ``nodes`` maps a path to (data, version). ``calls`` counts
    each call by name (``blocking()`` sums the round trips that block); ``watches`` records
    the watch passed to every ``exists`` and ``get_children``, for a test to fire."""

    connected = True
    client_id = (1, b"")

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[bytes, int]] = {}
        self.calls: Counter[str] = Counter()
        self.watches: list[Any] = []

    def blocking(self) -> int:
        return sum(n for k, n in self.calls.items() if not k.endswith("_async") and k != "transaction")

    def get(self, path: str, watch: Any = None) -> tuple[bytes, KazooStat]:
        self.calls["get"] += 1
        if path not in self.nodes:
            raise NoNodeError()
        data, version = self.nodes[path]
        return data, KazooStat(version, 7)

    def get_async(self, path: str) -> _Result:
        self.calls["get_async"] += 1
        if path not in self.nodes:
            return _Result(error=NoNodeError())
        data, version = self.nodes[path]
        return _Result((data, KazooStat(version, 7)))

    def exists(self, path: str, watch: Any = None) -> KazooStat | None:
        self.calls["exists"] += 1
        self.watches.append(watch)
        return KazooStat(self.nodes[path][1], 7) if path in self.nodes else None

    def get_children(self, path: str, watch: Any = None) -> list[str]:
        self.calls["get_children"] += 1
        self.watches.append(watch)
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix) :].split("/")[0] for p in self.nodes if p.startswith(prefix)})

    def create_async(self, path: str, data: bytes = b"", **_: Any) -> _Result:
        self.calls["create_async"] += 1
        if path in self.nodes:
            return _Result(error=NodeExistsError())
        self.nodes[path] = (data, 0)
        return _Result(path)

    def transaction(self) -> FakeKazooTransaction:
        self.calls["transaction"] += 1
        return FakeKazooTransaction(self)

    def create(self, path: str, data: bytes = b"", **_: Any) -> str:
        self.calls["create"] += 1
        if path in self.nodes:
            raise NodeExistsError()
        self.nodes[path] = (data, 0)
        return path

    def set(self, path: str, data: bytes, version: int = -1) -> KazooStat:
        self.calls["set"] += 1
        if path not in self.nodes:
            raise NoNodeError()
        if version != -1 and self.nodes[path][1] != version:
            raise BadVersionError()
        self.nodes[path] = (data, self.nodes[path][1] + 1)
        return KazooStat(self.nodes[path][1], 7)


class FakeMetadataCache:
    """The broker's metadata cache as the group coordinator and the core read it: a
    snapshot with the live ``brokers`` (ids, each ``BrokerInfo`` at 127.0.0.1:9092+id)
    and ``topics`` (name -> partition count, every replica on the first broker)."""

    def __init__(self, brokers: Iterable[int] = (1,), topics: dict[str, int] | None = None) -> None:
        self.brokers = list(brokers)
        self.topics = dict(topics or {})

    def loaded(self) -> bool:
        return True

    def snapshot(self) -> ClusterSnapshot:
        first = self.brokers[:1]
        return ClusterSnapshot(
            brokers={b: zkdata.BrokerInfo(b, "127.0.0.1", 9092 + b) for b in self.brokers},
            topics={
                name: TopicInfo(name, {p: list(first) for p in range(count)}) for name, count in self.topics.items()
            },
        )


class FakeAuthorizer:
    """An authorizer that refuses exactly the ``denied`` (operation name, resource type
    name, resource name) triples, and records every question."""

    def __init__(self, *denied: tuple[str, str, str]) -> None:
        self.denied = set(denied)
        self.asked: list[tuple[str, str, str]] = []

    def authorize(
        self,
        principal: Any,
        host: str,
        operation: Any,
        resource_type: Any,
        resource_name: str,
        *,
        log_denied: bool = True,
    ) -> bool:
        key = (operation.name, resource_type.name, resource_name)
        self.asked.append(key)
        return key not in self.denied

    def authorize_by_resource_type(self, principal: Any, host: str, operation: Any, resource_type: Any) -> bool:
        return not any(op == operation.name and rt == resource_type.name for op, rt, _ in self.denied)


class FakeMetadata:
    """kclient's ClusterMetadata as the client's roles read it, with no broker behind it.

    ``counts`` gives a topic's partition count (``default_partitions`` for a topic not in
    it; ``None`` means the topic is unknown); ``addresses`` are the brokers, and
    ``leader`` (the first address unless given) leads every partition. ``refreshes``
    counts the refreshes; ``refresh_due`` makes ``needs_refresh`` true until the next one."""

    def __init__(
        self,
        counts: dict[str, int] | None = None,
        *,
        default_partitions: int | None = None,
        addresses: Iterable[str] = ("leader:1",),
        leader: str | None = None,
    ) -> None:
        self.counts = dict(counts or {})
        self.default_partitions = default_partitions
        self.addresses = list(addresses)
        self.leader = leader if leader is not None else self.addresses[0]
        self.refreshes = 0
        self.refresh_due = False

    def partitions_for(self, topic: str) -> set[int] | None:
        n = self.counts.get(topic, self.default_partitions)
        return set(range(n)) if n else None

    def wait_for_partitions(self, topic: str, timeout_s: float) -> set[int]:
        return self.partitions_for(topic) or set()

    def topics(self) -> set[str]:
        return set(self.counts)

    def add_topics(self, topics: Any) -> None:
        pass

    def leader_address(self, tp: Any) -> str:
        return self.leader

    def broker_addresses(self) -> list[str]:
        return list(self.addresses)

    def needs_refresh(self, now: float) -> bool:
        return self.refresh_due

    def refresh(self, topics: Any = None, *, all_topics: bool = False) -> None:
        self.refresh_due = False
        self.refreshes += 1

    def maybe_refresh(self, timeout_s: float | None = None) -> bool:
        self.refresh()
        return True

    def request_update(self) -> None:
        pass


class DoneFuture:
    """A gRPC future already done: ``fn()``'s value, or the exception it raised."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        try:
            self._value, self._exc = fn(), None
        except Exception as exc:
            self._value, self._exc = None, exc

    def result(self, timeout: float | None = None) -> Any:
        if self._exc is not None:
            raise self._exc
        return self._value

    def add_done_callback(self, cb: Callable[[DoneFuture], None]) -> None:
        cb(self)


class FakeTransport:
    """kclient's Transport as the client's roles call it, with no network.

    - Each RPC answers from a script: ``answers`` (method -> answer) or ``on(method,
      *answers)``; each call takes the next answer and the last one repeats. An answer is
      a response, an exception to raise, or a callable taking the request and giving the
      response. An RPC without a script fails the test.
    - ``stub(address).<Method>.future(request)`` is an already-done future over ``call``,
      unless ``futures`` gives the method a maker (request -> future): then the test (or an
      in-process leader) completes it, and ``issued[method]`` lists the futures made.
    - Addresses in ``down`` refuse connections (``KafkaConnectionError``).
    - ``calls`` records every (address, method, request) in order.
    - ``failed(address, exc)`` turns a failed gRPC call into the client's error; the
      failure must be one of ``failures``.
    """

    def __init__(
        self,
        answers: dict[str, Any] | None = None,
        *,
        futures: dict[str, Callable[[Any], Any]] | None = None,
        request_timeout_s: float = 1.0,
        failures: tuple[type[BaseException], ...] = (Exception,),
    ) -> None:
        self.request_timeout_s = request_timeout_s
        self.scripts: dict[str, list[Any]] = {}
        for method, answer in (answers or {}).items():
            self.on(method, answer)
        self.futures = dict(futures or {})
        self.issued: dict[str, list[Any]] = {method: [] for method in self.futures}
        self.failures = failures
        self.down: set[str] = set()
        self.calls: list[tuple[str, str, Any]] = []
        self.closed = False

    def on(self, method: str, *answers: Any) -> None:
        self.scripts[method] = list(answers)

    def methods(self) -> list[str]:
        return [m for _, m, _ in self.calls]

    def requests(self, method: str) -> list[Any]:
        return [r for _, m, r in self.calls if m == method]

    def addresses(self) -> list[str]:
        return [a for a, _, _ in self.calls]

    def candidates(self, addresses: list[str]) -> list[str]:
        return list(addresses)

    def call(self, address: str, method: str, request: Any, timeout_s: float | None = None) -> Any:
        self.calls.append((address, method, request))
        if address in self.down:
            raise KafkaConnectionError(f"{address} is down")
        assert method in self.scripts, f"unexpected {method} call"
        script = self.scripts[method]
        item = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(item, Exception):
            raise item
        return item(request) if callable(item) else item

    def call_any(self, method: str, request: Any, addresses: Any = (), timeout_s: float | None = None, **_: Any) -> Any:
        return self.call("any", method, request, timeout_s)

    def stub(self, address: str) -> Any:
        transport = self

        class _Method:
            def __init__(self, name: str) -> None:
                self.name = name

            def future(self, request: Any, timeout: float | None = None) -> Any:
                make = transport.futures.get(self.name)
                if make is None:
                    return DoneFuture(lambda: transport.call(address, self.name, request))
                future = make(request)
                transport.issued[self.name].append(future)
                return future

        class _Stub:
            def __getattr__(self, name: str) -> _Method:
                return _Method(name)

        return _Stub()

    def failed(self, address: str, exc: BaseException) -> KafkaConnectionError:
        assert isinstance(exc, self.failures), f"unexpected failure {exc!r}"
        details = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)  # type: ignore[attr-defined]
        return KafkaConnectionError(f"{address}: {details}")

    def mark_failed(self, address: str) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeClock:
    """A clock a test moves by hand: call it for the time, add to ``now`` to move it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Aborted(Exception):
    """What :meth:`FakeContext.abort` raises (grpc.aio's abort ends the handler)."""


class FakeContext:
    """The parts of a gRPC servicer context the door's codecs use."""

    def __init__(self) -> None:
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.aborted = (code, details)
        raise Aborted(details)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5555"
