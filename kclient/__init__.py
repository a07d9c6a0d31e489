"""kclient: the Python client of kbroker (kafka-python's names and meanings)."""

from kclient.admin import AdminClient, NewTopic, TopicDescription
from kclient.assignors import (
    AbstractPartitionAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
)
from kclient.consumer import Consumer, ConsumerRebalanceListener
from kclient.errors import (
    CommitFailedError,
    CorruptRecordError,
    KafkaError,
    KafkaTimeoutError,
    NoBrokersAvailable,
)
from kclient.producer import BatchMetadata, FutureBatchMetadata, FutureRecordMetadata, Producer
from kclient.records import ColumnBuffers, RecordColumns
from kclient.structs import (
    BrokerMetadata,
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    PartitionMetadata,
    RecordMetadata,
    TopicPartition,
)

# kafka-python's names: the same classes, so `from kclient import KafkaProducer` and
# isinstance checks work either way.
KafkaProducer = Producer
KafkaConsumer = Consumer
KafkaAdminClient = AdminClient

__all__ = [  # noqa: RUF022 -- grouped: clients, assignors, errors, structs
    # clients
    "AdminClient",
    "BatchMetadata",
    "Consumer",
    "ConsumerRebalanceListener",
    "FutureBatchMetadata",
    "FutureRecordMetadata",
    "KafkaAdminClient",
    "KafkaConsumer",
    "KafkaProducer",
    "NewTopic",
    "Producer",
    "TopicDescription",
    # assignors
    "AbstractPartitionAssignor",
    "RangeAssignor",
    "RoundRobinAssignor",
    "StickyAssignor",
    # errors
    "CommitFailedError",
    "CorruptRecordError",
    "KafkaError",
    "KafkaTimeoutError",
    "NoBrokersAvailable",
    # structs
    "BrokerMetadata",
    "ConsumerRecord",
    "ConsumerGroupMetadata",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "PartitionMetadata",
    "ColumnBuffers",
    "RecordColumns",
    "RecordMetadata",
    "TopicPartition",
]
