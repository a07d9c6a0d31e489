"""``kctl users`` parsing and printing shared by its backends (and by ``kctl configs --entity-type users``)."""

from __future__ import annotations

import pytest

from kbroker.cli.common import UsageError
from kbroker.cli.configs import parse_add_config
from kbroker.cli.users import format_user, parse_scram_configs


def test_kafka_configs_scram_syntax() -> None:
    adds = parse_add_config("SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=a=b]")
    upserts, deletes = parse_scram_configs(adds, [])
    assert upserts == {"SCRAM-SHA-256": ("alice-secret", 8192), "SCRAM-SHA-512": ("a=b", 4096)} and deletes == []
    assert parse_scram_configs({}, ["SCRAM-SHA-512", "SCRAM-SHA-512"]) == ({}, ["SCRAM-SHA-512"])


@pytest.mark.parametrize(
    ("adds", "deletes", "mentions"),
    [
        ({"producer_byte_rate": "1024"}, [], "only SCRAM"),
        ({}, ["consumer_byte_rate"], "only SCRAM"),
        ({"SCRAM-SHA-256": "iterations=8192"}, [], "password is empty"),
        ({"SCRAM-SHA-256": "password=pw,iterations=100"}, [], "minimum 4096"),
        ({"SCRAM-SHA-256": "password=pw,iterations=x"}, [], "must be a number"),
        ({"SCRAM-SHA-256": "password=pw,salt=abc"}, [], "expects"),
        ({"SCRAM-SHA-256": "password=pw,pw2"}, [], "cannot hold ','"),
    ],
)
def test_bad_scram_configs_are_usage_errors(adds: dict[str, str], deletes: list[str], mentions: str) -> None:
    with pytest.raises(UsageError, match=mentions) as refused:
        parse_scram_configs(adds, deletes)
    assert "pw" not in str(refused.value).replace("password", "")


def test_format_is_kafkas_line() -> None:
    assert format_user("alice", {"SCRAM-SHA-512": 8192, "SCRAM-SHA-256": 4096}) == (
        "SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-256=iterations=4096, "
        "SCRAM-SHA-512=iterations=8192"
    )
