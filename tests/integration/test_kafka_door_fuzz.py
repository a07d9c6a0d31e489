"""Fuzzing the Kafka door: mutated frames (flipped bytes, truncations, insertions, bad
sizes, wrong API keys and versions) each on their own connection. The broker must answer
or close that connection only: it keeps serving, logs no traceback, and what it stored
before is intact."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.records import BatchBuilder
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.integration

ROUNDS = 1500


def _seed_frames(w: WireClient) -> list[bytes]:
    builder = BatchBuilder()
    for i in range(3):
        builder.append(1_700_000_000_000 + i, b"k%d" % i, b"v%d" % i)
    batch = builder.build()
    return [
        w.frame(18, 3, {"client_software_name": "fuzz", "client_software_version": "1"}),
        w.frame(18, 0, {}),
        w.frame(3, 12, {"topics": [{"name": "fuzz"}], "allow_auto_topic_creation": False}),
        w.frame(3, 1, {"topics": None}),
        w.frame(
            0,
            9,
            {
                "acks": 1,
                "timeout": 5000,
                "topic_data": [{"name": "fuzz-sink", "partition_data": [{"index": 0, "records": batch}]}],
            },
        ),
        w.frame(
            0,
            3,
            {
                "acks": -1,
                "timeout": 5000,
                "topic_data": [{"name": "fuzz-sink", "partition_data": [{"index": 0, "records": batch}]}],
            },
        ),
        w.frame(
            1,
            12,
            {
                "max_wait": 10,
                "min_bytes": 1,
                "topics": [
                    {
                        "topic": "fuzz",
                        "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}],
                    }
                ],
            },
        ),
        w.frame(
            1,
            4,
            {
                "max_wait": 10,
                "min_bytes": 1,
                "topics": [
                    {
                        "topic": "fuzz",
                        "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}],
                    }
                ],
            },
        ),
        w.frame(
            2,
            7,
            {"replica_id": -1, "topics": [{"name": "fuzz", "partitions": [{"partition_index": 0, "timestamp": -1}]}]},
        ),
        w.frame(23, 4, {"topics": [{"topic": "fuzz", "partitions": [{"partition": 0, "leader_epoch": 0}]}]}),
        w.frame(22, 4, {"transactional_id": None, "transaction_timeout": 1000}),
    ]


def _mutate(frame: bytes, rng: random.Random) -> bytes:
    data = bytearray(frame)
    kind = rng.randrange(7)
    if kind == 0:  # flip a few bytes of the body
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(4, len(data))
            data[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # truncate (the size prefix still claims the whole frame)
        data = data[: rng.randrange(1, len(data))]
    elif kind == 2:  # truncate and fix the size: a short body that says it is complete
        cut = rng.randrange(4, len(data))
        data = bytearray((cut - 4).to_bytes(4, "big")) + data[4:cut]
    elif kind == 3:  # insert random bytes, size fixed
        i = rng.randrange(4, len(data))
        data[i:i] = rng.randbytes(rng.randint(1, 16))
        data[0:4] = (len(data) - 4).to_bytes(4, "big")
    elif kind == 4:  # a random size prefix
        data[0:4] = rng.choice([0, 1, 7, 2**31 - 1, 2**32 - 1, rng.randrange(2**31)]).to_bytes(4, "big")
    elif kind == 5:  # another api key / version
        data[4:6] = rng.randrange(-2, 80).to_bytes(2, "big", signed=True)
        data[6:8] = rng.randrange(-1, 20).to_bytes(2, "big", signed=True)
    else:  # garbage of a plausible size
        body = rng.randbytes(rng.randint(0, 64))
        data = bytearray(len(body).to_bytes(4, "big")) + body
    return bytes(data)


def _exchange(address: str, data: bytes) -> None:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)  # EOF: the broker answers what it can, then closes
        s.settimeout(5)
        while True:
            try:
                if not s.recv(65536):
                    return
            except (TimeoutError, ConnectionError):
                return


def test_mutated_frames_close_only_their_connection(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(1, **{"kafka.listeners": "PLAINTEXT://127.0.0.1:0"})
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("fuzz", 1, 1), NewTopic("fuzz-sink", 1, 1)])
    with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        for i in range(20):
            producer.send("fuzz", b"kept-%d" % i, partition=0)
        producer.flush(30)
    address = cluster.kafka_bootstrap()
    rng = random.Random(14)
    with WireClient(address) as w:
        seeds = _seed_frames(w)
        for _ in range(ROUNDS):
            _exchange(address, _mutate(rng.choice(seeds), rng))
        # The connection opened before the storm still serves, and so does a new one.
        assert w.call(3, 1, {"topics": None}).brokers
    with WireClient(address) as fresh:
        assert int(fresh.call(18, 0, {}).error_code) == 0
    broker = cluster.brokers[0]
    assert broker.running()
    log = broker.log_path.read_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-4000:]
    with Consumer(bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("fuzz", 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(values) < 20 and time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                values.extend(r.value for r in records if r.value is not None)
    assert values == [b"kept-%d" % i for i in range(20)]
