"""The container images (issue 25), smoke-tested: ZooKeeper from ``kbroker-zookeeper`` and
one broker from ``kbroker`` on a Docker network of this test's own, the broker configured
by a mounted properties file and ``KBROKER_*`` variables; both healthchecks go healthy,
and kclient on this host produces and consumes a record through the broker's port,
published on 127.0.0.1 only. Everything the test creates (containers, network) is removed,
pass or fail; the images stay.

Needs a Docker engine: skipped (with the reason) where none answers. ``scripts/images``
builds the images first when they are absent (a minute or two from nothing; it is a no-op
when they are up to date, so run it before this test to test a changed tree).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kbroker.local.zookeeper import free_port
from kclient import AdminClient, Consumer, NewTopic, Producer
from tests.container_support import KBROKER_IMAGE, VERSION, ZOOKEEPER_IMAGE, docker, ensure_images, require_docker

require_docker()

pytestmark = [pytest.mark.docker, pytest.mark.integration, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def images() -> None:
    ensure_images(KBROKER_IMAGE, ZOOKEEPER_IMAGE)


class Containers:
    """The containers and the network this test made, removed at the end."""

    def __init__(self) -> None:
        self.suffix = uuid.uuid4().hex[:8]
        self.network = f"kbroker-test-{self.suffix}"
        self.names: list[str] = []

    def run(self, name: str, *args: str) -> str:
        full = f"{name}-{self.suffix}"
        self.names.append(full)
        docker("run", "-d", "--name", full, "--network", self.network, "--network-alias", name, *args)
        return full

    def health(self, name: str) -> str:
        state = json.loads(docker("inspect", "--format", "{{json .State}}", name))
        if not state.get("Running"):
            return f"exited {state.get('ExitCode')}"
        return str(state.get("Health", {}).get("Status", "none"))

    def wait_healthy(self, name: str, timeout_s: float = 120) -> float:
        started = time.monotonic()
        status = ""
        while time.monotonic() - started < timeout_s:
            status = self.health(name)
            if status == "healthy":
                return time.monotonic() - started
            if status.startswith("exited"):
                break
            time.sleep(1)
        last = json.loads(docker("inspect", "--format", "{{json .State.Health}}", name, check=False) or "null")
        pytest.fail(f"{name} is {status}, not healthy; last healthchecks: {json.dumps(last, indent=1)[-2000:]}")

    def remove(self) -> None:
        for name in self.names:
            docker("rm", "-f", "-v", name, check=False)
        docker("network", "rm", self.network, check=False)


@pytest.fixture
def containers(images: None, request: pytest.FixtureRequest) -> Iterator[Containers]:
    made = Containers()
    docker("network", "create", made.network)
    try:
        yield made
    finally:
        failed = any(
            getattr(request.node, f"rep_{when}", None) and getattr(request.node, f"rep_{when}").failed
            for when in ("setup", "call")
        )
        if failed:
            for name in made.names:
                logs = subprocess.run(["docker", "logs", "--tail", "60", name], capture_output=True, text=True)
                print(f"--- docker logs {name}\n{logs.stdout}{logs.stderr}")
        made.remove()


def test_a_broker_container_serves_a_client_on_the_host(containers: Containers, tmp_path: Path) -> None:
    zookeeper = containers.run("zookeeper", "-e", "ZOO_MY_ID=1", ZOOKEEPER_IMAGE)

    # The mounted file gives the defaults of new topics; the environment, the rest.
    port = free_port()
    properties = tmp_path / "server.properties"
    properties.write_text("num.partitions=2\nauto.create.topics.enable=false\nbroker.id=7\n")
    properties.chmod(0o644)
    env = {
        "KBROKER_BROKER_ID": "1",  # over the file's 7
        "KBROKER_ZOOKEEPER_CONNECT": "zookeeper:2181/kbroker",
        "KBROKER_LISTENERS": f"PLAINTEXT://0.0.0.0:{port}",
        "KBROKER_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{port}",
        "KBROKER_ZOOKEEPER_SESSION_TIMEOUT_MS": "6000",
    }
    broker = containers.run(
        "broker1",
        *("--publish", f"127.0.0.1:{port}:{port}"),
        *("--volume", f"{properties}:/etc/kbroker/server.properties:ro"),
        *(arg for name, value in env.items() for arg in ("--env", f"{name}={value}")),
        KBROKER_IMAGE,
    )
    zk_s = containers.wait_healthy(zookeeper)
    broker_s = containers.wait_healthy(broker)
    print(f"healthy after: ZooKeeper {zk_s:.1f} s, then the broker {broker_s:.1f} s")

    assert docker("exec", broker, "id", "-un") == "kbroker"
    assert docker("exec", zookeeper, "id", "-un") == "zookeeper"
    assert docker("exec", broker, "kbroker", "--version") == f"kbroker {VERSION}"
    assert "serves on" in docker("exec", broker, "kbroker-docker-entrypoint", "--health")
    published = docker("port", broker)
    assert published == f"{port}/tcp -> 127.0.0.1:{port}", published

    bootstrap = f"127.0.0.1:{port}"
    with AdminClient(bootstrap) as admin:
        brokers, controller, _ = admin.describe_cluster()
        assert [(b.node_id, b.host, b.port) for b in brokers] == [(1, "127.0.0.1", port)]
        assert controller == 1
        admin.create_topics([NewTopic("smoke", replication_factor=1)])  # partitions: the file's num.partitions
        (described,) = admin.describe_topics(["smoke"])
        assert len(described.partitions) == 2

    with Producer(bootstrap_servers=bootstrap, acks="all") as producer:
        sent = producer.send("smoke", b"through the container", key=b"k", partition=1).get(30)
    assert (sent.partition, sent.offset) == (1, 0)

    consumer = Consumer(bootstrap_servers=bootstrap, group_id="smoke", auto_offset_reset="earliest")
    try:
        consumer.subscribe(["smoke"])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got += [r.value for r in records if r.value is not None]
        assert got == [b"through the container"]
        consumer.commit()
    finally:
        consumer.close()
