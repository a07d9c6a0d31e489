"""Small helpers shared by the process-level tests."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout_s: float = 60, what: str = "condition") -> None:
    """Poll ``predicate`` until it is truthy; an exception counts as "not yet"."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
