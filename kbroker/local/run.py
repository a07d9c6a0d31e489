"""``scripts/run``: a local ZooKeeper + brokers under ``./.run/``, left running.

``python -m kbroker.local.run [--brokers N] [--secure]`` starts ZooKeeper from the
installed jars and N brokers, creates the topic ``demo``, produces and consumes through
it, prints the addresses and how long start-up took, and exits with the cluster still
running. ``--secure`` makes it a TLS + SCRAM cluster with ACLs (:mod:`kbroker.local.secure`).

Ports: ZooKeeper 2181; broker ``i`` serves gRPC clients on 9092+i (``PLAINTEXT``, or
``CLIENT`` with ``--secure``), Kafka-protocol clients on 29092+i (``kafka.listeners``, the
same listener name and security) and, with ``--secure``, brokers replicate over
``INTERNAL`` on 19092+i. A port that is taken is replaced by a free one, and one line
says so. A restarted broker keeps its ports.

``--restart N`` stops broker N cleanly (SIGTERM) and starts it again on the same ports
and data dir; ``--stop-broker N`` stops it. ``--stop`` stops the whole cluster (brokers
first, each with a clean SIGTERM shutdown, SIGKILL after a grace period; then ZooKeeper),
including brokers started by hand against its ZooKeeper chroot. State lives in
``.run/cluster.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kbroker.local.cluster import BrokerProcess, process_runs
from kbroker.local.secure import CLIENT_LISTENER, SecureSetup, create_admin, prepare
from kbroker.local.zookeeper import ZooKeeperEnsemble, free_port, pids_listening_on, port_free

STATE = "cluster.json"
HOST = "127.0.0.1"
ZK_PORT = 2181
CLIENT_PORT = 9092
"""Broker i's client listener (PLAINTEXT, or CLIENT with --secure): 9092 + i."""
INTERNAL_PORT = 19092
"""Broker i's INTERNAL (inter-broker) listener with --secure: 19092 + i."""
KAFKA_PORT = 29092
"""Broker i's Kafka-protocol listener (kafka.listeners): 29092 + i."""
KAFKA_DOOR = "kafka"
"""The key of the Kafka-protocol port among a broker's listener ports (not a listener name)."""
METRICS_PORT = 9404
"""Broker i's Prometheus metrics (metrics.port): 9404 + i, kept across --restart."""
METRICS = "metrics"
"""The key of the metrics port among a broker's ports (not a listener name)."""
CHROOT = "/kbroker"
BROKER_GRACE_S = 60.0
"""How long a broker gets for its clean shutdown before SIGKILL."""
ZK_GRACE_S = 15.0
BROKER_MARK = b"kbroker"
ZK_MARK = b"QuorumPeerMain"
_BROKER_DIR = re.compile(r"broker-(\d+)")
_PARTITION_DIR = re.compile(r".+-\d+")


# --- processes ------------------------------------------------------------------------


def terminate(pids: list[int], grace_s: float, marker: bytes) -> None:
    """SIGTERM every process of ``pids`` that still runs ``marker``; SIGKILL those still
    there after ``grace_s``."""
    live = [p for p in pids if process_runs(p, marker)]
    for pid in live:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(process_runs(p, marker) for p in live) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in live:
        if process_runs(pid, marker):
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# --- ports ----------------------------------------------------------------------------


def default_port(listener: str, broker_id: int) -> int:
    base = {"INTERNAL": INTERNAL_PORT, KAFKA_DOOR: KAFKA_PORT, METRICS: METRICS_PORT}.get(listener, CLIENT_PORT)
    return base + broker_id


class Ports:
    """Picks ports: the wanted one when it is free, else a free one; remembers which
    moved so that one line can say so. Never hands out a port twice."""

    def __init__(self) -> None:
        self.taken: set[int] = set()
        self.moved: list[str] = []

    def take(self, what: str, want: int) -> int:
        if want not in self.taken and port_free(want, HOST):
            self.taken.add(want)
            return want
        return self.instead(what, want)

    def instead(self, what: str, want: int) -> int:
        port = free_port(self.taken)
        self.taken.add(port)
        self.moved.append(f"{what} {want} -> {port}")
        return port

    def report(self) -> None:
        if self.moved:
            print(f"ports in use, took free ones instead: {', '.join(self.moved)}")
            self.moved.clear()


def listener_names(overrides: dict[str, str]) -> list[str]:
    """The listener names of ``overrides["listeners"]`` (``NAME://host:port,...``)."""
    spec = overrides.get("listeners", "")
    return [item.split("://", 1)[0].strip() for item in spec.split(",") if item.strip()] or ["PLAINTEXT"]


def with_ports(overrides: dict[str, str], ports: dict[str, int]) -> dict[str, str]:
    """The broker's settings: its listeners on these ports, the Kafka-protocol door on
    ``ports[KAFKA_DOOR]`` (as the clients' listener: PLAINTEXT, or CLIENT with --secure),
    and Prometheus metrics on ``ports[METRICS]`` (else a free port; the broker logs the
    URL; ``metrics`` in ``.run/cluster.json``)."""
    grpc = {name: port for name, port in ports.items() if name not in (KAFKA_DOOR, METRICS)}
    metrics = str(ports.get(METRICS, 0))
    out = {"metrics.port": metrics, **overrides, "listeners": ",".join(f"{n}://{HOST}:{p}" for n, p in grpc.items())}
    if KAFKA_DOOR in ports:
        client = CLIENT_LISTENER if CLIENT_LISTENER in grpc else "PLAINTEXT"
        out["kafka.listeners"] = f"{client}://{HOST}:{ports[KAFKA_DOOR]}"
    return out


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


# --- state ----------------------------------------------------------------------------


def load_state(root: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((root / STATE).read_text())
    except FileNotFoundError:
        return None
    return state


def save_state(root: Path, state: dict[str, Any]) -> None:
    client = state.get("client_listener", "PLAINTEXT")
    addresses = [b.get("listeners", {}).get(client, b["address"]) for b in state["brokers"]]
    running = [a for a, b in zip(addresses, state["brokers"], strict=True) if b.get("running", True)]
    state["bootstrap"] = ",".join(running or addresses)
    door = [(b.get("kafka", ""), b.get("running", True)) for b in state["brokers"]]
    state["kafka_bootstrap"] = ",".join([a for a, up in door if a and up] or [a for a, _ in door if a])
    tmp = root / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(root / STATE)


def broker_entry(b: BrokerProcess) -> dict[str, Any]:
    return {
        "id": b.broker_id,
        "pid": b.proc.pid if b.proc else -1,
        "running": True,
        "address": b.address,
        "listeners": dict(b.listeners) or {"PLAINTEXT": b.address},
        "kafka": next(iter(b.kafka_listeners.values()), ""),
        "metrics": b.metrics_url,
        "data": str(b.data_dir),
        "log": str(b.log_path),
    }


def _running_state(root: Path) -> dict[str, Any] | None:
    """The state of the cluster under ``root`` if its ZooKeeper still runs, else None
    (with one line saying so)."""
    state = load_state(root)
    if state is None or not process_runs(state["zookeeper"]["pid"], ZK_MARK):
        print("no local cluster is running (start one with scripts/run)")
        return None
    return state


# --- the cluster ----------------------------------------------------------------------


def leftover_brokers(root: Path, brokers: int) -> dict[int, int]:
    """Broker data dirs under ``root`` with an id of ``brokers`` or more: id -> how many
    partition replicas the dir holds."""
    found: dict[int, int] = {}
    for d in root.glob("broker-*"):
        m = _BROKER_DIR.fullmatch(d.name)
        if m and d.is_dir() and int(m.group(1)) >= brokers:
            found[int(m.group(1))] = sum(1 for p in d.iterdir() if p.is_dir() and _PARTITION_DIR.fullmatch(p.name))
    return dict(sorted(found.items()))


def warn_leftovers(root: Path, brokers: int) -> None:
    left = leftover_brokers(root, brokers)
    if not left:
        return
    ids = ", ".join(str(i) for i in left)
    earlier = max(left) + 1
    print(
        f"warning: {root} holds the data of broker{'s' if len(left) > 1 else ''} {ids} "
        f"({sum(left.values())} partition replicas) from an earlier cluster of {earlier} brokers, "
        f"and only {brokers} start now: partitions with replicas there will be under-replicated, "
        f"and offline where those brokers held the only in-sync replicas. "
        f"Use --brokers {earlier}, or delete {root} for a fresh cluster."
    )


def start_brokers(
    root: Path, zk_connect: str, overrides: dict[str, str], wanted: dict[int, dict[str, int]], ports: Ports
) -> list[BrokerProcess]:
    """Start the brokers of ``wanted`` (id -> listener ports) and wait until each is
    ready. A broker that loses a port to another process between the check and its
    bind is started once more on free ports. Raises RuntimeError, the brokers stopped."""
    procs = {bid: BrokerProcess(bid, root, zk_connect, with_ports(overrides, lp)) for bid, lp in wanted.items()}
    for b in procs.values():
        b.start(wait=False)
    try:
        for bid, b in procs.items():
            try:
                b.wait_ready()
            except RuntimeError as exc:
                if "cannot listen on" not in str(exc):
                    raise
                moved = {name: ports.instead(f"broker {bid} {name}", p) for name, p in wanted[bid].items()}
                ports.report()
                procs[bid] = BrokerProcess(bid, root, zk_connect, with_ports(overrides, moved))
                procs[bid].start(wait=True)
    except RuntimeError:
        for b in procs.values():
            b.stop()
        raise
    return list(procs.values())


def start_zookeeper(root: Path, ports: Ports) -> ZooKeeperEnsemble:
    port = ports.take("ZooKeeper", ZK_PORT)
    ports.report()
    zk = ZooKeeperEnsemble(root / "zookeeper", size=1, client_ports=[port])
    try:
        zk.start()
    except RuntimeError as exc:
        zk.stop()
        if "Address already in use" not in str(exc) and port_free(port, HOST):
            raise  # not a port taken since the check
        zk = ZooKeeperEnsemble(root / "zookeeper", size=1, client_ports=[ports.instead("ZooKeeper", port)])
        ports.report()
        zk.start()
    return zk


def _secure_overrides(root: Path) -> tuple[SecureSetup, dict[str, str]]:
    setup = prepare(root / "secure")
    os.environ["KBROKER_ZK_DIGEST"] = setup.zk_digest  # the brokers inherit it
    return setup, setup.broker_overrides


def demo(bootstrap: str, replication: int, client: dict[str, Any] | None = None) -> None:
    from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
    from kclient.errors import TopicAlreadyExistsError

    client = client or {}
    with AdminClient(bootstrap_servers=bootstrap, **client) as admin:
        try:
            admin.create_topics([NewTopic("demo", 3, replication)])
            print(f"created topic 'demo' (3 partitions, replication factor {replication})")
        except TopicAlreadyExistsError:
            print("topic 'demo' exists")
    with Producer(bootstrap_servers=bootstrap, acks="all", **client) as producer:
        metas = [producer.send("demo", f"hello {i}".encode(), key=f"user-{i % 3}".encode()) for i in range(9)]
        producer.flush()
        for m in metas:
            meta = m.get(10)
            print(f"  produced -> demo-{meta.partition} @ offset {meta.offset}")
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", **client) as consumer:
        consumer.assign([TopicPartition("demo", p) for p in range(3)])
        got = 0
        deadline = time.monotonic() + 15
        while got < 9 and time.monotonic() < deadline:
            for recs in consumer.poll(timeout_ms=500).values():
                for r in recs[-3:]:
                    print(f"  consumed <- demo-{r.partition} @ {r.offset}: {r.key!r} {r.value!r}")
                got += len(recs)
    print(f"consumed {got} records from 'demo'")


def start(root: Path, brokers: int, secure: bool = False) -> int:
    began = time.monotonic()
    state = load_state(root)
    if state is not None:
        if process_runs(state["zookeeper"]["pid"], ZK_MARK):
            print(f"a local cluster is already running (bootstrap {state['bootstrap']}); scripts/run --stop first")
            return 1
        (root / STATE).unlink()
    if not secure and (root / "secure" / "secrets.json").exists() and (root / "zookeeper").exists():
        print(
            f"{root} holds a secured cluster (its znodes need the credential): use scripts/run --secure, "
            f"or delete {root} for a fresh plaintext one"
        )
        return 1
    root.mkdir(parents=True, exist_ok=True)
    warn_leftovers(root, brokers)
    setup, overrides = _secure_overrides(root) if secure else (None, {})
    client_listener = CLIENT_LISTENER if setup is not None else "PLAINTEXT"
    ports = Ports()
    try:
        zk = start_zookeeper(root, ports)
    except RuntimeError as exc:
        print(f"run: {exc}", file=sys.stderr)
        return 1
    zk_connect = zk.connect_string + CHROOT
    try:
        if setup is not None:
            create_admin(zk_connect, setup)
        wanted = {
            i: {
                name: ports.take(f"broker {i} {name}", default_port(name, i))
                for name in [*listener_names(overrides), KAFKA_DOOR, METRICS]
            }
            for i in range(brokers)
        }
        ports.report()
        procs = start_brokers(root, zk_connect, overrides, wanted, ports)
    except RuntimeError as exc:
        print(f"run: {exc}", file=sys.stderr)
        zk.stop()
        return 1
    except BaseException:
        zk.stop()
        raise
    server = zk.servers[0]
    assert server.proc is not None
    state = {
        "zookeeper": {"pid": server.proc.pid, "connect": zk_connect, "log": str(server.log_path)},
        "brokers": [broker_entry(b) for b in procs],
        "client_listener": client_listener,
        "secure": setup is not None,
    }
    if setup is not None:
        state["command_config"] = str(setup.command_config)
    save_state(root, state)
    print(f"ZooKeeper: {zk_connect}   (log {server.log_path})")
    for b in procs:
        where = b.listeners.get(client_listener, b.address)
        door = next(iter(b.kafka_listeners.values()), "-")
        print(
            f"broker {b.broker_id}: {where}   (Kafka protocol {door}, metrics {b.metrics_url or '-'}, "
            f"data {b.data_dir}, log {b.log_path})"
        )
    print(f"cluster ready in {time.monotonic() - began:.1f} s")
    bootstrap = state["bootstrap"]
    failed = False
    try:
        demo(bootstrap, min(brokers, 3), setup.client_configs if setup else None)
    except Exception as exc:  # the cluster runs; say why the demo did not, in one line
        print(f"run: the demo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        failed = True
    print()
    print("The cluster keeps running. Try:")
    conn = f"--bootstrap-server {bootstrap}"
    if setup is not None:
        conn += f" --command-config {setup.command_config}"
        print(f"  (TLS + SCRAM: the admin user's client settings are in {setup.command_config};")
        print(f"   kctl --zookeeper needs KBROKER_ZK_DIGEST=$(cat {root}/secure/zk.digest))")
    print(f"  .venv/bin/kctl {conn} topics describe")
    print(f"  echo hi | .venv/bin/kctl produce {conn} --topic demo")
    print(f"  .venv/bin/kctl consume {conn} --topic demo --from-beginning --max-messages 10")
    if setup is None:
        print(f"  kcat -b {state['kafka_bootstrap']} -C -t demo -e    (any Kafka client: the Kafka-protocol door)")
    else:
        door = state["kafka_bootstrap"]
        print(f"  Kafka-protocol clients: {door} with the SASL_SSL settings of {setup.command_config}")
    print("Restart one broker: scripts/run --restart 0    Stop it: scripts/run --stop")
    return 1 if failed else 0


def _running_broker(root: Path, broker_id: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(state, the broker's entry) of the running cluster under ``root``, or None with
    one line saying why not."""
    state = _running_state(root)
    if state is None:
        return None
    entry = next((b for b in state["brokers"] if b["id"] == broker_id), None)
    if entry is None:
        ids = ", ".join(str(b["id"]) for b in state["brokers"])
        print(f"broker {broker_id} is not part of this cluster (its brokers: {ids})")
        return None
    return state, entry


def stop_broker(root: Path, broker_id: int) -> int:
    found = _running_broker(root, broker_id)
    if found is None:
        return 1
    state, entry = found
    if not process_runs(entry["pid"], BROKER_MARK):
        print(f"broker {broker_id} is not running")
    else:
        began = time.monotonic()
        terminate([entry["pid"]], BROKER_GRACE_S, BROKER_MARK)
        took = time.monotonic() - began
        print(f"broker {broker_id} stopped in {took:.1f} s; scripts/run --restart {broker_id} starts it again")
    entry.update(pid=-1, running=False)
    save_state(root, state)
    return 0


def restart(root: Path, broker_id: int) -> int:
    """Stop broker ``broker_id`` cleanly and start it again on its ports and data dir."""
    found = _running_broker(root, broker_id)
    if found is None:
        return 1
    state, entry = found
    began = time.monotonic()
    if process_runs(entry["pid"], BROKER_MARK):
        terminate([entry["pid"]], BROKER_GRACE_S, BROKER_MARK)
        print(f"broker {broker_id} stopped in {time.monotonic() - began:.1f} s")
    else:
        print(f"broker {broker_id} was not running")
    overrides: dict[str, str] = {}
    if state.get("secure"):
        overrides = _secure_overrides(root)[1]
    listeners: dict[str, str] = entry.get("listeners") or {"PLAINTEXT": entry["address"]}
    ports = Ports()
    wanted = {name: ports.take(f"broker {broker_id} {name}", _port(addr)) for name, addr in listeners.items()}
    if entry.get("kafka"):
        wanted[KAFKA_DOOR] = ports.take(f"broker {broker_id} Kafka protocol", _port(entry["kafka"]))
    if entry.get("metrics"):  # http://host:port/metrics: the scrape address stays valid
        wanted[METRICS] = ports.take(f"broker {broker_id} metrics", _port(entry["metrics"].rsplit("/", 1)[0]))
    ports.report()
    try:
        (b,) = start_brokers(root, state["zookeeper"]["connect"], overrides, {broker_id: wanted}, ports)
    except RuntimeError as exc:
        print(f"run: {exc}", file=sys.stderr)
        entry.update(pid=-1, running=False)
        save_state(root, state)
        return 1
    entry.update(broker_entry(b))
    save_state(root, state)
    client = b.listeners.get(state.get("client_listener", "PLAINTEXT"), b.address)
    print(f"broker {broker_id} running again on {client} in {time.monotonic() - began:.1f} s (data {b.data_dir})")
    return 0


def hand_started(root: Path, state: dict[str, Any], known: set[int]) -> list[tuple[int, int]]:
    """(broker id, pid) of kbroker processes registered in this cluster's ZooKeeper
    chroot that this script did not start (found by their listening ports)."""
    from kbroker.cluster.zk_client import ZkClient

    digest_file = root / "secure" / "zk.digest"
    digest = digest_file.read_text().strip() if digest_file.exists() else None
    zk = ZkClient(state["zookeeper"]["connect"], auth_digest=digest or None)
    try:
        zk.start(timeout_s=10)
        registered = zk.live_brokers()
    except Exception as exc:
        print(f"could not read the broker registrations in ZooKeeper ({exc}); stopping the brokers scripts/run started")
        return []
    finally:
        zk.close()
    found: list[tuple[int, int]] = []
    for bid, info in sorted(registered.items()):
        pids = {pid for e in info.endpoints for pid in pids_listening_on(e.port)}
        for pid in sorted(pids - known - {os.getpid()}):
            if process_runs(pid, BROKER_MARK):
                found.append((bid, pid))
    return found


def stop(root: Path) -> int:
    state = load_state(root)
    if state is None:
        print("no local cluster is running")
        return 0
    ours = [b["pid"] for b in state["brokers"] if b.get("running", True) and b["pid"] > 0]
    zookeeper = state["zookeeper"]["pid"]
    others: list[tuple[int, int]] = []
    if process_runs(zookeeper, ZK_MARK):
        others = hand_started(root, state, set(ours))
    for bid, pid in others:
        print(f"also stopping broker {bid} (pid {pid}), started by hand against {state['zookeeper']['connect']}")
    # Brokers first, while ZooKeeper is up: their clean shutdown moves leadership away,
    # deregisters and writes the clean-shutdown marker. ZooKeeper last.
    terminate(ours + [pid for _, pid in others], BROKER_GRACE_S, BROKER_MARK)
    terminate([zookeeper], ZK_GRACE_S, ZK_MARK)
    (root / STATE).unlink()
    print("local cluster stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--secure", action="store_true", help="TLS + SCRAM + ACLs, with a fresh local CA")
    parser.add_argument("--dir", type=Path, default=Path(".run"))
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--stop", action="store_true", help="stop the cluster (and brokers started by hand in it)")
    action.add_argument("--restart", type=int, metavar="N", help="restart broker N on its ports and data dir")
    action.add_argument("--stop-broker", type=int, metavar="N", help="stop broker N (clean shutdown)")
    args = parser.parse_args(argv)
    root = args.dir.resolve()
    if args.stop:
        return stop(root)
    if args.restart is not None:
        return restart(root, args.restart)
    if args.stop_broker is not None:
        return stop_broker(root, args.stop_broker)
    if args.brokers < 1:
        parser.error("--brokers must be at least 1")
    return start(root, args.brokers, args.secure)


if __name__ == "__main__":
    sys.exit(main())
