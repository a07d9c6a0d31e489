"""Consumer groups on the Kafka door: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups, DeleteGroups and
OffsetDelete. Each is Kafka's request -> the servicer's protobuf request -> the same
handler as gRPC (authorization, validation, the group coordinator) -> Kafka's response;
error codes pass straight through (the protobuf codes are Kafka's).

Groups are shared by both doors. For protocol type ``"consumer"`` the coordinator only
ever holds kbroker's protobuf payloads, so the consumer-protocol bytes are converted at
this door (:mod:`kbroker.doors.kafka.consumer_protocol`): JoinGroup subscriptions and the
leader's SyncGroup assignments on the way in; the subscriptions a Kafka leader receives,
a member's SyncGroup assignment and DescribeGroups' member payloads on the way out.
Payloads of other protocol types pass through untouched.

Versions: FindCoordinator 0-4 (key type 0, groups, and 1, transactional ids: the core's
TransactionApi; another key type answers INVALID_REQUEST), JoinGroup 0-9, SyncGroup 0-5,
Heartbeat 0-4, LeaveGroup 0-5, OffsetCommit 2-8, OffsetFetch 1-7, DescribeGroups 0-5,
ListGroups 0-4, DeleteGroups 0-2, OffsetDelete 0. OffsetCommit 0-1 and OffsetFetch 0 are
not served: kio (Kafka 4's message definitions) has no schema for them, and every
current client speaks newer ones.

Kafka-protocol differences, each accepted by Kafka's clients:

- none in group membership: a first JoinGroup v4+ with an empty member id is answered
  MEMBER_ID_REQUIRED with a new member id (KIP-394); ``group_instance_id`` (JoinGroup v5+,
  SyncGroup/Heartbeat v3+, LeaveGroup v3+, OffsetCommit v7+, DescribeGroups v4+) makes
  a static member (KIP-345, see :mod:`kbroker.group.group`);
- OffsetCommit's retention time and commit timestamp, and the committed leader epoch,
  are ignored (OffsetFetch answers leader epoch -1). With ``require_stable`` (v7,
  KIP-447) a partition whose offset a transaction holds and has not completed answers
  UNSTABLE_OFFSET_COMMIT, as Kafka's (EndTxn answers before the offsets reach the
  group, so a read_committed client asks again); without it, the last committed offset;
- ListGroups answers the groups this broker coordinates (Kafka's rule; clients ask every
  broker), where the gRPC ListGroups answers every group;
- DescribeGroups' authorized operations are not computed (INT32_MIN, "not provided").

Thread safety: everything runs on the door's loop thread, including :class:`_Members`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from kbroker.api.call_context import Offload
from kbroker.api.group_api import CommittedOffset, GroupApi, GroupDescription, JoinGroup, MemberIdNeeded, MemberOf
from kbroker.api.log_api import NO_TRANSACTIONS
from kbroker.api.txn_api import TransactionApi
from kbroker.doors.kafka.codec import build, millis, response_class
from kbroker.doors.kafka.consumer_protocol import (
    CONSUMER,
    ConsumerProtocolError,
    assignment_to_kafka,
    assignment_to_proto,
    subscription_to_kafka,
    subscription_to_proto,
)
from kbroker.doors.kafka.server import Api, KafkaRequest
from kclient.errors import (
    BrokerResponseError,
    InconsistentGroupProtocolError,
    InvalidRequestError,
    TransactionalIdAuthorizationFailedError,
    UnstableOffsetCommitError,
    as_response_error,
)

T = TypeVar("T")
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT = 8, 9, 10, 11, 12
LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS, OFFSET_DELETE = 13, 14, 15, 16, 42, 47
INVALID_REQUEST = InvalidRequestError.errno
INCONSISTENT_GROUP_PROTOCOL = InconsistentGroupProtocolError.errno
UNSTABLE_OFFSET_COMMIT = UnstableOffsetCommitError.errno
GROUP_KEY = 0
"""FindCoordinator key type of a consumer group."""
TRANSACTIONS_REFUSED = TransactionalIdAuthorizationFailedError.errno
TRANSACTION_KEY = 1
"""FindCoordinator key type of a transactional id (without a TransactionApi:
TRANSACTIONAL_ID_AUTHORIZATION_FAILED)."""
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
    """The consumer-group APIs over the core's :class:`GroupApi`; ``offload`` runs its
    blocking requests on the request pool; ``txn`` gives the core's
    :class:`TransactionApi` for FindCoordinator's key type TRANSACTION (None: refused)."""

    def __init__(self, groups: GroupApi, offload: Offload, txn: Callable[[], TransactionApi] | None = None) -> None:
        self._groups = groups
        self._offload = offload
        self._txn = txn
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

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._offload(fn, *args)  # type: ignore[no-any-return]

    # --- coordinator ------------------------------------------------------------------

    async def find_coordinator(self, req: KafkaRequest) -> Any:
        p = req.payload
        keys = list(p.coordinator_keys) if req.version >= 4 else [p.key]
        found = []
        key_type = int(getattr(p, "key_type", GROUP_KEY))  # v0: groups only
        for key in keys:
            if key_type == TRANSACTION_KEY and self._txn is None:  # fatal at once for clients
                found.append(
                    {"key": key, "node_id": -1, "port": -1, "error_code": TRANSACTIONS_REFUSED,
                     "error_message": NO_TRANSACTIONS}
                )  # fmt: skip
                continue
            if key_type not in (GROUP_KEY, TRANSACTION_KEY):
                err: BrokerResponseError = InvalidRequestError(
                    f"key type {key_type}: only groups (0) and transactional ids (1) have coordinators"
                )
                found.append({"key": key, "node_id": -1, "port": -1, **_error(err)})
                continue
            txn = self._txn() if key_type == TRANSACTION_KEY and self._txn is not None else None
            find: Callable[[str], Any] = txn.find_coordinator if txn is not None else self._groups.find_coordinator
            try:
                node = await self._call(find, key)
            except Exception as exc:
                found.append({"key": key, "node_id": -1, "host": "", "port": -1, **_error(exc)})
                continue
            found.append({"key": key, "node_id": node.node_id, "host": node.host, "port": node.port, "error_code": 0})
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
        protocols = []
        for pr in p.protocols:
            metadata = bytes(pr.metadata)
            if consumer:
                try:
                    metadata, versions[pr.name] = subscription_to_proto(metadata)
                except ConsumerProtocolError:
                    return build(cls, {"error_code": INVALID_REQUEST, "member_id": p.member_id})
            protocols.append((pr.name, metadata))
        join = JoinGroup(
            p.group_id,
            p.member_id,
            req.header.client_id or "",
            req.connection.client_host,
            millis(p.session_timeout),
            millis(getattr(p, "rebalance_timeout", -1)),
            p.protocol_type,
            protocols,
            getattr(p, "group_instance_id", None),
            require_known_member_id=req.version >= 4,  # KIP-394
        )
        try:
            r = await self._groups.join(join)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            member_id = exc.member_id if isinstance(exc, MemberIdNeeded) else p.member_id
            return build(cls, {"error_code": _code(exc), "member_id": member_id, "protocol_type": None})
        version = versions.get(r.protocol) if consumer else None
        self._members.joined(p.group_id, r.member_id, _Member(p.protocol_type, r.protocol, version))
        return build(
            cls,
            {
                "error_code": 0,
                "generation_id": r.generation,
                "protocol_type": p.protocol_type,
                "protocol_name": r.protocol,
                "leader": r.leader_id,
                "member_id": r.member_id,
                "members": [
                    {
                        "member_id": mid,
                        "group_instance_id": r.instance_ids.get(mid),
                        "metadata": _out(subscription_to_kafka, metadata, version),
                    }
                    for mid, metadata in r.members
                ],
            },
        )

    async def sync_group(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(SYNC_GROUP, req.version)
        member = self._members.get(p.group_id, p.member_id)
        consumer = member is not None and member.version is not None
        assignments: dict[str, bytes] = {}
        for a in p.assignments:
            assignment = bytes(a.assignment)
            if consumer:
                try:
                    assignment, _ = assignment_to_proto(assignment)
                except ConsumerProtocolError:
                    return build(cls, {"error_code": INVALID_REQUEST})
            assignments[a.member_id] = assignment
        try:
            mine = await self._groups.sync(_member_of(p), assignments)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return build(cls, {"error_code": _code(exc)})
        return build(
            cls,
            {
                "error_code": 0,
                "protocol_type": member.protocol_type if member else None,
                "protocol_name": member.protocol_name if member else None,
                "assignment": _out(assignment_to_kafka, mine, member.version if member else None),
            },
        )

    async def heartbeat(self, req: KafkaRequest) -> Any:
        try:
            await self._call(self._groups.heartbeat, _member_of(req.payload))
            code = 0
        except Exception as exc:
            code = _code(exc)
        return build(response_class(HEARTBEAT, req.version), {"error_code": code})

    async def leave_group(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(LEAVE_GROUP, req.version)
        ids = [(m.member_id, m.group_instance_id) for m in p.members] if req.version >= 3 else [(p.member_id, None)]
        codes = []
        for mid, instance in ids:
            try:
                await self._call(self._groups.leave, MemberOf(p.group_id, mid, -1, instance))
                code = 0
            except Exception as exc:
                code = _code(exc)
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
        member = MemberOf(
            p.group_id, p.member_id, int(p.generation_id_or_member_epoch), getattr(p, "group_instance_id", None)
        )
        offsets = [
            (
                (t.name, int(part.partition_index)),
                CommittedOffset(int(part.committed_offset), part.committed_metadata or ""),
            )
            for t in p.topics
            for part in t.partitions
        ]
        results = await self._call(self._groups.commit_offsets, member, offsets)
        return build(response_class(OFFSET_COMMIT, req.version), {"topics": _partition_codes(p.topics, results)})

    async def offset_fetch(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(OFFSET_FETCH, req.version)
        if p.topics is not None and not p.topics:
            return build(cls, {"error_code": 0})  # an empty list asks for nothing (null asks for all)
        wanted = [(t.name, int(i)) for t in p.topics for i in t.partition_indexes] if p.topics is not None else None
        unstable: set[tuple[str, int]] = set()
        try:
            if req.version >= 7 and p.require_stable and self._txn is not None:
                # Before the offsets are read: a transaction found complete here has put
                # its offsets in the group already (it is marked complete after them).
                unstable = await self._call(self._txn().unstable_offsets, p.group_id, wanted)
            entries = await self._call(self._groups.fetch_offsets, p.group_id, wanted)
        except Exception as exc:
            if req.version >= 2:
                return build(cls, {"error_code": _code(exc)})
            # v1 has no group-level error: every partition asked carries it
            topics = [
                _partition_errors(t.name, [int(i) for i in t.partition_indexes], _code(exc)) for t in p.topics or ()
            ]
            return build(cls, {"topics": topics})
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for e in entries:
            c = e.committed
            if (e.topic, e.partition) in unstable and e.error is None:
                by_topic.setdefault(e.topic, []).append(
                    {"partition_index": e.partition, "committed_offset": -1, "committed_leader_epoch": -1,
                     "metadata": "", "error_code": UNSTABLE_OFFSET_COMMIT}
                )  # fmt: skip
                continue
            by_topic.setdefault(e.topic, []).append(
                {
                    "partition_index": e.partition,
                    "committed_offset": c.offset if c else -1,
                    "committed_leader_epoch": -1,
                    "metadata": c.metadata if c else "",
                    "error_code": _code(e.error),
                }
            )
        topics = [{"name": name, "partitions": parts} for name, parts in by_topic.items()]
        return build(cls, {"error_code": 0, "topics": topics})

    async def offset_delete(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(OFFSET_DELETE, req.version)
        wanted = [(t.name, int(part.partition_index)) for t in p.topics for part in t.partitions]
        try:
            results = await self._call(self._groups.delete_offsets, p.group_id, wanted)
        except Exception as exc:
            return build(cls, {"error_code": _code(exc)})
        return build(cls, {"error_code": 0, "topics": _partition_codes(p.topics, results)})

    # --- administration ---------------------------------------------------------------

    async def describe_groups(self, req: KafkaRequest) -> Any:
        described = await self._call(self._groups.describe_groups, list(req.payload.groups))
        return build(response_class(DESCRIBE_GROUPS, req.version), {"groups": [self._described(g) for g in described]})

    def _described(self, g: GroupDescription) -> dict[str, Any]:
        if g.error is not None:
            return {"error_code": g.error.errno, "group_id": g.group_id, "group_state": "", "protocol_type": "",
                    "protocol_data": "", "members": []}  # fmt: skip
        consumer = g.protocol_type == CONSUMER
        members = []
        for m in g.members:
            known = self._members.get(g.group_id, m.member_id)
            version = known.version if known is not None and known.version is not None else DESCRIBE_VERSION
            members.append(
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": _out(
                        subscription_to_kafka, m.metadata_for(g.protocol_name), version if consumer else None
                    ),
                    "member_assignment": _out(assignment_to_kafka, m.assignment, version if consumer else None)
                    if m.assignment
                    else b"",
                }
            )
        return {
            "error_code": 0,
            "group_id": g.group_id,
            "group_state": g.state,
            "protocol_type": g.protocol_type,
            "protocol_data": g.protocol_name,
            "members": members,
        }

    async def list_groups(self, req: KafkaRequest) -> Any:
        p = req.payload
        states = {s.lower() for s in getattr(p, "states_filter", ())}
        listed = await self._call(self._groups.list_groups)
        return build(
            response_class(LIST_GROUPS, req.version),
            {
                "error_code": 0,
                "groups": [
                    {"group_id": g.group_id, "protocol_type": g.protocol_type, "group_state": g.state}
                    for g in listed
                    if g.state != UNKNOWN_STATE and (not states or g.state.lower() in states)
                ],
            },
        )

    async def delete_groups(self, req: KafkaRequest) -> Any:
        results = await self._call(self._groups.delete_groups, list(req.payload.groups_names))
        return build(
            response_class(DELETE_GROUPS, req.version),
            {"results": [{"group_id": gid, "error_code": _code(err)} for gid, err in results]},
        )


def _code(exc: BaseException | None) -> int:
    """The Kafka error code of a core failure (0: none)."""
    return 0 if exc is None else as_response_error(exc).errno  # type: ignore[arg-type]


def _error(exc: Exception) -> dict[str, Any]:
    err = as_response_error(exc)
    return {"error_code": err.errno, "error_message": err.message}


def _partition_codes(topics: Any, results: Mapping[tuple[str, int], BrokerResponseError | None]) -> list[Any]:
    """OffsetCommit's and OffsetDelete's answer: each partition asked, with its code."""
    return [
        {
            "name": t.name,
            "partitions": [
                {
                    "partition_index": int(x.partition_index),
                    "error_code": _code(results.get((t.name, int(x.partition_index)))),
                }
                for x in t.partitions
            ],
        }
        for t in topics
    ]


def _member_of(payload: Any) -> MemberOf:
    return MemberOf(
        payload.group_id,
        payload.member_id,
        int(getattr(payload, "generation_id", -1)),
        getattr(payload, "group_instance_id", None),
    )


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


def _partition_errors(topic: str, partitions: list[int], errno: int) -> dict[str, Any]:
    return {
        "name": topic,
        "partitions": [{"partition_index": i, "error_code": errno, "committed_offset": -1} for i in partitions],
    }
