"""The outcome objects of the producer: one per batch, cheap views per record.

A :class:`ProduceResult` is the outcome of one batch (one event, one lock). ``send``
returns a :class:`FutureRecordMetadata`, three slots pointing at its batch's result;
``send_batch`` returns one :class:`FutureBatchMetadata` over the results of the batches
it made, whose value is a :class:`BatchMetadata` (every record's partition and offset,
computed on demand from each batch's base offset).

KIP-467: when a broker refuses a batch for some of its records (INVALID_RECORD with
record errors, e.g. records without a key on a compacted topic), the whole batch fails,
and each record's future says which part it played, as Kafka's Java producer does: a
refused record raises :class:`~kclient.errors.InvalidRecordError` with the broker's
message for it, the others one saying that they were not written because of the
batch's invalid records; both carry ``record_errors`` (every refused record's batch
index and message). ``send_batch``'s future raises one InvalidRecordError whose
``record_errors`` are positions in the call's input.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

from kclient.errors import InvalidRecordError, KafkaTimeoutError
from kclient.structs import RecordMetadata

log = logging.getLogger(__name__)

Callback = tuple[Callable[..., Any], tuple[Any, ...], bool]
"""(function, leading arguments, on_success)."""

_completing = threading.local()
"""Per thread: the owners (producers' accumulators) whose batches' callbacks are running
on it, innermost last (a callback may complete other batches, whose callbacks nest)."""


def in_send_callback(owner: object) -> bool:
    """Is a callback of ``owner``'s batches running on this thread, one of the producer's
    own? There ``flush()`` would wait for the callback's own batch, and ``close()`` must not
    wait for the thread it runs on. (Callbacks registered after completion run on the
    caller's thread, which is not the producer's: they do not count.)"""
    return owner in getattr(_completing, "owners", ())


class ProduceResult:
    """The outcome of one batch of ``topic``-``partition``, shared by its records' futures.

    Set once (``done``); later calls are ignored, so a batch failed by ``close`` keeps
    that outcome. Callbacks registered before completion run on the thread that completes
    the batch, after the outcome is set, marked as ``owner``'s (see ``in_send_callback``);
    those registered later run at once on the caller's thread. Thread safety: any thread.
    """

    __slots__ = (
        "_callbacks", "_event", "_lock", "base_offset", "error", "log_append_time", "owner", "partition", "topic",
    )  # fmt: skip

    def __init__(self, topic: str, partition: int, owner: object = None) -> None:
        self.topic = topic
        self.partition = partition
        self.owner = owner
        self._event = threading.Event()
        self._lock = threading.Lock()
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        self._callbacks: list[tuple[Any, Callback]] | None = None

    def done(self, base_offset: int, log_append_time: int, error: BaseException | None) -> bool:
        """Set the outcome; False if it was already set."""
        with self._lock:
            if self._event.is_set():
                return False
            self.base_offset, self.log_append_time, self.error = base_offset, log_append_time, error
            self._event.set()
            callbacks, self._callbacks = self._callbacks or [], None
        if callbacks:
            owners: list[object] | None = getattr(_completing, "owners", None)
            if owners is None:
                owners = _completing.owners = []
            owners.append(self.owner)
            try:
                for fut, cb in callbacks:
                    fut._call(cb)
            finally:
                owners.pop()
        return True

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)

    @property
    def is_done(self) -> bool:
        return self._event.is_set()

    def add_callback(self, fut: Any, cb: Callback) -> None:
        """Run ``fut._call(cb)`` once the outcome is set (at once if it is)."""
        with self._lock:
            if not self._event.is_set():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append((fut, cb))
                return
        fut._call(cb)


BATCH_HAD_INVALID_RECORDS = "the record was not written: its batch had invalid records"
"""The error message of a valid record failed with its batch (KIP-467)."""


def record_error(err: BaseException | None, index: int) -> BaseException | None:
    """The error of the record at ``index`` of a batch that failed with ``err``: its own
    message when the broker named it (KIP-467), else ``err`` itself."""
    if not isinstance(err, InvalidRecordError) or not err.record_errors:
        return err
    mine = [m for i, m in err.record_errors if i == index]
    if mine:
        return InvalidRecordError(f"record {index} of its batch: {mine[0]}", err.record_errors)
    refused = ", ".join(str(i) for i, _ in err.record_errors)
    return InvalidRecordError(f"{BATCH_HAD_INVALID_RECORDS} ({refused}): {err.message}", err.record_errors)


def _run_callback(cb: Callback, value: Any, err: BaseException | None) -> None:
    fn, args, on_success = cb
    try:
        if on_success and err is None:
            fn(*args, value)
        elif not on_success and err is not None:
            fn(*args, err)
    except Exception:
        log.exception("producer callback failed")


class FutureRecordMetadata:
    """The outcome of one ``send`` (kafka-python's ``FutureRecordMetadata``).

    ``get(timeout)`` returns :class:`RecordMetadata` or raises the delivery error;
    ``add_callback(fn, *args)`` / ``add_errback(fn, *args)`` run on the client's network
    thread when the batch completes (at once if it already has). A view: its batch's
    :class:`ProduceResult`, the record's index in the batch and its timestamp.
    """

    __slots__ = ("_index", "_result", "_timestamp")

    def __init__(self, result: ProduceResult, index: int, timestamp: int) -> None:
        self._result = result
        self._index = index
        self._timestamp = timestamp

    def _value(self) -> RecordMetadata:
        r = self._result
        offset = r.base_offset + self._index if r.base_offset >= 0 else -1
        ts = r.log_append_time if r.log_append_time > 0 else self._timestamp
        return RecordMetadata(r.topic, r.partition, offset, ts)

    def _error(self) -> BaseException | None:
        return record_error(self._result.error, self._index)

    def get(self, timeout: float | None = None) -> RecordMetadata:
        if not self._result.wait(timeout):
            raise KafkaTimeoutError(f"record not acknowledged within {timeout}s")
        err = self._error()
        if err is not None:
            raise err
        return self._value()

    result = get

    def is_done(self) -> bool:
        return self._result.is_done

    done = is_done

    def succeeded(self) -> bool:
        return self._result.is_done and self._result.error is None

    def failed(self) -> bool:
        return self._result.is_done and self._result.error is not None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._result.wait(timeout):
            raise KafkaTimeoutError(f"record not acknowledged within {timeout}s")
        return self._error()

    def add_callback(self, fn: Callable[..., Any], *args: Any) -> FutureRecordMetadata:
        """``fn(*args, record_metadata)`` on success."""
        self._result.add_callback(self, (fn, args, True))
        return self

    def add_errback(self, fn: Callable[..., Any], *args: Any) -> FutureRecordMetadata:
        """``fn(*args, exception)`` on failure."""
        self._result.add_callback(self, (fn, args, False))
        return self

    def _call(self, cb: Callback) -> None:
        err = self._error()
        _run_callback(cb, None if err is not None else self._value(), err)


class Run:
    """Records of one ``send_batch`` call that went into one batch.

    ``indices`` are their positions in the call's input (a ``range`` when contiguous),
    in batch order; ``timestamps`` theirs (None: every record has ``timestamp``).
    """

    __slots__ = ("indices", "result", "timestamp", "timestamps")

    def __init__(
        self, result: ProduceResult, indices: Sequence[int], timestamp: int, timestamps: Sequence[int] | None
    ) -> None:
        self.result = result
        self.indices = indices
        self.timestamp = timestamp
        self.timestamps = timestamps


class BatchMetadata(Sequence[RecordMetadata]):
    """Where every record of one ``send_batch`` call landed; item ``i`` is input record ``i``.

    ``partitions`` and ``offsets`` are whole columns (lists, one entry per input record),
    built on first use; indexing builds one :class:`RecordMetadata`. Offsets are -1 with
    acks=0. Immutable once made.
    """

    def __init__(self, topic: str, count: int, runs: Sequence[Run]) -> None:
        self.topic = topic
        self._count = count
        self._runs = runs
        self._partitions: list[int] | None = None
        self._offsets: list[int] | None = None
        self._timestamps: list[int] | None = None

    def __len__(self) -> int:
        return self._count

    def _columns(self) -> None:
        n = self._count
        parts = [-1] * n
        offsets = [-1] * n
        stamps = [-1] * n
        for run in self._runs:
            r = run.result
            idx = run.indices
            k = len(idx)
            base = r.base_offset
            if type(idx) is range and idx.step == 1:
                a, b = idx.start, idx.stop
                parts[a:b] = [r.partition] * k
                offsets[a:b] = range(base, base + k) if base >= 0 else [-1] * k
                if r.log_append_time > 0:
                    stamps[a:b] = [r.log_append_time] * k
                elif run.timestamps is None:
                    stamps[a:b] = [run.timestamp] * k
                else:
                    stamps[a:b] = run.timestamps
                continue
            for j, i in enumerate(idx):
                parts[i] = r.partition
                offsets[i] = base + j if base >= 0 else -1
                if r.log_append_time > 0:
                    stamps[i] = r.log_append_time
                else:
                    stamps[i] = run.timestamp if run.timestamps is None else run.timestamps[j]
        self._partitions, self._offsets, self._timestamps = parts, offsets, stamps

    @property
    def partitions(self) -> list[int]:
        if self._partitions is None:
            self._columns()
        assert self._partitions is not None
        return self._partitions

    @property
    def offsets(self) -> list[int]:
        if self._offsets is None:
            self._columns()
        assert self._offsets is not None
        return self._offsets

    @property
    def timestamps(self) -> list[int]:
        if self._timestamps is None:
            self._columns()
        assert self._timestamps is not None
        return self._timestamps

    @property
    def runs(self) -> list[tuple[int, int, int]]:
        """(partition, base offset, record count) of each batch, in the order they were made."""
        return [(r.result.partition, r.result.base_offset, len(r.indices)) for r in self._runs]

    @overload
    def __getitem__(self, i: int) -> RecordMetadata: ...

    @overload
    def __getitem__(self, i: slice) -> list[RecordMetadata]: ...

    def __getitem__(self, i: int | slice) -> RecordMetadata | list[RecordMetadata]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError("record index out of range")
        return RecordMetadata(self.topic, self.partitions[i], self.offsets[i], self.timestamps[i])

    def __iter__(self) -> Iterator[RecordMetadata]:
        topic = self.topic
        for p, o, t in zip(self.partitions, self.offsets, self.timestamps, strict=True):
            yield RecordMetadata(topic, p, o, t)

    def __repr__(self) -> str:
        return f"BatchMetadata(topic={self.topic!r}, records={self._count}, runs={self.runs})"


class FutureBatchMetadata:
    """The outcome of one ``send_batch``: every record's partition and offset.

    ``get(timeout)`` returns a :class:`BatchMetadata` once every batch the call made is
    acknowledged, or raises the first failure in input order (records of the call's other
    batches may have been written then, as with separate ``send`` calls). Callbacks as
    :class:`FutureRecordMetadata`'s: ``fn(*args, batch_metadata)`` / ``fn(*args, exc)``,
    once, after the last batch completes.
    """

    __slots__ = ("_callbacks", "_left", "_lock", "_runs", "_topic", "count")

    def __init__(self, topic: str, count: int, runs: list[Run]) -> None:
        self._topic = topic
        self.count = count
        self._runs = runs
        self._lock = threading.Lock()
        self._left = len(runs)
        self._callbacks: list[Callback] = []

    def _first_error(self) -> BaseException | None:
        failed = [r for r in self._runs if r.result.error is not None]
        if not failed:
            return None
        first = min(failed, key=lambda r: r.indices[0] if r.indices else 0)
        err = first.result.error
        if isinstance(err, InvalidRecordError) and err.record_errors:
            # KIP-467: batch indexes -> positions in the call's input (one run per batch)
            idx = first.indices
            mapped = [(idx[i] if 0 <= i < len(idx) else i, m) for i, m in err.record_errors]
            return InvalidRecordError(err.message, mapped)
        return err

    def _wait(self, timeout: float | None) -> None:
        if timeout is None:
            for r in self._runs:
                r.result.wait(None)
            return
        deadline = time.monotonic() + timeout
        for r in self._runs:
            if not r.result.wait(max(deadline - time.monotonic(), 0.0)):
                raise KafkaTimeoutError(f"records not acknowledged within {timeout}s")

    def get(self, timeout: float | None = None) -> BatchMetadata:
        self._wait(timeout)
        err = self._first_error()
        if err is not None:
            raise err
        return BatchMetadata(self._topic, self.count, self._runs)

    result = get

    def is_done(self) -> bool:
        return all(r.result.is_done for r in self._runs)

    done = is_done

    def succeeded(self) -> bool:
        return self.is_done() and self._first_error() is None

    def failed(self) -> bool:
        return self.is_done() and self._first_error() is not None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._first_error()

    def add_callback(self, fn: Callable[..., Any], *args: Any) -> FutureBatchMetadata:
        """``fn(*args, batch_metadata)`` once every record is acknowledged."""
        return self._add((fn, args, True))

    def add_errback(self, fn: Callable[..., Any], *args: Any) -> FutureBatchMetadata:
        """``fn(*args, exception)`` if any record failed (once, the first failure)."""
        return self._add((fn, args, False))

    def _add(self, cb: Callback) -> FutureBatchMetadata:
        with self._lock:
            first = not self._callbacks and self._left > 0
            if self._left > 0:
                self._callbacks.append(cb)
                cb = None  # type: ignore[assignment]
        if first:
            for r in self._runs:
                r.result.add_callback(self, (_noop, (), True))
        if cb is not None:
            self._call_one(cb)
        return self

    def _call(self, _cb: Callback) -> None:
        """One of the batches completed; the callbacks run after the last."""
        with self._lock:
            self._left -= 1
            if self._left > 0:
                return
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            self._call_one(cb)

    def _call_one(self, cb: Callback) -> None:
        err = self._first_error()
        _run_callback(cb, None if err is not None else BatchMetadata(self._topic, self.count, self._runs), err)


def _noop(*_args: Any) -> None:
    return None
