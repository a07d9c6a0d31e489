"""The queries of the monitoring configuration (issue 25), read in pure Python: the PromQL of
every panel of the Grafana dashboard (``deploy/grafana/kbroker-dashboard.json``) and of
every alert rule (``deploy/prometheus/alerts.yml``), the metric names a query reads, and
the metric names kbroker really exports (read from :mod:`kbroker.metrics` on fake broker
state: no broker runs).

Used by ``tests/integration/test_monitoring_config.py`` (the names are real) and meant for
a test that evaluates every query against a running Prometheus: :func:`dashboard_queries`
substitutes Grafana's variables (``$__rate_interval``, ``$topic``, ...) so that each
query is plain PromQL that Prometheus's ``/api/v1/query`` accepts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml  # PyYAML: in .venv with mkdocs (the dev extra)

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "kbroker-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"

PROMETHEUS_OWN = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added"})
"""Series Prometheus itself makes for each scrape target (not exported by the brokers)."""

INTERVALS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h", "__interval_ms": "15000"}
"""Grafana's built-in variables, as :func:`dashboard_queries` substitutes them."""

_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]")


# --- the dashboard ---------------------------------------------------------------------


def load_dashboard(path: Path | str = DASHBOARD) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return data


def dashboard_panels(path: Path | str = DASHBOARD) -> list[dict[str, Any]]:
    """Every panel that is not a row, those inside collapsed rows included."""

    def walk(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in panels:
            if p.get("type") == "row":
                yield from walk(p.get("panels", []))
            else:
                yield p

    return list(walk(load_dashboard(path).get("panels", [])))


def dashboard_variables(path: Path | str = DASHBOARD) -> dict[str, str]:
    """The dashboard's template variables and the value :func:`dashboard_queries` gives
    each: its "All" value (``.*`` for a regex matcher) where it has one."""
    out: dict[str, str] = {}
    for v in load_dashboard(path).get("templating", {}).get("list", []):
        out[v["name"]] = v.get("allValue") or ".*"
    return out


def substitute(expr: str, variables: dict[str, str]) -> str:
    """``expr`` with Grafana's variables replaced: the built-in intervals by
    :data:`INTERVALS`, the dashboard's own by ``variables``; an unknown one raises."""
    known = {**INTERVALS, **variables}

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in known:
            raise KeyError(f"unknown Grafana variable ${name} in {expr!r}")
        return known[name]

    return _VARIABLE.sub(value, expr)


def dashboard_queries(path: Path | str = DASHBOARD, raw: bool = False) -> list[str]:
    """The PromQL of every target of every panel, in panel order, ready for Prometheus
    (Grafana's variables substituted, see :func:`substitute`); ``raw`` leaves them as the
    dashboard has them."""
    variables = dashboard_variables(path)
    exprs = [t["expr"] for p in dashboard_panels(path) for t in p.get("targets", []) if t.get("expr")]
    return exprs if raw else [substitute(e, variables) for e in exprs]


def variable_queries(path: Path | str = DASHBOARD) -> list[str]:
    """The metric selectors of the template variables' ``label_values(METRIC, label)``
    queries (what their values are read from)."""
    out: list[str] = []
    for v in load_dashboard(path).get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        query = v.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", text)
        out.append(m.group(1) if m else text)
    return out


# --- the alert rules -------------------------------------------------------------------


def alert_rules(path: Path | str = ALERTS) -> list[dict[str, Any]]:
    """Every alerting rule (``alert``, ``expr``, ``for``, ``labels``, ``annotations``) of a
    Prometheus rule file, in file order."""
    doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return [rule for group in doc.get("groups", []) for rule in group.get("rules", []) if "alert" in rule]


def alert_exprs(path: Path | str = ALERTS) -> list[str]:
    """The PromQL of every alerting rule, in file order."""
    return [str(rule["expr"]).strip() for rule in alert_rules(path)]


# --- metric names ----------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r'__name__\s*=\s*"([a-zA-Z_:][a-zA-Z0-9_:]*)"')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+-?\w+")
_IDENTIFIER = re.compile(r"(?<![\w:.])[a-zA-Z_:][a-zA-Z0-9_:]*(?![\w:])(?!\s*\()")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
    | {"inf", "nan", "atan2"}
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: its identifiers that are neither
    functions, keywords, label names (in ``{...}``, ``by (...)``, ...) nor durations."""
    names = set(_NAME_MATCHER.findall(expr))
    text = _STRING.sub('""', expr)
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    names.update(w for w in _IDENTIFIER.findall(text) if w.lower() not in _KEYWORDS)
    return names


def exported_metric_names() -> set[str]:
    """Every sample name a broker's ``/metrics`` serves (``..._total``, ``..._bucket``, ...),
    read from :mod:`kbroker.metrics`: its registry with one child of each labelled
    metric, and the scrape-time collector on fake state that fills every gauge family
    (a led partition with a lag, a follower replica). Nothing is started."""
    from kbroker.metrics import BrokerMetrics, BrokerState, BrokerStateCollector

    metrics = BrokerMetrics()
    metrics.topic("t").messages_in.inc()
    request = metrics.request("Produce")
    request.done(1.0)
    request.error("NOT_LEADER_FOR_PARTITION")
    log = SimpleNamespace(size_in_bytes=100)
    led = SimpleNamespace(
        topic="t",
        index=0,
        broker_id=1,
        leader=1,
        isr=[1],
        replicas=[1, 2],
        high_watermark=10,
        last_stable_offset=5,
        isr_shrinks=1,
        isr_expands=1,
        log=log,
    )
    followed = SimpleNamespace(**{**vars(led), "index": 1, "leader": 2})
    metrics.registry.register(
        BrokerStateCollector(
            BrokerState(
                partitions=lambda: [led, followed],
                min_insync_replicas=lambda topic: 2,
                controller_active=lambda: True,
                offline_partitions=lambda: 0,
                zk_state=lambda: "CONNECTED",
                purgatory_sizes=lambda: {},
                committed_offsets=lambda: {"g": {("t", 0): 4, ("t", 1): 3}},
                end_offsets=lambda tps: {tp: 10 for tp in tps},
                unfinished_transactions=lambda: 0,
            )
        )
    )
    return {sample.name for family in metrics.registry.collect() for sample in family.samples}
