"""Client metrics(): kafka-python's shape, counted per batch/request."""

from __future__ import annotations

from kclient.consumer.fetcher import FetchMetrics
from kclient.producer.metrics import WINDOW_S, ProducerMetrics, Sensor


def test_sensor_rate_spans_the_current_and_previous_window() -> None:
    s = Sensor(now=0.0)
    s.record(30.0, now=10.0)
    assert s.rate(now=10.0) == 3.0  # 30 over the 10 s since it started
    s.record(60.0, now=WINDOW_S + 5)  # a new sample; the first one is still counted
    assert s.rate(now=WINDOW_S + 10) == 90.0 / (WINDOW_S + 10)
    assert s.rate(now=4 * WINDOW_S) == 0.0  # idle for two windows: nothing recent
    assert (s.count, s.total, s.max, s.avg()) == (2, 90.0, 60.0, 45.0)


def test_sensor_rate_of_a_fresh_sensor_is_zero_not_a_division_error() -> None:
    s = Sensor(now=0.0)
    assert s.rate(now=0.0) == 0.0
    assert s.avg() == 0.0


def test_producer_metrics_shape_and_counts() -> None:
    m = ProducerMetrics()
    m.request_sent([(10, 1000, False), (5, 500, True)])
    m.response(4.0)
    m.response(8.0)
    m.failed(5)
    got = m.snapshot(in_flight=1)
    assert list(got) == ["producer-metrics"]
    p = got["producer-metrics"]
    assert p["record-send-total"] == 15
    assert p["record-retry-total"] == 5
    assert p["record-error-total"] == 5
    assert p["batch-size-avg"] == 750
    assert p["batch-size-max"] == 1000
    assert p["records-per-request-avg"] == 15
    assert p["request-total"] == 1
    assert p["request-latency-avg"] == 6.0
    assert p["request-latency-max"] == 8.0
    assert p["requests-in-flight"] == 1
    assert p["record-send-rate"] > 0


def test_fetch_metrics_shape() -> None:
    m = FetchMetrics()
    m.records_consumed.record(100)
    m.bytes_consumed.record(4096)
    m.fetch_latency_ms.record(2.0)
    c = m.snapshot(records_lag_max=7)["consumer-fetch-manager-metrics"]
    assert c["records-consumed-total"] == 100
    assert c["bytes-consumed-total"] == 4096
    assert c["fetch-latency-avg"] == 2.0
    assert c["records-lag-max"] == 7
    assert c["records-consumed-rate"] > 0
