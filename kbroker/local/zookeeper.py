"""Real Apache ZooKeeper servers started from the jars of a local installation.

Like kazoo's own test harness: plain ``java -cp <jars> QuorumPeerMain zoo.cfg``
processes, one or an ensemble, on free ports of 127.0.0.1. Jars are looked for in
``$ZOOKEEPER_PATH`` then ``/usr/share/java`` (Debian's ``zookeeper`` package) and
``/usr/share/zookeeper``.

Thread safety: none needed; one owner drives the processes.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from kazoo.client import KazooClient

from kbroker.local.netns import Host

JAR_DIRS = ("/usr/share/java", "/usr/share/zookeeper", "/usr/share/zookeeper/lib", "/opt/zookeeper/lib")


_PROBE_LOG = logging.getLogger("kbroker.local.zookeeper.probe")
_PROBE_LOG.setLevel(logging.CRITICAL)


class ZooKeeperNotFound(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def classpath() -> str:
    dirs = [os.environ["ZOOKEEPER_PATH"]] if os.environ.get("ZOOKEEPER_PATH") else []
    dirs += list(JAR_DIRS)
    for d in dirs:
        jars = [j for j in glob.glob(os.path.join(d, "zookeeper*.jar")) if "contrib" not in j and "-it" not in j]
        if any(os.path.basename(j).startswith("zookeeper") for j in jars):
            extra = [j for pat in ("slf4j-api*.jar", "slf4j-simple*.jar") for j in glob.glob(os.path.join(d, pat))]
            return os.pathsep.join(sorted(set(jars)) + sorted(set(extra))[:2])
    raise ZooKeeperNotFound("no ZooKeeper jars found (install Debian's 'zookeeper' package or set ZOOKEEPER_PATH)")


class ZooKeeperServer:
    """One ZooKeeper server process (standalone, or a member of an ensemble).

    ``host`` places it in a network namespace (:mod:`kbroker.local.netns`) and on that
    host's address; by default it runs here on 127.0.0.1. ``peers`` are (myid, ip,
    quorum port, election port).
    """

    def __init__(
        self,
        root: Path,
        myid: int,
        client_port: int,
        peers: list[tuple[int, str, int, int]] | None,
        host: Host | None = None,
    ) -> None:
        self.root = root
        self.myid = myid
        self.client_port = client_port
        self.peers = peers
        self.host = host
        self.ip = host.ip if host else "127.0.0.1"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root / "zookeeper.log"

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.client_port}"

    def _write_config(self) -> Path:
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        lines = [
            "tickTime=500",
            "initLimit=20",
            "syncLimit=10",
            f"dataDir={data}",
            f"clientPort={self.client_port}",
            f"clientPortAddress={self.ip}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "minSessionTimeout=1000",
            "maxSessionTimeout=60000",
        ]
        if self.peers:
            (data / "myid").write_text(str(self.myid))
            lines += [f"server.{i}={ip}:{p1}:{p2}" for i, ip, p1, p2 in self.peers]
        cfg = self.root / "zoo.cfg"
        cfg.write_text("\n".join(lines) + "\n")
        return cfg

    def start(self) -> None:
        cfg = self._write_config()
        java = shutil.which("java") or "java"
        with open(self.log_path, "ab") as out:
            cmd = [
                java,
                "-Xmx256m",
                "-Dzookeeper.admin.enableServer=false",
                "-cp",
                classpath(),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                str(cfg),
            ]
            self.proc = subprocess.Popen(
                self.host.wrap(cmd) if self.host else cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        if self.running():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class ZooKeeperEnsemble:
    """``size`` ZooKeeper servers under ``root`` (size 1 = standalone).

    With ``hosts`` (one per server), server i runs in the namespace of ``hosts[i]``.
    """

    def __init__(self, root: Path, size: int = 1, hosts: list[Host] | None = None) -> None:
        self.root = Path(root)
        if hosts is not None and len(hosts) != size:
            raise ValueError(f"{size} ZooKeeper servers need {size} hosts, got {len(hosts)}")
        placed: list[Host | None] = list(hosts) if hosts else [None] * size
        ports = [(free_port(), free_port(), free_port()) for _ in range(size)]
        ips = [h.ip if h else "127.0.0.1" for h in placed]
        peers = [(i + 1, ips[i], p[1], p[2]) for i, p in enumerate(ports)] if size > 1 else None
        self.servers = [
            ZooKeeperServer(self.root / f"zk{i + 1}", i + 1, p[0], peers, placed[i]) for i, p in enumerate(ports)
        ]

    @property
    def connect_string(self) -> str:
        return ",".join(s.address for s in self.servers)

    def start(self, timeout_s: float = 60.0) -> None:
        for s in self.servers:
            s.start()
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            dead = [s for s in self.servers if not s.running()]
            if dead:
                raise RuntimeError(f"ZooKeeper exited; see {dead[0].log_path}:\n{tail(dead[0].log_path)}")
            client = KazooClient(hosts=self.connect_string, timeout=5, logger=_PROBE_LOG)
            try:
                client.start(timeout=min(5, max(deadline - time.monotonic(), 0.5)))
                client.get_children("/")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"ZooKeeper not ready after {timeout_s}s:\n{tail(self.servers[0].log_path)}"
                    ) from None
                time.sleep(0.3)
            finally:
                client.stop()
                client.close()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
