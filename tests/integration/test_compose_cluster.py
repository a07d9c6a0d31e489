"""The three-host cluster of ``deploy/compose.yaml``, from the images, as hosts fail.

One compose project (3 ZooKeeper nodes, 3 brokers, Prometheus; its own name and free
ports) serves the module:

- both doors serve a topic from the host: kclient over gRPC, librdkafka over the Kafka
  door, a consumer group on each;
- every query of the Grafana dashboard returns series from the project's Prometheus,
  and its alert rules are loaded and healthy;
- hosts fail under an idempotent acks=all producer and a consumer group on each door:
  ``docker kill`` a leader's broker, ``docker pause`` the controller, ``docker network
  disconnect`` a leader then reconnect it, ``docker kill`` a ZooKeeper node. Every
  acknowledged record is in the log once, at the offset acknowledged; both groups read
  every one; every partition is back to a full ISR;
- a rolling upgrade to a second image version (``scripts/images --version``), one broker
  at a time, under the same load: no partition goes offline, nothing is lost.

Recovery and per-broker upgrade times are printed (``pytest -s`` or ``-rA``). Marked
``docker`` and ``slow`` (a few minutes, CPU-heavy: CI runs it in the serial ``-m slow``
step); skipped, saying why, where no Docker engine answers.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from kclient import AdminClient, Consumer, NewTopic
from kclient.structs import PartitionMetadata
from tests.container_support import (
    KBROKER_IMAGE,
    PROMETHEUS_IMAGE,
    ROOT,
    VERSION,
    ZOOKEEPER_IMAGE,
    ComposeProject,
    build_images,
    docker,
    ensure_images,
    require_docker,
)
from tests.integration.test_faults import NumberedProducer, read_everything, validate
from tests.support import wait_until

require_docker()

ck = pytest.importorskip("confluent_kafka")

pytestmark = [pytest.mark.docker, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1500)]

DASHBOARD = ROOT / "deploy" / "grafana" / "kbroker-dashboard.json"
UPGRADED = f"{VERSION}.post1"
"""The version the rolling upgrade moves to (scripts/images --version builds it)."""

# Faster than Kafka's defaults (18 s sessions, 30 s ISR lag), so a host's failure is
# noticed within seconds; everything else is compose.yaml's.
FAST_FAILURE = """
x-fast: &fast
  KBROKER_ZOOKEEPER_SESSION_TIMEOUT_MS: "6000"
  KBROKER_REPLICA_LAG_TIME_MAX_MS: "6000"
  KBROKER_CONTROLLED_SHUTDOWN_RETRY_BACKOFF_MS: "500"
services:
  broker1: {environment: *fast}
  broker2: {environment: *fast}
  broker3: {environment: *fast}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeProject]:
    ensure_images(KBROKER_IMAGE, ZOOKEEPER_IMAGE, PROMETHEUS_IMAGE)
    override = tmp_path_factory.mktemp("compose") / "fast-failure.yaml"
    override.write_text(FAST_FAILURE)
    p = ComposeProject([override])
    try:
        took = p.up()
        print(f"\ncompose cluster {p.name}: up and healthy in {took:.1f} s")
        yield p
    except BaseException:
        print(p.logs(80))
        raise
    finally:
        p.down()
        label = f"label=com.docker.compose.project={p.name}"
        leftovers = docker("ps", "-aq", "--filter", label, check=False) + docker(
            "volume", "ls", "-q", "--filter", label, check=False
        )
        assert not leftovers, f"containers or volumes of {p.name} left behind: {leftovers}"


# --- what the cluster says ------------------------------------------------------------------


_admins: dict[str, AdminClient] = {}


def admin_of(project: ComposeProject) -> AdminClient:
    """One AdminClient per project, kept: it remembers which broker stopped answering and
    asks the others first, so a paused broker costs one short timeout, not one per call."""
    if project.name not in _admins:
        _admins[project.name] = AdminClient(bootstrap_servers=project.grpc_bootstrap, request_timeout_ms=1500)
    return _admins[project.name]


def partitions(project: ComposeProject, topic: str) -> list[PartitionMetadata]:
    (desc,) = admin_of(project).describe_topics([topic])
    return desc.partitions


def controller(project: ComposeProject) -> int:
    _, controller_id, _ = admin_of(project).describe_cluster()
    return controller_id


def settled(project: ComposeProject, topic: str, live: set[int]) -> bool:
    """Every partition led by a live broker (``live``), ISR full when all three are live."""
    try:
        parts = partitions(project, topic)
    except Exception:
        return False
    if any(p.leader not in live for p in parts):
        return False
    return len(live) < 3 or all(len(p.isr) == 3 for p in parts)


def create_topic(project: ComposeProject, topic: str, count: int) -> None:
    with AdminClient(bootstrap_servers=project.grpc_bootstrap, request_timeout_ms=15000) as admin:
        admin.create_topics([NewTopic(topic, count, 3, topic_configs={"min.insync.replicas": "2"})])
    wait_until(lambda: settled(project, topic, {1, 2, 3}), 60, f"{topic} fully replicated")


# --- load: a producer and a group on each door ------------------------------------------------


class GroupReader(threading.Thread):
    """A consumer group member reading ``topic`` until stopped: kclient over gRPC, or
    librdkafka (confluent-kafka) through the Kafka door. ``seen`` holds every value read."""

    def __init__(self, project: ComposeProject, topic: str, door: str) -> None:
        super().__init__(daemon=True, name=f"reader-{door}")
        self.project, self.topic, self.door = project, topic, door
        self.seen: set[int] = set()
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        if self.door == "grpc":
            self._run_grpc()
        else:
            self._run_kafka()

    def _run_grpc(self) -> None:
        with Consumer(
            self.topic,
            bootstrap_servers=self.project.grpc_bootstrap,
            group_id=f"{self.topic}-grpc",
            auto_offset_reset="earliest",
            request_timeout_ms=8000,
        ) as c:
            while not self.stop.is_set():
                try:
                    for recs in c.poll(timeout_ms=300).values():
                        self.seen.update(int(r.value) for r in recs)
                except Exception as exc:  # a broker going away: the consumer retries
                    self.errors.append(repr(exc))
                    time.sleep(0.5)

    def _run_kafka(self) -> None:
        c = ck.Consumer(
            {
                "bootstrap.servers": self.project.kafka_bootstrap,
                "group.id": f"{self.topic}-kafka",
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10000,
            }
        )
        c.subscribe([self.topic])
        try:
            while not self.stop.is_set():
                for m in c.consume(num_messages=500, timeout=0.3):
                    if m.error():
                        self.errors.append(str(m.error()))
                    else:
                        self.seen.add(int(m.value()))
        finally:
            c.close()


class Load:
    """The producer and the two group readers, started and stopped together."""

    def __init__(self, project: ComposeProject, topic: str) -> None:
        self.project, self.topic = project, topic
        self.producer = NumberedProducer(project.grpc_bootstrap, topic)  # idempotent by default
        self.readers = [GroupReader(project, topic, "grpc"), GroupReader(project, topic, "kafka")]

    def __enter__(self) -> Load:
        self.producer.start()
        for r in self.readers:
            r.start()
        wait_until(lambda: len(self.producer.acked) > 500, 60, "first acks")
        return self

    def resumed(self, since: float, lost: set[int], timeout_s: float = 90) -> float:
        """Seconds from ``since`` until each partition in ``lost`` (those the failed host
        led) had a record acknowledged again."""

        def first_acks() -> dict[int, float]:
            first: dict[int, float] = {}
            for t, p in list(self.producer.ack_log):
                if t > since and p in lost and p not in first:
                    first[p] = t
            return first

        wait_until(lambda: set(first_acks()) == lost, timeout_s, f"acks on partitions {sorted(lost)}")
        return max(first_acks().values()) - since

    def acks_after(self, what: str, timeout_s: float = 90) -> float:
        """Seconds from now until 200 more records are acknowledged."""
        t0, before = time.monotonic(), len(self.producer.acked)
        wait_until(lambda: len(self.producer.acked) > before + 200, timeout_s, f"acks after {what}")
        return time.monotonic() - t0

    def finish(self, partition_count: int) -> None:
        """Stop producing; check the log and both groups hold every acknowledged record."""
        self.producer.stop.set()
        self.producer.join(180)
        assert not self.producer.is_alive(), "the producer did not finish"
        validate(self.producer, read_everything(self.project.grpc_bootstrap, self.topic, partition_count))
        acked = set(self.producer.acked)
        for r in self.readers:
            wait_until(lambda r=r: acked <= r.seen, 120, f"the {r.door} group to read every acked record")
            r.stop.set()
            r.join(30)
            print(f"{r.door} group: read {len(r.seen)} distinct records, {len(r.errors)} errors {r.errors[:2]}")

    def __exit__(self, *exc: object) -> None:
        self.producer.stop.set()
        for r in self.readers:
            r.stop.set()


# --- the tests ----------------------------------------------------------------------------------


def test_both_doors_serve_the_cluster_from_the_host(project: ComposeProject) -> None:
    create_topic(project, "greetings", 3)
    from kclient import Producer

    with Producer(bootstrap_servers=project.grpc_bootstrap, acks="all") as p:
        for i in range(100):
            p.send("greetings", str(i).encode(), partition=i % 3)
        p.flush(30)
    rd = ck.Producer({"bootstrap.servers": project.kafka_bootstrap, "acks": "all"})
    for i in range(100, 200):
        rd.produce("greetings", str(i).encode(), partition=i % 3)
    assert rd.flush(30) == 0
    load = Load(project, "greetings")
    for r in load.readers:
        r.start()
    try:
        for r in load.readers:
            wait_until(lambda r=r: len(r.seen) == 200, 60, f"the {r.door} group to read 200 records")
            assert r.seen == set(range(200))
    finally:
        for r in load.readers:
            r.stop.set()
            r.join(30)
    # Each broker advertises its own published ports on each door.
    with AdminClient(bootstrap_servers=project.grpc_bootstrap) as admin:
        brokers, _, _ = admin.describe_cluster()
    assert {(b.node_id, b.port) for b in brokers} == set(project.grpc_ports.items())
    md = rd.list_topics(timeout=10)
    assert {(b.id, b.port) for b in md.brokers.values()} == set(project.kafka_ports.items())


def prometheus(project: ComposeProject, path: str, **params: str) -> Any:
    url = f"{project.prometheus_url}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]


def test_every_dashboard_query_returns_series(project: ComposeProject) -> None:
    from tests.monitoring_support import dashboard_queries

    queries = dashboard_queries(DASHBOARD)
    assert queries, "the dashboard has no queries"
    # The errors panel counts refused requests: a healthy cluster may have none yet, so
    # send each broker one it must refuse (garbage for a Produce: INVALID_ARGUMENT).
    for port in project.grpc_ports.values():
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError) as refused:
                channel.unary_unary("/kbroker.v1.Broker/Produce")(b"\xff\xff\xff\xfe not a request", timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    wait_until(
        lambda: len([t for t in prometheus(project, "/api/v1/targets")["activeTargets"] if t["health"] == "up"]) == 3,
        60,
        "Prometheus to scrape the three brokers",
    )
    empty: dict[str, str] = {}

    def all_answer() -> bool:
        empty.clear()
        for q in queries:
            result = prometheus(project, "/api/v1/query", query=q)["result"]
            if not result:
                empty[q] = "no series"
        return not empty

    try:
        wait_until(all_answer, 90, "every dashboard query to return series")
    except Exception:
        raise AssertionError(f"dashboard queries without series: {json.dumps(empty, indent=1)}") from None
    print(f"\n{len(queries)} dashboard queries, each returned series")
    groups = prometheus(project, "/api/v1/rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert rules, "no alert rules loaded"
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    firing = [r["name"] for r in rules if r["type"] == "alerting" and r["state"] == "firing"]
    assert not firing, f"alerts firing on a healthy cluster: {firing}"


def zookeeper_mode(project: ComposeProject, node: str) -> str:
    """A ZooKeeper node's ``Mode:`` (leader, follower), by the four-letter word srvr."""
    srvr = "exec 3<>/dev/tcp/127.0.0.1/2181 && echo srvr >&3 && cat <&3"
    out = docker("exec", project.container(node), "bash", "-c", srvr, check=False)
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Mode:")), "")


def led_by(project: ComposeProject, topic: str, broker: int) -> set[int]:
    return {p.partition for p in partitions(project, topic) if p.leader == broker}


def broker_fault(
    project: ComposeProject,
    load: Load,
    name: str,
    broker: int,
    fault: Callable[[], object],
    heal: Callable[[], object],
    times: dict[str, float],
) -> None:
    """``fault`` a broker's host, wait for its partitions to be led by the others and
    acknowledged again, ``heal`` it, wait for every ISR to be full; record the times."""
    lost = led_by(project, load.topic, broker)
    live = {1, 2, 3} - {broker}
    t0 = time.monotonic()
    fault()
    done = time.monotonic()  # acks that arrive while the docker command runs were answered before
    try:
        wait_until(lambda: settled(project, load.topic, live), 60, f"{name}: leaders on the other brokers")
        times[f"{name}: leaders moved"] = time.monotonic() - t0
        times[f"{name}: acks again on the {len(lost)} partitions it led"] = load.resumed(done, lost) + done - t0
    finally:
        t0 = time.monotonic()
        heal()  # also when a wait failed: the module's cluster is shared with the next test
    wait_until(lambda: settled(project, load.topic, {1, 2, 3}), 120, f"{name}: every ISR full again")
    times[f"{name}: healed -> every ISR full"] = time.monotonic() - t0


def test_hosts_failing_lose_no_acknowledged_record(project: ComposeProject) -> None:
    topic, count = "ledger", 6
    create_topic(project, topic, count)
    times: dict[str, float] = {}
    with Load(project, topic) as load:
        # docker kill the broker leading partition 0, then start it again.
        b = partitions(project, topic)[0].leader
        c = project.container(f"broker{b}")
        broker_fault(
            project, load, "docker kill a leader", b, lambda: docker("kill", c), lambda: docker("start", c), times
        )

        # docker pause the controller past its ZooKeeper session (6 s), then unpause it.
        b = controller(project)
        c = project.container(f"broker{b}")
        broker_fault(
            project,
            load,
            "docker pause the controller",
            b,
            lambda: docker("pause", c),
            lambda: docker("unpause", c),
            times,
        )

        # docker network disconnect the leader of partition 1, then connect it again.
        b = partitions(project, topic)[1].leader
        c = project.container(f"broker{b}")
        broker_fault(
            project,
            load,
            "docker network disconnect a leader",
            b,
            lambda: docker("network", "disconnect", project.network, c),
            lambda: docker("network", "connect", "--alias", f"broker{b}", project.network, c),
            times,
        )

        # docker kill the ZooKeeper leader: the other two elect a leader and keep the
        # quorum. A broker failover works on the two; then both come back.
        zk = next(n for n in ("zk1", "zk2", "zk3") if zookeeper_mode(project, n) == "leader")
        t0 = time.monotonic()
        docker("kill", project.container(zk))
        times["docker kill the ZooKeeper leader: 200 more acks"] = load.acks_after("the ZooKeeper leader's death")
        wait_until(
            lambda: "leader" in {zookeeper_mode(project, n) for n in ("zk1", "zk2", "zk3")}, 60, "a ZooKeeper leader"
        )
        times["docker kill the ZooKeeper leader: a new ZooKeeper leader"] = time.monotonic() - t0
        b = partitions(project, topic)[2].leader
        c = project.container(f"broker{b}")

        def both_back() -> None:
            docker("start", project.container(zk), c)
            project.wait_healthy([zk, f"broker{b}"], 120)

        broker_fault(project, load, "then docker kill a leader", b, lambda: docker("kill", c), both_back, times)
        load.finish(count)
    print("\n" + "\n".join(f"  {k}: {v:.1f} s" for k, v in times.items()))
    assert all(len(p.isr) == 3 and p.leader in (1, 2, 3) for p in partitions(project, topic))


def test_rolling_upgrade_keeps_every_partition_online(project: ComposeProject) -> None:
    build_images("--version", UPGRADED)
    topic, count = "upgrade", 6
    create_topic(project, topic, count)
    offline: list[tuple[float, str, int]] = []
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            try:
                for p in partitions(project, topic):
                    if p.leader < 0:
                        offline.append((time.monotonic(), topic, p.partition))
            except Exception:
                pass  # the broker asked was the one stopping: the next call asks another
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    per_broker: dict[int, float] = {}
    with Load(project, topic) as load:
        watcher.start()
        for b in ComposeProject.BROKERS:
            t0 = time.monotonic()
            # compose recreates the service on the new image: docker stop (SIGTERM, a
            # controlled shutdown, up to stop_grace_period), then a new container on the
            # same volume.
            project.compose("up", "-d", "--no-deps", f"broker{b}", image=f"kbroker:{UPGRADED}", timeout=180)
            project.wait_healthy([f"broker{b}"], 120)
            wait_until(lambda: settled(project, topic, {1, 2, 3}), 120, f"broker {b} back in every ISR")
            per_broker[b] = time.monotonic() - t0
            got = docker("exec", project.container(f"broker{b}"), "kbroker", "--version")
            assert got == f"kbroker {UPGRADED}", got
        load.acks_after("the upgrade")
        watching.set()
        watcher.join(10)
        load.finish(count)
    print("\nrolling upgrade, per broker: " + ", ".join(f"broker{b} {t:.1f} s" for b, t in per_broker.items()))
    assert not offline, f"partitions offline during the upgrade: {offline[:10]}"
