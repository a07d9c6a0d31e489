"""The thread that does a ZooKeeper watcher's work: kazoo's callbacks (watches, session
state) only enqueue, one daemon thread handles each event in order.

Events handed to ``handle``: ``"start"`` (first), ``"watch"`` (a watch fired), and
``"reconnected"`` (the session came back after SUSPENDED/LOST: watches may be gone and
notifications missed — re-read and re-arm). ZooKeeper being unreachable is logged as one
WARNING, anything else with its traceback; either way ``on_error`` is told and the thread
goes on with the next event.

Used by the dynamic broker configs, the SCRAM credential cache and the ACL cache.
Thread safety: :meth:`watch` and the state listener run on kazoo's threads and only
enqueue; ``handle`` runs on this thread only.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from kazoo.exceptions import ConnectionLoss, SessionExpiredError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from kbroker.cluster.zk_client import ZkClient

log = logging.getLogger(__name__)

Event = tuple[str, threading.Event | None] | None


class ZkEventThread:
    def __init__(
        self,
        zk: ZkClient,
        name: str,
        handle: Callable[[str], None],
        *,
        on_error: Callable[[BaseException], None] = lambda exc: None,
    ) -> None:
        self._zk = zk
        self.name = name
        self._handle = handle
        self._on_error = on_error
        self._events: queue.Queue[Event] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stopped = False
        self._disconnected = False

    def start(self) -> None:
        self._zk.add_state_listener(self._session_state)
        self._events.put(("start", None))
        self._thread.start()

    def stop(self, join_s: float = 0.0) -> None:
        self._stopped = True
        self._zk.remove_state_listener(self._session_state)
        self._events.put(None)
        if join_s and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(join_s)

    def sync(self, timeout_s: float = 10.0, *, poke: bool = False) -> bool:
        """Wait until every event enqueued so far is handled (``poke``: after one more
        ``"watch"``, i.e. a fresh look); True when done within ``timeout_s``."""
        done = threading.Event()
        if poke:
            self._events.put(("watch", None))
        self._events.put(("barrier", done))
        return done.wait(timeout_s)

    # --- kazoo threads: enqueue only -----------------------------------------------------

    def watch(self, event: WatchedEvent) -> None:
        """A kazoo watch callback."""
        if not self._stopped and event.type != EventType.NONE:
            self._events.put(("watch", None))

    def _session_state(self, state: KazooState) -> None:
        if self._stopped:
            return
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            self._disconnected = True
        elif state == KazooState.CONNECTED and self._disconnected:
            self._disconnected = False
            self._events.put(("reconnected", None))

    # --- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            kind, done = event
            if done is not None:
                done.set()
                continue
            try:
                self._handle(kind)
            except (ConnectionLoss, SessionExpiredError) as exc:
                log.warning("%s: ZooKeeper unreachable (%r); read again on reconnect", self.name, exc)
                self._on_error(exc)
            except Exception as exc:
                log.exception("%s: handling a ZooKeeper event failed", self.name)
                self._on_error(exc)
