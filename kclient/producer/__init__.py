"""The producer: ``Producer`` is a thin facade over role objects, each testable alone.

- :mod:`~kclient.producer.producer`: the facade (``send``, ``send_batch``, ``flush``, ``close``);
- :mod:`~kclient.producer.accumulator`: batches per partition, linger, buffer memory;
- :mod:`~kclient.producer.sender`: the thread that sends Produce requests and handles outcomes;
- :mod:`~kclient.producer.sequences`: idempotence (producer id, epoch, sequence numbers);
- :mod:`~kclient.producer.transactions`: transactions (Kafka's TransactionManager);
- :mod:`~kclient.producer.batch`: one batch from first record to outcome;
- :mod:`~kclient.producer.futures`: the result objects ``send`` and ``send_batch`` return.

Imports go one way: futures <- batch <- sequences <- accumulator <- transactions <- sender
<- producer.
"""

from kclient.producer.futures import BatchMetadata, FutureBatchMetadata, FutureRecordMetadata
from kclient.producer.producer import Producer

__all__ = ["BatchMetadata", "FutureBatchMetadata", "FutureRecordMetadata", "Producer"]
