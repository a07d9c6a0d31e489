"""``kctl groups list|describe|delete|reset-offsets``, as ``kafka-consumer-groups.sh`` does them.

Consumer groups live on the brokers (their coordinator), so every verb needs
``--bootstrap-server``. Output (columns padded to the widest cell, ``-`` when unknown)::

    groups list             G                            one per line, sorted
    groups list --state     GROUP STATE                  then one row per group
    groups describe         [Consumer group 'G' has no active members.]
                            [Warning: Consumer group 'G' is rebalancing.]
                            (then, after a blank line when one of those was printed)
                            GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
                            one row per partition with a committed offset or an owner,
                            and one (``-`` topic) per member that owns nothing;
                            several groups are separated by a blank line
    groups delete           Deletion of requested consumer groups ('G') was successful.
    groups reset-offsets    GROUP TOPIC PARTITION NEW-OFFSET  the plan (dry run, the default)
                            or what was committed (--execute)

A group with neither members nor committed offsets does not exist
(``GroupIdNotFoundError``). Offsets are reset only while the group has no members,
and are clamped to the partition's ``[log start, log end]``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kbroker.cli.backends import open_group_admin
from kbroker.cli.common import CliError, UsageError, client_configs
from kclient import AdminClient, Consumer, TopicPartition
from kclient.admin import GroupDescription, MemberDescription
from kclient.errors import GroupIdNotFoundError, KafkaError, UnknownTopicOrPartitionError

DESCRIBE_HEADER = (
    "GROUP",
    "TOPIC",
    "PARTITION",
    "CURRENT-OFFSET",
    "LOG-END-OFFSET",
    "LAG",
    "CONSUMER-ID",
    "HOST",
    "CLIENT-ID",
)
RESET_HEADER = ("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")
INACTIVE_STATES = ("Empty", "Dead")
REBALANCING_STATES = ("PreparingRebalance", "CompletingRebalance")
UNKNOWN = "-"
DATETIME_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:?\d{2})?")
DATETIME_FORMAT = "YYYY-MM-DDTHH:MM:SS[.sss][Z|+hh:mm|-hh:mm]"


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    groups = nouns.add_parser("groups", help="consumer groups: list, describe (offsets and lag), delete, reset offsets")
    verbs = groups.add_subparsers(dest="verb", metavar="VERB", required=True)

    lister = verbs.add_parser("list", parents=[connection], help="consumer group ids, one per line")
    lister.add_argument("--state", action="store_true", help="also print each group's state")
    lister.set_defaults(handler=list_groups)

    describe = verbs.add_parser(
        "describe",
        parents=[connection],
        help="each partition's committed offset, log end offset, lag and owner",
    )
    describe.add_argument("--group", action="append", required=True, help="the group (repeatable)")
    describe.set_defaults(handler=describe_groups)

    delete = verbs.add_parser("delete", parents=[connection], help="delete groups without members and their offsets")
    delete.add_argument("--group", action="append", required=True, help="the group (repeatable)")
    delete.set_defaults(handler=delete_groups)

    reset = verbs.add_parser(
        "reset-offsets",
        parents=[connection],
        help="move an inactive group's committed offsets (a dry run unless --execute)",
        description="Compute new committed offsets for the partitions given and, with --execute, commit them. "
        "Only for a group without active members. New offsets are clamped to each partition's "
        "[log start, log end].",
    )
    reset.add_argument("--group", required=True)
    which = reset.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--topic",
        action="append",
        metavar="TOPIC[:P[,P...]]",
        help="a topic (every partition) or some of its partitions (repeatable)",
    )
    which.add_argument("--all-topics", action="store_true", help="every partition the group has a committed offset for")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start offset")
    to.add_argument("--to-latest", action="store_true", help="the log end offset")
    to.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    to.add_argument(
        "--to-datetime",
        metavar="DATETIME",
        help=f"the first offset with a timestamp at or after {DATETIME_FORMAT} (local time without a zone)",
    )
    to.add_argument("--shift-by", type=int, metavar="N", help="the committed offset plus N (negative: back)")
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="only print the new offsets (the default)")
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    reset.set_defaults(handler=reset_offsets)


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Left-aligned columns, each as wide as its widest cell, one space apart."""
    all_rows = [list(header), *(list(r) for r in rows)]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(header))]
    return [" ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in all_rows]


def _groups(names: Sequence[str]) -> list[str]:
    out = []
    for name in names:
        if not name.strip():
            raise UsageError("--group is empty")
        if name.strip() not in out:
            out.append(name.strip())
    return out


# --- list ----------------------------------------------------------------------------


def list_groups(args: argparse.Namespace) -> int:
    with open_group_admin(args.zookeeper, args.bootstrap_server, client_configs(args)) as admin:
        groups = admin.list_consumer_groups()
    if args.state:
        for line in table(("GROUP", "STATE"), groups):
            print(line)
    else:
        for gid, _ in groups:
            print(gid)
    return 0


# --- describe ------------------------------------------------------------------------


def show_host(host: str) -> str:
    """A gRPC peer (``ipv4:10.0.0.1:5432``, ``ipv6:[::1]:5432``) as Kafka shows a host (``/10.0.0.1``)."""
    for prefix in ("ipv4:", "ipv6:"):
        if host.startswith(prefix):
            address = host[len(prefix) :].rpartition(":")[0] or host[len(prefix) :]
            return "/" + address.strip("[]")
    return host or UNKNOWN


@dataclass
class GroupOffsets:
    description: GroupDescription
    committed: dict[TopicPartition, int]


def _load(admin: AdminClient, group: str) -> GroupOffsets:
    """The group's description and committed offsets; GroupIdNotFoundError when it has neither."""
    (description,) = admin.describe_consumer_groups([group])
    committed = {tp: om.offset for tp, om in admin.list_consumer_group_offsets(group).items() if om.offset >= 0}
    if not description.members and not committed:
        raise GroupIdNotFoundError(f"Consumer group '{group}' does not exist.")
    return GroupOffsets(description, committed)


def _log_ends(consumer: Consumer, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
    """Each partition's log end offset; None where it cannot be had (topic deleted, no leader)."""
    wanted = sorted(set(tps))
    if not wanted:
        return {}
    try:
        return dict(consumer.end_offsets(wanted))
    except KafkaError:
        out: dict[TopicPartition, int | None] = {}
        for tp in wanted:
            try:
                out[tp] = consumer.end_offsets([tp])[tp]
            except KafkaError:
                out[tp] = None
        return out


def _member_cells(m: MemberDescription | None) -> list[str]:
    if m is None:
        return [UNKNOWN, UNKNOWN, UNKNOWN]
    return [m.member_id, show_host(m.host), m.client_id or UNKNOWN]


def describe_rows(g: GroupOffsets, ends: dict[TopicPartition, int | None]) -> list[list[str]]:
    """One row per partition with a committed offset or an owner, then one per member owning nothing."""
    gid = g.description.group_id
    owner: dict[TopicPartition, MemberDescription] = {}
    for member in g.description.members:
        for tp in member.assignment:
            owner[tp] = member
    rows = []
    for tp in sorted(set(g.committed) | set(owner)):
        current, end = g.committed.get(tp), ends.get(tp)
        offsets = [UNKNOWN if current is None else str(current), UNKNOWN if end is None else str(end)]
        lag = str(end - current) if current is not None and end is not None else UNKNOWN
        rows.append([gid, tp.topic, str(tp.partition), *offsets, lag, *_member_cells(owner.get(tp))])
    for member in sorted(g.description.members, key=lambda m: m.member_id):
        if not member.assignment:
            rows.append([gid, *[UNKNOWN] * 5, *_member_cells(member)])
    return rows


def describe_lines(g: GroupOffsets, ends: dict[TopicPartition, int | None]) -> list[str]:
    gid, state = g.description.group_id, g.description.state
    notes = []
    if not g.description.members:
        notes.append(f"Consumer group '{gid}' has no active members.")
    elif state in REBALANCING_STATES:
        notes.append(f"Warning: Consumer group '{gid}' is rebalancing.")
    return [*notes, *([""] if notes else []), *table(DESCRIBE_HEADER, describe_rows(g, ends))]


def describe_groups(args: argparse.Namespace) -> int:
    names = _groups(args.group)
    with open_group_admin(args.zookeeper, args.bootstrap_server, client_configs(args)) as admin:
        loaded = [_load(admin, name) for name in names]
    tps = [tp for g in loaded for tp in {*g.committed, *(tp for m in g.description.members for tp in m.assignment)}]
    with Consumer(bootstrap_servers=args.bootstrap_server, **client_configs(args)) as consumer:
        ends = _log_ends(consumer, tps)
    for i, g in enumerate(loaded):
        if i:
            print()
        for line in describe_lines(g, ends):
            print(line)
    return 0


# --- delete --------------------------------------------------------------------------


def delete_groups(args: argparse.Namespace) -> int:
    names = _groups(args.group)
    with open_group_admin(args.zookeeper, args.bootstrap_server, client_configs(args)) as admin:
        results = admin.delete_consumer_groups(names)
    deleted = [gid for gid in names if results.get(gid) is None]
    failed = [(gid, err) for gid, err in results.items() if err is not None]
    if deleted:
        quoted = ", ".join(f"'{gid}'" for gid in deleted)
        print(f"Deletion of requested consumer groups ({quoted}) was successful.")
    if len(failed) == 1:
        raise failed[0][1]
    if failed:
        raise CliError(f"{len(failed)} group(s) could not be deleted: " + "; ".join(f"{e}" for _, e in failed))
    return 0


# --- reset-offsets -------------------------------------------------------------------


def parse_topic_spec(spec: str) -> tuple[str, list[int] | None]:
    """``T`` -> (T, None: every partition); ``T:0,2`` -> (T, [0, 2])."""
    topic, colon, parts = spec.strip().partition(":")
    topic = topic.strip()
    if not topic:
        raise UsageError(f"--topic expects TOPIC[:P[,P...]], got {spec!r}")
    if not colon:
        return topic, None
    items = [p.strip() for p in parts.split(",")]
    if not items or not all(p.isdigit() for p in items):
        raise UsageError(f"--topic expects TOPIC[:P[,P...]] with partition numbers, got {spec!r}")
    return topic, sorted({int(p) for p in items})


def parse_datetime(text: str) -> int:
    """Kafka's ``--to-datetime`` (local time without a zone) in milliseconds since the epoch."""
    if not DATETIME_RE.fullmatch(text):
        raise UsageError(f"--to-datetime must be {DATETIME_FORMAT}, got {text!r}")
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise UsageError(f"--to-datetime {text!r}: {exc}") from None
    return int(when.timestamp() * 1000)


def _partitions(admin: AdminClient, specs: Sequence[str]) -> list[TopicPartition]:
    wanted: list[TopicPartition] = []
    parsed = [parse_topic_spec(s) for s in specs]
    existing = {
        d.name: sorted(p.partition for p in d.partitions) for d in admin.describe_topics({t for t, _ in parsed})
    }
    for topic, parts in parsed:
        have = existing.get(topic)
        if have is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        for p in have if parts is None else parts:
            if p not in have:
                raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {p} (it has {len(have)})")
            wanted.append(TopicPartition(topic, p))
    return sorted(set(wanted))


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


def new_offsets(
    args: argparse.Namespace, consumer: Consumer, tps: list[TopicPartition], committed: dict[TopicPartition, int]
) -> dict[TopicPartition, int]:
    if args.to_earliest:
        return consumer.beginning_offsets(tps)
    ends = consumer.end_offsets(tps)
    if args.to_latest:
        return ends
    if args.to_datetime is not None:
        at = parse_datetime(args.to_datetime)
        found = consumer.offsets_for_times({tp: at for tp in tps})
        by_time = {}
        for tp in tps:
            hit = found.get(tp)
            by_time[tp] = ends[tp] if hit is None else hit.offset  # no record that late: the log end
        return by_time
    starts = consumer.beginning_offsets(tps)
    if args.to_offset is not None:
        return {tp: _clamp(args.to_offset, starts[tp], ends[tp]) for tp in tps}
    out = {}
    for tp in tps:
        if tp not in committed:
            raise CliError(
                f"cannot shift the offset of {tp.topic}-{tp.partition}: group '{args.group}' has no committed offset"
            )
        out[tp] = _clamp(committed[tp] + args.shift_by, starts[tp], ends[tp])
    return out


def reset_offsets(args: argparse.Namespace) -> int:
    (group,) = _groups([args.group])
    if args.to_datetime is not None:
        parse_datetime(args.to_datetime)  # a usage error before any request
    with open_group_admin(args.zookeeper, args.bootstrap_server, client_configs(args)) as admin:
        (description,) = admin.describe_consumer_groups([group])
        if description.members or description.state not in INACTIVE_STATES:
            raise CliError(
                f"Assignments can only be reset if the group '{group}' is inactive, "
                f"but the current state is {description.state}."
            )
        committed = {tp: om.offset for tp, om in admin.list_consumer_group_offsets(group).items() if om.offset >= 0}
        tps = sorted(committed) if args.all_topics else _partitions(admin, args.topic)
        if not tps:
            raise CliError(f"consumer group '{group}' has no committed offsets to reset (give --topic)")
        with Consumer(bootstrap_servers=args.bootstrap_server, **client_configs(args)) as consumer:
            plan = new_offsets(args, consumer, tps, committed)
        if args.execute:
            admin.alter_consumer_group_offsets(group, plan)
    for line in table(RESET_HEADER, [[group, tp.topic, str(tp.partition), str(plan[tp])] for tp in sorted(plan)]):
        print(line)
    return 0
