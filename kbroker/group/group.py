"""One consumer group's membership state machine (Kafka's classic, eager protocol).

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
    IllegalGenerationError,
    InconsistentGroupProtocolError,
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

    def metadata_for(self, protocol: str) -> bytes:
        return next((m for n, m in self.protocols if n == protocol), b"")


@dataclass
class JoinResult:
    generation: int
    protocol: str
    leader_id: str
    member_id: str
    members: list[tuple[str, bytes]]


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
    ) -> None:
        self.group_id = group_id
        self.generation = generation
        self.state = GroupState.EMPTY
        self.protocol_type = ""
        self.protocol = ""
        self.leader_id = ""
        self.members: dict[str, Member] = {}
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
            raise UnknownMemberIdError(f"member {member_id!r} is not in group {self.group_id!r}")
        return m

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
        members = list(self.members.values())
        common = set(n for n, _ in members[0].protocols)
        for m in members[1:]:
            common &= {n for n, _ in m.protocols}
        # The protocol with the best total preference rank over all members.
        return min(common, key=lambda name: sum([n for n, _ in m.protocols].index(name) for m in members))

    def _complete_join(self) -> None:
        laggards = [mid for mid, m in self.members.items() if m.joined_round != self._round]
        for mid in laggards:
            del self.members[mid]
        self.generation += 1
        if not self.members:
            self.state = GroupState.EMPTY
            self.protocol = ""
            self.leader_id = ""
        else:
            self.protocol = self._choose_protocol()
            if self.leader_id not in self.members:
                self.leader_id = next(iter(self.members))
            self.state = GroupState.COMPLETING_REBALANCE
            for m in self.members.values():
                m.assignment = b""
                m.last_heartbeat = time.monotonic()
        self._on_change(self)
        self._changed()

    def _maybe_complete_join(self, now: float) -> None:
        if self.state != GroupState.PREPARING_REBALANCE:
            return
        everyone = all(m.joined_round == self._round for m in self.members.values())
        if now >= self._deadline or (everyone and not self._initial):
            self._complete_join()

    # --- the protocol --------------------------------------------------------------

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
    ) -> tuple[str, int]:
        """Register a JoinGroup call; returns (member id, join round) for ``join_poll``.
        The member counts as alive until ``call_done``."""
        with self.cond:
            self._check_alive()
            if not protocols:
                raise InconsistentGroupProtocolError("a member must offer at least one protocol")
            if self.members:
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
            if member_id and member_id not in self.members:
                raise UnknownMemberIdError(f"member {member_id!r} is not in group {self.group_id!r}")
            now = time.monotonic()
            if not member_id:
                member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
                self.members[member_id] = Member(
                    member_id,
                    client_id,
                    client_host,
                    session_timeout_ms,
                    rebalance_timeout_ms,
                    protocol_type,
                    protocols,
                )
                if self.state == GroupState.PREPARING_REBALANCE and self._initial:
                    # InitialDelayedJoin: every newcomer buys the others a little more time.
                    self._deadline = min(now + self._initial_delay_s, self._first_join + self._max_rebalance_s())
            m = self.members[member_id]
            m.protocols = protocols
            m.session_timeout_ms = session_timeout_ms
            m.rebalance_timeout_ms = rebalance_timeout_ms
            m.last_heartbeat = now
            self.protocol_type = protocol_type
            if self.state != GroupState.PREPARING_REBALANCE:
                self._first_join = now
                self._start_rebalance(now)
            m.joined_round = self._round
            m.in_call += 1
            self._maybe_complete_join(now)
            return member_id, self._round

    def join_poll(self, member_id: str, my_round: int) -> tuple[JoinResult | None, float]:
        """The JoinGroup answer once the round is over, else (None, seconds until the
        round's deadline — poll again then, or when ``version`` changes)."""
        with self.cond:
            self._check_alive()
            now = time.monotonic()
            if self._round == my_round and self.state == GroupState.PREPARING_REBALANCE:
                self._maybe_complete_join(now)
            if self._round == my_round and self.state == GroupState.PREPARING_REBALANCE:
                return None, max(min(self._deadline - now, 1.0), 0.01)
            if member_id not in self.members:
                raise UnknownMemberIdError(f"member {member_id!r} was removed from group {self.group_id!r}")
            members = (
                [(mid, mm.metadata_for(self.protocol)) for mid, mm in self.members.items()]
                if member_id == self.leader_id
                else []
            )
            return JoinResult(self.generation, self.protocol, self.leader_id, member_id, members), 0.0

    def call_done(self, member_id: str) -> None:
        """A JoinGroup/SyncGroup call ended (answered, failed or abandoned)."""
        with self.cond:
            m = self.members.get(member_id)
            if m is not None and m.in_call > 0:
                m.in_call -= 1
                m.last_heartbeat = time.monotonic()

    def sync_begin(self, member_id: str, generation: int, assignments: dict[str, bytes]) -> None:
        """Register a SyncGroup call (the leader's carries the assignment)."""
        with self.cond:
            self._check_alive()
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
                return None
            if member_id not in self.members:
                raise UnknownMemberIdError(f"member {member_id!r} was removed from group {self.group_id!r}")
            if self.generation != generation or self.state != GroupState.STABLE:
                raise RebalanceInProgressError(f"group {self.group_id!r} is rebalancing; join again")
            return self.members[member_id].assignment

    def sync_timed_out(self) -> RebalanceInProgressError:
        return RebalanceInProgressError(f"the leader of {self.group_id!r} did not send an assignment")

    def heartbeat(self, member_id: str, generation: int) -> None:
        with self.cond:
            self._check_alive()
            m = self._member(member_id)
            self._check_generation(generation)
            m.last_heartbeat = time.monotonic()
            if self.state == GroupState.PREPARING_REBALANCE:
                raise RebalanceInProgressError(f"group {self.group_id!r} is rebalancing; join again")

    def leave(self, member_id: str) -> None:
        with self.cond:
            self._check_alive()
            self._member(member_id)
            self._remove(member_id)

    def _remove(self, member_id: str) -> None:
        del self.members[member_id]
        if not self.members and self.state != GroupState.PREPARING_REBALANCE:
            self.state = GroupState.EMPTY
            self.generation += 1
            self.leader_id = ""
            self.protocol = ""
            self._on_change(self)
        else:
            self._start_rebalance(time.monotonic())
            self._maybe_complete_join(time.monotonic())
        self._changed()

    def check_commit(self, member_id: str, generation: int) -> None:
        """May this member commit offsets now?"""
        with self.cond:
            self._check_alive()
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
