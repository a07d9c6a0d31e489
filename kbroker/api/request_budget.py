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

Thread safety: a pool and its holders are used from one event loop thread only (the
gRPC server's loop, which also runs the Kafka door).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

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


class RequestPool:
    """A byte budget for request memory (Kafka's ``MemoryPool``).

    Invariants: see the module; ``_waiters`` are futures resolved at the next release.
    Thread safety: event loop thread only.
    """

    def __init__(self, name: str, limit: int, per_connection: int) -> None:
        if limit < 1 or per_connection < 1:
            raise ValueError("a request pool needs a positive limit and per-connection cap")
        self.name = name
        self.limit = limit
        self.per_connection = per_connection
        self.used = 0
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def free(self) -> int:
        return max(self.limit - self.used, 0)

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

    def __init__(self, client_bytes: int, per_connection: int, inter_broker_bytes: int) -> None:
        self.client = RequestPool("client", client_bytes, per_connection)
        self.inter_broker = RequestPool("inter-broker", inter_broker_bytes, inter_broker_bytes)
