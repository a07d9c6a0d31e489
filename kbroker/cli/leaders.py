"""``kctl leaders elect``: preferred-leader election, as ``kafka-leader-election.sh
--election-type preferred`` (and the older ``kafka-preferred-replica-election.sh``) do it.

Each partition's preferred leader is the first broker of its replica list; the
controller moves leadership there when that broker is alive and in the ISR.
``--zookeeper`` writes ``/admin/preferred_replica_election`` and waits for the
controller to delete it; ``--bootstrap-server`` calls the ``ElectLeaders`` RPC.

Output (partitions as ``topic-partition``, sorted)::

    Successfully completed leader election (PREFERRED) for partitions T-0, T-1
    Valid replica already elected for partitions T-2, T-3
    Error completing leader election (PREFERRED) for partition: T-2: PreferredLeaderNotAvailableError: ...

A partition already led by its preferred replica before the command (read just before
the election; or reported ``ELECTION_NOT_NEEDED``, 84) is "already elected", as
kafka-leader-election.sh reports it. Exit 0 when every partition is led by its preferred replica; otherwise 1, after the
lines above, with ``kctl: N replica(s) could not be elected`` on stderr.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from kbroker.cli.backends import ElectionResults, TopicView, open_backend
from kbroker.cli.common import CliError, UsageError, client_configs
from kclient.errors import ElectionNotNeededError, KafkaError, UnknownTopicOrPartitionError

ELECTION_TYPE = "PREFERRED"
DEFAULT_TIMEOUT_MS = 30000


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    leaders = nouns.add_parser("leaders", help="partition leadership: preferred-leader election")
    verbs = leaders.add_subparsers(dest="verb", metavar="VERB", required=True)

    elect = verbs.add_parser(
        "elect",
        parents=[connection],
        help="move leadership back to each partition's preferred (first) replica",
        description="Preferred-leader election: each partition is led by the first broker of its replica list "
        "again, where that broker is alive and in sync. Give --topic (optionally with --partition) "
        "or --all-topic-partitions.",
    )
    which = elect.add_mutually_exclusive_group(required=True)
    which.add_argument("--topic", help="the topic whose partitions to elect leaders for")
    which.add_argument("--all-topic-partitions", action="store_true", help="every partition of every topic")
    elect.add_argument("--partition", type=int, help="only this partition of --topic")
    elect.add_argument(
        "--election-type",
        type=str.lower,
        choices=["preferred"],
        default="preferred",
        help="only 'preferred' (accepted for kafka-leader-election.sh compatibility)",
    )
    elect.add_argument(
        "--timeout-ms",
        type=int,
        default=DEFAULT_TIMEOUT_MS,
        help=f"how long to wait for the controller (default {DEFAULT_TIMEOUT_MS})",
    )
    elect.set_defaults(handler=elect_leaders)


def _name(tp: tuple[str, int]) -> str:
    return f"{tp[0]}-{tp[1]}"


def already_preferred(topics: Iterable[TopicView]) -> set[tuple[str, int]]:
    """The partitions whose leader is their first replica."""
    return {(t.name, p.partition) for t in topics for p in t.partitions if p.replicas and p.leader == p.replicas[0]}


def result_lines(results: ElectionResults, unchanged: set[tuple[str, int]] | None = None) -> list[str]:
    """Kafka's report: one line for the partitions elected, one for those whose preferred
    replica already led (``unchanged``, or ELECTION_NOT_NEEDED), then one line per failure."""
    ordered = sorted(results.items())
    noop = unchanged or set()
    not_needed = [
        _name(tp) for tp, err in ordered if isinstance(err, ElectionNotNeededError) or (err is None and tp in noop)
    ]
    succeeded = [_name(tp) for tp, err in ordered if err is None and tp not in noop]
    out = []
    if succeeded:
        out.append(f"Successfully completed leader election ({ELECTION_TYPE}) for partitions {', '.join(succeeded)}")
    if not_needed:
        out.append(f"Valid replica already elected for partitions {', '.join(not_needed)}")
    for tp, err in ordered:
        if err is not None and not isinstance(err, ElectionNotNeededError):
            out.append(f"Error completing leader election ({ELECTION_TYPE}) for partition: {_name(tp)}: {_error(err)}")
    return out


def _error(err: Exception) -> str:
    """``Name: message``, as Kafka prints an exception (not kclient's ``[Error N] ...``)."""
    if isinstance(err, KafkaError):
        name = type(err).__name__
        return f"{name}: {err.message}" if err.message else name
    return str(err)


def elect_leaders(args: argparse.Namespace) -> int:
    if args.partition is not None and args.topic is None:
        raise UsageError("--partition needs --topic")
    if args.partition is not None and args.partition < 0:
        raise UsageError(f"--partition must be 0 or more, got {args.partition}")
    if args.timeout_ms < 1:
        raise UsageError(f"--timeout-ms must be at least 1, got {args.timeout_ms}")
    with open_backend(args.zookeeper, args.bootstrap_server, client_configs(args)) as backend:
        wanted: list[tuple[str, int]] | None = None
        before = backend.describe_topics([args.topic] if args.topic is not None else None)
        if args.topic is not None:
            (topic,) = before  # UnknownTopicOrPartitionError if missing
            indexes = [p.partition for p in topic.partitions]
            if args.partition is not None and args.partition not in indexes:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic.name!r} has no partition {args.partition} (it has {len(indexes)})"
                )
            chosen = [args.partition] if args.partition is not None else indexes
            wanted = [(topic.name, p) for p in chosen]
        results = backend.elect_preferred_leaders(wanted, args.timeout_ms)
    for err in results.values():
        if isinstance(err, UnknownTopicOrPartitionError):
            raise err
    for line in result_lines(results, already_preferred(before)):
        print(line)
    failed = sum(err is not None and not isinstance(err, ElectionNotNeededError) for err in results.values())
    if failed:
        raise CliError(f"{failed} replica(s) could not be elected")
    return 0
