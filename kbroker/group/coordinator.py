"""The group coordinator: this broker's share of the consumer groups.

Each group has one coordinator among the live brokers, chosen by rendezvous hashing
(the broker with the highest ``murmur2(group, broker id)``): every broker computes the
same answer from its metadata, and when a broker dies only its own groups move. The
coordinator keeps group membership in memory (:class:`Group`) and mirrors it into
ZooKeeper (:class:`GroupStore`): member and owner znodes are ephemeral under the
coordinator's session, the generation and committed offsets are persistent, so a new
coordinator continues the generation sequence and every committed offset.

Committed-offset retention (Kafka's ``offsets.retention.minutes``, KIP-211), checked every
``offsets.retention.check.interval.ms`` by the ``group-offsets-expiry`` thread over the
groups this broker coordinates, as Kafka 2.8's ``GroupMetadata.removeExpiredOffsets``:

- an Empty group that has had members (a protocol type): every offset expires once the
  group has been Empty for the retention period (``Group.empty_since_ms``);
- a group with members of the consumer protocol: the offsets of topics no member
  subscribes to expire once their last commit is older than the retention period;
  those of subscribed topics never; members of another protocol: none;
- a group that never had members (offsets committed without a generation: a standalone
  consumer): each offset once its last commit is older than the retention period.

A commit's time is its znode's mtime. An Empty group left without offsets is deleted
(Kafka: Dead); one that had members only once it has been Empty for the retention
period (its offsets all expire then anyway), so that a group loaded here is never
deleted while its members reconnect. Kafka keeps a group's state timestamp with its members in
``__consumer_offsets``; kbroker keeps members in the coordinator's memory only, so a
coordinator that loads a group (at its start, or when the group moves to it) counts the
group's Empty time from then: a stable group whose members are reconnecting after a
coordinator change never loses its offsets. OffsetCommit v2-v4's ``retention_time`` is
not honoured (every offset has the broker's retention), as Kafka 2.1+ does from v5 on:
see docs/kafka-compatibility.md.

Thread safety: request threads call in concurrently; each group serialises itself; a
daemon thread (``group-reaper``) expires silent members and drops groups that moved;
another (``group-offsets-expiry``) expires committed offsets, holding each group's lock
over its check and delete, as commits do.
JoinGroup and SyncGroup have asynchronous forms (:meth:`join_async`,
:meth:`sync_async`) that park in ``waiters`` (keyed by group id) instead of holding a
thread; their blocking parts run through the caller's ``offload``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from kbroker.cluster.group_store import GroupStore
from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.zkdata import CommittedOffset
from kbroker.group.group import Group, GroupState, JoinResult, Member
from kbroker.group.lag import LeaderEndOffsets
from kbroker.purgatory import Purgatory
from kclient.errors import (
    BrokerResponseError,
    CoordinatorNotAvailableError,
    GroupIdNotFoundError,
    GroupSubscribedToTopicError,
    InvalidCommitOffsetSizeError,
    InvalidGroupIdError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
    NonEmptyGroupError,
    NotCoordinatorError,
    OffsetMetadataTooLargeError,
    UnknownTopicOrPartitionError,
    as_response_error,
)
from kclient.partitioner import murmur2
from kclient.proto.kbroker.v1 import group_pb2

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
T = TypeVar("T")
MAX_CLIENT_ID_LENGTH = 255
MAX_OFFSET_METADATA = 4096
"""Kafka's offset.metadata.max.bytes default (characters here)."""
"""Member ids are built from client ids and must fit ZooKeeper path limits."""
Offload = Callable[..., Awaitable[Any]]
"""Runs a blocking call off the event loop: ``await offload(fn, *args)``."""


def _commit_error(exists: bool, tp: TopicPartition, c: CommittedOffset) -> BrokerResponseError | None:
    if not exists:
        return UnknownTopicOrPartitionError(f"{tp[0]}-{tp[1]} does not exist")
    if c.offset < 0:
        return InvalidCommitOffsetSizeError(f"{tp[0]}-{tp[1]}: offset {c.offset} is negative")
    if len(c.metadata) > MAX_OFFSET_METADATA:
        return OffsetMetadataTooLargeError(f"metadata over {MAX_OFFSET_METADATA} characters")
    return None


def coordinator_for(group_id: str, brokers: list[int]) -> int:
    """Rendezvous hashing: the live broker with the highest score for this group."""
    if not brokers:
        return -1
    return max(brokers, key=lambda b: ((murmur2(f"{group_id}\x00{b}".encode()) & 0x7FFFFFFF), b))


class GroupCoordinator:
    def __init__(
        self,
        broker_id: int,
        store: GroupStore,
        metadata: MetadataCache,
        *,
        initial_rebalance_delay_ms: int = 3000,
        min_session_timeout_ms: int = 6000,
        max_session_timeout_ms: int = 1800000,
        inter_broker_channel: Callable[[str], Any] | None = None,
        offsets_retention_minutes: int = 10080,
        offsets_retention_check_interval_ms: int = 600000,
    ) -> None:
        self.broker_id = broker_id
        self._store = store
        self._metadata = metadata
        self._initial_delay_s = initial_rebalance_delay_ms / 1000.0
        self._min_session = min_session_timeout_ms
        self._max_session = max_session_timeout_ms
        self._lock = threading.Lock()
        self._groups: dict[str, Group] = {}
        self._committed: dict[str, dict[TopicPartition, int]] = {}
        """Committed offsets of the groups coordinated here (for kafka_consumergroup_lag):
        read from ZooKeeper once per group, then kept current by the commits through here."""
        self._end_offsets = LeaderEndOffsets(metadata, inter_broker_channel)
        self.waiters = Purgatory()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._reap, name="group-reaper", daemon=True)
        self.offsets_retention_ms = offsets_retention_minutes * 60_000
        self._check_interval_s = offsets_retention_check_interval_ms / 1000.0
        self._expiry = threading.Thread(target=self._expire_loop, name="group-offsets-expiry", daemon=True)

    @property
    def store(self) -> GroupStore:
        return self._store

    def start(self) -> None:
        self._thread.start()
        self._expiry.start()

    def shutdown(self) -> None:
        self._stopped.set()
        with self._lock:
            groups = list(self._groups.values())
            self._groups.clear()
        for g in groups:
            g.kill()
        self.waiters.close()
        self._end_offsets.close()

    # --- which groups are ours -----------------------------------------------------

    def coordinator_of(self, group_id: str) -> int:
        return coordinator_for(group_id, sorted(self._metadata.snapshot().brokers))

    def _group(self, group_id: str) -> Group:
        """The group if this broker coordinates it (loaded on first use: after a coordinator
        move the members of the old one are unknown here and get UNKNOWN_MEMBER_ID)."""
        if not group_id:
            raise InvalidGroupIdError("the group id is empty")
        owner = self.coordinator_of(group_id)
        if owner < 0:
            raise CoordinatorNotAvailableError("no live broker to coordinate groups")
        if owner != self.broker_id:
            raise NotCoordinatorError(
                f"broker {self.broker_id} is not the coordinator of {group_id!r} (broker {owner} is)"
            )
        with self._lock:
            g = self._groups.get(group_id)
            if g is None:
                g = Group(
                    group_id,
                    self._store.generation(group_id),
                    initial_delay_s=self._initial_delay_s,
                    on_change=self._persist,
                    on_wake=self._wake,
                )
                self._groups[group_id] = g
            return g

    def _wake(self, g: Group) -> None:
        self.waiters.progress(g.group_id)

    async def _park(self, g: Group, seen_version: int, timeout_s: float) -> None:
        """Wait (holding no thread) until the group changes after ``seen_version``."""
        w = self.waiters.watch([g.group_id], lambda: g.version != seen_version, asyncio.get_running_loop())
        try:
            await w.wait_async(timeout_s)
        finally:
            self.waiters.cancel(w)

    def _persist(self, g: Group) -> None:
        """Mirror a group's generation, members and owners into ZooKeeper."""
        try:
            self._store.set_generation(g.group_id, g.generation, g.protocol_type or "consumer")
            current = set(g.members)
            for mid in self._store.members(g.group_id):
                if mid not in current:
                    self._store.remove_member(g.group_id, mid)
            for m in g.members.values():
                self._store.add_member(
                    g.group_id,
                    m.member_id,
                    {"client_id": m.client_id, "host": m.client_host, "generation": g.generation}
                    | ({"group_instance_id": m.group_instance_id} if m.group_instance_id is not None else {}),
                )
            if g.state == GroupState.STABLE and g.protocol_type == "consumer":
                self._store.set_owners(g.group_id, owners_of(g.members.values()))
            else:
                self._store.clear_owners(g.group_id)
        except BrokerResponseError as exc:
            log.warning("group %s: cannot mirror state to ZooKeeper: %s", g.group_id, exc)
        except Exception:
            log.exception("group %s: cannot mirror state to ZooKeeper", g.group_id)

    def _reap(self) -> None:
        """Expire sessions on time: the thread wakes at the earliest session deadline (at most
        0.5 s apart, so groups that moved are noticed), as Kafka's heartbeat purgatory does."""
        wait = 0.5
        while not self._stopped.wait(wait):
            with self._lock:
                groups = list(self._groups.items())
            brokers = sorted(self._metadata.snapshot().brokers)
            for gid, g in groups:
                if coordinator_for(gid, brokers) != self.broker_id:
                    log.info("group %s moved to broker %d", gid, coordinator_for(gid, brokers))
                    g.kill()
                    with self._lock:
                        self._groups.pop(gid, None)
                    continue
                try:
                    for mid in g.expire(time.monotonic()):
                        log.info("group %s: member %s expired (no heartbeat)", gid, mid)
                except Exception:
                    log.exception("group %s: expiry failed", gid)
            deadlines = [d for _, g in groups if (d := g.next_expiry()) is not None]
            wait = min([0.5, *(d - time.monotonic() + 0.001 for d in deadlines)])
            wait = max(wait, 0.005)

    # --- protocol ------------------------------------------------------------------

    def _check_session_timeout(self, session_timeout_ms: int) -> None:
        if not self._min_session <= session_timeout_ms <= self._max_session:
            raise InvalidSessionTimeoutError(
                f"session timeout {session_timeout_ms} ms is outside the broker's range "
                f"[{self._min_session}, {self._max_session}]"
            )

    def join_begin(
        self,
        group_id: str,
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
    ) -> tuple[Group, str, int]:
        self._check_session_timeout(session_timeout_ms)
        if len(client_id) > MAX_CLIENT_ID_LENGTH:
            raise InvalidRequestError(f"client id of {len(client_id)} characters; at most {MAX_CLIENT_ID_LENGTH}")
        g = self._group(group_id)
        mid, my_round = g.join_begin(
            member_id,
            client_id=client_id,
            client_host=client_host,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms if rebalance_timeout_ms > 0 else session_timeout_ms,
            protocol_type=protocol_type,
            protocols=protocols,
            group_instance_id=group_instance_id,
            require_known_member_id=require_known_member_id,
        )
        return g, mid, my_round

    async def join_async(self, offload: Offload, group_id: str, member_id: str, **kwargs: Any) -> JoinResult:
        """JoinGroup as a long poll that holds no thread while the round is open."""
        g, mid, my_round = await offload(partial(self.join_begin, group_id, member_id, **kwargs))
        try:
            while True:
                seen = g.version
                result, wait_s = await offload(g.join_poll, mid, my_round)
                if result is not None:
                    return result  # type: ignore[no-any-return]
                await self._park(g, seen, wait_s)
        finally:
            g.call_done(mid)

    def _sync_timeout_s(self, g: Group, member_id: str) -> float:
        m = g.members.get(member_id)
        return (m.rebalance_timeout_ms if m else 30000) / 1000.0

    async def sync_async(
        self,
        offload: Offload,
        group_id: str,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes],
        group_instance_id: str | None = None,
    ) -> bytes:
        """SyncGroup as a long poll that holds no thread while the leader is assigning."""
        g = await offload(self._group, group_id)
        deadline = time.monotonic() + self._sync_timeout_s(g, member_id)
        await offload(g.sync_begin, member_id, generation, assignments, group_instance_id)
        try:
            while True:
                seen = g.version
                got = await offload(g.sync_poll, member_id, generation)
                if got is not None:
                    return got  # type: ignore[no-any-return]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise g.sync_timed_out()
                await self._park(g, seen, min(left, 1.0))
        finally:
            g.call_done(member_id)

    def heartbeat(self, group_id: str, member_id: str, generation: int, group_instance_id: str | None = None) -> None:
        self._group(group_id).heartbeat(member_id, generation, group_instance_id)

    def leave(self, group_id: str, member_id: str, group_instance_id: str | None = None) -> None:
        self._group(group_id).leave(member_id, group_instance_id)

    def commit(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        offsets: Mapping[TopicPartition, CommittedOffset],
        group_instance_id: str | None = None,
    ) -> None:
        """Check the member's right to commit and write the offsets, holding the group's
        lock over both: no rebalance completes in between, so an offset accepted for a
        generation lands before the next generation's owners are told their partitions
        (a revoked partition's offset never moves after its new owner fetched it)."""
        g = self._group(group_id)
        with g.cond:
            g.check_commit(member_id, generation, group_instance_id)
            self._store.commit(group_id, offsets)
        with self._lock:
            self._committed.setdefault(group_id, {}).update((tp, c.offset) for tp, c in offsets.items())

    def check_txn_commit(
        self, group_id: str, member_id: str, generation: int, group_instance_id: str | None = None
    ) -> None:
        """KIP-447: TxnOffsetCommit's member, generation and instance against the group
        (see :meth:`Group.check_txn_commit`); NOT_COORDINATOR on another broker."""
        self._group(group_id).check_txn_commit(member_id, generation, group_instance_id)

    def commit_transactional(self, group_id: str, offsets: Mapping[TopicPartition, CommittedOffset]) -> None:
        """Write the offsets a transaction committed (its coordinator completing it; the
        member was checked at TxnOffsetCommit): the transaction coordinator's OffsetSink."""
        self._store.commit(group_id, offsets)
        with self._lock:
            if group_id in self._committed:
                self._committed[group_id].update((tp, c.offset) for tp, c in offsets.items())

    def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        offsets: Sequence[tuple[TopicPartition, CommittedOffset]],
        group_instance_id: str | None = None,
        *,
        refused: Mapping[str, BrokerResponseError] | None = None,
    ) -> dict[TopicPartition, BrokerResponseError | None]:
        """OffsetCommit: per partition None (written) or why not. A partition of a topic in
        ``refused`` answers that error; one that does not exist
        UNKNOWN_TOPIC_OR_PARTITION, a negative offset INVALID_COMMIT_OFFSET_SIZE, metadata
        over :data:`MAX_OFFSET_METADATA` characters OFFSET_METADATA_TOO_LARGE. The rest are
        written together (:meth:`commit`), or all answer the member's refusal."""
        snap = self._metadata.snapshot()
        results: dict[TopicPartition, BrokerResponseError | None] = {}
        valid: dict[TopicPartition, CommittedOffset] = {}
        for tp, c in offsets:
            err = (refused or {}).get(tp[0]) or _commit_error(snap.has_partition(*tp), tp, c)
            results[tp] = err
            if err is None:
                valid[tp] = c
        if valid:
            try:
                self.commit(group_id, member_id, generation, valid, group_instance_id)
            except Exception as exc:
                failure = as_response_error(exc)
                results.update(dict.fromkeys(valid, failure))
        return results

    def committed_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        """Group -> partition -> committed offset, for every group this broker
        coordinates (every group in ZooKeeper that hashes here, whether or not a member
        committed through this broker since it started; a copy)."""
        brokers = sorted(self._metadata.snapshot().brokers)
        try:
            ours = [g for g in self._store.groups() if coordinator_for(g, brokers) == self.broker_id]
        except Exception:
            log.exception("lag: cannot list the groups in ZooKeeper")
            ours = []
        with self._lock:
            known = set(self._committed)
        for gid in ours:
            if gid in known:
                continue
            try:
                loaded = {tp: c.offset for tp, c in self._store.fetch(gid).items()}
            except Exception:
                log.exception("lag: cannot read the offsets of group %s", gid)
                continue
            with self._lock:
                mine = self._committed.setdefault(gid, {})
                for tp, offset in loaded.items():
                    mine.setdefault(tp, offset)  # a commit through here meanwhile is newer
        with self._lock:
            committed = {
                g: dict(o) for g, o in self._committed.items() if coordinator_for(g, brokers) == self.broker_id
            }
            for gone in [g for g in self._committed if coordinator_for(g, brokers) != self.broker_id]:
                del self._committed[gone]  # moved away: reloaded if it comes back
        return committed

    def end_offsets(self, partitions: Collection[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark of each partition, asked of its leader (the partitions whose
        leader answered), for the lag of partitions this broker does not lead."""
        return self._end_offsets(partitions)

    def describe(self, group_id: str) -> tuple[Group, GroupState, list[Member]]:
        g = self._group(group_id)
        state, members = g.describe()
        if state == GroupState.EMPTY and not members and not self._store.exists(group_id):
            state = GroupState.DEAD
        return g, state, members

    def delete(self, group_id: str) -> None:
        g = self._group(group_id)
        _, members = g.describe()
        if members:
            raise NonEmptyGroupError(f"group {group_id!r} has {len(members)} active member(s)")
        if not self._store.exists(group_id):
            raise GroupIdNotFoundError(f"group {group_id!r} does not exist")
        self._drop(g)

    def _drop(self, g: Group) -> None:
        """Remove an empty group from ZooKeeper and from here (it is Dead)."""
        self._store.delete_group(g.group_id)
        g.kill()
        with self._lock:
            self._groups.pop(g.group_id, None)
            self._committed.pop(g.group_id, None)

    def delete_offsets(
        self, group_id: str, partitions: Collection[TopicPartition]
    ) -> dict[TopicPartition, BrokerResponseError | None]:
        """OffsetDelete (Kafka's GroupCoordinator.handleDeleteOffsets): remove the group's
        committed offsets of ``partitions``; per partition None (deleted, or nothing was
        committed) or GroupSubscribedToTopicError while an active member subscribes to
        its topic.

        Raises for the whole group: NotCoordinatorError / InvalidGroupIdError;
        GroupIdNotFoundError when the group has neither members nor committed offsets;
        NonEmptyGroupError when it has members of another protocol type than "consumer".
        An empty group left without offsets is deleted (Kafka: it turns Dead).
        """
        g = self._group(group_id)
        with g.cond:  # no member joins (and subscribes) between the check and the delete
            if g.state == GroupState.DEAD:
                raise NotCoordinatorError(f"group {group_id!r} moved to another coordinator")
            members = bool(g.members)
            if not members and not (self._store.exists(group_id) and self._store.fetch(group_id)):
                raise GroupIdNotFoundError(f"group {group_id!r} does not exist")
            if members and g.protocol_type not in ("", "consumer"):
                raise NonEmptyGroupError(f"group {group_id!r} has active members of protocol type {g.protocol_type!r}")
            subscribed = g.subscribed_topics() if members else set()
            out: dict[TopicPartition, BrokerResponseError | None] = {
                tp: GroupSubscribedToTopicError(
                    f"group {group_id!r} is actively subscribed to topic {tp[0]!r}: "
                    + GroupSubscribedToTopicError.description
                )
                if tp[0] in subscribed
                else None
                for tp in partitions
            }
            doomed = [tp for tp, err in out.items() if err is None]
            if doomed:
                self._store.delete_offsets(group_id, doomed)
                with self._lock:
                    committed = self._committed.get(group_id, {})
                    for tp in doomed:
                        committed.pop(tp, None)
                log.info("group %s: deleted the committed offsets of %d partition(s)", group_id, len(doomed))
                if not g.members and not self._store.fetch(group_id):
                    log.info("group %s: empty and without offsets; removed", group_id)
                    self._drop(g)
            return out

    # --- committed-offset retention -------------------------------------------------------

    def _expire_loop(self) -> None:
        while not self._stopped.wait(self._check_interval_s):
            started = time.monotonic()
            try:
                removed = self.expire_offsets(time.time() * 1000.0)
            except Exception:
                log.exception("committed-offset expiry failed")
                continue
            if removed:
                log.info("removed %d expired offsets in %d milliseconds", removed, (time.monotonic() - started) * 1000)

    def expire_offsets(self, now_ms: float) -> int:
        """One retention check (see the module docstring) over every group in ZooKeeper
        this broker coordinates; the number of offsets deleted."""
        brokers = sorted(self._metadata.snapshot().brokers)
        removed = 0
        for gid in self._store.groups():
            if self._stopped.is_set():
                break
            if coordinator_for(gid, brokers) != self.broker_id:
                continue
            try:
                removed += self._expire_group(gid, now_ms)
            except (NotCoordinatorError, InvalidGroupIdError):
                continue  # moved meanwhile, or a znode no group id maps to
            except Exception:
                log.exception("group %s: committed-offset expiry failed", gid)
        return removed

    def _expire_group(self, gid: str, now_ms: float) -> int:
        g = self._group(gid)
        retention = self.offsets_retention_ms
        with g.cond:  # no commit and no join between the check and the delete
            if g.state == GroupState.DEAD:
                return 0
            offsets = self._store.offsets_with_times(gid)
            had_members = self._had_members(g)
            if g.members:
                if g.protocol_type not in ("", "consumer"):
                    return 0
                subscribed = g.subscribed_topics()
                expired = {
                    tp: o.version
                    for tp, o in offsets.items()
                    if tp[0] not in subscribed and now_ms - o.commit_time_ms >= retention
                }
            elif had_members:
                empty_long = now_ms - g.empty_since_ms >= retention
                expired = {tp: o.version for tp, o in offsets.items()} if empty_long else {}
            else:  # offsets only (a standalone consumer): each by its own commit time
                expired = {tp: o.version for tp, o in offsets.items() if now_ms - o.commit_time_ms >= retention}
            if expired and not self._store.expire_offsets(gid, expired):
                return 0  # committed again meanwhile: the next check looks again
            if expired:
                with self._lock:
                    committed = self._committed.get(gid, {})
                    for tp in expired:
                        committed.pop(tp, None)
                log.info("group %s: %d committed offset(s) expired (offsets.retention.minutes)", gid, len(expired))
            if (
                g.state == GroupState.EMPTY
                and not g.members
                and not g.pending
                and len(expired) == len(offsets)
                and (not had_members or now_ms - g.empty_since_ms >= retention)
            ):
                log.info("group %s: empty and without offsets; removed", gid)
                self._drop(g)
            return len(expired)

    def _had_members(self, g: Group) -> bool:
        """Whether the group has a protocol type (Kafka's test): it had members, here or
        under an earlier coordinator (a generation in ZooKeeper)."""
        if g.protocol_type:
            return True
        stored = self._store.stored_group(g.group_id)
        return stored is not None and stored.generation > 0

    def local_state(self, group_id: str) -> str:
        with self._lock:
            g = self._groups.get(group_id)
        if g is None:
            return "Empty" if self.coordinator_of(group_id) == self.broker_id else "Unknown"
        return g.describe()[0].value


def owners_of(members: object) -> dict[TopicPartition, str]:
    """Partition -> member from the members' consumer-protocol assignments."""
    out: dict[TopicPartition, str] = {}
    for m in members:  # type: ignore[attr-defined]
        if not m.assignment:
            continue
        a = group_pb2.ConsumerAssignment()
        try:
            a.ParseFromString(m.assignment)
        except Exception:
            continue
        for tps in a.partitions:
            for p in tps.partitions:
                out[(tps.topic, p)] = m.member_id
    return out
