"""The sender: one thread that drains ready batches into Produce requests (Kafka's ``Sender``).

Each turn of the loop refreshes metadata when asked or every ``metadata_max_age_ms``,
takes what :meth:`RecordAccumulator.drain` says is ready, and sends one Produce RPC per
request as a gRPC future, up to ``max_in_flight_requests_per_connection`` per broker.
Responses are handled on gRPC's callback thread (``_on_response``), batch by batch:

- success, or DUPLICATE_SEQUENCE_NUMBER (a retry of a batch the leader already wrote):
  the batch's result is set with its base offset;
- a retriable error (and ``delivery_timeout_ms`` not passed since the batch was made):
  the batch goes back to its partition's queue for a retry after ``retry_backoff_ms``;
  an ``invalid_metadata`` error, REQUEST_TIMED_OUT or a failed call also ask for a
  metadata refresh (and the last two mark the broker failed, so the refresh asks
  another broker first);
- with idempotence, a send whose outcome is unknown (a failed call, REQUEST_TIMED_OUT,
  NOT_ENOUGH_REPLICAS_AFTER_APPEND) marks the batch ``maybe_written``: it is resent only
  with the same stamp, which the leader recognises if it wrote it (see ``sequences``);
- with idempotence, OUT_OF_ORDER_SEQUENCE_NUMBER for a batch behind another unresolved
  batch of its partition is retried (the earlier one failed and is resent first), and so
  is one that has become the first unresolved batch since it was sent (the leader served
  it before the batch ahead of it, which is written now; its answer came late). For a
  batch that was already the first unresolved one when sent, it is a real gap (the
  leader lost records it had acknowledged) or, for a batch that may have been written,
  possibly that batch itself beyond the leader's memory: a batch never possibly written
  is resent in the partition's restarted stream (a new epoch, as Kafka 2.5+ bumps it);
  one that may have been written fails with the error, since resending it under a new
  stamp could write it twice;
- anything else fails the batch; with idempotence its partition's stream restarts once
  none of its batches is in flight, and the batches that may have been written under
  their old stamps fail with it (KafkaError "outcome unknown").

Transactions (``txn``, :mod:`~kclient.producer.transactions`): before each drain the
sender adds the partitions waiting for the transaction (AddPartitionsToTxn), and only
added partitions are drained; Produce requests carry the transactional id. A batch that
fails for good fails the transaction (abortable, or fatal for PRODUCER_FENCED and the
like) instead of restarting its partition's stream; once the transaction failed, batches
are no longer retried and those not yet sent fail with its error.

Ordering: with idempotence, batches of a partition are written in their send order
even with several in flight and across retries (the leader refuses a batch that skips
a sequence; retried batches are resent alone and in order). Without idempotence and
with more than one request in flight, a retry can land after batches sent later, and
the broker may also write concurrent requests of one partition in either order:
set ``max_in_flight_requests_per_connection=1`` for strict order without idempotence.

Thread safety: the loop runs on its own thread; the response handlers on gRPC's; the
shared state is the accumulator's (under its lock) and ``requests_in_flight`` (also
under the accumulator's lock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from kclient.errors import (
    DuplicateSequenceNumberError,
    InvalidProducerEpochError,
    InvalidRecordError,
    KafkaError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    NotEnoughReplicasAfterAppendError,
    OutOfOrderSequenceNumberError,
    RequestTimedOutError,
    UnknownProducerIdError,
    for_code,
)
from kclient.metadata import ClusterMetadata
from kclient.producer.accumulator import RecordAccumulator
from kclient.producer.batch import ProducerBatch
from kclient.producer.metrics import ProducerMetrics
from kclient.producer.sequences import Sequences, fetch_producer_id
from kclient.producer.transactions import TransactionManager
from kclient.proto.kbroker.v1 import log_pb2
from kclient.transport import Transport

log = logging.getLogger(__name__)

_DUPLICATE_SEQUENCE = DuplicateSequenceNumberError.errno
_SEQUENCE_ERRORS = (OutOfOrderSequenceNumberError, InvalidProducerEpochError, UnknownProducerIdError)
_OUTCOME_UNKNOWN = (RequestTimedOutError, NotEnoughReplicasAfterAppendError)
"""Error answers after which the batch may be in the log (the leader wrote it first)."""
_REFUSED_BEFORE_SERVED = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)
"""Failed calls that the broker refused before serving them: nothing of them was written."""


class Sender:
    """See the module docstring."""

    def __init__(
        self,
        accumulator: RecordAccumulator,
        metadata: ClusterMetadata,
        transport: Transport,
        sequences: Sequences | None,
        *,
        acks: int,
        request_timeout_ms: int,
        delivery_timeout_ms: int,
        retry_backoff_ms: int,
        max_request_size: int,
        max_in_flight: int,
        on_metadata: Callable[[], None] = lambda: None,
        txn: TransactionManager | None = None,
    ) -> None:
        self.accumulator = accumulator
        self.metadata = metadata
        self.transport = transport
        self.sequences = sequences
        self.acks = acks
        self.request_timeout_s = request_timeout_ms / 1000.0
        self.request_timeout_ms = request_timeout_ms
        self.delivery_timeout_s = delivery_timeout_ms / 1000.0
        self.delivery_timeout_ms = delivery_timeout_ms
        self.backoff_s = retry_backoff_ms / 1000.0
        self.max_request_size = max_request_size
        self.max_in_flight = max_in_flight
        self.on_metadata = on_metadata
        self.txn = txn
        """A transactional producer's transaction state (None: not transactional)."""
        self.requests_in_flight: dict[str, int] = {}
        self.metrics = ProducerMetrics()
        self.aborted = False
        """close() ran out of time: batches still undelivered fail."""
        self._needs_metadata = threading.Event()
        self._requests_lock = threading.Lock()
        self._requests_created: dict[int, float] = {}
        """Requests in flight (by the id of their batch list) -> when their oldest batch was made."""
        self._producer_id_retry_at = 0.0
        self._thread = threading.Thread(target=self.run, name="kclient-producer-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    # --- the loop ------------------------------------------------------------------------

    def run(self) -> None:
        acc = self.accumulator
        while True:
            seqs = self.sequences
            if seqs is not None and seqs.awaiting_producer_id and time.monotonic() >= self._producer_id_retry_at:
                self._renew_producer_id()
            self._refresh_metadata()
            if self.txn is not None:
                self._transaction_turn(self.txn)
            expired: list[ProducerBatch] = []
            with acc.lock:
                if acc.closed and (self.aborted or not acc.pending):
                    return
                dropped = self._restart_streams() if seqs is not None and seqs.restarting else []
                now = time.monotonic()
                requests, wait, no_leader = acc.drain(
                    now, self.metadata.leader_address, self.requests_in_flight, self.max_in_flight,
                    self.max_request_size,
                )  # fmt: skip
                for b in no_leader:
                    self._needs_metadata.set()
                    if now - b.created > self.delivery_timeout_s or self.aborted:
                        expired.append(b)
                    else:
                        b.retry_at = now + self.backoff_s
                        wait = min(wait, self.backoff_s)
                for addr, _ in requests:
                    self.requests_in_flight[addr] = self.requests_in_flight.get(addr, 0) + 1
                if not requests and not expired and not dropped:
                    acc.cond.wait(wait)
                    continue
            self._fail_dropped(dropped)
            for b in expired:
                b.fail(
                    LeaderNotAvailableError(
                        f"no leader known for {b.tp.topic}-{b.tp.partition} "
                        f"(gave up after delivery_timeout_ms={self.delivery_timeout_ms})"
                    )
                )
                acc.complete(b, in_flight=False)
            for addr, batches in requests:
                self._send(addr, batches)

    def _transaction_turn(self, txn: TransactionManager) -> None:
        """Add the partitions waiting for the transaction, or, once the transaction failed,
        fail the batches not sent yet with its error (Kafka's ``abortUndrainedBatches``)."""
        err = txn.sender_turn()
        acc = self.accumulator
        if err is None:
            self._expire_unadded(txn)
            return
        for b in acc.take_queued():
            self.metrics.failed(b.count)
            b.fail(err)
            acc.complete(b, in_flight=False)

    def _expire_unadded(self, txn: TransactionManager) -> None:
        """Batches whose partition could not be added within ``delivery_timeout_ms`` fail
        (and with them the transaction), as Kafka expires batches in the accumulator."""
        acc = self.accumulator
        now = time.monotonic()
        expired: list[ProducerBatch] = []
        with acc.lock:
            for tp in acc.txn_pending:
                q = acc.queues.get(tp)
                for b in q.batches if q is not None else ():
                    if now - b.created <= self.delivery_timeout_s:
                        break
                    expired.append(b)
        for b in expired:
            err = KafkaTimeoutError(
                f"{b.tp.topic}-{b.tp.partition} was not added to the transaction within "
                f"delivery_timeout_ms={self.delivery_timeout_ms}"
            )
            txn.batch_failed(b, err)
            self.metrics.failed(b.count)
            b.fail(err)
            acc.complete(b, in_flight=False)

    def _restart_streams(self) -> list[ProducerBatch]:
        """Restart the streams marked for it whose partitions have nothing in flight; returns
        the batches that cannot be renumbered (their outcome is unknown). Lock held."""
        seqs = self.sequences
        assert seqs is not None
        dropped: list[ProducerBatch] = []
        for tp in list(seqs.restarting):
            q = self.accumulator.queues.get(tp)
            if q is not None and q.in_flight:
                continue
            out = seqs.restart(tp)
            if q is not None:
                for b in out:  # failed below, outside the lock; never drained again
                    q.batches.remove(b)
            s = seqs.streams[tp]
            log.info(
                "%s-%d: the partition's sequence restarts at 0 with producer id %d epoch %d%s",
                tp.topic,
                tp.partition,
                s.producer_id,
                s.epoch,
                f"; {len(out)} batch(es) whose outcome is unknown fail" if out else "",
            )
            dropped += out
        return dropped

    def _fail_dropped(self, dropped: list[ProducerBatch]) -> None:
        for b in dropped:
            self.metrics.failed(b.count)
            b.fail(
                KafkaError(
                    f"{b.tp.topic}-{b.tp.partition}: the outcome of the batch is unknown (an answer was lost) and "
                    "its sequence stream restarted after another batch failed; it may or may not have been written"
                )
            )
            self.accumulator.complete(b, in_flight=False)

    def _refresh_metadata(self) -> None:
        """Refresh when asked (a send failed) or every ``metadata_max_age_ms``, waiting at most
        until the oldest unsent batch's ``delivery_timeout_ms`` passes (it then fails on time)."""
        if self.aborted or self.accumulator.closed:
            return  # closing with nothing left to send (or giving up on what is left)
        if self._needs_metadata.is_set():
            self._needs_metadata.clear()
            self.metadata.request_update()
        now = time.monotonic()
        if not self.metadata.needs_refresh(now):
            return
        timeout = self.request_timeout_s
        with self._requests_lock:
            oldest = min(self._requests_created.values(), default=None)
        queued = self.accumulator.oldest_queued()
        if queued is not None and (oldest is None or queued < oldest):
            oldest = queued
        if oldest is not None:
            timeout = min(timeout, max(oldest + self.delivery_timeout_s - now, 0.05))
        if self.metadata.maybe_refresh(timeout):
            self.on_metadata()
        elif not self.accumulator.closed:  # else close() cancelled it
            log.warning("metadata refresh failed; retrying after retry_backoff_ms")

    def _renew_producer_id(self) -> None:
        """A new producer id for the partitions whose epoch ran out."""
        acc = self.accumulator
        assert self.sequences is not None
        try:
            pid, epoch = fetch_producer_id(self.call_any, time.monotonic(), self.backoff_s)
        except KafkaError as exc:
            log.warning("could not get a new producer id: %s", exc)
            now = time.monotonic()
            self._producer_id_retry_at = now + self.backoff_s
            expired: list[ProducerBatch] = []
            with acc.lock:
                for tp in self.sequences.awaiting_producer_id:
                    q = acc.queues.get(tp)
                    while q and q.batches and now - q.batches[0].created > self.delivery_timeout_s:
                        expired.append(q.batches[0])
                        break
            for b in expired:
                b.fail(KafkaTimeoutError(f"batch for {b.tp.topic}-{b.tp.partition} expired waiting for a producer id"))
                acc.complete(b, in_flight=False)
            return
        with acc.lock:
            dropped = self.sequences.renew(pid, epoch)
            acc.cond.notify_all()
        self._fail_dropped(dropped)

    def call_any(self, method: str, request: object) -> object:
        return self.transport.call_any(method, request, self.metadata.broker_addresses())

    # --- requests ------------------------------------------------------------------------

    def _send(self, addr: str, batches: list[ProducerBatch]) -> None:
        req = log_pb2.ProduceRequest(acks=self.acks, timeout_ms=self.request_timeout_ms)
        if self.txn is not None:
            req.transactional_id = self.txn.transactional_id
        topics: dict[str, Any] = {}
        sent: list[tuple[int, int, bool]] = []
        for b in batches:
            b.attempts += 1
            t = topics.get(b.tp.topic)
            if t is None:
                t = topics[b.tp.topic] = req.topics.add(name=b.tp.topic)
            payload = b.payload()
            t.partitions.add(index=b.tp.partition, records=payload)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("to %s: %r%s", addr, b, f" (maybe written as {b.maybe_written})" if b.maybe_written else "")
            sent.append((b.count, len(payload), b.attempts > 1))
        self.metrics.request_sent(sent)
        start = time.monotonic()
        # The answer is awaited until the request timeout, or until the oldest batch's
        # delivery_timeout_ms passes (Kafka expires batches in flight too).
        oldest = min(b.created for b in batches)
        full = self.request_timeout_s + 5
        timeout = min(full, max(oldest + self.delivery_timeout_s - start, 0.05))
        key = id(batches)
        with self._requests_lock:
            self._requests_created[key] = oldest
        try:
            call = self.transport.stub(addr).Produce.future(req, timeout=timeout)
        except KafkaError as exc:
            with self._requests_lock:
                self._requests_created.pop(key, None)
            self._request_done(addr)
            for b in batches:
                self._failed(b, exc)
            return
        expiring = timeout < full
        call.add_done_callback(lambda c: self._on_response(c, batches, addr, start, expiring))

    def _request_done(self, addr: str, completed: Sequence[ProducerBatch] = ()) -> None:
        """The request to ``addr`` is answered; ``completed`` (their results set) are released.
        One lock acquisition per response."""
        acc = self.accumulator
        with acc.lock:
            n = self.requests_in_flight.get(addr, 0) - 1
            if n > 0:
                self.requests_in_flight[addr] = n
            else:
                self.requests_in_flight.pop(addr, None)
            seqs = self.sequences
            for b in completed:
                if seqs is not None:
                    seqs.acknowledged(b)
                acc.complete_locked(b)
            acc.cond.notify_all()

    def _on_response(
        self, call: Any, batches: list[ProducerBatch], addr: str, start: float, expiring: bool = False
    ) -> None:
        """``expiring``: the call's deadline was cut to the batches' delivery time, so its
        DEADLINE_EXCEEDED says nothing about the connection."""
        self.metrics.response((time.monotonic() - start) * 1000.0)
        with self._requests_lock:
            self._requests_created.pop(id(batches), None)
        try:
            resp = call.result()
        except grpc.RpcError as exc:
            self._request_done(addr)
            code = exc.code() if hasattr(exc, "code") else None
            if expiring and code == grpc.StatusCode.DEADLINE_EXCEEDED:
                err: KafkaError = KafkaTimeoutError(f"no answer from {addr} within the batches' delivery time")
            else:
                err = self.transport.failed(addr, exc)
                self._needs_metadata.set()
            log.debug("from %s: %s for %s", addr, code, batches)
            for b in batches:
                if b.maybe_written is None and code not in _REFUSED_BEFORE_SERVED:
                    b.maybe_written = b.sent_stamp  # the call may have been served; its answer is lost
                self._failed(b, err)
            return
        except Exception as exc:  # pragma: no cover - cancelled at close
            self._request_done(addr)
            for b in batches:
                self._failed(b, KafkaError(str(exc)))
            return
        if self.acks == 0:
            # Nothing is acknowledged; the batch is done once the broker has it.
            for b in batches:
                b.succeed(-1, -1)
            self._request_done(addr, batches)
            return
        by_tp = {(t.name, p.index): p for t in resp.topics for p in t.partitions}
        completed: list[ProducerBatch] = []
        failed: list[tuple[ProducerBatch, KafkaError]] = []
        for b in batches:
            pr = by_tp.get((b.tp.topic, b.tp.partition))
            if pr is None:
                failed.append((b, KafkaError("partition missing from produce response")))
            elif pr.error_code and pr.error_code != _DUPLICATE_SEQUENCE:
                if pr.error_code == InvalidRecordError.errno:
                    # KIP-467: the records the broker refused, by index in the batch.
                    err = InvalidRecordError(pr.error_message, [(e.batch_index, e.message) for e in pr.record_errors])
                else:
                    err = for_code(pr.error_code)(pr.error_message)
                if isinstance(err, RequestTimedOutError):
                    # The leader could not replicate in time: it may be cut off (from
                    # ZooKeeper or its followers) while another broker leads now.
                    self.transport.mark_failed(addr)
                    self._needs_metadata.set()
                elif err.invalid_metadata:
                    self._needs_metadata.set()
                if isinstance(err, _OUTCOME_UNKNOWN) and b.maybe_written is None:
                    b.maybe_written = b.sent_stamp
                failed.append((b, err))
                log.debug("from %s: %r: %s", addr, b, err)
            else:
                log.debug("from %s: %r at offset %d", addr, b, pr.base_offset)
                b.succeed(pr.base_offset, pr.log_append_time_ms)
                completed.append(b)
        self._request_done(addr, completed)
        for b, err in failed:
            self._failed(b, err)

    def _failed(self, b: ProducerBatch, err: KafkaError) -> None:
        """Retry ``b`` or fail it (see the module docstring)."""
        acc = self.accumulator
        now = time.monotonic()
        expired = now - b.created > self.delivery_timeout_s
        seqs = self.sequences
        txn = self.txn
        txn_failed = txn is not None and txn.in_error  # no retry: the transaction's batches fail
        if not expired and not acc.closed and not txn_failed:
            if seqs is not None and b.sequenced:
                with acc.lock:
                    retry, restart = self._sequence_retry(seqs, b, err)
                    if restart and txn is not None:
                        # A transactional producer's epoch is the coordinator's: the
                        # transaction fails, and its abort bumps the epoch.
                        retry, restart = False, False
                    if restart:
                        seqs.request_restart(b.tp)
                    elif retry:
                        seqs.unconfirm(b.tp)
                if isinstance(err, OutOfOrderSequenceNumberError) and not retry and txn is None:
                    err = OutOfOrderSequenceNumberError(
                        f"{err.message} (the batch may already be in the log beyond the leader's memory of this "
                        "producer: it is not resent under a new sequence, which could write it twice)"
                    )
            else:
                retry = err.retriable
            if retry:
                acc.requeue(b, now + self.backoff_s)
                return
        if self.aborted:
            err = KafkaTimeoutError("the producer was closed before the batch was acknowledged")
        elif txn_failed and txn is not None and txn.error is not None and err.retriable:
            err = type(txn.error)(f"the transaction failed: {txn.error.message}")
        elif expired and err.retriable:
            # Report why it kept failing, not just that time ran out.
            err = type(err)(f"{err.message} (gave up after delivery_timeout_ms={self.delivery_timeout_ms})")
        if seqs is not None and b.sequenced and txn is None:
            with acc.lock:
                seqs.request_restart(b.tp)
        if txn is not None:
            txn.batch_failed(b, err)
        self.metrics.failed(b.count)
        b.fail(err)
        acc.complete(b)

    @staticmethod
    def _sequence_retry(seqs: Sequences, b: ProducerBatch, err: KafkaError) -> tuple[bool, bool]:
        """(retry ``b`` with its stamp, restart its stream first) for a sequenced batch's error.
        Lock held."""
        if seqs.is_stale(b):
            # Sent in an older stream: a sequence error refers to that stream, no gap. A batch
            # that may be in the log under that stream's stamp cannot be renumbered.
            return b.maybe_written is None and (err.retriable or isinstance(err, _SEQUENCE_ERRORS)), False
        if isinstance(err, OutOfOrderSequenceNumberError):
            if not seqs.is_first_unresolved(b):
                return True, False  # an earlier batch failed: it is resent first
            if not b.sent_first:
                # A batch ahead of it was in flight when it was sent, and is written now: the
                # leader served this one first (calls are served concurrently) and its answer
                # came late. No gap: resent, it follows.
                return True, False
            if b.maybe_written is None:
                log.warning(
                    "%s-%d: out-of-order sequence for the first unacknowledged batch (%r: %s); "
                    "restarting the partition's sequence in a new epoch",
                    b.tp.topic,
                    b.tp.partition,
                    b,
                    err.message,
                )
                return True, True
            return False, False
        return err.retriable, False
