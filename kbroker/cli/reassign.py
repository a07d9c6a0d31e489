"""``kctl partitions reassign``: kafka-reassign-partitions.sh, over ``--bootstrap-server``
(AlterPartitionReassignments / ListPartitionReassignments at the controller) or
``--zookeeper`` (the ``/admin/reassign_partitions`` znode and the topic znodes).

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
  original replicas (kbroker accepts this over ``--zookeeper`` too; Kafka needs the admin API).
- ``--list`` shows the moves in progress.

``--execute --throttle BYTES/s`` (Kafka's replication throttle, KIP-73) sets, per moving
topic, ``leader.replication.throttled.replicas`` (the partitions' current replicas) and
``follower.replication.throttled.replicas`` (the replicas being added), and on every broker
involved ``leader.`` and ``follower.replication.throttled.rate``. Only the moving replicas
that are not yet in sync are slowed; normal replication never is. ``--verify``, once every
move is complete, and ``--cancel`` remove those throttles from every live broker and the
listed topics ("Clearing broker-level throttles on brokers 1,2,3"), unless
``--preserve-throttles``.

Files are Kafka's JSON: ``{"version":1,"topics":[{"topic":"foo"}]}`` and
``{"version":1,"partitions":[{"topic":"foo","partition":0,"replicas":[1,2],
"log_dirs":["any","any"]}]}`` (``log_dirs`` optional; kbroker has one data directory per
broker, so only ``"any"``). Output lines are kafka-reassign-partitions.sh's (Kafka 2.8),
including what differs between its two modes: over ``--bootstrap-server``, ``--verify``
ends with a blank line and ``--cancel`` with "None of the specified partition moves are
active." (Kafka's empty report of log-directory moves).
"""

from __future__ import annotations

import argparse
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kbroker.cli.backends import connect_zookeeper, zookeeper_credential
from kbroker.cli.common import CliError, UsageError, check_bootstrap, check_zookeeper, client_configs
from kbroker.cluster.config_admin import AlterOp, ConfigAdmin, OpType, ResourceType
from kbroker.cluster.replica_plan import plan_decommission, propose_reassignment
from kbroker.config import THROTTLE_RATE_KEYS
from kclient.admin import AdminClient
from kclient.errors import KafkaError
from kclient.proto.kbroker.v1 import config_pb2

TopicPartition = tuple[str, int]
Plan = dict[TopicPartition, list[int]]
Moves = dict[TopicPartition, tuple[list[int], list[int], list[int]]]
"""Ongoing moves: (replicas, adding replicas, removing replicas) per partition."""

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
    add_throttle_flags(p)
    p.set_defaults(handler=reassign)


def add_throttle_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--throttle",
        type=int,
        default=-1,
        metavar="BYTES/s",
        help="bound the moves' replication traffic on each broker involved (--execute; default: none)",
    )
    p.add_argument(
        "--preserve-throttles", action="store_true", help="leave the throttles in place (--verify, --cancel)"
    )


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


# --- where the assignments live -------------------------------------------------------


class Source(ABC):
    """Where the command reads assignments and starts or cancels moves: ZooKeeper or the
    controller's admin RPCs. One per command run; not thread-safe."""

    bootstrap: bool
    """True over --bootstrap-server (Kafka's output differs slightly between the modes)."""

    @abstractmethod
    def assignments(self) -> dict[str, dict[int, list[int]]]:
        """Every topic's replicas per partition (while moving: the original and the target ones)."""

    @abstractmethod
    def live_brokers(self) -> dict[int, str | None]:
        """Live broker id -> rack."""

    @abstractmethod
    def ongoing(self) -> Moves:
        """The moves the controller has started."""

    @abstractmethod
    def moving(self) -> Plan:
        """Every partition with a move requested or running -> its target replicas."""

    @abstractmethod
    def start(self, plan: Plan) -> None:
        """Start the moves (CliError naming every refused partition)."""

    @abstractmethod
    def cancel(self, tps: Sequence[TopicPartition]) -> list[TopicPartition]:
        """Cancel the moves of ``tps`` that are requested or running; returns those."""

    @abstractmethod
    def alter_configs(self, rtype: ResourceType, name: str, ops: list[AlterOp]) -> None:
        """IncrementalAlterConfigs of one topic or broker (a typed error if refused)."""

    @abstractmethod
    def topic_overrides(self, topic: str) -> dict[str, str]:
        """The topic's own configs (``/config/topics/<t>``)."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ZooKeeperSource(Source):
    """``/admin/reassign_partitions`` and the topic znodes (the controller carries moves out)."""

    bootstrap = False

    def __init__(self, connect: str) -> None:
        self.zk = connect_zookeeper(check_zookeeper(connect), credential=zookeeper_credential())

    def assignments(self) -> dict[str, dict[int, list[int]]]:
        return {t: {p: list(rs) for p, rs in z.partitions.items()} for t, z in self.zk.all_topic_znodes().items()}

    def live_brokers(self) -> dict[int, str | None]:
        return {b: info.rack for b, info in self.zk.live_brokers().items()}

    def ongoing(self) -> Moves:
        out: Moves = {}
        for t, z in self.zk.all_topic_znodes().items():
            for p in z.reassigning_partitions:
                out[(t, p)] = (list(z.partitions[p]), list(z.adding.get(p, [])), list(z.removing.get(p, [])))
        return out

    def moving(self) -> Plan:
        """The request znode's partitions and the topic znodes' adding/removing."""
        found = self.zk.reassignment_request()
        moving: Plan = dict(found[0]) if found else {}
        for t, z in self.zk.all_topic_znodes().items():
            for p in z.reassigning_partitions:
                moving.setdefault((t, p), z.target(p))
        return moving

    def start(self, plan: Plan) -> None:
        self.zk.create_reassignment_request(plan)

    def cancel(self, tps: Sequence[TopicPartition]) -> list[TopicPartition]:
        """Moving partitions go back to their original replicas (a new request the controller
        carries out); requested ones the controller has not started are dropped from the request."""
        znodes = self.zk.all_topic_znodes()
        found = self.zk.reassignment_request()
        request: Plan = dict(found[0]) if found else {}
        back: dict[TopicPartition, list[int] | None] = {}
        for t, p in sorted(tps):
            z = znodes.get(t)
            if z is not None and p in z.partitions and z.reassigning(p):
                back[(t, p)] = z.origin(p)
            elif (t, p) in request:
                back[(t, p)] = None
        if not back:
            return []
        wanted = {tp: rs for tp, rs in request.items() if tp not in back}
        wanted.update({tp: rs for tp, rs in back.items() if rs is not None})
        if found is None:
            self.zk.create_reassignment_request(wanted)
        elif wanted:
            self.zk.set_reassignment_request(wanted, found[1])
        else:
            self.zk.delete_reassignment_request(found[1])
        return list(back)

    def alter_configs(self, rtype: ResourceType, name: str, ops: list[AlterOp]) -> None:
        ConfigAdmin(self.zk).incremental_alter(rtype, name, ops)

    def topic_overrides(self, topic: str) -> dict[str, str]:
        return self.zk.entity_config("topics", topic)[0]

    def close(self) -> None:
        self.zk.close()


class AdminSource(Source):
    """The admin RPCs: DescribeTopics, Metadata, and the reassignment RPCs at the controller."""

    bootstrap = True

    def __init__(self, bootstrap: str, configs: Mapping[str, Any] | None = None) -> None:
        self.admin = AdminClient(check_bootstrap(bootstrap), **dict(configs or {}))

    def assignments(self) -> dict[str, dict[int, list[int]]]:
        return {d.name: {p.partition: list(p.replicas) for p in d.partitions} for d in self.admin.describe_topics()}

    def live_brokers(self) -> dict[int, str | None]:
        return {b.node_id: b.rack for b in self.admin.describe_cluster()[0]}

    def ongoing(self) -> Moves:
        return {(tp.topic, tp.partition): m for tp, m in self.admin.list_partition_reassignments().items()}

    def moving(self) -> Plan:
        """The controller keeps the target first in the replicas of a moving partition."""
        return {tp: [b for b in rs if b not in removing] for tp, (rs, _, removing) in self.ongoing().items()}

    def start(self, plan: Plan) -> None:
        _raise_errors("Error reassigning partition(s):", self.admin.alter_partition_reassignments(dict(plan)))

    def cancel(self, tps: Sequence[TopicPartition]) -> list[TopicPartition]:
        ongoing = self.ongoing()
        active = [tp for tp in sorted(tps) if tp in ongoing]
        if active:
            results = self.admin.alter_partition_reassignments(dict.fromkeys(active))
            _raise_errors("Error cancelling partition reassignment(s) for:", results)
        return active

    def alter_configs(self, rtype: ResourceType, name: str, ops: list[AlterOp]) -> None:
        self.admin.incremental_alter_configs({(int(rtype), name): [(o.name, int(o.op), o.value) for o in ops]})

    def topic_overrides(self, topic: str) -> dict[str, str]:
        key = (int(ResourceType.TOPIC), topic)
        entries = self.admin.describe_configs([key])[key]
        return {k: e.value for k, e in entries.items() if e.config_source == config_pb2.TOPIC_CONFIG}

    def close(self) -> None:
        self.admin.close()


def _raise_errors(what: str, results: Mapping[Any, Exception | None]) -> None:
    failed = [f"{tp[0]}-{tp[1]}: {err}" for tp, err in sorted(results.items()) if err is not None]
    if failed:
        raise CliError(f"{what} {'; '.join(failed)}")


def open_source(zookeeper: str | None, bootstrap: str | None, configs: Mapping[str, Any] | None = None) -> Source:
    """The source for exactly one of ``--zookeeper`` / ``--bootstrap-server`` (``configs``:
    the client settings, :func:`kbroker.cli.common.client_configs`)."""
    if (zookeeper is None) == (bootstrap is None):
        which = "both" if zookeeper is not None else "neither"
        raise UsageError(f"give exactly one of --zookeeper or --bootstrap-server ({which} given)")
    return ZooKeeperSource(zookeeper) if zookeeper is not None else AdminSource(bootstrap or "", configs)


# --- actions -------------------------------------------------------------------------


def _current(assignments: Mapping[str, Mapping[int, list[int]]], tps: Sequence[TopicPartition]) -> Plan:
    out: Plan = {}
    for t, p in tps:
        parts = assignments.get(t)
        if parts is None or p not in parts:
            raise CliError(f"Topic {t} or partition {t}-{p} not found")
        out[(t, p)] = list(parts[p])
    return out


def generate(src: Source, topics: list[str], brokers: list[int], rack_aware: bool) -> None:
    assignments = src.assignments()
    missing = [t for t in topics if t not in assignments]
    if missing:
        raise CliError(f"Topic(s) {', '.join(missing)} not found")
    current = {(t, p): list(rs) for t in topics for p, rs in assignments[t].items()}
    live = src.live_brokers()
    unknown = [b for b in brokers if b not in live]
    if unknown:
        raise CliError(f"Unknown broker id {unknown[0]}")
    racks = {b: live[b] for b in brokers} if rack_aware else None
    print("Current partition replica assignment")
    print(to_json(current))
    print()
    print("Proposed partition reassignment configuration")
    print(to_json(propose_reassignment(current, brokers, racks)))


# --- throttles (KIP-73) -----------------------------------------------------------------

LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"
VERIFY_WARNING = (
    "Warning: You must run --verify periodically, until the reassignment completes, to ensure the throttle is removed."
)


def throttled_replicas(current: Mapping[TopicPartition, list[int]], plan: Plan) -> dict[str, tuple[str, str]]:
    """Per moving topic: (leader list = the current replicas of its moving partitions,
    follower list = the replicas being added), Kafka's ``partition:broker`` form."""
    leader: dict[str, list[str]] = {}
    follower: dict[str, list[str]] = {}
    for (t, p), target in sorted(plan.items()):
        now = current[(t, p)]
        if list(now) == list(target):
            continue
        leader.setdefault(t, []).extend(f"{p}:{b}" for b in now)
        follower.setdefault(t, []).extend(f"{p}:{b}" for b in target if b not in now)
    return {t: (",".join(leader[t]), ",".join(follower.get(t, []))) for t in leader}


def set_throttles(src: Source, current: Mapping[TopicPartition, list[int]], plan: Plan, rate: int) -> None:
    for topic, (leaders, followers) in throttled_replicas(current, plan).items():
        ops = [AlterOp(LEADER_REPLICAS, OpType.SET, leaders)]
        ops.append(
            AlterOp(FOLLOWER_REPLICAS, OpType.SET, followers)
            if followers
            else AlterOp(FOLLOWER_REPLICAS, OpType.DELETE)
        )
        src.alter_configs(ResourceType.TOPIC, topic, ops)
    brokers = sorted({b for tp, rs in plan.items() for b in (*rs, *current[tp])})
    for b in brokers:
        src.alter_configs(ResourceType.BROKER, str(b), [AlterOp(k, OpType.SET, str(rate)) for k in THROTTLE_RATE_KEYS])
    print(f"The inter-broker throttle limit was set to {rate} B/s")


def clear_throttles(src: Source, plan: Plan) -> None:
    """Kafka's clearAllThrottles: every live broker and the plan's brokers, the plan's topics;
    only when one of those topics carries a throttled-replicas list (so a move that was never
    throttled touches no broker, and a paused broker does not fail its --cancel)."""
    topics = sorted({t for t, _ in plan})
    if not any({LEADER_REPLICAS, FOLLOWER_REPLICAS} & set(src.topic_overrides(t)) for t in topics):
        return
    brokers = sorted(set(src.live_brokers()) | {b for rs in plan.values() for b in rs})
    print(f"Clearing broker-level throttles on broker{'' if len(brokers) == 1 else 's'} {','.join(map(str, brokers))}")
    for b in brokers:
        src.alter_configs(ResourceType.BROKER, str(b), [AlterOp(k, OpType.DELETE) for k in THROTTLE_RATE_KEYS])
    print(f"Clearing topic-level throttles on topic{'' if len(topics) == 1 else 's'} {','.join(topics)}")
    for t in topics:
        src.alter_configs(
            ResourceType.TOPIC, t, [AlterOp(LEADER_REPLICAS, OpType.DELETE), AlterOp(FOLLOWER_REPLICAS, OpType.DELETE)]
        )


def execute(src: Source, plan: Plan, throttle: int = -1) -> None:
    if src.moving():  # checked first, as Kafka
        raise CliError(EXISTING)
    current = _current(src.assignments(), sorted(plan))
    live = src.live_brokers()
    for rs in plan.values():
        for b in rs:
            if b not in live:
                raise CliError(f"Unknown broker id {b}")
    print("Current partition replica assignment")
    print()
    print(to_json(current))
    print()
    print("Save this to use as the --reassignment-json-file option during rollback")
    if throttle >= 0:
        print(VERIFY_WARNING)
        set_throttles(src, current, plan, throttle)
    src.start(plan)
    print(f"Successfully started partition reassignment{'s' if len(plan) > 1 else ''} for {_names(list(plan))}")


def verify(src: Source, plan: Plan, preserve_throttles: bool = False) -> bool:
    """Prints each partition's state; True when every move is complete (then the throttles
    are removed unless ``preserve_throttles``)."""
    assignments = src.assignments()
    moving = src.moving()
    print("Status of partition reassignment:")
    done = True
    for (t, p), target in sorted(plan.items()):
        parts = assignments.get(t)
        if parts is None or p not in parts:
            raise CliError(f"Topic {t} or partition {t}-{p} not found")
        if (t, p) in moving:
            print(f"Reassignment of partition {t}-{p} is still in progress.")
            done = False
        elif list(parts[p]) == list(target):
            print(f"Reassignment of partition {t}-{p} is complete.")
        else:
            now = ",".join(map(str, parts[p]))
            print(
                f"There is no active reassignment of partition {t}-{p}, but replica set is {now} rather than "
                f"{','.join(map(str, target))}."
            )
            done = False
    if src.bootstrap:
        print()  # Kafka's (empty) report of replica log-directory moves
    if done and not preserve_throttles:
        clear_throttles(src, plan)
    return done


def cancel(src: Source, plan: Plan, preserve_throttles: bool = False) -> None:
    cancelled = src.cancel(sorted(plan))
    if cancelled:
        s = "s" if len(cancelled) > 1 else ""
        print(f"Successfully cancelled partition reassignment{s} for: {_names(cancelled)}")
    else:
        print("None of the specified partition reassignments are active.")
    if src.bootstrap:
        print("None of the specified partition moves are active.")
    if not preserve_throttles:
        clear_throttles(src, plan)


def list_moves(src: Source) -> None:
    ongoing = src.ongoing()
    if not ongoing:
        print("No partition reassignments found.")
        return
    print("Current partition reassignments:")
    for (t, p), (replicas, adding, removing) in sorted(ongoing.items()):
        print(
            f"{t}-{p}: replicas: {','.join(map(str, replicas))}. adding: {','.join(map(str, adding))}. "
            f"removing: {','.join(map(str, removing))}."
        )


def reassign(args: argparse.Namespace) -> int:
    with open_source(args.zookeeper, args.bootstrap_server, client_configs(args)) as src:
        if args.generate:
            if args.topics_to_move_json_file is None or args.broker_list is None:
                raise UsageError("--generate needs --topics-to-move-json-file and --broker-list")
            topics = parse_topics_to_move(_load(args.topics_to_move_json_file, "--topics-to-move-json-file"))
            generate(src, topics, _ids(args.broker_list), not args.disable_rack_aware)
        elif args.list:
            list_moves(src)
        else:
            plan = parse_reassignment(_load(args.reassignment_json_file, "--reassignment-json-file"))
            if args.execute:
                execute(src, plan, check_throttle(args.throttle))
            elif args.verify:
                return 0 if verify(src, plan, args.preserve_throttles) else 1
            else:
                cancel(src, plan, args.preserve_throttles)
        return 0


def check_throttle(value: int) -> int:
    if value < -1:
        raise UsageError(f"--throttle must be a rate in bytes/s (or -1 for none), got {value}")
    return value


def _holding(assignments: Mapping[str, Mapping[int, list[int]]], broker: int) -> Plan:
    return {(t, p): list(rs) for t, parts in assignments.items() for p, rs in parts.items() if broker in rs}


def decommission_broker(
    src: Source,
    broker: int,
    *,
    dry_run: bool,
    wait: bool,
    timeout_s: float,
    throttle: int = -1,
    preserve_throttles: bool = False,
) -> int:
    """``kctl brokers decommission``: see :mod:`kbroker.cli.brokers`."""
    deadline = time.monotonic() + timeout_s
    announced = False
    started: Plan = {}
    while True:
        assignments = src.assignments()
        moving = src.moving()
        held = _holding(assignments, broker)
        if not held and not moving:
            if started and throttle >= 0 and not preserve_throttles:
                clear_throttles(src, started)
            print(f"Broker {broker} holds no partition replicas; it can be stopped.")
            return 0
        if not moving:
            try:
                everything = {(t, p): list(rs) for t, parts in assignments.items() for p, rs in parts.items()}
                plan = plan_decommission(everything, broker, src.live_brokers())
            except KafkaError as exc:
                raise CliError(f"cannot decommission broker {broker}: {exc.message}") from None
            print("Current partition replica assignment")
            print(to_json(held))
            print()
            print("Proposed partition reassignment configuration")
            print(to_json(plan))
            if dry_run:
                return 0
            if throttle >= 0:
                set_throttles(src, held, plan, throttle)
            src.start(plan)
            started.update(plan)
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
