"""``kctl`` as a real subprocess against real broker processes on a real ZooKeeper.

Every command is run both ways where it has both (``--zookeeper`` writes the znodes,
``--bootstrap-server`` goes through the gRPC admin API). Failures must be one
``kctl: ...`` line on stderr, a non-zero exit and no change to the cluster.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import ZkClient
from kbroker.local.cluster import LocalCluster

pytestmark = pytest.mark.integration

T = TypeVar("T")
Result = subprocess.CompletedProcess[str]


def kctl(*words: str, stdin: str | None = None, timeout: float = 90) -> Result:
    """Run ``kctl``; each of ``words`` is split on whitespace (no argument here has spaces).

    It runs outside the repository and without ``KBROKER_BOOTSTRAP``, so that a developer's
    running ``scripts/run`` cluster (``.run/cluster.json``) is never its default."""
    args = [arg for w in words for arg in w.split()]
    env = {k: v for k, v in os.environ.items() if k != "KBROKER_BOOTSTRAP"}
    return subprocess.run(
        [sys.executable, "-m", "kbroker.cli", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tempfile.gettempdir(),
        env=env,
    )


def ok(result: Result) -> str:
    assert result.returncode == 0, f"kctl failed ({result.returncode}): {result.stderr}"
    return result.stdout


def fails(result: Result, *, code: int = 1, mentions: str = "") -> str:
    """The one stderr line of a failed command."""
    assert result.returncode == code, f"exit {result.returncode}, wanted {code}: {result.stdout!r} {result.stderr!r}"
    assert result.stdout == "", result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, f"want one stderr line, got: {result.stderr!r}"
    assert lines[0].startswith("kctl: "), lines[0]
    assert "Traceback" not in result.stderr
    assert mentions in lines[0], lines[0]
    return lines[0]


def wait_for(check: Callable[[], T | None], what: str, timeout_s: float = 45) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def conn(cluster: LocalCluster, mode: str) -> str:
    return f"--zookeeper {cluster.zk_connect}" if mode == "zookeeper" else f"--bootstrap-server {cluster.bootstrap}"


TOPIC_ID = re.compile(r"\tTopicId: [A-Za-z0-9_-]{22}")


def without_topic_id(line: str) -> str:
    """A topic line without its ``TopicId`` field (printed as Kafka 2.8 does)."""
    return TOPIC_ID.sub("", line)


def describe_when_led(cluster: LocalCluster, mode: str, topic: str, partitions: int) -> list[str]:
    """``topics describe --topic`` once every partition has a leader (the topic id left out,
    after checking that it is printed)."""

    def led() -> list[str] | None:
        lines = ok(kctl(conn(cluster, mode), "topics describe --topic", topic)).splitlines()
        parts = lines[1:]
        if len(parts) == partitions and all("\tLeader: none\t" not in line for line in parts):
            assert TOPIC_ID.search(lines[0]) is not None, lines[0]  # either connection prints it
            return [without_topic_id(lines[0]), *parts]
        return None

    return wait_for(led, f"leaders of {topic} ({mode})")


def topic_znodes(cluster: LocalCluster) -> tuple[list[str], list[str]]:
    """(children of /brokers/topics, children of /config/topics)."""
    zk = ZkClient(cluster.zk_connect)
    zk.start()
    try:
        configs = zk.kazoo.get_children(zkdata.CONFIG_TOPICS) if zk.kazoo.exists(zkdata.CONFIG_TOPICS) else []
        return zk.topics(), sorted(configs)
    finally:
        zk.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- topics --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["zookeeper", "bootstrap"])
def test_topic_lifecycle(cluster: LocalCluster, mode: str) -> None:
    c = conn(cluster, mode)
    configs = "--config retention.ms=60000 --config cleanup.policy=compact"
    out = ok(kctl(c, "topics create --topic events --partitions 2 --replication-factor 1", configs))
    assert out == "Created topic events.\n"
    ok(kctl(c, "topics create --topic placed --replica-assignment 0,0,0"))
    assert ok(kctl(c, "topics list")) == "events\nplaced\n"

    lines = describe_when_led(cluster, mode, "events", 2)
    assert lines == [
        "Topic: events\tPartitionCount: 2\tReplicationFactor: 1\tConfigs: cleanup.policy=compact,retention.ms=60000",
        "\tTopic: events\tPartition: 0\tLeader: 0\tReplicas: 0\tIsr: 0",
        "\tTopic: events\tPartition: 1\tLeader: 0\tReplicas: 0\tIsr: 0",
    ]
    placed = describe_when_led(cluster, mode, "placed", 3)
    assert placed[0] == "Topic: placed\tPartitionCount: 3\tReplicationFactor: 1\tConfigs: "
    # Flags after the verb work as well as before the noun; no --topic describes every topic.
    everything = ok(kctl("topics describe", c)).splitlines()
    assert [without_topic_id(line) for line in everything if line.startswith("Topic:")] == [lines[0], placed[0]]
    # Healthy partitions match neither filter.
    assert ok(kctl(c, "topics describe --under-replicated-partitions")) == ""
    assert ok(kctl(c, "topics describe --unavailable-partitions")) == ""

    out = ok(kctl(c, "topics alter --topic events --partitions 3"))
    assert out == ("Adding partitions succeeded!\n" if mode == "zookeeper" else "")
    assert describe_when_led(cluster, mode, "events", 3)[0].startswith("Topic: events\tPartitionCount: 3\t")
    ok(kctl(c, "topics alter --topic events --config retention.ms=1000"))  # both ways (IncrementalAlterConfigs)
    # Over gRPC the config comes from the broker's metadata, which its config watch updates.
    want = "Configs: cleanup.policy=compact,retention.ms=1000"
    wait_for(lambda: describe_when_led(cluster, mode, "events", 3)[0].endswith(want), "the new config described")

    out = ok(kctl(c, "topics delete --topic events"))
    assert out == ("Topic events is marked for deletion.\n" if mode == "zookeeper" else "")
    wait_for(lambda: ok(kctl(c, "topics list")) == "placed\n", "events to be deleted")
    fails(kctl(c, "topics describe --topic events"), mentions="UnknownTopicOrPartitionError")
    fails(kctl(c, "topics delete --topic events"), mentions="UnknownTopicOrPartitionError")
    assert ok(kctl(c, "topics delete --topic events --if-exists")) == ""
    assert ok(kctl(c, "topics create --topic placed --partitions 1 --replication-factor 1 --if-not-exists")) == ""


@pytest.mark.parametrize("mode", ["zookeeper", "bootstrap"])
def test_bad_topic_commands_fail_in_one_line_and_change_nothing(cluster: LocalCluster, mode: str) -> None:
    c = conn(cluster, mode)
    rf1 = "--partitions 1 --replication-factor 1"
    ok(kctl(c, "topics create --topic dup", rf1))

    fails(kctl(c, "topics create --topic bad/name", rf1), mentions="InvalidTopicError")
    fails(kctl(c, "topics create --topic", "a" * 250, rf1), mentions="InvalidTopicError")
    fails(kctl(c, "topics create --topic dup", rf1), mentions="TopicAlreadyExistsError")
    too_wide = "topics create --topic wide --partitions 1 --replication-factor 3"
    fails(kctl(c, too_wide), mentions="InvalidReplicationFactorError")
    fails(kctl(c, "topics create --topic cfg --config retention.ms=soon", rf1), mentions="InvalidConfigurationError")
    fails(kctl(c, "topics create --topic cfg --config no.such.setting=1", rf1), mentions="InvalidConfigurationError")
    fails(
        kctl(c, "topics create --topic cfg --config retention.ms", rf1), code=2, mentions="--config expects KEY=VALUE"
    )
    fails(kctl(c, "topics create --topic placed --replica-assignment 0:7"), mentions="InvalidReplicaAssignmentError")
    fails(kctl(c, "topics create --topic placed --replica-assignment 0:x"), code=2)
    fails(kctl(c, "topics create --topic zero --partitions 0 --replication-factor 1"), code=2)
    fails(kctl(c, "topics create --topic nope --partitions many"), code=2)
    fails(kctl(c, "topics create --topic flags --no-such-flag", rf1), code=2)
    fails(kctl("topics create --topic noconn", rf1), code=2, mentions="--zookeeper or --bootstrap-server")
    fails(kctl(c, "topics alter --topic dup --partitions 1"), mentions="InvalidPartitionsError")
    fails(kctl(c, "topics alter --topic ghost --partitions 4"), mentions="UnknownTopicOrPartitionError")

    assert ok(kctl(c, "topics list")) == "dup\n"
    assert topic_znodes(cluster) == (["dup"], ["dup"])


def test_connection_errors_are_one_line() -> None:
    port = free_port()
    started = time.monotonic()
    line = fails(kctl(f"--zookeeper 127.0.0.1:{port}/kctl topics list"))
    assert line.startswith(f"kctl: cannot connect to ZooKeeper at 127.0.0.1:{port}/kctl"), line
    assert time.monotonic() - started < 40
    create = "topics create --topic t --partitions 1 --replication-factor 1"

    nobody = f"--bootstrap-server 127.0.0.1:{port}"
    fails(kctl(nobody, "topics list"), mentions="NoBrokersAvailable")
    fails(kctl(nobody, create), mentions="NoBrokersAvailable")
    fails(kctl(nobody, "brokers list"), mentions="NoBrokersAvailable")
    fails(kctl("consume --topic t --max-messages 1", nobody), mentions="NoBrokersAvailable")
    fails(kctl("produce --topic t", nobody, stdin="x\n"), mentions="NoBrokersAvailable")

    fails(kctl("topics list"), code=2, mentions="exactly one of --zookeeper or --bootstrap-server")
    fails(kctl("--zookeeper 127.0.0.1:1 --bootstrap-server 127.0.0.1:1 topics list"), code=2)
    fails(kctl("--zookeeper localhost topics list"), code=2, mentions="--zookeeper must be")
    fails(kctl("--bootstrap-server nope topics list"), code=2, mentions="--bootstrap-server must be")
    fails(kctl("--zookeeper 127.0.0.1:1 produce --topic t"), code=2, mentions="--bootstrap-server")
    fails(kctl("topics"), code=2)
    fails(kctl("sing"), code=2)


# --- produce / consume ---------------------------------------------------------------


def test_produce_then_consume_from_beginning(cluster: LocalCluster) -> None:
    b = f"--bootstrap-server {cluster.bootstrap}"
    ok(kctl(b, "topics create --topic lines --partitions 1 --replication-factor 1"))
    assert ok(kctl("produce --topic lines", b, stdin="alpha\nbeta gamma\n\ndelta")) == ""
    keyed = kctl(
        "produce --topic lines --acks 1 --compression-type gzip --verbose",
        b,
        stdin="k1\tone\nk2\ttwo\tstill two\nthree\r\n",
    )
    assert ok(keyed) == ""
    assert keyed.stderr == "kctl: produced 3 record(s) to lines (acks=1)\n"

    values = ["alpha", "beta gamma", "", "delta", "one", "two\tstill two", "three"]
    everything = kctl("consume --topic lines --from-beginning --max-messages 7", b)
    assert ok(everything) == "".join(v + "\n" for v in values)
    assert everything.stderr == ""

    props = "--property print.key=true --property print.offset=true"
    with_keys = ok(kctl("consume --topic lines --from-beginning --max-messages 7", props, b)).splitlines()
    keys = ["null", "null", "null", "null", "k1", "k2", "null"]
    assert with_keys == [f"Offset:{i}\t{k}\t{v}" for i, (k, v) in enumerate(zip(keys, values, strict=True))]

    # --max-messages stops early, --partition/--offset start in the middle, --timeout-ms ends an idle read.
    assert ok(kctl("consume --topic lines --from-beginning --max-messages 2", b)) == "alpha\nbeta gamma\n"
    tail = ok(kctl("consume --topic lines --partition 0 --offset 5 --timeout-ms 3000", b))
    assert tail == "two\tstill two\nthree\n"
    assert ok(kctl("consume --topic lines --timeout-ms 1500", b)) == ""

    # parse.key=false never splits; parse.key=true insists on a key.
    ok(kctl("produce --topic lines --property parse.key=false", b, stdin="a\tb\n"))
    strict = kctl("produce --topic lines --property parse.key=true", b, stdin="k\tv\nno key here\n")
    fails(strict, mentions="line 2 has no key separator")
    fails(kctl("produce --topic lines --property colour=blue", b), code=2)
    after = ok(kctl("consume --topic lines --partition 0 --offset 7 --max-messages 2 --property print.key=true", b))
    assert after == "null\ta\tb\nk\tv\n"


def test_produce_and_consume_failures_are_one_line(cluster: LocalCluster) -> None:
    b = f"--bootstrap-server {cluster.bootstrap}"
    started = time.monotonic()
    fails(kctl("consume --topic nowhere --from-beginning", b), mentions="UnknownTopicOrPartitionError")
    fails(kctl("produce --topic nowhere", b, stdin="x\n"), mentions="UnknownTopicOrPartitionError")
    assert time.monotonic() - started < 30
    ok(kctl(b, "topics create --topic one --partitions 1"))
    fails(kctl("consume --topic one --partition 3 --offset 0", b), mentions="no partition 3")
    fails(kctl("consume --topic one --offset 0", b), code=2, mentions="--offset needs --partition")
    # A record the broker refuses: the producer reports it, once, after flushing.
    ok(kctl(b, "topics create --topic small --partitions 1 --config max.message.bytes=200"))
    refused = fails(kctl("produce --topic small", b, stdin="x" * 1000 + "\n"), mentions="1 of 1 record(s) to small")
    assert "MessageSizeTooLargeError" in refused or "RecordListTooLargeError" in refused, refused
    assert ok(kctl(f"--zookeeper {cluster.zk_connect} topics list")) == "one\nsmall\n"


def test_consume_until_ctrl_c_exits_quietly(cluster: LocalCluster) -> None:
    b = f"--bootstrap-server {cluster.bootstrap}"
    ok(kctl(b, "topics create --topic live --partitions 2 --replication-factor 1"))
    ok(kctl("produce --topic live", b, stdin="first\n"))
    args = [sys.executable, "-m", "kbroker.cli", *f"consume --topic live --from-beginning {b}".split()]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == "first\n"  # it is in its poll loop now
        ok(kctl("produce --topic live", b, stdin="k\tsecond\n"))
        assert proc.stdout.readline() == "second\n"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout.read() == ""
        assert proc.stderr.read() == ""


# --- brokers -------------------------------------------------------------------------


def test_brokers_list_and_partition_filters(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(2)
    addresses = {bid: b.address for bid, b in cluster.brokers.items()}
    for mode in ("zookeeper", "bootstrap"):
        lines = ok(kctl(conn(cluster, mode), "brokers list")).splitlines()
        assert [line.removesuffix(" (controller)") for line in lines] == [f"{i} {addresses[i]} -" for i in (0, 1)]
        assert sum(line.endswith(" (controller)") for line in lines) == 1, lines

    zk = conn(cluster, "zookeeper")
    ok(kctl(zk, "topics create --topic both --replica-assignment 0:1,1:0"))
    ok(kctl(zk, "topics create --topic lonely --replica-assignment 1"))
    describe_when_led(cluster, "zookeeper", "both", 2)
    describe_when_led(cluster, "zookeeper", "lonely", 1)

    def in_sync() -> bool:
        parts = ok(kctl(zk, "topics describe --topic both")).splitlines()[1:]
        return all(line.endswith(("Isr: 0,1", "Isr: 1,0")) for line in parts)

    wait_for(in_sync, "both replicas of 'both' in sync")

    cluster.brokers[1].stop()
    alone = f"0 {addresses[0]} - (controller)\n"
    for mode in ("zookeeper", "bootstrap"):
        c = conn(cluster, mode)

        def only_broker_0(c: str = c) -> bool:
            return ok(kctl(c, "brokers list")) == alone

        def unavailable_lines(c: str = c) -> str:
            return ok(kctl(c, "topics describe --unavailable-partitions"))

        wait_for(only_broker_0, f"broker 1 to leave ({mode})")
        unavailable = wait_for(unavailable_lines, f"'lonely' unavailable ({mode})")
        # One line; the ISR a leaderless partition keeps is the controller's business.
        assert unavailable.count("\n") == 1, unavailable
        assert unavailable.startswith("\tTopic: lonely\tPartition: 0\tLeader: none\tReplicas: 1\tIsr: "), unavailable

        def both_under(c: str = c) -> list[str]:
            lines = ok(kctl(c, "topics describe --under-replicated-partitions")).splitlines()
            both = [line for line in lines if "Topic: both" in line]
            return both if len(both) == 2 else []

        under = wait_for(both_under, f"both partitions of 'both' under-replicated ({mode})")
        assert under == [
            "\tTopic: both\tPartition: 0\tLeader: 0\tReplicas: 0,1\tIsr: 0",
            "\tTopic: both\tPartition: 1\tLeader: 0\tReplicas: 1,0\tIsr: 0",
        ], under


def test_the_root_without_brokers_names_the_chroot_that_has_them(cluster: LocalCluster) -> None:
    """``--zookeeper host:port`` without the cluster's chroot says where the brokers are
    instead of silently showing an empty cluster."""
    hosts, _, chroot = cluster.zk_connect.partition("/")
    zk = ZkClient(hosts)
    zk.start()
    try:
        assert f"/{chroot}" in zk.chroots_with_brokers()
    finally:
        zk.close()
    result = kctl(f"--zookeeper {hosts} topics list")  # the root: no chroot named
    assert result.returncode == 0, result.stderr
    assert f"kctl: no broker is registered at {hosts}; brokers are registered under" in result.stderr
    assert "(use --zookeeper " in result.stderr
    # With the right chroot: no hint.
    assert "no broker is registered" not in kctl(f"--zookeeper {cluster.zk_connect} topics list").stderr
