"""Asking the controller for a preferred-leader election through ZooKeeper, as Kafka's
``kafka-preferred-replica-election.sh --zookeeper`` did: create
``/admin/preferred_replica_election`` naming the partitions (or none: every partition),
then wait for the controller to delete it, its sign of completion.

The broker's ElectLeaders RPC and ``kctl leaders elect --zookeeper`` both ask this way;
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
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zk_errors import mapped
from kclient.errors import KafkaError

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
