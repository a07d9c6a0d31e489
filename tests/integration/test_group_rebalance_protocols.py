"""Group membership as Kafka 2.8 runs it, through the Kafka-protocol door with real
clients: KIP-394 (MEMBER_ID_REQUIRED), KIP-345 static members (a restart within the
session timeout keeps the assignment without a rebalance, the replaced member id is
fenced, the session timeout still removes a member that does not come back), KIP-429
cooperative rebalancing (two rounds when a member joins, never more, no partition owned
twice), and commits racing a rebalance."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from kbroker.local.cluster import LocalCluster
from tests.integration.test_kafka_door_groups import GROUPS, _ck_consumer, _create, _produce

ck = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.integration


@pytest.fixture
def door(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(1, **GROUPS)


class Watched:
    """A confluent-kafka consumer that records its rebalance callbacks."""

    def __init__(self, cluster: LocalCluster, group: str, topic: str, **extra: Any) -> None:
        self.events: list[tuple[str, frozenset[tuple[str, int]]]] = []
        self.c = _ck_consumer(cluster, group, **extra)
        self.c.subscribe([topic], on_assign=self._assign, on_revoke=self._revoke)

    def _assign(self, c: Any, parts: list[Any]) -> None:
        self.events.append(("assign", frozenset((p.topic, p.partition) for p in parts)))

    def _revoke(self, c: Any, parts: list[Any]) -> None:
        self.events.append(("revoke", frozenset((p.topic, p.partition) for p in parts)))

    def poll(self) -> None:
        self.c.poll(0.1)

    def owned(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self.c.assignment()}


def _pump(members: list[Watched], check: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for m in members:
            m.poll()
        if check():
            return
    raise AssertionError(f"timed out waiting for {what}")


def _stored_generation(cluster: LocalCluster, group: str) -> int:
    import json

    from kazoo.client import KazooClient

    from kbroker.cluster import zkdata

    zk = KazooClient(hosts=cluster.zk_connect)
    zk.start(10)
    try:
        data, _ = zk.get(zkdata.group_path(group))
        return int(json.loads(data.decode())["generation"])
    finally:
        zk.stop()
        zk.close()


def test_kip394_a_first_join_v4_is_answered_member_id_required(door: LocalCluster) -> None:
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as KpSubscription

    from tests.kafka_wire import WireClient

    _create(door, "k394", 1)
    subscription = bytes(KpSubscription(version=0, topics=["k394"], user_data=b"").encode())
    join = {
        "group_id": "k394",
        "session_timeout": 6000,
        "rebalance_timeout": 10000,
        "member_id": "",
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": subscription}],
    }
    with WireClient(door.kafka_bootstrap().split(",")[0]) as c:
        first = c.call(11, 4, join)
        assert int(first.error_code) == 79 and first.member_id  # MEMBER_ID_REQUIRED, with the id to use
        again = c.call(11, 4, {**join, "member_id": first.member_id})
        assert int(again.error_code) == 0 and again.member_id == first.member_id == again.leader
        old = c.call(11, 3, {**join, "group_id": "k394-v3"})  # before v4: admitted at once
        assert int(old.error_code) == 0 and old.member_id


def test_a_restarted_static_member_keeps_its_assignment_without_a_rebalance(door: LocalCluster) -> None:
    _create(door, "static", 4)
    _produce(door, "static", range(40), 4)
    settings = {"session.timeout.ms": 15000, "max.poll.interval.ms": 30000}
    a = Watched(door, "sg", "static", **settings, **{"group.instance.id": "a"})
    b = Watched(door, "sg", "static", **settings, **{"group.instance.id": "b"})
    _pump([a, b], lambda: len(a.owned()) + len(b.owned()) == 4 and bool(a.owned()) and bool(b.owned()), "two owners")
    b_had, a_events, generation = b.owned(), len(a.events), _stored_generation(door, "sg")

    b.c.close()  # a static member does not leave the group
    started = time.monotonic()
    b = Watched(door, "sg", "static", **settings, **{"group.instance.id": "b"})
    _pump([a, b], lambda: b.owned() == b_had, "b's old partitions back")
    assert time.monotonic() - started < 15  # within the session timeout: the generation below proves it
    for _ in range(20):  # a sees no rebalance, now or a little later
        a.poll()
        b.poll()
    assert len(a.events) == a_events and _stored_generation(door, "sg") == generation

    b.c.close()  # and without a restart, the session timeout removes it
    _pump([a], lambda: len(a.owned()) == 4, "a owning everything after b's session timed out", timeout_s=60)
    a.c.close()


def test_a_replaced_static_member_id_is_fenced_on_the_wire(door: LocalCluster) -> None:
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as KpSubscription

    from tests.kafka_wire import WireClient

    _create(door, "fence", 1)
    subscription = bytes(KpSubscription(version=0, topics=["fence"], user_data=b"").encode())
    join = {
        "group_id": "fg",
        "session_timeout": 6000,
        "rebalance_timeout": 10000,
        "member_id": "",
        "group_instance_id": "i-1",
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": subscription}],
    }
    with WireClient(door.kafka_bootstrap().split(",")[0]) as c:
        j = c.call(11, 5, join)  # static: no MEMBER_ID_REQUIRED round
        assert int(j.error_code) == 0 and j.member_id.startswith("i-1-")
        assert [m.group_instance_id for m in j.members] == ["i-1"]
        gen = int(j.generation_id)
        s = c.call(
            14,
            3,
            {
                "group_id": "fg",
                "generation_id": gen,
                "member_id": j.member_id,
                "group_instance_id": "i-1",
                "assignments": [{"member_id": j.member_id, "assignment": b""}],
            },
        )
        assert int(s.error_code) == 0
        again = c.call(11, 5, join)  # the same instance restarted
        assert int(again.error_code) == 0 and again.member_id != j.member_id
        assert int(again.generation_id) == gen and again.leader == j.member_id  # no rebalance, not told to lead
        hb = {"group_id": "fg", "generation_id": gen, "member_id": j.member_id, "group_instance_id": "i-1"}
        assert int(c.call(12, 3, hb).error_code) == 82  # FENCED_INSTANCE_ID
        assert int(c.call(12, 3, {**hb, "member_id": again.member_id}).error_code) == 0
        d = c.call(15, 5, {"groups": ["fg"], "include_authorized_operations": False}).groups[0]
        assert [(m.member_id, m.group_instance_id) for m in d.members] == [(again.member_id, "i-1")]
        left = c.call(13, 3, {"group_id": "fg", "members": [{"member_id": "", "group_instance_id": "i-1"}]})
        assert [int(m.error_code) for m in left.members] == [0]
        d = c.call(15, 5, {"groups": ["fg"], "include_authorized_operations": False}).groups[0]
        assert d.members == ()


def test_cooperative_sticky_hands_partitions_over_in_two_rounds(door: LocalCluster) -> None:
    _create(door, "coop", 6)
    _produce(door, "coop", range(60), 6)
    coop = {"partition.assignment.strategy": "cooperative-sticky"}
    a = Watched(door, "cg", "coop", **coop)
    _pump([a], lambda: len(a.owned()) == 6, "a owning all six")
    before = _stored_generation(door, "cg")
    b = Watched(door, "cg", "coop", **coop)
    _pump([a, b], lambda: len(a.owned()) == 3 and len(b.owned()) == 3, "three each")
    for _ in range(30):  # let any further round show itself
        a.poll()
        b.poll()
    assert not a.owned() & b.owned() and len(a.owned() | b.owned()) == 6
    assert _stored_generation(door, "cg") - before == 2  # KIP-429: revoke, then hand over
    # Incremental: a gave up three and kept three throughout (librdkafka also reports the
    # empty incremental assignments of each round).
    assert [(e, len(tps)) for e, tps in a.events if tps] == [("assign", 6), ("revoke", 3)], a.events
    a.c.close()
    b.c.close()
