"""Sparse per-segment indexes: ``.index`` (offset -> position) and ``.timeindex``."""

from __future__ import annotations

import errno
import os
import struct
from array import array
from bisect import bisect_right
from pathlib import Path
from typing import NamedTuple

_INT32_MAX = 2**31 - 1


class CorruptIndexError(Exception):
    """An index file failed its sanity check; the segment's indexes must be rebuilt."""


class OffsetPosition(NamedTuple):
    """An offset and the file position of the batch the index entry points to."""

    offset: int
    position: int


class TimestampOffset(NamedTuple):
    """A timestamp and an offset at or after which records reach it."""

    timestamp: int
    offset: int


class _IndexFile:
    """The file under an index: fixed-size entries appended with ``os.pwrite``.

    No preallocation and no mmap: the file is exactly ``entries * entry_size``
    bytes, entries live in memory, and an appended entry is in the OS page cache as
    soon as ``append`` returns. Not thread-safe for writers.
    """

    entry_size = 0

    def __init__(self, path: Path, base_offset: int, max_index_size: int) -> None:
        self._path = path
        self.base_offset = base_offset
        self.max_entries = max(max_index_size // self.entry_size, 1)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(self._fd).st_size
            data = os.pread(self._fd, size, 0) if size else b""
        except BaseException:
            os.close(self._fd)
            raise
        self._file_bytes = len(data)
        self._before_rebuild: tuple[int, tuple[array, ...]] | None = None
        self._load(data[: len(data) - len(data) % self.entry_size])

    def _load(self, data: bytes) -> None:
        raise NotImplementedError

    def _arrays(self) -> tuple[array, ...]:
        """The in-memory entries (parallel arrays)."""
        raise NotImplementedError

    def _encode(self) -> bytes:
        """The file content of the in-memory entries."""
        raise NotImplementedError

    def begin_rebuild(self) -> None:
        """Forget every entry, to append them again (a segment's recovery).

        Until :meth:`end_rebuild` appends go to memory only. A rebuilt index is almost
        always the one on disk already, and cutting a file to nothing and writing it
        again costs the file system a journal transaction per file (ext4: and a flush
        of the new blocks, its ``auto_da_alloc``), which made recovering many logs slow.
        """
        self._before_rebuild = (self._file_bytes, self._arrays())
        self._load(b"")

    def end_rebuild(self) -> None:
        """Write the rebuilt entries, if they differ from the file."""
        before = self._before_rebuild
        if before is None:
            return
        self._before_rebuild = None
        file_bytes, arrays = before
        size = self._entries() * self.entry_size
        if file_bytes == size and arrays == self._arrays():
            return
        try:
            if arrays != self._arrays():
                data = self._encode()
                written = 0
                while written < len(data):
                    n = os.pwrite(self._fd, data[written:], written)
                    if n <= 0:
                        raise OSError(errno.ENOSPC, f"short write to {self._path}")
                    written += n
            if file_bytes != size:
                os.ftruncate(self._fd, size)
        except BaseException:
            try:  # an empty index is a valid one (lookups scan the segment from its start)
                os.ftruncate(self._fd, 0)
                self._file_bytes = 0
            except OSError:
                pass
            raise
        self._file_bytes = size

    def _entries(self) -> int:
        raise NotImplementedError

    @property
    def path(self) -> Path:
        return self._path

    @property
    def entries(self) -> int:
        return self._entries()

    @property
    def is_full(self) -> bool:
        return self._entries() >= self.max_entries

    @property
    def size_in_bytes(self) -> int:
        return self._entries() * self.entry_size

    def _check_file_length(self) -> None:
        if self._file_bytes % self.entry_size:
            raise CorruptIndexError(
                f"index file {self._path} has length {self._file_bytes}, "
                f"not a multiple of the entry size {self.entry_size}"
            )

    def _write_entry(self, entry: bytes, count_before: int) -> None:
        """Write an entry at the end, whole or not at all (a short write is retried;
        on an error the file is cut back to ``count_before`` entries, best effort)."""
        if self._before_rebuild is not None:
            return  # written by end_rebuild
        position = count_before * self.entry_size
        written = 0
        try:
            while written < len(entry):
                n = os.pwrite(self._fd, entry[written:], position + written)
                if n <= 0:
                    raise OSError(errno.ENOSPC, f"short write to {self._path}")
                written += n
        except BaseException:
            if written:
                try:
                    os.ftruncate(self._fd, position)
                except OSError:
                    pass  # the file length is no multiple of entries: the index is rebuilt on load
            raise
        self._file_bytes = position + len(entry)

    def _truncate_file(self, entries: int) -> None:
        if self._before_rebuild is not None:
            return
        os.ftruncate(self._fd, entries * self.entry_size)
        self._file_bytes = entries * self.entry_size

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def rename_to(self, path: Path) -> None:
        """Rename the file; the open descriptor stays valid."""
        try:
            os.replace(self._path, path)
        except FileNotFoundError:
            pass
        self._path = path

    def delete(self) -> None:
        self.close()
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass


class OffsetIndex(_IndexFile):
    """Sparse map from offset to the file position of a batch in one segment.

    File format: 8-byte big-endian entries ``relative_offset int32 | position
    int32``, where ``relative_offset = offset - base_offset`` is the last offset of
    the batch that starts at ``position``.

    Invariants: offsets strictly increase, positions strictly increase, every
    entry points at the start of a batch. A lookup binary-searches for the last
    entry at or below the target (the floor), from which the caller scans forward.

    Thread safety: one writer (the owning log's lock); concurrent lookups are safe
    (entries are only appended to in-memory arrays, which the GIL keeps consistent).
    """

    entry_size = 8
    _ENTRY = struct.Struct(">ii")

    def _load(self, data: bytes) -> None:
        words = array("i", data)
        if struct.pack("=i", 1) != struct.pack(">i", 1):
            words.byteswap()
        self._offsets = words[0::2]
        self._positions = words[1::2]

    def _arrays(self) -> tuple[array, ...]:
        return (self._offsets, self._positions)

    def _encode(self) -> bytes:
        words = array("i", bytes(8 * len(self._offsets)))
        words[0::2] = self._offsets
        words[1::2] = self._positions
        if struct.pack("=i", 1) != struct.pack(">i", 1):
            words.byteswap()
        return words.tobytes()

    def _entries(self) -> int:
        return len(self._offsets)

    @property
    def last_entry(self) -> OffsetPosition:
        """The last entry, or (base_offset, 0) if empty."""
        if not self._offsets:
            return OffsetPosition(self.base_offset, 0)
        return OffsetPosition(self.base_offset + self._offsets[-1], self._positions[-1])

    @property
    def last_offset(self) -> int:
        return self.last_entry.offset

    def entry(self, n: int) -> OffsetPosition:
        return OffsetPosition(self.base_offset + self._offsets[n], self._positions[n])

    def append(self, offset: int, position: int) -> None:
        """Add an entry; offsets and positions must increase."""
        relative = offset - self.base_offset
        if not 0 <= relative <= _INT32_MAX:
            raise ValueError(f"offset {offset} does not fit an index with base offset {self.base_offset}")
        if self._offsets and (relative <= self._offsets[-1] or position <= self._positions[-1]):
            raise ValueError(
                f"index entry ({offset}, {position}) is not after the last entry "
                f"{tuple(self.last_entry)} in {self._path}"
            )
        if self.is_full:
            raise ValueError(f"offset index {self._path} is full ({self.max_entries} entries)")
        self._write_entry(self._ENTRY.pack(relative, position), len(self._offsets))
        self._offsets.append(relative)
        self._positions.append(position)

    def lookup(self, target_offset: int) -> OffsetPosition:
        """The entry with the largest offset <= target, or (base_offset, 0)."""
        relative = target_offset - self.base_offset
        if relative < 0:
            return OffsetPosition(self.base_offset, 0)
        i = bisect_right(self._offsets, min(relative, _INT32_MAX)) - 1
        if i < 0:
            return OffsetPosition(self.base_offset, 0)
        return OffsetPosition(self.base_offset + self._offsets[i], self._positions[i])

    def floor_entry_by_position(self, position: int, max_offset: int | None = None) -> OffsetPosition | None:
        """The entry with the largest position <= ``position`` (and offset <= ``max_offset``).

        Its position is a batch boundary; None if there is no such entry.
        """
        i = bisect_right(self._positions, position) - 1
        if max_offset is not None:
            while i >= 0 and self.base_offset + self._offsets[i] > max_offset:
                i -= 1
        if i < 0:
            return None
        return OffsetPosition(self.base_offset + self._offsets[i], self._positions[i])

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= ``offset``."""
        relative = offset - self.base_offset
        self.truncate_to_entries(0 if relative <= 0 else bisect_right(self._offsets, relative - 1))

    def truncate_to_entries(self, keep: int) -> None:
        """Keep the first ``keep`` entries (undoes the entries of a failed append)."""
        if keep < len(self._offsets):
            del self._offsets[keep:]
            del self._positions[keep:]
        self._truncate_file(keep)

    def reset(self) -> None:
        """Remove every entry."""
        self.truncate_to(self.base_offset)

    def sanity_check(self) -> None:
        """Raise CorruptIndexError unless the entries are well formed."""
        self._check_file_length()
        offsets, positions = self._offsets, self._positions
        previous_offset = previous_position = -1
        for relative, position in zip(offsets, positions, strict=True):
            if relative < 0 or position < 0:
                raise CorruptIndexError(
                    f"offset index {self._path} is corrupt: negative entry ({relative}, {position})"
                )
            if relative <= previous_offset or position <= previous_position:
                raise CorruptIndexError(
                    f"offset index {self._path} is corrupt: entry ({relative}, {position}) "
                    f"follows ({previous_offset}, {previous_position})"
                )
            previous_offset, previous_position = relative, position


class TimeIndex(_IndexFile):
    """Sparse map from timestamp to offset in one segment.

    File format: 12-byte big-endian entries ``timestamp int64 | relative_offset
    int32``: the largest batch timestamp seen up to some batch, and the last offset
    of the batch where that timestamp first appeared.

    Invariants: timestamps strictly increase, offsets never decrease. Every record
    before an entry's offset has a timestamp <= the entry's timestamp, so the floor
    entry of a target timestamp is a safe place to start a forward scan.

    Thread safety: as :class:`OffsetIndex`.
    """

    entry_size = 12
    _ENTRY = struct.Struct(">qi")

    def _load(self, data: bytes) -> None:
        self._timestamps = array("q")
        self._offsets = array("i")
        for timestamp, relative in self._ENTRY.iter_unpack(data):
            self._timestamps.append(timestamp)
            self._offsets.append(relative)

    def _arrays(self) -> tuple[array, ...]:
        return (self._timestamps, self._offsets)

    def _encode(self) -> bytes:
        pack = self._ENTRY.pack
        return b"".join(pack(t, o) for t, o in zip(self._timestamps, self._offsets, strict=True))

    def _entries(self) -> int:
        return len(self._offsets)

    @property
    def last_entry(self) -> TimestampOffset:
        """The last entry, or (-1, base_offset) if empty."""
        if not self._offsets:
            return TimestampOffset(-1, self.base_offset)
        return TimestampOffset(self._timestamps[-1], self.base_offset + self._offsets[-1])

    def entry(self, n: int) -> TimestampOffset:
        return TimestampOffset(self._timestamps[n], self.base_offset + self._offsets[n])

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> bool:
        """Add an entry if ``timestamp`` is larger than the last one; returns whether it did.

        ``skip_full_check`` lets a segment record its final entry when it is rolled
        or closed even if the index is full.
        """
        last = self._timestamps[-1] if self._timestamps else -1
        if timestamp <= last:  # also skips -1 (no timestamp), as Kafka does
            return False
        relative = offset - self.base_offset
        if not 0 <= relative <= _INT32_MAX:
            raise ValueError(f"offset {offset} does not fit an index with base offset {self.base_offset}")
        if self._offsets and relative < self._offsets[-1]:
            raise ValueError(
                f"time index entry ({timestamp}, {offset}) goes back from the last entry "
                f"{tuple(self.last_entry)} in {self._path}"
            )
        if not skip_full_check and self.is_full:
            raise ValueError(f"time index {self._path} is full ({self.max_entries} entries)")
        self._write_entry(self._ENTRY.pack(timestamp, relative), len(self._offsets))
        self._timestamps.append(timestamp)
        self._offsets.append(relative)
        return True

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """The entry with the largest timestamp <= target, or (-1, base_offset)."""
        i = bisect_right(self._timestamps, target_timestamp) - 1
        if i < 0:
            return TimestampOffset(-1, self.base_offset)
        return TimestampOffset(self._timestamps[i], self.base_offset + self._offsets[i])

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset is >= ``offset``."""
        relative = offset - self.base_offset
        self.truncate_to_entries(0 if relative <= 0 else bisect_right(self._offsets, relative - 1))

    def truncate_to_entries(self, keep: int) -> None:
        """Keep the first ``keep`` entries (undoes the entries of a failed append)."""
        if keep < len(self._offsets):
            del self._offsets[keep:]
            del self._timestamps[keep:]
        self._truncate_file(keep)

    def reset(self) -> None:
        self.truncate_to(self.base_offset)

    def sanity_check(self) -> None:
        """Raise CorruptIndexError unless the entries are well formed."""
        self._check_file_length()
        previous_ts, previous_offset = -(2**63), 0
        for timestamp, relative in zip(self._timestamps, self._offsets, strict=True):
            if timestamp <= previous_ts or relative < previous_offset:
                raise CorruptIndexError(
                    f"time index {self._path} is corrupt: entry ({timestamp}, {relative}) "
                    f"follows ({previous_ts}, {previous_offset})"
                )
            previous_ts, previous_offset = timestamp, relative
