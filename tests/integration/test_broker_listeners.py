"""Brokers with several listeners, as real processes: an SSL inter-broker
listener with client certificates required (replication runs over it), a PLAINTEXT
listener and a SASL_SSL one for clients. Metadata answers each client with the
addresses of the listener it came in on; SASL (SCRAM and PLAIN) over raw gRPC gives a
session token that later calls carry; no token, a wrong password or a plaintext client on
a TLS port is refused; the ACL and user RPCs need Alter/Describe on the Cluster."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from kbroker.cluster.zk_client import ZkClient
from kbroker.local.cluster import LocalCluster
from kbroker.security import certs
from kbroker.security.acl import (
    CLUSTER_RESOURCE,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePattern,
    ResourceType,
)
from kbroker.security.authorizer import AclAuthorizer
from kbroker.security.credentials import CredentialStore
from kclient.errors import (
    ClusterAuthorizationFailedError,
    IllegalSaslStateError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)
from kclient.proto.kbroker.v1 import (
    admin_pb2,
    broker_pb2_grpc,
    metadata_pb2,
    security_pb2,
)
from kclient.scram import ScramClient, ScramMechanism
from tests.support import set_scram_passwords, wait_until

pytestmark = pytest.mark.integration

ADMIN, ADMIN_PASSWORD = "admin", "admin-secret"
ALLOW, ALL = AclPermissionType.ALLOW, AclOperation.ALL


@pytest.fixture
def ca(tmp_path: Path) -> Iterator[tuple[certs.IssuedCert, certs.IssuedCert]]:
    authority = certs.make_ca(tmp_path / "ca")
    yield certs.issue(authority, tmp_path / "ca", "broker"), certs.issue(authority, tmp_path / "ca", "client")


def secure_cluster(
    cluster_factory: Callable[..., LocalCluster], broker: certs.IssuedCert, n: int, **extra: str
) -> LocalCluster:
    return cluster_factory(
        n,
        **{
            "listeners": "INTERNAL://127.0.0.1:0,CLIENT://127.0.0.1:0,SECURE://127.0.0.1:0",
            "listener.security.protocol.map": "INTERNAL:SSL,CLIENT:PLAINTEXT,SECURE:SASL_SSL",
            "inter.broker.listener.name": "INTERNAL",
            "ssl.keystore.location": str(broker.keystore_path),
            "ssl.truststore.location": str(broker.ca_path),
            "listener.name.internal.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": f"User:CN=broker;User:{ADMIN}",
            **extra,
        },
    )


def tls_stub(address: str, ca: Path, cert: certs.IssuedCert | None = None) -> broker_pb2_grpc.BrokerStub:
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca.read_bytes(),
        private_key=cert.key_path.read_bytes() if cert else None,
        certificate_chain=cert.cert_path.read_bytes() if cert else None,
    )
    return broker_pb2_grpc.BrokerStub(grpc.secure_channel(address, creds))


def scram_login(stub: broker_pb2_grpc.BrokerStub, user: str, password: str, mechanism: str) -> str:
    """The session token of a SCRAM exchange, or the typed error the broker answered."""
    hs = stub.SaslHandshake(security_pb2.SaslHandshakeRequest(mechanism=mechanism), timeout=10)
    if hs.error_code:
        raise UnsupportedSaslMechanismError(hs.error_message)
    client = ScramClient(ScramMechanism(mechanism), user, password)
    first = stub.SaslAuthenticate(
        security_pb2.SaslAuthenticateRequest(mechanism=mechanism, auth_bytes=client.first_message()), timeout=10
    )
    if first.error_code:
        raise SaslAuthenticationFailedError(first.error_message)
    final = stub.SaslAuthenticate(
        security_pb2.SaslAuthenticateRequest(
            mechanism=mechanism, auth_bytes=client.final_message(first.auth_bytes), exchange_id=first.exchange_id
        ),
        timeout=10,
    )
    if final.error_code:
        raise SaslAuthenticationFailedError(final.error_message)
    client.verify_server_final(final.auth_bytes)
    assert final.session_token and final.session_lifetime_ms > 0
    return final.session_token


def session(token: str) -> tuple[tuple[str, str]]:
    return (("kbroker-session", token),)


def allow_anonymous_clients(zk_connect: str) -> None:
    """User:ANONYMOUS (the PLAINTEXT listener's callers) may create topics and use every topic."""
    zk = ZkClient(zk_connect)
    zk.start()
    try:
        anonymous = "User:ANONYMOUS"
        errors = AclAuthorizer(zk).create_acls(
            [
                AclBinding(CLUSTER_RESOURCE, AccessControlEntry(anonymous, "*", AclOperation.CREATE, ALLOW)),
                AclBinding(
                    ResourcePattern(ResourceType.TOPIC, "*"),
                    AccessControlEntry(anonymous, "*", AclOperation.ALL, ALLOW),
                ),
            ]
        )
        assert errors == [None, None], errors
    finally:
        zk.close()


def test_listeners_tls_replication_and_sasl_sessions(
    cluster_factory: Callable[..., LocalCluster],
    ca: tuple[certs.IssuedCert, certs.IssuedCert],
) -> None:
    broker_cert, client_cert = ca
    cluster = secure_cluster(cluster_factory, broker_cert, 2)
    b0, b1 = cluster.brokers[0], cluster.brokers[1]
    set_scram_passwords(cluster.zk_connect, {ADMIN: ADMIN_PASSWORD})
    allow_anonymous_clients(cluster.zk_connect)

    # Metadata over PLAINTEXT lists every broker's CLIENT address, over SASL_SSL its SECURE one.
    plain = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(b0.listeners["CLIENT"]))
    md = plain.Metadata(metadata_pb2.MetadataRequest(), timeout=10)
    assert {f"{b.host}:{b.port}" for b in md.brokers} == {b0.listeners["CLIENT"], b1.listeners["CLIENT"]}

    secure = tls_stub(b0.listeners["SECURE"], broker_cert.ca_path)
    with pytest.raises(grpc.RpcError) as refused:
        secure.Metadata(metadata_pb2.MetadataRequest(), timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert dict(refused.value.trailing_metadata())["kbroker-error-code"] == str(SaslAuthenticationFailedError.errno)

    with pytest.raises(SaslAuthenticationFailedError):
        scram_login(secure, ADMIN, "wrong", "SCRAM-SHA-256")
    with pytest.raises(SaslAuthenticationFailedError):
        scram_login(secure, "nobody", ADMIN_PASSWORD, "SCRAM-SHA-512")
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        token = scram_login(secure, ADMIN, ADMIN_PASSWORD, mechanism)
        md = secure.Metadata(metadata_pb2.MetadataRequest(), timeout=10, metadata=session(token))
        assert {f"{b.host}:{b.port}" for b in md.brokers} == {b0.listeners["SECURE"], b1.listeners["SECURE"]}
    # PLAIN on SASL_SSL: one call.
    plain_auth = secure.SaslAuthenticate(
        security_pb2.SaslAuthenticateRequest(mechanism="PLAIN", auth_bytes=f"\0{ADMIN}\0{ADMIN_PASSWORD}".encode()),
        timeout=10,
    )
    assert plain_auth.error_code == 0 and plain_auth.session_token
    # The token is good on the broker that issued it only.
    other = tls_stub(b1.listeners["SECURE"], broker_cert.ca_path)
    with pytest.raises(grpc.RpcError) as elsewhere:
        other.Metadata(metadata_pb2.MetadataRequest(), timeout=10, metadata=session(plain_auth.session_token))
    assert elsewhere.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # SASL on a PLAINTEXT listener is an illegal state, as in Kafka.
    hs = plain.SaslHandshake(security_pb2.SaslHandshakeRequest(mechanism="SCRAM-SHA-256"), timeout=10)
    assert hs.error_code == IllegalSaslStateError.errno

    # TLS: a plaintext client on a TLS port fails; the client-auth listener refuses a client without a cert.
    raw = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(b0.listeners["SECURE"]))
    with pytest.raises(grpc.RpcError):
        raw.Metadata(metadata_pb2.MetadataRequest(), timeout=5)
    with pytest.raises(grpc.RpcError):
        tls_stub(b0.listeners["INTERNAL"], broker_cert.ca_path).Metadata(metadata_pb2.MetadataRequest(), timeout=5)
    assert (
        tls_stub(b0.listeners["INTERNAL"], broker_cert.ca_path, client_cert)
        .Metadata(metadata_pb2.MetadataRequest(), timeout=5)
        .brokers
    )

    # Replication runs over the SSL inter-broker listener (the brokers' certificate is a super user).
    created = plain.CreateTopics(
        admin_pb2.CreateTopicsRequest(
            topics=[admin_pb2.CreatableTopic(name="t", num_partitions=1, replication_factor=2)]
        ),
        timeout=30,
    )
    assert created.topics[0].error_code == 0, created
    wait_until(lambda: len(_isr(plain, "t")) == 2, what="both replicas in sync over TLS")

    # ACL RPCs need Alter/Describe on the Cluster: ANONYMOUS is refused, the admin user is not.
    acl = security_pb2.AclBinding(
        resource_type=2,
        resource_name="t",
        pattern_type=3,
        principal="User:alice",
        host="*",
        operation=3,
        permission_type=3,
    )
    denied = plain.CreateAcls(security_pb2.CreateAclsRequest(creations=[acl]), timeout=10)
    assert denied.results[0].error_code == ClusterAuthorizationFailedError.errno
    token = scram_login(secure, ADMIN, ADMIN_PASSWORD, "SCRAM-SHA-512")
    made = secure.CreateAcls(security_pb2.CreateAclsRequest(creations=[acl]), timeout=10, metadata=session(token))
    assert made.results[0].error_code == 0, made
    listed = secure.DescribeAcls(
        security_pb2.DescribeAclsRequest(
            filter=security_pb2.AclBindingFilter(resource_type=1, pattern_type=1, operation=1, permission_type=1)
        ),
        timeout=10,
        metadata=session(token),
    )
    assert sorted(a.principal for a in listed.acls) == ["User:ANONYMOUS", "User:ANONYMOUS", "User:alice"]
    users = secure.DescribeUserScramCredentials(
        security_pb2.DescribeUserScramCredentialsRequest(), timeout=10, metadata=session(token)
    )
    assert [(r.user, sorted(c.mechanism for c in r.credentials)) for r in users.results] == [
        (ADMIN, ["SCRAM-SHA-256", "SCRAM-SHA-512"])
    ]


def _isr(stub: broker_pb2_grpc.BrokerStub, topic: str) -> list[int]:
    md = stub.Metadata(metadata_pb2.MetadataRequest(topics=[topic]), timeout=10)
    return list(md.topics[0].partitions[0].isr_nodes) if md.topics and md.topics[0].partitions else []


def test_a_deleted_user_loses_its_session(
    cluster_factory: Callable[..., LocalCluster], ca: tuple[certs.IssuedCert, certs.IssuedCert]
) -> None:
    broker_cert, _ = ca
    cluster = secure_cluster(cluster_factory, broker_cert, 1)
    set_scram_passwords(cluster.zk_connect, {"bob": "bob-secret"})
    secure = tls_stub(cluster.brokers[0].listeners["SECURE"], broker_cert.ca_path)
    token = scram_login(secure, "bob", "bob-secret", "SCRAM-SHA-256")
    assert secure.Metadata(metadata_pb2.MetadataRequest(), timeout=10, metadata=session(token)).brokers
    zk = ZkClient(cluster.zk_connect)
    zk.start()
    try:
        CredentialStore(zk).delete("bob")
    finally:
        zk.close()

    def refused() -> bool:
        try:
            secure.Metadata(metadata_pb2.MetadataRequest(), timeout=10, metadata=session(token))
        except grpc.RpcError as exc:
            return exc.code() == grpc.StatusCode.UNAUTHENTICATED
        return False

    wait_until(refused, timeout_s=15, what="the deleted user's session to be revoked")
    with pytest.raises(SaslAuthenticationFailedError):
        scram_login(secure, "bob", "bob-secret", "SCRAM-SHA-256")
