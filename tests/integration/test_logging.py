"""Broker logging on real brokers: a SIGKILLed leader (and controller) leaves a
failover story in the survivors' logs; log.file rotates; --log-level filters."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic, Producer
from tests.integration.test_faults import FAST, ZkView
from tests.support import wait_until


def _new_log(cluster: LocalCluster, broker_id: int, offset: int) -> str:
    return cluster.brokers[broker_id].log_path.read_bytes()[offset:].decode(errors="replace")


def test_a_killed_leader_and_controller_tells_its_story(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(3, **FAST)
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("story", 3, 3)])
    view = ZkView(cluster.zk_connect)
    try:
        wait_until(lambda: all(len(view.state("story", p).isr) == 3 for p in range(3)), 30, "full ISR")
        # A new partition's first ISR holds every replica before any follower fetched: one
        # record per partition acknowledged by all three shows that each follower follows.
        with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
            for partition in range(3):
                producer.send("story", b"before", partition=partition).get(30)
        # (acks=all covers the ISR of the moment: a follower dropped meanwhile for not
        # fetching is back in it only once it has caught up.)
        wait_until(lambda: all(len(view.state("story", p).isr) == 3 for p in range(3)), 30, "full ISR after the write")
        victim = view.controller()  # the controller leads one partition too (leaders spread over 3)
        led = [p for p in range(3) if view.state("story", p).leader == victim]
        followed = [p for p in range(3) if p not in led]
        assert led, "the controller leads a partition"
        survivors = [b for b in cluster.brokers if b != victim]
        offsets = {b: cluster.brokers[b].log_path.stat().st_size for b in survivors}

        cluster.brokers[victim].kill()
        wait_until(
            lambda: all(
                view.state("story", p).leader in survivors and victim not in view.state("story", p).isr
                for p in range(3)
            ),
            30,
            "the survivors lead every partition without the victim in the ISR",
        )
        new_controller = view.controller()
        assert new_controller in survivors

        def story_told() -> bool:
            logs = {b: _new_log(cluster, b, offsets[b]) for b in survivors}
            return all(f"controller change: broker {new_controller}" in logs[b] for b in survivors)

        wait_until(story_told, 10, "every survivor logs the controller change")
        time.sleep(1.0)  # a fetcher retrying the dead leader has had time to spam, were it not limited
        logs = {b: _new_log(cluster, b, offsets[b]) for b in survivors}
        for b in survivors:
            log = logs[b]
            assert re.search(rf"WARNING .*broker {victim} lost \(was at 127\.0\.0\.1:\d+\)", log), log
            # Each survivor followed the victim for the partitions it led: one warning, not hundreds.
            unreachable = re.findall(rf"WARNING .*replica fetcher: cannot reach leader {victim} at ", log)
            assert 1 <= len(unreachable) <= 2, (len(unreachable), log)
            # The ZooKeeper side of the failover is time-stamped before the election.
            assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING ", log, re.M)
        elections = logs[new_controller]
        print(f"\n--- broker {new_controller} (new controller) after broker {victim} was killed ---")
        print("\n".join(line for line in elections.splitlines() if " DEBUG " not in line))
        assert f"broker {new_controller}: elected controller" in elections
        for p in led:
            assert re.search(
                rf"story-{p}: leader \d elected \(was {victim}\), reason: broker failure: leader {victim} not alive",
                elections,
            ), elections
        for p in followed:
            assert re.search(
                rf"story-{p}: ISR change \[[\d, ]+\] -> \[[\d, ]+\], reason: broker failure: broker {victim} not alive",
                elections,
            ), elections
        # Order: the fetcher's error comes before the election in the new controller's log.
        assert elections.index(f"cannot reach leader {victim}") < elections.index("elected (was")
    finally:
        view.close()


def test_log_file_rotates_and_debug_shows(cluster_factory: Callable[..., LocalCluster], tmp_path: Path) -> None:
    path = tmp_path / "logs" / "kbroker.log"
    cluster = cluster_factory(
        1, **{"log.file": str(path), "log.file.max.bytes": "2048", "log.file.backups": "2", "log.level": "DEBUG"}
    )
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:  # a few more lines
        admin.create_topics([NewTopic("rot", 8, 1)])
    wait_until(lambda: (path.parent / "kbroker.log.2").exists(), 20, "two rotated files")
    time.sleep(0.5)
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == ["kbroker.log", "kbroker.log.1", "kbroker.log.2"], names
    assert all(p.stat().st_size <= 2048 for p in path.parent.iterdir())
    both = "".join(p.read_text() for p in path.parent.iterdir())
    assert " DEBUG " in both
    # The ready line stays on stdout (what LocalCluster reads), not in the log file.
    assert "kbroker 0 listening on" in cluster.brokers[0].log_path.read_text()
    assert "listening on" not in both


def test_log_level_flag_filters(zk_connect: str, tmp_path: Path) -> None:
    props = tmp_path / "server.properties"
    props.write_text(f"broker.id=7\nzookeeper.connect={zk_connect}\nlog.dirs={tmp_path / 'data'}\nlog.level=DEBUG\n")
    cmd = [sys.executable, "-m", "kbroker.server", str(props), "--listen", "127.0.0.1:0", "--log-level", "WARNING"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        assert ready.startswith("kbroker 7 listening on 127.0.0.1:"), ready
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert " INFO " not in err and " DEBUG " not in err, err


def test_a_paused_broker_logs_its_session_loss(cluster_factory: Callable[..., LocalCluster]) -> None:
    cluster = cluster_factory(2, **FAST)
    paused, other = cluster.brokers[0], cluster.brokers[1]
    offsets = {b.broker_id: b.log_path.stat().st_size for b in (paused, other)}
    paused.pause()
    try:  # past zookeeper.session.timeout.ms (3 s): the other broker sees its session end
        wait_until(lambda: "broker 0 lost (was at" in _new_log(cluster, 1, offsets[1]), 30, "the session to expire")
    finally:
        paused.resume()
    wait_until(
        lambda: "re-registered after the session loss" in _new_log(cluster, 0, offsets[0]), 20, "re-registration"
    )
    own = _new_log(cluster, 0, offsets[0])
    assert re.search(r"WARNING .*broker 0: ZooKeeper session lost \(expired\)", own), own
    assert own.index("ZooKeeper session lost") < own.index("re-registered after the session loss")
    wait_until(lambda: "broker 0 registered at" in _new_log(cluster, 1, offsets[1]), 10, "broker 1 sees it back")
    seen = _new_log(cluster, 1, offsets[1])
    assert seen.index("broker 0 lost (was at") < seen.index("broker 0 registered at"), seen
