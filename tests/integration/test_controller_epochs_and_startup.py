"""The controller against a real ZooKeeper: controlled shutdown needs the
broker's current epoch (KIP-380), and a cluster that is starting does not log ERROR."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from kbroker.cluster import zkdata
from kbroker.cluster.controller import Controller
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import BrokerInfo, LeaderAndIsr
from kclient.errors import BrokerNotAvailableError, StaleBrokerEpochError
from tests.support import wait_until

pytestmark = pytest.mark.integration


class Brokers:
    """ZooKeeper sessions standing in for brokers: register, re-register, die."""

    def __init__(self, connect: str) -> None:
        self.connect = connect
        self.sessions: dict[int, ZkClient] = {}
        self.epochs: dict[int, int] = {}

    def register(self, broker_id: int) -> ZkClient:
        zk = ZkClient(self.connect)
        zk.start()
        zk.ensure_persistent_paths()
        self.epochs[broker_id] = zk.register_broker(BrokerInfo(broker_id, "127.0.0.1", 9000 + broker_id))
        self.sessions[broker_id] = zk
        return zk

    def die(self, broker_id: int) -> None:
        self.sessions.pop(broker_id).close()

    def close(self) -> None:
        for zk in self.sessions.values():
            zk.close()


@pytest.fixture
def brokers(zk_connect: str) -> Iterator[Brokers]:
    b = Brokers(zk_connect)
    try:
        yield b
    finally:
        b.close()


def leader(zk: ZkClient, topic: str) -> int | None:
    state = zk.partition_state(topic, 0)
    return None if state is None else state.leader


def test_controlled_shutdown_needs_the_current_broker_epoch(brokers: Brokers) -> None:
    zk = brokers.register(0)
    brokers.register(1)
    assert zk.broker_epoch(1) == brokers.epochs[1] > brokers.epochs[0] > 0
    assert zk.broker_epoch(7) == -1
    ctl = Controller(zk, 0, auto_leader_rebalance=False)
    ctl.start()
    try:
        wait_until(lambda: ctl.is_active, 15, "controller elected")
        zk.create_topic("t", {0: [1, 0]}, {})
        wait_until(lambda: leader(zk, "t") == 1, 15, "t led by 1")

        epoch = brokers.epochs[1]
        for spoofed in (-1, 0, epoch - 1, epoch + 1, brokers.epochs[0]):
            with pytest.raises(StaleBrokerEpochError):
                ctl.controlled_shutdown(1, spoofed)
        with pytest.raises(BrokerNotAvailableError):
            ctl.controlled_shutdown(7, 123)
        state = zk.partition_state("t", 0)
        assert state is not None and (state.leader, state.isr, state.leader_epoch) == (1, [1, 0], 0)
        zk.create_topic("u", {0: [1, 0]}, {})
        wait_until(lambda: leader(zk, "u") == 1, 15, "u led by 1: broker 1 is not shutting down")

        assert ctl.controlled_shutdown(1, epoch) == []
        assert leader(zk, "t") == 0 and leader(zk, "u") == 0
        zk.create_topic("v", {0: [1, 0]}, {})
        wait_until(lambda: leader(zk, "v") == 0, 15, "v led by 0 while 1 shuts down")

        # Broker 1 restarts: a new registration, a new epoch; the old mark is gone.
        brokers.die(1)
        brokers.register(1)
        assert brokers.epochs[1] > epoch
        zk.create_topic("w", {0: [1, 0]}, {})
        wait_until(lambda: leader(zk, "w") == 1, 15, "w led by the re-registered broker 1")
        with pytest.raises(StaleBrokerEpochError):
            ctl.controlled_shutdown(1, epoch)  # a request from its previous life
        assert leader(zk, "w") == 1
    finally:
        ctl.stop()


def test_a_starting_cluster_logs_no_error(brokers: Brokers, caplog: pytest.LogCaptureFixture) -> None:
    zk = brokers.register(0)
    # Left by the cluster's previous life: t is led by broker 1, which has not registered yet.
    zk.create_topic("t", {0: [1, 0]}, {})
    zk.kazoo.create(
        zkdata.partition_state_path("t", 0), zkdata.encode_leader_and_isr(LeaderAndIsr(1, 3, [1], 1)), makepath=True
    )
    zk.create_topic("solo", {0: [2]}, {})  # broker 2 has not registered either: no state yet
    caplog.set_level(logging.INFO, logger="kbroker.cluster.controller")
    ctl = Controller(zk, 0, auto_leader_rebalance=False)
    ctl.start()
    try:
        wait_until(lambda: leader(zk, "t") == zkdata.NO_LEADER, 15, "t offline until broker 1 registers")
        brokers.register(1)
        brokers.register(2)
        wait_until(lambda: leader(zk, "t") == 1, 15, "broker 1 leads t again")
        wait_until(lambda: leader(zk, "solo") == 2, 15, "broker 2 leads solo")
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []

        brokers.die(1)  # a real loss: the only in-sync replica that was alive is gone
        wait_until(lambda: leader(zk, "t") == zkdata.NO_LEADER, 15, "t offline")
        wait_until(
            lambda: any(r.levelno == logging.ERROR and "offline" in r.getMessage() for r in caplog.records),
            5,
            "an ERROR for a real loss",
        )
    finally:
        ctl.stop()
