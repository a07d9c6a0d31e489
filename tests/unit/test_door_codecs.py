"""Each door's codec alone, over a fake core: what reaches the core is the plain values
the wire carried (with the contract's defaults for unset fields), and the core's answers
and refusals come out as each protocol says (gRPC: a status with the Kafka code in the
trailing metadata, or the response's error code; Kafka: the code per partition, at the
top where the version has one, or a closed connection for acks=0)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from kio.index import load_request_schema

from kbroker.api.admin_api import ConfigEntry, DescribedConfigs
from kbroker.api.log_api import Fetch, FetchAnswer
from kbroker.cluster.config_admin import ConfigSource
from kbroker.doors.grpc.servicer import BrokerService
from kbroker.doors.kafka.codec import Header, build
from kbroker.doors.kafka.log_apis import LogApis
from kbroker.doors.kafka.server import CloseConnection, Connection, KafkaRequest
from kbroker.replication.replica_manager import FetchResult, ProduceResult, TopicPartition
from kbroker.security.listeners import EndPoint
from kclient.errors import (
    GroupAuthorizationFailedError,
    InvalidRequestError,
    NotLeaderForPartitionError,
    UnknownTopicOrPartitionError,
)
from kclient.proto.kbroker.v1 import config_pb2, group_pb2, log_pb2
from kclient.transport import ERROR_CODE_METADATA_KEY
from tests.support import Aborted, FakeContext


class FakeLog:
    """The core's LogApi: answers with ``produced`` (or raises ``refusal``) and records
    what it was asked."""

    def __init__(self, produced: dict[TopicPartition, ProduceResult] | None = None, refusal: Exception | None = None):
        self.produced, self.refusal = produced or {}, refusal
        self.asked: list[Any] = []

    async def produce(
        self,
        acks: int,
        timeout_ms: int,
        entries: list[tuple[TopicPartition, bytes]],
        transactional_id: str | None = None,
    ) -> Any:
        self.asked.append((acks, timeout_ms, entries))
        if self.refusal is not None:
            raise self.refusal
        return self.produced

    async def fetch(self, fetch: Fetch) -> FetchAnswer:
        self.asked.append(fetch)
        if self.refusal is not None:
            raise self.refusal
        return FetchAnswer([(s, FetchResult(NotLeaderForPartitionError("moved"))) for s in fetch.partitions])


class FakeAdmin:
    def describe_configs(self, resources: list[Any]) -> list[DescribedConfigs]:
        entry = ConfigEntry(
            "ssl.key.password", None, ConfigSource.STATIC_BROKER_CONFIG, True, (), True, "The key's password.", 9
        )
        return [DescribedConfigs(r.resource_type, r.name, None, [entry]) for r in resources]


class FakeGroups:
    def find_coordinator(self, group_id: str) -> Any:
        raise GroupAuthorizationFailedError(f"not {group_id}")


async def _offload(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _core(log: FakeLog) -> Any:
    return SimpleNamespace(
        log=log,
        metadata=None,
        groups=FakeGroups(),
        admin=FakeAdmin(),
        cluster=None,
        security=None,
        transactions=None,
        offload=_offload,
        broker_id=1,
    )


# --- the gRPC door ------------------------------------------------------------------------


def test_grpc_a_refused_produce_is_invalid_argument_with_the_kafka_code() -> None:
    log = FakeLog(refusal=InvalidRequestError("timeout_ms must be >= 0, got -5"))
    ctx = FakeContext()
    request = log_pb2.ProduceRequest(timeout_ms=-5)
    request.topics.add(name="t").partitions.add(index=0, records=b"x")
    with pytest.raises(Aborted):
        asyncio.run(BrokerService(_core(log)).Produce(request, ctx))  # type: ignore[arg-type]
    assert ctx.aborted is not None and ctx.aborted[0] is grpc.StatusCode.INVALID_ARGUMENT
    assert ctx.trailing == ((ERROR_CODE_METADATA_KEY, "42"),)
    assert log.asked == [(-1, -5, [(("t", 0), b"x")])]  # acks unset: all (-1)


def test_grpc_produce_encodes_each_partition_and_its_record_errors() -> None:
    failed = InvalidRequestError("bad record")
    failed.record_errors = [(3, "no key")]  # type: ignore[attr-defined]
    log = FakeLog({("t", 0): ProduceResult(None, 10, 0, 99), ("t", 1): ProduceResult(failed)})
    request = log_pb2.ProduceRequest(acks=1)
    t = request.topics.add(name="t")
    t.partitions.add(index=0, records=b"a")
    t.partitions.add(index=1, records=b"b")
    resp = asyncio.run(BrokerService(_core(log)).Produce(request, FakeContext()))  # type: ignore[arg-type]
    ok, bad = resp.topics[0].partitions
    assert (ok.error_code, ok.base_offset, ok.log_append_time_ms) == (0, 10, 99)
    assert bad.error_code == 42 and bad.error_message == "bad record"
    assert [(e.batch_index, e.message) for e in bad.record_errors] == [(3, "no key")]


def test_grpc_fetch_passes_the_contract_defaults_for_unset_fields() -> None:
    log = FakeLog()
    request = log_pb2.FetchRequest()
    request.topics.add(name="t").partitions.add(index=2, fetch_offset=5)
    resp = asyncio.run(BrokerService(_core(log)).Fetch(request, FakeContext()))  # type: ignore[arg-type]
    [fetch] = log.asked
    assert (fetch.replica_id, fetch.max_wait_ms, fetch.min_bytes, fetch.max_bytes) == (-1, 500, 1, 52428800)
    assert (fetch.session_id, fetch.session_epoch) == (0, -1)
    assert fetch.partitions[0].max_bytes == 1048576 and fetch.partitions[0].current_leader_epoch == -1
    [p] = resp.topics[0].partitions
    assert p.error_code == 6 and p.high_watermark == -1  # NOT_LEADER_OR_FOLLOWER, nothing read


def test_grpc_a_refused_group_request_is_the_response_error_code() -> None:
    service = BrokerService(_core(FakeLog()))
    request = group_pb2.FindCoordinatorRequest(group_id="g")
    resp = asyncio.run(service.FindCoordinator(request, FakeContext()))  # type: ignore[arg-type]
    assert resp.error_code == 30 and resp.node_id == -1 and "not g" in resp.error_message


def test_grpc_describe_configs_carries_type_sensitivity_and_documentation_when_asked() -> None:
    service = BrokerService(_core(FakeLog()))
    for asked in (False, True):
        request = config_pb2.DescribeConfigsRequest(include_documentation=asked)
        request.resources.add(resource_type=config_pb2.BROKER, resource_name="1")
        resp = asyncio.run(service.DescribeConfigs(request, FakeContext()))  # type: ignore[arg-type]
        [entry] = resp.results[0].configs
        assert entry.is_sensitive and entry.config_type == 9 and not entry.HasField("value")
        assert entry.HasField("documentation") is asked


# --- the Kafka door -----------------------------------------------------------------------


def _request(api_key: int, version: int, values: dict[str, Any]) -> KafkaRequest:
    conn = Connection(EndPoint("PLAINTEXT", "127.0.0.1", 0, "PLAINTEXT"), "127.0.0.1")
    payload = build(load_request_schema(api_key, version), values)
    return KafkaRequest(Header(api_key, version, 1, "ck"), payload, conn)


def _produce(acks: int, partitions: list[int]) -> KafkaRequest:
    return _request(
        0,
        8,
        {
            "acks": acks,
            "timeout": 1000,
            "topic_data": [{"name": "t", "partition_data": [{"index": i, "records": b""} for i in partitions]}],
        },
    )


def test_kafka_an_acks_0_produce_with_a_failed_partition_closes_the_connection() -> None:
    log = FakeLog({("t", 0): ProduceResult(None, 1), ("t", 1): ProduceResult(UnknownTopicOrPartitionError("gone"))})
    with pytest.raises(CloseConnection):
        asyncio.run(LogApis(_core(log)).produce(_produce(0, [0, 1])))
    ok = FakeLog({("t", 0): ProduceResult(None, 1)})
    assert asyncio.run(LogApis(_core(ok)).produce(_produce(0, [0]))) is None  # acks=0: no answer


def test_kafka_a_refused_produce_answers_the_code_on_every_partition() -> None:
    log = FakeLog(refusal=InvalidRequestError("timeout"))
    resp = asyncio.run(LogApis(_core(log)).produce(_produce(1, [0, 1])))
    codes = [(int(p.index), int(p.error_code)) for t in resp.responses for p in t.partition_responses]
    assert codes == [(0, 42), (1, 42)]


def test_kafka_a_refused_fetch_answers_at_the_top_and_on_every_partition() -> None:
    log = FakeLog(refusal=InvalidRequestError("dup"))
    values = {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1000,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 100}]},
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    resp = asyncio.run(LogApis(_core(log)).fetch(_request(1, 11, values)))
    assert int(resp.error_code) == 42
    assert [int(p.error_code) for t in resp.responses for p in t.partitions] == [42]
    [fetch] = log.asked
    assert (fetch.session_id, fetch.session_epoch, fetch.max_wait_ms) == (0, -1, 0)
