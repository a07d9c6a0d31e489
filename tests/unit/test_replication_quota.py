"""Replication throttling (Kafka's ReplicationQuotaManager): the sampled rate, the
throttled-replica lists, and both paths — a leader serving nothing to an out-of-sync
throttled follower once the quota is used up, a follower skipping such partitions —
while in-sync replicas and unlisted partitions are never delayed."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import LeaderAndIsr
from kbroker.purgatory import Purgatory
from kbroker.replication.fetch_session import FetchSpec
from kbroker.replication.fetcher import ReplicaFetcher
from kbroker.replication.quota import (
    ALL_PARTITIONS,
    SAMPLE_WINDOW_S,
    SAMPLES,
    ReplicationQuota,
    SampledRate,
    parse_throttled_replicas,
)
from kbroker.replication.replica_manager import ReplicaManager
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kbroker.storage.log_manager import LogManager
from kclient.errors import InvalidConfigurationError
from tests.support import FakeClock
from tests.unit.test_replica_fetcher import FOLLOWER, LEADER, InProcessLeader, batch, partition


def test_the_rate_is_the_windowed_total_over_at_least_ten_windows() -> None:
    clock = FakeClock()
    rate = SampledRate(clock)
    rate.record(1000)
    assert rate.measure() == pytest.approx(1000 / ((SAMPLES - 1) * SAMPLE_WINDOW_S))
    for _ in range(20):  # steady 500 B/s for 20 s
        clock.now += 1.0
        rate.record(500)
    # 11 windows retained; the oldest began 10 s ago (padded minimum): 11 * 500 / 10
    assert rate.measure() == pytest.approx(11 * 500 / 10, rel=0.01)
    clock.now += SAMPLES * SAMPLE_WINDOW_S + 1
    assert rate.measure() == 0.0


def test_the_quota_is_exceeded_only_above_a_finite_bound() -> None:
    clock = FakeClock()
    quota = ReplicationQuota("leader", clock)
    quota.record(10**12)
    assert not quota.is_exceeded()  # unbounded by default
    quota.set_bound(1000)
    assert quota.is_exceeded()
    wait = quota.time_until_within_s()
    assert 0 < wait <= SAMPLES * SAMPLE_WINDOW_S
    clock.now += SAMPLES * SAMPLE_WINDOW_S + 1
    assert not quota.is_exceeded()


def test_throttled_replica_lists_name_partitions_on_this_broker() -> None:
    assert parse_throttled_replicas("0:1,0:2,1:2,2:3", 2) == {0, 1}
    assert parse_throttled_replicas("0:1", 2) == frozenset()
    assert parse_throttled_replicas("*", 7) == ALL_PARTITIONS
    assert parse_throttled_replicas("", 1) == frozenset()
    quota = ReplicationQuota("follower")
    quota.mark_throttled("t", {0, 1})
    quota.mark_throttled("all", ALL_PARTITIONS)
    assert quota.is_throttled("t", 1) and not quota.is_throttled("t", 2)
    assert quota.is_throttled("all", 99) and not quota.is_throttled("other", 0)
    quota.mark_throttled("t", frozenset())
    assert not quota.is_throttled("t", 0)


@pytest.mark.parametrize("value", ["0-1", "0:1,", "*,0:1", "a:b", "0:1:2"])
def test_a_bad_throttled_replica_list_is_refused(value: str) -> None:
    with pytest.raises(InvalidConfigurationError, match=r"leader\.replication\.throttled\.replicas"):
        LogConfig.from_properties({"leader.replication.throttled.replicas": value})


def test_a_throttled_replica_list_is_normalised() -> None:
    cfg = LogConfig.from_properties({"follower.replication.throttled.replicas": " 0:1 , 1:2 "})
    assert cfg.follower_replication_throttled_replicas == "0:1,1:2"


# --- leader side -----------------------------------------------------------------


def leader_manager(tmp_path: Path, overrides: dict[str, str]) -> ReplicaManager:
    logs = LogManager(tmp_path / "data", LogConfig())
    logs.startup()
    rm = ReplicaManager(LEADER, logs, LogConfig(), cast(ZkClient, None), lambda b: None)
    rm.on_partition_change("t", 0, [LEADER, FOLLOWER, 3], LeaderAndIsr(LEADER, 0, [LEADER, 3], 1, 0), overrides)
    p = rm.partition("t", 0)
    for _ in range(4):
        p.append_as_leader(batch(0, [b"x" * 1000]), 1, 1)
    return rm


def fetch(rm: ReplicaManager, replica: int) -> int:
    (result,) = rm.read(replica, 1 << 20, [FetchSpec("t", 0, 0, 1 << 20, -1)])
    assert result.error is None and result.read is not None
    return len(result.read.records)


def test_a_leader_serves_nothing_to_an_out_of_sync_throttled_follower_once_the_quota_is_used(
    tmp_path: Path,
) -> None:
    rm = leader_manager(tmp_path, {"leader.replication.throttled.replicas": f"0:{LEADER}"})
    rm.set_replication_throttles(100, 2**63 - 1)
    try:
        first = fetch(rm, FOLLOWER)
        assert first > 0  # a fresh quota lets the first fetch through
        assert rm.leader_quota.is_exceeded()
        assert fetch(rm, FOLLOWER) == 0  # out of the ISR: held back
        assert not rm.fetch_ready(FOLLOWER, 1, 1 << 20, [FetchSpec("t", 0, 0, 1 << 20, -1)])
        assert fetch(rm, 3) == first  # in the ISR: never delayed
    finally:
        rm.shutdown()


def test_a_leader_without_a_throttled_list_never_holds_back(tmp_path: Path) -> None:
    rm = leader_manager(tmp_path, {})
    rm.set_replication_throttles(1, 1)
    try:
        sizes = {fetch(rm, FOLLOWER) for _ in range(5)}
        assert len(sizes) == 1 and sizes.pop() > 0
        assert rm.leader_quota.rate() == 0.0  # unlisted traffic is not even counted
    finally:
        rm.shutdown()


def test_removing_the_list_lifts_the_throttle(tmp_path: Path) -> None:
    rm = leader_manager(tmp_path, {"leader.replication.throttled.replicas": "*"})
    rm.set_replication_throttles(100, 2**63 - 1)
    try:
        fetch(rm, FOLLOWER)
        assert fetch(rm, FOLLOWER) == 0
        state = LeaderAndIsr(LEADER, 0, [LEADER, 3], 1, 0)
        rm.on_partition_change("t", 0, [LEADER, FOLLOWER, 3], state, {})
        assert fetch(rm, FOLLOWER) > 0
    finally:
        rm.shutdown()


# --- follower side ---------------------------------------------------------------


def test_a_follower_skips_throttled_partitions_until_it_is_in_sync(tmp_path: Path) -> None:
    leader = partition(Log.open(tmp_path / "leader" / "t-0", LogConfig()), LEADER)
    leader.make_leader(LeaderAndIsr(LEADER, 0, [LEADER], 1, 0), [LEADER, FOLLOWER])
    follower = partition(Log.open(tmp_path / "follower" / "t-0", LogConfig()), FOLLOWER)
    follower.make_follower(LeaderAndIsr(LEADER, 0, [LEADER], 1, 0), [LEADER, FOLLOWER])
    for _ in range(3):
        leader.append_as_leader(batch(0, [b"y" * 1000]), 1, 1)
    endpoint = InProcessLeader(leader)
    quota = ReplicationQuota("follower")
    quota.mark_throttled("t", {0})
    quota.set_bound(10)
    fetcher = ReplicaFetcher(
        FOLLOWER, LEADER, endpoint, max_wait_ms=5, max_bytes=1000, purgatory=Purgatory(), quota=quota
    )
    fetcher.add(follower, 0)
    (state,) = list(fetcher._partitions.values())
    state.truncating = False
    assert fetcher._fetch([state]) == 0.0  # the first fetch goes (fresh quota)...
    copied = follower.log.log_end_offset
    assert copied == 1 and quota.is_exceeded()
    backoff = fetcher._fetch([state])  # ...then the follower waits instead of fetching
    assert backoff > 0 and endpoint.fetches == 1 and follower.log.log_end_offset == copied
    quota.set_bound(2**63 - 1)
    while follower.log.log_end_offset < leader.log.log_end_offset:
        fetcher._fetch([state])
    fetcher._fetch([state])  # learns the high watermark it has reached
    assert state.in_sync
    quota.set_bound(10)
    leader.append_as_leader(batch(0, [b"z" * 1000]), 1, 1)
    fetcher._fetch([state])  # in sync: replicated although the quota is used up
    assert follower.log.log_end_offset == leader.log.log_end_offset
