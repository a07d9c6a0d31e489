"""Batch reads through ``spark.read.format("kbroker")`` against real brokers."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pyspark")

from tests.spark.conftest import produce

pytestmark = pytest.mark.integration


def spark_error(action: Callable[[], Any]) -> str:
    """The text of the error ``action`` raises (Spark wraps the connector's own)."""
    with pytest.raises(Exception) as info:
        action()
    return str(info.value)


def reader(spark: Any, bootstrap: str, **options: str) -> Any:
    r = spark.read.format("kbroker").option("bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r


def test_batch_read_returns_exactly_the_produced_rows(
    spark: Any, bootstrap: str, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(3)
    stamps = [1_700_000_000_000 + i for i in range(300)]
    sent: list[dict[str, Any]] = [
        {
            "value": f"value-{i}".encode(),
            "key": None if i % 7 == 0 else f"key-{i % 5}".encode(),
            "partition": i % 3,
            "headers": [("h", f"{i}".encode()), ("empty", None)] if i % 2 else None,
            "timestamp_ms": stamps[i],
        }
        for i in range(300)
    ]
    where = produce(bootstrap, topic, sent)
    df = reader(spark, bootstrap, subscribe=topic, includeHeaders="true", maxRecordsPerPartition="40").load()
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
        "timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )
    assert df.rdd.getNumPartitions() >= 300 // 40  # each 100-record partition range was cut in three
    rows = df.collect()
    assert len(rows) == 300
    got = {(r.partition, r.offset): r for r in rows}
    assert set(got) == set(where)
    for rec, ms, (p, o) in zip(sent, stamps, where, strict=True):
        row = got[(p, o)]
        assert row.topic == topic
        assert row.value == rec["value"] and row.key == rec["key"]
        assert [(h.key, h.value) for h in row.headers] == (rec["headers"] or [])
        assert row.timestamp == dt.datetime.fromtimestamp(ms // 1000) + dt.timedelta(milliseconds=ms % 1000)
        assert row.timestampType == 0
    # offsets within each partition are exactly 0..99
    for p in range(3):
        assert sorted(o for (q, o) in got if q == p) == list(range(100))


def test_starting_and_ending_offsets_are_honoured(spark: Any, bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(3)
    produce(bootstrap, topic, [{"value": b"%d" % i, "partition": i % 3} for i in range(60)])
    starting = {topic: {"0": 5, "1": -2, "2": 18}}
    ending = {topic: {"0": 12, "1": 3, "2": -1}}
    df = reader(
        spark, bootstrap, subscribe=topic, startingOffsets=json.dumps(starting), endingOffsets=json.dumps(ending)
    ).load()
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    want = [(0, o) for o in range(5, 12)] + [(1, o) for o in range(0, 3)] + [(2, o) for o in range(18, 20)]
    assert got == want
    # the default end is "latest"; an explicit JSON end on a part of the partitions must name them all
    assert reader(spark, bootstrap, subscribe=topic).load().count() == 60
    message = spark_error(
        lambda: reader(spark, bootstrap, subscribe=topic, endingOffsets=json.dumps({topic: {"0": 1}})).load().count()
    )
    assert f"option 'endingOffsets' must name every partition read: it lacks {topic}-1, {topic}-2" in message


def test_timestamps_assign_and_pattern(spark: Any, bootstrap: str, new_topic: Callable[..., str]) -> None:
    base = f"pat{int(time.time() * 1000) % 100000}"
    t1, t2 = new_topic(2, prefix=f"{base}-a"), new_topic(1, prefix=f"{base}-b")
    produce(bootstrap, t1, [{"value": b"%d" % i, "partition": i % 2, "timestamp_ms": 1000 * i} for i in range(20)])
    produce(bootstrap, t2, [{"value": b"x"} for _ in range(5)])
    # startingTimestamp: first record at or after 10 s in each partition; endingTimestamp: before 16 s
    df = reader(spark, bootstrap, subscribe=t1, startingTimestamp="10000", endingTimestamp="16000").load()
    assert sorted(int(r.value) for r in df.collect()) == [10, 11, 12, 13, 14, 15]
    # assign reads just the named partitions
    df = reader(spark, bootstrap, assign=json.dumps({t1: [1]})).load()
    assert sorted(int(r.value) for r in df.collect()) == list(range(1, 20, 2))
    # subscribePattern reads every matching topic
    df = reader(spark, bootstrap, subscribePattern=f"{base}-.*").load()
    assert {(r.topic, r.cnt) for r in df.groupBy("topic").count().withColumnRenamed("count", "cnt").collect()} == {
        (t1, 20),
        (t2, 5),
    }


def test_bad_options_fail_when_the_read_is_defined(spark: Any, bootstrap: str, new_topic: Callable[..., str]) -> None:
    topic = new_topic(2)
    cases = [
        ({"subscribe": "no-such-topic-anywhere"}, "option 'subscribe': unknown topic(s) no-such-topic-anywhere"),
        ({"assign": json.dumps({topic: [0, 7]})}, f"option 'assign': unknown partition(s) {topic}-7"),
        ({"subscribe": topic, "startingOffsets": '{"x": 1'}, "option 'startingOffsets' is not valid JSON"),
        ({}, "exactly one of the options 'subscribe', 'subscribePattern' or 'assign' must be set"),
        ({"subscribe": topic, "subscribePattern": ".*"}, "got 2: subscribe, subscribePattern"),
    ]

    def load(options: dict[str, str]) -> Callable[[], Any]:
        return lambda: reader(spark, bootstrap, **options).load()

    for options, mentions in cases:
        message = spark_error(load(options))
        assert mentions in message, message
    message = spark_error(lambda: spark.read.format("kbroker").option("subscribe", topic).load())
    assert "option 'bootstrap.servers' (or 'kafka.bootstrap.servers') is required" in message
    # batch-only rules are checked when the query is planned
    message = spark_error(lambda: reader(spark, bootstrap, subscribe=topic, startingOffsets="latest").load().count())
    assert "option 'startingOffsets' cannot be latest for a batch query" in message
    # a user schema is refused
    message = spark_error(lambda: reader(spark, bootstrap, subscribe=topic).schema("value binary").load().collect())
    assert "has a fixed schema" in message
