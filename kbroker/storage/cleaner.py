"""Log compaction of one log: keep the latest record of every key (Kafka's ``Cleaner``).

One cleaning of a log, given where its dirty part starts (the cleaner checkpoint) and
the first offset it must not touch (:func:`first_uncleanable_offset`):

1. **Offset map.** The dirty records [first dirty, first uncleanable) are read in
   order and every key's last offset goes into the :class:`OffsetMap`. When the map is
   full the pass stops before the batch that does not fit; the end of this pass is
   that batch's base offset, and the rest is left to the next pass (several passes
   when the dirty part holds more keys than the map).
2. **Recopy.** Every segment below the end of the pass, clean part included, is
   recopied in groups of neighbours whose sizes together fit a segment
   (:func:`group_segments_by_size`, Kafka's groupSegmentsBySize). A record is kept if
   it has a key and no later offset of that key is in the map. A tombstone (null
   value) is kept until its batch's *delete horizon* has passed: the horizon is set
   to the cleaning time + ``delete.retention.ms`` the first time the batch is cleaned
   (KIP-534, see :mod:`.batch_filter`). The batches of aborted transactions are
   dropped whole and never enter the map (a key's latest value is its latest
   *committed* one). A transaction marker whose transaction has no record left (every
   ABORT marker, and a COMMIT one whose records were all superseded) follows the delete
   horizon as a tombstone does, then goes (Kafka's rule). Each segment's
   aborted-transaction index moves to the cleaned segment. Batches are rebuilt around the kept records (see
   :mod:`.batch_filter`): offsets never change. Kept whole, or kept empty, are: the
   last batch of every producer in the producer state (so an idempotent retry is still
   recognised as a duplicate), and the last batch of each group (so the cleaned
   segment ends where the group ended, which is what crash recovery relies on).
3. **Swap.** The cleaned segment is written as ``<base>.*.cleaned``, fsynced, given
   the old segments' last-modified time, then swapped in by
   :meth:`Log.replace_segments <kbroker.storage.log.Log.replace_segments>`
   (``.cleaned`` -> ``.swap`` -> live). Indexes are rebuilt by the appends.

Test hook: the environment variable ``KBROKER_CLEANER_PAUSE_AT=<stage>`` (stages
``after-cleaned``, ``after-swap``, ``after-delete``, ``after-replace``) makes the cleaner
write ``<data_dir>/cleaner-paused-<stage>`` when it reaches that stage and then sleep
forever, so that a test can SIGKILL the broker there and check the recovery.

Thread safety: a :class:`Cleaner` is used by one thread at a time; it reads segments
without the log lock (non-active segments below the high watermark do not change) and
takes it only to swap.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kbroker.storage import files
from kbroker.storage.batch_filter import batch_columns, build_batch, filter_batch
from kbroker.storage.log import Log
from kbroker.storage.offset_map import OffsetMap, key_hash
from kbroker.storage.segment import LogSegment
from kclient.errors import KafkaStorageError
from kclient.records import (
    CONTROL_FLAG_MASK,
    CONTROL_TYPE_COMMIT,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    control_type,
    read_header,
)

logger = logging.getLogger(__name__)

PAUSE_ENV = "KBROKER_CLEANER_PAUSE_AT"
"""Test hook: the stage at which the cleaner writes a marker file and sleeps forever."""
PAUSE_STAGES = ("after-cleaned", "after-swap", "after-delete", "after-replace")
_READ_CHUNK = 512 * 1024
"""Bytes read at once (Kafka's log.cleaner.io.buffer.size)."""
_WRITE_CHUNK = 512 * 1024
_INT32_MAX = 2**31 - 1


class CleanerAbortedError(Exception):
    """The log changed under the cleaner (truncated, closed, deleted): try again later."""


@dataclass
class CleanerStats:
    """What one cleaning did."""

    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    map_records: int = 0
    segments_cleaned: int = 0
    elapsed_s: float = 0.0
    earliest_delete_horizon: int | None = None
    """The earliest delete horizon of the tombstones kept, None if none was kept."""


class Throttler:
    """Limits the bytes per second of every thread that shares it
    (log.cleaner.io.max.bytes.per.second). Thread-safe."""

    def __init__(self, bytes_per_second: float) -> None:
        self._rate = bytes_per_second
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._count = 0.0

    def maybe_throttle(self, n: int) -> None:
        if self._rate <= 0 or self._rate == float("inf"):
            return
        with self._lock:
            self._count += n
            now = time.monotonic()
            elapsed = now - self._start
            wait = self._count / self._rate - elapsed
            if elapsed > 1.0 and wait <= 0:  # a new window
                self._start, self._count = now, 0.0
        if wait > 0:
            time.sleep(wait)


def pause_at(stage: str, data_dir: Path, what: str = "") -> None:
    """The test hook (see the module docstring): no-op unless the environment names ``stage``."""
    if os.environ.get(PAUSE_ENV) != stage:
        return
    marker = data_dir / f"cleaner-paused-{stage}"
    marker.write_text(what + "\n")
    logger.warning("cleaner paused at %s (%s) by %s; waiting to be killed", stage, what, PAUSE_ENV)
    while True:
        time.sleep(3600)


def first_uncleanable_offset(log: Log, now_ms: int) -> int:
    """The first offset the cleaner must not touch: the smallest of the active segment's
    base offset, the log's high watermark (:attr:`Log.cleaner_upper_bound`), the first
    offset of an undecided transaction (the last stable offset) and the base offset of
    the first segment holding a record younger than min.compaction.lag.ms."""
    segments = log.segments
    bound = segments[-1].base_offset
    upper = log.cleaner_upper_bound
    if upper is not None:
        bound = min(bound, upper())
    unstable = log.first_unstable_offset(bound)
    if unstable is not None:
        bound = min(bound, unstable)
    lag = log.config.min_compaction_lag_ms
    if lag > 0:
        for segment in segments[:-1]:
            if segment.base_offset >= bound:
                break
            if segment.largest_timestamp > now_ms - lag:
                bound = min(bound, segment.base_offset)
                break
    return bound


def group_segments_by_size(segments: list[LogSegment], max_size: int, max_index_size: int) -> list[list[LogSegment]]:
    """Consecutive segments grouped so that each group's data fits ``max_size`` bytes, its
    index entries fit ``max_index_size`` bytes and its offsets fit one segment (Kafka's
    groupSegmentsBySize). A segment larger than the limit forms a group alone."""
    groups: list[list[LogSegment]] = []
    rest = list(segments)
    while rest:
        group = [rest.pop(0)]
        size = group[0].size
        index_size = group[0].offset_index.entries * 8
        time_size = group[0].time_index.entries * 12
        while rest:
            nxt = rest[0]
            if (
                size + nxt.size > max_size
                or index_size + nxt.offset_index.entries * 8 > max_index_size
                or time_size + nxt.time_index.entries * 12 > max_index_size
                or nxt.next_offset - 1 - group[0].base_offset > _INT32_MAX
            ):
                break
            group.append(rest.pop(0))
            size += nxt.size
            index_size += nxt.offset_index.entries * 8
            time_size += nxt.time_index.entries * 12
        groups.append(group)
    return groups


def iter_batches(segment: LogSegment, start: int = 0) -> Iterator[tuple[bytes, int, BatchHeader]]:
    """(buffer, position in it, header) of every batch of ``segment`` from file position
    ``start``, read in chunks of about 512 KiB (whole batches)."""
    fd_path = segment.log_path
    end = segment.size
    pos = start
    try:
        f = open(fd_path, "rb", buffering=0)
    except FileNotFoundError:
        raise CleanerAbortedError(f"segment {fd_path} was removed while it was cleaned") from None
    with f:
        while end - pos >= HEADER_SIZE:
            buf = os.pread(f.fileno(), min(_READ_CHUNK, end - pos), pos)
            if len(buf) < HEADER_SIZE:
                return
            off = 0
            progressed = False
            while len(buf) - off >= HEADER_SIZE:
                header = read_header(buf, off)
                size = header.batch_length + LOG_OVERHEAD
                if off + size > len(buf):
                    if not progressed:  # a batch larger than the chunk
                        buf = os.pread(f.fileno(), size, pos)
                        if len(buf) < size:
                            return
                        yield buf, 0, header
                        off = size
                        progressed = True
                    break
                yield buf, off, header
                off += size
                progressed = True
            pos += off


class AbortedRanges:
    """The aborted transactions of a log between two offsets, by producer: which
    transactional batches belong to one."""

    def __init__(self, log: Log, start: int, end: int) -> None:
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        for txn in log.collect_aborted_transactions(start, end):
            self._ranges.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))

    def holds(self, header: BatchHeader) -> bool:
        """Is this a data batch of an aborted transaction?"""
        if not self._ranges or not header.is_transactional or header.is_control:
            return False
        return any(first <= header.base_offset < last for first, last in self._ranges.get(header.producer_id, ()))


class Cleaner:
    """Cleans one log at a time with its own offset map (see the module docstring)."""

    def __init__(
        self,
        offset_map: OffsetMap,
        *,
        throttler: Throttler | None = None,
        pause: Callable[[str, Path, str], None] = pause_at,
    ) -> None:
        self.offset_map = offset_map
        self._throttler = throttler or Throttler(float("inf"))
        self._pause = pause
        self._kept_in_txn: dict[int, bool] = {}
        """Producer id -> a record of its open transaction was kept (this cleaning, so far):
        its COMMIT marker stays."""

    def clean(
        self, log: Log, first_dirty: int, first_uncleanable: int, now_ms: int, *, recopy: bool = False
    ) -> tuple[int, CleanerStats]:
        """One pass: map [first_dirty, first_uncleanable) (as much as fits), recopy every
        segment below the end of the map. With ``recopy``, the clean part is recopied even
        if nothing is dirty (tombstones whose delete horizon has passed go). Returns (end
        offset of the pass: the new cleaner checkpoint, stats). Raises
        CleanerAbortedError if the log changed under it, KafkaError / OSError for
        anything else."""
        started = time.monotonic()
        stats = CleanerStats()
        end = self._build_offset_map(log, first_dirty, first_uncleanable, stats)
        if end <= first_dirty and not recopy:
            return first_dirty, stats
        segments = log.segments
        config = log.config
        producers = log.last_producer_batches()
        self._kept_in_txn = {}
        to_clean = [s for s in segments[:-1] if s.base_offset < end]
        for group in group_segments_by_size(to_clean, config.segment_bytes, config.segment_index_bytes):
            if all(s.size == 0 for s in group):
                continue
            self._clean_segments(log, group, now_ms, producers, stats)
        stats.elapsed_s = time.monotonic() - started
        return end, stats

    # ------------------------------------------------------------------ the offset map

    def _build_offset_map(self, log: Log, first_dirty: int, upper: int, stats: CleanerStats) -> int:
        """Fill the map from ``first_dirty``; returns the offset where it stopped."""
        omap = self.offset_map
        omap.clear()
        put = omap.put_hash
        for segment in log.segments[:-1]:
            if segment.next_offset <= first_dirty or segment.size == 0:
                continue
            if segment.base_offset >= upper:
                break
            found = segment.translate_offset(first_dirty) if segment.base_offset < first_dirty else None
            start = found[0] if found is not None else 0
            aborted = AbortedRanges(log, segment.base_offset, segment.next_offset)
            for buf, pos, header in iter_batches(segment, start):
                if header.base_offset >= upper:
                    return upper
                if header.last_offset < first_dirty:
                    continue
                size = header.batch_length + LOG_OVERHEAD
                stats.bytes_read += size
                self._throttler.maybe_throttle(size)
                if header.attributes & CONTROL_FLAG_MASK or header.record_count == 0 or aborted.holds(header):
                    continue
                if omap.free < header.record_count:
                    if len(omap) == 0:
                        raise KafkaStorageError(
                            f"{log.name}: a batch of {header.record_count} records does not fit the "
                            f"cleaner's offset map of {omap.max_entries} entries: raise log.cleaner.dedupe.buffer.size"
                        )
                    return max(header.base_offset, first_dirty)
                cols = batch_columns(buf, pos, header)
                for offset, key in zip(cols.offsets, cols.keys, strict=True):
                    if key is not None and first_dirty <= offset < upper:
                        put(key_hash(key), offset)
                        stats.map_records += 1
        return upper

    # ------------------------------------------------------------------ recopying

    def _clean_segments(
        self,
        log: Log,
        group: list[LogSegment],
        now_ms: int,
        producers: set[tuple[int, int]],
        stats: CleanerStats,
    ) -> None:
        config = log.config
        dir = log.dir
        base = group[0].base_offset
        for stale in (
            files.log_file(dir, base, files.CLEANED_SUFFIX),
            files.offset_index_file(dir, base, files.CLEANED_SUFFIX),
            files.time_index_file(dir, base, files.CLEANED_SUFFIX),
            files.txn_index_file(dir, base, files.CLEANED_SUFFIX),
        ):
            stale.unlink(missing_ok=True)
        cleaned = LogSegment.open(
            dir,
            base,
            index_interval_bytes=config.index_interval_bytes,
            max_index_size=config.segment_index_bytes,
            create=True,
            now_ms=int(time.time() * 1000),
            suffix=files.CLEANED_SUFFIX,
        )
        swapped = False
        try:
            markers = self._recopy(log, group, cleaned, now_ms, producers, stats)
            # An aborted transaction stays in the index as long as its ABORT marker stays
            # (Kafka's cleanedIndex): a reader must meet the marker that ends it.
            cleaned.txn_index.reset(t for s in group for t in s.txn_index.entries if t.last_offset in markers)
            cleaned.on_become_inactive()
            cleaned.flush()
            modified = max(s.last_modified_ms for s in group)
            os.utime(cleaned.log_path, ns=(modified * 1_000_000, modified * 1_000_000))
            files.fsync_dir(dir)
            self._pause("after-cleaned", dir.parent, log.name)
            pause: Callable[[str], None] = lambda stage: self._pause(stage, dir.parent, log.name)  # noqa: E731
            swapped = log.replace_segments(cleaned, group, pause)
            if not swapped:
                raise CleanerAbortedError(f"{log.name}: the log changed while segments {base}.. were cleaned")
            stats.segments_cleaned += len(group)
            logger.debug("%s: cleaned segments %s into %r", log.name, [s.base_offset for s in group], cleaned)
            self._pause("after-replace", dir.parent, log.name)
        finally:
            if not swapped:
                cleaned.delete()

    def _recopy(
        self,
        log: Log,
        group: list[LogSegment],
        cleaned: LogSegment,
        now_ms: int,
        producers: set[tuple[int, int]],
        stats: CleanerStats,
    ) -> set[int]:
        """Recopy ``group`` into ``cleaned``; the offsets of the transaction markers kept."""
        omap = self.offset_map
        markers: set[int] = set()
        pending: list[bytes | bytearray | memoryview] = []
        pending_batches: list[tuple[int, BatchHeader]] = []
        pending_size = 0

        def write_pending() -> None:
            nonlocal pending_size
            if pending:
                cleaned.append(pending, pending_batches)
                stats.bytes_written += pending_size
                self._throttler.maybe_throttle(pending_size)
                pending.clear()
                pending_batches.clear()
                pending_size = 0

        retention = log.config.delete_retention_ms

        latest = omap.get_hash

        last_segment = group[-1]
        last_header: BatchHeader | None = None
        aborted = AbortedRanges(log, group[0].base_offset, group[-1].next_offset)
        kept_in_txn = self._kept_in_txn
        for segment in group:
            if log.closed:
                raise CleanerAbortedError(f"{log.name} was closed while it was cleaned")

            is_last_segment = segment is last_segment
            kept_last = True
            for buf, pos, header in iter_batches(segment):
                size = header.batch_length + LOG_OVERHEAD
                stats.bytes_read += size
                stats.records_read += header.record_count
                self._throttler.maybe_throttle(size)
                keep_empty = (header.producer_id, header.last_offset) in producers
                cols = batch_columns(buf, pos, header)
                discardable_marker = False
                if header.is_control:
                    # Kafka's CleanedTransactionMetadata: an ABORT marker's data always went;
                    # a COMMIT marker's went if none of its transaction's records was kept.
                    pid = header.producer_id
                    committed = control_type(buf, pos) == CONTROL_TYPE_COMMIT
                    discardable_marker = not (committed and kept_in_txn.pop(pid, False))
                    keep = []
                elif aborted.holds(header):
                    keep = [False] * len(cols.offsets)
                else:
                    keep = [
                        key is not None and offset >= latest(key_hash(key))
                        for offset, key in zip(cols.offsets, cols.keys, strict=True)
                    ]
                    if header.is_transactional and any(keep):
                        kept_in_txn[header.producer_id] = True
                tombstones = [value is None for value in cols.values]
                result = filter_batch(
                    buf,
                    pos,
                    header,
                    keep,
                    tombstones,
                    keep_empty=keep_empty,
                    now_ms=now_ms,
                    delete_retention_ms=retention,
                    discardable_marker=discardable_marker,
                )
                if is_last_segment:
                    last_header, kept_last = header, result.data is not None
                if result.data is None:
                    continue
                if header.is_control:
                    markers.add(header.base_offset)
                stats.records_kept += result.kept
                data = result.data
                horizon = result.horizon
                if horizon is not None and (
                    stats.earliest_delete_horizon is None or horizon < stats.earliest_delete_horizon
                ):
                    stats.earliest_delete_horizon = horizon
                pending_batches.append((pending_size, read_header(data)))
                pending.append(data)
                pending_size += len(data)
                if pending_size >= _WRITE_CHUNK:
                    write_pending()
            if is_last_segment and not kept_last and last_header is not None:
                # The group's last batch stays (empty): the cleaned segment ends where the group did.
                empty = build_batch(last_header, b"", 0)
                pending_batches.append((pending_size, read_header(empty)))
                pending.append(empty)
                pending_size += len(empty)
        write_pending()
        return markers
