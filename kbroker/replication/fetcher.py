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
from collections.abc import Callable
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
    """Fetches every partition this broker follows from one leader."""

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
        self._stopped = threading.Event()
        self._wake = threading.Event()

    # --- partition table -----------------------------------------------------------

    def add(self, partition: Partition, leader_epoch: int) -> None:
        with self._lock:
            self._partitions[(partition.topic, partition.index)] = _FetchState(partition, leader_epoch)
        self._wake.set()

    def remove(self, tp: TopicPartition) -> None:
        with self._lock:
            self._partitions.pop(tp, None)

    def partitions(self) -> list[TopicPartition]:
        with self._lock:
            return list(self._partitions)

    def shutdown(self) -> None:
        self._stopped.set()
        self._wake.set()
        self.join(timeout=5)
        self.leader.close()

    # --- loop ----------------------------------------------------------------------

    def run(self) -> None:
        backoff = 0.0
        while not self._stopped.is_set():
            if backoff:
                self._wake.wait(backoff)
                self._wake.clear()
            with self._lock:
                states = list(self._partitions.values())
            if not states:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                truncating = [s for s in states if s.truncating]
                if truncating:
                    self._truncate(truncating)
                now = time.monotonic()
                ready = [s for s in states if not s.truncating and s.delayed_until <= now]
                if ready:
                    backoff = self._fetch(ready)
                else:
                    delayed = [s.delayed_until - now for s in states if not s.truncating]
                    backoff = min(max(min(delayed, default=0.2), 0.01), 0.2)
                self._reached()
            except KafkaError as exc:
                self._unreachable(exc)
                backoff = 0.5
            except Exception:
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

    def _fetch(self, states: list[_FetchState]) -> float:
        req = log_pb2.FetchRequest(
            replica_id=self.broker_id, max_wait_ms=self._max_wait_ms, min_bytes=1, max_bytes=self._response_max_bytes
        )
        unthrottled = [s for s in states if not self._throttled(s)]
        if not unthrottled:
            return min(1.0, max(self._quota.time_until_within_s(), 0.05))
        topics: dict[str, log_pb2.FetchTopic] = {}
        offsets: dict[TopicPartition, int] = {}
        for s in unthrottled:
            p = s.partition
            t = topics.get(p.topic)
            if t is None:
                t = topics[p.topic] = req.topics.add(name=p.topic)
            offsets[(p.topic, p.index)] = fetch_offset = p.log.log_end_offset
            t.partitions.add(
                index=p.index,
                fetch_offset=fetch_offset,
                partition_max_bytes=self._max_bytes,
                current_leader_epoch=s.leader_epoch,
                log_start_offset=p.log.log_start_offset,
            )
        resp = self.leader.fetch(req, self._max_wait_ms / 1000.0 + FETCH_TIMEOUT_MARGIN_S)
        progressed = False
        errors = 0
        throttled_bytes = 0
        for t in resp.topics:
            for r in t.partitions:
                with self._lock:
                    st = self._partitions.get((t.name, r.index))
                if st is None or st.truncating:
                    continue
                fetch_offset = offsets.get((t.name, r.index), -1)
                if r.error_code:
                    errors += 1
                    self._partition_error(st, for_code(r.error_code)(r.error_message), r, fetch_offset)
                    continue
                try:
                    st.partition.append_as_follower(r.records, r.high_watermark, st.leader_epoch, r.log_start_offset)
                    st.in_sync = st.partition.log.log_end_offset >= r.high_watermark
                    if self._quota.is_throttled(t.name, r.index):
                        throttled_bytes += len(r.records)
                    if r.records:
                        progressed = True
                        self._purgatory.progress((t.name, r.index))
                except FencedLeaderEpochError:
                    continue  # this broker's role changed while the fetch was out
                except OffsetOutOfRangeError:
                    st.truncating = True  # our log moved under us (truncation); resync
                except (CorruptRecordError, InvalidRecordError) as exc:
                    # This partition only: the others of the response are appended, and it is
                    # fetched again after a backoff (the leader's copy may be repaired, or the
                    # bad bytes were a transient state of its log), as Kafka's fetcher does.
                    self._delay(st, "is corrupt, not appended", exc, fetch_offset)
                except KafkaError as exc:
                    log.warning("%s-%d: follower append failed: %s", t.name, r.index, exc)
                    st.truncating = True
                    st.delayed_until = time.monotonic() + FETCH_BACKOFF_S
                except Exception as exc:  # a bug, or bytes nothing above caught: this partition only
                    self._delay(st, "could not be appended", exc, fetch_offset, traceback=True)
        self._quota.record(throttled_bytes)
        # Nothing but errors (e.g. the leader moved): don't spin; the metadata watch fixes it.
        return 0.5 if errors and not progressed else 0.0

    def _delay(self, st: _FetchState, what: str, exc: Exception, fetch_offset: int, *, traceback: bool = False) -> None:
        """Hold ``st`` back for FETCH_BACKOFF_S: its fetched data ``what``. WARNING at most
        once per partition every ERROR_LOG_INTERVAL_S (with how many were held back)."""
        st.delayed_until = time.monotonic() + FETCH_BACKOFF_S
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
        for f in fetchers:
            f.shutdown()
