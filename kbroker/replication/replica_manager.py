"""The broker-wide facade over its partitions: append with acks, fetch, roles.

Roles come from ZooKeeper through the metadata cache: when a partition's state names
this broker as leader it becomes leader with that epoch, otherwise a follower that
fetches from the leader (:mod:`kbroker.replication.fetcher`). Logs are created for
every partition assigned here and deleted with their topic. A background thread
shrinks the ISR of led partitions whose followers lag more than
``replica.lag.time.max.ms`` and checkpoints high watermarks to
``replication-offset-checkpoint`` in the data directory (read back at start-up).

Thread safety: the partition map is guarded by a lock; each :class:`Partition`
guards itself. Appends run on per-partition single-threaded lanes (``append_async``),
reads on the server's request pool; waits park in ``purgatory`` and hold no thread.
The metadata thread calls the ``on_*`` listeners. While ZooKeeper is out of reach, a
leader whose in-sync followers went quiet is fenced (:meth:`fenced`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from kbroker.cluster.isr_changes import IsrChangeNotifier
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import LeaderAndIsr
from kbroker.purgatory import Purgatory
from kbroker.replication.fetch_session import (
    CachedPartition,
    FetchContext,
    FetchSession,
    FetchSessionCache,
    FetchSpec,
)
from kbroker.replication.fetcher import GrpcLeaderEndPoint, ReplicaFetcherManager
from kbroker.replication.partition import Partition, ReadResult
from kbroker.replication.quota import ReplicationQuota, parse_throttled_replicas
from kbroker.storage import files
from kbroker.storage.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, Log
from kbroker.storage.log_config import LogConfig
from kbroker.storage.log_manager import LogManager
from kclient.errors import (
    BrokerResponseError,
    InvalidRequestError,
    InvalidRequiredAcksError,
    KafkaError,
    KafkaStorageError,
    NotLeaderForPartitionError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
    as_response_error,
)
from kclient.structs import IsolationLevel

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Offload = Callable[..., Awaitable[Any]]
"""Runs a blocking call off the event loop: ``await offload(fn, *args)``."""


@dataclass
class ProduceResult:
    error: BrokerResponseError | None = None
    base_offset: int = -1
    log_start_offset: int = -1
    log_append_time: int = -1


class TxnMarker(NamedTuple):
    """A transaction marker to write (WriteTxnMarkers): COMMIT or ABORT of one producer's
    transaction, from the coordinator of that epoch."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int = 0


@dataclass
class PendingAcks:
    """acks=all partitions appended here and waiting for the ISR: partition, the offset
    the high watermark must reach, and min.insync.replicas."""

    partitions: dict[TopicPartition, tuple[Partition, int, int]] = field(default_factory=dict)


Answered = tuple[FetchSpec, "FetchResult"]
"""A partition of a session fetch's answer: what was asked, and the outcome."""


def _now_ms() -> float:
    return time.monotonic() * 1000.0


def fetch_keys(specs: list[FetchSpec]) -> list[TopicPartition]:
    return [(s.topic, s.partition) for s in specs]


@dataclass
class FetchResult:
    error: BrokerResponseError | None = None
    read: ReadResult | None = None


@dataclass
class OffsetResult:
    error: BrokerResponseError | None = None
    offset: int = -1
    timestamp: int = -1
    leader_epoch: int = -1


@dataclass
class DeleteRecordsResult:
    error: BrokerResponseError | None = None
    low_watermark: int = -1


@dataclass
class PendingDeletes:
    """DeleteRecords partitions waiting for the ISR's log start offsets: partition and
    the low watermark to reach."""

    partitions: dict[TopicPartition, tuple[Partition, int]] = field(default_factory=dict)


APPEND_LANES = 4
"""Single-threaded append executors; a partition always appends on the same one."""

FENCE_CHECK_S = 0.25
"""How often, while ZooKeeper is out of reach, parked produce requests re-check fencing."""

HW_CHECKPOINT = "replication-offset-checkpoint"
PARTITION_METADATA = "partition.metadata"
"""Per partition directory, as Kafka 2.8: ``version: 0`` and ``topic_id: <id>`` lines."""


def _read_topic_id(log_dir: Path) -> str | None:
    try:
        text = (log_dir / PARTITION_METADATA).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id" and value.strip():
            return value.strip()
    return None


def _record_topic_id(log_dir: Path, topic_id: str) -> None:
    """Written whole (atomic replace) but not fsynced, as Kafka defers it to a flush: the
    file only tells a later incarnation of the topic apart, and without it the leader
    epochs do (:meth:`ReplicaManager._other_incarnation`). Fsyncing it (and its directory)
    was 43 % of a broker's work creating 4,000 partitions."""
    if _read_topic_id(log_dir) != topic_id:
        files.atomic_write(log_dir / PARTITION_METADATA, f"version: 0\ntopic_id: {topic_id}\n".encode(), sync=False)


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        logs: LogManager,
        log_defaults: LogConfig,
        zk: ZkClient,
        address_of: Callable[[int], str | None],
        *,
        replica_lag_time_max_ms: int = 30000,
        replica_fetch_wait_max_ms: int = 500,
        replica_fetch_max_bytes: int = 1048576,
        hw_checkpoint_interval_ms: int = 5000,
        inter_broker_channel: Callable[[str], grpc.Channel] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self._logs = logs
        self._defaults = log_defaults
        self._zk = zk
        self._lag_max_ms = replica_lag_time_max_ms
        self._hw_interval_s = hw_checkpoint_interval_ms / 1000.0
        self._lock = threading.Lock()
        self._partitions: dict[TopicPartition, Partition] = {}
        self._configs: dict[str, LogConfig] = {}
        self._overrides: dict[str, dict[str, str]] = {}
        self._topic_ids: dict[TopicPartition, str] = {}
        """The topic id recorded in each hosted partition's ``partition.metadata`` (metadata thread)."""
        self._config_lock = threading.Lock()
        """Guards ``_defaults``, ``_configs``, ``_overrides`` and applying them to logs."""
        self.purgatory = Purgatory()
        self.leader_quota = ReplicationQuota("leader")
        """Bounds what this broker serves to throttled followers (partition moves)."""
        self._lanes = [ThreadPoolExecutor(1, thread_name_prefix=f"append-{i}") for i in range(APPEND_LANES)]
        # Fencing: with ZooKeeper out of reach and the ISR followers gone quiet for this
        # long, this broker has most likely been deposed (see :meth:`fenced`).
        self._quiet_ms = max(2 * replica_fetch_wait_max_ms, 1000)
        self.fetchers = ReplicaFetcherManager(
            broker_id,
            address_of,
            self.purgatory,
            max_wait_ms=replica_fetch_wait_max_ms,
            max_bytes=replica_fetch_max_bytes,
            quota=ReplicationQuota("follower"),
            endpoint=functools.partial(GrpcLeaderEndPoint, channel=inter_broker_channel),
        )
        self._hw_file = logs.data_dir / HW_CHECKPOINT
        self._saved_hw = files.read_offsets_checkpoint(self._hw_file) if self._hw_file.exists() else {}
        # The cleaner never compacts what is not committed: until a partition is set up,
        # its checkpointed high watermark bounds the cleaning, then the live one.
        for key, loaded in logs.logs().items():
            loaded.cleaner_upper_bound = functools.partial(int, self._saved_hw.get(key, 0))
        self._stopped = threading.Event()
        self._leaving = threading.Event()
        """Set by :meth:`begin_controlled_shutdown`."""
        self._thread = threading.Thread(target=self._run, name="replica-manager", daemon=True)
        self._isr_changes = IsrChangeNotifier(zk)
        """The ISR changes this broker wrote as leader, announced to the controller in batches."""

    def start(self) -> None:
        self._thread.start()
        self._isr_changes.start()

    def _run(self) -> None:
        last_checkpoint = time.monotonic()
        interval = min(self._lag_max_ms / 2000.0, self._hw_interval_s)
        while not self._stopped.wait(interval if self._zk.connected else FENCE_CHECK_S):
            if not self._zk.connected:
                # Parked acks=all requests re-check whether their partition is fenced.
                for p in self.partitions():
                    if p.is_leader:
                        self.purgatory.progress((p.topic, p.index))
                continue
            for p in self.partitions():
                try:
                    if p.maybe_shrink_isr(self._lag_max_ms):
                        self.purgatory.progress((p.topic, p.index))
                except Exception:
                    log.exception("%s-%d: ISR shrink check failed", p.topic, p.index)
            if time.monotonic() - last_checkpoint >= self._hw_interval_s:
                self.checkpoint_high_watermarks()
                last_checkpoint = time.monotonic()

    def _log_start_moved(self, p: Partition) -> None:
        """DeleteRecords (or the leader's) moved ``p``'s log start offset: checkpoint it
        at once (log-start-offset-checkpoint), so a restart does not bring records back,
        and wake what waits on the partition (DeleteRecords, a follower's fetch)."""
        try:
            self._logs.checkpoint()
        except OSError:
            log.exception("%s-%d: cannot checkpoint the log start offset", p.topic, p.index)
        self.purgatory.progress((p.topic, p.index))

    def checkpoint_high_watermarks(self) -> None:
        offsets = {(p.topic, p.index): p.high_watermark for p in self.partitions()}
        try:
            files.write_offsets_checkpoint(self._hw_file, offsets)
        except OSError:
            log.exception("cannot write %s", self._hw_file)

    def _write_isr(self, p: Partition, state: LeaderAndIsr) -> int | None:
        """The new znode version, or None if ZooKeeper refused the change; announced to
        the controller (in a batch) when written.

        Any other failure (e.g. a lost connection: the write may or may not have been
        applied) is raised, so the partition can stay conservative.
        """
        version = self._zk.write_isr(p.topic, p.index, state)
        if version is None:
            log.debug("%s-%d: ISR change to %s refused (state changed in ZooKeeper)", p.topic, p.index, state.isr)
            return None
        self._isr_changes.record(p.topic, p.index)
        return version

    # --- lookups -------------------------------------------------------------------

    def partition(self, topic: str, index: int) -> Partition:
        with self._lock:
            p = self._partitions.get((topic, index))
        if p is None:
            reason = self._logs.offline_reason(topic, index)
            if reason is not None:
                raise KafkaStorageError(f"{topic}-{index}: log offline on broker {self.broker_id}: {reason}")
            raise UnknownTopicOrPartitionError(f"this broker hosts no replica of {topic}-{index}")
        return p

    @property
    def log_manager(self) -> LogManager:
        return self._logs

    def partitions(self) -> list[Partition]:
        with self._lock:
            return list(self._partitions.values())

    def topic_config(self, topic: str) -> LogConfig:
        return self._configs.get(topic, self._defaults)

    # --- role changes (metadata thread) --------------------------------------------

    def on_partition_change(
        self,
        topic: str,
        index: int,
        replicas: list[int],
        state: LeaderAndIsr | None,
        config: dict[str, str],
        topic_id: str | None = None,
    ) -> None:
        if self.broker_id not in replicas:
            self._drop(topic, index)
            return
        log_config = self._config_for(topic, config)
        with self._lock:
            p = self._partitions.get((topic, index))
        known_id = self._topic_ids.get((topic, index))
        if p is not None and topic_id is not None and known_id is None:
            known_id = _read_topic_id(p.log.dir)  # set up without an id: the file may hold one
        if p is not None and topic_id is not None and known_id is not None and known_id != topic_id:
            # Deleted and recreated between two reads of its znode: no deletion was seen, and
            # the old incarnation's log (and its leader epochs) must not carry over.
            log.warning(
                "%s-%d: the topic was recreated (topic id %s, was %s); replacing the local log",
                topic,
                index,
                topic_id,
                known_id,
            )
            self._drop(topic, index, delete=True)
            p = None
        if p is None:
            self._topic_ids.pop((topic, index), None)
            if self._logs.offline_reason(topic, index) is not None:
                return  # its requests get KAFKA_STORAGE_ERROR; the other partitions go on
            existing = self._logs.get(topic, index)
            if existing is not None and self._other_incarnation(existing, state, topic_id):
                log.warning("%s-%d: local log is from a deleted incarnation of the topic; removing it", topic, index)
                self._logs.delete(topic, index)
                self._saved_hw.pop((topic, index), None)
            plog = self._logs.get_or_create(topic, index, log_config)
            hw = self._saved_hw.get((topic, index), 0)
            p = Partition(
                topic,
                index,
                self.broker_id,
                plog,
                high_watermark=hw,
                isr_writer=self._write_isr,
                on_log_start_moved=self._log_start_moved,
            )
            plog.cleaner_upper_bound = p.committed_offset
            with self._lock:
                self._partitions[(topic, index)] = p
        with self._config_lock:  # the defaults may have changed meanwhile (a dynamic config)
            current = self._configs.get(topic, self._defaults)
            if p.log.config != current:
                p.log.update_config(current)
        if topic_id is not None and self._topic_ids.get((topic, index)) != topic_id:
            _record_topic_id(p.log.dir, topic_id)  # a file read (and write) once, not at every change
            self._topic_ids[(topic, index)] = topic_id
        if state is None:
            return
        if state.leader == self.broker_id:
            self.fetchers.unfollow((topic, index))
            if p.make_leader(state, replicas):
                # Per-partition lines are DEBUG: the metadata cache logs one line per batch.
                log.debug("%s-%d: leader, epoch %d, isr %s", topic, index, state.leader_epoch, state.isr)
        elif self._leaving.is_set() and self.broker_id not in state.isr:
            # The controller moved us out of the ISR because we are leaving: fetching would
            # only make the leader try to add us back (Kafka's controller stops such a
            # replica with StopReplica).
            p.make_follower(state, replicas)
            self.fetchers.unfollow((topic, index))
        elif p.make_follower(state, replicas):
            if state.has_leader:
                log.debug("%s-%d: follower of %d, epoch %d", topic, index, state.leader, state.leader_epoch)
                self.fetchers.follow(p, state.leader, state.leader_epoch)
            else:
                log.debug("%s-%d: offline (no leader)", topic, index)
                self.fetchers.unfollow((topic, index))
        self.purgatory.progress((topic, index))

    @staticmethod
    def _other_incarnation(existing: Log, state: LeaderAndIsr | None, topic_id: str | None) -> bool:
        """Is this local log from an earlier topic of the same name (deleted while we were away)?

        The topic id says so for sure; without one, a log epoch above the partition's
        current epoch does (epochs only grow within one incarnation).
        """
        recorded = _read_topic_id(existing.dir)
        if topic_id is not None and recorded is not None:
            return recorded != topic_id
        return state is not None and existing.latest_epoch > state.leader_epoch

    def on_brokers_change(self) -> None:
        """Leaders may have come back, or on new addresses: re-point their partitions'
        fetchers (the others go on as they were)."""
        for p in self.partitions():
            view = p.state_view()
            if self._leaving.is_set() and self.broker_id not in view.isr:
                continue  # left behind by the controlled shutdown: stays unfetched
            if not p.is_leader and view.leader >= 0:
                self.fetchers.repoint(p, view.leader, view.leader_epoch)

    def on_topic_deleted(self, topic: str) -> None:
        with self._lock:
            doomed = [tp for tp in self._partitions if tp[0] == topic]
        for tp in doomed:
            self._drop(*tp, delete=True)
        with self._config_lock:
            self._configs.pop(topic, None)
            self._overrides.pop(topic, None)
            self.leader_quota.remove_throttle(topic)
            self.fetchers.quota.remove_throttle(topic)

    def _config_for(self, topic: str, overrides: dict[str, str]) -> LogConfig:
        with self._config_lock:
            cached = self._configs.get(topic)
            if cached is not None and self._overrides.get(topic) == overrides:
                return cached  # unchanged overrides (a state change): no re-parse per partition
            self._overrides[topic] = dict(overrides)
            return self._recompute_locked(topic, overrides)

    def _recompute_locked(self, topic: str, overrides: dict[str, str]) -> LogConfig:
        try:
            cfg = LogConfig.from_properties(overrides, self._defaults)
        except KafkaError as exc:
            log.error("topic %s: bad config in ZooKeeper (%s); using broker defaults", topic, exc)
            cfg = self._defaults
        self._configs[topic] = cfg
        self.leader_quota.mark_throttled(
            topic, parse_throttled_replicas(cfg.leader_replication_throttled_replicas, self.broker_id)
        )
        self.fetchers.quota.mark_throttled(
            topic, parse_throttled_replicas(cfg.follower_replication_throttled_replicas, self.broker_id)
        )
        return cfg

    def set_replication_throttles(self, leader_bytes_per_s: int, follower_bytes_per_s: int) -> None:
        """``leader.`` / ``follower.replication.throttled.rate`` (dynamic broker configs)."""
        self.leader_quota.set_bound(leader_bytes_per_s)
        self.fetchers.quota.set_bound(follower_bytes_per_s)

    def update_log_defaults(self, defaults: LogConfig) -> None:
        """The broker's log defaults changed (a dynamic broker config): every topic's config
        is recomputed from its own overrides on top of the new defaults, and each hosted
        log gets its topic's config at once (so a topic override still wins)."""
        with self._config_lock:
            self._defaults = defaults
            for topic, overrides in self._overrides.items():
                self._recompute_locked(topic, overrides)
            for p in self.partitions():
                cfg = self._configs.get(p.topic, defaults)
                if p.log.config != cfg:
                    p.log.update_config(cfg)

    def _drop(self, topic: str, index: int, delete: bool = True) -> None:
        with self._lock:
            p = self._partitions.pop((topic, index), None)
        self._topic_ids.pop((topic, index), None)
        self.fetchers.unfollow((topic, index))
        if p is not None:
            p.resign()
            self.purgatory.progress((topic, index))  # its waiters now get NOT_LEADER at once
        # A log left from a replica this broker no longer has (removed while it was down,
        # e.g. by a reassignment) goes too: the replica set in ZooKeeper no longer counts it.
        stray = p is None and self._logs.get(topic, index) is not None
        if delete and (p is not None or stray or self._logs.offline_reason(topic, index) is not None):
            self._logs.delete(topic, index)
            self._saved_hw.pop((topic, index), None)  # the high watermark of a log that is gone
            if stray:
                log.warning("%s-%d: deleting a local log: this broker is no longer a replica", topic, index)
            else:
                log.info("%s-%d: replica removed", topic, index)

    # --- fencing -------------------------------------------------------------------

    def fenced(self, p: Partition) -> bool:
        """Must this broker stop acting as ``p``'s leader?

        Cut off from ZooKeeper it cannot see a new leader being elected; but the ISR
        followers can, and then stop fetching from here. So: ZooKeeper unreachable and
        an ISR follower silent for ``2 x replica.fetch.wait.max.ms`` (at least 1 s)
        means deposed, most likely: refuse produce requests and fail the waiting
        acks=all ones (NOT_LEADER_OR_FOLLOWER), and name no leader in Metadata, so
        clients go to the brokers that know. When the whole ZooKeeper ensemble is down
        the followers keep fetching and the partition keeps serving, as in Kafka; a
        single-replica partition is never fenced (nobody else can lead it).
        """
        return not self._zk.connected and p.isr_follower_silent(self._quiet_ms)

    def any_fenced(self) -> bool:
        """Is any partition led here fenced (so this broker's view of the cluster is stale)?"""
        return not self._zk.connected and any(self.fenced(p) for p in self.partitions())

    def fenced_partition(self, topic: str, index: int) -> bool:
        with self._lock:
            p = self._partitions.get((topic, index))
        return p is not None and self.fenced(p)

    def _fenced_error(self, p: Partition) -> NotLeaderForPartitionError:
        return NotLeaderForPartitionError(
            f"{p.topic}-{p.index}: broker {self.broker_id} is cut off from ZooKeeper and its followers: "
            "another broker is likely the leader now"
        )

    # --- produce -------------------------------------------------------------------

    def append(
        self, acks: int, entries: Iterable[tuple[TopicPartition, bytes]]
    ) -> tuple[dict[TopicPartition, ProduceResult], PendingAcks]:
        """Append as leader. With acks=all, the partitions still waiting for the ISR are
        returned as :class:`PendingAcks`, to be parked in the purgatory and finished by
        :meth:`finish_acks`. A topic-partition given twice is refused (INVALID_REQUEST)."""
        entries = list(entries)
        results: dict[TopicPartition, ProduceResult] = {}
        pending = PendingAcks()
        if acks not in (0, 1, -1):
            err = InvalidRequiredAcksError(f"acks must be 0, 1 or -1 (all), got {acks}")
            return {tp: ProduceResult(err) for tp, _ in entries}, pending
        counts = Counter(tp for tp, _ in entries)
        for tp, records in entries:
            if counts[tp] > 1:
                results[tp] = ProduceResult(InvalidRequestError(f"{tp[0]}-{tp[1]} appears more than once"))
                continue
            try:
                p = self.partition(*tp)
                if self.fenced(p):
                    raise self._fenced_error(p)
                min_isr = self.topic_config(tp[0]).min_insync_replicas
                info = p.append_as_leader(records, acks, min_isr)
                results[tp] = ProduceResult(None, info.first_offset, p.log.log_start_offset, info.log_append_time)
                if acks == -1:
                    pending.partitions[tp] = (p, info.last_offset + 1, min_isr)
            except Exception as exc:
                results[tp] = ProduceResult(as_response_error(exc).with_traceback(None))  # no frames (records) kept
                continue
            self.purgatory.progress(tp)
        return results, pending

    def acks_ready(self, pending: PendingAcks) -> bool:
        """Has every pending partition reached (or definitely failed) its acks=all goal?"""
        for p, required, min_isr in pending.partitions.values():
            try:
                if p.acks_satisfied(required, min_isr) is None and not self.fenced(p):
                    return False
            except Exception:
                continue
        return True

    def finish_acks(self, pending: PendingAcks, results: dict[TopicPartition, ProduceResult], timeout_ms: int) -> None:
        """Fill in the acks=all outcome of each pending partition (after the wait)."""
        for tp, (p, required, min_isr) in pending.partitions.items():
            try:
                if p.acks_satisfied(required, min_isr) is None:
                    if self.fenced(p):
                        raise self._fenced_error(p)
                    results[tp] = ProduceResult(
                        RequestTimedOutError(f"{tp[0]}-{tp[1]}: not replicated to the ISR within {timeout_ms} ms")
                    )
            except Exception as exc:
                results[tp] = ProduceResult(as_response_error(exc))

    async def append_async(
        self, acks: int, timeout_ms: int, entries: list[tuple[TopicPartition, bytes]]
    ) -> dict[TopicPartition, ProduceResult]:
        """:meth:`append` on the partitions' append lanes, then an acks=all wait parked in
        the purgatory (no thread held).

        Each partition always appends on the same single-threaded lane, and this method
        queues its appends there before its first ``await``: so requests are appended
        to a partition in the order the event loop received them, as Kafka processes a
        connection's requests in order, even with several in flight.
        """
        loop = asyncio.get_running_loop()
        by_lane: dict[int, list[tuple[TopicPartition, bytes]]] = {}
        for tp, records in entries:
            by_lane.setdefault(hash(tp) % len(self._lanes), []).append((tp, records))
        parts = [loop.run_in_executor(self._lanes[i], self.append, acks, group) for i, group in by_lane.items()]
        results: dict[TopicPartition, ProduceResult] = {}
        pending = PendingAcks()
        for part_results, part_pending in await asyncio.gather(*parts):
            results.update(part_results)
            pending.partitions.update(part_pending.partitions)
        if pending.partitions:
            await self._park(list(pending.partitions), lambda: self.acks_ready(pending), timeout_ms)
            self.finish_acks(pending, results, timeout_ms)
        return results

    def append_markers(
        self, marker: TxnMarker, partitions: Iterable[TopicPartition]
    ) -> tuple[dict[TopicPartition, BrokerResponseError | None], PendingAcks]:
        """Append ``marker`` as leader of each partition (WriteTxnMarkers). They are waited
        for as acks=all appends: the partitions still waiting for the ISR are returned."""
        results: dict[TopicPartition, BrokerResponseError | None] = {}
        pending = PendingAcks()
        for tp in partitions:
            try:
                p = self.partition(*tp)
                if self.fenced(p):
                    raise self._fenced_error(p)
                min_isr = self.topic_config(tp[0]).min_insync_replicas
                info = p.append_marker(
                    marker.producer_id, marker.producer_epoch, marker.commit, marker.coordinator_epoch, min_isr
                )
                results[tp] = None
                pending.partitions[tp] = (p, info.last_offset + 1, min_isr)
            except Exception as exc:
                results[tp] = as_response_error(exc).with_traceback(None)
                continue
            self.purgatory.progress(tp)
        return results, pending

    def write_markers(
        self, marker: TxnMarker, partitions: Sequence[TopicPartition], timeout_ms: int
    ) -> dict[TopicPartition, BrokerResponseError | None]:
        """:meth:`write_markers_async` in this thread (a coordinator writing to the
        partitions it leads itself)."""
        by_lane: dict[int, list[TopicPartition]] = {}
        for tp in partitions:
            by_lane.setdefault(hash(tp) % len(self._lanes), []).append(tp)
        futures = [self._lanes[i].submit(self.append_markers, marker, g) for i, g in by_lane.items()]
        results: dict[TopicPartition, BrokerResponseError | None] = {}
        pending = PendingAcks()
        for future in futures:
            part_results, part_pending = future.result()
            results.update(part_results)
            pending.partitions.update(part_pending.partitions)
        if pending.partitions:
            w = self.purgatory.watch(list(pending.partitions), lambda: self.acks_ready(pending))
            try:
                w.wait(timeout_ms / 1000.0)
            finally:
                self.purgatory.cancel(w)
            acked: dict[TopicPartition, ProduceResult] = {}
            self.finish_acks(pending, acked, timeout_ms)
            results.update((tp, r.error) for tp, r in acked.items())
        return results

    async def write_markers_async(
        self, marker: TxnMarker, partitions: Sequence[TopicPartition], timeout_ms: int
    ) -> dict[TopicPartition, BrokerResponseError | None]:
        """:meth:`append_markers` on the partitions' append lanes (in order with their
        produce requests), then the wait for the ISR parked in the purgatory: per
        partition None (written and replicated) or why not."""
        loop = asyncio.get_running_loop()
        by_lane: dict[int, list[TopicPartition]] = {}
        for tp in partitions:
            by_lane.setdefault(hash(tp) % len(self._lanes), []).append(tp)
        parts = [loop.run_in_executor(self._lanes[i], self.append_markers, marker, g) for i, g in by_lane.items()]
        results: dict[TopicPartition, BrokerResponseError | None] = {}
        pending = PendingAcks()
        for part_results, part_pending in await asyncio.gather(*parts):
            results.update(part_results)
            pending.partitions.update(part_pending.partitions)
        if pending.partitions:
            await self._park(list(pending.partitions), lambda: self.acks_ready(pending), timeout_ms)
            acked: dict[TopicPartition, ProduceResult] = {}
            self.finish_acks(pending, acked, timeout_ms)
            results.update((tp, r.error) for tp, r in acked.items())
        return results

    async def _park(self, keys: list[TopicPartition], ready: Callable[[], bool], timeout_ms: int) -> None:
        w = self.purgatory.watch(keys, ready, asyncio.get_running_loop())
        try:
            await w.wait_async(max(timeout_ms, 0) / 1000.0)
        finally:
            self.purgatory.cancel(w)

    # --- fetch ---------------------------------------------------------------------

    async def fetch_async(
        self,
        offload: Offload,
        replica_id: int,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        specs: list[FetchSpec],
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> list[FetchResult]:
        """A long-poll fetch whose wait is parked in the purgatory (no thread held)."""

        def first() -> tuple[dict[int, BrokerResponseError], list[FetchResult]]:
            errors = self.record_follower_fetches(replica_id, specs)
            return errors, self.read(replica_id, max_bytes, specs, errors, isolation)

        errors, results = await offload(first)
        if self.enough(results, min_bytes) or max_wait_ms <= 0:
            return results  # type: ignore[no-any-return]
        await self._park(
            fetch_keys(specs),
            lambda: self.fetch_ready(replica_id, min_bytes, max_bytes, specs, isolation),
            max_wait_ms,
        )
        return await offload(self.read, replica_id, max_bytes, specs, errors, isolation)  # type: ignore[no-any-return]

    def record_follower_fetches(self, replica_id: int, specs: list[FetchSpec]) -> dict[int, BrokerResponseError]:
        """A follower's fetch positions (its LEOs); returns the errors by spec index.

        A broker outside a partition's replica set, or a fetch from a non-leader, gets an
        error for that partition and moves nothing: it must not read above the HW.
        """
        errors: dict[int, BrokerResponseError] = {}
        if replica_id < 0:
            return errors
        for i, spec in enumerate(specs):
            try:
                p = self.partition(spec.topic, spec.partition)
                if p.record_follower_fetch(replica_id, spec.offset, spec.current_leader_epoch, spec.log_start_offset):
                    self.purgatory.progress((spec.topic, spec.partition))
            except Exception as exc:
                errors[i] = as_response_error(exc)
        return errors

    def read(
        self,
        replica_id: int,
        max_bytes: int,
        specs: list[FetchSpec],
        errors: dict[int, BrokerResponseError] | None = None,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> list[FetchResult]:
        """Read every spec once (a follower up to the LEO, a consumer below the HW, or the
        LSO with read_committed); what a follower gets of throttled partitions counts
        against the leader quota."""
        out, throttled_bytes = self._read(replica_id, max_bytes, specs, errors, isolation)
        self.leader_quota.record(throttled_bytes)
        return out

    def _read(
        self,
        replica_id: int,
        max_bytes: int,
        specs: list[FetchSpec],
        errors: dict[int, BrokerResponseError] | None = None,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> tuple[list[FetchResult], int]:
        # KIP-74: the response holds at most ``max_bytes`` and each partition at most its
        # ``max_bytes``, except the first batch of the first partition that has one, which
        # comes whole even when larger (so that a consumer always makes progress).
        budget = max_bytes
        min_one_batch = True
        throttled_bytes = 0
        out: list[FetchResult] = []
        for i, spec in enumerate(specs):
            if errors and i in errors:
                out.append(FetchResult(errors[i]))
                continue
            try:
                p = self.partition(spec.topic, spec.partition)
                limit = max(min(spec.max_bytes, budget), 0)
                listed = replica_id >= 0 and self.leader_quota.is_throttled(spec.topic, spec.partition)
                held = listed and self._leader_throttled(p, replica_id)
                epoch = spec.current_leader_epoch
                r = p.read(
                    spec.offset,
                    limit,
                    replica_id,
                    epoch,
                    records=not held,
                    min_one_batch=min_one_batch,
                    isolation=isolation,
                )
                budget -= len(r.records)
                if r.records:
                    min_one_batch = False
                if listed:
                    throttled_bytes += len(r.records)
                out.append(FetchResult(None, r))
            except Exception as exc:
                out.append(FetchResult(as_response_error(exc)))
        return out, throttled_bytes

    def _leader_throttled(self, p: Partition, replica_id: int) -> bool:
        """Kafka's shouldLeaderThrottle (the partition is listed): an out-of-sync follower
        gets nothing while the leader quota is used up."""
        return not p.in_sync(replica_id) and self.leader_quota.is_exceeded()

    def fetch_ready(
        self,
        replica_id: int,
        min_bytes: int,
        max_bytes: int,
        specs: list[FetchSpec],
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> bool:
        """May a parked fetch answer now? Cheap: compares offsets (reads only when
        ``min_bytes`` > 1). Any error (leadership moved, partition gone) counts as ready."""
        if min_bytes > 1:
            return self.enough(self._read(replica_id, max_bytes, specs, None, isolation)[0], min_bytes)
        for spec in specs:
            try:
                p = self.partition(spec.topic, spec.partition)
                if replica_id >= 0 and 0 <= spec.log_start_offset < p.log.log_start_offset <= spec.offset:
                    return True  # the follower learns the new log start offset (DeleteRecords) now
                if p.available_to(replica_id, spec.offset, spec.current_leader_epoch, isolation) and not (
                    replica_id >= 0
                    and self.leader_quota.is_throttled(spec.topic, spec.partition)
                    and self._leader_throttled(p, replica_id)
                ):
                    return True
            except Exception:
                return True
        return False

    def fetch(
        self, replica_id: int, max_wait_ms: int, min_bytes: int, max_bytes: int, specs: list[FetchSpec]
    ) -> list[FetchResult]:
        """A whole fetch in this thread, long poll included (tests, tools)."""
        errors = self.record_follower_fetches(replica_id, specs)
        results = self.read(replica_id, max_bytes, specs, errors)
        if self.enough(results, min_bytes) or max_wait_ms <= 0:
            return results
        w = self.purgatory.watch(fetch_keys(specs), lambda: self.fetch_ready(replica_id, min_bytes, max_bytes, specs))
        try:
            w.wait(max_wait_ms / 1000.0)
        finally:
            self.purgatory.cancel(w)
        return self.read(replica_id, max_bytes, specs, errors)

    @staticmethod
    def enough(results: list[FetchResult], min_bytes: int) -> bool:
        total = 0
        for r in results:
            if r.error is not None:
                return True
            if r.read is not None:
                total += len(r.read.records)
        return total >= max(min_bytes, 1)

    # --- fetch sessions (KIP-227) ------------------------------------------------------

    @functools.cached_property
    def fetch_sessions(self) -> FetchSessionCache:
        """This broker's fetch sessions (Kafka's cache settings until ``configure``d);
        the purgatory marks their partitions (see :mod:`kbroker.replication.fetch_session`)."""
        cache = FetchSessionCache()
        cache.attach(self.purgatory)
        return cache

    async def fetch_session_async(
        self,
        offload: Offload,
        replica_id: int,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        ctx: FetchContext,
        refused: Mapping[str, BrokerResponseError],
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> list[tuple[FetchSpec, FetchResult]]:
        """A fetch in ``ctx.session`` (a full or an incremental one): what to answer, in
        order. It reads the session's dirty partitions only (every one for a full fetch),
        parks under the session's key, and reads the dirty ones again. ``refused``: the
        topics answered with that error (authorization).

        A follower's position is recorded for each partition whose fetch offset (or
        epoch, log start, max bytes) the request changed; for every partition of the
        session every ``replica.lag.time.max.ms / 4`` (so ISR shrinking and expansion see
        a caught-up idle follower as such), and at every fetch while ZooKeeper is out of
        reach (fencing looks at the followers' last fetch). Each refresh also marks every
        partition dirty, a safety net for a change no purgatory key reported (a log start
        moved by retention)."""
        session = ctx.session
        if session is None:
            raise ValueError("fetch_session_async needs a session context")

        def first() -> tuple[dict[TopicPartition, BrokerResponseError], dict[TopicPartition, Answered]]:
            errors = self._record_session_positions(replica_id, session, ctx.changed)
            return errors, self._read_session(replica_id, max_bytes, session, ctx.full, errors, refused, isolation)

        errors, answered = await offload(first)
        if max_wait_ms <= 0 or self.enough([r for _, r in answered.values()], min_bytes):
            return list(answered.values())
        w = self.purgatory.watch(
            [session.waiter_key],
            lambda: self._session_ready(replica_id, min_bytes, max_bytes, session, isolation),
            asyncio.get_running_loop(),
        )
        try:
            await w.wait_async(max_wait_ms / 1000.0)
        finally:
            self.purgatory.cancel(w)
        answered.update(
            await offload(self._read_session, replica_id, max_bytes, session, False, errors, refused, isolation)
        )
        return list(answered.values())

    def _record_session_positions(
        self, replica_id: int, session: FetchSession, changed: list[FetchSpec]
    ) -> dict[TopicPartition, BrokerResponseError]:
        now = _now_ms()
        refresh = now - session.last_refresh_ms >= self._lag_max_ms / 4
        if refresh:
            session.last_refresh_ms = now
            session.mark_all()
        if replica_id < 0:
            return {}
        everything = refresh or not self._zk.connected
        specs = [cp.spec for cp in session.cached()] if everything else changed
        if everything:
            session.positions_ms = now
        errors = self.record_follower_fetches(replica_id, specs)
        return {(specs[i].topic, specs[i].partition): e for i, e in errors.items()}

    def _read_session(
        self,
        replica_id: int,
        max_bytes: int,
        session: FetchSession,
        full: bool,
        errors: Mapping[TopicPartition, BrokerResponseError],
        refused: Mapping[str, BrokerResponseError],
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> dict[TopicPartition, Answered]:
        """Read the dirty partitions (all for ``full``) once: those to answer (new
        records, a changed high watermark or log start offset, an error; all for
        ``full``), by key. Those that returned records or are not caught up stay dirty."""
        parts = session.take_dirty()
        if full:
            parts = session.cached()
        if not parts:
            return {}
        specs = [cp.spec for cp in parts]
        errs: dict[int, BrokerResponseError] = {}
        if errors or refused:
            for i, spec in enumerate(specs):
                err = refused.get(spec.topic) or errors.get((spec.topic, spec.partition))
                if err is not None:
                    errs[i] = err
        results = self.read(replica_id, max_bytes, specs, errs, isolation)
        committed = replica_id < 0 and isolation is IsolationLevel.READ_COMMITTED
        out: dict[TopicPartition, Answered] = {}
        keep: list[CachedPartition] = []
        for cp, spec, r in zip(parts, specs, results, strict=True):
            rd = r.read
            if rd is None:
                out[cp.key] = (spec, r)
                continue
            told = (
                rd.high_watermark == cp.high_watermark
                and rd.log_start_offset == cp.log_start_offset
                and rd.last_stable_offset == cp.last_stable_offset
            )
            if full or rd.records or not told:
                cp.high_watermark, cp.log_start_offset = rd.high_watermark, rd.log_start_offset
                cp.last_stable_offset = rd.last_stable_offset
                out[cp.key] = (spec, r)
            visible = (
                rd.log_end_offset if replica_id >= 0 else rd.last_stable_offset if committed else rd.high_watermark
            )
            if rd.records or spec.offset < visible:
                keep.append(cp)
        session.keep_dirty(keep)
        return out

    def _session_ready(
        self,
        replica_id: int,
        min_bytes: int,
        max_bytes: int,
        session: FetchSession,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> bool:
        """:meth:`fetch_ready` over the session's dirty partitions only; or, for a follower
        while ZooKeeper is out of reach, as soon as its positions were last recorded half
        the fencing silence ago (its next fetch records them all: see :meth:`fenced`)."""
        if replica_id >= 0 and not self._zk.connected and _now_ms() - session.positions_ms > self._quiet_ms / 2:
            return True
        parts = session.peek_dirty()
        return bool(parts) and self.fetch_ready(replica_id, min_bytes, max_bytes, [cp.spec for cp in parts], isolation)

    # --- delete records ------------------------------------------------------------

    def delete_records(
        self, offsets: Mapping[TopicPartition, int]
    ) -> tuple[dict[TopicPartition, DeleteRecordsResult], PendingDeletes]:
        """DeleteRecords as leader: move each partition's log start offset (-1: to the HW).
        The partitions whose ISR has not reached the new start yet are returned as
        :class:`PendingDeletes`, to be parked in the purgatory and finished by
        :meth:`finish_deletes`; the others are answered with their low watermark."""
        results: dict[TopicPartition, DeleteRecordsResult] = {}
        pending = PendingDeletes()
        for tp, offset in offsets.items():
            try:
                p = self.partition(*tp)
                if self.fenced(p):
                    raise self._fenced_error(p)
                target = p.delete_records(offset)
                low = p.low_watermark()
                if low >= target:
                    results[tp] = DeleteRecordsResult(None, low)
                else:
                    pending.partitions[tp] = (p, target)
            except Exception as exc:
                results[tp] = DeleteRecordsResult(as_response_error(exc))
        return results, pending

    @staticmethod
    def deletes_ready(pending: PendingDeletes) -> bool:
        """Has every pending partition's low watermark reached its target (or failed)?"""
        for p, target in pending.partitions.values():
            try:
                if p.low_watermark() < target:
                    return False
            except Exception:
                continue
        return True

    @staticmethod
    def finish_deletes(
        pending: PendingDeletes, results: dict[TopicPartition, DeleteRecordsResult], timeout_ms: int
    ) -> None:
        """Fill in each pending partition's outcome (after the wait): its low watermark, or
        REQUEST_TIMED_OUT, or the error that ended its leadership."""
        for tp, (p, target) in pending.partitions.items():
            try:
                low = p.low_watermark()
                if low >= target:
                    results[tp] = DeleteRecordsResult(None, low)
                else:
                    results[tp] = DeleteRecordsResult(
                        RequestTimedOutError(
                            f"{tp[0]}-{tp[1]}: the in-sync replicas did not reach log start offset {target} "
                            f"within {timeout_ms} ms (low watermark {low})"
                        )
                    )
            except Exception as exc:
                results[tp] = DeleteRecordsResult(as_response_error(exc))

    async def delete_records_async(
        self, offload: Offload, timeout_ms: int, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, DeleteRecordsResult]:
        """:meth:`delete_records` on the request pool, then the wait for the ISR parked in
        the purgatory (Kafka's DelayedDeleteRecords; no thread held)."""
        results, pending = await offload(self.delete_records, offsets)
        if pending.partitions:
            await self._park(list(pending.partitions), lambda: self.deletes_ready(pending), timeout_ms)
            self.finish_deletes(pending, results, timeout_ms)
        return results  # type: ignore[no-any-return]

    # --- list offsets --------------------------------------------------------------

    def list_offset(
        self,
        topic: str,
        index: int,
        timestamp: int,
        replica_id: int,
        current_leader_epoch: int = -1,
        isolation: IsolationLevel = IsolationLevel.READ_UNCOMMITTED,
    ) -> OffsetResult:
        """Kafka's ListOffsets: a consumer's "latest" is the high watermark, or the last
        stable offset with read_committed, and no answer reaches past it."""
        try:
            p = self.partition(topic, index)
            if replica_id >= 0:
                p.check_replica(replica_id)
            if not p.is_leader and replica_id < 0:
                raise NotLeaderForPartitionError(f"broker {self.broker_id} is not the leader of {topic}-{index}")
            p.check_epoch(current_leader_epoch)
            epoch = p.leader_epoch
            if timestamp == EARLIEST_TIMESTAMP:
                return OffsetResult(None, p.log.log_start_offset, -1, epoch)
            if replica_id >= 0:
                visible = p.log.log_end_offset
            elif isolation is IsolationLevel.READ_COMMITTED:
                visible = p.last_stable_offset
            else:
                visible = p.high_watermark
            if timestamp == LATEST_TIMESTAMP:
                return OffsetResult(None, visible, -1, epoch)
            if timestamp < 0:
                raise InvalidRequestError(f"timestamp {timestamp} is neither -1 (latest), -2 (earliest) nor >= 0")
            found = p.log.offset_for_timestamp(timestamp)
            if found is None or found[0] >= visible:
                return OffsetResult(None, -1, -1, epoch)
            return OffsetResult(None, found[0], found[1], epoch)
        except Exception as exc:
            return OffsetResult(as_response_error(exc))

    def begin_controlled_shutdown(self) -> None:
        """This broker is leaving: from now on, a partition whose ISR no longer holds it
        (the controller's controlled shutdown removes it) is not fetched any more."""
        self._leaving.set()

    def shutdown(self) -> None:
        self._stopped.set()
        self._isr_changes.stop()
        for lane in self._lanes:
            lane.shutdown(wait=True, cancel_futures=True)
        self.fetchers.shutdown()
        self.purgatory.close()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.checkpoint_high_watermarks()
