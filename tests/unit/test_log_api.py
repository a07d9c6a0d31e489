"""The core's log requests (kbroker.api.log_api), without sockets: whole-request
validation raises the error table's exceptions and changes nothing, authorization answers
per topic, and only what passed reaches the replica manager."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from kbroker.api.access import Access
from kbroker.api.log_api import EpochQuery, Fetch, IsolationLevel, LogApi, OffsetQuery
from kbroker.api.metadata_api import MetadataApi
from kbroker.replication.fetch_session import FetchSpec
from kbroker.replication.replica_manager import (
    DeleteRecordsResult,
    FetchResult,
    OffsetResult,
    ProduceResult,
    TopicPartition,
)
from kclient.errors import (
    ClusterAuthorizationFailedError,
    InvalidFetchSizeError,
    InvalidRequestError,
    InvalidTopicError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from tests.support import FakeAuthorizer, FakeMetadataCache


class FakeReplicas:
    """The replica manager as the core calls it, recording what reached it."""

    def __init__(self) -> None:
        self.appended: list[tuple[int, list[tuple[TopicPartition, bytes]]]] = []
        self.fetched: list[list[FetchSpec]] = []
        self.deleted: list[dict[TopicPartition, int]] = []

    def fenced_partition(self, topic: str, partition: int) -> bool:
        return False

    def any_fenced(self) -> bool:
        return False

    async def append_async(
        self, acks: int, timeout_ms: int, entries: list[tuple[TopicPartition, bytes]]
    ) -> dict[TopicPartition, ProduceResult]:
        self.appended.append((acks, entries))
        return {tp: ProduceResult(None, 7, 0, -1) for tp, _ in entries}

    async def fetch_async(
        self,
        offload: Any,
        replica_id: int,
        wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        specs: list[FetchSpec],
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> list[FetchResult]:
        self.fetched.append(specs)
        self.isolation = isolation
        return [FetchResult(None, None) for _ in specs]

    def list_offset(
        self,
        topic: str,
        index: int,
        timestamp: int,
        replica_id: int,
        epoch: int = -1,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> OffsetResult:
        return OffsetResult(None, 42 if isolation is IsolationLevel.READ_UNCOMMITTED else 40, timestamp, 3)

    def partition(self, topic: str, index: int) -> Any:
        raise UnknownTopicOrPartitionError(f"{topic}-{index} is not here")

    async def delete_records_async(
        self, offload: Any, timeout_ms: int, offsets: dict[TopicPartition, int]
    ) -> dict[TopicPartition, DeleteRecordsResult]:
        self.deleted.append(offsets)
        return {tp: DeleteRecordsResult(None, o) for tp, o in offsets.items()}


class FakeProducerIds:
    def generate(self) -> tuple[int, int]:
        return 1000, 0


async def _offload(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _api(*denied: tuple[str, str, str]) -> tuple[LogApi, FakeReplicas]:
    replicas = FakeReplicas()
    metadata = FakeMetadataCache([1], {"t": 2, "secret": 1})
    access = Access(FakeAuthorizer(*denied))
    topics = MetadataApi(lambda: "c", metadata, None, access, replicas.fenced_partition, replicas.any_fenced)  # type: ignore[arg-type]
    api = LogApi(replicas, metadata, topics, FakeProducerIds(), access, _offload)  # type: ignore[arg-type]
    return api, replicas


def _produce(api: LogApi, timeout_ms: int, entries: Sequence[tuple[TopicPartition, bytes]]) -> Any:
    return asyncio.run(api.produce(-1, timeout_ms, entries))


def test_a_produce_with_a_negative_timeout_is_refused_whole_and_appends_nothing() -> None:
    api, replicas = _api()
    with pytest.raises(InvalidRequestError):
        _produce(api, -1, [(("t", 0), b"x")])
    assert replicas.appended == []


def test_a_produce_answers_refused_and_misnamed_topics_and_appends_the_rest() -> None:
    api, replicas = _api(("WRITE", "TOPIC", "secret"))
    results = _produce(api, 1000, [(("t", 0), b"a"), (("secret", 0), b"b"), (("bad/name", 0), b"c")])
    assert isinstance(results[("secret", 0)].error, TopicAuthorizationFailedError)
    assert isinstance(results[("bad/name", 0)].error, InvalidTopicError)
    assert results[("t", 0)].error is None and results[("t", 0)].base_offset == 7
    assert replicas.appended == [(-1, [(("t", 0), b"a")])]
    assert api.parked == {"Produce": 0, "Fetch": 0}


@pytest.mark.parametrize(
    ("fetch", "error"),
    [
        (Fetch([], replica_id=-2), InvalidRequestError),
        (Fetch([], max_wait_ms=-1), InvalidRequestError),
        (Fetch([], max_bytes=0), InvalidFetchSizeError),
        (Fetch([FetchSpec("t", 0, 0, 0)]), InvalidFetchSizeError),
        (Fetch([FetchSpec("t", 0, 0, 10), FetchSpec("t", 0, 5, 10)]), InvalidRequestError),
    ],
)
def test_a_malformed_fetch_is_refused_whole(fetch: Fetch, error: type[Exception]) -> None:
    api, replicas = _api()
    with pytest.raises(error):
        asyncio.run(api.fetch(fetch))
    assert replicas.fetched == []


def test_a_follower_without_cluster_action_is_answered_topic_authorization_failed() -> None:
    api, replicas = _api(("CLUSTER_ACTION", "CLUSTER", "kafka-cluster"))
    answer = asyncio.run(api.fetch(Fetch([FetchSpec("t", 0, 0, 10)], replica_id=2, max_wait_ms=0)))
    [(spec, result)] = answer.partitions
    assert spec.topic == "t" and isinstance(result.error, TopicAuthorizationFailedError)
    assert replicas.fetched == [[]]  # nothing read for it


def test_list_offsets_answers_in_order_with_refusals() -> None:
    api, _ = _api(("DESCRIBE", "TOPIC", "secret"))
    with pytest.raises(InvalidRequestError):
        api.list_offsets(-5, [])
    first, refused = api.list_offsets(-1, [OffsetQuery("t", 0, -1), OffsetQuery("secret", 0)])
    assert (first.error, first.offset, first.leader_epoch) == (None, 42, 3)
    assert isinstance(refused.error, TopicAuthorizationFailedError)


def test_the_isolation_level_reaches_the_replicas() -> None:
    api, replicas = _api()
    asyncio.run(api.fetch(Fetch([FetchSpec("t", 0, 0, 10)], isolation_level=IsolationLevel.READ_COMMITTED)))
    assert replicas.isolation is IsolationLevel.READ_COMMITTED
    [committed] = api.list_offsets(-1, [OffsetQuery("t", 0, -1, isolation_level=IsolationLevel.READ_COMMITTED)])
    assert committed.offset == 40


def test_a_transactional_produce_needs_write_on_its_transactional_id() -> None:
    api, replicas = _api(("WRITE", "TRANSACTIONAL_ID", "tx"))
    with pytest.raises(TransactionalIdAuthorizationFailedError):
        asyncio.run(api.produce(1, 1000, [(("t", 0), b"a")], transactional_id="tx"))
    assert replicas.appended == []
    asyncio.run(api.produce(1, 1000, [(("t", 0), b"a")], transactional_id="other"))
    assert len(replicas.appended) == 1


def test_offset_for_leader_epoch_answers_each_partition_its_error() -> None:
    api, _ = _api()
    [end] = api.offset_for_leader_epoch(-1, [EpochQuery("t", 0, 1)])
    assert isinstance(end.error, UnknownTopicOrPartitionError) and end.end_offset == -1


def test_delete_records_refuses_duplicates_whole_and_answers_unknown_partitions() -> None:
    api, replicas = _api()
    with pytest.raises(InvalidRequestError):
        asyncio.run(api.delete_records(1000, [(("t", 0), 1), (("t", 0), 2)]))
    results = asyncio.run(api.delete_records(1000, [(("t", 0), 5), (("t", 9), 1)]))
    assert results[("t", 0)].low_watermark == 5
    assert isinstance(results[("t", 9)].error, UnknownTopicOrPartitionError)
    assert replicas.deleted == [{("t", 0): 5}]


def test_init_producer_id_refuses_a_transactional_id_and_checks_idempotent_write() -> None:
    api, _ = _api()
    assert api.init_producer_id(None) == (1000, 0)
    with pytest.raises(TransactionalIdAuthorizationFailedError):
        api.init_producer_id("txn-1")
    denied, _ = _api(("IDEMPOTENT_WRITE", "CLUSTER", "kafka-cluster"), ("WRITE", "TOPIC", "*"))
    with pytest.raises(ClusterAuthorizationFailedError):
        denied.init_producer_id(None)
