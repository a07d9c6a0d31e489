"""Kafka's binary ConsumerProtocol <-> kbroker's protobuf payloads, both ways, checked
against an independent implementation (kafka-python's encoder/decoder) and against
kclient's own helpers, and the Kafka door's group APIs translating through them (a fake
core records what the coordinator would see)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment as KpAssignment
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as KpSubscription

from kbroker.api.group_api import JoinGroup, MemberOf
from kbroker.doors.kafka.codec import Header, build
from kbroker.doors.kafka.consumer_protocol import (
    ConsumerProtocolError,
    assignment_to_kafka,
    assignment_to_proto,
    subscription_to_kafka,
    subscription_to_proto,
)
from kbroker.doors.kafka.group_apis import GroupApis
from kbroker.doors.kafka.server import Connection, KafkaRequest
from kbroker.group.group import JoinResult
from kbroker.security.listeners import EndPoint
from kclient.assignors import (
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from kclient.proto.kbroker.v1 import group_pb2
from kclient.structs import TopicPartition

names = st.text(alphabet="abcdefghij-._", min_size=1, max_size=12)
partitions = st.lists(st.integers(0, 1000), max_size=5, unique=True)
owned = st.lists(st.tuples(names, partitions), max_size=4, unique_by=lambda x: x[0])
user_data = st.one_of(st.none(), st.binary(min_size=1, max_size=40))


def _kp_subscription(version: int, topics: list[str], data: bytes | None, own: list[Any], gen: int) -> bytes:
    fields: dict[str, Any] = {"topics": topics, "user_data": data}
    if version >= 1:
        fields["owned_partitions"] = [KpSubscription.TopicPartition(topic=t, partitions=ps) for t, ps in own]
    if version >= 2:
        fields["generation_id"] = gen
    if version >= 3:
        fields["rack_id"] = None
    return bytes(KpSubscription(version=version, **fields).encode())


@given(st.integers(0, 3), st.lists(names, max_size=5, unique=True), user_data, owned, st.integers(-1, 1 << 20))
def test_a_kafka_subscription_survives_the_protobuf_round_trip(
    version: int, topics: list[str], data: bytes | None, own: list[Any], gen: int
) -> None:
    wire = _kp_subscription(version, topics, data, own, gen)
    proto, seen = subscription_to_proto(wire)
    assert seen == version
    back = subscription_to_kafka(proto, version)
    assert back == wire  # byte for byte, at the version the member wrote
    decoded = KpSubscription.decode(back)
    assert list(decoded.topics) == topics and decoded.user_data == data


@given(st.integers(0, 3), st.lists(names, max_size=5, unique=True), user_data, owned, st.integers(-1, 1 << 20))
def test_the_coordinator_sees_what_kclient_would_have_sent(
    version: int, topics: list[str], data: bytes | None, own: list[Any], gen: int
) -> None:
    proto, _ = subscription_to_proto(_kp_subscription(version, topics, data, own, gen))
    sub = decode_subscription(proto)  # kclient's leader reads it
    assert sub.topics == topics
    assert sub.user_data == (data or b"")
    want_owned = sorted(TopicPartition(t, p) for t, ps in own for p in ps) if version >= 1 else []
    assert sub.owned_partitions == want_owned
    assert sub.generation_id == (gen if version >= 2 else -1)


@given(st.integers(0, 3), st.lists(names, max_size=5, unique=True), owned, st.integers(-1, 1000), user_data)
def test_a_kclient_subscription_reaches_a_kafka_leader_and_comes_back(
    version: int, topics: list[str], own: list[Any], gen: int, data: bytes | None
) -> None:
    tps = [TopicPartition(t, p) for t, ps in own for p in ps]
    proto = encode_subscription(Subscription(topics, tps, gen, data or b""))
    wire = subscription_to_kafka(proto, version)
    k = KpSubscription.decode(wire)
    assert k.version == version and sorted(k.topics) == sorted(set(topics)) and k.user_data == data
    if version >= 1:
        assert sorted(TopicPartition(tp.topic, p) for tp in k.owned_partitions for p in tp.partitions) == sorted(tps)
    if version >= 2:
        assert k.generation_id == gen
        again, _ = subscription_to_proto(wire)
        assert decode_subscription(again) == decode_subscription(proto)


@given(st.integers(0, 3), owned, user_data)
def test_an_assignment_crosses_both_ways(version: int, own: list[Any], data: bytes | None) -> None:
    tps = [TopicPartition(t, p) for t, ps in own for p in ps]
    # kclient leader -> Kafka member
    wire = assignment_to_kafka(encode_assignment(tps, data or b""), version)
    k = KpAssignment.decode(wire)
    assert k.version == version and k.user_data == data
    assert sorted(TopicPartition(t.topic, p) for t in k.assigned_partitions for p in t.partitions) == sorted(tps)
    # Kafka leader -> kclient member
    proto, seen = assignment_to_proto(wire)
    assert seen == version and sorted(decode_assignment(proto)) == sorted(tps)
    assert group_pb2.ConsumerAssignment.FromString(proto).user_data == (data or b"")
    assert assignment_to_kafka(proto, version) == wire


def test_an_empty_assignment_is_a_valid_empty_one_for_kafka_clients() -> None:
    assert assignment_to_proto(b"") == (b"", 0)
    k = KpAssignment.decode(assignment_to_kafka(b"", 1))
    assert k.version == 1 and list(k.assigned_partitions) == [] and k.user_data is None


def test_a_newer_version_is_read_as_v3_and_rack_id_is_kept() -> None:
    v3 = bytes(
        KpSubscription(
            version=3, topics=["t"], user_data=None, owned_partitions=[], generation_id=7, rack_id="r1"
        ).encode()
    )
    proto, version = subscription_to_proto(b"\x00\x05" + v3[2:] + b"future fields")
    assert version == 5
    assert decode_subscription(proto) == Subscription(["t"], [], 7, b"")
    assert KpSubscription.decode(subscription_to_kafka(proto, 3)).rack_id == "r1"  # for rack-aware assignors
    assert (
        KpSubscription.decode(subscription_to_kafka(subscription_to_proto(v3[:-4] + b"\xff\xff")[0], 3)).rack_id is None
    )
    assert KpSubscription.decode(subscription_to_kafka(proto, 9)).version == 3  # clamped to what is known


@pytest.mark.parametrize("garbage", [b"", b"\x00", b"\xff\xff\x00\x00", b"\x00\x00\x00\x00\x00\x09ab"])
def test_unreadable_subscriptions_are_refused(garbage: bytes) -> None:
    with pytest.raises(ConsumerProtocolError):
        subscription_to_proto(garbage)


# --- the door's group APIs over a fake core -------------------------------------------


class FakeGroups:
    """Answers join and sync like the core's GroupApi would, recording the typed requests
    it got (what the coordinator would see)."""

    def __init__(self, members: list[tuple[str, bytes]], assignment: bytes = b"") -> None:
        self.members, self.assignment = members, assignment
        self.got: list[Any] = []

    async def join(self, request: JoinGroup) -> JoinResult:
        self.got.append(request)
        return JoinResult(3, "range", "kafka-1", "kafka-1", list(self.members))

    async def sync(self, member: MemberOf, assignments: dict[str, bytes]) -> bytes:
        self.got.append(assignments)
        return self.assignment


async def _offload(fn: Any, *args: Any) -> Any:
    return fn(*args)


def _apis(svc: FakeGroups) -> GroupApis:
    return GroupApis(svc, _offload)  # type: ignore[arg-type]


def _request(api_key: int, version: int, payload: Any) -> KafkaRequest:
    conn = Connection(EndPoint("PLAINTEXT", "127.0.0.1", 0, "PLAINTEXT"), "127.0.0.1")
    return KafkaRequest(Header(api_key, version, 1, "ck"), payload, conn)


def _payload(api_key: int, version: int, values: dict[str, Any]) -> Any:
    from kio.index import load_request_schema

    return build(load_request_schema(api_key, version), values)


def test_the_door_translates_join_and_sync_for_a_kafka_leader_of_a_mixed_group() -> None:
    grpc_member = encode_subscription(Subscription(["t"], [TopicPartition("t", 1)], 2, b"u"))
    svc = FakeGroups([("kafka-1", b"placeholder"), ("kclient-1", grpc_member)])
    apis = _apis(svc)
    mine = _kp_subscription(1, ["t"], None, [("t", [0])], -1)
    svc.members[0] = ("kafka-1", subscription_to_proto(mine)[0])
    join = _payload(
        11,
        5,
        {
            "group_id": "g",
            "session_timeout": 10000,
            "rebalance_timeout": 30000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": mine}],
        },
    )
    resp = asyncio.run(apis.join_group(_request(11, 5, join)))
    sent = svc.got[0]
    assert sent.client_id == "ck" and sent.protocols[0][0] == "range"
    assert decode_subscription(sent.protocols[0][1]).owned_partitions == [TopicPartition("t", 0)]
    by_id = {m.member_id: KpSubscription.decode(m.metadata) for m in resp.members}
    assert {v.version for v in by_id.values()} == {1}  # the leader's own version
    assert [(t.topic, list(t.partitions)) for t in by_id["kclient-1"].owned_partitions] == [("t", [1])]
    assert by_id["kclient-1"].user_data == b"u"

    to_kclient = bytes(
        KpAssignment(version=1, assigned_partitions=[KpAssignment.TopicPartition(topic="t", partitions=[1])]).encode()
    )
    svc.assignment = encode_assignment([TopicPartition("t", 0)])
    sync = _payload(
        14,
        3,
        {
            "group_id": "g",
            "generation_id": 3,
            "member_id": "kafka-1",
            "assignments": [{"member_id": "kclient-1", "assignment": to_kclient}],
        },
    )
    out = asyncio.run(apis.sync_group(_request(14, 3, sync)))
    assert decode_assignment(svc.got[1]["kclient-1"]) == [TopicPartition("t", 1)]
    mine_back = KpAssignment.decode(out.assignment)
    assert mine_back.version == 1 and [(t.topic, list(t.partitions)) for t in mine_back.assigned_partitions] == [
        ("t", [0])
    ]


def test_other_protocol_types_pass_through_untouched() -> None:
    svc = FakeGroups([("kafka-1", b"\x01opaque")], assignment=b"\x02opaque")
    apis = _apis(svc)
    join = _payload(
        11,
        7,
        {
            "group_id": "g",
            "session_timeout": 10000,
            "member_id": "",
            "protocol_type": "connect",
            "protocols": [{"name": "sessioned", "metadata": b"\x01opaque"}],
        },
    )
    resp = asyncio.run(apis.join_group(_request(11, 7, join)))
    assert svc.got[0].protocols[0][1] == b"\x01opaque" and resp.members[0].metadata == b"\x01opaque"
    assert resp.protocol_type == "connect"
    assignments = [{"member_id": "kafka-1", "assignment": b"\x02opaque"}]
    sync = _payload(14, 5, {"group_id": "g", "generation_id": 3, "member_id": "kafka-1", "assignments": assignments})
    out = asyncio.run(apis.sync_group(_request(14, 5, sync)))
    assert svc.got[1]["kafka-1"] == b"\x02opaque" and out.assignment == b"\x02opaque"
    assert out.protocol_type == "connect" and out.protocol_name == "range"


def test_an_unreadable_kafka_subscription_gets_invalid_request() -> None:
    svc = FakeGroups([])
    join = _payload(
        11,
        4,
        {
            "group_id": "g",
            "session_timeout": 10000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b"\x00"}],
        },
    )
    resp = asyncio.run(_apis(svc).join_group(_request(11, 4, join)))
    assert int(resp.error_code) == 42 and svc.got == []


@pytest.mark.parametrize(
    ("function", "payload"),
    [
        ("assignment_to_proto", "00007fffffff" + "00" * 20),  # v0 assignment: 2**31-1 topics
        ("subscription_to_proto", "00017fffffff" + "00" * 20),  # v1 subscription: 2**31-1 topics
    ],
)
def test_a_payload_claiming_billions_of_entries_is_refused_not_allocated(function: str, payload: str) -> None:
    # kio's native reader sizes an array from its count before reading it; with the
    # address space capped (as on a small host), that allocation aborts the process.
    # Run in a child: an abort must not take pytest down.
    import subprocess
    import sys

    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))\n"
        "from kbroker.doors.kafka import consumer_protocol as cp\n"
        "try:\n"
        f"    cp.{function}(bytes.fromhex({payload!r}))\n"
        "except cp.ConsumerProtocolError as exc:\n"
        "    print('refused:', exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused:" in proc.stdout
