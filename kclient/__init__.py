"""kclient: the Python client of kbroker (kafka-python's names and meanings)."""

import os

# gRPC's fork handlers, on by default in grpcio's core, start a poller thread in the child
# of every fork; when that child is a subprocess.Popen with ``preexec_fn`` (PySpark starts
# its JVM so), it closes the poller's descriptors before exec and a few in a hundred such
# children die ("epoll_wait error: Bad file descriptor", grpc/grpc#43055). kclient does not
# use a channel across fork, so the handlers are off unless the application says otherwise.
# gRPC reads this once, at its import: it must be set before anything imports grpc.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

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
