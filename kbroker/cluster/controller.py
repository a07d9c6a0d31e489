"""The controller: one broker, elected through ZooKeeper, that owns partition state.

Election: every broker watches ``/controller``; when it is absent each tries
:meth:`ZkClient.try_become_controller` (create the ephemeral ``/controller`` and bump
``/controller_epoch`` in one transaction). The winner runs the controller event loop;
every write it makes to partition state is fenced by the ``/controller_epoch`` znode
version, so a deposed controller cannot overwrite its successor.

The controller reacts to:

* new topics and new partitions (``/brokers/topics`` and each topic's znode): it
  creates ``partitions/<p>/state`` with leader = the first live replica in assignment
  order, ISR = the live replicas, leader epoch 0;
* deletion markers (``/admin/delete_topics``): it removes the topic's znodes; brokers
  drop their logs when the topic vanishes from their metadata;
* broker membership (``/brokers/ids``): partitions led by a broker that vanished get a
  new leader from the live ISR (first in assignment order; unclean election only when
  the topic enables it), the ISR loses the dead broker but never its last member, and
  the leader epoch goes up by one. Offline partitions come back when an ISR member
  returns. A partition whose in-sync replicas this controller has not yet seen alive
  (a cluster starting up) is logged at INFO; losing the last in-sync replica that was
  alive is an ERROR.
* partition reassignment (:mod:`kbroker.cluster.reassignment`): the request znode
  ``/admin/reassign_partitions`` (created or changed) and :meth:`alter_partition_reassignments`
  start, replace or cancel moves (step U); a move completes (step B) when its target is in
  sync, checked when a leader announces an ISR change of a moving partition, on
  membership changes and every ``REASSIGN_TICK_S`` while anything moves. A new
  controller resumes from the topic znodes. Preferred-leader elections skip moving
  partitions.
* controlled shutdown (KIP-380): the request names the broker's epoch, the czxid of its
  current ``/brokers/ids/<id>``; a missing or stale one is refused
  (StaleBrokerEpochError). The broker counts as shutting down only while that very
  registration lives: it ends when the broker re-registers or its session ends.

Batches: every event that changes many partitions (membership, controlled shutdown,
preferred election, new partitions) decides every new leader and ISR from the
controller's cache and writes them all pipelined (:meth:`ZkClient.update_partition_states`
/ ``create_partition_states``: one small transaction per partition, each fenced by the
``/controller_epoch`` version and compare-and-set on the state's znode version). Only the
partitions whose version check failed (a leader changed its ISR meanwhile) are re-read
and decided again. One summary line per batch; per-partition lines at their own level for the first
:data:`PARTITION_LINES_MAX` of an event (a small failure tells its whole story), the rest
at DEBUG (Kafka 1.1's fix was partly log volume).

The cache: the topic znodes and partition states, read from ZooKeeper once per election
(pipelined) and kept current by the topic watches, this controller's own writes and the
leaders' ISR change notifications (``/isr_change_notification``). A failover or a
broker's death therefore reads nothing from ZooKeeper again; a stale entry only costs a
failed compare-and-set.

The controller channel (:mod:`kbroker.cluster.controller_channel`): whatever a batch
wrote goes to the brokers in one LeaderAndIsr per replica and one UpdateMetadata per
live broker; a broker new to the channel (the controller's first round, a registration
or re-registration) gets every partition's state. Brokers do not watch partition-state
znodes. ISR changes made by leaders reach the controller as sequential notification
znodes (batched by the leaders) and go out in UpdateMetadata.

A controlled shutdown first marks the broker's registration (its znode's data version,
see :meth:`ZkClient.mark_broker_shutting_down`), which leaders check when they write an
ISR, then moves all its leaderships and ISR memberships in one batch before answering.

Watches: a fixed set of kazoo recipes (``/controller``, ``/brokers/ids``,
``/brokers/topics``, ``/admin/delete_topics``, the preferred-election and reassignment
znodes, ``/isr_change_notification``), set once at start, plus one plain ZooKeeper
watch per topic znode, all with the same callback.
kazoo's recipes spawn a thread per recipe on every reconnect; plain watches spawn none,
so a reconnect costs a bounded number of threads however many topics exist. kazoo
forgets plain watches when the connection drops, so on reconnect the controller re-arms
them and re-reads every topic.

Thread safety: watch callbacks only enqueue; one daemon thread (``controller-events``)
does all the work.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import replace
from typing import Any, Protocol

from kazoo.exceptions import BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError, SessionExpiredError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from kbroker.cluster import zkdata
from kbroker.cluster.controller_channel import ChannelFactory, ControllerChannel, PartitionStateUpdate
from kbroker.cluster.reassignment import Moves, ReassignmentManager
from kbroker.cluster.zk_client import ControllerMovedError, ZkClient
from kbroker.cluster.zk_errors import ZooKeeperError
from kbroker.cluster.zkdata import Assignment, BrokerInfo, LeaderAndIsr, Reassignment, TopicZNode
from kclient.errors import (
    BrokerNotAvailableError,
    KafkaError,
    RequestTimedOutError,
    StaleBrokerEpochError,
)

log = logging.getLogger(__name__)

UNCLEAN_KEY = "unclean.leader.election.enable"
REASSIGN_TICK_S = 5.0  # while a move is under way, try to complete it at least this often

TP = tuple[str, int]
_Change = tuple[int, list[int], str]  # new leader, new ISR, reason
MAX_BATCH_ROUNDS = 5  # re-reads of partitions whose compare-and-set failed, per batch
PARTITION_LINES_MAX = 10
"""An event logs at most this many per-partition lines at their own level (a small
failure tells its whole story); the rest go at DEBUG, and one line says how many."""
CONTROLLED_SHUTDOWN_ACK_S = 10.0
"""How long a controlled shutdown waits for the new leaders to confirm (LeaderAndIsr)."""


class ChannelLike(Protocol):
    """What the controller needs of a :class:`ControllerChannel` (tests pass a fake)."""

    def set_brokers(self, live: dict[int, BrokerInfo]) -> list[int]: ...

    def send(
        self,
        leader_and_isr: dict[int, list[PartitionStateUpdate]],
        update_metadata: list[PartitionStateUpdate],
        to: Any = None,
    ) -> dict[int, Future[None]]: ...

    def close(self) -> None: ...


ChannelMaker = Callable[[int, int], ChannelLike]
"""(controller id, controller epoch) -> the channel of that controller tenure."""


def grpc_channel_maker(channel: ChannelFactory) -> ChannelMaker:
    def make(controller_id: int, epoch: int) -> ChannelLike:
        return ControllerChannel(controller_id, epoch, channel)  # type: ignore[return-value]

    return make


class _PartitionLines:
    """The per-partition log lines of one controller event, emitted bounded (:data:`PARTITION_LINES_MAX`)."""

    def __init__(self) -> None:
        self._lines: list[tuple[int, str, tuple[Any, ...]]] = []

    def add(self, level: int, msg: str, *args: Any) -> None:
        self._lines.append((level, msg, args))

    def emit(self) -> None:
        lines, self._lines = self._lines, []
        for level, msg, args in lines[:PARTITION_LINES_MAX]:
            log.log(level, msg, *args)
        rest = lines[PARTITION_LINES_MAX:]
        for _, msg, args in rest:
            log.debug(msg, *args)
        if rest:
            log.log(
                max(level for level, _, _ in rest),
                "controller: %d more partition line(s) of this event at DEBUG",
                len(rest),
            )


def _ids(brokers: list[int]) -> str:
    return ("broker " if len(brokers) == 1 else "brokers ") + ", ".join(map(str, brokers))


def _leader_name(leader: int) -> str:
    return "none" if leader == zkdata.NO_LEADER else str(leader)


class _ZkReassignmentStore:
    """ZkClient as a :class:`~kbroker.cluster.reassignment.ReassignmentStore`, every step
    fenced by this controller's ``/controller_epoch`` version."""

    def __init__(self, zk: ZkClient, epoch_zk_version: int) -> None:
        self._zk = zk
        self._epoch_zk_version = epoch_zk_version

    def topics(self) -> list[str]:
        return self._zk.topics()

    def topics_pending_deletion(self) -> list[str]:
        return self._zk.topics_pending_deletion()

    def topic_znode(self, topic: str) -> tuple[TopicZNode, int] | None:
        return self._zk.topic_znode(topic)

    def partition_state(self, topic: str, partition: int) -> LeaderAndIsr | None:
        return self._zk.partition_state(topic, partition)

    def reassignment_request(self) -> tuple[Reassignment, int] | None:
        try:
            return self._zk.reassignment_request()
        except KafkaError:  # malformed JSON: nothing in it can be carried out
            log.error("%s is malformed; deleting it", zkdata.REASSIGN_PARTITIONS)
            try:
                self._zk.kazoo.delete(zkdata.REASSIGN_PARTITIONS)
            except NoNodeError:
                pass
            return None

    def set_reassignment_request(self, parts: Reassignment, version: int) -> int:
        return self._zk.set_reassignment_request(parts, version)

    def delete_reassignment_request(self, version: int) -> None:
        self._zk.delete_reassignment_request(version)

    def commit_reassignment_step(
        self,
        topic: str,
        znode: TopicZNode,
        topic_version: int,
        states: dict[int, LeaderAndIsr],
        request: tuple[Reassignment | None, int] | None = None,
    ) -> int:
        return self._zk.commit_reassignment_step(self._epoch_zk_version, topic, znode, topic_version, states, request)


class Controller:
    """Controller election and, while elected, the controller's work."""

    def __init__(
        self,
        zk: ZkClient,
        broker_id: int,
        *,
        unclean_default: bool = False,
        auto_leader_rebalance: bool = True,
        leader_imbalance_check_interval_ms: int = 300000,
        channel: ChannelMaker | None = None,
    ) -> None:
        self._zk = zk
        self._new_channel = channel
        self._channel: ChannelLike | None = None
        # The controller's cache (event thread only; reset on each election): every
        # partition state read or written (None: no state znode), every topic znode.
        self._states: dict[TP, LeaderAndIsr | None] = {}
        self._znodes: dict[str, TopicZNode] = {}
        self._znodes_loaded = False
        self._full_sync: set[int] = set()
        """Brokers new to the channel: they get the whole state after the current event."""
        self._last_sent: dict[int, Future[None]] = {}
        self._lines = _PartitionLines()
        self.broker_id = broker_id
        self._unclean_default = unclean_default
        self._auto_rebalance = auto_leader_rebalance
        self._rebalance_interval_s = leader_imbalance_check_interval_ms / 1000.0
        self._next_rebalance = time.monotonic() + self._rebalance_interval_s
        self._events: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="controller-events", daemon=True)
        self._active = False
        self.epoch = 0
        self._epoch_zk_version = -1
        self._generation = 0  # bumped on each election won; stale watches check it
        self._topics: set[str] = set()
        self._stopped = False
        self._shutting_down: dict[int, int] = {}  # broker id -> registration epoch (czxid)
        self._seen: set[int] = set()  # brokers seen alive since this controller was elected
        self._suspended = False
        self._reassign = ReassignmentManager(_ZkReassignmentStore(zk, -1), 0)
        self._moving: set[TP] = set()  # reassigning partitions
        self._next_reassign_tick = 0.0

    @property
    def is_active(self) -> bool:
        return self._active

    def start(self) -> None:
        self._thread.start()
        self._zk.add_state_listener(self._session_state)
        DataWatch(self._zk.kazoo, zkdata.CONTROLLER, self._controller_changed)
        ChildrenWatch(self._zk.kazoo, zkdata.BROKER_IDS, self._enqueue_on_change("brokers"))
        ChildrenWatch(self._zk.kazoo, zkdata.BROKER_TOPICS, self._enqueue_on_change("topics"))
        ChildrenWatch(self._zk.kazoo, zkdata.DELETE_TOPICS, self._enqueue_on_change("deletions"))
        DataWatch(self._zk.kazoo, zkdata.PREFERRED_REPLICA_ELECTION, self._preferred_changed)
        DataWatch(self._zk.kazoo, zkdata.REASSIGN_PARTITIONS, self._reassign_changed)
        ChildrenWatch(self._zk.kazoo, zkdata.ISR_CHANGE_NOTIFICATION, self._enqueue_on_change("isr_changes"))

    def stop(self) -> None:
        self._stopped = True
        self._events.put(None)
        self._thread.join(timeout=5)
        self._deactivate()

    def _deactivate(self) -> None:
        """No longer controller: stale watches are ignored, the channel closes."""
        self._active = False
        self._generation += 1
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def resign(self) -> None:
        """Give up the controller role (on shutdown) so another broker takes over."""
        if self._active:
            self._active = False
            try:
                if self._zk.controller_id() == self.broker_id:
                    log.info("broker %d: resigning as controller (epoch %d): shutting down", self.broker_id, self.epoch)
                    self._zk.kazoo.delete(zkdata.CONTROLLER)
            except Exception:  # pragma: no cover - best effort at shutdown
                log.exception("could not resign as controller")

    # --- callbacks: enqueue only ---------------------------------------------------

    def _controller_changed(self, data: bytes | None, _stat: Any) -> bool:
        if self._stopped:
            return False
        self._events.put(("controller", data))
        return True

    def _session_state(self, state: KazooState) -> None:
        if state == KazooState.LOST:
            self._suspended = True
            self._events.put(("session_lost",))
        elif state == KazooState.SUSPENDED:
            self._suspended = True
        elif state == KazooState.CONNECTED and self._suspended:
            # kazoo dropped the plain topic watches with the connection: re-arm and re-read.
            self._suspended = False
            self._events.put(("resync", self._generation))

    def _enqueue_on_change(self, kind: str) -> Callable[[list[str]], bool]:
        def changed(_children: list[str]) -> bool:
            if self._stopped:
                return False
            self._events.put((kind, self._generation))
            return True

        return changed

    def _preferred_changed(self, data: bytes | None, _stat: Any) -> bool:
        if self._stopped:
            return False
        if data is not None:
            self._events.put(("elect_preferred", self._generation, zkdata.decode_preferred_election(data), "znode"))
        return True

    def _reassign_changed(self, data: bytes | None, _stat: Any) -> bool:
        if self._stopped:
            return False
        if data is not None:
            self._events.put(("reassign_znode", self._generation))
        return True

    def _topic_watch(self, event: WatchedEvent) -> None:
        """The one callback of every topic znode's plain watch (kazoo's callback thread)."""
        if self._stopped or event.type == EventType.NONE or not event.path:
            return  # NONE: the connection dropped; "resync" re-arms
        self._events.put(("topic", self._generation, zkdata.decode_segment(event.path.rsplit("/", 1)[1])))

    def _arm_topic_watch(self, topic: str) -> None:
        self._zk.kazoo.exists(zkdata.topic_path(topic), watch=self._topic_watch)

    # --- event thread --------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                event = self._events.get(timeout=1.0)
            except queue.Empty:
                if self._active and self._auto_rebalance and time.monotonic() >= self._next_rebalance:
                    self._next_rebalance = time.monotonic() + self._rebalance_interval_s
                    event = ("elect_preferred", self._generation, None, None)
                elif self._active and self._moving and time.monotonic() >= self._next_reassign_tick:
                    event = ("reassign_tick", self._generation)
                else:
                    continue
            if event is None:
                return
            try:
                try:
                    self._handle(event)
                    if self._full_sync and self._active:
                        self._send_full_state()
                finally:
                    self._lines.emit()
            except ControllerMovedError:
                log.warning(
                    "broker %d: controller moved (a newer epoch than %d exists); resigning", self.broker_id, self.epoch
                )
                self._deactivate()
            except Exception as exc:
                if isinstance(exc, (ConnectionLoss, SessionExpiredError)):
                    log.warning("controller event %s: ZooKeeper unreachable (%r); retrying in 1 s", event[0], exc)
                else:
                    log.exception("controller event %s failed; retrying in 1 s", event[0])
                if event[0] not in ("controlled_shutdown", "reassign_api") and not self._stopped:
                    retry = threading.Timer(1.0, self._events.put, args=(event,))
                    retry.daemon = True
                    retry.start()

    def _handle(self, event: tuple[Any, ...]) -> None:
        kind = event[0]
        if kind == "controller":
            if event[1] is None:
                self._elect()
            elif zkdata.decode_controller(event[1]) != self.broker_id and self._active:
                log.info(
                    "broker %d: no longer controller (epoch %d): broker %d is",
                    self.broker_id,
                    self.epoch,
                    zkdata.decode_controller(event[1]),
                )
                self._deactivate()
            return
        if kind == "session_lost":
            if self._active:
                log.warning(
                    "broker %d: ZooKeeper session lost; no longer controller (epoch %d)", self.broker_id, self.epoch
                )
            self._deactivate()
            return
        if kind == "controlled_shutdown":
            fut = event[3]
            if not self._active:
                fut.set_exception(ControllerMovedError(f"broker {self.broker_id} is not the controller"))
            else:
                try:
                    self._last_sent = {}
                    remaining = self._controlled_shutdown(event[1], event[2])
                    fut.set_result((remaining, self._last_sent))
                except Exception as exc:
                    fut.set_exception(exc)
            return
        if kind == "reassign_api":
            self._reassign_api(event[1], event[2], event[3])
            return
        if not self._active or event[1] != self._generation:
            return
        if kind == "brokers":
            self._on_brokers()
            self._complete_moves(None)
        elif kind == "reassign_znode":
            before = set(self._reassign.ongoing(None))
            self._reassign.process_request(self._live())
            self._complete_moves(None)
            self._refresh(before)
        elif kind == "reassign_tick":
            self._complete_moves(None)
        elif kind == "isr_changes":
            self._on_isr_changes()
        elif kind == "topics":
            self._on_topics()
        elif kind == "topic":
            if event[2] in self._topics:
                self._arm_topic_watch(event[2])
            self._on_topic(event[2])
        elif kind == "deletions":
            for topic in self._zk.topics_pending_deletion():
                self._delete_topic(topic)
        elif kind == "resync":
            # Whatever changed while we were away is read again (the cache starts over).
            self._states = {}
            self._znodes = {}
            self._znodes_loaded = False
            self._topics = set()
            self._on_topics()
            self._on_brokers()
            self._moving = set()
            self._events.put(("deletions", self._generation))
            self._events.put(("reassign_znode", self._generation))
        elif kind == "elect_preferred":
            self._elect_preferred(event[2])
            if event[3] == "znode":
                try:
                    self._zk.kazoo.delete(zkdata.PREFERRED_REPLICA_ELECTION)
                except Exception:
                    pass

    def _elect(self) -> None:
        if self._stopped:
            return
        won = self._zk.try_become_controller(self.broker_id)
        if won is None:
            # Our own earlier attempt may have succeeded although its reply was lost.
            won = self._zk.controller_held_by_this_session()
            if won is None:
                return
        self.epoch, self._epoch_zk_version = won
        self._generation += 1
        self._active = True
        self._topics = set()
        self._seen = set()
        self._reassign = ReassignmentManager(_ZkReassignmentStore(self._zk, self._epoch_zk_version), self.epoch)
        self._moving = set()
        self._states = {}
        self._znodes = {}
        self._znodes_loaded = False
        self._full_sync = set()
        if self._channel is not None:
            self._channel.close()
        self._channel = self._new_channel(self.broker_id, self.epoch) if self._new_channel is not None else None
        log.info("broker %d: elected controller, epoch %d", self.broker_id, self.epoch)
        # "reassign_znode" starts what the request asks and resumes (step B) what a previous
        # controller started: the progress is in the topic znodes. "brokers" reads every
        # partition state once (the cache's first load) and tells every live broker.
        for kind in ("brokers", "topics", "deletions", "reassign_znode", "isr_changes"):
            self._events.put((kind, self._generation))

    # --- topic and partition state -------------------------------------------------

    def _live(self) -> set[int]:
        """Live brokers, without those in a controlled shutdown of their current registration."""
        brokers = self._zk.live_brokers()
        self._seen.update(brokers)
        if self._channel is not None:
            self._full_sync.update(self._channel.set_brokers(brokers))
        # A mark ends with the registration it was made for (re-registration or session end).
        self._shutting_down = {b: e for b, e in self._shutting_down.items() if b in brokers and brokers[b].epoch == e}
        return {b for b, info in brokers.items() if self._shutting_down.get(b) != info.epoch}

    def _on_topics(self) -> None:
        """``/brokers/topics`` changed: watch new topics (and set up their partitions)."""
        current = set(self._zk.topics())
        new = current - self._topics
        self._topics = current
        for topic in sorted(new):
            self._arm_topic_watch(topic)
        self._on_topic_znodes(sorted(new))

    def set_unclean_default(self, value: bool) -> None:
        """The broker's ``unclean.leader.election.enable`` changed (a dynamic config).

        Turning it on re-runs elections, so offline partitions whose topics do not override
        it get an unclean leader at once (Kafka does the same).
        """
        turned_on = value and not self._unclean_default
        self._unclean_default = value
        if turned_on:
            self._events.put(("brokers", self._generation))

    def _unclean(self, topic: str) -> bool:
        value = self._zk.topic_config(topic).get(UNCLEAN_KEY)
        return self._unclean_default if value is None else value.strip().lower() == "true"

    def _on_topic(self, topic: str) -> None:
        self._on_topic_znodes([topic])

    def _on_topic_znodes(self, topics: list[str]) -> None:
        """Topic znodes created or changed: read them (pipelined), then create the partition
        states they lack, for all of them in one batch."""
        assignments: dict[str, Assignment] = {}
        for topic, found in self._zk.topic_znodes(topics).items():
            if found is None:
                self._forget_topic(topic)
                self._znodes.pop(topic, None)
                continue
            znode, version = found
            if znode.topic_id is None:
                # Written without an id (a Kafka-era tool): give this incarnation one, as Kafka 2.8
                # does (keeping every other field: an in-flight reassignment survives).
                try:
                    znode = replace(znode, topic_id=zkdata.new_topic_id())
                    self._zk.set_topic_znode(topic, znode, version)
                except BadVersionError:
                    continue  # changed meanwhile: the watch brings us back
            old = self._znodes.get(topic)
            if old is not None and old.topic_id != znode.topic_id:
                self._forget_topic(topic)  # another incarnation: its cached states are not ours
            self._znodes[topic] = znode
            assignments[topic] = znode.partitions
        if assignments:
            self._init_partitions(assignments)

    def _init_partitions(self, assignments: dict[str, Assignment], live: set[int] | None = None) -> None:
        """Create the state znode of every partition of ``assignments`` that has none, in
        one pipelined batch: leader = the first live replica, ISR = the live replicas."""
        if live is None:
            live = self._live()
        tps = [(t, p) for t, a in sorted(assignments.items()) for p in sorted(a)]
        existing = self._zk.partition_states(tps)
        self._states.update(existing)
        new: dict[TP, LeaderAndIsr] = {}
        for (topic, p), state in existing.items():
            if state is not None:
                continue
            replicas = assignments[topic][p]
            alive = [r for r in replicas if r in live]
            if not alive:
                level = logging.WARNING if self._seen.intersection(replicas) else logging.INFO
                self._lines.add(level, "%s-%d: no live replica among %s yet; waiting", topic, p, replicas)
                continue
            new[(topic, p)] = LeaderAndIsr(alive[0], 0, alive, self.epoch)
        if not new:
            return
        results = self._zk.create_partition_states(new, self._epoch_zk_version)
        created = 0
        for (topic, p), result in sorted(results.items()):
            if isinstance(result, Exception):
                if not isinstance(result, (NodeExistsError, NoNodeError)):
                    self._lines.add(logging.WARNING, "%s-%d: cannot create the partition state: %r", topic, p, result)
                continue
            created += 1
            state = self._states[(topic, p)] = replace(new[(topic, p)], zk_version=0)
            self._lines.add(
                logging.INFO,
                "%s-%d: leader %d elected, reason: new partition; epoch 0 isr %s",
                topic, p, state.leader, state.isr,
            )  # fmt: skip
        self._publish([tp for tp, r in results.items() if not isinstance(r, Exception)])
        if created > 1:
            log.info("controller: %d new partition(s) got their first leader in one batch", created)

    def _delete_topic(self, topic: str) -> None:
        self._zk.delete_topic_znodes(topic, self._epoch_zk_version)
        self._forget_topic(topic)
        self._znodes.pop(topic, None)
        self._topics.discard(topic)
        self._moving = {tp for tp in self._moving if tp[0] != topic}
        self._reassign.drop_topic(topic)
        log.info("topic %s deleted", topic)

    # --- the cache and the channel ------------------------------------------------------

    def _topic_znodes(self) -> dict[str, TopicZNode]:
        """Every topic znode: read once per election (pipelined), then kept current by the
        topic watches (:meth:`_on_topic`) and this controller's own writes."""
        if not self._znodes_loaded:
            self._znodes = self._zk.all_topic_znodes()
            self._znodes_loaded = True
        return self._znodes

    def _assignments(self) -> dict[str, Assignment]:
        return {t: z.partitions for t, z in self._topic_znodes().items()}

    def _forget_topic(self, topic: str) -> None:
        for tp in [tp for tp in self._states if tp[0] == topic]:
            del self._states[tp]

    def _update(self, tp: TP) -> PartitionStateUpdate | None:
        state = self._states.get(tp)
        znode = self._znodes.get(tp[0])
        if state is None or znode is None:
            return None
        return PartitionStateUpdate(tp[0], tp[1], znode.topic_id or "", state)

    def _publish(self, tps: list[TP], *, leader_and_isr: bool = True) -> dict[int, Future[None]]:
        """Send the cached states of ``tps``: LeaderAndIsr to their replicas (unless only
        ISRs written by their leaders changed), then UpdateMetadata to every live broker."""
        if self._channel is None or not tps:
            return {}
        updates = [u for tp in tps if (u := self._update(tp)) is not None]
        by_broker: dict[int, list[PartitionStateUpdate]] = {}
        if leader_and_isr:
            for u in updates:
                for replica in self._znodes[u.topic].partitions.get(u.partition, ()):
                    by_broker.setdefault(replica, []).append(u)
        return self._channel.send(by_broker, updates)

    def _send_full_state(self) -> None:
        """Brokers new to the channel (this controller's first round, a broker that
        registered or re-registered) get every partition's state."""
        brokers, self._full_sync = sorted(self._full_sync), set()
        if self._channel is None:
            return
        assignments = self._assignments()
        tps = [(t, p) for t, a in sorted(assignments.items()) for p in sorted(a)]
        missing = [tp for tp in tps if tp not in self._states]
        if missing:
            self._states.update(self._zk.partition_states(missing))
        updates = [u for tp in tps if (u := self._update(tp)) is not None]
        by_broker: dict[int, list[PartitionStateUpdate]] = {b: [] for b in brokers}
        for u in updates:
            for replica in assignments[u.topic][u.partition]:
                if replica in by_broker:
                    by_broker[replica].append(u)
        self._channel.send(by_broker, updates, to=brokers)
        log.info(
            "controller: sent the state of %d partition(s) to %s (new to the controller channel)",
            len(updates),
            _ids(brokers),
        )

    def _refresh(self, tps: set[TP]) -> None:
        """Re-read ``tps`` (and their topics' znodes) from ZooKeeper, after writes made
        outside :meth:`_change_batch` (reassignment steps), and send what changed."""
        if not tps:
            return
        for topic in sorted({t for t, _ in tps}):
            found = self._zk.topic_znode(topic)
            if found is not None:
                self._znodes[topic] = found[0]
        fresh = self._zk.partition_states(sorted(tps))
        changed = [tp for tp, state in fresh.items() if self._states.get(tp) != state]
        self._states.update(fresh)
        self._publish(changed)

    def _on_isr_changes(self) -> None:
        """Leaders announced ISR changes (``/isr_change_notification``): read the states
        they name, send them in UpdateMetadata, and try to complete moves waiting on them."""
        children = self._zk.isr_change_notifications()
        if not children:
            return
        known = self._topic_znodes()
        tps = {tp for tp in self._zk.take_isr_changes(children) if tp[0] in known}
        fresh = self._zk.partition_states(sorted(tps))
        changed = [tp for tp, state in fresh.items() if self._states.get(tp) != state]
        self._states.update(fresh)
        self._publish(changed, leader_and_isr=False)
        log.debug("controller: %d ISR change(s) announced by leaders sent to the brokers", len(changed))
        if self._moving & tps:
            self._complete_moves(sorted(self._moving & tps))

    # --- batched state changes ---------------------------------------------------------

    def _change_batch(
        self, tps: list[TP], decide: Callable[[TP, LeaderAndIsr], _Change | None], what: str
    ) -> dict[TP, LeaderAndIsr | None]:
        """Read the states of ``tps`` (pipelined), ``decide`` each one's new leader and ISR,
        and write all changes pipelined, fenced and compare-and-set; the partitions whose
        version check failed (a leader changed its ISR meanwhile) are re-read and decided
        again. Returns the last state known of each partition (None: no state znode).

        The states come from the controller's cache (read from ZooKeeper once, on
        election or first use); a stale entry only costs a failed compare-and-set and a
        re-read. What is written goes to the brokers (:meth:`_publish`)."""
        missing = [tp for tp in tps if tp not in self._states]
        if missing:
            self._states.update(self._zk.partition_states(missing))
        states = {tp: self._states.get(tp) for tp in tps}
        todo = list(tps)
        changed: list[TP] = []
        failure: Exception | None = None
        for _round in range(MAX_BATCH_ROUNDS):
            changes: dict[TP, tuple[LeaderAndIsr, LeaderAndIsr, str]] = {}
            for tp in todo:
                old = states.get(tp)
                if old is None:
                    continue
                change = decide(tp, old)
                if change is not None:
                    leader, isr, reason = change
                    changes[tp] = (
                        old,
                        LeaderAndIsr(leader, old.leader_epoch + 1, isr, self.epoch, old.zk_version),
                        reason,
                    )
            if not changes:
                break
            results = self._zk.update_partition_states({tp: c[1] for tp, c in changes.items()}, self._epoch_zk_version)
            retry: list[TP] = []
            for tp, (old, new, reason) in sorted(changes.items()):
                result = results.get(tp)
                if isinstance(result, int):
                    states[tp] = self._states[tp] = replace(new, zk_version=result)
                    changed.append(tp)
                    self._log_change(tp, old, new, reason)
                elif isinstance(result, BadVersionError):
                    retry.append(tp)
                elif isinstance(result, NoNodeError):
                    states[tp] = self._states[tp] = None
                else:  # outcome unknown (e.g. the connection dropped): the event is retried
                    self._lines.add(logging.WARNING, "%s-%d: state change (%s) failed: %r", *tp, reason, result)
                    failure = failure or result
            if not retry or failure is not None:
                break
            fresh = self._zk.partition_states(retry)
            states.update(fresh)
            self._states.update(fresh)
            todo = retry
        self._last_sent = self._publish(changed)
        if changed:
            log.info("controller: %s: %d partition state(s) changed in one batch", what, len(changed))
        if failure is not None:
            raise failure
        return states

    def _log_change(self, tp: TP, old: LeaderAndIsr, new: LeaderAndIsr, reason: str) -> None:
        topic, p = tp
        if new.leader == old.leader:
            self._lines.add(
                logging.INFO,
                "%s-%d: ISR change %s -> %s, reason: %s; leader %d epoch %d",
                topic, p, old.isr, new.isr, reason, new.leader, new.leader_epoch,
            )  # fmt: skip
        elif new.leader != zkdata.NO_LEADER:  # (no leader: the decision logged why)
            isr_change = f", ISR {old.isr} -> {new.isr}" if new.isr != old.isr else f", isr {new.isr}"
            self._lines.add(
                logging.INFO,
                "%s-%d: leader %d elected (was %s), reason: %s; epoch %d%s",
                topic, p, new.leader, _leader_name(old.leader), reason, new.leader_epoch, isr_change,
            )  # fmt: skip

    def _on_brokers(self) -> None:
        """Membership changed: re-elect where a leader or ISR member is gone (or back), in one batch."""
        live = self._live()
        assignments = self._assignments()
        tps = [(t, p) for t, a in sorted(assignments.items()) for p in sorted(a)]
        unclean: dict[str, bool] = {}

        def decide(tp: TP, state: LeaderAndIsr) -> _Change | None:
            topic, p = tp
            replicas = assignments[topic][p]
            if state.leader in live and all(b in live for b in state.isr):
                return None
            if state.leader in live:
                # A follower died: drop it from the ISR (epoch bump, as a controller
                # driven ISR change).
                isr = [b for b in state.isr if b in live] or [state.leader]
                gone = [b for b in state.isr if b not in live]
                return state.leader, isr, f"broker failure: {_ids(gone)} not alive"
            candidates = [r for r in replicas if r in live and r in state.isr]
            if candidates:
                leader = candidates[0]
                isr = [b for b in state.isr if b in live]
                if state.leader == zkdata.NO_LEADER:
                    return leader, isr, f"offline partition: in-sync replica {leader} is back"
                return leader, isr, f"broker failure: leader {state.leader} not alive"
            if topic not in unclean:
                unclean[topic] = self._unclean(topic)
            alive = [r for r in replicas if r in live]
            if unclean[topic] and alive:
                self._lines.add(
                    logging.WARNING,
                    "%s-%d: unclean leader election of %d: no in-sync replica is alive",
                    topic, p, alive[0],
                )  # fmt: skip
                return alive[0], [alive[0]], "unclean election (data may be lost)"
            if state.leader == zkdata.NO_LEADER:
                return None
            # Offline: no live ISR member. Keep the last ISR member so that it can
            # lead again when it returns; never shrink the ISR to nothing.
            if self._seen.intersection(state.isr):
                self._lines.add(
                    logging.ERROR,
                    "%s-%d: offline, reason: leader %d lost and no in-sync replica is alive",
                    topic, p, state.leader,
                )  # fmt: skip
            else:  # e.g. the cluster is starting and the ISR has not registered yet
                self._lines.add(
                    logging.INFO,
                    "%s-%d: offline, reason: leader %d not alive; waiting for in-sync replica %s",
                    topic, p, state.leader, state.isr,
                )  # fmt: skip
            isr = [state.leader] if state.leader in state.isr or not state.isr else state.isr[:1]
            return zkdata.NO_LEADER, isr, f"broker failure: leader {state.leader} not alive"

        states = self._change_batch(tps, decide, "broker change")
        # Partitions without a state znode yet whose replicas are now alive get one.
        missing: dict[str, Assignment] = {}
        for topic, p in tps:
            if states.get((topic, p)) is None and any(r in live for r in assignments[topic][p]):
                missing.setdefault(topic, {})[p] = assignments[topic][p]
        if missing:
            self._init_partitions(missing, live)

    def _elect_preferred(self, partitions: list[tuple[str, int]] | None) -> None:
        live = self._live()
        znodes = self._topic_znodes()
        wanted = None if partitions is None else set(partitions)
        tps = [
            (t, p)
            for t, z in sorted(znodes.items())
            for p, replicas in sorted(z.partitions.items())
            # as Kafka: a moving partition's leadership is the move's business
            if replicas and not z.reassigning(p) and (wanted is None or (t, p) in wanted)
        ]

        def decide(tp: TP, state: LeaderAndIsr) -> _Change | None:
            preferred = znodes[tp[0]].partitions[tp[1]][0]
            if state.leader != preferred and preferred in live and preferred in state.isr:
                return preferred, state.isr, "preferred replica election"
            return None

        self._change_batch(tps, decide, "preferred replica election")

    def request_preferred_election(self, partitions: list[tuple[str, int]] | None = None) -> None:
        """Move leadership back to each partition's first replica where it is in sync."""
        self._events.put(("elect_preferred", self._generation, partitions, None))

    # --- reassignment ----------------------------------------------------------------

    def _complete_moves(self, tps: list[TP] | None) -> None:
        """Try step B (all reassigning partitions, or ``tps``); the rest are tried again when
        their leaders announce an ISR change, and every ``REASSIGN_TICK_S``. What the
        steps wrote goes to the brokers."""
        self._next_reassign_tick = time.monotonic() + REASSIGN_TICK_S
        ongoing = set(self._reassign.ongoing(tps))
        done = set(self._reassign.try_complete(self._live(), tps))
        self._refresh(ongoing | set(self._reassign.ongoing(tps)))
        if tps is None:
            self._moving = ongoing - done
        else:
            self._moving = (self._moving - set(tps)) | (ongoing - done)

    def alter_partition_reassignments(
        self, targets: dict[TP, list[int] | None], timeout_s: float = 60.0
    ) -> dict[TP, KafkaError | None]:
        """Start, replace (a replica list) or cancel (None) partition moves; per partition its error or None.

        Returns once the moves are started (written to ZooKeeper), not when they finish, as
        Kafka. Errors: UnknownTopicOrPartitionError, InvalidReplicaAssignmentError (empty,
        duplicate or negative ids, an added broker not alive, or no in-sync replica left by a
        replacement), NoReassignmentInProgressError (cancel of a partition not moving).
        ControllerMovedError (a NotControllerError) when this broker is not the controller;
        RequestTimedOutError after ``timeout_s``.
        """
        fut: Future[dict[TP, KafkaError | None]] = Future()
        self._events.put(("reassign_api", "alter", dict(targets), fut))
        return self._await(fut, timeout_s, "partition reassignment")

    def list_partition_reassignments(
        self, tps: list[TP] | None = None, timeout_s: float = 60.0
    ) -> dict[TP, tuple[list[int], list[int], list[int]]]:
        """Ongoing moves (of ``tps``, or all): (replicas, adding, removing) per partition."""
        fut: Future[dict[TP, tuple[list[int], list[int], list[int]]]] = Future()
        self._events.put(("reassign_api", "list", tps, fut))
        return self._await(fut, timeout_s, "listing partition reassignments")

    @staticmethod
    def _await(fut: Future[Any], timeout_s: float, what: str) -> Any:
        try:
            return fut.result(timeout_s)
        except FutureTimeoutError:
            raise RequestTimedOutError(f"{what} took over {timeout_s} s") from None

    def _reassign_api(self, op: str, arg: Any, fut: Future[Any]) -> None:
        if not self._active:
            fut.set_exception(ControllerMovedError(f"broker {self.broker_id} is not the controller"))
            return
        try:
            if op == "alter":
                before = set(self._reassign.ongoing(None))
                try:
                    result: Any = self._reassign.alter(arg, self._live())
                except BadVersionError:  # a znode changed under us: re-read once (steps are idempotent)
                    result = self._reassign.alter(arg, self._live())
                self._complete_moves(None)
                self._refresh(before)  # cancelled moves changed their partitions too
            else:
                ongoing: dict[TP, Moves] = self._reassign.ongoing(arg)
                result = {tp: (m.replicas, m.adding, m.removing) for tp, m in ongoing.items()}
        except Exception as exc:
            fut.set_exception(exc)
            if isinstance(exc, ControllerMovedError):
                raise  # resign, as for any other event
            return
        fut.set_result(result)

    # --- controlled shutdown -------------------------------------------------------

    def controlled_shutdown(self, broker_id: int, broker_epoch: int, timeout_s: float = 30.0) -> list[tuple[str, int]]:
        """Move leadership (and ISR membership) off ``broker_id``; returns what it still leads.

        ``broker_epoch`` must be the czxid of the broker's current registration
        (:meth:`ZkClient.register_broker` returns it); a missing (-1) or stale one raises
        StaleBrokerEpochError and changes nothing. BrokerNotAvailableError if the broker
        is not registered; ControllerMovedError (a NotControllerError) when this broker
        is not the controller; RequestTimedOutError after ``timeout_s``. Runs on the
        controller's event thread; then waits (here, up to ``CONTROLLED_SHUTDOWN_ACK_S``)
        until the new leaders confirmed their LeaderAndIsr, so that no partition is without
        a serving leader when the broker stops.
        """
        if not self._zk.connected:  # nothing can move now: say so at once, the broker retries
            raise ZooKeeperError(f"controlled shutdown of broker {broker_id}: no ZooKeeper connection here")
        fut: Future[tuple[list[tuple[str, int]], dict[int, Future[None]]]] = Future()
        deadline = time.monotonic() + timeout_s
        self._events.put(("controlled_shutdown", broker_id, broker_epoch, fut))
        try:
            remaining, sent = fut.result(timeout_s)
        except FutureTimeoutError:
            raise RequestTimedOutError(f"controlled shutdown of broker {broker_id} took over {timeout_s} s") from None
        wait_until = min(deadline, time.monotonic() + CONTROLLED_SHUTDOWN_ACK_S)
        for target, ack in sorted(sent.items()):
            if target == broker_id:
                continue  # the broker leaving waits for this answer: it cannot answer first
            try:
                ack.result(max(wait_until - time.monotonic(), 0.0))
            except Exception as exc:  # a late or refused ack only costs clients a retry
                log.info("controlled shutdown of broker %d: broker %d did not confirm: %r", broker_id, target, exc)
        return remaining

    def _controlled_shutdown(self, broker_id: int, broker_epoch: int) -> list[tuple[str, int]]:
        current = self._zk.broker_epoch(broker_id)
        if current < 0:
            raise BrokerNotAvailableError(f"broker {broker_id} is not registered")
        if broker_epoch != current:
            raise StaleBrokerEpochError(
                f"controlled shutdown of broker {broker_id} names broker epoch {broker_epoch}; "
                f"its current registration has epoch {current}"
            )
        self._shutting_down[broker_id] = current
        log.info("broker %d (epoch %d) is shutting down", broker_id, current)
        # First the mark leaders check before adding a replica to an ISR: from here on they
        # cannot put the broker back into the ISRs this batch removes it from.
        self._zk.mark_broker_shutting_down(broker_id, current, self._epoch_zk_version)
        live = self._live()
        assignments = self._assignments()
        tps = [(t, p) for t, a in sorted(assignments.items()) for p, rs in sorted(a.items()) if broker_id in rs]
        reason = f"controlled shutdown of broker {broker_id}"

        def decide(tp: TP, state: LeaderAndIsr) -> _Change | None:
            isr = [b for b in state.isr if b != broker_id]
            if state.leader == broker_id:
                candidates = [r for r in assignments[tp[0]][tp[1]] if r in live and r in isr]
                return (candidates[0], isr, reason) if candidates else None
            if broker_id in state.isr and isr:
                return state.leader, isr, reason
            return None

        # Every leadership moves in one batch, then the ISRs lose the broker; the broker
        # keeps serving (and leading what has not moved yet) until this returns.
        states = self._change_batch(tps, decide, reason)
        remaining = [
            tp
            for tp in tps
            if (s := states.get(tp)) is not None and s.leader == broker_id and len(assignments[tp[0]][tp[1]]) > 1
        ]  # as Kafka: a single replica has nowhere to go
        log.info(
            "controlled shutdown of broker %d: %d partition(s) left without another leader", broker_id, len(remaining)
        )
        return remaining
