"""Names and small files of a log directory (Kafka's ``LogFileUtils`` + ``CheckpointFile``).

A data directory holds one sub-directory per partition plus broker-wide files::

    <data_dir>/
        .lock                                 exclusive flock of the owning broker process
        .kafka_cleanshutdown                  present only after a clean shutdown
        recovery-point-offset-checkpoint      topic partition offset (data flushed below offset)
        log-start-offset-checkpoint           topic partition offset
        cleaner-offset-checkpoint             topic partition offset (first dirty offset, compaction)
        <topic>-<partition>/
            00000000000000000000.log          segment: record batches, byte for byte
            00000000000000000000.index        sparse offset index of that segment
            00000000000000000000.timeindex    sparse time index of that segment
            leader-epoch-checkpoint           epoch start_offset
        <topic>-<partition>.<uuidhex>-delete/ a partition directory being deleted

Segment files are named by their base offset zero-padded to 20 digits, so ``ls``
sorts them numerically. ``.deleted``, ``.cleaned`` and ``.swap`` are appended to a
segment's file names while it is being deleted or rewritten; when a log is opened a
``.swap`` segment replaces the segments it covers and other leftovers are removed.

Checkpoint files are text, in Kafka's format: a version line (``0``), a line with
the number of entries, then one entry per line, fields separated by one space. They
are replaced atomically: written to ``<name>.tmp``, fsynced, renamed over the old
file, and the directory is fsynced.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

from kclient.errors import KafkaStorageError

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
DELETED_SUFFIX = ".deleted"
"""Appended to a segment's files between removal from the log and unlinking."""
CLEANED_SUFFIX = ".cleaned"
"""A segment being written by the log cleaner (compaction)."""
SWAP_SUFFIX = ".swap"
"""A cleaned segment about to replace the live one."""
TMP_SUFFIX = ".tmp"
"""A checkpoint file being written."""

SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
TEMPORARY_SUFFIXES = (DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX, TMP_SUFFIX)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
LOCK_FILE = ".lock"
DELETE_DIR_SUFFIX = "-delete"
"""Suffix of a partition directory renamed for deletion."""

CHECKPOINT_VERSION = 0
OFFSET_DIGITS = 20


# ---------------------------------------------------------------------------
# Segment file names
# ---------------------------------------------------------------------------


def filename_prefix_from_offset(offset: int) -> str:
    """``offset`` zero-padded to 20 digits: ``00000000000000000042``."""
    if offset < 0:
        raise ValueError(f"a segment base offset cannot be negative: {offset}")
    return f"{offset:0{OFFSET_DIGITS}d}"


def offset_from_filename(name: str) -> int:
    """The base offset a segment file name starts with (``...042.log`` -> 42).

    Raises ValueError if the name does not start with 20 digits and a dot.
    """
    prefix, dot, _ = name.partition(".")
    if not dot or len(prefix) != OFFSET_DIGITS or not prefix.isdigit():
        raise ValueError(f"not a segment file name: {name!r}")
    return int(prefix)


def log_file(dir: Path, base_offset: int, suffix: str = "") -> Path:
    """``<dir>/<base_offset:020d>.log<suffix>``."""
    return dir / (filename_prefix_from_offset(base_offset) + LOG_SUFFIX + suffix)


def offset_index_file(dir: Path, base_offset: int, suffix: str = "") -> Path:
    """``<dir>/<base_offset:020d>.index<suffix>``."""
    return dir / (filename_prefix_from_offset(base_offset) + INDEX_SUFFIX + suffix)


def time_index_file(dir: Path, base_offset: int, suffix: str = "") -> Path:
    """``<dir>/<base_offset:020d>.timeindex<suffix>``."""
    return dir / (filename_prefix_from_offset(base_offset) + TIME_INDEX_SUFFIX + suffix)


def txn_index_file(dir: Path, base_offset: int, suffix: str = "") -> Path:
    """``<dir>/<base_offset:020d>.txnindex<suffix>``."""
    return dir / (filename_prefix_from_offset(base_offset) + TXN_INDEX_SUFFIX + suffix)


def is_log_file(path: Path) -> bool:
    return path.name.endswith(LOG_SUFFIX)


def is_index_file(path: Path) -> bool:
    return path.name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX))


def is_temporary_file(path: Path) -> bool:
    """A leftover of an interrupted delete, clean, swap or checkpoint write."""
    return path.name.endswith(TEMPORARY_SUFFIXES)


# ---------------------------------------------------------------------------
# Partition directory names
# ---------------------------------------------------------------------------


def partition_dir_name(topic: str, partition: int) -> str:
    """``<topic>-<partition>``."""
    if partition < 0:
        raise ValueError(f"a partition number cannot be negative: {partition}")
    return f"{topic}-{partition}"


def parse_partition_dir_name(name: str) -> tuple[str, int]:
    """(topic, partition) of a ``<topic>-<partition>`` directory name.

    Topic names may hold dashes, so the partition is what follows the last one.
    Raises ValueError for anything else, including ``...-delete`` directories.
    """
    topic, dash, number = name.rpartition("-")
    if not dash or not topic or not number.isdigit() or not number.isascii():
        raise ValueError(f"not a partition directory name: {name!r}")
    if len(number) > 1 and number.startswith("0"):
        raise ValueError(f"not a partition directory name (leading zero): {name!r}")
    return topic, int(number)


def delete_dir_name(topic: str, partition: int) -> str:
    """``<topic>-<partition>.<uuidhex>-delete``: a unique name for a directory being removed."""
    return f"{partition_dir_name(topic, partition)}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"


def is_delete_dir_name(name: str) -> bool:
    return name.endswith(DELETE_DIR_SUFFIX)


# ---------------------------------------------------------------------------
# Durable small files
# ---------------------------------------------------------------------------


def fsync_dir(dir: Path) -> None:
    """fsync a directory so that renames and creations in it are durable."""
    try:
        fd = os.open(dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # not supported on this platform or file system
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` durably: tmp file, fsync, rename, fsync dir.

    With ``sync=False`` neither is fsynced: readers see the old or the new file whole,
    but a crash may bring the old one back (the caller makes it durable later).
    If writing fails (a full disk), the tmp file is removed and ``path`` is untouched.
    """
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def write_checkpoint(
    path: Path, entries: Iterable[str], version: int = CHECKPOINT_VERSION, *, sync: bool = True
) -> None:
    """Write a checkpoint file: version line, count line, one line per entry."""
    lines = list(entries)
    text = f"{version}\n{len(lines)}\n" + "".join(line + "\n" for line in lines)
    atomic_write(path, text.encode("utf-8"), sync=sync)


def read_checkpoint(path: Path, fields: int, version: int = CHECKPOINT_VERSION) -> list[list[str]] | None:
    """The entries of a checkpoint file, each split into ``fields`` strings.

    Returns None if the file does not exist. Raises KafkaStorageError naming the
    file and the problem if it is malformed (wrong version, count or field count).
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise KafkaStorageError(f"cannot read checkpoint file {path}: {exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise KafkaStorageError(f"checkpoint file {path} is not UTF-8 text") from None
    lines = text.splitlines()
    if len(lines) < 2:
        raise KafkaStorageError(f"checkpoint file {path} is truncated: {len(lines)} lines")
    if lines[0].strip() != str(version):
        raise KafkaStorageError(f"checkpoint file {path} has version {lines[0].strip()!r}, expected {version}")
    try:
        count = int(lines[1])
    except ValueError:
        raise KafkaStorageError(f"checkpoint file {path} has a malformed count line {lines[1]!r}") from None
    entries = [line for line in lines[2:] if line.strip()]
    if count != len(entries):
        raise KafkaStorageError(f"checkpoint file {path} declares {count} entries but holds {len(entries)}")
    result: list[list[str]] = []
    for line in entries:
        parts = line.split()
        if len(parts) != fields:
            raise KafkaStorageError(f"malformed line in checkpoint file {path}: {line!r}")
        result.append(parts)
    return result


def _int_field(path: Path, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise KafkaStorageError(f"malformed number {value!r} in checkpoint file {path}") from None


def read_offsets_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """``topic partition offset`` entries; an absent file is empty."""
    entries = read_checkpoint(path, fields=3)
    if entries is None:
        return {}
    return {(t, _int_field(path, p)): _int_field(path, o) for t, p, o in entries}


def write_offsets_checkpoint(path: Path, offsets: Mapping[tuple[str, int], int]) -> None:
    """Write ``topic partition offset`` entries, sorted by topic and partition."""
    write_checkpoint(path, (f"{t} {p} {o}" for (t, p), o in sorted(offsets.items())))


def read_epoch_checkpoint(path: Path) -> list[tuple[int, int]] | None:
    """``epoch start_offset`` entries in file order; None if the file does not exist."""
    entries = read_checkpoint(path, fields=2)
    if entries is None:
        return None
    return [(_int_field(path, e), _int_field(path, o)) for e, o in entries]


def write_epoch_checkpoint(path: Path, entries: Iterable[tuple[int, int]], *, sync: bool = True) -> None:
    write_checkpoint(path, (f"{epoch} {offset}" for epoch, offset in entries), sync=sync)
