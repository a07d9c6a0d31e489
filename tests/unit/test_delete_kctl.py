"""kctl groups delete-offsets and kctl delete-records: output and input, as Kafka's tools."""

from __future__ import annotations

import json

import pytest

from kbroker.cli.common import UsageError
from kbroker.cli.delete_records import parse_offsets
from kbroker.cli.groups import delete_offsets_lines
from kbroker.cli.main import build_parser
from kclient import TopicPartition
from kclient.errors import GroupSubscribedToTopicError, UnknownTopicOrPartitionError

TP = TopicPartition


def test_delete_offsets_table_when_every_partition_succeeded() -> None:
    lines = delete_offsets_lines("g", ["t:0,1"], {TP("t", 1): None, TP("t", 0): None})
    assert lines == [
        "Request succeed for deleting offsets with topic t:0,1 group g",
        "",
        "TOPIC                          PARTITION       STATUS",
        "t                              0               Successful",
        "t                              1               Successful",
    ]


def test_delete_offsets_table_with_partition_errors() -> None:
    lines = delete_offsets_lines(
        "g",
        ["t", "nope"],
        {
            TP("t", 0): GroupSubscribedToTopicError("group 'g' is actively subscribed to topic 't'"),
            TP("nope", -1): UnknownTopicOrPartitionError("topic 'nope' does not exist"),
        },
    )
    assert lines[0] == "Error: Encounter some partition level error, see the follow-up details:"
    assert lines[3] == (
        "nope                           Not Provided    Error: This server does not host this topic-partition."
    )
    assert lines[4] == (
        "t                              0               Error: Deleting offsets of a topic is forbidden while the "
        "consumer group is actively subscribed to it."
    )


def test_delete_offsets_needs_group_and_topic() -> None:
    args = build_parser().parse_args(["groups", "delete-offsets", "--group", "g", "--topic", "t:0", "--topic", "u"])
    assert args.group == "g" and args.topic == ["t:0", "u"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["groups", "delete-offsets", "--group", "g"])


def test_offset_json_is_kafkas() -> None:
    text = json.dumps(
        {"partitions": [{"topic": "t", "partition": 0, "offset": 5}, {"topic": "t", "partition": 1, "offset": -1}]}
    )
    assert parse_offsets(text, "f") == {TP("t", 0): 5, TP("t", 1): -1}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("{", "not valid JSON"),
        ('{"version": 2, "partitions": []}', "Not supported version field value 2"),
        ('{"version": 1}', "Missing partitions field"),
        ('{"partitions": [{"topic": "t", "partition": "0", "offset": 1}]}', "partition and offset"),
        (
            '{"partitions": [{"topic": "t", "partition": 0, "offset": 1},'
            ' {"topic": "t", "partition": 0, "offset": 2}]}',
            "Offset json file contains duplicate topic partitions: t-0",
        ),
        ('{"partitions": []}', "names no partition"),
    ],
)
def test_offset_json_errors(doc: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_offsets(doc, "f")


def test_delete_records_command_is_registered() -> None:
    args = build_parser().parse_args(["delete-records", "--bootstrap-server", "h:1", "--offset-json-file", "f.json"])
    assert args.offset_json_file == "f.json" and args.bootstrap_server == "h:1"
