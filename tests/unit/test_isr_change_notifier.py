"""Leaders' ISR changes go to the controller in batches (``/isr_change_notification``)."""

from __future__ import annotations

import threading
import time
from typing import cast

from kbroker.cluster.isr_changes import MAX_PARTITIONS_PER_NOTIFICATION, IsrChangeNotifier
from kbroker.cluster.zk_client import ZkClient
from tests.support import wait_until


class Announcements:
    """The one ZkClient call the notifier makes, recorded."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, int]]] = []
        self.lock = threading.Lock()

    def announce_isr_changes(self, partitions: list[tuple[str, int]]) -> None:
        with self.lock:
            self.batches.append(list(partitions))

    def announced(self) -> list[tuple[str, int]]:
        with self.lock:
            return [tp for b in self.batches for tp in b]


def test_changes_recorded_within_the_linger_go_out_in_one_notification() -> None:
    zk = Announcements()
    notifier = IsrChangeNotifier(cast(ZkClient, zk), linger_s=0.5)
    notifier.start()
    try:
        for i in range(20):  # a burst spread over ~100 ms: each record wakes the thread
            notifier.record("t", i)
            time.sleep(0.005)
        wait_until(lambda: len(zk.announced()) == 20, 10, "the burst announced")
        assert zk.batches == [[("t", i) for i in range(20)]]
    finally:
        notifier.stop()


def test_a_large_burst_is_split_and_a_partition_is_named_once_per_notification() -> None:
    zk = Announcements()
    notifier = IsrChangeNotifier(cast(ZkClient, zk), linger_s=0.2)
    count = MAX_PARTITIONS_PER_NOTIFICATION * 2 + 500
    for i in range(count):
        notifier.record("t", i)
        notifier.record("t", i)  # twice: named once
    notifier.start()
    try:
        wait_until(lambda: len(zk.announced()) == count, 10, "the burst announced")
        assert [len(b) for b in zk.batches] == [MAX_PARTITIONS_PER_NOTIFICATION] * 2 + [500]
    finally:
        notifier.stop()
