"""The secured local cluster of ``scripts/run --secure``: TLS everywhere, SCRAM users,
ACLs, and ZooKeeper ACLs — made from scratch under ``.run/secure/``.

- a local CA (``ca.pem``, made on the first run and kept, as are the passwords in
  ``secrets.json``) and one broker certificate (``CN=broker``, for every broker: a local
  cluster has one host);
- listeners ``INTERNAL`` (SSL, client certificates required; the inter-broker listener,
  so brokers authenticate to each other as ``User:CN=broker``) and ``CLIENT`` (SASL_SSL
  with SCRAM-SHA-256/512) on free ports;
- ``authorizer.class.name=kafka.security.authorizer.AclAuthorizer`` with
  ``super.users=User:CN=broker;User:admin`` and no access for anyone else;
- an ``admin`` SCRAM user with a random password, written to ``admin.properties``
  (mode 0600, Java client property names, for ``kctl --command-config``);
- ``zookeeper.set.acl=true`` with a random ZooKeeper digest credential (``zk.digest``,
  mode 0600): the znodes are writable by the brokers and that credential only.

Thread safety: run once from the command line.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from kbroker.cluster.zk_client import ZkClient
from kbroker.security import certs
from kbroker.security.credentials import CredentialStore

ADMIN = "admin"
CLIENT_LISTENER = "CLIENT"


@dataclass(frozen=True)
class SecureSetup:
    """What a secured local cluster needs: broker overrides, the client's settings."""

    broker_overrides: dict[str, str]
    client_configs: dict[str, str]
    """kafka-python names for Producer / Consumer / AdminClient."""
    command_config: Path
    """``admin.properties`` for ``kctl --command-config``."""
    zk_digest: str
    """``user:password`` of the ZooKeeper credential (``KBROKER_ZK_DIGEST``)."""


def _secret_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def prepare(root: Path) -> SecureSetup:
    """Make the CA, certificates, credentials and files under ``root`` (``.run/secure``),
    or reuse them: a restarted cluster keeps its CA, its admin password and the ZooKeeper
    credential its znodes are protected with."""
    saved = root / "secrets.json"
    if saved.exists():
        kept = json.loads(saved.read_text())
        ca = certs.load_ca(root / "tls")
        password, zk_digest = kept["admin_password"], kept["zk_digest"]
    else:
        ca = certs.make_ca(root / "tls", "kbroker local CA")
        password = secrets.token_urlsafe(18)
        zk_digest = f"kbroker:{secrets.token_urlsafe(18)}"
        _secret_file(saved, json.dumps({"admin_password": password, "zk_digest": zk_digest}))
    broker = certs.issue(ca, root / "tls", "broker")
    _secret_file(root / "zk.digest", zk_digest + "\n")
    command_config = root / "admin.properties"
    _secret_file(
        command_config,
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN}" password="{password}";\n'
        f"ssl.truststore.type=PEM\nssl.truststore.location={ca.cert_path}\n",
    )
    overrides = {
        "listeners": f"INTERNAL://127.0.0.1:0,{CLIENT_LISTENER}://127.0.0.1:0",
        "listener.security.protocol.map": f"INTERNAL:SSL,{CLIENT_LISTENER}:SASL_SSL",
        "inter.broker.listener.name": "INTERNAL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(broker.keystore_path),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca.cert_path),
        "listener.name.internal.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": f"User:{broker.subject};User:{ADMIN}",
        "zookeeper.set.acl": "true",
    }
    client = {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(ca.cert_path),
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": ADMIN,
        "sasl_plain_password": password,
    }
    return SecureSetup(overrides, client, command_config, zk_digest)


def create_admin(zk_connect: str, setup: SecureSetup) -> None:
    """The admin SCRAM user (both mechanisms), written with the ZooKeeper credential so
    that its znode is protected like the brokers' own."""
    zk = ZkClient(zk_connect, auth_digest=setup.zk_digest, set_acl=True)
    zk.start()
    try:
        store = CredentialStore(zk)
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            store.set_password(ADMIN, mechanism, setup.client_configs["sasl_plain_password"])
    finally:
        zk.close()
