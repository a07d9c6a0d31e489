"""The lean install: ``pip install kbroker`` brings the broker, the client and kctl; Spark
and the test tools are extras, and nothing on the lean path imports them."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXTRAS_ONLY = ("pyspark", "pyarrow", "pytest", "hypothesis", "testcontainers", "kafka", "grpc_tools", "mypy", "ruff")


def _project() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_base_dependencies_are_what_running_needs() -> None:
    project = _project()["project"]
    base = _names(project["dependencies"])
    assert base == {
        "kazoo",
        "grpcio",
        "protobuf",
        "crc32c",
        "zstandard",
        "lz4",
        "cryptography",
        "cramjam",
        "prometheus-client",
        "rich",
        "kio",  # the Kafka-protocol door's message schemas
    }
    extras = project["optional-dependencies"]
    assert _names(extras["spark"]) == {"pyspark", "pyarrow"}
    dev = _names(extras["dev"])
    assert {"pytest", "pytest-xdist", "hypothesis", "testcontainers", "ruff", "mypy", "confluent-kafka"} <= dev
    assert not dev & {"pyspark", "pyarrow"}


def test_zookeeper_logging_configs_are_package_data() -> None:
    data = _project()["tool"]["setuptools"]["package-data"]["kbroker.local"]
    for name in data:
        assert (ROOT / "kbroker" / "local" / name).is_file(), name
    assert {"zookeeper-log4j.properties", "zookeeper-logback.xml"} <= set(data)


BLOCKER = f"""
import sys
BLOCKED = {EXTRAS_ONLY!r}

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is not part of the lean install")
        return None

sys.meta_path.insert(0, Block())
import kbroker.server, kbroker.cli.main, kbroker.local.run, kclient, kclient.admin  # noqa
from kbroker.cli.main import main
try:
    main(["--help"])
except SystemExit:
    pass
leaked = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print("LEAKED", leaked)
"""


def test_lean_path_imports_no_extra() -> None:
    """The broker, kctl, scripts/run and the client import with every extra-only package
    unimportable (a meta-path finder refuses them)."""
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "LEAKED []" in done.stdout, done.stdout + done.stderr
