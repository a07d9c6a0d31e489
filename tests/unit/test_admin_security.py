"""AdminClient's ACL and SCRAM-user methods (kclient/admin_security.py) against a fake
broker call: the requests they send, the answers they decode, and that a SCRAM
upsertion carries a salted password only (KIP-554)."""

from __future__ import annotations

from typing import Any

import pytest

from kclient import AdminClient
from kclient.admin_security import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminSecurityMixin,
    PatternType,
    ResourceType,
    scram_upsertion,
)
from kclient.errors import (
    InvalidRequestError,
    NoBrokersAvailable,
    ResourceNotFoundError,
    SecurityDisabledError,
    UnsupportedSaslMechanismError,
)
from kclient.proto.kbroker.v1 import security_pb2
from kclient.scram import ScramMechanism, credential_from_salted_password, password_matches
from tests.support import FakeMetadata, FakeTransport

BINDING = AclBinding(
    ResourceType.TOPIC, "t", PatternType.LITERAL, "User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW
)


class FakeAdmin(AdminSecurityMixin):
    def __init__(self, answers: dict[str, Any]) -> None:
        self._transport = FakeTransport(answers)  # type: ignore[assignment]
        self._metadata = FakeMetadata(addresses=["b1", "b2"])  # type: ignore[assignment]
        self._timeout_ms = 1000
        self.sent: list[tuple[str, Any]] = []
        self._real_call = self._transport.call
        self._transport.call = self._record  # type: ignore[method-assign]

    def _record(self, address: str, method: str, request: Any, timeout_s: float | None = None) -> Any:
        resp = self._real_call(address, method, request, timeout_s)
        self.sent.append((method, request))
        return resp


def test_admin_client_has_the_security_methods() -> None:
    for name in (
        "create_acls",
        "describe_acls",
        "delete_acls",
        "describe_user_scram_credentials",
        "alter_user_scram_credentials",
    ):
        assert callable(getattr(AdminClient, name))


def test_enum_codes_are_security_proto_codes() -> None:
    assert (ResourceType.TOPIC, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID) == (2, 4, 5)
    assert (PatternType.MATCH, PatternType.LITERAL, PatternType.PREFIXED) == (2, 3, 4)
    assert (AclOperation.ALL, AclOperation.READ, AclOperation.IDEMPOTENT_WRITE) == (2, 3, 12)
    assert (AclPermissionType.DENY, AclPermissionType.ALLOW) == (2, 3)


def test_create_describe_delete_acls() -> None:
    bad = security_pb2.AclResult(error_code=InvalidRequestError.errno, error_message="no")
    admin = FakeAdmin(
        {
            "CreateAcls": security_pb2.CreateAclsResponse(results=[security_pb2.AclResult(), bad]),
            "DescribeAcls": security_pb2.DescribeAclsResponse(acls=[BINDING.to_proto()]),
            "DeleteAcls": security_pb2.DeleteAclsResponse(
                filter_results=[security_pb2.DeleteAclsFilterResult(deleted=[BINDING.to_proto()])]
            ),
        }
    )
    results = admin.create_acls([BINDING, BINDING])
    assert results[0] is None and isinstance(results[1], InvalidRequestError)
    assert list(admin.sent[0][1].creations) == [BINDING.to_proto()] * 2

    assert admin.describe_acls(AclBindingFilter(ResourceType.TOPIC, "t", PatternType.MATCH)) == [BINDING]
    sent = admin.sent[1][1].filter
    assert sent.HasField("resource_name") and not sent.HasField("principal") and sent.pattern_type == 2

    ((deleted, error),) = admin.delete_acls([AclBindingFilter()])
    assert deleted == [BINDING] and error is None
    assert admin.create_acls([]) == [] and admin.delete_acls([]) == []


def test_describe_acls_raises_a_request_error() -> None:
    admin = FakeAdmin({"DescribeAcls": security_pb2.DescribeAclsResponse(error_code=SecurityDisabledError.errno)})
    with pytest.raises(SecurityDisabledError):
        admin.describe_acls()


def test_describe_user_scram_credentials() -> None:
    alice = security_pb2.UserScramCredentials(
        user="alice", credentials=[security_pb2.ScramCredentialInfo(mechanism="SCRAM-SHA-256", iterations=8192)]
    )
    admin = FakeAdmin(
        {"DescribeUserScramCredentials": security_pb2.DescribeUserScramCredentialsResponse(results=[alice])}
    )
    assert admin.describe_user_scram_credentials() == {"alice": {"SCRAM-SHA-256": 8192}}
    missing = security_pb2.UserScramCredentials(user="bob", error_code=ResourceNotFoundError.errno)
    admin = FakeAdmin(
        {"DescribeUserScramCredentials": security_pb2.DescribeUserScramCredentialsResponse(results=[missing])}
    )
    with pytest.raises(ResourceNotFoundError):
        admin.describe_user_scram_credentials(["bob"])
    assert list(admin.sent[0][1].users) == ["bob"]


def test_alter_user_scram_credentials_sends_a_salted_password_only() -> None:
    admin = FakeAdmin(
        {
            "AlterUserScramCredentials": security_pb2.AlterUserScramCredentialsResponse(
                results=[
                    security_pb2.AlterUserScramCredentialsResult(user="alice"),
                    security_pb2.AlterUserScramCredentialsResult(user="bob", error_code=ResourceNotFoundError.errno),
                ]
            )
        }
    )
    out = admin.alter_user_scram_credentials(
        [("alice", "SCRAM-SHA-512", "alice-secret", 4096)], [("bob", "SCRAM-SHA-256")]
    )
    assert out["alice"] is None and isinstance(out["bob"], ResourceNotFoundError)
    req = admin.sent[0][1]
    assert b"alice-secret" not in req.SerializeToString()
    (up,) = req.upsertions
    assert len(up.salt) == 32 and up.iterations == 4096 and up.mechanism == "SCRAM-SHA-512"
    credential = credential_from_salted_password(ScramMechanism.SCRAM_SHA_512, up.salt, up.salted_password, 4096)
    assert password_matches(ScramMechanism.SCRAM_SHA_512, credential, "alice-secret")
    assert not password_matches(ScramMechanism.SCRAM_SHA_512, credential, "wrong")
    assert admin.alter_user_scram_credentials() == {}


def test_each_upsertion_gets_a_fresh_salt() -> None:
    a = scram_upsertion("u", "SCRAM-SHA-256", "pw", 4096)
    b = scram_upsertion("u", "SCRAM-SHA-256", "pw", 4096)
    assert a.salt != b.salt and a.salted_password != b.salted_password
    with pytest.raises(UnsupportedSaslMechanismError):
        scram_upsertion("u", "MD5", "pw", 4096)


def test_security_calls_stick_to_the_broker_that_answered() -> None:
    answer = security_pb2.DescribeAclsResponse()
    admin = FakeAdmin(
        {"DescribeAcls": answer, "CreateAcls": security_pb2.CreateAclsResponse(results=[security_pb2.AclResult()])}
    )
    transport = admin._transport
    assert isinstance(transport, FakeTransport)
    transport.down = {"b1"}
    admin.describe_acls()
    transport.down = set()
    admin.create_acls([BINDING])
    admin.describe_acls()
    assert transport.addresses() == ["b1", "b2", "b2", "b2"]
    transport.down = {"b2"}
    admin.describe_acls()  # the sticky broker is gone: another one answers
    assert transport.addresses()[-2:] == ["b2", "b1"]
    transport.down = {"b1", "b2"}
    with pytest.raises(NoBrokersAvailable):
        admin.describe_acls()
