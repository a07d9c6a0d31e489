"""``kctl perf produce`` / ``kctl perf consume`` as real subprocesses against a real broker.

The summary lines must parse (Kafka's shapes), count exactly the records asked for (checked
against the log end offsets), and bad input must be one ``kctl: ...`` line and a
non-zero exit.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition

pytestmark = pytest.mark.integration

PRODUCE_SUMMARY = re.compile(
    r"^(?P<records>\d+) records sent, (?P<rate>[\d.]+) records/sec \((?P<mb>[\d.]+) MB/sec\), "
    r"(?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, (?P<p50>[\d.]+) ms 50th, "
    r"(?P<p95>[\d.]+) ms 95th, (?P<p99>[\d.]+) ms 99th, (?P<p999>[\d.]+) ms 99\.9th\.$"
)
PROGRESS = re.compile(
    r"^\d+ records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, [\d.]+ ms max latency\.$"
)
CONSUME_HEADER = (
    "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
    "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
)
MB = 1024 * 1024


def kctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kbroker.cli", *args], capture_output=True, text=True, timeout=timeout, stdin=None
    )


def fails(result: subprocess.CompletedProcess[str], code: int, mentions: str) -> None:
    assert result.returncode == code, f"exit {result.returncode}, wanted {code}: {result.stdout!r} {result.stderr!r}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kctl: "), result.stderr
    assert mentions in lines[0], lines[0]


def produce_summary(result: subprocess.CompletedProcess[str]) -> dict[str, float]:
    assert result.returncode == 0, result.stderr
    m = PRODUCE_SUMMARY.match(result.stdout.splitlines()[-1])
    assert m, result.stdout
    return {k: float(v) for k, v in m.groupdict().items()}


def consume_summary(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    header, values = result.stdout.splitlines()[-2:]
    assert header == CONSUME_HEADER
    return dict(zip(header.split(", "), values.split(", "), strict=True))


def make_topic(cluster: LocalCluster, name: str, partitions: int = 2) -> str:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])
    with Producer(bootstrap_servers=cluster.bootstrap) as p:
        deadline = time.monotonic() + 30
        while len(p.partitions_for(name)) < partitions and time.monotonic() < deadline:
            time.sleep(0.1)
    return name


def end_offsets(cluster: LocalCluster, topic: str, partitions: int = 2) -> int:
    with Consumer(bootstrap_servers=cluster.bootstrap) as c:
        ends = c.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    return sum(ends.values())


def test_produce_then_consume_count_every_record(cluster: LocalCluster) -> None:
    topic = make_topic(cluster, "perf")
    bs = ["--bootstrap-server", cluster.bootstrap, "--topic", topic]

    s = produce_summary(
        kctl(
            "perf",
            "produce",
            *bs,
            "--num-records",
            "3000",
            "--record-size",
            "50",
            "--producer-props",
            "acks=all",
            "linger.ms=1",
            "batch.size=4096",
        )
    )
    assert s["records"] == 3000
    assert s["rate"] > 0 and s["mb"] == pytest.approx(s["rate"] * 50 / MB, abs=0.01)
    assert 0 < s["p50"] <= s["p95"] <= s["p99"] <= s["p999"] <= s["max"]
    assert end_offsets(cluster, topic) == 3000

    result = kctl("perf", "consume", *bs, "--num-records", "3000", "--consumer-props", "max.poll.records=700")
    assert result.returncode == 0, result.stderr
    c = consume_summary(result)
    assert int(c["data.consumed.in.nMsg"]) == 3000
    assert float(c["data.consumed.in.MB"]) == pytest.approx(3000 * 50 / MB, abs=1e-4)
    assert float(c["nMsg.sec"]) > 0 and float(c["fetch.nMsg.sec"]) >= float(c["nMsg.sec"])


def test_throughput_throttles_and_reports_every_five_seconds(cluster: LocalCluster) -> None:
    topic = make_topic(cluster, "perf-slow")
    result = kctl(
        "perf",
        "produce",
        "--bootstrap-server",
        cluster.bootstrap,
        "--topic",
        topic,
        "--num-records",
        "1200",
        "--throughput",
        "200",
        "--producer-props",
        "acks=1",
        "linger.ms=0",
    )
    s = produce_summary(result)
    assert s["records"] == 1200
    assert 150 <= s["rate"] <= 210, s
    progress = result.stdout.splitlines()[:-1]
    assert progress and all(PROGRESS.match(line) for line in progress), result.stdout
    assert end_offsets(cluster, topic) == 1200


@pytest.mark.skipif(not hasattr(Producer, "send_batch"), reason="this kclient has no Producer.send_batch")
def test_bulk_sends_every_record(cluster: LocalCluster) -> None:
    topic = make_topic(cluster, "perf-bulk")
    s = produce_summary(
        kctl(
            "perf",
            "produce",
            "--bootstrap-server",
            cluster.bootstrap,
            "--topic",
            topic,
            "--num-records",
            "2500",
            "--bulk",
            "--bulk-size",
            "1000",
            "--producer-props",
            "acks=1",
        )
    )
    assert s["records"] == 2500
    assert end_offsets(cluster, topic) == 2500


@pytest.mark.skipif(
    not (hasattr(Consumer, "poll_columns") or hasattr(Consumer, "poll_arrow")),
    reason="this kclient has no columnar poll",
)
@pytest.mark.parametrize("kind", ["columns", "arrow"])
def test_columnar_consume_counts_every_record(cluster: LocalCluster, kind: str) -> None:
    if not hasattr(Consumer, f"poll_{kind}"):
        pytest.skip(f"this kclient has no Consumer.poll_{kind}")
    topic = make_topic(cluster, "perf-columns")
    bs = ["--bootstrap-server", cluster.bootstrap, "--topic", topic]
    produce_summary(kctl("perf", "produce", *bs, "--num-records", "2000", "--producer-props", "acks=1"))
    result = kctl("perf", "consume", *bs, "--num-records", "2000", f"--columnar={kind}")
    assert result.returncode == 0, result.stderr
    c = consume_summary(result)
    assert int(c["data.consumed.in.nMsg"]) == 2000
    assert float(c["data.consumed.in.MB"]) == pytest.approx(2000 * 100 / MB, abs=1e-4)


def test_consume_short_of_num_records_prints_summary_then_fails(cluster: LocalCluster) -> None:
    topic = make_topic(cluster, "perf-short")
    bs = ["--bootstrap-server", cluster.bootstrap, "--topic", topic]
    produce_summary(kctl("perf", "produce", *bs, "--num-records", "10", "--producer-props", "acks=1"))
    result = kctl("perf", "consume", *bs, "--num-records", "20", "--timeout-ms", "1000")
    fails(result, 1, "read 10 of 20 records")
    assert int(consume_summary(result)["data.consumed.in.nMsg"]) == 10


@pytest.mark.parametrize(
    ("args", "code", "mentions"),
    [
        (["produce", "--num-records", "10", "--producer-props", "colour=blue"], 2, "unknown --producer-props"),
        (["produce", "--num-records", "10", "--producer-props", "linger.ms=soon"], 2, "linger.ms must be a number"),
        (["produce", "--num-records", "10", "--producer-props", "acks"], 2, "KEY=VALUE"),
        (["produce", "--num-records", "10", "--producer-props", "acks=2"], 2, "acks"),
        (["produce", "--num-records", "0"], 2, "--num-records must be at least 1"),
        (["produce", "--num-records", "10", "--throughput", "0"], 2, "--throughput"),
        (["produce", "--num-records", "ten"], 2, "invalid int value"),
        (["produce"], 2, "--num-records"),
        (["consume", "--num-records", "10", "--timeout-ms", "-1"], 2, "--timeout-ms"),
        (["consume", "--num-records", "10", "--consumer-props", "group.id=g"], 2, "group.id"),
        (["consume", "--num-records", "10", "--columnar=rows"], 2, "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(cluster: LocalCluster, args: list[str], code: int, mentions: str) -> None:
    verb, *rest = args
    fails(kctl("perf", verb, "--bootstrap-server", cluster.bootstrap, "--topic", "perf-bad", *rest), code, mentions)


def test_unknown_topic_and_missing_server_fail_in_one_line(cluster: LocalCluster) -> None:
    fails(
        kctl("perf", "produce", "--bootstrap-server", cluster.bootstrap, "--topic", "nope", "--num-records", "5"),
        1,
        "does not exist",
    )
    fails(kctl("perf", "consume", "--topic", "nope", "--num-records", "5"), 2, "--bootstrap-server")
    fails(
        kctl("--zookeeper", "127.0.0.1:2181", "perf", "produce", "--topic", "t", "--num-records", "5"),
        2,
        "--bootstrap-server",
    )
