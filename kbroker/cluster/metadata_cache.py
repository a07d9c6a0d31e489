"""Each broker's view of the cluster: membership, topics and configs from ZooKeeper
watches, partition states from the controller.

Watched: ``/brokers/ids`` (children), ``/controller``, ``/brokers/topics`` (children),
each topic's assignment znode and its config znode. Partition states (leader, epoch,
ISR) are not watched: the active controller sends them in batches over the controller
channel (LeaderAndIsr to the replicas, UpdateMetadata to every broker;
:meth:`apply_controller_states`). They are kept by topic incarnation (topic id), apart
from the topic entries, so a state that arrives before its topic's znode is read waits
for it. A request from an older controller epoch than the newest seen, or naming an
older registration of this broker, is refused and changes nothing; within a partition
a state older than the one held (lower leader epoch, or same epoch and lower znode
version) is ignored.

Watches are plain one-shot ZooKeeper watches that all share one callback, which runs
on kazoo's callback thread and only enqueues the znode's path; one daemon thread
(``metadata-events``) re-reads the znode (re-arming the watch), applies the change and
calls the listeners, so a listener may do ZooKeeper or disk I/O without stalling kazoo.
Many znodes at once (a new topic's partition states, a resync) are read with pipelined
async requests. kazoo's watch recipes are not used: each spawns a thread per znode on
every reconnect (3,011 threads at 1,500 partitions), while this cache runs on exactly
one thread whatever the partition count. kazoo forgets every watch when its connection
drops, so on reconnect one ``resync`` event re-reads every znode, re-arms its watch and
notifies the listeners of what changed meanwhile.

Events are applied in batches: the event thread drains its queue, coalesces the
watched paths (a znode named twice is read once), reads them with one pipelined round,
applies the controller's states that arrived meanwhile, publishes one snapshot and
notifies the listeners of exactly the partitions whose view changed, then logs one
summary line for the batch. The work for a batch is O(events), not O(partitions of the
cluster): a state touches only its partition's entries (a topic's states are copied once
per batch), and only the topics and partitions the batch touched are compared and
notified. Derived views (:meth:`ClusterSnapshot.offline_count`,
:meth:`ClusterSnapshot.leader_counts`) are computed lazily, once per snapshot.

Listeners: a partition listener is called for each partition when it is first seen
(state None until the controller elects a leader), and again when its state, its
replicas, its topic's config or its topic id change.

Thread safety: readers take an immutable snapshot (``snapshot()``); the event thread
swaps in a new one under a lock. Listeners run on the event thread only.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent, ZnodeStat

from kbroker.cluster import zkdata
from kbroker.cluster.controller_channel import PartitionStateUpdate
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import Assignment, BrokerInfo, LeaderAndIsr
from kclient.errors import (
    BrokerResponseError,
    RequestTimedOutError,
    StaleBrokerEpochError,
    StaleControllerEpochError,
    UnknownTopicOrPartitionError,
)

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 30.0
APPLY_TIMEOUT_S = 30.0
"""How long a controller request waits for the event thread to apply it."""


@dataclass(frozen=True)
class TopicInfo:
    name: str
    assignment: Assignment
    config: dict[str, str] = field(default_factory=dict)
    states: dict[int, LeaderAndIsr] = field(default_factory=dict)
    topic_id: str | None = None
    adding: Assignment = field(default_factory=dict)
    """Partitions being reassigned -> replicas being added (``assignment`` is the full set)."""
    removing: Assignment = field(default_factory=dict)
    """Partitions being reassigned -> replicas being removed."""


@dataclass(frozen=True)
class ClusterSnapshot:
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    controller_id: int = -1
    topics: dict[str, TopicInfo] = field(default_factory=dict)

    def leader_of(self, topic: str, partition: int) -> int:
        info = self.topics.get(topic)
        state = info.states.get(partition) if info else None
        return state.leader if state else zkdata.NO_LEADER

    def has_partition(self, topic: str, partition: int) -> bool:
        info = self.topics.get(topic)
        return info is not None and partition in info.assignment

    def unknown_partitions(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], BrokerResponseError]:
        """UNKNOWN_TOPIC_OR_PARTITION for each of ``partitions`` that does not exist."""
        return {
            (t, p): UnknownTopicOrPartitionError(f"{t}-{p} does not exist")
            for t, p in partitions
            if not self.has_partition(t, p)
        }

    @cached_property
    def offline_count(self) -> int:
        """Partitions without a live leader (computed once per snapshot, on first use)."""
        return sum(
            1
            for info in self.topics.values()
            for state in info.states.values()
            if state.leader < 0 or state.leader not in self.brokers
        )

    @cached_property
    def leader_counts(self) -> Counter[int]:
        """Broker id -> partitions it leads (computed once per snapshot, on first use)."""
        return Counter(state.leader for info in self.topics.values() for state in info.states.values())


def _broker_or_none(broker_id: int) -> str:
    return f"broker {broker_id}" if broker_id >= 0 else "none"


PartitionListener = Callable[[str, int, list[int], LeaderAndIsr | None, dict[str, str], str | None], None]
"""(topic, partition, replicas, state or None if not yet elected, topic config, topic id)."""
TopicDeletedListener = Callable[[str], None]

Read = tuple[bytes | None, ZnodeStat | None]
"""A znode's (data, stat); (None, None) if it does not exist."""


class MetadataCache:
    """Cluster metadata from ZooKeeper, with change listeners."""

    def __init__(self, zk: ZkClient, broker_epoch: Callable[[], int] | None = None) -> None:
        self._zk = zk
        self._broker_epoch = broker_epoch or (lambda: -1)
        self._controller_epoch = -1
        """The newest controller epoch seen in a controller request (under ``_lock``)."""
        self._controller_states: dict[str, tuple[str, dict[int, LeaderAndIsr]]] = {}
        """Event thread only: topic -> (topic id or "", partition -> the newest state the
        controller sent), for the newest incarnation the controller named."""
        self._ended_topic_ids: set[str] = set()
        """Event thread only: the ids of topic incarnations seen deleted or replaced. A
        controller state naming one was sent before the deletion and arrived after it: it
        is dropped, or a recreated topic's znode read before its new id is written would
        take it (an old leader epoch on the new incarnation's empty log). A few bytes per
        deleted topic, kept for the broker's life."""
        self._lock = threading.Lock()
        self._snapshot = ClusterSnapshot()
        self._events: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._partition_listeners: list[PartitionListener] = []
        self._deleted_listeners: list[TopicDeletedListener] = []
        self._broker_listeners: list[Callable[[], None]] = []
        # Event thread only: watched znode path -> ("assignment"|"config", topic); each
        # topic's watched paths.
        self._paths: dict[str, tuple[Any, ...]] = {}
        self._topic_paths: dict[str, set[str]] = {}
        self._thread = threading.Thread(target=self._run, name="metadata-events", daemon=True)
        self._changed = threading.Condition()
        self._loaded = threading.Event()
        """Set once the first resync has read the brokers, the controller and the topics."""
        self._stopped = False
        self._disconnected = False

    # --- public --------------------------------------------------------------------

    def on_partition_change(self, listener: PartitionListener) -> None:
        self._partition_listeners.append(listener)

    def on_topic_deleted(self, listener: TopicDeletedListener) -> None:
        self._deleted_listeners.append(listener)

    def on_brokers_change(self, listener: Callable[[], None]) -> None:
        self._broker_listeners.append(listener)

    def start(self) -> None:
        self._zk.add_state_listener(self._session_state)
        self._events.put(("resync",))  # the first load is a resync from an empty cache
        self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._events.put(None)
        with self._changed:
            self._changed.notify_all()

    def snapshot(self) -> ClusterSnapshot:
        with self._lock:
            return self._snapshot

    def loaded(self) -> bool:
        """Whether the first read of the cluster is done: until then the snapshot is empty
        (no brokers, no topics), not the cluster's."""
        return self._loaded.is_set()

    def wait_loaded(self, timeout_s: float) -> bool:
        return self._loaded.wait(timeout_s)

    def wait_for(self, predicate: Callable[[ClusterSnapshot], bool], timeout_s: float) -> bool:
        """Block until ``predicate(snapshot)`` holds or the timeout passes."""
        with self._changed:
            return (
                self._changed.wait_for(lambda: self._stopped or predicate(self.snapshot()), timeout=timeout_s)
                and not self._stopped
            )

    def apply_controller_states(
        self,
        controller_id: int,
        controller_epoch: int,
        broker_epoch: int,
        updates: list[PartitionStateUpdate],
        timeout_s: float = APPLY_TIMEOUT_S,
    ) -> None:
        """A LeaderAndIsr or UpdateMetadata request: apply ``updates`` (on the event thread,
        listeners included) and return once applied.

        Raises StaleControllerEpochError for an older controller epoch than the newest
        seen, StaleBrokerEpochError when ``broker_epoch`` names an older registration of
        this broker (both change nothing), RequestTimedOutError after ``timeout_s``.
        """
        mine = self._broker_epoch()
        if 0 < broker_epoch < mine:  # (0 or -1: the sender does not know it)
            raise StaleBrokerEpochError(
                f"controller {controller_id} addressed broker epoch {broker_epoch}; this broker's is {mine}"
            )
        with self._lock:
            if controller_epoch < self._controller_epoch:
                raise StaleControllerEpochError(
                    f"controller {controller_id} has epoch {controller_epoch}; "
                    f"epoch {self._controller_epoch} has been seen"
                )
            self._controller_epoch = controller_epoch
        done = threading.Event()
        self._events.put(("controller", updates, done))
        if not done.wait(timeout_s):
            raise RequestTimedOutError(f"{len(updates)} partition state(s) not applied within {timeout_s} s")

    def sync(self, timeout_s: float = 10.0) -> None:
        """Wait until every event enqueued so far has been applied."""
        done = threading.Event()
        self._events.put(("barrier", done))
        done.wait(timeout_s)

    # --- kazoo threads: enqueue only -----------------------------------------------

    def _watch(self, event: WatchedEvent) -> None:
        if self._stopped or event.type == EventType.NONE or not event.path:
            return  # NONE: the connection dropped and kazoo forgot the watch; resync re-arms
        self._events.put(("path", event.path))

    def _session_state(self, state: KazooState) -> None:
        if self._stopped:
            return
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            self._disconnected = True
        elif state == KazooState.CONNECTED and self._disconnected:
            self._disconnected = False
            self._events.put(("resync",))

    # --- reads (event thread) ------------------------------------------------------

    def _read(self, paths: Iterable[str]) -> dict[str, Read]:
        """Read ``paths`` with pipelined requests, each arming a watch (exists if absent)."""
        kazoo = self._zk.kazoo
        pending = [(p, kazoo.get_async(p, watch=self._watch)) for p in paths]
        out: dict[str, Read] = {}
        absent: list[str] = []
        for path, result in pending:
            try:
                out[path] = result.get(timeout=READ_TIMEOUT_S)
            except NoNodeError:
                absent.append(path)
        for path, result in [(p, kazoo.exists_async(p, watch=self._watch)) for p in absent]:
            if result.get(timeout=READ_TIMEOUT_S) is not None:
                self._events.put(("path", path))  # created meanwhile: read it again
            out[path] = (None, None)
        return out

    def _children(self, path: str) -> list[str]:
        try:
            return list(self._zk.kazoo.get_children(path, watch=self._watch))
        except NoNodeError:
            self._zk.kazoo.exists(path, watch=self._watch)
            return []

    # --- event thread --------------------------------------------------------------

    def _run(self) -> None:
        while self._step():
            pass

    def _step(self, block: bool = True) -> bool:
        """Drain the queue and apply what it held as one batch; False once stopped."""
        batch: list[tuple[Any, ...]] = []
        stop = False
        try:
            event = self._events.get(block=block)
            while True:
                if event is None:
                    stop = True
                    break
                batch.append(event)
                event = self._events.get_nowait()
        except queue.Empty:
            pass
        try:
            self._apply_batch(batch)
        finally:
            for event in batch:
                if event[0] == "barrier":
                    event[1].set()
                elif event[0] == "controller":
                    event[2].set()
            with self._changed:
                self._changed.notify_all()
        return not stop

    def _guarded(self, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except (ConnectionLoss, SessionExpiredError) as exc:
            # The reconnect's resync reads everything again.
            log.warning("metadata event %s: ZooKeeper unreachable (%r)", what, exc)
        except Exception:
            log.exception("metadata event %s failed", what)

    def _publish(self, snap: ClusterSnapshot) -> None:
        with self._lock:
            self._snapshot = snap

    def _apply_batch(self, batch: list[tuple[Any, ...]]) -> None:
        """Apply a batch of events: each watched znode is read once, the topic znodes
        of the whole batch together (one pipelined round, one snapshot, one summary line)."""
        resync = any(e[0] == "resync" for e in batch)
        paths = dict.fromkeys(e[1] for e in batch if e[0] == "path")
        if resync:
            # Everything is read again (and every watch re-armed): the paths go with it.
            self._guarded("resync", self._resync)
        else:
            self._apply_paths(paths)
        updates = [u for e in batch if e[0] == "controller" for u in e[1]]
        if updates:
            self._guarded("controller states", lambda: self._apply_controller_states(updates))

    def _apply_paths(self, paths: dict[str, None]) -> None:
        if zkdata.BROKER_IDS in paths:
            self._guarded("path", self._read_brokers)
        if zkdata.CONTROLLER in paths:
            self._guarded("path", self._read_controller)
        topic_paths: list[str] = []
        if zkdata.BROKER_TOPICS in paths:
            self._guarded("path", lambda: topic_paths.extend(self._read_topics(resync=False)))
        new_topics = set(topic_paths)
        topic_paths += [p for p in paths if p in self._paths and p not in new_topics]
        if topic_paths:
            self._guarded("path", lambda: self._read_topic_znodes(topic_paths))

    def _resync(self) -> None:
        """Re-read everything (start-up, reconnect), re-arm every watch, notify changes."""
        self._read_brokers()
        self._read_controller()
        topics = self._read_topics(resync=True)
        try:
            self._read_topic_znodes(topics)
        finally:  # the brokers and the topics are read: a failure past here is logged, as before
            self._loaded.set()

    def _read_brokers(self) -> None:
        brokers: dict[int, BrokerInfo] = {}
        for child in self._children(zkdata.BROKER_IDS):
            if child.isdigit():
                info = self._zk.broker(int(child))
                if info is not None:
                    brokers[info.broker_id] = info
        snap = self.snapshot()
        if brokers == snap.brokers:
            return
        self._log_membership(snap.brokers, brokers)
        self._publish(replace(snap, brokers=brokers))
        for listener in self._broker_listeners:
            listener()

    def _read_controller(self) -> None:
        data, _ = self._read([zkdata.CONTROLLER])[zkdata.CONTROLLER]
        cid = zkdata.decode_controller(data) if data else -1
        snap = self.snapshot()
        if cid != snap.controller_id:
            self._publish(replace(snap, controller_id=cid))
            if cid >= 0:
                epoch, _ = self._zk.controller_epoch()
                log.info(
                    "controller change: broker %d (epoch %d), was %s", cid, epoch, _broker_or_none(snap.controller_id)
                )
            elif snap.controller_id >= 0:
                log.info("controller change: broker %d resigned or was lost; no controller yet", snap.controller_id)

    @staticmethod
    def _log_membership(old: dict[int, BrokerInfo], new: dict[int, BrokerInfo]) -> None:
        """One line per broker registered or lost (every broker logs what it sees)."""
        if not old:
            log.info("live brokers: %s", ", ".join(f"{b} at {new[b].address}" for b in sorted(new)) or "none")
            return
        for b in sorted(old.keys() - new.keys()):
            log.warning("broker %d lost (was at %s): its registration in ZooKeeper ended", b, old[b].address)
        for b in sorted(new.keys() - old.keys()):
            log.info("broker %d registered at %s (broker epoch %d)", b, new[b].address, new[b].epoch)
        for b in sorted(old.keys() & new.keys()):
            if old[b].epoch != new[b].epoch:
                log.info(
                    "broker %d re-registered at %s (broker epoch %d, was %d)",
                    b,
                    new[b].address,
                    new[b].epoch,
                    old[b].epoch,
                )

    def _read_topics(self, *, resync: bool) -> list[str]:
        """Read the topic list (dropping deleted topics); the topic znode paths to read."""
        current = {zkdata.decode_segment(c) for c in self._children(zkdata.BROKER_TOPICS)}
        known = set(self.snapshot().topics)
        for topic in sorted(known - current):
            self._drop_topic(topic)
        topics = current if resync else current - known
        paths: list[str] = []
        for topic in sorted(topics):
            try:
                tpath, cpath = zkdata.topic_path(topic), zkdata.topic_config_path(topic)
            except Exception:
                log.warning("ignoring znode %r under %s: not a topic name", topic, zkdata.BROKER_TOPICS)
                continue
            self._watch_path(tpath, ("assignment", topic))
            self._watch_path(cpath, ("config", topic))
            paths += [tpath, cpath]
        return paths

    def _watch_path(self, path: str, key: tuple[Any, ...]) -> None:
        self._paths[path] = key
        self._topic_paths.setdefault(key[1], set()).add(path)

    def _read_topic_znodes(self, paths: list[str]) -> None:
        """Read topic znodes, publish one snapshot, then notify every partition whose view
        changed. O(znodes read): only the topics named by ``paths`` are touched."""
        started = time.monotonic()
        old = self.snapshot().topics
        topics = dict(old)
        touched: dict[str, set[int] | None] = {}
        deleted: set[str] = set()
        reads = self._read(paths)
        # Assignments first: they create a topic's entry, its config fills it.
        for path, (data, _stat) in sorted(reads.items(), key=lambda r: _ORDER[self._paths[r[0]][0]]):
            kind, topic = self._paths[path][:2]
            info = topics.get(topic)
            try:
                if kind == "assignment":
                    if data is None:
                        deleted.add(topic)
                        continue
                    znode = zkdata.decode_topic_znode(data)
                    if info is None:
                        info = TopicInfo(topic, znode.partitions)
                    elif info.topic_id and znode.topic_id and info.topic_id != znode.topic_id:
                        self._ended_topic_ids.add(info.topic_id)  # recreated between two reads
                    topics[topic] = replace(
                        info,
                        assignment=znode.partitions,
                        topic_id=znode.topic_id,
                        adding=znode.adding,
                        removing=znode.removing,
                        states=self._states_of(topic, znode.topic_id),
                    )
                    touched[topic] = None
                elif info is not None:  # else the topic's assignment is gone or unread: it brings the rest
                    topics[topic] = replace(info, config=zkdata.decode_topic_config(data) if data else {})
                    touched[topic] = None
            except Exception:
                log.exception("cannot apply znode %s", path)
        self._publish(replace(self.snapshot(), topics=topics))
        for topic in sorted(deleted):
            self._drop_topic(topic)
        self._notify_changes(old, topics, touched, deleted, started)

    def _states_of(self, topic: str, topic_id: str | None) -> dict[int, LeaderAndIsr]:
        """The controller's states of ``topic`` if they are of incarnation ``topic_id``."""
        entry = self._controller_states.get(topic)
        if entry is None or not _same_incarnation(entry[0], topic_id):
            return {}
        return dict(entry[1])

    def _apply_controller_states(self, updates: list[PartitionStateUpdate]) -> None:
        """Keep the newest state of each partition (per incarnation), then publish and
        notify the topics known here whose states changed."""
        started = time.monotonic()
        touched: dict[str, set[int] | None] = {}
        late: Counter[str] = Counter()
        for u in updates:
            if u.topic_id in self._ended_topic_ids:
                late[u.topic] += 1
                continue
            entry = self._controller_states.get(u.topic)
            if entry is None or (u.topic_id and entry[0] != u.topic_id):
                entry = self._controller_states[u.topic] = (u.topic_id, {})  # a (new) incarnation
            held = entry[1].get(u.partition)
            new = u.state
            if held is not None and (new.leader_epoch, new.zk_version) < (held.leader_epoch, held.zk_version):
                continue  # older than what the controller already told us
            entry[1][u.partition] = new
            parts = touched.setdefault(u.topic, set())
            assert parts is not None
            parts.add(u.partition)
        for topic, n in sorted(late.items()):
            log.info("topic %s: dropped %d late state(s) of a deleted incarnation", topic, n)
        old = self.snapshot().topics
        topics = dict(old)
        for topic in list(touched):
            info = topics.get(topic)
            if info is None or not _same_incarnation(self._controller_states[topic][0], info.topic_id):
                del touched[topic]  # its topic znode brings the states when read
                continue
            topics[topic] = replace(info, states=self._states_of(topic, info.topic_id))
        if touched:
            self._publish(replace(self.snapshot(), topics=topics))
        self._notify_changes(old, topics, touched, set(), started)

    def _notify_changes(
        self,
        old: dict[str, TopicInfo],
        topics: dict[str, TopicInfo],
        touched: dict[str, set[int] | None],
        deleted: set[str],
        started: float,
    ) -> None:
        """Notify each touched partition (None: every partition of the topic) whose view
        changed, and log one line for the batch."""
        summary: Counter[str] = Counter()
        for topic in sorted(touched):
            info = topics.get(topic)
            if topic in deleted or info is None:
                continue
            before = old.get(topic)
            parts = touched[topic]
            for p in sorted(info.assignment if parts is None else parts):
                if p not in info.assignment:
                    continue
                if before is None or _partition_view(before, p) != _partition_view(info, p):
                    summary[_change_kind(before, info, p)] += 1
                    summary["topics:" + topic] = 1
                    self._notify(info, p)
        self._log_batch(summary, len(deleted), time.monotonic() - started)

    @staticmethod
    def _log_batch(summary: Counter[str], deleted: int, took_s: float) -> None:
        """One line per batch: INFO when a partition is new or changed leader (or lost it),
        DEBUG when only ISRs or configs changed (routine, and frequent under load)."""
        changed = sum(n for k, n in summary.items() if not k.startswith("topics:"))
        if not changed and not deleted:
            return
        topics = sum(1 for k in summary if k.startswith("topics:"))
        kinds = ", ".join(f"{summary[k]} {k}" for k in _KINDS if summary[k])
        level = (
            logging.INFO
            if summary["new"] or summary["new leader"] or summary["no leader"] or deleted
            else logging.DEBUG
        )
        log.log(
            level,
            "metadata: applied %d partition change(s) over %d topic(s)%s in %.3f s (%s)",
            changed,
            topics,
            f", {deleted} topic(s) deleted" if deleted else "",
            took_s,
            kinds or "none",
        )

    def _forget_paths(self, topic: str) -> None:
        for path in self._topic_paths.pop(topic, ()):
            self._paths.pop(path, None)

    def _drop_topic(self, topic: str) -> None:
        self._forget_paths(topic)
        snap = self.snapshot()
        entry = self._controller_states.get(topic)
        info = snap.topics.get(topic)
        if info is not None and info.topic_id:
            self._ended_topic_ids.add(info.topic_id)
        if entry is not None and (info is None or _same_incarnation(entry[0], info.topic_id)):
            del self._controller_states[topic]  # not a newer incarnation's, sent ahead of its znode
        if topic in snap.topics:
            topics = dict(snap.topics)
            del topics[topic]
            self._publish(replace(snap, topics=topics))
            for listener in self._deleted_listeners:
                listener(topic)

    def _notify(self, info: TopicInfo, partition: int) -> None:
        for listener in self._partition_listeners:
            listener(
                info.name,
                partition,
                info.assignment[partition],
                info.states.get(partition),
                info.config,
                info.topic_id,
            )


_ORDER = {"assignment": 0, "config": 1}


def _same_incarnation(a: str | None, b: str | None) -> bool:
    """Do two topic ids name the same incarnation (an unknown id matches any)?"""
    return not a or not b or a == b


_KINDS = ("new", "new leader", "no leader", "isr", "replicas", "config")


def _change_kind(before: TopicInfo | None, after: TopicInfo, partition: int) -> str:
    """How a partition's view changed, for the batch's summary line."""
    old = before.states.get(partition) if before is not None else None
    new = after.states.get(partition)
    if before is None or partition not in before.assignment:
        return "new"
    if new is not None and (old is None or (old.leader, old.leader_epoch) != (new.leader, new.leader_epoch)):
        return "new leader" if new.has_leader else "no leader"
    if old != new:
        return "isr"
    if before.assignment.get(partition) != after.assignment.get(partition):
        return "replicas"
    return "config"


def _partition_view(info: TopicInfo, partition: int) -> tuple[Any, ...]:
    """What a partition listener is told about ``partition``; notify when it changes."""
    return (info.assignment.get(partition), info.states.get(partition), info.config, info.topic_id)
