"""Fetch sessions (Kafka's KIP-227), the broker side: an idle fetch names no partition.

A client (a follower broker or a consumer) opens a session with a full fetch (session
id 0, epoch 0); the leader keeps the session's partitions (:class:`CachedPartition`:
what the client asked for and what the last answer told it) in a
:class:`FetchSessionCache` and answers with the session id. The client's following
fetches are incremental: they name only the partitions whose fetch offset, max bytes,
leader epoch or log start offset changed, plus those to forget, and the answer names
only the partitions with new records, a changed high watermark or log start offset, or
an error.

Beyond Kafka (whose leader still reads every session partition at every fetch), an
incremental fetch with nothing new costs the leader no per-partition work either: each
session keeps the set of its partitions that may have something to return (its *dirty*
set). The purgatory tells the cache of every progressed key (an append, a high-watermark
or log-start move, a leadership or role change: :meth:`FetchSessionCache.on_progress`),
which marks that partition in the sessions holding it and wakes their parked fetch; a
fetch reads its dirty partitions only, and keeps a partition dirty while its last read
returned records or it is not caught up (a throttled or size-limited read). See
``ReplicaManager.fetch_session_async`` for the reads.

Session ids are random positive 31-bit ints, unique on this broker; epochs go 1, 2, ...
(after 2**31 - 1: 1 again). The cache holds at most
``max.incremental.fetch.session.cache.slots`` sessions; a new session may evict one that
has not been used for ``min.incremental.fetch.session.eviction.ms``, or else, as in
Kafka, a smaller session that is older than that, and a follower's (privileged) session
any smaller consumer session.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kclient.errors import BrokerResponseError, FetchSessionIdNotFoundError, InvalidFetchSessionEpochError

if TYPE_CHECKING:
    from kbroker.purgatory import Purgatory

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


@dataclass
class FetchSpec:
    """What a Fetch asks of one partition."""

    topic: str
    partition: int
    offset: int
    max_bytes: int
    current_leader_epoch: int = -1
    log_start_offset: int = -1
    """A follower's own log start offset (-1: not reported)."""


INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
"""A full fetch that asks for a new session."""
FINAL_EPOCH = -1
"""A full fetch without a session (closing the one named, if any)."""
MAX_EPOCH = 2**31 - 1

MAX_INCREMENTAL_FETCH_SESSION_CACHE_SLOTS = 1000
"""Kafka's ``max.incremental.fetch.session.cache.slots`` default."""
MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS = 120000
"""Kafka's ``min.incremental.fetch.session.eviction.ms`` default."""


def next_epoch(epoch: int) -> int:
    """The epoch that follows ``epoch`` (Kafka's FetchMetadata.nextEpoch)."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch >= MAX_EPOCH else epoch + 1


def _now_ms() -> float:
    return time.monotonic() * 1000.0


@dataclass(frozen=True, slots=True)
class SessionKey:
    """The purgatory key a session's parked fetch waits under (never a partition's)."""

    session_id: int


@dataclass(slots=True, eq=False)
class CachedPartition:
    """One partition of a session: what the client last asked (``spec``) and what the
    last answer that named it told the client (``high_watermark``, ``log_start_offset``,
    ``last_stable_offset``: the leader's; -1 before the first answer)."""

    spec: FetchSpec
    high_watermark: int = -1
    log_start_offset: int = -1
    last_stable_offset: int = -1

    @property
    def key(self) -> TopicPartition:
        return (self.spec.topic, self.spec.partition)


class FetchSession:
    """One client's fetch session.

    Invariants: ``partitions`` holds each topic-partition once; ``dirty`` is a subset of
    its keys (in marking order, oldest first); ``epoch`` is the epoch the next
    incremental fetch must carry. ``topics`` counts the session's partitions per topic.

    Thread safety: ``partitions``, ``topics`` and ``epoch`` change only through the
    cache (under its lock, then this session's); the dirty set is guarded by this
    session's lock and may be marked from any thread. The cached answer values of a
    partition are written by the (one) fetch being served in the session.
    """

    def __init__(self, session_id: int, privileged: bool, replica_id: int, now_ms: float) -> None:
        self.id = session_id
        self.privileged = privileged
        """A follower's session (Kafka's privileged sessions): it may evict consumer sessions."""
        self.replica_id = replica_id
        self.partitions: dict[TopicPartition, CachedPartition] = {}
        self.topics: Counter[str] = Counter()
        self.epoch = next_epoch(INITIAL_EPOCH)
        self.creation_ms = now_ms
        self.last_used_ms = now_ms
        self.last_refresh_ms = now_ms
        """When every partition was last marked dirty, and a follower's position of each
        recorded (see ``ReplicaManager.fetch_session_async``)."""
        self.positions_ms = now_ms
        """When a follower's position of every partition was last recorded."""
        self.waiter_key = SessionKey(session_id)
        """The purgatory key a parked fetch of this session waits under."""
        self._lock = threading.Lock()
        self._dirty: dict[TopicPartition, None] = {}

    def __repr__(self) -> str:
        return f"FetchSession(id={self.id}, epoch={self.epoch}, partitions={len(self.partitions)})"

    @property
    def size(self) -> int:
        return len(self.partitions)

    # --- the dirty set ---------------------------------------------------------------

    def mark(self, tp: TopicPartition) -> None:
        with self._lock:
            if tp in self.partitions:
                self._dirty[tp] = None

    def mark_all(self) -> None:
        with self._lock:
            self._dirty = dict.fromkeys(self.partitions)

    def take_dirty(self) -> list[CachedPartition]:
        """The dirty partitions (oldest mark first), clearing the set: a partition marked
        while they are read is marked again."""
        with self._lock:
            dirty, self._dirty = self._dirty, {}
            return [cp for tp in dirty if (cp := self.partitions.get(tp)) is not None]

    def peek_dirty(self) -> list[CachedPartition]:
        with self._lock:
            return [cp for tp in self._dirty if (cp := self.partitions.get(tp)) is not None]

    def keep_dirty(self, partitions: Iterable[CachedPartition]) -> None:
        """Mark ``partitions`` again (after those marked meanwhile: a round robin)."""
        with self._lock:
            for cp in partitions:
                if self.partitions.get(cp.key) is cp:
                    self._dirty[cp.key] = None

    def cached(self) -> list[CachedPartition]:
        """Every partition of the session, in order."""
        with self._lock:
            return list(self.partitions.values())

    def topic_names(self) -> list[str]:
        with self._lock:
            return list(self.topics)

    def dirty_count(self) -> int:
        with self._lock:
            return len(self._dirty)

    # --- changes (through the cache) -------------------------------------------------

    def _update(
        self, specs: Iterable[FetchSpec], forgotten: Iterable[TopicPartition]
    ) -> tuple[list[FetchSpec], list[TopicPartition], list[TopicPartition]]:
        """Add or change ``specs``, then drop ``forgotten``; returns (the added or changed
        specs, the added keys, the removed keys). Changed and added partitions are dirty."""
        changed: list[FetchSpec] = []
        added: list[TopicPartition] = []
        removed: list[TopicPartition] = []
        with self._lock:
            for spec in specs:
                tp = (spec.topic, spec.partition)
                cp = self.partitions.get(tp)
                if cp is None:
                    self.partitions[tp] = CachedPartition(spec)
                    self.topics[spec.topic] += 1
                    added.append(tp)
                elif cp.spec != spec:
                    cp.spec = spec
                else:
                    continue
                changed.append(spec)
                self._dirty[tp] = None
            for tp in forgotten:
                if self.partitions.pop(tp, None) is not None:
                    self._dirty.pop(tp, None)
                    self.topics[tp[0]] -= 1
                    if not self.topics[tp[0]]:
                        del self.topics[tp[0]]
                    removed.append(tp)
        return changed, added, removed


@dataclass
class FetchContext:
    """How to serve one Fetch (Kafka's FetchContext kinds):

    * ``error`` set: answer it as the top-level error, nothing else;
    * ``session`` set: a session fetch; ``full`` says whether the answer names every
      partition (the session's first fetch) or only what changed; ``changed`` are the
      specs the request added or changed (their follower positions must be recorded);
    * neither: a sessionless fetch of ``specs``.
    """

    specs: list[FetchSpec] = field(default_factory=list)
    session: FetchSession | None = None
    full: bool = False
    changed: list[FetchSpec] = field(default_factory=list)
    error: BrokerResponseError | None = None


class FetchSessionCache:
    """The fetch sessions of this broker, by id, and by partition (to mark them).

    Invariants: at most ``max_slots`` sessions; ``_by_partition[tp]`` holds exactly the
    sessions whose ``partitions`` hold ``tp``.

    Thread safety: every method may be called from any thread; the cache's lock is taken
    before a session's, never the other way round. :meth:`on_progress` (a purgatory
    listener) holds neither while it wakes parked fetches.
    """

    def __init__(
        self,
        max_slots: int = MAX_INCREMENTAL_FETCH_SESSION_CACHE_SLOTS,
        eviction_ms: int = MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS,
        *,
        clock: Callable[[], float] = _now_ms,
    ) -> None:
        self._lock = threading.Lock()
        self._max_slots = max_slots
        self._eviction_ms = eviction_ms
        self._clock = clock
        self._sessions: dict[int, FetchSession] = {}
        self._by_partition: dict[TopicPartition, set[FetchSession]] = {}
        self._purgatory: Purgatory | None = None
        self.evictions = 0

    def configure(self, max_slots: int, eviction_ms: int) -> None:
        """``max.incremental.fetch.session.cache.slots`` (0: no sessions) and
        ``min.incremental.fetch.session.eviction.ms``; existing sessions stay."""
        with self._lock:
            self._max_slots = max_slots
            self._eviction_ms = eviction_ms

    def attach(self, purgatory: Purgatory) -> None:
        """Hear of every progressed key of ``purgatory``, and wake parked fetches there."""
        self._purgatory = purgatory
        purgatory.add_listener(self.on_progress)

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def total_partitions(self) -> int:
        with self._lock:
            return sum(s.size for s in self._sessions.values())

    def get(self, session_id: int) -> FetchSession | None:
        with self._lock:
            return self._sessions.get(session_id)

    # --- the purgatory listener --------------------------------------------------------

    def on_progress(self, key: Hashable) -> None:
        """``key`` progressed: if it is a partition, mark it in every session holding it
        and wake their parked fetches (which then look at their dirty partitions only)."""
        with self._lock:
            holders = self._by_partition.get(key)  # type: ignore[call-overload]
            if not holders:
                return
            sessions = list(holders)
        for s in sessions:
            s.mark(key)  # type: ignore[arg-type]
        purgatory = self._purgatory
        if purgatory is not None:
            for s in sessions:
                purgatory.progress(s.waiter_key)

    # --- contexts ----------------------------------------------------------------------

    def new_context(
        self,
        session_id: int,
        epoch: int,
        specs: list[FetchSpec],
        forgotten: list[TopicPartition],
        replica_id: int,
    ) -> FetchContext:
        """Kafka's FetchManager.newContext: see :class:`FetchContext`."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self.remove(session_id)
            if epoch == FINAL_EPOCH:
                return FetchContext(specs)
            session = self._create(replica_id >= 0, replica_id, specs)
            if session is None:
                return FetchContext(specs)
            return FetchContext(specs, session, full=True, changed=specs)
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return FetchContext(error=FetchSessionIdNotFoundError(f"fetch session {session_id} not found"))
            if session.epoch != epoch or session.replica_id != replica_id:
                return FetchContext(
                    error=InvalidFetchSessionEpochError(
                        f"fetch session {session_id}: expected epoch {session.epoch}, got {epoch}"
                        if session.epoch != epoch
                        else f"fetch session {session_id} belongs to another replica id"
                    )
                )
            changed, added, removed = session._update(specs, forgotten)
            self._index(session, added, removed)
            if not session.partitions:
                self._remove_locked(session)
                return FetchContext(specs)
            session.epoch = next_epoch(session.epoch)
            session.last_used_ms = self._clock()
        return FetchContext(specs, session, full=False, changed=changed)

    def _create(self, privileged: bool, replica_id: int, specs: list[FetchSpec]) -> FetchSession | None:
        now = self._clock()
        with self._lock:
            if len(self._sessions) >= self._max_slots and not self._evict_one(privileged, len(specs), now):
                return None
            session_id = 0
            while session_id == INVALID_SESSION_ID or session_id in self._sessions:
                session_id = random.randint(1, MAX_EPOCH)
            session = FetchSession(session_id, privileged, replica_id, now)
            _, added, _ = session._update(specs, ())
            self._sessions[session_id] = session
            self._index(session, added, [])
        log.debug("created %r for replica %d", session, replica_id)
        return session

    def _evict_one(self, privileged: bool, size: int, now: float) -> bool:
        """Kafka's tryEvict: the least recently used session if idle for the eviction
        time; else the least valuable evictable one (unprivileged before privileged, then
        smaller, then older id) if the new session is worth at least as much."""
        if self._max_slots <= 0 or not self._sessions:
            return False
        lru = min(self._sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now - lru.last_used_ms > self._eviction_ms:
            self._remove_locked(lru)
            self.evictions += 1
            log.debug("evicted idle %r", lru)
            return True
        old = [s for s in self._sessions.values() if now - s.creation_ms > self._eviction_ms]
        if privileged:
            old += [s for s in self._sessions.values() if not s.privileged and now - s.creation_ms <= self._eviction_ms]
        if not old:
            return False
        victim = min(old, key=lambda s: (s.privileged, s.size, s.id))
        if (privileged, size) <= (victim.privileged, victim.size):
            return False
        self._remove_locked(victim)
        self.evictions += 1
        log.debug("evicted %r for a new %s session of %d partitions", victim, "follower" if privileged else "", size)
        return True

    def remove(self, session_id: int) -> FetchSession | None:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None:
                self._remove_locked(session)
            return session

    def _remove_locked(self, session: FetchSession) -> None:
        if self._sessions.pop(session.id, None) is None:
            return
        self._index(session, [], list(session.partitions))

    def _index(self, session: FetchSession, added: Iterable[TopicPartition], removed: Iterable[TopicPartition]) -> None:
        for tp in added:
            self._by_partition.setdefault(tp, set()).add(session)
        for tp in removed:
            holders = self._by_partition.get(tp)
            if holders is not None:
                holders.discard(session)
                if not holders:
                    del self._by_partition[tp]
