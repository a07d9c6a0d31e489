"""``kctl perf produce --transactional-id / --transaction-duration-ms / --transaction-size``:
the flags' validation (bad input is one ``kctl:`` line and exit 2, before any connection)
and when the perf producer begins and commits (a fake producer, no broker)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from kbroker.cli import perf
from kbroker.cli.common import UsageError
from kbroker.cli.main import main

# Nothing listens here: a usage error must come before any connection.
NOWHERE = "127.0.0.1:1"


def kctl_fails(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    try:
        code: object = main(
            ["perf", "produce", "--bootstrap-server", NOWHERE, "--topic", "t", "--num-records", "10", *args]
        )
    except SystemExit as exc:  # argparse's own errors (a flag's type)
        code = exc.code
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("kctl: "), err
    return lines[0]


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (["--transaction-duration-ms", "0"], "--transaction-duration-ms must be positive, got 0"),
        (["--transaction-duration-ms", "-5"], "--transaction-duration-ms must be positive"),
        (["--transaction-size", "0"], "--transaction-size must be at least 1, got 0"),
        (["--transactional-id", ""], "--transactional-id must not be empty"),
        (["--transactional-id", " "], "--transactional-id must not be empty"),
        (["--transaction-size", "10", "--producer-props", "acks=1"], "transactions need acks=all, got acks=1"),
        (["--transaction-size", "10", "--producer-props", "enable.idempotence=false"], "idempotent"),
        (
            ["--transactional-id", "a", "--producer-props", "transactional.id=b"],
            "--transactional-id 'a' and --producer-props transactional.id=b differ",
        ),
        (["--transaction-size", "ten"], "invalid int value: 'ten'"),
        (["--transaction-duration-ms", "1.5"], "invalid int value: '1.5'"),
    ],
)
def test_bad_transaction_flags_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str], mentions: str) -> None:
    assert mentions in kctl_fails(capsys, *args)


def test_no_transaction_flags_no_plan() -> None:
    assert perf.transaction_plan(None, None, None, {"acks": "1"}) is None


def test_plan_defaults_are_kafkas() -> None:
    assert perf.transaction_plan(None, None, 100, {}) == perf.TransactionPlan(perf.DEFAULT_TRANSACTIONAL_ID, 100, None)
    # A transactional id alone: Kafka's 3000 ms transactions.
    assert perf.transaction_plan("x", None, None, {}) == perf.TransactionPlan("x", None, 3000)
    assert perf.transaction_plan(None, None, None, {"transactional_id": "p"}) == perf.TransactionPlan("p", None, 3000)
    assert perf.transaction_plan("p", 100, 10, {"transactional_id": "p", "acks": "all"}) == perf.TransactionPlan(
        "p", 10, 100
    )
    assert perf.transaction_plan(None, 50, None, {"acks": "-1"}) == perf.TransactionPlan(
        perf.DEFAULT_TRANSACTIONAL_ID, None, 50
    )


def test_plan_errors_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="must be positive"):
        perf.transaction_plan(None, 0, None, {})


class FakeProducer:
    """Records sends and transaction calls; every send is acknowledged at once."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.open = False
        self.in_txn = 0

    def _done(self) -> Future[None]:
        f: Future[None] = Future()
        f.set_result(None)
        return f

    def send(self, topic: str, value: bytes, partition: int | None = None) -> Future[None]:
        assert self.open, "a send outside a transaction"
        self.in_txn += 1
        return self._done()

    def send_batch(self, topic: str, values: Any, partition: int | None = None) -> list[Future[None]]:
        assert self.open, "a send_batch outside a transaction"
        self.in_txn += len(values)
        return [self._done()]

    def begin_transaction(self) -> None:
        assert not self.open
        self.open = True
        self.calls.append(("begin", 0))

    def commit_transaction(self) -> None:
        assert self.open
        self.calls.append(("commit", self.in_txn))
        self.open = False
        self.in_txn = 0

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("bulk", [False, True])
def test_commits_every_transaction_size_records(bulk: bool) -> None:
    p = FakeProducer()
    txn = perf.Transactions(p, perf.TransactionPlan("t", size=4))
    lines: list[str] = []
    s = perf.produce(p, "t", 10, 10, bulk=bulk, bulk_size=3, transactions=txn, report=lines.append)  # type: ignore[arg-type]
    assert s.records == 10
    assert [n for what, n in p.calls if what == "commit"] == [4, 4, 2]
    assert not p.open
    assert lines[-2].startswith("3 transactions committed, 3.3 records each, ")
    assert lines[-1].startswith("10 records sent, ")


def test_commits_once_a_transaction_is_old(monkeypatch: pytest.MonkeyPatch) -> None:
    p = FakeProducer()
    txn = perf.Transactions(p, perf.TransactionPlan("t", duration_ms=2))
    ms = iter(range(1_000_000))  # every reading of the clock 1 ms after the one before
    monkeypatch.setattr(perf.time, "perf_counter", lambda: next(ms) / 1000.0)
    monkeypatch.setattr(perf, "TRANSACTION_CHECK", 2)  # the age is read every 2 records
    perf.produce(p, "t", 6, 10, transactions=txn)  # type: ignore[arg-type]
    commits = [n for what, n in p.calls if what == "commit"]
    assert sum(commits) == 6 and len(commits) > 1 and all(n % 2 == 0 for n in commits)
    assert not p.open


def test_room_begins_once_and_bounds_the_chunk() -> None:
    p = FakeProducer()
    txn = perf.Transactions(p, perf.TransactionPlan("t", size=10, duration_ms=100))
    assert txn.room(256) == 10  # the size bounds it
    assert txn.room(4) == 4  # the age check does
    assert p.calls == [("begin", 0)]
    txn.commit()
    txn.commit()  # nothing open: nothing to commit
    assert p.calls == [("begin", 0), ("commit", 0)]
