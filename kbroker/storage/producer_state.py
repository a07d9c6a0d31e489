"""Idempotent-producer state of one partition log (Kafka's ``ProducerStateManager``, KIP-98).

For every producer id seen in the log, the state keeps its epoch and the metadata of
its last ``NUM_BATCHES_TO_RETAIN`` (5) batches: first and last sequence, first and
last offset. The leader checks each batch from a producer against it before the batch
gets offsets (:meth:`ProducerStateManager.check_leader_append`):

- a batch whose producer epoch and first and last sequence equal a retained batch's is
  a **duplicate** (a retry of a batch already written): nothing is appended and the
  producer is answered with the original batch's offsets;
- an epoch older than the producer's known epoch raises InvalidProducerEpochError;
- a newer epoch must start at sequence 0, else OutOfOrderSequenceNumberError;
- within the known epoch, the first sequence must follow the last one
  (``last + 1``, wrapping from 2**31 - 1 to 0), else OutOfOrderSequenceNumberError;
- an **unknown producer id accepts any first sequence**. The producer client
  (``kclient.Producer``) starts every sequence stream at 0; a non-zero first sequence
  for an unknown id means the log no longer holds the producer's batches (retention or
  DeleteRecords moved the log start past them, or a replica truncated them). Refusing
  it (UNKNOWN_PRODUCER_ID, as Kafka 0.11 to 2.4 did) fails a live producer for no
  benefit; Kafka 2.5+ (KIP-360) accepts it, and so do we. The price, as in Kafka: a
  retry of a batch whose state is gone cannot be recognised as a duplicate.

Batches without a producer id (-1) are not looked at. Followers, recovery and
truncation update the state from batch headers without any check (:meth:`update`).

**Transactions** (KIP-98). A producer's first transactional batch opens its transaction
(its first offset is kept in the entry); the COMMIT or ABORT marker (a control batch)
that the transaction coordinator has the leader append closes it, and :meth:`update`
returns it as a :class:`CompletedTxn`. A marker with a newer producer epoch (the
coordinator bumped it to fence a zombie) moves the entry to that epoch. The **first
unstable offset** is the first offset of the oldest transaction that is open, or closed
by a marker not yet below the high watermark (:meth:`first_unstable_offset`); the last
stable offset (LSO) is the smaller of it and the high watermark. On a leader, a producer
with an open transaction may only write transactional batches (INVALID_TXN_STATE), and
a marker with an epoch older than the producer's is refused (INVALID_PRODUCER_EPOCH).

The state is a function of the log: it is rebuilt from batch **headers** (records are
never decoded) when the log is loaded and after a truncation, starting from the latest
usable snapshot. Producers whose last batch lies below the log start offset are
evicted, so the state matches what a scan of the retained log gives.

Snapshot files: ``<dir>/<offset, 20 digits>.snapshot``, JSON::

    {"version": 1, "offset": 1234, "producers": [{"id": 7, "epoch": 0,
     "batches": [[first_seq, last_seq, first_offset, last_offset], ...],
     "txn": 1200, "marker": 1100}, ...]}

``txn`` (the first offset of the producer's open transaction) and ``marker`` (the
offset of its last transaction marker) are there only when set; an entry with no
batches has a marker.

A snapshot holds the state of every batch below ``offset``. One is written when a
segment is rolled (at its base offset) and when the log is closed (at the log end);
the newest ``MAX_SNAPSHOTS`` are kept. Snapshots are written to a temporary file and
renamed, without fsync: on load, a snapshot that does not parse is deleted and an
older one (or a full scan) is used; one whose offset is beyond the log end (the tail
was lost or truncated after it was written) is deleted as stale. Truncating the log
deletes the snapshots above the new end first, durably (the directory is fsynced), so
a snapshot never describes batches the log no longer holds.

Thread safety: none; the owning :class:`~kbroker.storage.log.Log` calls it under its lock.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from kbroker.storage import files
from kbroker.storage.segment import LogSegment
from kclient.errors import (
    InvalidProducerEpochError,
    InvalidRequestError,
    InvalidTxnStateError,
    OutOfOrderSequenceNumberError,
)
from kclient.records import CONTROL_TYPE_ABORT, BatchHeader, control_type

logger = logging.getLogger(__name__)

NUM_BATCHES_TO_RETAIN = 5
"""Batches remembered per producer for duplicate detection (Kafka's NumBatchesToRetain)."""
MAX_SEQUENCE = 2**31 - 1
"""Sequences run from 0 to this, then wrap to 0."""
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1
MAX_SNAPSHOTS = 3
"""Snapshot files kept per log (the newest)."""


def next_sequence(sequence: int, increment: int = 1) -> int:
    """``sequence + increment`` in the wrapping sequence space (0..2**31-1)."""
    return (sequence + increment) % (MAX_SEQUENCE + 1)


def snapshot_file(dir: Path, offset: int) -> Path:
    """``<dir>/<offset:020d>.snapshot``."""
    return dir / (files.filename_prefix_from_offset(offset) + SNAPSHOT_SUFFIX)


class BatchMetadata(NamedTuple):
    """Where one producer batch went."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


class CompletedTxn(NamedTuple):
    """A transaction closed by a marker: its producer, first offset, the marker's offset,
    whether it aborted, and the log's last stable offset once it was closed (the first
    offset of the oldest transaction still open, else the offset after the marker)."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool
    last_stable_offset: int


ControlTypeOf = Callable[[BatchHeader], int]
"""The ControlRecordType (ABORT 0, COMMIT 1) of a control batch, given its header."""


class ProducerStateEntry:
    """One producer id: its epoch, its last batches (oldest first), the first offset of
    its open transaction (-1: none) and the offset of its last marker (-1: none)."""

    __slots__ = ("batches", "epoch", "last_marker_offset", "producer_id", "txn_first_offset")

    def __init__(
        self,
        producer_id: int,
        epoch: int,
        batches: Iterable[BatchMetadata] = (),
        txn_first_offset: int = -1,
        last_marker_offset: int = -1,
    ) -> None:
        self.producer_id = producer_id
        self.epoch = epoch
        self.batches: deque[BatchMetadata] = deque(batches, maxlen=NUM_BATCHES_TO_RETAIN)
        self.txn_first_offset = txn_first_offset
        self.last_marker_offset = last_marker_offset

    @property
    def last_log_offset(self) -> int:
        """The last offset this producer wrote, a data batch or a marker."""
        return max(self.last_offset, self.last_marker_offset)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def add(self, epoch: int, batch: BatchMetadata) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches.clear()
        self.batches.append(batch)

    def __repr__(self) -> str:
        return (
            f"ProducerStateEntry(id={self.producer_id}, epoch={self.epoch}, batches={list(self.batches)}, "
            f"txn={self.txn_first_offset}, marker={self.last_marker_offset})"
        )


class ProducerStateManager:
    """Producer id -> :class:`ProducerStateEntry` for one partition, plus its snapshots.

    ``dir`` is the partition directory (snapshots live there); None keeps the state
    in memory only.
    """

    def __init__(self, dir: Path | None = None, name: str = "") -> None:
        self._dir = dir
        self._name = name or (dir.name if dir is not None else "")
        self._producers: dict[int, ProducerStateEntry] = {}
        self._snapshots: list[int] = self._list_snapshots()
        self._ongoing: dict[int, int] = {}
        """Producer id -> first offset of its open transaction."""
        self._unreplicated: list[tuple[int, int]] = []
        """(first offset, marker offset) of closed transactions, until the marker is
        below the high watermark."""

    # ------------------------------------------------------------------ queries

    @property
    def producers(self) -> dict[int, ProducerStateEntry]:
        """The live state (do not modify it)."""
        return self._producers

    def entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    @property
    def ongoing_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction (a copy)."""
        return dict(self._ongoing)

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of the oldest transaction open, or closed by a marker at or
        above ``high_watermark``; None if there is none."""
        if self._unreplicated:
            self._unreplicated = [t for t in self._unreplicated if t[1] >= high_watermark]
        if not self._ongoing and not self._unreplicated:
            return None
        return min([*self._ongoing.values(), *(first for first, _ in self._unreplicated)])

    @property
    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files, oldest first."""
        return list(self._snapshots)

    # ------------------------------------------------------------------ leader checks

    def check_leader_append(self, headers: Sequence[BatchHeader]) -> BatchMetadata | None:
        """Check the batches of a produce request (offsets not assigned yet).

        Returns None if they are all new and valid: append them, then call
        :meth:`update` with their stamped headers. Returns the original location if
        every batch is a duplicate of a retained batch (then append nothing): the
        first offset of the first and the last offset of the last duplicate.

        Raises InvalidProducerEpochError, OutOfOrderSequenceNumberError, or
        InvalidRequestError for a producer batch without a sequence or epoch, and for
        a request mixing duplicates with new batches (a well-behaved client only
        resends whole requests, and an append is all or nothing, so such a request
        cannot be a retry; writing part of it would leave no single offset to answer
        with). Nothing is changed in any case.
        """
        duplicates: list[BatchMetadata] = []
        new_batches = 0
        pending: dict[int, tuple[int, int]] | None = None  # producer id -> (epoch, last seq) in this request
        for header in headers:
            pid = header.producer_id
            if pid < 0:
                new_batches += 1
                continue
            epoch = header.producer_epoch
            first_seq = header.base_sequence
            if first_seq < 0 or epoch < 0:
                raise InvalidRequestError(
                    f"{self._name}: batch of producer {pid} has producer epoch {epoch} and base sequence "
                    f"{first_seq}: an idempotent batch needs both >= 0"
                )
            last_seq = header.last_sequence
            entry = self._producers.get(pid)
            if entry is not None and entry.txn_first_offset >= 0 and not header.is_transactional:
                raise InvalidTxnStateError(
                    f"{self._name}: producer {pid} has a transaction open since offset {entry.txn_first_offset}: "
                    "it can only write transactional batches until the transaction ends"
                )
            if pending is not None and pid in pending:
                known_epoch, known_last = pending[pid]
            else:
                if entry is not None:
                    duplicate = entry.find_duplicate(epoch, first_seq, last_seq)
                    if duplicate is not None:
                        duplicates.append(duplicate)
                        continue
                known_epoch, known_last = (entry.epoch, entry.last_seq) if entry is not None else (-1, -1)
            if known_epoch >= 0:
                self._check_sequence(pid, epoch, first_seq, known_epoch, known_last)
            if pending is None:
                pending = {}
            pending[pid] = (epoch, last_seq)
            new_batches += 1
        if not duplicates:
            return None
        if new_batches:
            raise InvalidRequestError(
                f"{self._name}: the request holds {len(duplicates)} batch(es) already written (duplicates of "
                f"earlier batches) and {new_batches} new one(s); nothing was written: send new batches in a "
                "request of their own"
            )
        return BatchMetadata(
            duplicates[0].first_seq, duplicates[-1].last_seq, duplicates[0].first_offset, duplicates[-1].last_offset
        )

    def _check_sequence(self, pid: int, epoch: int, first_seq: int, known_epoch: int, known_last: int) -> None:
        if epoch < known_epoch:
            raise InvalidProducerEpochError(
                f"{self._name}: producer {pid} sent epoch {epoch}, older than its current epoch {known_epoch} "
                "(the producer was fenced)"
            )
        if epoch > known_epoch:
            if first_seq != 0:
                raise OutOfOrderSequenceNumberError(
                    f"{self._name}: producer {pid} started epoch {epoch} at sequence {first_seq}; "
                    "a new epoch must start at sequence 0"
                )
            return
        if known_last < 0:
            return  # an entry a marker made: no batch of this epoch to follow (as an unknown producer)
        expected = next_sequence(known_last)
        if first_seq != expected:
            raise OutOfOrderSequenceNumberError(
                f"{self._name}: producer {pid} epoch {epoch} sent sequence {first_seq}, expected {expected} "
                f"(its last written sequence is {known_last})"
            )

    # ------------------------------------------------------------------ updates

    def check_marker(self, producer_id: int, producer_epoch: int) -> None:
        """A leader's check of a transaction marker: its epoch may not be older than the
        producer's (INVALID_PRODUCER_EPOCH)."""
        entry = self._producers.get(producer_id)
        if entry is not None and producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"{self._name}: a transaction marker of producer {producer_id} has epoch {producer_epoch}, older "
                f"than its current epoch {entry.epoch}"
            )

    def update(
        self, headers: Iterable[BatchHeader], control_type_of: ControlTypeOf | None = None
    ) -> list[CompletedTxn]:
        """Record appended batches (their offsets stamped); no checks (followers, recovery).

        Returns the transactions the markers among them closed. ``control_type_of`` reads
        a control batch's type; without it a batch list holding a marker is refused.
        """
        producers = self._producers
        completed: list[CompletedTxn] = []
        for header in headers:
            pid = header.producer_id
            if pid < 0:
                continue
            entry = producers.get(pid)
            if header.is_control:
                if control_type_of is None:
                    raise ValueError(f"{self._name}: a control batch at offset {header.base_offset} needs its type")
                aborted = control_type_of(header) == CONTROL_TYPE_ABORT
                marker = header.base_offset
                if entry is None:
                    entry = producers[pid] = ProducerStateEntry(pid, header.producer_epoch)
                elif header.producer_epoch != entry.epoch:
                    entry.epoch = header.producer_epoch
                    entry.batches.clear()
                entry.last_marker_offset = marker
                first = entry.txn_first_offset
                if first >= 0:
                    entry.txn_first_offset = -1
                    del self._ongoing[pid]
                    self._unreplicated.append((first, marker))
                    stable = min(self._ongoing.values(), default=marker + 1)
                    completed.append(CompletedTxn(pid, first, marker, aborted, stable))
                continue
            batch = BatchMetadata(header.base_sequence, header.last_sequence, header.base_offset, header.last_offset)
            if entry is None:
                entry = producers[pid] = ProducerStateEntry(pid, header.producer_epoch, (batch,))
            else:
                entry.add(header.producer_epoch, batch)
            if header.is_transactional and entry.txn_first_offset < 0:
                entry.txn_first_offset = header.base_offset
                self._ongoing[pid] = header.base_offset
        return completed

    def evict_below(self, log_start_offset: int) -> None:
        """Forget producers whose last batch lies entirely below ``log_start_offset``, but
        not one whose transaction is open: its marker is still to come, and must find it."""
        doomed = [
            pid for pid, e in self._producers.items() if e.last_log_offset < log_start_offset and e.txn_first_offset < 0
        ]
        for pid in doomed:
            del self._producers[pid]
            self._ongoing.pop(pid, None)

    def clear(self) -> None:
        self._producers = {}
        self._ongoing = {}
        self._unreplicated = []

    # ------------------------------------------------------------------ loading

    def load(
        self,
        segments: Sequence[LogSegment],
        log_start_offset: int,
        log_end_offset: int,
        *,
        completed_from: int | None = None,
    ) -> list[CompletedTxn]:
        """Rebuild the state of the batches in ``[log_start_offset, log_end_offset)``.

        Starts from the newest snapshot at or below the log end that reads back
        (deleting stale and unreadable ones), then replays the batch headers after it.
        With ``completed_from`` (recovery rebuilding the aborted-transaction indexes of
        the segments from there), snapshots above it are deleted first, and the
        transactions whose marker is at or after it are returned.
        """
        if completed_from is not None:
            self.delete_snapshots_above(completed_from)
        self.clear()
        replay_from = -1
        for offset in reversed(list(self._snapshots)):
            if offset > log_end_offset:
                logger.info(
                    "%s: deleting producer snapshot %d, beyond the log end %d", self._name, offset, log_end_offset
                )
                self._delete_snapshot(offset)
                continue
            try:
                self._producers = self._read_snapshot(offset)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.warning("%s: deleting unreadable producer snapshot %d: %s", self._name, offset, exc)
                self._delete_snapshot(offset)
                continue
            replay_from = offset
            break
        self._ongoing = {pid: e.txn_first_offset for pid, e in self._producers.items() if e.txn_first_offset >= 0}
        completed = self.update(*_batches_from(segments, max(replay_from, log_start_offset)))
        self.evict_below(log_start_offset)
        self._unreplicated = []
        if completed_from is None:
            return []
        return [t for t in completed if t.last_offset >= completed_from]

    def truncate_and_reload(self, segments: Sequence[LogSegment], log_start_offset: int, log_end_offset: int) -> None:
        """After the log was truncated to ``log_end_offset``: forget later snapshots, rebuild."""
        self.delete_snapshots_above(log_end_offset)
        self.load(segments, log_start_offset, log_end_offset)

    # ------------------------------------------------------------------ snapshots

    def take_snapshot(self, offset: int) -> None:
        """Write the current state as the snapshot of every batch below ``offset``."""
        if self._dir is None:
            return
        body = {
            "version": SNAPSHOT_VERSION,
            "offset": offset,
            "producers": [_entry_json(e) for e in self._producers.values()],
        }
        path = snapshot_file(self._dir, offset)
        tmp = path.with_name(path.name + files.TMP_SUFFIX)
        tmp.write_bytes(json.dumps(body, separators=(",", ":")).encode())
        os.replace(tmp, path)
        if offset not in self._snapshots:
            self._snapshots.append(offset)
            self._snapshots.sort()
        while len(self._snapshots) > MAX_SNAPSHOTS:
            self._delete_snapshot(self._snapshots[0])

    def delete_snapshots_above(self, offset: int) -> None:
        """Delete snapshots of offsets > ``offset``, durably (before a truncation)."""
        doomed = [o for o in self._snapshots if o > offset]
        for o in doomed:
            self._delete_snapshot(o)
        if doomed and self._dir is not None:
            files.fsync_dir(self._dir)

    def delete_all_snapshots(self) -> None:
        self.delete_snapshots_above(-1)

    def _delete_snapshot(self, offset: int) -> None:
        if offset in self._snapshots:
            self._snapshots.remove(offset)
        if self._dir is not None:
            snapshot_file(self._dir, offset).unlink(missing_ok=True)

    def _list_snapshots(self) -> list[int]:
        if self._dir is None or not self._dir.is_dir():
            return []
        out = []
        for name in os.listdir(self._dir):
            if name.endswith(SNAPSHOT_SUFFIX):
                try:
                    out.append(files.offset_from_filename(name))
                except ValueError:
                    continue
        return sorted(out)

    def _read_snapshot(self, offset: int) -> dict[int, ProducerStateEntry]:
        assert self._dir is not None
        body: Any = json.loads(snapshot_file(self._dir, offset).read_bytes())
        if body.get("version") != SNAPSHOT_VERSION or body.get("offset") != offset:
            raise ValueError(f"version {body.get('version')!r} / offset {body.get('offset')!r} do not match")
        producers: dict[int, ProducerStateEntry] = {}
        for p in body["producers"]:
            pid, epoch = p["id"], p["epoch"]
            batches = [BatchMetadata(*(int(v) for v in b)) for b in p["batches"]]
            txn, marker = p.get("txn", -1), p.get("marker", -1)
            if (
                not all(isinstance(v, int) for v in (pid, epoch, txn, marker))
                or not (batches or marker >= 0)
                or max(txn, marker) >= offset
            ):
                raise ValueError(f"malformed producer entry {p!r}")
            if any(b.first_offset > b.last_offset or b.last_offset >= offset for b in batches):
                raise ValueError(f"producer {pid} has batches beyond the snapshot offset {offset}")
            producers[pid] = ProducerStateEntry(pid, epoch, batches, txn, marker)
        return producers

    def __repr__(self) -> str:
        return f"ProducerStateManager({self._name}, producers={len(self._producers)}, snapshots={self._snapshots})"


def _entry_json(entry: ProducerStateEntry) -> dict[str, Any]:
    body: dict[str, Any] = {"id": entry.producer_id, "epoch": entry.epoch, "batches": [list(b) for b in entry.batches]}
    if entry.txn_first_offset >= 0:
        body["txn"] = entry.txn_first_offset
    if entry.last_marker_offset >= 0:
        body["marker"] = entry.last_marker_offset
    return body


def _batches_from(segments: Sequence[LogSegment], from_offset: int) -> tuple[Iterator[BatchHeader], ControlTypeOf]:
    """Headers of the producer batches whose last offset is >= ``from_offset``, in order,
    and the reader of their control batches' types."""
    control_types: dict[int, int] = {}

    def headers() -> Iterator[BatchHeader]:
        for segment in segments:
            if segment.next_offset <= from_offset:
                continue
            position = 0
            if segment.base_offset < from_offset:
                found = segment.translate_offset(from_offset)
                if found is None:
                    continue
                position = found[0]
            for pos, header in segment.iter_headers(position):
                if header.producer_id >= 0 and header.last_offset >= from_offset:
                    if header.is_control:
                        control_types[header.base_offset] = control_type(segment.read_batch(pos, header))
                    yield header

    return headers(), lambda header: control_types.pop(header.base_offset)
