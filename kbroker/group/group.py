"""One consumer group's membership state machine (Kafka's classic group protocol, as
Kafka 2.8's GroupCoordinator runs it: eager and cooperative (KIP-429) clients alike,
static members (KIP-345) and member ids handed out before joining (KIP-394)).

States::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
      ^                   ^     |                                      | leader's SyncGroup
      |                   |     +--no members left--> Empty            v
      +---last leaves-----+---------join / leave / member expired--- Stable

Invariants:

* ``generation`` only grows (it continues from ZooKeeper when a coordinator takes a
  group over), and every completed rebalance bumps it.
* A join round completes when every current member has (re)joined, or when the
  rebalance timeout passes — members that did not rejoin are dropped. A new group
  waits ``initial_delay_s`` (extended by each new member, capped by the rebalance
  timeout) so that members starting together land in one generation.
* Each partition is owned by at most one member: assignments come from the leader's
  SyncGroup, for the generation that SyncGroup names.
* Static members (``group_instance_id``): ``static_members`` maps each instance id to
  its current member id. A join with an unknown member id and a known instance id
  replaces the old member id (which is fenced: FENCED_INSTANCE_ID from then on); in
  Stable, when the protocol chosen does not change, it gets the current generation and
  its old assignment without a rebalance. A static member that does not rejoin a round
  stays in the group; only its session timeout (or a LeaveGroup) removes it.
* KIP-394: a dynamic member's first join may be answered MEMBER_ID_REQUIRED with a new
  member id, kept in ``pending`` until it joins with it or its session timeout passes;
  a round does not complete while a pending member may still join.
* Cooperative rebalancing (KIP-429) needs nothing special: a member that revoked
  partitions rejoins with new metadata (its owned partitions), which starts the second
  round like any metadata change.

Thread safety: all state is guarded by ``cond``. JoinGroup and SyncGroup are long
polls, split in two halves so that a waiting request holds no thread: ``join_begin`` /
``sync_begin`` register the call, ``join_poll`` / ``sync_poll`` answer it once the round
allows (None meanwhile), and ``call_done`` ends it. Every state change bumps
``version`` and calls ``on_wake`` (parked requests re-check).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from google.protobuf.message import DecodeError

from kclient.errors import (
    FencedInstanceIdError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    MemberIdRequiredError,
    NotCoordinatorError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from kclient.proto.kbroker.v1 import group_pb2


class GroupState(StrEnum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    last_heartbeat: float = field(default_factory=time.monotonic)
    joined_round: int = -1
    in_call: int = 0  # blocked in JoinGroup/SyncGroup: alive even without heartbeats
    group_instance_id: str | None = None
    join_answer: JoinResult | None = None
    """A JoinGroup answered at once (no round to wait for), taken by ``join_poll``."""

    def metadata_for(self, protocol: str) -> bytes:
        return next((m for n, m in self.protocols if n == protocol), b"")

    def vote(self, candidates: set[str]) -> str:
        """The first protocol this member prefers among ``candidates``."""
        return next(n for n, _ in self.protocols if n in candidates)


@dataclass
class JoinResult:
    generation: int
    protocol: str
    leader_id: str
    member_id: str
    members: list[tuple[str, bytes]]
    instance_ids: dict[str, str] = field(default_factory=dict)
    """Member id -> group instance id of the static ones among ``members``."""


class MemberIdNeeded(MemberIdRequiredError):
    """MEMBER_ID_REQUIRED (KIP-394), carrying the member id to join again with."""

    def __init__(self, member_id: str) -> None:
        super().__init__(f"join again with member id {member_id!r}")
        self.member_id = member_id


FENCED_MEMORY = 1024
"""Replaced member ids of static members remembered (answered FENCED_INSTANCE_ID)."""


Listener = Callable[["Group"], None]


def _no_wake(_: Group) -> None:
    pass


class Group:
    def __init__(
        self,
        group_id: str,
        generation: int,
        *,
        initial_delay_s: float,
        on_change: Listener,
        on_wake: Listener = _no_wake,
        empty_since_ms: float | None = None,
    ) -> None:
        self.group_id = group_id
        self.generation = generation
        self.state = GroupState.EMPTY
        self.empty_since_ms = time.time() * 1000.0 if empty_since_ms is None else empty_since_ms
        """When the group last became Empty (epoch ms; Kafka's currentStateTimestamp as
        committed-offset retention reads it): at construction, when it was loaded here."""
        self.protocol_type = ""
        self.protocol = ""
        self.leader_id = ""
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}
        """Group instance id -> its current member id."""
        self.pending: dict[str, float] = {}
        """KIP-394: member ids handed out by MEMBER_ID_REQUIRED -> when they lapse (monotonic)."""
        self._fenced: dict[str, str] = {}
        """Replaced member id of a static member -> its instance id (bounded)."""
        self.cond = threading.Condition()
        self._round = 0
        self._deadline = 0.0
        self._initial_delay_s = initial_delay_s
        self._initial = False  # this round started from Empty: wait the initial delay
        self._first_join = 0.0
        self._on_change = on_change  # persist generation / members / owners (called with cond held)
        self._on_wake = on_wake  # parked requests re-check (called with cond held)
        self.version = 0

    def _changed(self) -> None:
        self.version += 1
        self._on_wake(self)

    # --- helpers -------------------------------------------------------------------

    def _check_alive(self) -> None:
        if self.state == GroupState.DEAD:
            raise NotCoordinatorError(f"group {self.group_id!r} moved to another coordinator")

    def _member(self, member_id: str) -> Member:
        m = self.members.get(member_id)
        if m is None:
            self._check_not_replaced(member_id)
            raise UnknownMemberIdError(f"member {member_id!r} is not in group {self.group_id!r}")
        return m

    def _check_not_replaced(self, member_id: str) -> None:
        instance = self._fenced.get(member_id)
        if instance is not None:
            raise FencedInstanceIdError(
                f"member {member_id!r} of group {self.group_id!r} was replaced by a newer member with "
                f"group.instance.id {instance!r}"
            )

    def _check_fenced(self, member_id: str, group_instance_id: str | None) -> None:
        """Kafka's isStaticMemberFenced: the instance id is known and maps to another member."""
        if group_instance_id is None:
            return
        current = self.static_members.get(group_instance_id)
        if current is not None and current != member_id:
            raise FencedInstanceIdError(
                f"group.instance.id {group_instance_id!r} of group {self.group_id!r} belongs to member "
                f"{current!r}, not {member_id!r}"
            )

    def _check_generation(self, generation: int) -> None:
        if generation != self.generation:
            raise IllegalGenerationError(
                f"generation {generation} of group {self.group_id!r} is stale; the current one is {self.generation}"
            )

    def _max_rebalance_s(self) -> float:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=30000) / 1000.0

    def _start_rebalance(self, now: float) -> None:
        if self.state == GroupState.PREPARING_REBALANCE:
            return
        initial = self.state == GroupState.EMPTY
        self.state = GroupState.PREPARING_REBALANCE
        self._round += 1
        if initial:
            self._deadline = now + min(self._initial_delay_s, self._max_rebalance_s())
        else:
            self._deadline = now + self._max_rebalance_s()
        self._initial = initial
        self._changed()

    def _choose_protocol(self) -> str:
        """Kafka's selectProtocol: among the protocols every member supports, each member
        votes for the one it prefers most; most votes wins (ties: the best total
        preference rank, then the name)."""
        members = list(self.members.values())
        common = set(n for n, _ in members[0].protocols)
        for m in members[1:]:
            common &= {n for n, _ in m.protocols}
        votes: dict[str, int] = {}
        for m in members:
            choice = m.vote(common)
            votes[choice] = votes.get(choice, 0) + 1
        return min(
            votes,
            key=lambda name: (-votes[name], sum([n for n, _ in m.protocols].index(name) for m in members), name),
        )

    def _complete_join(self) -> None:
        # Dynamic members that did not rejoin are dropped; static ones stay (KIP-345:
        # only their session timeout removes them).
        laggards = [
            mid for mid, m in self.members.items() if m.joined_round != self._round and m.group_instance_id is None
        ]
        for mid in laggards:
            del self.members[mid]
        self.pending.clear()
        self.generation += 1
        if not self.members:
            self.state = GroupState.EMPTY
            self.empty_since_ms = time.time() * 1000.0
            self.protocol = ""
            self.leader_id = ""
        else:
            self.protocol = self._choose_protocol()
            joined = [mid for mid, m in self.members.items() if m.joined_round == self._round]
            if self.leader_id not in joined:
                self.leader_id = joined[0] if joined else next(iter(self.members))
            self.state = GroupState.COMPLETING_REBALANCE
            for m in self.members.values():
                m.assignment = b""
                m.last_heartbeat = time.monotonic()
        self._on_change(self)
        self._changed()

    def _maybe_complete_join(self, now: float) -> None:
        if self.state != GroupState.PREPARING_REBALANCE:
            return
        everyone = not self.pending and all(m.joined_round == self._round for m in self.members.values())
        if everyone and not self._initial:
            self._complete_join()
        elif now >= self._deadline:
            if self.members and not any(m.joined_round == self._round for m in self.members.values()):
                # Only static members that have not rejoined are left: no one could lead the
                # next generation. Wait another rebalance timeout (Kafka does; their session
                # timeouts remove them meanwhile).
                self._deadline = now + self._max_rebalance_s()
                return
            self._complete_join()

    def _answer(self, member_id: str, leader_id: str | None = None) -> JoinResult:
        """This generation's JoinGroup answer for a member (the leader gets every member)."""
        leader = self.leader_id if leader_id is None else leader_id
        if member_id != leader:
            return JoinResult(self.generation, self.protocol, leader, member_id, [])
        members = [(mid, mm.metadata_for(self.protocol)) for mid, mm in self.members.items()]
        instances = {mid: mm.group_instance_id for mid, mm in self.members.items() if mm.group_instance_id is not None}
        return JoinResult(self.generation, self.protocol, leader, member_id, members, instances)

    def _supports(self, member_id: str, protocol_type: str, protocols: list[tuple[str, bytes]]) -> None:
        """Kafka's supportsProtocols: the type matches and one protocol is common to every
        other member (INCONSISTENT_GROUP_PROTOCOL otherwise)."""
        if not protocols:
            raise InconsistentGroupProtocolError("a member must offer at least one protocol")
        if not self.members:
            return
        if protocol_type != self.protocol_type:
            raise InconsistentGroupProtocolError(
                f"group {self.group_id!r} uses protocol type {self.protocol_type!r}, not {protocol_type!r}"
            )
        others = [m for mid, m in self.members.items() if mid != member_id]
        offered = {n for n, _ in protocols}
        if others and not offered.intersection(*({n for n, _ in m.protocols} for m in others)):
            raise InconsistentGroupProtocolError(
                f"member offers {sorted(offered)}, which no protocol common to the other members of "
                f"{self.group_id!r} matches"
            )

    def join_begin(
        self,
        member_id: str,
        *,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        group_instance_id: str | None = None,
        require_known_member_id: bool = False,
    ) -> tuple[str, int]:
        """Register a JoinGroup call; returns (member id, join round) for ``join_poll``.
        The member counts as alive until ``call_done``.

        Raises MemberIdNeeded (KIP-394: a dynamic member's first join when
        ``require_known_member_id``), FencedInstanceIdError, UnknownMemberIdError,
        InconsistentGroupProtocolError."""
        with self.cond:
            self._check_alive()
            self._supports(member_id, protocol_type, protocols)
            now = time.monotonic()
            if not member_id:
                new_id = f"{group_instance_id or client_id or 'member'}-{uuid.uuid4()}"
                if group_instance_id is not None and group_instance_id in self.static_members:
                    return self._static_rejoin(
                        new_id,
                        group_instance_id,
                        client_id,
                        client_host,
                        session_timeout_ms,
                        rebalance_timeout_ms,
                        protocols,
                        now,
                    )
                if group_instance_id is None and require_known_member_id:
                    self.pending[new_id] = now + session_timeout_ms / 1000.0
                    raise MemberIdNeeded(new_id)
                return self._add_and_join(
                    new_id,
                    group_instance_id,
                    client_id,
                    client_host,
                    session_timeout_ms,
                    rebalance_timeout_ms,
                    protocol_type,
                    protocols,
                    now,
                )
            if member_id in self.pending:
                if group_instance_id is not None:
                    raise UnknownMemberIdError(f"member {member_id!r} was handed out to a dynamic member")
                del self.pending[member_id]
                return self._add_and_join(
                    member_id,
                    None,
                    client_id,
                    client_host,
                    session_timeout_ms,
                    rebalance_timeout_ms,
                    protocol_type,
                    protocols,
                    now,
                )
            self._check_fenced(member_id, group_instance_id)
            m = self._member(member_id)
            if group_instance_id is not None and group_instance_id not in self.static_members:
                raise UnknownMemberIdError(
                    f"group.instance.id {group_instance_id!r} is not known in group {self.group_id!r}"
                )
            m.last_heartbeat = now
            m.session_timeout_ms = session_timeout_ms
            m.rebalance_timeout_ms = rebalance_timeout_ms
            same = m.protocols == protocols
            if self.state == GroupState.COMPLETING_REBALANCE and same:
                # It lost its JoinGroup answer: the current generation again.
                m.join_answer = self._answer(member_id)
            elif self.state == GroupState.STABLE and same and member_id != self.leader_id:
                # Nothing changed for a follower: the current generation, no rebalance (the
                # leader's join forces one: it may have seen a metadata change).
                m.join_answer = self._answer(member_id)
            else:
                m.protocols = protocols
                self._join_round(m, now)
            m.in_call += 1
            return member_id, self._round

    def _join_round(self, m: Member, now: float) -> None:
        """The member joins the current (or a new) round."""
        if self.state != GroupState.PREPARING_REBALANCE:
            self._first_join = now
            self._start_rebalance(now)
        m.joined_round = self._round
        m.join_answer = None
        self._maybe_complete_join(now)

    def _add_and_join(
        self,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        now: float,
    ) -> tuple[str, int]:
        m = Member(
            member_id,
            client_id,
            client_host,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            protocols,
            group_instance_id=group_instance_id,
        )
        self.members[member_id] = m
        if group_instance_id is not None:
            self.static_members[group_instance_id] = member_id
        self.protocol_type = protocol_type
        if self.state == GroupState.PREPARING_REBALANCE and self._initial:
            # InitialDelayedJoin: every newcomer buys the others a little more time.
            self._deadline = min(now + self._initial_delay_s, self._first_join + self._max_rebalance_s())
        self._join_round(m, now)
        m.in_call += 1
        return member_id, self._round

    def _static_rejoin(
        self,
        new_id: str,
        group_instance_id: str,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocols: list[tuple[str, bytes]],
        now: float,
    ) -> tuple[str, int]:
        """A known static member restarted (unknown member id, known instance id): it takes
        the old member's place; the old member id is fenced (Kafka's
        updateStaticMemberAndRebalance)."""
        old_id = self.static_members[group_instance_id]
        old = self.members.pop(old_id)
        self._fenced[old_id] = group_instance_id
        while len(self._fenced) > FENCED_MEMORY:
            del self._fenced[next(iter(self._fenced))]
        old_leader = self.leader_id
        m = Member(
            new_id,
            client_id,
            client_host,
            session_timeout_ms,
            rebalance_timeout_ms,
            old.protocol_type,
            protocols,
            assignment=old.assignment,
            last_heartbeat=now,
            joined_round=old.joined_round,
            group_instance_id=group_instance_id,
        )
        self.members[new_id] = m
        self.static_members[group_instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        self._changed()  # the old member's parked calls end (fenced)
        if self.state == GroupState.STABLE and self._choose_protocol() == self.protocol:
            # No rebalance: the current generation and the old assignment. The answer names
            # the leader as it was, so that a restarted leader does not assign again (a
            # Stable group would not pass its new assignment on).
            self._on_change(self)
            m.join_answer = self._answer(new_id, leader_id=old_leader)
        else:
            # PreparingRebalance: it joins the round. CompletingRebalance (the old id may
            # already be in the leader's assignment) or Stable with a protocol change: a
            # new round.
            self._join_round(m, now)
        m.in_call += 1
        return new_id, self._round

    def join_poll(self, member_id: str, my_round: int) -> tuple[JoinResult | None, float]:
        """The JoinGroup answer once the round is over, else (None, seconds until the
        round's deadline — poll again then, or when ``version`` changes)."""
        with self.cond:
            self._check_alive()
            m = self.members.get(member_id)
            if m is not None and m.join_answer is not None:
                answer, m.join_answer = m.join_answer, None
                return answer, 0.0
            now = time.monotonic()
            if self._round == my_round and self.state == GroupState.PREPARING_REBALANCE:
                self._maybe_complete_join(now)
            if member_id not in self.members:
                self._check_not_replaced(member_id)
            if self._round == my_round and self.state == GroupState.PREPARING_REBALANCE:
                return None, max(min(self._deadline - now, 1.0), 0.01)
            if member_id not in self.members:
                raise UnknownMemberIdError(f"member {member_id!r} was removed from group {self.group_id!r}")
            return self._answer(member_id), 0.0

    def call_done(self, member_id: str) -> None:
        """A JoinGroup/SyncGroup call ended (answered, failed or abandoned)."""
        with self.cond:
            m = self.members.get(member_id)
            if m is not None and m.in_call > 0:
                m.in_call -= 1
                m.last_heartbeat = time.monotonic()

    def sync_begin(
        self, member_id: str, generation: int, assignments: dict[str, bytes], group_instance_id: str | None = None
    ) -> None:
        """Register a SyncGroup call (the leader's carries the assignment)."""
        with self.cond:
            self._check_alive()
            self._check_fenced(member_id, group_instance_id)
            m = self._member(member_id)
            self._check_generation(generation)
            if self.state == GroupState.PREPARING_REBALANCE:
                raise RebalanceInProgressError(f"group {self.group_id!r} is rebalancing; join again")
            m.last_heartbeat = time.monotonic()
            if self.state == GroupState.COMPLETING_REBALANCE and member_id == self.leader_id:
                for mid, mm in self.members.items():
                    mm.assignment = assignments.get(mid, b"")
                self.state = GroupState.STABLE
                self._on_change(self)
                self._changed()
            m.in_call += 1

    def sync_poll(self, member_id: str, generation: int) -> bytes | None:
        """This member's assignment once the leader sent it, else None."""
        with self.cond:
            self._check_alive()
            if self.state == GroupState.COMPLETING_REBALANCE and self.generation == generation:
                if member_id in self.members:
                    return None
            if member_id not in self.members:
                self._check_not_replaced(member_id)
                raise UnknownMemberIdError(f"member {member_id!r} was removed from group {self.group_id!r}")
            if self.generation != generation or self.state != GroupState.STABLE:
                raise RebalanceInProgressError(f"group {self.group_id!r} is rebalancing; join again")
            return self.members[member_id].assignment

    def sync_timed_out(self) -> RebalanceInProgressError:
        return RebalanceInProgressError(f"the leader of {self.group_id!r} did not send an assignment")

    def heartbeat(self, member_id: str, generation: int, group_instance_id: str | None = None) -> None:
        with self.cond:
            self._check_alive()
            self._check_fenced(member_id, group_instance_id)
            m = self._member(member_id)
            self._check_generation(generation)
            m.last_heartbeat = time.monotonic()
            if self.state == GroupState.PREPARING_REBALANCE:
                raise RebalanceInProgressError(f"group {self.group_id!r} is rebalancing; join again")

    def leave(self, member_id: str, group_instance_id: str | None = None) -> None:
        """LeaveGroup (Kafka 2.8's rules): a member id, or with v3+ an instance id alone
        (member id empty: an operator removing a static member)."""
        with self.cond:
            self._check_alive()
            if member_id and group_instance_id is not None:
                self._check_fenced(member_id, group_instance_id)
            if member_id in self.pending:
                del self.pending[member_id]
                self._maybe_complete_join(time.monotonic())
                self._changed()
                return
            if group_instance_id is not None and group_instance_id in self.static_members:
                self._remove(self.static_members[group_instance_id])
                return
            self._member(member_id)
            self._remove(member_id)

    def _remove(self, member_id: str) -> None:
        m = self.members.pop(member_id)
        if m.group_instance_id is not None and self.static_members.get(m.group_instance_id) == member_id:
            del self.static_members[m.group_instance_id]
        if not self.members and self.state != GroupState.PREPARING_REBALANCE:
            self.state = GroupState.EMPTY
            self.empty_since_ms = time.time() * 1000.0
            self.generation += 1
            self.leader_id = ""
            self.protocol = ""
            self._on_change(self)
        else:
            self._start_rebalance(time.monotonic())
            self._maybe_complete_join(time.monotonic())
        self._changed()

    def check_commit(self, member_id: str, generation: int, group_instance_id: str | None = None) -> None:
        """May this member commit offsets now? (Kafka's doCommitOffsets: a member of the
        current generation may commit in Stable and in PreparingRebalance, where it still
        owns its partitions until it rejoins (an eager member commits what it revokes);
        CompletingRebalance answers REBALANCE_IN_PROGRESS.) The caller holds ``cond`` over
        the check and the write, so no rebalance completes between them."""
        with self.cond:
            self._check_alive()
            self._check_fenced(member_id, group_instance_id)
            if generation < 0 and not member_id:
                if self.members:
                    raise UnknownMemberIdError(
                        f"group {self.group_id!r} has active members; only they may commit its offsets"
                    )
                return
            self._member(member_id)
            self._check_generation(generation)
            if self.state == GroupState.COMPLETING_REBALANCE:
                raise RebalanceInProgressError(f"group {self.group_id!r} is rebalancing")
            self.members[member_id].last_heartbeat = time.monotonic()

    def check_txn_commit(self, member_id: str, generation: int, group_instance_id: str | None = None) -> None:
        """May a transactional producer commit this group's offsets for this member
        (KIP-447's TxnOffsetCommit; Kafka's doTxnCommitOffsets)? A request naming a
        member must name a current one, of the current generation, not a fenced static
        instance; one naming none (a producer given only the group id) may commit."""
        with self.cond:
            self._check_alive()
            if group_instance_id:
                self._check_fenced(member_id, group_instance_id)
            if member_id:
                self._member(member_id)
            if generation >= 0:
                self._check_generation(generation)

    def next_expiry(self) -> float | None:
        """When the next member's session or pending member id runs out (monotonic), if any."""
        with self.cond:
            if self.state == GroupState.DEAD:
                return None
            times = [m.last_heartbeat + m.session_timeout_ms / 1000.0 for m in self.members.values() if m.in_call == 0]
            times += list(self.pending.values())
            return min(times, default=None)

    def expire(self, now: float) -> list[str]:
        """Drop members whose session timed out; returns their ids."""
        with self.cond:
            if self.state == GroupState.DEAD:
                return []
            dead = [
                mid
                for mid, m in self.members.items()
                if m.in_call == 0 and now - m.last_heartbeat > m.session_timeout_ms / 1000.0
            ]
            for mid in dead:
                self._remove(mid)
            lapsed = [mid for mid, deadline in self.pending.items() if now > deadline]
            for mid in lapsed:
                del self.pending[mid]
            if lapsed:
                self._changed()
            self._maybe_complete_join(now)
            return dead

    def kill(self) -> None:
        """This broker no longer coordinates the group: fail every waiting call."""
        with self.cond:
            self.state = GroupState.DEAD
            self._changed()

    def subscribed_topics(self) -> set[str]:
        """The topics the members subscribe to (the consumer protocol's subscriptions in
        every protocol each member offers; empty for another protocol type)."""
        with self.cond:
            if self.protocol_type not in ("", "consumer"):
                return set()
            topics: set[str] = set()
            for m in self.members.values():
                for _, metadata in m.protocols:
                    try:
                        topics.update(group_pb2.ConsumerSubscription.FromString(metadata).topics)
                    except DecodeError:
                        continue
            return topics

    def describe(self) -> tuple[GroupState, list[Member]]:
        with self.cond:
            return self.state, list(self.members.values())
