"""A follower's Fetch asks for Kafka's limits: ``replica.fetch.max.bytes`` (1 MiB) per
partition and ``replica.fetch.response.max.bytes`` (10 MiB) for the whole answer. Now that
the leader keeps a response within its total (KIP-74), a total of 1 MiB would slow a
follower of many partitions to 1 MiB per round trip."""

from __future__ import annotations

from pathlib import Path

from kbroker.purgatory import Purgatory
from kbroker.replication.fetcher import REPLICA_FETCH_RESPONSE_MAX_BYTES, ReplicaFetcher
from kclient.proto.kbroker.v1 import log_pb2
from tests.support import wait_until
from tests.unit.test_replica_fetcher import FOLLOWER, LEADER, InProcessLeader
from tests.unit.test_replica_fetcher import setup as fetcher_setup


class Recording(InProcessLeader):
    def __init__(self, leader: object) -> None:
        super().__init__(leader)  # type: ignore[arg-type]
        self.requests: list[log_pb2.FetchRequest] = []

    def fetch(self, request: log_pb2.FetchRequest, timeout_s: float) -> log_pb2.FetchResponse:
        self.requests.append(request)
        return super().fetch(request, timeout_s)


def test_follower_fetch_total_is_replica_fetch_response_max_bytes(tmp_path: Path) -> None:
    leader, follower, _, _ = fetcher_setup(tmp_path)
    endpoint = Recording(leader)
    fetcher = ReplicaFetcher(FOLLOWER, LEADER, endpoint, max_wait_ms=5, max_bytes=1 << 20, purgatory=Purgatory())
    fetcher.add(follower, 0)
    fetcher.start()
    try:
        wait_until(lambda: bool(endpoint.requests), 10, "a fetch")
    finally:
        fetcher.shutdown()
    req = endpoint.requests[0]
    assert REPLICA_FETCH_RESPONSE_MAX_BYTES == 10 * 1024 * 1024
    assert req.max_bytes == REPLICA_FETCH_RESPONSE_MAX_BYTES
    assert [p.partition_max_bytes for t in req.topics for p in t.partitions] == [1 << 20]
