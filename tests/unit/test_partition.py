"""Partition and follower-truncation rules on real logs (no processes, no ZooKeeper)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from kbroker.cluster.zkdata import LeaderAndIsr
from kbroker.purgatory import Purgatory
from kbroker.replication import partition as partition_module
from kbroker.replication.fetcher import GrpcLeaderEndPoint, ReplicaFetcher, _FetchState
from kbroker.replication.partition import Partition
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient.errors import FencedLeaderEpochError, NotEnoughReplicasAfterAppendError
from kclient.records import BatchBuilder, iter_headers
from kclient.structs import AbortedTransaction, IsolationLevel


def batch(base_offset: int, epoch: int, n: int = 1) -> bytes:
    b = BatchBuilder(base_offset=base_offset, partition_leader_epoch=epoch)
    for i in range(n):
        b.append(1000 + i, None, f"{epoch}-{base_offset + i}".encode())
    return b.build()


def follower_log(tmp_path: Path, name: str, epochs: list[tuple[int, int]], end: int) -> Log:
    """A log holding one record per offset; ``epochs`` = [(epoch, start offset)]."""
    log = Log.open(tmp_path / f"{name}-0", LogConfig())
    bounds = [*epochs, (None, end)]
    for (epoch, start), (_, stop) in itertools.pairwise(bounds):
        for off in range(start, stop):
            log.append_as_follower(batch(off, epoch))
    return log


def partition(log: Log, broker: int = 1, writes: list[LeaderAndIsr] | None = None) -> Partition:
    def writer(_p: Partition, state: LeaderAndIsr) -> int:
        if writes is not None:
            writes.append(state)
        return state.zk_version + 1

    return Partition("t", 0, broker, log, isr_writer=writer)


def test_follower_writes_are_refused_once_this_broker_leads(tmp_path: Path) -> None:
    p = partition(follower_log(tmp_path, "a", [(0, 0)], 3))
    p.make_follower(LeaderAndIsr(2, 5, [2, 1], 1, 0), [2, 1])
    p.make_leader(LeaderAndIsr(1, 6, [1, 2], 1, 1), [1, 2])  # a late reply arrives after this
    with pytest.raises(FencedLeaderEpochError):
        p.truncate_to(1, 5)
    with pytest.raises(FencedLeaderEpochError):
        p.append_as_follower(batch(3, 5), 4, 5)
    assert p.log.log_end_offset == 3


def test_acks_all_fails_when_the_isr_shrank_below_min_insync(tmp_path: Path) -> None:
    p = partition(Log.open(tmp_path / "t-0", LogConfig()))
    p.make_leader(LeaderAndIsr(1, 0, [1, 2], 1, 0), [1, 2])
    end = p.append_as_leader(batch(0, 0), -1, 2).last_offset + 1
    assert p.acks_satisfied(end, 2) is None  # follower 2 has not fetched yet
    p.followers[2].last_caught_up_ms -= 10_000
    assert p.maybe_shrink_isr(1000)  # the HW jumps to the leader's LEO ...
    with pytest.raises(NotEnoughReplicasAfterAppendError):  # ... but that is not acks=all
        p.acks_satisfied(end, 2)


def test_a_stale_state_of_the_same_epoch_does_not_shrink_the_isr(tmp_path: Path) -> None:
    p = partition(Log.open(tmp_path / "t-0", LogConfig()))
    p.make_leader(LeaderAndIsr(1, 3, [1, 2], 1, 7), [1, 2])
    p.append_as_leader(batch(0, 3, 4), 1, 1)
    p.record_follower_fetch(2, 1, -1)
    assert not p.make_leader(LeaderAndIsr(1, 3, [1], 1, 6), [1, 2])  # an older write, seen late
    assert p.isr == [1, 2] and p.high_watermark == 1


def test_a_lost_isr_expansion_write_still_counts_the_follower_for_the_hw(tmp_path: Path) -> None:
    def flaky(_p: Partition, _s: LeaderAndIsr) -> int:
        raise ConnectionError("connection loss")

    p = Partition("t", 0, 1, Log.open(tmp_path / "t-0", LogConfig()), isr_writer=flaky)
    p.make_leader(LeaderAndIsr(1, 0, [1], 1, 0), [1, 2])
    p.append_as_leader(batch(0, 0, 4), 1, 1)
    assert p.high_watermark == 4
    p.record_follower_fetch(2, 4, -1)  # caught up to the HW: expansion attempted, outcome unknown
    assert p.isr == [1]
    p.append_as_leader(batch(4, 0, 4), 1, 1)
    assert p.high_watermark == 4  # follower 2 (maybe in the ISR now) only has 4


def test_a_refused_isr_expansion_is_not_tried_again_at_every_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZooKeeper refuses adding a departing broker back: the leader tries once per
    ISR_EXPANSION_RETRY_MS for the state it knows, not once per fetch (each try is a
    round trip inside the follower's fetch), and at once after its state changed."""
    tries: list[LeaderAndIsr] = []
    now = [1_000_000.0]
    monkeypatch.setattr(partition_module, "_now_ms", lambda: now[0])

    def refusing(_p: Partition, state: LeaderAndIsr) -> int | None:
        tries.append(state)
        return None

    p = Partition("t", 0, 1, Log.open(tmp_path / "t-0", LogConfig()), isr_writer=refusing)
    p.make_leader(LeaderAndIsr(1, 1, [1], 1, 5), [1, 2])
    for _ in range(50):
        p.record_follower_fetch(2, 0, -1)
    assert len(tries) == 1 and p.isr == [1]
    now[0] += partition_module.ISR_EXPANSION_RETRY_MS
    p.record_follower_fetch(2, 0, -1)
    assert len(tries) == 2
    p.make_leader(LeaderAndIsr(1, 2, [1], 1, 6), [1, 2])  # a new state from the controller
    p.record_follower_fetch(2, 0, -1)
    assert len(tries) == 3 and tries[-1].zk_version == 6


def truncate(follower: Log, leader: Log, rounds: int = 10) -> None:
    """Run KIP-279 rounds of the fetcher against ``leader``'s epoch cache."""
    p = partition(follower, broker=2)
    p.make_follower(LeaderAndIsr(1, 9, [1, 2], 1, 0), [1, 2])
    fetcher = ReplicaFetcher(2, 1, GrpcLeaderEndPoint("127.0.0.1:1"), max_wait_ms=0, max_bytes=1, purgatory=Purgatory())
    st = _FetchState(p, 9)
    while st.truncating and rounds:
        epoch, end = leader.leader_epoch_cache.end_offset_for(
            follower.leader_epoch_cache.latest_epoch, leader.log_end_offset
        )
        st.rounds += 1
        fetcher._truncation_round(st, epoch, end)
        rounds -= 1


def test_truncation_takes_several_rounds_when_epochs_differ(tmp_path: Path) -> None:
    leader = follower_log(tmp_path, "leader", [(1, 0), (2, 5), (4, 12)], 15)
    follower = follower_log(tmp_path, "follower", [(1, 0), (3, 10)], 14)
    truncate(follower, leader)
    # Epoch 3 (never on the leader) and the epoch-1 records at 5..9 the leader has as epoch 2 are gone.
    assert follower.log_end_offset == 5
    assert [(e.epoch, e.start_offset) for e in follower.leader_epoch_cache.entries()] == [(1, 0)]


def test_truncation_keeps_a_common_prefix(tmp_path: Path) -> None:
    leader = follower_log(tmp_path, "leader", [(0, 0), (1, 100)], 130)
    follower = follower_log(tmp_path, "follower", [(0, 0)], 151)  # an old leader's unreplicated tail
    truncate(follower, leader)
    assert follower.log_end_offset == 100


def txn_batch(pid: int, seq: int, n: int = 1) -> bytes:
    b = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=seq, is_transactional=True)
    for i in range(n):
        b.append(int(time.time() * 1000), None, f"tx{pid}-{seq + i}".encode())
    return b.build()


def test_read_committed_stops_at_the_last_stable_offset_and_names_aborted_transactions(tmp_path: Path) -> None:
    p = partition(Log.open(tmp_path / "t-0", LogConfig()))
    p.make_leader(LeaderAndIsr(1, 0, [1], 1, 0), [1])
    p.append_as_leader(batch(0, 0, 2), 1, 1)  # 0..1, no transaction
    p.append_as_leader(txn_batch(7, 0, 2), 1, 1)  # 2..3, open
    committed, uncommitted = IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED
    assert (p.high_watermark, p.last_stable_offset) == (4, 2)
    head = p.read(0, 1 << 20, -1, isolation=committed)
    assert [h.last_offset for _, h in iter_headers(head.records)] == [1]
    assert (head.last_stable_offset, head.aborted_transactions) == (2, [])
    assert p.read(2, 1 << 20, -1, isolation=committed).records == b""
    assert not p.available_to(-1, 2, isolation=committed)
    assert p.available_to(-1, 2, isolation=uncommitted)
    assert p.read(2, 1 << 20, -1, isolation=uncommitted).aborted_transactions is None

    p.append_marker(7, 0, False, 0, 1)  # 4: ABORT
    assert p.last_stable_offset == p.high_watermark == 5
    tail = p.read(2, 1 << 20, -1, isolation=committed)
    assert [h.is_control for _, h in iter_headers(tail.records)] == [False, True]
    assert tail.aborted_transactions == [AbortedTransaction(7, 2)]
    assert p.read(0, 1 << 20, 2, isolation=committed).aborted_transactions is None  # a follower: the LEO
