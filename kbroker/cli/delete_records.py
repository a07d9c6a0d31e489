"""``kctl delete-records --offset-json-file F``: kafka-delete-records.sh.

The file is Kafka's JSON::

    {"partitions": [{"topic": "t", "partition": 0, "offset": 42}], "version": 1}

Every record below ``offset`` is deleted (the partition's log start offset moves there;
``-1``: the high watermark, everything committed). Output, as kafka-delete-records.sh
(a tab before ``low_watermark`` / ``error``; partitions sorted)::

    Executing records delete operation
    Records delete operation completed:
    partition: t-0\tlow_watermark: 42
    partition: t-1\terror: [Error 1] OffsetOutOfRangeError: ...

Exit 1 when any partition failed (after printing every line).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from kbroker.cli.common import CliError, UsageError, check_bootstrap, client_configs
from kclient import AdminClient, TopicPartition

NOUN = "delete-records"


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    p = nouns.add_parser(
        NOUN,
        parents=[connection],
        help="delete the records below given offsets (move log start offsets)",
        description="kafka-delete-records.sh: delete every record below the offset given for each partition.",
    )
    p.add_argument(
        "--offset-json-file",
        required=True,
        metavar="FILE",
        help='{"partitions":[{"topic":"t","partition":0,"offset":42}],"version":1} (offset -1: the high watermark)',
    )
    p.set_defaults(handler=run)


def parse_offsets(text: str, where: str) -> dict[TopicPartition, int]:
    """Kafka's offset JSON (version 1; no version means 1), duplicates refused."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: expected a JSON object with 'partitions' and 'version'")
    if doc.get("version", 1) != 1:
        raise UsageError(f"{where}: Not supported version field value {doc.get('version')}")
    parts = doc.get("partitions")
    if not isinstance(parts, list):
        raise UsageError(f"{where}: Missing partitions field")
    pairs: list[tuple[TopicPartition, int]] = []
    for entry in parts:
        topic = entry.get("topic") if isinstance(entry, dict) else None
        partition = entry.get("partition") if isinstance(entry, dict) else None
        offset = entry.get("offset") if isinstance(entry, dict) else None
        if not isinstance(topic, str) or not topic or type(partition) is not int or type(offset) is not int:
            raise UsageError(f"{where}: each partition needs a topic (string), partition and offset (numbers): {entry}")
        pairs.append((TopicPartition(topic, partition), offset))
    repeated = sorted(f"{tp.topic}-{tp.partition}" for tp, n in Counter(tp for tp, _ in pairs).items() if n > 1)
    if repeated:
        raise UsageError(f"Offset json file contains duplicate topic partitions: {','.join(repeated)}")
    if not pairs:
        raise UsageError(f"{where} names no partition")
    return dict(pairs)


def run(args: argparse.Namespace) -> int:
    if args.bootstrap_server is None:
        raise UsageError("delete-records needs --bootstrap-server")
    try:
        with open(args.offset_json_file, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read --offset-json-file: {exc.strerror}: {args.offset_json_file}") from None
    offsets = parse_offsets(text, args.offset_json_file)
    print("Executing records delete operation")
    with AdminClient(check_bootstrap(args.bootstrap_server), **client_configs(args)) as admin:
        results = admin.delete_records(offsets, raise_errors=False)
    print("Records delete operation completed:")
    for tp, r in sorted(results.items()):
        outcome = f"error: {r.error}" if r.error is not None else f"low_watermark: {r.low_watermark}"
        print(f"partition: {tp.topic}-{tp.partition}\t{outcome}")
    failed = sum(1 for r in results.values() if r.error is not None)
    if failed:
        raise CliError(f"records of {failed} partition(s) were not deleted")
    return 0
