"""The Kafka door serves a connection's requests one at a time, in arrival order, as
Kafka does (it mutes a channel until its request is answered): pipelined requests take
effect in the order sent (librdkafka's 0030 offset_commit test saw committed() return 7
where 50 was committed last)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, Consumer, NewTopic, TopicPartition
from kclient.records import BatchBuilder
from tests.kafka_wire import WireClient

pytestmark = pytest.mark.integration

DOOR = {"kafka.listeners": "PLAINTEXT://127.0.0.1:0"}
OFFSET_COMMIT, OFFSET_FETCH, PRODUCE = 8, 9, 0


@pytest.fixture
def door(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    cluster = cluster_factory(1, **DOOR)
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("ordered", 1, 1)])
    return cluster


def commit(w: WireClient, offset: int, correlation: int) -> bytes:
    return w.frame(
        OFFSET_COMMIT,
        2,
        {
            "group_id": "order-group",
            "member_id": "",
            "topics": [
                {
                    "name": "ordered",
                    "partitions": [{"partition_index": 0, "committed_offset": offset, "committed_metadata": ""}],
                }
            ],
        },
        correlation,
    )


def test_pipelined_offset_commits_end_with_the_last_one_committed(door: LocalCluster) -> None:
    """Rounds of 8 OffsetCommits sent at once with increasing offsets: OffsetFetch then
    returns the last, every round. Before: the commits ran concurrently and an earlier
    one often landed last."""
    rounds, per_round = 150, 8
    wrong: list[tuple[int, int]] = []
    with WireClient(door.kafka_bootstrap().split(",")[0], timeout_s=30) as w:
        for r in range(rounds):
            offsets = [r * 100 + i for i in range(per_round)]
            w.send_raw(b"".join(commit(w, o, i) for i, o in enumerate(offsets)))
            for i in range(per_round):
                correlation, response = w.read_response(OFFSET_COMMIT, 2)
                assert correlation == i
                assert response.topics[0].partitions[0].error_code == 0
            fetched = w.call(
                OFFSET_FETCH, 1, {"group_id": "order-group", "topics": [{"name": "ordered", "partition_indexes": [0]}]}
            )
            got = fetched.topics[0].partitions[0].committed_offset
            if got != offsets[-1]:
                wrong.append((offsets[-1], got))
    assert wrong == [], f"{len(wrong)} of {rounds} rounds ended with an earlier commit: {wrong[:5]}"


def test_pipelined_produce_requests_land_in_the_order_sent(door: LocalCluster) -> None:
    n = 60
    with WireClient(door.kafka_bootstrap().split(",")[0], timeout_s=30) as w:
        frames = []
        for i in range(n):
            batch = BatchBuilder()
            batch.append(int(time.time() * 1000), None, str(i).encode() * (1 + (i * 37) % 2000))
            frames.append(
                w.frame(
                    PRODUCE,
                    3,
                    {
                        "transactional_id": None,
                        "acks": 1,
                        "timeout": 10000,
                        "topic_data": [{"name": "ordered", "partition_data": [{"index": 0, "records": batch.build()}]}],
                    },
                    i,
                )
            )
        w.send_raw(b"".join(frames))
        for i in range(n):
            correlation, response = w.read_response(PRODUCE, 3)
            assert correlation == i
            partition = response.responses[0].partition_responses[0]
            assert partition.error_code == 0
            assert partition.base_offset == i  # each lands after the one sent before it
    with Consumer(bootstrap_servers=door.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("ordered", 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(values) < n and time.monotonic() < deadline:
            for records in consumer.poll(2000).values():
                values.extend(r.value or b"" for r in records)
    assert [v[: len(str(i))] for i, v in enumerate(values)] == [str(i).encode() for i in range(n)]
