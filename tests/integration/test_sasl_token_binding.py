"""SASL session tokens are bound to their connection, on a real broker with a
SASL_PLAINTEXT and a SASL_SSL listener: a token copied from one connection's call
metadata is refused (UNAUTHENTICATED, SASL_AUTHENTICATION_FAILED) on another connection
of the same listener while its owner keeps using it; kclient still works across
reconnects (cut by a TCP proxy, so the broker sees a new client port) and across
re-authentication (``connections.max.reauth.ms`` a few seconds), producer and consumer
included."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kbroker.security import certs
from kclient import Consumer, Producer
from kclient.errors import SaslAuthenticationFailedError
from kclient.proto.kbroker.v1 import broker_pb2_grpc, metadata_pb2
from kclient.security import SecurityConfig
from kclient.transport import Transport
from tests.conftest import FAST_BROKER
from tests.integration.fault_proxy import FaultProxy
from tests.integration.test_broker_listeners import scram_login, session
from tests.support import set_scram_passwords, wait_until

pytestmark = pytest.mark.integration

USER, PASSWORD = "alice", "alice-secret"
REAUTH_MS = 4000
OWN_CONNECTION = ("grpc.use_local_subchannel_pool", 1)
"""Channels with identical arguments share one TCP connection in grpc; this gives each its own."""


@dataclass
class Env:
    cluster: LocalCluster
    ca: certs.CertificateAuthority

    def address(self, listener: str) -> str:
        return self.cluster.brokers[0].listeners[listener]

    def stub(self, protocol: str) -> broker_pb2_grpc.BrokerStub:
        """A raw stub on a connection of its own to the listener of ``protocol``."""
        if protocol == "SASL_PLAINTEXT":
            channel = grpc.insecure_channel(self.address("SCRAM"), options=[OWN_CONNECTION])
        else:
            creds = grpc.ssl_channel_credentials(root_certificates=self.ca.cert_path.read_bytes())
            channel = grpc.secure_channel(self.address("SECURE"), creds, options=[OWN_CONNECTION])
        return broker_pb2_grpc.BrokerStub(channel)

    def client_configs(self, protocol: str) -> dict[str, Any]:
        tls = {"ssl_cafile": str(self.ca.cert_path)} if protocol == "SASL_SSL" else {}
        return {
            "security_protocol": protocol,
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": USER,
            "sasl_plain_password": PASSWORD,
            **tls,
        }


@pytest.fixture(scope="module")
def env(zookeeper: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("token-binding")
    ca = certs.make_ca(root / "ca")
    broker = certs.issue(ca, root / "ca", "broker")
    zk_connect = f"{zookeeper}/kbroker-binding-{time.monotonic_ns()}"
    cluster = LocalCluster(
        root / "cluster",
        zk_connect,
        {
            **FAST_BROKER,
            "listeners": "INTERNAL://127.0.0.1:0,SCRAM://127.0.0.1:0,SECURE://127.0.0.1:0",
            "listener.security.protocol.map": "INTERNAL:PLAINTEXT,SCRAM:SASL_PLAINTEXT,SECURE:SASL_SSL",
            "inter.broker.listener.name": "INTERNAL",
            "ssl.keystore.location": str(broker.keystore_path),
            "ssl.truststore.location": str(broker.ca_path),
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
            "connections.max.reauth.ms": str(REAUTH_MS),
            "auto.create.topics.enable": "true",
            "group.initial.rebalance.delay.ms": "0",
        },
    )
    failed_before = request.session.testsfailed
    try:
        cluster.start(1)
        set_scram_passwords(zk_connect, {USER: PASSWORD})
        yield Env(cluster, ca)
    finally:
        if request.session.testsfailed > failed_before:
            print(cluster.logs())
        cluster.stop()


def _metadata(stub: broker_pb2_grpc.BrokerStub, token: str) -> metadata_pb2.MetadataResponse:
    return stub.Metadata(metadata_pb2.MetadataRequest(), timeout=10, metadata=session(token))


def _refused(stub: broker_pb2_grpc.BrokerStub, token: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        _metadata(stub, token)
    return refused.value


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_a_token_replayed_on_another_connection_is_refused(env: Env, protocol: str) -> None:
    owner, thief = env.stub(protocol), env.stub(protocol)
    token = scram_login(owner, USER, PASSWORD, "SCRAM-SHA-512")
    assert _metadata(owner, token).brokers

    refused = _refused(thief, token)
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert dict(refused.trailing_metadata())["kbroker-error-code"] == str(SaslAuthenticationFailedError.errno)
    assert "another connection" in (refused.details() or "")
    # The replay did not log the owner out.
    assert _metadata(owner, token).brokers

    # The thief's own login is bound to its connection in turn.
    theirs = scram_login(thief, USER, PASSWORD, "SCRAM-SHA-256")
    assert _metadata(thief, theirs).brokers
    assert _refused(owner, theirs).code() == grpc.StatusCode.UNAUTHENTICATED
    # A token of the other listener is refused here too.
    other = "SASL_SSL" if protocol == "SASL_PLAINTEXT" else "SASL_PLAINTEXT"
    elsewhere = env.stub(other)
    assert _refused(owner, scram_login(elsewhere, USER, PASSWORD, "SCRAM-SHA-512")).code() == (
        grpc.StatusCode.UNAUTHENTICATED
    )


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_kclient_logs_in_again_after_a_reconnect_and_before_its_session_expires(env: Env, protocol: str) -> None:
    proxy = FaultProxy()
    proxy.forward_to(env.address("SCRAM" if protocol == "SASL_PLAINTEXT" else "SECURE"))
    transport = Transport(proxy.address, 10000, SecurityConfig(**env.client_configs(protocol)))
    try:
        request = metadata_pb2.MetadataRequest()
        assert transport.call(proxy.address, "Metadata", request).brokers
        sessions = transport.session(proxy.address)
        assert sessions is not None and sessions.logins == 1

        proxy.reset_all()  # the broker now sees this client on another port: its token is refused there
        wait_until(lambda: transport.call(proxy.address, "Metadata", request).brokers, 30, "a call after the cut")
        assert proxy.accepted >= 2
        assert sessions.logins >= 2
        logins = sessions.logins
        for _ in range(3):
            assert transport.call(proxy.address, "Metadata", request).brokers
        assert sessions.logins == logins  # one login per connection, not per call

        # Re-authentication: 90 % of connections.max.reauth.ms later the client logs in
        # again on the same connection, and goes on without a refused call.
        time.sleep(REAUTH_MS * 0.95 / 1000)
        assert transport.call(proxy.address, "Metadata", request).brokers
        assert sessions.logins == logins + 1
    finally:
        transport.close()
        proxy.close()


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_producer_and_consumer_across_a_reauthentication(env: Env, protocol: str) -> None:
    topic = f"bound-{protocol.lower().replace('_', '-')}"
    configs = env.client_configs(protocol)
    bootstrap = env.address("SCRAM" if protocol == "SASL_PLAINTEXT" else "SECURE")
    with Producer(bootstrap_servers=bootstrap, acks="all", **configs) as producer:
        first = [producer.send(topic, f"a{i}".encode()) for i in range(20)]
        producer.flush(30)
        time.sleep(REAUTH_MS * 1.1 / 1000)  # past the session's lifetime: the producer logs in again
        second = [producer.send(topic, f"b{i}".encode()) for i in range(20)]
        producer.flush(30)
        assert all(f.get(10).offset >= 0 for f in first + second)

    consumer = Consumer(
        topic, bootstrap_servers=bootstrap, group_id=f"g-{topic}", auto_offset_reset="earliest", **configs
    )
    values: list[bytes] = []
    try:

        def done() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(r.value or b"" for r in records)
            return len(values) >= 40

        wait_until(done, 60, "40 records")
    finally:
        consumer.close()
    assert sorted(values) == sorted([f"a{i}".encode() for i in range(20)] + [f"b{i}".encode() for i in range(20)])
