"""The transaction coordinator's marker channel (Kafka's TransactionMarkerChannelManager):
WriteTxnMarkers to the leader of each partition of a transaction.

:class:`LeaderMarkerWriter` is the coordinator's
:class:`~kbroker.txn.coordinator.MarkerWriter`. It groups the partitions by their leader
in this broker's metadata and sends each leader one WriteTxnMarkers over the
inter-broker listener; the partitions this broker leads are written in-process (the same
replica-manager call the RPC makes). A partition without a leader, a leader that does
not answer, or one that refuses (NOT_LEADER_OR_FOLLOWER after a move,
NOT_ENOUGH_REPLICAS, a timeout waiting for the ISR) comes back with its error; the
coordinator keeps the transaction in PrepareCommit/PrepareAbort and tries again
(:class:`~kbroker.txn.housekeeping.TransactionHousekeeping`), so every marker is written
at least once. A second copy of a marker is harmless: the partition's producer state has
no open transaction left for it to close.

Thread safety: calls may come from several threads (request pool, housekeeping); the
stubs are cached by :class:`~kbroker.replication.broker_stubs.BrokerStubs`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

import grpc

from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.replication.broker_stubs import BrokerStubs
from kbroker.replication.replica_manager import TopicPartition, TxnMarker
from kclient.errors import BrokerResponseError, LeaderNotAvailableError, for_code
from kclient.proto.kbroker.v1 import txn_pb2

log = logging.getLogger(__name__)

LocalMarkers = Callable[[TxnMarker, list[TopicPartition], int], dict[TopicPartition, BrokerResponseError | None]]
"""Write a marker to partitions this broker leads: ReplicaManager.write_markers."""


class LeaderMarkerWriter:
    """WriteTxnMarkers to each partition's leader (see the module docstring)."""

    def __init__(
        self,
        broker_id: int,
        metadata: MetadataCache,
        local: LocalMarkers,
        channel: Callable[[str], grpc.Channel] | None = None,
        *,
        timeout_ms: int = 30000,
    ) -> None:
        self._broker_id = broker_id
        self._metadata = metadata
        self._local = local
        self._timeout_ms = timeout_ms
        self._stubs = BrokerStubs(channel)

    def write_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        partitions: Collection[TopicPartition],
        coordinator_epoch: int = 0,
    ) -> dict[TopicPartition, BrokerResponseError | None]:
        marker = TxnMarker(producer_id, producer_epoch, commit, coordinator_epoch)
        snap = self._metadata.snapshot()
        out: dict[TopicPartition, BrokerResponseError | None] = {}
        by_leader: dict[int, list[TopicPartition]] = {}
        for tp in partitions:
            leader = snap.leader_of(*tp)
            if leader < 0 or (leader != self._broker_id and leader not in snap.brokers):
                out[tp] = LeaderNotAvailableError(f"{tp[0]}-{tp[1]} has no live leader")
            else:
                by_leader.setdefault(leader, []).append(tp)
        for leader, tps in sorted(by_leader.items()):
            if leader == self._broker_id:
                out.update(self._local(marker, tps, self._timeout_ms))
            else:
                out.update(self._remote(snap.brokers[leader].address, marker, tps))
        return out

    def _remote(
        self, address: str, marker: TxnMarker, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, BrokerResponseError | None]:
        topics: dict[str, list[int]] = {}
        for t, p in partitions:
            topics.setdefault(t, []).append(p)
        request = txn_pb2.WriteTxnMarkersRequest(
            markers=[
                txn_pb2.WritableTxnMarker(
                    producer_id=marker.producer_id,
                    producer_epoch=marker.producer_epoch,
                    committed=marker.commit,
                    coordinator_epoch=marker.coordinator_epoch,
                    topics=[txn_pb2.AddPartitionsToTxnTopic(name=t, partitions=ps) for t, ps in topics.items()],
                )
            ]
        )
        try:
            resp = self._stubs.stub(address).WriteTxnMarkers(request, timeout=self._timeout_ms / 1000 + 5)
        except grpc.RpcError as exc:
            self._stubs.forget(address)
            err = LeaderNotAvailableError(f"the leader at {address} did not answer WriteTxnMarkers: {exc.code()}")
            return dict.fromkeys(partitions, err)
        if resp.error_code:
            whole = for_code(resp.error_code)(resp.error_message)
            return dict.fromkeys(partitions, whole)
        out: dict[TopicPartition, BrokerResponseError | None] = {}
        for m in resp.markers:
            for t in m.topics:
                for p in t.partitions:
                    out[(t.name, p.index)] = for_code(p.error_code)(p.error_message) if p.error_code else None
        missing = LeaderNotAvailableError(f"the leader at {address} did not answer for this partition")
        return {tp: out.get(tp, missing) for tp in partitions}

    def close(self) -> None:
        self._stubs.close()
