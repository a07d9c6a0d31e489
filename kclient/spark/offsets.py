"""Per topic-partition offsets: the stream offsets of the kbroker source, and ranges to read.

Offsets travel as Spark's Kafka source writes them, one JSON object of topic ->
partition (a string) -> offset::

    {"orders": {"0": 23, "1": 42}, "payments": {"0": 7}}

The same shape is the value of the ``startingOffsets`` / ``endingOffsets`` options
(where -2 means earliest and -1 latest) and of the ``*ByTimestamp`` options (where the
numbers are epoch milliseconds). As a stream offset the numbers are always concrete
offsets: the next offset to read of each partition. :func:`to_json_dict` always sorts
topics and partitions, so equal offsets serialise to equal JSON (Spark compares stream
offsets by their JSON text).

An :class:`OffsetRange` is a half-open ``[start, end)`` range of one partition; a
Spark input partition reads one range (:func:`split_ranges` cuts the large ones).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kclient.spark.errors import KbrokerOptionError
from kclient.structs import TopicPartition

EARLIEST = -2
"""In an offsets option: the partition's earliest offset."""
LATEST = -1
"""In an offsets option: the partition's latest offset (the high watermark)."""

PartitionOffsets = dict[TopicPartition, int]
JsonOffsets = dict[str, dict[str, int]]


def to_json_dict(offsets: Mapping[TopicPartition, int]) -> JsonOffsets:
    """``{topic: {"partition": offset}}`` sorted by topic, then partition number."""
    out: JsonOffsets = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def from_json_dict(data: Mapping[str, Any]) -> PartitionOffsets:
    """The inverse of :func:`to_json_dict` (for stream offsets Spark hands back)."""
    out: PartitionOffsets = {}
    for topic, parts in data.items():
        for p, offset in parts.items():
            out[TopicPartition(topic, int(p))] = int(offset)
    return out


def to_json(offsets: Mapping[TopicPartition, int]) -> str:
    return json.dumps(to_json_dict(offsets))


def _load_object(text: str, option: str, example: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KbrokerOptionError(
            f"option {option!r} is not valid JSON ({exc.msg} at character {exc.pos}): {text!r}; expected e.g. {example}"
        ) from None
    if not isinstance(data, dict) or not data:
        raise KbrokerOptionError(f"option {option!r} must be a non-empty JSON object, e.g. {example}; got {text!r}")
    return data


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def parse_partition_numbers(text: str, option: str) -> PartitionOffsets:
    """``{"topic": {"0": n, ...}}`` from an option, with every number an integer."""
    example = '{"topicA": {"0": 23, "1": -2}}'
    data = _load_object(text, option, example)
    out: PartitionOffsets = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict) or not parts:
            raise KbrokerOptionError(
                f"option {option!r}: the value of topic {topic!r} must be a non-empty object of partition -> number, "
                f"e.g. {example}"
            )
        for p, n in parts.items():
            if not p.isdigit():
                raise KbrokerOptionError(f"option {option!r}: {p!r} of topic {topic!r} is not a partition number")
            num = _int(n)
            if num is None:
                raise KbrokerOptionError(f"option {option!r}: the value of {topic}-{p} is not an integer: {n!r}")
            out[TopicPartition(topic, int(p))] = num
    return out


def parse_assign(text: str) -> list[TopicPartition]:
    """The ``assign`` option: ``{"topicA": [0, 1], "topicB": [2]}``."""
    example = '{"topicA": [0, 1], "topicB": [2]}'
    data = _load_object(text, "assign", example)
    out: set[TopicPartition] = set()
    for topic, parts in data.items():
        if not isinstance(parts, list) or not parts:
            raise KbrokerOptionError(
                f"option 'assign': topic {topic!r} needs a non-empty list of partition numbers, e.g. {example}"
            )
        for p in parts:
            num = _int(p)
            if num is None or num < 0:
                raise KbrokerOptionError(f"option 'assign': {p!r} of topic {topic!r} is not a partition number")
            out.add(TopicPartition(topic, num))
    return sorted(out)


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)

    def split(self, parts: int) -> list[OffsetRange]:
        """``parts`` contiguous ranges of (nearly) equal size covering this one."""
        parts = max(1, min(parts, self.size))
        step, extra = divmod(self.size, parts)
        out, start = [], self.start
        for i in range(parts):
            end = start + step + (1 if i < extra else 0)
            out.append(OffsetRange(self.topic, self.partition, start, end))
            start = end
        return out


def split_ranges(
    ranges: Iterable[OffsetRange], max_records: int | None = None, min_partitions: int | None = None
) -> list[OffsetRange]:
    """Cut ranges so none holds more than ``max_records`` and there are at least ``min_partitions``.

    Empty ranges are dropped. As Spark's Kafka source: a range is cut into pieces of at
    most ``max_records`` records; when that leaves fewer than ``min_partitions`` ranges,
    each range is cut further in proportion to its share of all the records.
    """
    work = [r for r in ranges if r.size > 0]
    out: list[OffsetRange] = []
    for r in work:
        out.extend(r.split(math.ceil(r.size / max_records)) if max_records else [r])
    if min_partitions and len(out) < min_partitions:
        total = sum(r.size for r in out)
        finer: list[OffsetRange] = []
        for r in out:
            finer.extend(r.split(max(1, math.ceil(min_partitions * r.size / total))))
        out = finer
    return sorted(out, key=lambda r: (r.topic, r.partition, r.start))


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], limit: int
) -> PartitionOffsets:
    """End offsets admitting at most about ``limit`` records from ``start`` toward ``latest``.

    Spark's ``maxOffsetsPerTrigger``: the limit is shared among partitions in proportion
    to their backlog (a partition's share rounds down, a share below one record rounds up
    so a small backlog is not starved). Partitions absent from ``start`` start at 0.
    """
    backlog = {tp: max(latest[tp] - start.get(tp, 0), 0) for tp in latest}
    total = sum(backlog.values())
    if total <= limit:
        return dict(latest)
    out: PartitionOffsets = {}
    for tp, end in latest.items():
        begin = start.get(tp, 0)
        if backlog[tp] == 0:
            out[tp] = end
            continue
        share = limit * backlog[tp] / total
        take = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(begin + take, end)
    return out
