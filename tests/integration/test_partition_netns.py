"""The network-namespace harness itself: cuts are silent both ways, heal restores, nothing leaks."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from kbroker.local import netns

pytestmark = pytest.mark.integration

SERVE = "import socket,time;s=socket.socket();s.bind(('{ip}',5555));s.listen();time.sleep(60)"
PROBE = "import socket;s=socket.socket();s.settimeout(1);s.connect(('{ip}',5555));print('ok')"


@pytest.fixture
def net() -> Iterator[netns.Network]:
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    with netns.Network() as n:
        yield n


def reach(src: netns.Host, dst: netns.Host) -> str:
    proc = subprocess.run(src.wrap([sys.executable, "-c", PROBE.format(ip=dst.ip)]), capture_output=True, text=True)
    return proc.stdout.strip() or proc.stderr.strip().splitlines()[-1]


def serve(host: netns.Host) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(host.wrap([sys.executable, "-c", SERVE.format(ip=host.ip)]))
    deadline = time.monotonic() + 30  # a Python process starting on a loaded machine
    while reach(host, host) != "ok":
        assert time.monotonic() < deadline, "probe server did not start"
        time.sleep(0.05)
    return proc


def test_cut_is_silent_both_ways_and_heal_restores(net: netns.Network) -> None:
    a, b, c = net.add_host("a"), net.add_host("b"), net.add_host("c")
    servers = [serve(h) for h in (a, b, c)]
    try:
        assert reach(a, b) == reach(b, a) == reach(net.client, a) == "ok"
        net.isolate(a)
        # Silence, not a refusal or a local send error: the connect times out.
        assert "timed out" in reach(a, b) and "timed out" in reach(b, a) and "timed out" in reach(c, a)
        assert reach(net.client, a) == "ok", "isolate() keeps the client's path"
        assert reach(b, c) == "ok"
        net.heal()
        assert reach(a, b) == reach(b, a) == reach(c, a) == "ok"
        net.cut(a, [b])
        assert "timed out" in reach(a, b) and reach(a, c) == "ok"
    finally:
        net.heal()
        for s in servers:
            s.kill()
            s.wait()


def test_close_removes_everything_and_stale_runs_are_cleaned() -> None:
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    with netns.Network() as n:
        n.add_host("x")
        made = [n.hub, n.prefix + "x"]
        assert set(made) <= set(netns.namespaces())
    assert not set(made) & set(netns.namespaces())
    assert n.root_veth not in netns.run("ip", "-o", "link", "show")

    # A run that dies without tearing down (SIGKILL, power cut) leaves namespaces and a
    # process inside them behind; the next Network removes them.
    crash = (
        "import os,subprocess,sys;from kbroker.local import netns;n=netns.Network();h=n.add_host('y');"
        "subprocess.Popen(h.wrap(['sleep','60']),stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL);print(n.prefix,flush=True);os._exit(0)"
    )
    prefix = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True, check=True).stdout.strip()
    left = [ns for ns in netns.namespaces() if ns.startswith(prefix)]
    assert len(left) == 2
    pids = netns.run("ip", "netns", "pids", prefix + "y").split()
    assert pids
    removed = netns.cleanup_stale()
    assert set(left) <= set(removed)
    assert not [ns for ns in netns.namespaces() if ns.startswith(prefix)]
    deadline = time.monotonic() + 5
    while any(running(int(p)) for p in pids):
        assert time.monotonic() < deadline, f"processes of the stale run still alive: {pids}"
        time.sleep(0.05)


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's parent may be slow to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
