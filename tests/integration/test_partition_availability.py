"""Availability under real network partitions, measured in network namespaces.

Three brokers, each in its own namespace on a bridge, ZooKeeper in another; the test
process is the client. A numbered acks=all producer (RF 3, min.insync.replicas=2)
keeps sending while iptables cuts one broker off, then the network heals. Measured,
from the cut (or the heal):

- ``expired_s`` / ``elected_s``: until ZooKeeper dropped the broker / named a new leader;
- ``resumed_s``: until the cut leader's partitions acknowledge acks=all writes on their
  new leader (the producer's first ack on them after ZooKeeper named it; for a cut
  follower: the first ack later than 0.5 s after the cut, i.e. after the ISR shrank);
- ``max_gap_s``: the longest time without an ack on those partitions, from the cut until
  their first ack after the heal (a leader cut only from ZooKeeper keeps acking until
  the controller moves its followers away; the gap is what a producer sees);
- ``isr_s``: from the heal until every partition's ISR (in ZooKeeper) is full again.

A cut lasts a fixed time (``CUT_S``) before the heal.

Goals: ``resumed_s`` and ``max_gap_s`` at most ``zookeeper.session.timeout.ms
+ 2 s`` (``replica.lag.time.max.ms + 2 s`` for a cut follower), ``isr_s <= 5 s``.
Every acknowledged record is then read back once, in order. The figures are printed
and written to ``partition_figures.json`` in the test's tmp dir.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.netns_support import (
    Figures,
    NetCluster,
    first_ack_after,
    longest_gap,
    netns_cluster,
    stalls,
    wait_for,
)
from tests.integration.test_faults import NumberedProducer, ZkView, read_everything, start_topic, validate

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

SESSION_MS = 6000
LAG_MS = 4000
BROKER = {"zookeeper.session.timeout.ms": str(SESSION_MS), "replica.lag.time.max.ms": str(LAG_MS)}
PARTITIONS = 3
RESUME_GOAL_S = SESSION_MS / 1000 + 2
ISR_GOAL_S = 5.0
# How long a cut lasts, whatever happens meanwhile: a fixed length keeps the heal figures
# comparable between runs (TCP retransmission backoff grows with the length of the cut).
CUT_S = {"leader_isolated": 20.0, "leader_cut_from_zookeeper": 20.0, "follower_cut_from_leader": 10.0}


def _leaders(view: ZkView, topic: str) -> dict[int, int]:
    return {p: view.state(topic, p).leader for p in range(PARTITIONS)}


def _cut(nc: NetCluster, scenario: str, victim: int, leader: int) -> None:
    net = nc.net
    if scenario == "leader_isolated":
        net.isolate(nc.host(victim))  # from ZooKeeper and the other brokers; the client still reaches it
    elif scenario == "leader_cut_from_zookeeper":
        net.cut(nc.host(victim), [net.hosts["zk"]])
    elif scenario == "follower_cut_from_leader":
        net.cut(nc.host(victim), [nc.host(leader)])
    else:
        raise AssertionError(scenario)


@pytest.mark.parametrize("scenario", ["leader_isolated", "leader_cut_from_zookeeper", "follower_cut_from_leader"])
def test_partition_availability(tmp_path: Path, scenario: str) -> None:
    topic = "avail"
    fig = Figures(tmp_path, f"test_partition_availability[{scenario}]", session_timeout_ms=SESSION_MS, lag_ms=LAG_MS)
    with netns_cluster(tmp_path, 3, **BROKER) as nc:
        cluster = nc.cluster
        view = start_topic(cluster, topic, PARTITIONS)
        producer = NumberedProducer(cluster.bootstrap, topic)
        producer.start()
        try:
            assert wait_for(lambda: len(producer.acked) > 300, 60), "no acks before the cut"
            controller = view.controller()
            leaders = _leaders(view, topic)
            # A leader that is not the controller: the figure is then leader failover alone.
            measured = next(p for p in range(PARTITIONS) if leaders[p] != controller)
            leader = leaders[measured]
            if scenario == "follower_cut_from_leader":
                victim = next(b for b in view.state(topic, measured).isr if b != leader)
                watched = [measured]
            else:
                victim = leader
                watched = [p for p in range(PARTITIONS) if leaders[p] == victim]
            fig["victim"], fig["controller"], fig["watched_partitions"] = victim, controller, watched

            t_cut = time.monotonic()
            _cut(nc, scenario, victim, leader)

            t_new_leader = t_cut + 0.5

            def resumed() -> bool:
                return all(first_ack_after(producer, p, t_new_leader) for p in watched)

            def left() -> float:
                return max(0.0, t_cut + CUT_S[scenario] - time.monotonic())

            def since_cut(t: float | None) -> float | None:
                return None if t is None else t - t_cut

            if scenario != "follower_cut_from_leader":
                fig["expired_s"] = since_cut(wait_for(lambda: victim not in view.live(), left()))
                t_elected = wait_for(lambda: all(view.state(topic, p).leader != victim for p in watched), left())
                fig["elected_s"] = since_cut(t_elected)
                t_new_leader = t_elected or t_new_leader
            else:
                fig["isr_shrunk_s"] = since_cut(wait_for(lambda: victim not in view.state(topic, measured).isr, left()))
            wait_for(resumed, left(), step_s=0.05)
            time.sleep(left())
            ack_times = [first_ack_after(producer, p, t_new_leader) for p in watched]
            resumed_s = max(a for a in ack_times if a) - t_cut if all(ack_times) else None
            fig["resumed_s"] = resumed_s
            fig["acked_at_heal"] = len(producer.acked)

            t_heal = time.monotonic()
            nc.net.heal()
            t_isr = wait_for(
                lambda: all(len(view.state(topic, p).isr) == 3 for p in range(PARTITIONS)), 60, step_s=0.05
            )
            isr_s = t_isr - t_heal if t_isr else None
            fig["isr_s"] = isr_s
            if resumed_s is None:
                wait_for(resumed, 30, step_s=0.05)
                late = [first_ack_after(producer, p, t_new_leader) for p in watched]
                fig["resumed_after_heal_s"] = max(a for a in late if a) - t_heal if all(late) else None
            before = len(producer.acked)
            wait_for(lambda: len(producer.acked) > before + 300, 30)
            gaps = [longest_gap(producer, p, t_cut, t_heal) for p in watched]
            max_gap_s = max(g for g in gaps if g is not None) if all(g is not None for g in gaps) else None
            fig["max_gap_s"] = max_gap_s
            fig["heal_at_s"] = t_heal - t_cut
            fig["stalls_s"] = {p: stalls(producer, p, t_cut) for p in watched}
            others = [longest_gap(producer, p, t_cut, t_heal) for p in range(PARTITIONS) if p not in watched]
            fig["other_partitions_max_gap_s"] = [None if g is None else round(g, 3) for g in others]
        except BaseException:
            producer.stop.set()  # a daemon thread: the teardown must not wait for a flush across a cut
            producer.join(5)
            raise
        producer.stop.set()
        producer.join(180)
        fig["acked"], fig["failed"] = len(producer.acked), len(producer.failed)
        fig.write()
        validate(producer, read_everything(cluster.bootstrap, topic, PARTITIONS))
        view.close()

    goal = LAG_MS / 1000 + 2 if scenario == "follower_cut_from_leader" else RESUME_GOAL_S
    assert resumed_s is not None and resumed_s <= goal, f"writes not back within {goal}s: {fig.data}"
    assert max_gap_s is not None and max_gap_s <= goal, f"acks stalled longer than {goal}s: {fig.data}"
    assert isr_s is not None and isr_s <= ISR_GOAL_S, f"ISR not full within {ISR_GOAL_S}s after the heal: {fig.data}"
