"""The replication fault test on a TLS + SCRAM cluster: one SASL_SSL listener for
clients and brokers alike, brokers logging in to each other as the SCRAM user ``broker``
(``sasl.mechanism.inter.broker.protocol``, the listener's ``sasl.jaas.config``), the
authorizer on. Leaders are SIGKILLed and restarted under an acks=all producer; every
acknowledged record is read back once, in order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kbroker.local.cluster import LocalCluster
from kbroker.security import certs
from tests.integration.test_faults import FAST, sigkill_bounces
from tests.support import set_scram_passwords

pytestmark = pytest.mark.integration

BROKER_PASSWORD, APP_PASSWORD = "broker-secret", "app-secret"


def tls_scram_cluster(
    cluster_factory: Callable[..., LocalCluster], zk_connect: str, tmp_path: Path, n: int
) -> tuple[LocalCluster, dict[str, str]]:
    ca = certs.make_ca(tmp_path / "ca")
    broker = certs.issue(ca, tmp_path / "ca", "broker")
    set_scram_passwords(zk_connect, {"broker": BROKER_PASSWORD})
    set_scram_passwords(zk_connect, {"app": APP_PASSWORD})
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="broker" password="{}";'
    cluster = cluster_factory(
        n,
        **FAST,
        **{
            "listeners": "SASL_SSL://127.0.0.1:0",
            "inter.broker.listener.name": "SASL_SSL",
            "ssl.keystore.location": str(broker.keystore_path),
            "ssl.truststore.location": str(broker.ca_path),
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": jaas.format(BROKER_PASSWORD),
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": "User:broker;User:app",
        },
    )
    client = {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(broker.ca_path),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "app",
        "sasl_plain_password": APP_PASSWORD,
    }
    return cluster, client


def test_sigkill_bounces_lose_nothing_on_a_tls_scram_cluster(
    cluster_factory: Callable[..., LocalCluster], zk_connect: str, tmp_path: Path
) -> None:
    cluster, client = tls_scram_cluster(cluster_factory, zk_connect, tmp_path, 3)
    sigkill_bounces(cluster, "leader", rounds=2, client=client)
