"""Errors of the kbroker Spark connector.

    KafkaError
     └── KbrokerSparkError
          ├── KbrokerOptionError (also a ValueError): a bad option, found when the query starts
          ├── DataLossError: records were gone (retention, deleted topic) before they were read
          └── UnacknowledgedRecordsError: a write task could not get every record acknowledged

Every message starts with ``kbroker:`` and is one line, so it stands out in Spark's
error reports (which wrap it in a Python traceback).
"""

from __future__ import annotations

from kclient.errors import KafkaError


class KbrokerSparkError(KafkaError):
    """Base class of the connector's errors."""

    def __init__(self, message: str) -> None:
        super().__init__(message if message.startswith("kbroker:") else f"kbroker: {message}")

    def __str__(self) -> str:
        return self.message


class KbrokerOptionError(KbrokerSparkError, ValueError):
    """An option is missing, unknown, malformed or names something that does not exist."""


class DataLossError(KbrokerSparkError):
    """Records the query should have read no longer exist (and ``failOnDataLoss`` is true)."""


class UnacknowledgedRecordsError(KbrokerSparkError):
    """A write task ended with records the brokers did not acknowledge."""
