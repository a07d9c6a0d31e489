"""One log segment: a ``.log`` file of record batches and its two sparse indexes."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from kbroker.storage import files
from kbroker.storage.index import CorruptIndexError, OffsetIndex, TimeIndex
from kbroker.storage.leader_epoch import LeaderEpochCache
from kbroker.storage.txn_index import TransactionIndex
from kclient.errors import CorruptRecordError, KafkaStorageError
from kclient.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    BatchHeader,
    check_batch,
    decode_batch,
    iter_headers,
    read_header,
)

logger = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024

_INT32_MAX = 2**31 - 1
_SCAN_CHUNK = 64 * 1024
"""Bytes read at once when scanning batch headers."""
_RECOVER_CHUNK = 1024 * 1024
"""Bytes read at once when validating whole batches during recovery."""


class SegmentRead(NamedTuple):
    """Whole batches read from one segment."""

    records: bytes
    """Raw batch bytes, possibly empty."""
    position: int
    """File position of the batch holding the start offset."""
    first_offset: int
    """Base offset of the first batch returned, -1 if none."""
    next_offset: int
    """Offset after the last batch returned (the start offset if none)."""


class AppendUndoError(KafkaStorageError):
    """An append failed and the segment could not be put back as it was.

    Its files may then hold bytes its state does not know about: the owning log
    must go offline (Kafka takes the log directory offline on such an IOException).
    """


class _AppendUndo(NamedTuple):
    """A segment's state before an append, to put back if the append fails."""

    size: int
    index_entries: int
    time_index_entries: int
    max_timestamp: int
    offset_of_max_timestamp: int
    rolling_based_timestamp: int | None


class LogSegment:
    """A slice of one partition's log starting at ``base_offset``.

    Files, named by the base offset zero-padded to 20 digits:

    - ``.log``: record batches exactly as received (RecordBatch v2), back to back,
      offsets increasing. Nothing else: no per-segment header or footer.
    - ``.index``: :class:`OffsetIndex`, an entry (batch last offset, batch position)
      after every ``index_interval_bytes`` of batches.
    - ``.timeindex``: :class:`TimeIndex`, the largest timestamp so far and the last
      offset of the batch that holds it, written with the offset index entries.
    - ``.txnindex``: :class:`TransactionIndex`, the aborted transactions whose ABORT
      marker is in this segment (no file while there are none). The log appends to it;
      the segment truncates, flushes, renames and deletes it with the others.

    Invariants: every offset in the segment is >= ``base_offset`` and fits an int32
    relative to it; ``size`` is the length of the ``.log`` file and ends on a batch
    boundary (after :meth:`recover`); the indexes only point at batch starts; an
    append that fails leaves all three files and the state as they were.

    I/O: the file is written with ``os.pwrite`` and read with ``os.pread`` on a raw
    descriptor, so appended bytes are in the OS page cache when ``append`` returns
    (they survive the process being killed); :meth:`flush` fsyncs them.

    Thread safety: one writer at a time (``append``, ``truncate_to``, ``recover``,
    ``close``: the owning log's lock). Readers (``read``, ``translate_offset``,
    ``find_offset_by_timestamp``) may run concurrently with appends if they pass a
    ``max_position`` no larger than the size they saw under that lock.
    """

    txn_index: TransactionIndex
    """The segment's aborted transactions (set by :meth:`open`)."""

    def __init__(
        self,
        dir: Path,
        base_offset: int,
        log_fd: int,
        offset_index: OffsetIndex,
        time_index: TimeIndex,
        index_interval_bytes: int,
        created_ms: int,
    ) -> None:
        self._dir = dir
        self._base_offset = base_offset
        self._fd = log_fd
        self._log_path = files.log_file(dir, base_offset)
        self._offset_index = offset_index
        self._time_index = time_index
        self.index_interval_bytes = index_interval_bytes
        self._created_ms = created_ms
        self._size = os.fstat(log_fd).st_size
        self._next_offset = base_offset
        self._max_timestamp = -1
        self._offset_of_max_timestamp = -1
        self._bytes_since_last_index_entry = 0
        self._rolling_based_timestamp: int | None = None
        self._closed = False

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        dir: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_size: int,
        create: bool = False,
        now_ms: int = 0,
        suffix: str = "",
    ) -> LogSegment:
        """Open the segment files in ``dir`` (create a new empty segment if ``create``).

        An existing segment is opened as is: call :meth:`load` (trust the files) or
        :meth:`recover` (validate every batch) before using it. ``suffix`` names files
        such as ``<base>.log.cleaned`` (the log cleaner's; :meth:`rename_with_suffix`
        with ``""`` makes them live).
        """
        log_path = files.log_file(dir, base_offset, suffix)
        index_path = files.offset_index_file(dir, base_offset, suffix)
        time_path = files.time_index_file(dir, base_offset, suffix)
        txn_path = files.txn_index_file(dir, base_offset, suffix)
        if create:
            try:
                fd = os.open(log_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                fd = os.open(log_path, os.O_RDWR)
                if os.fstat(fd).st_size:
                    os.close(fd)
                    raise KafkaStorageError(f"cannot create segment {log_path}: a non-empty file exists") from None
            for stale in (index_path, time_path, txn_path):
                try:
                    os.unlink(stale)
                except FileNotFoundError:
                    pass
        else:
            fd = os.open(log_path, os.O_RDWR)
        try:
            offset_index = OffsetIndex(index_path, base_offset, max_index_size)
            try:
                time_index = TimeIndex(time_path, base_offset, max_index_size)
            except BaseException:
                offset_index.close()
                raise
        except BaseException:
            os.close(fd)
            raise
        segment = cls(dir, base_offset, fd, offset_index, time_index, index_interval_bytes, now_ms)
        segment._log_path = log_path
        try:
            segment.txn_index = TransactionIndex(txn_path)
        except (OSError, ValueError) as exc:
            logger.warning("%s: unreadable aborted-transaction index, starting it empty: %s", txn_path, exc)
            txn_path.unlink(missing_ok=True)
            segment.txn_index = TransactionIndex(txn_path)
        return segment

    def sanity_check(self) -> None:
        """Raise CorruptIndexError unless both indexes look consistent with the log.

        Checks the entry order of both indexes, and that the first and last offset
        index entries point at batches with those last offsets.
        """
        self._offset_index.sanity_check()
        self._time_index.sanity_check()
        index = self._offset_index
        for n in {0, index.entries - 1} if index.entries else ():
            offset, position = index.entry(n)
            try:
                data = os.pread(self._fd, HEADER_SIZE, position)
                header = read_header(data)
            except (CorruptRecordError, OSError):
                raise CorruptIndexError(
                    f"offset index {index.path}: entry ({offset}, {position}) is past the data"
                ) from None
            if header.last_offset != offset or position + header.size > self._size:
                raise CorruptIndexError(
                    f"offset index {index.path}: entry ({offset}, {position}) points at a "
                    f"batch with last offset {header.last_offset}"
                )

    def load(self) -> bool:
        """Compute the end offset and the largest timestamp from the indexes and the tail.

        Trusts the indexes and scans batch headers from the last index entry to the
        end of the file. Returns False if the data does not end on a batch boundary
        or the time index points past the data (the segment then needs :meth:`recover`).
        """
        self._bytes_since_last_index_entry = 0
        return self._load_tail()

    def _load_tail(self) -> bool:
        ts_entry = self._time_index.last_entry
        start = self._offset_index.last_entry.position
        if self._time_index.entries:
            start = min(start, self._offset_index.lookup(ts_entry.offset).position)
            self._max_timestamp = ts_entry.timestamp
            self._offset_of_max_timestamp = ts_entry.offset
        else:
            self._max_timestamp = -1
            self._offset_of_max_timestamp = -1
        self._next_offset = self._base_offset
        end = start if start <= self._size else -1
        for pos, header in self._scan_headers(start, self._size):
            if header.max_timestamp > self._max_timestamp:
                self._max_timestamp = header.max_timestamp
                self._offset_of_max_timestamp = header.last_offset
            self._next_offset = header.next_offset
            end = pos + header.size
        self._rolling_based_timestamp = None
        if self._size >= HEADER_SIZE:
            first = read_header(os.pread(self._fd, HEADER_SIZE, 0))
            self._rolling_based_timestamp = first.max_timestamp
        time_index_ok = not self._time_index.entries or ts_entry.offset < self._next_offset
        return end == self._size and time_index_ok

    # ------------------------------------------------------------------ properties

    @property
    def base_offset(self) -> int:
        return self._base_offset

    @property
    def size(self) -> int:
        """Bytes in the ``.log`` file."""
        return self._size

    @property
    def next_offset(self) -> int:
        """The offset after the last batch (``base_offset`` if empty)."""
        return self._next_offset

    @property
    def is_empty(self) -> bool:
        return self._size == 0

    @property
    def log_path(self) -> Path:
        return self._log_path

    @property
    def offset_index(self) -> OffsetIndex:
        return self._offset_index

    @property
    def time_index(self) -> TimeIndex:
        return self._time_index

    @property
    def max_timestamp_so_far(self) -> int:
        """The largest batch max timestamp in the segment, -1 if none."""
        return self._max_timestamp

    @property
    def offset_of_max_timestamp(self) -> int:
        """Last offset of the batch holding ``max_timestamp_so_far``, -1 if none."""
        return self._offset_of_max_timestamp

    @property
    def largest_timestamp(self) -> int:
        """The largest record timestamp, or the file's mtime if no batch has one (retention)."""
        if self._max_timestamp >= 0:
            return self._max_timestamp
        return self.last_modified_ms

    @property
    def last_modified_ms(self) -> int:
        return os.fstat(self._fd).st_mtime_ns // 1_000_000

    # ------------------------------------------------------------------ rolling

    def can_convert_to_relative_offset(self, offset: int) -> bool:
        return 0 <= offset - self._base_offset <= _INT32_MAX

    def time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        """Age of the segment for segment.ms: by batch timestamps, else wall clock.

        As Kafka: the max timestamp of the new batches minus the max timestamp of the
        segment's first batch, or ``now - created`` if either is missing.
        """
        first = self._rolling_based_timestamp
        if first is not None and first >= 0 and message_timestamp >= 0:
            return message_timestamp - first
        return now_ms - self._created_ms

    def should_roll(
        self,
        *,
        messages_size: int,
        max_timestamp_in_messages: int,
        max_offset_in_messages: int,
        now_ms: int,
        segment_bytes: int,
        segment_ms: int,
    ) -> bool:
        """Whether the batches about to be appended belong in a new segment.

        An empty segment never rolls. Otherwise: it would outgrow segment.bytes, it
        is older than segment.ms, an index is full, or the offsets do not fit.
        """
        if self._size == 0:
            return False
        return (
            self._size > segment_bytes - messages_size
            or self.time_waited_for_roll(now_ms, max_timestamp_in_messages) > segment_ms
            or self._offset_index.is_full
            or self._time_index.is_full
            or not self.can_convert_to_relative_offset(max_offset_in_messages)
        )

    def on_become_inactive(self) -> None:
        """Called when a newer segment takes over: record the final time index entry."""
        if self._max_timestamp >= 0:
            self._time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp, skip_full_check=True)

    # ------------------------------------------------------------------ writing

    def append(
        self,
        records: Buffer | list[Buffer],
        batches: Sequence[tuple[int, BatchHeader]] | None = None,
    ) -> None:
        """Append whole, validated, offset-stamped batches, all or nothing.

        ``records`` is the bytes, or pieces written one after the other (a leader
        writes each batch as a stamped header copy plus a view of the producer's
        records). ``batches`` are (position in ``records``, header) of every batch, as
        the caller found them while validating; parsed again if omitted.

        If writing the data or an index entry fails (ENOSPC, a short write, EIO),
        the ``.log`` file and both indexes are cut back to their sizes before the
        call and the OSError is raised: the segment is exactly as before. If cutting
        back fails too, AppendUndoError is raised instead.
        """
        if batches is None:
            batches = list(iter_headers(b"".join(records) if isinstance(records, list) else records))
        if not batches:
            return
        last_offset = batches[-1][1].last_offset
        if not self.can_convert_to_relative_offset(last_offset) or (batches[0][1].base_offset < self._next_offset):
            raise ValueError(
                f"offsets {batches[0][1].base_offset}..{last_offset} cannot be appended to "
                f"segment {self._log_path} (base {self._base_offset}, next {self._next_offset})"
            )
        physical = self._size
        offset_index = self._offset_index
        time_index = self._time_index
        undo = _AppendUndo(
            physical,
            offset_index.entries,
            time_index.entries,
            self._max_timestamp,
            self._offset_of_max_timestamp,
            self._rolling_based_timestamp,
        )
        try:
            if physical == 0:
                self._rolling_based_timestamp = batches[0][1].max_timestamp
            self._write(records, physical)
            interval = self.index_interval_bytes
            since = self._bytes_since_last_index_entry
            for pos, header in batches:
                if header.max_timestamp > self._max_timestamp:
                    self._max_timestamp = header.max_timestamp
                    self._offset_of_max_timestamp = header.last_offset
                if since > interval and not offset_index.is_full:
                    offset_index.append(header.last_offset, physical + pos)
                    if not time_index.is_full:
                        time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
                    since = 0
                since += header.batch_length + LOG_OVERHEAD
        except BaseException as exc:
            self._undo_append(undo, exc)
            raise
        self._bytes_since_last_index_entry = since
        self._next_offset = batches[-1][1].next_offset

    def _write(self, data: Buffer | list[Buffer], position: int) -> None:
        views = [memoryview(d).cast("B") for d in (data if isinstance(data, list) else [data])]
        total = sum(len(v) for v in views)
        written = 0
        first = 0  # views[:first] are written; a short write leaves views[first] partly written
        while first < len(views):
            n = os.pwritev(self._fd, views[first : first + _IOV_MAX], position + written)
            if n <= 0:
                raise OSError(errno.ENOSPC, f"short write to {self._log_path}")
            written += n
            while first < len(views) and n >= len(views[first]):
                n -= len(views[first])
                first += 1
            if n:
                views[first] = views[first][n:]
        self._size = position + total

    def _undo_append(self, undo: _AppendUndo, cause: BaseException) -> None:
        """Put the files and the state back as they were before a failed append.

        Raises AppendUndoError (from ``cause``) if the files cannot be cut back.
        """
        self._size = undo.size
        self._max_timestamp = undo.max_timestamp
        self._offset_of_max_timestamp = undo.offset_of_max_timestamp
        self._rolling_based_timestamp = undo.rolling_based_timestamp
        try:
            os.ftruncate(self._fd, undo.size)
            self._offset_index.truncate_to_entries(undo.index_entries)
            self._time_index.truncate_to_entries(undo.time_index_entries)
        except OSError as exc:
            raise AppendUndoError(
                f"segment {self._log_path}: an append failed ({cause}) and cutting the files back to "
                f"{undo.size} bytes failed too ({exc})"
            ) from cause

    def truncate_to(self, offset: int) -> int:
        """Remove every batch holding offsets >= ``offset``; returns bytes removed.

        A batch that straddles ``offset`` is removed whole.
        """
        found = self.translate_offset(offset, self._size)
        if found is None:
            return 0
        position = found[0]
        self._offset_index.truncate_to(offset)
        self._time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        removed = self._size - position
        os.ftruncate(self._fd, position)
        self._size = position
        self._bytes_since_last_index_entry = 0
        self._load_tail()
        return removed

    def recover(self, epoch_cache: LeaderEpochCache | None = None, min_offset: int | None = None) -> int:
        """Validate every batch, rebuild both indexes, cut the file at the first bad byte.

        A batch is valid if its header is complete, it lies inside the file, it
        passes ``check_batch`` (magic, length, CRC-32C), its offsets do not go back
        (nor below ``min_offset``) and fit the segment. Leader epochs of the valid
        batches are assigned to ``epoch_cache``. Returns the number of bytes removed.
        """
        self._offset_index.begin_rebuild()
        self._time_index.begin_rebuild()
        self._max_timestamp = -1
        self._offset_of_max_timestamp = -1
        self._bytes_since_last_index_entry = 0
        self._rolling_based_timestamp = None
        fd = self._fd
        file_size = os.fstat(fd).st_size
        expected = self._base_offset if min_offset is None else max(min_offset, self._base_offset)
        buf = b""
        buf_start = 0
        pos = 0
        batches: list[tuple[int, BatchHeader]] = []
        problem = ""
        while pos < file_size:
            if file_size - pos < HEADER_SIZE:
                problem = f"{file_size - pos} trailing bytes, too few for a batch header"
                break
            off = pos - buf_start
            if off + HEADER_SIZE > len(buf):
                buf = os.pread(fd, min(_RECOVER_CHUNK, file_size - pos), pos)
                buf_start, off = pos, 0
            header = read_header(buf, off)
            size = header.batch_length + LOG_OVERHEAD
            if header.batch_length < MIN_BATCH_LENGTH or pos + size > file_size:
                problem = f"batch length {header.batch_length} at position {pos} runs past the end"
                break
            if off + size > len(buf):
                buf = os.pread(fd, max(size, min(_RECOVER_CHUNK, file_size - pos)), pos)
                buf_start, off = pos, 0
            try:
                check_batch(buf, off, header)
            except CorruptRecordError as exc:
                problem = str(exc.message)
                break
            if (
                header.base_offset < expected
                or header.last_offset_delta < 0
                or header.record_count > header.last_offset_delta + 1
                or not self.can_convert_to_relative_offset(header.last_offset)
            ):
                problem = (
                    f"batch at position {pos} has offsets {header.base_offset}.."
                    f"{header.last_offset}, expected a base offset >= {expected}"
                )
                break
            batches.append((pos, header))
            if epoch_cache is not None and header.partition_leader_epoch >= 0:
                epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
            expected = header.next_offset
            pos += size
        removed = file_size - pos
        if removed:
            logger.warning(
                "segment %s: %s; truncating %d bytes at position %d (offset %d)",
                self._log_path,
                problem,
                removed,
                pos,
                expected,
            )
            os.ftruncate(fd, pos)
        self._size = pos
        self._next_offset = self._base_offset
        # Rebuild the indexes with the same rule as append.
        interval = self.index_interval_bytes
        since = 0
        for bpos, header in batches:
            if header.max_timestamp > self._max_timestamp:
                self._max_timestamp = header.max_timestamp
                self._offset_of_max_timestamp = header.last_offset
            if since > interval and not self._offset_index.is_full:
                self._offset_index.append(header.last_offset, bpos)
                if not self._time_index.is_full:
                    self._time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
                since = 0
            since += header.batch_length + LOG_OVERHEAD
            self._next_offset = header.next_offset
        self._offset_index.end_rebuild()
        self._time_index.end_rebuild()
        self._bytes_since_last_index_entry = since
        if batches:
            self._rolling_based_timestamp = batches[0][1].max_timestamp
        return removed

    # ------------------------------------------------------------------ reading

    def _scan_headers(self, position: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of the complete batches from ``position`` up to ``end``."""
        fd = self._fd
        buf = b""
        buf_start = position
        pos = position
        read_size = _SCAN_CHUNK
        while end - pos >= HEADER_SIZE:
            off = pos - buf_start
            if off < 0 or off + HEADER_SIZE > len(buf):
                buf = os.pread(fd, min(read_size, end - pos), pos)
                buf_start, off = pos, 0
                if len(buf) < HEADER_SIZE:
                    return
            header = read_header(buf, off)
            if header.batch_length < MIN_BATCH_LENGTH:
                raise CorruptRecordError(
                    f"segment {self._log_path}: batch at position {pos} has length {header.batch_length}"
                )
            size = header.batch_length + LOG_OVERHEAD
            if pos + size > end:
                return
            yield pos, header
            pos += size
            # Large batches: read just the next header rather than a whole chunk.
            read_size = HEADER_SIZE if size > _SCAN_CHUNK // 4 else _SCAN_CHUNK

    def iter_headers(self, start_position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of every complete batch from ``start_position``."""
        return self._scan_headers(start_position, self._size)

    def translate_offset(self, offset: int, max_position: int | None = None) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch whose last offset is >= ``offset``.

        Looks up the floor entry of the offset index, then scans headers forward.
        None if no such batch lies before ``max_position`` (default: the file end).
        """
        end = self._size if max_position is None else min(max_position, self._size)
        start = self._offset_index.lookup(offset).position
        for pos, header in self._scan_headers(start, end):
            if header.last_offset >= offset:
                return pos, header
        return None

    def read(
        self,
        start_offset: int,
        max_bytes: int,
        *,
        max_position: int | None = None,
        max_offset: int | None = None,
        min_one_batch: bool = False,
    ) -> SegmentRead | None:
        """Whole batches from the one holding ``start_offset``, at most ``max_bytes``.

        - ``max_position``: read nothing at or beyond this file position;
        - ``max_offset``: stop before the first batch whose last offset is >= it;
        - ``min_one_batch``: return the first batch even if it exceeds ``max_bytes``.

        None if the segment has no batch at or after ``start_offset`` (before
        ``max_position``). Records are never decoded.
        """
        end = self._size if max_position is None else min(max_position, self._size)
        found = self.translate_offset(start_offset, end)
        if found is None:
            return None
        position, first = found
        if max_offset is not None and first.last_offset >= max_offset:
            return SegmentRead(b"", position, -1, start_offset)
        first_size = first.batch_length + LOG_OVERHEAD
        if first_size > max_bytes:
            if not min_one_batch:
                return SegmentRead(b"", position, -1, start_offset)
            data = os.pread(self._fd, first_size, position)
            if len(data) < first_size:  # truncated under our feet
                return SegmentRead(b"", position, -1, start_offset)
            return SegmentRead(data, position, first.base_offset, first.next_offset)
        cut, next_offset = self._last_boundary(position, first, min(position + max_bytes, end), max_offset)
        data = os.pread(self._fd, cut - position, position)
        if len(data) < cut - position:  # truncated under our feet: keep whole batches
            cut, next_offset = position, start_offset
            for pos, header in iter_headers(data):
                cut, next_offset = position + pos + header.size, header.next_offset
            data = data[: cut - position]
        return SegmentRead(data, position, first.base_offset if data else -1, next_offset)

    def _last_boundary(self, position: int, first: BatchHeader, limit: int, max_offset: int | None) -> tuple[int, int]:
        """(end position, next offset) of the longest run of whole batches from
        ``position`` (where ``first`` starts, and fits) that ends at or before ``limit``
        and holds no offset >= ``max_offset``.

        Jumps ahead with the offset index (its positions are batch boundaries) and
        scans headers only from the last entry in range, so that the records can then
        be read with one exact ``pread``.
        """
        scan_from = position
        entry = self._offset_index.floor_entry_by_position(limit, max_offset)
        if entry is not None and entry.position > position:
            scan_from = entry.position
        cut = position + first.batch_length + LOG_OVERHEAD
        next_offset = first.next_offset
        scanned_from_jump = scan_from > position
        try:
            for pos, header in self._scan_headers(scan_from, limit):
                if max_offset is not None and header.last_offset >= max_offset:
                    break
                cut = pos + header.batch_length + LOG_OVERHEAD
                next_offset = header.next_offset
                scanned_from_jump = False
        except CorruptRecordError as exc:
            # A header that went bad on disk (a clean shutdown trusts the files): the read
            # ends before it; a read that starts there gets the error.
            logger.warning("%s; a read from offset %d stops before it", exc, first.base_offset)
        if scanned_from_jump:
            # Nothing after the jump fits: the run ends where the entry's batch starts.
            cut = scan_from
            next_offset = read_header(os.pread(self._fd, HEADER_SIZE, scan_from)).base_offset
        return cut, next_offset

    def read_batch(self, position: int, header: BatchHeader) -> bytes:
        """The whole batch at ``position`` (whose header is ``header``)."""
        return os.pread(self._fd, header.batch_length + LOG_OVERHEAD, position)

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int = 0) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record >= ``starting_offset`` stamped >= ``timestamp``.

        Uses the time index, then the offset index, then scans batch headers; only
        the one batch whose max timestamp reaches the target is decoded.
        """
        ts_entry = self._time_index.lookup(timestamp)
        position = self._offset_index.lookup(max(ts_entry.offset, starting_offset)).position
        for pos, header in self._scan_headers(position, self._size):
            if header.max_timestamp < timestamp or header.last_offset < starting_offset:
                continue
            data = os.pread(self._fd, header.batch_length + LOG_OVERHEAD, pos)
            _, records = decode_batch(data, 0, check_crc=False)
            for record in records:
                if record.timestamp >= timestamp and record.offset >= starting_offset:
                    return record.offset, record.timestamp
        return None

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """fsync the log and the indexes."""
        os.fsync(self._fd)
        self._offset_index.flush()
        self._time_index.flush()
        self.txn_index.flush()

    def rename_with_suffix(self, suffix: str) -> None:
        """Rename the three files to ``<base>.log<suffix>`` etc.; descriptors stay open."""
        target = files.log_file(self._dir, self._base_offset, suffix)
        try:
            os.replace(self._log_path, target)
        except FileNotFoundError:
            pass
        self._log_path = target
        self._offset_index.rename_to(files.offset_index_file(self._dir, self._base_offset, suffix))
        self._time_index.rename_to(files.time_index_file(self._dir, self._base_offset, suffix))
        self.txn_index.rename_to(files.txn_index_file(self._dir, self._base_offset, suffix))

    def close(self, *, final_index_entry: bool = True) -> None:
        """Record the final time index entry (unless told not to) and close the files (idempotent)."""
        if self._closed:
            return
        try:
            if final_index_entry:
                self.on_become_inactive()
        finally:
            self._close_files()

    def _close_files(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._offset_index.close()
        self._time_index.close()
        self.txn_index.close()
        os.close(self._fd)

    def delete(self) -> None:
        """Close and unlink the files (missing files are fine)."""
        self._close_files()
        for path in (self._log_path, self._offset_index.path, self._time_index.path, self.txn_index.path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return f"LogSegment({self._log_path}, size={self._size}, offsets={self._base_offset}..{self._next_offset - 1})"
