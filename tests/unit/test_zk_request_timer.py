"""zk_request_timer: one observation per request kazoo sends, from queued to answered,
whether the answer is a value or an error; the request itself goes through unchanged."""

from __future__ import annotations

import threading
import time
from typing import Any

from kazoo.exceptions import NoNodeError
from kazoo.handlers.threading import SequentialThreadingHandler

from kbroker.cluster.zk_request_timer import time_requests
from tests.support import wait_until


class SlowConnection:
    """kazoo's ``_call`` as the connection thread answers it: ``delay_s`` later."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.sent: list[object] = []

    def _call(self, request: object, async_result: Any) -> bool:
        self.sent.append(request)

        def answer() -> None:
            time.sleep(self.delay_s)
            if request == "missing":
                async_result.set_exception(NoNodeError())
            else:
                async_result.set(b"data")

        threading.Thread(target=answer, daemon=True).start()
        return True


def test_each_request_is_timed_once_from_queued_to_answered() -> None:
    handler = SequentialThreadingHandler()
    handler.start()
    try:
        client = SlowConnection(0.05)
        observed: list[float] = []
        time_requests(client, observed.append)  # type: ignore[arg-type]
        found, missing = handler.async_result(), handler.async_result()
        assert client._call("get", found) is True
        client._call("missing", missing)
        assert found.get(timeout=5) == b"data"
        wait_until(lambda: len(observed) == 2, 5, "two observations")
        assert missing.exception is not None
        assert client.sent == ["get", "missing"]
        assert all(50.0 <= ms < 5000.0 for ms in observed), observed
        time.sleep(0.1)
        assert len(observed) == 2
    finally:
        handler.stop()
