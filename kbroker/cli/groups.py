"""``kctl groups list|describe|delete|delete-offsets|reset-offsets``, as ``kafka-consumer-groups.sh`` does them.

Consumer groups live on the brokers (their coordinator), so every verb needs
``--bootstrap-server``. Output (columns padded to the widest cell, ``-`` when unknown)::

    groups list             G                            one per line, sorted
    groups list --state     GROUP STATE                  then one row per group
    groups describe         (--offsets, the default)
                            [Consumer group 'G' has no active members.]
                            [Warning: Consumer group 'G' is rebalancing.]
                            (then, after a blank line when one of those was printed)
                            GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
                            one row per partition with a committed offset or an owner,
                            and one (``-`` topic) per member that owns nothing;
                            several groups are separated by a blank line
    groups describe --members
                            GROUP CONSUMER-ID HOST CLIENT-ID #PARTITIONS [ASSIGNMENT]
                            (ASSIGNMENT with --verbose: t(0,1),u(2); ``-`` for none)
    groups describe --state GROUP COORDINATOR (ID) ASSIGNMENT-STRATEGY STATE #MEMBERS
                            (the coordinator as ``host:port  (id)``)
    groups delete           Deletion of requested consumer groups ('G') was successful.
    groups delete-offsets   Request succeed for deleting offsets with topic T group G
                            (or: Error: Encounter some partition level error, see the follow-up details:)
                            (blank line)
                            TOPIC PARTITION STATUS   (Kafka's %-30s %-15s %-15s columns) one row per
                            partition: Successful, or Error: <message> (GROUP_SUBSCRIBED_TO_TOPIC while
                            an active member subscribes to the topic); exit 1 if any row failed
    groups reset-offsets    GROUP TOPIC PARTITION NEW-OFFSET  the plan (dry run, the default,
                            under a ``DRY RUN`` notice on stderr) or what was committed (--execute);
                            with --export Kafka's CSV instead: ``topic,partition,offset`` lines
                            (``group,topic,partition,offset`` when several groups are reset),
                            which --from-file reads back

``--all-groups`` describes (or resets) every group the brokers know. reset-offsets
targets: --to-earliest, --to-latest, --to-current (the committed offset; the log end
where there is none), --to-offset N, --shift-by N, --to-datetime, --by-duration
PnDTnHnMnS (the first offset at or after now minus the ISO-8601 duration) and
--from-file CSV (the offsets of the file, as given; --topic/--all-topics optional then,
and narrow the file's rows).

A group with neither members nor committed offsets does not exist
(``GroupIdNotFoundError``). Offsets are reset only while the group has no members
(with --all-groups an active group is skipped with a warning on stderr), and, except
with --from-file, are clamped to the partition's ``[log start, log end]``.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
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
MEMBERS_HEADER = ("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS")
STATE_HEADER = ("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS")
RESET_HEADER = ("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")
INACTIVE_STATES = ("Empty", "Dead")
REBALANCING_STATES = ("PreparingRebalance", "CompletingRebalance")
UNKNOWN = "-"
DATETIME_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:?\d{2})?")
DATETIME_FORMAT = "YYYY-MM-DDTHH:MM:SS[.sss][Z|+hh:mm|-hh:mm]"
DURATION_RE = re.compile(r"P(?:(\d+)D)?(T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:[.,]\d{1,9})?)S)?)?", re.IGNORECASE)
DURATION_FORMAT = "PnDTnHnMnS"


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    groups = nouns.add_parser(
        "groups", help="consumer groups: list, describe (offsets and lag), delete, delete or reset offsets"
    )
    verbs = groups.add_subparsers(dest="verb", metavar="VERB", required=True)

    lister = verbs.add_parser("list", parents=[connection], help="consumer group ids, one per line")
    lister.add_argument("--state", action="store_true", help="also print each group's state")
    lister.set_defaults(handler=list_groups)

    describe = verbs.add_parser(
        "describe",
        parents=[connection],
        help="each partition's committed offset, log end offset, lag and owner (or members, or state)",
    )
    _group_flags(describe)
    view = describe.add_mutually_exclusive_group()
    view.add_argument("--offsets", action="store_true", help="offsets, log end offsets and lag (the default)")
    view.add_argument("--members", action="store_true", help="the members (--verbose: and their partitions)")
    view.add_argument("--state", action="store_true", help="coordinator, assignment strategy, state, member count")
    describe.set_defaults(handler=describe_groups)

    delete = verbs.add_parser("delete", parents=[connection], help="delete groups without members and their offsets")
    delete.add_argument("--group", action="append", required=True, help="the group (repeatable)")
    delete.set_defaults(handler=delete_groups)

    erase = verbs.add_parser(
        "delete-offsets",
        parents=[connection],
        help="delete a group's committed offsets of some topics or partitions",
        description="kafka-consumer-groups.sh --delete-offsets: remove the group's committed offsets of the "
        "partitions given. Refused for a topic an active member of the group subscribes to.",
    )
    erase.add_argument("--group", required=True, help="the group")
    erase.add_argument(
        "--topic",
        action="append",
        required=True,
        metavar="TOPIC[:P[,P...]]",
        help="a topic (every partition) or some of its partitions (repeatable)",
    )
    erase.set_defaults(handler=delete_offsets)

    reset = verbs.add_parser(
        "reset-offsets",
        parents=[connection],
        help="move an inactive group's committed offsets (a DRY RUN unless --execute)",
        description="Compute new committed offsets for the partitions given and, with --execute, commit them. "
        "Without --execute nothing changes: the plan is printed under a DRY RUN notice. Only for a group "
        "without active members. New offsets are clamped to each partition's [log start, log end] "
        "(except those of --from-file).",
    )
    _group_flags(reset, repeat=False)
    which = reset.add_mutually_exclusive_group()
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
    to.add_argument("--to-current", action="store_true", help="the committed offset (the log end where none)")
    to.add_argument("--to-offset", type=int, metavar="N", help="offset N")
    to.add_argument(
        "--to-datetime",
        metavar="DATETIME",
        help=f"the first offset with a timestamp at or after {DATETIME_FORMAT} (local time without a zone)",
    )
    to.add_argument(
        "--by-duration",
        metavar="PnDTnHnMnS",
        help="the first offset with a timestamp at or after now minus this ISO-8601 duration (P1DT2H, PT30M)",
    )
    to.add_argument("--shift-by", type=int, metavar="N", help="the committed offset plus N (negative: back)")
    to.add_argument(
        "--from-file", metavar="CSV", help="the offsets of a CSV file (topic,partition,offset or group,topic,...)"
    )
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="only print the new offsets (the default)")
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    reset.add_argument(
        "--export", action="store_true", help="print the plan as CSV (topic,partition,offset), for --from-file"
    )
    reset.set_defaults(handler=reset_offsets)


def _group_flags(parser: argparse.ArgumentParser, *, repeat: bool = True) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    if repeat:
        which.add_argument("--group", action="append", help="the group (repeatable)")
    else:
        which.add_argument("--group", help="the group")
    which.add_argument("--all-groups", action="store_true", help="every consumer group")


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


def member_assignment(m: MemberDescription) -> str:
    """Kafka's ASSIGNMENT cell: ``t(0,1),u(2)``, or ``-``."""
    by_topic: dict[str, list[int]] = {}
    for tp in m.assignment:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    cells = [f"{t}({','.join(str(p) for p in sorted(ps))})" for t, ps in sorted(by_topic.items())]
    return ",".join(cells) or UNKNOWN


def members_lines(d: GroupDescription, verbose: bool = False) -> list[str]:
    """``--members``: one row per member, or Kafka's note for a group without any."""
    if not d.members:
        return [f"Consumer group '{d.group_id}' has no active members."]
    header = [*MEMBERS_HEADER, *(["ASSIGNMENT"] if verbose else [])]
    rows = []
    for m in sorted(d.members, key=lambda m: m.member_id):
        row = [d.group_id, *_member_cells(m), str(len(m.assignment))]
        rows.append([*row, member_assignment(m)] if verbose else row)
    notes = [f"Warning: Consumer group '{d.group_id}' is rebalancing.", ""] if d.state in REBALANCING_STATES else []
    return [*notes, *table(header, rows)]


def state_lines(d: GroupDescription, coordinator: str) -> list[str]:
    """``--state``: Kafka's one-row table (``coordinator`` as ``host:port  (id)``)."""
    row = [d.group_id, coordinator, d.protocol or UNKNOWN, d.state, str(len(d.members))]
    return table(STATE_HEADER, [row])


def _coordinator(admin: AdminClient, group: str, brokers: dict[str, int]) -> str:
    try:
        address = admin.find_coordinator(group)
    except KafkaError:
        return UNKNOWN
    broker_id = brokers.get(address)
    return f"{address}  ({broker_id})" if broker_id is not None else address


def _group_ids(admin: AdminClient, args: argparse.Namespace) -> list[str]:
    if args.all_groups:
        return [gid for gid, _ in admin.list_consumer_groups()]
    return _groups(args.group if isinstance(args.group, list) else [args.group])


def _describe_one(admin: AdminClient, args: argparse.Namespace, gid: str, brokers: dict[str, int]) -> list[str]:
    if args.members:
        g = _load(admin, gid)
        return members_lines(g.description, args.verbose)
    (description,) = admin.describe_consumer_groups([gid])
    if description.state == "Dead":
        raise GroupIdNotFoundError(f"Consumer group '{gid}' does not exist.")
    return state_lines(description, _coordinator(admin, gid, brokers))


def describe_groups(args: argparse.Namespace) -> int:
    blocks: list[list[str]] = []
    with open_group_admin(args.zookeeper, args.bootstrap_server, client_configs(args)) as admin:
        names = _group_ids(admin, args)
        if args.members or args.state:
            brokers = {f"{b.host}:{b.port}": b.node_id for b in admin.describe_cluster()[0]} if args.state else {}
            for gid in names:
                try:
                    blocks.append(_describe_one(admin, args, gid, brokers))
                except GroupIdNotFoundError:
                    if not args.all_groups:  # with --all-groups: deleted since listed
                        raise
        else:
            loaded = []
            for gid in names:
                try:
                    loaded.append(_load(admin, gid))
                except GroupIdNotFoundError:
                    if not args.all_groups:
                        raise
            tps = [
                tp for g in loaded for tp in {*g.committed, *(tp for m in g.description.members for tp in m.assignment)}
            ]
            with Consumer(bootstrap_servers=args.bootstrap_server, **client_configs(args)) as consumer:
                ends = _log_ends(consumer, tps)
            blocks = [describe_lines(g, ends) for g in loaded]
    for i, block in enumerate(blocks):
        if i:
            print()
        for line in block:
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


# --- delete-offsets ------------------------------------------------------------------

DELETE_OFFSETS_FORMAT = "%-30s %-15s %-15s"
"""kafka-consumer-groups.sh --delete-offsets' table row."""


def _status(err: Exception | None) -> str:
    """Kafka's STATUS cell: ``Successful`` or ``Error: <the error's message>`` (a broker
    error code's own description, as the Java client shows it)."""
    if err is None:
        return "Successful"
    return f"Error: {getattr(err, 'description', '') or err}"


def delete_offsets_lines(
    group: str, topics: Sequence[str], results: dict[TopicPartition, Exception | None]
) -> list[str]:
    """kafka-consumer-groups.sh's output: a first line when every partition succeeded,
    then a blank line and the TOPIC PARTITION STATUS table (partition -1: ``Not Provided``,
    for an unknown topic)."""
    failed = any(err is not None for err in results.values())
    out = [
        "Error: Encounter some partition level error, see the follow-up details:"
        if failed
        else f"Request succeed for deleting offsets with topic {', '.join(topics)} group {group}",
        "",
        (DELETE_OFFSETS_FORMAT % ("TOPIC", "PARTITION", "STATUS")).rstrip(),
    ]
    for tp, err in sorted(results.items(), key=lambda kv: kv[0].topic + str(kv[0].partition)):
        partition = str(tp.partition) if tp.partition >= 0 else "Not Provided"
        out.append((DELETE_OFFSETS_FORMAT % (tp.topic, partition, _status(err))).rstrip())
    return out


def delete_offsets(args: argparse.Namespace) -> int:
    (group,) = _groups([args.group])
    specs = [parse_topic_spec(s) for s in args.topic]
    with open_group_admin(args.zookeeper, args.bootstrap_server, client_configs(args)) as admin:
        results: dict[TopicPartition, Exception | None] = {}
        wanted = [TopicPartition(t, p) for t, parts in specs if parts is not None for p in parts]
        whole = sorted({t for t, parts in specs if parts is None})
        if whole:
            known = {d.name: d for d in admin.describe_topics(None)}
            for topic in whole:
                if topic in known:
                    wanted.extend(TopicPartition(topic, p.partition) for p in known[topic].partitions)
                else:
                    results[TopicPartition(topic, -1)] = UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        if wanted:
            results.update(admin.delete_consumer_group_offsets(group, wanted))
    for line in delete_offsets_lines(group, [s.strip() for s in args.topic], results):
        print(line)
    failed = sum(1 for err in results.values() if err is not None)
    if failed:
        raise CliError(f"the offsets of {failed} partition(s) of group {group!r} were not deleted (see STATUS)")
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


def parse_duration(text: str) -> int:
    """Kafka's ``--by-duration``: an ISO-8601 duration ``PnDTnHnMnS`` (java.time.Duration's
    day-time form, components optional, seconds may have a fraction) in milliseconds."""
    m = DURATION_RE.fullmatch(text.strip())
    if (
        m is None
        or not any(m.group(i) for i in (1, 3, 4, 5))
        or (m.group(2) and not any(m.group(i) for i in (3, 4, 5)))
    ):
        raise UsageError(f"--by-duration must be an ISO-8601 duration {DURATION_FORMAT} (P1D, PT2H30M), got {text!r}")
    days, hours, minutes = (int(m.group(i) or 0) for i in (1, 3, 4))
    seconds = float((m.group(5) or "0").replace(",", "."))
    return round(((days * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000)


ResetPlan = dict[str, dict[TopicPartition, int]]
"""group -> {partition: new offset}."""


def read_plan(text: str, where: str) -> tuple[list[tuple[str | None, TopicPartition, int]], int]:
    """Kafka's reset CSV: ``topic,partition,offset`` or ``group,topic,partition,offset`` rows
    (blank lines skipped). Returns the rows (group None for 3 columns) and the column count."""
    out: list[tuple[str | None, TopicPartition, int]] = []
    width = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) not in (3, 4) or (width and len(cells) != width):
            raise UsageError(f"{where} line {lineno}: expected topic,partition,offset or group,topic,partition,offset")
        width = len(cells)
        group = cells[0] if width == 4 else None
        topic, partition, offset = cells[-3:]
        if not topic or not partition.isdigit() or not offset.isdigit():
            raise UsageError(f"{where} line {lineno}: partition and offset must be numbers >= 0, got {line!r}")
        out.append((group, TopicPartition(topic, int(partition)), int(offset)))
    if not out:
        raise UsageError(f"{where} holds no offsets")
    return out, width


def export_lines(plans: ResetPlan) -> list[str]:
    """Kafka's --export CSV: 3 columns for one group, 4 (with the group) for several."""
    several = len(plans) > 1
    out = []
    for group, plan in sorted(plans.items()):
        for tp in sorted(plan):
            cells = [tp.topic, str(tp.partition), str(plan[tp])]
            out.append(",".join([group, *cells] if several else cells))
    return out


def plan_table(plans: ResetPlan) -> list[str]:
    rows = [[g, tp.topic, str(tp.partition), str(plan[tp])] for g, plan in sorted(plans.items()) for tp in sorted(plan)]
    return table(RESET_HEADER, rows)


def new_offsets(
    args: argparse.Namespace,
    consumer: Consumer,
    tps: list[TopicPartition],
    committed: dict[TopicPartition, int],
    group: str = "",
    now_ms: int | None = None,
) -> dict[TopicPartition, int]:
    if args.to_earliest:
        return consumer.beginning_offsets(tps)
    ends = consumer.end_offsets(tps)
    if args.to_latest:
        return ends
    if args.to_datetime is not None or args.by_duration is not None:
        if args.to_datetime is not None:
            at = parse_datetime(args.to_datetime)
        else:
            at = (int(time.time() * 1000) if now_ms is None else now_ms) - parse_duration(args.by_duration)
        found = consumer.offsets_for_times({tp: at for tp in tps})
        by_time = {}
        for tp in tps:
            hit = found.get(tp)
            by_time[tp] = ends[tp] if hit is None else hit.offset  # no record that late: the log end
        return by_time
    starts = consumer.beginning_offsets(tps)
    if args.to_offset is not None:
        return {tp: _clamp(args.to_offset, starts[tp], ends[tp]) for tp in tps}
    if args.to_current:
        return {tp: _clamp(committed[tp], starts[tp], ends[tp]) if tp in committed else ends[tp] for tp in tps}
    out = {}
    for tp in tps:
        if tp not in committed:
            raise CliError(
                f"cannot shift the offset of {tp.topic}-{tp.partition}: group '{group}' has no committed offset"
            )
        out[tp] = _clamp(committed[tp] + args.shift_by, starts[tp], ends[tp])
    return out


def _file_rows(args: argparse.Namespace) -> list[tuple[str | None, TopicPartition, int]] | None:
    if args.from_file is None:
        return None
    try:
        text = Path(args.from_file).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read --from-file {args.from_file}: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError:
        raise UsageError(f"cannot read --from-file {args.from_file}: not UTF-8 text") from None
    rows, _ = read_plan(text, f"--from-file {args.from_file}")
    return rows


def _plan_group(
    admin: AdminClient,
    consumer: Consumer,
    args: argparse.Namespace,
    group: str,
    file_rows: list[tuple[str | None, TopicPartition, int]] | None,
) -> dict[TopicPartition, int]:
    """One inactive group's new offsets (CliError if it has members)."""
    (description,) = admin.describe_consumer_groups([group])
    if description.members or description.state not in INACTIVE_STATES:
        raise CliError(
            f"Assignments can only be reset if the group '{group}' is inactive, "
            f"but the current state is {description.state}."
        )
    committed = {tp: om.offset for tp, om in admin.list_consumer_group_offsets(group).items() if om.offset >= 0}
    if file_rows is not None:
        plan = {tp: offset for g, tp, offset in file_rows if g in (None, group)}
        if args.topic:
            scope = set(_partitions(admin, args.topic))
            plan = {tp: o for tp, o in plan.items() if tp in scope}
        elif args.all_topics:
            plan = {tp: o for tp, o in plan.items() if tp in committed}
        return plan
    tps = sorted(committed) if args.all_topics else _partitions(admin, args.topic)
    return new_offsets(args, consumer, tps, committed, group) if tps else {}


def reset_offsets(args: argparse.Namespace) -> int:
    if args.from_file is None and not args.topic and not args.all_topics:
        raise UsageError("give --topic or --all-topics (or --from-file)")
    if args.to_datetime is not None:
        parse_datetime(args.to_datetime)  # a usage error before any request
    if args.by_duration is not None:
        parse_duration(args.by_duration)
    file_rows = _file_rows(args)
    plans: ResetPlan = {}
    with open_group_admin(args.zookeeper, args.bootstrap_server, client_configs(args)) as admin:
        groups = _group_ids(admin, args)
        with Consumer(bootstrap_servers=args.bootstrap_server, **client_configs(args)) as consumer:
            for group in groups:
                try:
                    plan = _plan_group(admin, consumer, args, group, file_rows)
                except CliError as exc:
                    if not args.all_groups:
                        raise
                    print(f"kctl: warning: {exc} (skipped)", file=sys.stderr)
                    continue
                if plan:
                    plans[group] = plan
                elif not args.all_groups:
                    raise CliError(f"consumer group '{group}' has no committed offsets to reset (give --topic)")
        if not plans:
            raise CliError("no consumer group has offsets to reset")
        if args.execute:
            for group, plan in sorted(plans.items()):
                admin.alter_consumer_group_offsets(group, plan)
    if not args.execute:
        print("DRY RUN: nothing was changed; these are the offsets --execute would commit.", file=sys.stderr)
    for line in export_lines(plans) if args.export else plan_table(plans):
        print(line)
    return 0
