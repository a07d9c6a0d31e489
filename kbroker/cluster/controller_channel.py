"""The controller channel (Kafka's ControllerChannelManager): the active controller's
requests to every live broker.

The controller decides partition states and writes them to ZooKeeper; brokers learn them
from this channel, in batches, instead of each watching every partition-state znode:

* **LeaderAndIsr** goes to the replicas of the partitions it names, first;
* **UpdateMetadata** goes to every live broker (the states its metadata answers from)
  once every LeaderAndIsr of the same batch was answered: a client told by any broker
  that a replica leads finds that replica leading.

Each request carries the controller's id and epoch and the target's broker epoch (the
czxid of its registration, KIP-380); the broker refuses an older controller epoch
(STALE_CONTROLLER_EPOCH) or an older registration of itself (STALE_BROKER_EPOCH) and
changes nothing. A channel belongs to one controller epoch: a new controller makes a new
one (:class:`ControllerChannel`), and a deposed one shuts its own down.

One sender thread per live broker (:class:`_BrokerSender`). Its pending states are kept
by partition, newest wins (states only move forward, so an older pending state can be
replaced unsent), and each round drains everything pending into one LeaderAndIsr and one
UpdateMetadata request (in chunks of :data:`MAX_STATES_PER_REQUEST`). A request that
fails in transport is retried, merged under anything newer, while the broker's
registration lives; an answer of STALE_CONTROLLER_EPOCH or STALE_BROKER_EPOCH drops it
(a newer controller or registration gets the whole state anyway).

Thread safety: every public method may be called from any thread (in practice the
controller's event thread); each sender thread owns its gRPC channel.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass

import grpc

from kbroker.cluster.zkdata import BrokerInfo, LeaderAndIsr
from kclient.errors import KafkaError, StaleBrokerEpochError, StaleControllerEpochError, for_code
from kclient.proto.kbroker.v1 import broker_pb2_grpc, cluster_pb2

log = logging.getLogger(__name__)

TP = tuple[str, int]
MAX_STATES_PER_REQUEST = 5000
"""A request's partition states at most (a full state of 10,000 partitions is two)."""
REQUEST_TIMEOUT_S = 30.0
RETRY_BACKOFF_S = 0.5
ChannelFactory = Callable[[str], grpc.Channel]


@dataclass(frozen=True)
class PartitionStateUpdate:
    """One partition's state as the controller sends it."""

    topic: str
    partition: int
    topic_id: str
    state: LeaderAndIsr

    def to_proto(self) -> cluster_pb2.PartitionState:
        s = self.state
        return cluster_pb2.PartitionState(
            topic=self.topic,
            partition=self.partition,
            topic_id=self.topic_id,
            leader=s.leader,
            leader_epoch=s.leader_epoch,
            isr=s.isr,
            controller_epoch=s.controller_epoch,
            zk_version=s.zk_version,
        )

    @staticmethod
    def from_proto(m: cluster_pb2.PartitionState) -> PartitionStateUpdate:
        state = LeaderAndIsr(m.leader, m.leader_epoch, list(m.isr), m.controller_epoch, m.zk_version)
        return PartitionStateUpdate(m.topic, m.partition, m.topic_id, state)


def _newer(a: PartitionStateUpdate, b: PartitionStateUpdate | None) -> bool:
    """Is ``a`` at least as new as ``b`` (same incarnation: by leader epoch, then znode version)?"""
    if b is None or a.topic_id != b.topic_id:
        return True
    return (a.state.leader_epoch, a.state.zk_version) >= (b.state.leader_epoch, b.state.zk_version)


class _BrokerSender(threading.Thread):
    """Sends one broker its pending LeaderAndIsr and UpdateMetadata states, in order."""

    def __init__(
        self, info: BrokerInfo, controller_id: int, controller_epoch: int, channel: ChannelFactory
    ) -> None:
        super().__init__(name=f"controller-channel-{info.broker_id}", daemon=True)
        self.info = info
        self._controller_id = controller_id
        self._controller_epoch = controller_epoch
        self._new_channel = channel
        self._cond = threading.Condition()
        self._leader_and_isr: dict[TP, PartitionStateUpdate] = {}
        self._update_metadata: dict[TP, PartitionStateUpdate] = {}
        self._waiters: list[Future[None]] = []
        self._stopped = False

    def enqueue(
        self, leader_and_isr: Iterable[PartitionStateUpdate], update_metadata: Iterable[PartitionStateUpdate]
    ) -> Future[None]:
        """Queue states; the future completes once a request carrying all of them was answered."""
        fut: Future[None] = Future()
        with self._cond:
            for target, updates in ((self._leader_and_isr, leader_and_isr), (self._update_metadata, update_metadata)):
                for u in updates:
                    key = (u.topic, u.partition)
                    if _newer(u, target.get(key)):
                        target[key] = u
            self._waiters.append(fut)
            self._cond.notify()
        return fut

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def run(self) -> None:
        channel = self._new_channel(self.info.address)
        try:
            stub = broker_pb2_grpc.BrokerStub(channel)
            while self._round(stub):
                pass
        finally:
            channel.close()
            with self._cond:
                waiters, self._waiters = self._waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_exception(KafkaError(f"broker {self.info.broker_id} left the controller channel"))

    def _round(self, stub: broker_pb2_grpc.BrokerStub) -> bool:
        with self._cond:
            while not self._stopped and not self._waiters:
                self._cond.wait()
            if self._stopped:
                return False
            lai, self._leader_and_isr = self._leader_and_isr, {}
            um, self._update_metadata = self._update_metadata, {}
            waiters, self._waiters = self._waiters, []
        try:
            self._send(stub.LeaderAndIsr, cluster_pb2.LeaderAndIsrRequest, list(lai.values()))
            self._send(stub.UpdateMetadata, cluster_pb2.UpdateMetadataRequest, list(um.values()))
        except grpc.RpcError as exc:
            log.warning(
                "controller channel: broker %d at %s unreachable (%s); retrying",
                self.info.broker_id,
                self.info.address,
                exc.code(),
            )
            with self._cond:
                for pending, sent in ((self._leader_and_isr, lai), (self._update_metadata, um)):
                    for key, u in sent.items():
                        if _newer(u, pending.get(key)):
                            pending[key] = u
                self._waiters = waiters + self._waiters
                self._cond.wait(RETRY_BACKOFF_S)
            return True
        except (StaleControllerEpochError, StaleBrokerEpochError) as exc:
            log.info("controller channel: broker %d refused the request: %s", self.info.broker_id, exc)
            for fut in waiters:
                fut.set_exception(exc)
            return True
        except KafkaError as exc:
            log.warning("controller channel: broker %d could not apply the request: %s", self.info.broker_id, exc)
            for fut in waiters:
                fut.set_exception(exc)
            return True
        for fut in waiters:
            fut.set_result(None)
        return True

    def _send(self, method: Callable[..., object], request_type: type, updates: list[PartitionStateUpdate]) -> None:
        for start in range(0, len(updates), MAX_STATES_PER_REQUEST):
            request = request_type(
                controller_id=self._controller_id,
                controller_epoch=self._controller_epoch,
                broker_epoch=self.info.epoch,
                partition_states=[u.to_proto() for u in updates[start : start + MAX_STATES_PER_REQUEST]],
            )
            resp = method(request, timeout=REQUEST_TIMEOUT_S)
            code = int(getattr(resp, "error_code", 0))
            if code:
                raise for_code(code)(str(getattr(resp, "error_message", "")))


class ControllerChannel:
    """The active controller's senders, one per live broker, for one controller epoch."""

    def __init__(self, controller_id: int, controller_epoch: int, channel: ChannelFactory) -> None:
        self.controller_id = controller_id
        self.controller_epoch = controller_epoch
        self._new_channel = channel
        self._lock = threading.Lock()
        self._senders: dict[int, _BrokerSender] = {}
        self._closed = False

    def set_brokers(self, live: dict[int, BrokerInfo]) -> list[int]:
        """Track the live brokers; returns those new to the channel (or re-registered, or
        moved), which need the whole state. Senders of brokers gone are stopped."""
        added: list[int] = []
        with self._lock:
            if self._closed:
                return []
            for broker_id in [b for b in self._senders if b not in live]:
                self._senders.pop(broker_id).stop()
            for broker_id, info in sorted(live.items()):
                current = self._senders.get(broker_id)
                if current is not None and (current.info.epoch, current.info.address) == (info.epoch, info.address):
                    continue
                if current is not None:
                    current.stop()
                sender = self._senders[broker_id] = _BrokerSender(
                    info, self.controller_id, self.controller_epoch, self._new_channel
                )
                sender.start()
                added.append(broker_id)
        return added

    def send(
        self,
        leader_and_isr: dict[int, list[PartitionStateUpdate]],
        update_metadata: list[PartitionStateUpdate],
        to: Iterable[int] | None = None,
    ) -> dict[int, Future[None]]:
        """LeaderAndIsr to each broker of ``leader_and_isr`` with its states, then, once
        every one of them answered (or failed), UpdateMetadata with ``update_metadata``
        to ``to`` (default: every live broker): a client told by any broker that a
        replica leads finds that replica leading. Never blocks. Returns each addressed
        broker's future (done once all its requests of this call were answered)."""
        with self._lock:
            senders = dict(self._senders)
        lai_targets = {b: senders[b] for b in sorted(leader_and_isr) if b in senders and leader_and_isr[b]}
        um_targets = {b: s for b, s in senders.items() if to is None or b in set(to)} if update_metadata else {}
        # (brokers not live get the whole state when they register)
        out: dict[int, Future[None]] = {b: Future() for b in sorted(set(lai_targets) | set(um_targets))}
        lai_futures = {b: s.enqueue(leader_and_isr[b], ()) for b, s in lai_targets.items()}
        remaining = len(lai_futures)
        lock = threading.Lock()

        def finish(target: int, fut: Future[None]) -> None:
            """``fut`` is the last of ``target``'s requests of this call."""
            if out[target].done():
                return
            exc = fut.exception()
            if exc is None:
                out[target].set_result(None)
            else:
                out[target].set_exception(exc)

        def send_update_metadata() -> None:
            for target, sender in um_targets.items():
                sender.enqueue((), update_metadata).add_done_callback(functools.partial(finish, target))

        def leader_and_isr_answered(target: int, fut: Future[None]) -> None:
            nonlocal remaining
            if fut.exception() is not None or target not in um_targets:
                finish(target, fut)
            with lock:
                remaining -= 1
                last = remaining == 0
            if last:
                send_update_metadata()

        if not lai_futures:
            send_update_metadata()
        for target, fut in lai_futures.items():
            fut.add_done_callback(functools.partial(leader_and_isr_answered, target))
        return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            senders, self._senders = list(self._senders.values()), {}
        for sender in senders:
            sender.stop()
