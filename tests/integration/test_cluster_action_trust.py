"""What a cluster trusts from any client, on real brokers: without an authorizer, a
Fetch naming a real follower's ``replica_id`` reads above the high watermark and moves
it, and a ControlledShutdown carrying a broker's epoch (the czxid of its
``/brokers/ids/<id>``, readable by anyone who reaches ZooKeeper) moves that broker's
leaderships away, as in Kafka without an authorizer. With the AclAuthorizer on, both
need ClusterAction on the Cluster: refused without that ACL even with a real replica id
and a real epoch, served with it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from kazoo.client import KazooClient

from kbroker.cluster.zk_client import ZkClient
from kbroker.local.cluster import LocalCluster
from kbroker.security import certs
from kbroker.security.acl import (
    CLUSTER_RESOURCE,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePattern,
    ResourceType,
)
from kbroker.security.authorizer import AclAuthorizer
from kclient.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError
from kclient.proto.kbroker.v1 import admin_pb2, broker_pb2_grpc, cluster_pb2, log_pb2, metadata_pb2
from kclient.records import BatchBuilder
from tests.integration.test_broker_listeners import (
    ADMIN,
    ADMIN_PASSWORD,
    scram_login,
    secure_cluster,
    session,
    tls_stub,
)
from tests.support import set_scram_passwords, wait_until

pytestmark = pytest.mark.integration

PATIENT = {"zookeeper.session.timeout.ms": "30000", "replica.lag.time.max.ms": "30000"}
"""A paused follower stays registered and in the ISR while the test pretends to be it."""


def _records(value: bytes) -> bytes:
    batch = BatchBuilder()
    batch.append(0, None, value)
    return batch.build()


def _fetch(
    stub: broker_pb2_grpc.BrokerStub, topic: str, offset: int, replica_id: int = -1, metadata: object = None
) -> log_pb2.FetchPartitionResponse:
    req = log_pb2.FetchRequest(replica_id=replica_id, max_wait_ms=0)
    req.topics.add(name=topic).partitions.add(index=0, fetch_offset=offset)
    resp = stub.Fetch(req, timeout=10, metadata=metadata)
    return resp.topics[0].partitions[0]


def _broker_epoch(zk_connect: str, broker_id: int) -> int:
    """What any ZooKeeper client can read: the czxid of ``/brokers/ids/<id>`` (an exists(),
    which ZooKeeper answers whatever the znode's ACL)."""
    zk = KazooClient(hosts=zk_connect)
    zk.start(timeout=15)
    try:
        stat = zk.exists(f"/brokers/ids/{broker_id}")
        assert stat is not None
        return int(stat.czxid)
    finally:
        zk.stop()
        zk.close()


def _create(stub: broker_pb2_grpc.BrokerStub, topic: str, replicas: list[int], metadata: object = None) -> None:
    made = stub.CreateTopics(
        admin_pb2.CreateTopicsRequest(
            topics=[admin_pb2.CreatableTopic(name=topic, assignments={0: admin_pb2.ReplicaList(broker_ids=replicas)})]
        ),
        timeout=30,
        metadata=metadata,
    )
    assert made.topics[0].error_code == 0, made


def _partition(stub: broker_pb2_grpc.BrokerStub, topic: str, metadata: object = None) -> metadata_pb2.PartitionMetadata:
    md = stub.Metadata(metadata_pb2.MetadataRequest(topics=[topic]), timeout=10, metadata=metadata)
    return md.topics[0].partitions[0]


def test_an_unsecured_cluster_trusts_a_replica_id_and_a_broker_epoch(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(2, **PATIENT)
    stubs = {i: broker_pb2_grpc.BrokerStub(grpc.insecure_channel(b.address)) for i, b in cluster.brokers.items()}
    controller = stubs[0].Metadata(metadata_pb2.MetadataRequest(), timeout=10).controller_id
    follower = 1 - controller
    leader = stubs[controller]
    _create(leader, "trusted", [controller, follower])
    wait_until(lambda: sorted(_partition(leader, "trusted").isr_nodes) == [0, 1], 30, "both replicas in sync")

    # The follower stops fetching: a record written now stays above the high watermark.
    cluster.brokers[follower].pause()
    try:
        req = log_pb2.ProduceRequest(acks=1, timeout_ms=10000)
        req.topics.add(name="trusted").partitions.add(index=0, records=_records(b"unreplicated"))
        assert leader.Produce(req, timeout=10).topics[0].partitions[0].error_code == 0
        consumer = _fetch(leader, "trusted", 0)
        assert consumer.high_watermark == 0 and not consumer.records

        # Any client claiming to be the follower reads above the high watermark ...
        above = _fetch(leader, "trusted", 0, replica_id=follower)
        assert above.error_code == 0 and b"unreplicated" in above.records
        # ... and, reporting the leader's log end as its position, commits the record
        # although the real follower never stored it.
        _fetch(leader, "trusted", above.log_end_offset, replica_id=follower)
        committed = _fetch(leader, "trusted", 0)
        assert committed.high_watermark == 1 and b"unreplicated" in committed.records
    finally:
        cluster.brokers[follower].resume()

    # ControlledShutdown with the epoch read from ZooKeeper: leadership moves off a broker
    # that never asked.
    _create(leader, "moved", [follower, controller])
    wait_until(lambda: _partition(leader, "moved").leader_id == follower, 30, "the follower to lead 'moved'")
    epoch = _broker_epoch(cluster.zk_connect, follower)
    shutdown = leader.ControlledShutdown(
        cluster_pb2.ControlledShutdownRequest(broker_id=follower, broker_epoch=epoch), timeout=30
    )
    assert shutdown.error_code == 0, shutdown
    wait_until(lambda: _partition(leader, "moved").leader_id == controller, 30, "leadership to move away")
    assert cluster.brokers[follower].running()


def test_with_an_authorizer_a_replica_id_and_controlled_shutdown_need_cluster_action(
    cluster_factory: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    authority = certs.make_ca(tmp_path / "ca")
    broker_cert = certs.issue(authority, tmp_path / "ca", "broker")
    cluster = secure_cluster(cluster_factory, broker_cert, 2)
    set_scram_passwords(cluster.zk_connect, {ADMIN: ADMIN_PASSWORD})
    set_scram_passwords(cluster.zk_connect, {"mallory": "mallory-secret"})

    def login(broker: int, user: str, password: str) -> tuple[broker_pb2_grpc.BrokerStub, object]:
        stub = tls_stub(cluster.brokers[broker].listeners["SECURE"], broker_cert.ca_path)
        return stub, session(scram_login(stub, user, password, "SCRAM-SHA-512"))

    admin, admin_md = login(0, ADMIN, ADMIN_PASSWORD)
    controller = admin.Metadata(metadata_pb2.MetadataRequest(), timeout=10, metadata=admin_md).controller_id
    follower = 1 - controller
    leader, leader_md = login(controller, ADMIN, ADMIN_PASSWORD)
    _create(leader, "guarded", [controller, follower], leader_md)
    wait_until(
        lambda: sorted(_partition(leader, "guarded", leader_md).isr_nodes) == [0, 1], 30, "both replicas in sync"
    )
    produce = log_pb2.ProduceRequest(acks=-1, timeout_ms=10000)
    produce.topics.add(name="guarded").partitions.add(index=0, records=_records(b"v"))
    assert leader.Produce(produce, timeout=10, metadata=leader_md).topics[0].partitions[0].error_code == 0

    # mallory may read the topic, but holds no ClusterAction.
    zk = ZkClient(cluster.zk_connect)
    zk.start()
    try:
        acls = AclAuthorizer(zk)
        read = AccessControlEntry("User:mallory", "*", AclOperation.READ, AclPermissionType.ALLOW)
        assert acls.create_acls([AclBinding(ResourcePattern(ResourceType.TOPIC, "guarded"), read)]) == [None]
        mallory, mallory_md = login(controller, "mallory", "mallory-secret")
        wait_until(lambda: _fetch(mallory, "guarded", 0, metadata=mallory_md).error_code == 0, 30, "READ to apply")

        as_follower = _fetch(mallory, "guarded", 0, replica_id=follower, metadata=mallory_md)
        assert as_follower.error_code == TopicAuthorizationFailedError.errno and not as_follower.records
        epoch = _broker_epoch(cluster.zk_connect, follower)
        shutdown = cluster_pb2.ControlledShutdownRequest(broker_id=follower, broker_epoch=epoch)
        refused = mallory.ControlledShutdown(shutdown, timeout=30, metadata=mallory_md)
        assert refused.error_code == ClusterAuthorizationFailedError.errno

        # With ClusterAction on the Cluster, both are served.
        action = AccessControlEntry("User:mallory", "*", AclOperation.CLUSTER_ACTION, AclPermissionType.ALLOW)
        assert acls.create_acls([AclBinding(CLUSTER_RESOURCE, action)]) == [None]
        wait_until(
            lambda: _fetch(mallory, "guarded", 0, replica_id=follower, metadata=mallory_md).error_code == 0,
            30,
            "ClusterAction to apply",
        )
        assert b"v" in _fetch(mallory, "guarded", 0, replica_id=follower, metadata=mallory_md).records
        accepted = mallory.ControlledShutdown(shutdown, timeout=30, metadata=mallory_md)
        assert accepted.error_code == 0, accepted
    finally:
        zk.close()
