"""The transactional producer's state (Kafka's ``TransactionManager``, KIP-98 / KIP-447).

States, as Kafka's::

    UNINITIALIZED --init_transactions--> INITIALIZING --> READY
    READY --begin_transaction--> IN_TRANSACTION
    IN_TRANSACTION --commit_transaction--> COMMITTING --> READY
    IN_TRANSACTION --abort_transaction--> ABORTING --> READY
    IN_TRANSACTION --a failed send, AddPartitionsToTxn refused...--> ABORTABLE_ERROR
    ABORTABLE_ERROR --abort_transaction--> ABORTING --> READY
    any --PRODUCER_FENCED, INVALID_PRODUCER_EPOCH, TRANSACTIONAL_ID_AUTHORIZATION_FAILED...--> FATAL_ERROR

In FATAL_ERROR every call raises the fatal error (the producer can only be closed); in
ABORTABLE_ERROR ``send``, ``send_offsets_to_transaction`` and ``commit_transaction``
raise it, and ``abort_transaction`` leads back to READY.

Requests go to the transactional id's coordinator (FindCoordinator, key type
TRANSACTION), found again after NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE;
CONCURRENT_TRANSACTIONS and COORDINATOR_LOAD_IN_PROGRESS are retried after
``retry_backoff_ms``. TxnOffsetCommit goes to the group's coordinator (key type GROUP).

**Partitions.** A batch of a partition not yet in the transaction is held back by the
accumulator (``txn_added``, ``txn_pending``); the sender calls :meth:`sender_turn` before
each drain, which sends one AddPartitionsToTxn for every partition pending then, and only
the partitions it added become sendable. In an error state the sender fails the batches
not yet sent (:meth:`sender_turn` returns the error), as Kafka's ``abortUndrainedBatches``.

**Epochs.** A transactional producer's epoch is the coordinator's: its streams never
restart locally. A batch that failed after it got its sequence leaves a hole, so the
abort that follows bumps the epoch (InitProducerId naming the producer id and epoch,
KIP-360) and every stream starts again at 0.

Thread safety: the public methods run on the application's thread (one at a time, as
Kafka requires); :meth:`sender_turn`, :meth:`batch_failed` and the state reads on the
sender's and gRPC's threads. ``_lock`` guards the state; the accumulator's lock guards
its sets and the sequences. No RPC is made with either lock held.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kclient.errors import (
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    IllegalStateError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    KafkaError,
    KafkaTimeoutError,
    NotCoordinatorError,
    OperationNotAttemptedError,
    ProducerFencedError,
    TransactionalIdAuthorizationFailedError,
    TransactionCoordinatorFencedError,
    UnsupportedVersionError,
    for_code,
)
from kclient.producer.accumulator import RecordAccumulator
from kclient.producer.batch import ProducerBatch
from kclient.proto.kbroker.v1 import cluster_pb2, group_pb2, txn_pb2
from kclient.structs import OffsetAndMetadata, TopicPartition

log = logging.getLogger(__name__)

FATAL_ERRORS = (
    ProducerFencedError,
    InvalidProducerEpochError,
    TransactionalIdAuthorizationFailedError,
    TransactionCoordinatorFencedError,
    InvalidProducerIdMappingError,
    UnsupportedVersionError,
)
"""Errors after which the transactional producer can do nothing more (Kafka's fatal ones)."""
_FIND_AGAIN = (NotCoordinatorError, CoordinatorNotAvailableError)
"""Errors that mean: the coordinator moved (or is starting); find it again."""
_RETRY = (ConcurrentTransactionsError, CoordinatorLoadInProgressError)


class State(enum.Enum):
    UNINITIALIZED = "Uninitialized"
    INITIALIZING = "Initializing"
    READY = "Ready"
    IN_TRANSACTION = "InTransaction"
    COMMITTING = "CommittingTransaction"
    ABORTING = "AbortingTransaction"
    ABORTABLE_ERROR = "AbortableError"
    FATAL_ERROR = "FatalError"


class TransactionAbortedError(KafkaError):
    """A batch of a transaction that was aborted before the batch was sent."""


def resp_ids(resp: Any) -> tuple[int, int]:
    return int(resp.producer_id), int(resp.producer_epoch)


def _is_fatal(err: BaseException) -> bool:
    return isinstance(err, FATAL_ERRORS)


class TransactionManager:
    """See the module docstring. ``call(address, method, request, timeout_s)`` and
    ``call_any(method, request, timeout_s)`` are the transport's; ``flush(timeout_s)``
    waits for every batch's outcome."""

    def __init__(
        self,
        transactional_id: str,
        transaction_timeout_ms: int,
        accumulator: RecordAccumulator,
        *,
        call: Callable[..., Any],
        call_any: Callable[..., Any],
        retry_backoff_ms: float,
        request_timeout_ms: float,
    ) -> None:
        if not transactional_id:
            raise IllegalStateError("a transactional producer needs a non-empty transactional_id")
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = int(transaction_timeout_ms)
        self.accumulator = accumulator
        self._call = call
        self._call_any = call_any
        self.backoff_s = retry_backoff_ms / 1000.0
        self.request_timeout_s = request_timeout_ms / 1000.0
        self._lock = threading.Lock()
        self.state = State.UNINITIALIZED
        self.error: KafkaError | None = None
        """The error of ABORTABLE_ERROR or FATAL_ERROR."""
        self.producer_id = -1
        self.producer_epoch = -1
        self.coordinator: str | None = None
        self._started = False
        """The coordinator knows of this transaction (a partition or offsets were added)."""
        self._bump_epoch = False
        """A sequenced batch of the transaction failed: the abort bumps the epoch."""
        self._add_retry_at = 0.0

    # --- state ---------------------------------------------------------------------------

    def _transition(self, allowed: Iterable[State], to: State, what: str) -> None:
        with self._lock:
            if self.state is State.FATAL_ERROR:
                assert self.error is not None
                raise self.error
            if self.state not in allowed:
                if self.state is State.ABORTABLE_ERROR and self.error is not None:
                    raise type(self.error)(
                        f"cannot {what}: the transaction failed and must be aborted (abort_transaction): "
                        f"{self.error.message}"
                    )
                raise IllegalStateError(f"cannot {what} in state {self.state.value}")
            self.state = to

    def _fail(self, err: KafkaError) -> KafkaError:
        """Enter FATAL_ERROR or ABORTABLE_ERROR for ``err`` (unless already fatal); returns it."""
        with self._lock:
            if self.state is State.FATAL_ERROR:
                return err
            if _is_fatal(err):
                self.state, self.error = State.FATAL_ERROR, err
                log.error(
                    "transactional id %s: fatal error, the producer must be closed: %s", self.transactional_id, err
                )
            elif self.state not in (State.UNINITIALIZED, State.INITIALIZING, State.READY):
                self.state, self.error = State.ABORTABLE_ERROR, err
                log.warning("transactional id %s: the transaction must be aborted: %s", self.transactional_id, err)
        return err

    @property
    def in_error(self) -> bool:
        return self.state in (State.ABORTABLE_ERROR, State.FATAL_ERROR)

    @property
    def in_transaction(self) -> bool:
        return self.state in (State.IN_TRANSACTION, State.COMMITTING, State.ABORTING, State.ABORTABLE_ERROR)

    def check_send(self) -> None:
        """``send`` is allowed only inside a transaction that has not failed."""
        state = self.state
        if state is State.IN_TRANSACTION:
            return
        error = self.error
        if error is not None and state is State.FATAL_ERROR:
            raise type(error)(f"cannot send, the producer can only be closed: {error.message}")
        if error is not None and state is State.ABORTABLE_ERROR:
            raise type(error)(f"cannot send: the transaction failed and must be aborted: {error.message}")
        if state is State.UNINITIALIZED or state is State.INITIALIZING:
            raise IllegalStateError("cannot send before init_transactions() completed")
        raise IllegalStateError(f"cannot send outside a transaction (state {state.value}): call begin_transaction()")

    # --- the calls ----------------------------------------------------------------------

    def _coordinator(self, key: str, key_type: int, deadline: float) -> str:
        resp = self._call_any(
            "FindCoordinator",
            group_pb2.FindCoordinatorRequest(group_id=key, key_type=key_type),  # type: ignore[arg-type]
            timeout_s=self._timeout(deadline),
        )
        if resp.error_code:
            raise for_code(resp.error_code)(resp.error_message)
        return f"{resp.host}:{resp.port}"

    def _timeout(self, deadline: float) -> float:
        return max(min(self.request_timeout_s, deadline - time.monotonic()), 0.05)

    def _txn_call(self, method: str, request: Any, deadline: float, check: Callable[[Any], None]) -> Any:
        """``method`` on the transaction coordinator, until ``check`` (which raises the
        answer's error) passes: found again after NOT_COORDINATOR, retried after
        CONCURRENT_TRANSACTIONS and connection failures, until ``deadline``
        (KafkaTimeoutError). Other errors are raised."""
        while True:
            try:
                if self.coordinator is None:
                    self.coordinator = self._coordinator(self.transactional_id, group_pb2.TRANSACTION, deadline)
                resp = self._call(self.coordinator, method, request, self._timeout(deadline))
                check(resp)
                return resp
            except KafkaError as exc:
                err = exc
            if isinstance(err, _FIND_AGAIN) or (not isinstance(err, _RETRY) and err.retriable):
                self.coordinator = None
            elif not isinstance(err, _RETRY):
                raise err
            if time.monotonic() + self.backoff_s >= deadline:
                raise KafkaTimeoutError(f"{method} for transactional id {self.transactional_id!r}: {err}") from err
            log.debug("%s for %s: %s; retrying", method, self.transactional_id, err)
            time.sleep(self.backoff_s)

    @staticmethod
    def _check_top(resp: Any) -> None:
        if resp.error_code:
            raise for_code(resp.error_code)(resp.error_message)

    # --- init_transactions ---------------------------------------------------------------

    def init_transactions(self, timeout_s: float, set_producer_id: Callable[[int, int], None]) -> None:
        """Fence the id's older producers and get this one's producer id and epoch. A call
        that timed out may be repeated."""
        self._transition((State.UNINITIALIZED, State.INITIALIZING), State.INITIALIZING, "init_transactions")
        deadline = time.monotonic() + timeout_s
        try:
            pid, epoch = self._init_producer_id(deadline, None)
        except KafkaTimeoutError:
            raise
        except KafkaError as exc:
            with self._lock:
                self.state, self.error = State.FATAL_ERROR, exc
            raise
        set_producer_id(pid, epoch)
        with self._lock:
            self.state = State.READY

    def _init_producer_id(self, deadline: float, held: tuple[int, int] | None) -> tuple[int, int]:
        request = cluster_pb2.InitProducerIdRequest(
            transactional_id=self.transactional_id, transaction_timeout_ms=self.transaction_timeout_ms
        )
        if held is not None:
            request.producer_id, request.producer_epoch = held
        resp = self._txn_call("InitProducerId", request, deadline, self._check_top)
        self.producer_id, self.producer_epoch = int(resp.producer_id), int(resp.producer_epoch)
        log.info(
            "transactional id %s: producer id %d, epoch %d",
            self.transactional_id,
            self.producer_id,
            self.producer_epoch,
        )
        return self.producer_id, self.producer_epoch

    # --- begin ----------------------------------------------------------------------------

    def begin_transaction(self) -> None:
        self._transition((State.READY,), State.IN_TRANSACTION, "begin_transaction")
        with self._lock:
            self._started = False

    # --- partitions (the sender's thread) ---------------------------------------------------

    def sender_turn(self) -> KafkaError | None:
        """Before a drain: the error that fails the batches not yet sent (an error state), or
        None after adding the pending partitions when due (see the module docstring)."""
        if self.in_error:
            return self.error
        acc = self.accumulator
        with acc.lock:
            pending = sorted(acc.txn_pending)
        if not pending or time.monotonic() < self._add_retry_at:
            return None
        self._add_partitions(pending)
        return self.error if self.in_error else None

    def _add_partitions(self, pending: list[TopicPartition]) -> None:
        request = txn_pb2.AddPartitionsToTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id, producer_epoch=self.producer_epoch
        )
        by_topic: dict[str, list[int]] = {}
        for tp in pending:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        for topic, partitions in by_topic.items():
            request.topics.add(name=topic, partitions=partitions)
        try:
            if self.coordinator is None:
                deadline = time.monotonic() + self.request_timeout_s
                self.coordinator = self._coordinator(self.transactional_id, group_pb2.TRANSACTION, deadline)
            resp = self._call(self.coordinator, "AddPartitionsToTxn", request, self.request_timeout_s)
        except KafkaError as exc:
            self._partitions_not_added(exc)
            return
        errors: list[KafkaError] = []
        if resp.error_code:
            errors.append(for_code(resp.error_code)(resp.error_message))
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code and p.error_code != OperationNotAttemptedError.errno:
                    errors.append(for_code(p.error_code)(f"{t.name}-{p.index}: {p.error_message}"))
        if errors:
            self._partitions_not_added(errors[0])
            return
        acc = self.accumulator
        with acc.lock:
            assert acc.txn_added is not None
            acc.txn_added.update(pending)
            acc.txn_pending.difference_update(pending)
            acc.cond.notify_all()
        with self._lock:
            self._started = True
        log.debug("transactional id %s: added %s", self.transactional_id, pending)

    def _partitions_not_added(self, err: KafkaError) -> None:
        if isinstance(err, _FIND_AGAIN) or (err.retriable and not isinstance(err, _RETRY)):
            self.coordinator = None
        if err.retriable:
            self._add_retry_at = time.monotonic() + self.backoff_s
            log.debug("AddPartitionsToTxn for %s: %s; retrying", self.transactional_id, err)
            return
        self._fail(err)

    def batch_failed(self, b: ProducerBatch, err: KafkaError) -> None:
        """The sender failed ``b`` for good: the transaction cannot commit."""
        if b.sequenced:
            with self._lock:
                self._bump_epoch = True
        if not isinstance(err, TransactionAbortedError):
            self._fail(err)

    # --- offsets ---------------------------------------------------------------------------

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
        group: Any,
        timeout_s: float,
    ) -> None:
        """AddOffsetsToTxn to the transaction's coordinator, then TxnOffsetCommit to the
        group's (KIP-447). ``group``: a group id, or a consumer's group metadata (an object
        with ``group_id`` and, optionally, ``generation_id``, ``member_id`` and
        ``group_instance_id``)."""
        group_id = group if isinstance(group, str) else getattr(group, "group_id", None)
        if not group_id:
            raise ValueError("send_offsets_to_transaction needs a group id or a consumer's group metadata")
        self._transition((State.IN_TRANSACTION,), State.IN_TRANSACTION, "send_offsets_to_transaction")
        deadline = time.monotonic() + timeout_s
        try:
            self._txn_call(
                "AddOffsetsToTxn",
                txn_pb2.AddOffsetsToTxnRequest(
                    transactional_id=self.transactional_id,
                    producer_id=self.producer_id,
                    producer_epoch=self.producer_epoch,
                    group_id=group_id,
                ),
                deadline,
                self._check_top,
            )
            with self._lock:
                self._started = True
            self._txn_offset_commit(group_id, group, offsets, deadline)
        except KafkaTimeoutError:
            raise
        except KafkaError as exc:
            raise self._fail(exc) from None

    def _txn_offset_commit(
        self, group_id: str, group: Any, offsets: Mapping[TopicPartition, OffsetAndMetadata | int], deadline: float
    ) -> None:
        request = txn_pb2.TxnOffsetCommitRequest(
            transactional_id=self.transactional_id,
            group_id=group_id,
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
        )
        generation = getattr(group, "generation_id", None)
        if generation is not None:
            request.generation_id = int(generation)
        request.member_id = getattr(group, "member_id", None) or ""
        instance = getattr(group, "group_instance_id", None)
        if instance is not None:
            request.group_instance_id = instance
        by_topic: dict[str, Any] = {}
        for tp, om in sorted(offsets.items()):
            t = by_topic.get(tp.topic)
            if t is None:
                t = by_topic[tp.topic] = request.topics.add(name=tp.topic)
            if isinstance(om, int):
                t.partitions.add(index=tp.partition, offset=om)
            else:
                t.partitions.add(index=tp.partition, offset=om.offset, metadata=om.metadata or "")
        coordinator: str | None = None
        while True:
            try:
                if coordinator is None:
                    coordinator = self._coordinator(group_id, group_pb2.GROUP, deadline)
                resp = self._call(coordinator, "TxnOffsetCommit", request, self._timeout(deadline))
                errors = [for_code(resp.error_code)(resp.error_message)] if resp.error_code else []
                errors += [
                    for_code(p.error_code)(f"{t.name}-{p.index}: {p.error_message}")
                    for t in resp.topics
                    for p in t.partitions
                    if p.error_code
                ]
                if not errors:
                    return
                err: KafkaError = errors[0]
            except KafkaError as exc:
                err = exc
            if isinstance(err, _FIND_AGAIN) or (err.retriable and not isinstance(err, _RETRY)):
                coordinator = None
            elif not err.retriable:
                raise err
            if time.monotonic() + self.backoff_s >= deadline:
                raise KafkaTimeoutError(f"TxnOffsetCommit for group {group_id!r}: {err}") from err
            time.sleep(self.backoff_s)

    # --- commit / abort ---------------------------------------------------------------------

    def commit_transaction(self, timeout_s: float, flush: Callable[[float], None]) -> None:
        """Send every batch, then EndTxn(commit). A failed batch makes the transaction
        abortable and raises its error. A call that timed out may be repeated."""
        self._transition((State.IN_TRANSACTION, State.COMMITTING), State.COMMITTING, "commit_transaction")
        deadline = time.monotonic() + timeout_s
        flush(max(deadline - time.monotonic(), 0.0))
        if self.in_error:
            assert self.error is not None
            raise type(self.error)(f"the transaction cannot commit: {self.error.message}")
        self._end(True, deadline)

    def abort_transaction(self, timeout_s: float, flush: Callable[[float], None]) -> None:
        """Fail the batches not sent yet, await those in flight, then EndTxn(abort); bump
        the epoch when a sent batch failed. A call that timed out may be repeated."""
        self._transition(
            (State.IN_TRANSACTION, State.ABORTABLE_ERROR, State.ABORTING, State.COMMITTING),
            State.ABORTING,
            "abort_transaction",
        )
        deadline = time.monotonic() + timeout_s
        self._drop_unsent()
        flush(max(deadline - time.monotonic(), 0.0))
        self._end(False, deadline)

    def _drop_unsent(self) -> None:
        acc = self.accumulator
        dropped = acc.take_queued()
        err = TransactionAbortedError("the transaction was aborted before the batch was sent")
        for b in dropped:
            if b.sequenced:
                with self._lock:
                    self._bump_epoch = True
            b.fail(err)
            acc.complete(b, in_flight=False)

    def _end(self, commit: bool, deadline: float) -> None:
        try:
            if self._started:
                self._txn_call(
                    "EndTxn",
                    txn_pb2.EndTxnRequest(
                        transactional_id=self.transactional_id,
                        producer_id=self.producer_id,
                        producer_epoch=self.producer_epoch,
                        committed=commit,
                    ),
                    deadline,
                    self._check_top,
                )
            if not commit and self._bump_epoch:
                self._new_epoch(deadline)
        except KafkaTimeoutError:
            raise
        except KafkaError as exc:
            raise self._fail(exc) from None
        acc = self.accumulator
        with acc.lock:
            assert acc.txn_added is not None
            acc.txn_added.clear()
            acc.txn_pending.clear()
        with self._lock:
            self.state, self.error, self._started = State.READY, None, False
        log.debug("transactional id %s: transaction %s", self.transactional_id, "committed" if commit else "aborted")

    def _new_epoch(self, deadline: float) -> None:
        """KIP-360: a new epoch after an abort that left holes in the sequences; every
        partition's stream starts again at 0."""
        pid, epoch = self._init_producer_id(deadline, (self.producer_id, self.producer_epoch))
        acc = self.accumulator
        with acc.lock:
            seqs = acc.sequences
            assert seqs is not None
            seqs.set_producer_id(pid, epoch)
            seqs.streams.clear()
            seqs.restarting.clear()
            seqs.awaiting_producer_id.clear()
        with self._lock:
            self._bump_epoch = False
