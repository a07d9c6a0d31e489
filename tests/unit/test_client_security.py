"""Client security: SecurityConfig checks, sasl.jaas.config parsing, and the client's
TLS + SASL login against an in-process gRPC server whose servicer implements only
SaslHandshake, SaslAuthenticate and Metadata over the broker's SaslAuthenticator."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from kbroker.security import certs
from kbroker.security.sasl import SaslAuthenticator, SessionStore
from kclient.admin import AdminClient
from kclient.consumer.consumer import Consumer
from kclient.errors import (
    InvalidConfigError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)
from kclient.producer.producer import Producer
from kclient.proto.kbroker.v1 import broker_pb2_grpc, metadata_pb2, security_pb2
from kclient.scram import ScramCredential, ScramMechanism, generate_credential
from kclient.security import (
    SESSION_METADATA_KEY,
    BrokerSession,
    SaslSessionExpiredError,
    SecurityConfig,
    java_client_configs,
    parse_jaas_config,
)
from kclient.transport import Transport

PASSWORD = "alice-secret"


# --- configuration -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ({"security_protocol": "TLS"}, "security_protocol must be one of"),
        ({"security_protocol": "SASL_SSL"}, "needs sasl_mechanism"),
        ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "GSSAPI"}, "sasl_mechanism must be one of"),
        ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256"}, "needs sasl_plain_username"),
        (
            {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "a"},
            "needs sasl_plain_password",
        ),
        (
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "sasl_plain_username": "alice",
                "sasl_plain_password": PASSWORD,
            },
            "PLAIN sends the password and is refused over SASL_PLAINTEXT",
        ),
        ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"}, "ssl_cafile: cannot read /nonexistent"),
        ({"ssl_cafile": "/tmp/ca.pem"}, "ssl_cafile is set but security_protocol is PLAINTEXT"),
        ({"sasl_mechanism": "SCRAM-SHA-256"}, r"sasl_\* settings are given but security_protocol is PLAINTEXT"),
        ({"security_protocol": "SSL", "ssl_check_hostname": "no"}, "ssl_check_hostname must be True or False"),
    ],
)
def test_security_config_refuses_with_one_line(configs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message) as info:
        SecurityConfig.from_configs(configs)
    assert "\n" not in str(info.value)
    assert PASSWORD not in str(info.value)


def test_security_config_defaults_and_repr_hide_passwords(tmp_path: Path) -> None:
    assert SecurityConfig.from_configs({}) is None
    cfg = SecurityConfig(
        security_protocol="sasl_plaintext",
        sasl_mechanism="scram-sha-512",
        sasl_plain_username="alice",
        sasl_plain_password=PASSWORD,
    )
    assert (cfg.security_protocol, cfg.sasl_mechanism) == ("SASL_PLAINTEXT", "SCRAM-SHA-512")
    assert cfg.uses_sasl and not cfg.uses_tls
    assert PASSWORD not in repr(cfg)


@pytest.mark.parametrize("client", ["producer", "consumer", "admin"])
def test_clients_take_the_security_settings(client: str) -> None:
    bad = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256"}
    make = {
        "producer": lambda **c: Producer(bootstrap_servers="localhost:1", **c),
        "consumer": lambda **c: Consumer(bootstrap_servers="localhost:1", **c),
        "admin": lambda **c: AdminClient("localhost:1", **c),
    }[client]
    with pytest.raises(InvalidConfigError, match="needs sasl_plain_username"):
        make(**bad)


def test_jaas_config_scram_and_plain() -> None:
    scram = parse_jaas_config(
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="se\\"cret";'
    )
    assert scram.login_module == "org.apache.kafka.common.security.scram.ScramLoginModule"
    assert scram.options == {"username": "alice", "password": 'se"cret'}
    assert "cret" not in repr(scram)
    plain = parse_jaas_config(
        "org.apache.kafka.common.security.plain.PlainLoginModule required\n  username=bob\n  password=pw ;"
    )
    assert plain.options == {"username": "bob", "password": "pw"}


@pytest.mark.parametrize(
    "text",
    [
        'username="alice" password="x";',
        'org.apache.kafka.common.security.scram.ScramLoginModule username="alice";',
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="hunter2"',
        'org.apache.kafka.common.security.scram.ScramLoginModule required password="hunter2"; Other required;',
    ],
)
def test_jaas_config_malformed_is_one_line_without_the_password(text: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        parse_jaas_config(text)
    assert "hunter2" not in str(info.value) and "\n" not in str(info.value)


def test_java_client_configs() -> None:
    props = {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.ssl.truststore.location": "/etc/ca.pem",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.keystore.location": "/etc/client.keystore.pem",
        "kafka.ssl.key.password": "kp",
        "kafka.ssl.endpoint.identification.algorithm": "",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="secret";',
        "kafka.acks": "all",
    }
    assert java_client_configs(props, "kafka.") == {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": "/etc/ca.pem",
        "ssl_certfile": "/etc/client.keystore.pem",
        "ssl_password": "kp",
        "ssl_check_hostname": False,
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "secret",
    }
    with pytest.raises(InvalidConfigError, match=r"kafka\.ssl\.truststore\.type=JKS: only PEM"):
        java_client_configs({"kafka.ssl.truststore.type": "JKS"}, "kafka.")
    with pytest.raises(InvalidConfigError, match=r"sasl\.mechanism PLAIN needs .*PlainLoginModule"):
        java_client_configs({"sasl.mechanism": "PLAIN", "sasl.jaas.config": props["kafka.sasl.jaas.config"]})
    assert java_client_configs({"sasl.username": "u", "sasl.password": "p"}) == {
        "sasl_plain_username": "u",
        "sasl_plain_password": "p",
    }


def test_broker_session_renews_at_90_percent_of_its_lifetime() -> None:
    now = [100.0]
    issued: list[str] = []

    def login() -> tuple[str, int]:
        issued.append(f"t{len(issued)}")
        return issued[-1], 10_000

    session = BrokerSession("b:1", login, clock=lambda: now[0])
    assert session.token() == "t0"
    now[0] += 8.9
    assert session.token() == "t0"
    now[0] += 0.2  # 9.1 s of 10 s
    assert session.token() == "t1"
    session.invalidate("t0")  # a stale token's refusal does not drop the new one
    assert session.token() == "t1"
    session.invalidate("t1")
    assert session.token() == "t2" and session.logins == 3


# --- a fake broker -------------------------------------------------------------------------


@dataclass
class FakeBroker(broker_pb2_grpc.BrokerServicer):  # type: ignore[misc]
    """SaslHandshake / SaslAuthenticate / Metadata over kbroker's SaslAuthenticator."""

    listener_protocol: str
    sessions: SessionStore = field(default_factory=SessionStore)
    credentials: dict[tuple[str, ScramMechanism], ScramCredential] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    principals: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.authenticator = SaslAuthenticator(
            enabled_mechanisms=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
            lookup=lambda user, mech: self.credentials.get((user, mech)),
            sessions=self.sessions,
        )

    def add_user(self, user: str, password: str) -> None:
        for mech in ScramMechanism:
            self.credentials[(user, mech)] = generate_credential(mech, password)

    def _seen(self, method: str) -> None:
        with self.lock:
            self.calls.append(method)

    def SaslHandshake(self, request: Any, context: Any) -> Any:
        self._seen("SaslHandshake")
        try:
            enabled = self.authenticator.handshake(request.mechanism, self.listener_protocol)
        except KafkaError as exc:
            return security_pb2.SaslHandshakeResponse(error_code=exc.errno, error_message=exc.message)  # type: ignore[attr-defined]
        return security_pb2.SaslHandshakeResponse(enabled_mechanisms=enabled)

    def SaslAuthenticate(self, request: Any, context: Any) -> Any:
        self._seen("SaslAuthenticate")
        try:
            r = self.authenticator.authenticate(
                request.mechanism, request.exchange_id, request.auth_bytes, self.listener_protocol
            )
        except KafkaError as exc:
            return security_pb2.SaslAuthenticateResponse(error_code=exc.errno, error_message=exc.message)  # type: ignore[attr-defined]
        return security_pb2.SaslAuthenticateResponse(
            auth_bytes=r.auth_bytes,
            exchange_id=r.exchange_id,
            session_token=r.session_token or "",
            session_lifetime_ms=r.session_lifetime_ms,
        )

    def Metadata(self, request: Any, context: Any) -> Any:
        self._seen("Metadata")
        if self.listener_protocol.startswith("SASL_"):
            token = dict(context.invocation_metadata()).get(SESSION_METADATA_KEY)
            principal = self.sessions.lookup(token) if token else None
            if principal is None:
                context.set_trailing_metadata((("kbroker-error-code", "58"),))
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "session expired or unknown: authenticate again")
            with self.lock:
                self.principals.append(str(principal))
        return metadata_pb2.MetadataResponse(cluster_id="fake")


@dataclass
class Pki:
    ca: certs.CertificateAuthority
    server: certs.IssuedCert
    other_name: certs.IssuedCert
    foreign_ca: certs.CertificateAuthority


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("client-pki")
    ca = certs.make_ca(root / "ca")
    return Pki(
        ca,
        certs.issue(ca, root / "certs", "broker", "CN=broker", client=False),
        certs.issue(ca, root / "certs", "elsewhere", "CN=elsewhere", sans=("broker.example",), client=False),
        certs.make_ca(root / "foreign", "foreign CA"),
    )


def serve(broker: FakeBroker, cert: certs.IssuedCert | None = None) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    broker_pb2_grpc.add_BrokerServicer_to_server(broker, server)
    if cert is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        creds = grpc.ssl_server_credentials([(cert.key_path.read_bytes(), cert.cert_path.read_bytes())])
        port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    return server, f"localhost:{port}"


@pytest.fixture
def sasl_plaintext() -> Iterator[tuple[FakeBroker, str]]:
    broker = FakeBroker("SASL_PLAINTEXT")
    broker.add_user("alice", PASSWORD)
    server, address = serve(broker)
    yield broker, address
    server.stop(None)


def scram(mechanism: str, password: str = PASSWORD, protocol: str = "SASL_PLAINTEXT", **ssl: Any) -> SecurityConfig:
    return SecurityConfig(
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_plain_username="alice",
        sasl_plain_password=password,
        **ssl,
    )


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_login_and_every_call_carries_the_token(sasl_plaintext: tuple[FakeBroker, str], mechanism: str) -> None:
    broker, address = sasl_plaintext
    transport = Transport(address, 5000, scram(mechanism))
    try:
        assert transport.call(address, "Metadata", metadata_pb2.MetadataRequest()).cluster_id == "fake"
        future = transport.stub(address).Metadata.future(metadata_pb2.MetadataRequest(), timeout=5)
        assert future.result().cluster_id == "fake"
        transport.call_any("Metadata", metadata_pb2.MetadataRequest())
    finally:
        transport.close()
    assert broker.calls == ["SaslHandshake", "SaslAuthenticate", "SaslAuthenticate", "Metadata", "Metadata", "Metadata"]
    assert broker.principals == ["User:alice"] * 3


def test_admin_client_logs_in(sasl_plaintext: tuple[FakeBroker, str]) -> None:
    broker, address = sasl_plaintext
    admin = AdminClient(
        address,
        5000,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="alice",
        sasl_plain_password=PASSWORD,
    )
    try:
        admin._metadata.refresh()
    finally:
        admin.close()
    assert broker.principals == ["User:alice"]


def test_wrong_password_is_sasl_authentication_failed(sasl_plaintext: tuple[FakeBroker, str]) -> None:
    broker, address = sasl_plaintext
    transport = Transport(address, 5000, scram("SCRAM-SHA-256", password="wrong"))
    try:
        with pytest.raises(SaslAuthenticationFailedError, match="invalid credentials") as info:
            transport.call(address, "Metadata", metadata_pb2.MetadataRequest())
        assert not info.value.retriable
        future = transport.stub(address).Metadata.future(metadata_pb2.MetadataRequest(), timeout=5)
        err = transport.failed(address, future.exception())
        assert isinstance(err, SaslAuthenticationFailedError) and not err.retriable
    finally:
        transport.close()
    assert "Metadata" not in broker.calls
    assert "wrong" not in str(info.value)


def test_unknown_user_and_unsupported_mechanism(sasl_plaintext: tuple[FakeBroker, str]) -> None:
    _, address = sasl_plaintext
    ssl_broker = FakeBroker("SASL_PLAINTEXT")
    transport = Transport(address, 5000, scram("SCRAM-SHA-512"))
    transport.close()
    cfg = SecurityConfig(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="nobody",
        sasl_plain_password="x",
    )
    transport = Transport(address, 5000, cfg)
    try:
        with pytest.raises(SaslAuthenticationFailedError):
            transport.call(address, "Metadata", metadata_pb2.MetadataRequest())
    finally:
        transport.close()
    # The broker allows only SCRAM-SHA-256 here: SCRAM-SHA-512 is UNSUPPORTED_SASL_MECHANISM (33).
    ssl_broker.authenticator.enabled_mechanisms = ["SCRAM-SHA-256"]
    server, other = serve(ssl_broker)
    transport = Transport(other, 5000, scram("SCRAM-SHA-512"))
    try:
        with pytest.raises(UnsupportedSaslMechanismError, match="Unsupported SASL mechanism SCRAM-SHA-512"):
            transport.call(other, "Metadata", metadata_pb2.MetadataRequest())
    finally:
        transport.close()
        server.stop(None)


@pytest.mark.parametrize("client", ["producer", "consumer", "admin"])
def test_plain_over_sasl_plaintext_is_refused_before_anything_is_sent(
    sasl_plaintext: tuple[FakeBroker, str], client: str
) -> None:
    broker, address = sasl_plaintext
    plain: dict[str, Any] = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORD,
    }
    make = {
        "producer": lambda: Producer(bootstrap_servers=address, **plain),
        "consumer": lambda: Consumer("t", bootstrap_servers=address, **plain),
        "admin": lambda: AdminClient(address, **plain).list_topics(),
    }[client]
    with pytest.raises(InvalidConfigError, match="refused over SASL_PLAINTEXT") as info:
        make()
    assert PASSWORD not in str(info.value)
    assert broker.calls == []


def test_relogin_after_the_broker_revokes_the_session(sasl_plaintext: tuple[FakeBroker, str]) -> None:
    broker, address = sasl_plaintext
    transport = Transport(address, 5000, scram("SCRAM-SHA-256"))
    request = metadata_pb2.MetadataRequest()
    try:
        transport.call(address, "Metadata", request)
        session = transport.session(address)
        assert session is not None and session.logins == 1
        # A blocking call after a revocation is answered after one transparent login.
        assert broker.sessions.revoke_user("alice") == 1
        assert transport.call(address, "Metadata", request).cluster_id == "fake"
        assert session.logins == 2
        # A future refused by the broker fails retriably and the next call logs in again;
        # or, when the refusal arrived before the interceptor returned the future (a fast
        # broker), the interceptor logged in again at once and the future succeeds.
        broker.sessions.revoke_user("alice")
        future = transport.stub(address).Metadata.future(request, timeout=5)
        if future.exception() is None:
            assert future.result().cluster_id == "fake"
        else:
            err = transport.failed(address, future.exception())
            assert isinstance(err, SaslSessionExpiredError) and err.retriable and err.errno == 58
            assert transport.stub(address).Metadata.future(request, timeout=5).result().cluster_id == "fake"
        assert session.logins == 3
        # Revoked because the user is gone: the login is refused, SaslAuthenticationFailedError.
        broker.credentials.clear()
        broker.sessions.revoke_user("alice")
        with pytest.raises(SaslAuthenticationFailedError) as info:
            transport.call(address, "Metadata", request)
        assert not isinstance(info.value, SaslSessionExpiredError)
    finally:
        transport.close()
    assert broker.principals == ["User:alice"] * 3


# --- TLS -----------------------------------------------------------------------------------


def test_tls_with_the_right_ca_and_a_wrong_one(pki: Pki) -> None:
    broker = FakeBroker("SSL")
    server, address = serve(broker, pki.server)
    try:
        good = Transport(address, 5000, SecurityConfig("SSL", ssl_cafile=str(pki.ca.cert_path)))
        assert good.call(address, "Metadata", metadata_pb2.MetadataRequest()).cluster_id == "fake"
        good.close()
        bad = Transport(address, 3000, SecurityConfig("SSL", ssl_cafile=str(pki.foreign_ca.cert_path)))
        with pytest.raises(KafkaConnectionError, match=r"TLS handshake with broker .* failed: .* not trusted"):
            bad.call(address, "Metadata", metadata_pb2.MetadataRequest())
        bad.close()
        plaintext = Transport(address, 3000)
        with pytest.raises(KafkaConnectionError):
            plaintext.call(address, "Metadata", metadata_pb2.MetadataRequest())
        plaintext.close()
    finally:
        server.stop(None)
    assert broker.calls == ["Metadata"]


def test_ssl_check_hostname_false_still_verifies_the_chain(pki: Pki) -> None:
    broker = FakeBroker("SSL")
    server, address = serve(broker, pki.other_name)  # names broker.example only, we dial localhost
    request = metadata_pb2.MetadataRequest()
    try:
        checked = Transport(address, 3000, SecurityConfig("SSL", ssl_cafile=str(pki.ca.cert_path)))
        with pytest.raises(KafkaConnectionError, match="certificate does not name the host dialled"):
            checked.call(address, "Metadata", request)
        checked.close()
        unchecked = SecurityConfig("SSL", ssl_cafile=str(pki.ca.cert_path), ssl_check_hostname=False)
        transport = Transport(address, 3000, unchecked)
        assert transport.call(address, "Metadata", request).cluster_id == "fake"
        transport.close()
        foreign = SecurityConfig("SSL", ssl_cafile=str(pki.foreign_ca.cert_path), ssl_check_hostname=False)
        transport = Transport(address, 3000, foreign)
        with pytest.raises(KafkaConnectionError, match="TLS certificate not trusted"):
            transport.call(address, "Metadata", request)
        transport.close()
    finally:
        server.stop(None)
    assert broker.calls == ["Metadata"]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_sasl_ssl(pki: Pki, mechanism: str) -> None:
    broker = FakeBroker("SASL_SSL")
    broker.add_user("alice", PASSWORD)
    server, address = serve(broker, pki.server)
    transport = Transport(address, 5000, scram(mechanism, protocol="SASL_SSL", ssl_cafile=str(pki.ca.cert_path)))
    try:
        assert transport.call(address, "Metadata", metadata_pb2.MetadataRequest()).cluster_id == "fake"
    finally:
        transport.close()
        server.stop(None)
    assert broker.principals == ["User:alice"]
    assert broker.calls.count("SaslAuthenticate") == (1 if mechanism == "PLAIN" else 2)


def test_client_certificate_for_a_listener_that_requires_one(pki: Pki, tmp_path: Path) -> None:
    alice = certs.issue(pki.ca, tmp_path, "alice", "CN=alice", sans=(), server=False)
    locked = certs.issue(pki.ca, tmp_path, "locked", "CN=locked", sans=(), server=False, key_password="kp")
    broker = FakeBroker("SSL")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    broker_pb2_grpc.add_BrokerServicer_to_server(broker, server)
    creds = grpc.ssl_server_credentials(
        [(pki.server.key_path.read_bytes(), pki.server.cert_path.read_bytes())],
        root_certificates=pki.ca.cert_path.read_bytes(),
        require_client_auth=True,
    )
    address = f"localhost:{server.add_secure_port('127.0.0.1:0', creds)}"
    server.start()
    ca = str(pki.ca.cert_path)
    request = metadata_pb2.MetadataRequest()
    try:
        for cfg in (
            SecurityConfig("SSL", ssl_cafile=ca, ssl_certfile=str(alice.cert_path), ssl_keyfile=str(alice.key_path)),
            SecurityConfig("SSL", ssl_cafile=ca, ssl_certfile=str(alice.keystore_path)),
            SecurityConfig(
                "SSL",
                ssl_cafile=ca,
                ssl_certfile=str(locked.cert_path),
                ssl_keyfile=str(locked.key_path),
                ssl_password="kp",
            ),
        ):
            transport = Transport(address, 5000, cfg)
            assert transport.call(address, "Metadata", request).cluster_id == "fake"
            transport.close()
        transport = Transport(address, 3000, SecurityConfig("SSL", ssl_cafile=ca))
        with pytest.raises(KafkaConnectionError):
            transport.call(address, "Metadata", request)
        transport.close()
    finally:
        server.stop(None)
    with pytest.raises(InvalidConfigError, match="the private key is encrypted: set ssl_password"):
        SecurityConfig("SSL", ssl_cafile=ca, ssl_certfile=str(locked.cert_path), ssl_keyfile=str(locked.key_path))
    with pytest.raises(InvalidConfigError, match="wrong ssl_password"):
        SecurityConfig(
            "SSL", ssl_cafile=ca, ssl_certfile=str(locked.cert_path), ssl_keyfile=str(locked.key_path), ssl_password="x"
        )
    assert broker.calls == ["Metadata"] * 3


def test_a_client_without_sasl_on_a_sasl_listener_is_told_so(sasl_plaintext: tuple[FakeBroker, str]) -> None:
    broker, address = sasl_plaintext
    transport = Transport(address, 5000)
    try:
        with pytest.raises(SaslAuthenticationFailedError, match="security_protocol is PLAINTEXT") as info:
            transport.call(address, "Metadata", metadata_pb2.MetadataRequest())
        assert not info.value.retriable
    finally:
        transport.close()
    assert broker.calls == ["Metadata"]
