"""Shared fixtures: a real ZooKeeper for the whole run, a chroot per test, broker processes.

ZooKeeper comes from, in order: ``$KBROKER_TEST_ZOOKEEPER`` (an address), a
testcontainers ZooKeeper where a Docker engine answers and has the project's
ZooKeeper image (``scripts/images`` builds it from Debian's packages: no registry
answers here), or real ZooKeeper servers started from the local jars (Debian's
``zookeeper`` package). ``$KBROKER_TEST_ZOOKEEPER_FROM`` (``container`` or ``jars``)
picks one of the last two: ``scripts/test`` runs its main step on the jars and a step
of broker, group and session tests on the container, so that CI exercises both. The run's header says
which. Broker logs are printed when a test fails.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kbroker.local.cluster import LocalCluster
from kbroker.local.zookeeper import ZooKeeperEnsemble, ZooKeeperNotFound, classpath

ZOOKEEPER_IMAGE = "kbroker-zookeeper:latest"
"""The ZooKeeper image ``scripts/images`` builds."""


def _docker_has(image: str) -> bool:
    """Does a Docker engine answer, with ``image`` built?"""
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=2)
        client.ping()
        client.images.get(image)
        return True
    except Exception:
        return False


def zookeeper_source() -> str:
    """Where this run's ZooKeeper comes from: ``address``, ``container`` or ``jars``."""
    if os.environ.get("KBROKER_TEST_ZOOKEEPER"):
        return "address"
    wanted = os.environ.get("KBROKER_TEST_ZOOKEEPER_FROM", "")
    if wanted not in ("", "container", "jars"):
        raise pytest.UsageError(f"KBROKER_TEST_ZOOKEEPER_FROM={wanted!r}: use container or jars")
    if wanted:
        return wanted
    return "container" if _docker_has(ZOOKEEPER_IMAGE) else "jars"


def pytest_report_header(config: pytest.Config) -> str:
    source = zookeeper_source()
    where = {
        "address": f"$KBROKER_TEST_ZOOKEEPER ({os.environ.get('KBROKER_TEST_ZOOKEEPER')})",
        "container": f"a testcontainers container of {ZOOKEEPER_IMAGE}",
        "jars": "servers started from the local jars",
    }[source]
    return f"ZooKeeper for the integration tests: {where}"


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ZooKeeper connect string (no chroot) shared by the whole run."""
    source = zookeeper_source()
    if source == "address":
        yield os.environ["KBROKER_TEST_ZOOKEEPER"]
        return
    if source == "container":
        os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # Ryuk's image cannot be pulled here
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.waiting_utils import wait_for_logs

        # The settings of the local jars' servers (kbroker.local.zookeeper): the tests'
        # 3-4 s sessions need a 500 ms tick (the image's 2 s tick floors a session at 4 s
        # and expires it up to a tick late), and every client comes through Docker's port
        # proxy from one address, so no per-address connection cap.
        container = (
            DockerContainer(ZOOKEEPER_IMAGE)
            .with_exposed_ports(2181)
            .with_env("ZOO_TICK_TIME", "500")
            .with_env("ZOO_MAX_CLIENT_CNXNS", "0")
            .with_env("ZOO_4LW_COMMANDS_WHITELIST", "*")
            .with_env("ZOO_CFG_EXTRA", "minSessionTimeout=1000 maxSessionTimeout=60000")
        )
        container.start()
        try:
            wait_for_logs(container, "binding to port", timeout=60)
            yield f"{container.get_container_host_ip()}:{container.get_exposed_port(2181)}"
        finally:
            container.stop()
        return
    try:
        classpath()
    except ZooKeeperNotFound as exc:
        pytest.skip(str(exc))
    ensemble = ZooKeeperEnsemble(tmp_path_factory.mktemp("zookeeper"), size=1)
    ensemble.start()
    try:
        yield ensemble.connect_string
    finally:
        ensemble.stop()


@pytest.fixture
def zk_connect(zookeeper: str) -> str:
    """The shared ZooKeeper with a fresh chroot for this test."""
    return f"{zookeeper}/kbroker-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _root_logger_kept() -> Iterator[None]:
    """What a test does to the root logger (kctl's ``main`` and ``log_setup.configure``
    run in-process set its level and handlers) is undone after it: the next test in the
    same process (pytest-xdist workers run many) sees the default, and its caplog the
    records it expects."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


FAST_BROKER = {
    "zookeeper.session.timeout.ms": "4000",
    "replica.lag.time.max.ms": "4000",
    # The last broker of a test cluster cannot move its leaderships anywhere: don't wait
    # Kafka's 3 x 5 s for it at every teardown.
    "controlled.shutdown.retry.backoff.ms": "200",
}


@pytest.fixture
def cluster_factory(
    zk_connect: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., LocalCluster]]:
    """Start ``n`` real broker processes: ``cluster_factory(n, **overrides)``."""
    clusters: list[LocalCluster] = []

    def make(n: int = 1, **overrides: str) -> LocalCluster:
        c = LocalCluster(tmp_path / f"cluster{len(clusters)}", zk_connect, {**FAST_BROKER, **overrides})
        clusters.append(c)
        return c.start(n)

    yield make
    failed = any(
        getattr(request.node, f"rep_{w}", None) and getattr(request.node, f"rep_{w}").failed for w in ("setup", "call")
    )
    for c in clusters:
        if failed:
            print(c.logs())
        c.stop()


@pytest.fixture
def cluster(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    """One broker (id 0)."""
    return cluster_factory(1)
