"""The PySpark data source of kbroker: ``format("kbroker")`` for batch and streaming, read and write.

    from kclient.spark import register
    register(spark)   # once per SparkSession
    df = (spark.readStream.format("kbroker")
          .option("bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "events")
          .load())

Options, row schema and sink columns are those of Spark's Kafka connector; see
:mod:`kclient.spark.options`, :mod:`kclient.spark.source` and :mod:`kclient.spark.sink`.
Needs ``pyspark`` (4.3 or later; tested with 4.3.0) and ``pyarrow``; executors must be able to import
``kclient`` (point ``PYSPARK_PYTHON`` at a Python that has it installed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kclient.spark.errors import DataLossError, KbrokerOptionError, KbrokerSparkError, UnacknowledgedRecordsError
from kclient.spark.source import KbrokerDataSource, kafka_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DataLossError",
    "KbrokerDataSource",
    "KbrokerOptionError",
    "KbrokerSparkError",
    "UnacknowledgedRecordsError",
    "kafka_schema",
    "register",
]


def register(spark: SparkSession) -> None:
    """Make ``format("kbroker")`` available in ``spark`` (idempotent)."""
    spark.dataSource.register(KbrokerDataSource)
