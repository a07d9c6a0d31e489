"""The record accumulator: one queue of batches per partition (Kafka's ``RecordAccumulator``).

``append`` (one record, from ``send``) adds to the partition's open batch while the
record fits under ``batch_size`` by its exact encoded size; otherwise it closes that
batch and opens a new one. Keyless records stick to one partition per topic and move
round-robin to the next when that partition's batch closes (full, or taken by the
sender), so they spread evenly. ``add_encoded`` queues a batch ``send_batch`` encoded.

Buffer memory (``buffer_memory``) is counted per batch, as Kafka's BufferPool does: a
new batch reserves ``max(batch_size, record bound)`` bytes, gives back what it did not
use when it closes, and the rest when it completes. A caller that needs a new batch
while the buffer is full blocks up to ``max_block_ms``, then gets KafkaTimeoutError.

``drain`` gives the sender what to send now (see its docstring) and how long it may
sleep otherwise; ``requeue`` puts a batch back for a retry, ahead of the batches never
sent and in its creation order among the other retries; ``complete`` releases it.

Thread safety: every method takes ``lock`` (a plain lock: one acquisition per record);
``cond`` (on the same lock) wakes the sender when a batch is created or closes, and
blocked callers and flushers when batches complete. ``drain`` expects the lock held.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from kclient.errors import KafkaTimeoutError
from kclient.producer.batch import NO_STAMP, ProducerBatch, Stamp
from kclient.producer.futures import FutureRecordMetadata
from kclient.producer.sequences import Sequences
from kclient.records import BatchBuilder, Compression
from kclient.structs import TopicPartition

Headers = Sequence[tuple[str, bytes | None]]

log = logging.getLogger(__name__)


class PartitionQueue:
    """The batches of one partition not completed and not in flight, oldest first."""

    __slots__ = ("batches", "in_flight", "next_order", "open", "tp")

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.batches: deque[ProducerBatch] = deque()
        self.open: ProducerBatch | None = None
        """The last batch while ``send`` may still append to it."""
        self.in_flight = 0
        self.next_order = 0


class _Topic:
    __slots__ = ("queues", "sticky")

    def __init__(self) -> None:
        self.queues: dict[int, PartitionQueue] = {}
        self.sticky: int | None = None


class RecordAccumulator:
    """See the module docstring."""

    def __init__(
        self,
        *,
        batch_size: int,
        buffer_memory: int,
        linger_ms: float,
        compression: Compression,
        max_block_ms: float,
        sequences: Sequences | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.linger_s = linger_ms / 1000.0
        self.compression = compression
        self.max_block_s = max_block_ms / 1000.0
        self.sequences = sequences
        self.queues: dict[TopicPartition, PartitionQueue] = {}
        self._topics: dict[str, _Topic] = {}
        self._round_robin = itertools.count()
        self.buffered = 0
        self.pending = 0
        """Batches created and not completed."""
        self.flushing = 0
        self.closed = False
        self.txn_added: set[TopicPartition] | None = None
        """A transactional producer's partitions added to the current transaction (None: not
        transactional). Only their batches are drained."""
        self.txn_pending: set[TopicPartition] = set()
        """Partitions with batches that are not in the transaction yet (AddPartitionsToTxn due)."""

    def make_transactional(self) -> None:
        """Batches carry the transactional attribute and wait for their partition to be
        added to the transaction (see ``txn_added``)."""
        with self.lock:
            self.txn_added = set()

    def _note_partition(self, tp: TopicPartition) -> None:
        added = self.txn_added
        if added is not None and tp not in added:
            self.txn_pending.add(tp)

    # --- appending (caller threads) ----------------------------------------------------

    def append(
        self,
        topic: str,
        partition: int | None,
        partitions: Sequence[int],
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        size_bound: int,
    ) -> FutureRecordMetadata:
        """Add one record to ``partition`` (None: the topic's sticky partition among ``partitions``)."""
        deadline = 0.0
        with self.lock:
            t = self._topics.get(topic)
            if t is None:
                t = self._topics[topic] = _Topic()
            while True:
                p = partition
                if p is None:
                    p = t.sticky
                    if p is None:
                        p = t.sticky = partitions[next(self._round_robin) % len(partitions)]
                q = t.queues.get(p)
                if q is None:
                    q = t.queues[p] = self.queues[TopicPartition(topic, p)] = PartitionQueue(TopicPartition(topic, p))
                b = q.open
                if b is not None:
                    i = b.builder.try_append(timestamp, key, value, headers)  # type: ignore[union-attr]
                    if i is not None:
                        return FutureRecordMetadata(b.result, i, timestamp)
                    self._close(q, b)
                    if partition is None:
                        t.sticky = None
                        continue
                need = size_bound if size_bound > self.batch_size else self.batch_size
                if self.buffered + need > self.buffer_memory and self.buffered > 0:
                    if not deadline:
                        deadline = time.monotonic() + self.max_block_s
                    self._wait_for_memory(deadline)
                    continue
                b = self._new_batch(q, need, time.monotonic())
                b.builder.append(timestamp, key, value, headers)  # type: ignore[union-attr]
                return FutureRecordMetadata(b.result, 0, timestamp)

    def reserve(
        self, topic: str, partition: int | None, partitions: Sequence[int], size: int, deadline: float
    ) -> tuple[TopicPartition, Stamp]:
        """For ``send_batch``: a partition for one encoded batch (the sticky one when
        ``partition`` is None, which then moves on), ``size`` bytes of buffer memory, and
        the stamp to encode the batch with. Close the partition's open batch first."""
        with self.lock:
            while self.buffered + size > self.buffer_memory and self.buffered > 0:
                self._wait_for_memory(deadline)
            t = self._topics.get(topic)
            if t is None:
                t = self._topics[topic] = _Topic()
            p = partition
            if p is None:
                p = t.sticky
                if p is None:
                    p = partitions[next(self._round_robin) % len(partitions)]
                t.sticky = None
            tp = TopicPartition(topic, p)
            q = t.queues.get(p)
            if q is None:
                q = t.queues[p] = self.queues[tp] = PartitionQueue(tp)
            if q.open is not None:
                self._close(q, q.open)
            self.buffered += size
            stamp = self.sequences.predict(tp, q.batches) if self.sequences is not None else NO_STAMP
            return tp, stamp

    def add_encoded(self, tp: TopicPartition, payload: bytes, count: int, reserved: int, stamp: Stamp) -> ProducerBatch:
        """Queue a batch encoded with ``stamp`` after ``reserve`` gave ``reserved`` bytes."""
        with self.lock:
            q = self.queues[tp]
            if q.open is not None:
                self._close(q, q.open)
            b = ProducerBatch(
                tp, time.monotonic(), q.next_order, len(payload), payload=payload, count=count, stamp=stamp, owner=self
            )
            q.next_order += 1
            if self.sequences is not None:
                b.stamp = self.sequences.predict(tp, q.batches)
            self._note_partition(tp)
            self.buffered += len(payload) - reserved
            q.batches.append(b)
            self.pending += 1
            self.cond.notify_all()
            return b

    def release(self, size: int) -> None:
        """Give back a reservation that did not become a batch."""
        with self.lock:
            self.buffered -= size
            self.cond.notify_all()

    def _wait_for_memory(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise KafkaTimeoutError(f"buffer_memory ({self.buffer_memory} bytes) is full and max_block_ms passed")
        self.cond.wait(left)

    def _new_batch(self, q: PartitionQueue, reserve: int, now: float) -> ProducerBatch:
        stamp = self.sequences.predict(q.tp, q.batches) if self.sequences is not None else NO_STAMP
        builder = BatchBuilder(
            self.compression,
            producer_id=stamp[0],
            producer_epoch=stamp[1],
            base_sequence=stamp[2],
            is_transactional=self.txn_added is not None,
            write_limit=self.batch_size,
        )
        self._note_partition(q.tp)
        b = ProducerBatch(q.tp, now, q.next_order, reserve, builder=builder, stamp=stamp, owner=self)
        q.next_order += 1
        q.batches.append(b)
        q.open = b
        self.buffered += reserve
        self.pending += 1
        self.cond.notify_all()  # the sender learns when this batch's linger ends
        return b

    def _close(self, q: PartitionQueue, b: ProducerBatch) -> None:
        """No more records go into ``b`` (full, or taken by the sender)."""
        q.open = None
        size = b.close()
        if size < b.reserved:
            self.buffered -= b.reserved - size
            b.reserved = size
        self.cond.notify_all()

    # --- the sender's side ---------------------------------------------------------------

    def drain(
        self,
        now: float,
        leader_of: Callable[[TopicPartition], str | None],
        requests_in_flight: dict[str, int],
        max_in_flight: int,
        max_request_size: int,
    ) -> tuple[list[tuple[str, list[ProducerBatch]]], float, list[ProducerBatch]]:
        """Requests to send now, how long to sleep otherwise, and the head batches whose
        leader is unknown. Holds the lock.

        A partition's head batch is ready when it is closed, has batches behind it, its
        linger passed, or a flush or close is on, and its retry backoff passed. Each
        request goes to one leader, holds at most one batch per partition and at most
        ``max_request_size`` bytes (one batch always fits); a leader has at most
        ``max_in_flight`` requests in flight, so a partition has at most that many
        batches in flight. A transactional producer's partition is drained only once it
        is in the transaction (``txn_added``). With idempotence a batch is sent for the first time only while
        its partition's window has room (:meth:`Sequences.has_room`), and nothing of a
        partition whose stream is restarting or waiting for a producer id is sent. A
        batch being retried is sent alone, once nothing else of its partition is in
        flight, so retries keep the partition's order (with idempotence). Batches taken
        are closed, marked in flight and, with idempotence, sequenced.
        """
        requests: dict[str, list[list[ProducerBatch]]] = {}
        sizes: dict[str, list[int]] = {}
        no_leader: list[ProducerBatch] = []
        wait = 0.1
        urgent = self.flushing > 0 or self.closed
        linger = self.linger_s
        seqs = self.sequences
        awaiting = seqs.awaiting_producer_id if seqs is not None else None
        restarting = seqs.restarting if seqs is not None else None
        txn_added = self.txn_added
        for q in self.queues.values():
            batches = q.batches
            if not batches or (awaiting and q.tp in awaiting) or (restarting and q.tp in restarting):
                continue
            if txn_added is not None and q.tp not in txn_added:
                continue  # AddPartitionsToTxn first
            taken = 0
            while batches:
                b = batches[0]
                if b.retry_at > now:
                    wait = min(wait, b.retry_at - now)
                    break
                if q.in_flight >= max_in_flight or (b.attempts and q.in_flight):
                    break
                if seqs is not None and not b.sequenced and not seqs.has_room(q.tp, max_in_flight):
                    break
                if not (b.closed or urgent or len(batches) > 1):
                    due = b.created + linger
                    if due > now:
                        wait = min(wait, due - now)
                        break
                addr = leader_of(q.tp)
                if addr is None:
                    no_leader.append(b)
                    break
                reqs = requests.get(addr)
                if reqs is None:
                    reqs = requests[addr] = []
                    sizes[addr] = []
                if taken >= len(reqs):
                    if requests_in_flight.get(addr, 0) + len(reqs) >= max_in_flight:
                        break
                    reqs.append([])
                    sizes[addr].append(0)
                size = b.size
                if reqs[taken] and sizes[addr][taken] + size > max_request_size:
                    break
                batches.popleft()
                if q.open is b:
                    self._close(q, b)
                    t = self._topics[q.tp.topic]
                    if t.sticky == q.tp.partition:
                        t.sticky = None
                reqs[taken].append(b)
                sizes[addr][taken] += size
                q.in_flight += 1
                b.in_flight = True
                taken += 1
                if seqs is not None:
                    if not b.sequenced:
                        seqs.assign(b)
                    seqs.sending(b)
                if b.attempts:
                    break
        out = [(addr, group) for addr, reqs in requests.items() for group in reqs if group]
        return out, wait, no_leader

    def requeue(self, b: ProducerBatch, retry_at: float, in_flight: bool = True) -> None:
        """Put ``b`` back for a retry: ahead of the batches never sent, after the retries created before it."""
        with self.lock:
            q = self.queues[b.tp]
            if in_flight:
                q.in_flight -= 1
                b.in_flight = False
            b.retry_at = retry_at
            batches = q.batches
            i = 0
            for other in batches:
                if not other.attempts or other.order > b.order:
                    break
                i += 1
            batches.insert(i, b)
            self.cond.notify_all()

    def complete(self, b: ProducerBatch, in_flight: bool = True) -> None:
        """``b`` has its outcome: release its memory and its place."""
        with self.lock:
            if in_flight:
                self.complete_locked(b)
            else:
                q = self.queues[b.tp]
                if q.open is b:
                    self._close(q, b)
                try:
                    q.batches.remove(b)
                except ValueError:
                    pass
                self.complete_locked(b, in_flight=False)
            self.cond.notify_all()

    def complete_locked(self, b: ProducerBatch, in_flight: bool = True) -> None:
        """``complete`` with the lock held (the caller notifies). A batch completes once."""
        if b.completed:  # never expected: counted once, whatever a caller does
            log.warning("%r completed twice; the second time is ignored", b)
            return
        b.completed = True
        if in_flight:
            self.queues[b.tp].in_flight -= 1
            b.in_flight = False
        self.buffered -= b.reserved
        self.pending -= 1
        if self.sequences is not None:
            self.sequences.resolved(b)

    def oldest_queued(self) -> float | None:
        """When the oldest batch not in flight was created (None: there is none)."""
        with self.lock:
            heads = [q.batches[0].created for q in self.queues.values() if q.batches]
        return min(heads) if heads else None

    def take_queued(self) -> list[ProducerBatch]:
        """Every batch not in flight (closing): their queues are emptied."""
        with self.lock:
            out = [b for q in self.queues.values() for b in q.batches]
            for q in self.queues.values():
                q.batches.clear()
                q.open = None
            return out
