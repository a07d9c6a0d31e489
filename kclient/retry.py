"""The one retry loop of kclient: call, and on a retriable error back off and call
again until a deadline.

Every client call that must find something first (a coordinator, a leader, offsets)
and may meet a broker that moved, restarted or is busy goes through :func:`retry`,
so they all honour their timeouts (KIP-266) and say what they were doing when time ran
out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from kclient.errors import KafkaError, KafkaTimeoutError

T = TypeVar("T")


def _ignore(_: KafkaError) -> None:
    pass


def retry(
    attempt: Callable[[], T],
    *,
    what: str,
    deadline: float,
    backoff_s: float,
    on_error: Callable[[KafkaError], None] = _ignore,
    raise_last: bool = False,
) -> T:
    """``attempt()``'s result, calling it again while it raises retriable KafkaErrors.

    Each error first goes to ``on_error``, which may act on it (mark a coordinator dead,
    refresh metadata) or raise something else instead (e.g. CommitFailedError). A
    non-retriable error is raised as it is; a retriable one is retried ``backoff_s``
    later, unless that would pass ``deadline`` (``time.monotonic()``): then
    KafkaTimeoutError("<what>: <the last error>"), or the last error itself with
    ``raise_last`` (for errors that already say what failed: NoBrokersAvailable, an
    unknown topic).
    """
    while True:
        try:
            return attempt()
        except KafkaError as err:
            on_error(err)
            if not err.retriable:
                raise
            if time.monotonic() + backoff_s >= deadline:
                if raise_last:
                    raise
                raise KafkaTimeoutError(f"{what}: {err}") from err
            time.sleep(backoff_s)
