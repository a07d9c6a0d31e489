"""The transaction coordinator (Kafka's TransactionCoordinator, KIP-98 and KIP-447): the
state machine of each transactional id, kept in ZooKeeper by
:class:`~kbroker.cluster.txn_store.TransactionStore`.

States and moves (Kafka's)::

    Empty / CompleteCommit / CompleteAbort --AddPartitionsToTxn/AddOffsetsToTxn--> Ongoing
    Ongoing --EndTxn(commit)--> PrepareCommit --markers, offsets--> CompleteCommit
    Ongoing --EndTxn(abort), timeout, a new InitProducerId--> PrepareAbort --markers--> CompleteAbort

- **InitProducerId** with a transactional id: a new id gets a producer id and epoch 0;
  an id whose transaction is done gets its epoch bumped, which fences every older
  producer of it (PRODUCER_FENCED). One that is Ongoing is aborted first, with the epoch
  bumped, and the caller is told CONCURRENT_TRANSACTIONS (retriable), as Kafka does; one
  that is preparing answers CONCURRENT_TRANSACTIONS until it completes. The timeout must
  not exceed ``transaction.max.timeout.ms`` (INVALID_TRANSACTION_TIMEOUT).
- **Fencing.** Every request names its producer id and epoch: another producer id
  answers INVALID_PRODUCER_ID_MAPPING, an older epoch PRODUCER_FENCED.
- **EndTxn** answers once PrepareCommit or PrepareAbort is stored: from then on the
  outcome is decided and survives a coordinator crash. Completing it (the markers on
  every partition, then, for a commit, the pending offsets into the groups' committed
  offsets, then CompleteCommit) is handed to ``completions`` (a thread pool in the
  broker; inline by default). EndTxn waits for it up to ``end_txn_wait_s`` (2 s), then
  answers anyway: Kafka's EndTxn does not wait for the markers, but a client's next
  request after its commit then meets the markers written (a DeleteRecords, a read
  of the offsets, the next transaction's AddPartitionsToTxn, which would otherwise
  answer CONCURRENT_TRANSACTIONS), and a marker that cannot be written (no leader)
  delays the answer by the wait only. Until it succeeds it is tried again by :meth:`complete_pending` (the
  coordinator's housekeeping, which also retries :meth:`take_incomplete`, and a new
  coordinator of the id); that leaves an id whose completion is still with ``completions``
  to it, so each decision's markers are written once. So ``send_offsets_to_transaction``
  offsets reach the group exactly when the transaction commits, and never when it aborts.
- **Expiry.** An Ongoing transaction older than its timeout is aborted, its epoch bumped
  (:meth:`abort_expired`).

Markers go through a :class:`MarkerWriter` (WriteTxnMarkers to each partition's leader)
and offsets through an :class:`OffsetSink` (the group store).

Thread safety: requests for one transactional id are serialised by its lock; ids are
independent. The store's compare-and-set fences a second coordinator of the same id, and
orders TxnOffsetCommit, which the group's coordinator (any broker) writes, against the
id's coordinator's own writes: a request of the id's coordinator that loses that race
(AddPartitionsToTxn beside a TxnOffsetCommit) loads the state again and retries, and
answers the retriable CONCURRENT_TRANSACTIONS only after :data:`RACE_ATTEMPTS` losses.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import Protocol, TypeVar

from kbroker.cluster.txn_store import TransactionStore
from kbroker.cluster.zkdata import CommittedOffset, TransactionMetadata, TxnState
from kclient.errors import (
    BrokerResponseError,
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidRequestError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionCoordinatorFencedError,
)

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
MAX_EPOCH = 32767
"""Kafka's Short.MaxValue: an epoch that would pass it takes a new producer id."""
DEFAULT_MAX_TIMEOUT_MS = 900000
"""transaction.max.timeout.ms (Kafka's default, 15 minutes)."""
DEFAULT_END_TXN_WAIT_S = 2.0
"""How long EndTxn waits for its transaction's completion before answering anyway."""
RACE_ATTEMPTS = 5
"""Writes of one request that may lose the store's compare-and-set before it answers
CONCURRENT_TRANSACTIONS (:meth:`TransactionCoordinator._raced`)."""
T = TypeVar("T")


class MarkerWriter(Protocol):
    def write_markers(
        self, producer_id: int, producer_epoch: int, commit: bool, partitions: Collection[TopicPartition]
    ) -> dict[TopicPartition, BrokerResponseError | None]:
        """Write a COMMIT or ABORT control batch on each partition (at its leader)."""
        ...


class OffsetSink(Protocol):
    def commit(self, group: str, offsets: Mapping[TopicPartition, CommittedOffset]) -> None: ...


class ProducerIds(Protocol):
    def generate(self) -> tuple[int, int]: ...


def _run_now(work: Callable[[], None]) -> None:
    work()


class TransactionCoordinator:
    """The transactions of the ids this broker coordinates (see the module docstring)."""

    def __init__(
        self,
        store: TransactionStore,
        producer_ids: ProducerIds,
        markers: MarkerWriter,
        offsets: OffsetSink,
        *,
        max_timeout_ms: int = DEFAULT_MAX_TIMEOUT_MS,
        clock: Callable[[], float] = time.time,
        completions: Callable[[Callable[[], None]], object] = _run_now,
        end_txn_wait_s: float = DEFAULT_END_TXN_WAIT_S,
    ) -> None:
        self._store = store
        self._producer_ids = producer_ids
        self._markers = markers
        self._offsets = offsets
        self._max_timeout_ms = max_timeout_ms
        self._clock = clock
        self._completions = completions
        self._end_txn_wait_s = end_txn_wait_s
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()
        self._incomplete: set[str] = set()
        self._completing: set[str] = set()
        """The ids whose completion is with ``completions`` now: :meth:`complete_pending`
        leaves them to it (it would write their markers twice, and lose the store's race)."""
        self._offset_txns: dict[str, set[str]] = {}
        """Group -> the transactional ids whose TxnOffsetCommit this broker served: the
        candidates for :meth:`unstable_offsets` (this broker is the group's coordinator)."""
        self._index_lock = threading.Lock()
        self._offsets_indexed = False

    def _lock(self, transactional_id: str) -> threading.RLock:
        with self._guard:
            return self._locks.setdefault(transactional_id, threading.RLock())

    def _raced(self, transactional_id: str, attempt: Callable[[], T]) -> T:
        """``attempt`` (load, check, write) again while its write loses the store's
        compare-and-set to another broker's: TxnOffsetCommit is written by the group's
        coordinator, which may be another broker, while this one adds partitions (a
        producer's AddPartitionsToTxn for records sent beside send_offsets_to_transaction
        races it). Each attempt checks the state anew; after :data:`RACE_ATTEMPTS` the
        retriable CONCURRENT_TRANSACTIONS, not the fatal TRANSACTION_COORDINATOR_FENCED."""
        for _ in range(RACE_ATTEMPTS - 1):
            try:
                return attempt()
            except TransactionCoordinatorFencedError:
                log.info("transaction %s: changed by another broker meanwhile, loading it again", transactional_id)
        try:
            return attempt()
        except TransactionCoordinatorFencedError as exc:
            raise ConcurrentTransactionsError(
                f"transaction {transactional_id!r} kept changing while it was written: retry"
            ) from exc

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _load(self, transactional_id: str) -> tuple[TransactionMetadata, int]:
        found = self._store.load(transactional_id)
        if found is None:
            raise InvalidProducerIdMappingError(f"transactional id {transactional_id!r} has no producer id")
        return found

    @staticmethod
    def _check_producer(meta: TransactionMetadata, producer_id: int, producer_epoch: int) -> None:
        if producer_id != meta.producer_id:
            raise InvalidProducerIdMappingError(
                f"producer id {producer_id} is not the one of transactional id {meta.transactional_id!r}"
            )
        if producer_epoch != meta.producer_epoch:
            raise ProducerFencedError(
                f"transactional id {meta.transactional_id!r}: epoch {producer_epoch} is fenced by epoch "
                f"{meta.producer_epoch}"
            )

    # --- InitProducerId --------------------------------------------------------------

    def init_producer_id(
        self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None = None
    ) -> tuple[int, int]:
        """(producer id, epoch) for the id's newest producer (see the module docstring).
        ``expected``: the (producer id, epoch) the caller holds (InitProducerId v3+,
        KIP-360), None for a new producer. A caller holding the current producer id gets
        its epoch bumped; one whose epoch is the previous one, after a bump it never
        heard the answer to, gets the current epoch unchanged; any other is fenced
        (PRODUCER_FENCED)."""
        if not transactional_id:
            raise InvalidRequestError("the transactional id is empty")
        if not 0 < timeout_ms <= self._max_timeout_ms:
            raise InvalidTransactionTimeoutError(
                f"transaction.timeout.ms {timeout_ms} is outside (0, transaction.max.timeout.ms={self._max_timeout_ms}]"
            )
        with self._lock(transactional_id):
            found = self._store.load(transactional_id)
            now = self._now_ms()
            if found is None:
                pid, epoch = self._producer_ids.generate()
                meta = TransactionMetadata(transactional_id, pid, epoch, timeout_ms, update_ms=now)
                self._store.write(meta, None)
                return pid, epoch
            meta, version = found
            if expected is not None and expected[0] != meta.producer_id:
                raise ProducerFencedError(
                    f"transactional id {transactional_id!r}: producer id {expected[0]} is fenced by "
                    f"producer id {meta.producer_id}"
                )
            if meta.state.preparing:
                raise ConcurrentTransactionsError(f"transaction {transactional_id!r} is completing")
            if meta.state is TxnState.ONGOING:
                # A new producer of the id: the old one's transaction is aborted first.
                self._prepare(meta, version, commit=False, bump_epoch=True)
                raise ConcurrentTransactionsError(
                    f"transaction {transactional_id!r} was open: aborting it, retry InitProducerId"
                )
            last = -1  # a new producer: an older one cannot pass for a retry
            if expected is not None:
                if expected[1] == meta.last_producer_epoch and expected[1] != meta.producer_epoch:
                    return meta.producer_id, meta.producer_epoch  # a retry of a bump already made
                if expected[1] != meta.producer_epoch:
                    raise ProducerFencedError(
                        f"transactional id {transactional_id!r}: epoch {expected[1]} is fenced by epoch "
                        f"{meta.producer_epoch}"
                    )
                last = meta.producer_epoch
            pid, epoch = meta.producer_id, meta.producer_epoch + 1
            if epoch > MAX_EPOCH:
                pid, epoch, last = *self._producer_ids.generate(), -1
            fresh = TransactionMetadata(
                transactional_id, pid, epoch, timeout_ms, TxnState.EMPTY, update_ms=now, last_producer_epoch=last
            )
            self._store.write(fresh, version)
            log.info("transaction %s: producer id %d epoch %d", transactional_id, pid, epoch)
            return pid, epoch

    # --- the transaction ----------------------------------------------------------------

    def _begin_or_extend(self, meta: TransactionMetadata, now: int) -> TransactionMetadata:
        if meta.state.preparing:
            raise ConcurrentTransactionsError(f"transaction {meta.transactional_id!r} is completing")
        if meta.state.open:
            return replace(
                meta,
                state=TxnState.ONGOING,
                partitions=frozenset(),
                groups=frozenset(),
                pending_offsets={},
                start_ms=now,
                update_ms=now,
            )
        return replace(meta, update_ms=now)

    def add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Collection[TopicPartition]
    ) -> None:
        """AddPartitionsToTxn: the transaction writes to ``partitions`` (it begins here)."""

        def attempt() -> None:
            meta, version = self._load(transactional_id)
            self._check_producer(meta, producer_id, producer_epoch)
            if meta.state is TxnState.ONGOING and set(partitions) <= meta.partitions:
                return
            meta = self._begin_or_extend(meta, self._now_ms())
            self._store.write(replace(meta, partitions=meta.partitions | frozenset(partitions)), version)

        with self._lock(transactional_id):
            self._raced(transactional_id, attempt)

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str) -> None:
        """AddOffsetsToTxn: the transaction will commit offsets of ``group_id``."""
        if not group_id:
            raise InvalidRequestError("the group id is empty")

        def attempt() -> None:
            meta, version = self._load(transactional_id)
            self._check_producer(meta, producer_id, producer_epoch)
            meta = self._begin_or_extend(meta, self._now_ms())
            self._store.write(replace(meta, groups=meta.groups | {group_id}), version)

        with self._lock(transactional_id):
            self._raced(transactional_id, attempt)

    def commit_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group_id: str,
        offsets: Mapping[TopicPartition, CommittedOffset],
    ) -> None:
        """TxnOffsetCommit: offsets held with the transaction until it ends (the group was
        added with AddOffsetsToTxn first, else INVALID_TXN_STATE).

        Served by the group's coordinator, which need not be the transactional id's (as
        Kafka's clients send it): any broker's coordinator may make this write, fenced by
        the store's compare-and-set alone. A write that lost the race to another broker's
        (TRANSACTION_COORDINATOR_FENCED from the store) answers the retriable
        CONCURRENT_TRANSACTIONS, and the client sends it again."""
        with self._lock(transactional_id):
            meta, version = self._load(transactional_id)
            self._check_producer(meta, producer_id, producer_epoch)
            if meta.state.preparing:
                raise ConcurrentTransactionsError(f"transaction {transactional_id!r} is completing")
            if meta.state is not TxnState.ONGOING or group_id not in meta.groups:
                raise InvalidTxnStateError(
                    f"transaction {transactional_id!r} has not added group {group_id!r} (AddOffsetsToTxn first)"
                )
            pending = {g: dict(o) for g, o in meta.pending_offsets.items()}
            pending.setdefault(group_id, {}).update(offsets)
            with self._guard:
                self._offset_txns.setdefault(group_id, set()).add(transactional_id)
            try:
                self._store.write(replace(meta, pending_offsets=pending, update_ms=self._now_ms()), version)
            except TransactionCoordinatorFencedError as exc:
                raise ConcurrentTransactionsError(
                    f"transaction {transactional_id!r} changed while its offsets were written: retry"
                ) from exc

    def _index_stored_offsets(self) -> None:
        with self._index_lock:
            if self._offsets_indexed:
                return
            for tid in self._store.transactional_ids():
                found = self._store.load(tid)
                if found is not None and (found[0].state is TxnState.ONGOING or found[0].state.preparing):
                    with self._guard:
                        for group in found[0].pending_offsets:
                            self._offset_txns.setdefault(group, set()).add(tid)
            self._offsets_indexed = True

    def unstable_offsets(self, group_id: str, partitions: Collection[TopicPartition] | None) -> set[TopicPartition]:
        """The partitions of ``group_id`` (of ``partitions``; None: any) with offsets held
        by a transaction not yet complete (Ongoing, or decided and its completion not
        done): OffsetFetch's ``require_stable`` (KIP-447) answers them
        UNSTABLE_OFFSET_COMMIT, so a client reading its committed offsets right after
        EndTxn, whose completion runs after the answer, retries until the commit has
        reached the group. Candidates are the transactions whose TxnOffsetCommit this
        broker served (the group's coordinator), kept in memory, and, once at the first
        call, every stored transaction holding offsets (so a restart of this broker misses
        none; a group moving here misses those another broker served since). One found
        complete is forgotten."""
        self._index_stored_offsets()
        with self._guard:
            candidates = sorted(self._offset_txns.get(group_id, ()))
        wanted = None if partitions is None else frozenset(partitions)
        unstable: set[TopicPartition] = set()
        for tid in candidates:
            with self._lock(tid):  # a TxnOffsetCommit between the load and the discard is kept
                found = self._store.load(tid)
                meta = found[0] if found is not None else None
                held = meta.pending_offsets.get(group_id) if meta is not None else None
                if meta is None or not held or not (meta.state is TxnState.ONGOING or meta.state.preparing):
                    with self._guard:
                        tids = self._offset_txns.get(group_id)
                        if tids is not None:
                            tids.discard(tid)
                            if not tids:
                                del self._offset_txns[group_id]
                    continue
            unstable.update(tp for tp in held if wanted is None or tp in wanted)
        return unstable

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> None:
        """EndTxn: decide the outcome (stored before this returns), then complete it,
        waiting up to ``end_txn_wait_s`` for the completion (see the module docstring)."""

        def attempt() -> object:
            meta, version = self._load(transactional_id)
            self._check_producer(meta, producer_id, producer_epoch)
            wanted = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            preparing = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            if meta.state in (wanted, preparing):
                return None  # a retry of the same EndTxn
            if meta.state is not TxnState.ONGOING:
                if meta.state is TxnState.EMPTY and not commit:
                    return None  # aborting nothing (Kafka's clients may)
                raise InvalidTxnStateError(
                    f"transaction {transactional_id!r} is {meta.state.value}: cannot {'commit' if commit else 'abort'}"
                )
            return self._prepare(meta, version, commit=commit, bump_epoch=False)

        with self._lock(transactional_id):
            completing = self._raced(transactional_id, attempt)
        if isinstance(completing, Future):  # outside the lock: the completion takes it
            try:
                completing.result(timeout=self._end_txn_wait_s)
            except Exception:  # not done in time, or failed: it is retried; the outcome is stored
                log.info("transaction %s: answering EndTxn before its completion", transactional_id)

    def _prepare(self, meta: TransactionMetadata, version: int, *, commit: bool, bump_epoch: bool) -> object:
        """Store PrepareCommit/PrepareAbort (the decision), then try to complete it;
        what ``completions`` returned (the broker's pool: a Future)."""
        state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        epoch = meta.producer_epoch + 1 if bump_epoch and meta.producer_epoch < MAX_EPOCH else meta.producer_epoch
        prepared = replace(
            meta,
            state=state,
            producer_epoch=epoch,
            last_producer_epoch=meta.producer_epoch if epoch != meta.producer_epoch else meta.last_producer_epoch,
            update_ms=self._now_ms(),
        )
        version = self._store.write(prepared, version)
        log.info("transaction %s: %s (%d partition(s))", meta.transactional_id, state.value, len(meta.partitions))
        with self._guard:
            self._completing.add(meta.transactional_id)
        try:
            return self._completions(lambda: self._complete(prepared, version))
        except BaseException:  # not handed over (the pool is shut down): the housekeeping's, then
            with self._guard:
                self._completing.discard(meta.transactional_id)
            raise

    def _complete(self, prepared: TransactionMetadata, version: int) -> None:
        """Complete a decided transaction (on ``completions``): on failure it stays
        preparing and its id is handed to :meth:`take_incomplete`."""
        tid = prepared.transactional_id
        completed = False
        with self._lock(tid):
            try:
                completed = self._try_complete(prepared, version)
            finally:
                with self._guard:
                    self._completing.discard(tid)
                    if not completed:
                        self._incomplete.add(tid)

    def take_incomplete(self) -> set[str]:
        """The ids whose completion failed since the last call (to be retried)."""
        with self._guard:
            ids, self._incomplete = self._incomplete, set()
        return ids

    def _try_complete(self, meta: TransactionMetadata, version: int) -> bool:
        """Markers on every partition, then (a commit) the offsets, then Complete*; False,
        and the transaction left preparing, if a step failed."""
        commit = meta.state is TxnState.PREPARE_COMMIT
        try:
            partitions = sorted(meta.partitions)
            written = self._markers.write_markers(meta.producer_id, meta.producer_epoch, commit, partitions)
            failed = {tp: err for tp, err in written.items() if err is not None}
            if failed:
                log.warning("transaction %s: markers not written yet on %s", meta.transactional_id, sorted(failed))
                return False
            if commit:
                for group, offsets in sorted(meta.pending_offsets.items()):
                    self._offsets.commit(group, offsets)
            done = replace(
                meta,
                state=TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT,
                partitions=frozenset(),
                groups=frozenset(),
                pending_offsets={},
                update_ms=self._now_ms(),
            )
            self._store.write(done, version)
        except Exception as exc:
            log.warning("transaction %s: completing %s failed: %s", meta.transactional_id, meta.state.value, exc)
            return False
        return True

    # --- the coordinator's own work -----------------------------------------------------

    def complete_pending(self, transactional_ids: Collection[str] | None = None) -> int:
        """Complete every transaction left preparing (a crash, a marker that failed);
        how many completed now."""
        done = 0
        for tid in self._store.transactional_ids() if transactional_ids is None else transactional_ids:
            with self._lock(tid):
                with self._guard:
                    if tid in self._completing:
                        continue
                found = self._store.load(tid)
                if found is not None and found[0].state.preparing and self._try_complete(*found):
                    done += 1
        return done

    def abort_expired(self, transactional_ids: Collection[str] | None = None) -> list[str]:
        """Abort, with the epoch bumped, every Ongoing transaction older than its timeout."""
        aborted = []
        now = self._now_ms()
        for tid in self._store.transactional_ids() if transactional_ids is None else transactional_ids:
            with self._lock(tid):
                found = self._store.load(tid)
                if found is None:
                    continue
                meta, version = found
                if meta.state is TxnState.ONGOING and now - meta.start_ms > meta.timeout_ms:
                    log.info("transaction %s: timed out after %d ms, aborting", tid, now - meta.start_ms)
                    self._prepare(meta, version, commit=False, bump_epoch=True)
                    aborted.append(tid)
        return aborted

    def describe(self, transactional_id: str) -> TransactionMetadata | None:
        found = self._store.load(transactional_id)
        return found[0] if found is not None else None

    def list_transactions(
        self,
        state_filters: Collection[TxnState] = (),
        producer_id_filters: Collection[int] = (),
        coordinated: Callable[[str], bool] = lambda transactional_id: True,
    ) -> list[TransactionMetadata]:
        """ListTransactions (KIP-664): the stored ids ``coordinated`` says are this
        broker's, in a state of ``state_filters`` and with a producer id of
        ``producer_id_filters`` (an empty filter passes all); in id order. An id removed
        while listed is left out."""
        states, pids = frozenset(state_filters), frozenset(producer_id_filters)
        out = []
        for tid in self._store.transactional_ids():
            if not coordinated(tid):
                continue
            found = self._store.load(tid)
            if found is None:
                continue
            meta = found[0]
            if (not states or meta.state in states) and (not pids or meta.producer_id in pids):
                out.append(meta)
        return out
