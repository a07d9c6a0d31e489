"""A process that uses kclient can start subprocesses with ``preexec_fn`` (as PySpark starts
its JVM) while it produces: gRPC's fork handlers would kill a few in a hundred of those
children before their exec (grpc/grpc#43055), so importing kclient turns them off unless
the application set ``GRPC_ENABLE_FORK_SUPPORT`` itself."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from kbroker.local.cluster import LocalCluster

pytestmark = pytest.mark.integration

SPAWNS = 300

SCRIPT = textwrap.dedent(
    """
    import os, signal, subprocess, sys, threading
    from kclient import AdminClient, NewTopic, Producer

    bootstrap, spawns = sys.argv[1], int(sys.argv[2])
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic("spawning", num_partitions=2, replication_factor=1)])
    stop = threading.Event()
    acked = []

    def produce() -> None:
        with Producer(bootstrap_servers=bootstrap, linger_ms=0) as p:
            while not stop.is_set():
                acked.append(p.send("spawning", b"x").get(timeout=30))

    sender = threading.Thread(target=produce)
    sender.start()
    died = 0
    for _ in range(spawns):
        child = subprocess.Popen(
            ["true"], preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN), stderr=subprocess.DEVNULL
        )
        died += child.wait() != 0
    stop.set()
    sender.join()
    print(os.environ.get("GRPC_ENABLE_FORK_SUPPORT"), died, len(acked))
    """
)


def _run(cluster: LocalCluster, env: dict[str, str], spawns: int = SPAWNS) -> tuple[str, int, int]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, cluster.bootstrap, str(spawns)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    setting, died, acked = out.stdout.split()
    return setting, int(died), int(acked)


def test_subprocesses_started_with_preexec_fn_while_producing_all_run(cluster: LocalCluster) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    setting, died, acked = _run(cluster, env)
    assert acked > 0  # the channel was busy while the children were forked
    assert died == 0, f"{died} of {SPAWNS} children died before their exec"
    assert setting == "false"


def test_the_applications_own_setting_is_kept(cluster: LocalCluster) -> None:
    setting, _, _ = _run(cluster, {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "1"}, spawns=0)
    assert setting == "1"
