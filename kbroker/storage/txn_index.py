"""The aborted-transaction index of one segment (Kafka's ``TransactionIndex``, ``.txnindex``).

When an ABORT marker is appended, the transaction it ends is recorded in the index of
the segment that holds the marker: the producer id, the transaction's first offset, the
marker's offset (its last offset) and the log's last stable offset once the transaction
was complete. A read_committed Fetch collects the entries that overlap the records it
returns (:meth:`TransactionIndex.collect`), and the client drops those producers'
batches from each first offset up to the ABORT marker.

File format (Kafka's, big-endian), one 34-byte entry per aborted transaction, in the
order the markers were appended (so by last offset)::

    version: int16 (0) | producer_id: int64 | first_offset: int64
    | last_offset: int64 | last_stable_offset: int64

The file is only appended to and cut back (:meth:`truncate_to`); it is fsynced with its
segment (:meth:`flush`), and the segments that recovery re-validates get theirs rebuilt
from the log (see :func:`kbroker.storage.loader.load_log`), so a torn tail is harmless: a
partial entry at the end is ignored on load. A missing file is an empty index (segments
written before transactions existed).

Thread safety: none; the owning segment's writer (the log lock) appends and truncates.
Readers take :meth:`collect` under the log lock too (the entries are in memory).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

ENTRY = struct.Struct(">hqqqq")
"""version, producer id, first offset, last offset, last stable offset."""
ENTRY_SIZE = ENTRY.size
VERSION = 0


class AbortedTxn(NamedTuple):
    """One aborted transaction: its producer, its first offset, the offset of its ABORT
    marker, and the last stable offset of the log once it was complete."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TransactionIndex:
    """The aborted transactions whose ABORT marker lies in one segment (see the module
    docstring). The entries are kept in memory; the file mirrors them."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None
        self._entries: list[AbortedTxn] = []
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        whole = len(data) - len(data) % ENTRY_SIZE
        for version, *fields in ENTRY.iter_unpack(data[:whole]):
            if version != VERSION:
                raise ValueError(f"{path}: entry version {version}, expected {VERSION}")
            self._entries.append(AbortedTxn(*fields))
        if whole != len(data):
            self._rewrite()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def entries(self) -> list[AbortedTxn]:
        """A copy of the entries, in append order."""
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    def append(self, txn: AbortedTxn) -> None:
        if self._entries and txn.last_offset < self._entries[-1].last_offset:
            raise ValueError(f"{self._path}: aborted transaction {txn} ends before the last entry {self._entries[-1]}")
        os.write(self._open(), ENTRY.pack(VERSION, *txn))
        self._entries.append(txn)

    def collect(self, fetch_offset: int, upper_bound: int) -> tuple[list[AbortedTxn], bool]:
        """The entries overlapping [fetch_offset, upper_bound), and whether the search is
        complete (an entry's last stable offset reached ``upper_bound``: no later segment
        can hold a transaction that started below it)."""
        found = []
        for txn in self._entries:
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound:
                found.append(txn)
            if txn.last_stable_offset >= upper_bound:
                return found, True
        return found, False

    def truncate_to(self, offset: int) -> None:
        """Forget the transactions whose ABORT marker is at or after ``offset``."""
        kept = [t for t in self._entries if t.last_offset < offset]
        if len(kept) != len(self._entries):
            self._entries = kept
            self._rewrite()

    def reset(self, entries: Iterable[AbortedTxn] = ()) -> None:
        """Replace every entry (recovery rebuilds the index from the log)."""
        self._entries = list(entries)
        self._rewrite()

    def _rewrite(self) -> None:
        self.close()
        if not self._entries:
            self._path.unlink(missing_ok=True)
            return
        tmp = self._path.with_name(self._path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"".join(ENTRY.pack(VERSION, *t) for t in self._entries))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self._path)

    def flush(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def rename_to(self, path: Path) -> None:
        try:
            os.replace(self._path, path)
        except FileNotFoundError:
            pass
        self._path = path

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def delete(self) -> None:
        self.close()
        self._path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"TransactionIndex({self._path}, entries={len(self._entries)})"
