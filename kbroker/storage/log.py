"""One partition's log: a directory of segments (Kafka's UnifiedLog + LocalLog)."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from kbroker.storage import files
from kbroker.storage.leader_epoch import LeaderEpochCache
from kbroker.storage.loader import load_log
from kbroker.storage.log_config import LogConfig
from kbroker.storage.producer_state import CompletedTxn, ProducerStateManager
from kbroker.storage.segment import AppendUndoError, LogSegment
from kbroker.storage.txn_index import AbortedTxn
from kbroker.storage.validator import (
    BatchSummary,
    recompress,
    stamp_headers,
    summarize,
    validate_batches,
)
from kclient.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    KafkaError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
)
from kclient.records import build_control_batch, control_type

logger = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
"""ListOffsets: the log start offset."""
LATEST_TIMESTAMP = -1
"""ListOffsets: the log end offset."""


class LogAppendInfo(NamedTuple):
    """The outcome of an append."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    """Largest batch max timestamp appended, -1 if none."""
    offset_of_max_timestamp: int
    """Last offset of the batch holding ``max_timestamp``, -1 if none."""
    num_records: int
    """Records appended (0 for a duplicate)."""
    valid_bytes: int
    """Bytes appended (0 for a duplicate)."""
    log_append_time: int = -1
    """The time the leader stamped on the batches (LogAppendTime topics), else -1."""


class FetchDataInfo(NamedTuple):
    """The result of a read: whole record batches and where they came from."""

    records: bytes
    """Raw batch bytes (possibly empty), starting with the batch holding ``fetch_offset``."""
    fetch_offset: int
    """The offset asked for."""
    first_offset: int
    """Base offset of the first batch returned (may be < fetch_offset), -1 if none."""
    next_offset: int
    """Offset after the last batch returned: where the next read continues."""
    log_start_offset: int
    log_end_offset: int
    """The log's offsets when the read began."""
    segment_base_offset: int
    """Base offset of the segment read, -1 if none."""
    position: int
    """File position of the first batch returned (or of the end of the log), -1 if none."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@contextmanager
def _storage_errors(what: str) -> Iterator[None]:
    """Turn OSError into KafkaStorageError (the log directory has an I/O problem)."""
    try:
        yield
    except OSError as exc:
        raise KafkaStorageError(f"I/O error while {what}: {exc}") from exc


class Log:
    """The log of one partition: segments in a directory, offsets, retention, recovery.

    Files: ``<dir>/`` holds segments (see :class:`LogSegment`),
    ``leader-epoch-checkpoint`` (see :class:`LeaderEpochCache`) and ``<offset>.snapshot``
    files of the idempotent-producer state (see :class:`ProducerStateManager`).

    Invariants:

    - ``log_start_offset <= log_end_offset``; offsets below the start are gone to
      readers even if their segment still exists;
    - segments are sorted by base offset, do not overlap, and only the last one
      (the active segment) is appended to; it is never deleted by retention;
    - ``recovery_point <= log_end_offset``: everything below it has been fsynced;
    - every batch in the log passed validation (CRC included) when it was appended;
    - the producer state describes exactly the producer batches in
      [log_start_offset, log_end_offset): it is updated with every append, evicts
      producers left below the log start and is rebuilt after a truncation. A leader
      append never writes a batch with a producer id twice (see :meth:`append_as_leader`);
    - an append is all or nothing: a failed write (a full disk, a short write) is cut
      back and the log end offset does not move. When I/O fails in a way that cannot
      be undone (the cut-back, an fsync, a truncation), the log goes :attr:`offline`:
      every later append, read and flush raises KafkaStorageError, nothing more is
      written, and the next start recovers the files (Kafka takes the log directory
      offline on an IOException).

    Thread safety: the log owns one lock (``RLock``) around every change and every
    snapshot of the segment list. Reads snapshot the segments and their sizes under
    it and ``pread`` outside it. Flushes fsync outside it, serialised by a second
    lock that is always taken before the first. Segments removed from the log keep
    their files open as ``.deleted`` for ``file.delete.delay.ms`` so that reads in
    flight still succeed.
    """

    def __init__(
        self,
        dir: Path,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        recovery_point: int,
        epoch_cache: LeaderEpochCache,
        producer_state: ProducerStateManager | None = None,
    ) -> None:
        if not segments:
            raise ValueError("a log needs at least one segment")
        if producer_state is None:
            producer_state = ProducerStateManager(dir)
            producer_state.load(segments, log_start_offset, segments[-1].next_offset)
        self._dir = dir
        self._config = config
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._next_offset = segments[-1].next_offset
        self._log_start_offset = log_start_offset
        self._recovery_point = recovery_point
        self._epoch_cache = epoch_cache
        self._producer_state = producer_state
        self._last_flush_ms = _now_ms()
        self._roll_flush_offset = -1
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self._closed = False
        self._offline_reason: str | None = None
        self._truncated_to: int | None = None
        self.cleaner_upper_bound: Callable[[], int] | None = None
        """The log cleaner never cleans at or above the offset this returns: the replica
        layer sets it to the partition's high watermark. None: no bound but the active
        segment (a log that is not replicated)."""

    @classmethod
    def open(
        cls,
        dir: Path,
        config: LogConfig,
        *,
        recovery_point: int = 0,
        log_start_offset: int | None = None,
        clean_shutdown: bool = False,
    ) -> Log:
        """Open the log in ``dir``, creating the directory if needed.

        Without ``clean_shutdown`` every segment from the one holding
        ``recovery_point`` is validated batch by batch, and a torn or corrupt tail
        is cut at the last valid batch (later segments are deleted). Indexes that
        are missing or corrupt are rebuilt. Leftover temporary files are removed.
        """
        with _storage_errors(f"loading log {dir}"):
            loaded = load_log(
                dir,
                config,
                recovery_point=recovery_point,
                log_start_offset=log_start_offset,
                clean_shutdown=clean_shutdown,
                now_ms=_now_ms(),
            )
        return cls(
            dir,
            config,
            loaded.segments,
            log_start_offset=loaded.log_start_offset,
            recovery_point=loaded.recovery_point,
            epoch_cache=loaded.epoch_cache,
            producer_state=loaded.producer_state,
        )

    # ------------------------------------------------------------------ properties

    @property
    def dir(self) -> Path:
        return self._dir

    @property
    def name(self) -> str:
        return self._dir.name

    @property
    def config(self) -> LogConfig:
        return self._config

    def update_config(self, config: LogConfig) -> None:
        """Use ``config`` from now on (index sizes apply to new segments)."""
        with self._lock:
            self._config = config
            for segment in self._segments:
                segment.index_interval_bytes = config.index_interval_bytes

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._next_offset

    @property
    def recovery_point(self) -> int:
        """Every offset below this has been fsynced."""
        return self._recovery_point

    @property
    def size_in_bytes(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    @property
    def num_segments(self) -> int:
        return len(self._segments)

    @property
    def segments(self) -> list[LogSegment]:
        """A snapshot of the segments, oldest first (do not modify them)."""
        with self._lock:
            return list(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def leader_epoch_cache(self) -> LeaderEpochCache:
        return self._epoch_cache

    @property
    def producer_state(self) -> ProducerStateManager:
        """The idempotent-producer state (changes under the log lock)."""
        return self._producer_state

    @property
    def latest_epoch(self) -> int:
        return self._epoch_cache.latest_epoch

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def offline(self) -> bool:
        """True once an I/O error left the files in a state this log cannot vouch for."""
        return self._offline_reason is not None

    @property
    def offline_reason(self) -> str | None:
        """Why the log went offline, None while it is online."""
        return self._offline_reason

    def _ensure_open(self) -> None:
        if self._closed:
            raise KafkaStorageError(f"log {self._dir} is closed")
        if self._offline_reason is not None:
            raise KafkaStorageError(f"log {self._dir} is offline: {self._offline_reason}")

    def _go_offline(self, reason: str) -> None:
        """Refuse every later append and read (KafkaStorageError) until a restart recovers
        the files, as Kafka takes a log directory offline on an IOException."""
        with self._lock:
            if self._offline_reason is None:
                self._offline_reason = reason
                logger.error("%s: log taken offline: %s", self.name, reason)

    @contextmanager
    def _offline_on_error(self, what: str) -> Iterator[None]:
        """Like ``_storage_errors``, and the log goes offline: for I/O that cannot be
        undone (an fsync that failed, a truncation half done)."""
        try:
            yield
        except OSError as exc:
            self._go_offline(f"I/O error while {what}: {exc}")
            raise KafkaStorageError(f"I/O error while {what}: {exc}") from exc

    # ------------------------------------------------------------------ appends

    def append_as_leader(
        self, records: bytes | bytearray | memoryview, leader_epoch: int, *, now_ms: int | None = None
    ) -> LogAppendInfo:
        """Validate the batches from a producer, give them offsets and the epoch, append.

        Every batch is checked first (complete batches only, CRC, size within
        max.message.bytes, records matching the header: count, offset deltas, lengths,
        decompressed size; see :func:`validate_batches`); any problem raises
        CorruptRecordError / InvalidRecordError / MessageSizeTooLargeError /
        RecordListTooLargeError and nothing is written. Then, under the log lock, batches with a producer id are
        checked against the producer state (:meth:`ProducerStateManager.check_leader_append`):
        InvalidProducerEpochError / OutOfOrderSequenceNumberError / InvalidRequestError
        write nothing; if every batch is a duplicate of a batch already in the log,
        nothing is written and the result carries the ORIGINAL first and last offsets
        (``num_records`` and ``valid_bytes`` 0), so a retried produce gets the answer of
        the first attempt. Otherwise the batches get consecutive base offsets from the
        log end offset and ``leader_epoch`` (and, for LogAppendTime topics, the
        append time), and are written at once.
        """
        if leader_epoch < 0:
            raise ValueError(f"leader epoch must be >= 0, not {leader_epoch}")
        now = _now_ms() if now_ms is None else now_ms
        config = self._config
        batches = validate_batches(
            records,
            as_leader=True,
            max_message_bytes=config.max_message_bytes,
            require_keys=config.compact_enabled,
        )
        codec = config.codec
        if codec is not None:  # compression.type: the one case where batches are re-encoded
            records, batches = recompress(records, batches, codec, config.max_message_bytes)
        if len(records) > config.segment_bytes:
            raise RecordListTooLargeError(
                f"{len(records)} bytes of batches are more than segment.bytes={config.segment_bytes} of {self.name}"
            )
        append_time = now if config.log_append_time else -1
        with self._lock:
            self._ensure_open()
            latest = self._epoch_cache.latest_epoch
            if leader_epoch < latest:
                raise FencedLeaderEpochError(
                    f"{self.name}: cannot append as leader with epoch {leader_epoch}, "
                    f"the log already has epoch {latest}"
                )
            duplicate = self._producer_state.check_leader_append([h for _, h in batches])
            if duplicate is not None:
                logger.debug(
                    "%s: duplicate producer batch(es), already at offsets %d..%d",
                    self.name,
                    duplicate.first_offset,
                    duplicate.last_offset,
                )
                return LogAppendInfo(duplicate.first_offset, duplicate.last_offset, -1, -1, 0, 0)
            first_offset = self._next_offset
            pieces, stamped = stamp_headers(
                records, batches, first_offset, leader_epoch, append_time if config.log_append_time else None
            )
            summary = summarize(stamped)
            new_epoch = leader_epoch if leader_epoch > latest else None
            self._append_locked(pieces, summary, now, [(new_epoch, first_offset)])
            self._producer_state.update([h for _, h in stamped])
        return LogAppendInfo(
            first_offset,
            summary.last_offset,
            summary.max_timestamp,
            summary.offset_of_max_timestamp,
            summary.num_records,
            len(records),
            append_time,
        )

    def append_as_follower(
        self, records: bytes | bytearray | memoryview, *, now_ms: int | None = None
    ) -> LogAppendInfo:
        """Append batches fetched from the leader, keeping their offsets and epochs.

        The same checks as a leader append (except max.message.bytes, which is the
        leader's business); the first batch must start at the log end offset
        (else OffsetOutOfRangeError) and offsets must increase. New leader
        epochs found in the batches go into the leader-epoch cache, producer batches
        into the producer state (no sequence checks: the leader made them).
        """
        now = _now_ms() if now_ms is None else now_ms
        summary = summarize(validate_batches(records, as_leader=False, max_message_bytes=None))
        with self._lock:
            self._ensure_open()
            first_offset = summary.first_offset
            # A compacted leader log has gaps: the next batch may start after the end.
            if first_offset < self._next_offset:
                raise OffsetOutOfRangeError(
                    f"{self.name}: follower append starts at offset {first_offset} but the log "
                    f"end offset is {self._next_offset}"
                )
            epochs: list[tuple[int | None, int]] = [
                (h.partition_leader_epoch, h.base_offset) for _, h in summary.batches if h.partition_leader_epoch >= 0
            ]
            self._append_locked(records, summary, now, epochs)
            positions = {h.base_offset: pos for pos, h in summary.batches if h.is_control}
            completed = self._producer_state.update(
                [h for _, h in summary.batches], lambda h: control_type(records, positions[h.base_offset])
            )
            self._index_aborted(completed)
        return LogAppendInfo(
            first_offset,
            summary.last_offset,
            summary.max_timestamp,
            summary.offset_of_max_timestamp,
            summary.num_records,
            len(records),
        )

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        *,
        commit: bool,
        coordinator_epoch: int,
        leader_epoch: int,
        now_ms: int | None = None,
    ) -> LogAppendInfo:
        """Append a transaction marker as leader (WriteTxnMarkers): a COMMIT or ABORT
        control batch of ``producer_id``, which closes its open transaction here (an
        ABORT also goes into the active segment's aborted-transaction index).

        Raises InvalidProducerEpochError for an epoch older than the producer's, and
        FencedLeaderEpochError as :meth:`append_as_leader`.
        """
        now = _now_ms() if now_ms is None else now_ms
        with self._lock:
            self._ensure_open()
            latest = self._epoch_cache.latest_epoch
            if leader_epoch < latest:
                raise FencedLeaderEpochError(
                    f"{self.name}: cannot append as leader with epoch {leader_epoch}, "
                    f"the log already has epoch {latest}"
                )
            self._producer_state.check_marker(producer_id, producer_epoch)
            first_offset = self._next_offset
            batch = build_control_batch(
                producer_id,
                producer_epoch,
                commit=commit,
                coordinator_epoch=coordinator_epoch,
                base_offset=first_offset,
                timestamp_ms=now,
                partition_leader_epoch=leader_epoch,
            )
            summary = summarize(validate_batches(batch, as_leader=False, max_message_bytes=None))
            new_epoch = leader_epoch if leader_epoch > latest else None
            self._append_locked(batch, summary, now, [(new_epoch, first_offset)])
            completed = self._producer_state.update([h for _, h in summary.batches], lambda h: control_type(batch, 0))
            self._index_aborted(completed)
        return LogAppendInfo(first_offset, first_offset, summary.max_timestamp, first_offset, 1, len(batch))

    def _index_aborted(self, completed: list[CompletedTxn]) -> None:
        """Record the aborted ones among ``completed`` (closed by markers just appended,
        so in the active segment) in the aborted-transaction index."""
        for txn in completed:
            if txn.aborted:
                with self._offline_on_error(f"writing the aborted-transaction index of {self.name}"):
                    self._segments[-1].txn_index.append(
                        AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset)
                    )

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of the oldest transaction still open (or closed by a marker
        not yet below ``high_watermark``), None if none: the last stable offset is the
        smaller of it and the high watermark."""
        with self._lock:
            return self._producer_state.first_unstable_offset(high_watermark)

    def collect_aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """The aborted transactions that overlap [fetch_offset, upper_bound) (Kafka's
        collectAbortedTransactions): from the segment holding ``fetch_offset`` on, until
        an index entry's last stable offset shows no later one can."""
        with self._lock:
            i = max(bisect_right(self._bases, fetch_offset) - 1, 0)
            found: list[AbortedTxn] = []
            for segment in self._segments[i:]:
                txns, complete = segment.txn_index.collect(fetch_offset, upper_bound)
                found.extend(txns)
                if complete:
                    break
            return found

    def _append_locked(
        self,
        data: bytes | bytearray | memoryview | list[bytes | bytearray | memoryview],
        summary: BatchSummary,
        now_ms: int,
        epochs: list[tuple[int | None, int]],
    ) -> None:
        """Write batches at the log end: all of them or, on any error, nothing.

        ``epochs`` are (leader epoch or None, start offset) to record in the leader-epoch
        cache first; they are forgotten again if the append fails. A failed write is
        undone by the segment (the log end offset does not move); if it cannot be
        undone the log goes offline.
        """
        config = self._config
        try:
            with _storage_errors(f"appending to {self.name}"):
                cache = self._epoch_cache
                for epoch, start in epochs:
                    if epoch is not None and epoch > cache.latest_epoch:
                        cache.assign(epoch, start)
                segment = self._segments[-1]
                if segment.should_roll(
                    messages_size=sum(len(d) for d in data) if isinstance(data, list) else len(data),
                    max_timestamp_in_messages=summary.max_timestamp,
                    max_offset_in_messages=summary.last_offset,
                    now_ms=now_ms,
                    segment_bytes=config.segment_bytes,
                    segment_ms=config.segment_ms,
                ):
                    segment = self._roll_locked(now_ms)
                if not segment.can_convert_to_relative_offset(summary.last_offset):
                    # Only a leader's batch can do that (a base offset is outside the CRC):
                    # offsets more than 2^31 past the log end offset are corrupt.
                    raise CorruptRecordError(
                        f"{self.name}: batches at offsets {summary.first_offset}..{summary.last_offset} "
                        f"cannot follow log end offset {self._next_offset}: corrupt offsets"
                    )
                segment.append(data, summary.batches)
                self._next_offset = segment.next_offset
        except KafkaError as exc:
            if isinstance(exc, AppendUndoError):
                self._go_offline(str(exc))
            # Nothing of this append is in the log: forget an epoch assigned for it.
            try:
                self._epoch_cache.truncate_from_end(self._next_offset)
            except OSError as undo_exc:  # the file is trimmed to the log end at the next load
                logger.warning("%s: could not rewrite the leader epoch cache: %s", self.name, undo_exc)
            raise
        flush_messages = config.flush_messages
        if flush_messages is not None and self._next_offset - self._recovery_point >= flush_messages:
            self._flush_locked(self._next_offset, now_ms)

    # ------------------------------------------------------------------ reads

    def read(
        self,
        start_offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> FetchDataInfo:
        """Whole batches starting with the one holding ``start_offset``.

        At most ``max_bytes`` unless the first batch alone is larger and
        ``min_one_batch`` (then exactly that batch). No batch whose last offset is
        >= ``max_offset`` (the exclusive bound, e.g. the high watermark). Reads come
        from one segment; an empty result at the log end offset. Raises
        OffsetOutOfRangeError if ``start_offset`` is outside
        [log_start_offset, log_end_offset].
        """
        with self._lock:
            self._ensure_open()
            start = self._log_start_offset
            end = self._next_offset
            if start_offset == end:
                active = self._segments[-1]
                return FetchDataInfo(b"", start_offset, -1, end, start, end, active.base_offset, active.size)
            if start_offset < start or start_offset > end:
                raise OffsetOutOfRangeError(
                    f"offset {start_offset} is out of range for {self.name}: the log holds "
                    f"offsets {start} to {end} (log start offset to log end offset)"
                )
            i = max(bisect_right(self._bases, start_offset) - 1, 0)
            snapshot = [(s, s.size) for s in self._segments[i:]]
        empty = FetchDataInfo(b"", start_offset, -1, start_offset, start, end, -1, -1)
        if max_offset is not None and start_offset >= max_offset:
            return empty
        with _storage_errors(f"reading {self.name}"):
            for segment, size in snapshot:
                result = segment.read(
                    start_offset,
                    max_bytes,
                    max_position=size,
                    max_offset=max_offset,
                    min_one_batch=min_one_batch,
                )
                if result is not None:
                    return FetchDataInfo(
                        result.records,
                        start_offset,
                        result.first_offset,
                        result.next_offset,
                        start,
                        end,
                        segment.base_offset,
                        result.position,
                    )
        return empty

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record stamped at or after ``timestamp_ms``.

        Kafka's ListOffsets: None if no record is that recent.
        ``EARLIEST_TIMESTAMP`` (-2) and ``LATEST_TIMESTAMP`` (-1) give
        (log_start_offset, -1) and (log_end_offset, -1). Decodes one batch.
        """
        with self._lock:
            self._ensure_open()
            if timestamp_ms == EARLIEST_TIMESTAMP:
                return self._log_start_offset, -1
            if timestamp_ms == LATEST_TIMESTAMP:
                return self._next_offset, -1
            if timestamp_ms < 0:
                raise ValueError(f"invalid timestamp {timestamp_ms}")
            start = self._log_start_offset
            snapshot = list(self._segments)
        with _storage_errors(f"searching {self.name} by timestamp"):
            for segment in snapshot:
                if segment.max_timestamp_so_far < timestamp_ms or segment.next_offset <= start:
                    continue
                found = segment.find_offset_by_timestamp(timestamp_ms, start)
                if found is not None:
                    return found
        return None

    # ------------------------------------------------------------------ rolling & flushing

    def roll(self, now_ms: int | None = None) -> int:
        """Start a new active segment at the log end offset (no-op if the active one
        is empty); returns the active segment's base offset."""
        now = _now_ms() if now_ms is None else now_ms
        with self._lock, _storage_errors(f"rolling {self.name}"):
            self._ensure_open()
            return self._roll_locked(now).base_offset

    def _roll_locked(self, now_ms: int) -> LogSegment:
        active = self._segments[-1]
        if active.is_empty:
            return active
        base = self._next_offset
        active.on_become_inactive()
        config = self._config
        segment = LogSegment.open(
            self._dir,
            base,
            index_interval_bytes=config.index_interval_bytes,
            max_index_size=config.segment_index_bytes,
            create=True,
            now_ms=now_ms,
        )
        self._segments.append(segment)
        self._bases.append(base)
        self._snapshot_producer_state(base)
        # As Kafka, the finished segment is flushed soon, off the append path.
        self._roll_flush_offset = base
        logger.debug("%s: rolled new segment at offset %d", self.name, base)
        return segment

    def flush(self, offset: int | None = None) -> None:
        """fsync everything below ``offset`` (default: the log end offset) and move the
        recovery point there. Appends continue while the fsync runs. The leader-epoch
        checkpoint is made durable first (the epochs of what becomes flushed)."""
        with self._offline_on_error(f"flushing the leader-epoch checkpoint of {self.name}"):
            self._epoch_cache.flush()
        with self._flush_lock:
            with self._lock:
                self._ensure_open()
                target = self._next_offset if offset is None else min(offset, self._next_offset)
                if target <= self._recovery_point:
                    return
                to_flush = self._segments_between(self._recovery_point, target)
            with self._offline_on_error(f"flushing {self.name}"):
                for segment in to_flush:
                    segment.flush()
            with self._lock:
                self._advance_recovery_point(target, _now_ms())

    def _flush_locked(self, target: int, now_ms: int) -> None:
        """Flush with the log lock held (flush.messages on the append path)."""
        with self._offline_on_error(f"flushing {self.name}"):
            self._epoch_cache.flush()
            for segment in self._segments_between(self._recovery_point, target):
                segment.flush()
        self._advance_recovery_point(target, now_ms)

    def _segments_between(self, from_offset: int, to_offset: int) -> list[LogSegment]:
        """Segments holding offsets in [from_offset, to_offset)."""
        i = max(bisect_right(self._bases, from_offset) - 1, 0)
        candidates = self._segments[i:]
        return candidates[:1] + [s for s in candidates[1:] if s.base_offset < to_offset]

    def _advance_recovery_point(self, target: int, now_ms: int) -> None:
        target = min(target, self._next_offset)
        if target > self._recovery_point:
            self._recovery_point = target
        self._last_flush_ms = now_ms

    def flush_if_due(self, now_ms: int | None = None) -> bool:
        """Flush if flush.ms has passed since the last flush (with data to flush), or a
        rolled segment awaits its flush; remove ``.deleted`` files that are due.
        Returns whether it flushed."""
        now = _now_ms() if now_ms is None else now_ms
        with self._lock:
            if self._closed or self._offline_reason is not None:
                return False
            flush_ms = self._config.flush_ms
            unflushed = self._next_offset > self._recovery_point
            target: int | None = None
            if flush_ms is not None and unflushed and now - self._last_flush_ms >= flush_ms:
                target = self._next_offset
            elif self._roll_flush_offset > self._recovery_point:
                target = self._roll_flush_offset
        flushed = False
        if target is not None:
            self.flush(target)
            flushed = True
        self._delete_due_segments(now)
        return flushed

    # ------------------------------------------------------------------ truncation

    def truncate_to(self, offset: int) -> bool:
        """Remove every offset >= ``offset`` (a batch straddling it goes whole).

        Used by followers. The leader-epoch cache forgets epochs starting at or
        after the new end. Returns whether anything was removed.
        """
        if offset < 0:
            raise ValueError(f"cannot truncate to a negative offset {offset}")
        with self._flush_lock, self._lock, self._offline_on_error(f"truncating {self.name}"):
            self._ensure_open()
            if offset >= self._next_offset:
                return False
            logger.info(
                "%s: truncating to offset %d (log end offset was %d)",
                self.name,
                offset,
                self._next_offset,
            )
            if self._segments[0].base_offset > offset:
                self._truncate_fully_locked(offset)
                return True
            # Snapshots of the removed batches go first (durably), then the batches.
            self._producer_state.delete_snapshots_above(offset)
            now = _now_ms()
            while len(self._segments) > 1 and self._segments[-1].base_offset > offset:
                self._remove_segment_locked(len(self._segments) - 1, now)
            active = self._segments[-1]
            active.truncate_to(offset)
            self._next_offset = active.next_offset
            self._log_start_offset = min(self._log_start_offset, self._next_offset)
            self._recovery_point = min(self._recovery_point, self._next_offset)
            self._roll_flush_offset = min(self._roll_flush_offset, self._next_offset)
            self._epoch_cache.truncate_from_end(self._next_offset)
            self._producer_state.truncate_and_reload(self._segments, self._log_start_offset, self._next_offset)
            self._note_truncation(self._next_offset)
            return True

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete everything and continue with an empty log starting at ``offset``."""
        if offset < 0:
            raise ValueError(f"cannot start a log at a negative offset {offset}")
        with self._flush_lock, self._lock, self._offline_on_error(f"truncating {self.name}"):
            self._ensure_open()
            logger.info("%s: truncating fully and starting at offset %d", self.name, offset)
            self._truncate_fully_locked(offset)

    def _truncate_fully_locked(self, offset: int) -> None:
        self._producer_state.delete_all_snapshots()
        self._producer_state.clear()
        now = _now_ms()
        while self._segments:
            self._remove_segment_locked(len(self._segments) - 1, now)
        config = self._config
        segment = LogSegment.open(
            self._dir,
            offset,
            index_interval_bytes=config.index_interval_bytes,
            max_index_size=config.segment_index_bytes,
            create=True,
            now_ms=now,
        )
        self._segments = [segment]
        self._bases = [offset]
        self._next_offset = offset
        self._log_start_offset = offset
        self._recovery_point = offset
        self._roll_flush_offset = -1
        self._epoch_cache.clear()
        self._note_truncation(offset)

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start offset up to ``offset`` (DeleteRecords, retention) and
        delete the segments entirely below it. Returns whether it moved."""
        with self._flush_lock, self._lock, _storage_errors(f"deleting segments of {self.name}"):
            self._ensure_open()
            if offset > self._next_offset:
                raise OffsetOutOfRangeError(
                    f"cannot move the log start offset of {self.name} to {offset}: "
                    f"the log end offset is {self._next_offset}"
                )
            if offset <= self._log_start_offset:
                return False
            self._set_log_start_offset_locked(offset)
            self._delete_segments_while(lambda s, nxt: nxt.base_offset <= offset, _now_ms())
            return True

    def _set_log_start_offset_locked(self, offset: int) -> None:
        if offset > self._log_start_offset:
            self._log_start_offset = offset
            self._epoch_cache.truncate_from_start(offset)
            self._producer_state.evict_below(offset)

    # ------------------------------------------------------------------ retention

    def delete_old_segments(self, now_ms: int | None = None, *, high_watermark: int | None = None) -> int:
        """Apply retention: delete the oldest whole segments that are past retention.ms
        (judged by their largest timestamp) or beyond retention.bytes, and those below
        the log start offset. The active segment is never deleted. With
        ``high_watermark``, only segments entirely below it are deleted, and never those
        at or above the first offset of an undecided transaction. Returns the number of
        segments deleted."""
        now = _now_ms() if now_ms is None else now_ms
        with self._flush_lock, self._lock, _storage_errors(f"applying retention to {self.name}"):
            if self._closed or self._offline_reason is not None:
                return 0
            config = self._config
            limit = high_watermark
            # Nothing of an undecided transaction goes: it would leave its marker alone.
            unstable = self._producer_state.first_unstable_offset(self._next_offset if limit is None else limit)
            if unstable is not None:
                limit = unstable if limit is None else min(limit, unstable)

            def below_hw(nxt: LogSegment) -> bool:
                return limit is None or nxt.base_offset <= limit

            deleted = 0
            if config.delete_enabled:
                retention_ms = config.retention_ms
                if retention_ms >= 0:
                    deleted += self._delete_segments_while(
                        lambda s, nxt: below_hw(nxt) and now - s.largest_timestamp > retention_ms,
                        now,
                    )
                if config.retention_bytes >= 0:
                    excess = sum(s.size for s in self._segments) - config.retention_bytes

                    def over_size(s: LogSegment, nxt: LogSegment) -> bool:
                        nonlocal excess
                        if below_hw(nxt) and excess - s.size >= 0:
                            excess -= s.size
                            return True
                        return False

                    deleted += self._delete_segments_while(over_size, now)
            start = self._log_start_offset
            deleted += self._delete_segments_while(lambda s, nxt: nxt.base_offset <= start, now)
        self._delete_due_segments(now)
        return deleted

    def _delete_segments_while(self, predicate: Callable[[LogSegment, LogSegment], bool], now_ms: int) -> int:
        """Delete the oldest segments while ``predicate(segment, next_segment)`` holds,
        never the active one; the log start offset follows."""
        count = 0
        while len(self._segments) > 1 and predicate(self._segments[0], self._segments[1]):
            segment = self._segments[0]
            logger.info(
                "%s: deleting segment %d (offsets %d..%d, %d bytes)",
                self.name,
                segment.base_offset,
                segment.base_offset,
                segment.next_offset - 1,
                segment.size,
            )
            self._remove_segment_locked(0, now_ms)
            count += 1
        if count:
            self._set_log_start_offset_locked(self._segments[0].base_offset)
        return count

    def _remove_segment_locked(self, i: int, now_ms: int) -> None:
        """Take segment ``i`` out of the log: rename it ``.deleted`` and delete it after
        file.delete.delay.ms (readers in flight keep working)."""
        segment = self._segments.pop(i)
        del self._bases[i]
        segment.rename_with_suffix(files.DELETED_SUFFIX)
        delay = self._config.file_delete_delay_ms
        if delay <= 0:
            segment.delete()
        else:
            self._pending_deletes.append((now_ms + delay, segment))

    def _delete_due_segments(self, now_ms: int) -> None:
        with self._lock:
            due = [s for t, s in self._pending_deletes if t <= now_ms]
            if not due:
                return
            self._pending_deletes = [(t, s) for t, s in self._pending_deletes if t > now_ms]
        with _storage_errors(f"deleting segments of {self.name}"):
            for segment in due:
                segment.delete()

    # ------------------------------------------------------------------ cleaning (compaction)

    def _note_truncation(self, offset: int) -> None:
        if self._truncated_to is None or offset < self._truncated_to:
            self._truncated_to = offset

    def take_truncation(self) -> int | None:
        """The lowest offset the log was truncated to since the last call, None if it was
        not: the cleaner's checkpoint must not stay above it (what follows is new data)."""
        with self._lock:
            offset, self._truncated_to = self._truncated_to, None
            return offset

    def last_producer_batches(self) -> set[tuple[int, int]]:
        """(producer id, last offset) of the last batch of every producer in the log: the
        cleaner keeps those batches (empty if need be) so producer state survives."""
        with self._lock:
            return {(pid, entry.last_offset) for pid, entry in self._producer_state.producers.items()}

    def replace_segments(self, cleaned: LogSegment, old: list[LogSegment], pause: Callable[[str], None]) -> bool:
        """Put ``cleaned`` (files ``<base>.*.cleaned``, complete and fsynced) in place of
        the consecutive segments ``old``, crash-safely (Kafka's replaceSegments):

        1. ``.cleaned`` -> ``.swap`` (from now on a restart finishes the swap: see
           :func:`~kbroker.storage.loader.load_log`);
        2. every old segment -> ``.deleted`` (removed after file.delete.delay.ms;
           reads in flight keep their descriptors);
        3. ``.swap`` -> live, and the segment list holds ``cleaned`` instead of ``old``.

        The directory is fsynced after each step; ``pause(stage)`` is called after
        step 1 (``"after-swap"``) and step 2 (``"after-delete"``), the test hook.
        Returns False (and changes nothing) if ``old`` are no longer consecutive
        segments of this log (a truncation or retention ran meanwhile), or the log is
        closed or offline: the caller discards ``cleaned``.
        """
        with self._flush_lock, self._lock:
            if self._closed or self._offline_reason is not None or not old:
                return False
            try:
                i = next(n for n, s in enumerate(self._segments) if s is old[0])
            except StopIteration:
                return False
            if i + len(old) >= len(self._segments) or any(
                a is not b for a, b in zip(self._segments[i : i + len(old)], old, strict=True)
            ):
                return False  # gone, or it would replace the active segment
            with self._offline_on_error(f"replacing segments of {self.name}"):
                cleaned.rename_with_suffix(files.SWAP_SUFFIX)
                files.fsync_dir(self._dir)
                pause("after-swap")
                for segment in old:
                    segment.rename_with_suffix(files.DELETED_SUFFIX)
                files.fsync_dir(self._dir)
                pause("after-delete")
                cleaned.rename_with_suffix("")
                files.fsync_dir(self._dir)
            self._segments[i : i + len(old)] = [cleaned]
            self._bases[i : i + len(old)] = [cleaned.base_offset]
            now = _now_ms()
            delay = self._config.file_delete_delay_ms
            for segment in old:
                if delay <= 0:
                    segment.delete()
                else:
                    self._pending_deletes.append((now + delay, segment))
            return True

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close every file (pending ``.deleted`` files are removed now). Idempotent.

        Writes a producer-state snapshot at the log end offset first (so the next
        load replays nothing). Does not flush: call :meth:`flush` first for a clean
        shutdown. An offline log writes nothing: its files are left to recovery.
        """
        self._close(snapshot=True)

    def _close(self, *, snapshot: bool) -> None:
        with self._flush_lock, self._lock:
            if self._closed:
                return
            online = self._offline_reason is None
            # As Kafka's takeSnapshot: none when the newest one is at this offset already
            # (a log without appends since it was loaded; replacing the file costs a flush).
            if snapshot and online and self._next_offset not in self._producer_state.snapshot_offsets:
                self._snapshot_producer_state(self._next_offset)
            if online:
                try:  # best effort, as the snapshot: recovery derives the epochs of unflushed batches
                    self._epoch_cache.write()
                except OSError as exc:
                    logger.warning("%s: could not write the leader-epoch checkpoint: %s", self.name, exc)
            self._closed = True
            with _storage_errors(f"closing {self.name}"):
                for segment in self._segments:
                    segment.close(final_index_entry=online)
                for _, segment in self._pending_deletes:
                    segment.delete()
                self._pending_deletes = []

    def delete(self) -> None:
        """Close the log and remove its directory."""
        self._close(snapshot=False)
        with _storage_errors(f"deleting {self._dir}"):
            if self._dir.exists():
                shutil.rmtree(self._dir)

    def _snapshot_producer_state(self, offset: int) -> None:
        """Best effort: a missing snapshot only makes the next load scan more headers."""
        try:
            self._producer_state.take_snapshot(offset)
        except OSError as exc:
            logger.warning("%s: could not write the producer state snapshot at %d: %s", self.name, offset, exc)

    def __repr__(self) -> str:
        return (
            f"Log({self._dir}, start={self._log_start_offset}, end={self._next_offset}, segments={len(self._segments)})"
        )
