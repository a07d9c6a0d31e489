"""The compose cluster with TLS and SCRAM (``deploy/compose.secure.yaml`` over
``deploy/compose.yaml``): its one-shot ``secrets`` service makes a CA, the brokers'
certificate and an ``admin`` SCRAM user; brokers replicate over INTERNAL, SSL with client
certificates required; clients on the host reach both doors over EXTERNAL, SASL_SSL with
SCRAM-SHA-512, and nothing less. Marked ``docker`` and ``slow``; skipped, saying why,
where no Docker engine answers.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kclient import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from kclient.errors import KafkaError
from tests.container_support import (
    KBROKER_IMAGE,
    PROMETHEUS_IMAGE,
    ROOT,
    ZOOKEEPER_IMAGE,
    ComposeProject,
    ensure_images,
    require_docker,
)
from tests.support import wait_until

require_docker()

ck = pytest.importorskip("confluent_kafka")

pytestmark = [pytest.mark.docker, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ComposeProject, Path]]:
    ensure_images(KBROKER_IMAGE, ZOOKEEPER_IMAGE, PROMETHEUS_IMAGE)
    secrets = tmp_path_factory.mktemp("secrets")
    p = ComposeProject([ROOT / "deploy" / "compose.secure.yaml"], env={"KBROKER_SECRETS_DIR": str(secrets)})
    try:
        took = p.up()
        print(f"\nsecure compose cluster {p.name}: up and healthy in {took:.1f} s")
        yield p, secrets
    except BaseException:
        print(p.logs(80))
        raise
    finally:
        p.down()


def scram(secrets: Path, password: str | None = None) -> dict[str, Any]:
    return {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(secrets / "ca.pem"),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "admin",
        "sasl_plain_password": password or (secrets / "admin.password").read_text().strip(),
    }


def test_both_doors_serve_scram_over_tls_and_nothing_less(secure: tuple[ComposeProject, Path]) -> None:
    project, secrets = secure
    client = scram(secrets)
    with AdminClient(bootstrap_servers=project.grpc_bootstrap, **client) as admin:
        admin.create_topics([NewTopic("vault", 3, 3, topic_configs={"min.insync.replicas": "2"})])
        # The brokers replicate to each other over INTERNAL: mutual TLS.
        wait_until(lambda: all(len(p.isr) == 3 for p in admin.describe_topics(["vault"])[0].partitions), 60, "full ISR")
    with Producer(bootstrap_servers=project.grpc_bootstrap, acks="all", **client) as producer:
        for i in range(30):
            producer.send("vault", str(i).encode(), partition=i % 3)
        producer.flush(30)
    rd = ck.Producer(
        {
            "bootstrap.servers": project.kafka_bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "admin",
            "sasl.password": client["sasl_plain_password"],
            "ssl.ca.location": client["ssl_cafile"],
            "acks": "all",
        }
    )
    for i in range(30, 60):
        rd.produce("vault", str(i).encode(), partition=i % 3)
    assert rd.flush(30) == 0
    with Consumer(bootstrap_servers=project.grpc_bootstrap, auto_offset_reset="earliest", **client) as c:
        tps = [TopicPartition("vault", p) for p in range(3)]
        c.assign(tps)
        got: set[int] = set()
        wait_until(
            lambda: got.update(int(r.value) for rs in c.poll(timeout_ms=500).values() for r in rs) or len(got) == 60,
            60,
            "60 records",
        )
    assert got == set(range(60))

    # kctl with the client configuration the secrets service wrote.
    listed = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "kctl"),
            "--bootstrap-server",
            project.grpc_bootstrap.split(",")[0],
            "--command-config",
            str(secrets / "admin.properties"),
            "topics",
            "list",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0 and "vault" in listed.stdout.split(), listed

    # A plaintext client and a wrong password get nowhere.
    with pytest.raises(KafkaError), AdminClient(bootstrap_servers=project.grpc_bootstrap, request_timeout_ms=3000) as a:
        a.list_topics()
    with (
        pytest.raises(KafkaError),
        AdminClient(bootstrap_servers=project.grpc_bootstrap, request_timeout_ms=3000, **scram(secrets, "wrong")) as a,
    ):
        a.list_topics()


def test_metrics_are_scraped_beside_tls(secure: tuple[ComposeProject, Path]) -> None:
    """Prometheus reaches every broker's metrics port (plain HTTP) in the secured cluster."""
    import json
    import urllib.request

    def up() -> int:
        with urllib.request.urlopen(f"{secure[0].prometheus_url}/api/v1/targets", timeout=10) as resp:
            targets = json.load(resp)["data"]["activeTargets"]
        return sum(t["health"] == "up" for t in targets)

    wait_until(lambda: up() == 3, 60, "three brokers scraped")
