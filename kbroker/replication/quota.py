"""Replication throttling for partition moves (Kafka's ReplicationQuotaManager, KIP-73).

A broker has two quotas: the *leader* quota bounds the bytes it serves to throttled
followers, the *follower* quota the bytes its fetchers pull for throttled replicas. A
partition is throttled when its topic's ``leader.replication.throttled.replicas`` /
``follower.replication.throttled.replicas`` names it on this broker (``*`` = every
partition); the bound is the broker's ``leader.`` / ``follower.replication.throttled.rate``.

Only replicas outside the ISR are ever delayed, so normal replication (and a move's
replica once it has caught up) never is. All traffic of a throttled partition is counted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from kbroker.config import LONG_MAX

ALL_PARTITIONS: frozenset[int] = frozenset({-1})
"""``*``: every partition of the topic is throttled."""

SAMPLES = 11
"""Kafka's ``replication.quota.window.num``."""
SAMPLE_WINDOW_S = 1.0
"""Kafka's ``replication.quota.window.size.seconds``."""


def parse_throttled_replicas(value: str, broker_id: int) -> frozenset[int]:
    """The partitions a ``leader/follower.replication.throttled.replicas`` value throttles
    on ``broker_id``: ``*`` -> ALL_PARTITIONS, ``0:1,0:2,1:2`` on broker 2 -> {0, 1}.

    The value is assumed valid (LogConfig checked it when it was written).
    """
    text = value.strip()
    if text == "*":
        return ALL_PARTITIONS
    out = set()
    for entry in text.split(","):
        partition, _, broker = entry.strip().partition(":")
        if partition and broker and int(broker) == broker_id:
            out.add(int(partition))
    return frozenset(out)


class SampledRate:
    """Bytes per second over the last ``SAMPLES`` windows of ``SAMPLE_WINDOW_S`` (Kafka's
    ``Rate`` on a ``SampledStat``): the windowed total divided by the time since the oldest
    retained window began, counted as at least ``SAMPLES - 1`` whole windows, so a fresh
    quota measures low and lets a short burst through as Kafka's does.

    Not thread-safe on its own: :class:`ReplicationQuota` holds the lock.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._starts: list[float] = []
        self._totals: list[float] = []

    def _purge(self, now: float) -> None:
        horizon = now - SAMPLES * SAMPLE_WINDOW_S
        while self._starts and self._starts[0] + SAMPLE_WINDOW_S <= horizon:
            del self._starts[0]
            del self._totals[0]

    def record(self, amount: float) -> None:
        now = self._clock()
        self._purge(now)
        if not self._starts or now >= self._starts[-1] + SAMPLE_WINDOW_S:
            self._starts.append(now)
            self._totals.append(0.0)
        self._totals[-1] += amount

    def measure(self) -> float:
        now = self._clock()
        self._purge(now)
        if not self._starts:
            return 0.0
        elapsed = now - self._starts[0]
        elapsed = max(elapsed, (SAMPLES - 1) * SAMPLE_WINDOW_S)
        return sum(self._totals) / elapsed

    def time_until_below(self, bound: float) -> float:
        """Seconds until the rate falls to ``bound`` if nothing more is recorded."""
        now = self._clock()
        self._purge(now)
        total = sum(self._totals)
        if not self._starts or bound <= 0:
            return SAMPLE_WINDOW_S
        # total / max(now + t - start, 10 windows) <= bound
        start = self._starts[0]
        needed = total / bound - (now - start)
        return max(0.0, min(needed, SAMPLES * SAMPLE_WINDOW_S))


class ReplicationQuota:
    """One direction's replication throttle: the throttled partitions and the byte rate.

    Thread-safe: one lock guards the throttled sets, the bound and the rate; readers
    (fetch paths on many threads) take it briefly.
    """

    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._bound: float = float(LONG_MAX)
        self._throttled: dict[str, frozenset[int]] = {}
        self._rate = SampledRate(clock)

    @property
    def bound(self) -> float:
        return self._bound

    def set_bound(self, bytes_per_s: float) -> None:
        """The rate throttled traffic may not exceed (``LONG_MAX``: unbounded)."""
        with self._lock:
            self._bound = float(bytes_per_s)

    def mark_throttled(self, topic: str, partitions: Iterable[int]) -> None:
        """Throttle these partitions of ``topic`` (ALL_PARTITIONS for ``*``); empty removes."""
        parts = frozenset(partitions)
        with self._lock:
            if parts:
                self._throttled[topic] = parts
            else:
                self._throttled.pop(topic, None)

    def remove_throttle(self, topic: str) -> None:
        with self._lock:
            self._throttled.pop(topic, None)

    def is_throttled(self, topic: str, partition: int) -> bool:
        parts = self._throttled.get(topic)
        return parts is not None and (partition in parts or parts == ALL_PARTITIONS)

    def throttled_topics(self) -> dict[str, frozenset[int]]:
        with self._lock:
            return dict(self._throttled)

    def record(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        with self._lock:
            self._rate.record(nbytes)

    def rate(self) -> float:
        with self._lock:
            return self._rate.measure()

    def is_exceeded(self) -> bool:
        with self._lock:
            return self._bound < LONG_MAX and self._rate.measure() > self._bound

    def time_until_within_s(self) -> float:
        with self._lock:
            return self._rate.time_until_below(self._bound)
