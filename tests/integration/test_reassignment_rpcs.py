"""AlterPartitionReassignments / ListPartitionReassignments over raw gRPC (fields left
unset as a client in any language may) and through AdminClient, against real brokers:
only the controller answers, bad partitions are refused one by one, a move is listed
while it runs and can be cancelled."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from kclient.errors import (
    InvalidReplicaAssignmentError,
    InvalidRequestError,
    NoReassignmentInProgressError,
    NotControllerError,
    UnknownTopicOrPartitionError,
)
from kclient.proto.kbroker.v1 import admin_pb2, broker_pb2_grpc, reassignment_pb2
from kclient.structs import TopicPartition
from tests.support import wait_until

pytestmark = pytest.mark.integration


def stub_of(address: str) -> broker_pb2_grpc.BrokerStub:
    return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(address))


def controller_id(bootstrap: str) -> int:
    with AdminClient(bootstrap) as admin:
        return admin.describe_cluster()[1]


def replicas(bootstrap: str, topic: str) -> dict[int, list[int]]:
    with AdminClient(bootstrap) as admin:
        return {p.partition: list(p.replicas) for p in admin.describe_topics([topic])[0].partitions}


def alter_request(
    topic: str, targets: dict[int, list[int] | None]
) -> reassignment_pb2.AlterPartitionReassignmentsRequest:
    """No timeout_ms: the broker's default applies; ``None`` leaves ``replicas`` unset (cancel)."""
    req = reassignment_pb2.AlterPartitionReassignmentsRequest()
    t = req.topics.add(name=topic)
    for p, target in targets.items():
        part = t.partitions.add(partition_index=p)
        if target is not None:
            part.replicas.CopyFrom(admin_pb2.ReplicaList(broker_ids=target))
    return req


def codes(resp: reassignment_pb2.AlterPartitionReassignmentsResponse) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition_index): p.error_code for t in resp.responses for p in t.partitions}


def test_reassignment_rpcs_at_the_controller_only(cluster_factory: Callable[..., LocalCluster]) -> None:
    # A broker is paused below; its ZooKeeper session must outlive the few calls made meanwhile.
    cluster = cluster_factory(4, **{"zookeeper.session.timeout.ms": "15000"})
    assignment = {p: [p % 3, (p + 1) % 3] for p in range(6)}  # brokers 0-2; broker 3 holds nothing
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("mv", 6, replica_assignments=assignment)])
    wait_until(lambda: controller_id(cluster.bootstrap) >= 0, what="a controller")
    ctl = controller_id(cluster.bootstrap)
    other = next(b for b in range(4) if b != ctl)
    spare = 3 if ctl != 3 else 2  # not the controller, not a replica of mv-0 ([0, 1])
    at_ctl, at_other = stub_of(cluster.brokers[ctl].address), stub_of(cluster.brokers[other].address)

    # A broker that is not the controller refuses both, at the top level.
    refused = at_other.AlterPartitionReassignments(alter_request("mv", {0: [1, 2]}), timeout=30)
    assert refused.error_code == NotControllerError.errno and not refused.responses
    listed = at_other.ListPartitionReassignments(reassignment_pb2.ListPartitionReassignmentsRequest(), timeout=30)
    assert listed.error_code == NotControllerError.errno
    assert replicas(cluster.bootstrap, "mv") == assignment

    # Bad partitions are refused one by one; nothing moves.
    bad = alter_request("mv", {1: None, 2: [0, 0], 3: [-1, 0], 4: [0, 7], 5: [], 9: [0, 1]})
    bad.topics.add(name="nope").partitions.add(partition_index=0).replicas.broker_ids.append(0)
    resp = at_ctl.AlterPartitionReassignments(bad, timeout=60)
    assert resp.error_code == 0, resp.error_message
    assert codes(resp) == {
        ("mv", 1): NoReassignmentInProgressError.errno,
        ("mv", 2): InvalidReplicaAssignmentError.errno,
        ("mv", 3): InvalidReplicaAssignmentError.errno,
        ("mv", 4): InvalidReplicaAssignmentError.errno,
        ("mv", 5): InvalidReplicaAssignmentError.errno,
        ("mv", 9): UnknownTopicOrPartitionError.errno,
        ("nope", 0): UnknownTopicOrPartitionError.errno,
    }, resp
    dup = alter_request("mv", {0: [1, 2]})
    dup.topics.add(name="mv").partitions.add(partition_index=0)
    assert at_ctl.AlterPartitionReassignments(dup, timeout=30).error_code == InvalidRequestError.errno
    assert replicas(cluster.bootstrap, "mv") == assignment

    # A move to a paused broker stays in progress: it is listed, and can be cancelled.
    cluster.brokers[spare].pause()
    try:
        started = at_ctl.AlterPartitionReassignments(alter_request("mv", {0: [spare, 0]}), timeout=60)
        assert started.error_code == 0 and codes(started) == {("mv", 0): 0}, started
        ongoing = at_ctl.ListPartitionReassignments(reassignment_pb2.ListPartitionReassignmentsRequest(), timeout=30)
        assert ongoing.error_code == 0
        [topic] = ongoing.topics
        [p0] = topic.partitions
        assert (topic.name, p0.partition_index) == ("mv", 0)
        assert sorted(p0.replicas) == sorted([0, 1, spare])
        assert list(p0.adding_replicas) == [spare] and list(p0.removing_replicas) == [1]
        with AdminClient(cluster.brokers[other].address) as admin:  # found via controller_id
            assert admin.list_partition_reassignments([("mv", 0), ("mv", 1)]) == {
                TopicPartition("mv", 0): (list(p0.replicas), [spare], [1])
            }
            assert admin.alter_partition_reassignments({("mv", 0): None}) == {TopicPartition("mv", 0): None}
            assert admin.list_partition_reassignments() == {}
            again = admin.alter_partition_reassignments({("mv", 0): None})
            assert isinstance(again[TopicPartition("mv", 0)], NoReassignmentInProgressError)
    finally:
        cluster.brokers[spare].resume()
    wait_until(lambda: replicas(cluster.bootstrap, "mv") == assignment, what="the cancelled move rolled back")

    # Through AdminClient: a move that completes.
    with AdminClient(cluster.bootstrap) as admin:
        assert admin.alter_partition_reassignments({("mv", 1): [3, 2]}) == {TopicPartition("mv", 1): None}
        wait_until(lambda: admin.list_partition_reassignments() == {}, timeout_s=60, what="the move to finish")
    # The listing reads ZooKeeper; a broker's metadata follows by its topic watch.
    wait_until(lambda: replicas(cluster.bootstrap, "mv")[1] == [3, 2], what="the new placement in the metadata")
