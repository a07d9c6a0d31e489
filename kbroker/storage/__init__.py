"""Segmented log storage: segments, sparse indexes, recovery, retention, leader epochs.

Knows nothing of ZooKeeper or gRPC. Modules, one concept each:

- :mod:`~kbroker.storage.files`: file and directory names, checkpoint files
- :mod:`~kbroker.storage.log_config`: :class:`LogConfig` (Kafka topic configs)
- :mod:`~kbroker.storage.index`: :class:`OffsetIndex`, :class:`TimeIndex`
- :mod:`~kbroker.storage.segment`: :class:`LogSegment`
- :mod:`~kbroker.storage.leader_epoch`: :class:`LeaderEpochCache`
- :mod:`~kbroker.storage.producer_state`: idempotent producers' last batches (dedupe, sequence checks)
- :mod:`~kbroker.storage.validator`: batch checks and stamping on append
- :mod:`~kbroker.storage.record_checks`: the records of a producer's batch (count, offset deltas, lengths)
- :mod:`~kbroker.storage.loader`: opening and recovering a partition directory
- :mod:`~kbroker.storage.log`: :class:`Log`, one partition
- :mod:`~kbroker.storage.log_manager`: :class:`LogManager`, one data directory
- :mod:`~kbroker.storage.offset_map`: the cleaner's key -> last offset map
- :mod:`~kbroker.storage.batch_filter`: stored batches rebuilt around some of their records
- :mod:`~kbroker.storage.cleaner`: compaction of one log (offset map, recopy, swap)
- :mod:`~kbroker.storage.cleaner_manager`: the cleaner threads and their checkpoint
"""

from kbroker.storage.leader_epoch import EpochEntry, LeaderEpochCache
from kbroker.storage.log import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchDataInfo,
    Log,
    LogAppendInfo,
)
from kbroker.storage.log_config import LogConfig
from kbroker.storage.log_manager import LogManager
from kbroker.storage.segment import LogSegment

__all__ = [  # noqa: RUF022 - grouped, as aiokafka does
    # logs
    "Log",
    "LogManager",
    "LogSegment",
    "LeaderEpochCache",
    # configuration
    "LogConfig",
    # value types
    "EpochEntry",
    "FetchDataInfo",
    "LogAppendInfo",
    # constants
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
]
