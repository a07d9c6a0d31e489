"""``kctl partitions reassign``: kafka-reassign-partitions.sh, over ``--zookeeper``.

Exactly one action:

- ``--generate --topics-to-move-json-file F --broker-list 1,2,3 [--disable-rack-aware]``
  prints the topics' current assignment and a proposal: balanced over the listed brokers,
  rack-aware when every broker has a rack, moving as few replicas as it can
  (:mod:`kbroker.cluster.replica_plan`; Kafka's proposal reassigns everything at random).
- ``--execute --reassignment-json-file F`` prints the current assignment of the listed
  partitions (keep it to roll back), then writes ``/admin/reassign_partitions``; the
  controller carries the moves out and removes the znode when all are done.
- ``--verify --reassignment-json-file F`` says, per partition, whether its move is complete.
- ``--cancel --reassignment-json-file F`` sends the moving partitions back to their
  original replicas (kbroker accepts this over ``--zookeeper``; Kafka needs the admin API).
- ``--list`` shows the moves in progress.

Files are Kafka's JSON: ``{"version":1,"topics":[{"topic":"foo"}]}`` and
``{"version":1,"partitions":[{"topic":"foo","partition":0,"replicas":[1,2],
"log_dirs":["any","any"]}]}`` (``log_dirs`` optional; kbroker has one data directory per
broker, so only ``"any"``). Output lines are kafka-reassign-partitions.sh's (Kafka 2.8).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kbroker.cli.common import CliError, UsageError, check_zookeeper
from kbroker.cluster.replica_plan import plan_decommission, propose_reassignment
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import TopicZNode
from kclient.errors import KafkaError

TopicPartition = tuple[str, int]
Plan = dict[TopicPartition, list[int]]

EXISTING = (
    "Cannot execute because there is an existing partition assignment.  Use --additional to override this and "
    "create a new partition assignment in addition to the existing one."
)


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    partitions = nouns.add_parser("partitions", help="partition placement: reassignment")
    verbs = partitions.add_subparsers(dest="verb", metavar="VERB", required=True)
    p = verbs.add_parser(
        "reassign",
        parents=[connection],
        help="move partition replicas between brokers (kafka-reassign-partitions.sh)",
        description="Generate, execute, verify, cancel or list partition reassignments.",
    )
    action = p.add_mutually_exclusive_group(required=True)
    for name, what in (
        ("generate", "propose a balanced assignment of --topics-to-move-json-file over --broker-list"),
        ("execute", "start the reassignment in --reassignment-json-file"),
        ("verify", "report whether the reassignment in --reassignment-json-file is done"),
        ("cancel", "send the moving partitions of --reassignment-json-file back to their original replicas"),
        ("list", "list the reassignments in progress"),
    ):
        action.add_argument(f"--{name}", action="store_true", help=what)
    p.add_argument("--topics-to-move-json-file", type=Path, help='{"version":1,"topics":[{"topic":"foo"}]}')
    p.add_argument("--reassignment-json-file", type=Path, help="Kafka's reassignment JSON")
    p.add_argument("--broker-list", help="brokers to spread the topics over, e.g. 1,2,3 (--generate)")
    p.add_argument("--disable-rack-aware", action="store_true", help="ignore broker racks (--generate)")
    p.set_defaults(handler=reassign)


# --- files ---------------------------------------------------------------------------


def _load(path: Path | None, flag: str) -> Any:
    if path is None:
        raise UsageError(f"this action needs {flag}")
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise CliError(f"{path} is not JSON: {exc}") from None


def parse_topics_to_move(doc: Any) -> list[str]:
    """The topic names of a topics-to-move file."""
    topics = doc.get("topics") if isinstance(doc, dict) else None
    if not isinstance(topics, list) or not topics:
        raise CliError('the topics-to-move file needs a non-empty "topics" list')
    names = []
    for entry in topics:
        name = entry.get("topic") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise CliError(f'each topics-to-move entry needs a "topic" name, got {entry!r}')
        names.append(name)
    return sorted(set(names))


def parse_reassignment(doc: Any) -> Plan:
    """(topic, partition) -> replicas of a reassignment file, checked as Kafka checks it."""
    entries = doc.get("partitions") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise CliError('the reassignment file needs a non-empty "partitions" list')
    plan: Plan = {}
    for e in entries:
        if not isinstance(e, dict):
            raise CliError(f"a reassignment entry must be an object, got {e!r}")
        topic, partition, replicas = e.get("topic"), e.get("partition"), e.get("replicas")
        if not isinstance(topic, str) or not isinstance(partition, int) or isinstance(partition, bool):
            raise CliError(f'each entry needs "topic" and an integer "partition", got {e!r}')
        if not isinstance(replicas, list) or not replicas:
            raise CliError(f"Partition {topic}-{partition} has an empty replica list")
        if not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in replicas):
            raise CliError(f"Partition {topic}-{partition} has an invalid replica list {replicas}")
        if len(set(replicas)) != len(replicas):
            raise CliError(f"Partition replica lists may not contain duplicate entries: {topic}-{partition}")
        dirs = e.get("log_dirs")
        if dirs is not None and (not isinstance(dirs, list) or any(d != "any" for d in dirs)):
            raise CliError(f'{topic}-{partition}: log_dirs other than "any" (kbroker has one data directory)')
        if (topic, partition) in plan:
            raise CliError(f"Duplicate reassignment of partition {topic}-{partition}")
        plan[(topic, partition)] = list(replicas)
    return plan


def to_json(plan: Mapping[TopicPartition, Sequence[int]]) -> str:
    """Kafka's compact reassignment JSON, partitions sorted."""
    entries = [
        {"topic": t, "partition": p, "replicas": list(rs), "log_dirs": ["any"] * len(rs)}
        for (t, p), rs in sorted(plan.items())
    ]
    return json.dumps({"version": 1, "partitions": entries}, separators=(",", ":"))


def _names(tps: Sequence[TopicPartition]) -> str:
    return ",".join(f"{t}-{p}" for t, p in sorted(tps))


def _ids(text: str | None) -> list[int]:
    items = [t.strip() for t in (text or "").split(",") if t.strip()]
    if not items or not all(t.isdigit() for t in items):
        raise UsageError(f"--broker-list expects broker ids like 1,2,3, got {text!r}")
    return [int(t) for t in items]


# --- actions -------------------------------------------------------------------------


def _current(znodes: Mapping[str, TopicZNode], tps: Sequence[TopicPartition]) -> Plan:
    out: Plan = {}
    for t, p in tps:
        z = znodes.get(t)
        if z is None or p not in z.partitions:
            raise CliError(f"Topic {t} or partition {t}-{p} not found")
        out[(t, p)] = list(z.partitions[p])
    return out


def _moving(znodes: Mapping[str, TopicZNode], zk: ZkClient) -> Plan:
    """Every partition being moved: the request znode and the topic znodes' adding/removing."""
    found = zk.reassignment_request()
    moving: Plan = dict(found[0]) if found else {}
    for t, z in znodes.items():
        for p in z.reassigning_partitions:
            moving.setdefault((t, p), z.target(p))
    return moving


def generate(zk: ZkClient, topics: list[str], brokers: list[int], rack_aware: bool) -> None:
    znodes = zk.all_topic_znodes()
    missing = [t for t in topics if t not in znodes]
    if missing:
        raise CliError(f"Topic(s) {', '.join(missing)} not found")
    current = {(t, p): list(rs) for t in topics for p, rs in znodes[t].partitions.items()}
    live = zk.live_brokers()
    unknown = [b for b in brokers if b not in live]
    if unknown:
        raise CliError(f"Unknown broker id {unknown[0]}")
    racks = {b: live[b].rack for b in brokers} if rack_aware else None
    print("Current partition replica assignment")
    print(to_json(current))
    print()
    print("Proposed partition reassignment configuration")
    print(to_json(propose_reassignment(current, brokers, racks)))


def execute(zk: ZkClient, plan: Plan) -> None:
    znodes = zk.all_topic_znodes()
    current = _current(znodes, sorted(plan))
    live = zk.live_brokers()
    for rs in plan.values():
        for b in rs:
            if b not in live:
                raise CliError(f"Unknown broker id {b}")
    if _moving(znodes, zk):
        raise CliError(EXISTING)
    print("Current partition replica assignment")
    print()
    print(to_json(current))
    print()
    print("Save this to use as the --reassignment-json-file option during rollback")
    zk.create_reassignment_request(plan)
    print(f"Successfully started partition reassignment{'s' if len(plan) > 1 else ''} for {_names(list(plan))}")


def verify(zk: ZkClient, plan: Plan) -> bool:
    """Prints each partition's state; True when every move is complete."""
    znodes = zk.all_topic_znodes()
    moving = _moving(znodes, zk)
    print("Status of partition reassignment:")
    done = True
    for (t, p), target in sorted(plan.items()):
        z = znodes.get(t)
        if z is None or p not in z.partitions:
            raise CliError(f"Topic {t} or partition {t}-{p} not found")
        if (t, p) in moving:
            print(f"Reassignment of partition {t}-{p} is still in progress.")
            done = False
        elif list(z.partitions[p]) == list(target):
            print(f"Reassignment of partition {t}-{p} is complete.")
        else:
            now = ",".join(map(str, z.partitions[p]))
            print(
                f"There is no active reassignment of partition {t}-{p}, but replica set is {now} rather than "
                f"{','.join(map(str, target))}."
            )
            done = False
    return done


def cancel(zk: ZkClient, plan: Plan) -> None:
    """Moving partitions go back to their original replicas (a new request the controller
    carries out); requested ones the controller has not started are dropped from the request."""
    znodes = zk.all_topic_znodes()
    found = zk.reassignment_request()
    request: Plan = dict(found[0]) if found else {}
    back: dict[TopicPartition, list[int] | None] = {}
    for t, p in sorted(plan):
        z = znodes.get(t)
        if z is not None and p in z.partitions and z.reassigning(p):
            back[(t, p)] = z.origin(p)
        elif (t, p) in request:
            back[(t, p)] = None
    if not back:
        print("None of the specified partition reassignments are active.")
        return
    wanted = {tp: rs for tp, rs in request.items() if tp not in back}
    wanted.update({tp: rs for tp, rs in back.items() if rs is not None})
    if found is None:
        zk.create_reassignment_request(wanted)
    elif wanted:
        zk.set_reassignment_request(wanted, found[1])
    else:
        zk.delete_reassignment_request(found[1])
    print(f"Successfully cancelled partition reassignment{'s' if len(back) > 1 else ''} for: {_names(list(back))}")


def list_moves(zk: ZkClient) -> None:
    znodes = zk.all_topic_znodes()
    rows = []
    for t in sorted(znodes):
        z = znodes[t]
        for p in z.reassigning_partitions:
            rows.append(
                f"{t}-{p}: replicas: {','.join(map(str, z.partitions[p]))}. "
                f"adding: {','.join(map(str, z.adding.get(p, [])))}. "
                f"removing: {','.join(map(str, z.removing.get(p, [])))}."
            )
    if not rows:
        print("No partition reassignments found.")
        return
    print("Current partition reassignments:")
    for row in rows:
        print(row)


def reassign(args: argparse.Namespace) -> int:
    if args.zookeeper is None:
        raise UsageError(
            "partitions reassign needs --zookeeper HOST:PORT[/chroot] (the admin API for reassignments "
            "is not built yet)"
        )
    zk = ZkClient(check_zookeeper(args.zookeeper))
    zk.start(timeout_s=10)
    try:
        if args.generate:
            if args.topics_to_move_json_file is None or args.broker_list is None:
                raise UsageError("--generate needs --topics-to-move-json-file and --broker-list")
            topics = parse_topics_to_move(_load(args.topics_to_move_json_file, "--topics-to-move-json-file"))
            generate(zk, topics, _ids(args.broker_list), not args.disable_rack_aware)
        elif args.list:
            list_moves(zk)
        else:
            plan = parse_reassignment(_load(args.reassignment_json_file, "--reassignment-json-file"))
            if args.execute:
                execute(zk, plan)
            elif args.verify:
                return 0 if verify(zk, plan) else 1
            else:
                cancel(zk, plan)
        return 0
    finally:
        zk.close()


def _holding(znodes: Mapping[str, TopicZNode], broker: int) -> Plan:
    return {(t, p): list(rs) for t, z in znodes.items() for p, rs in z.partitions.items() if broker in rs}


def decommission_broker(connect: str, broker: int, *, dry_run: bool, wait: bool, timeout_s: float) -> int:
    """``kctl brokers decommission``: see :mod:`kbroker.cli.brokers`."""
    zk = ZkClient(check_zookeeper(connect))
    zk.start(timeout_s=10)
    try:
        deadline = time.monotonic() + timeout_s
        announced = False
        while True:
            znodes = zk.all_topic_znodes()
            moving = _moving(znodes, zk)
            held = _holding(znodes, broker)
            if not held and not moving:
                print(f"Broker {broker} holds no partition replicas; it can be stopped.")
                return 0
            if not moving:
                live = {b: info.rack for b, info in zk.live_brokers().items()}
                try:
                    everything = {(t, p): list(rs) for t, z in znodes.items() for p, rs in z.partitions.items()}
                    plan = plan_decommission(everything, broker, live)
                except KafkaError as exc:
                    raise CliError(f"cannot decommission broker {broker}: {exc.message}") from None
                print("Current partition replica assignment")
                print(to_json(held))
                print()
                print("Proposed partition reassignment configuration")
                print(to_json(plan))
                if dry_run:
                    return 0
                zk.create_reassignment_request(plan)
                print(f"Started {len(plan)} partition reassignment(s) off broker {broker}")
                if not wait:
                    return 0
            elif not announced:
                print(f"Waiting for {len(moving)} partition reassignment(s)")
                announced = True
            if time.monotonic() > deadline:
                raise CliError(
                    f"broker {broker} still holds {len(held)} partition replica(s) after {timeout_s:.0f} s; "
                    "the moves go on (see partitions reassign --list)"
                )
            time.sleep(0.5)
    finally:
        zk.close()
