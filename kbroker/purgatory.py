"""Delayed operations: long-poll fetches and acks=all produces wait here.

Kafka parks such requests in a purgatory keyed by partition and completes each exactly
once when its condition holds or its time runs out. Here a waiting request thread
re-checks its condition whenever any partition makes progress (an append, a high
watermark move, a leadership change): simple and correct, at the price of spurious
wake-ups under many concurrent waiters.

Thread safety: safe from any thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Purgatory:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._closed = False

    def progress(self) -> None:
        """Something changed: waiters re-check their conditions."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def wait(self, check: Callable[[], T | None], timeout_s: float) -> T | None:
        """Return ``check()`` once it is not None, or None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                result = check()
                if result is not None or self._closed:
                    return result
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
