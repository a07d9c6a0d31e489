"""kclient: the Python client of kbroker (kafka-python's names and meanings)."""

from kclient.admin import AdminClient, NewTopic, TopicDescription
from kclient.consumer import Consumer
from kclient.errors import KafkaError
from kclient.producer import FutureRecordMetadata, Producer
from kclient.structs import (
    BrokerMetadata,
    ConsumerRecord,
    OffsetAndTimestamp,
    PartitionMetadata,
    RecordMetadata,
    TopicPartition,
)

__all__ = [
    # clients
    "AdminClient",
    # structs
    "BrokerMetadata",
    "Consumer",
    "ConsumerRecord",
    "FutureRecordMetadata",
    # errors
    "KafkaError",
    "NewTopic",
    "OffsetAndTimestamp",
    "PartitionMetadata",
    "Producer",
    "RecordMetadata",
    "TopicDescription",
    "TopicPartition",
]
