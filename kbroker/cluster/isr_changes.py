"""Leaders announce the ISR changes they wrote, in batches (Kafka's ISR change propagation).

A leader writes a partition's new ISR to its state znode itself (compare-and-set); the
other brokers learn it from the controller, which learns it from a sequential znode
``/isr_change_notification/isr_change_<seq>`` naming the partitions changed. This module
batches those announcements: changes recorded within ``linger_s`` of each other (and at
most :data:`MAX_PARTITIONS_PER_NOTIFICATION` per znode) go out in one znode, so a restarted
broker catching up on thousands of partitions costs a few znodes, not thousands of
watch events.

Thread safety: :meth:`IsrChangeNotifier.record` may be called from any thread; one daemon
thread (``isr-change-notifier``) writes. A write that fails (ZooKeeper unreachable) is
retried every second; pending changes are kept until written.
"""

from __future__ import annotations

import logging
import threading
import time

from kbroker.cluster.zk_client import ZkClient

log = logging.getLogger(__name__)

TP = tuple[str, int]
MAX_PARTITIONS_PER_NOTIFICATION = 2000
"""A notification znode names at most this many partitions (well under jute.maxbuffer)."""
LINGER_S = 0.05
SUMMARY_NAMES = 5
"""Partitions named in a batch's log line."""
RETRY_S = 1.0


class IsrChangeNotifier:
    def __init__(self, zk: ZkClient, *, linger_s: float = LINGER_S) -> None:
        self._zk = zk
        self._linger_s = linger_s
        self._cond = threading.Condition()
        self._pending: set[TP] = set()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="isr-change-notifier", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def record(self, topic: str, partition: int) -> None:
        with self._cond:
            self._pending.add((topic, partition))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                # Let the rest of a burst arrive: records notify, so wait out the whole linger.
                deadline = time.monotonic() + self._linger_s
                while not self._stopped and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                batch, self._pending = sorted(self._pending), set()
            try:
                for start in range(0, len(batch), MAX_PARTITIONS_PER_NOTIFICATION):
                    self._zk.announce_isr_changes(batch[start : start + MAX_PARTITIONS_PER_NOTIFICATION])
                # The one line per batch (the partitions' own lines are DEBUG).
                named = ", ".join(f"{t}-{p}" for t, p in batch[:SUMMARY_NAMES])
                more = f" and {len(batch) - SUMMARY_NAMES} more" if len(batch) > SUMMARY_NAMES else ""
                log.info("ISR changed as leader and announced to the controller: %d partition(s): %s%s",
                         len(batch), named, more)  # fmt: skip
            except Exception as exc:
                log.warning("cannot announce %d ISR change(s) to the controller: %r; retrying", len(batch), exc)
                with self._cond:
                    self._pending.update(batch)
                    self._cond.wait(RETRY_S)
