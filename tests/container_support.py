"""What the container tests share: is a Docker engine there, the ``docker`` CLI, the
images of ``scripts/images`` (built when absent), and a compose project of
``deploy/compose.yaml`` under a name and ports of the test's own.

Thread safety: :class:`ComposeProject` is driven by one test thread; its read-only
helpers (:meth:`ComposeProject.container`, the addresses) may be called from any.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import tomllib
import uuid
from collections.abc import Sequence
from pathlib import Path

from kbroker.local.zookeeper import free_port

ROOT = Path(__file__).resolve().parents[1]
VERSION: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
KBROKER_IMAGE = f"kbroker:{VERSION}"
ZOOKEEPER_IMAGE = "kbroker-zookeeper:latest"
PROMETHEUS_IMAGE = "kbroker-prometheus:latest"
COMPOSE_FILE = ROOT / "deploy" / "compose.yaml"


def docker_unavailable() -> str | None:
    """Why no container test can run here, or None when a Docker engine answers."""
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=2).ping()
        return None
    except Exception as exc:
        return f"no Docker engine answers ({type(exc).__name__}): start dockerd, or run scripts/images, which starts it"


def require_docker() -> None:
    """Skip the calling test module, saying why, where no Docker engine answers."""
    import pytest

    why = docker_unavailable()
    if why:
        pytest.skip(why, allow_module_level=True)


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    """Run the docker CLI; its stdout, stripped. ``check``: a non-zero exit fails the test."""
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"docker {' '.join(args)} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout.strip()


def has_image(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def build_images(*args: str) -> None:
    """``scripts/images [args]``: a no-op when the images are up to date, a minute or two
    from nothing. Prints what it built and how long it took."""
    started = time.monotonic()
    done = subprocess.run(
        [str(ROOT / "scripts" / "images"), *args], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, f"scripts/images exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    print(done.stdout)
    print(f"scripts/images {' '.join(args)} took {time.monotonic() - started:.0f} s")


def ensure_images(*names: str) -> None:
    if not all(has_image(n) for n in names):
        build_images()


class ComposeProject:
    """``deploy/compose.yaml`` (plus ``overrides``, more compose files) as a project named
    ``kbc<random>``, its published ports chosen free (the variables compose.yaml reads),
    so that it runs beside another cluster on this host. :meth:`down` removes it all,
    volumes too.

    Compose v1 (Debian's ``docker-compose``) names containers ``<project>_<service>_1``
    and the network ``<project>_default``.
    """

    BROKERS = (1, 2, 3)

    def __init__(
        self, overrides: Sequence[Path] = (), image: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.name = f"kbc{uuid.uuid4().hex[:8]}"
        self.extra_env = env or {}
        self.files = [COMPOSE_FILE, *overrides]
        self.grpc_ports = {b: free_port() for b in self.BROKERS}
        self.kafka_ports = {b: free_port() for b in self.BROKERS}
        self.prometheus_port = free_port()
        self.image = image or KBROKER_IMAGE

    @property
    def network(self) -> str:
        return f"{self.name}_default"

    def env(self, image: str | None = None) -> dict[str, str]:
        ports = {f"KBROKER_GRPC_PORT_{b}": str(p) for b, p in self.grpc_ports.items()}
        ports |= {f"KBROKER_KAFKA_PORT_{b}": str(p) for b, p in self.kafka_ports.items()}
        ports |= {"KBROKER_PROMETHEUS_PORT": str(self.prometheus_port), "KBROKER_IMAGE": image or self.image}
        return {**os.environ, **self.extra_env, **ports}

    def compose(self, *args: str, timeout: float = 300, image: str | None = None, check: bool = True) -> str:
        cmd = ["docker-compose", "-p", self.name]
        for f in self.files:
            cmd += ["-f", str(f)]
        done = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, env=self.env(image))
        if check:
            assert done.returncode == 0, f"docker-compose {' '.join(args)} exited {done.returncode}\n{done.stderr}"
        return done.stdout

    def container(self, service: str) -> str:
        return f"{self.name}_{service}_1"

    def health(self, service: str) -> str:
        out = docker("inspect", "--format", "{{json .State}}", self.container(service), check=False)
        if not out:
            return "absent"
        state = json.loads(out)
        if state.get("Paused"):
            return "paused"
        if not state.get("Running"):
            return "exited"
        return str(state.get("Health", {}).get("Status", "running"))

    def wait_healthy(self, services: Sequence[str], timeout_s: float = 180) -> float:
        """Seconds until every one of ``services`` is healthy."""
        started = time.monotonic()
        while True:
            states = {s: self.health(s) for s in services}
            if all(v == "healthy" for v in states.values()):
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise AssertionError(f"not healthy in {timeout_s:.0f} s: {states}\n{self.logs()}")
            time.sleep(0.5)

    def logs(self, tail: int = 40) -> str:
        return self.compose("logs", "--no-color", f"--tail={tail}", check=False, timeout=60)

    @property
    def grpc_bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.grpc_ports.values())

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.kafka_ports.values())

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    def up(self, timeout_s: float = 240) -> float:
        """``up -d``, then wait for every service to be healthy; the seconds it all took."""
        started = time.monotonic()
        self.compose("up", "-d", timeout=timeout_s)
        self.wait_healthy(["zk1", "zk2", "zk3", *(f"broker{b}" for b in self.BROKERS), "prometheus"], timeout_s)
        return time.monotonic() - started

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "10", check=False, timeout=300)
