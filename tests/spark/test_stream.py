"""Structured-streaming reads through ``spark.readStream.format("kbroker")`` against real brokers."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from kclient import AdminClient, Consumer, TopicPartition
from kclient.spark.errors import DataLossError
from kclient.spark.options import parse_source_options
from kclient.spark.source import KbrokerInputPartition, read_range
from tests.spark.conftest import produce, wait_for_leaders
from tests.spark.test_read import spark_error

pytestmark = pytest.mark.integration


def stream(spark: Any, bootstrap: str, **options: str) -> Any:
    r = spark.readStream.format("kbroker").option("bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_available_now(df: Any, out: Path, checkpoint: Path) -> list[int]:
    """Run the query to the end of what is there now (Parquet sink); the rows of each micro-batch."""
    q = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert not q.isActive, "the availableNow query did not finish"
    if q.exception() is not None:
        raise q.exception()
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


def offsets_in(spark: Any, out: Path) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for r in spark.read.parquet(str(out)).select("partition", "offset").collect())


def test_parquet_sink_restarted_from_checkpoint_ingests_every_record_once(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(3)
    group = f"spark-{uuid.uuid4().hex[:8]}"
    first = produce(bootstrap, topic, [{"value": b"a%d" % i, "key": b"k%d" % (i % 4)} for i in range(150)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def query() -> Any:
        return stream(
            spark, bootstrap, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="100", groupId=group
        )

    batches = run_available_now(query(), out, checkpoint)
    assert sum(batches) == 150 and max(batches) <= 100 and len(batches) >= 2
    assert offsets_in(spark, out) == sorted(first)

    # More records, and a partition added while the query is down: the restart reads
    # exactly the new records (the checkpoint's offsets), the new partition from its start.
    second = produce(bootstrap, topic, [{"value": b"b%d" % i, "partition": i % 3} for i in range(90)])
    with AdminClient(bootstrap) as admin:
        admin.create_partitions({topic: 4})
    wait_for_leaders(bootstrap, topic, 4)
    third = produce(bootstrap, topic, [{"value": b"c%d" % i, "partition": 3} for i in range(20)])
    batches = run_available_now(query(), out, checkpoint)
    assert sum(batches) == 110
    assert offsets_in(spark, out) == sorted(first + second + third)  # no duplicates, nothing missing
    values = sorted(r.value for r in spark.read.parquet(str(out)).select("value").collect())
    assert len(values) == len(set(values)) == 260

    # A third run finds nothing new.
    assert run_available_now(query(), out, checkpoint) == []

    # The group holds the stream's progress: every partition committed at its end.
    with AdminClient(bootstrap) as admin:
        committed = admin.list_consumer_group_offsets(group)
    with Consumer(bootstrap_servers=bootstrap) as consumer:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(4)])
    assert {tp: om.offset for tp, om in committed.items()} == ends


def test_running_query_picks_up_new_topics_and_commits_each_batch(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    base = f"grow{uuid.uuid4().hex[:6]}"
    t1 = new_topic(2, prefix=f"{base}-a")
    group = f"spark-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, t1, [{"value": b"old"}])  # before the start: not read with startingOffsets=latest
    name = f"q_{uuid.uuid4().hex[:8]}"
    q = (
        stream(spark, bootstrap, subscribePattern=f"{base}-.*", groupId=group, includeHeaders="true")
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait(lambda: q.lastProgress is not None, "the first trigger")
        produce(bootstrap, t1, [{"value": b"x%d" % i, "headers": [("n", b"%d" % i)]} for i in range(10)])
        t2 = new_topic(3, prefix=f"{base}-b")  # matches the pattern: read from its first record
        produce(bootstrap, t2, [{"value": b"y%d" % i, "partition": i % 3} for i in range(30)])
        q.processAllAvailable()
        wait(lambda: spark.table(name).count() == 40, "40 rows in the memory sink", query=q)
        rows = spark.table(name).collect()
        assert sorted(r.value for r in rows if r.topic == t1) == sorted(b"x%d" % i for i in range(10))
        assert {r.topic for r in rows} == {t1, t2}
        assert all(r.headers[0].key == "n" for r in rows if r.topic == t1)

        def committed() -> dict[TopicPartition, int]:
            with AdminClient(bootstrap) as admin:
                return {tp: om.offset for tp, om in admin.list_consumer_group_offsets(group).items()}

        with Consumer(bootstrap_servers=bootstrap) as consumer:
            ends = consumer.end_offsets(
                [TopicPartition(t1, p) for p in range(2)] + [TopicPartition(t2, p) for p in range(3)]
            )
        wait(lambda: committed() == ends, "the group to reach the end offsets", query=q)
    finally:
        q.stop()


def wait(check: Callable[[], bool], what: str, timeout_s: float = 60, query: Any = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if query is not None and query.exception() is not None:
            raise query.exception()
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s}s for {what}")
        time.sleep(0.2)


def fill_until_retention_deletes(bootstrap: str, topic: str, past: int) -> int:
    """Produce until the log of partition 0 starts after offset ``past``; the new log start."""
    tp = TopicPartition(topic, 0)
    deadline = time.monotonic() + 60
    with Consumer(bootstrap_servers=bootstrap) as consumer:
        while True:
            produce(bootstrap, topic, [{"value": b"z" * 100, "partition": 0} for _ in range(20)])
            start = consumer.beginning_offsets([tp])[tp]
            if start > past:
                return start
            if time.monotonic() > deadline:
                raise TimeoutError(f"retention never deleted past offset {past} of {topic}")
            time.sleep(0.3)


def test_records_removed_by_retention_fail_the_query_unless_told(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(1, segment_bytes="4096", retention_bytes="8192", file_delete_delay_ms="0")
    produce(bootstrap, topic, [{"value": b"first%d" % i} for i in range(5)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest")
    assert run_available_now(df, out, checkpoint) == [5]  # the checkpoint now says: next is offset 5

    log_start = fill_until_retention_deletes(bootstrap, topic, past=5)
    message = spark_error(lambda: run_available_now(df, out, checkpoint))
    lost = re.search(
        rf"kbroker: offsets 5 to (\d+) of {topic}-0 were removed by retention before they were read", message
    )
    assert lost is not None, message
    assert int(lost.group(1)) >= log_start - 1  # retention may have gone on since
    assert "set the source option failOnDataLoss=false" in message

    # failOnDataLoss=false: skip what is gone, read the rest, from the same checkpoint.
    df = stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest", failOnDataLoss="false")
    run_available_now(df, out, checkpoint)
    with Consumer(bootstrap_servers=bootstrap) as consumer:
        tp = TopicPartition(topic, 0)
        earliest, end = consumer.beginning_offsets([tp])[tp], consumer.end_offsets([tp])[tp]
    got = [o for p, o in offsets_in(spark, out)]
    assert got[:5] == [0, 1, 2, 3, 4]
    assert got[5:] == list(range(got[5], end)) and got[5] <= earliest

    # On an executor (a range planned before retention struck): the same rule.
    opts = parse_source_options({"bootstrap.servers": bootstrap, "subscribe": topic}, streaming=False)
    with pytest.raises(DataLossError, match=f"offsets 0 to {earliest - 1} of {topic}-0 were removed"):
        list(read_range(opts, KbrokerInputPartition(topic, 0, 0, end)))
    lenient = parse_source_options(
        {"bootstrap.servers": bootstrap, "subscribe": topic, "failOnDataLoss": "false"}, streaming=False
    )
    batches = list(read_range(lenient, KbrokerInputPartition(topic, 0, 0, end)))
    assert sum(b.num_rows for b in batches) == end - earliest


def test_bad_stream_options_fail_at_query_start(
    spark: Any, bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic(1)
    message = spark_error(lambda: stream(spark, bootstrap, subscribe=f"{topic}-missing"))
    assert f"option 'subscribe': unknown topic(s) {topic}-missing" in message
    df = stream(spark, bootstrap, subscribe=topic, endingOffsets=json.dumps({topic: {"0": 1}}))
    message = spark_error(lambda: run_available_now(df, tmp_path / "o", tmp_path / "c"))
    assert "kbroker: ending offsets ('endingOffsets', 'endingTimestamp', ...) are for batch queries only" in message
    assert "UnboundLocalError" not in message
    df = stream(spark, bootstrap, subscribe=topic, startingOffsets=json.dumps({topic: {"0": 0, "1": 0}}))
    message = spark_error(lambda: run_available_now(df, tmp_path / "o2", tmp_path / "c2"))
    assert f"option 'startingOffsets' must name every partition read: {topic}-1 do(es) not exist" in message
