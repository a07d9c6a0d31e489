"""Real Apache ZooKeeper servers started from the jars of a local installation.

Like kazoo's own test harness: plain ``java -cp <jars> QuorumPeerMain zoo.cfg``
processes, one or an ensemble, on free ports of 127.0.0.1 (or given client ports). Jars
are looked for in ``$ZOOKEEPER_PATH`` then ``/usr/share/java`` (Debian's ``zookeeper``
package) and ``/usr/share/zookeeper``.

ZooKeeper logs through SLF4J; the classpath gets a binding that is installed next to the
jars (logback, else log4j 1.2 / reload4j, else slf4j-simple) and java is pointed at the
configuration shipped here (``zookeeper-logback.xml`` / ``zookeeper-log4j.properties``):
INFO and above to stdout, which is the server's ``zookeeper.log``.

Readiness is asked of the servers started here with ZooKeeper's four-letter word ``srvr``
(:func:`serving`; ``zoo.cfg`` allows it), over a plain socket: this module opens no
ZooKeeper session, so it does not go through :mod:`kbroker.cluster`, the only package
that talks to ZooKeeper as a client.

Thread safety: none needed; one owner drives the processes.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Collection
from pathlib import Path

from kbroker.local.netns import Host

JAR_DIRS = ("/usr/share/java", "/usr/share/zookeeper", "/usr/share/zookeeper/lib", "/opt/zookeeper/lib")


class ZooKeeperNotFound(RuntimeError):
    pass


def free_port(avoid: Collection[int] = ()) -> int:
    """A port of 127.0.0.1 that is free now (and not in ``avoid``)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Can a server bind ``host:port`` now? Probed as servers bind (SO_REUSEADDR), so a
    port held only by connections in TIME_WAIT counts as free and a listening one (on
    this address or a wildcard) does not."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


_LOGGING = (
    # (jars that must all be present, java options); the first complete set wins.
    (("logback-classic", "logback-core"), "-Dlogback.configurationFile={}", "zookeeper-logback.xml"),
    (("slf4j-reload4j", "reload4j"), "-Dlog4j.configuration=file:{}", "zookeeper-log4j.properties"),
    (("slf4j-log4j12", "log4j-1.2"), "-Dlog4j.configuration=file:{}", "zookeeper-log4j.properties"),
    (("slf4j-simple",), "-Dorg.slf4j.simpleLogger.logFile=System.out", ""),
)


def _jar(directory: str, name: str) -> str | None:
    """``name.jar`` (Debian's unversioned link) or else ``name-<version>.jar``."""
    plain = os.path.join(directory, f"{name}.jar")
    if os.path.exists(plain):
        return plain
    versioned = sorted(glob.glob(os.path.join(directory, f"{name}-[0-9]*.jar")))
    return versioned[-1] if versioned else None


def installation() -> tuple[list[str], list[str]]:
    """(classpath jars, java options) of the local ZooKeeper: its jars, SLF4J and a
    logging binding with the configuration shipped in this package."""
    dirs = [os.environ["ZOOKEEPER_PATH"]] if os.environ.get("ZOOKEEPER_PATH") else []
    dirs += list(JAR_DIRS)
    for d in dirs:
        jars = [j for j in glob.glob(os.path.join(d, "zookeeper*.jar")) if "contrib" not in j and "-it" not in j]
        if not any(os.path.basename(j).startswith("zookeeper") for j in jars):
            continue
        api = _jar(d, "slf4j-api")
        found = sorted(set(jars)) + ([api] if api else [])
        for names, option, config in _LOGGING:
            binding = [_jar(d, n) for n in names]
            if all(binding):
                path = str(Path(__file__).with_name(config)) if config else ""
                return found + [j for j in binding if j], [option.format(path)]
        return found, []
    raise ZooKeeperNotFound("no ZooKeeper jars found (install Debian's 'zookeeper' package or set ZOOKEEPER_PATH)")


def classpath() -> str:
    return os.pathsep.join(installation()[0])


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
        jars, logging_options = installation()
        with open(self.log_path, "ab") as out:
            cmd = [
                java,
                "-Xmx256m",
                "-Dzookeeper.admin.enableServer=false",
                *logging_options,
                "-cp",
                os.pathsep.join(jars),
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

    def serves_its_port(self) -> bool:
        """This process listens on the client port (unknowable inside another network
        namespace: assumed)."""
        if self.host is not None or self.proc is None:
            return True
        return self.proc.pid in pids_listening_on(self.client_port)

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
    ``client_ports`` (one per server) fixes the client ports; else free ones are picked.
    """

    def __init__(
        self, root: Path, size: int = 1, hosts: list[Host] | None = None, client_ports: list[int] | None = None
    ) -> None:
        self.root = Path(root)
        if hosts is not None and len(hosts) != size:
            raise ValueError(f"{size} ZooKeeper servers need {size} hosts, got {len(hosts)}")
        if client_ports is not None and len(client_ports) != size:
            raise ValueError(f"{size} ZooKeeper servers need {size} client ports, got {len(client_ports)}")
        placed: list[Host | None] = list(hosts) if hosts else [None] * size
        clients = list(client_ports) if client_ports else [free_port() for _ in range(size)]
        ports = [(clients[i], free_port(clients), free_port(clients)) for i in range(size)]
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
            if not all(s.serves_its_port() for s in self.servers):
                # Another ZooKeeper may answer on the port (a race for a fixed port):
                # ready means ours listens there; if it lost the race it exits, above.
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ZooKeeper not listening after {timeout_s}s:\n{tail(self.servers[0].log_path)}")
                time.sleep(0.2)
                continue
            if any(serving(s.address) for s in self.servers):  # a quorum, for an ensemble
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"ZooKeeper not ready after {timeout_s}s:\n{tail(self.servers[0].log_path)}")
            time.sleep(0.3)

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


def serving(address: str, timeout_s: float = 2.0) -> bool:
    """Does the ZooKeeper server at ``host:port`` serve clients? Its answer to ``srvr``
    names its mode (standalone, leader, follower) only then; before it has loaded its data,
    or while an ensemble has no quorum, it says it is not serving."""
    host, _, port = address.rpartition(":")
    answer = b""
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.sendall(b"srvr")
            while chunk := sock.recv(4096):  # the server closes the connection after answering
                answer += chunk
    except OSError:
        return False
    return b"Mode: " in answer


def pids_listening_on(port: int) -> set[int]:
    """The processes with a TCP socket listening on ``port`` (any address, this network
    namespace), from ``/proc/net/tcp{,6}`` and ``/proc/<pid>/fd``; only processes this
    user may inspect are seen."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # sl local_address rem_address st ... inode; st 0A is LISTEN
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    pids: set[int] = set()
    if not inodes:
        return pids
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
