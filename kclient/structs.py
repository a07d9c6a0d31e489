"""Value types of the public client API (kafka-python's names and meanings)."""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed (offset -1 with acks=0)."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


class OffsetAndMetadata(NamedTuple):
    """A committed position: the offset of the next record to read, a free-form string,
    and the leader epoch of the record before it (kafka-python 2.0.2+'s three fields).

    ``OffsetAndMetadata(offset)`` and ``OffsetAndMetadata(offset, metadata)`` work too;
    ``leader_epoch`` defaults to -1 (unknown). kbroker's OffsetCommit does not carry the
    epoch, so commits ignore it and ``committed()`` returns -1.
    """

    offset: int
    metadata: str = ""
    leader_epoch: int = -1


class BrokerMetadata(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: str | None


class PartitionMetadata(NamedTuple):
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    offline_replicas: list[int]
    error: int


class IsolationLevel(IntEnum):
    """What a consumer's Fetch and ListOffsets may see (Kafka's IsolationLevel, KIP-98):
    every record below the high watermark, or only those below the last stable offset,
    without the records of aborted transactions."""

    READ_UNCOMMITTED = 0
    READ_COMMITTED = 1


class AbortedTransaction(NamedTuple):
    """A Fetch answer's aborted transaction: the producer and the first offset of its
    aborted transaction; a read_committed consumer drops that producer's transactional
    batches from there up to its ABORT marker."""

    producer_id: int
    first_offset: int


class ConsumerGroupMetadata(NamedTuple):
    """A consumer's place in its group (Java's ``ConsumerGroupMetadata``), for a
    transactional producer's ``send_offsets_to_transaction``: the coordinator refuses
    the commit of a member that is no longer current (KIP-447)."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None
