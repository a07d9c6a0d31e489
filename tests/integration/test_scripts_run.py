"""``scripts/run`` (kbroker.local.run) as a user lives with it: fixed default ports with a
fallback that says so, ``--restart N`` on the same port and data, ``--stop-broker N``,
the warning about brokers of an earlier, larger cluster, ``--stop`` stopping a broker
started by hand against the cluster's ZooKeeper chroot, the ready-time line, and
ZooKeeper's own INFO log."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kbroker.local.cluster import BrokerProcess, process_runs
from kbroker.local.zookeeper import port_free
from kclient import Consumer, TopicPartition
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.integration


def run(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kbroker.local.run", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def state_of(root: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((root / "cluster.json").read_text())
    return state


def port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def alive(pid: int) -> bool:
    try:
        return b"kbroker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.fixture
def port_9092_taken() -> Iterator[None]:
    """9092 is in use during the test: held here when it is free (else someone holds it)."""
    holder = None
    if port_free(9092):
        holder = socket.socket()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no obstacle
        holder.bind(("127.0.0.1", 9092))
        holder.listen()
    try:
        yield
    finally:
        if holder is not None:
            holder.close()


def consume_all(bootstrap: str, want: int, timeout_s: float = 60) -> int:
    got = 0
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("demo", p) for p in range(3)])
        deadline = time.monotonic() + timeout_s
        while got < want and time.monotonic() < deadline:
            got += sum(len(recs) for recs in consumer.poll(timeout_ms=500).values())
    return got


def test_ports_fall_back_restart_keeps_port_and_data_stop_broker(tmp_path: Path, port_9092_taken: None) -> None:
    root = tmp_path / "run"
    try:
        started = run("--brokers", "2", "--dir", root)
        assert started.returncode == 0, started.stdout + started.stderr
        assert re.search(r"^cluster ready in \d+\.\d s$", started.stdout, re.M), started.stdout
        assert "consumed 9 records from 'demo'" in started.stdout
        state = state_of(root)
        b0, b1 = state["brokers"]
        port0 = port(b0["listeners"]["PLAINTEXT"])
        assert port0 != 9092
        moved = [line for line in started.stdout.splitlines() if line.startswith("ports in use")]
        assert len(moved) == 1 and f"broker 0 PLAINTEXT 9092 -> {port0}" in moved[0], started.stdout
        assert state["bootstrap"] == f"{b0['listeners']['PLAINTEXT']},{b1['listeners']['PLAINTEXT']}"
        # The Kafka-protocol door is open on every broker (29092 + i when free).
        assert state["kafka_bootstrap"] == f"{b0['kafka']},{b1['kafka']}"
        for b in (b0, b1):
            with WireClient(b["kafka"]) as w:
                assert int(w.call(18, 0, {}).error_code) == 0
        assert f"kcat -b {state['kafka_bootstrap']} -C -t demo -e" in started.stdout

        # ZooKeeper logs through a real binding now, not SLF4J's NOP logger.
        zk_log = Path(state["zookeeper"]["log"]).read_text()
        assert "no-operation (NOP) logger" not in zk_log
        assert re.search(r" INFO .*(binding to port|ZooKeeper audit|Snapshot|started)", zk_log), zk_log[-2000:]

        stopped = run("--stop-broker", "1", "--dir", root)
        assert stopped.returncode == 0 and "broker 1 stopped" in stopped.stdout, stopped.stdout + stopped.stderr
        after = state_of(root)
        assert not alive(b1["pid"])
        assert after["brokers"][1]["running"] is False
        assert after["bootstrap"] == b0["listeners"]["PLAINTEXT"]

        # Broker 0 is now the only replica left: after its restart, the demo records it
        # serves come from its own data dir, on the port it had.
        restarted = run("--restart", "0", "--dir", root)
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        assert f"broker 0 running again on {b0['listeners']['PLAINTEXT']}" in restarted.stdout
        new0 = state_of(root)["brokers"][0]
        assert new0["listeners"] == b0["listeners"] and new0["data"] == b0["data"]
        assert new0["kafka"] == b0["kafka"]
        assert new0["metrics"] == b0["metrics"] and b0["metrics"]  # a scrape config stays valid
        assert new0["pid"] != b0["pid"] and alive(new0["pid"]) and not alive(b0["pid"])
        assert consume_all(new0["listeners"]["PLAINTEXT"], 9) == 9

        back = run("--restart", "1", "--dir", root)
        assert back.returncode == 0 and "broker 1 was not running" in back.stdout, back.stdout + back.stderr
        final = state_of(root)
        assert final["brokers"][1]["listeners"] == b1["listeners"] and final["brokers"][1]["running"] is True
        assert run("--restart", "5", "--dir", root).returncode == 1
    finally:
        run("--stop", "--dir", root)
    assert not (root / "cluster.json").exists()
    assert not any(alive(b["pid"]) for b in final["brokers"])


def test_stop_also_stops_a_broker_started_by_hand_and_leftovers_warn(tmp_path: Path) -> None:
    root = tmp_path / "run"
    (root / "broker-3" / "demo-0").mkdir(parents=True)  # a broker of an earlier, larger cluster
    hand: BrokerProcess | None = None
    try:
        started = run("--dir", root)
        assert started.returncode == 0, started.stdout + started.stderr
        warning = [line for line in started.stdout.splitlines() if line.startswith("warning:")]
        assert len(warning) == 1 and "broker 3 " in warning[0] and "under-replicated" in warning[0], started.stdout
        state = state_of(root)

        hand = BrokerProcess(7, tmp_path / "hand", state["zookeeper"]["connect"])
        hand.start()
        assert hand.proc is not None
        stopped = run("--stop", "--dir", root)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"also stopping broker 7 (pid {hand.proc.pid})" in stopped.stdout, stopped.stdout
        assert hand.proc.wait(10) == 0, hand.log_tail()  # a clean SIGTERM shutdown
        assert not alive(state["brokers"][0]["pid"])
        assert not process_runs(state["zookeeper"]["pid"], b"QuorumPeerMain")
    finally:
        if hand is not None:
            hand.stop()
        run("--stop", "--dir", root)
