"""Consumer groups on the Kafka door: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups, DeleteGroups and
OffsetDelete. Each is Kafka's request -> the servicer's protobuf request -> the same
handler as gRPC (authorization, validation, the group coordinator) -> Kafka's response;
error codes pass straight through (the protobuf codes are Kafka's).

Groups are shared by both doors. For protocol type ``"consumer"`` the coordinator only
ever holds kbroker's protobuf payloads, so the consumer-protocol bytes are converted at
this door (:mod:`kbroker.api.kafka.consumer_protocol`): JoinGroup subscriptions and the
leader's SyncGroup assignments on the way in; the subscriptions a Kafka leader receives,
a member's SyncGroup assignment and DescribeGroups' member payloads on the way out.
Payloads of other protocol types pass through untouched.

Versions: FindCoordinator 0-4 (key type 0, groups; transactions are not served:
INVALID_REQUEST), JoinGroup 0-9, SyncGroup 0-5, Heartbeat 0-4, LeaveGroup 0-5,
OffsetCommit 2-8, OffsetFetch 1-7, DescribeGroups 0-5, ListGroups 0-4, DeleteGroups
0-2, OffsetDelete 0. OffsetCommit 0-1 and OffsetFetch 0 are not served: kio (Kafka 4's
message definitions) has no schema for them, and every current client speaks newer ones.

Kafka-protocol differences, each accepted by Kafka's clients:

- none in group membership: a first JoinGroup v4+ with an empty member id is answered
  MEMBER_ID_REQUIRED with a new member id (KIP-394); ``group_instance_id`` (JoinGroup v5+,
  SyncGroup/Heartbeat v3+, LeaveGroup v3+, OffsetCommit v7+, DescribeGroups v4+) makes
  a static member (KIP-345, see :mod:`kbroker.group.group`);
- OffsetCommit's retention time and commit timestamp, and the committed leader epoch,
  are ignored (OffsetFetch answers leader epoch -1); ``require_stable`` is moot (no
  transactions);
- ListGroups answers the groups this broker coordinates (Kafka's rule; clients ask every
  broker), where the gRPC ListGroups answers every group;
- DescribeGroups' authorized operations are not computed (INT32_MIN, "not provided").

Thread safety: everything runs on the door's loop thread, including :class:`_Members`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from kbroker.api.broker_service import NO_TRANSACTIONS, TRANSACTIONS_REFUSED, BrokerService
from kbroker.api.kafka.codec import build, millis, response_class
from kbroker.api.kafka.consumer_protocol import (
    CONSUMER,
    ConsumerProtocolError,
    assignment_to_kafka,
    assignment_to_proto,
    subscription_to_kafka,
    subscription_to_proto,
)
from kbroker.api.kafka.server import Api, KafkaRequest
from kbroker.api.kafka.service_call import RequestRefused
from kclient.errors import InconsistentGroupProtocolError, InvalidRequestError
from kclient.proto.kbroker.v1 import group_pb2

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT = 8, 9, 10, 11, 12
LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS, OFFSET_DELETE = 13, 14, 15, 16, 42, 47
INVALID_REQUEST = InvalidRequestError.errno
INCONSISTENT_GROUP_PROTOCOL = InconsistentGroupProtocolError.errno
GROUP_KEY = 0
"""FindCoordinator key type of a consumer group."""
TRANSACTION_KEY = 1
"""FindCoordinator key type of a transactional id: not served, TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""
UNKNOWN_STATE = "Unknown"
"""ListGroups' state of a group another broker coordinates."""
DESCRIBE_VERSION = 1
"""ConsumerProtocol version of DescribeGroups' payloads of a member that did not join
through this door (a kclient member): v1 carries owned partitions and user data, and
every Kafka client since 2.4 reads it."""
GROUP_LEVEL_ERRORS = frozenset({14, 15, 16, 24, 30})
"""COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
INVALID_GROUP_ID, GROUP_AUTHORIZATION_FAILED: LeaveGroup v3+ answers these for the whole
request, not per member."""


@dataclass(frozen=True, slots=True)
class _Member:
    protocol_type: str
    protocol_name: str
    version: int | None
    """The ConsumerProtocol version of its subscription (None: not the consumer protocol)."""


class _Members:
    """(group id, member id) -> how a member that joined through this door speaks: what
    its SyncGroup answer and DescribeGroups need (the group coordinator keeps only
    protobuf payloads). Bounded: the oldest joins are forgotten first; a member that is
    forgotten (or joined through gRPC) gets DESCRIBE_VERSION payloads."""

    LIMIT = 65536

    def __init__(self) -> None:
        self._members: OrderedDict[tuple[str, str], _Member] = OrderedDict()

    def joined(self, group_id: str, member_id: str, member: _Member) -> None:
        key = (group_id, member_id)
        self._members[key] = member
        self._members.move_to_end(key)
        while len(self._members) > self.LIMIT:
            self._members.popitem(last=False)

    def get(self, group_id: str, member_id: str) -> _Member | None:
        return self._members.get((group_id, member_id))

    def left(self, group_id: str, member_id: str) -> None:
        self._members.pop((group_id, member_id), None)


class GroupApis:
    """The consumer-group APIs over one :class:`BrokerService`."""

    def __init__(self, service: BrokerService) -> None:
        self._service = service
        self._members = _Members()

    def apis(self) -> list[Api]:
        return [
            Api(OFFSET_COMMIT, "OffsetCommit", 2, 8, self.offset_commit),
            Api(OFFSET_FETCH, "OffsetFetch", 1, 7, self.offset_fetch),
            Api(FIND_COORDINATOR, "FindCoordinator", 0, 4, self.find_coordinator),
            Api(JOIN_GROUP, "JoinGroup", 0, 9, self.join_group),
            Api(HEARTBEAT, "Heartbeat", 0, 4, self.heartbeat),
            Api(LEAVE_GROUP, "LeaveGroup", 0, 5, self.leave_group),
            Api(SYNC_GROUP, "SyncGroup", 0, 5, self.sync_group),
            Api(DESCRIBE_GROUPS, "DescribeGroups", 0, 5, self.describe_groups),
            Api(LIST_GROUPS, "ListGroups", 0, 4, self.list_groups),
            Api(DELETE_GROUPS, "DeleteGroups", 0, 2, self.delete_groups),
            Api(OFFSET_DELETE, "OffsetDelete", 0, 0, self.offset_delete),
        ]

    # --- coordinator ------------------------------------------------------------------

    async def find_coordinator(self, req: KafkaRequest) -> Any:
        p = req.payload
        keys = list(p.coordinator_keys) if req.version >= 4 else [p.key]
        found = []
        for key in keys:
            key_type = int(getattr(p, "key_type", GROUP_KEY))
            if key_type == TRANSACTION_KEY:  # no transactions yet: fatal at once for clients
                found.append(
                    {"key": key, "node_id": -1, "port": -1, "error_code": TRANSACTIONS_REFUSED,
                     "error_message": NO_TRANSACTIONS}
                )  # fmt: skip
                continue
            if key_type != GROUP_KEY:
                found.append(
                    {
                        "key": key,
                        "node_id": -1,
                        "port": -1,
                        "error_code": INVALID_REQUEST,
                        "error_message": "only group coordinators (key type 0) are served",
                    }
                )
                continue
            try:
                r = await self._service.FindCoordinator(
                    group_pb2.FindCoordinatorRequest(group_id=key),
                    req.service_context(),  # type: ignore[arg-type]
                )
            except RequestRefused as exc:
                r = group_pb2.FindCoordinatorResponse(error_code=exc.errno, error_message=exc.message, node_id=-1)  # type: ignore[arg-type]
            found.append(
                {
                    "key": key,
                    "node_id": r.node_id,
                    "host": r.host,
                    "port": r.port if r.error_code == 0 else -1,
                    "error_code": r.error_code,
                    "error_message": r.error_message or None,
                }
            )
        cls = response_class(FIND_COORDINATOR, req.version)
        if req.version >= 4:
            return build(cls, {"coordinators": found})
        return build(cls, found[0])

    # --- membership -------------------------------------------------------------------

    async def join_group(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(JOIN_GROUP, req.version)
        if not p.protocol_type:
            return build(cls, {"error_code": INCONSISTENT_GROUP_PROTOCOL, "member_id": p.member_id})
        consumer = p.protocol_type == CONSUMER
        versions: dict[str, int] = {}
        proto = group_pb2.JoinGroupRequest(
            group_id=p.group_id,
            session_timeout_ms=millis(p.session_timeout),
            rebalance_timeout_ms=millis(getattr(p, "rebalance_timeout", -1)),
            member_id=p.member_id,
            protocol_type=p.protocol_type,
            client_id=req.header.client_id or "",
            client_host=req.connection.client_host,
            require_known_member_id=req.version >= 4,  # KIP-394
        )
        instance = getattr(p, "group_instance_id", None)
        if instance is not None:
            proto.group_instance_id = instance
        for pr in p.protocols:
            metadata = bytes(pr.metadata)
            if consumer:
                try:
                    metadata, versions[pr.name] = subscription_to_proto(metadata)
                except ConsumerProtocolError:
                    return build(cls, {"error_code": INVALID_REQUEST, "member_id": p.member_id})
            proto.protocols.add(name=pr.name, metadata=metadata)
        try:
            r = await self._service.JoinGroup(proto, req.service_context())  # type: ignore[arg-type]
        except RequestRefused as exc:
            return build(cls, {"error_code": exc.errno, "member_id": p.member_id})
        if r.error_code != 0:
            return build(cls, {"error_code": r.error_code, "member_id": r.member_id, "protocol_type": None})
        version = versions.get(r.protocol_name) if consumer else None
        self._members.joined(p.group_id, r.member_id, _Member(p.protocol_type, r.protocol_name, version))
        return build(
            cls,
            {
                "error_code": 0,
                "generation_id": r.generation_id,
                "protocol_type": p.protocol_type,
                "protocol_name": r.protocol_name,
                "leader": r.leader_id,
                "member_id": r.member_id,
                "members": [
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.group_instance_id if m.HasField("group_instance_id") else None,
                        "metadata": _out(subscription_to_kafka, m.metadata, version),
                    }
                    for m in r.members
                ],
            },
        )

    async def sync_group(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(SYNC_GROUP, req.version)
        member = self._members.get(p.group_id, p.member_id)
        consumer = member is not None and member.version is not None
        proto = group_pb2.SyncGroupRequest(
            group_id=p.group_id, generation_id=int(p.generation_id), member_id=p.member_id
        )
        _instance(proto, p)
        for a in p.assignments:
            assignment = bytes(a.assignment)
            if consumer:
                try:
                    assignment, _ = assignment_to_proto(assignment)
                except ConsumerProtocolError:
                    return build(cls, {"error_code": INVALID_REQUEST})
            proto.assignments.add(member_id=a.member_id, assignment=assignment)
        try:
            r = await self._service.SyncGroup(proto, req.service_context())  # type: ignore[arg-type]
        except RequestRefused as exc:
            return build(cls, {"error_code": exc.errno})
        if r.error_code != 0:
            return build(cls, {"error_code": r.error_code})
        return build(
            cls,
            {
                "error_code": 0,
                "protocol_type": member.protocol_type if member else None,
                "protocol_name": member.protocol_name if member else None,
                "assignment": _out(assignment_to_kafka, r.assignment, member.version if member else None),
            },
        )

    async def heartbeat(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = group_pb2.HeartbeatRequest(
            group_id=p.group_id, generation_id=int(p.generation_id), member_id=p.member_id
        )
        _instance(proto, p)
        try:
            r = await self._service.Heartbeat(proto, req.service_context())  # type: ignore[arg-type]
            code = int(r.error_code)
        except RequestRefused as exc:
            code = exc.errno
        return build(response_class(HEARTBEAT, req.version), {"error_code": code})

    async def leave_group(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(LEAVE_GROUP, req.version)
        ids = [(m.member_id, m.group_instance_id) for m in p.members] if req.version >= 3 else [(p.member_id, None)]
        codes = []
        for mid, instance in ids:
            leave = group_pb2.LeaveGroupRequest(group_id=p.group_id, member_id=mid)
            if instance is not None:
                leave.group_instance_id = instance
            try:
                r = await self._service.LeaveGroup(leave, req.service_context())  # type: ignore[arg-type]
                code = int(r.error_code)
            except RequestRefused as exc:
                code = exc.errno
            if code == 0:
                self._members.left(p.group_id, mid)
            codes.append(code)
        if req.version < 3:
            return build(cls, {"error_code": codes[0]})
        whole = next((c for c in codes if c in GROUP_LEVEL_ERRORS), 0)
        if whole:
            return build(cls, {"error_code": whole})
        return build(
            cls,
            {
                "error_code": 0,
                "members": [
                    {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "error_code": code}
                    for m, code in zip(p.members, codes, strict=True)
                ],
            },
        )

    # --- offsets ----------------------------------------------------------------------

    async def offset_commit(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = group_pb2.CommitOffsetsRequest(
            group_id=p.group_id, generation_id=int(p.generation_id_or_member_epoch), member_id=p.member_id
        )
        _instance(proto, p)
        for t in p.topics:
            ct = proto.topics.add(name=t.name)
            for part in t.partitions:
                ct.partitions.add(
                    index=int(part.partition_index),
                    offset=int(part.committed_offset),
                    metadata=part.committed_metadata or "",
                )
        cls = response_class(OFFSET_COMMIT, req.version)
        try:
            r = await self._service.CommitOffsets(proto, req.service_context())  # type: ignore[arg-type]
        except RequestRefused as exc:
            topics = [_partition_errors(t.name, [x.index for x in t.partitions], exc.errno) for t in proto.topics]
            return build(cls, {"topics": topics})
        return build(
            cls,
            {
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [{"partition_index": e.index, "error_code": e.error_code} for e in t.partitions],
                    }
                    for t in r.topics
                ]
            },
        )

    async def offset_fetch(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(OFFSET_FETCH, req.version)
        if p.topics is not None and not p.topics:
            return build(cls, {"error_code": 0})  # an empty list asks for nothing (null asks for all)
        proto = group_pb2.FetchOffsetsRequest(group_id=p.group_id)
        for t in p.topics or ():
            proto.topics.add(name=t.name, partitions=[int(i) for i in t.partition_indexes])
        try:
            r = await self._service.FetchOffsets(proto, req.service_context())  # type: ignore[arg-type]
        except RequestRefused as exc:
            r = group_pb2.FetchOffsetsResponse(error_code=exc.errno)  # type: ignore[arg-type]
        if r.error_code != 0:
            if req.version >= 2:
                return build(cls, {"error_code": r.error_code})
            # v1 has no group-level error: every partition asked carries it
            topics = [_partition_errors(t.name, list(t.partitions), r.error_code) for t in proto.topics]
            return build(cls, {"topics": topics})
        return build(
            cls,
            {
                "error_code": 0,
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            {
                                "partition_index": o.index,
                                "committed_offset": o.offset,
                                "committed_leader_epoch": -1,
                                "metadata": o.metadata,
                                "error_code": o.error_code,
                            }
                            for o in t.partitions
                        ],
                    }
                    for t in r.topics
                ],
            },
        )

    async def offset_delete(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = group_pb2.OffsetDeleteRequest(group_id=p.group_id)
        for t in p.topics:
            proto.topics.add(name=t.name, partitions=[int(part.partition_index) for part in t.partitions])
        cls = response_class(OFFSET_DELETE, req.version)
        try:
            r = await self._service.OffsetDelete(proto, req.service_context())  # type: ignore[arg-type]
        except RequestRefused as exc:
            return build(cls, {"error_code": exc.errno})
        return build(
            cls,
            {
                "error_code": r.error_code,
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [{"partition_index": e.index, "error_code": e.error_code} for e in t.partitions],
                    }
                    for t in r.topics
                ],
            },
        )

    # --- administration ---------------------------------------------------------------

    async def describe_groups(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(DESCRIBE_GROUPS, req.version)
        try:
            r = await self._service.DescribeGroups(
                group_pb2.DescribeGroupsRequest(group_ids=list(p.groups)),
                req.service_context(),  # type: ignore[arg-type]
            )
        except RequestRefused as exc:
            return build(cls, {"groups": [{"group_id": g, "error_code": exc.errno} for g in p.groups]})
        return build(cls, {"groups": [self._described(g) for g in r.groups]})

    def _described(self, g: group_pb2.DescribedGroup) -> dict[str, Any]:
        consumer = g.protocol_type == CONSUMER
        members = []
        for m in g.members:
            known = self._members.get(g.group_id, m.member_id)
            version = known.version if known is not None and known.version is not None else DESCRIBE_VERSION
            members.append(
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id if m.HasField("group_instance_id") else None,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": _out(subscription_to_kafka, m.metadata, version if consumer else None),
                    "member_assignment": _out(assignment_to_kafka, m.assignment, version if consumer else None)
                    if m.assignment
                    else b"",
                }
            )
        return {
            "error_code": g.error_code,
            "group_id": g.group_id,
            "group_state": g.state,
            "protocol_type": g.protocol_type,
            "protocol_data": g.protocol_name,
            "members": members,
        }

    async def list_groups(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(LIST_GROUPS, req.version)
        try:
            r = await self._service.ListGroups(group_pb2.ListGroupsRequest(), req.service_context())  # type: ignore[arg-type]
        except RequestRefused as exc:
            return build(cls, {"error_code": exc.errno})
        states = {s.lower() for s in getattr(p, "states_filter", ())}
        return build(
            cls,
            {
                "error_code": r.error_code,
                "groups": [
                    {"group_id": g.group_id, "protocol_type": g.protocol_type, "group_state": g.state}
                    for g in r.groups
                    if g.state != UNKNOWN_STATE and (not states or g.state.lower() in states)
                ],
            },
        )

    async def delete_groups(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(DELETE_GROUPS, req.version)
        try:
            r = await self._service.DeleteGroups(
                group_pb2.DeleteGroupsRequest(group_ids=list(p.groups_names)),
                req.service_context(),  # type: ignore[arg-type]
            )
        except RequestRefused as exc:
            return build(cls, {"results": [{"group_id": g, "error_code": exc.errno} for g in p.groups_names]})
        return build(cls, {"results": [{"group_id": g.group_id, "error_code": g.error_code} for g in r.results]})


def _out(convert: Any, data: bytes, version: int | None) -> bytes:
    """A coordinator payload for a Kafka client: converted to Kafka's ConsumerProtocol at
    ``version``, or as it is when ``version`` is None (another protocol type) or it is
    not a consumer-protocol payload."""
    if version is None:
        return data
    try:
        return bytes(convert(data, version))
    except ConsumerProtocolError:
        return data


def _instance(proto: Any, payload: Any) -> None:
    """Copy a request's group_instance_id (the versions that carry one) to ``proto``."""
    instance = getattr(payload, "group_instance_id", None)
    if instance is not None:
        proto.group_instance_id = instance


def _partition_errors(topic: str, partitions: list[int], errno: int) -> dict[str, Any]:
    return {
        "name": topic,
        "partitions": [{"partition_index": i, "error_code": errno, "committed_offset": -1} for i in partitions],
    }
