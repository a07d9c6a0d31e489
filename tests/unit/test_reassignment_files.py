"""kctl partitions reassign: Kafka's reassignment files, parsed and printed as
kafka-reassign-partitions.sh does (pure parts; the cluster side is an integration test)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kbroker.cli import reassign
from kbroker.cli.common import CliError, UsageError
from kbroker.cli.reassign import parse_reassignment, parse_topics_to_move, to_json


def test_reassignment_json_round_trip_in_kafkas_shape() -> None:
    text = to_json({("b", 1): [3, 1], ("a", 0): [1, 2]})
    assert text == (
        '{"version":1,"partitions":[{"topic":"a","partition":0,"replicas":[1,2],"log_dirs":["any","any"]},'
        '{"topic":"b","partition":1,"replicas":[3,1],"log_dirs":["any","any"]}]}'
    )
    assert parse_reassignment(json.loads(text)) == {("a", 0): [1, 2], ("b", 1): [3, 1]}


def test_topics_to_move() -> None:
    assert parse_topics_to_move({"version": 1, "topics": [{"topic": "b"}, {"topic": "a"}, {"topic": "b"}]}) == [
        "a",
        "b",
    ]
    with pytest.raises(CliError, match="non-empty"):
        parse_topics_to_move({"topics": []})
    with pytest.raises(CliError, match='"topic"'):
        parse_topics_to_move({"topics": [{"name": "a"}]})


@pytest.mark.parametrize(
    ("doc", "mentions"),
    [
        ({"partitions": []}, "non-empty"),
        ({"partitions": [{"topic": "a", "partition": 0, "replicas": []}]}, "empty replica list"),
        ({"partitions": [{"topic": "a", "partition": 0, "replicas": [1, 1]}]}, "duplicate"),
        ({"partitions": [{"topic": "a", "partition": 0, "replicas": [-1]}]}, "invalid replica list"),
        ({"partitions": [{"topic": "a", "partition": "0", "replicas": [1]}]}, "integer"),
        ({"partitions": [{"topic": "a", "partition": 0, "replicas": [1], "log_dirs": ["/d"]}]}, "log_dirs"),
        (
            {
                "partitions": [
                    {"topic": "a", "partition": 0, "replicas": [1]},
                    {"topic": "a", "partition": 0, "replicas": [2]},
                ]
            },
            "Duplicate reassignment of partition a-0",
        ),
        ([1, 2], "non-empty"),
    ],
)
def test_bad_reassignment_files_are_refused_with_one_line(doc: Any, mentions: str) -> None:
    with pytest.raises(CliError, match=mentions):
        parse_reassignment(doc)


def test_throttled_replicas_are_the_sources_on_the_leader_side_and_the_new_replicas_on_the_follower_side() -> None:
    current = {("foo", 0): [1, 2], ("foo", 1): [2, 3], ("foo", 2): [3, 1], ("bar", 0): [1]}
    plan = {("foo", 0): [1, 4], ("foo", 1): [2, 3], ("foo", 2): [4, 5], ("bar", 0): [1]}
    assert reassign.throttled_replicas(current, plan) == {"foo": ("0:1,0:2,2:3,2:1", "0:4,2:4,2:5")}
    # an RF decrease moves data nowhere: only a leader list, no follower list
    assert reassign.throttled_replicas({("t", 0): [1, 2, 3]}, {("t", 0): [1, 2]}) == {"t": ("0:1,0:2,0:3", "")}


def test_a_negative_throttle_other_than_minus_one_is_a_usage_error() -> None:
    assert reassign.check_throttle(-1) == -1 and reassign.check_throttle(0) == 0
    with pytest.raises(UsageError, match="--throttle"):
        reassign.check_throttle(-5)
