"""One partition replica on this broker: its log, its role, leader epoch, ISR and HW.

Invariants (Kafka's ``Partition``):

* Only the leader appends producer batches; it stamps its leader epoch on each.
* The high watermark (HW) is the smallest log end offset (LEO) over the ISR; while
  this broker leads it never goes backwards. Consumers read strictly below it.
* acks=all is satisfied when the HW has passed the last offset of the batch.
* With acks=all, an ISR smaller than ``min.insync.replicas`` refuses the write before
  anything is appended.
* A follower is in sync while it has reached the leader's LEO within the last
  ``replica.lag.time.max.ms``; the leader shrinks and expands the ISR through
  ``isr_writer`` (a compare-and-set of the partition state znode). The ISR always
  holds the leader.
* On a follower, HW = min(leader's HW, own LEO).
* DeleteRecords moves the leader's log start offset up to at most the HW; followers
  follow the leader's log start offset (capped by their LEO) from fetch responses and
  report theirs in their fetch requests; the low watermark is the smallest log start
  offset over the ISR. ``on_log_start_moved`` is called (without the lock) whenever
  either moves it, so the new start can be checkpointed.

Thread safety: every method takes the partition's lock. ``isr_writer`` is called with
it held (it does one ZooKeeper round trip). Callers must not hold it while notifying
the purgatory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kbroker.cluster.zkdata import LeaderAndIsr
from kbroker.storage.log import Log, LogAppendInfo
from kclient.errors import (
    FencedLeaderEpochError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderForPartitionError,
    OffsetOutOfRangeError,
    PolicyViolationError,
    UnknownLeaderEpochError,
)
from kclient.structs import AbortedTransaction, IsolationLevel

log = logging.getLogger(__name__)

IsrWriter = Callable[["Partition", LeaderAndIsr], int | None]
"""Write a leader-driven ISR change; returns the new znode version or None if refused."""

ISR_EXPANSION_RETRY_MS = 1000.0
"""How long a leader waits before it tries again an ISR expansion that ZooKeeper refused
while the partition state it knows is unchanged."""


def _ignore(_: Partition) -> None:
    pass


def _now_ms() -> float:
    return time.monotonic() * 1000.0


@dataclass
class FollowerState:
    log_end_offset: int = -1
    last_caught_up_ms: float = 0.0
    last_fetch_ms: float = 0.0
    last_fetch_leader_leo: int = -1
    log_start_offset: int = -1
    """As the follower reported it in its last fetch; -1 unknown."""


@dataclass
class ReadResult:
    records: bytes
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int = -1
    """The first offset a read_committed consumer may not read yet (-1: not known)."""
    aborted_transactions: list[AbortedTransaction] | None = None
    """For a read_committed read, the aborted transactions overlapping its records."""


@dataclass
class PartitionStateView:
    leader: int
    leader_epoch: int
    isr: list[int] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)


class Partition:
    """A replica of ``topic``-``index`` hosted here."""

    def __init__(
        self,
        topic: str,
        index: int,
        broker_id: int,
        log: Log,
        *,
        high_watermark: int = 0,
        isr_writer: IsrWriter,
        on_log_start_moved: Callable[[Partition], None] = _ignore,
    ) -> None:
        self.topic = topic
        self._on_log_start_moved = on_log_start_moved
        self.index = index
        self.broker_id = broker_id
        self.log = log
        self._lock = threading.RLock()
        self._isr_writer = isr_writer
        self.leader = -1
        self.leader_epoch = -1
        self.isr: list[int] = []
        self.replicas: list[int] = []
        self.zk_version = -1
        self.controller_epoch = 0
        self.high_watermark = min(high_watermark, log.log_end_offset)
        self.followers: dict[int, FollowerState] = {}
        # Followers an ISR expansion may have added in ZooKeeper although the write's
        # outcome is unknown (lost connection): the HW counts them until ZooKeeper's
        # state is seen again (Kafka's "maximal ISR").
        self._maybe_in_isr: set[int] = set()
        self._expansion_refused: dict[int, tuple[int, float]] = {}
        """Follower -> (znode version, when): its last ISR expansion was refused (a
        departing broker, a state changed in ZooKeeper). Not tried again for that version
        within ``ISR_EXPANSION_RETRY_MS``: each try is a ZooKeeper round trip inside a
        follower's fetch."""
        self._led_since_ms = 0.0
        self.isr_shrinks = 0
        """ISR shrinks / expansions made here as leader (read by kbroker.metrics)."""
        self.isr_expands = 0

    def __repr__(self) -> str:
        return f"Partition({self.topic}-{self.index}, leader={self.leader}, epoch={self.leader_epoch}, isr={self.isr})"

    def committed_offset(self) -> int:
        """The high watermark: the log cleaner stays below it."""
        return self.high_watermark

    @property
    def is_leader(self) -> bool:
        return self.leader == self.broker_id

    # --- role changes --------------------------------------------------------------

    def _stale(self, state: LeaderAndIsr) -> bool:
        """An older write of the current epoch (a lagging watch event): ignore it."""
        return state.leader_epoch == self.leader_epoch and 0 <= state.zk_version < self.zk_version

    def make_leader(self, state: LeaderAndIsr, replicas: list[int]) -> bool:
        """Become (or stay) leader; returns True if the epoch is new."""
        with self._lock:
            new_epoch = state.leader_epoch != self.leader_epoch or not self.is_leader
            if not new_epoch and self._stale(state):
                return False
            self._set_state(state, replicas)
            self._maybe_in_isr = set()
            if new_epoch:
                now = _now_ms()
                self._led_since_ms = now
                self.followers = {r: FollowerState(last_caught_up_ms=now) for r in replicas if r != self.broker_id}
                self.log.leader_epoch_cache.assign(state.leader_epoch, self.log.log_end_offset)
            else:
                for r in replicas:
                    if r != self.broker_id and r not in self.followers:
                        self.followers[r] = FollowerState(last_caught_up_ms=_now_ms())
            self._maybe_increment_hw()
            return new_epoch

    def make_follower(self, state: LeaderAndIsr, replicas: list[int]) -> bool:
        """Become (or stay) a follower of ``state.leader``; True if leader or epoch changed."""
        with self._lock:
            changed = state.leader != self.leader or state.leader_epoch != self.leader_epoch
            if not changed and self._stale(state):
                return False
            self._set_state(state, replicas)
            self.followers = {}
            self._maybe_in_isr = set()
            return changed

    def _set_state(self, state: LeaderAndIsr, replicas: list[int]) -> None:
        self.leader = state.leader
        self.leader_epoch = state.leader_epoch
        self.isr = list(state.isr)
        self.replicas = list(replicas)
        self.zk_version = state.zk_version
        self.controller_epoch = state.controller_epoch

    def state_view(self) -> PartitionStateView:
        with self._lock:
            return PartitionStateView(self.leader, self.leader_epoch, list(self.isr), list(self.replicas))

    # --- leader side ---------------------------------------------------------------

    def check_epoch(self, current_leader_epoch: int) -> None:
        if current_leader_epoch < 0:
            return
        if current_leader_epoch < self.leader_epoch:
            raise FencedLeaderEpochError(
                f"{self.topic}-{self.index}: request epoch {current_leader_epoch} < current {self.leader_epoch}"
            )
        if current_leader_epoch > self.leader_epoch:
            raise UnknownLeaderEpochError(
                f"{self.topic}-{self.index}: request epoch {current_leader_epoch} > current {self.leader_epoch}"
            )

    def check_leader_epoch(self, current_leader_epoch: int) -> None:
        """Raise unless this replica leads in ``current_leader_epoch`` (or any, if -1)."""
        with self._lock:
            self._require_leader()
            self.check_epoch(current_leader_epoch)

    def resign(self) -> None:
        """This replica is going away: stop leading so waiting requests fail over."""
        with self._lock:
            self.leader = -1

    def _require_leader(self) -> None:
        if not self.is_leader:
            raise NotLeaderForPartitionError(
                f"broker {self.broker_id} is not the leader of {self.topic}-{self.index} (leader is {self.leader})"
            )

    def append_as_leader(self, records: bytes, required_acks: int, min_insync: int) -> LogAppendInfo:
        """Append a producer's batches (offsets, and the LogAppendTime stamped if any)."""
        with self._lock:
            self._require_leader()
            if required_acks == -1 and len(self.isr) < min_insync:
                raise NotEnoughReplicasError(
                    f"{self.topic}-{self.index}: {len(self.isr)} in-sync replica(s) {self.isr}, "
                    f"min.insync.replicas is {min_insync}"
                )
            info = self.log.append_as_leader(records, self.leader_epoch)
            self._maybe_increment_hw()
            return info

    def append_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, min_insync: int
    ) -> LogAppendInfo:
        """Append a transaction marker (WriteTxnMarkers), written as acks=all is."""
        with self._lock:
            self._require_leader()
            if len(self.isr) < min_insync:
                raise NotEnoughReplicasError(
                    f"{self.topic}-{self.index}: {len(self.isr)} in-sync replica(s) {self.isr}, "
                    f"min.insync.replicas is {min_insync}"
                )
            info = self.log.append_marker(
                producer_id,
                producer_epoch,
                commit=commit,
                coordinator_epoch=coordinator_epoch,
                leader_epoch=self.leader_epoch,
            )
            self._maybe_increment_hw()
            return info

    def acks_satisfied(self, required_offset: int, min_insync: int) -> bool | None:
        """For acks=all: True once the HW reached ``required_offset`` with at least
        ``min_insync`` replicas in sync; raises if deposed or if the ISR shrank below it."""
        with self._lock:
            self._require_leader()
            if self.high_watermark < required_offset:
                return None
            if len(self.isr) < min_insync:
                raise NotEnoughReplicasAfterAppendError(
                    f"{self.topic}-{self.index}: written, but the ISR shrank to {self.isr}, "
                    f"below min.insync.replicas={min_insync}"
                )
            return True

    def record_follower_fetch(
        self, replica_id: int, fetch_offset: int, current_leader_epoch: int, log_start_offset: int = -1
    ) -> bool:
        """A follower fetched from ``fetch_offset`` (its LEO) with its log start offset
        (-1: not reported). Returns True if the HW or the follower's log start moved."""
        with self._lock:
            self._require_leader()
            self.check_epoch(current_leader_epoch)
            if replica_id == self.broker_id or replica_id not in self.replicas:
                raise NotLeaderForPartitionError(
                    f"broker {replica_id} is not a follower of {self.topic}-{self.index} (replicas {self.replicas})"
                )
            f = self.followers.get(replica_id)
            if f is None:
                f = self.followers[replica_id] = FollowerState()
            now = _now_ms()
            leo = self.log.log_end_offset
            if fetch_offset > leo:
                raise OffsetOutOfRangeError(
                    f"{self.topic}-{self.index}: replica {replica_id} fetches from {fetch_offset}, beyond the "
                    f"leader's log end offset {leo}"
                )
            if fetch_offset >= leo:
                f.last_caught_up_ms = now
            elif fetch_offset >= f.last_fetch_leader_leo >= 0:
                f.last_caught_up_ms = max(f.last_caught_up_ms, f.last_fetch_ms)
            f.last_fetch_leader_leo = leo
            f.last_fetch_ms = now
            f.log_end_offset = fetch_offset
            start_moved = log_start_offset > f.log_start_offset
            if log_start_offset >= 0:
                f.log_start_offset = log_start_offset
            self._maybe_expand_isr(replica_id, f)
            return self._maybe_increment_hw() or start_moved

    def _maybe_expand_isr(self, replica_id: int, f: FollowerState) -> None:
        if replica_id in self.isr or f.log_end_offset < self.high_watermark:
            return
        epoch_start = self._epoch_start_offset()
        if f.log_end_offset < epoch_start:
            return
        now = _now_ms()
        refused = self._expansion_refused.get(replica_id)
        if refused is not None and refused[0] == self.zk_version and now - refused[1] < ISR_EXPANSION_RETRY_MS:
            return
        new_isr = [r for r in self.replicas if r in self.isr or r == replica_id]
        if self._write_isr(new_isr):
            self._expansion_refused.pop(replica_id, None)
            self.isr_expands += 1
            log.debug("%s-%d: ISR expanded to %s (broker %d caught up)", self.topic, self.index, new_isr, replica_id)
        else:
            self._expansion_refused[replica_id] = (self.zk_version, now)

    def _epoch_start_offset(self) -> int:
        for entry in reversed(self.log.leader_epoch_cache.entries()):
            if entry.epoch == self.leader_epoch:
                return int(entry.start_offset)
        return 0

    def maybe_shrink_isr(self, lag_max_ms: float) -> bool:
        """Drop followers that have not caught up within ``lag_max_ms``; True if the HW moved."""
        with self._lock:
            if not self.is_leader:
                return False
            now = _now_ms()
            leo = self.log.log_end_offset
            out = [
                r
                for r in self.isr
                if r != self.broker_id
                and (f := self.followers.get(r)) is not None
                and f.log_end_offset < leo
                and now - f.last_caught_up_ms > lag_max_ms
            ]
            if not out:
                return False
            new_isr = [r for r in self.isr if r not in out]
            if self._write_isr(new_isr):
                self.isr_shrinks += 1
                log.debug("%s-%d: ISR shrunk to %s (lagging: %s)", self.topic, self.index, new_isr, out)
                return self._maybe_increment_hw()
            return False

    def isr_follower_silent(self, quiet_ms: float) -> bool:
        """Leading, and some other ISR member has not fetched for ``quiet_ms``: with
        ZooKeeper out of reach, the sign that the followers now follow someone else."""
        with self._lock:
            if not self.is_leader:
                return False
            now = _now_ms()
            for r in self.isr:
                if r == self.broker_id:
                    continue
                f = self.followers.get(r)
                last = max(f.last_fetch_ms if f else 0.0, self._led_since_ms)
                if now - last > quiet_ms:
                    return True
            return False

    def _write_isr(self, new_isr: list[int]) -> bool:
        state = LeaderAndIsr(self.leader, self.leader_epoch, new_isr, self.controller_epoch, self.zk_version)
        try:
            version = self._isr_writer(self, state)
        except Exception as exc:
            # Unknown outcome: an expansion may have been applied; count it for the HW.
            log.warning("%s-%d: ISR change to %s failed: %s", self.topic, self.index, new_isr, exc)
            self._maybe_in_isr |= set(new_isr) - set(self.isr)
            return False
        if version is None:
            return False
        self.isr = new_isr
        self.zk_version = version
        return True

    def delete_records(self, offset: int) -> int:
        """DeleteRecords as leader: move the log start offset up to ``offset`` (-1: the
        HW); segments entirely below it are deleted. Returns the offset asked for
        (the HW for -1): the low watermark to wait for.

        Raises NotLeaderForPartitionError off the leader, OffsetOutOfRangeError for an
        offset above the HW or below -1, PolicyViolationError when the topic's
        cleanup.policy lacks ``delete`` (compact only)."""
        with self._lock:
            self._require_leader()
            if not self.log.config.delete_enabled:
                raise PolicyViolationError(
                    f"Records of partition {self.topic}-{self.index} can not be deleted due to the configured policy"
                )
            target = self.high_watermark if offset == -1 else offset
            if target < 0:
                raise OffsetOutOfRangeError(f"The offset {target} for partition {self.topic}-{self.index} is not valid")
            if target > self.high_watermark:
                raise OffsetOutOfRangeError(
                    f"Cannot increment the log start offset to {target} of partition {self.topic}-{self.index} "
                    f"since it is larger than the high watermark {self.high_watermark}"
                )
            moved = self.log.maybe_increment_log_start_offset(target)
        if moved:
            log.info("%s-%d: log start offset moved to %d (DeleteRecords)", self.topic, self.index, target)
            self._on_log_start_moved(self)
        return target

    def low_watermark(self) -> int:
        """The smallest log start offset over the ISR (leader only; -1 while an in-sync
        follower has not reported its own)."""
        with self._lock:
            self._require_leader()
            low = self.log.log_start_offset
            for r in self.isr:
                if r != self.broker_id:
                    f = self.followers.get(r)
                    low = min(low, f.log_start_offset if f else -1)
            return low

    def available_to(
        self,
        replica_id: int,
        offset: int,
        current_leader_epoch: int = -1,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> bool:
        """Is there anything at or after ``offset`` for this reader (a consumer sees below
        the HW, or the LSO with read_committed; a follower up to the LEO)? Raises what
        :meth:`read` would raise."""
        with self._lock:
            self._require_leader()
            self.check_epoch(current_leader_epoch)
            if replica_id >= 0:
                end = self.log.log_end_offset
            elif isolation is IsolationLevel.READ_COMMITTED:
                end = self._last_stable_offset()
            else:
                end = self.high_watermark
            return end > offset or offset < self.log.log_start_offset

    def _last_stable_offset(self) -> int:
        hw = self.high_watermark
        unstable = self.log.first_unstable_offset(hw)
        return hw if unstable is None else min(unstable, hw)

    @property
    def last_stable_offset(self) -> int:
        """The LSO: no transaction is undecided below it (at most the high watermark)."""
        with self._lock:
            return self._last_stable_offset()

    def check_replica(self, replica_id: int) -> None:
        """Only a broker in this partition's replica set may act as its follower."""
        with self._lock:
            if replica_id not in self.replicas:
                raise NotLeaderForPartitionError(
                    f"broker {replica_id} is not a replica of {self.topic}-{self.index} ({self.replicas})"
                )

    def in_sync(self, replica_id: int) -> bool:
        with self._lock:
            return replica_id in self.isr

    def read(
        self,
        offset: int,
        max_bytes: int,
        replica_id: int,
        current_leader_epoch: int = -1,
        *,
        records: bool = True,
        min_one_batch: bool = True,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> ReadResult:
        """Records from ``offset`` (none if not ``records``: a throttled follower gets the
        offsets only) after the leadership and epoch checks. With ``min_one_batch`` the
        first batch comes whole even when larger than ``max_bytes`` (KIP-74: only for the
        first partition of a fetch that returns records). A consumer reads below the high
        watermark, or with read_committed below the last stable offset, and then also
        gets the aborted transactions that overlap what it read."""
        with self._lock:
            self._require_leader()
            self.check_epoch(current_leader_epoch)
            hw = self.high_watermark
            lso = self._last_stable_offset()
            start, end = self.log.log_start_offset, self.log.log_end_offset
        committed = replica_id < 0 and isolation is IsolationLevel.READ_COMMITTED
        limit = None if replica_id >= 0 else lso if committed else hw
        if not records or (limit is not None and limit < offset <= end):
            # Above the HW (or LSO) but inside the log: nothing visible yet.
            return ReadResult(b"", hw, start, end, lso, [] if committed else None)
        data = self.log.read(offset, max_bytes, max_offset=limit, min_one_batch=min_one_batch)
        aborted = None
        if committed:
            aborted = (
                [
                    AbortedTransaction(t.producer_id, t.first_offset)
                    for t in self.log.collect_aborted_transactions(offset, data.next_offset)
                ]
                if data.records
                else []
            )
        return ReadResult(data.records, hw, start, end, lso, aborted)

    def _maybe_increment_hw(self) -> bool:
        """HW = min LEO over the ISR (the leader's own LEO included); only grows."""
        if not self.is_leader:
            return False
        leo = self.log.log_end_offset
        new_hw = leo
        for r in set(self.isr) | self._maybe_in_isr:
            if r != self.broker_id:
                f = self.followers.get(r)
                new_hw = min(new_hw, f.log_end_offset if f else -1)
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            return True
        return False

    # --- follower side -------------------------------------------------------------

    def _check_follower(self, leader_epoch: int) -> None:
        """Follower-side writes are for the follower of ``leader_epoch`` only: a reply that
        arrives after this broker became leader (or moved on) must not touch the log."""
        if self.is_leader or self.leader_epoch != leader_epoch:
            raise FencedLeaderEpochError(
                f"{self.topic}-{self.index}: replica state moved on (epoch {self.leader_epoch}, "
                f"leader {self.leader}); dropping a fetch result for epoch {leader_epoch}"
            )

    def append_as_follower(
        self, records: bytes, leader_hw: int, leader_epoch: int, leader_log_start_offset: int = -1
    ) -> None:
        """Append the leader's batches; take its HW and its log start offset (each capped
        by this log's end)."""
        with self._lock:
            self._check_follower(leader_epoch)
            if records:
                self.log.append_as_follower(records)
            self.high_watermark = max(min(leader_hw, self.log.log_end_offset), 0)
            start = min(leader_log_start_offset, self.log.log_end_offset)
            moved = start > self.log.log_start_offset and self.log.maybe_increment_log_start_offset(start)
        if moved:
            log.info("%s-%d: log start offset moved to %d (the leader's)", self.topic, self.index, start)
            self._on_log_start_moved(self)

    def truncate_to(self, offset: int, leader_epoch: int) -> None:
        with self._lock:
            self._check_follower(leader_epoch)
            if offset < self.log.log_end_offset:
                log.warning("%s-%d: truncating from %d to %d", self.topic, self.index, self.log.log_end_offset, offset)
                self.log.truncate_to(offset)
            self.high_watermark = min(self.high_watermark, self.log.log_end_offset)

    def truncate_fully_and_start_at(self, offset: int, leader_epoch: int) -> None:
        with self._lock:
            self._check_follower(leader_epoch)
            self.log.truncate_fully_and_start_at(offset)
            self.high_watermark = offset
