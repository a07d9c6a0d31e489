"""The log cleaner threads of one data directory (Kafka's LogCleaner + LogCleanerManager)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from kbroker.storage import files
from kbroker.storage.cleaner import Cleaner, CleanerAbortedError, Throttler, first_uncleanable_offset
from kbroker.storage.log import Log
from kbroker.storage.offset_map import BYTES_PER_ENTRY, DEFAULT_LOAD_FACTOR, OffsetMap

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
"""``topic partition offset``: where each log's dirty part starts."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class CleanerConfig:
    """The broker's ``log.cleaner.*`` settings, with Kafka's defaults."""

    enable: bool = True
    """log.cleaner.enable"""
    threads: int = 1
    """log.cleaner.threads"""
    backoff_ms: int = 15_000
    """log.cleaner.backoff.ms: the sleep when no log needs cleaning."""
    dedupe_buffer_size: int = 128 * 1024 * 1024
    """log.cleaner.dedupe.buffer.size: offset-map memory, shared by the threads."""
    io_max_bytes_per_second: float = float("inf")
    """log.cleaner.io.max.bytes.per.second: read plus write, all threads together."""
    io_buffer_load_factor: float = DEFAULT_LOAD_FACTOR
    """log.cleaner.io.buffer.load.factor"""


class LogToClean(NamedTuple):
    """A compacted log and how dirty it is."""

    key: TopicPartition
    log: Log
    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    dirty_bytes: int
    forced: bool
    """max.compaction.lag.ms is overdue."""
    recopy: bool = False
    """Tombstones in the clean part have passed their delete horizon."""

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


@dataclass
class _PartitionState:
    bytes_cleaned: int = 0
    last_clean_ms: int = -1
    last_clean_mb_per_s: float = 0.0
    uncleanable: str | None = None
    delete_horizon_ms: int | None = None
    """The earliest delete horizon of the tombstones kept by the last cleaning."""


class LogCleaner:
    """Cleaner threads for the compacted logs of one data directory.

    Each thread repeatedly takes the *filthiest* log (largest dirty ratio) among those
    whose ratio is at least ``min.cleanable.dirty.ratio``, whose max.compaction.lag.ms
    is overdue, or whose kept tombstones have passed their delete horizon, cleans one
    pass of it (see :class:`~kbroker.storage.cleaner.Cleaner`),
    moves its checkpoint, and sleeps ``log.cleaner.backoff.ms`` only when nothing needs
    cleaning. Every broker cleans its own copies, leader or follower.

    Files: ``<data_dir>/cleaner-offset-checkpoint`` (``topic partition offset``: the
    first dirty offset of each log), written after every cleaning.

    Errors: a cleaning that fails is logged and marks its partition *uncleanable*
    (skipped until a restart, as Kafka), and the thread lives on; one that finds its log
    changed under it (truncated, deleted) is just retried later.

    Thread safety: all methods may be called from any thread; one lock guards the
    checkpoint map, the logs in progress and the per-partition state, another the
    threads' lifecycle (start, stop, :meth:`reconfigure`).
    """

    def __init__(self, data_dir: Path, logs: Callable[[], dict[TopicPartition, Log]], config: CleanerConfig) -> None:
        if config.threads < 1:
            raise ValueError(f"log.cleaner.threads must be at least 1, not {config.threads}")
        self._data_dir = data_dir
        self._logs = logs
        self._config = config
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._checkpoints: dict[TopicPartition, int] = files.read_offsets_checkpoint(data_dir / CLEANER_CHECKPOINT)
        self._in_progress: set[TopicPartition] = set()
        self._state: dict[TopicPartition, _PartitionState] = {}
        self._throttler = Throttler(config.io_max_bytes_per_second)
        self._map_memory = max(config.dedupe_buffer_size // config.threads, BYTES_PER_ENTRY)
        self._threads: list[threading.Thread] = []
        self._lifecycle = threading.Lock()
        """Serialises startup / shutdown / reconfigure."""
        self._shut_down = False

    @property
    def config(self) -> CleanerConfig:
        return self._config

    # ------------------------------------------------------------------ lifecycle

    def startup(self) -> None:
        with self._lifecycle:
            self._start_locked()

    def _start_locked(self) -> None:
        if not self._config.enable or self._threads or self._shut_down:
            return
        stop = self._stop
        for n in range(self._config.threads):
            thread = threading.Thread(target=self._run, args=(stop,), name=f"log-cleaner-{n}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def shutdown(self) -> None:
        """Stop the threads (a cleaning in progress finishes its current group first)."""
        with self._lifecycle:
            self._shut_down = True
            self._stop_locked()

    def _stop_locked(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def thread_names(self) -> list[str]:
        """The names of the running cleaner threads."""
        with self._lifecycle:
            return [t.name for t in self._threads if t.is_alive()]

    def reconfigure(self, config: CleanerConfig) -> None:
        """Use ``config`` from now on (Kafka's LogCleaner.reconfigure, for the dynamic
        log.cleaner.* configs): the threads stop after their current pass, and new ones
        start with the new thread count, dedupe buffer share, throttle and backoff.
        ``enable`` stays as it was (it is not dynamic). Checkpoints and per-partition state
        are kept."""
        if config.threads < 1:
            raise ValueError(f"log.cleaner.threads must be at least 1, not {config.threads}")
        with self._lifecycle:
            config = replace(config, enable=self._config.enable)
            if config == self._config:
                return
            running = bool(self._threads)
            self._stop_locked()
            self._config = config
            self._stop = threading.Event()
            self._throttler = Throttler(config.io_max_bytes_per_second)
            self._map_memory = max(config.dedupe_buffer_size // config.threads, BYTES_PER_ENTRY)
            if running:
                self._start_locked()
        logger.info(
            "log cleaner reconfigured: %d thread(s), backoff %d ms, dedupe buffer %d bytes, io max %s bytes/s",
            config.threads,
            config.backoff_ms,
            config.dedupe_buffer_size,
            config.io_max_bytes_per_second,
        )

    def _run(self, stop: threading.Event) -> None:
        cleaner = self.new_cleaner()
        backoff_s = self._config.backoff_ms / 1000
        while not stop.is_set():
            try:
                cleaned = self.clean_filthiest_log(cleaner)
            except Exception:  # never kill the thread
                logger.exception("log cleaner pass failed")
                cleaned = False
            if not cleaned:
                stop.wait(backoff_s)

    def new_cleaner(self) -> Cleaner:
        """A cleaner with one thread's share of the dedupe buffer."""
        return Cleaner(OffsetMap(self._map_memory, self._config.io_buffer_load_factor), throttler=self._throttler)

    # ------------------------------------------------------------------ choosing

    def _first_dirty(self, key: TopicPartition, log: Log) -> int:
        checkpoint = self._checkpoints.get(key, log.log_start_offset)
        if checkpoint < log.log_start_offset or checkpoint > log.log_end_offset:
            return log.log_start_offset
        return checkpoint

    def cleanable(self, key: TopicPartition, log: Log, now_ms: int) -> LogToClean:
        """How dirty ``log`` is now."""
        first_dirty = self._first_dirty(key, log)
        uncleanable = first_uncleanable_offset(log, now_ms)
        clean = dirty = 0
        first_dirty_segment = None
        for segment in log.segments[:-1]:
            if segment.base_offset >= uncleanable:
                break
            if segment.next_offset <= first_dirty:
                clean += segment.size
            elif segment.size:
                dirty += segment.size
                if first_dirty_segment is None:
                    first_dirty_segment = segment
        forced = False
        lag = log.config.max_compaction_lag_ms
        if first_dirty_segment is not None and lag < 2**63 - 1:
            first = next(iter(first_dirty_segment.iter_headers()), None)
            if first is not None:
                ts = first[1].max_timestamp
                forced = ts >= 0 and now_ms - ts > lag
        return LogToClean(key, log, first_dirty, uncleanable, clean, dirty, forced)

    def filthiest(self, now_ms: int) -> LogToClean | None:
        """The log to clean next (and mark it in progress), None if none needs it."""
        with self._lock:
            candidates: list[LogToClean] = []
            for key, log in self._logs().items():
                truncated = log.take_truncation()
                if truncated is not None and self._checkpoints.get(key, -1) > truncated:
                    self._checkpoints[key] = truncated  # Kafka's maybeTruncateCheckpoint
                if (
                    key in self._in_progress
                    or log.offline
                    or log.closed
                    or not log.config.compact_enabled
                    or self._state_of(key).uncleanable is not None
                ):
                    continue
                try:
                    c = self.cleanable(key, log, now_ms)
                except Exception as exc:
                    logger.warning("cannot measure how dirty %s-%d is: %s", *key, exc)
                    continue
                if c.dirty_bytes and c.first_dirty < c.first_uncleanable:
                    if c.forced or c.dirty_ratio >= log.config.min_cleanable_dirty_ratio:
                        candidates.append(c)
                        continue
                horizon = self._state_of(key).delete_horizon_ms
                if horizon is not None and now_ms >= horizon:
                    candidates.append(c._replace(forced=True, recopy=True))
            if not candidates:
                return None
            best = max(candidates, key=lambda c: (c.forced, c.dirty_ratio))
            self._in_progress.add(best.key)
            return best

    def _state_of(self, key: TopicPartition) -> _PartitionState:
        state = self._state.get(key)
        if state is None:
            state = self._state[key] = _PartitionState()
        return state

    # ------------------------------------------------------------------ cleaning

    def clean_filthiest_log(self, cleaner: Cleaner, now_ms: int | None = None) -> bool:
        """Clean one pass of the filthiest log; returns whether there was one."""
        now = _now_ms() if now_ms is None else now_ms
        chosen = self.filthiest(now)
        if chosen is None:
            return False
        key, log = chosen.key, chosen.log
        try:
            end, stats = cleaner.clean(log, chosen.first_dirty, chosen.first_uncleanable, now, recopy=chosen.recopy)
        except CleanerAbortedError as exc:
            logger.info("%s", exc)
            return True
        except Exception as exc:
            with self._lock:
                self._in_progress.discard(key)
                if log.closed or log.offline:
                    return True
                reason = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                self._state_of(key).uncleanable = reason
            logger.exception("cleaning %s-%d failed; it is marked uncleanable until a restart", *key)
            return True
        finally:
            with self._lock:
                self._in_progress.discard(key)
        with self._lock:
            self._checkpoints[key] = end
            state = self._state_of(key)
            state.bytes_cleaned += stats.bytes_read
            state.delete_horizon_ms = stats.earliest_delete_horizon
            state.last_clean_ms = _now_ms()
            if stats.elapsed_s > 0:
                state.last_clean_mb_per_s = stats.bytes_read / stats.elapsed_s / 1e6
            self._write_checkpoint_locked()
        logger.info(
            "%s: cleaned offsets %d..%d: %d segments, %.1f MB read, %.1f MB written, %d of %d records kept, %.2f s",
            log.name,
            chosen.first_dirty,
            end,
            stats.segments_cleaned,
            stats.bytes_read / 1e6,
            stats.bytes_written / 1e6,
            stats.records_kept,
            stats.records_read,
            stats.elapsed_s,
        )
        return True

    def _write_checkpoint_locked(self) -> None:
        live = self._logs()
        self._checkpoints = {k: v for k, v in self._checkpoints.items() if k in live}
        files.write_offsets_checkpoint(self._data_dir / CLEANER_CHECKPOINT, self._checkpoints)

    # ------------------------------------------------------------------ state for operators

    def state(self, now_ms: int | None = None) -> dict[TopicPartition, dict[str, object]]:
        """Per compacted partition: ``dirty_ratio``, ``last_cleaned_offset`` (the
        checkpoint, -1 if never cleaned), ``first_uncleanable_offset``, ``bytes_cleaned``
        (total read by the cleaner since start-up), ``last_clean_ms``, ``uncleanable``
        (the reason, or None)."""
        now = _now_ms() if now_ms is None else now_ms
        out: dict[TopicPartition, dict[str, object]] = {}
        with self._lock:
            for key, log in self._logs().items():
                if not log.config.compact_enabled or log.closed or log.offline:
                    continue
                try:
                    c = self.cleanable(key, log, now)
                except Exception:
                    continue
                st = self._state_of(key)
                out[key] = {
                    "dirty_ratio": round(c.dirty_ratio, 4),
                    "last_cleaned_offset": self._checkpoints.get(key, -1),
                    "first_uncleanable_offset": c.first_uncleanable,
                    "bytes_cleaned": st.bytes_cleaned,
                    "last_clean_ms": st.last_clean_ms,
                    "last_clean_mb_per_s": round(st.last_clean_mb_per_s, 2),
                    "uncleanable": st.uncleanable,
                }
        return out

    def forget(self, key: TopicPartition) -> None:
        """A log was deleted: drop its checkpoint and state."""
        with self._lock:
            self._checkpoints.pop(key, None)
            self._state.pop(key, None)
