"""Idempotence (KIP-98, KIP-360): the producer id and epoch, one sequence stream per partition.

Before its first batch the producer gets a producer id and epoch (InitProducerId).
Each partition's stream numbers its records: a batch gets its base sequence at its
first send (``assign``), in the partition's queue order, and keeps it across retries,
so a leader recognises a retry of a batch it already wrote (DUPLICATE_SEQUENCE_NUMBER,
answered with the original offsets) and refuses a batch that skips ahead
(OUT_OF_ORDER_SEQUENCE_NUMBER).

**The window.** A leader remembers the last 5 batches of each producer and partition, so
a retry is recognised only while at most 4 batches of its stream were written after it.
``window`` holds the batches sent in the stream from the oldest unresolved one on, in
sequence order, including those resolved after it (answers arrive in any order); a batch
is sent for the first time only while the window holds fewer than
``max_in_flight_requests_per_connection`` (at most 5) batches (``has_room``). A batch
answered early keeps its place until every batch ahead of it is resolved, so the window
never slides past an unresolved batch, which therefore stays recognisable.

Requests of one partition may be served in any order (gRPC serves calls concurrently),
and a leader that does not know the producer id accepts any first sequence (KIP-360). So
until a batch of the stream is acknowledged by its current leader (``confirmed``), and
again after any of its batches needs a retry (``unconfirm``: the leader may have changed,
or lost the producer), one batch of the partition is in flight at a time: a second one
could otherwise be written ahead of the first.

A batch created by ``send`` is stamped at creation with the stamp it will most likely
get (``predict``: the stream's next sequence plus the records of the batches queued
before it); ``assign`` corrects it in the rare case it changed.

**Restarts.** When a sent batch fails for good, the stream has a hole, so it restarts:
sequence 0 in a new epoch that the producer bumps itself, as Kafka 2.5+ does (the
producer id is ours alone; once the 16-bit epoch runs out a new producer id is fetched
for the partition). ``request_restart`` marks the partition; nothing of it is sent until
none of its batches is in flight, then ``restart`` renumbers its unresolved batches from
0 in their order. A batch that may already be in the log under its old stamp
(``ProducerBatch.maybe_written``) cannot be renumbered without risking a duplicate: it is
dropped from the stream and returned, and the caller fails it. The leader fences the
old epoch, so a late write of an old-epoch batch is refused (INVALID_PRODUCER_EPOCH).

Thread safety: none; the accumulator calls it under its lock (``fetch_producer_id``
excepted, which takes no lock).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable

from kclient.errors import KafkaError, KafkaTimeoutError, for_code
from kclient.producer.batch import ProducerBatch, Stamp
from kclient.proto.kbroker.v1 import cluster_pb2
from kclient.records import NO_PRODUCER_ID
from kclient.structs import TopicPartition

SEQUENCE_SPACE = 2**31
"""Sequences wrap from 2**31 - 1 to 0."""
MAX_EPOCH = 2**15 - 1
MAX_IN_FLIGHT = 5
"""Batches per producer and partition a leader remembers (NUM_BATCHES_TO_RETAIN)."""


def fetch_producer_id(call_any: Callable[[str, object], object], deadline: float, backoff_s: float) -> tuple[int, int]:
    """InitProducerId on any broker, retrying retriable errors until ``deadline``."""
    while True:
        try:
            resp: cluster_pb2.InitProducerIdResponse = call_any(  # type: ignore[assignment]
                "InitProducerId", cluster_pb2.InitProducerIdRequest()
            )
            if not resp.error_code:
                pid, epoch = int(resp.producer_id), int(resp.producer_epoch)
                if pid < 0 or not 0 <= epoch <= MAX_EPOCH:
                    raise KafkaError(f"InitProducerId returned an invalid producer id {pid} / epoch {epoch}")
                return pid, epoch
            err: KafkaError = for_code(resp.error_code)(resp.error_message)
        except KafkaError as exc:
            err = exc
        if not err.retriable:
            raise err
        if time.monotonic() + backoff_s >= deadline:
            raise KafkaTimeoutError(f"could not get a producer id (InitProducerId): {err}") from err
        time.sleep(backoff_s)


class PartitionSequence:
    """The sequence stream of one partition."""

    __slots__ = ("confirmed", "epoch", "next_seq", "producer_id", "window")

    def __init__(self, producer_id: int, epoch: int) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.next_seq = 0
        """Base sequence of the next batch sent for the first time."""
        self.window: deque[ProducerBatch] = deque()
        """Batches sent in this stream from the oldest unresolved one on (see the module docstring)."""
        self.confirmed = False
        """The leader acknowledged a batch of this stream, and none needed a retry since."""


class Sequences:
    """Producer id, epoch and the partitions' streams (see the module docstring)."""

    def __init__(self) -> None:
        self.producer_id = NO_PRODUCER_ID
        self.epoch = -1
        self.needs_producer_id = True
        self.streams: dict[TopicPartition, PartitionSequence] = {}
        self.awaiting_producer_id: set[TopicPartition] = set()
        """Partitions whose epoch ran out: nothing of theirs is sent until a new id comes."""
        self.restarting: set[TopicPartition] = set()
        """Partitions whose stream restarts once none of their batches is in flight."""

    def set_producer_id(self, producer_id: int, epoch: int) -> None:
        self.producer_id, self.epoch = producer_id, epoch
        self.needs_producer_id = False

    def stream(self, tp: TopicPartition) -> PartitionSequence:
        s = self.streams.get(tp)
        if s is None:
            s = self.streams[tp] = PartitionSequence(self.producer_id, self.epoch)
        return s

    def predict(self, tp: TopicPartition, queued: Iterable[ProducerBatch]) -> Stamp:
        """The stamp a batch created now behind ``queued`` (the partition's unsent batches) will get."""
        s = self.stream(tp)
        seq = s.next_seq
        for b in queued:
            if not b.sequenced:
                seq += b.count if b.closed else (b.builder.record_count if b.builder is not None else 0)
        return s.producer_id, s.epoch, seq % SEQUENCE_SPACE

    def has_room(self, tp: TopicPartition, max_in_flight: int) -> bool:
        """May a batch of ``tp`` be sent for the first time now (the window is not full)?"""
        s = self.streams.get(tp)
        return s is None or len(s.window) < (max_in_flight if s.confirmed else 1)

    def acknowledged(self, b: ProducerBatch) -> None:
        """The leader acknowledged ``b``: it knows the stream (see the module docstring)."""
        s = self.streams.get(b.tp)
        if s is not None and b.sent_stamp[:2] == (s.producer_id, s.epoch):
            s.confirmed = True

    def unconfirm(self, tp: TopicPartition) -> None:
        """A batch of ``tp`` needs a retry: one batch in flight until the next acknowledgement."""
        s = self.streams.get(tp)
        if s is not None:
            s.confirmed = False

    def assign(self, b: ProducerBatch) -> None:
        """Give a batch sent for the first time its place in the stream."""
        s = self.stream(b.tp)
        b.stamp = (s.producer_id, s.epoch, s.next_seq)
        b.sequenced = True
        s.next_seq = (s.next_seq + b.count) % SEQUENCE_SPACE
        s.window.append(b)

    def resolved(self, b: ProducerBatch) -> None:
        """``b`` completed (acknowledged or failed): the window slides past the resolved head."""
        s = self.streams.get(b.tp)
        if s is not None:
            w = s.window
            while w and w[0].completed:
                w.popleft()

    def sending(self, b: ProducerBatch) -> None:
        """``b`` (sequenced) goes out now: note whether a batch ahead of it is unresolved."""
        b.sent_first = self.is_first_unresolved(b)

    def is_first_unresolved(self, b: ProducerBatch) -> bool:
        s = self.streams.get(b.tp)
        return s is not None and bool(s.window) and s.window[0] is b

    def is_stale(self, b: ProducerBatch) -> bool:
        """``b`` was last sent with another producer id or epoch than its stream has now:
        a sequence error about it refers to the old stream and is no gap."""
        s = self.streams.get(b.tp)
        return s is not None and b.sent_stamp[:2] != (s.producer_id, s.epoch)

    def request_restart(self, tp: TopicPartition) -> None:
        """Restart ``tp``'s stream once none of its batches is in flight (see ``restart``)."""
        self.restarting.add(tp)

    def restart(self, tp: TopicPartition) -> list[ProducerBatch]:
        """Restart ``tp``'s stream at 0 in a new epoch (or under a new producer id once the
        epoch is exhausted), renumbering its unresolved batches in order. None of them may be
        in flight. Returns the batches that may be in the log under their old stamp: they
        leave the stream, and the caller fails them."""
        self.restarting.discard(tp)
        s = self.stream(tp)
        if 0 <= s.epoch < MAX_EPOCH and s.producer_id != NO_PRODUCER_ID:
            s.epoch += 1
        else:
            s.producer_id, s.epoch = NO_PRODUCER_ID, -1
            self.awaiting_producer_id.add(tp)
        s.next_seq = 0
        s.confirmed = False
        return self._renumber(s)

    def renew(self, producer_id: int, epoch: int) -> list[ProducerBatch]:
        """A new producer id for the partitions that were waiting for one; returns the
        batches that cannot be renumbered (as ``restart``)."""
        self.producer_id, self.epoch = producer_id, epoch
        dropped: list[ProducerBatch] = []
        for tp in self.awaiting_producer_id:
            s = self.stream(tp)
            s.producer_id, s.epoch, s.next_seq = producer_id, epoch, 0
            s.confirmed = False
            dropped += self._renumber(s)
        self.awaiting_producer_id.clear()
        return dropped

    @staticmethod
    def _renumber(s: PartitionSequence) -> list[ProducerBatch]:
        dropped: list[ProducerBatch] = []
        window: deque[ProducerBatch] = deque()
        for b in s.window:
            if b.completed:
                continue
            if b.maybe_written is not None:
                dropped.append(b)
                continue
            b.stamp = (s.producer_id, s.epoch, s.next_seq)
            s.next_seq = (s.next_seq + b.count) % SEQUENCE_SPACE
            window.append(b)
        s.window = window
        return dropped
