"""Produce v0-2 on the Kafka door of a real broker: message sets of magic 0/1 are
up-converted and stored, and each version is answered in its own response shape, with
an error per partition for a set Kafka refuses (CORRUPT_MESSAGE for a CRC mismatch)
while the request's other partitions are produced."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from kclient.errors import CorruptRecordError
from kclient.records import Compression, decode_batches
from tests.kafka_wire import WireClient
from tests.legacy_messages import compressed, message_set

pytestmark = pytest.mark.integration

DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}
TOPIC = "legacy"
APPEND_TIME_TOPIC = "legacy-append-time"
RECORDS = [(b"k0", b"v0"), (None, b"v1"), (b"k2", b"v2")]


@pytest.fixture
def door(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    cluster = cluster_factory(1, **DOOR)
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics(
            [
                NewTopic(TOPIC, 2, 1),
                NewTopic(APPEND_TIME_TOPIC, 1, 1, topic_configs={"message.timestamp.type": "LogAppendTime"}),
            ]
        )
    return cluster


def _produce(c: WireClient, version: int, topic: str, partitions: dict[int, bytes]) -> Any:
    return c.call(
        0,
        version,
        {
            "acks": 1,
            "timeout": 10_000,
            "topic_data": [
                {"name": topic, "partition_data": [{"index": i, "records": r} for i, r in partitions.items()]}
            ],
        },
    )


def _fetch(c: WireClient, topic: str, partition: int) -> list[tuple[int, bytes | None, bytes | None, int]]:
    resp = c.call(
        1,
        4,
        {
            "replica_id": -1,
            "max_wait": 0,
            "min_bytes": 0,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [{"partition": partition, "fetch_offset": 0, "partition_max_bytes": 1 << 20}],
                }
            ],
        },
    )
    data = bytes(resp.responses[0].partitions[0].records or b"")
    return [(r.offset, r.key, r.value, r.timestamp) for _, rs in decode_batches(data) for r in rs]


def test_produce_v1_magic_0_is_stored_and_a_corrupt_partition_fails_alone(door: LocalCluster) -> None:
    corrupt = bytearray(message_set(RECORDS))
    corrupt[-1] ^= 0xFF
    with WireClient(door.kafka_bootstrap()) as c:
        resp = _produce(c, 1, TOPIC, {0: message_set(RECORDS), 1: bytes(corrupt)})
        by_index = {int(r.index): r for r in resp.responses[0].partition_responses}
        assert (by_index[0].error_code, by_index[0].base_offset) == (0, 0)
        assert (by_index[1].error_code, by_index[1].base_offset) == (CorruptRecordError.errno, -1)
        assert int(resp.throttle_time.total_seconds()) == 0  # v1's field, read in v1's shape
        assert _fetch(c, TOPIC, 0) == [(i, k, v, -1) for i, (k, v) in enumerate(RECORDS)]
        assert _fetch(c, TOPIC, 1) == []  # nothing of the refused set was kept


@pytest.mark.parametrize("version", [0, 2])
def test_produce_v0_and_v2_magic_1_gzip(door: LocalCluster, version: int) -> None:
    ts = 1_700_000_000_000
    with WireClient(door.kafka_bootstrap()) as c:
        wrapper = compressed(message_set(RECORDS, magic=1, timestamp=ts), Compression.GZIP, magic=1, timestamp=ts)
        resp = _produce(c, version, TOPIC, {0: wrapper})
        r = resp.responses[0].partition_responses[0]
        assert (r.error_code, r.base_offset) == (0, 0)
        if version == 2:
            assert r.log_append_time is None  # -1: a CreateTime topic
        assert _fetch(c, TOPIC, 0) == [(i, k, v, ts) for i, (k, v) in enumerate(RECORDS)]


def test_log_append_time_stamps_magic_0_records(door: LocalCluster) -> None:
    before = int(time.time() * 1000)
    with WireClient(door.kafka_bootstrap()) as c:
        resp = _produce(c, 2, APPEND_TIME_TOPIC, {0: message_set(RECORDS)})
        r = resp.responses[0].partition_responses[0]
        assert r.error_code == 0
        stamped = int(r.log_append_time.timestamp() * 1000)
        assert before <= stamped <= int(time.time() * 1000) + 1
        assert {ts for *_, ts in _fetch(c, APPEND_TIME_TOPIC, 0)} == {stamped}


def test_a_produce_version_not_served_fails_each_partition_in_its_own_shape(door: LocalCluster) -> None:
    """Produce v10+ (not served: ApiVersions says 0-9) is answered in that version's
    schema with UNSUPPORTED_VERSION on every partition, and nothing is written; with
    acks=0 (no answer awaited) the connection closes."""
    unsupported = 35
    request = {
        "transactional_id": None,
        "acks": 1,
        "timeout": 10_000,
        "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": message_set(RECORDS)}]}],
    }
    with WireClient(door.kafka_bootstrap()) as c:
        resp = c.call(0, 10, request)
        [r] = resp.responses[0].partition_responses
        assert (int(r.index), r.error_code, r.base_offset) == (0, unsupported, -1)
        assert _fetch(c, TOPIC, 0) == []
    with WireClient(door.kafka_bootstrap()) as c:
        c.send_raw(c.frame(0, 10, {**request, "acks": 0}))
        c.sock.settimeout(10)
        assert c.sock.recv(1) == b""


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4"])
def test_librdkafka_as_a_0_9_client_produces_with_each_codec(door: LocalCluster, codec: str) -> None:
    """confluent-kafka with ApiVersions off and a 0.9.0 fallback sends Produce v1 with
    magic-0 messages (lz4 with Kafka 0.8's framing); every record arrives, in order."""
    ck = pytest.importorskip("confluent_kafka")
    producer = ck.Producer(
        {
            "bootstrap.servers": door.kafka_bootstrap(),
            "api.version.request": False,
            "broker.version.fallback": "0.9.0",
            "enable.idempotence": False,
            "compression.codec": codec,
            "linger.ms": 50,
        }
    )
    errors: list[object] = []
    for i in range(20):
        producer.produce(
            TOPIC, value=b"value-%d" % i, key=b"k%d" % i, partition=1, on_delivery=lambda e, m: errors.append(e)
        )
    assert producer.flush(30) == 0
    assert errors == [None] * 20
    with WireClient(door.kafka_bootstrap()) as c:
        got = _fetch(c, TOPIC, 1)
    assert [(k, v) for _, k, v, _ in got] == [(b"k%d" % i, b"value-%d" % i) for i in range(20)]
    assert {ts for *_, ts in got} == {-1}  # magic 0: no timestamps
