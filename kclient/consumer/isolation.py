"""The consumer's ``isolation_level`` (Kafka's ``isolation.level``, KIP-98).

``read_uncommitted`` (the default) reads every record below the high watermark, those of
open and aborted transactions too; ``read_committed`` reads below the last stable offset
only, and drops the records of aborted transactions
(:func:`kclient.records.drop_aborted`). The names are kafka-python's and Kafka's.
"""

from __future__ import annotations

from kclient.errors import InvalidConfigError
from kclient.proto.kbroker.v1 import common_pb2
from kclient.structs import IsolationLevel

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"

_LEVELS = {READ_UNCOMMITTED: IsolationLevel.READ_UNCOMMITTED, READ_COMMITTED: IsolationLevel.READ_COMMITTED}


def parse_isolation_level(value: object, setting: str = "isolation_level") -> IsolationLevel:
    """``value`` ('read_uncommitted', 'read_committed', or an IsolationLevel) as an
    IsolationLevel; InvalidConfigError, naming ``setting``, for anything else."""
    if isinstance(value, IsolationLevel):
        return value
    if isinstance(value, str):
        level = _LEVELS.get(value)
        if level is not None:
            return level
    raise InvalidConfigError(f"{setting} must be {READ_UNCOMMITTED!r} or {READ_COMMITTED!r}, got {value!r}")


def isolation_level_name(level: IsolationLevel) -> str:
    """'read_uncommitted' or 'read_committed'."""
    return READ_COMMITTED if level is IsolationLevel.READ_COMMITTED else READ_UNCOMMITTED


def to_proto(level: IsolationLevel) -> common_pb2.IsolationLevel:
    """``level`` as the gRPC contract's IsolationLevel (FetchRequest, ListOffsetsRequest)."""
    return common_pb2.READ_COMMITTED if level is IsolationLevel.READ_COMMITTED else common_pb2.READ_UNCOMMITTED
