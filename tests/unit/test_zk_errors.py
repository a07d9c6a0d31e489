"""ZooKeeper's failures leave kbroker/cluster/ as ZooKeeperError types, and kctl turns
each into its one line and exit code 1."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from kazoo.exceptions import BadVersionError, ConnectionLoss, NoAuthError
from kazoo.handlers.threading import KazooTimeoutError

from kbroker.cli import main as kctl
from kbroker.cluster.zk_errors import ZooKeeperError, ZooKeeperNoAuthError, ZooKeeperTimeoutError, mapped
from kclient.errors import KafkaError


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (KazooTimeoutError("Connection time-out"), ZooKeeperTimeoutError),
        (NoAuthError(), ZooKeeperNoAuthError),
        (ConnectionLoss(), ZooKeeperError),
        (BadVersionError(), ZooKeeperError),
    ],
)
def test_kazoo_errors_are_mapped_with_their_cause(raised: Exception, expected: type[ZooKeeperError]) -> None:
    with pytest.raises(expected) as caught, mapped():
        raise raised
    assert type(caught.value) is expected and isinstance(caught.value, KafkaError)
    assert caught.value.__cause__ is raised
    assert caught.value.message.startswith(type(raised).__name__)


def test_other_errors_pass_through() -> None:
    with pytest.raises(OSError), mapped():
        raise OSError("refused")


def _failing_command(monkeypatch: pytest.MonkeyPatch, raised: Exception) -> None:
    """``kctl dump-log`` whose handler raises ``raised`` (no connection is opened)."""
    build = kctl.build_parser

    def build_parser() -> argparse.ArgumentParser:
        parser = build()
        parse = parser.parse_args

        def parse_args(argv: Any = None, namespace: Any = None) -> argparse.Namespace:
            args = parse(argv, namespace)

            def handler(_args: argparse.Namespace) -> int:
                raise raised

            args.handler = handler
            return args

        parser.parse_args = parse_args  # type: ignore[method-assign,assignment]
        return parser

    monkeypatch.setattr(kctl, "build_parser", build_parser)


@pytest.mark.parametrize(
    ("raised", "line"),
    [
        (KazooTimeoutError("Connection time-out"), "kctl: ZooKeeper did not answer in time"),
        (ConnectionLoss(), "kctl: ZooKeeper error: ConnectionLoss"),
        (BadVersionError("changed"), "kctl: ZooKeeper error: BadVersionError: changed"),
        (NoAuthError(), "kctl: ZooKeeper refused the write: no authentication"),
    ],
)
def test_kctl_prints_one_line_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], raised: Exception, line: str
) -> None:
    monkeypatch.delenv("KBROKER_ZK_DIGEST", raising=False)
    monkeypatch.delenv("KAFKA_OPTS", raising=False)
    _failing_command(monkeypatch, raised)
    assert kctl.main(["dump-log", "--files", "x.log"]) == kctl.EXIT_FAILURE
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1
