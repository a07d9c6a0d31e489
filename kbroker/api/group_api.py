"""The consumer-group requests, protocol-neutral (Kafka's ``KafkaApis.handle*Group*`` and
``handleOffset*``): plain values in, typed results out, whole-request failures raised as
the error table's exceptions (:mod:`kclient.errors`). Both doors call this: the gRPC
servicer and the Kafka door each decode their request, call one method and encode the
answer.

Authorization is here, once for both doors (Kafka's rules, per method below); the group
logic (membership, commits and their validation, offset deletion) is the
:class:`~kbroker.group.coordinator.GroupCoordinator`'s.

Methods that block (ZooKeeper) are plain functions, for the door to run on its request
pool; JoinGroup and SyncGroup are coroutines that park in the coordinator and hold no
thread. Every method reads the caller from :func:`kbroker.api.call_context.current`.

Thread safety: stateless beyond its collaborators, which are thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kbroker.api.access import Access
from kbroker.api.call_context import Offload, current
from kbroker.api.metadata_api import Node, advertised
from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.zkdata import CommittedOffset as CommittedOffset
from kbroker.group.coordinator import GroupCoordinator, TopicPartition
from kbroker.group.group import JoinResult as JoinResult
from kbroker.group.group import Member as Member
from kbroker.group.group import MemberIdNeeded as MemberIdNeeded
from kbroker.security.acl import AclOperation as Op
from kclient.errors import BrokerResponseError, CoordinatorNotAvailableError, InvalidGroupIdError, as_response_error

PartitionErrors = dict[TopicPartition, BrokerResponseError | None]
"""Per partition: None (done) or why not."""


@dataclass(frozen=True, slots=True)
class JoinGroup:
    group_id: str
    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    """<= 0: the session timeout (JoinGroup v0 has none)."""
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    group_instance_id: str | None = None
    require_known_member_id: bool = False


@dataclass(frozen=True, slots=True)
class MemberOf:
    """Who a Heartbeat, LeaveGroup, SyncGroup or OffsetCommit comes from."""

    group_id: str
    member_id: str
    generation: int = -1
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class CommittedEntry:
    topic: str
    partition: int
    committed: CommittedOffset | None
    """None: nothing committed (offset -1)."""
    error: BrokerResponseError | None = None


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    error: BrokerResponseError | None = None
    state: str = ""
    protocol_type: str = ""
    protocol_name: str = ""
    generation: int = -1
    leader_id: str = ""
    members: list[Member] = field(default_factory=list)


class GroupApi:
    """The group requests over one :class:`GroupCoordinator` (see the module docstring)."""

    def __init__(
        self,
        groups: GroupCoordinator,
        metadata: MetadataCache,
        access: Access,
        offload: Offload,
    ) -> None:
        self._groups = groups
        self._metadata = metadata
        self._access = access
        self._offload = offload

    def find_coordinator(self, group_id: str) -> Node:
        """DESCRIBE on the group; the coordinator as the caller's listener reaches it."""
        self._access.check_group(Op.DESCRIBE, group_id)
        if not group_id:
            raise InvalidGroupIdError("the group id is empty")
        info = self._metadata.snapshot().brokers.get(self._groups.coordinator_of(group_id))
        if info is None:
            raise CoordinatorNotAvailableError("no live broker can coordinate groups")
        where = advertised(info)
        if where is None:
            raise CoordinatorNotAvailableError(f"broker {info.broker_id} has no listener {current().listener}")
        return Node(info.broker_id, where[0], where[1])

    # --- membership (READ on the group) ---------------------------------------------------

    async def join(self, req: JoinGroup) -> JoinResult:
        """Raises MemberIdNeeded (KIP-394: join again with its ``member_id``) or the
        coordinator's refusal."""
        self._access.check_group(Op.READ, req.group_id)
        return await self._groups.join_async(
            self._offload,
            req.group_id,
            req.member_id,
            client_id=req.client_id,
            client_host=req.client_host,
            session_timeout_ms=req.session_timeout_ms,
            rebalance_timeout_ms=req.rebalance_timeout_ms if req.rebalance_timeout_ms > 0 else req.session_timeout_ms,
            protocol_type=req.protocol_type or "consumer",
            protocols=req.protocols,
            group_instance_id=req.group_instance_id,
            require_known_member_id=req.require_known_member_id,
        )

    async def sync(self, member: MemberOf, assignments: dict[str, bytes]) -> bytes:
        """The member's assignment, once the leader has sent every member's."""
        self._access.check_group(Op.READ, member.group_id)
        return await self._groups.sync_async(
            self._offload, member.group_id, member.member_id, member.generation, assignments, member.group_instance_id
        )

    def heartbeat(self, member: MemberOf) -> None:
        self._access.check_group(Op.READ, member.group_id)
        self._groups.heartbeat(member.group_id, member.member_id, member.generation, member.group_instance_id)

    def leave(self, member: MemberOf) -> None:
        self._access.check_group(Op.READ, member.group_id)
        self._groups.leave(member.group_id, member.member_id, member.group_instance_id)

    # --- offsets --------------------------------------------------------------------------

    def commit_offsets(
        self, member: MemberOf, offsets: Sequence[tuple[TopicPartition, CommittedOffset]]
    ) -> PartitionErrors:
        """READ on the group (refused: every partition answers GROUP_AUTHORIZATION_FAILED),
        then READ on each topic; the coordinator checks and writes the rest."""
        names = [tp[0] for tp, _ in offsets]
        refused: dict[str, BrokerResponseError] = (
            self._access.refused_topics(Op.READ, names)
            if self._access.group(Op.READ, member.group_id)
            else dict.fromkeys(names, self._access.group_error(Op.READ, member.group_id))
        )
        return self._groups.commit_offsets(
            member.group_id,
            member.member_id,
            member.generation,
            offsets,
            member.group_instance_id,
            refused=refused,
        )

    def fetch_offsets(self, group_id: str, partitions: Sequence[TopicPartition] | None) -> list[CommittedEntry]:
        """DESCRIBE on the group (raised), then on each topic: a named partition of a
        topic the caller may not describe answers TOPIC_AUTHORIZATION_FAILED, and fetching
        all (``partitions`` None) leaves those topics out."""
        self._access.check_group(Op.DESCRIBE, group_id)
        if not group_id:
            raise InvalidGroupIdError("the group id is empty")
        refused = self._access.refused_topics(Op.DESCRIBE, (t for t, _ in partitions or ()))
        asked = [tp for tp in partitions if tp[0] not in refused] if partitions is not None else None
        try:
            found = self._groups.store.fetch(group_id, asked)
        except Exception as exc:
            raise as_response_error(exc) from exc
        wanted = list(partitions) if partitions is not None else sorted(found)
        if partitions is None and self._access.enabled:
            describable = self._access.topics(Op.DESCRIBE, (t for t, _ in wanted))
            wanted = [tp for tp in wanted if tp[0] in describable]
        return [CommittedEntry(t, p, found.get((t, p)), refused.get(t)) for t, p in wanted]

    def delete_offsets(self, group_id: str, partitions: Sequence[TopicPartition]) -> PartitionErrors:
        """Kafka 2.8's handleOffsetDeleteRequest: DELETE on the group (raised), READ on each
        topic (refused: its partitions answer TOPIC_AUTHORIZATION_FAILED), unknown
        partitions UNKNOWN_TOPIC_OR_PARTITION; the rest goes to the coordinator, whose
        group-level refusals are raised."""
        self._access.check_group(Op.DELETE, group_id)
        refused = self._access.refused_topics(Op.READ, (t for t, _ in partitions))
        results: PartitionErrors = {tp: refused[tp[0]] for tp in partitions if tp[0] in refused}
        results.update(self._metadata.snapshot().unknown_partitions(tp for tp in partitions if tp not in results))
        wanted = [tp for tp in partitions if tp not in results]
        try:
            results.update(self._groups.delete_offsets(group_id, wanted))
        except Exception as exc:
            raise as_response_error(exc) from exc
        return results

    # --- administration -------------------------------------------------------------------

    def list_groups(self) -> list[GroupListing]:
        """Every group with DESCRIBE on the Cluster, else the groups the caller may DESCRIBE.
        The state is this broker's view ("Unknown" for a group another broker coordinates)."""
        everything = self._access.cluster(Op.DESCRIBE, quiet=True)
        return [
            GroupListing(gid, "consumer", self._groups.local_state(gid))
            for gid in self._groups.store.groups()
            if everything or self._access.group(Op.DESCRIBE, gid, quiet=True)
        ]

    def describe_groups(self, group_ids: Sequence[str]) -> list[GroupDescription]:
        """DESCRIBE on each group; each answer carries its own error."""
        out = []
        for gid in group_ids:
            try:
                self._access.check_group(Op.DESCRIBE, gid)
                g, state, members = self._groups.describe(gid)
            except Exception as exc:
                out.append(GroupDescription(gid, as_response_error(exc)))
                continue
            out.append(
                GroupDescription(
                    gid,
                    None,
                    state.value,
                    g.protocol_type,
                    g.protocol,
                    g.generation,
                    g.leader_id,
                    members,
                )
            )
        return out

    def delete_groups(self, group_ids: Sequence[str]) -> list[tuple[str, BrokerResponseError | None]]:
        """DELETE on each group, in order; a group with members or unknown answers its
        own error."""
        out: list[tuple[str, BrokerResponseError | None]] = []
        for gid in group_ids:
            try:
                self._access.check_group(Op.DELETE, gid)
                self._groups.delete(gid)
                out.append((gid, None))
            except Exception as exc:
                out.append((gid, as_response_error(exc)))
        return out
