"""The member side of a consumer group: ``ConsumerCoordinator``, one per consumer with a group_id.

Protocol (Kafka's classic, eager one): FindCoordinator on any broker -> JoinGroup on the
coordinator (blocks until every known member has rejoined; the leader gets everyone's
subscription) -> the leader runs the chosen assignor and sends the result in SyncGroup
(everyone gets its share) -> Heartbeat every ``heartbeat_interval_ms`` -> CommitOffsets /
FetchOffsets -> LeaveGroup. Eager: before every rejoin the member gives up all its
partitions (commits their positions when auto-commit is on, then calls
``on_partitions_revoked``); after SyncGroup it calls ``on_partitions_assigned``, and the
consumer positions the new partitions at their committed offsets (or by
``auto_offset_reset``).

What this object owns: the coordinator's address, the member id and generation, the
"rejoin needed" flag, the heartbeat thread and the snapshot of topic partition counts
the current assignment was made for (a change in the metadata, or a new topic matching a
pattern subscription, triggers a rejoin). Commits and committed offsets are
``self.offsets`` (kclient/consumer/offsets.py), which sees this object only as its
``GroupMember`` (coordinator address, generation, fencing).

Threads: joins, commits, listener calls and commit callbacks all run on the application
thread (from ``Consumer.poll``, ``commit*``, ``close``). JoinGroup and SyncGroup are sent
as gRPC futures and kept across calls (KIP-266): ``ensure_active_group(deadline)`` waits
for them only until ``deadline`` and the next ``poll`` picks them up, so one thread can
drive several members of one group with short polls. A daemon heartbeat thread sends
Heartbeat while the member is in a generation, flags a rejoin when the coordinator asks
for one, and sends LeaveGroup when the application has not called ``poll`` within
``max_poll_interval_ms`` (KIP-62: the next ``poll`` rejoins). One lock guards the shared
fields; no RPC is made while holding it.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import grpc

from kclient.assignors import (
    PROTOCOL_TYPE,
    AbstractPartitionAssignor,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    resolve_assignors,
)
from kclient.consumer.offsets import COORDINATOR_ERRORS, UNKNOWN_MEMBER, GroupOffsets
from kclient.errors import (
    CommitFailedError,
    IllegalGenerationError,
    IllegalStateError,
    InvalidConfigError,
    KafkaConnectionError,
    KafkaError,
    MemberIdRequiredError,
    RebalanceInProgressError,
    for_code,
    raise_for_code,
)
from kclient.proto.kbroker.v1 import group_pb2
from kclient.retry import retry
from kclient.structs import TopicPartition
from kclient.transport import map_rpc_error

if TYPE_CHECKING:
    from kclient.consumer.fetcher import Fetcher
    from kclient.consumer.subscription_state import SubscriptionState
    from kclient.metadata import ClusterMetadata
    from kclient.transport import Transport

log = logging.getLogger(__name__)

_MISSING_TOPIC_CHECK_S = 1.0


@dataclass
class _InFlight:
    """A JoinGroup or SyncGroup sent and not yet answered (or not yet looked at)."""

    method: str
    address: str
    future: Any
    started: float
    topics: set[str]
    join: group_pb2.JoinGroupResponse | None = None  # SyncGroup: the JoinGroup answer it follows


class MemberState(Enum):
    UNJOINED = "unjoined"  # no generation: joining is needed
    REBALANCING = "rebalancing"  # JoinGroup / SyncGroup in progress
    STABLE = "stable"  # in a generation, heartbeating


class ConsumerCoordinator:
    """Group membership, assignment and heartbeats for one consumer; its commits are ``offsets``."""

    def __init__(
        self,
        transport: Transport,
        metadata: ClusterMetadata,
        subscription: SubscriptionState,
        fetcher: Fetcher,
        config: Mapping[str, Any],
    ) -> None:
        self._transport = transport
        self._metadata = metadata
        self._subs = subscription
        self._fetcher = fetcher
        self.group_id: str = config["group_id"]
        if not isinstance(self.group_id, str) or not self.group_id:
            raise InvalidConfigError(f"group_id must be a non-empty string, got {self.group_id!r}")
        self._client_id: str = config["client_id"]
        self._session_timeout_ms = int(config["session_timeout_ms"])
        self._heartbeat_interval_s = config["heartbeat_interval_ms"] / 1000.0
        self._rebalance_timeout_ms = int(config["max_poll_interval_ms"])
        self._max_poll_interval_s = self._rebalance_timeout_ms / 1000.0
        self._retry_backoff_s = config["retry_backoff_ms"] / 1000.0
        self._metadata_max_age_s = config["metadata_max_age_ms"] / 1000.0
        self._request_timeout_s = transport.request_timeout_s
        if config["heartbeat_interval_ms"] <= 0 or config["heartbeat_interval_ms"] >= self._session_timeout_ms:
            raise InvalidConfigError(
                f"heartbeat_interval_ms ({config['heartbeat_interval_ms']}) must be positive and below "
                f"session_timeout_ms ({self._session_timeout_ms})"
            )
        if self._rebalance_timeout_ms <= 0:
            raise InvalidConfigError("max_poll_interval_ms must be positive")
        self.assignors: list[AbstractPartitionAssignor] = resolve_assignors(config["partition_assignment_strategy"])

        self._lock = threading.Condition()
        # --- guarded by _lock ---
        self._coordinator: str | None = None
        self.member_id = ""
        self.generation = -1
        self.protocol = ""
        self.leader_id = ""
        self.state = MemberState.UNJOINED
        self._rejoin_needed = True
        self._last_poll = time.monotonic()
        self._last_heartbeat_ok = time.monotonic()
        self._next_heartbeat = 0.0
        self._closing = False
        self._group_topics: set[str] = set()  # leader: every member's topics
        self._joined_counts: dict[str, int] = {}  # partition counts the assignment was made for
        # --- application thread only ---
        self._prepared = False  # partitions already revoked for the pending join
        self._owned: list[TopicPartition] = []
        self._owned_generation = -1
        self._next_metadata_check = time.monotonic() + self._metadata_max_age_s
        self._next_missing_check = 0.0
        self._heartbeat_thread: threading.Thread | None = None
        self._pending: _InFlight | None = None  # the JoinGroup or SyncGroup in flight
        self._next_join = 0.0  # no JoinGroup before this (retry_backoff_ms after a failed round)
        self.offsets = GroupOffsets(transport, metadata, subscription, self, config)

    # --- coordinator discovery -------------------------------------------------------

    def coordinator(self) -> str | None:
        with self._lock:
            return self._coordinator

    def mark_coordinator_dead(self, reason: object) -> None:
        with self._lock:
            if self._coordinator is not None:
                log.info(
                    "group %s: coordinator %s is gone (%s); looking it up again",
                    self.group_id,
                    self._coordinator,
                    reason,
                )
                self._coordinator = None

    def ensure_coordinator(self, deadline: float) -> str:
        """The coordinator's address, asking FindCoordinator until it answers or ``deadline``."""

        def find() -> str:
            addr = self.coordinator()
            if addr is not None:
                return addr
            timeout = max(min(self._request_timeout_s, deadline - time.monotonic()), 0.2)
            resp = self._transport.call_any(
                "FindCoordinator",
                group_pb2.FindCoordinatorRequest(group_id=self.group_id),
                self._metadata.broker_addresses(),
                timeout_s=timeout,
            )
            raise_for_code(resp.error_code, resp.error_message)
            addr = f"{resp.host}:{resp.port}"
            with self._lock:
                self._coordinator = addr
            log.debug("group %s: coordinator is broker %d at %s", self.group_id, resp.node_id, addr)
            return addr

        return retry(
            find,
            what=f"no coordinator found for group {self.group_id!r}",
            deadline=deadline,
            backoff_s=self._retry_backoff_s,
        )

    # --- the poll hook -------------------------------------------------------------

    def poll(self, deadline: float) -> None:
        """Called by ``Consumer.poll`` on every round: rejoin if needed, auto-commit."""
        self.offsets.invoke_completed_callbacks()
        now = time.monotonic()
        with self._lock:
            self._last_poll = now
        if self._subs.partitions_auto_assigned():
            self._check_metadata(now)
            if self.need_rejoin():
                self.ensure_active_group(deadline)
        self.offsets.maybe_auto_commit(time.monotonic())

    def need_rejoin(self) -> bool:
        if not self._subs.partitions_auto_assigned():
            return False
        with self._lock:
            return self._rejoin_needed or self.state != MemberState.STABLE

    def request_rejoin(self, reason: str) -> None:
        with self._lock:
            if not self._rejoin_needed:
                log.info("group %s: rejoining: %s", self.group_id, reason)
            self._rejoin_needed = True

    def _reset_generation_locked(self, keep_member_id: bool = False) -> None:
        self.generation = -1
        if not keep_member_id:
            self.member_id = ""
        self.state = MemberState.UNJOINED
        self._rejoin_needed = True
        self._lock.notify_all()

    # --- metadata watch --------------------------------------------------------------

    def _partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in topics:
            parts = self._metadata.partitions_for(t)
            if parts:
                out[t] = len(parts)
        return out

    def _matching_topics(self, pattern: re.Pattern[str]) -> set[str]:
        return {t for t in self._metadata.topics() if pattern.fullmatch(t)}

    def _check_metadata(self, now: float) -> None:
        """Rejoin when subscribed topics gain partitions or a new topic matches the pattern.

        Compares the cached metadata on every poll (no RPC); refreshes it every
        ``metadata_max_age_ms`` (the fetcher also refreshes it after errors).
        """
        pattern = self._subs.pattern
        known = self._metadata.topics()
        missing = pattern is None and not self._subs.subscription <= known
        if now >= self._next_metadata_check or (missing and now >= self._next_missing_check):
            # A subscribed topic that does not exist yet is looked for every second.
            self._next_metadata_check = now + self._metadata_max_age_s
            self._next_missing_check = now + _MISSING_TOPIC_CHECK_S
            try:
                self._metadata.refresh(all_topics=pattern is not None)
            except KafkaError as exc:
                log.debug("group %s: metadata refresh failed: %s", self.group_id, exc)
                return
        if pattern is not None and self._subs.change_subscription(self._matching_topics(pattern)):
            self.request_rejoin(f"the topics matching {pattern.pattern!r} changed to {sorted(self._subs.subscription)}")
        with self._lock:
            if self.state != MemberState.STABLE or self._rejoin_needed:
                return
            watched = set(self._joined_counts) | self._subs.subscription
            if self.leader_id and self.leader_id == self.member_id:
                watched |= self._group_topics
            joined = self._joined_counts
        counts = self._partition_counts(watched)
        if counts != joined:
            changed = sorted(t for t in watched if counts.get(t) != joined.get(t))
            self.request_rejoin(f"partition counts changed for {changed}")

    def _subscription_topics(self) -> set[str]:
        pattern = self._subs.pattern
        if pattern is not None:
            self._metadata.refresh(all_topics=True)
            self._subs.change_subscription(self._matching_topics(pattern))
        topics = set(self._subs.subscription)
        self._metadata.add_topics(topics)
        return topics

    # --- join / sync -----------------------------------------------------------------

    def ensure_active_group(self, deadline: float) -> bool:
        """Join (or rejoin) the group; ``True`` once in a stable generation.

        Returns ``False`` at ``deadline`` while a JoinGroup or SyncGroup is still waiting
        (it stays in flight and the next call continues it), or when the coordinator
        cannot be found or a retriable failure happened; the next ``poll`` continues.
        """
        while self.need_rejoin():
            with self._lock:
                if self._closing:
                    return False
            pending = self._pending
            if pending is not None:
                try:
                    resp = self._await(pending, deadline)
                except KafkaError as exc:
                    self._pending = None
                    if not self._join_failed(exc, deadline):
                        return False
                    continue
                if resp is None:
                    return False  # still waiting: the next poll looks again
                self._pending = None
                try:
                    if pending.method == "JoinGroup":
                        self._joined(pending, resp)
                    else:
                        self._synced(pending, resp)
                        return True
                except KafkaError as exc:
                    if not self._join_failed(exc, deadline):
                        return False
                continue
            now = time.monotonic()
            if now < self._next_join:
                if self._next_join >= deadline:
                    return False
                time.sleep(self._next_join - now)
            try:
                addr = self.ensure_coordinator(deadline)
            except KafkaError as exc:
                if not exc.retriable:
                    raise
                log.debug("group %s: %s", self.group_id, exc)
                return False
            if not self._prepared:
                self._on_join_prepare(deadline)
                self._prepared = True
            try:
                self._send_join(addr)
            except KafkaError as exc:
                if not self._join_failed(exc, deadline):
                    return False
        return True

    def _await(self, pending: _InFlight, deadline: float) -> Any:
        """The answer of ``pending``, waiting until ``deadline``; ``None`` if not there yet."""
        try:
            return pending.future.result(timeout=max(deadline - time.monotonic(), 0.0))
        except grpc.FutureTimeoutError:
            return None
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, pending.address) from exc
        except grpc.FutureCancelledError as exc:
            raise KafkaConnectionError(f"{pending.method} to {pending.address} was cancelled") from exc

    def _join_failed(self, exc: KafkaError, deadline: float) -> bool:
        """A join round failed: raise if fatal, else back off; ``True`` to go on now."""
        with self._lock:
            if self.state == MemberState.REBALANCING:
                self.state = MemberState.UNJOINED
        if not self._retry_join(exc):
            raise exc
        self._next_join = time.monotonic() + self._retry_backoff_s
        return self._next_join < deadline

    def _retry_join(self, exc: KafkaError) -> bool:
        """Adjust state after a failed join round; ``False`` when the error is fatal."""
        if isinstance(exc, UNKNOWN_MEMBER):
            with self._lock:
                self._reset_generation_locked()
        elif isinstance(exc, IllegalGenerationError | RebalanceInProgressError | MemberIdRequiredError):
            pass
        elif isinstance(exc, COORDINATOR_ERRORS):
            self.mark_coordinator_dead(exc)
        else:
            return False
        log.info("group %s: join failed (%s); retrying", self.group_id, exc)
        return True

    def _cancel_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.future.cancel()

    def _on_join_prepare(self, deadline: float) -> None:
        """Eager protocol: give up every partition before rejoining."""
        with self._lock:
            in_generation = self.generation >= 0 and bool(self.member_id)
        revoked = set(self._subs.partitions)
        if revoked and self.offsets.auto_commit and in_generation:
            try:
                timeout = min(self._request_timeout_s, max(deadline - time.monotonic(), 1.0))
                self.offsets.commit_sync(self._subs.all_consumed(), timeout)
            except KafkaError as exc:
                log.warning("group %s: commit before rebalance failed: %s", self.group_id, exc)
        if revoked:
            self._call_listener("on_partitions_revoked", revoked)
        self._subs.assign_from_subscribed([])
        self._fetcher.clear()

    def _send_join(self, addr: str) -> None:
        topics = self._subscription_topics()
        with self._lock:
            member_id = self.member_id
            self.state = MemberState.REBALANCING
        join = group_pb2.JoinGroupRequest(
            group_id=self.group_id,
            session_timeout_ms=self._session_timeout_ms,
            rebalance_timeout_ms=self._rebalance_timeout_ms,
            member_id=member_id,
            protocol_type=PROTOCOL_TYPE,
            client_id=self._client_id,
        )
        for a in self.assignors:
            sub = a.subscription(topics, self._owned, self._owned_generation)
            join.protocols.add(name=a.name, metadata=encode_subscription(sub))
        future = self._transport.stub(addr).JoinGroup.future(join, timeout=self._rebalance_timeout_ms / 1000.0 + 5.0)
        self._pending = _InFlight("JoinGroup", addr, future, time.monotonic(), topics)

    def _joined(self, pending: _InFlight, resp: group_pb2.JoinGroupResponse) -> None:
        """JoinGroup answered: the leader assigns; everyone sends SyncGroup."""
        if resp.error_code:
            err = for_code(resp.error_code)(resp.error_message)
            if isinstance(err, MemberIdRequiredError) and resp.member_id:
                with self._lock:
                    self.member_id = resp.member_id
            raise err
        with self._lock:
            self.member_id, self.generation = resp.member_id, resp.generation_id
            self.protocol, self.leader_id = resp.protocol_name, resp.leader_id
        sync = group_pb2.SyncGroupRequest(
            group_id=self.group_id, generation_id=resp.generation_id, member_id=resp.member_id
        )
        if resp.leader_id == resp.member_id:
            for mid, data in self._perform_assignment(resp.protocol_name, resp.members).items():
                sync.assignments.add(member_id=mid, assignment=data)
        future = self._transport.stub(pending.address).SyncGroup.future(
            sync, timeout=self._session_timeout_ms / 1000.0 + self._request_timeout_s
        )
        self._pending = _InFlight("SyncGroup", pending.address, future, pending.started, pending.topics, resp)

    def _synced(self, pending: _InFlight, sresp: group_pb2.SyncGroupResponse) -> None:
        if sresp.error_code:
            raise for_code(sresp.error_code)(sresp.error_message)
        resp = pending.join
        assert resp is not None
        leader = resp.leader_id == resp.member_id
        partitions = decode_assignment(sresp.assignment)
        log.info(
            "group %s: joined generation %d as %s%s in %.0f ms with %s (%s)",
            self.group_id,
            resp.generation_id,
            resp.member_id,
            " (leader)" if leader else "",
            (time.monotonic() - pending.started) * 1000,
            [f"{tp.topic}-{tp.partition}" for tp in partitions],
            resp.protocol_name,
        )
        self._on_join_complete(resp.generation_id, resp.protocol_name, leader, pending.topics, partitions)
        if self._subs.pattern is None and self._subs.subscription != pending.topics:
            self.request_rejoin(f"the subscription changed to {sorted(self._subs.subscription)} during the rebalance")

    def _assignor(self, name: str) -> AbstractPartitionAssignor:
        for a in self.assignors:
            if a.name == name:
                return a
        raise IllegalStateError(f"the coordinator chose assignor {name!r}, which this consumer does not offer")

    def _perform_assignment(self, protocol: str, members: Iterable[group_pb2.JoinGroupMember]) -> dict[str, bytes]:
        """Leader only: run the chosen assignor over every member's subscription."""
        assignor = self._assignor(protocol)
        subscriptions = {m.member_id: decode_subscription(m.metadata) for m in members}
        topics = {t for s in subscriptions.values() for t in s.topics}
        self._metadata.add_topics(topics)
        self._metadata.refresh()
        counts = self._partition_counts(topics)
        assignment = assignor.assign(counts, subscriptions)
        with self._lock:
            self._group_topics = topics
        log.debug("group %s: leader assigned %s", self.group_id, assignment)
        return {mid: encode_assignment(assignment.get(mid, [])) for mid in subscriptions}

    def _on_join_complete(
        self,
        generation: int,
        protocol: str,
        leader: bool,
        topics: set[str],
        partitions: list[TopicPartition],
    ) -> None:
        self._assignor(protocol).on_assignment(partitions, generation)
        watched = set(topics)
        if leader:
            watched |= self._group_topics
        else:
            try:  # see what the leader saw, so the metadata watch does not rejoin at once
                self._metadata.refresh()
            except KafkaError as exc:
                log.debug("group %s: metadata refresh failed: %s", self.group_id, exc)
        counts = self._partition_counts(watched)
        now = time.monotonic()
        with self._lock:
            self.state = MemberState.STABLE
            self._rejoin_needed = False
            self._last_heartbeat_ok = now
            self._next_heartbeat = now + self._heartbeat_interval_s
            self._last_poll = now
            self._joined_counts = counts
            self._lock.notify_all()
        self._prepared = False
        self._owned, self._owned_generation = list(partitions), generation
        self._subs.assign_from_subscribed(partitions)
        self._fetcher.clear()
        self.offsets.new_generation(now)
        self._start_heartbeat_thread()
        self._call_listener("on_partitions_assigned", set(partitions))

    def _call_listener(self, method: str, partitions: set[TopicPartition]) -> None:
        listener = self._subs.listener
        if listener is None:
            return
        try:
            getattr(listener, method)(partitions)
        except Exception:
            log.exception("group %s: %s.%s raised", self.group_id, type(listener).__name__, method)

    # --- heartbeats ------------------------------------------------------------------

    def _start_heartbeat_thread(self) -> None:
        if self._heartbeat_thread is None or not self._heartbeat_thread.is_alive():
            self._heartbeat_thread = threading.Thread(
                target=self._heartbeat_loop, name=f"kclient-heartbeat-{self.group_id}", daemon=True
            )
            self._heartbeat_thread.start()

    def _heartbeat_loop(self) -> None:
        try:
            while self._heartbeat_once():
                pass
        except Exception:  # never let the thread die silently
            log.exception("group %s: heartbeat thread failed", self.group_id)

    def _heartbeat_once(self) -> bool:
        """One turn of the heartbeat thread; ``False`` when the coordinator closes."""
        with self._lock:
            if self._closing:
                return False
            now = time.monotonic()
            if self.state != MemberState.STABLE or not self.member_id:
                self._lock.wait(self._heartbeat_interval_s)
                return True
            poll_deadline = self._last_poll + self._max_poll_interval_s
            if now > poll_deadline:
                member_id, addr = self.member_id, self._coordinator
                self._reset_generation_locked()
                left = True
            elif now < self._next_heartbeat:
                self._lock.wait(min(self._next_heartbeat, poll_deadline) - now + 0.001)
                return True
            else:
                left = False
                generation, member_id, addr = self.generation, self.member_id, self._coordinator
        if left:
            log.warning(
                "group %s: poll() was not called within max_poll_interval_ms (%d ms); leaving the group so its "
                "partitions go to other members. The next poll() rejoins; raise max_poll_interval_ms or lower "
                "max_poll_records if processing a batch takes this long.",
                self.group_id,
                self._rebalance_timeout_ms,
            )
            self._send_leave(addr, member_id)
            return True
        if addr is None:
            try:
                addr = self.ensure_coordinator(time.monotonic())
            except KafkaError as exc:
                log.debug("group %s: heartbeat: %s", self.group_id, exc)
                with self._lock:
                    self._next_heartbeat = time.monotonic() + self._retry_backoff_s
                return True
        req = group_pb2.HeartbeatRequest(group_id=self.group_id, generation_id=generation, member_id=member_id)
        err: KafkaError | None
        try:
            resp = self._transport.call(
                addr, "Heartbeat", req, timeout_s=min(self._request_timeout_s, self._session_timeout_ms / 1000.0)
            )
            err = for_code(resp.error_code)(resp.error_message) if resp.error_code else None
        except KafkaError as exc:
            err = exc
        with self._lock:
            if self._closing:
                return False
            if (self.generation, self.member_id) != (generation, member_id) or self.state != MemberState.STABLE:
                return True  # the answer is about a generation that is over
            now = time.monotonic()
            self._next_heartbeat = now + self._heartbeat_interval_s
            if err is None:
                self._last_heartbeat_ok = now
            elif isinstance(err, RebalanceInProgressError):
                self._last_heartbeat_ok = now
                if not self._rejoin_needed:
                    log.info("group %s: the group is rebalancing; rejoining on the next poll()", self.group_id)
                self._rejoin_needed = True
            elif isinstance(err, IllegalGenerationError):
                log.info("group %s: generation %d is over (%s); rejoining", self.group_id, generation, err)
                self._reset_generation_locked(keep_member_id=True)
            elif isinstance(err, UNKNOWN_MEMBER):
                log.info("group %s: member %s is not in the group (%s); rejoining", self.group_id, member_id, err)
                self._reset_generation_locked()
            else:
                self._next_heartbeat = now + self._retry_backoff_s
                if isinstance(err, COORDINATOR_ERRORS):
                    log.debug("group %s: heartbeat failed: %s", self.group_id, err)
                    self._coordinator = None
                else:
                    log.info("group %s: heartbeat failed: %s", self.group_id, err)
            if now - self._last_heartbeat_ok > self._session_timeout_ms / 1000.0 and self._coordinator is not None:
                log.info("group %s: no heartbeat answered within the session timeout", self.group_id)
                self._coordinator = None
        return True

    # --- leaving -----------------------------------------------------------------------

    def _send_leave(self, addr: str | None, member_id: str) -> None:
        if not member_id:
            return
        try:
            if addr is None:
                addr = self.ensure_coordinator(time.monotonic())
            resp = self._transport.call(
                addr,
                "LeaveGroup",
                group_pb2.LeaveGroupRequest(group_id=self.group_id, member_id=member_id),
                timeout_s=min(self._request_timeout_s, 5.0),
            )
            if resp.error_code:
                log.debug("group %s: LeaveGroup: %s", self.group_id, for_code(resp.error_code)(resp.error_message))
        except KafkaError as exc:
            log.debug("group %s: LeaveGroup failed: %s", self.group_id, exc)

    def maybe_leave_group(self, reason: str) -> None:
        """Leave the group now (the others rebalance at once) and forget the generation."""
        with self._lock:
            member_id, addr = self.member_id, self._coordinator
            self._reset_generation_locked()
        if member_id:
            log.info("group %s: member %s leaving: %s", self.group_id, member_id, reason)
            self._send_leave(addr, member_id)

    def leave(self, autocommit: bool, timeout_s: float | None = None) -> None:
        """Give up the assignment (commit, revoke) and leave the group: unsubscribe/close."""
        self._cancel_pending()
        if self._subs.partitions_auto_assigned():
            with self._lock:
                in_generation = self.generation >= 0 and bool(self.member_id)
            revoked = set(self._subs.partitions)
            if in_generation and autocommit and self.offsets.auto_commit and revoked:
                try:
                    self.offsets.commit_sync(self._subs.all_consumed(), timeout_s)
                except KafkaError as exc:
                    log.warning("group %s: commit on leave failed: %s", self.group_id, exc)
            if revoked:
                self._call_listener("on_partitions_revoked", revoked)
            self._subs.assign_from_subscribed([])
            self._fetcher.clear()
            self.maybe_leave_group("unsubscribed or closed")
            self._prepared = False
        elif autocommit and self.offsets.auto_commit and self._subs.partitions:
            try:
                self.offsets.commit_sync(self._subs.all_consumed(), timeout_s)
            except KafkaError as exc:
                log.warning("group %s: commit on close failed: %s", self.group_id, exc)

    def close(self, autocommit: bool = True, timeout_s: float | None = None) -> None:
        """Commit, leave and stop heartbeating, within about ``timeout_s`` (default: the request timeout)."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self._request_timeout_s)
        try:
            self.leave(autocommit, max(deadline - time.monotonic(), 0.1))
            self.offsets.wait_inflight(max(deadline - time.monotonic(), 0.0))
            self.offsets.invoke_completed_callbacks()
        finally:
            with self._lock:
                self._closing = True
                self._lock.notify_all()
            t = self._heartbeat_thread
            if t is not None and t is not threading.current_thread():
                t.join(timeout=max(deadline - time.monotonic(), 0.1))

    # --- what the offsets need (GroupMember) --------------------------------------------

    def commit_identity(self) -> tuple[int, str]:
        with self._lock:
            if not self._subs.partitions_auto_assigned():
                return -1, ""  # standalone: a consumer using assign()
            if self.generation < 0 or not self.member_id:
                raise CommitFailedError(
                    f"this consumer is not part of an active generation of group {self.group_id!r} "
                    "(it is joining, or it was removed from the group); it rejoins on its next poll() "
                    "and resumes from the last committed offsets"
                )
            return self.generation, self.member_id

    def fenced(self, err: KafkaError, generation: int) -> None:
        with self._lock:
            if self.generation == generation:
                if isinstance(err, UNKNOWN_MEMBER):
                    self._reset_generation_locked()
                elif isinstance(err, IllegalGenerationError):
                    self._reset_generation_locked(keep_member_id=True)
                else:
                    self._rejoin_needed = True

    def stable(self) -> bool:
        if not self._subs.partitions_auto_assigned():
            return True
        with self._lock:
            return self.state == MemberState.STABLE and not self._rejoin_needed
