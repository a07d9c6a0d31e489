"""The Spark source's kafka.isolation.level (Spark's Kafka source option): parsed into the
consumer's isolation_level, so every consumer the source makes reads committed records
only and its "latest" end offsets are the last stable offsets (option parsing and the
driver's offset lookups, no Spark session, no broker)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from kclient.consumer import Consumer
from kclient.proto.kbroker.v1 import common_pb2, log_pb2
from kclient.spark.errors import KbrokerOptionError
from kclient.spark.options import CONSUMER_SETTINGS, parse_source_options
from kclient.spark.source import SourceCluster
from kclient.structs import TopicPartition
from tests.support import FakeMetadata, FakeTransport

B = {"bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
T0 = TopicPartition("t", 0)


@pytest.mark.parametrize(
    ("raw", "level"),
    [
        ("read_committed", "read_committed"),
        ("read_uncommitted", "read_uncommitted"),
        ("  READ_COMMITTED ", "read_committed"),
    ],
)
def test_the_option_becomes_the_consumers_setting(raw: str, level: str) -> None:
    opts = parse_source_options({**B, "kafka.isolation.level": raw})
    assert opts.consumer_settings == {"isolation_level": level}
    assert opts.consumer_config()["isolation_level"] == level


def test_option_names_are_case_insensitive() -> None:
    opts = parse_source_options({**B, "Kafka.Isolation.Level": "read_committed"})
    assert opts.consumer_config()["isolation_level"] == "read_committed"


def test_default_is_the_consumers_read_uncommitted() -> None:
    opts = parse_source_options(B)
    assert "isolation_level" not in opts.consumer_config()
    assert Consumer.DEFAULT_CONFIG["isolation_level"] == "read_uncommitted"


@pytest.mark.parametrize("raw", ["committed", "", "read-committed", "READ_COMMITTED_PLUS"])
def test_bad_values_name_the_option(raw: str) -> None:
    with pytest.raises(KbrokerOptionError) as info:
        parse_source_options({**B, "kafka.isolation.level": raw})
    message = str(info.value)
    assert "'kafka.isolation.level' must be read_uncommitted or read_committed" in message
    assert repr(raw) in message


def test_listed_among_the_supported_consumer_settings() -> None:
    assert CONSUMER_SETTINGS["isolation.level"][0] == "isolation_level"
    with pytest.raises(KbrokerOptionError, match=r"kafka\.isolation\.level"):
        parse_source_options({**B, "kafka.no.such.setting": "1"})


@pytest.mark.parametrize(
    ("raw", "wire"),
    [("read_committed", common_pb2.READ_COMMITTED), ("read_uncommitted", common_pb2.READ_UNCOMMITTED)],
)
def test_the_drivers_latest_offsets_ask_for_the_isolation_level(raw: str, wire: int) -> None:
    """SourceCluster.latest (the end of every micro-batch and of a batch query) is the
    consumer's end_offsets: its ListOffsets carries the level, so read_committed's latest
    is the leader's last stable offset."""
    opts = parse_source_options({**B, "kafka.isolation.level": raw})
    cluster = SourceCluster(opts)
    consumer = cluster.consumer
    transport = FakeTransport()
    answer = log_pb2.ListOffsetsResponse(
        topics=[log_pb2.ListOffsetsTopicResponse(name="t", partitions=[{"index": 0, "offset": 7}])]
    )
    transport.on("ListOffsets", lambda req: answer)
    consumer._transport.close()
    consumer._transport = transport  # type: ignore[assignment]
    consumer._metadata = FakeMetadata(addresses=["leader:1"])  # type: ignore[assignment]
    try:
        assert cluster.latest([T0]) == {T0: 7}
        [request] = transport.requests("ListOffsets")
        assert request.HasField("isolation_level")
        assert request.isolation_level == wire
        assert request.topics[0].partitions[0].timestamp == -1
    finally:
        cluster.close()
