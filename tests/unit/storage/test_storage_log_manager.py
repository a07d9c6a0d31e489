import os
import threading
import time
from pathlib import Path

import pytest
from storage_testutil import append_batches, log_files, make_batch, read_all, small_config, truncate_file

from kbroker.config import InvalidConfigError, build_config
from kbroker.storage import files
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kbroker.storage.log_manager import LogManager
from kclient.errors import InvalidTopicError, KafkaStorageError
from kclient.records import iter_headers

CONFIG = small_config()


def crash(manager: LogManager) -> None:
    """What a SIGKILL leaves: the files as they are, no marker, no checkpoint, lock freed."""
    manager._stop.set()
    if manager._thread is not None:
        manager._thread.join()
    for log in manager.logs().values():
        for segment in log.segments:
            segment._close_files()
    os.close(manager._lock_fd)  # the kernel drops the flock with the descriptor


def started(dir: Path, config: LogConfig = CONFIG, **kw: int) -> LogManager:
    manager = LogManager(dir, config, **kw)
    manager.startup()
    return manager


def test_second_manager_on_the_same_dir_is_refused(tmp_path: Path) -> None:
    first = started(tmp_path)
    with pytest.raises(KafkaStorageError, match="in use by another broker") as info:
        LogManager(tmp_path, CONFIG)
    assert str(os.getpid()) in str(info.value)
    first.shutdown()
    second = LogManager(tmp_path, CONFIG)  # the lock is free again
    second.shutdown()


def test_create_get_delete(tmp_path: Path) -> None:
    manager = started(tmp_path)
    assert manager.get("orders", 0) is None
    log = manager.get_or_create("orders", 0)
    assert manager.get_or_create("orders", 0) is log
    assert manager.get("orders", 0) is log
    assert log.dir == tmp_path / "orders-0"
    other = manager.get_or_create("my.topic_v2-x", 11, CONFIG.replace(retention_ms=5))
    assert other.config.retention_ms == 5
    assert set(manager.logs()) == {("orders", 0), ("my.topic_v2-x", 11)}
    append_batches(log, 3)
    assert manager.delete("orders", 0)
    assert not manager.delete("orders", 0)
    assert not (tmp_path / "orders-0").exists()
    assert not any(p.name.endswith("-delete") for p in tmp_path.iterdir())
    assert manager.get("orders", 0) is None
    assert manager.get_or_create("orders", 0).log_end_offset == 0
    with pytest.raises(InvalidTopicError):
        manager.get_or_create("bad topic", 0)
    with pytest.raises(ValueError):
        manager.get_or_create("t", -1)
    manager.shutdown()


def test_clean_restart(tmp_path: Path) -> None:
    manager = started(tmp_path)
    for topic, partition in [("a", 0), ("a", 1), ("b.c-d_e", 7)]:
        append_batches(manager.get_or_create(topic, partition), 20, per_batch=2)
    manager.get_or_create("a", 0).maybe_increment_log_start_offset(30)
    manager.shutdown()
    manager.shutdown()  # idempotent
    assert (tmp_path / files.CLEAN_SHUTDOWN_FILE).exists()
    assert files.read_offsets_checkpoint(tmp_path / files.RECOVERY_POINT_CHECKPOINT) == {
        ("a", 0): 40,
        ("a", 1): 40,
        ("b.c-d_e", 7): 40,
    }
    assert files.read_offsets_checkpoint(tmp_path / files.LOG_START_OFFSET_CHECKPOINT) == {
        ("a", 0): 30,
        ("a", 1): 0,
        ("b.c-d_e", 7): 0,
    }

    again = started(tmp_path)
    assert not (tmp_path / files.CLEAN_SHUTDOWN_FILE).exists()
    assert set(again.logs()) == {("a", 0), ("a", 1), ("b.c-d_e", 7)}
    log = again.get("a", 0)
    assert log is not None
    assert log.log_start_offset == 30 and log.log_end_offset == 40 and log.recovery_point == 40
    other = again.get("b.c-d_e", 7)
    assert other is not None and [r.offset for r in read_all(other)] == list(range(40))
    again.shutdown()


def test_unclean_restart_recovers(tmp_path: Path) -> None:
    manager = started(tmp_path)
    log = manager.get_or_create("t", 0)
    append_batches(log, 100, value_size=60)
    manager.checkpoint()  # recovery point 0: nothing flushed yet
    crash(manager)
    last = log_files(tmp_path / "t-0")[-1]
    headers = [h for _, h in iter_headers(last.read_bytes())]
    truncate_file(last, 10)

    again = started(tmp_path)
    recovered = again.get("t", 0)
    assert recovered is not None
    assert recovered.log_end_offset == headers[-1].base_offset
    assert [r.offset for r in read_all(recovered)] == list(range(headers[-1].base_offset))
    assert recovered.append_as_leader(make_batch(1), 0).first_offset == headers[-1].base_offset
    again.shutdown()


def test_startup_cleans_the_data_dir(tmp_path: Path) -> None:
    (tmp_path / "t-0.0123456789abcdef-delete").mkdir()
    (tmp_path / "t-0.0123456789abcdef-delete" / "00000000000000000000.log").write_bytes(b"x")
    (tmp_path / "not a partition").mkdir()
    (tmp_path / "lost+found").mkdir()
    manager = started(tmp_path)
    assert not (tmp_path / "t-0.0123456789abcdef-delete").exists()
    assert manager.logs() == {}
    manager.shutdown()


def test_topic_configs_at_startup(tmp_path: Path) -> None:
    manager = started(tmp_path)
    manager.get_or_create("special", 0)
    manager.get_or_create("plain", 0)
    manager.shutdown()
    again = LogManager(tmp_path, CONFIG)
    again.startup({"special": CONFIG.replace(retention_ms=123)})
    assert again.get("special", 0).config.retention_ms == 123  # type: ignore[union-attr]
    assert again.get("plain", 0).config == CONFIG  # type: ignore[union-attr]
    again.shutdown()


def test_background_thread_runs_retention_flush_and_checkpoints(tmp_path: Path) -> None:
    config = small_config(retention_ms=1000, flush_ms=10)
    manager = started(
        tmp_path,
        config,
        retention_check_interval_ms=20,
        flush_check_interval_ms=10,
        checkpoint_interval_ms=20,
    )
    log = manager.get_or_create("t", 0)
    append_batches(log, 3, timestamp=1)  # ancient timestamps
    log.roll()
    append_batches(log, 1, timestamp=int(time.time() * 1000))
    deadline = time.monotonic() + 10
    checkpoint = tmp_path / files.RECOVERY_POINT_CHECKPOINT
    while time.monotonic() < deadline:
        if (
            log.log_start_offset == 3
            and log.recovery_point == 4
            and files.read_offsets_checkpoint(checkpoint).get(("t", 0)) == 4
        ):
            break
        time.sleep(0.02)
    assert log.log_start_offset == 3 and log.num_segments == 1
    assert log.recovery_point == 4
    assert files.read_offsets_checkpoint(checkpoint) == {("t", 0): 4}
    manager.shutdown()


def test_shut_down_manager_refuses_new_logs(tmp_path: Path) -> None:
    manager = started(tmp_path)
    manager.shutdown()
    with pytest.raises(KafkaStorageError):
        manager.get_or_create("t", 0)


# ---------------------------------------------------------------- parallel loading


def _count_opens(monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, int], set[str]]:
    """Count Log.open per directory and name the threads it ran on (each open is slowed
    a little so that a pool's threads overlap)."""
    opened: dict[str, int] = {}
    threads: set[str] = set()
    guard = threading.Lock()
    real_open = Log.open

    def counting_open(dir: Path, *args: object, **kw: object) -> Log:
        with guard:
            opened[Path(dir).name] = opened.get(Path(dir).name, 0) + 1
            threads.add(threading.current_thread().name)
        time.sleep(0.005)
        return real_open(dir, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Log, "open", counting_open)
    return opened, threads


@pytest.mark.parametrize("clean", [True, False])
def test_parallel_loading_loads_every_log_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean: bool
) -> None:
    manager = started(tmp_path)
    keys = [(f"t{i % 3}", i) for i in range(40)]
    for n, (topic, partition) in enumerate(keys):
        append_batches(manager.get_or_create(topic, partition), 1 + n % 5, per_batch=2)
    if clean:
        manager.shutdown()
    else:
        crash(manager)
        assert not (tmp_path / files.CLEAN_SHUTDOWN_FILE).exists()
    # One directory that cannot be loaded: it stays offline, the others load.
    (tmp_path / "bad-0").mkdir()
    (tmp_path / "bad-0" / "00000000000000000000.log").mkdir()
    opened, threads = _count_opens(monkeypatch)

    again = started(tmp_path, recovery_threads=4)
    try:
        assert opened == {f"{t}-{p}": 1 for t, p in keys} | {"bad-0": 1}
        assert len(threads) > 1 and all(name.startswith("log-recovery-") for name in threads)
        assert set(again.logs()) == set(keys)
        assert set(again.offline_logs()) == {("bad", 0)}
        for n, key in enumerate(keys):
            log = again.get(*key)
            assert log is not None
            assert [r.offset for r in read_all(log)] == list(range(2 * (1 + n % 5)))
        assert not (tmp_path / files.CLEAN_SHUTDOWN_FILE).exists()
    finally:
        again.shutdown()
    assert not (tmp_path / files.CLEAN_SHUTDOWN_FILE).exists()  # bad-0 is still offline


def test_parallel_shutdown_closes_every_log_then_writes_the_marker(tmp_path: Path) -> None:
    manager = started(tmp_path, recovery_threads=4)
    keys = [("t", i) for i in range(30)]
    for key in keys:
        append_batches(manager.get_or_create(*key), 3)
    logs = list(manager.logs().values())
    manager.shutdown()
    assert all(log._closed for log in logs)
    assert (tmp_path / files.CLEAN_SHUTDOWN_FILE).exists()
    assert files.read_offsets_checkpoint(tmp_path / files.RECOVERY_POINT_CHECKPOINT) == {key: 3 for key in keys}
    again = started(tmp_path, recovery_threads=4)
    assert not (tmp_path / files.CLEAN_SHUTDOWN_FILE).exists()
    assert all(log.log_end_offset == 3 and log.recovery_point == 3 for log in again.logs().values())
    again.shutdown()


def test_a_failing_close_leaves_no_marker_with_parallel_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = started(tmp_path, recovery_threads=4)
    for i in range(8):
        append_batches(manager.get_or_create("t", i), 2)
    bad = manager.get("t", 5)
    assert bad is not None

    def failing_flush() -> None:
        raise KafkaStorageError("disk gone")

    monkeypatch.setattr(bad, "flush", failing_flush)
    manager.shutdown()
    assert not (tmp_path / files.CLEAN_SHUTDOWN_FILE).exists()


def test_recovery_threads_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="recovery_threads"):
        LogManager(tmp_path, CONFIG, recovery_threads=0)


def test_num_recovery_threads_per_data_dir_is_a_broker_setting() -> None:
    base = {"broker.id": "0", "zookeeper.connect": "h:1", "log.dirs": "/tmp/x"}
    assert build_config(base).num_recovery_threads_per_data_dir == 1  # Kafka's default
    assert build_config({**base, "num.recovery.threads.per.data.dir": "4"}).num_recovery_threads_per_data_dir == 4
    with pytest.raises(InvalidConfigError):
        build_config({**base, "num.recovery.threads.per.data.dir": "0"})
