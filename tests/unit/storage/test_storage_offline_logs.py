"""One unopenable segment does not stop the broker; a new data dir is not "unclean".

Real broken partition directories (root can open any file, so: an immutable file,
a directory where a segment file should be). The LogManager loads every other log,
keeps the broken one offline and says so once at ERROR.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_testutil import append_batches, read_all, small_config

from kbroker.storage import files
from kbroker.storage.log_manager import LogManager
from kclient.errors import KafkaStorageError

CONFIG = small_config()
LOGGER = "kbroker.storage"


def started(dir: Path) -> LogManager:
    manager = LogManager(dir, CONFIG)
    manager.startup()
    return manager


def crash(manager: LogManager) -> None:
    """What a SIGKILL leaves: the files as they are, no marker, no checkpoint, lock freed."""
    manager._stop.set()
    if manager._thread is not None:
        manager._thread.join()
    for log in manager.logs().values():
        for segment in log.segments:
            segment._close_files()
    os.close(manager._lock_fd)


def three_logs(dir: Path, *, clean: bool) -> None:
    """orders-0, orders-1 and audit-0 with 5 batches each, several segments."""
    manager = started(dir)
    for topic, partition in (("orders", 0), ("orders", 1), ("audit", 0)):
        append_batches(manager.get_or_create(topic, partition), 5, value_size=900)
    for log in manager.logs().values():
        log.maybe_increment_log_start_offset(1)
    manager.checkpoint()
    if clean:
        manager.shutdown()
    else:
        crash(manager)


def error_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.ERROR]


def check_offline(manager: LogManager, dir: Path, broken: Path, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    """orders-1 is offline for ``reason``; the two other logs are served."""
    assert set(manager.logs()) == {("orders", 0), ("audit", 0)}
    for log in manager.logs().values():
        assert [r.offset for r in read_all(log)] == [1, 2, 3, 4]
    assert manager.get("orders", 1) is None
    offline = manager.offline_logs()
    assert list(offline) == [("orders", 1)] and reason in offline[("orders", 1)]
    assert manager.offline_reason("orders", 1) == offline[("orders", 1)]
    assert manager.offline_reason("orders", 0) is None and manager.offline_reason("nope", 0) is None
    before = sorted(p.name for p in (dir / "orders-1").iterdir())
    with pytest.raises(KafkaStorageError, match="offline"):
        manager.get_or_create("orders", 1)  # never a fresh empty log over the broken one
    assert sorted(p.name for p in (dir / "orders-1").iterdir()) == before
    errors = error_records(caplog)
    assert len(errors) == 1, [r.getMessage() for r in errors]
    message = errors[0].getMessage()
    assert "orders-1" in message and str(dir / "orders-1") in message and reason in message
    assert "\n" not in message and errors[0].exc_info is None


@pytest.fixture
def immutable() -> Iterator[list[Path]]:
    """Files made immutable (chattr +i: even root cannot open them for writing); undone after."""
    paths: list[Path] = []
    yield paths
    for path in paths:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def make_immutable(path: Path, paths: list[Path]) -> None:
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"chattr +i is not supported here: {done.stderr.strip()}")
    paths.append(path)


@pytest.mark.parametrize("clean", [True, False], ids=["after-clean-shutdown", "after-crash"])
def test_unopenable_segment_takes_only_its_log_offline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, immutable: list[Path], clean: bool
) -> None:
    three_logs(tmp_path, clean=clean)
    segment = sorted((tmp_path / "orders-1").glob("*.log"))[-1]
    make_immutable(segment, immutable)
    caplog.set_level(logging.INFO, LOGGER)
    manager = started(tmp_path)
    check_offline(manager, tmp_path, segment, "Operation not permitted", caplog)
    manager.shutdown()
    assert not (tmp_path / files.CLEAN_SHUTDOWN_FILE).exists()  # orders-1 still needs its recovery
    # Its checkpointed offsets are kept: once the file is fixed, it loads whole.
    assert files.read_offsets_checkpoint(tmp_path / files.LOG_START_OFFSET_CHECKPOINT)[("orders", 1)] == 1
    subprocess.run(["chattr", "-i", str(segment)], check=True)
    manager = started(tmp_path)
    assert manager.offline_logs() == {}
    assert [r.offset for r in read_all(manager.get_or_create("orders", 1))] == [1, 2, 3, 4]
    manager.shutdown()


def test_directory_in_place_of_an_index_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    three_logs(tmp_path, clean=False)
    index = sorted((tmp_path / "orders-1").glob("*.index"))[0]
    index.unlink()
    index.mkdir()
    caplog.set_level(logging.INFO, LOGGER)
    manager = started(tmp_path)
    check_offline(manager, tmp_path, index, "is not a regular file", caplog)
    manager.shutdown()


def test_directory_in_place_of_a_segment_is_not_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A segment that is not a regular file: skipping it would drop its records (and the
    index files next to it) silently; the log goes offline instead."""
    three_logs(tmp_path, clean=True)
    segment = sorted((tmp_path / "orders-1").glob("*.log"))[0]
    segment.unlink()
    segment.mkdir()
    caplog.set_level(logging.INFO, LOGGER)
    manager = started(tmp_path)
    check_offline(manager, tmp_path, segment, "not a regular file", caplog)
    manager.shutdown()


def test_offline_log_can_be_deleted(tmp_path: Path) -> None:
    three_logs(tmp_path, clean=True)
    index = sorted((tmp_path / "orders-1").glob("*.index"))[0]
    index.unlink()
    index.mkdir()
    manager = started(tmp_path)
    assert manager.delete("orders", 1)
    assert not (tmp_path / "orders-1").exists()
    assert manager.offline_logs() == {}
    assert manager.get_or_create("orders", 1).log_end_offset == 0  # a new replica starts empty
    manager.shutdown()
    assert (tmp_path / files.CLEAN_SHUTDOWN_FILE).exists()


def test_log_offline_at_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = started(tmp_path)
    log = manager.get_or_create("orders", 0)
    append_batches(log, 3)
    healthy = manager.get_or_create("audit", 0)
    with monkeypatch.context() as patch:

        def failing_fsync(fd: int) -> None:
            raise OSError(5, "Input/output error")

        patch.setattr(os, "fsync", failing_fsync)
        with pytest.raises(KafkaStorageError):
            log.flush()
    assert manager.offline_reason("orders", 0) is not None and "flushing" in manager.offline_reason("orders", 0)
    assert list(manager.offline_logs()) == [("orders", 0)]
    assert manager.get_or_create("orders", 0) is log  # the same (offline) log: every call raises
    append_batches(healthy, 2)
    manager.shutdown()
    assert not (tmp_path / files.CLEAN_SHUTDOWN_FILE).exists()
    manager = started(tmp_path)  # recovered
    assert [r.offset for r in read_all(manager.get_or_create("orders", 0))] == [0, 1, 2]
    assert manager.offline_logs() == {}
    manager.shutdown()


# --------------------------------------------------------------------- start-up noise


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_new_data_dir_is_not_an_unclean_shutdown(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    manager = started(tmp_path / "data")
    manager.get_or_create("orders", 0)
    assert not [m for m in messages(caplog) if "unclean" in m]
    assert [m for m in messages(caplog) if "new data directory" in m]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    manager.shutdown()


def test_dir_without_logs_and_marker_is_not_unclean(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Killed before any log was created: checkpoints, no marker, no logs."""
    manager = started(tmp_path)
    manager.checkpoint()
    crash(manager)
    caplog.set_level(logging.DEBUG, LOGGER)
    started(tmp_path).shutdown()
    assert not [m for m in messages(caplog) if "unclean" in m]


def test_restarts_report_clean_and_unclean_shutdowns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    three_logs(tmp_path, clean=True)
    caplog.set_level(logging.INFO, LOGGER)
    manager = started(tmp_path)
    assert [m for m in messages(caplog) if "(clean shutdown)" in m]
    assert not [m for m in messages(caplog) if "unclean" in m]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    crash(manager)
    caplog.clear()
    started(tmp_path).shutdown()
    assert [m for m in messages(caplog) if "unclean shutdown" in m]
