"""``kctl transactions list|describe|abort``: kafka-transactions.sh (KIP-664).

Every verb talks to the brokers (``--bootstrap-server``). Output is Kafka's tables
(each cell padded to its column's widest, a tab after each; ``None`` when unknown)::

    transactions list        TransactionalId Coordinator ProducerId TransactionState
                             one row per transactional id any broker's coordinator knows,
                             sorted by id (Coordinator: the broker id that listed it).
                             --duration-filter MS: only the transactions open for longer
                             than MS (each is described for its start time)
    transactions describe    CoordinatorId TransactionalId ProducerId ProducerEpoch
                             TransactionState TransactionTimeoutMs
                             CurrentTransactionStartTimeMs TransactionDurationMs
                             TopicPartitions (t-0,t-1)
    transactions abort       nothing on success (Kafka's tool prints nothing; --verbose
                             says what was aborted, on stderr)

``abort`` writes an ABORT marker to one partition for a hanging transaction: one whose
coordinator lost track of it, which holds the partition's last stable offset back (so
read_committed consumers wait forever). The transaction is named either by
``--start-offset`` (its first offset on the partition) or by ``--producer-id``,
``--producer-epoch`` and ``--coordinator-epoch``. Kafka finds the producer of a start
offset with DescribeProducers, which kbroker does not serve: kctl reads the batch at that
offset instead (a transactional batch names its producer id and epoch), and refuses an
offset that is no open transaction's first batch (reading it needs READ on the topic).
The abort needs CLUSTER_ACTION on the Cluster.

Kafka's ``describe-producers`` and ``find-hanging`` verbs need DescribeProducers: not
available.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kbroker.cli.common import CliError, UsageError, check_bootstrap, client_configs
from kclient import AdminClient
from kclient.admin import PartitionBatch, TransactionDescription, TransactionListing
from kclient.errors import BrokerResponseError

NOUN = "transactions"

LIST_HEADER = ("TransactionalId", "Coordinator", "ProducerId", "TransactionState")
DESCRIBE_HEADER = (
    "CoordinatorId",
    "TransactionalId",
    "ProducerId",
    "ProducerEpoch",
    "TransactionState",
    "TransactionTimeoutMs",
    "CurrentTransactionStartTimeMs",
    "TransactionDurationMs",
    "TopicPartitions",
)


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    noun = nouns.add_parser(
        NOUN,
        help="list, describe and abort transactions (kafka-transactions.sh)",
        description="kafka-transactions.sh: analyze the transactional state of producers in the cluster, "
        "and recover from hanging transactions.",
    )
    verbs = noun.add_subparsers(dest="verb", metavar="VERB", required=True)

    lst = verbs.add_parser("list", parents=[connection], help="list transactions")
    lst.add_argument(
        "--duration-filter",
        type=int,
        metavar="MS",
        help="duration (in millis) to filter by: if < 0, all transactions are listed; otherwise only "
        "transactions running longer than this duration",
    )
    lst.set_defaults(handler=list_transactions)

    desc = verbs.add_parser(
        "describe",
        parents=[connection],
        help="describe the state of an active transactional-id",
        description="Describe the state of an active transactional-id.",
    )
    desc.add_argument("--transactional-id", required=True, help="transactional id")
    desc.set_defaults(handler=describe_transaction)

    abort = verbs.add_parser(
        "abort",
        parents=[connection],
        help="abort a hanging transaction (requires administrative privileges)",
        description="Abort a hanging transaction on one partition: an ABORT marker written at its leader "
        "(CLUSTER_ACTION on the Cluster). Name the transaction by --start-offset, or by --producer-id, "
        "--producer-epoch and --coordinator-epoch.",
    )
    abort.add_argument("--topic", required=True, help="topic name")
    abort.add_argument("--partition", required=True, type=int, help="partition number")
    by_offset = abort.add_argument_group(
        "by start offset", "the first offset of the transaction to abort on the partition"
    )
    by_offset.add_argument(
        "--start-offset", type=int, metavar="OFFSET", help="start offset of the transaction to abort"
    )
    by_producer = abort.add_argument_group("by producer", "give all three")
    by_producer.add_argument("--producer-id", type=int, help="producer id")
    by_producer.add_argument("--producer-epoch", type=int, help="producer epoch")
    by_producer.add_argument("--coordinator-epoch", type=int, help="coordinator epoch")
    abort.set_defaults(handler=abort_transaction)


# --- output ----------------------------------------------------------------------------


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Kafka's ``prettyPrintTable``: every cell padded to its column's width and followed
    by a tab (trailing whitespace dropped)."""
    all_rows = [list(header), *(list(r) for r in rows)]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(header))]
    return ["".join(cell.ljust(w) + "\t" for cell, w in zip(r, widths, strict=True)).rstrip() for r in all_rows]


def list_rows(listings: Iterable[TransactionListing]) -> list[list[str]]:
    return [[t.transactional_id, str(t.coordinator_id), str(t.producer_id), t.state] for t in listings]


def describe_row(d: TransactionDescription, now_ms: int) -> list[str]:
    start = d.transaction_start_time_ms
    return [
        str(d.coordinator_id),
        d.transactional_id,
        str(d.producer_id),
        str(d.producer_epoch),
        d.state,
        str(d.transaction_timeout_ms),
        "None" if start is None else str(start),
        "None" if start is None else str(now_ms - start),
        ",".join(f"{tp.topic}-{tp.partition}" for tp in d.partitions),
    ]


def _now_ms() -> int:
    return int(time.time() * 1000)


# --- the verbs ---------------------------------------------------------------------------


def open_admin(args: argparse.Namespace) -> AdminClient:
    if args.bootstrap_server is None:
        raise UsageError("transactions needs --bootstrap-server")
    return AdminClient(check_bootstrap(args.bootstrap_server), **client_configs(args))


def _failed(what: str, exc: BrokerResponseError) -> CliError:
    """Kafka's ``<what>: <the error>`` line (exit 1)."""
    return CliError(f"{what}: {exc}")


def longer_than(
    listings: Sequence[TransactionListing],
    describe: Callable[[list[str]], list[TransactionDescription]],
    ms: int,
    now_ms: int,
) -> list[TransactionListing]:
    """Those of ``listings`` whose open transaction began more than ``ms`` ago (Kafka's
    ``--duration-filter``; kbroker's ListTransactions has no such filter, so each is
    described). An id gone in between is left out."""
    if ms < 0 or not listings:
        return list(listings)
    started: dict[str, int | None] = {}
    for t in listings:
        try:
            (d,) = describe([t.transactional_id])
        except BrokerResponseError:
            continue
        started[t.transactional_id] = d.transaction_start_time_ms
    return [t for t in listings if (s := started.get(t.transactional_id)) is not None and now_ms - s > ms]


def list_transactions(args: argparse.Namespace) -> int:
    with open_admin(args) as admin:
        try:
            listings = admin.list_transactions()
            if args.duration_filter is not None:
                listings = longer_than(listings, admin.describe_transactions, args.duration_filter, _now_ms())
        except BrokerResponseError as exc:
            raise _failed("Failed to list transactions", exc) from exc
    for line in table(LIST_HEADER, list_rows(listings)):
        print(line)
    return 0


def describe_transaction(args: argparse.Namespace) -> int:
    tid = args.transactional_id
    if not tid:
        raise UsageError("--transactional-id is empty")
    with open_admin(args) as admin:
        try:
            (d,) = admin.describe_transactions([tid])
        except BrokerResponseError as exc:
            raise _failed(f"Failed to describe transaction state of transactional-id `{tid}`", exc) from exc
    for line in table(DESCRIBE_HEADER, [describe_row(d, _now_ms())]):
        print(line)
    return 0


def check_abort_flags(args: argparse.Namespace) -> None:
    """One of the two ways to name the transaction, complete, and not both."""
    by_producer = {
        "--producer-id": args.producer_id,
        "--producer-epoch": args.producer_epoch,
        "--coordinator-epoch": args.coordinator_epoch,
    }
    given = [flag for flag, value in by_producer.items() if value is not None]
    if args.start_offset is None and not given:
        raise UsageError(
            "The transaction to abort must be identified either with --start-offset or with "
            "--producer-id, --producer-epoch, and --coordinator-epoch"
        )
    if args.start_offset is not None and given:
        raise UsageError(f"--start-offset cannot be combined with {', '.join(given)}: give one or the other")
    missing = [flag for flag, value in by_producer.items() if value is None]
    if args.start_offset is None and missing:
        raise UsageError(f"Missing required argument {missing[0]}")
    if args.partition < 0:
        raise UsageError(f"--partition must be >= 0, got {args.partition}")
    if args.start_offset is not None and args.start_offset < 0:
        raise UsageError(f"--start-offset must be >= 0, got {args.start_offset}")
    if args.producer_id is not None and args.producer_id < 0:
        raise UsageError(f"--producer-id must be >= 0, got {args.producer_id}")
    if args.producer_epoch is not None and not 0 <= args.producer_epoch <= 32767:
        raise UsageError(f"--producer-epoch must be 0..32767, got {args.producer_epoch}")


def producer_of(batch: PartitionBatch, topic: str, partition: int, offset: int) -> tuple[int, int]:
    """The producer id and epoch of the open transaction that starts at ``offset``, from
    the batch read there; a CliError (Kafka's message, and why) when there is none."""
    where = f"Could not find any open transactions starting at offset {offset} on partition {topic}-{partition}"
    h = batch.header
    if h is None:
        raise CliError(f"{where}: there is no record at that offset yet (the high watermark is {batch.high_watermark})")
    if h.base_offset != offset:
        raise CliError(f"{where}: offset {offset} is inside a batch that starts at {h.base_offset}")
    if h.is_control:
        raise CliError(f"{where}: offset {offset} holds a transaction marker, not a transaction's records")
    if not h.is_transactional:
        raise CliError(f"{where}: the batch at offset {offset} is not transactional (producer id {h.producer_id})")
    if batch.last_stable_offset > offset:
        raise CliError(
            f"{where}: the transaction of producer {h.producer_id} (epoch {h.producer_epoch}) that starts there "
            f"has completed (the last stable offset is {batch.last_stable_offset})"
        )
    return h.producer_id, h.producer_epoch


def abort_transaction(args: argparse.Namespace) -> int:
    check_abort_flags(args)
    topic, partition = args.topic, args.partition
    with open_admin(args) as admin:
        if args.start_offset is not None:
            try:
                batch = admin.batch_at(topic, partition, args.start_offset)
            except BrokerResponseError as exc:
                raise _failed(
                    f"Failed to read the batch at offset {args.start_offset} of {topic}-{partition}", exc
                ) from exc
            producer_id, producer_epoch = producer_of(batch, topic, partition, args.start_offset)
            coordinator_epoch = 0  # unknown without DescribeProducers: Kafka's choice for "none seen"
        else:
            producer_id, producer_epoch = args.producer_id, args.producer_epoch
            # A hanging transaction of a new producer id has coordinator epoch -1 in Kafka's
            # DescribeProducers; 0 is no newer than any.
            coordinator_epoch = max(args.coordinator_epoch, 0)
        spec = (
            f"{{topicPartition={topic}-{partition}, producerId={producer_id}, producerEpoch={producer_epoch}, "
            f"coordinatorEpoch={coordinator_epoch}}}"
        )
        try:
            admin.abort_transaction(topic, partition, producer_id, producer_epoch, coordinator_epoch)
        except BrokerResponseError as exc:
            raise _failed(f"Failed to abort transaction {spec}", exc) from exc
    if args.verbose:
        print(f"kctl: aborted the transaction {spec}", file=sys.stderr)
    return 0
