"""The leader-epoch cache of one partition (KIP-101, KIP-279)."""

from __future__ import annotations

import itertools
import logging
import threading
from bisect import bisect_right
from pathlib import Path
from typing import NamedTuple

from kbroker.storage.files import (
    LEADER_EPOCH_CHECKPOINT,
    read_epoch_checkpoint,
    write_epoch_checkpoint,
)
from kclient.errors import KafkaStorageError

logger = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class EpochEntry(NamedTuple):
    """Leader epoch ``epoch`` wrote its first batch at ``start_offset``."""

    epoch: int
    start_offset: int


class LeaderEpochCache:
    """The start offset of every leader epoch present in one partition's log.

    File format: ``<log dir>/leader-epoch-checkpoint`` in the checkpoint text format
    (``0``, entry count, then ``epoch start_offset`` lines in order). A truncation
    (:meth:`truncate_from_end`, :meth:`truncate_from_start`, :meth:`clear`) is written
    through (atomic replace) before the method returns, but not fsynced; a new epoch
    (:meth:`assign`) is only kept in memory. :meth:`flush` writes and fsyncs what changed.
    The log calls it before it moves its recovery point (and at a clean shutdown), so
    the epochs of every flushed batch are durable, and recovery derives the epochs of
    the batches above the recovery point from the batches themselves, as Kafka does
    since 3.7 (KAFKA-15046: an fsync per leader change cost the controller's batches
    most of their time). What a crash can lose is an epoch that wrote no batch yet,
    which answers no OffsetForLeaderEpoch of a replica that could have fetched from it.
    Writing even without fsync cost a broker taking over 1,333 partitions 2 s of its
    LeaderAndIsr here (a file created and renamed per partition). A stale file holds at
    most entries that recovery removes (past the log end, before the log start). A
    cache created with ``path=None`` lives in memory only.

    Invariants: epochs strictly increase and start offsets strictly increase. Epoch
    ``e`` covers offsets from its start offset up to the next entry's start offset
    (or the log end offset for the latest epoch).

    Thread safety: every method takes the cache's own lock.
    """

    def __init__(self, path: Path | None, entries: list[EpochEntry] | None = None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._epochs: list[EpochEntry] = list(entries or [])
        self._check(self._epochs)
        self._unsynced = False
        """The file holds changes not fsynced yet."""
        self._unwritten = False
        """The file lacks epochs assigned since it was written."""

    @classmethod
    def load(cls, dir: Path) -> LeaderEpochCache:
        """The cache persisted in ``dir`` (empty if the file is absent).

        Raises KafkaStorageError if the file is malformed or out of order.
        """
        path = dir / LEADER_EPOCH_CHECKPOINT
        raw = read_epoch_checkpoint(path)
        entries = [EpochEntry(e, o) for e, o in raw or []]
        try:
            return cls(path, entries)
        except ValueError as exc:
            raise KafkaStorageError(f"leader epoch checkpoint {path}: {exc}") from None

    @staticmethod
    def _check(entries: list[EpochEntry]) -> None:
        for previous, entry in itertools.pairwise(entries):
            if entry.epoch <= previous.epoch or entry.start_offset <= previous.start_offset:
                raise ValueError(f"entries out of order: {previous} then {entry}")
        for entry in entries:
            if entry.epoch < 0 or entry.start_offset < 0:
                raise ValueError(f"negative entry {entry}")

    @property
    def path(self) -> Path | None:
        return self._path

    def entries(self) -> list[EpochEntry]:
        with self._lock:
            return list(self._epochs)

    @property
    def latest_epoch(self) -> int:
        """The latest known epoch, or -1 (UNDEFINED_EPOCH)."""
        with self._lock:
            return self._epochs[-1].epoch if self._epochs else UNDEFINED_EPOCH

    @property
    def earliest_entry(self) -> EpochEntry | None:
        with self._lock:
            return self._epochs[0] if self._epochs else None

    @property
    def latest_entry(self) -> EpochEntry | None:
        with self._lock:
            return self._epochs[-1] if self._epochs else None

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; returns whether it changed anything.

        An epoch that is not newer than the latest one, or a negative epoch, is
        ignored. Entries for older epochs that start at or after ``start_offset``
        (epochs that never wrote anything) are replaced, as Kafka does.
        """
        if epoch < 0 or start_offset < 0:
            return False
        with self._lock:
            if self._epochs and epoch <= self._epochs[-1].epoch:
                return False
            while self._epochs and self._epochs[-1].start_offset >= start_offset:
                dropped = self._epochs.pop()
                logger.debug("leader epoch %d at %d replaces %s in %s", epoch, start_offset, dropped, self._path)
            self._epochs.append(EpochEntry(epoch, start_offset))
            self._unwritten = True
            return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) answering OffsetsForLeaderEpoch for ``requested_epoch`` (KIP-279).

        - the latest epoch: (it, log_end_offset);
        - otherwise the largest known epoch <= requested, and its end offset, which is
          the start offset of the first epoch after the requested one;
        - requested older than every known epoch: (requested, start of the first epoch);
        - requested newer than every known epoch, undefined, or an empty cache: (-1, -1).
        """
        with self._lock:
            epochs = self._epochs
            if requested_epoch == UNDEFINED_EPOCH or not epochs:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if epochs[-1].epoch == requested_epoch:
                return requested_epoch, log_end_offset
            keys = [e.epoch for e in epochs]
            higher = bisect_right(keys, requested_epoch)
            if higher == len(epochs):
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            end_offset = epochs[higher].start_offset
            if higher == 0:
                return requested_epoch, end_offset
            return epochs[higher - 1].epoch, end_offset

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch whose range holds ``offset``, or -1 if before every epoch."""
        with self._lock:
            starts = [e.start_offset for e in self._epochs]
            i = bisect_right(starts, offset) - 1
            return self._epochs[i].epoch if i >= 0 else UNDEFINED_EPOCH

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (the log was truncated there)."""
        if end_offset < 0:
            return
        with self._lock:
            keep = len(self._epochs)
            while keep and self._epochs[keep - 1].start_offset >= end_offset:
                keep -= 1
            if keep < len(self._epochs):
                del self._epochs[keep:]
                self._flush_locked()

    def truncate_from_start(self, start_offset: int) -> None:
        """Forget offsets below ``start_offset`` (the log start moved there).

        The epoch covering ``start_offset`` is kept and now starts there.
        """
        with self._lock:
            starts = [e.start_offset for e in self._epochs]
            i = bisect_right(starts, start_offset) - 1
            if i < 0 or (i == 0 and self._epochs[0].start_offset == start_offset):
                return
            self._epochs = [EpochEntry(self._epochs[i].epoch, start_offset), *self._epochs[i + 1 :]]
            self._flush_locked()

    def clear(self) -> None:
        """Forget every epoch."""
        with self._lock:
            self._epochs = []
            self._flush_locked()

    def flush(self) -> None:
        """Make the checkpoint file durable (written and fsynced), if the cache changed
        since it last was."""
        with self._lock:
            if self._path is not None and (self._unsynced or self._unwritten):
                write_epoch_checkpoint(self._path, self._epochs)
                self._unsynced = self._unwritten = False

    def write(self) -> None:
        """Write the epochs assigned since the file was written, without an fsync (a
        log closing without a flush)."""
        with self._lock:
            if self._unwritten:
                self._flush_locked()

    def _flush_locked(self) -> None:
        if self._path is not None:
            write_epoch_checkpoint(self._path, self._epochs, sync=False)
            self._unsynced, self._unwritten = True, False

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self._path}, {self._epochs})"
