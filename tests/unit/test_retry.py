"""kclient's one retry loop: retriable errors are retried until the deadline, then a
KafkaTimeoutError says what was being done; other errors pass at once."""

from __future__ import annotations

import time

import pytest

from kclient.errors import (
    CommitFailedError,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    NoBrokersAvailable,
    NotCoordinatorError,
)
from kclient.retry import retry


def test_retriable_errors_are_retried_until_success() -> None:
    calls: list[int] = []
    seen: list[KafkaError] = []

    def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise NotCoordinatorError("moved")
        return "ok"

    assert retry(attempt, what="x", deadline=time.monotonic() + 5, backoff_s=0.01, on_error=seen.append) == "ok"
    assert len(calls) == 3 and len(seen) == 2


def test_the_deadline_ends_with_a_timeout_naming_the_work() -> None:
    def attempt() -> None:
        raise NotCoordinatorError("moved")

    start = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match=r"commit did not complete: \[Error 16\] NotCoordinatorError: moved"):
        retry(attempt, what="commit did not complete", deadline=start + 0.2, backoff_s=0.05)
    assert time.monotonic() - start < 2.0  # the deadline, not a retry count, ended it


def test_other_errors_pass_at_once_and_on_error_may_replace_them() -> None:
    def unknown() -> None:
        raise InvalidTopicError("t")

    with pytest.raises(InvalidTopicError):
        retry(unknown, what="x", deadline=time.monotonic() + 5, backoff_s=1)

    def fenced(err: KafkaError) -> None:
        raise CommitFailedError("fenced") from err

    with pytest.raises(CommitFailedError):
        retry(lambda: (_ for _ in ()).throw(NotCoordinatorError()), what="x", deadline=time.monotonic() + 5,
              backoff_s=1, on_error=fenced)  # fmt: skip


def test_raise_last_ends_with_the_last_error_itself() -> None:
    errors = iter([NotCoordinatorError("moved"), NoBrokersAvailable("none answered")] * 50)

    def attempt() -> None:
        raise next(errors)

    with pytest.raises((NotCoordinatorError, NoBrokersAvailable)) as info:
        retry(attempt, what="x", deadline=time.monotonic() + 0.2, backoff_s=0.05, raise_last=True)
    assert not isinstance(info.value, KafkaTimeoutError)
