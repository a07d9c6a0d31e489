"""Real ``kbroker`` processes on 127.0.0.1, for scripts/run and integration tests.

Each broker runs as ``python -m kbroker.server`` with its own data directory and log
file under the cluster's root; it picks a free port itself (``--listen 127.0.0.1:0``)
and is ready when it prints ``kbroker <id> listening on HOST:PORT``.

With a :class:`~kbroker.local.netns.Network`, broker ``<id>`` runs in that network's
host ``b<id>`` (its own namespace, started under ``ip netns exec``) and listens on the
host's address, so partition tests can cut it off with iptables.

Thread safety: none; one owner drives the processes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from kbroker.local.netns import Host, Network
from kbroker.local.zookeeper import tail

READY = re.compile(rb"kbroker (\d+) listening on (\S+)(?: (\S+))?(?: kafka (\S+))?")
"""The broker's ready line: its inter-broker address, then every listener as NAME://host:port,
then (with kafka.listeners) ``kafka`` and every Kafka-protocol listener."""
METRICS = re.compile(rb"broker \d+ metrics: (http://\S+/metrics)")
"""The line a broker with ``metrics.port`` logs before it is ready."""


class BrokerProcess:
    def __init__(
        self,
        broker_id: int,
        root: Path,
        zk_connect: str,
        overrides: dict[str, str] | None = None,
        config_file: Path | None = None,
        host: Host | None = None,
    ) -> None:
        self.config_file = config_file
        self.host = host
        self.broker_id = broker_id
        self.root = root
        self.data_dir = root / f"broker-{broker_id}"
        self.log_path = root / f"broker-{broker_id}.log"
        self.zk_connect = zk_connect
        self.overrides = dict(overrides or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        """The inter-broker listener's address (host:port)."""
        self.listeners: dict[str, str] = {}
        """Every listener's advertised address by name (PLAINTEXT, SSL, ...)."""
        self.kafka_listeners: dict[str, str] = {}
        """Every Kafka-protocol listener's advertised address by name (kafka.listeners)."""
        self.metrics_url = ""
        """``http://host:port/metrics`` when the broker serves Prometheus metrics."""
        self._log_offset = 0

    def command(self) -> list[str]:
        cmd = self._command()
        return self.host.wrap(cmd) if self.host else cmd

    def _command(self) -> list[str]:
        if self.config_file is not None:
            return [sys.executable, "-m", "kbroker.server", str(self.config_file)]
        cmd = [
            sys.executable,
            "-m",
            "kbroker.server",
            "--broker-id",
            str(self.broker_id),
            "--zookeeper",
            self.zk_connect,
            "--data-dir",
            str(self.data_dir),
        ]
        # A restarted broker keeps the ports it bound the first time, as a broker host does
        # (clients and librdkafka's coordinator connections find it where it was).
        if "listeners" not in self.overrides:  # else the overrides name every listener
            cmd += ["--listen", self.address or f"{self.host.ip if self.host else '127.0.0.1'}:0"]
        for k, v in sorted(self.overrides.items()):
            if k == "kafka.listeners" and self.kafka_listeners:
                v = ",".join(self._same_port(item) for item in v.split(","))
            cmd += ["-o", f"{k}={v}"]
        return cmd

    def _same_port(self, listener: str) -> str:
        """``NAME://host:0`` as bound at the first start (``NAME://host:port``)."""
        name, sep, where = listener.partition("://")
        bound = self.kafka_listeners.get(name)
        if sep and bound and where.endswith(":0"):
            return f"{name}://{where.rsplit(':', 1)[0]}:{bound.rsplit(':', 1)[1]}"
        return listener

    def start(self, wait: bool = True, timeout_s: float = 60.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        if wait:
            self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                text = f.read()
            m = READY.search(text)
            if m:
                self.address = m.group(2).decode()
                metrics = METRICS.search(text)
                self.metrics_url = metrics.group(1).decode() if metrics else ""
                for group, found in ((3, self.listeners), (4, self.kafka_listeners)):
                    for item in (m.group(group) or b"").decode().split(","):
                        name, sep, where = item.partition("://")
                        if sep:
                            found[name] = where
                return self.address
            if not self.running():
                raise RuntimeError(f"broker {self.broker_id} exited with {self.returncode()}:\n{self.log_tail()}")
            time.sleep(0.05)
        raise RuntimeError(f"broker {self.broker_id} not ready after {timeout_s}s:\n{self.log_tail()}")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: int) -> None:
        if self.running():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (clean shutdown) and wait; SIGKILL if it hangs."""
        if self.proc is None:
            return None
        if self.running():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self) -> None:
        if self.running():
            assert self.proc is not None
            self.signal(signal.SIGKILL)
            self.proc.wait()

    def pause(self, timeout_s: float = 10.0) -> float:
        """SIGSTOP, then wait until every thread of the broker has stopped; how long that
        took (seconds). SIGSTOP is asynchronous: ``kill()`` returns once the signal is
        queued, and the kernel stops the threads one by one as each is next scheduled
        (1.5-6 ms on an idle 2-core machine, longer on a loaded one), time enough for a
        follower to take a write sent "after" the pause. Linux only (``/proc``)."""
        if not self.running():
            return 0.0
        assert self.proc is not None
        self.signal(signal.SIGSTOP)
        sent = time.monotonic()
        while True:
            states = thread_states(self.proc.pid)
            if states and all(s in "Tt" for s in states.values()):
                return time.monotonic() - sent
            if time.monotonic() - sent > timeout_s:
                running = {tid: s for tid, s in states.items() if s not in "Tt"}
                raise RuntimeError(
                    f"broker {self.broker_id}: threads still running {timeout_s} s after SIGSTOP: {running}"
                )
            time.sleep(0.001)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)


def thread_states(pid: int) -> dict[int, str]:
    """Each live thread of ``pid`` and its state letter (``/proc/<pid>/task/*/stat``)."""
    states: dict[int, str] = {}
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # the thread ended meanwhile
        state = text[text.rindex(")") + 2]
        if state not in "ZX":
            states[int(stat.parent.name)] = state
    return states


class LocalCluster:
    """N brokers sharing one ZooKeeper connect string, under ``root``.

    With ``network``, each broker runs in its own namespace of it (host ``b<id>``).
    """

    def __init__(
        self,
        root: Path,
        zk_connect: str,
        overrides: dict[str, str] | None = None,
        network: Network | None = None,
    ) -> None:
        self.root = Path(root)
        self.network = network
        self.zk_connect = zk_connect
        self.overrides = dict(overrides or {})
        self.brokers: dict[int, BrokerProcess] = {}

    def add_broker(self, broker_id: int | None = None, *, start: bool = True, **overrides: str) -> BrokerProcess:
        bid = broker_id if broker_id is not None else (max(self.brokers) + 1 if self.brokers else 0)
        host = self.network.add_host(f"b{bid}") if self.network else None
        b = BrokerProcess(bid, self.root, self.zk_connect, {**self.overrides, **overrides}, host=host)
        self.brokers[bid] = b
        if start:
            b.start()
        return b

    def start(self, n: int) -> LocalCluster:
        procs = [self.add_broker(start=False) for _ in range(n)]
        for b in procs:
            b.start(wait=False)
        for b in procs:
            b.wait_ready()
        return self

    @property
    def bootstrap(self) -> str:
        return ",".join(b.address for b in self.brokers.values() if b.running() and b.address)

    def kafka_bootstrap(self, listener: str = "PLAINTEXT") -> str:
        """The Kafka-protocol bootstrap list of the running brokers (kafka.listeners)."""
        return ",".join(
            b.kafka_listeners[listener] for b in self.brokers.values() if b.running() and listener in b.kafka_listeners
        )

    def stop(self) -> None:
        for b in self.brokers.values():
            b.stop()

    def logs(self) -> str:
        return "\n".join(
            f"----- broker {b.broker_id} ({b.log_path}) -----\n{b.log_tail(200)}" for b in self.brokers.values()
        )


def process_runs(pid: int, marker: bytes) -> bool:
    """Is ``pid`` alive and is ``marker`` part of its command line? (Guards against a
    recorded pid that the system has since given to another program.)"""
    if pid <= 0:
        return False
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: trust the pid
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
