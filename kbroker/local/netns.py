"""A private network of Linux network namespaces, for partition tests.

Shape: a *hub* namespace holds a Linux bridge; every host (ZooKeeper, each broker) gets
its own namespace with one veth onto the bridge and one address of a private /24
(``10.237.N.0/24``, N chosen free at creation). The root namespace gets one more veth
onto the bridge (address ``.1``), so the test process itself (producer, consumer,
ZooKeeper client) reaches every host without running in a namespace. Processes are
started in a host's namespace with :meth:`Host.wrap` (``ip netns exec <ns> ...``).

Partitions are iptables DROP rules in a dedicated chain (``KBPART``, jumped to from
INPUT) inside the hosts' own namespaces: cutting A from B drops what A receives from B
*and* what B receives from A, so both sides see silence (a real partition: no RST, no
ICMP, TCP retransmits), never a local send error. :meth:`Network.heal` flushes the
chains. The root namespace's firewall is never touched, so the test's clients cannot
be cut off by this module (cut a broker from everyone *but* the client instead).

Names carry a per-process prefix ``kbn-<pid>-<n>-`` (root veth ``kbn<pid>r<n>``), so a
crashed run's leftovers are found and removed at the next start
(:func:`cleanup_stale`): namespaces whose owning pid is gone are emptied of their
processes (SIGKILL by pid) and deleted.

Needs root, ``ip`` (iproute2) and ``iptables``; :func:`unavailable` says why not.

Thread safety: none; one owner (the test) drives a :class:`Network`.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

FAMILY = "kbn"
CHAIN = "KBPART"
SUBNET_BASE = "10.237"
_NAME = re.compile(rf"^{FAMILY}-(\d+)-(\d+)-")
_ROOT_VETH = re.compile(rf"^{FAMILY}(\d+)r(\d+)")
_counter = itertools.count()


class NetnsError(RuntimeError):
    pass


def unavailable() -> str | None:
    """Why a :class:`Network` cannot be built here, or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed"
    return None


def run(*args: str, check: bool = True) -> str:
    """Run one command; raise :class:`NetnsError` with its stderr on failure."""
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetnsError(f"{' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def namespaces() -> list[str]:
    return [line.split()[0] for line in run("ip", "netns", "list").splitlines() if line.strip()]


def _kill_inside(ns: str) -> None:
    """SIGKILL the processes a namespace of ours still holds (by pid), and reap them."""
    for pid in (int(p) for p in run("ip", "netns", "pids", ns, check=False).split()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cleanup_stale() -> list[str]:
    """Delete namespaces and root veths left by runs whose process is gone; return their names."""
    removed: list[str] = []
    for ns in namespaces():
        m = _NAME.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            _kill_inside(ns)
            run("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    for line in run("ip", "-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        m = _ROOT_VETH.match(name)
        if m and not _pid_alive(int(m.group(1))):
            run("ip", "link", "del", name, check=False)
            removed.append(name)
    return removed


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 under 10.237/16 that no interface or route of the root namespace uses."""
    used = run("ip", "-4", "-o", "addr", "show") + run("ip", "-4", "route", "show")
    start = (os.getpid() + next(_counter)) % 256
    for i in range(256):
        n = (start + i) % 256
        if f"{SUBNET_BASE}.{n}." not in used:
            return ipaddress.IPv4Network(f"{SUBNET_BASE}.{n}.0/24")
    raise NetnsError(f"no free /24 under {SUBNET_BASE}.0.0/16")


@dataclass
class Host:
    """One namespace on the bridge. ``ns`` is None for the root namespace (the test)."""

    name: str
    ip: str
    ns: str | None
    cuts: set[str] = field(default_factory=set)

    def wrap(self, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run inside this host's namespace."""
        return list(cmd) if self.ns is None else ["ip", "netns", "exec", self.ns, *cmd]

    def iptables(self, *args: str) -> None:
        if self.ns is None:
            raise NetnsError("the root namespace's firewall is never touched")
        run("ip", "netns", "exec", self.ns, "iptables", "-w", *args)


class Network:
    """A bridge in a hub namespace, hosts in their own namespaces, the root ns on a veth.

    Invariants: every namespace and interface this object made has the run's prefix and
    is removed by :meth:`close` (idempotent; also use it as a context manager); partition
    rules only ever live in the ``KBPART`` chain of a host namespace.
    """

    def __init__(self) -> None:
        reason = unavailable()
        if reason:
            raise NetnsError(reason)
        cleanup_stale()
        n = next(_counter)
        self.prefix = f"{FAMILY}-{os.getpid()}-{n}-"
        self.root_veth = f"{FAMILY}{os.getpid()}r{n}"
        self.subnet = _free_subnet()
        self._addrs = self.subnet.hosts()
        self.hub = self.prefix + "hub"
        self.hosts: dict[str, Host] = {}
        self._made: list[str] = []
        self._closed = False
        try:
            self._ns_add(self.hub)
            run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            run("ip", "-n", self.hub, "link", "set", "br0", "up")
            root_ip = str(next(self._addrs))
            run("ip", "link", "add", self.root_veth, "type", "veth", "peer", "name", "v-root", "netns", self.hub)
            self._made.append(self.root_veth)
            run("ip", "-n", self.hub, "link", "set", "v-root", "master", "br0", "up")
            run("ip", "addr", "add", f"{root_ip}/{self.subnet.prefixlen}", "dev", self.root_veth)
            run("ip", "link", "set", self.root_veth, "up")
            self.client = Host("client", root_ip, None)
        except BaseException:
            self.close()
            raise

    def _ns_add(self, ns: str) -> None:
        run("ip", "netns", "add", ns)
        self._made.append(ns)
        run("ip", "-n", ns, "link", "set", "lo", "up")

    def add_host(self, name: str) -> Host:
        """The host ``name`` (created on first use): its namespace, veth and address."""
        if name in self.hosts:
            return self.hosts[name]
        if not re.fullmatch(r"[a-z0-9]{1,12}", name):
            raise ValueError(f"host name must be 1-12 of [a-z0-9]: {name!r}")
        ns = self.prefix + name
        self._ns_add(ns)
        ip = str(next(self._addrs))
        hub_end = f"v-{name}"
        run("ip", "-n", self.hub, "link", "add", hub_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
        run("ip", "-n", self.hub, "link", "set", hub_end, "master", "br0", "up")
        run("ip", "-n", ns, "addr", "add", f"{ip}/{self.subnet.prefixlen}", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        host = Host(name, ip, ns)
        host.iptables("-N", CHAIN)
        host.iptables("-I", "INPUT", "-j", CHAIN)
        self.hosts[name] = host
        return host

    def _host(self, h: Host | str) -> Host:
        return h if isinstance(h, Host) else self.hosts[h]

    def cut(self, a: Host | str, others: Iterable[Host | str]) -> None:
        """Drop all traffic between ``a`` and each of ``others``, both directions."""
        ha = self._host(a)
        for o in others:
            hb = self._host(o)
            if hb is ha or hb.name in ha.cuts:
                continue
            ha.iptables("-A", CHAIN, "-s", hb.ip, "-j", "DROP")
            hb.iptables("-A", CHAIN, "-s", ha.ip, "-j", "DROP")
            ha.cuts.add(hb.name)
            hb.cuts.add(ha.name)

    def lossy(self, a: Host | str, probability: float) -> None:
        """Drop each packet arriving at ``a`` with ``probability`` (iptables' statistic
        match), from every host and the root namespace alike; ``heal`` removes it."""
        ha = self._host(a)
        rule = ("-m", "statistic", "--mode", "random", "--probability", f"{probability:.4f}", "-j", "DROP")
        ha.iptables("-A", CHAIN, *rule)
        ha.cuts.add("*loss")

    def isolate(self, a: Host | str) -> None:
        """Cut ``a`` from every other host of the network except the root namespace (the client)."""
        ha = self._host(a)
        self.cut(ha, [h for h in self.hosts.values() if h is not ha])

    def heal(self) -> None:
        """Remove every partition rule."""
        for h in self.hosts.values():
            if h.cuts:
                h.iptables("-F", CHAIN)
                h.cuts.clear()

    def close(self) -> None:
        """Kill what still runs in our namespaces, delete them and the root veth."""
        if self._closed:
            return
        self._closed = True
        for name in reversed(self._made):
            if name == self.root_veth:
                run("ip", "link", "del", name, check=False)
            else:
                _kill_inside(name)
                run("ip", "netns", "del", name, check=False)

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
