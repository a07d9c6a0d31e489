"""``kctl topics create|list|describe|delete|alter``, as ``kafka-topics.sh`` does them.

Output (tabs shown as ``\\t``)::

    topics create    Created topic T.
    topics list      T                                  one per line, sorted
                     T - marked for deletion            (--zookeeper, deletion pending)
    topics describe  Topic: T\\tTopicId: ID\\tPartitionCount: N\\tReplicationFactor: R\\tConfigs: k=v,...
                     \\tTopic: T\\tPartition: p\\tLeader: l\\tReplicas: 1,2\\tIsr: 1,2
                     (Leader ``none`` when there is none; a partition being moved adds
                     ``\\tAdding Replicas: 3\\tRemoving Replicas: 1`` and ReplicationFactor
                     does not count the replicas being added; with a partition filter only
                     the matching partition lines are printed, as Kafka does; ``TopicId``
                     for every topic that has one, over --zookeeper and --bootstrap-server)
    topics delete    Topic T is marked for deletion.    (--zookeeper; silent otherwise)
    topics alter     Adding partitions succeeded!       (--zookeeper; silent otherwise)

``topics describe`` filters, as kafka-topics.sh 2.8 (partition filters combine: a
partition matching any is printed)::

    --under-replicated-partitions   ISR smaller than the replica set
    --unavailable-partitions        no leader, or a leader that is not a live broker
    --under-min-isr-partitions      no leader, or ISR smaller than min.insync.replicas
    --at-min-isr-partitions         ISR exactly min.insync.replicas
    --topics-with-overrides         only the topic lines of topics with config overrides

``min.insync.replicas`` is the topic's effective value: over --bootstrap-server the
broker's DescribeConfigs answer (override, else the broker default); over --zookeeper
the topic's override, else 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from kbroker.cli.backends import NO_LEADER, Backend, PartitionView, TopicView, open_backend
from kbroker.cli.common import UsageError, client_configs, parse_key_values, parse_replica_assignment
from kclient.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    topics = nouns.add_parser("topics", help="create, list, describe, delete and grow topics")
    verbs = topics.add_subparsers(dest="verb", metavar="VERB", required=True)

    create = verbs.add_parser("create", parents=[connection], help="create a topic")
    create.add_argument("--topic", required=True)
    create.add_argument("--partitions", type=int, help="number of partitions (broker default with --bootstrap-server)")
    create.add_argument(
        "--replication-factor", type=int, help="replicas per partition (broker default with --bootstrap-server)"
    )
    create.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="topic config override (repeatable)"
    )
    create.add_argument(
        "--replica-assignment",
        metavar="B:B,B:B",
        help="explicit placement: partitions comma-separated, each a colon-separated broker list (0:1,1:2)",
    )
    create.add_argument("--if-not-exists", action="store_true", help="do nothing if the topic already exists")
    create.set_defaults(handler=create_topic)

    lister = verbs.add_parser("list", parents=[connection], help="list topic names")
    lister.set_defaults(handler=list_topics)

    describe = verbs.add_parser("describe", parents=[connection], help="partitions, leaders, replicas, ISR and configs")
    describe.add_argument("--topic", help="topic name, or several comma-separated (default: every topic)")
    describe.add_argument(
        "--under-replicated-partitions",
        action="store_true",
        help="only partitions whose ISR is smaller than their replica set",
    )
    describe.add_argument(
        "--unavailable-partitions",
        action="store_true",
        help="only partitions whose leader is none or not a live broker",
    )
    describe.add_argument(
        "--under-min-isr-partitions",
        action="store_true",
        help="only partitions without a leader or whose ISR is smaller than min.insync.replicas",
    )
    describe.add_argument(
        "--at-min-isr-partitions",
        action="store_true",
        help="only partitions whose ISR size is exactly min.insync.replicas",
    )
    describe.add_argument(
        "--topics-with-overrides",
        action="store_true",
        help="only the topic lines of topics that override a config (no partition lines)",
    )
    describe.set_defaults(handler=describe_topics)

    delete = verbs.add_parser("delete", parents=[connection], help="delete a topic")
    delete.add_argument("--topic", required=True)
    delete.add_argument("--if-exists", action="store_true", help="do nothing if the topic does not exist")
    delete.set_defaults(handler=delete_topic)

    alter = verbs.add_parser(
        "alter", parents=[connection], help="add partitions or set config overrides (--config KEY=VALUE)"
    )
    alter.add_argument("--topic", required=True)
    alter.add_argument("--partitions", type=int, help="the new, larger, partition count")
    alter.add_argument(
        "--config", action="append", default=[], metavar="KEY=VALUE", help="config override to set (repeatable)"
    )
    alter.add_argument("--if-exists", action="store_true", help="do nothing if the topic does not exist")
    alter.set_defaults(handler=alter_topic)


def _backend(args: argparse.Namespace) -> Backend:
    return open_backend(args.zookeeper, args.bootstrap_server, client_configs(args))


def _positive(value: int | None, flag: str) -> None:
    if value is not None and value < 1:
        raise UsageError(f"{flag} must be at least 1, got {value}")


# --- create --------------------------------------------------------------------------


def create_topic(args: argparse.Namespace) -> int:
    configs = parse_key_values(args.config, "--config")
    _positive(args.partitions, "--partitions")
    _positive(args.replication_factor, "--replication-factor")
    assignment = None
    if args.replica_assignment is not None:
        if args.partitions is not None or args.replication_factor is not None:
            raise UsageError("--replica-assignment cannot be combined with --partitions or --replication-factor")
        assignment = parse_replica_assignment(args.replica_assignment)
    elif args.zookeeper is not None and (args.partitions is None or args.replication_factor is None):
        raise UsageError(
            "--partitions and --replication-factor are required with --zookeeper (or give --replica-assignment)"
        )
    with _backend(args) as backend:
        try:
            backend.create_topic(
                args.topic,
                -1 if args.partitions is None else args.partitions,
                -1 if args.replication_factor is None else args.replication_factor,
                assignment,
                configs,
            )
        except TopicAlreadyExistsError:
            if args.if_not_exists:
                return 0
            raise
    print(f"Created topic {args.topic}.")
    return 0


# --- list ----------------------------------------------------------------------------


def list_topics(args: argparse.Namespace) -> int:
    with _backend(args) as backend:
        names = backend.list_topics()
        pending = backend.pending_deletion()
    for name in names:
        print(f"{name} - marked for deletion" if name in pending else name)
    return 0


# --- describe ------------------------------------------------------------------------


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids)


def topic_line(t: TopicView) -> str:
    configs = ",".join(f"{k}={v}" for k, v in sorted(t.configs.items()))
    topic_id = f"\tTopicId: {t.topic_id}" if t.topic_id else ""
    line = (
        f"Topic: {t.name}{topic_id}\tPartitionCount: {len(t.partitions)}"
        f"\tReplicationFactor: {t.replication_factor}\tConfigs: {configs}"
    )
    return line + "\tMarkedForDeletion: true" if t.marked_for_deletion else line


def partition_line(topic: str, p: PartitionView) -> str:
    leader = "none" if p.leader == NO_LEADER else str(p.leader)
    line = (
        f"\tTopic: {topic}\tPartition: {p.partition}\tLeader: {leader}"
        f"\tReplicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}"
    )
    if p.adding or p.removing:  # a move under way
        line += f"\tAdding Replicas: {_ids(p.adding)}\tRemoving Replicas: {_ids(p.removing)}"
    return line


def is_under_replicated(p: PartitionView) -> bool:
    return len(p.isr) < len(p.replicas)


def is_unavailable(p: PartitionView, live: set[int]) -> bool:
    return p.leader == NO_LEADER or p.leader not in live


def is_under_min_isr(p: PartitionView, min_isr: int) -> bool:
    return p.leader == NO_LEADER or len(p.isr) < min_isr


def is_at_min_isr(p: PartitionView, min_isr: int) -> bool:
    return len(p.isr) == min_isr


def describe_lines(
    topics: Iterable[TopicView],
    *,
    under_replicated: bool = False,
    unavailable: bool = False,
    live: set[int] | None = None,
    under_min_isr: bool = False,
    at_min_isr: bool = False,
    min_isr: dict[str, int] | None = None,
    with_overrides: bool = False,
) -> list[str]:
    """``kafka-topics.sh --describe`` output; a partition filter keeps only matching partition
    lines, ``with_overrides`` only the topic lines of topics with config overrides."""
    filtered = under_replicated or unavailable or under_min_isr or at_min_isr
    live_ids = live or set()
    out: list[str] = []
    for t in topics:
        if with_overrides:
            if t.configs:
                out.append(topic_line(t))
            continue
        if not filtered:
            out.append(topic_line(t))
        wanted_isr = (min_isr or {}).get(t.name, 1)
        for p in t.partitions:
            if filtered and not (
                (under_replicated and is_under_replicated(p))
                or (unavailable and is_unavailable(p, live_ids))
                or (under_min_isr and is_under_min_isr(p, wanted_isr))
                or (at_min_isr and is_at_min_isr(p, wanted_isr))
            ):
                continue
            out.append(partition_line(t.name, p))
    return out


def describe_topics(args: argparse.Namespace) -> int:
    names = None
    if args.topic is not None:
        names = [n.strip() for n in args.topic.split(",") if n.strip()]
        if not names:
            raise UsageError("--topic is empty")
    partition_filter = args.under_replicated_partitions or args.unavailable_partitions
    partition_filter = partition_filter or args.under_min_isr_partitions or args.at_min_isr_partitions
    if args.topics_with_overrides and partition_filter:
        raise UsageError("--topics-with-overrides cannot be combined with a partition filter")
    with _backend(args) as backend:
        topics = backend.describe_topics(names)
        live = {b.broker_id for b in backend.brokers()[0]} if args.unavailable_partitions else set()
        by_isr = args.under_min_isr_partitions or args.at_min_isr_partitions
        min_isr = backend.min_insync_replicas(topics) if by_isr else {}
    for line in describe_lines(
        topics,
        under_replicated=args.under_replicated_partitions,
        unavailable=args.unavailable_partitions,
        live=live,
        under_min_isr=args.under_min_isr_partitions,
        at_min_isr=args.at_min_isr_partitions,
        min_isr=min_isr,
        with_overrides=args.topics_with_overrides,
    ):
        print(line)
    return 0


# --- delete / alter ------------------------------------------------------------------


def delete_topic(args: argparse.Namespace) -> int:
    with _backend(args) as backend:
        try:
            backend.delete_topic(args.topic)
        except UnknownTopicOrPartitionError:
            if args.if_exists:
                return 0
            raise
    if args.zookeeper is not None:
        print(f"Topic {args.topic} is marked for deletion.")
    return 0


def alter_topic(args: argparse.Namespace) -> int:
    configs = parse_key_values(args.config, "--config")
    _positive(args.partitions, "--partitions")
    if args.partitions is None and not configs:
        raise UsageError("give --partitions N or --config KEY=VALUE")
    with _backend(args) as backend:
        try:
            if configs and args.partitions is not None:  # both or neither
                backend.create_partitions(args.topic, args.partitions, validate_only=True)
            if configs:
                backend.alter_config(args.topic, configs)
            if args.partitions is not None:
                backend.create_partitions(args.topic, args.partitions)
        except UnknownTopicOrPartitionError:
            if args.if_exists:
                return 0
            raise
    if args.zookeeper is not None:
        if configs:
            print(f"Updated config for topic {args.topic}.")
        if args.partitions is not None:
            print("Adding partitions succeeded!")
    return 0
