"""Asking the controller for a preferred-leader election through ZooKeeper, as Kafka's
``kafka-preferred-replica-election.sh --zookeeper`` did: create
``/admin/preferred_replica_election`` naming the partitions (or none: every partition),
then wait for the controller to delete it, its sign of completion.

The broker's ElectLeaders request (:func:`elect_preferred_leaders`) and ``kctl leaders
elect --zookeeper`` both ask this way;
the controller's side is :meth:`kbroker.cluster.controller.Controller.request_preferred_election`
and its watch on the znode. ZooKeeper failures come out as
:mod:`kbroker.cluster.zk_errors`' types.

Thread safety: stateless; concurrent requests are serialised by the znode (one pending
request at a time).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from kazoo.exceptions import NodeExistsError

from kbroker.cluster import zkdata
from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.zk_client import CONNECTION_WAIT_S, ZkClient
from kbroker.cluster.zk_errors import mapped
from kclient.errors import KafkaError, PreferredLeaderNotAvailableError, RequestTimedOutError

POLL_S = 0.05


class ElectionInProgressError(KafkaError):
    """A preferred-leader election requested earlier is still pending."""


@mapped()
def request_preferred_election(
    zk: ZkClient,
    partitions: Sequence[tuple[str, int]] | None,
    timeout_s: float,
    *,
    join_pending: bool = False,
    poll_s: float = POLL_S,
) -> bool:
    """Request an election of ``partitions`` (None: every partition) and wait up to
    ``timeout_s`` for the controller to finish it; True if it did.

    A request already pending is waited for instead with ``join_pending`` (it is not
    replaced), else ElectionInProgressError, nothing written.
    """
    data = zkdata.encode_preferred_election(None if partitions is None else list(partitions))
    try:
        zk.kazoo.create(zkdata.PREFERRED_REPLICA_ELECTION, data, makepath=True)
    except NodeExistsError:
        if not join_pending:
            raise ElectionInProgressError("a preferred replica election is already in progress") from None
    deadline = time.monotonic() + timeout_s
    while zk.kazoo.exists(zkdata.PREFERRED_REPLICA_ELECTION) is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def elect_preferred_leaders(
    zk: ZkClient,
    metadata: MetadataCache,
    partitions: Sequence[tuple[str, int]] | None,
    timeout_s: float,
    *,
    zookeeper_wait_s: float = CONNECTION_WAIT_S,
) -> dict[tuple[str, int], KafkaError | None]:
    """ElectLeaders (preferred): ask the controller (or join an election already asked
    for), wait up to ``timeout_s``, and answer per partition (``partitions``, or every
    partition of the cluster) from ZooKeeper's states: None where the preferred replica
    leads now, else PREFERRED_LEADER_NOT_AVAILABLE saying whether the election is still
    running. Without a ZooKeeper connection it waits up to ``zookeeper_wait_s`` for it,
    then raises RequestTimedOutError having asked nothing (kazoo would queue the request
    znode's creation for the whole outage, and the election would run when the quorum
    returned, long after the client gave up); another ZooKeeper failure raises the typed
    ZooKeeperError."""
    zk.require_connection(
        f"electing the preferred leaders of {len(partitions)} partition(s)"
        if partitions
        else "electing the preferred leaders of every partition",
        RequestTimedOutError,
        zookeeper_wait_s,
    )
    deadline = time.monotonic() + timeout_s
    request_preferred_election(zk, partitions, timeout_s, join_pending=True)
    metadata.sync()
    snap = metadata.snapshot()
    targets = (
        list(partitions)
        if partitions
        else [(t, p) for t, info in sorted(snap.topics.items()) for p in sorted(info.assignment)]
    )
    # The outcome as ZooKeeper has it (pipelined reads): this broker's own metadata
    # learns it from the controller's UpdateMetadata, a moment later.
    with mapped():
        states = zk.partition_states(targets)
    out: dict[tuple[str, int], KafkaError | None] = {}
    for t, p in targets:
        info = snap.topics.get(t)
        state = states.get((t, p))
        preferred = info.assignment[p][0] if info and info.assignment.get(p) else -1
        if state is not None and state.leader == preferred:
            out[(t, p)] = None
        else:
            out[(t, p)] = PreferredLeaderNotAvailableError(
                f"{t}-{p}: preferred leader {preferred} is not alive and in sync"
                if time.monotonic() < deadline
                else f"{t}-{p}: election did not finish within {timeout_s:.0f}s"
            )
    return out
