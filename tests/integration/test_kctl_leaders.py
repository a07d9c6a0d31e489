"""``kctl leaders elect`` (preferred-leader election) as a real subprocess, both ways.

Automatic leader rebalancing is off, so only the command moves leadership back to a
partition's preferred (first) replica after a failover.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import ZkClient
from kbroker.local.cluster import LocalCluster
from tests.integration.test_kctl import conn, fails, kctl, ok, wait_for

pytestmark = pytest.mark.integration

TOPIC = "pref"


@contextmanager
def zk_session(connect: str) -> Iterator[ZkClient]:
    zk = ZkClient(connect)
    zk.start()
    try:
        yield zk
    finally:
        zk.close()


def leader_and_isr(zk: ZkClient, partition: int) -> tuple[int, list[int]]:
    state = zk.partition_state(TOPIC, partition)
    return (state.leader, sorted(state.isr)) if state is not None else (zkdata.NO_LEADER, [])


def fully_in_sync(zk: ZkClient, partitions: int = 3) -> bool:
    return all(
        leader != zkdata.NO_LEADER and isr == [0, 1, 2]
        for leader, isr in (leader_and_isr(zk, p) for p in range(partitions))
    )


def fail_over(cluster: LocalCluster, zk: ZkClient, preferred: int, mode: str) -> None:
    """SIGKILL ``preferred``; once another broker leads partition 0, check that an election
    cannot bring it back yet; restart it and wait until it is in sync again."""
    cluster.brokers[preferred].kill()
    wait_for(
        lambda: leader_and_isr(zk, 0)[0] not in (preferred, zkdata.NO_LEADER),
        f"another leader for {TOPIC}-0",
    )
    # The preferred replica is down: the election fails for that partition, and says why.
    failed = kctl(conn(cluster, mode), f"leaders elect --topic {TOPIC} --partition 0")
    assert failed.returncode == 1, failed
    assert failed.stdout.startswith(
        f"Error completing leader election (PREFERRED) for partition: {TOPIC}-0: PreferredLeaderNotAvailableError: "
    ), failed.stdout
    assert failed.stdout.count("\n") == 1, failed.stdout
    assert failed.stderr == "kctl: 1 replica(s) could not be elected\n"

    cluster.brokers[preferred].start()
    wait_for(lambda: fully_in_sync(zk), f"broker {preferred} back in every ISR")
    assert leader_and_isr(zk, 0)[0] != preferred  # nothing but the command moves it back


def test_preferred_leader_election_both_ways(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(3, **{"auto.leader.rebalance.enable": "false"})
    zk_flag = conn(cluster, "zookeeper")
    ok(kctl(zk_flag, f"topics create --topic {TOPIC} --partitions 3 --replication-factor 3"))
    with zk_session(cluster.zk_connect) as zk:
        wait_for(lambda: fully_in_sync(zk), f"every replica of {TOPIC} in sync")
        found = zk.topic_assignment(TOPIC)
        assert found is not None
        preferred = found[0][0][0]
        assert leader_and_isr(zk, 0)[0] == preferred

        # Nothing to move: every partition is already led by its preferred replica.
        assert ok(kctl(zk_flag, f"leaders elect --topic {TOPIC}")) == (
            f"Valid replica already elected for partitions {TOPIC}-0, {TOPIC}-1, {TOPIC}-2\n"
        )

        for mode, which, expected in (
            ("zookeeper", f"--topic {TOPIC} --partition 0", f"{TOPIC}-0\n"),
            (
                "bootstrap",
                "--all-topic-partitions",
                f"{TOPIC}-0\nValid replica already elected for partitions {TOPIC}-1, {TOPIC}-2\n",
            ),
        ):
            fail_over(cluster, zk, preferred, mode)
            result = kctl(conn(cluster, mode), "leaders elect", which)
            out = ok(result)
            assert result.stderr == ""
            assert out.startswith("Successfully completed leader election (PREFERRED) for partitions "), out
            assert out.endswith(expected), out
            assert out.count("\n") == expected.count("\n"), out
            assert leader_and_isr(zk, 0) == (preferred, [0, 1, 2]), mode
            assert not zk.kazoo.exists(zkdata.PREFERRED_REPLICA_ELECTION)

        # Unknown topics and partitions: one line, exit 1, in both modes.
        for mode in ("zookeeper", "bootstrap"):
            c = conn(cluster, mode)
            fails(kctl(c, "leaders elect --topic ghost"), mentions="UnknownTopicOrPartitionError")
            fails(kctl(c, f"leaders elect --topic {TOPIC} --partition 7"), mentions="UnknownTopicOrPartitionError")
        assert not zk.kazoo.exists(zkdata.PREFERRED_REPLICA_ELECTION)


def test_election_without_a_controller(zk_connect: str) -> None:
    """No broker runs: the request znode stays, and a second request is refused."""
    zk = f"--zookeeper {zk_connect}"
    line = fails(kctl(zk, "leaders elect --all-topic-partitions --timeout-ms 300"))
    assert line.startswith("kctl: the controller did not complete the election within 0.3s"), line
    with zk_session(zk_connect) as client:
        data, _ = client.kazoo.get(zkdata.PREFERRED_REPLICA_ELECTION)
        assert zkdata.decode_preferred_election(data) is None  # None = every partition
    fails(
        kctl(zk, "leaders elect --all-topic-partitions"),
        mentions="kctl: a preferred replica election is already in progress",
    )
    fails(kctl(zk, "leaders elect --topic ghost"), mentions="UnknownTopicOrPartitionError")


def test_usage_errors_exit_2() -> None:
    zk = "--zookeeper 127.0.0.1:1"
    fails(kctl(zk, "leaders elect"), code=2, mentions="--topic")
    fails(kctl(zk, "leaders elect --topic t --all-topic-partitions"), code=2, mentions="not allowed with")
    fails(kctl(zk, "leaders elect --all-topic-partitions --partition 0"), code=2, mentions="--partition needs --topic")
    fails(kctl(zk, "leaders elect --topic t --partition -1"), code=2)
    fails(kctl(zk, "leaders elect --topic t --timeout-ms 0"), code=2)
    fails(kctl(zk, "leaders elect --topic t --election-type unclean"), code=2)
    fails(kctl("leaders elect --topic t"), code=2, mentions="exactly one of --zookeeper or --bootstrap-server")
    fails(kctl("leaders"), code=2)
