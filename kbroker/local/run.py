"""``scripts/run``: a local ZooKeeper + brokers under ``./.run/``, left running.

``python -m kbroker.local.run [--brokers N] [--secure]`` starts ZooKeeper from the
installed jars and N brokers, creates the topic ``demo``, produces and consumes through
it, prints the addresses and exits with the cluster still running. ``--secure`` makes it
a TLS + SCRAM cluster with ACLs (:mod:`kbroker.local.secure`). ``--stop`` stops it
(clean SIGTERM shutdown). State lives in ``.run/cluster.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kbroker.local.cluster import BrokerProcess
from kbroker.local.secure import CLIENT_LISTENER, create_admin, prepare
from kbroker.local.zookeeper import ZooKeeperEnsemble

STATE = "cluster.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def stop(root: Path) -> int:
    state_file = root / STATE
    if not state_file.exists():
        print("no local cluster is running")
        return 0
    state = json.loads(state_file.read_text())
    brokers = [b["pid"] for b in state["brokers"]]
    zookeeper = state["zookeeper"]["pid"]
    # Brokers first, while ZooKeeper is up: their clean shutdown moves leadership away,
    # deregisters and writes the clean-shutdown marker. ZooKeeper last.
    for group, grace in ((brokers, 60), ([zookeeper], 15)):
        for pid in group:
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(_alive(p) for p in group) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in group:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    state_file.unlink()
    print("local cluster stopped")
    return 0


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
    if (root / STATE).exists():
        state = json.loads((root / STATE).read_text())
        if _alive(state["zookeeper"]["pid"]):
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
    setup = prepare(root / "secure") if secure else None
    zk = ZooKeeperEnsemble(root / "zookeeper", size=1)
    zk.start()
    zk_connect = zk.connect_string + "/kbroker"
    overrides: dict[str, str] = {}
    if setup is not None:
        os.environ["KBROKER_ZK_DIGEST"] = setup.zk_digest  # the brokers inherit it
        create_admin(zk_connect, setup)
        overrides = setup.broker_overrides
    procs = [BrokerProcess(i, root, zk_connect, overrides) for i in range(brokers)]
    for b in procs:
        b.start(wait=False)
    try:
        for b in procs:
            b.wait_ready()
    except RuntimeError as exc:
        print(f"run: {exc}", file=sys.stderr)
        for b in procs:
            b.stop()
        zk.stop()
        return 1
    bootstrap = ",".join(b.listeners[CLIENT_LISTENER] if setup else b.address for b in procs)
    server = zk.servers[0]
    assert server.proc is not None
    state = {
        "zookeeper": {"pid": server.proc.pid, "connect": zk_connect, "log": str(server.log_path)},
        "brokers": [
            {"id": b.broker_id, "pid": b.proc.pid if b.proc else -1, "address": b.address, "log": str(b.log_path)}
            for b in procs
        ],
        "bootstrap": bootstrap,
    }
    if setup is not None:
        state["command_config"] = str(setup.command_config)
    (root / STATE).write_text(json.dumps(state, indent=2))
    print(f"ZooKeeper: {zk_connect}   (log {server.log_path})")
    for b in procs:
        print(f"broker {b.broker_id}: {b.address}   (data {b.data_dir}, log {b.log_path})")
    demo(bootstrap, min(brokers, 3), setup.client_configs if setup else None)
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
    print("Stop it with: scripts/run --stop")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/run", description=__doc__)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--stop", action="store_true")
    parser.add_argument("--secure", action="store_true", help="TLS + SCRAM + ACLs, with a fresh local CA")
    parser.add_argument("--dir", type=Path, default=Path(".run"))
    args = parser.parse_args(argv)
    if args.stop:
        return stop(args.dir)
    if args.brokers < 1:
        parser.error("--brokers must be at least 1")
    return start(args.dir.resolve(), args.brokers, args.secure)


if __name__ == "__main__":
    sys.exit(main())
