"""Each broker's view of the cluster, kept current by ZooKeeper watches.

Watched: ``/brokers/ids`` (children and each broker's data), ``/controller``,
``/brokers/topics`` (children), each topic's assignment znode, its config znode and
each partition's state znode. Watch callbacks run on kazoo's callback thread and only
enqueue; one daemon thread (``metadata-events``) applies the changes in order and calls
the listeners, so a listener may do ZooKeeper or disk I/O without stalling kazoo.

Thread safety: readers take an immutable snapshot (``snapshot()``); the event thread
swaps in a new one under a lock. Listeners run on the event thread only.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import Assignment, BrokerInfo, LeaderAndIsr

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicInfo:
    name: str
    assignment: Assignment
    config: dict[str, str] = field(default_factory=dict)
    states: dict[int, LeaderAndIsr] = field(default_factory=dict)
    topic_id: str | None = None


@dataclass(frozen=True)
class ClusterSnapshot:
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    controller_id: int = -1
    topics: dict[str, TopicInfo] = field(default_factory=dict)

    def leader_of(self, topic: str, partition: int) -> int:
        info = self.topics.get(topic)
        state = info.states.get(partition) if info else None
        return state.leader if state else zkdata.NO_LEADER


PartitionListener = Callable[[str, int, list[int], LeaderAndIsr | None, dict[str, str], str | None], None]
"""(topic, partition, replicas, state or None if not yet elected, topic config, topic id)."""
TopicDeletedListener = Callable[[str], None]


class MetadataCache:
    """Cluster metadata from ZooKeeper, with change listeners."""

    def __init__(self, zk: ZkClient) -> None:
        self._zk = zk
        self._lock = threading.Lock()
        self._snapshot = ClusterSnapshot()
        self._events: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._partition_listeners: list[PartitionListener] = []
        self._deleted_listeners: list[TopicDeletedListener] = []
        self._broker_listeners: list[Callable[[], None]] = []
        self._watched_topics: set[str] = set()
        self._watched_partitions: set[tuple[str, int]] = set()
        self._thread = threading.Thread(target=self._run, name="metadata-events", daemon=True)
        self._changed = threading.Condition()
        self._stopped = False

    # --- public --------------------------------------------------------------------

    def on_partition_change(self, listener: PartitionListener) -> None:
        self._partition_listeners.append(listener)

    def on_topic_deleted(self, listener: TopicDeletedListener) -> None:
        self._deleted_listeners.append(listener)

    def on_brokers_change(self, listener: Callable[[], None]) -> None:
        self._broker_listeners.append(listener)

    def start(self) -> None:
        self._thread.start()
        ChildrenWatch(self._zk.kazoo, zkdata.BROKER_IDS, self._brokers_changed)
        DataWatch(self._zk.kazoo, zkdata.CONTROLLER, self._controller_changed)
        ChildrenWatch(self._zk.kazoo, zkdata.BROKER_TOPICS, self._topics_changed)

    def stop(self) -> None:
        self._stopped = True
        self._events.put(None)
        with self._changed:
            self._changed.notify_all()

    def snapshot(self) -> ClusterSnapshot:
        with self._lock:
            return self._snapshot

    def wait_for(self, predicate: Callable[[ClusterSnapshot], bool], timeout_s: float) -> bool:
        """Block until ``predicate(snapshot)`` holds or the timeout passes."""
        with self._changed:
            return (
                self._changed.wait_for(lambda: self._stopped or predicate(self.snapshot()), timeout=timeout_s)
                and not self._stopped
            )

    def sync(self, timeout_s: float = 10.0) -> None:
        """Wait until every event enqueued so far has been applied."""
        done = threading.Event()
        self._events.put(("barrier", done))
        done.wait(timeout_s)

    # --- watch callbacks (kazoo thread): enqueue only ------------------------------

    def _brokers_changed(self, children: list[str]) -> bool:
        if self._stopped:
            return False
        self._events.put(("brokers", tuple(children)))
        return True

    def _controller_changed(self, data: bytes | None, _stat: Any) -> bool:
        if self._stopped:
            return False
        self._events.put(("controller", data))
        return True

    def _topics_changed(self, children: list[str]) -> bool:
        if self._stopped:
            return False
        self._events.put(("topics", tuple(children)))
        return True

    def _watch_topic(self, topic: str) -> None:
        def on_assignment(data: bytes | None, _stat: Any) -> bool:
            if self._stopped or topic not in self._watched_topics:
                return False
            self._events.put(("assignment", topic, data))
            return True

        def on_config(data: bytes | None, _stat: Any) -> bool:
            if self._stopped or topic not in self._watched_topics:
                return False
            self._events.put(("config", topic, data))
            return True

        DataWatch(self._zk.kazoo, zkdata.topic_path(topic), on_assignment)
        DataWatch(self._zk.kazoo, zkdata.topic_config_path(topic), on_config)

    def _watch_partition(self, topic: str, partition: int) -> None:
        key = (topic, partition)

        def on_state(data: bytes | None, stat: Any) -> bool:
            if self._stopped or key not in self._watched_partitions:
                return False
            self._events.put(("state", topic, partition, data, stat.version if stat else -1))
            return True

        DataWatch(self._zk.kazoo, zkdata.partition_state_path(topic, partition), on_state)

    # --- event thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            try:
                self._apply(event)
            except Exception:
                log.exception("metadata event %s failed", event[0])
            with self._changed:
                self._changed.notify_all()

    def _publish(self, snap: ClusterSnapshot) -> None:
        with self._lock:
            self._snapshot = snap

    def _apply(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        snap = self.snapshot()
        if kind == "barrier":
            event[1].set()
        elif kind == "brokers":
            brokers: dict[int, BrokerInfo] = {}
            for child in event[1]:
                info = self._zk.broker(int(child))
                if info is not None:
                    brokers[info.broker_id] = info
            self._publish(replace(snap, brokers=brokers))
            for listener in self._broker_listeners:
                listener()
        elif kind == "controller":
            cid = zkdata.decode_controller(event[1]) if event[1] else -1
            self._publish(replace(snap, controller_id=cid))
        elif kind == "topics":
            current = set(event[1])
            for topic in sorted(current - self._watched_topics):
                self._watched_topics.add(topic)
                self._watch_topic(topic)
            for topic in sorted(self._watched_topics - current):
                self._drop_topic(topic)
        elif kind == "assignment":
            self._apply_assignment(snap, event[1], event[2])
        elif kind == "config":
            topic, data = event[1], event[2]
            tinfo = snap.topics.get(topic)
            if tinfo is not None:
                config = zkdata.decode_topic_config(data) if data else {}
                topics = dict(snap.topics)
                topics[topic] = replace(tinfo, config=config)
                self._publish(replace(snap, topics=topics))
                for p in tinfo.assignment:
                    self._notify(topic, p)
        elif kind == "state":
            _, topic, partition, data, version = event
            sinfo = snap.topics.get(topic)
            if sinfo is None:
                return
            states = dict(sinfo.states)
            if data:
                states[partition] = zkdata.decode_leader_and_isr(data, version)
            else:
                states.pop(partition, None)
            topics = dict(snap.topics)
            topics[topic] = replace(sinfo, states=states)
            self._publish(replace(snap, topics=topics))
            self._notify(topic, partition)

    def _apply_assignment(self, snap: ClusterSnapshot, topic: str, data: bytes | None) -> None:
        if data is None:
            if topic in snap.topics:
                self._drop_topic(topic)
            return
        assignment = zkdata.decode_assignment(data)
        topic_id = zkdata.decode_topic_id(data)
        old = snap.topics.get(topic)
        if old is None:
            config = self._zk.topic_config(topic)
            info = TopicInfo(topic, assignment, config, {}, topic_id)
        else:
            info = replace(old, assignment=assignment, topic_id=topic_id)
        topics = dict(snap.topics)
        topics[topic] = info
        self._publish(replace(snap, topics=topics))
        for p in sorted(assignment):
            if (topic, p) not in self._watched_partitions:
                self._watched_partitions.add((topic, p))
                self._watch_partition(topic, p)
            elif old is not None and old.topic_id != topic_id:
                self._notify(topic, p)  # the id arrived: replicas record it

    def _drop_topic(self, topic: str) -> None:
        self._watched_topics.discard(topic)
        self._watched_partitions = {k for k in self._watched_partitions if k[0] != topic}
        snap = self.snapshot()
        if topic in snap.topics:
            topics = dict(snap.topics)
            del topics[topic]
            self._publish(replace(snap, topics=topics))
            for listener in self._deleted_listeners:
                listener(topic)

    def _notify(self, topic: str, partition: int) -> None:
        info = self.snapshot().topics.get(topic)
        if info is None or partition not in info.assignment:
            return
        for listener in self._partition_listeners:
            listener(
                topic, partition, info.assignment[partition], info.states.get(partition), info.config, info.topic_id
            )
