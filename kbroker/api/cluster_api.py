"""The controller's and the cluster's requests, protocol-neutral (Kafka's
``handleControlledShutdownRequest``, ``handleLeaderAndIsrRequest``,
``handleUpdateMetadataRequest``, ``handleAlterPartitionReassignmentsRequest``,
``handleListPartitionReassignmentsRequest``, ``handleElectLeaders``): plain values in,
typed answers out; a refusal of the whole request (CLUSTER_AUTHORIZATION_FAILED,
NOT_CONTROLLER, INVALID_REQUEST) is raised.

Without a ZooKeeper connection (its quorum lost), AlterPartitionReassignments and
ListPartitionReassignments wait up to ``zookeeper_wait_s`` (5 s) for it once authorized
and checked, then answer REQUEST_TIMED_OUT, nothing changed; the controller's event
thread would otherwise run them whenever the quorum returned, long after the client gave
up (ElectLeaders waits the same way, in
:func:`~kbroker.cluster.preferred_election.elect_preferred_leaders`).

Authorization is here; the work is the :class:`~kbroker.cluster.controller.Controller`'s,
the metadata cache's (the controller channel's states) and
:func:`~kbroker.cluster.preferred_election.elect_preferred_leaders`'.

Thread safety: every method blocks and runs on a door's request pool.
"""

from __future__ import annotations

from collections.abc import Sequence

from kbroker.api.access import Access
from kbroker.cluster.controller import Controller
from kbroker.cluster.controller_channel import PartitionStateUpdate as PartitionStateUpdate
from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.preferred_election import elect_preferred_leaders
from kbroker.cluster.zk_client import CONNECTION_WAIT_S, ZkClient
from kbroker.security.acl import AclOperation as Op
from kclient.errors import (
    BrokerResponseError,
    InvalidRequestError,
    NotControllerError,
    RequestTimedOutError,
    as_response_error,
)

TopicPartition = tuple[str, int]
Moves = dict[TopicPartition, tuple[list[int], list[int], list[int]]]
"""Partition -> (replicas, adding, removing) of an ongoing reassignment."""


class ClusterApi:
    """The cluster requests of one broker (see the module docstring)."""

    def __init__(
        self,
        broker_id: int,
        controller: Controller,
        metadata: MetadataCache,
        zk: ZkClient,
        access: Access,
        *,
        zookeeper_wait_s: float = CONNECTION_WAIT_S,
    ) -> None:
        self._broker_id = broker_id
        self._controller = controller
        self._metadata = metadata
        self._zk = zk
        self._access = access
        self.zookeeper_wait_s = zookeeper_wait_s

    def _wait_for_zookeeper(self, what: str) -> None:
        """Return once the session is connected; RequestTimedOutError after ``zookeeper_wait_s``."""
        self._zk.require_connection(what, RequestTimedOutError, self.zookeeper_wait_s)

    def _check_controller(self) -> None:
        if not self._controller.is_active:
            raise NotControllerError(f"broker {self._broker_id} is not the controller")

    def controlled_shutdown(self, broker_id: int, broker_epoch: int) -> list[TopicPartition]:
        """CLUSTER_ACTION on the Cluster; the controller only. What ``broker_id`` still leads."""
        self._access.check_cluster(Op.CLUSTER_ACTION)
        self._check_controller()
        try:
            return self._controller.controlled_shutdown(broker_id, broker_epoch)
        except Exception as exc:
            raise as_response_error(exc) from exc

    def apply_controller_states(
        self, controller_id: int, controller_epoch: int, broker_epoch: int, states: Sequence[PartitionStateUpdate]
    ) -> None:
        """LeaderAndIsr and UpdateMetadata from the controller (CLUSTER_ACTION on the
        Cluster): fenced by the controller's epoch and this broker's epoch."""
        self._access.check_cluster(Op.CLUSTER_ACTION)
        try:
            self._metadata.apply_controller_states(controller_id, controller_epoch, broker_epoch, list(states))
        except Exception as exc:
            raise as_response_error(exc) from exc

    def alter_partition_reassignments(
        self, targets: Sequence[tuple[TopicPartition, list[int] | None]], timeout_ms: int
    ) -> dict[TopicPartition, BrokerResponseError | None]:
        """Start, replace or cancel (None) moves: ALTER on the Cluster; the controller only;
        a partition named twice refuses the request."""
        self._access.check_cluster(Op.ALTER)
        moves: dict[TopicPartition, list[int] | None] = {}
        for tp, replicas in targets:
            if tp in moves:
                raise InvalidRequestError(f"{tp[0]}-{tp[1]} appears more than once")
            moves[tp] = replicas
        self._check_controller()
        self._wait_for_zookeeper(f"reassigning {len(moves)} partition(s)")
        try:
            results = self._controller.alter_partition_reassignments(moves, timeout_ms / 1000.0)
        except Exception as exc:
            raise as_response_error(exc) from exc
        return {tp: as_response_error(err) if err is not None else None for tp, err in results.items()}

    def list_partition_reassignments(self, partitions: Sequence[TopicPartition] | None, timeout_ms: int) -> Moves:
        """Ongoing moves (of ``partitions``, or all): DESCRIBE on the Cluster; the controller only."""
        self._access.check_cluster(Op.DESCRIBE)
        self._check_controller()
        self._wait_for_zookeeper("listing partition reassignments")
        try:
            return self._controller.list_partition_reassignments(
                list(partitions) if partitions is not None else None, timeout_ms / 1000.0
            )
        except Exception as exc:
            raise as_response_error(exc) from exc

    def elect_leaders(
        self, partitions: Sequence[TopicPartition], timeout_ms: int
    ) -> dict[TopicPartition, BrokerResponseError | None]:
        """Preferred-leader election of ``partitions`` (empty: all): ALTER on the Cluster
        (raised); unknown partitions answer UNKNOWN_TOPIC_OR_PARTITION."""
        self._access.check_cluster(Op.ALTER)
        unknown: dict[TopicPartition, BrokerResponseError | None] = dict(
            self._metadata.snapshot().unknown_partitions(partitions)
        )
        known = [tp for tp in partitions if tp not in unknown]
        if partitions and not known:
            return unknown
        try:
            elected = elect_preferred_leaders(
                self._zk, self._metadata, known or None, timeout_ms / 1000.0, zookeeper_wait_s=self.zookeeper_wait_s
            )
        except Exception as exc:
            raise as_response_error(exc) from exc
        unknown.update((tp, as_response_error(err) if err is not None else None) for tp, err in elected.items())
        return unknown
