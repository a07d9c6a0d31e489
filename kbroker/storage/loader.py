"""Opening a partition directory: segments, indexes, crash recovery (Kafka's LogLoader)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from kbroker.storage import files
from kbroker.storage.index import CorruptIndexError
from kbroker.storage.leader_epoch import LeaderEpochCache
from kbroker.storage.log_config import LogConfig
from kbroker.storage.producer_state import CompletedTxn, ProducerStateManager
from kbroker.storage.segment import LogSegment
from kbroker.storage.txn_index import AbortedTxn
from kclient.errors import CorruptRecordError, KafkaStorageError

logger = logging.getLogger(__name__)


@dataclass
class LoadedLog:
    """The state of a partition directory after loading."""

    segments: list[LogSegment]
    log_start_offset: int
    recovery_point: int
    epoch_cache: LeaderEpochCache
    recovered_segments: int = 0
    truncated_bytes: int = 0
    deleted_segments: int = 0
    producer_state: ProducerStateManager | None = None
    """Idempotent-producer state rebuilt from the loaded segments (and snapshots)."""


def _remove_leftovers(dir: Path) -> list[int]:
    """Delete temporary and orphaned files; return the base offsets of the ``.log`` files.

    Raises KafkaStorageError if a segment or index name is not a regular file (its
    data cannot be read, and skipping it would silently drop it or the data after it).
    """
    bases: list[int] = []
    index_files: list[tuple[int, Path]] = []
    with os.scandir(dir) as entries:  # one listing, file types without a stat per file
        listing = [(entry.name, entry.is_file()) for entry in entries]
    for name, is_file in listing:
        path = dir / name
        if not is_file:
            if (files.is_log_file(path) or files.is_index_file(path)) and _is_segment_name(name):
                raise KafkaStorageError(f"segment file {path} is not a regular file")
            continue
        if files.is_temporary_file(path):
            logger.info("%s: removing leftover file %s", dir.name, name)
            path.unlink(missing_ok=True)
            continue
        try:
            base = files.offset_from_filename(name)
        except ValueError:
            continue
        if files.is_log_file(path):
            bases.append(base)
        elif files.is_index_file(path):
            index_files.append((base, path))
    present = set(bases)
    for base, path in index_files:
        if base not in present:
            logger.info("%s: removing orphaned index file %s", dir.name, path.name)
            path.unlink(missing_ok=True)
    return sorted(bases)


def _complete_swaps(dir: Path, config: LogConfig, now_ms: int) -> None:
    """Finish the log cleaner's swaps that a crash interrupted (Kafka's LogLoader rule).

    A ``<base>.log.swap`` file is a complete cleaned segment that replaces every live
    segment whose base offset lies in [base, the swap's next offset): those are
    deleted, then the swap files are renamed live (indexes are rebuilt from the data).
    ``.cleaned`` files (a cleaning that did not reach the swap) are left to
    :func:`_remove_leftovers`, which deletes them, and so is a swap without a valid batch.
    """
    swap_tail = files.LOG_SUFFIX + files.SWAP_SUFFIX
    for path in sorted(dir / name for name in os.listdir(dir) if name.endswith(swap_tail)):
        try:
            base = files.offset_from_filename(path.name)
        except ValueError:
            continue
        for index in (
            files.offset_index_file(dir, base, files.SWAP_SUFFIX),
            files.time_index_file(dir, base, files.SWAP_SUFFIX),
        ):
            index.unlink(missing_ok=True)
        segment = LogSegment.open(
            dir,
            base,
            index_interval_bytes=config.index_interval_bytes,
            max_index_size=config.segment_index_bytes,
            now_ms=now_ms,
            suffix=files.SWAP_SUFFIX,
        )
        try:
            segment.recover()
            if segment.is_empty:
                # A cleaned segment always holds at least the last batch of what it replaces.
                logger.warning("%s: removing swap segment %d: it holds no valid batch", dir.name, base)
                segment.delete()
                continue
            end = segment.next_offset
            replaced = []
            for live in dir.glob("*" + files.LOG_SUFFIX):
                try:
                    live_base = files.offset_from_filename(live.name)
                except ValueError:
                    continue
                if base <= live_base < end:
                    replaced.append(live_base)
                    for doomed in (
                        live,
                        files.offset_index_file(dir, live_base),
                        files.time_index_file(dir, live_base),
                        files.txn_index_file(dir, live_base),
                    ):
                        doomed.unlink(missing_ok=True)
            files.fsync_dir(dir)
            segment.rename_with_suffix("")
            files.fsync_dir(dir)
            logger.info(
                "%s: finished an interrupted swap of cleaned segment %d (replacing segments %s)",
                dir.name,
                base,
                sorted(replaced),
            )
        finally:
            segment.close()


def _is_segment_name(name: str) -> bool:
    try:
        files.offset_from_filename(name)
    except ValueError:
        return False
    return True


def _open_segment(dir: Path, base: int, config: LogConfig, now_ms: int) -> LogSegment:
    return LogSegment.open(
        dir,
        base,
        index_interval_bytes=config.index_interval_bytes,
        max_index_size=config.segment_index_bytes,
        create=False,
        now_ms=now_ms,
    )


def _load_trusted(segment: LogSegment, indexes_present: bool) -> int | None:
    """Load a segment that needs no recovery; rebuild it if its indexes do not hold up.

    Returns the bytes truncated by a rebuild, or None if no rebuild was needed.
    """
    reason = "" if indexes_present else "index file missing"
    if not reason:
        try:
            segment.sanity_check()
            if not segment.load():
                reason = "data does not end on a batch boundary"
        except (CorruptIndexError, CorruptRecordError) as exc:
            reason = str(exc)
    if not reason:
        return None
    logger.warning("segment %s: %s; rebuilding its indexes", segment.log_path, reason)
    return segment.recover()


def load_log(
    dir: Path,
    config: LogConfig,
    *,
    recovery_point: int,
    log_start_offset: int | None,
    clean_shutdown: bool,
    now_ms: int,
) -> LoadedLog:
    """Open (or create) the log in ``dir``.

    - finishes an interrupted cleaner swap (``.swap`` files replace the segments they
      cover), then removes ``.deleted``/``.cleaned``/``.tmp`` leftovers and orphaned indexes;
    - opens every segment; indexes that are missing or fail their sanity check are
      rebuilt from the data;
    - unless ``clean_shutdown``, recovers every segment from the one holding
      ``recovery_point``: each batch is validated and the first invalid byte ends the
      log: that segment is truncated there and every later segment is deleted;
    - loads the leader-epoch cache (rebuilt from the batches if its file is missing
      or unreadable) and trims it to the loaded offsets;
    - rebuilds the producer state (idempotent producers) from the newest usable
      ``.snapshot`` and the batch headers after it (see :mod:`.producer_state`);
    - rebuilds the aborted-transaction index (``.txnindex``) of every recovered segment
      from the transaction markers in the log (the replay starts at or below the first
      recovered segment, so it knows the transactions open there).
    """
    dir.mkdir(parents=True, exist_ok=True)
    _complete_swaps(dir, config, now_ms)
    bases = _remove_leftovers(dir)
    try:
        epoch_cache = LeaderEpochCache.load(dir)
        rebuild_epochs = epoch_cache.path is not None and not epoch_cache.path.exists() and bool(bases)
    except KafkaStorageError as exc:
        logger.warning("%s: %s; rebuilding the leader epoch cache from the log", dir.name, exc)
        epoch_cache = LeaderEpochCache(dir / files.LEADER_EPOCH_CHECKPOINT)
        rebuild_epochs = True

    loaded = LoadedLog([], 0, 0, epoch_cache)
    segments = loaded.segments
    try:
        for i, base in enumerate(bases):
            indexes_present = files.offset_index_file(dir, base).exists() and files.time_index_file(dir, base).exists()
            segment = _open_segment(dir, base, config, now_ms)
            segments.append(segment)
            last = i == len(bases) - 1
            unflushed = not clean_shutdown and (last or bases[i + 1] > recovery_point)
            if unflushed:
                continue  # recovered below, in order
            truncated = _load_trusted(segment, indexes_present)
            if truncated is not None:
                loaded.recovered_segments += 1
                loaded.truncated_bytes += truncated

        recovered_from = None if clean_shutdown else _recover_unflushed(loaded, recovery_point)
    except BaseException:
        for segment in segments:
            segment.close()
        raise

    if segments:
        end = segments[-1].next_offset
        start = max(log_start_offset or 0, segments[0].base_offset)
        if end < start:
            logger.warning(
                "%s: log end offset %d is below the log start offset %d (segment files were "
                "removed?); deleting every segment",
                dir.name,
                end,
                start,
            )
            for segment in segments:
                segment.delete()
            loaded.deleted_segments += len(segments)
            segments.clear()
            epoch_cache.clear()
    if not segments:
        base = max(log_start_offset or 0, 0)
        segments.append(
            LogSegment.open(
                dir,
                base,
                index_interval_bytes=config.index_interval_bytes,
                max_index_size=config.segment_index_bytes,
                create=True,
                now_ms=now_ms,
            )
        )
    log_end = segments[-1].next_offset
    loaded.log_start_offset = max(log_start_offset or 0, segments[0].base_offset)
    loaded.recovery_point = log_end if clean_shutdown else min(max(recovery_point, 0), log_end)

    if rebuild_epochs:
        # A fresh cache (clearing the old one would write the file): recovery may have filled it.
        epoch_cache = loaded.epoch_cache = LeaderEpochCache(epoch_cache.path)
        for segment in segments:
            for _, header in segment.iter_headers():
                if header.partition_leader_epoch >= 0:
                    epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
        try:
            epoch_cache.flush()
        except OSError as exc:  # a full disk: the log's next flush writes it (or a load rebuilds it again)
            logger.warning("%s: cannot write the rebuilt leader-epoch checkpoint: %s", dir.name, exc)
    epoch_cache.truncate_from_end(log_end)
    epoch_cache.truncate_from_start(loaded.log_start_offset)

    producer_state = ProducerStateManager(dir)
    try:
        if recovered_from is not None and recovered_from > log_end:
            recovered_from = None  # every recovered segment was deleted
        completed = producer_state.load(segments, loaded.log_start_offset, log_end, completed_from=recovered_from)
        if recovered_from is not None:
            _rebuild_txn_indexes([s for s in segments if s.base_offset >= recovered_from], completed)
    except BaseException:
        for segment in segments:
            segment.close()
        raise
    loaded.producer_state = producer_state

    if loaded.recovered_segments or loaded.deleted_segments:
        damaged = loaded.truncated_bytes or loaded.deleted_segments
        # Undamaged logs at DEBUG: after a crash every log is recovered, and one INFO line
        # each (2,000 at a broker's start) is volume without news; the log manager sums up.
        logger.log(
            logging.WARNING if damaged else logging.DEBUG,
            "%s: loaded with recovery: %d segments recovered, %d bytes truncated, "
            "%d segments deleted; log end offset %d",
            dir.name,
            loaded.recovered_segments,
            loaded.truncated_bytes,
            loaded.deleted_segments,
            log_end,
        )
    return loaded


def _rebuild_txn_indexes(segments: list[LogSegment], completed: list[CompletedTxn]) -> None:
    """Each segment's aborted-transaction index: the aborted transactions whose marker it holds."""
    for i, segment in enumerate(segments):
        end = segments[i + 1].base_offset if i + 1 < len(segments) else None
        segment.txn_index.reset(
            AbortedTxn(t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset)
            for t in completed
            if t.aborted and t.last_offset >= segment.base_offset and (end is None or t.last_offset < end)
        )


def _recover_unflushed(loaded: LoadedLog, recovery_point: int) -> int | None:
    """Validate the segments after the recovery point; cut the log at the first bad byte.
    Returns the base offset of the first segment recovered (None: no segment)."""
    segments = loaded.segments
    if not segments:
        return None
    first = 0
    while first < len(segments) - 1 and segments[first + 1].base_offset <= recovery_point:
        first += 1
    for i in range(first, len(segments)):
        segment = segments[i]
        min_offset = segments[i - 1].next_offset if i > 0 else None
        truncated = segment.recover(loaded.epoch_cache, min_offset=min_offset)
        loaded.recovered_segments += 1
        if truncated:
            loaded.truncated_bytes += truncated
            doomed = segments[i + 1 :]
            for later in doomed:
                logger.warning("deleting segment %s after corruption in %s", later.log_path, segment.log_path)
                later.delete()
            loaded.deleted_segments += len(doomed)
            del segments[i + 1 :]
            break
    return segments[first].base_offset
