"""One batch of one partition, from its first record to its outcome (Kafka's ``ProducerBatch``).

A batch is **open** while ``send`` appends to its :class:`~kclient.records.BatchBuilder`
(filled by exact encoded size against ``batch_size``, as Kafka's
``MemoryRecordsBuilder.hasRoomFor``), then **closed** (no more records), then sent,
possibly several times, until its :class:`ProduceResult` is set. ``send_batch`` makes
batches that are closed from the start (``payload`` already encoded).

Idempotence: ``stamp`` is the (producer id, epoch, base sequence) the batch must carry
when sent; ``built_stamp`` the one its bytes carry. They differ only after the
partition's sequence stream restarted (a failure); :meth:`payload` then rewrites the
three header fields and the CRC in place: the records are not re-encoded.

``maybe_written`` is the stamp of a send whose outcome is unknown (the answer was lost:
a failed call, REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND). Such a batch may
be in the log under that stamp, so it is only ever resent with that same stamp (the
leader then recognises it as a duplicate); if its stream restarts it fails instead.

Thread safety: the accumulator's lock guards the open/closed state and the stamp;
after it is closed, a batch is touched by one thread at a time (the sender, then the
thread that completes it).
"""

from __future__ import annotations

from kclient.producer.futures import ProduceResult
from kclient.records import HEADER_SIZE, NO_PRODUCER_ID, NO_SEQUENCE, BatchBuilder, assemble_batch, read_header
from kclient.structs import TopicPartition

Stamp = tuple[int, int, int]
"""(producer id, producer epoch, base sequence)."""

NO_STAMP: Stamp = (NO_PRODUCER_ID, -1, NO_SEQUENCE)


def restamp(payload: bytes, stamp: Stamp) -> bytes:
    """``payload`` (one built batch) with other producer fields, CRC recomputed (they lie inside it)."""
    producer_id, producer_epoch, base_sequence = stamp
    header = read_header(payload)._replace(
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence
    )
    with memoryview(payload) as view:
        return assemble_batch(header, view[HEADER_SIZE:])


class ProducerBatch:
    """See the module docstring. ``order`` numbers the batches of a partition in creation order."""

    __slots__ = (
        "_payload",
        "attempts",
        "builder",
        "built_stamp",
        "closed",
        "completed",
        "count",
        "created",
        "in_flight",
        "maybe_written",
        "order",
        "reserved",
        "result",
        "retry_at",
        "sent_first",
        "sent_stamp",
        "sequenced",
        "stamp",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        created: float,
        order: int,
        reserved: int,
        *,
        builder: BatchBuilder | None = None,
        payload: bytes | None = None,
        count: int = 0,
        stamp: Stamp = NO_STAMP,
        owner: object = None,
    ) -> None:
        self.tp = tp
        self.created = created
        self.order = order
        self.reserved = reserved
        """Bytes of buffer_memory this batch holds until it completes."""
        self.builder = builder
        self._payload = payload
        self.count = count
        self.closed = payload is not None
        self.result = ProduceResult(tp.topic, tp.partition, owner)
        self.attempts = 0
        self.retry_at = 0.0
        self.stamp = stamp
        self.built_stamp = stamp
        self.sent_stamp = stamp
        """The stamp of the last send (what a broker's sequence error refers to)."""
        self.sequenced = False
        """Given its place in the partition's sequence stream (at its first send)."""
        self.sent_first = False
        """Every batch ahead of it in its stream was resolved when it was last sent: a
        leader's sequence error about that send cannot predate a write ahead of it."""
        self.in_flight = False
        """A request carrying it is waiting for its answer."""
        self.maybe_written: Stamp | None = None
        """The stamp of a send whose outcome is unknown (see the module docstring)."""
        self.completed = False
        """Its outcome is set (acknowledged or failed)."""

    def close(self) -> int:
        """No more records; returns the batch's exact size in bytes (uncompressed)."""
        self.closed = True
        if self.builder is not None:
            self.count = self.builder.record_count
            return self.builder.size_in_bytes()
        return len(self._payload or b"")

    def payload(self) -> bytes:
        """The bytes to send, carrying ``stamp``. Only once the batch is closed."""
        if self._payload is None:
            assert self.builder is not None and self.closed
            self._payload = self.builder.build()
            self.builder = None
        if self.built_stamp != self.stamp:
            self._payload = restamp(self._payload, self.stamp)
            self.built_stamp = self.stamp
        self.sent_stamp = self.stamp
        return self._payload

    @property
    def size(self) -> int:
        if self._payload is not None:
            return len(self._payload)
        assert self.builder is not None
        return self.builder.size_in_bytes()

    def fail(self, exc: BaseException) -> None:
        self.result.done(-1, -1, exc)

    def succeed(self, base_offset: int, log_append_time: int) -> None:
        self.result.done(base_offset, log_append_time, None)

    def __repr__(self) -> str:
        return (
            f"ProducerBatch({self.tp.topic}-{self.tp.partition} #{self.order}, {self.count} records, "
            f"stamp={self.stamp}, attempts={self.attempts})"
        )
