"""A controlled shutdown moves every leadership of the broker in one batch,
before the broker stops serving, and no partition is ever without a live leader."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest

from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import ZkClient
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from tests.support import wait_until

pytestmark = pytest.mark.integration

TOPICS, PER_TOPIC = 4, 50  # 200 partitions, all led by the broker that leaves


def test_controlled_shutdown_of_a_broker_leading_200_partitions_leaves_none_leaderless(
    cluster_factory: Callable[..., LocalCluster], zk_connect: str
) -> None:
    cluster = cluster_factory(3)
    leaving = 1
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics(
            [
                NewTopic(
                    f"cs{t}",
                    replica_assignments={p: [leaving, (p + t) % 2 * 2, 2 - (p + t) % 2 * 2] for p in range(PER_TOPIC)},
                )
                for t in range(TOPICS)
            ]
        )
    tps = [(f"cs{t}", p) for t in range(TOPICS) for p in range(PER_TOPIC)]
    zk = ZkClient(zk_connect)
    zk.start()
    try:

        def led_by_leaving_with_full_isr() -> bool:
            states = zk.partition_states(tps)
            return all(s is not None and s.leader == leaving and len(s.isr) == 3 for s in states.values())

        wait_until(led_by_leaving_with_full_isr, 60, "every partition led by broker 1 with a full ISR")
        b = cluster.brokers[leaving]
        assert b.proc is not None
        b.signal(signal.SIGTERM)
        start = time.monotonic()
        samples = 0
        worst: list[tuple[str, int]] = []
        while b.proc.poll() is None and time.monotonic() - start < 60:
            live = {int(c) for c in zk.kazoo.get_children(zkdata.BROKER_IDS)}
            states = zk.partition_states(tps)
            leaderless = [tp for tp, s in states.items() if s is None or s.leader not in live]
            worst = max(worst, leaderless, key=len)
            samples += 1
        assert b.proc.wait(30) == 0
        took = time.monotonic() - start
        assert samples > 0
        assert worst == [], f"{len(worst)} partition(s) without a live leader, e.g. {worst[:5]}"
        text = b.log_path.read_text(errors="replace")
        assert "controlled shutdown: leadership moved away" in text, b.log_tail(80)

        def moved() -> bool:
            states = zk.partition_states(tps)
            return all(s is not None and s.leader in (0, 2) and leaving not in s.isr for s in states.values())

        wait_until(moved, 30, "every partition led by broker 0 or 2, without broker 1 in its ISR")
        print(f"controlled shutdown of a broker leading {len(tps)} partitions: {took:.1f} s, {samples} samples")
    finally:
        zk.close()
