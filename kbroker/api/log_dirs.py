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
from collections.abc import Iterable, Mapping
from typing import Any

from kbroker.replication.replica_manager import ReplicaManager
from kclient.errors import KafkaStorageError
from kclient.proto.kbroker.v1 import admin_pb2

TopicPartition = tuple[str, int]


def _wanted(filters: Iterable[admin_pb2.LogDirTopicFilter]) -> Mapping[str, set[int] | None] | None:
    """None: everything; else topic -> partitions (None: all of the topic's)."""
    out: dict[str, set[int] | None] = {}
    for f in filters:
        parts = set(f.partitions)
        if f.name in out and (out[f.name] is None or not parts):
            out[f.name] = None
            continue
        known = out.get(f.name)
        out[f.name] = (known or set()) | parts if parts else None
    return out or None


def _filesystem(path: str) -> tuple[int, int]:
    try:
        st = os.statvfs(path)
    except OSError:
        return -1, -1
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def describe_log_dirs(
    broker_id: int, replicas: ReplicaManager, request: admin_pb2.DescribeLogDirsRequest
) -> admin_pb2.DescribeLogDirsResponse:
    logs = replicas.log_manager
    wanted = _wanted(request.topics)

    def included(tp: TopicPartition) -> bool:
        if wanted is None:
            return True
        parts = wanted.get(tp[0], ())
        return parts is None or tp[1] in parts

    resp = admin_pb2.DescribeLogDirsResponse(broker_id=broker_id)
    data_dir = str(logs.data_dir)
    total, usable = _filesystem(data_dir)
    result = resp.results.add(log_dir=data_dir, total_bytes=total, usable_bytes=usable)
    cleaner = logs.cleaner_state()
    hw = {(p.topic, p.index): p.high_watermark for p in replicas.partitions()}
    rows: dict[str, list[admin_pb2.LogDirPartition]] = {}
    for tp, log in sorted(logs.logs().items()):
        if not included(tp):
            continue
        row = admin_pb2.LogDirPartition(
            partition_index=tp[1],
            partition_size=log.size_in_bytes,
            log_start_offset=log.log_start_offset,
            log_end_offset=log.log_end_offset,
            num_segments=log.num_segments,
            offset_lag=max(hw.get(tp, log.log_end_offset) - log.log_end_offset, 0),
        )
        state = cleaner.get(tp)
        if state is not None:
            _fill_cleaner(row.cleaner, state)
        rows.setdefault(tp[0], []).append(row)
    offline = {tp: why for tp, why in logs.offline_logs().items() if included(tp)}
    for tp, why in sorted(offline.items()):
        if all(r.partition_index != tp[1] for r in rows.get(tp[0], ())):
            rows.setdefault(tp[0], []).append(admin_pb2.LogDirPartition(partition_index=tp[1], offline_reason=why))
        else:
            next(r for r in rows[tp[0]] if r.partition_index == tp[1]).offline_reason = why
    if offline:
        result.error_code = KafkaStorageError.errno  # type: ignore[assignment]
    for name in sorted(rows):
        result.topics.add(name=name, partitions=sorted(rows[name], key=lambda r: r.partition_index))
    return resp


def _fill_cleaner(out: admin_pb2.LogCleanerState, state: Mapping[str, Any]) -> None:
    out.dirty_ratio = float(state["dirty_ratio"])
    out.last_cleaned_offset = int(state["last_cleaned_offset"])
    out.first_uncleanable_offset = int(state["first_uncleanable_offset"])
    out.bytes_cleaned = int(state["bytes_cleaned"])
    reason = state["uncleanable"]
    out.uncleanable = reason is not None
    out.uncleanable_reason = str(reason or "")
