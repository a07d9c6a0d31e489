"""Fetch sessions (KIP-227) on the Kafka door: Fetch v7+ opens a session with a full fetch
(session epoch 0), incremental fetches name only what changed, a wrong epoch or an unknown
session gets its top-level error, epoch -1 fetches without a session (closing one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic, Producer
from tests.kafka_wire import WireClient
from tests.support import wait_until

pytestmark = pytest.mark.integration

FETCH = 1
FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH = 70, 71


def fetch(
    w: WireClient,
    version: int,
    session_id: int,
    epoch: int,
    offsets: dict[int, int],
    *,
    forgotten: list[int] | None = None,
    max_wait: int = 0,
) -> Any:
    values: dict[str, Any] = {
        "replica_id": -1,
        "max_wait": max_wait,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": session_id,
        "session_epoch": epoch,
        "topics": [
            {
                "topic": "door",
                "partitions": [
                    {"partition": p, "fetch_offset": o, "partition_max_bytes": 1 << 20} for p, o in offsets.items()
                ],
            }
        ]
        if offsets
        else [],
        "forgotten_topics_data": [{"topic": "door", "partitions": forgotten}] if forgotten else [],
        "rack_id": "",
    }
    return w.call(FETCH, version, values)


def led(bootstrap: str) -> bool:
    with AdminClient(bootstrap) as admin:
        return all(p.leader >= 0 for p in admin.describe_topics(["door"])[0].partitions)


def named(resp: Any) -> dict[int, Any]:
    return {int(p.partition_index): p for t in resp.responses for p in t.partitions}


@pytest.mark.parametrize("version", [7, 12])
def test_kafka_door_fetch_sessions(cluster_factory: Callable[..., LocalCluster], version: int) -> None:
    cluster = cluster_factory(1, **{"kafka.listeners": "PLAINTEXT://127.0.0.1:0"})
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("door", 3, 1)])
    wait_until(lambda: led(cluster.bootstrap), what="leaders")
    with WireClient(cluster.kafka_bootstrap().split(",")[0]) as w:
        full = fetch(w, version, 0, 0, {0: 0, 1: 0, 2: 0})
        assert int(full.error_code) == 0 and int(full.session_id) > 0 and sorted(named(full)) == [0, 1, 2]
        sid = int(full.session_id)
        idle = fetch(w, version, sid, 1, {}, max_wait=200)
        assert int(idle.error_code) == 0 and int(idle.session_id) == sid and not named(idle)
        with Producer(bootstrap_servers=cluster.bootstrap, acks=1) as p:
            p.send("door", b"x", partition=2).get(10)
        news = fetch(w, version, sid, 2, {}, max_wait=5000)
        assert list(named(news)) == [2] and bytes(named(news)[2].records)
        quiet = fetch(w, version, sid, 3, {2: 1}, forgotten=[0])
        assert not named(quiet)
        wrong = fetch(w, version, sid, 3, {})
        assert int(wrong.error_code) == INVALID_FETCH_SESSION_EPOCH and not named(wrong)
        unknown = fetch(w, version, sid + 1, 1, {})
        assert int(unknown.error_code) == FETCH_SESSION_ID_NOT_FOUND
        closed = fetch(w, version, sid, -1, {1: 0})  # sessionless, and session sid is closed
        assert int(closed.session_id) == 0 and list(named(closed)) == [1]
        assert int(fetch(w, version, sid, 4, {}).error_code) == FETCH_SESSION_ID_NOT_FOUND
