"""``scripts/run --secure`` (kbroker.local.run) as a user runs it: a TLS + SCRAM + ACL
cluster comes up, the demo runs over SASL_SSL, the printed kctl command works with the
admin's --command-config, anonymous clients and unauthenticated ZooKeeper writes are
refused, a second start reuses the CA and credentials, and a plaintext start on the
secured data is refused with one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from kclient import AdminClient
from kclient.errors import KafkaError

pytestmark = pytest.mark.integration


def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kbroker.local.run", *args], capture_output=True, text=True, timeout=timeout
    )


def kctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kbroker.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_run_secure(tmp_path: Path) -> None:
    root = tmp_path / "run"
    try:
        started = run("--secure", "--dir", str(root))
        assert started.returncode == 0, started.stdout + started.stderr
        assert "consumed 9 records from 'demo'" in started.stdout, started.stdout
        state = json.loads((root / "cluster.json").read_text())
        bootstrap, command_config = state["bootstrap"], state["command_config"]
        assert f"--command-config {command_config}" in started.stdout
        assert (Path(command_config).stat().st_mode & 0o777) == 0o600

        listed = kctl("--bootstrap-server", bootstrap, "--command-config", command_config, "topics", "list")
        assert listed.returncode == 0 and "demo" in listed.stdout.split(), listed.stderr
        with pytest.raises(KafkaError):  # no credentials: no way in
            with AdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000) as anonymous:
                anonymous.list_topics()

        # The Kafka-protocol door speaks SASL_SSL too, with the same admin credentials.
        ck_admin = pytest.importorskip("confluent_kafka.admin")
        props = dict(line.split("=", 1) for line in Path(command_config).read_text().splitlines() if "=" in line)
        password = json.loads((root / "secure" / "secrets.json").read_text())["admin_password"]
        door = ck_admin.AdminClient(
            {
                "bootstrap.servers": state["kafka_bootstrap"],
                "security.protocol": "SASL_SSL",
                "sasl.mechanisms": "SCRAM-SHA-512",
                "sasl.username": "admin",
                "sasl.password": password,
                "ssl.ca.location": props["ssl.truststore.location"],
            }
        )
        assert "demo" in door.list_topics(timeout=30).topics
        assert f"Kafka-protocol clients: {state['kafka_bootstrap']}" in started.stdout

        zk = KazooClient(hosts=state["zookeeper"]["connect"])
        zk.start()
        try:
            with pytest.raises(NoAuthError):
                zk.create("/brokers/topics/sneaky", b"{}")
            with pytest.raises(NoAuthError):
                zk.get("/config/users/admin")
        finally:
            zk.stop()
            zk.close()

        assert run("--stop", "--dir", str(root)).returncode == 0
        again = run("--secure", "--dir", str(root))
        assert again.returncode == 0 and "topic 'demo' exists" in again.stdout, again.stdout + again.stderr
        assert run("--stop", "--dir", str(root)).returncode == 0
        plain = run("--dir", str(root))
        assert plain.returncode == 1 and "holds a secured cluster" in plain.stdout
    finally:
        run("--stop", "--dir", str(root))
