"""Followers replicate by fetching from leaders, exactly as consumers do.

One :class:`ReplicaFetcher` thread per leader broker fetches, for every partition this
broker follows from that leader, with ``replica_id`` = this broker's id and the leader
epoch it believes current, and appends the returned batch bytes unchanged.

Before fetching a partition after a leader change, the follower truncates any
divergent tail (KIP-101/KIP-279): it asks the leader, with OffsetForLeaderEpoch, where
the follower's latest epoch ends in the leader's log, truncates to the smaller of that
and its own end of that epoch, and repeats until both agree.

The fetcher talks to its leader through a :class:`LeaderEndPoint` (Kafka's seam):
:class:`GrpcLeaderEndPoint` over the network, or any in-process implementation, so the
loop runs in a unit test against a leader in the same process.

Thread safety: ``ReplicaFetcherManager`` methods may be called from any thread; each
fetcher thread owns its partition table under its own lock, and its endpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from kbroker.log_setup import RateLimiter
from kbroker.purgatory import Purgatory
from kbroker.replication.partition import Partition
from kbroker.replication.quota import ReplicationQuota
from kclient.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    InvalidRecordError,
    KafkaError,
    NotLeaderForPartitionError,
    OffsetOutOfRangeError,
    UnknownLeaderEpochError,
    UnknownTopicOrPartitionError,
    for_code,
)
from kclient.fetch_session import FetchSessionHandler, PartitionData
from kclient.proto.kbroker.v1 import broker_pb2_grpc, log_pb2
from kclient.transport import CHANNEL_OPTIONS, map_rpc_error

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
MAX_TRUNCATION_ROUNDS = 10
ERROR_LOG_INTERVAL_S = 10.0
"""A fetcher logs its leader's connection errors at most once per this many seconds."""
FETCH_BACKOFF_S = 1.0
"""How long a partition whose fetched data could not be appended (a corrupt batch from the
leader, an unexpected error) waits before it is fetched again (Kafka's
replica.fetch.backoff.ms); the fetcher's other partitions are fetched meanwhile."""


@dataclass
class _FetchState:
    partition: Partition
    leader_epoch: int
    truncating: bool = True
    rounds: int = 0
    in_sync: bool = False
    """Caught up with the leader's high watermark at the last fetch (Kafka's
    isReplicaInSync): such a replica is never throttled."""
    delayed_until: float = 0.0
    """Not fetched before this ``time.monotonic()``: its last data could not be appended
    (Kafka's PartitionFetchState delay)."""


class LeaderEndPoint(Protocol):
    """Where a follower fetches from: the leader broker's Fetch and OffsetForLeaderEpoch.

    Calls raise kclient errors (KafkaConnectionError, KafkaTimeoutError, ...)."""

    address: str

    def fetch(self, request: log_pb2.FetchRequest, timeout_s: float) -> log_pb2.FetchResponse: ...

    def offset_for_leader_epoch(
        self, request: log_pb2.OffsetForLeaderEpochRequest, timeout_s: float
    ) -> log_pb2.OffsetForLeaderEpochResponse: ...

    def close(self) -> None: ...


REPLICA_FETCH_RESPONSE_MAX_BYTES = 10 * 1024 * 1024
"""Kafka's ``replica.fetch.response.max.bytes`` default: a follower's Fetch total (its
``max_bytes``); ``replica.fetch.max.bytes`` is the per-partition limit. The leader keeps
the answer within the total, except for the first batch (KIP-74)."""


def insecure_channel(address: str) -> grpc.Channel:
    """A plaintext channel to another broker (the default inter-broker channel)."""
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


class GrpcLeaderEndPoint:
    """A leader over gRPC. A call that times out replaces the channel: its TCP connection
    may be dead, and keepalive pings (``CHANNEL_OPTIONS``) notice a dead peer anyway."""

    def __init__(self, address: str, channel: Callable[[str], grpc.Channel] | None = None) -> None:
        self.address = address
        self._new_channel = channel or insecure_channel
        self._channel = self._new_channel(address)
        self._stub = broker_pb2_grpc.BrokerStub(self._channel)

    def fetch(self, request: log_pb2.FetchRequest, timeout_s: float) -> log_pb2.FetchResponse:
        return self._call(self._stub.Fetch, request, timeout_s)  # type: ignore[no-any-return]

    def offset_for_leader_epoch(
        self, request: log_pb2.OffsetForLeaderEpochRequest, timeout_s: float
    ) -> log_pb2.OffsetForLeaderEpochResponse:
        return self._call(self._stub.OffsetForLeaderEpoch, request, timeout_s)  # type: ignore[no-any-return]

    def _call(self, method: Callable[..., Any], request: object, timeout_s: float) -> Any:
        try:
            return method(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                old = self._channel
                self._channel = self._new_channel(self.address)
                self._stub = broker_pb2_grpc.BrokerStub(self._channel)
                old.close()
            raise map_rpc_error(exc, self.address) from exc

    def close(self) -> None:
        self._channel.close()


FETCH_TIMEOUT_MARGIN_S = 5.0
"""A replica fetch that takes this much longer than its long poll is given up (and the
connection replaced): keepalive pings notice a dead peer sooner still."""


class ReplicaFetcher(threading.Thread):
    """Fetches every partition this broker follows from one leader, in a fetch session
    (KIP-227) when the leader keeps one: a full fetch first, then incremental fetches
    that name only the partitions whose fetch offset, log start offset, leader epoch or
    max bytes changed since the last one, and those to forget (removed, truncating,
    delayed or throttled ones). An idle fetch names no partition, and a loop over it
    touches none: whatever may change a partition's fetch data marks it (``_touch``).
    A connection error or a session error starts again with a full fetch.

    Invariants: ``_truncating`` and ``_delayed`` hold (at least) the partitions whose
    state says truncating / delayed; ``_out_of_sync`` the partitions not known in sync.

    Thread safety: the partition table (and those sets) under ``_lock``; the session
    handler, truncation and fetching belong to the fetcher thread."""

    def __init__(
        self,
        broker_id: int,
        leader_id: int,
        leader: LeaderEndPoint,
        *,
        max_wait_ms: int,
        max_bytes: int,
        purgatory: Purgatory,
        quota: ReplicationQuota | None = None,
        error_log: RateLimiter | None = None,
        response_max_bytes: int = REPLICA_FETCH_RESPONSE_MAX_BYTES,
        sessions: bool = True,
    ) -> None:
        super().__init__(name=f"replica-fetcher-{leader_id}", daemon=True)
        self._error_log = error_log if error_log is not None else RateLimiter(ERROR_LOG_INTERVAL_S)
        """Rate limit of the connection-error warnings, keyed by (leader id, address)."""
        self._failing_since: float | None = None
        self._failures = 0
        self._quota = quota if quota is not None else ReplicationQuota("follower")
        self.broker_id = broker_id
        self.leader_id = leader_id
        self.leader = leader
        self._max_wait_ms = max_wait_ms
        self._max_bytes = max_bytes
        self._response_max_bytes = max(response_max_bytes, max_bytes)
        self._purgatory = purgatory
        self._lock = threading.Lock()
        self._partitions: dict[TopicPartition, _FetchState] = {}
        self._truncating: set[TopicPartition] = set()
        self._delayed: set[TopicPartition] = set()
        self._out_of_sync: set[TopicPartition] = set()
        self._touched: set[TopicPartition] = set()
        """Partitions whose fetch data may have changed, for the session (any thread)."""
        self.session = FetchSessionHandler(enabled=sessions)
        """The fetch session with the leader (the fetcher thread's)."""
        self._stopped = threading.Event()
        self._wake = threading.Event()

    # --- partition table -----------------------------------------------------------

    def add(self, partition: Partition, leader_epoch: int) -> None:
        tp = (partition.topic, partition.index)
        with self._lock:
            self._partitions[tp] = _FetchState(partition, leader_epoch)
            self._truncating.add(tp)
            self._out_of_sync.add(tp)
            self._touched.add(tp)
        self._wake.set()

    def remove(self, tp: TopicPartition) -> None:
        with self._lock:
            self._partitions.pop(tp, None)
            self._truncating.discard(tp)
            self._delayed.discard(tp)
            self._out_of_sync.discard(tp)
            self._touched.add(tp)  # forgotten at the next fetch

    def partitions(self) -> list[TopicPartition]:
        with self._lock:
            return list(self._partitions)

    def fetches(self, tp: TopicPartition, leader_epoch: int) -> bool:
        """Is ``tp`` fetched here in ``leader_epoch``?"""
        with self._lock:
            st = self._partitions.get(tp)
            return st is not None and st.leader_epoch == leader_epoch

    def stop(self) -> None:
        """Ask the thread to end, and close the connection: a fetch in flight ends now
        rather than after its long poll."""
        self._stopped.set()
        self._wake.set()
        self.leader.close()

    def shutdown(self) -> None:
        self.stop()
        self.join(timeout=5)

    def _touch(self, tp: TopicPartition) -> None:
        with self._lock:
            self._touched.add(tp)

    # --- loop ----------------------------------------------------------------------

    def run(self) -> None:
        backoff = 0.0
        while not self._stopped.is_set():
            if backoff:
                self._wake.wait(backoff)
                self._wake.clear()
            with self._lock:
                empty = not self._partitions
                truncating = [st for tp in self._truncating if (st := self._partitions.get(tp)) and st.truncating]
                self._truncating = {(st.partition.topic, st.partition.index) for st in truncating}
            if empty and not self.session.incremental:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                if truncating:
                    self._truncate(truncating)
                backoff = self._fetch()
                self._reached()
            except KafkaError as exc:
                if self._stopped.is_set():
                    break  # stop() closed the connection under the fetch
                self.session.reset()
                self._unreachable(exc)
                backoff = 0.5
            except Exception:
                if self._stopped.is_set():
                    break
                self.session.reset()
                log.exception("replica fetcher for leader %d", self.leader_id)
                backoff = 1.0

    def _unreachable(self, exc: KafkaError) -> None:
        """A call to the leader failed: WARNING, at most once per leader every 10 s."""
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        held_back = self._error_log.allow((self.leader_id, self.leader.address))
        if held_back is None:
            return
        more = f" ({held_back} more since the last report)" if held_back else ""
        log.warning(
            "replica fetcher: cannot reach leader %d at %s for %d partition(s): %s%s",
            self.leader_id,
            self.leader.address,
            len(self.partitions()),
            exc,
            more,
        )

    def _reached(self) -> None:
        """A call to the leader succeeded: INFO once if it had been failing."""
        if self._failing_since is None:
            return
        log.info(
            "replica fetcher: leader %d at %s reachable again after %d failed attempt(s) over %.1f s",
            self.leader_id,
            self.leader.address,
            self._failures,
            time.monotonic() - self._failing_since,
        )
        self._error_log.reset((self.leader_id, self.leader.address))
        self._failing_since = None
        self._failures = 0

    def _truncate(self, states: list[_FetchState]) -> None:
        req = log_pb2.OffsetForLeaderEpochRequest(replica_id=self.broker_id)
        for st in states:
            p = st.partition
            latest = p.log.leader_epoch_cache.latest_epoch
            t = req.topics.add(name=p.topic)
            t.partitions.add(index=p.index, current_leader_epoch=st.leader_epoch, leader_epoch=latest)
        resp = self.leader.offset_for_leader_epoch(req, 10.0)
        by_tp = {(t.name, r.index): r for t in resp.topics for r in t.partitions}
        for st in states:
            p = st.partition
            r = by_tp.get((p.topic, p.index))
            if r is None or not self._current(st):
                continue
            if r.error_code:
                self._partition_error(st, for_code(r.error_code)(r.error_message))
                continue
            st.rounds += 1
            try:
                self._truncation_round(st, r.leader_epoch, r.end_offset)
            except FencedLeaderEpochError:
                continue  # we are no longer this leader's follower; the watch moves us
            if not st.truncating:
                self._touch((p.topic, p.index))  # fetched from now on

    def _truncation_round(self, st: _FetchState, leader_epoch: int, leader_end: int) -> None:
        """One KIP-279 round: the leader's largest epoch <= ours ends at ``leader_end``."""
        p = st.partition
        own_leo = p.log.log_end_offset
        if leader_epoch < 0 or leader_end < 0:
            # The leader knows no epoch at or below ours: keep only what is committed.
            p.truncate_to(min(p.high_watermark, own_leo), st.leader_epoch)
            st.truncating = False
            return
        own_epoch, own_end = p.log.leader_epoch_cache.end_offset_for(leader_epoch, own_leo)
        if own_epoch == leader_epoch or own_epoch < 0 or st.rounds >= MAX_TRUNCATION_ROUNDS:
            # Same epoch on both sides (or nothing older here): cut where either ends.
            end = own_end if own_epoch == leader_epoch else own_leo
            p.truncate_to(min(leader_end, end, own_leo), st.leader_epoch)
            st.truncating = False
            return
        # We do not have the leader's epoch: drop our later epochs and ask again with
        # our (now older) latest epoch.
        p.truncate_to(min(own_end, own_leo), st.leader_epoch)

    def _current(self, st: _FetchState) -> bool:
        p = st.partition
        with self._lock:
            return self._partitions.get((p.topic, p.index)) is st

    def _throttled(self, st: _FetchState) -> bool:
        """Kafka's shouldFollowerThrottle: out of sync, listed, and the quota used up."""
        p = st.partition
        return not st.in_sync and self._quota.is_throttled(p.topic, p.index) and self._quota.is_exceeded()

    def _wanted(self, tp: TopicPartition, now: float) -> PartitionData | None:
        """What to ask of ``tp`` now; None while it is gone, truncating, delayed or throttled."""
        with self._lock:
            st = self._partitions.get(tp)
        if st is None or st.truncating or st.delayed_until > now or self._throttled(st):
            return None
        log_ = st.partition.log
        return PartitionData(log_.log_end_offset, log_.log_start_offset, st.leader_epoch, self._max_bytes)

    def _fetch(self, states: list[_FetchState] | None = None) -> float:
        """One Fetch (of ``states`` only, for a full one, when given); returns how long to
        wait before the next."""
        now = time.monotonic()
        with self._lock:
            due = [tp for tp in self._delayed if (st := self._partitions.get(tp)) is None or st.delayed_until <= now]
            self._delayed.difference_update(due)
            self._touched.update(due)
            if self._out_of_sync:
                self._touched.update(tp for tp in self._out_of_sync if self._quota.is_throttled(*tp))
            touched, self._touched = self._touched, set()
        for tp in touched:
            self.session.touch(tp)
        if states is not None:
            chosen = [(s.partition.topic, s.partition.index) for s in states]
            every: Callable[[], Iterable[TopicPartition]] = lambda: chosen  # noqa: E731
        else:
            every = self.partitions
        data = self.session.build(lambda tp: self._wanted(tp, now), every)
        if data.full and not data.to_send:
            # Nothing to fetch (all truncating, delayed or throttled).
            with self._lock:
                throttled = any(self._throttled(st) for tp in self._out_of_sync if (st := self._partitions.get(tp)))
            if throttled:
                return min(1.0, max(self._quota.time_until_within_s(), 0.05))
            return 0.2 if self.partitions() else 0.0
        req = log_pb2.FetchRequest(
            replica_id=self.broker_id,
            max_wait_ms=self._max_wait_ms,
            min_bytes=1,
            max_bytes=self._response_max_bytes,
            session_id=data.session_id,
            session_epoch=data.epoch,
        )
        topics: dict[str, log_pb2.FetchTopic] = {}
        for (topic, index), d in data.to_send.items():
            t = topics.get(topic)
            if t is None:
                t = topics[topic] = req.topics.add(name=topic)
            t.partitions.add(
                index=index,
                fetch_offset=d.fetch_offset,
                partition_max_bytes=d.max_bytes,
                current_leader_epoch=d.current_leader_epoch,
                log_start_offset=d.log_start_offset,
            )
        forgotten: dict[str, log_pb2.ForgottenTopic] = {}
        for topic, index in data.forgotten:
            f = forgotten.get(topic)
            if f is None:
                f = forgotten[topic] = req.forgotten_topics_data.add(name=topic)
            f.partitions.append(index)
        resp = self.leader.fetch(req, self._max_wait_ms / 1000.0 + FETCH_TIMEOUT_MARGIN_S)
        if not self.session.handle_response(data, resp.session_id, resp.error_code):
            log.info(
                "replica fetcher: leader %d ended fetch session %d (%s); starting a new one",
                self.leader_id,
                data.session_id,
                for_code(resp.error_code)(resp.error_message),
            )
            return 0.0
        progressed = False
        errors = 0
        throttled_bytes = 0
        for t in resp.topics:
            for r in t.partitions:
                tp = (t.name, r.index)
                with self._lock:
                    st = self._partitions.get(tp)
                    self._touched.add(tp)  # its log end / start may move, or it errs
                if st is None or st.truncating:
                    continue
                sent = self.session.sent(tp) or data.to_send.get(tp)
                fetch_offset = sent.fetch_offset if sent is not None else -1
                if r.error_code:
                    errors += 1
                    self._partition_error(st, for_code(r.error_code)(r.error_message), r, fetch_offset)
                    continue
                try:
                    st.partition.append_as_follower(r.records, r.high_watermark, st.leader_epoch, r.log_start_offset)
                    st.in_sync = st.partition.log.log_end_offset >= r.high_watermark
                    with self._lock:
                        if st.in_sync:
                            self._out_of_sync.discard(tp)
                        elif tp in self._partitions:
                            self._out_of_sync.add(tp)
                    if self._quota.is_throttled(t.name, r.index):
                        throttled_bytes += len(r.records)
                    if r.records:
                        progressed = True
                        self._purgatory.progress(tp)
                except FencedLeaderEpochError:
                    continue  # this broker's role changed while the fetch was out
                except OffsetOutOfRangeError:
                    self._resync(st)  # our log moved under us (truncation)
                except (CorruptRecordError, InvalidRecordError) as exc:
                    # This partition only: the others of the response are appended, and it is
                    # fetched again after a backoff (the leader's copy may be repaired, or the
                    # bad bytes were a transient state of its log), as Kafka's fetcher does.
                    self._delay(st, "is corrupt, not appended", exc, fetch_offset)
                except KafkaError as exc:
                    log.warning("%s-%d: follower append failed: %s", t.name, r.index, exc)
                    self._resync(st)
                    self._hold(st)
                except Exception as exc:  # a bug, or bytes nothing above caught: this partition only
                    self._delay(st, "could not be appended", exc, fetch_offset, traceback=True)
        self._quota.record(throttled_bytes)
        # Nothing but errors (e.g. the leader moved): don't spin; the metadata watch fixes it.
        return 0.5 if errors and not progressed else 0.0

    def _resync(self, st: _FetchState) -> None:
        """Truncate ``st`` (KIP-279) before fetching it again."""
        p = st.partition
        tp = (p.topic, p.index)
        st.truncating = True
        st.rounds = 0
        with self._lock:
            if self._partitions.get(tp) is st:
                self._truncating.add(tp)
            self._touched.add(tp)

    def _hold(self, st: _FetchState) -> None:
        """Fetch ``st`` again only after FETCH_BACKOFF_S."""
        p = st.partition
        tp = (p.topic, p.index)
        st.delayed_until = time.monotonic() + FETCH_BACKOFF_S
        with self._lock:
            if self._partitions.get(tp) is st:
                self._delayed.add(tp)
            self._touched.add(tp)

    def _delay(self, st: _FetchState, what: str, exc: Exception, fetch_offset: int, *, traceback: bool = False) -> None:
        """Hold ``st`` back for FETCH_BACKOFF_S: its fetched data ``what``. WARNING at most
        once per partition every ERROR_LOG_INTERVAL_S (with how many were held back)."""
        self._hold(st)
        p = st.partition
        held_back = self._error_log.allow(("append", p.topic, p.index))
        if held_back is None:
            return
        more = f" ({held_back} more since the last report)" if held_back else ""
        log.warning(
            "%s-%d: what leader %d returned from offset %d %s: %s; fetching this partition "
            "again in %.1f s, the others go on%s",
            p.topic,
            p.index,
            self.leader_id,
            fetch_offset,
            what,
            exc,
            FETCH_BACKOFF_S,
            more,
            exc_info=exc if traceback else None,
        )

    def _partition_error(
        self, s: _FetchState, err: KafkaError, r: log_pb2.FetchPartitionResponse | None = None, fetch_offset: int = -1
    ) -> None:
        p = s.partition
        if isinstance(err, OffsetOutOfRangeError) and r is not None:
            try:
                if p.log.log_end_offset > r.log_end_offset >= 0:
                    # Epochs agree yet the leader has less: only after an unclean election.
                    log.warning(
                        "%s-%d: leader %d has only up to %d; truncating",
                        p.topic,
                        p.index,
                        self.leader_id,
                        r.log_end_offset,
                    )
                    p.truncate_to(r.log_end_offset, s.leader_epoch)
                elif r.log_start_offset > p.log.log_end_offset:
                    log.warning(
                        "%s-%d: behind the leader's log start %d; restarting there",
                        p.topic,
                        p.index,
                        r.log_start_offset,
                    )
                    p.truncate_fully_and_start_at(r.log_start_offset, s.leader_epoch)
            except FencedLeaderEpochError:
                pass  # this broker's role changed meanwhile
            return
        if isinstance(
            err,
            (NotLeaderForPartitionError, FencedLeaderEpochError, UnknownLeaderEpochError, UnknownTopicOrPartitionError),
        ):
            # Our view of leadership is stale or ahead; the metadata watch will move us.
            log.debug("%s-%d: %s", p.topic, p.index, err)
            return
        if r is None:
            log.warning("%s-%d: fetch error from leader %d: %s", p.topic, p.index, self.leader_id, err)
            return
        # Anything else (CORRUPT_MESSAGE: the leader cannot read its own log there, a
        # storage error, ...): this partition waits, the others are fetched meanwhile.
        self._delay(s, "is an error", err, fetch_offset)


class ReplicaFetcherManager:
    """The fetcher threads of this broker, one per leader."""

    def __init__(
        self,
        broker_id: int,
        address_of: Callable[[int], str | None],
        purgatory: Purgatory,
        *,
        max_wait_ms: int = 500,
        max_bytes: int = 1048576,
        endpoint: Callable[[str], LeaderEndPoint] = GrpcLeaderEndPoint,
        quota: ReplicationQuota | None = None,
    ) -> None:
        self.broker_id = broker_id
        self._error_log = RateLimiter(ERROR_LOG_INTERVAL_S)
        """Shared by the fetcher threads: one that replaces another keeps the rate limit."""
        self.quota = quota if quota is not None else ReplicationQuota("follower")
        self._endpoint = endpoint
        self._address_of = address_of
        self._purgatory = purgatory
        self._max_wait_ms = max_wait_ms
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._fetchers: dict[int, ReplicaFetcher] = {}
        self._owner: dict[TopicPartition, int] = {}

    def follow(self, partition: Partition, leader_id: int, leader_epoch: int) -> None:
        """Fetch ``partition`` from ``leader_id`` (after a truncation check)."""
        tp = (partition.topic, partition.index)
        self.unfollow(tp)
        address = self._address_of(leader_id)
        if address is None:
            # Its registration is gone (lost: the controller elects another) or not seen yet.
            log.info("%s-%d: leader %d is not registered; not fetching until it is or another leads", *tp, leader_id)
            return
        with self._lock:
            f = self._fetchers.get(leader_id)
            if f is not None and f.leader.address != address:
                f.shutdown()
                f = None
            if f is None:
                f = ReplicaFetcher(
                    self.broker_id,
                    leader_id,
                    self._endpoint(address),
                    max_wait_ms=self._max_wait_ms,
                    max_bytes=self._max_bytes,
                    purgatory=self._purgatory,
                    quota=self.quota,
                    error_log=self._error_log,
                )
                self._fetchers[leader_id] = f
                f.start()
            f.add(partition, leader_epoch)
            self._owner[tp] = leader_id

    def repoint(self, partition: Partition, leader_id: int, leader_epoch: int) -> None:
        """:meth:`follow` unless ``partition`` is fetched already from ``leader_id`` at its
        registered address in ``leader_epoch``: a change in the set of brokers re-points
        only the partitions whose leader came back or moved, and the others keep their
        fetch positions (no truncation round, no new fetch session)."""
        tp = (partition.topic, partition.index)
        address = self._address_of(leader_id)
        with self._lock:
            f = self._fetchers.get(leader_id)
            if (
                address is not None
                and f is not None
                and self._owner.get(tp) == leader_id
                and f.leader.address == address
                and f.fetches(tp, leader_epoch)
            ):
                return
        self.follow(partition, leader_id, leader_epoch)

    def unfollow(self, tp: TopicPartition) -> None:
        with self._lock:
            leader = self._owner.pop(tp, None)
            f = self._fetchers.get(leader) if leader is not None else None
            if f is not None:
                f.remove(tp)
                if not f.partitions():
                    del self._fetchers[f.leader_id]
                    threading.Thread(target=f.shutdown, daemon=True).start()

    def shutdown(self) -> None:
        with self._lock:
            fetchers = list(self._fetchers.values())
            self._fetchers.clear()
            self._owner.clear()
        for f in fetchers:  # all at once, then wait for each
            f.stop()
        for f in fetchers:
            f.join(timeout=5)
