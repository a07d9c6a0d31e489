"""The controller channel between real broker processes: brokers learn partition states
from the controller's LeaderAndIsr and UpdateMetadata requests (they watch no
partition-state znode), refuse requests of an older controller or for an older
registration of themselves, and a new controller brings every broker up to date."""

from __future__ import annotations

import socket
from collections.abc import Callable

import grpc
import pytest

from kbroker.cluster.zk_client import ZkClient
from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from kclient.proto.kbroker.v1 import broker_pb2_grpc, cluster_pb2, common_pb2, metadata_pb2
from tests.support import wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 6


def _metadata(address: str, topic: str) -> dict[int, tuple[int, int, list[int]]]:
    """Partition -> (leader, leader epoch, ISR) as the broker at ``address`` answers."""
    with grpc.insecure_channel(address) as channel:
        resp = broker_pb2_grpc.BrokerStub(channel).Metadata(metadata_pb2.MetadataRequest(topics=[topic]), timeout=10)
    return {
        p.index: (p.leader_id, p.leader_epoch, sorted(p.isr_nodes))
        for t in resp.topics
        if t.name == topic
        for p in t.partitions
    }


def _zk_view(zk: ZkClient, topic: str) -> dict[int, tuple[int, int, list[int]]]:
    states = zk.partition_states([(topic, p) for p in range(PARTITIONS)])
    return {p: (s.leader, s.leader_epoch, sorted(s.isr)) for (_, p), s in states.items() if s is not None}


def _watched_paths(zk_connect: str) -> str:
    """ZooKeeper's ``wchp`` (watches by path), or "" where four-letter words are off."""
    host, port = zk_connect.split("/", 1)[0].split(",")[0].rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"wchp")
            out = b""
            while chunk := sock.recv(65536):
                out += chunk
    except OSError:
        return ""
    text = out.decode(errors="replace")
    return "" if "not in the whitelist" in text else text


def test_brokers_follow_the_controller_and_refuse_stale_requests(
    cluster_factory: Callable[..., LocalCluster], zk_connect: str
) -> None:
    cluster = cluster_factory(3)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("ch", num_partitions=PARTITIONS, replication_factor=3)])
    zk = ZkClient(zk_connect)
    zk.start()
    try:
        wait_until(lambda: len(_zk_view(zk, "ch")) == PARTITIONS, 30, "every partition has a state")
        for b in cluster.brokers.values():
            wait_until(lambda b=b: _metadata(b.address, "ch") == _zk_view(zk, "ch"), 30, f"broker {b.broker_id} agrees")

        watched = _watched_paths(zk_connect)
        if watched:  # the brokers watch topic znodes, never a partition's state
            assert "/brokers/topics/ch" in watched
            assert "/partitions/0/state" not in watched

        # An older controller epoch: refused, nothing changes.
        epoch, _ = zk.controller_epoch()
        target = cluster.brokers[0]
        before = _metadata(target.address, "ch")
        forged = cluster_pb2.PartitionState(
            topic="ch", partition=0, topic_id=zk.topic_id("ch") or "", leader=2, leader_epoch=99, isr=[2], zk_version=99
        )
        with grpc.insecure_channel(target.address) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            stale = stub.LeaderAndIsr(
                cluster_pb2.LeaderAndIsrRequest(controller_id=1, controller_epoch=epoch - 1, partition_states=[forged]),
                timeout=10,
            )
            assert stale.error_code == common_pb2.STALE_CONTROLLER_EPOCH
            # For an older registration of the broker: refused too.
            old_registration = stub.UpdateMetadata(
                cluster_pb2.UpdateMetadataRequest(
                    controller_id=1, controller_epoch=epoch, broker_epoch=1, partition_states=[forged]
                ),
                timeout=10,
            )
            assert old_registration.error_code == common_pb2.STALE_BROKER_EPOCH
        assert _metadata(target.address, "ch") == before

        # The controller dies: its successor sends every broker the whole state, and the
        # leaders it elects reach the survivors.
        controller = zk.controller_id()
        cluster.brokers[controller].kill()
        wait_until(lambda: zk.controller_id() not in (-1, controller), 60, "a new controller")
        survivors = [b for b in cluster.brokers.values() if b.broker_id != controller]
        wait_until(
            lambda: all(s[0] != controller for s in _zk_view(zk, "ch").values()), 60, "no partition led by the dead"
        )
        for b in survivors:
            wait_until(lambda b=b: _metadata(b.address, "ch") == _zk_view(zk, "ch"), 30, f"broker {b.broker_id} agrees")
    finally:
        zk.close()
