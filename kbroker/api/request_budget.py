"""Request memory budgets: Kafka's ``queued.max.request.bytes`` memory pool, shared by
both doors, with a bound per connection and a separate budget for inter-broker traffic.

A :class:`RequestPool` counts the bytes of requests the broker holds: bytes of a Kafka
frame as they arrive (never the size a frame header promises), a gRPC message once it
has been received, until its request is answered. When the pool is spent the doors stop
reading (Kafka's muted channels) and wait for bytes to be released; they never fail a
request for it. A :class:`Holder` is one connection's share: it may hold at most
``queued.max.request.bytes.per.connection``, so one client cannot take the whole pool.

Two pools exist per broker (:class:`RequestBudgets`): the client pool and the
inter-broker pool (``inter.broker.queued.max.request.bytes``), so replication and the
controller's calls never wait behind client requests.

Invariants: ``0 <= used``; ``used <= limit`` except for one request larger than the
whole limit, admitted only while nothing else is held (the same rule per holder), so a
request of up to ``socket.request.max.bytes`` can always run.

Freed request memory goes back to the operating system (:class:`MemoryReclaimer`): glibc
keeps freed heap pages of its arenas (gRPC receives a message as many small slices)
rather than returning them, so once released request bytes add up to
``RECLAIM_AFTER_BYTES`` the pools run glibc's ``malloc_trim(0)`` on a worker thread (at
most one every ``RECLAIM_INTERVAL_S``). A request left in a reference cycle is freed only
by a full garbage collection; the write path keeps none (a refused append's error is
kept without its traceback, whose frames held the records), so the pools run
``gc.collect()`` on the loop only rarely, as a backstop: at most one every
``COLLECT_INTERVAL_S`` (one more then if a reclaim came sooner), never at the rate of
the traffic. Measured with ten concurrent
95 MiB requests refused for size: 1,080 MiB resident after them without this, 79 MiB
(the idle broker) with it.

Thread safety: a pool and its holders are used from one event loop thread only (the
gRPC server's loop, which also runs the Kafka door).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

RECLAIM_AFTER_BYTES = 32 * 1024 * 1024
"""Released request bytes that make the pools give memory back (a collection and a trim)."""

RECLAIM_INTERVAL_S = 0.05
"""The least time between two trims (on a worker thread, off the loop)."""

COLLECT_INTERVAL_S = 5.0
"""The least time between two full garbage collections on the loop (a backstop for
request memory left in a reference cycle; a collection stalls the loop serving both doors
for milliseconds to tens of milliseconds, so never at the rate of the traffic)."""

SMALL_HELD_BYTES = 1024 * 1024
"""A pool or connection share holding less than this (or a quarter of it) reads its next
request whatever its size may be (:meth:`RequestPool.may_read`)."""

INTER_BROKER_METADATA_KEY = "kbroker-inter-broker"
"""Call metadata a broker's own inter-broker channels send (value: the broker id); on the
inter-broker listener such calls are served from the inter-broker budget."""


@dataclass
class Holder:
    """One connection's bytes in a pool, at most ``cap`` (except one larger request
    while it holds nothing). Loop thread only."""

    cap: int
    held: int = 0

    def room(self) -> int:
        return max(self.cap - self.held, 0)


def _glibc_malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)`` (gives the free pages of every arena back), or None
    where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)  # ctypes drops the GIL for the call


class MemoryReclaimer:
    """Gives freed request memory back: after ``after_bytes`` released request bytes,
    ``trim()`` (the C heap's free pages) on the loop's default executor, at most one
    reclaim every ``interval_s`` (and one more later for releases that came during the
    wait); a reclaim runs ``collect()`` (reference cycles that still hold requests) on the
    loop first only if the last collection is ``collect_interval_s`` old, else one
    collection is scheduled for when it will be (so a burst's cycles are freed soon after
    it, and steady traffic costs one collection per interval).

    Invariants: ``_pending`` counts bytes released since the last reclaim started; at most
    one reclaim is scheduled at a time. Thread safety: event loop thread only.
    """

    def __init__(
        self,
        after_bytes: int = RECLAIM_AFTER_BYTES,
        interval_s: float = RECLAIM_INTERVAL_S,
        *,
        collect_interval_s: float = COLLECT_INTERVAL_S,
        collect: Callable[[], object] = gc.collect,
        trim: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.after_bytes = after_bytes
        self.interval_s = interval_s
        self._collect = collect
        self._trim = trim if trim is not None else _glibc_malloc_trim()
        self._clock = clock
        self._pending = 0
        self._last = -interval_s
        self.collect_interval_s = collect_interval_s
        self._last_collect: float | None = None
        self._collect_scheduled: asyncio.Handle | None = None
        self._scheduled: asyncio.Handle | None = None
        self.reclaims = 0
        """Reclaims run so far (for tests)."""
        self.collections = 0
        """Full collections run so far (for tests)."""

    def released(self, n: int) -> None:
        """``n`` request bytes were freed: reclaim once enough have been."""
        self._pending += n
        if self._pending < self.after_bytes or self._scheduled is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a pool used synchronously): nothing to schedule on
            return
        delay = max(self._last + self.interval_s - self._clock(), 0.0)
        # Later, not now: the released request's own frames still hold it here.
        self._scheduled = loop.call_later(delay, self._reclaim, loop)

    def _reclaim(self, loop: asyncio.AbstractEventLoop) -> None:
        self._scheduled = None
        self._pending = 0
        self._last = self._clock()
        self.reclaims += 1
        if self._last_collect is None or self._last - self._last_collect >= self.collect_interval_s:
            self._collect_now()
        elif self._collect_scheduled is None:
            delay = self._last_collect + self.collect_interval_s - self._last
            self._collect_scheduled = loop.call_later(delay, self._collect_now)
        if self._trim is not None:
            loop.run_in_executor(None, self._trim).add_done_callback(_log_failure)

    def _collect_now(self) -> None:
        if self._collect_scheduled is not None:
            self._collect_scheduled.cancel()
            self._collect_scheduled = None
        self._last_collect = self._clock()
        self.collections += 1
        self._collect()

    async def received(self, n: int) -> None:
        """A request of ``n`` bytes was just received: once it is large (at least
        ``after_bytes``), give back the heap pages gRPC received it in before it is
        decoded (they would otherwise stay resident beside the decoded copies)."""
        if n < self.after_bytes or self._trim is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._trim)
        except Exception as exc:  # never fail a request for it
            log.warning("malloc_trim failed: %s", exc)


def _log_failure(fut: asyncio.Future[object]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("malloc_trim failed: %s", fut.exception())


class RequestPool:
    """A byte budget for request memory (Kafka's ``MemoryPool``).

    Invariants: see the module; ``_waiters`` are futures resolved at the next release.
    Thread safety: event loop thread only.
    """

    def __init__(self, name: str, limit: int, per_connection: int, reclaimer: MemoryReclaimer | None = None) -> None:
        if limit < 1 or per_connection < 1:
            raise ValueError("a request pool needs a positive limit and per-connection cap")
        self.name = name
        self.limit = limit
        self.per_connection = per_connection
        self.used = 0
        self.reclaimer = reclaimer
        """What gives released bytes back to the operating system (None: nothing)."""
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def free(self) -> int:
        return max(self.limit - self.used, 0)

    def may_read(self, largest: int, holder: Holder | None = None) -> bool:
        """Whether a request whose size is not known yet (at most ``largest`` bytes) may
        be read now: only while the pool, and ``holder``'s share, would still hold it.
        A pool or share holding next to nothing (under ``SMALL_HELD_BYTES``, or a quarter
        of it) always reads one more, so small requests never wait behind the rule and
        a request as large as the whole pool can run. So what is held stays within
        ``max(limit, SMALL_HELD_BYTES + largest)``, per pool and per share, plus the
        requests other connections were reading at the same time."""
        if self._full(self.used, self.limit, largest):
            return False
        return holder is None or not self._full(holder.held, holder.cap, largest)

    @staticmethod
    def _full(held: int, cap: int, largest: int) -> bool:
        if held >= cap:
            return True
        return held >= min(SMALL_HELD_BYTES, cap // 4) and held + largest > cap

    def holder(self) -> Holder:
        """A new connection's share of this pool."""
        return Holder(self.per_connection)

    def try_acquire(self, n: int, holder: Holder | None = None) -> bool:
        """Take ``n`` bytes if the pool (and ``holder``'s cap) has room for them."""
        if self.used and self.used + n > self.limit:
            return False
        if holder is not None and holder.held and holder.held + n > holder.cap:
            return False
        self._take(n, holder)
        return True

    def take_up_to(self, n: int, holder: Holder | None = None) -> int:
        """Take as many of ``n`` bytes as there is room for (maybe 0): for bytes about to
        be read from a socket, which are then read only up to what was taken."""
        room = self.free if holder is None else min(self.free, holder.room())
        got = min(n, room)
        if got > 0:
            self._take(got, holder)
        return max(got, 0)

    def hold(self, n: int, holder: Holder | None = None) -> None:
        """Count ``n`` bytes already received (a message read while there was room, the
        rest of a frame whose read was admitted): taken even past the limit."""
        if n > 0:
            self._take(n, holder)

    def _take(self, n: int, holder: Holder | None) -> None:
        self.used += n
        if holder is not None:
            holder.held += n

    def release(self, n: int, holder: Holder | None = None) -> None:
        if n <= 0:
            return
        self.used -= n
        if holder is not None:
            holder.held -= n
        if self.reclaimer is not None:
            self.reclaimer.released(n)
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def released(self) -> None:
        """Return at the next release of any bytes of this pool."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        finally:
            if not fut.done():
                fut.cancel()
                if fut in self._waiters:
                    self._waiters.remove(fut)

    async def acquire(self, n: int, holder: Holder | None = None) -> None:
        """Take ``n`` bytes, waiting for releases while they do not fit (no timeout: the
        caller's deadline cancels the wait)."""
        while not self.try_acquire(n, holder):
            await self.released()


class RequestBudgets:
    """The broker's two request pools: ``client`` (queued.max.request.bytes) and
    ``inter_broker`` (inter.broker.queued.max.request.bytes). Loop thread only."""

    def __init__(
        self,
        client_bytes: int,
        per_connection: int,
        inter_broker_bytes: int,
        reclaimer: MemoryReclaimer | None = None,
    ) -> None:
        self.reclaimer = reclaimer if reclaimer is not None else MemoryReclaimer()
        self.client = RequestPool("client", client_bytes, per_connection, self.reclaimer)
        self.inter_broker = RequestPool("inter-broker", inter_broker_bytes, inter_broker_bytes, self.reclaimer)
