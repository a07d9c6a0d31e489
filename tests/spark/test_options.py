"""Option parsing, offsets JSON, range splitting and rate limiting (no Spark, no brokers)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from kclient.spark.errors import KbrokerOptionError
from kclient.spark.offsets import (
    OffsetRange,
    from_json_dict,
    parse_assign,
    rate_limit,
    split_ranges,
    to_json,
    to_json_dict,
)
from kclient.spark.options import parse_sink_options, parse_source_options
from kclient.structs import TopicPartition as TP

B = {"bootstrap.servers": "127.0.0.1:9092"}


def bad(options: dict[str, str], mentions: str, **kw: bool) -> str:
    with pytest.raises(KbrokerOptionError) as info:
        parse_source_options(options, **kw)
    message = str(info.value)
    assert mentions in message, message
    assert "\n" not in message
    assert "kbroker:" in message
    return message


def test_minimal_options_and_defaults() -> None:
    opts = parse_source_options({**B, "subscribe": "a, b,a"}, streaming=True)
    assert opts.subscription.kind == "subscribe" and opts.subscription.topics == ("a", "b")
    assert opts.starting.kind == "latest" and opts.ending.kind == "latest"
    assert opts.fail_on_data_loss and not opts.include_headers and opts.group_id is None
    assert parse_source_options({**B, "subscribe": "a"}, streaming=False).starting.kind == "earliest"


def test_option_names_are_case_insensitive_and_kafka_prefix_accepted() -> None:
    opts = parse_source_options(
        {"KAFKA.BOOTSTRAP.SERVERS": "h:1,h:2", "SubscribePattern": "t-.*", "FAILONDATALOSS": "False"}
    )
    assert opts.bootstrap == "h:1,h:2"
    assert opts.subscription.matches("t-1") and not opts.subscription.matches("xt-1")
    assert not opts.fail_on_data_loss


def test_json_offsets_and_timestamps() -> None:
    opts = parse_source_options(
        {**B, "subscribe": "t", "startingOffsets": '{"t": {"0": 5, "1": -2}}', "endingOffsets": '{"t":{"0":9,"1":-1}}'},
        streaming=False,
    )
    assert opts.starting.kind == "offsets" and dict(opts.starting.per_partition) == {TP("t", 0): 5, TP("t", 1): -2}
    assert dict(opts.ending.per_partition) == {TP("t", 0): 9, TP("t", 1): -1}
    opts = parse_source_options({**B, "subscribe": "t", "startingTimestamp": "1700000000000"})
    assert opts.starting.kind == "timestamp" and opts.starting.timestamp == 1700000000000
    opts = parse_source_options(
        {**B, "subscribe": "t", "startingOffsets": "latest", "startingOffsetsByTimestamp": '{"t": {"0": 1}}'}
    )
    assert opts.starting.kind == "timestamps"


def test_assign_json() -> None:
    assert parse_assign('{"a": [1, 0], "b": [2]}') == [TP("a", 0), TP("a", 1), TP("b", 2)]
    opts = parse_source_options({**B, "assign": '{"a": [0]}'})
    assert opts.subscription.partitions == (TP("a", 0),)


@pytest.mark.parametrize(
    ("options", "mentions"),
    [
        ({"subscribe": "t"}, "'bootstrap.servers' (or 'kafka.bootstrap.servers') is required"),
        ({**B}, "exactly one of the options 'subscribe', 'subscribePattern' or 'assign' must be set (none was given)"),
        ({**B, "subscribe": "t", "assign": '{"t": [0]}'}, "got 2: subscribe, assign"),
        ({**B, "subscribe": "t", "subscribePattern": "x"}, "got 2"),
        ({"bootstrap.servers": "nohost", "subscribe": "t"}, "'nohost' is not host:port"),
        ({**B, "subscribe": "t", "startingOffsets": '{"t": {"0": 1'}, "option 'startingOffsets' is not valid JSON"),
        ({**B, "subscribe": "t", "startingOffsets": "yesterday"}, "must be earliest, latest or JSON"),
        ({**B, "subscribe": "t", "startingOffsets": '{"t": {"x": 1}}'}, "'x' of topic 't' is not a partition number"),
        ({**B, "subscribe": "t", "startingOffsets": '{"t": {"0": "1"}}'}, "the value of t-0 is not an integer"),
        ({**B, "subscribe": "t", "startingOffsets": '{"t": {"0": -3}}'}, "offset -3 of t-0 is invalid"),
        ({**B, "subscribe": "t", "startingOffsets": "[1]"}, "must be earliest, latest or JSON"),
        ({**B, "assign": "[0]"}, "option 'assign' must be a non-empty JSON object"),
        ({**B, "assign": '{"t": []}'}, "needs a non-empty list of partition numbers"),
        ({**B, "subscribePattern": "(["}, "not a valid regular expression"),
        ({**B, "subscribe": "bad topic"}, "option 'subscribe': topic name 'bad topic' is illegal"),
        ({**B, "subscribe": "t", "endingOffsets": "earliest"}, "'endingOffsets' cannot be earliest"),
        ({**B, "subscribe": "t", "endingOffsets": '{"t": {"0": -2}}'}, "-2 (earliest) is not allowed"),
        ({**B, "subscribe": "t", "maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' must be at least 1"),
        ({**B, "subscribe": "t", "maxOffsetsPerTrigger": "many"}, "'maxOffsetsPerTrigger' must be an integer"),
        ({**B, "subscribe": "t", "failOnDataLoss": "maybe"}, "'failOnDataLoss' must be true or false"),
        ({**B, "subscribe": "t", "kafka.group.id": "g"}, "use the option 'groupId'"),
        ({**B, "subscribe": "t", "kafka.auto.offset.reset": "earliest"}, "'startingOffsets'"),
        ({**B, "subscribe": "t", "kafka.ssl.truststore.password": "x"}, "not a consumer setting kbroker knows"),
        ({**B, "subscribe": "t", "minOffsetsPerTrigger": "5"}, "minOffsetsPerTrigger is not supported"),
        ({**B, "assign": '{"t": [0]}', "startingOffsets": '{"t": {"1": 0}}'}, "not assigned: t-1"),
        ({**B, "subscribe": "t", "startingTimestamp": "soon"}, "'startingTimestamp' must be an integer"),
    ],
)
def test_bad_options_give_one_clear_line(options: dict[str, str], mentions: str) -> None:
    bad(options, mentions)


def test_mode_specific_checks() -> None:
    bad({**B, "subscribe": "t", "endingOffsets": "latest"}, "for batch queries only", streaming=True)
    bad({**B, "subscribe": "t", "startingOffsets": "latest"}, "cannot be latest for a batch query", streaming=False)
    bad({**B, "subscribe": "t", "startingOffsets": '{"t": {"0": -1}}'}, "-1 (latest) is not allowed", streaming=False)
    bad({**B, "subscribe": "t", "groupId": "g"}, "for streaming queries only", streaming=False)


def test_sink_options() -> None:
    opts = parse_sink_options({**B, "topic": "out", "kafka.acks": "1", "kafka.linger.ms": "20"})
    assert opts.topic == "out"
    cfg = opts.producer_config()
    assert cfg["acks"] == 1 and cfg["linger_ms"] == 20
    assert parse_sink_options(B).producer_config()["acks"] == "all"
    with pytest.raises(KbrokerOptionError, match=r"'kafka.acks' must be all, -1, 0 or 1"):
        parse_sink_options({**B, "kafka.acks": "2"})
    with pytest.raises(KbrokerOptionError, match="is not a producer setting"):
        parse_sink_options({**B, "kafka.sasl.username": "u"})
    with pytest.raises(KbrokerOptionError, match="required"):
        parse_sink_options({"topic": "t"})


def test_offsets_json_round_trip_is_sorted() -> None:
    offsets = {TP("b", 10): 1, TP("a", 2): 7, TP("b", 9): 3}
    assert to_json(offsets) == '{"a": {"2": 7}, "b": {"9": 3, "10": 1}}'
    assert from_json_dict(to_json_dict(offsets)) == offsets


def test_split_ranges() -> None:
    r = OffsetRange("t", 0, 10, 35)
    assert [(x.start, x.end) for x in split_ranges([r], max_records=10)] == [(10, 19), (19, 27), (27, 35)]
    pieces = split_ranges([r, OffsetRange("t", 1, 0, 5), OffsetRange("t", 2, 3, 3)], min_partitions=6)
    assert sum(p.size for p in pieces) == 30 and len(pieces) >= 6
    assert all(p.size > 0 for p in pieces)
    # contiguous and covering
    by_tp: dict[int, list[OffsetRange]] = {}
    for p in pieces:
        by_tp.setdefault(p.partition, []).append(p)
    assert by_tp[0][0].start == 10 and by_tp[0][-1].end == 35
    assert all(a.end == b.start for a, b in zip(by_tp[0], by_tp[0][1:], strict=False))


def test_rate_limit_prorates_by_backlog() -> None:
    start = {TP("t", 0): 0, TP("t", 1): 100}
    latest = {TP("t", 0): 900, TP("t", 1): 200, TP("t", 2): 5}
    end = rate_limit(start, latest, 100)
    assert end[TP("t", 0)] == 89 and end[TP("t", 1)] == 109 and end[TP("t", 2)] == 1
    assert rate_limit(start, latest, 10_000) == latest
