"""Batch and streaming writes through ``format("kbroker")``, read back with kclient's Consumer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from kclient.partitioner import partition_for_key
from tests.spark.conftest import consume_all, produce
from tests.spark.test_read import spark_error

pytestmark = pytest.mark.integration


def test_batch_write_lands_every_row(spark: Any, bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(4)
    rows = [
        (
            f"key-{i % 10}" if i % 9 else None,
            f"value-{i}",
            (i % 4) if i % 3 == 0 else None,
            [("seq", f"{i}".encode())] if i % 2 else [],
        )
        for i in range(1000)
    ]
    df = spark.createDataFrame(
        rows, "key string, value string, partition int, headers array<struct<key:string,value:binary>>"
    ).repartition(3)
    df.write.format("kbroker").option("bootstrap.servers", bootstrap).option("topic", topic).mode("append").save()

    got = consume_all(bootstrap, topic)
    assert len(got) == 1000
    by_value = {r.value: r for r in got}
    for key, value, partition, headers in rows:
        rec = by_value[value.encode()]
        assert rec.key == (key.encode() if key is not None else None)
        assert rec.headers == headers
        if partition is not None:
            assert rec.partition == partition
        elif key is not None:
            assert rec.partition == partition_for_key(key.encode(), 4)  # Kafka's key partitioning


def test_topic_column_and_binary_values(spark: Any, bootstrap: str, new_topic: Callable[..., str]) -> None:
    t1, t2 = new_topic(2), new_topic(1)
    df = spark.createDataFrame(
        [(t1 if i % 2 else t2, bytes([i % 256]) * 3, None) for i in range(200)],
        "topic string, value binary, key binary",
    )
    # PySpark's Python data sources take only the append and overwrite modes; a topic is appended to
    df.write.format("kbroker").option("kafka.bootstrap.servers", bootstrap).mode("append").save()
    assert sorted(r.value or b"" for r in consume_all(bootstrap, t1)) == sorted(
        bytes([i % 256]) * 3 for i in range(1, 200, 2)
    )
    assert len(consume_all(bootstrap, t2)) == 100


def test_stream_write_from_a_kbroker_stream(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    source, sink = new_topic(3), new_topic(2)
    produce(bootstrap, source, [{"value": b"v%d" % i, "key": b"k%d" % (i % 5)} for i in range(120)])
    q = (
        spark.readStream.format("kbroker")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "50")
        .load()
        .selectExpr("key", "concat(value, cast('!' as binary)) as value")
        .writeStream.format("kbroker")
        .option("bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    got = consume_all(bootstrap, sink)
    assert sorted(r.value or b"" for r in got) == sorted(b"v%d!" % i for i in range(120))
    assert all(r.partition == partition_for_key(r.key or b"", 2) for r in got)


def test_unacknowledged_records_fail_the_task(spark: Any, bootstrap: str, new_topic: Callable[..., str]) -> None:
    # One replica but min.insync.replicas=2: acks=all can never be satisfied.
    topic = new_topic(1, min_insync_replicas="2")
    df = spark.createDataFrame([("x",)], "value string")
    message = spark_error(
        lambda: (
            df.write.format("kbroker")
            .option("bootstrap.servers", bootstrap)
            .option("topic", topic)
            .option("kafka.delivery.timeout.ms", "1500")
            .option("kafka.request.timeout.ms", "1000")
            .mode("append")
            .save()
        )
    )
    assert "kbroker: 1 of 1 records were not acknowledged; first error: " in message
    assert "NotEnoughReplicas" in message


def test_bad_writes_fail_before_sending(spark: Any, bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(1)

    def write(df: Any, mode: str = "append", **options: str) -> Callable[[], None]:
        w = df.write.format("kbroker").option("bootstrap.servers", bootstrap).mode(mode)
        for k, v in options.items():
            w = w.option(k, v)
        return lambda: w.save()

    values = spark.createDataFrame([("a",)], "value string")
    cases = [
        (write(spark.createDataFrame([("a",)], "data string"), topic=topic), "required column 'value' not found"),
        (write(values), "no 'topic' column and no 'topic' option"),
        (write(values, topic=f"{topic}-missing"), f"option 'topic': unknown topic '{topic}-missing'"),
        (write(values, mode="overwrite", topic=topic), "save mode 'overwrite' is not allowed"),
        (write(spark.createDataFrame([(1,)], "value int"), topic=topic), "column 'value' must be binary or string"),
        (
            write(spark.createDataFrame([("a", "0")], "value string, partition string"), topic=topic),
            "column 'partition' must be int, not string",
        ),
        (write(values, topic=topic, **{"kafka.acks": "most"}), "option 'kafka.acks' must be all, -1, 0 or 1"),
    ]
    for action, mentions in cases:
        message = spark_error(action)
        assert mentions in message, message
    assert consume_all(bootstrap, topic) == []
