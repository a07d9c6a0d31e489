"""One partition replica on this broker: its log, its role, leader epoch, ISR and HW.

Invariants (Kafka's ``Partition``):

* Only the leader appends producer batches; it stamps its leader epoch on each.
* The high watermark (HW) is the smallest log end offset (LEO) over the ISR; it never
  goes backwards while this broker leads. Consumers read strictly below it.
* acks=all is satisfied when the HW has passed the last offset of the batch.
* With acks=all, an ISR smaller than ``min.insync.replicas`` refuses the write before
  anything is appended.

Thread safety: every method takes the partition's lock. Callers must not hold it while
notifying the purgatory.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from kbroker.cluster.zkdata import LeaderAndIsr
from kbroker.storage.log import Log
from kclient.errors import (
    FencedLeaderEpochError,
    NotEnoughReplicasError,
    NotLeaderForPartitionError,
    UnknownLeaderEpochError,
)

CONSUMER_REPLICA_ID = -1


@dataclass
class FollowerState:
    log_end_offset: int = -1
    last_caught_up_ms: float = 0.0
    last_fetch_ms: float = 0.0


@dataclass
class ReadResult:
    records: bytes
    high_watermark: int
    log_start_offset: int
    log_end_offset: int


@dataclass
class PartitionStateView:
    leader: int
    leader_epoch: int
    isr: list[int] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)


class Partition:
    """A replica of ``topic``-``index`` hosted here."""

    def __init__(self, topic: str, index: int, broker_id: int, log: Log) -> None:
        self.topic = topic
        self.index = index
        self.broker_id = broker_id
        self.log = log
        self._lock = threading.RLock()
        self.leader = -1
        self.leader_epoch = -1
        self.isr: list[int] = []
        self.replicas: list[int] = []
        self.zk_version = -1
        self.high_watermark = 0
        self.followers: dict[int, FollowerState] = {}

    @property
    def is_leader(self) -> bool:
        return self.leader == self.broker_id

    # --- role changes --------------------------------------------------------------

    def make_leader(self, state: LeaderAndIsr, replicas: list[int]) -> bool:
        """Become (or stay) leader; returns True if the epoch is new."""
        with self._lock:
            new_epoch = state.leader_epoch != self.leader_epoch or not self.is_leader
            self.leader = state.leader
            self.leader_epoch = state.leader_epoch
            self.isr = list(state.isr)
            self.replicas = list(replicas)
            self.zk_version = state.zk_version
            if new_epoch:
                now = time.monotonic() * 1000
                self.followers = {r: FollowerState(last_caught_up_ms=now) for r in replicas if r != self.broker_id}
                self.log.leader_epoch_cache.assign(state.leader_epoch, self.log.log_end_offset)
            self._maybe_increment_hw()
            return new_epoch

    def make_follower(self, state: LeaderAndIsr, replicas: list[int]) -> bool:
        """Become (or stay) a follower of ``state.leader``; True if the leader changed."""
        with self._lock:
            changed = state.leader != self.leader or state.leader_epoch != self.leader_epoch
            self.leader = state.leader
            self.leader_epoch = state.leader_epoch
            self.isr = list(state.isr)
            self.replicas = list(replicas)
            self.zk_version = state.zk_version
            self.followers = {}
            return changed

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

    def _require_leader(self) -> None:
        if not self.is_leader:
            raise NotLeaderForPartitionError(
                f"broker {self.broker_id} is not the leader of {self.topic}-{self.index} (leader is {self.leader})"
            )

    def append_as_leader(self, records: bytes, required_acks: int, min_insync: int) -> tuple[int, int]:
        """Append a producer's batches; returns (base offset, next offset after them)."""
        with self._lock:
            self._require_leader()
            if required_acks == -1 and len(self.isr) < min_insync:
                raise NotEnoughReplicasError(
                    f"{self.topic}-{self.index}: {len(self.isr)} in-sync replica(s) {self.isr}, "
                    f"min.insync.replicas is {min_insync}"
                )
            info = self.log.append_as_leader(records, self.leader_epoch)
            self._maybe_increment_hw()
            return info.first_offset, info.last_offset + 1

    def acks_satisfied(self, required_offset: int) -> bool | None:
        """For acks=all: True once the HW reached ``required_offset``; raises if deposed."""
        with self._lock:
            self._require_leader()
            return True if self.high_watermark >= required_offset else None

    def read(self, offset: int, max_bytes: int, replica_id: int, current_leader_epoch: int = -1) -> ReadResult:
        with self._lock:
            self._require_leader()
            self.check_epoch(current_leader_epoch)
            hw = self.high_watermark
            start, end = self.log.log_start_offset, self.log.log_end_offset
        limit = None if replica_id >= 0 else hw
        if replica_id < 0 and offset > hw and offset <= end:
            # Above the HW but inside the log: nothing visible yet.
            return ReadResult(b"", hw, start, end)
        data = self.log.read(offset, max_bytes, max_offset=limit, min_one_batch=True)
        return ReadResult(data.records, hw, start, end)

    def _maybe_increment_hw(self) -> bool:
        """HW = min LEO over the ISR (the leader's own LEO included)."""
        leo = self.log.log_end_offset
        candidates = [leo]
        for r in self.isr:
            if r != self.broker_id:
                f = self.followers.get(r)
                candidates.append(f.log_end_offset if f else -1)
        new_hw = max(min(candidates), 0)
        if new_hw > self.high_watermark or self.high_watermark > leo:
            self.high_watermark = min(max(new_hw, self.high_watermark), leo)
            return True
        return False
