"""DescribeLogDirs (Kafka's API 35): this broker's data directory, partition by partition.

kbroker has one data directory per broker (``log.dirs`` names one), so the answer holds
one LogDirResult. Sizes are the bytes of every segment; ``offset_lag`` is Kafka's
``max(high watermark - log end offset, 0)``; offline logs are listed with their reason
and KAFKA_STORAGE_ERROR on the directory, as Kafka marks a failed directory. Compacted
logs carry the cleaner's state (dirty ratio, first dirty offset, bytes cleaned,
uncleanable), which Kafka shows as LogCleanerManager metrics.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kbroker.replication.replica_manager import ReplicaManager
from kclient.errors import BrokerResponseError, KafkaStorageError

TopicPartition = tuple[str, int]


@dataclass(slots=True)
class LogDirPartition:
    partition: int
    size: int = 0
    log_start_offset: int = 0
    log_end_offset: int = 0
    num_segments: int = 0
    offset_lag: int = 0
    offline_reason: str = ""
    cleaner: Mapping[str, Any] | None = None
    """A compacted log's cleaner state: dirty_ratio, last_cleaned_offset,
    first_uncleanable_offset, bytes_cleaned, uncleanable (the reason, or None)."""


@dataclass(slots=True)
class LogDir:
    path: str
    total_bytes: int
    usable_bytes: int
    error: BrokerResponseError | None = None
    topics: dict[str, list[LogDirPartition]] = field(default_factory=dict)
    """Topic -> its partitions here, by partition; topics sorted."""


def _filesystem(path: str) -> tuple[int, int]:
    try:
        st = os.statvfs(path)
    except OSError:
        return -1, -1
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def describe_log_dirs(replicas: ReplicaManager, wanted: Mapping[str, set[int] | None] | None) -> list[LogDir]:
    """``wanted``: topic -> partitions (None: all of the topic's), None for everything."""
    logs = replicas.log_manager

    def included(tp: TopicPartition) -> bool:
        if wanted is None:
            return True
        parts = wanted.get(tp[0], ())
        return parts is None or tp[1] in parts

    data_dir = str(logs.data_dir)
    total, usable = _filesystem(data_dir)
    cleaner = logs.cleaner_state()
    hw = {(p.topic, p.index): p.high_watermark for p in replicas.partitions()}
    rows: dict[str, dict[int, LogDirPartition]] = {}
    for tp, log in sorted(logs.logs().items()):
        if included(tp):
            rows.setdefault(tp[0], {})[tp[1]] = LogDirPartition(
                tp[1],
                log.size_in_bytes,
                log.log_start_offset,
                log.log_end_offset,
                log.num_segments,
                max(hw.get(tp, log.log_end_offset) - log.log_end_offset, 0),
                cleaner=cleaner.get(tp),
            )
    offline = {tp: why for tp, why in logs.offline_logs().items() if included(tp)}
    for tp, why in sorted(offline.items()):
        rows.setdefault(tp[0], {}).setdefault(tp[1], LogDirPartition(tp[1])).offline_reason = why
    error = KafkaStorageError(f"{len(offline)} log(s) offline") if offline else None
    topics = {name: [parts[p] for p in sorted(parts)] for name, parts in sorted(rows.items())}
    return [LogDir(data_dir, total, usable, error, topics)]
