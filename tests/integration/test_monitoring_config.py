"""The monitoring configuration of a kbroker cluster (issue 25): Prometheus's scrape config
and alert rules (``deploy/prometheus/``) and the Grafana dashboard
(``deploy/grafana/kbroker-dashboard.json``).

- ``promtool check config`` / ``check rules`` accept them, and ``promtool test rules``
  passes the alerts' unit tests (``alerts.test.yml``: series that fire each alert and
  series that must not). promtool is the host's where there is one, else the one in
  ``kbroker-prometheus:latest`` (``scripts/images`` builds it) with ``deploy/prometheus``
  mounted read-only; these tests are marked ``docker`` and skipped, saying why, where
  neither answers.
- In pure Python (no Docker, no broker): every panel of the dashboard has a datasource
  and a query, and every query, variable and alert reads only metrics a broker exports
  (the names are read from :mod:`kbroker.metrics`, see
  :func:`tests.monitoring_support.exported_metric_names`).

One test (marked ``integration``) starts a real broker and checks that what its
``/metrics`` serves is what :func:`exported_metric_names` reads without one.

Grafana itself is not run; ``tests/integration/test_compose_cluster.py`` evaluates every
dashboard query (:func:`dashboard_queries`) against the compose cluster's Prometheus.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable

import grpc
import pytest
import yaml

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2
from tests.container_support import PROMETHEUS_IMAGE, docker_unavailable, ensure_images
from tests.monitoring_support import (
    ALERTS,
    DASHBOARD,
    PROMETHEUS_DIR,
    PROMETHEUS_OWN,
    alert_exprs,
    alert_rules,
    dashboard_panels,
    dashboard_queries,
    exported_metric_names,
    load_dashboard,
    metric_names,
    variable_queries,
)
from tests.support import wait_until

MOUNT = "/etc/prometheus"

Promtool = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def promtool() -> Promtool:
    """Runs ``promtool ARGS`` in ``deploy/prometheus`` (as ``/etc/prometheus`` in the
    container): the host's promtool, else the image's."""
    host = shutil.which("promtool")
    if host is not None:

        def run_host(*args: str) -> subprocess.CompletedProcess[str]:
            paths = [a.replace(MOUNT, str(PROMETHEUS_DIR)) for a in args]
            return subprocess.run([host, *paths], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=120)

        return run_host
    why = docker_unavailable()
    if why:
        pytest.skip(f"no promtool on this host, and {why}")
    ensure_images(PROMETHEUS_IMAGE)

    def run_docker(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "docker",
                "run",
                "--rm",
                "--network",
                "none",
                "-v",
                f"{PROMETHEUS_DIR}:{MOUNT}:ro",
                "-w",
                MOUNT,
                "--entrypoint",
                "promtool",
                PROMETHEUS_IMAGE,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run_docker


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(done.args)} exited {done.returncode}\n{out}"
    return out


@pytest.mark.docker
def test_promtool_accepts_the_config_and_the_rules(promtool: Promtool) -> None:
    out = _ok(promtool("check", "config", f"{MOUNT}/prometheus.yml"))
    assert f"SUCCESS: {len(alert_rules())} rules found" in out, out  # the config loads alerts.yml
    out = _ok(promtool("check", "rules", f"{MOUNT}/alerts.yml"))
    assert f"SUCCESS: {len(alert_rules())} rules found" in out, out


@pytest.mark.docker
def test_promtool_passes_the_alerts_unit_tests(promtool: Promtool) -> None:
    out = _ok(promtool("test", "rules", f"{MOUNT}/alerts.test.yml"))
    assert "SUCCESS" in out, out


def test_the_scrape_config_scrapes_the_three_brokers_and_loads_the_rules() -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    assert config["global"]["evaluation_interval"] == "5s"
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "kbroker"
    assert job["scrape_interval"] == "5s"
    targets = [t for c in job["static_configs"] for t in c["targets"]]
    assert targets == ["broker1:9404", "broker2:9404", "broker3:9404"]


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    tests = yaml.safe_load((PROMETHEUS_DIR / "alerts.test.yml").read_text())["tests"]
    cases = [case for t in tests for case in t.get("alert_rule_test", [])]
    for rule in alert_rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c.get("exp_alerts") for c in mine), f"{rule['alert']}: no test where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{rule['alert']}: no test where it must not fire"
        assert rule.get("for"), f"{rule['alert']}: no for: duration"
        assert rule["labels"]["severity"] in ("critical", "warning"), rule
        assert rule["annotations"].get("summary") and rule["annotations"].get("description"), rule


def test_the_dashboard_panels_query_the_prometheus_input() -> None:
    dashboard = load_dashboard()
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    assert 36 <= dashboard["schemaVersion"] <= 39
    panels = dashboard_panels()
    assert len(panels) >= 20
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for p in panels:
        where = f"panel {p['id']} {p['title']!r}"
        assert p.get("datasource") == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, where
        assert p.get("targets"), f"{where}: no query"
        for t in p["targets"]:
            assert t.get("expr", "").strip(), f"{where}: a target without expr"
            assert t.get("datasource", p["datasource"]) == p["datasource"], where
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24, where
    for v in dashboard["templating"]["list"]:
        assert v["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, v["name"]


def test_the_dashboard_covers_what_kafka_users_expect() -> None:
    read = set().union(*(metric_names(q) for q in dashboard_queries()))
    expected = {
        "up",
        "kafka_controller_kafkacontroller_activecontrollercount",
        "kafka_controller_kafkacontroller_offlinepartitionscount",
        "kafka_server_replicamanager_underreplicatedpartitions",
        "kafka_server_replicamanager_underminisrpartitioncount",
        "kafka_server_brokertopicmetrics_messagesin_total",
        "kafka_server_brokertopicmetrics_bytesin_total",
        "kafka_server_brokertopicmetrics_bytesout_total",
        "kafka_network_requestmetrics_requests_total",
        "kafka_network_requestmetrics_totaltimems_bucket",
        "kafka_server_delayedoperationpurgatory_purgatorysize",
        "kafka_server_replicamanager_isrshrinks_total",
        "kafka_server_replicamanager_isrexpands_total",
        "kafka_consumergroup_lag",
        "kafka_log_log_size",
        "kafka_cluster_partition_laststableoffsetlag",
        "kafka_server_sessionexpirelistener_sessionstate",
        "kafka_server_zookeeperclientmetrics_zookeeperrequestlatencyms_bucket",
    }
    assert expected <= read, f"no panel reads {sorted(expected - read)}"


def test_every_query_reads_only_metrics_kbroker_exports() -> None:
    exported = exported_metric_names()
    assert "kafka_consumergroup_lag" in exported and "kafka_network_requestmetrics_totaltimems_bucket" in exported
    known = exported | PROMETHEUS_OWN
    queries = {
        **{f"{DASHBOARD.name}: {q}": q for q in dashboard_queries()},
        **{f"{DASHBOARD.name} variable: {q}": q for q in variable_queries()},
        **{f"{ALERTS.name}: {q}": q for q in alert_exprs()},
    }
    assert len(queries) > len(alert_exprs())
    unknown = {where: sorted(metric_names(q) - known) for where, q in queries.items() if metric_names(q) - known}
    assert not unknown, f"queries of metrics no broker exports: {unknown}"
    assert all(metric_names(q) for q in queries.values()), "a query that reads no metric"


def test_dashboard_queries_are_plain_promql() -> None:
    raw = dashboard_queries(raw=True)
    assert any("$__rate_interval" in q for q in raw) and any("$topic" in q for q in raw)
    for q in dashboard_queries():
        assert "$" not in q and "[[" not in q, q


def test_metric_names_of_promql() -> None:
    q = (
        'sum by (le, request) (rate(a_total{x=~"$y", __name__!="n"}[5m] offset 1h)) / on (i) group_left (z) b'
        ' * 1e3 + 0x1f > bool 2 unless {__name__="c"} or histogram_quantile(0.9, d_bucket[10m:1m])'
    )
    assert metric_names(q) == {"a_total", "b", "c", "d_bucket"}


@pytest.mark.integration
def test_a_real_broker_serves_the_metrics_the_queries_read(cluster_factory: Callable[..., LocalCluster]) -> None:
    c = cluster_factory(1, **{"metrics.port": "0"})
    with AdminClient(c.bootstrap) as admin:
        admin.create_topics([NewTopic("mon", num_partitions=1, replication_factor=1)])
    with Producer(bootstrap_servers=c.bootstrap, acks="all") as p:
        for i in range(5):
            p.send("mon", value=b"v%d" % i)
        p.flush()
    with Consumer(bootstrap_servers=c.bootstrap, group_id="mon-g", auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("mon", 0)])
        got = 0
        deadline = time.monotonic() + 30
        while got < 3 and time.monotonic() < deadline:
            got += sum(len(records) for records in consumer.poll(timeout_ms=500, max_records=3).values())
        assert got >= 3
        consumer.commit({TopicPartition("mon", 0): 3})  # a lag of 2
    (broker,) = c.brokers.values()
    with grpc.insecure_channel(broker.address) as channel:  # an error, for errors_total
        with pytest.raises(grpc.RpcError):
            broker_pb2_grpc.BrokerStub(channel).Fetch(log_pb2.FetchRequest(max_bytes=-1), timeout=10)
    found = re.search(rb"metrics: (http://\S+/metrics)", broker.log_path.read_bytes())
    assert found, f"the broker logged no metrics URL:\n{broker.log_tail()}"
    url = found.group(1).decode()

    def served_text() -> str:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return str(resp.read().decode())

    # grpc's abort() answers before the handler that counts the error resumes.
    wait_until(lambda: "kafka_network_requestmetrics_errors_total{" in served_text(), 10, "the error counted")
    text = served_text()
    served = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and line[0] != "#"}
    exported = exported_metric_names()
    assert served - exported == set(), "the broker serves names exported_metric_names() misses"
    read = set().union(*(metric_names(q) for q in [*dashboard_queries(), *alert_exprs()])) - PROMETHEUS_OWN
    assert read - served == set(), "queried metrics this broker does not serve"
