"""The Kafka door's transaction APIs alone over a fake core (kbroker.doors.kafka.txn_apis,
FindCoordinator key type 1, and the transactional parts of Produce, Fetch and
ListOffsets): each request goes through kio's encoder and the door's decoder at its
lowest and highest version served, reaches the core as plain values, and the answer,
encoded as the door sends it, reads back with the core's result or error code."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer

from kbroker.api.access import Access
from kbroker.api.group_api import CommittedEntry
from kbroker.api.log_api import AbortedTransaction, Fetch, FetchAnswer, IsolationLevel, OffsetQuery, OffsetResult
from kbroker.api.metadata_api import Node
from kbroker.api.txn_api import CommittedOffset, TransactionApi, TransactionMetadata, TxnState
from kbroker.doors.kafka.codec import Header, build, encode_response, read_request
from kbroker.doors.kafka.door import api_table
from kbroker.doors.kafka.group_apis import GroupApis
from kbroker.doors.kafka.log_apis import LogApis
from kbroker.doors.kafka.server import Connection, KafkaRequest
from kbroker.doors.kafka.txn_apis import TxnApis
from kbroker.replication.partition import ReadResult
from kbroker.replication.replica_manager import FetchResult, ProduceResult
from kbroker.security.listeners import EndPoint
from kclient.errors import (
    BrokerResponseError,
    ConcurrentTransactionsError,
    NotCoordinatorError,
    ProducerFencedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
)
from tests.support import FakeAuthorizer, FakeMetadataCache
from tests.unit.test_transaction_coordinator import Fixture

TP = tuple[str, int]
PID, EPOCH = 4000, 3


class FakeTxn:
    """The core's TransactionApi: records each call, answers fixed values or raises
    ``refusal``."""

    def __init__(self, refusal: Exception | None = None) -> None:
        self.refusal = refusal
        self.asked: list[tuple[Any, ...]] = []

    def _called(self, *call: Any) -> None:
        self.asked.append(call)
        if self.refusal is not None:
            raise self.refusal

    def find_coordinator(self, tid: str) -> Node:
        self._called("find_coordinator", tid)
        return Node(2, "txn-host", 9094)

    def init_producer_id(self, tid: str, timeout_ms: int, pid: int, epoch: int) -> tuple[int, int]:
        self._called("init_producer_id", tid, timeout_ms, pid, epoch)
        return PID, EPOCH

    def add_partitions(self, tid: str, pid: int, epoch: int, partitions: Sequence[TP]) -> dict[TP, Any]:
        self._called("add_partitions", tid, pid, epoch, list(partitions))
        return {tp: TopicAuthorizationFailedError("no") if tp[0] == "secret" else None for tp in partitions}

    def add_offsets(self, tid: str, pid: int, epoch: int, group: str) -> None:
        self._called("add_offsets", tid, pid, epoch, group)

    def end_txn(self, tid: str, pid: int, epoch: int, commit: bool) -> None:
        self._called("end_txn", tid, pid, epoch, commit)

    def commit_offsets(
        self,
        tid: str,
        pid: int,
        epoch: int,
        group: str,
        offsets: Mapping[TP, CommittedOffset],
        *,
        member_id: str = "",
        generation_id: int = -1,
        group_instance_id: str | None = None,
    ) -> dict[TP, Any]:
        self.member = (member_id, generation_id, group_instance_id)
        self._called("commit_offsets", tid, pid, epoch, group, dict(offsets))
        return dict.fromkeys(offsets)

    def describe(self, ids: Sequence[str]) -> list[tuple[str, BrokerResponseError | None, TransactionMetadata | None]]:
        self._called("describe", list(ids))
        meta = TransactionMetadata(
            "app", PID, EPOCH, 60000, TxnState.ONGOING, frozenset({("out", 1), ("out", 0)}), start_ms=1700000000123
        )
        return [("app", None, meta), ("nope", NotCoordinatorError("elsewhere"), None)]

    def list_transactions(self, states: Sequence[str], pids: Sequence[int]) -> tuple[list[str], list[Any]]:
        self._called("list_transactions", list(states), list(pids))
        return ["Bogus"], [TransactionMetadata("app", PID, EPOCH, 60000, TxnState.PREPARE_COMMIT)]


class FakeLog:
    def __init__(self) -> None:
        self.asked: list[Any] = []

    def init_producer_id(self, tid: str | None) -> tuple[int, int]:
        self.asked.append(("init_producer_id", tid))
        return 77, 0

    async def produce(
        self, acks: int, timeout_ms: int, entries: list[Any], transactional_id: str | None = None
    ) -> dict[TP, ProduceResult]:
        self.asked.append(("produce", transactional_id))
        return {tp: ProduceResult(None, 5) for tp, _ in entries}

    async def fetch(self, fetch: Fetch) -> FetchAnswer:
        self.asked.append(fetch)
        known = ReadResult(b"", 10, 0, 12, last_stable_offset=8, aborted_transactions=[AbortedTransaction(9, 3)])
        unknown = ReadResult(b"", 10, 0, 12)
        reads = iter([known, unknown])
        return FetchAnswer([(s, FetchResult(None, next(reads))) for s in fetch.partitions])

    def list_offsets(self, replica_id: int, queries: list[OffsetQuery]) -> list[OffsetResult]:
        self.asked.append(queries)
        return [OffsetResult(None, 8) for _ in queries]


async def _offload(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _core(txn: Any, log: FakeLog | None = None) -> Any:
    return SimpleNamespace(
        log=log or FakeLog(), metadata=None, groups=None, admin=None, cluster=None, security=None, offload=_offload,
        transactions=txn,
    )  # fmt: skip


def _as_txn(fake: Any) -> Callable[[], TransactionApi]:
    return lambda: fake  # type: ignore[no-any-return]


def _request(api_key: int, version: int, values: dict[str, Any]) -> KafkaRequest:
    """``values`` as kio writes them, read back by the door's decoder."""
    cls = load_request_schema(api_key, version)
    buf = io.BytesIO()
    entity_writer(cls)(buf, build(cls, values))
    payload = read_request(api_key, version, buf.getvalue(), 0)
    conn = Connection(EndPoint("PLAINTEXT", "127.0.0.1", 0, "PLAINTEXT"), "127.0.0.1")
    return KafkaRequest(Header(api_key, version, 7, "ck"), payload, conn)


def _sent(response: Any) -> Any:
    """``response`` as the door's frame carries it, read back with kio."""
    frame = encode_response(7, response)
    start = 4 + 4 + (1 if response.__flexible__ else 0)  # size, correlation id, tagged fields
    decoded, _ = entity_reader(type(response))(frame, start)
    return decoded


REQUESTS: dict[int, dict[str, Any]] = {
    22: {"transactional_id": "app", "transaction_timeout": 60000, "producer_id": PID, "producer_epoch": EPOCH - 1},
    24: {
        "v3_and_below_transactional_id": "app",
        "v3_and_below_producer_id": PID,
        "v3_and_below_producer_epoch": EPOCH,
        "v3_and_below_topics": [{"name": "out", "partitions": [0, 1]}, {"name": "secret", "partitions": [2]}],
    },
    25: {"transactional_id": "app", "producer_id": PID, "producer_epoch": EPOCH, "group_id": "readers"},
    26: {"transactional_id": "app", "producer_id": PID, "producer_epoch": EPOCH, "committed": True},
    28: {
        "transactional_id": "app",
        "group_id": "readers",
        "producer_id": PID,
        "producer_epoch": EPOCH,
        "generation_id": 4,
        "member_id": "m-1",
        "topics": [
            {"name": "in", "partitions": [{"partition_index": 0, "committed_offset": 42, "committed_metadata": "m"}]}
        ],
    },
    65: {"transactional_ids": ["app", "nope"]},
    66: {"state_filters": ["Ongoing", "Bogus"], "producer_id_filters": [PID]},
}
HANDLERS = {
    22: "init_producer_id",
    24: "add_partitions_to_txn",
    25: "add_offsets_to_txn",
    26: "end_txn",
    28: "txn_offset_commit",
    65: "describe_transactions",
    66: "list_transactions",
}
SERVED = {22: (0, 4), 24: (0, 3), 25: (0, 3), 26: (0, 3), 28: (0, 3), 65: (0, 0), 66: (0, 0)}
EDGES = sorted({(k, v) for k, (lo, hi) in SERVED.items() for v in (lo, hi)})


def _serve(txn: FakeTxn, api_key: int, version: int) -> Any:
    handler = getattr(TxnApis(_core(txn), _as_txn(txn)), HANDLERS[api_key])
    return _sent(asyncio.run(handler(_request(api_key, version, REQUESTS[api_key]))))


def _codes(api_key: int, resp: Any) -> list[int]:
    """Every error code of an answer, top level and per partition or id."""
    if api_key == 24:
        return [int(p.partition_error_code) for t in resp.results_by_topic_v3_and_below for p in t.results_by_partition]
    if api_key == 28:
        return [int(p.error_code) for t in resp.topics for p in t.partitions]
    if api_key == 65:
        return [int(s.error_code) for s in resp.transaction_states]
    return [int(resp.error_code)]


@pytest.mark.parametrize(("api_key", "version"), EDGES)
def test_each_api_round_trips_to_the_core_and_back(api_key: int, version: int) -> None:
    txn = FakeTxn()
    resp = _serve(txn, api_key, version)
    [call] = txn.asked
    if api_key == 22:
        held = (PID, EPOCH - 1) if version >= 3 else (-1, -1)  # v3+ carries the producer held (KIP-360)
        assert call == ("init_producer_id", "app", 60000, *held)
        assert (int(resp.error_code), int(resp.producer_id), int(resp.producer_epoch)) == (0, PID, EPOCH)
    elif api_key == 24:
        assert call == ("add_partitions", "app", PID, EPOCH, [("out", 0), ("out", 1), ("secret", 2)])
        assert _codes(api_key, resp) == [0, 0, TopicAuthorizationFailedError.errno]
        assert [t.name for t in resp.results_by_topic_v3_and_below] == ["out", "secret"]
    elif api_key == 25:
        assert call == ("add_offsets", "app", PID, EPOCH, "readers") and int(resp.error_code) == 0
    elif api_key == 26:
        assert call == ("end_txn", "app", PID, EPOCH, True) and int(resp.error_code) == 0
    elif api_key == 28:
        assert call == ("commit_offsets", "app", PID, EPOCH, "readers", {("in", 0): CommittedOffset(42, "m")})
        # v3 (KIP-447) names the consumer's member: the core checks it against the group
        assert txn.member == (("m-1", 4, None) if version >= 3 else ("", -1, None))
        assert [(t.name, int(p.partition_index), int(p.error_code)) for t in resp.topics for p in t.partitions] == [
            ("in", 0, 0)
        ]
    elif api_key == 65:
        assert call == ("describe", ["app", "nope"])
        app, nope = resp.transaction_states
        assert (app.transaction_state, int(app.producer_id), int(app.producer_epoch)) == ("Ongoing", PID, EPOCH)
        assert app.transaction_timeout.total_seconds() == 60
        assert round(app.transaction_start_time.timestamp() * 1000) == 1700000000123
        assert [(t.topic, list(t.partitions)) for t in app.topics] == [("out", [0, 1])]
        assert (nope.transactional_id, int(nope.error_code)) == ("nope", NotCoordinatorError.errno)
    else:
        assert call == ("list_transactions", ["Ongoing", "Bogus"], [PID])
        assert int(resp.error_code) == 0 and list(resp.unknown_state_filters) == ["Bogus"]
        [state] = resp.transaction_states
        assert (state.transactional_id, int(state.producer_id), state.transaction_state) == (
            "app",
            PID,
            "PrepareCommit",
        )


REFUSALS = [
    NotCoordinatorError("elsewhere"),
    ProducerFencedError("older epoch"),
    ConcurrentTransactionsError("completing"),
    TransactionalIdAuthorizationFailedError("denied"),
]


@pytest.mark.parametrize(("api_key", "version"), [e for e in EDGES if e[0] != 65])
@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda e: type(e).__name__)
def test_a_refusal_is_the_answers_code(api_key: int, version: int, refusal: BrokerResponseError) -> None:
    resp = _serve(FakeTxn(refusal), api_key, version)
    fenced_since = {22: 4, 24: 2, 25: 2, 26: 2, 28: 3}.get(api_key, 0)
    expected = refusal.errno
    if isinstance(refusal, ProducerFencedError) and version < fenced_since:
        expected = 47  # INVALID_PRODUCER_EPOCH: what clients before KIP-588 know
    codes = _codes(api_key, resp)
    assert codes and set(codes) == {expected}
    if api_key == 22:
        assert (int(resp.producer_id), int(resp.producer_epoch)) == (-1, -1)


def test_init_producer_id_without_a_transactional_id_is_the_idempotent_producers() -> None:
    log, txn = FakeLog(), FakeTxn()
    apis = TxnApis(_core(txn, log), _as_txn(txn))
    for version in (0, 4):
        values = {"transactional_id": None, "transaction_timeout": 0, "producer_id": 12, "producer_epoch": 1}
        resp = _sent(asyncio.run(apis.init_producer_id(_request(22, version, values))))
        assert (int(resp.error_code), int(resp.producer_id), int(resp.producer_epoch)) == (0, 77, 0)
    assert log.asked == [("init_producer_id", None)] * 2 and txn.asked == []


@pytest.mark.parametrize("version", [1, 3, 4])
def test_find_coordinator_of_a_transactional_id(version: int) -> None:
    txn = FakeTxn()
    groups = GroupApis(None, _offload, _as_txn(txn))  # type: ignore[arg-type]
    keys = {"key": "app"} if version < 4 else {"coordinator_keys": ["app", "other"]}
    resp = _sent(asyncio.run(groups.find_coordinator(_request(10, version, {"key_type": 1, **keys}))))
    found = list(resp.coordinators) if version >= 4 else [resp]
    assert [(int(c.error_code), int(c.node_id), c.host, int(c.port)) for c in found] == [
        (0, 2, "txn-host", 9094)
    ] * len(found)
    assert txn.asked == [("find_coordinator", k) for k in (["app"] if version < 4 else ["app", "other"])]
    refused = GroupApis(None, _offload, _as_txn(FakeTxn(NotCoordinatorError("moving"))))  # type: ignore[arg-type]
    resp = _sent(asyncio.run(refused.find_coordinator(_request(10, version, {"key_type": 1, **keys}))))
    found = list(resp.coordinators) if version >= 4 else [resp]
    assert {(int(c.error_code), int(c.node_id)) for c in found} == {(NotCoordinatorError.errno, -1)}


def test_produce_passes_its_transactional_id() -> None:
    log = FakeLog()
    values = {
        "transactional_id": "app",
        "acks": -1,
        "timeout": 1000,
        "topic_data": [{"name": "out", "partition_data": [{"index": 0, "records": b""}]}],
    }
    for version in (3, 9):
        asyncio.run(LogApis(_core(None, log)).produce(_request(0, version, values)))
    assert log.asked == [("produce", "app")] * 2


@pytest.mark.parametrize("version", [4, 12])
def test_fetch_passes_the_isolation_level_and_answers_the_last_stable_offset(version: int) -> None:
    log = FakeLog()
    values = {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1000,
        "isolation_level": 1,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": "t",
                "partitions": [
                    {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 100},
                    {"partition": 1, "fetch_offset": 0, "partition_max_bytes": 100},
                ],
            }
        ],
    }
    resp = _sent(asyncio.run(LogApis(_core(None, log)).fetch(_request(1, version, values))))
    [fetch] = log.asked
    assert fetch.isolation_level is IsolationLevel.READ_COMMITTED
    known, unknown = resp.responses[0].partitions
    assert (int(known.high_watermark), int(known.last_stable_offset)) == (10, 8)
    assert [(int(a.producer_id), int(a.first_offset)) for a in known.aborted_transactions] == [(9, 3)]
    assert int(unknown.last_stable_offset) == 10  # the log knows none: the high watermark
    assert unknown.aborted_transactions is None


def test_list_offsets_passes_the_isolation_level() -> None:
    log = FakeLog()
    for version, level in ((2, 1), (6, 0)):
        values = {
            "replica_id": -1,
            "isolation_level": level,
            "topics": [{"name": "t", "partitions": [{"partition_index": 0, "timestamp": -1}]}],
        }
        resp = _sent(asyncio.run(LogApis(_core(None, log)).list_offsets(_request(2, version, values))))
        assert int(resp.topics[0].partitions[0].offset) == 8
    assert [q.isolation_level for [q] in log.asked] == [IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED]


def test_api_versions_advertises_the_transaction_apis_but_not_write_txn_markers() -> None:
    table = api_table(_core(None))
    served = {k: (a.min_version, a.max_version) for k, a in table.apis.items()}
    assert {k: served[k] for k in SERVED} == SERVED
    assert served[10] == (0, 4) and 27 not in served


def test_a_transaction_through_the_door_and_the_core() -> None:
    f = Fixture()
    metadata = FakeMetadataCache((1,), {"out": 2, "in": 1})
    real = TransactionApi(1, f.coordinator, metadata, Access(FakeAuthorizer()))  # type: ignore[arg-type]
    apis = TxnApis(_core(real), _as_txn(real))

    def call(api_key: int, version: int, values: dict[str, Any]) -> Any:
        return _sent(asyncio.run(getattr(apis, HANDLERS[api_key])(_request(api_key, version, values))))

    init = call(22, 4, {"transactional_id": "app", "transaction_timeout": 60000, "producer_id": -1})
    pid, epoch = int(init.producer_id), int(init.producer_epoch)
    ids = {"producer_id": pid, "producer_epoch": epoch, "transactional_id": "app"}
    added = call(
        24,
        3,
        {
            "v3_and_below_transactional_id": "app",
            "v3_and_below_producer_id": pid,
            "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": "out", "partitions": [0, 1]}],
        },
    )
    assert _codes(24, added) == [0, 0]
    assert int(call(25, 3, {**ids, "group_id": "readers"}).error_code) == 0
    offsets = [{"name": "in", "partitions": [{"partition_index": 0, "committed_offset": 9}]}]
    assert _codes(28, call(28, 3, {**ids, "group_id": "readers", "topics": offsets})) == [0]
    listed = call(66, 0, {"state_filters": ["Ongoing"]})
    assert [(s.transactional_id, s.transaction_state) for s in listed.transaction_states] == [("app", "Ongoing")]
    assert int(call(26, 3, {**ids, "committed": True}).error_code) == 0
    [state] = call(65, 0, {"transactional_ids": ["app"]}).transaction_states
    assert state.transaction_state == "CompleteCommit" and int(state.producer_id) == pid
    assert f.offsets.committed == {"readers": {("in", 0): CommittedOffset(9)}}
    stale = call(26, 0, {**ids, "producer_epoch": epoch - 1 if epoch else epoch + 5, "committed": False})
    assert int(stale.error_code) == 47  # PRODUCER_FENCED as EndTxn v0 knows it


class FakeGroups:
    """The core's GroupApi for OffsetFetch: what the group store holds."""

    def __init__(self, committed: dict[TP, CommittedOffset]) -> None:
        self.committed = committed
        self.before_read: Callable[[], None] = lambda: None

    def fetch_offsets(self, group: str, partitions: Sequence[TP] | None) -> list[CommittedEntry]:
        self.before_read()
        wanted = sorted(self.committed) if partitions is None else list(partitions)
        return [CommittedEntry(t, p, self.committed.get((t, p))) for t, p in wanted]


@pytest.mark.parametrize("require_stable", [True, False])
def test_offset_fetch_require_stable_answers_unstable_until_the_transaction_completes(require_stable: bool) -> None:
    f = Fixture()
    metadata = FakeMetadataCache((1,), {"out": 1, "in": 2})
    real = TransactionApi(1, f.coordinator, metadata, Access(FakeAuthorizer()))  # type: ignore[arg-type]
    store = FakeGroups({("in", 1): CommittedOffset(3)})
    groups = GroupApis(store, _offload, _as_txn(real))  # type: ignore[arg-type]

    def fetch(version: int) -> dict[TP, tuple[int, int]]:
        values: dict[str, Any] = {"group_id": "readers", "topics": [{"name": "in", "partition_indexes": [0, 1]}]}
        if version >= 7:
            values["require_stable"] = require_stable
        resp = _sent(asyncio.run(groups.offset_fetch(_request(9, version, values))))
        return {(t.name, int(p.partition_index)): (int(p.error_code), int(p.committed_offset)) for t in resp.topics
                for p in t.partitions}  # fmt: skip

    pid, epoch = real.init_producer_id("app", 60000)
    real.add_offsets("app", pid, epoch, "readers")
    real.commit_offsets("app", pid, epoch, "readers", {("in", 0): CommittedOffset(9)})
    unstable = 88 if require_stable else 0
    assert fetch(7) == {("in", 0): (unstable, -1), ("in", 1): (0, 3)}
    assert fetch(6) == {("in", 0): (0, -1), ("in", 1): (0, 3)}  # no require_stable before v7
    f.markers.failing = {("out", 0)}
    real.add_partitions("app", pid, epoch, [("out", 0)])
    real.end_txn("app", pid, epoch, True)  # decided, not yet complete (EndTxn has answered)
    assert fetch(7)[("in", 0)] == (unstable, -1)
    f.markers.failing = set()

    def complete() -> None:  # the completion lands between the request's checks
        f.coordinator.complete_pending()
        store.committed.update(f.offsets.committed["readers"])
        store.before_read = lambda: None

    store.before_read = complete
    # never "no offset" without an error: the answer is unstable or the committed offset
    assert fetch(7)[("in", 0)] == ((88, -1) if require_stable else (0, 9))
    assert fetch(7) == {("in", 0): (0, 9), ("in", 1): (0, 3)}
