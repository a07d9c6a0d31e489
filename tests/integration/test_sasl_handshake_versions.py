"""SaslHandshake versions: Kafka serves v0-1 and librdkafka before 2.x-something only
logs in when ApiVersions lists v0 (its "SASL handshake" feature needs the range to cover
v0; it then sends v1 and SaslAuthenticate). Debian's kcat (librdkafka 2.0.2) over
SASL_PLAINTEXT with SCRAM, and the handshake on the wire."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

import pytest

from kbroker.local.cluster import LocalCluster
from tests.kafka_wire import WireClient
from tests.support import set_scram_passwords

pytestmark = pytest.mark.integration

PASSWORDS = {"alice": "alice-secret"}


@pytest.fixture
def scram(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    cluster = cluster_factory(
        1,
        **{
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,KSCRAM:SASL_PLAINTEXT",
            "kafka.listeners": "KSCRAM://127.0.0.1:0",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
        },
    )
    set_scram_passwords(cluster.zk_connect, PASSWORDS)
    return cluster


def test_api_versions_lists_sasl_handshake_from_v0(scram: LocalCluster) -> None:
    with WireClient(scram.kafka_bootstrap("KSCRAM")) as c:
        r = c.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        ranges = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in r.api_keys}
        assert ranges[17] == (0, 1)


@pytest.mark.parametrize("version", [0, 1])
def test_sasl_handshake_answers_the_mechanisms(scram: LocalCluster, version: int) -> None:
    with WireClient(scram.kafka_bootstrap("KSCRAM")) as c:
        r = c.call(17, version, {"mechanism": "SCRAM-SHA-256"})
        assert r.error_code == 0
        assert "SCRAM-SHA-256" in r.mechanisms


def test_debian_kcat_logs_in_with_scram(scram: LocalCluster) -> None:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (scripts/setup dev installs it)")
    out = subprocess.run(
        [
            "kcat", "-b", scram.kafka_bootstrap("KSCRAM"), "-L",
            "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=SCRAM-SHA-256",
            "-X", "sasl.username=alice", "-X", f"sasl.password={PASSWORDS['alice']}",
            "-m", "10",
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "1 brokers" in out.stdout, out.stdout
