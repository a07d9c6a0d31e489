"""kctl's operator tools as real subprocesses against real brokers on a real ZooKeeper:
consume --group / --include, groups describe views, reset-offsets dry run / --execute /
--export / --from-file, produce headers and producer properties, topics describe's
min-ISR and override filters and topic id, leaders elect's "already elected", the
default connection (KBROKER_BOOTSTRAP, .run/cluster.json) and ``kctl top --once``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient
from tests.integration.test_kctl import fails, kctl, ok, wait_for

pytestmark = pytest.mark.integration

FAST = {"group.initial.rebalance.delay.ms": "100", "group.min.session.timeout.ms": "1000"}
LINES = "".join(f"h{i}:v{i},x:y\tk{i}\tvalue-{i}\n" for i in range(6))


def committed(cluster: LocalCluster, group: str) -> dict[tuple[str, int], int]:
    with AdminClient(cluster.bootstrap) as admin:
        return {(tp.topic, tp.partition): om.offset for tp, om in admin.list_consumer_group_offsets(group).items()}


def rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("GROUP "))
    return [line.split() for line in lines[start + 1 :] if line.strip()]


def test_consume_group_describe_and_reset(cluster_factory: Callable[..., LocalCluster], tmp_path: Path) -> None:
    cluster = cluster_factory(1, **FAST)
    b = f"--bootstrap-server {cluster.bootstrap}"
    ok(kctl(b, "topics create --topic events --partitions 2 --replication-factor 1"))
    produce = "produce --topic events --property parse.headers=true --property parse.key=true"
    ok(kctl(b, produce, "--producer-property linger.ms=0 --producer-property enable_idempotence=false", stdin=LINES))
    fails(kctl(b, "produce --topic events --producer-property nope.ms=1", stdin="x\n"), code=2, mentions="nope.ms")
    bad = fails(kctl(b, "produce --topic events --property parse.headers=true", stdin="no-delimiter\n"))
    assert "No headers delimiter found on line number 1" in bad

    # A group member prints each record once and commits exactly what it printed.
    show = "--property print.headers=true --property print.key=true"
    first = ok(kctl(b, "consume --topic events --group g1 --from-beginning --max-messages 6 --timeout-ms 30000", show))
    printed = sorted(first.splitlines())
    assert printed == sorted(f"h{i}:v{i},x:y\tk{i}\tvalue-{i}" for i in range(6)), first
    offsets = committed(cluster, "g1")
    assert sum(offsets.values()) == 6 and set(offsets) == {("events", 0), ("events", 1)}, offsets
    assert ok(kctl(b, "consume --topic events --group g1 --timeout-ms 3000")) == ""  # nothing left

    # --include subscribes by pattern (a group member too).
    matched = ok(kctl(b, "consume --include ev.* --group g2 --from-beginning --max-messages 6 --timeout-ms 30000"))
    assert sorted(matched.splitlines()) == sorted(f"value-{i}" for i in range(6))
    assert sum(committed(cluster, "g2").values()) == 6
    fails(kctl(b, "consume --include ( --group g"), code=2, mentions="--include")

    # describe: --offsets (the default), --state, --members; --all-groups.
    described = rows(ok(kctl(b, "groups describe --group g1 --offsets")))
    assert [r[:6] for r in described] == [
        ["g1", "events", "0", str(offsets[("events", 0)]), str(offsets[("events", 0)]), "0"],
        ["g1", "events", "1", str(offsets[("events", 1)]), str(offsets[("events", 1)]), "0"],
    ]
    state = ok(kctl(b, "groups describe --all-groups --state")).splitlines()
    assert state[0].split() == ["GROUP", "COORDINATOR", "(ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"]
    assert [line.split()[0] for line in state if line.startswith("g")] == ["g1", "g2"]
    g1_state = next(line for line in state if line.startswith("g1 "))
    assert f"{cluster.bootstrap}  (0)" in g1_state and g1_state.split()[-2:] == ["Empty", "0"], g1_state
    assert ok(kctl(b, "groups describe --group g1 --members")) == "Consumer group 'g1' has no active members.\n"
    every = ok(kctl(b, "groups describe --all-groups")).splitlines()  # one table per group
    assert sum(line.startswith("GROUP ") for line in every) == 2, every
    assert {line.split()[0] for line in every if line.startswith("g")} == {"g1", "g2"}, every

    # An active member, seen by --members --verbose.
    member = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kbroker.cli",
            *b.split(),
            *"consume --topic events --group g3 --timeout-ms 60000".split(),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def member_rows() -> list[list[str]] | None:
            out = kctl(b, "groups describe --group g3 --members --verbose")
            if out.returncode != 0 or "GROUP" not in out.stdout:
                return None
            found = rows(out.stdout)
            return found if found and found[0][-1] == "events(0,1)" else None

        (row,) = wait_for(member_rows, "g3's member and its assignment", timeout_s=40)
        assert row[0] == "g3" and row[-2] == "2", row
        fails(kctl(b, "groups reset-offsets --group g3 --topic events --to-earliest --execute"), mentions="inactive")
    finally:
        member.terminate()
        member.wait(timeout=30)

    # reset-offsets: a dry run says so and changes nothing.
    dry = kctl(b, "groups reset-offsets --group g1 --all-topics --to-earliest")
    assert dry.returncode == 0 and "DRY RUN" in dry.stderr, dry.stderr
    assert rows(dry.stdout) == [["g1", "events", "0", "0"], ["g1", "events", "1", "0"]]
    assert committed(cluster, "g1") == offsets
    current = ok(kctl(b, "groups reset-offsets --group g1 --topic events --to-current --dry-run"))
    assert rows(current) == [["g1", "events", str(p), str(offsets[("events", p)])] for p in (0, 1)]

    # --export then --from-file: the CSV round trip.
    exported = ok(kctl(b, "groups reset-offsets --group g1 --all-topics --to-earliest --export"))
    assert exported == "events,0,0\nevents,1,0\n"
    plan = tmp_path / "plan.csv"
    plan.write_text("events,0,1\nevents,1,0\n")
    ok(kctl(b, f"groups reset-offsets --group g1 --from-file {plan} --execute"))
    assert committed(cluster, "g1") == {("events", 0): 1, ("events", 1): 0}
    fails(kctl(b, f"groups reset-offsets --group g1 --from-file {tmp_path / 'none.csv'}"), code=2, mentions="none.csv")

    # --by-duration: every record is younger than an hour, so: the earliest offsets.
    ok(kctl(b, "groups reset-offsets --group g1 --all-topics --by-duration PT1H --execute"))
    assert committed(cluster, "g1") == {("events", 0): 0, ("events", 1): 0}
    fails(kctl(b, "groups reset-offsets --group g1 --all-topics --by-duration 1h"), code=2, mentions="--by-duration")

    # --all-groups: every inactive group, one table; --export adds the group column.
    both = ok(kctl(b, "groups reset-offsets --all-groups --all-topics --to-latest --export --execute"))
    assert both.splitlines() == [f"g{g},events,{p},{offsets[('events', p)]}" for g in (1, 2) for p in (0, 1)], both
    assert committed(cluster, "g1") == offsets


def _state_file(folder: Path, cluster: LocalCluster) -> None:
    (folder / ".run").mkdir(parents=True)
    state = {"zookeeper": {"pid": os.getpid(), "connect": cluster.zk_connect}, "bootstrap": cluster.bootstrap}
    (folder / ".run" / "cluster.json").write_text(json.dumps(state))


def run_in(cwd: Path, *words: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "KBROKER_BOOTSTRAP"}
    environ.update(env or {})
    args = [arg for w in words for arg in w.split()]
    return subprocess.run(
        [sys.executable, "-m", "kbroker.cli", *args],
        input="",
        capture_output=True,
        text=True,
        timeout=90,
        cwd=cwd,
        env={**environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def test_topics_leaders_default_connection_and_top(cluster: LocalCluster, tmp_path: Path) -> None:
    b, z = f"--bootstrap-server {cluster.bootstrap}", f"--zookeeper {cluster.zk_connect}"
    ok(kctl(z, "topics create --topic strict --partitions 1 --replication-factor 1 --config min.insync.replicas=2"))
    ok(kctl(b, "topics create --topic plain --partitions 2 --replication-factor 1"))

    def led() -> bool:
        out = ok(kctl(b, "topics describe"))
        return "Leader: none" not in out and out.count("\tPartition: ") == 3

    wait_for(led, "leaders of strict and plain")
    for c in (b, z):
        under = ok(kctl(c, "topics describe --under-min-isr-partitions")).splitlines()
        assert [line.split("\t")[1:3] for line in under] == [["Topic: strict", "Partition: 0"]], under
        at = ok(kctl(c, "topics describe --at-min-isr-partitions")).splitlines()
        assert [line.split("\t")[1:3] for line in at] == [
            ["Topic: plain", "Partition: 0"],
            ["Topic: plain", "Partition: 1"],
        ]
        overrides = ok(kctl(c, "topics describe --topics-with-overrides")).splitlines()
        assert len(overrides) == 1 and overrides[0].startswith("Topic: strict\t"), overrides
        assert overrides[0].endswith("Configs: min.insync.replicas=2")
    fails(kctl(b, "topics describe --topics-with-overrides --at-min-isr-partitions"), code=2)

    def topic_id() -> str | None:
        first = ok(kctl(z, "topics describe --topic plain")).splitlines()[0]
        fields = dict(f.split(": ", 1) for f in first.split("\t") if ": " in f)
        return fields.get("TopicId")

    assert len(wait_for(topic_id, "the topic id of plain")) == 22

    # One broker leads everything already: nothing to elect, said as Kafka says it.
    for c in (b, z):
        assert (
            ok(kctl(c, "leaders elect --topic plain"))
            == "Valid replica already elected for partitions plain-0, plain-1\n"
        )

    # The default connection: .run/cluster.json (in the cwd or a parent), or $KBROKER_BOOTSTRAP.
    local = tmp_path / "local"
    _state_file(local, cluster)
    (local / "sub").mkdir()
    listed = run_in(local / "sub", "-v topics list")
    assert listed.returncode == 0 and listed.stdout.split() == ["plain", "strict"], listed.stderr
    assert f"using --bootstrap-server {cluster.bootstrap} from {local / '.run' / 'cluster.json'}" in listed.stderr
    assert cluster.bootstrap in run_in(local, "topics list --help").stdout  # --help says what the default is now
    empty = tmp_path / "empty"
    empty.mkdir()
    from_env = run_in(empty, "brokers list", env={"KBROKER_BOOTSTRAP": cluster.bootstrap})
    assert from_env.returncode == 0 and from_env.stdout.startswith("0 "), from_env.stderr
    nothing = run_in(empty, "topics list")
    assert nothing.returncode == 2 and "exactly one of --zookeeper or --bootstrap-server" in nothing.stderr

    # kctl top --once: one frame of the live view.
    if importlib.util.find_spec("rich") is None:
        pytest.skip("rich is not installed")
    ok(kctl(b, "consume --topic plain --group watcher --timeout-ms 500"))
    frame = ok(kctl(b, "top --once --interval 0.5"))
    for text in ("Brokers", cluster.bootstrap, "controller", "plain", "strict", "Under-replicated partitions: none"):
        assert text in frame, frame
    alias = ok(kctl(b, "cluster status --interval 0.2"))
    assert "Brokers" in alias and "plain" in alias
    fails(kctl(b, "top --once --interval 0"), code=2, mentions="--interval")
