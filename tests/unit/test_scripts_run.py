"""Pieces of scripts/run that need no cluster: port choice, finding the process that
listens on a port, the leftover-broker warning, ZooKeeper's logging options."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from kbroker.local import run
from kbroker.local.cluster import process_runs
from kbroker.local.zookeeper import ZooKeeperNotFound, installation, pids_listening_on, port_free


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_ports_take_the_wanted_one_when_free_and_say_when_not(capsys: pytest.CaptureFixture[str]) -> None:
    with _listening() as held:
        busy = held.getsockname()[1]
        assert not port_free(busy)
        ports = run.Ports()
        moved = ports.take("broker 0 PLAINTEXT", busy)
        assert moved != busy and moved not in (0, busy)
        free = ports.instead("x", 1)  # any free port, never one handed out already
        assert free not in (moved, busy)
        ports.report()
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and f"broker 0 PLAINTEXT {busy} -> {moved}" in out[0]


def test_a_free_port_is_kept() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ports = run.Ports()
    assert ports.take("ZooKeeper", port) == port
    assert ports.moved == []


def test_listener_ports() -> None:
    assert run.listener_names({}) == ["PLAINTEXT"]
    secure = {"listeners": "INTERNAL://127.0.0.1:0,CLIENT://127.0.0.1:0"}
    assert run.listener_names(secure) == ["INTERNAL", "CLIENT"]
    assert [run.default_port(n, 2) for n in run.listener_names(secure)] == [19094, 9094]
    assert run.default_port("PLAINTEXT", 0) == 9092
    got = run.with_ports(secure, {"INTERNAL": 19092, "CLIENT": 9092})
    assert got["listeners"] == "INTERNAL://127.0.0.1:19092,CLIENT://127.0.0.1:9092"


def test_pids_listening_on_finds_this_process() -> None:
    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs /proc")
    with _listening() as held:
        port = held.getsockname()[1]
        assert os.getpid() in pids_listening_on(port)
    assert os.getpid() not in pids_listening_on(port)
    assert process_runs(os.getpid(), b"python")
    assert not process_runs(os.getpid(), b"no-such-program-name")
    assert not process_runs(-1, b"python")


def test_leftover_brokers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bid in range(3):
        (tmp_path / f"broker-{bid}" / "demo-0").mkdir(parents=True)
        (tmp_path / f"broker-{bid}" / "demo-1").mkdir()
    (tmp_path / "broker-2" / "recovery-point-offset-checkpoint").touch()
    (tmp_path / "broker-7.log").touch()
    assert run.leftover_brokers(tmp_path, 3) == {}
    assert run.leftover_brokers(tmp_path, 1) == {1: 2, 2: 2}
    run.warn_leftovers(tmp_path, 1)
    out = capsys.readouterr().out
    assert "brokers 1, 2" in out and "4 partition replicas" in out and "under-replicated" in out
    assert "--brokers 3" in out


def test_zookeeper_gets_a_logging_binding_and_config() -> None:
    try:
        jars, options = installation()
    except ZooKeeperNotFound as exc:
        pytest.skip(str(exc))
    names = [os.path.basename(j) for j in jars]
    assert any(n.startswith("slf4j-api") for n in names)
    assert len([n for n in names if n.startswith("slf4j-api")]) == 1
    assert options, names  # a binding was found, so ZooKeeper does not fall back to NOP
    config = options[0].split("=", 1)[1].removeprefix("file:")
    assert not config or Path(config).is_file()
