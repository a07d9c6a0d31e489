"""The Kafka-protocol door (kafka.listeners) against real Kafka clients and raw frames:
kcat, confluent-kafka (librdkafka), and a kio-built socket client for the wire rules."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable

import pytest

from kbroker.doors.kafka.codec import NO_TOPIC_ID, topic_uuid
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from tests.kafka_wire import WireClient
from tests.support import wait_until

ck = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.integration

DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}


def _create(cluster: LocalCluster, name: str, partitions: int, rf: int = 1) -> None:
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, rf)])


def _kcat(*args: str, data: str | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (scripts/setup dev installs it)")
    return subprocess.run(["kcat", *args], input=data, capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture
def door(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(2, **DOOR)


def test_kcat_metadata_lists_every_broker_at_its_kafka_address(door: LocalCluster) -> None:
    _create(door, "orders", 4, rf=2)
    out = _kcat("-b", door.kafka_bootstrap(), "-L", "-t", "orders")
    assert out.returncode == 0, out.stderr
    for b in door.brokers.values():
        assert f"broker {b.broker_id} at {b.kafka_listeners['PLAINTEXT']}" in out.stdout
        assert b.kafka_listeners["PLAINTEXT"] != b.address  # not the gRPC port
    assert 'topic "orders" with 4 partitions' in out.stdout


def test_kcat_produces_with_keys_and_consumes_from_the_beginning(door: LocalCluster) -> None:
    _create(door, "keyed", 3)
    lines = [f"k{i}:v{i}" for i in range(30)]
    out = _kcat("-b", door.kafka_bootstrap(), "-P", "-t", "keyed", "-K:", data="\n".join(lines) + "\n")
    assert out.returncode == 0, out.stderr
    out = _kcat("-b", door.kafka_bootstrap(), "-C", "-t", "keyed", "-o", "beginning", "-e", "-f", "%k:%s %p\n")
    assert out.returncode == 0, out.stderr
    got = [line.split(" ") for line in out.stdout.splitlines()]
    assert sorted(kv for kv, _ in got) == sorted(lines)
    by_key: dict[str, set[str]] = {}
    for kv, p in got:
        by_key.setdefault(kv.split(":")[0], set()).add(p)
    assert all(len(ps) == 1 for ps in by_key.values())  # one key, one partition (murmur2)


@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd", "snappy"])
def test_confluent_idempotent_acks_all_producer_then_kclient_reads_it(door: LocalCluster, codec: str) -> None:
    topic = f"ck-{codec}"
    _create(door, topic, 2, rf=2)
    producer = ck.Producer(
        {
            "bootstrap.servers": door.kafka_bootstrap(),
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": codec,
            "linger.ms": 5,
        }
    )
    acked: list[tuple[int, int]] = []
    errors: list[object] = []

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.append((msg.partition(), msg.offset()))  # type: ignore[attr-defined]

    for i in range(500):
        producer.produce(topic, value=f"value-{i}".encode(), key=f"key-{i % 7}".encode(), on_delivery=delivered)
    assert producer.flush(30) == 0
    assert not errors and len(acked) == 500
    with Consumer(bootstrap_servers=door.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(2)])
        values = set()
        deadline = time.monotonic() + 30
        while len(values) < 500 and time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                values.update(r.value for r in records)
    assert values == {f"value-{i}".encode() for i in range(500)}


def test_records_cross_the_doors_byte_identical(door: LocalCluster) -> None:
    _create(door, "cross", 1)
    headers = [("h1", b"\x00\x01binary"), ("h2", None), ("h1", b"again")]
    with Producer(bootstrap_servers=door.bootstrap, acks="all") as producer:
        producer.send("cross", b"grpc-value", key=b"grpc-key", headers=headers, timestamp_ms=1_700_000_000_123).get(30)
    p = ck.Producer({"bootstrap.servers": door.kafka_bootstrap(), "acks": "all"})
    p.produce(
        "cross", value=b"kafka-value", key=b"kafka-key", headers=[("x", b"y"), ("n", None)], timestamp=1_700_000_000_456
    )
    assert p.flush(30) == 0

    c = ck.Consumer({"bootstrap.servers": door.kafka_bootstrap(), "group.id": "unused", "enable.auto.commit": False})
    c.assign([ck.TopicPartition("cross", 0, 0)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m)
    c.close()
    assert [(m.key(), m.value(), m.timestamp()[1]) for m in got] == [
        (b"grpc-key", b"grpc-value", 1_700_000_000_123),
        (b"kafka-key", b"kafka-value", 1_700_000_000_456),
    ]
    assert got[0].headers() == headers
    assert got[1].headers() == [("x", b"y"), ("n", None)]

    with Consumer(bootstrap_servers=door.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("cross", 0)])
        records = []
        while len(records) < 2:
            for rs in consumer.poll(2000).values():
                records.extend(rs)
    assert records[1].key == b"kafka-key" and records[1].value == b"kafka-value"
    assert records[1].timestamp == 1_700_000_000_456
    assert records[1].headers == [("x", b"y"), ("n", None)]


def test_acks_zero_gets_no_response_but_is_written(door: LocalCluster) -> None:
    _create(door, "fire", 1)
    p = ck.Producer({"bootstrap.servers": door.kafka_bootstrap(), "acks": 0})
    for i in range(100):
        p.produce("fire", value=str(i).encode())
    assert p.flush(30) == 0
    out = _kcat("-b", door.kafka_bootstrap(), "-C", "-t", "fire", "-o", "beginning", "-e", "-f", "%s\n")
    assert sorted(int(v) for v in out.stdout.split()) == list(range(100))


# --- the wire rules, with raw frames -------------------------------------------------


def _address(cluster: LocalCluster) -> str:
    return cluster.kafka_bootstrap().split(",")[0]


def test_api_versions_advertises_what_is_served_and_an_unknown_version_gets_v0(door: LocalCluster) -> None:
    with WireClient(_address(door)) as w:
        resp = w.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert int(resp.error_code) == 0
        keys = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}
        assert keys[0] == (0, 9) and keys[1] == (4, 12) and keys[3] == (0, 12) and keys[18] == (0, 3)
        # ApiVersions v99: a v0 answer with UNSUPPORTED_VERSION and the list, same connection.
        frame = w.frame(18, 3, {})
        w.send_raw(frame[:6] + (99).to_bytes(2, "big") + frame[8:])
        _, v0 = w.read_response(18, 0)
        assert int(v0.error_code) == 35 and {int(k.api_key) for k in v0.api_keys} == set(keys)
        assert int(w.call(18, 0, {}).error_code) == 0  # the connection still serves


def test_an_api_not_served_gets_unsupported_version_not_a_dropped_connection(door: LocalCluster) -> None:
    with WireClient(_address(door)) as w:
        # DescribeProducers (61) is a real API kbroker does not serve.
        w.send_raw(w.frame(61, 0, {"topics": []}))
        _, resp = w.read_response(61, 0)
        assert resp.topics == ()  # v0 has no top-level error code: a well-formed empty answer
        # Metadata v13 is newer than served: UNSUPPORTED_VERSION, connection kept.
        frame = w.frame(3, 12, {"topics": None})
        w.send_raw(frame[:6] + (13).to_bytes(2, "big") + frame[8:])
        assert len(w.read_frame()) >= 6
        assert w.call(3, 1, {"topics": None}).brokers


def test_a_malformed_frame_closes_only_its_own_connection(door: LocalCluster) -> None:
    address = _address(door)
    with WireClient(address) as good, WireClient(address) as bad:
        good.call(18, 0, {})
        bad.send_raw((12).to_bytes(4, "big") + b"\x00\x03\x00\x05" + b"\xff" * 8)  # Metadata v5, garbage body
        with pytest.raises((ConnectionError, socket.timeout, OSError)):
            bad.read_frame()
        huge = WireClient(address)
        huge.send_raw((2**31 - 1).to_bytes(4, "big"))  # over socket.request.max.bytes
        with pytest.raises((ConnectionError, OSError)):
            huge.read_frame()
        huge.close()
        assert good.call(3, 1, {"topics": None}).brokers  # the other connection still serves


def test_pipelined_requests_are_answered_in_order(door: LocalCluster) -> None:
    with WireClient(_address(door)) as w:
        frames = [
            w.frame(18 if i % 2 else 3, 0 if i % 2 else 1, {"topics": None} if i % 2 == 0 else {}, i) for i in range(40)
        ]
        w.send_raw(b"".join(frames))
        order = [int.from_bytes(w.read_frame()[0:4], "big") for _ in range(40)]
        assert order == list(range(40))


def test_metadata_carries_the_topic_id_and_trailing_bytes_are_ignored(door: LocalCluster) -> None:
    _create(door, "with-id", 2)
    with AdminClient(bootstrap_servers=door.bootstrap) as admin:
        topic_id = admin.describe_topics(["with-id"])[0].topic_id
    assert topic_id
    with WireClient(_address(door)) as w:
        frame = w.frame(3, 12, {"topics": [{"name": "with-id"}], "allow_auto_topic_creation": False})
        body = frame[4:] + b"\x01\x00\x00"  # librdkafka 2.16 sends three more bytes after Metadata v12
        w.send_raw(len(body).to_bytes(4, "big") + body)
        _, resp = w.read_response(3, 12)
    (t,) = resp.topics
    assert t.name == "with-id" and t.topic_id == topic_uuid(topic_id) and t.topic_id != NO_TOPIC_ID
    assert len(t.partitions) == 2


def test_a_refused_fetch_names_the_error_on_every_partition_in_every_version(door: LocalCluster) -> None:
    _create(door, "refused", 1)
    bad = {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 0}  # INVALID_FETCH_SIZE (4)
    with WireClient(_address(door)) as w:
        for version in (4, 12):
            resp = w.call(
                1, version, {"max_wait": 10, "min_bytes": 1, "topics": [{"topic": "refused", "partitions": [bad]}]}
            )
            (topic,) = resp.responses
            assert [int(p.error_code) for p in topic.partitions] == [4]
            if version >= 7:
                assert int(resp.error_code) == 4


def _leader_address(cluster: LocalCluster, topic: str) -> str:
    """The Kafka-protocol address of the leader of ``topic``-0, once it has one."""
    with WireClient(_address(cluster)) as w:

        def leader() -> str | None:
            md = w.call(3, 1, {"topics": [{"name": topic}]})
            (t,) = md.topics
            at = {int(b.node_id): f"{b.host}:{b.port}" for b in md.brokers}
            return at.get(int(t.partitions[0].leader_id)) if t.partitions else None

        wait_until(lambda: leader() is not None, what=f"a leader for {topic}-0")
        found = leader()
        assert found is not None
        return found


def test_acks_zero_to_a_partition_that_is_not_there_closes_the_connection(door: LocalCluster) -> None:
    """Kafka's rule: an acks=0 producer gets no answer, so a failed partition closes the
    connection and the client refreshes its metadata instead of sending into the void."""
    from kclient.records import BatchBuilder

    _create(door, "zero", 1)
    b = BatchBuilder()
    b.append(1_700_000_000_000, None, b"v")
    batch = b.build()
    with WireClient(_leader_address(door, "zero")) as w:
        ok = w.frame(
            0,
            9,
            {
                "acks": 0,
                "timeout": 1000,
                "topic_data": [{"name": "zero", "partition_data": [{"index": 0, "records": batch}]}],
            },
        )
        w.send_raw(ok)
        assert w.call(18, 0, {}).error_code == 0  # nothing came back for the acks=0 produce
        lost = w.frame(
            0,
            9,
            {
                "acks": 0,
                "timeout": 1000,
                "topic_data": [{"name": "zero", "partition_data": [{"index": 7, "records": batch}]}],
            },
        )
        w.send_raw(lost)
        with pytest.raises((ConnectionError, OSError)):
            w.read_frame()
