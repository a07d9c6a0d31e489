"""Every partition log of one broker data directory (Kafka's LogManager)."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from kbroker.storage import files
from kbroker.storage.cleaner_manager import CleanerConfig, LogCleaner
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient.errors import IllegalStateError, KafkaStorageError
from kclient.topic_name import validate_topic_name

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _UnloadedLog(NamedTuple):
    """A partition directory that could not be loaded at start-up (kept offline)."""

    dir: Path
    reason: str
    recovery_point: int | None
    log_start_offset: int | None
    """The checkpointed offsets, written back to the checkpoints until the log loads again."""


class LogManager:
    """Owns the data directory of a broker and the :class:`Log` of every partition in it.

    Files in ``data_dir``: ``.lock`` (held with an exclusive ``flock`` for the life
    of the manager, so two brokers can never share a directory), one
    ``<topic>-<partition>`` directory per log, ``recovery-point-offset-checkpoint``
    and ``log-start-offset-checkpoint`` (written every ``checkpoint_interval_ms`` and
    at shutdown) and ``.kafka_cleanshutdown`` (written by a clean :meth:`shutdown`,
    removed by :meth:`startup`; without it logs are recovered from their recovery
    points).

    Lifecycle: construct (takes the lock), :meth:`startup` (loads the logs, starts
    the background thread), use, :meth:`shutdown` (flushes, closes, checkpoints,
    writes the marker, releases the lock).

    ``recovery_threads`` (Kafka's num.recovery.threads.per.data.dir, default 1) threads
    load the logs at start-up and flush and close them at shutdown. Loading is mostly
    Python work under the GIL: on a busy 2-core machine 4 threads loaded 2,000 logs
    more slowly than 1 did; more threads pay off only where disk reads are the wait.

    Offline logs: a partition directory that cannot be loaded (an unopenable or
    unreadable segment) does not stop the start-up. It is logged once at ERROR and
    kept offline: not in :meth:`logs`, :meth:`get` answers None, :meth:`get_or_create`
    raises KafkaStorageError (it never creates a fresh log over it), its checkpointed
    offsets are kept, :meth:`delete` still removes it. A loaded log that later fails
    I/O it cannot undo is offline too (:attr:`Log.offline`). :meth:`offline_logs` and
    :meth:`offline_reason` name both kinds; while any log is offline, shutdown writes
    no clean-shutdown marker (the next start recovers). As Kafka takes a log
    directory offline; here each partition has its own directory.

    Log cleaner: :class:`LogCleaner` threads compact the logs whose cleanup.policy
    includes ``compact`` (``cleaner_config``: the broker's log.cleaner.* settings);
    they start with :meth:`startup` and stop first in :meth:`shutdown`.

    Background thread (daemon): retention every ``retention_check_interval_ms``,
    ``flush_if_due`` every ``flush_check_interval_ms``, checkpoints every
    ``checkpoint_interval_ms``. A failing task is logged and retried next time.

    Thread safety: all methods may be called from any thread; the map of logs has
    its own lock and each Log is thread-safe.
    """

    def __init__(
        self,
        data_dir: Path,
        default_config: LogConfig,
        *,
        retention_check_interval_ms: int = 300_000,
        flush_check_interval_ms: int = 1000,
        checkpoint_interval_ms: int = 60_000,
        cleaner_config: CleanerConfig | None = None,
        current_default: LogConfig | None = None,
        recovery_threads: int = 1,
    ) -> None:
        for name, value in (
            ("recovery_threads", recovery_threads),
            ("retention_check_interval_ms", retention_check_interval_ms),
            ("flush_check_interval_ms", flush_check_interval_ms),
            ("checkpoint_interval_ms", checkpoint_interval_ms),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, not {value}")
        self._data_dir = Path(data_dir)
        self._default_config = default_config
        self._current_default = current_default or default_config
        self._retention_interval_ms = retention_check_interval_ms
        self._flush_interval_ms = flush_check_interval_ms
        self._checkpoint_interval_ms = checkpoint_interval_ms
        self._recovery_threads = recovery_threads
        self._logs: dict[TopicPartition, Log] = {}
        self._unloaded: dict[TopicPartition, _UnloadedLog] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._shut_down = False
        try:
            self._data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise KafkaStorageError(f"cannot create data directory {self._data_dir}: {exc}") from exc
        self._lock_fd = self._acquire_dir_lock()
        self._cleaner = LogCleaner(self._data_dir, self.logs, cleaner_config or CleanerConfig())

    def _acquire_dir_lock(self) -> int:
        path = self._data_dir / files.LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise KafkaStorageError(f"cannot open lock file {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            owner = f" (process {holder})" if holder else ""
            raise KafkaStorageError(
                f"data directory {self._data_dir} is in use by another broker{owner}: cannot lock {path}"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise KafkaStorageError(f"cannot lock {path}: {exc}") from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _release_dir_lock(self) -> None:
        if self._lock_fd >= 0:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            finally:
                os.close(self._lock_fd)
                self._lock_fd = -1

    # ------------------------------------------------------------------ properties

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    @property
    def default_config(self) -> LogConfig:
        """The static log defaults (``server.properties`` / flags), as DescribeConfigs
        reports them (STATIC_BROKER_CONFIG)."""
        return self._default_config

    @property
    def current_default(self) -> LogConfig:
        """The log defaults in force: the static ones with the dynamic broker configs on
        top. Logs are loaded with it, and new logs created without a config get it."""
        return self._current_default

    def set_current_default(self, config: LogConfig) -> None:
        """A dynamic broker config changed the defaults (existing logs are reconfigured by
        the replica manager, which knows each topic's overrides)."""
        self._current_default = config

    # ------------------------------------------------------------------ lifecycle

    def startup(self, topic_configs: Mapping[str, LogConfig] | None = None) -> None:
        """Load every partition directory and start the background thread.

        ``topic_configs`` gives the config of topics that override the defaults.
        Logs are recovered from their checkpointed recovery points unless the last
        shutdown was clean. Directories marked ``-delete`` are removed.
        """
        with self._lock:
            if self._started or self._shut_down:
                raise IllegalStateError("LogManager.startup() may be called once")
            self._started = True
            configs = dict(topic_configs or {})
            marker = self._data_dir / files.CLEAN_SHUTDOWN_FILE
            clean = marker.exists()
            recovery_points = files.read_offsets_checkpoint(self._data_dir / files.RECOVERY_POINT_CHECKPOINT)
            start_offsets = files.read_offsets_checkpoint(self._data_dir / files.LOG_START_OFFSET_CHECKPOINT)
            started = time.monotonic()
            jobs: list[tuple[TopicPartition, Path]] = []
            for path in sorted(self._data_dir.iterdir()):
                if not path.is_dir():
                    continue
                if files.is_delete_dir_name(path.name):
                    logger.info("removing partition directory %s marked for deletion", path)
                    shutil.rmtree(path, ignore_errors=True)
                    continue
                try:
                    topic, partition = files.parse_partition_dir_name(path.name)
                    validate_topic_name(topic)
                except Exception:
                    logger.warning("ignoring %s: not a partition directory", path)
                    continue
                jobs.append(((topic, partition), path))

            def load(key: TopicPartition, path: Path) -> Log | _UnloadedLog:
                try:
                    return Log.open(
                        path,
                        configs.get(key[0], self._current_default),
                        recovery_point=recovery_points.get(key, 0),
                        log_start_offset=start_offsets.get(key),
                        clean_shutdown=clean,
                    )
                except Exception as exc:
                    reason = getattr(exc, "message", None) or str(exc)
                    logger.error(
                        "cannot load the log of %s-%d in %s, it stays offline (KAFKA_STORAGE_ERROR) "
                        "until a restart loads it: %s",
                        key[0],
                        key[1],
                        path,
                        reason,
                    )
                    return _UnloadedLog(path, reason, recovery_points.get(key), start_offsets.get(key))

            threads = min(self._recovery_threads, len(jobs))
            if threads > 1:
                results = self._load_in_parallel(jobs, load, threads)
            else:
                results = []
                try:
                    for key, path in jobs:
                        results.append((key, load(key, path)))
                except BaseException:
                    for _, done in results:
                        if isinstance(done, Log):
                            done.close()
                    raise
            for key, result in results:
                if isinstance(result, Log):
                    self._logs[key] = result
                else:
                    self._unloaded[key] = result
            loaded = len(self._logs) + len(self._unloaded)
            logger.info(
                "loaded %d logs from %s in %.1f s with %d thread%s (%s)%s",
                len(self._logs),
                self._data_dir,
                time.monotonic() - started,
                max(threads, 1),
                "" if threads <= 1 else "s",
                # Only a directory that holds logs and lacks the marker had an unclean shutdown.
                "clean shutdown" if clean else "unclean shutdown, recovered" if loaded else "new data directory",
                f"; {len(self._unloaded)} offline" if self._unloaded else "",
            )
            if clean:
                marker.unlink(missing_ok=True)
                files.fsync_dir(self._data_dir)
            self._thread = threading.Thread(target=self._run, name=f"log-manager-{self._data_dir.name}", daemon=True)
            self._thread.start()
            self._cleaner.startup()

    def _load_in_parallel(
        self,
        jobs: list[tuple[TopicPartition, Path]],
        load: Callable[[TopicPartition, Path], Log | _UnloadedLog],
        threads: int,
    ) -> list[tuple[TopicPartition, Log | _UnloadedLog]]:
        """``load`` every job on a pool of ``threads`` (Kafka's recovery threads); the
        results in job order. If anything escapes (an interrupt), every log that did
        load is closed before it propagates."""
        pool = ThreadPoolExecutor(threads, thread_name_prefix=f"log-recovery-{self._data_dir.name}")
        futures = [(key, pool.submit(load, key, path)) for key, path in jobs]
        results: list[tuple[TopicPartition, Log | _UnloadedLog]] = []
        try:
            for key, future in futures:
                results.append((key, future.result()))
        except BaseException:
            for _, future in futures:
                future.cancel()
            pool.shutdown(wait=True)
            for _, future in futures:
                if future.done() and not future.cancelled() and future.exception() is None:
                    loaded = future.result()
                    if isinstance(loaded, Log):
                        loaded.close()
            raise
        pool.shutdown(wait=True)
        return results

    def shutdown(self) -> None:
        """Stop the background thread, flush and close every log, write the checkpoints
        and the clean-shutdown marker, release the directory lock. Idempotent."""
        with self._lock:
            if self._shut_down:
                return
            self._shut_down = True
            thread = self._thread
        self._stop.set()
        self._cleaner.shutdown()
        if thread is not None:
            thread.join()
        with self._lock:

            def close(key: TopicPartition, log: Log) -> bool:
                """Flush and close one log; whether it closed clean."""
                try:
                    online = not log.offline
                    if online:
                        log.flush()
                    log.close()
                    return online
                except Exception:
                    logger.exception("error closing the log of %s-%d", *key)
                    return False

            logs = list(self._logs.items())
            threads = min(self._recovery_threads, len(logs))
            if threads > 1:
                with ThreadPoolExecutor(threads, thread_name_prefix=f"log-close-{self._data_dir.name}") as pool:
                    closed = list(pool.map(lambda item: close(*item), logs))
            else:
                closed = [close(key, log) for key, log in logs]
            clean = not self._unloaded and all(closed)
            try:
                if self._started:
                    self._write_checkpoints()
                    if clean:
                        files.atomic_write(self._data_dir / files.CLEAN_SHUTDOWN_FILE, b"")
            finally:
                self._release_dir_lock()
            logger.info("log manager of %s shut down (%s)", self._data_dir, "clean" if clean else "with errors")

    # ------------------------------------------------------------------ logs

    def get(self, topic: str, partition: int) -> Log | None:
        """The partition's log, None if absent or if it could not be loaded (see :meth:`offline_reason`)."""
        with self._lock:
            return self._logs.get((topic, partition))

    def offline_reason(self, topic: str, partition: int) -> str | None:
        """Why the partition's log is offline (it could not be loaded, or an I/O error
        took it offline since), None if it is online or absent. A replica manager answers
        KAFKA_STORAGE_ERROR for the partition while this is not None."""
        with self._lock:
            key = (topic, partition)
            unloaded = self._unloaded.get(key)
            if unloaded is not None:
                return unloaded.reason
            log = self._logs.get(key)
            return log.offline_reason if log is not None else None

    def offline_logs(self) -> dict[TopicPartition, str]:
        """Every offline log and why, by (topic, partition)."""
        with self._lock:
            out = {key: u.reason for key, u in self._unloaded.items()}
            for key, log in self._logs.items():
                reason = log.offline_reason
                if reason is not None:
                    out[key] = reason
            return out

    def get_or_create(self, topic: str, partition: int, config: LogConfig | None = None) -> Log:
        """The log of the partition, created empty (with ``config``) if absent; an
        existing log gets ``config`` if it has another (logs are loaded at start-up with
        the defaults, before the topic configs are known).

        Raises KafkaStorageError for a log that could not be loaded at start-up.
        """
        validate_topic_name(topic)
        if partition < 0:
            raise ValueError(f"partition number must be >= 0, not {partition}")
        with self._lock:
            self._ensure_running()
            key = (topic, partition)
            unloaded = self._unloaded.get(key)
            if unloaded is not None:
                raise KafkaStorageError(
                    f"the log of {topic}-{partition} in {unloaded.dir} is offline: {unloaded.reason}"
                )
            log = self._logs.get(key)
            if log is None:
                path = self._data_dir / files.partition_dir_name(topic, partition)
                log = Log.open(path, config or self._current_default)
                files.fsync_dir(self._data_dir)
                self._logs[key] = log
                logger.debug("created log for %s-%d in %s", topic, partition, path)
            elif config is not None and log.config != config:
                # Loaded at start-up with the defaults: the topic's own config applies now.
                log.update_config(config)
            return log

    def delete(self, topic: str, partition: int) -> bool:
        """Close the partition's log and remove its directory; returns whether it existed.

        The directory is first renamed ``<topic>-<partition>.<uuidhex>-delete`` so an
        interrupted removal is finished at the next startup.
        """
        with self._lock:  # held throughout: a concurrent get_or_create must not see the dir
            log = self._logs.pop((topic, partition), None)
            unloaded = self._unloaded.pop((topic, partition), None)
            if log is not None:
                log.close()
                dir = log.dir
            elif unloaded is not None:
                dir = unloaded.dir
            else:
                return False
            target = self._data_dir / files.delete_dir_name(topic, partition)
            try:
                os.replace(dir, target)
                files.fsync_dir(self._data_dir)
            except FileNotFoundError:
                return True
            except OSError as exc:
                raise KafkaStorageError(f"cannot delete {dir}: {exc}") from exc
        self._cleaner.forget((topic, partition))
        try:
            shutil.rmtree(target)
        except OSError as exc:  # finished at the next startup
            logger.warning("could not remove %s: %s", target, exc)
        logger.info("deleted log of %s-%d", topic, partition)
        return True

    def logs(self) -> dict[TopicPartition, Log]:
        """A snapshot of every log, by (topic, partition)."""
        with self._lock:
            return dict(self._logs)

    def _ensure_running(self) -> None:
        if self._shut_down:
            raise KafkaStorageError(f"the log manager of {self._data_dir} is shut down")

    # ------------------------------------------------------------------ compaction

    @property
    def cleaner(self) -> LogCleaner:
        """The log cleaner (compaction) of this directory."""
        return self._cleaner

    def cleaner_state(self) -> dict[TopicPartition, dict[str, object]]:
        """Per compacted partition: dirty ratio, last cleaned offset, bytes cleaned,
        uncleanable reason (see :meth:`LogCleaner.state`)."""
        return self._cleaner.state()

    # ------------------------------------------------------------------ periodic tasks

    def cleanup_logs(self, now_ms: int | None = None) -> int:
        """Apply retention to every log; returns the number of segments deleted."""
        now = _now_ms() if now_ms is None else now_ms
        total = 0
        for key, log in self.logs().items():
            try:
                total += log.delete_old_segments(now)
            except Exception:
                logger.exception("retention failed for %s-%d", *key)
        return total

    def flush_dirty_logs(self, now_ms: int | None = None) -> None:
        """``flush_if_due`` on every log."""
        now = _now_ms() if now_ms is None else now_ms
        for key, log in self.logs().items():
            try:
                log.flush_if_due(now)
            except Exception:
                logger.exception("flush failed for %s-%d", *key)

    def checkpoint(self) -> None:
        """Write the recovery-point and log-start-offset checkpoint files now."""
        with self._lock:
            self._write_checkpoints()

    def _write_checkpoints(self) -> None:
        logs = dict(self._logs)
        recovery_points = {key: u.recovery_point for key, u in self._unloaded.items() if u.recovery_point is not None}
        start_offsets = {key: u.log_start_offset for key, u in self._unloaded.items() if u.log_start_offset is not None}
        recovery_points.update((key, log.recovery_point) for key, log in logs.items())
        start_offsets.update((key, log.log_start_offset) for key, log in logs.items())
        files.write_offsets_checkpoint(self._data_dir / files.RECOVERY_POINT_CHECKPOINT, recovery_points)
        files.write_offsets_checkpoint(self._data_dir / files.LOG_START_OFFSET_CHECKPOINT, start_offsets)

    def _run(self) -> None:
        tasks: list[tuple[int, Callable[[], object]]] = [
            (self._retention_interval_ms, self.cleanup_logs),
            (self._flush_interval_ms, self.flush_dirty_logs),
            (self._checkpoint_interval_ms, self.checkpoint),
        ]
        now = _now_ms()
        due = [now + interval for interval, _ in tasks]
        while True:
            wait_ms = max(min(due) - _now_ms(), 0)
            if self._stop.wait(wait_ms / 1000):
                return
            now = _now_ms()
            for i, (interval, task) in enumerate(tasks):
                if now >= due[i]:
                    try:
                        task()
                    except Exception:
                        logger.exception("log manager task %s failed", getattr(task, "__name__", task))
                    due[i] = _now_ms() + interval
                if self._stop.is_set():
                    return

    def __repr__(self) -> str:
        return f"LogManager({self._data_dir}, {len(self._logs)} logs)"
