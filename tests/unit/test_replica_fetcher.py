"""The follower fetcher's loop against an in-process leader (a LeaderEndPoint over a real
leader Partition and Log): catching up, the high watermark, KIP-279 truncation of a
divergent tail, and a leader that stops leading."""

from __future__ import annotations

import time
from pathlib import Path

from kbroker.cluster.zkdata import LeaderAndIsr
from kbroker.purgatory import Purgatory
from kbroker.replication.fetcher import ReplicaFetcher
from kbroker.replication.partition import Partition
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient.proto.kbroker.v1 import log_pb2
from kclient.records import BatchBuilder, decode_batches
from tests.support import serve_fetch, serve_offset_for_leader_epoch, wait_until

LEADER, FOLLOWER = 1, 2


def batch(epoch: int, values: list[bytes]) -> bytes:
    b = BatchBuilder(partition_leader_epoch=epoch)
    for v in values:
        b.append(1000, None, v)
    return b.build()


def partition(log: Log, broker: int) -> Partition:
    return Partition("t", 0, broker, log, isr_writer=lambda _p, state: state.zk_version + 1)


class InProcessLeader:
    """A LeaderEndPoint answering from a leader Partition in this process."""

    address = "in-process"

    def __init__(self, leader: Partition) -> None:
        self.leader = leader
        self.fetches = 0

    def fetch(self, request: log_pb2.FetchRequest, timeout_s: float) -> log_pb2.FetchResponse:
        self.fetches += 1
        resp = serve_fetch(request, lambda topic, index: self.leader)
        time.sleep(0.005)  # a (very short) long poll
        return resp

    def offset_for_leader_epoch(
        self, request: log_pb2.OffsetForLeaderEpochRequest, timeout_s: float
    ) -> log_pb2.OffsetForLeaderEpochResponse:
        return serve_offset_for_leader_epoch(request, lambda topic, index: self.leader.log)

    def close(self) -> None:
        pass


def setup(tmp_path: Path, leader_epoch: int = 0) -> tuple[Partition, Partition, InProcessLeader, ReplicaFetcher]:
    leader = partition(Log.open(tmp_path / "leader" / "t-0", LogConfig()), LEADER)
    leader.make_leader(LeaderAndIsr(LEADER, leader_epoch, [LEADER, FOLLOWER], 1, 0), [LEADER, FOLLOWER])
    follower = partition(Log.open(tmp_path / "follower" / "t-0", LogConfig()), FOLLOWER)
    follower.make_follower(LeaderAndIsr(LEADER, leader_epoch, [LEADER, FOLLOWER], 1, 0), [LEADER, FOLLOWER])
    endpoint = InProcessLeader(leader)
    fetcher = ReplicaFetcher(FOLLOWER, LEADER, endpoint, max_wait_ms=5, max_bytes=1 << 20, purgatory=Purgatory())
    return leader, follower, endpoint, fetcher


def values(log: Log) -> list[bytes]:
    data = log.read(0, 1 << 24).records
    return [r.value or b"" for _, recs in decode_batches(data) for r in recs]


def test_a_follower_catches_up_and_moves_the_high_watermark(tmp_path: Path) -> None:
    leader, follower, _, fetcher = setup(tmp_path)
    leader.append_as_leader(batch(0, [b"a", b"b", b"c"]), 1, 1)
    assert leader.high_watermark == 0  # the follower has nothing yet
    fetcher.add(follower, 0)
    fetcher.start()
    try:
        wait_until(lambda: follower.log.log_end_offset == 3, 10, "follower caught up")
        wait_until(lambda: leader.high_watermark == 3 and follower.high_watermark == 3, 10, "high watermarks")
        leader.append_as_leader(batch(0, [b"d"]), 1, 1)
        wait_until(lambda: follower.log.log_end_offset == 4, 10, "the next record")
        assert values(follower.log) == [b"a", b"b", b"c", b"d"]
    finally:
        fetcher.shutdown()


def test_a_divergent_tail_is_truncated_before_fetching(tmp_path: Path) -> None:
    leader, follower, _, fetcher = setup(tmp_path, leader_epoch=1)
    # The follower holds epoch-0 records the leader never had past offset 2 (an old leader's tail).
    for i, v in enumerate([b"a", b"b", b"x", b"y"]):
        follower.log.append_as_follower(_at(i, 0, v))
    for i, v in enumerate([b"a", b"b"]):
        leader.log.append_as_follower(_at(i, 0, v))
    leader.make_leader(LeaderAndIsr(LEADER, 1, [LEADER, FOLLOWER], 1, 1), [LEADER, FOLLOWER])
    leader.append_as_leader(batch(1, [b"c"]), 1, 1)
    follower.make_follower(LeaderAndIsr(LEADER, 1, [LEADER, FOLLOWER], 1, 1), [LEADER, FOLLOWER])
    fetcher.add(follower, 1)
    fetcher.start()
    try:
        wait_until(lambda: values(follower.log) == [b"a", b"b", b"c"], 10, "truncated and caught up")
    finally:
        fetcher.shutdown()


def test_a_leader_that_stops_leading_is_survived(tmp_path: Path) -> None:
    leader, follower, endpoint, fetcher = setup(tmp_path)
    leader.append_as_leader(batch(0, [b"a"]), 1, 1)
    fetcher.add(follower, 0)
    fetcher.start()
    try:
        wait_until(lambda: follower.log.log_end_offset == 1, 10, "follower caught up")
        leader.resign()  # NOT_LEADER_OR_FOLLOWER from now on
        seen = endpoint.fetches
        wait_until(lambda: endpoint.fetches > seen + 1, 10, "the fetcher keeps going, backing off")
        assert fetcher.is_alive()
        assert follower.log.log_end_offset == 1
    finally:
        fetcher.shutdown()


def _at(offset: int, epoch: int, value: bytes) -> bytes:
    b = BatchBuilder(base_offset=offset, partition_leader_epoch=epoch)
    b.append(1000, None, value)
    return b.build()
