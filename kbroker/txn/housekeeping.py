"""The transaction coordinator's own thread (Kafka's abortTimedOutTransactions and the
marker channel's retries).

Every ``transaction.abort.timed.out.transaction.cleanup.interval.ms`` it looks at every
transactional id this broker coordinates (the ids under ``/transaction_state`` that hash
here over the live brokers): a transaction left in PrepareCommit or PrepareAbort (its
coordinator died between the decision and the markers, or a leader refused a marker) is
completed, and an Ongoing one past its ``transaction.timeout.ms`` is aborted with its
producer epoch bumped. Between two such scans, the ids found unfinished, and those whose completion
failed since (:meth:`~kbroker.txn.coordinator.TransactionCoordinator.take_incomplete`),
are retried every ``retry_ms``, so a transaction whose markers failed completes soon
after the leaders come back. A new coordinator of an id (its broker took over the id when the set of
brokers changed) picks it up at its next scan.

Thread safety: one daemon thread; :meth:`stop` joins it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kbroker.cluster.txn_store import TransactionStore
from kbroker.txn.coordinator import TransactionCoordinator

log = logging.getLogger(__name__)


class TransactionHousekeeping:
    """Completes and expires the transactions of the ids this broker coordinates."""

    def __init__(
        self,
        coordinator: TransactionCoordinator,
        store: TransactionStore,
        is_mine: Callable[[str], bool],
        *,
        interval_ms: int = 10000,
        retry_ms: int = 250,
    ) -> None:
        self._coordinator = coordinator
        self._store = store
        self._is_mine = is_mine
        self._interval_s = interval_ms / 1000
        self._retry_s = min(retry_ms, interval_ms) / 1000
        self._stop = threading.Event()
        self._unfinished: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="txn-housekeeping", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def unfinished(self) -> int:
        """Transactions found preparing (markers not all written) at the last pass."""
        return len(self._unfinished)

    def scan(self) -> None:
        """One full pass over the ids this broker coordinates."""
        mine = [tid for tid in self._store.transactional_ids() if self._is_mine(tid)]
        self._coordinator.abort_expired(mine)
        self._coordinator.complete_pending(mine)
        self._unfinished = self._still_preparing(mine)

    def retry(self) -> None:
        """Complete again the ids the last pass left preparing, and those whose
        completion failed since."""
        self._unfinished |= self._coordinator.take_incomplete()
        if self._unfinished:
            ids = [tid for tid in self._unfinished if self._is_mine(tid)]
            self._coordinator.complete_pending(ids)
            self._unfinished = self._still_preparing(ids)

    def _still_preparing(self, ids: list[str]) -> set[str]:
        left = set()
        for tid in ids:
            meta = self._coordinator.describe(tid)
            if meta is not None and meta.state.preparing:
                left.add(tid)
        return left

    def _run(self) -> None:
        next_scan = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + self._interval_s
                    self.scan()
                else:
                    self.retry()
            except Exception as exc:  # ZooKeeper away: the next pass tries again
                log.warning("transaction housekeeping: %s", exc)
            self._stop.wait(min(self._retry_s, max(next_scan - time.monotonic(), 0)))
