"""SCRAM credentials on a real ZooKeeper: ``kctl users`` writes Kafka's znodes, and a
broker-side CredentialStore cache follows changes and deletions within seconds."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import ZkClient
from kbroker.security.credentials import (
    LOGIN_WAIT_S,
    CredentialStore,
    ScramDeletion,
    ScramUpsertion,
    alter_user_scram_credentials,
    describe_user_scram_credentials,
)
from kbroker.security.principal import KafkaPrincipal
from kbroker.security.sasl import SaslAuthenticationFailedError, SaslAuthenticator, SessionStore
from kclient.errors import (
    DuplicateResourceError,
    ResourceNotFoundError,
    UnacceptableCredentialError,
    UnsupportedSaslMechanismError,
)
from kclient.scram import ScramClient, ScramCredential, ScramMechanism
from tests.integration.fault_proxy import FaultProxy
from tests.support import wait_until

pytestmark = pytest.mark.integration

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
Result = subprocess.CompletedProcess[str]


def kctl(*args: str, stdin: str = "") -> Result:
    return subprocess.run(
        [sys.executable, "-m", "kbroker.cli", *args], input=stdin, capture_output=True, text=True, timeout=90
    )


def ok(result: Result) -> str:
    assert result.returncode == 0, f"kctl failed ({result.returncode}): {result.stderr}"
    return result.stdout


def fails(result: Result, code: int, mentions: str) -> None:
    assert result.returncode == code, f"exit {result.returncode}: {result.stdout!r} {result.stderr!r}"
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kctl: ") and mentions in lines[0], result.stderr


@pytest.fixture
def zk(zk_connect: str) -> Iterator[ZkClient]:
    client = ZkClient(zk_connect)
    client.start()
    client.ensure_persistent_paths()
    yield client
    client.close()


def _znode(zk: ZkClient, user: str) -> dict[str, object]:
    data, _ = zk.kazoo.get(zkdata.user_config_path(user))
    body: dict[str, object] = json.loads(data)
    return body


def _user_notifications(zk: ZkClient) -> list[str]:
    out = []
    for child in zk.config_changes():
        found = zk.config_change(child)
        if found is not None and found[0] == "users":
            out.append(found[1])
    return out


def _scram_login(store: CredentialStore, user: str, password: str, mechanism: ScramMechanism = SHA512) -> str:
    auth = SaslAuthenticator(
        enabled_mechanisms=["SCRAM-SHA-256", "SCRAM-SHA-512"], lookup=store.lookup, sessions=SessionStore()
    )
    client = ScramClient(mechanism, user, password)
    first = auth.authenticate(mechanism.value, "", client.first_message(), "SASL_PLAINTEXT")
    final = auth.authenticate(
        mechanism.value, first.exchange_id, client.final_message(first.auth_bytes), "SASL_PLAINTEXT"
    )
    client.verify_server_final(final.auth_bytes)
    assert final.session_token is not None
    return final.session_token


def test_kctl_users_create_list_delete(zk: ZkClient, zk_connect: str, tmp_path: object) -> None:
    password = "alice-Secret-42"
    out = ok(kctl("users", "create", "alice@EXAMPLE.COM", "--password", password, "--zookeeper", zk_connect))
    assert out == "Completed updating config for user alice@EXAMPLE.COM.\n"
    assert password not in out

    # Kafka's znode: sanitized name, one credential per mechanism, never the password.
    assert zk.kazoo.get_children(zkdata.CONFIG_USERS) == ["alice%40EXAMPLE.COM"]
    raw = zk.kazoo.get("/config/users/alice%40EXAMPLE.COM")[0].decode()
    assert password not in raw
    body = _znode(zk, "alice@EXAMPLE.COM")
    assert body["version"] == 1
    config = body["config"]
    assert isinstance(config, dict) and sorted(config) == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    for value in config.values():
        assert [kv.split("=", 1)[0] for kv in value.split(",")] == ["salt", "stored_key", "server_key", "iterations"]
        assert ScramCredential.parse(value).iterations == 4096
    assert _user_notifications(zk) == ["alice@EXAMPLE.COM"]
    raw_change = zk.kazoo.get(f"{zkdata.CONFIG_CHANGES}/{zk.config_changes()[-1]}")[0]
    assert json.loads(raw_change) == {"version": 2, "entity_path": "users/alice%40EXAMPLE.COM"}

    # The stored credential authenticates the password, by SCRAM and by PLAIN.
    store = CredentialStore(zk)
    _scram_login(store, "alice@EXAMPLE.COM", password, SHA256)
    with pytest.raises(SaslAuthenticationFailedError):
        _scram_login(store, "alice@EXAMPLE.COM", "wrong")

    pw_file = f"{tmp_path}/pw"
    with open(pw_file, "w") as f:
        f.write("bob-secret\n")
    ok(
        kctl(
            "users", "create", "bob", "--password-file", pw_file, "--mechanism", "SCRAM-SHA-512",
            "--iterations", "8192", "--zookeeper", zk_connect,
        )
    )  # fmt: skip
    ok(kctl("users", "create", "carol", "--password-file", "-", "--zookeeper", zk_connect, stdin="carol-pw\n"))
    _scram_login(store, "bob", "bob-secret")
    _scram_login(store, "carol", "carol-pw")

    listed = ok(kctl("users", "list", "--zookeeper", zk_connect))
    assert listed.splitlines() == [
        "SCRAM credential configs for user-principal 'alice@EXAMPLE.COM' are "
        "SCRAM-SHA-256=iterations=4096, SCRAM-SHA-512=iterations=4096",
        "SCRAM credential configs for user-principal 'bob' are SCRAM-SHA-512=iterations=8192",
        "SCRAM credential configs for user-principal 'carol' are "
        "SCRAM-SHA-256=iterations=4096, SCRAM-SHA-512=iterations=4096",
    ]

    ok(kctl("users", "delete", "alice@EXAMPLE.COM", "--mechanism", "SCRAM-SHA-256", "--zookeeper", zk_connect))
    assert sorted(_znode(zk, "alice@EXAMPLE.COM")["config"]) == ["SCRAM-SHA-512"]  # type: ignore[call-overload]
    ok(kctl("users", "delete", "alice@EXAMPLE.COM", "--zookeeper", zk_connect))
    assert _znode(zk, "alice@EXAMPLE.COM") == {"version": 1, "config": {}}  # as Kafka leaves it
    assert [line.split("'")[1] for line in ok(kctl("users", "list", "--zookeeper", zk_connect)).splitlines()] == [
        "bob",
        "carol",
    ]
    fails(kctl("users", "delete", "alice@EXAMPLE.COM", "--zookeeper", zk_connect), 1, "does not exist")
    fails(kctl("users", "delete", "bob", "--mechanism", "SCRAM-SHA-256", "--zookeeper", zk_connect), 1, "SCRAM-SHA-256")
    assert sorted(_znode(zk, "bob")["config"]) == ["SCRAM-SHA-512"]  # type: ignore[call-overload]


def test_kctl_users_bad_input_is_one_line_and_writes_nothing(zk: ZkClient, zk_connect: str) -> None:
    before = zk.config_changes()
    z = ("--zookeeper", zk_connect)
    fails(kctl("users", "create", "dave", "--password", "pw", "--iterations", "100", *z), 2, "minimum 4096")
    fails(kctl("users", "create", "dave", "--password", "pw", "--iterations", "20000", *z), 2, "maximum 16384")
    fails(kctl("users", "create", "dave", "--password", "", *z), 2, "password is empty")
    fails(kctl("users", "create", "dave", "--password-file", "/nonexistent/pw", *z), 2, "cannot read --password-file")
    fails(kctl("users", "create", "", "--password", "pw", *z), 2, "user name is empty")
    fails(kctl("users", "create", "dave", "--mechanism", "PLAIN", "--password", "pw", *z), 2, "invalid choice")
    fails(kctl("users", "create", "dave", *z), 2, "--password")
    fails(kctl("users", "create", "dave", "--password", "pw"), 2, "--zookeeper")
    fails(kctl("users", "list", "--bootstrap-server", "127.0.0.1:1"), 1, "NoBrokersAvailable")
    for result in (kctl("users", "create", "dave", "--password", "s3cr3t-pw", "--iterations", "1", *z),):
        assert "s3cr3t-pw" not in result.stderr + result.stdout
    assert not zk.kazoo.exists(zkdata.user_config_path("dave"))
    assert zk.config_changes() == before


def test_store_keeps_other_user_configs(zk: ZkClient) -> None:
    zk.set_entity_config("users", "erin", {"producer_byte_rate": "1024"}, -1)
    store = CredentialStore(zk)
    store.set_password("erin", "SCRAM-SHA-256", "erin-pw", iterations=4096)
    assert zk.entity_config("users", "erin")[0]["producer_byte_rate"] == "1024"
    assert store.delete("erin") == [SHA256]
    assert zk.entity_config("users", "erin")[0] == {"producer_byte_rate": "1024"}
    assert store.describe() == {}
    with pytest.raises(ResourceNotFoundError):
        store.delete("erin")
    with pytest.raises(UnacceptableCredentialError):
        store.set_password("erin", SHA256, "pw", iterations=100)
    with pytest.raises(UnacceptableCredentialError):
        store.set_password("", SHA256, "pw")


def test_concurrent_writers_lose_no_mechanism(zk: ZkClient, zk_connect: str) -> None:
    other = ZkClient(zk_connect)
    other.start()
    try:
        stores = [CredentialStore(zk), CredentialStore(other)]
        errors: list[BaseException] = []

        def write(store: CredentialStore, mechanism: ScramMechanism) -> None:
            try:
                for i in range(5):
                    store.set_password("frank", mechanism, f"pw-{i}")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(s, m)) for s, m in zip(stores, (SHA256, SHA512), strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert stores[0].describe() == {"frank": {SHA256: 4096, SHA512: 4096}}
    finally:
        other.close()


def test_broker_cache_follows_changes_and_deletions(zk: ZkClient, zk_connect: str) -> None:
    """A broker's cache (its own ZooKeeper session) sees a password change and a deletion
    within seconds, and revokes the user's sessions each time."""
    tool = CredentialStore(zk)
    tool.set_password("grace", SHA512, "old-pw")
    tool.set_password("heidi", SHA512, "heidi-pw")

    broker_zk = ZkClient(zk_connect)
    broker_zk.start()
    changed: list[str] = []
    sessions = SessionStore()

    def on_user_changed(user: str) -> None:
        sessions.revoke_user(user)  # first: the test waits on ``changed``
        changed.append(user)

    cache = CredentialStore(broker_zk, on_user_changed=on_user_changed)
    cache.start()
    try:
        auth = SaslAuthenticator(enabled_mechanisms=["SCRAM-SHA-512"], lookup=cache.lookup, sessions=sessions)

        def login(user: str, password: str) -> str:
            client = ScramClient(SHA512, user, password)
            first = auth.authenticate("SCRAM-SHA-512", "", client.first_message(), "SASL_PLAINTEXT")
            final = auth.authenticate(
                "SCRAM-SHA-512", first.exchange_id, client.final_message(first.auth_bytes), "SASL_PLAINTEXT"
            )
            assert final.session_token is not None
            return final.session_token

        token = login("grace", "old-pw")
        heidi = login("heidi", "heidi-pw")
        assert sessions.lookup(token) == KafkaPrincipal.user("grace")
        cached = cache.lookup("grace", SHA512)
        assert cached is not None

        tool.set_password("grace", SHA512, "new-pw")  # another process changes the password
        wait_until(lambda: cache.lookup("grace", SHA512) != cached, 10, "the cache to see the new password")
        wait_until(lambda: "grace" in changed, 10, "on_user_changed('grace')")
        assert sessions.lookup(token) is None  # revoked
        assert sessions.lookup(heidi) == KafkaPrincipal.user("heidi")  # others keep theirs
        with pytest.raises(SaslAuthenticationFailedError):
            login("grace", "old-pw")
        token = login("grace", "new-pw")

        tool.delete("grace")
        wait_until(lambda: cache.lookup("grace", SHA512) is None, 10, "the cache to see the deletion")
        wait_until(lambda: changed.count("grace") == 2, 10, "on_user_changed after the deletion")
        assert sessions.lookup(token) is None
        with pytest.raises(SaslAuthenticationFailedError):
            login("grace", "new-pw")
        assert "heidi" not in changed
    finally:
        cache.stop()
        broker_zk.close()


def test_admin_rpc_helpers_follow_kafkas_rules(zk: ZkClient) -> None:
    store = CredentialStore(zk)
    salt = b"0123456789abcdef"
    salted = SHA256.salted_password("ivan-pw", salt, 8192)
    results = alter_user_scram_credentials(
        store,
        [ScramDeletion("judy", "SCRAM-SHA-512"), ScramDeletion("kim", "SCRAM-SHA-256")],
        [
            ScramUpsertion("ivan", "SCRAM-SHA-256", 8192, salt, salted),
            ScramUpsertion("kim", "SCRAM-SHA-256", 4096, salt, salted),  # kim twice: refused
            ScramUpsertion("leo", "SCRAM-SHA-1", 4096, salt, salted),
            ScramUpsertion("mia", "SCRAM-SHA-256", 1000, salt, salted),
            ScramUpsertion("", "SCRAM-SHA-256", 4096, salt, salted),
        ],
    )
    assert list(results) == ["judy", "kim", "ivan", "leo", "mia", ""]
    assert results["ivan"] is None
    assert type(results["judy"]) is ResourceNotFoundError
    assert type(results["kim"]) is DuplicateResourceError
    assert type(results["leo"]) is UnsupportedSaslMechanismError
    assert type(results["mia"]) is UnacceptableCredentialError
    assert type(results[""]) is UnacceptableCredentialError
    # The password that was salted client-side authenticates; nothing else was written.
    _scram_login(store, "ivan", "ivan-pw", SHA256)
    assert store.describe() == {"ivan": {SHA256: 8192}}

    described = describe_user_scram_credentials(store, ["ivan", "judy", "ivan2", "ivan2"])
    assert [(u, type(e).__name__ if e else None, c) for u, e, c in described] == [
        ("ivan", None, {SHA256: 8192}),
        ("judy", "ResourceNotFoundError", {}),
        ("ivan2", "DuplicateResourceError", {}),
    ]
    assert describe_user_scram_credentials(store) == [("ivan", None, {SHA256: 8192})]


def test_users_notifications_leave_dynamic_broker_configs_alone(zk: ZkClient, zk_connect: str) -> None:
    """The broker's other /config/changes reader decodes a users notification and ignores it."""
    from kbroker.config import build_config
    from kbroker.dynamic_config import DynamicBrokerConfig

    static = build_config({"broker.id": "1", "zookeeper.connect": zk_connect, "log.dirs": "/tmp/x"})
    dynamic = DynamicBrokerConfig(static, zk)
    changes: list[object] = []
    dynamic.on_change(lambda old, new: changes.append(new))
    dynamic.load()
    dynamic.start()
    try:
        CredentialStore(zk).set_password("olga", SHA256, "olga-pw")
        zk.set_entity_config("brokers", "1", {"log.retention.ms": "1234"}, -1)
        wait_until(lambda: changes, 10, "the broker config change to apply")
        dynamic.sync()
        assert len(changes) == 1  # the broker change only
        assert ("users", "olga") in [c[:2] for c in map(zk.config_change, zk.config_changes()) if c]
    finally:
        dynamic.stop()


def test_the_brokers_cache_holds_every_user_from_the_start_and_serves_logins_without_zookeeper(
    zk: ZkClient, zk_connect: str
) -> None:
    """As Kafka's credential cache: every user is loaded when the cache starts, so logins go
    on while ZooKeeper is unreachable; a user the cache does not hold is unknown after a
    short wait, and found again once ZooKeeper is back."""
    tool = CredentialStore(zk)
    for user in ("ivy", "jack"):
        tool.set_password(user, SHA512, f"{user}-pw")
    proxy = FaultProxy()
    server, chroot = zk_connect.split("/", 1)
    proxy.forward_to(server)
    broker_zk = ZkClient(f"{proxy.address}/{chroot}")
    broker_zk.start()
    cache = CredentialStore(broker_zk)
    cache.start()
    try:
        cache.sync()
        # Loaded at start, not on demand: a znode removed behind the cache's back (no
        # notification) is still served from it.
        zk.kazoo.delete(zkdata.user_config_path("ivy"))
        assert cache.lookup("ivy", SHA512) is not None

        proxy.target = None  # ZooKeeper unreachable: new connections are refused
        proxy.reset_all()
        wait_until(lambda: not broker_zk.connected, 10, "the cache's ZooKeeper connection to drop")
        started = time.monotonic()
        assert cache.lookup("jack", SHA512) is not None
        assert time.monotonic() - started < 0.5  # served from the cache, no wait
        tool.set_password("kim", SHA512, "kim-pw")  # written to ZooKeeper during the outage
        started = time.monotonic()
        assert cache.lookup("kim", SHA512) is None
        assert time.monotonic() - started < LOGIN_WAIT_S + 2  # bounded, not the outage's length

        proxy.forward_to(server)
        wait_until(lambda: cache.lookup("kim", SHA512) is not None, 30, "kim once ZooKeeper is back")
        wait_until(lambda: cache.lookup("ivy", SHA512) is None, 30, "the cache reloaded after the reconnection")
        assert cache.lookup("jack", SHA512) is not None
    finally:
        cache.stop()
        broker_zk.close()
        proxy.close()
