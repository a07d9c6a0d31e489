"""Client metrics in kafka-python's shape: ``metrics()`` returns ``{group: {name: value}}``.

Counted per request or per batch, never per record. Rates are over two 30 s samples,
as Kafka's (``metrics.sample.window.ms``, ``metrics.num.samples``): the rate is what the
current and the previous sample hold over the time they span.
"""

from __future__ import annotations

import threading
import time

WINDOW_S = 30.0


class Sensor:
    """A count, a total, a max and a windowed rate of one recorded quantity.

    Thread safety: none; the owner serializes :meth:`record` (a lock, or one thread).
    """

    __slots__ = ("_cur", "_cur_start", "_prev", "_prev_start", "count", "max", "total")

    def __init__(self, now: float | None = None) -> None:
        start = time.monotonic() if now is None else now
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self._prev_start = self._cur_start = start
        self._prev = self._cur = 0.0

    def _roll(self, now: float) -> None:
        if now - self._cur_start >= WINDOW_S:
            if now - self._cur_start >= 2 * WINDOW_S:  # idle for a whole window: both are old
                self._prev, self._prev_start = 0.0, now - WINDOW_S
            else:
                self._prev, self._prev_start = self._cur, self._cur_start
            self._cur, self._cur_start = 0.0, now

    def record(self, value: float = 1.0, now: float | None = None) -> None:
        self._roll(time.monotonic() if now is None else now)
        self.count += 1
        self.total += value
        self._cur += value
        if value > self.max:
            self.max = value

    def rate(self, now: float | None = None) -> float:
        """Per second, over the current and previous sample (at least one second)."""
        now = time.monotonic() if now is None else now
        self._roll(now)
        return (self._prev + self._cur) / max(now - self._prev_start, 1.0)

    def avg(self) -> float:
        return self.total / self.count if self.count else 0.0


class ProducerMetrics:
    """What the sender counts: per drained batch and per request/response.

    Thread safety: ``_lock`` (the sender thread and gRPC callback threads record).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records = Sensor()  # records sent (a retried batch counts again, as Kafka's)
        self.batch_bytes = Sensor()
        self.retries = Sensor()
        self.errors = Sensor()
        self.requests = Sensor()
        self.records_per_request = Sensor()
        self.latency_ms = Sensor()

    def request_sent(self, batches: list[tuple[int, int, bool]]) -> None:
        """One Produce request: (records, bytes, is a retry) per batch."""
        with self._lock:
            n = 0
            for count, size, retry in batches:
                n += count
                self.batch_bytes.record(size)
                if retry:
                    self.retries.record(count)
            self.records.record(n)
            self.requests.record()
            self.records_per_request.record(n)

    def response(self, latency_ms: float) -> None:
        with self._lock:
            self.latency_ms.record(latency_ms)

    def failed(self, records: int) -> None:
        with self._lock:
            self.errors.record(records)

    def snapshot(self, in_flight: int) -> dict[str, dict[str, float]]:
        with self._lock:
            return {
                "producer-metrics": {
                    "record-send-total": self.records.total,
                    "record-send-rate": self.records.rate(),
                    "record-retry-total": self.retries.total,
                    "record-retry-rate": self.retries.rate(),
                    "record-error-total": self.errors.total,
                    "record-error-rate": self.errors.rate(),
                    "batch-size-avg": self.batch_bytes.avg(),
                    "batch-size-max": self.batch_bytes.max,
                    "outgoing-byte-total": self.batch_bytes.total,
                    "outgoing-byte-rate": self.batch_bytes.rate(),
                    "records-per-request-avg": self.records_per_request.avg(),
                    "request-total": self.requests.total,
                    "request-rate": self.requests.rate(),
                    "request-latency-avg": self.latency_ms.avg(),
                    "request-latency-max": self.latency_ms.max,
                    "requests-in-flight": float(in_flight),
                }
            }
