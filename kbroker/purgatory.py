"""Delayed operations: long-poll fetches, acks=all produces and group joins wait here.

Kafka parks such requests in a purgatory, watched under the keys they depend on (a
topic-partition, a group), and completes each exactly once when its condition holds,
when its time runs out, or when the caller gives up. Here a parked request is a
:class:`Waiter`: a cheap ``ready()`` predicate plus a completion signal. Whoever
changes a key (an append, a high-watermark move, a leadership change, a group state
change) calls :meth:`Purgatory.progress` with that key; only the waiters watching
that key re-check their predicate, in the caller's thread, without re-reading any log.

Listeners (:meth:`Purgatory.add_listener`) hear of every progressed key, watched or
not, after its waiters: fetch sessions mark their partitions that may have something to
return that way (:mod:`kbroker.replication.fetch_session`).

A waiter holds no thread: an asyncio request handler awaits :meth:`Waiter.wait_async`
(the completion is handed to its event loop thread-safely), and plain threads may use
:meth:`Waiter.wait`. Whatever the outcome the caller must :meth:`Purgatory.cancel` the
waiter (a ``finally``), so a cancelled or expired request is forgotten at once.

Thread safety: safe from any thread. ``ready()`` runs in the thread that reported the
progress (or the registering one) and must not block; it must not call back into the
purgatory. Callers must not hold a partition lock while calling :meth:`progress`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Hashable, Iterable

log = logging.getLogger(__name__)


class Waiter:
    """One parked request: completed at most once, by ``ready()`` turning true or by close."""

    __slots__ = ("_done", "_event", "_future", "_lock", "_loop", "keys", "ready")

    def __init__(self, keys: tuple[Hashable, ...], ready: Callable[[], bool], loop: asyncio.AbstractEventLoop | None):
        self.keys = keys
        self.ready = ready
        self._lock = threading.Lock()
        self._done = False
        self._event = threading.Event()
        self._loop = loop
        self._future: asyncio.Future[None] | None = loop.create_future() if loop is not None else None

    @property
    def done(self) -> bool:
        return self._done

    def try_complete(self) -> bool:
        """Complete if ``ready()`` holds (an exception counts as ready: the caller re-reads)."""
        if self._done:
            return True
        try:
            ok = bool(self.ready())
        except Exception:
            ok = True
        return self.complete() if ok else False

    def complete(self) -> bool:
        with self._lock:
            if self._done:
                return True
            self._done = True
        self._event.set()
        if self._loop is not None and self._future is not None:
            try:
                self._loop.call_soon_threadsafe(_resolve, self._future)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass
        return True

    def wait(self, timeout_s: float) -> bool:
        """Block the calling thread until completed (True) or ``timeout_s`` passed (False)."""
        return self._event.wait(max(timeout_s, 0.0))

    async def wait_async(self, timeout_s: float) -> bool:
        """Await completion (True) or ``timeout_s`` (False) without holding a thread."""
        if self._future is None:
            raise RuntimeError("waiter was not created for an event loop")
        if self._done:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._future), max(timeout_s, 0.0))
        except TimeoutError:
            return self._done
        return True


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Purgatory:
    """Waiters by key, and the listeners of every progressed key.

    Thread safety: every method may be called from any thread; waiters' predicates and
    listeners run in the caller's thread, without the purgatory's lock held (so they may
    report progress on other keys)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watchers: dict[Hashable, set[Waiter]] = {}
        self._listeners: tuple[Callable[[Hashable], None], ...] = ()
        self._closed = False

    def add_listener(self, listener: Callable[[Hashable], None]) -> None:
        """Call ``listener(key)`` at every :meth:`progress`, after the key's waiters. It
        must be cheap and must not block; an exception it raises is logged and dropped."""
        with self._lock:
            self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: Callable[[Hashable], None]) -> None:
        with self._lock:
            self._listeners = tuple(x for x in self._listeners if x is not listener)

    def watch(
        self,
        keys: Iterable[Hashable],
        ready: Callable[[], bool],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Waiter:
        """Park a request under ``keys``; it completes as soon as ``ready()`` holds.

        ``ready()`` is checked once right after registration, so progress made between
        the caller's last look and this call is never missed.
        """
        w = Waiter(tuple(dict.fromkeys(keys)), ready, loop)
        with self._lock:
            closed = self._closed
            if not closed:
                for k in w.keys:
                    self._watchers.setdefault(k, set()).add(w)
        if closed:
            w.complete()
        else:
            w.try_complete()
        return w

    def cancel(self, w: Waiter) -> None:
        """Forget ``w`` (completed, expired or abandoned). Idempotent."""
        with self._lock:
            for k in w.keys:
                ws = self._watchers.get(k)
                if ws is not None:
                    ws.discard(w)
                    if not ws:
                        del self._watchers[k]

    def progress(self, key: Hashable) -> None:
        """``key`` changed: its waiters re-check their conditions, then the listeners hear of it."""
        with self._lock:
            ws = self._watchers.get(key)
            waiting = list(ws) if ws else ()
            listeners = self._listeners
        for w in waiting:
            if w.try_complete():
                self.cancel(w)
        for listener in listeners:
            try:
                listener(key)
            except Exception:
                log.exception("purgatory listener failed for %r", key)

    def progress_all(self) -> None:
        with self._lock:
            keys = list(self._watchers)
        for k in keys:
            self.progress(k)

    def waiting(self) -> int:
        """How many requests are parked (each counted once)."""
        with self._lock:
            return len({w for ws in self._watchers.values() for w in ws})

    def close(self) -> None:
        """Complete every waiter now and any later one at once (shutdown)."""
        with self._lock:
            self._closed = True
            waiting = {w for ws in self._watchers.values() for w in ws}
            self._watchers.clear()
        for w in waiting:
            w.complete()
