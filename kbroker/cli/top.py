"""``kctl top`` (alias ``kctl cluster status --watch``): a live view of a cluster in the terminal.

Every ``--interval`` seconds (default 2) it asks the brokers for:

- the live brokers (id, address, rack) and the controller (DescribeCluster);
- every topic's partitions (DescribeTopics): partitions, under-replicated and offline
  counts, and each under-replicated partition with its replicas and ISR;
- every partition's log end offset (ListOffsets), whose change since the previous
  refresh, per topic, is the produce rate in records/s (``-`` on the first frame);
- every consumer group's state, members and lag (committed offsets against the log
  end offsets).

and draws them with ``rich`` (imported only here; without it the command fails with
one line). ``--once`` prints one frame (two refreshes ``--interval`` apart, so that it
has rates) and exits; it is what scripts and tests use. A refresh that fails (the
brokers are failing over) shows the error in the frame and the view keeps going,
so a person can watch a failover happen. Ctrl-C ends it (exit 0).

Thread safety: none; one thread refreshes and draws.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kbroker.cli.common import CliError, UsageError, check_bootstrap, client_configs
from kclient import AdminClient, Consumer, TopicPartition
from kclient.errors import KafkaError

DEFAULT_INTERVAL_S = 2.0
NOT_A_TERMINAL_WIDTH = 160
"""Columns of a frame printed to a pipe (rich would otherwise assume 80 and cut cells)."""


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    top = nouns.add_parser(
        "top",
        parents=[connection],
        help="a live view: brokers, controller, topic rates, under-replicated partitions, group lag",
        description="Refresh the cluster's state every --interval seconds in the terminal (needs 'rich').",
    )
    _view_flags(top)
    top.set_defaults(handler=top_command)
    top.add_argument("--once", action="store_true", help="print one frame and exit")

    cluster = nouns.add_parser("cluster", help="the cluster as a whole: status")
    verbs = cluster.add_subparsers(dest="verb", metavar="VERB", required=True)
    status = verbs.add_parser("status", parents=[connection], help="one frame of 'kctl top' (--watch: keep refreshing)")
    _view_flags(status)
    status.add_argument("--watch", action="store_true", help="keep refreshing (kctl top)")
    status.set_defaults(handler=status_command)


def _view_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"seconds between refreshes (default {DEFAULT_INTERVAL_S:g})",
    )


# --- what one refresh sees ------------------------------------------------------------


@dataclass(frozen=True)
class BrokerRow:
    broker_id: int
    address: str
    rack: str | None


@dataclass(frozen=True)
class PartitionRow:
    topic: str
    partition: int
    leader: int
    replicas: list[int]
    isr: list[int]


@dataclass(frozen=True)
class GroupRow:
    group_id: str
    state: str
    members: int
    lag: int | None
    """Records between the committed offsets and the log ends (None: nothing committed)."""


@dataclass
class Snapshot:
    """The cluster at one instant (``at``: time.monotonic())."""

    at: float
    brokers: list[BrokerRow] = field(default_factory=list)
    controller: int = -1
    partitions: list[PartitionRow] = field(default_factory=list)
    log_ends: dict[TopicPartition, int] = field(default_factory=dict)
    groups: list[GroupRow] = field(default_factory=list)
    error: str | None = None

    def topics(self) -> list[str]:
        return sorted({p.topic for p in self.partitions})

    def under_replicated(self) -> list[PartitionRow]:
        return [p for p in self.partitions if len(p.isr) < len(p.replicas)]

    def offline(self) -> list[PartitionRow]:
        return [p for p in self.partitions if p.leader < 0]


def topic_rates(previous: Snapshot | None, current: Snapshot) -> dict[str, float | None]:
    """Records/s appended to each topic between two snapshots (None without a previous one,
    or when a partition's log end went missing in between)."""
    out: dict[str, float | None] = {}
    elapsed = current.at - previous.at if previous is not None else 0.0
    for topic in current.topics():
        tps = [tp for tp in current.log_ends if tp.topic == topic]
        if previous is None or elapsed <= 0 or any(tp not in previous.log_ends for tp in tps) or not tps:
            out[topic] = None
            continue
        appended = sum(max(current.log_ends[tp] - previous.log_ends[tp], 0) for tp in tps)
        out[topic] = appended / elapsed
    return out


def group_lag(committed: Mapping[TopicPartition, int], log_ends: Mapping[TopicPartition, int]) -> int | None:
    """Sum over the committed partitions of (log end - committed), or None if none is committed."""
    known = [(tp, offset) for tp, offset in committed.items() if offset >= 0 and tp in log_ends]
    if not known:
        return None
    return sum(max(log_ends[tp] - offset, 0) for tp, offset in known)


class Collector:
    """Takes snapshots through one AdminClient and one Consumer (kept across refreshes)."""

    def __init__(self, bootstrap: str, configs: Mapping[str, Any]) -> None:
        self._admin = AdminClient(bootstrap, **dict(configs))
        try:
            self._consumer = Consumer(bootstrap_servers=bootstrap, **dict(configs))
        except BaseException:
            self._admin.close()
            raise

    def snapshot(self, now: Callable[[], float] = time.monotonic) -> Snapshot:
        snap = Snapshot(at=now())
        try:
            brokers, snap.controller, _ = self._admin.describe_cluster()
            snap.brokers = [BrokerRow(b.node_id, f"{b.host}:{b.port}", b.rack) for b in sorted(brokers)]
            for d in self._admin.describe_topics():
                for p in d.partitions:
                    snap.partitions.append(PartitionRow(d.name, p.partition, p.leader, list(p.replicas), list(p.isr)))
            snap.partitions.sort(key=lambda p: (p.topic, p.partition))
            tps = [TopicPartition(p.topic, p.partition) for p in snap.partitions if p.leader >= 0]
            if tps:
                snap.log_ends = dict(self._consumer.end_offsets(tps))
            snap.at = now()
            for gid, state in self._admin.list_consumer_groups():
                members = -1
                try:
                    (description,) = self._admin.describe_consumer_groups([gid])
                    state, members = description.state, len(description.members)
                    offsets = self._admin.list_consumer_group_offsets(gid)
                    lag = group_lag({tp: om.offset for tp, om in offsets.items()}, snap.log_ends)
                except KafkaError:
                    lag = None
                snap.groups.append(GroupRow(gid, state, members, lag))
        except KafkaError as exc:
            snap.error = f"{type(exc).__name__}: {exc}"
        return snap

    def close(self) -> None:
        try:
            self._consumer.close(autocommit=False)
        finally:
            self._admin.close()


# --- drawing -------------------------------------------------------------------------


def _rich() -> Any:
    try:
        import rich
    except ImportError:
        raise CliError("kctl top needs the 'rich' package: pip install rich") from None
    return rich


def render(snap: Snapshot, rates: Mapping[str, float | None], source: str) -> Any:
    """The frame for ``snap`` as a rich renderable."""
    _rich()
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    when = time.strftime("%H:%M:%S")
    controller = "none" if snap.controller < 0 else str(snap.controller)
    title = Text(f"kbroker {source}  {when}  controller: {controller}", style="bold")
    parts: list[Any] = [title]
    if snap.error is not None:
        parts.append(Text(f"refresh failed: {snap.error}", style="bold red"))

    brokers = Table(title="Brokers", title_justify="left", expand=False)
    for name in ("ID", "ADDRESS", "RACK", "ROLE"):
        brokers.add_column(name)
    for b in snap.brokers:
        role = "controller" if b.broker_id == snap.controller else ""
        brokers.add_row(str(b.broker_id), b.address, b.rack or "-", role, style="bold" if role else None)
    parts.append(brokers)

    under = {(p.topic, p.partition) for p in snap.under_replicated()}
    offline = {(p.topic, p.partition) for p in snap.offline()}
    topics = Table(title="Topics", title_justify="left")
    for name in ("TOPIC", "PARTITIONS", "UNDER-REPLICATED", "OFFLINE", "LOG-END-OFFSETS", "RECORDS/S"):
        topics.add_column(name, justify="left" if name == "TOPIC" else "right")
    for topic in snap.topics():
        parts_of = [p for p in snap.partitions if p.topic == topic]
        n_under = sum((topic, p.partition) in under for p in parts_of)
        n_off = sum((topic, p.partition) in offline for p in parts_of)
        ends = sum(snap.log_ends.get(TopicPartition(topic, p.partition), 0) for p in parts_of)
        rate = rates.get(topic)
        style = "red" if n_off else "yellow" if n_under else None
        topics.add_row(
            topic,
            str(len(parts_of)),
            str(n_under),
            str(n_off),
            str(ends),
            "-" if rate is None else f"{rate:.1f}",
            style=style,
        )
    parts.append(topics)

    if under or offline:
        bad = Table(title="Under-replicated and offline partitions", title_justify="left")
        for name in ("PARTITION", "LEADER", "REPLICAS", "ISR"):
            bad.add_column(name)
        for p in snap.partitions:
            if (p.topic, p.partition) in under | offline:
                leader = "none" if p.leader < 0 else str(p.leader)
                bad.add_row(
                    f"{p.topic}-{p.partition}",
                    leader,
                    ",".join(map(str, p.replicas)),
                    ",".join(map(str, p.isr)),
                    style="red" if p.leader < 0 else "yellow",
                )
        parts.append(bad)
    else:
        parts.append(Text("Under-replicated partitions: none"))

    groups = Table(title="Consumer groups", title_justify="left")
    for name in ("GROUP", "STATE", "MEMBERS", "LAG"):
        groups.add_column(name, justify="right" if name in ("MEMBERS", "LAG") else "left")
    for g in snap.groups:
        groups.add_row(
            g.group_id, g.state, "-" if g.members < 0 else str(g.members), "-" if g.lag is None else str(g.lag)
        )
    parts.append(groups)
    return Group(*parts)


def _bootstrap(args: argparse.Namespace) -> str:
    if getattr(args, "zookeeper", None) is not None:
        raise UsageError("top talks to brokers: give --bootstrap-server, not --zookeeper")
    if args.bootstrap_server is None:
        raise UsageError("top needs --bootstrap-server HOST:PORT")
    return check_bootstrap(args.bootstrap_server)


def run_view(args: argparse.Namespace, *, watch: bool) -> int:
    if not args.interval > 0:
        raise UsageError(f"--interval must be positive, got {args.interval:g}")
    _rich()
    from rich.console import Console
    from rich.live import Live

    bootstrap = _bootstrap(args)
    console = Console() if sys.stdout.isatty() else Console(width=NOT_A_TERMINAL_WIDTH)
    collector = Collector(bootstrap, client_configs(args))
    try:
        previous = collector.snapshot()
        if not watch:
            time.sleep(args.interval)
            current = collector.snapshot()
            console.print(render(current, topic_rates(previous, current), bootstrap))
            return 0
        try:
            with Live(render(previous, topic_rates(None, previous), bootstrap), console=console) as live:
                while True:
                    time.sleep(args.interval)
                    current = collector.snapshot()
                    live.update(render(current, topic_rates(previous, current), bootstrap))
                    if current.error is None:
                        previous = current
        except KeyboardInterrupt:
            return 0
    finally:
        collector.close()


def top_command(args: argparse.Namespace) -> int:
    return run_view(args, watch=not args.once)


def status_command(args: argparse.Namespace) -> int:
    return run_view(args, watch=args.watch)
