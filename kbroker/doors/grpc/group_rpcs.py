"""The group RPCs of the ``kbroker.v1.Broker`` servicer: protobuf in, one call of the
core (:class:`~kbroker.api.group_api.GroupApi`), protobuf out. A refusal of the whole
request is the response's own ``error_code``; unset ``optional`` fields take the
defaults the .proto documents.

Thread safety: handlers run on the server's loop; blocking ones on its request pool.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from kbroker.api.group_api import CommittedOffset, GroupApi, JoinGroup, MemberIdNeeded, MemberOf
from kbroker.doors.grpc.rpc import blocking, opt, set_error
from kclient.errors import CoordinatorNotAvailableError, InvalidRequestError, as_response_error
from kclient.proto.kbroker.v1 import group_pb2

DEFAULT_SESSION_TIMEOUT_MS = 45000


def _member(request: Any) -> MemberOf:
    generation = opt(request, "generation_id", -1) if "generation_id" in type(request).DESCRIPTOR.fields_by_name else -1
    return MemberOf(request.group_id, request.member_id, generation, opt(request, "group_instance_id", None))


class GroupRpcs:
    """Mixin of the servicer: needs ``self.groups_api`` and ``self._offload``."""

    groups_api: GroupApi

    @blocking
    def FindCoordinator(self, request: group_pb2.FindCoordinatorRequest) -> group_pb2.FindCoordinatorResponse:
        resp = group_pb2.FindCoordinatorResponse(node_id=-1)
        key_type = opt(request, "key_type", group_pb2.GROUP)
        try:
            if key_type == group_pb2.GROUP:
                node = self.groups_api.find_coordinator(request.group_id)
            elif key_type == group_pb2.TRANSACTION:
                txn = getattr(self, "txn_api", None)
                if txn is None:
                    raise CoordinatorNotAvailableError("this broker does not serve transactions")
                node = txn.find_coordinator(request.group_id)
            else:
                raise InvalidRequestError(f"key_type must be 0 (GROUP) or 1 (TRANSACTION), got {key_type}")
        except Exception as exc:
            set_error(resp, as_response_error(exc))
            return resp
        resp.node_id, resp.host, resp.port = node.node_id, node.host, node.port
        return resp

    async def JoinGroup(
        self, request: group_pb2.JoinGroupRequest, context: grpc.aio.ServicerContext
    ) -> group_pb2.JoinGroupResponse:
        resp = group_pb2.JoinGroupResponse(generation_id=-1)
        join = JoinGroup(
            request.group_id,
            request.member_id,
            request.client_id,
            request.client_host or context.peer(),
            opt(request, "session_timeout_ms", DEFAULT_SESSION_TIMEOUT_MS),
            opt(request, "rebalance_timeout_ms", -1),
            request.protocol_type,
            [(p.name, p.metadata) for p in request.protocols],
            opt(request, "group_instance_id", None),
            request.require_known_member_id,
        )
        try:
            r = await self.groups_api.join(join)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            set_error(resp, as_response_error(exc))
            if isinstance(exc, MemberIdNeeded):
                resp.member_id = exc.member_id  # KIP-394: join again with it
            return resp
        resp.generation_id, resp.protocol_name, resp.leader_id, resp.member_id = (
            r.generation,
            r.protocol,
            r.leader_id,
            r.member_id,
        )
        for mid, metadata in r.members:
            m = resp.members.add(member_id=mid, metadata=metadata)
            if mid in r.instance_ids:
                m.group_instance_id = r.instance_ids[mid]
        return resp

    async def SyncGroup(
        self, request: group_pb2.SyncGroupRequest, context: grpc.aio.ServicerContext
    ) -> group_pb2.SyncGroupResponse:
        resp = group_pb2.SyncGroupResponse()
        try:
            resp.assignment = await self.groups_api.sync(
                _member(request), {a.member_id: a.assignment for a in request.assignments}
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            set_error(resp, as_response_error(exc))
        return resp

    @blocking
    def Heartbeat(self, request: group_pb2.HeartbeatRequest) -> group_pb2.HeartbeatResponse:
        resp = group_pb2.HeartbeatResponse()
        try:
            self.groups_api.heartbeat(_member(request))
        except Exception as exc:
            set_error(resp, as_response_error(exc))
        return resp

    @blocking
    def LeaveGroup(self, request: group_pb2.LeaveGroupRequest) -> group_pb2.LeaveGroupResponse:
        resp = group_pb2.LeaveGroupResponse()
        try:
            self.groups_api.leave(_member(request))
        except Exception as exc:
            set_error(resp, as_response_error(exc))
        return resp

    @blocking
    def CommitOffsets(self, request: group_pb2.CommitOffsetsRequest) -> group_pb2.CommitOffsetsResponse:
        offsets = [
            ((t.name, p.index), CommittedOffset(p.offset, p.metadata)) for t in request.topics for p in t.partitions
        ]
        results = self.groups_api.commit_offsets(_member(request), offsets)
        resp = group_pb2.CommitOffsetsResponse()
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                pe = tr.partitions.add(index=p.index)
                err = results.get((t.name, p.index))
                if err is not None:
                    set_error(pe, err)
        return resp

    @blocking
    def FetchOffsets(self, request: group_pb2.FetchOffsetsRequest) -> group_pb2.FetchOffsetsResponse:
        resp = group_pb2.FetchOffsetsResponse()
        wanted = [(t.name, p) for t in request.topics for p in t.partitions] if request.topics else None
        try:
            entries = self.groups_api.fetch_offsets(request.group_id, wanted)
        except Exception as exc:
            set_error(resp, as_response_error(exc))
            return resp
        by_topic: dict[str, Any] = {}
        for e in entries:
            tr = by_topic.get(e.topic)
            if tr is None:
                tr = by_topic[e.topic] = resp.topics.add(name=e.topic)
            c = e.committed
            pr = tr.partitions.add(index=e.partition, offset=c.offset if c else -1, metadata=c.metadata if c else "")
            if e.error is not None:
                pr.error_code = e.error.errno  # type: ignore[assignment]
        return resp

    @blocking
    def ListGroups(self, request: group_pb2.ListGroupsRequest) -> group_pb2.ListGroupsResponse:
        resp = group_pb2.ListGroupsResponse()
        for g in self.groups_api.list_groups():
            resp.groups.add(group_id=g.group_id, protocol_type=g.protocol_type, state=g.state)
        return resp

    @blocking
    def DescribeGroups(self, request: group_pb2.DescribeGroupsRequest) -> group_pb2.DescribeGroupsResponse:
        resp = group_pb2.DescribeGroupsResponse()
        for g in self.groups_api.describe_groups(list(request.group_ids)):
            d = resp.groups.add(group_id=g.group_id)
            if g.error is not None:
                set_error(d, g.error)
                continue
            d.state, d.protocol_type, d.protocol_name = g.state, g.protocol_type, g.protocol_name
            d.generation_id, d.leader_id = g.generation, g.leader_id
            for m in g.members:
                dm = d.members.add(
                    member_id=m.member_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    metadata=m.metadata_for(g.protocol_name),
                    assignment=m.assignment,
                )
                if m.group_instance_id is not None:
                    dm.group_instance_id = m.group_instance_id
        return resp

    @blocking
    def DeleteGroups(self, request: group_pb2.DeleteGroupsRequest) -> group_pb2.DeleteGroupsResponse:
        resp = group_pb2.DeleteGroupsResponse()
        for gid, err in self.groups_api.delete_groups(list(request.group_ids)):
            result = resp.results.add(group_id=gid)
            if err is not None:
                set_error(result, err)
        return resp

    @blocking
    def OffsetDelete(self, request: group_pb2.OffsetDeleteRequest) -> group_pb2.OffsetDeleteResponse:
        """A group-level error is the whole answer (no topics)."""
        resp = group_pb2.OffsetDeleteResponse()
        try:
            results = self.groups_api.delete_offsets(
                request.group_id, [(t.name, p) for t in request.topics for p in t.partitions]
            )
        except Exception as exc:
            set_error(resp, as_response_error(exc))
            return resp
        for t in request.topics:
            tr = resp.topics.add(name=t.name)
            for p in t.partitions:
                pr = tr.partitions.add(index=p)
                err = results.get((t.name, p))
                if err is not None:
                    set_error(pr, err)
        return resp
