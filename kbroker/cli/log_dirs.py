"""``kctl log-dirs --describe``: what each broker holds on disk, as kafka-log-dirs.sh.

Output (Kafka's JSON, one line, after the same two lines kafka-log-dirs.sh prints)::

    Querying brokers for log directories information
    Received log directory information from brokers 0,1
    {"version":1,"brokers":[{"broker":0,"logDirs":[{"logDir":"/data/broker-0","error":null,
     "totalBytes":..,"usableBytes":..,"size":..,"partitions":[{"partition":"t-0","size":4096,
     "offsetLag":0,"isFuture":false,"logStartOffset":0,"logEndOffset":42,"segments":1,
     "cleaner":{"dirtyRatio":0.5,"lastCleanedOffset":-1,"firstUncleanableOffset":40,
     "bytesCleaned":0,"uncleanable":null}}]}]}]}

kbroker adds, beside Kafka's keys, the directory's total ``size``, each partition's
offsets and segment count, ``offline`` (the reason) for an offline log, and for
compacted topics the log cleaner's state under ``cleaner``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kbroker.cli.common import UsageError, check_bootstrap, client_configs
from kclient import AdminClient
from kclient.errors import for_code
from kclient.proto.kbroker.v1 import admin_pb2


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    p = nouns.add_parser(
        "log-dirs",
        parents=[connection],
        help="each broker's data directory: sizes per partition, lag, compaction state",
        description="kafka-log-dirs.sh --describe: ask brokers what they hold on disk.",
    )
    p.add_argument("--describe", action="store_true", required=True, help="describe the log directories")
    p.add_argument("--broker-list", help="comma-separated broker ids (default: every live broker)")
    p.add_argument("--topic-list", help="comma-separated topics (default: every topic)")
    p.set_defaults(handler=describe)


def _ids(text: str | None) -> list[int] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() for t in items):
        raise UsageError(f"--broker-list expects broker ids like 0,1,2, got {text!r}")
    return [int(t) for t in items]


def _partition(topic: str, p: admin_pb2.LogDirPartition) -> dict[str, Any]:
    row: dict[str, Any] = {
        "partition": f"{topic}-{p.partition_index}",
        "size": p.partition_size,
        "offsetLag": p.offset_lag,
        "isFuture": p.is_future_key,
        "logStartOffset": p.log_start_offset,
        "logEndOffset": p.log_end_offset,
        "segments": p.num_segments,
    }
    if p.offline_reason:
        row["offline"] = p.offline_reason
    if p.HasField("cleaner"):
        c = p.cleaner
        row["cleaner"] = {
            "dirtyRatio": round(c.dirty_ratio, 4),
            "lastCleanedOffset": c.last_cleaned_offset,
            "firstUncleanableOffset": c.first_uncleanable_offset,
            "bytesCleaned": c.bytes_cleaned,
            "uncleanable": c.uncleanable_reason if c.uncleanable else None,
        }
    return row


def as_json(answers: dict[int, admin_pb2.DescribeLogDirsResponse]) -> dict[str, Any]:
    brokers = []
    for broker_id, resp in sorted(answers.items()):
        dirs = []
        for d in resp.results:
            parts = [_partition(t.name, p) for t in d.topics for p in t.partitions]
            dirs.append(
                {
                    "logDir": d.log_dir,
                    "error": for_code(d.error_code).__name__ if d.error_code else None,
                    "totalBytes": d.total_bytes,
                    "usableBytes": d.usable_bytes,
                    "size": sum(p["size"] for p in parts),
                    "partitions": parts,
                }
            )
        brokers.append({"broker": broker_id, "logDirs": dirs})
    return {"version": 1, "brokers": brokers}


def describe(args: argparse.Namespace) -> int:
    if getattr(args, "zookeeper", None) is not None:
        raise UsageError("log-dirs talks to brokers: give --bootstrap-server, not --zookeeper")
    if args.bootstrap_server is None:
        raise UsageError("log-dirs needs --bootstrap-server HOST:PORT")
    ids = _ids(args.broker_list)
    topics = [t.strip() for t in args.topic_list.split(",") if t.strip()] if args.topic_list else None
    with AdminClient(bootstrap_servers=check_bootstrap(args.bootstrap_server), **client_configs(args)) as admin:
        answers = admin.describe_log_dirs(ids, topics)
    print("Querying brokers for log directories information")  # after: a failure prints only its one line
    print("Received log directory information from brokers " + ",".join(str(b) for b in sorted(answers)))
    print(json.dumps(as_json(answers), separators=(",", ":")))
    return 0
