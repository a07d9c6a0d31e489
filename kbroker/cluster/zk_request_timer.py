"""The time of every ZooKeeper request a kazoo client sends, Kafka's
``ZooKeeperClientMetrics.ZooKeeperRequestLatencyMs``: from the moment the request is
queued to the moment its answer (or its failure) arrives.

kazoo has no hook for this; every request of its public API, sync or async, passes
through ``KazooClient._call(request, async_result)``, which queues it for the connection
thread. :func:`time_requests` wraps that one method, and links a callback to each
request's result. Session pings are the connection's own and are not counted.

Thread safety: ``observe`` is called on kazoo's completion thread (the result's
callbacks run there), one call at a time; it must be quick and must not block.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient


def time_requests(kazoo: KazooClient, observe: Callable[[float], object]) -> None:
    """From now on, call ``observe(milliseconds)`` once per request ``kazoo`` sends."""
    send = kazoo._call

    def timed(request: Any, async_result: Any) -> Any:
        start = time.monotonic()
        async_result.rawlink(lambda _result: observe((time.monotonic() - start) * 1000.0))
        return send(request, async_result)

    kazoo._call = timed  # type: ignore[method-assign]
