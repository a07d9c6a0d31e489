"""The transaction coordinator's state machine over its ZooKeeper store (an in-memory
kazoo): fencing by producer id and epoch, the decision stored before EndTxn answers,
offsets reaching the group exactly when a transaction commits, recovery of a transaction
left preparing, and expiry."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from types import SimpleNamespace

import pytest

from kbroker.cluster import zkdata
from kbroker.cluster.txn_store import TransactionStore
from kbroker.cluster.zkdata import CommittedOffset, TransactionMetadata, TxnState
from kbroker.txn.coordinator import TransactionCoordinator
from kclient.errors import (
    BrokerResponseError,
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    LeaderNotAvailableError,
    ProducerFencedError,
    TransactionCoordinatorFencedError,
)
from tests.support import FakeClock, FakeKazoo

TP = tuple[str, int]


class Markers:
    """Records the markers written; ``failing`` partitions answer LEADER_NOT_AVAILABLE."""

    def __init__(self) -> None:
        self.written: list[tuple[int, int, bool, list[TP]]] = []
        self.failing: set[TP] = set()

    def write_markers(
        self, producer_id: int, producer_epoch: int, commit: bool, partitions: Collection[TP]
    ) -> dict[TP, BrokerResponseError | None]:
        self.written.append((producer_id, producer_epoch, commit, list(partitions)))
        return {tp: LeaderNotAvailableError("no leader") if tp in self.failing else None for tp in partitions}


class Offsets:
    def __init__(self) -> None:
        self.committed: dict[str, dict[TP, CommittedOffset]] = {}

    def commit(self, group: str, offsets: Mapping[TP, CommittedOffset]) -> None:
        self.committed.setdefault(group, {}).update(offsets)


class ProducerIds:
    def __init__(self) -> None:
        self.next = 1000

    def generate(self) -> tuple[int, int]:
        self.next += 1
        return self.next - 1, 0


class Fixture:
    def __init__(self) -> None:
        self.kazoo = FakeKazoo()
        self.store = TransactionStore(SimpleNamespace(kazoo=self.kazoo))  # type: ignore[arg-type]
        self.markers, self.offsets, self.clock = Markers(), Offsets(), FakeClock(1000.0)
        self.coordinator = self.new_coordinator()

    def new_coordinator(self) -> TransactionCoordinator:
        return TransactionCoordinator(
            self.store, ProducerIds(), self.markers, self.offsets, max_timeout_ms=60000, clock=self.clock
        )

    def state(self, tid: str) -> TransactionMetadata:
        found = self.store.load(tid)
        assert found is not None
        return found[0]


@pytest.fixture
def f() -> Fixture:
    return Fixture()


def test_a_committed_transaction_writes_markers_then_the_offsets_then_completes(f: Fixture) -> None:
    c = f.coordinator
    pid, epoch = c.init_producer_id("app", 10000)
    assert (pid, epoch) == (1000, 0)
    c.add_partitions("app", pid, epoch, [("out", 0), ("out", 1)])
    c.add_offsets("app", pid, epoch, "readers")
    c.commit_offsets("app", pid, epoch, "readers", {("in", 0): CommittedOffset(42, "m")})
    assert f.offsets.committed == {}  # held with the transaction
    assert f.state("app").state is TxnState.ONGOING
    c.end_txn("app", pid, epoch, commit=True)
    assert f.markers.written == [(pid, epoch, True, [("out", 0), ("out", 1)])]
    assert f.offsets.committed == {"readers": {("in", 0): CommittedOffset(42, "m")}}
    done = f.state("app")
    assert done.state is TxnState.COMPLETE_COMMIT and done.partitions == frozenset() and done.pending_offsets == {}
    c.end_txn("app", pid, epoch, commit=True)  # a retried EndTxn answers the same
    with pytest.raises(InvalidTxnStateError):
        c.end_txn("app", pid, epoch, commit=False)


def test_an_aborted_transaction_never_commits_its_offsets(f: Fixture) -> None:
    c = f.coordinator
    pid, epoch = c.init_producer_id("app", 10000)
    c.add_offsets("app", pid, epoch, "readers")
    c.commit_offsets("app", pid, epoch, "readers", {("in", 0): CommittedOffset(7)})
    c.add_partitions("app", pid, epoch, [("out", 0)])
    c.end_txn("app", pid, epoch, commit=False)
    assert f.markers.written == [(pid, epoch, False, [("out", 0)])]
    assert f.offsets.committed == {} and f.state("app").state is TxnState.COMPLETE_ABORT


def test_a_new_producer_fences_the_old_one(f: Fixture) -> None:
    c = f.coordinator
    pid, old = c.init_producer_id("app", 10000)
    c.add_partitions("app", pid, old, [("out", 0)])
    with pytest.raises(ConcurrentTransactionsError):  # the open transaction is aborted first
        c.init_producer_id("app", 10000)
    aborted = f.markers.written[-1]
    assert aborted[2] is False and aborted[1] == old + 1  # the abort marker carries the new epoch
    pid2, new = c.init_producer_id("app", 10000)  # the retry
    assert pid2 == pid and new == old + 2
    for call in (
        lambda: c.add_partitions("app", pid, old, [("out", 1)]),
        lambda: c.end_txn("app", pid, old, commit=True),
        lambda: c.add_offsets("app", pid, old, "g"),
    ):
        with pytest.raises(ProducerFencedError):
            call()
    with pytest.raises(InvalidProducerIdMappingError):
        c.add_partitions("app", pid + 1, new, [("out", 1)])
    with pytest.raises(InvalidProducerIdMappingError):
        c.add_partitions("nobody", pid, new, [("out", 1)])


def test_offsets_need_their_group_added_first_and_timeouts_are_bounded(f: Fixture) -> None:
    c = f.coordinator
    pid, epoch = c.init_producer_id("app", 10000)
    c.add_partitions("app", pid, epoch, [("out", 0)])
    with pytest.raises(InvalidTxnStateError):
        c.commit_offsets("app", pid, epoch, "readers", {("in", 0): CommittedOffset(1)})
    for bad in (0, 60001):
        with pytest.raises(InvalidTransactionTimeoutError):
            c.init_producer_id("other", bad)
    assert f.store.load("other") is None


def test_a_decided_commit_is_finished_by_the_next_coordinator(f: Fixture) -> None:
    c = f.coordinator
    pid, epoch = c.init_producer_id("app", 10000)
    c.add_partitions("app", pid, epoch, [("out", 0)])
    c.add_offsets("app", pid, epoch, "readers")
    c.commit_offsets("app", pid, epoch, "readers", {("in", 0): CommittedOffset(5)})
    f.markers.failing = {("out", 0)}
    c.end_txn("app", pid, epoch, commit=True)  # decided: answers although the marker failed
    assert f.state("app").state is TxnState.PREPARE_COMMIT and f.offsets.committed == {}
    with pytest.raises(ConcurrentTransactionsError):
        c.add_partitions("app", pid, epoch, [("out", 1)])
    f.markers.failing = set()
    successor = f.new_coordinator()  # the first one died; its successor loads the znode
    assert successor.complete_pending() == 1
    assert f.state("app").state is TxnState.COMPLETE_COMMIT
    assert f.offsets.committed == {"readers": {("in", 0): CommittedOffset(5)}}
    assert successor.complete_pending() == 0


def test_an_expired_transaction_is_aborted_with_a_new_epoch(f: Fixture) -> None:
    c = f.coordinator
    pid, epoch = c.init_producer_id("app", 5000)
    c.add_partitions("app", pid, epoch, [("out", 0)])
    f.clock.now += 4.0
    assert c.abort_expired() == []
    f.clock.now += 2.0
    assert c.abort_expired() == ["app"]
    state = f.state("app")
    assert state.state is TxnState.COMPLETE_ABORT and state.producer_epoch == epoch + 1
    with pytest.raises(ProducerFencedError):
        c.end_txn("app", pid, epoch, commit=True)


def test_a_stale_coordinator_cannot_overwrite_a_newer_state(f: Fixture) -> None:
    f.coordinator.init_producer_id("app", 10000)
    meta, version = f.store.load("app") or (None, 0)
    assert meta is not None
    f.store.write(meta, version)  # someone else moved it on
    with pytest.raises(TransactionCoordinatorFencedError):
        f.store.write(meta, version)


def test_the_znode_reads_back_what_was_written() -> None:
    meta = TransactionMetadata(
        "a/b%c",
        7,
        3,
        60000,
        TxnState.PREPARE_COMMIT,
        frozenset({("t", 0), ("t", 2), ("u", 1)}),
        frozenset({"g"}),
        {"g": {("in", 4): CommittedOffset(10, "meta")}},
        5,
        6,
        2,
    )
    assert zkdata.decode_transaction("a/b%c", zkdata.encode_transaction(meta)) == meta
    assert zkdata.transaction_state_path("a/b%c") == "/transaction_state/a%2Fb%25c"


def test_init_producer_id_with_the_producer_it_holds_bumps_or_fences(f: Fixture) -> None:
    c = f.coordinator
    pid, e0 = c.init_producer_id("app", 10000)
    assert c.init_producer_id("app", 10000, (pid, e0)) == (pid, e0 + 1)  # KIP-360: the holder's epoch bump
    assert c.init_producer_id("app", 10000, (pid, e0)) == (pid, e0 + 1)  # its retry: no second bump
    with pytest.raises(ProducerFencedError):
        c.init_producer_id("app", 10000, (pid + 1, e0 + 1))  # another producer id
    assert c.init_producer_id("app", 10000) == (pid, e0 + 2)  # a new producer: no retry passes after it
    with pytest.raises(ProducerFencedError):
        c.init_producer_id("app", 10000, (pid, e0 + 1))
    assert f.state("app").producer_epoch == e0 + 2


def test_a_txn_offset_commit_that_lost_a_race_is_concurrent_transactions(f: Fixture) -> None:
    c = f.coordinator
    pid, epoch = c.init_producer_id("app", 10000)
    c.add_offsets("app", pid, epoch, "readers")
    elsewhere = f.new_coordinator()  # the group's coordinator, another broker
    load = f.store.load

    def racing(tid: str) -> tuple[TransactionMetadata, int] | None:
        found = load(tid)
        f.store.load = load  # type: ignore[method-assign]
        c.add_partitions("app", pid, epoch, [("out", 0)])  # the id's coordinator writes meanwhile
        return found

    f.store.load = racing  # type: ignore[method-assign,assignment]
    with pytest.raises(ConcurrentTransactionsError):
        elsewhere.commit_offsets("app", pid, epoch, "readers", {("in", 0): CommittedOffset(3)})
    elsewhere.commit_offsets("app", pid, epoch, "readers", {("in", 0): CommittedOffset(3)})  # the retry
    assert f.state("app").pending_offsets == {"readers": {("in", 0): CommittedOffset(3)}}


def test_list_transactions_filters_by_state_producer_and_coordinator(f: Fixture) -> None:
    c = f.coordinator
    a, ea = c.init_producer_id("a", 10000)
    b, _ = c.init_producer_id("b", 10000)
    c.init_producer_id("c", 10000)
    c.add_partitions("a", a, ea, [("out", 0)])
    assert [m.transactional_id for m in c.list_transactions()] == ["a", "b", "c"]
    assert [m.transactional_id for m in c.list_transactions([TxnState.ONGOING])] == ["a"]
    assert [m.transactional_id for m in c.list_transactions([TxnState.EMPTY], [b])] == ["b"]
    assert [m.transactional_id for m in c.list_transactions(coordinated=lambda t: t != "b")] == ["a", "c"]


def test_offsets_held_by_an_incomplete_transaction_are_unstable_until_it_completes(f: Fixture) -> None:
    c = f.coordinator
    pid, epoch = c.init_producer_id("app", 10000)
    c.add_offsets("app", pid, epoch, "readers")
    assert c.unstable_offsets("readers", None) == set()
    c.commit_offsets("app", pid, epoch, "readers", {("in", 0): CommittedOffset(9), ("in", 1): CommittedOffset(4)})
    assert c.unstable_offsets("readers", None) == {("in", 0), ("in", 1)}  # Ongoing
    assert c.unstable_offsets("readers", [("in", 1), ("in", 2)]) == {("in", 1)}
    assert c.unstable_offsets("others", None) == set()
    f.markers.failing = {("out", 0)}
    c.add_partitions("app", pid, epoch, [("out", 0)])
    c.end_txn("app", pid, epoch, commit=True)  # EndTxn answered; the completion failed
    assert f.offsets.committed == {}
    assert c.unstable_offsets("readers", [("in", 0)]) == {("in", 0)}  # PrepareCommit: not yet
    f.markers.failing = set()
    assert c.complete_pending() == 1
    assert f.offsets.committed["readers"][("in", 0)] == CommittedOffset(9)
    assert c.unstable_offsets("readers", None) == set()  # committed: stable, and forgotten
    assert "readers" not in c._offset_txns


def test_an_aborted_transactions_offsets_are_stable_once_it_is_complete(f: Fixture) -> None:
    c = f.coordinator
    pid, epoch = c.init_producer_id("app", 10000)
    c.add_offsets("app", pid, epoch, "readers")
    c.commit_offsets("app", pid, epoch, "readers", {("in", 0): CommittedOffset(9)})
    c.end_txn("app", pid, epoch, commit=False)
    assert c.unstable_offsets("readers", None) == set() and f.offsets.committed == {}


def test_add_partitions_that_lost_a_race_to_a_txn_offset_commit_loads_again_and_keeps_both(f: Fixture) -> None:
    c = f.coordinator
    pid, epoch = c.init_producer_id("app", 10000)
    c.add_offsets("app", pid, epoch, "readers")
    elsewhere = f.new_coordinator()  # the group's coordinator, another broker
    load = f.store.load

    def racing(tid: str) -> tuple[TransactionMetadata, int] | None:
        found = load(tid)
        f.store.load = load  # type: ignore[method-assign]
        elsewhere.commit_offsets("app", pid, epoch, "readers", {("in", 0): CommittedOffset(3)})  # meanwhile
        return found

    f.store.load = racing  # type: ignore[method-assign,assignment]
    c.add_partitions("app", pid, epoch, [("out", 0)])  # not TRANSACTION_COORDINATOR_FENCED
    state = f.state("app")
    assert state.partitions == {("out", 0)} and state.pending_offsets == {"readers": {("in", 0): CommittedOffset(3)}}


def test_a_request_that_keeps_losing_the_race_is_concurrent_transactions(f: Fixture) -> None:
    c = f.coordinator
    pid, epoch = c.init_producer_id("app", 10000)
    c.add_partitions("app", pid, epoch, [("out", 0)])
    write = f.store.write
    lost: list[int] = []

    def losing(meta: TransactionMetadata, version: int | None) -> int:
        lost.append(1)
        raise TransactionCoordinatorFencedError("another broker wrote first")

    f.store.write = losing  # type: ignore[method-assign]
    with pytest.raises(ConcurrentTransactionsError):
        c.end_txn("app", pid, epoch, commit=True)
    assert len(lost) == 5
    f.store.write = write  # type: ignore[method-assign]
    c.end_txn("app", pid, epoch, commit=True)
    assert f.state("app").state is TxnState.COMPLETE_COMMIT


def test_a_restarted_group_coordinator_still_sees_the_offsets_an_open_transaction_holds(f: Fixture) -> None:
    c = f.coordinator
    pid, epoch = c.init_producer_id("app", 10000)
    c.add_offsets("app", pid, epoch, "readers")
    c.commit_offsets("app", pid, epoch, "readers", {("in", 0): CommittedOffset(9)})
    other, other_epoch = c.init_producer_id("done", 10000)
    c.add_offsets("done", other, other_epoch, "readers")
    c.commit_offsets("done", other, other_epoch, "readers", {("in", 1): CommittedOffset(2)})
    c.end_txn("done", other, other_epoch, commit=True)
    restarted = f.new_coordinator()  # its memory is empty; the store is not
    assert restarted.unstable_offsets("readers", None) == {("in", 0)}


def test_end_txn_waits_a_bounded_time_for_the_completion_on_the_pool(f: Fixture) -> None:
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    release = threading.Event()
    real = f.markers.write_markers

    def slow(pid: int, epoch: int, commit: bool, partitions: Collection[TP]) -> dict[TP, BrokerResponseError | None]:
        release.wait(5)
        return real(pid, epoch, commit, partitions)

    with ThreadPoolExecutor(2) as pool:
        c = TransactionCoordinator(
            f.store, ProducerIds(), f.markers, f.offsets, clock=f.clock, completions=pool.submit, end_txn_wait_s=0.2
        )
        pid, epoch = c.init_producer_id("app", 10000)
        c.add_partitions("app", pid, epoch, [("out", 0)])
        c.end_txn("app", pid, epoch, commit=True)  # quick markers: answered once complete
        assert f.state("app").state is TxnState.COMPLETE_COMMIT
        c.add_partitions("app", pid, epoch, [("out", 0)])
        f.markers.write_markers = slow  # type: ignore[method-assign,assignment]
        t0 = time.monotonic()
        c.end_txn("app", pid, epoch, commit=False)  # markers stuck: answered after the wait
        assert 0.2 <= time.monotonic() - t0 < 2 and f.state("app").state is TxnState.PREPARE_ABORT
        release.set()


def test_the_housekeeping_leaves_a_completion_in_flight_to_the_pool(
    f: Fixture, caplog: pytest.LogCaptureFixture
) -> None:
    """complete_pending skips an id whose completion is queued on the pool: before, the
    housekeeping completed it first, then the pool wrote the markers again and lost the
    store's race ("changed by another coordinator")."""
    queued: list[Callable[[], None]] = []
    c = TransactionCoordinator(
        f.store, ProducerIds(), f.markers, f.offsets, clock=f.clock, completions=queued.append, end_txn_wait_s=0
    )
    pid, epoch = c.init_producer_id("app", 10000)
    c.add_partitions("app", pid, epoch, [("out", 0)])
    c.end_txn("app", pid, epoch, commit=True)
    assert c.complete_pending() == 0  # the pool's
    queued.pop()()
    assert f.state("app").state is TxnState.COMPLETE_COMMIT
    assert [w[2] for w in f.markers.written] == [True]  # one set of commit markers
    assert "changed by another coordinator" not in caplog.text

    # A completion that failed is the housekeeping's again.
    c.add_partitions("app", pid, epoch, [("out", 0)])
    f.markers.failing = {("out", 0)}
    c.end_txn("app", pid, epoch, commit=False)
    queued.pop()()
    assert f.state("app").state is TxnState.PREPARE_ABORT and c.take_incomplete() == {"app"}
    f.markers.failing = set()
    assert c.complete_pending(["app"]) == 1 and f.state("app").state is TxnState.COMPLETE_ABORT
