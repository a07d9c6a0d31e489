"""kbroker.metrics: the scrape-time collector on fake broker state, and the hot-path helpers."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import generate_latest

from kbroker.metrics import BrokerMetrics, BrokerState, BrokerStateCollector, count_records, error_name
from kclient.errors import NotLeaderForPartitionError


@dataclass
class FakeLog:
    size_in_bytes: int


@dataclass
class FakePartition:
    topic: str
    index: int
    leader: int
    isr: list[int]
    replicas: list[int]
    broker_id: int = 1
    high_watermark: int = 0
    isr_shrinks: int = 0
    isr_expands: int = 0
    log: Any = field(default_factory=lambda: FakeLog(100))
    last_stable_offset: int = 0


def _scrape(metrics: BrokerMetrics) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _broker(parts: list[FakePartition], **kw: Any) -> tuple[BrokerMetrics, dict[str, Any]]:
    state: dict[str, Any] = {
        "active": False,
        "offline": 3,
        "zk": "CONNECTED",
        "parked": {"Produce": 2, "Fetch": 5},
        "committed": {},
        **kw,
    }
    m = BrokerMetrics()
    m.registry.register(
        BrokerStateCollector(
            BrokerState(
                partitions=lambda: parts,
                min_insync_replicas=lambda topic: 2,
                controller_active=lambda: state["active"],
                offline_partitions=lambda: state["offline"],
                zk_state=lambda: state["zk"],
                purgatory_sizes=lambda: state["parked"],
                committed_offsets=lambda: state["committed"],
                unfinished_transactions=lambda: state.get("unfinished", 0),
            )
        )
    )
    return m, state


def test_transactions_show_as_last_stable_offset_lag_and_the_marker_retry_queue() -> None:
    parts = [
        FakePartition("t", 0, leader=1, isr=[1], replicas=[1], high_watermark=10, last_stable_offset=4),
        FakePartition("t", 1, leader=1, isr=[1], replicas=[1], high_watermark=10, last_stable_offset=10),
        FakePartition("t", 2, leader=2, isr=[2], replicas=[2, 1], high_watermark=10, last_stable_offset=1),
    ]
    m, _ = _broker(parts, unfinished=2)
    s = _scrape(m)
    assert s['kafka_cluster_partition_laststableoffsetlag{partition="0",topic="t"}'] == 6
    assert s['kafka_cluster_partition_laststableoffsetlag{partition="1",topic="t"}'] == 0
    assert 'kafka_cluster_partition_laststableoffsetlag{partition="2",topic="t"}' not in s  # led elsewhere
    assert s["kafka_coordinator_transaction_transactionmarkerchannelmanager_logappendretryqueuesize"] == 2


def test_replica_gauges_count_led_partitions_only() -> None:
    parts = [
        FakePartition("t", 0, leader=1, isr=[1, 2, 3], replicas=[1, 2, 3]),
        FakePartition("t", 1, leader=1, isr=[1, 2], replicas=[1, 2, 3]),  # under-replicated
        FakePartition("t", 2, leader=1, isr=[1], replicas=[1, 2, 3], log=FakeLog(7)),  # and under min ISR
        FakePartition("t", 3, leader=2, isr=[2], replicas=[2, 1, 3]),  # led elsewhere: not counted
    ]
    m, _ = _broker(parts)
    s = _scrape(m)
    assert s["kafka_server_replicamanager_leadercount"] == 3
    assert s["kafka_server_replicamanager_partitioncount"] == 4
    assert s["kafka_server_replicamanager_underreplicatedpartitions"] == 2
    assert s["kafka_server_replicamanager_underminisrpartitioncount"] == 1
    assert s['kafka_log_log_size{partition="2",topic="t"}'] == 7
    assert s["kafka_controller_kafkacontroller_activecontrollercount"] == 0
    assert s["kafka_controller_kafkacontroller_offlinepartitionscount"] == 0  # only the controller reports
    assert s['kafka_server_delayedoperationpurgatory_purgatorysize{delayedOperation="Fetch"}'] == 5
    assert s['kafka_server_delayedoperationpurgatory_purgatorysize{delayedOperation="Rebalance"}'] == 0
    assert s['kafka_server_sessionexpirelistener_sessionstate{state="CONNECTED"}'] == 1
    assert s['kafka_server_sessionexpirelistener_sessionstate{state="LOST"}'] == 0


def test_controller_reports_offline_partitions_and_session_state_follows() -> None:
    m, state = _broker([])
    state["active"] = True
    state["zk"] = "SUSPENDED"
    s = _scrape(m)
    assert s["kafka_controller_kafkacontroller_activecontrollercount"] == 1
    assert s["kafka_controller_kafkacontroller_offlinepartitionscount"] == 3
    assert s['kafka_server_sessionexpirelistener_sessionstate{state="SUSPENDED"}'] == 1
    assert s['kafka_server_sessionexpirelistener_sessionstate{state="CONNECTED"}'] == 0


def test_isr_change_totals_stay_monotonic_when_partitions_go() -> None:
    p = FakePartition("t", 0, leader=1, isr=[1], replicas=[1, 2], isr_shrinks=2, isr_expands=1)
    parts = [p]
    m, _ = _broker(parts)
    assert _scrape(m)["kafka_server_replicamanager_isrshrinks_total"] == 2
    p.isr_shrinks = 3
    p.isr_expands = 4
    s = _scrape(m)
    assert s["kafka_server_replicamanager_isrshrinks_total"] == 3
    assert s["kafka_server_replicamanager_isrexpands_total"] == 4
    parts.clear()  # the partition is deleted: its counts are kept
    parts.append(FakePartition("u", 0, leader=1, isr=[1], replicas=[1], isr_shrinks=1))
    assert _scrape(m)["kafka_server_replicamanager_isrshrinks_total"] == 4


def test_group_lag_is_high_watermark_minus_committed_on_led_partitions() -> None:
    parts = [
        FakePartition("t", 0, leader=1, isr=[1], replicas=[1], high_watermark=10),
        FakePartition("t", 1, leader=2, isr=[2], replicas=[2], high_watermark=10),
    ]
    m, state = _broker(parts)
    state["committed"] = {"g": {("t", 0): 4, ("t", 1): 1}}
    s = _scrape(m)
    assert s['kafka_consumergroup_lag{consumergroup="g",partition="0",topic="t"}'] == 6
    assert not any(k.startswith("kafka_consumergroup_lag{") and 'partition="1"' in k for k in s)


def test_hot_path_counters_and_names() -> None:
    m = BrokerMetrics()
    m.topic("t").messages_in.inc(3)
    m.topic("t").bytes_in.inc(120)
    r = m.request("Produce")
    r.done(3.0)
    r.error(error_name(NotLeaderForPartitionError("x")))
    s = _scrape(m)
    assert s['kafka_server_brokertopicmetrics_messagesin_total{topic="t"}'] == 3
    assert s['kafka_server_brokertopicmetrics_bytesin_total{topic="t"}'] == 120
    assert s['kafka_network_requestmetrics_requests_total{request="Produce"}'] == 1
    assert s['kafka_network_requestmetrics_errors_total{error="NOT_LEADER_FOR_PARTITION",request="Produce"}'] == 1
    assert s['kafka_network_requestmetrics_totaltimems_bucket{le="5.0",request="Produce"}'] == 1
    m.forget_topic("t")
    assert not any('topic="t"' in k for k in _scrape(m))


def _batch(records: int, body: int = 10) -> bytes:
    length = 49 + body
    header = struct.pack(">qi", 0, length) + bytes(45) + struct.pack(">i", records)
    return header + bytes(body)


def test_count_records_sums_batch_headers_and_ignores_a_torn_tail() -> None:
    assert count_records(_batch(3) + _batch(5)) == 8
    assert count_records(_batch(3) + _batch(5)[:30]) == 3
    assert count_records(b"") == 0
