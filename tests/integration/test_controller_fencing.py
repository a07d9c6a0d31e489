"""Controller election and fencing against a real ZooKeeper (no brokers needed)."""

from __future__ import annotations

import pytest
from kazoo.exceptions import BadVersionError

from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import ControllerMovedError, ZkClient
from kbroker.cluster.zkdata import LeaderAndIsr

pytestmark = pytest.mark.integration


def test_stale_controller_writes_are_refused(zk_connect: str) -> None:
    a, b = ZkClient(zk_connect), ZkClient(zk_connect)
    a.start()
    b.start()
    try:
        a.ensure_persistent_paths()
        won_a = a.try_become_controller(1)
        assert won_a is not None and won_a[0] == 1
        assert b.try_become_controller(2) is None  # /controller is taken
        a.create_topic("t", {0: [1, 2]}, {})
        a.create_partition_state("t", 0, LeaderAndIsr(1, 0, [1, 2], 1), won_a[1])

        # Controller 1 is deposed (its session ends); broker 2 takes over with epoch 2.
        a.kazoo.delete(zkdata.CONTROLLER)
        won_b = b.try_become_controller(2)
        assert won_b is not None and won_b[0] == 2
        state = b.partition_state("t", 0)
        assert state is not None

        # The zombie's write, fenced by its old /controller_epoch version, fails atomically.
        with pytest.raises(ControllerMovedError):
            a.update_partition_state("t", 0, LeaderAndIsr(2, 1, [2], 1, state.zk_version), won_a[1])
        assert b.partition_state("t", 0) == state

        # The new controller's write goes through; a write against an old znode version does not.
        assert b.update_partition_state("t", 0, LeaderAndIsr(2, 1, [2], 2, state.zk_version), won_b[1]) == 1
        with pytest.raises(BadVersionError):
            b.update_partition_state("t", 0, LeaderAndIsr(1, 2, [1], 2, state.zk_version), won_b[1])
        assert a.controller_id() == 2 and a.controller_epoch()[0] == 2
    finally:
        a.close()
        b.close()
