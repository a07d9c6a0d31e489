"""The follower fetcher when its leader serves a corrupt batch for one partition (the
LeaderEndPoint seam over real leader Partitions and Logs in this process): the other
partitions of the same fetch keep replicating, the bad partition is held back and
fetched again after a backoff (no hot loop), and it catches up once the leader's copy is
good again. Also: offsets that cannot follow the log end are a CorruptRecordError."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from kbroker.cluster.zkdata import LeaderAndIsr
from kbroker.purgatory import Purgatory
from kbroker.replication import fetcher as fetcher_module
from kbroker.replication.fetcher import ReplicaFetcher
from kbroker.replication.partition import Partition
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient.errors import CorruptRecordError
from kclient.proto.kbroker.v1 import log_pb2
from kclient.records import BatchBuilder, iter_headers
from tests.support import serve_fetch, wait_until
from tests.unit.test_replica_fetcher import values

LEADER, FOLLOWER = 1, 2


def batch(epoch: int, value: bytes) -> bytes:
    b = BatchBuilder(partition_leader_epoch=epoch)
    b.append(1000, None, value)
    return b.build()


class Leader:
    """A LeaderEndPoint answering from leader Partitions of several partitions."""

    address = "in-process"

    def __init__(self, partitions: dict[tuple[str, int], Partition]) -> None:
        self.partitions = partitions
        self.fetched: dict[tuple[str, int], int] = {tp: 0 for tp in partitions}
        self.epoch_requests = 0

    def fetch(self, request: log_pb2.FetchRequest, timeout_s: float) -> log_pb2.FetchResponse:
        for t in request.topics:
            for p in t.partitions:
                self.fetched[(t.name, p.index)] += 1
        resp = serve_fetch(request, lambda topic, index: self.partitions[(topic, index)])
        time.sleep(0.005)
        return resp

    def offset_for_leader_epoch(
        self, request: log_pb2.OffsetForLeaderEpochRequest, timeout_s: float
    ) -> log_pb2.OffsetForLeaderEpochResponse:
        self.epoch_requests += 1
        resp = log_pb2.OffsetForLeaderEpochResponse()
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                log = self.partitions[(t.name, p.index)].log
                epoch, end = log.leader_epoch_cache.end_offset_for(p.leader_epoch, log.log_end_offset)
                tr.partitions.add(index=p.index, leader_epoch=epoch, end_offset=end)
        return resp

    def close(self) -> None:
        pass


def pair(tmp_path: Path, index: int) -> tuple[Partition, Partition]:
    state = LeaderAndIsr(LEADER, 0, [LEADER, FOLLOWER], 1, 0)
    out = []
    for broker, role in ((LEADER, "leader"), (FOLLOWER, "follower")):
        log = Log.open(tmp_path / role / f"t-{index}", LogConfig())
        p = Partition("t", index, broker, log, isr_writer=lambda _p, s: s.zk_version + 1)
        if broker == LEADER:
            p.make_leader(state, [LEADER, FOLLOWER])
        else:
            p.make_follower(state, [LEADER, FOLLOWER])
        out.append(p)
    return out[0], out[1]


def flip_on_disk(log: Log, batch_index: int, field: str) -> bytes:
    """Corrupt the leader's segment file in place; returns the original bytes."""
    segment = log.segments[0]
    original = segment.log_path.read_bytes()
    pos, header = list(iter_headers(original))[batch_index]
    at = pos + header.size - 2 if field == "value" else pos + 2  # a value byte / a high byte of baseOffset
    with open(segment.log_path, "r+b") as f:
        f.seek(at)
        f.write(bytes([original[at] ^ 0x40]))
    return original


def restore(log: Log, original: bytes) -> None:
    log.segments[0].log_path.write_bytes(original)


@pytest.mark.parametrize("field", ["value", "base_offset"])
def test_a_corrupt_partition_does_not_stop_the_others(
    tmp_path: Path, field: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fetcher_module, "FETCH_BACKOFF_S", 0.5)
    caplog.set_level(logging.WARNING, "kbroker.replication.fetcher")
    (bad_leader, bad), (good_leader, good) = pair(tmp_path, 0), pair(tmp_path, 1)
    for i in range(3):
        bad_leader.append_as_leader(batch(0, b"bad-%d" % i), 1, 1)
        good_leader.append_as_leader(batch(0, b"good-%d" % i), 1, 1)
    # A value byte of the second batch (its CRC fails), or the last batch's base offset
    # (outside the CRC: the offsets jump by 2^46).
    original = flip_on_disk(bad_leader.log, 1 if field == "value" else 2, field)
    leader = Leader({("t", 0): bad_leader, ("t", 1): good_leader})
    fetcher = ReplicaFetcher(FOLLOWER, LEADER, leader, max_wait_ms=50, max_bytes=1 << 20, purgatory=Purgatory())
    fetcher.add(bad, 0)  # first in every request and response
    fetcher.add(good, 0)
    fetcher.start()
    try:
        # Before: 0 of 3 when the bad append raised a ValueError (base offset).
        wait_until(lambda: good.log.log_end_offset == 3, 10, "the healthy partition caught up")
        good_leader.append_as_leader(batch(0, b"good-3"), 1, 1)
        wait_until(lambda: good.log.log_end_offset == 4, 10, "the healthy partition keeps replicating")
        assert values(good.log) == [b"good-0", b"good-1", b"good-2", b"good-3"]
        assert bad.log.log_end_offset == 0  # the response's batches are refused together, as Kafka's
        fetches_before = leader.fetched[("t", 0)]
        epoch_requests_before = leader.epoch_requests
        time.sleep(1.2)
        # Held back between attempts: no hot loop of fetches nor truncations (before: hundreds).
        assert leader.fetched[("t", 0)] - fetches_before <= 4
        assert leader.epoch_requests == epoch_requests_before
        assert fetcher.is_alive()
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert warnings and all("t-0" in w and "offset 0" in w for w in warnings), warnings
        assert len(warnings) <= 2  # rate-limited
        # The leader's copy is repaired (e.g. by an operator): the partition catches up.
        restore(bad_leader.log, original)
        wait_until(lambda: bad.log.log_end_offset == 3, 10, "the repaired partition caught up")
        assert values(bad.log) == [b"bad-0", b"bad-1", b"bad-2"]
    finally:
        fetcher.shutdown()


def test_follower_offsets_that_cannot_follow_the_log_end_are_corrupt(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig())
    data = bytearray(batch(0, b"a") + batch(0, b"b"))
    data[len(batch(0, b"a")) + 2] ^= 0x40  # the second batch's base offset jumps by 2^46
    data[len(batch(0, b"a")) + 7] = 1
    with pytest.raises(CorruptRecordError, match="cannot follow log end offset 0"):  # before: ValueError
        log.append_as_follower(bytes(data))
    assert log.log_end_offset == 0
    log.close()
