"""``kctl perf produce`` with transactions, as real subprocesses against a real broker:
it commits as asked (the line before Kafka's summary counts the commits), and a
read_committed ``kctl perf consume`` reads every record."""

from __future__ import annotations

import re

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import Consumer, TopicPartition
from tests.integration.test_kctl_perf import consume_summary, kctl, make_topic, produce_summary

pytestmark = pytest.mark.integration

COMMITS = re.compile(
    r"^(?P<n>\d+) transactions committed, (?P<each>[\d.]+) records each, [\d.]+ ms avg commit, [\d.]+ ms max commit\.$"
)


def commits(stdout: str) -> tuple[int, float]:
    m = COMMITS.match(stdout.splitlines()[-2])
    assert m, stdout
    return int(m["n"]), float(m["each"])


@pytest.mark.parametrize("bulk", [[], ["--bulk", "--bulk-size", "700"]], ids=["send", "send_batch"])
def test_commits_every_transaction_size_records(cluster: LocalCluster, bulk: list[str]) -> None:
    topic = make_topic(cluster, f"perf-txn-{len(bulk)}", partitions=1)
    bs = ["--bootstrap-server", cluster.bootstrap, "--topic", topic]
    result = kctl(
        "perf", "produce", *bs, "--num-records", "2500", "--transactional-id", f"perf-{len(bulk)}",
        "--transaction-size", "1000", "--producer-props", "linger.ms=1", *bulk,
    )  # fmt: skip
    assert produce_summary(result)["records"] == 2500
    assert commits(result.stdout) == (3, pytest.approx(2500 / 3, abs=0.1))
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap_servers=cluster.bootstrap, isolation_level="read_committed") as c:
        assert c.end_offsets([tp]) == {tp: 2500 + 3}  # the LSO: after the last commit marker
    read = kctl(
        "perf", "consume", *bs, "--num-records", "2500", "--consumer-props", "isolation.level=read_committed"
    )  # fmt: skip
    assert read.returncode == 0, read.stderr
    assert int(consume_summary(read)["data.consumed.in.nMsg"]) == 2500


def test_transaction_duration_commits_by_age(cluster: LocalCluster) -> None:
    topic = make_topic(cluster, "perf-txn-age", partitions=1)
    result = kctl(
        "perf", "produce", "--bootstrap-server", cluster.bootstrap, "--topic", topic, "--num-records", "300",
        "--throughput", "1000", "--transaction-duration-ms", "100",
    )  # fmt: skip
    assert produce_summary(result)["records"] == 300
    n, _ = commits(result.stdout)
    assert 2 <= n <= 6, result.stdout  # ~0.3 s in ~100 ms transactions


def test_acks_1_with_transactions_is_a_usage_error(cluster: LocalCluster) -> None:
    result = kctl(
        "perf", "produce", "--bootstrap-server", cluster.bootstrap, "--topic", "nope", "--num-records", "10",
        "--transaction-size", "5", "--producer-props", "acks=1",
    )  # fmt: skip
    assert result.returncode == 2 and result.stderr.startswith("kctl: transactions need acks=all"), result.stderr
