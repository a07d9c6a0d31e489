"""kafka_consumergroup_lag covers every committed partition of every group the broker
coordinates: offsets committed before the coordinator started (read from the group
store), and partitions led by other brokers (their high watermark asked of the leader)."""

from __future__ import annotations

from collections.abc import Collection

from prometheus_client import generate_latest

from kbroker.cluster.zkdata import CommittedOffset
from kbroker.group.coordinator import GroupCoordinator
from kbroker.metrics import BrokerMetrics, BrokerState, BrokerStateCollector
from tests.support import FakeMetadataCache
from tests.unit.test_broker_metrics import FakePartition
from tests.unit.test_delete_offsets import FakeStore

TP = tuple[str, int]


class ListingStore(FakeStore):
    def groups(self) -> list[str]:
        return sorted(set(self.offsets) | set(self.generations))


def _lag(m: BrokerMetrics) -> dict[str, float]:
    out = {}
    for line in generate_latest(m.registry).decode().splitlines():
        if line.startswith("kafka_consumergroup_lag{"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_coordinator_reports_offsets_committed_before_it_started() -> None:
    store = ListingStore()
    store.commit("old-group", {("t", 0): CommittedOffset(3), ("t", 1): CommittedOffset(9)})
    c = GroupCoordinator(1, store, FakeMetadataCache())  # type: ignore[arg-type]
    assert c.committed_offsets() == {"old-group": {("t", 0): 3, ("t", 1): 9}}
    c.commit("old-group", "", -1, {("t", 0): CommittedOffset(5)})
    assert c.committed_offsets() == {"old-group": {("t", 0): 5, ("t", 1): 9}}


def test_lag_of_partitions_led_elsewhere_uses_the_leaders_high_watermark() -> None:
    parts = [FakePartition("t", 0, leader=1, isr=[1], replicas=[1], high_watermark=10)]
    asked: list[set[TP]] = []

    def end_offsets(tps: Collection[TP]) -> dict[TP, int]:
        asked.append(set(tps))
        return {("t", 1): 84_001} if ("t", 1) in tps else {}

    m = BrokerMetrics()
    m.registry.register(
        BrokerStateCollector(
            BrokerState(
                partitions=lambda: parts,
                min_insync_replicas=lambda topic: 1,
                controller_active=lambda: False,
                offline_partitions=lambda: 0,
                zk_state=lambda: "CONNECTED",
                purgatory_sizes=lambda: {},
                committed_offsets=lambda: {"g": {("t", 0): 4, ("t", 1): 1, ("t", 2): 0}},
                end_offsets=end_offsets,
            )
        )
    )
    lag = _lag(m)
    assert asked == [{("t", 1), ("t", 2)}]  # only what this broker does not lead
    assert lag == {
        'kafka_consumergroup_lag{consumergroup="g",partition="0",topic="t"}': 6.0,
        'kafka_consumergroup_lag{consumergroup="g",partition="1",topic="t"}': 84_000.0,
    }  # partition 2's leader did not answer: no series


def test_the_coordinators_own_end_offsets_are_used_when_none_is_wired() -> None:
    store = ListingStore()
    store.commit("g", {("t", 3): CommittedOffset(2)})
    c = GroupCoordinator(1, store, FakeMetadataCache())  # type: ignore[arg-type]
    c._end_offsets = lambda tps: {tp: 12 for tp in tps}  # type: ignore[assignment,method-assign]
    m = BrokerMetrics()
    m.registry.register(
        BrokerStateCollector(
            BrokerState(
                partitions=lambda: [],
                min_insync_replicas=lambda topic: 1,
                controller_active=lambda: False,
                offline_partitions=lambda: 0,
                zk_state=lambda: "CONNECTED",
                purgatory_sizes=lambda: {},
                committed_offsets=c.committed_offsets,
            )
        )
    )
    assert _lag(m) == {'kafka_consumergroup_lag{consumergroup="g",partition="3",topic="t"}': 10.0}
