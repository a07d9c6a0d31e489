"""Prometheus metrics of real brokers (metrics.port=0): scraped over HTTP while producing,
consuming, committing and losing a follower."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable

import grpc
import pytest

from kbroker.group.coordinator import coordinator_for
from kbroker.local.cluster import BrokerProcess, LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2

pytestmark = pytest.mark.integration


def metrics_url(b: BrokerProcess) -> str:
    found = re.search(rb"metrics: (http://\S+/metrics)", b.log_path.read_bytes())
    assert found, f"broker {b.broker_id} logged no metrics URL:\n{b.log_tail()}"
    return found.group(1).decode()


def scrape(b: BrokerProcess) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url(b), timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_for(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.3)


def test_counters_and_gauges_move_with_the_cluster(cluster_factory: Callable[..., LocalCluster]) -> None:
    c = cluster_factory(3, **{"metrics.port": "0"})
    group = "metrics-g"
    leader = coordinator_for(group, [0, 1, 2])  # so the lag shows on the leader's endpoint
    followers = [b for b in (0, 1, 2) if b != leader]
    with AdminClient(c.bootstrap) as admin:
        admin.create_topics([NewTopic("m", replica_assignments={0: [leader, *followers]})])
    with Producer(bootstrap_servers=c.bootstrap, acks="all") as p:
        for i in range(10):
            p.send("m", value=b"v%d" % i)
        p.flush()
        sent = p.metrics()["producer-metrics"]
        assert sent["record-send-total"] == 10
        assert sent["request-total"] >= 1
        assert sent["request-latency-avg"] > 0
        assert sent["batch-size-avg"] > 0
        assert sent["record-error-total"] == 0
    with Consumer(bootstrap_servers=c.bootstrap, group_id=group, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("m", 0)])
        got: list[object] = []
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(records)
        assert len(got) == 10
        fetched = consumer.metrics()["consumer-fetch-manager-metrics"]
        assert fetched["records-consumed-total"] == 10
        assert fetched["bytes-consumed-total"] > 0
        assert fetched["fetch-latency-avg"] > 0
        assert fetched["records-lag-max"] == 0
        consumer.commit()
    with Producer(bootstrap_servers=c.bootstrap, acks="all") as p:
        for _ in range(4):
            p.send("m", value=b"later")
        p.flush()

    lead = c.brokers[leader]
    with grpc.insecure_channel(lead.address) as channel:  # a refused call counts as an error
        with pytest.raises(grpc.RpcError):
            broker_pb2_grpc.BrokerStub(channel).Fetch(log_pb2.FetchRequest(max_bytes=-1), timeout=10)
    # grpc's abort() sends the status before the handler's frame (which counts it) resumes,
    # so the counter may lag the client's error by a moment, as Kafka's request metrics do.
    refused = 'kafka_network_requestmetrics_errors_total{error="INVALID_ARGUMENT",request="Fetch"}'
    wait_for(lambda: refused in scrape(lead), timeout_s=10)
    s = scrape(lead)
    assert s[refused] == 1
    assert s['kafka_server_brokertopicmetrics_messagesin_total{topic="m"}'] == 14
    assert s['kafka_server_brokertopicmetrics_bytesin_total{topic="m"}'] > 14
    assert s['kafka_server_brokertopicmetrics_bytesout_total{topic="m"}'] > 0
    assert s['kafka_server_brokertopicmetrics_replicationbytesout_total{topic="m"}'] > 0
    assert s['kafka_network_requestmetrics_requests_total{request="Produce"}'] >= 2
    assert s['kafka_network_requestmetrics_totaltimems_count{request="Produce"}'] >= 2
    assert s["kafka_server_replicamanager_leadercount"] >= 1
    wait_for(lambda: scrape(lead)["kafka_server_replicamanager_underreplicatedpartitions"] == 0, timeout_s=30)
    assert s['kafka_log_log_size{partition="0",topic="m"}'] > 0
    assert s['kafka_server_sessionexpirelistener_sessionstate{state="CONNECTED"}'] == 1
    zk_requests = s["kafka_server_zookeeperclientmetrics_zookeeperrequestlatencyms_count"]
    assert zk_requests > 0 and s["kafka_server_zookeeperclientmetrics_zookeeperrequestlatencyms_sum"] > 0
    assert s['kafka_server_zookeeperclientmetrics_zookeeperrequestlatencyms_bucket{le="+Inf"}'] == zk_requests
    assert s[f'kafka_consumergroup_lag{{consumergroup="{group}",partition="0",topic="m"}}'] == 4
    scrapes = [scrape(b) for b in c.brokers.values()]
    assert sum(x["kafka_controller_kafkacontroller_activecontrollercount"] for x in scrapes) == 1
    assert sum(x["kafka_controller_kafkacontroller_offlinepartitionscount"] for x in scrapes) == 0

    follower = c.brokers[followers[0]]
    follower.kill()  # the controller (session expiry) or the leader (lag) drops it from the ISR
    with Producer(bootstrap_servers=c.bootstrap, acks=1) as p:
        p.send("m", value=b"while a follower is down")
        p.flush()

    def shrunk() -> bool:
        x = scrape(lead)
        return x["kafka_server_replicamanager_underreplicatedpartitions"] == 1

    wait_for(shrunk)
    follower.start()

    def expanded() -> bool:
        x = scrape(lead)
        return (
            x["kafka_server_replicamanager_underreplicatedpartitions"] == 0
            and x["kafka_server_replicamanager_isrexpands_total"] >= 1
        )

    wait_for(expanded, timeout_s=60)


def test_metrics_are_off_by_default(cluster_factory: Callable[..., LocalCluster]) -> None:
    c = cluster_factory(1)
    assert b"metrics: http" not in c.brokers[0].log_path.read_bytes()
