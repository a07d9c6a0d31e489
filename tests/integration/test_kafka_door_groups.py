"""Consumer groups through the Kafka-protocol door, with real clients on real brokers:
confluent-kafka (librdkafka), kafka-python and kcat groups; a group mixing a kclient
(gRPC) member and a librdkafka member, with either one leading; offsets committed
through one door read through the other; AdminClient's group listing and description."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tests.integration.test_kctl import kctl, ok

ck = pytest.importorskip("confluent_kafka")
ck_admin = pytest.importorskip("confluent_kafka.admin")

pytestmark = pytest.mark.integration

GROUPS = {
    "kafka.listeners": "PLAINTEXT://127.0.0.1:0",
    "group.initial.rebalance.delay.ms": "100",
    "group.min.session.timeout.ms": "1000",
}
T0 = 1_700_000_000_000
KCAT_SETTINGS = ("-X", "auto.offset.reset=earliest", "-X", "session.timeout.ms=6000")


@pytest.fixture
def door(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(2, **GROUPS)


def _create(cluster: LocalCluster, name: str, partitions: int) -> None:
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])


def _produce(cluster: LocalCluster, topic: str, values: Iterable[int], partitions: int) -> None:
    """value i goes to partition i % partitions with timestamp T0 + i."""
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        futures = [producer.send(topic, str(i).encode(), partition=i % partitions, timestamp_ms=T0 + i) for i in values]
        for f in futures:
            f.get(30)


def _committed(cluster: LocalCluster, group: str) -> dict[tuple[str, int], int]:
    with AdminClient(cluster.bootstrap) as admin:
        return {(tp.topic, tp.partition): om.offset for tp, om in admin.list_consumer_group_offsets(group).items()}


def _ck_consumer(cluster: LocalCluster, group: str, **extra: Any) -> Any:
    return ck.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            **extra,
        }
    )


def _ck_poll(c: Any, timeout_s: float = 0.2) -> list[Any]:
    return [m for m in c.consume(100, timeout_s) if m.error() is None]


def _ck_assigned(c: Any) -> set[tuple[str, int]]:
    return {(tp.topic, tp.partition) for tp in c.assignment()}


def _until(what: str, check: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


# --- confluent-kafka ---------------------------------------------------------------------


def test_confluent_group_of_two_rebalances_and_reads_every_record_once(door: LocalCluster) -> None:
    _create(door, "rb", 4)
    _produce(door, "rb", range(200), 4)
    read: dict[str, list[tuple[int, int, int]]] = {"c1": [], "c2": []}

    def revoked(name: str) -> Callable[[Any, Any], None]:
        def on_revoke(consumer: Any, partitions: Any) -> None:
            try:
                consumer.commit(asynchronous=False)  # what was read is committed before it moves
            except ck.KafkaException as exc:
                if exc.args[0].code() != ck.KafkaError._NO_OFFSET:  # nothing new since the last commit
                    raise

        return on_revoke

    c1 = _ck_consumer(door, "ckg")
    c1.subscribe(["rb"], on_revoke=revoked("c1"))

    def consume(name: str, c: Any) -> None:
        batch = _ck_poll(c)
        for m in batch:
            read[name].append((m.partition(), m.offset(), int(m.value())))
        if batch:
            c.commit(asynchronous=False)

    _until("c1 reads half", lambda: consume("c1", c1) or len(read["c1"]) >= 100)
    assert _ck_assigned(c1) == {("rb", p) for p in range(4)}

    c2 = _ck_consumer(door, "ckg")
    c2.subscribe(["rb"], on_revoke=revoked("c2"))

    def split() -> bool:
        consume("c1", c1)
        consume("c2", c2)
        a1, a2 = _ck_assigned(c1), _ck_assigned(c2)
        return bool(a1) and bool(a2) and not a1 & a2 and a1 | a2 == {("rb", p) for p in range(4)}

    _until("the partitions split between the two", split)
    _produce(door, "rb", range(200, 300), 4)
    _until(
        "every record read", lambda: (consume("c1", c1), consume("c2", c2)) and len(read["c1"]) + len(read["c2"]) >= 300
    )
    time.sleep(1)
    consume("c1", c1)
    consume("c2", c2)
    values = [v for r in read.values() for _, _, v in r]
    assert sorted(values) == list(range(300))  # each once across the group
    assert {p for p, _, _ in read["c2"]} <= {p for _, p in _ck_assigned(c2)}

    # committed() reads back what was committed: the next offset of every partition
    ends = {p: 75 for p in range(4)}
    committed = c1.committed([ck.TopicPartition("rb", p) for p in range(4)], timeout=30)
    assert {tp.partition: tp.offset for tp in committed} == ends
    assert _committed(door, "ckg") == {("rb", p): 75 for p in range(4)}  # the same offsets over gRPC

    # offsets_for_times: value i has timestamp T0 + i and sits at offset i // 4 of partition i % 4
    found = c1.offsets_for_times([ck.TopicPartition("rb", 1, T0 + 42)], timeout=30)
    assert found[0].offset == 11  # value 45 (offset 11) is the first of partition 1 at or after T0+42
    c2.close()
    c1.close()

    # seek: a standalone (assigned) consumer jumps back and reads from there
    c3 = _ck_consumer(door, "seeker")
    c3.assign([ck.TopicPartition("rb", 2, 0)])
    first: list[Any] = []
    _until("the first record", lambda: bool(first.extend(_ck_poll(c3, 1.0)) or first))
    c3.seek(ck.TopicPartition("rb", 2, 70))
    after: list[Any] = []
    _until(
        "a record after the seek", lambda: bool(after.extend(m for m in _ck_poll(c3, 1.0) if m.offset() >= 70) or after)
    )
    assert (after[0].offset(), int(after[0].value())) == (70, 70 * 4 + 2)
    c3.close()


# --- kafka-python and kcat -------------------------------------------------------------------


def test_kafka_python_group_commits_offsets_that_kclient_and_kctl_see(door: LocalCluster) -> None:
    kafka = pytest.importorskip("kafka")
    _create(door, "kp", 2)
    _produce(door, "kp", range(50), 2)
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=door.kafka_bootstrap().split(","),
        group_id="kpg",
        client_id="kp-member",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )
    try:
        consumer.subscribe(["kp"])
        got: list[int] = []
        deadline = time.monotonic() + 60
        while len(got) < 50 and time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                got.extend(int(r.value) for r in records)
        assert sorted(got) == list(range(50))
        consumer.commit()
        assert consumer.committed(kafka.TopicPartition("kp", 0)) == 25

        # the member, seen over gRPC: its Kafka-binary subscription/assignment were
        # stored as protobuf, so kctl decodes them
        b = f"--bootstrap-server {door.bootstrap}"
        members = ok(kctl(b, "groups describe --group kpg --members --verbose"))
        row = next(line.split() for line in members.splitlines() if line.startswith("kpg "))
        assert "kp-member" in row and row[-1] == "kp(0,1)", members
    finally:
        consumer.close()
    with Consumer(bootstrap_servers=door.bootstrap, group_id="kpg") as kc:
        assert [kc.committed(TopicPartition("kp", p)) for p in range(2)] == [25, 25]
    described = ok(kctl(f"--bootstrap-server {door.bootstrap}", "groups describe --group kpg --offsets"))
    rows = [line.split() for line in described.splitlines() if line.startswith("kpg ")]
    assert [r[1:5] for r in rows] == [["kp", "0", "25", "25"], ["kp", "1", "25", "25"]], described


def test_a_kafka_group_drops_a_deleted_topic_and_its_member_leaves(door: LocalCluster) -> None:
    """A subscribed topic deleted under a Kafka consumer: the member sees it gone (Metadata),
    the group rebalances to the topic left, and the member closes and leaves. librdkafka
    2.0.2's suite checks the same (0045, 0107, 0113) but its consumer cannot be destroyed
    afterwards (a leak of its own), so kafka-python checks kbroker's side here."""
    kafka = pytest.importorskip("kafka")
    _create(door, "kept", 2)
    _create(door, "doomed", 2)
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=door.kafka_bootstrap().split(","),
        group_id="dropg",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        metadata_max_age_ms=1000,
    )

    def assigned() -> set[tuple[str, int]]:
        consumer.poll(200)
        return {(tp.topic, tp.partition) for tp in consumer.assignment()}

    try:
        consumer.subscribe(["kept", "doomed"])
        _until("both topics assigned", lambda: assigned() == {("kept", 0), ("kept", 1), ("doomed", 0), ("doomed", 1)})
        with AdminClient(bootstrap_servers=door.bootstrap) as admin:
            admin.delete_topics(["doomed"])
        _until("the deleted topic revoked", lambda: assigned() == {("kept", 0), ("kept", 1)})
    finally:
        consumer.close()
    with AdminClient(bootstrap_servers=door.bootstrap) as admin:
        (group,) = admin.describe_consumer_groups(["dropg"])
    assert group.members == [] and group.state in ("Empty", "Dead"), group


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_a_librdkafka_consumer_closes_at_once_after_its_topic_is_deleted(door: LocalCluster, strategy: str) -> None:
    """librdkafka (confluent-kafka's, newer than 2.0.2) with an assigned topic deleted: the
    assignment loses it, and close() (close and destroy) returns at once; librdkafka
    2.0.2's own destroy hangs here on leaked partition references."""
    keep, doomed = f"kept-{strategy}", f"doomed-{strategy}"
    _create(door, keep, 1)
    _create(door, doomed, 1)
    c = _ck_consumer(
        door,
        f"dropped-{strategy}",
        **{"partition.assignment.strategy": strategy, "topic.metadata.refresh.interval.ms": 1000},
    )
    c.subscribe([keep, doomed])
    try:
        _until("both topics assigned", lambda: (_ck_poll(c), _ck_assigned(c))[1] == {(keep, 0), (doomed, 0)})
        with AdminClient(bootstrap_servers=door.bootstrap) as admin:
            admin.delete_topics([doomed])
        _until("the deleted topic revoked", lambda: (_ck_poll(c), _ck_assigned(c))[1] == {(keep, 0)})
    finally:
        t0 = time.monotonic()
        c.close()
    assert time.monotonic() - t0 < 10


def test_kcat_balanced_consumer_reads_the_topic_and_commits(door: LocalCluster) -> None:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed")
    _create(door, "kc", 3)
    _produce(door, "kc", range(60), 3)
    out = subprocess.run(
        ["kcat", "-b", door.kafka_bootstrap(), "-G", "kcatg", "kc", "-e", "-f", "%s\n", *KCAT_SETTINGS],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(int(v) for v in out.stdout.split()) == list(range(60))
    assert _committed(door, "kcatg") == {("kc", p): 20 for p in range(3)}


# --- mixed groups ----------------------------------------------------------------------------


def test_a_mixed_group_splits_partitions_and_shares_offsets_across_the_doors(door: LocalCluster) -> None:
    _create(door, "mx", 4)
    everything = {("mx", p) for p in range(4)}
    kc = Consumer(
        bootstrap_servers=door.bootstrap,
        group_id="mixed",
        client_id="grpc-member",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        partition_assignment_strategy=("roundrobin",),
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )
    kc.subscribe(["mx"])
    kc.poll(500)  # kclient joins first: it leads and assigns to the librdkafka member
    c = _ck_consumer(door, "mixed", **{"partition.assignment.strategy": "roundrobin", "client.id": "kafka-member"})
    c.subscribe(["mx"])
    got: dict[str, list[tuple[int, int]]] = {"grpc": [], "kafka": []}

    def poll_both() -> None:
        for tp, records in kc.poll(200).items():
            got["grpc"].extend((tp.partition, int(r.value)) for r in records)
        got["kafka"].extend((m.partition(), int(m.value())) for m in _ck_poll(c))

    def split() -> bool:
        poll_both()
        a, b = {(tp.topic, tp.partition) for tp in kc.assignment()}, _ck_assigned(c)
        return bool(a) and bool(b) and not a & b and a | b == everything

    _until("the mixed group splits the partitions", split)
    grpc_parts = {p for _, p in {(tp.topic, tp.partition) for tp in kc.assignment()}}
    kafka_parts = {p for _, p in _ck_assigned(c)}
    assert len(grpc_parts) == len(kafka_parts) == 2  # roundrobin: two each

    # both doors' members, as Kafka's AdminClient sees them
    admin = ck_admin.AdminClient({"bootstrap.servers": door.kafka_bootstrap()})
    listed = admin.list_consumer_groups().result(30)
    assert "mixed" in {g.group_id for g in listed.valid}
    described = admin.describe_consumer_groups(["mixed"])["mixed"].result(30)
    by_client = {m.client_id: m for m in described.members}
    assert set(by_client) == {"grpc-member", "kafka-member"}
    assert {tp.partition for tp in by_client["grpc-member"].assignment.topic_partitions} == grpc_parts
    assert {tp.partition for tp in by_client["kafka-member"].assignment.topic_partitions} == kafka_parts
    assert described.partition_assignor == "roundrobin" and str(described.state).endswith("STABLE")

    _produce(door, "mx", range(200), 4)
    _until("every record read", lambda: poll_both() or len(got["grpc"]) + len(got["kafka"]) >= 200)
    assert sorted(v for r in got.values() for _, v in r) == list(range(200))
    assert got["grpc"] and got["kafka"]
    assert {p for p, _ in got["grpc"]} <= grpc_parts and {p for p, _ in got["kafka"]} <= kafka_parts

    # commits through either door are the same offsets
    kc.commit()
    c.commit(asynchronous=False)
    seen_by_kafka = c.committed([ck.TopicPartition("mx", p) for p in range(4)], timeout=30)
    assert {tp.partition: tp.offset for tp in seen_by_kafka} == dict.fromkeys(range(4), 50)
    assert [kc.committed(TopicPartition("mx", p)) for p in sorted(kafka_parts)] == [50, 50]

    # the librdkafka member leads once the kclient member is replaced: kclient's
    # subscription reaches it as Kafka binary, its assignment comes back as protobuf
    kc.close(autocommit=False)
    _until(
        "the librdkafka member takes every partition",
        lambda: bool(_ck_poll(c) or True) and _ck_assigned(c) == everything,
    )
    kc2 = Consumer(
        bootstrap_servers=door.bootstrap,
        group_id="mixed",
        client_id="grpc-member-2",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        partition_assignment_strategy=("roundrobin",),
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )
    kc = kc2
    kc.subscribe(["mx"])
    got = {"grpc": [], "kafka": []}
    _until("the group splits again", split)
    _produce(door, "mx", range(200, 240), 4)
    _until("the new records read", lambda: poll_both() or len(got["grpc"]) + len(got["kafka"]) >= 40)
    time.sleep(1)
    poll_both()
    assert sorted(v for r in got.values() for _, v in r) == list(range(200, 240))  # resumed at the commits
    kc.close(autocommit=False)
    c.close()


# --- the group APIs on the wire ---------------------------------------------------------------


def test_the_group_apis_on_the_wire(door: LocalCluster) -> None:
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment as KpAssignment
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as KpSubscription

    from tests.kafka_wire import WireClient

    _create(door, "w", 2)
    addresses = door.kafka_bootstrap().split(",")
    with WireClient(addresses[0]) as w:
        fc = w.call(10, 4, {"key_type": 0, "coordinator_keys": ["wg", "other"]})  # batched (KIP-699)
        assert [int(c.error_code) for c in fc.coordinators] == [0, 0] and fc.coordinators[0].key == "wg"
        coordinator = f"{fc.coordinators[0].host}:{fc.coordinators[0].port}"
        assert coordinator in addresses  # the Kafka-protocol address, not the gRPC one
        tx = w.call(10, 3, {"key": "tx", "key_type": 1})  # a transactional id's coordinator
        assert int(tx.error_code) == 0 and f"{tx.host}:{tx.port}" in addresses
        names = [f"nobody-{i}" for i in range(20)]
        found = w.call(10, 4, {"key_type": 0, "coordinator_keys": names}).coordinators
        nobody_id = next(
            c.key for c in found if f"{c.host}:{c.port}" == coordinator
        )  # an unused group, same coordinator
    subscription = bytes(KpSubscription(version=0, topics=["w"], user_data=b"mine").encode())
    with WireClient(coordinator) as c:
        join = {
            "group_id": "wg",
            "session_timeout": 6000,
            "rebalance_timeout": 10000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": subscription}],
        }
        first = c.call(11, 4, join)  # v4+: MEMBER_ID_REQUIRED (KIP-394), with the member id to join with
        assert int(first.error_code) == 79 and first.member_id
        j = c.call(11, 4, {**join, "member_id": first.member_id})
        assert int(j.error_code) == 0 and j.member_id == first.member_id and j.leader == j.member_id
        assert [bytes(m.metadata) for m in j.members] == [subscription]  # v0 in, v0 back, user data kept
        mid, gen = j.member_id, int(j.generation_id)
        mine = KpAssignment(version=0, assigned_partitions=[KpAssignment.TopicPartition(topic="w", partitions=[0, 1])])
        s = c.call(
            14,
            3,
            {
                "group_id": "wg",
                "generation_id": gen,
                "member_id": mid,
                "assignments": [{"member_id": mid, "assignment": bytes(mine.encode())}],
            },
        )
        assert int(s.error_code) == 0 and bytes(s.assignment) == bytes(mine.encode())
        assert int(c.call(12, 3, {"group_id": "wg", "generation_id": gen, "member_id": mid}).error_code) == 0
        assert int(c.call(12, 3, {"group_id": "wg", "generation_id": gen - 1, "member_id": mid}).error_code) == 22

        commit = c.call(
            8,
            8,
            {
                "group_id": "wg",
                "generation_id_or_member_epoch": gen,
                "member_id": mid,
                "topics": [
                    {
                        "name": "w",
                        "partitions": [
                            {"partition_index": 0, "committed_offset": 5, "committed_metadata": "m"},
                            {"partition_index": 7, "committed_offset": 1},
                        ],
                    }
                ],
            },
        )
        assert [int(p.error_code) for p in commit.topics[0].partitions] == [0, 3]  # 3: UNKNOWN_TOPIC_OR_PARTITION
        every = c.call(9, 7, {"group_id": "wg", "topics": None})  # null: every committed partition
        assert [
            (t.name, int(p.partition_index), int(p.committed_offset), p.metadata)
            for t in every.topics
            for p in t.partitions
        ] == [("w", 0, 5, "m")]
        named = c.call(9, 1, {"group_id": "wg", "topics": [{"name": "w", "partition_indexes": [0, 1]}]})
        assert [int(p.committed_offset) for p in named.topics[0].partitions] == [5, -1]

        d = c.call(15, 5, {"groups": ["wg", nobody_id], "include_authorized_operations": False})
        wg, nobody = d.groups
        assert (wg.group_state, wg.protocol_type, wg.protocol_data) == ("Stable", "consumer", "range")
        assert bytes(wg.members[0].member_metadata) == subscription
        assert bytes(wg.members[0].member_assignment) == bytes(mine.encode())
        assert (int(nobody.error_code), nobody.group_state, nobody.members) == (0, "Dead", ())

        listed = c.call(16, 4, {"states_filter": ["Stable"]})
        assert [(g.group_id, g.group_state) for g in listed.groups] == [("wg", "Stable")]
        assert c.call(16, 4, {"states_filter": ["Empty"]}).groups == ()
        with WireClient(next(a for a in addresses if a != coordinator)) as other:
            assert "wg" not in {g.group_id for g in other.call(16, 0, {}).groups}  # only its coordinator lists it

        od = c.call(47, 0, {"group_id": "wg", "topics": [{"name": "w", "partitions": [{"partition_index": 0}]}]})
        assert int(od.topics[0].partitions[0].error_code) == 86  # GROUP_SUBSCRIBED_TO_TOPIC
        assert int(c.call(42, 2, {"groups_names": ["wg"]}).results[0].error_code) == 68  # NON_EMPTY_GROUP

        leave = c.call(13, 4, {"group_id": "wg", "members": [{"member_id": mid}, {"member_id": "ghost"}]})
        assert int(leave.error_code) == 0
        assert [(m.member_id, int(m.error_code)) for m in leave.members] == [(mid, 0), ("ghost", 25)]
        od = c.call(47, 0, {"group_id": "wg", "topics": [{"name": "w", "partitions": [{"partition_index": 0}]}]})
        assert int(od.error_code) == 0 and int(od.topics[0].partitions[0].error_code) == 0
        assert c.call(9, 7, {"group_id": "wg", "topics": None}).topics == ()
        assert int(c.call(42, 2, {"groups_names": ["wg"]}).results[0].error_code) == 69  # GROUP_ID_NOT_FOUND: gone
