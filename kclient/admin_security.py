"""The ACL and SCRAM-user methods of :class:`kclient.AdminClient` (Java AdminClient's
names: ``create_acls``, ``describe_acls``, ``delete_acls``,
``describe_user_scram_credentials``, ``alter_user_scram_credentials``).

ACLs are the flat :class:`AclBinding` / :class:`AclBindingFilter` below, whose enums are
Kafka's int codes (those of ``protos/kbroker/v1/security.proto``). Any broker answers
these RPCs (ACLs and credentials live in ZooKeeper). One AdminClient sends them all to
the same broker while it answers (the first that answered): a broker updates its own
ACL and credential caches at once on a write and the others' through ZooKeeper
notifications, so a describe right after a write reads that write (Kafka's tools behave
the same way when they talk to one broker).

SCRAM credentials follow KIP-554: the client draws a random 32-byte salt and sends
``Hi(password, salt, iterations)``; the password never leaves the process.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from kclient.acl import AclOperation, AclPermissionType, PatternType, ResourceType
from kclient.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NoBrokersAvailable,
    UnsupportedSaslMechanismError,
    for_code,
)
from kclient.proto.kbroker.v1 import security_pb2
from kclient.scram import SALT_BYTES, ScramMechanism

if TYPE_CHECKING:
    from kclient.metadata import ClusterMetadata
    from kclient.transport import Transport

SCRAM_SALT_BYTES = SALT_BYTES


def _enum(cls: type[IntEnum], value: int) -> Any:
    """A code from the wire as ``cls``; a code this client does not know is UNKNOWN (0)."""
    try:
        return cls(value)
    except ValueError:
        return cls(0)


@dataclass(frozen=True)
class AclBinding:
    """One ACL: on the resource (type, name, LITERAL or PREFIXED), principal ``User:alice``
    (``User:*`` = everyone) from ``host`` (``*`` = anywhere) is allowed or denied
    ``operation``. Immutable."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType

    def to_proto(self) -> security_pb2.AclBinding:
        return security_pb2.AclBinding(
            resource_type=int(self.resource_type),
            resource_name=self.resource_name,
            pattern_type=int(self.pattern_type),
            principal=self.principal,
            host=self.host,
            operation=int(self.operation),
            permission_type=int(self.permission_type),
        )

    @classmethod
    def from_proto(cls, b: security_pb2.AclBinding) -> AclBinding:
        return cls(
            _enum(ResourceType, b.resource_type),
            b.resource_name,
            _enum(PatternType, b.pattern_type),
            b.principal,
            b.host,
            _enum(AclOperation, b.operation),
            _enum(AclPermissionType, b.permission_type),
        )


@dataclass(frozen=True)
class AclBindingFilter:
    """Selects ACLs: ``None`` names/principal/host and the ANY codes match everything;
    ``pattern_type`` MATCH selects the patterns that apply to ``resource_name``
    (literal, ``*`` and prefixed ones), as Kafka's ``AclBindingFilter``. Immutable."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def to_proto(self) -> security_pb2.AclBindingFilter:
        f = security_pb2.AclBindingFilter(
            resource_type=int(self.resource_type),
            pattern_type=int(self.pattern_type),
            operation=int(self.operation),
            permission_type=int(self.permission_type),
        )
        if self.resource_name is not None:
            f.resource_name = self.resource_name
        if self.principal is not None:
            f.principal = self.principal
        if self.host is not None:
            f.host = self.host
        return f


def _error(code: int, message: str) -> KafkaError | None:
    return for_code(code)(message) if code else None


def scram_upsertion(
    user: str, mechanism: str, password: str, iterations: int, salt: bytes | None = None
) -> security_pb2.ScramCredentialUpsertion:
    """KIP-554's upsertion: a random salt (``SCRAM_SALT_BYTES``) and the salted password only.

    UnsupportedSaslMechanismError (33) for a name that is not SCRAM-SHA-256/512.
    """
    found = ScramMechanism.from_name(mechanism)
    if found is None:
        names = ", ".join(m.value for m in ScramMechanism)
        raise UnsupportedSaslMechanismError(f"unknown SCRAM mechanism {mechanism!r} (use {names})")
    salt = os.urandom(SCRAM_SALT_BYTES) if salt is None else salt
    return security_pb2.ScramCredentialUpsertion(
        user=user,
        mechanism=found.value,
        iterations=iterations,
        salt=salt,
        salted_password=found.salted_password(password, salt, iterations),
    )


class AdminSecurityMixin:
    """ACL and SCRAM-user administration for :class:`kclient.AdminClient`.

    Uses the host class's ``_transport``, ``_metadata`` and ``_timeout_ms``. Invariant:
    ``_security_broker`` is the broker that answered the last security call (None until
    one did, or after it failed to answer); calls go there first. Thread-safe as the
    transport is (two threads may race to set the sticky broker; either one is fine).
    """

    _transport: Transport
    _metadata: ClusterMetadata
    _timeout_ms: int
    _security_broker: str | None = None

    def _security_call(self, method: str, request: Any) -> Any:
        timeout_s = self._timeout_ms / 1000.0 + 5
        sticky = self._security_broker
        if sticky is not None:
            try:
                return self._transport.call(sticky, method, request, timeout_s)
            except (KafkaConnectionError, KafkaTimeoutError):
                self._security_broker = None
        last: KafkaError | None = None
        tried: list[str] = []
        for address in self._transport.candidates(self._metadata.broker_addresses()):
            if address == sticky:
                continue
            tried.append(address)
            try:
                resp = self._transport.call(address, method, request, timeout_s)
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                last = exc
                continue
            self._security_broker = address
            return resp
        raise NoBrokersAvailable(f"no broker answered {method} among {tried}: {last}")

    # --- ACLs -------------------------------------------------------------------------

    def create_acls(self, bindings: Iterable[AclBinding]) -> list[KafkaError | None]:
        """Create ``bindings``; per binding, in order, ``None`` or its typed error
        (InvalidRequestError for a malformed one). Raises what failed the whole request
        (SecurityDisabledError without an authorizer, ClusterAuthorizationFailedError
        without Alter on the Cluster)."""
        req = security_pb2.CreateAclsRequest(creations=[b.to_proto() for b in bindings])
        if not req.creations:
            return []
        resp = self._security_call("CreateAcls", req)
        return [_error(r.error_code, r.error_message) for r in resp.results]

    def describe_acls(self, acl_filter: AclBindingFilter | None = None) -> list[AclBinding]:
        """The ACLs ``acl_filter`` selects (default: every ACL); raises the typed error
        of a refused request."""
        req = security_pb2.DescribeAclsRequest(filter=(acl_filter or AclBindingFilter()).to_proto())
        resp = self._security_call("DescribeAcls", req)
        if resp.error_code:
            raise for_code(resp.error_code)(resp.error_message or "DescribeAcls")
        return [AclBinding.from_proto(b) for b in resp.acls]

    def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[tuple[list[AclBinding], KafkaError | None]]:
        """Delete every ACL each filter selects; per filter, in order, (the deleted
        bindings, ``None`` or the typed error)."""
        req = security_pb2.DeleteAclsRequest(filters=[f.to_proto() for f in filters])
        if not req.filters:
            return []
        resp = self._security_call("DeleteAcls", req)
        return [
            ([AclBinding.from_proto(b) for b in r.deleted], _error(r.error_code, r.error_message))
            for r in resp.filter_results
        ]

    # --- SCRAM users ------------------------------------------------------------------

    def describe_user_scram_credentials(self, users: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
        """``{user: {mechanism: iterations}}`` of ``users`` (default: every user with a
        credential). A named user without credentials raises its typed error
        (ResourceNotFoundError, 91), as Java's ``description(user).get()`` does."""
        resp = self._security_call(
            "DescribeUserScramCredentials", security_pb2.DescribeUserScramCredentialsRequest(users=list(users or ()))
        )
        if resp.error_code:
            raise for_code(resp.error_code)(resp.error_message or "DescribeUserScramCredentials")
        out: dict[str, dict[str, int]] = {}
        for r in resp.results:
            if r.error_code:
                raise for_code(r.error_code)(r.error_message or f"user {r.user!r}")
            out[r.user] = {c.mechanism: int(c.iterations) for c in r.credentials}
        return out

    def alter_user_scram_credentials(
        self,
        upsertions: Iterable[tuple[str, str, str, int]] = (),
        deletions: Iterable[tuple[str, str]] = (),
    ) -> dict[str, KafkaError | None]:
        """Set credentials from ``(user, mechanism, password, iterations)`` (salted here,
        with a fresh random salt: the password is never sent) and remove
        ``(user, mechanism)`` ones; each user's changes apply together. Per user, ``None``
        or its typed error (ResourceNotFoundError for a credential to delete that does not
        exist, UnacceptableCredentialError, DuplicateResourceError for a mechanism named
        twice, UnsupportedSaslMechanismError)."""
        req = security_pb2.AlterUserScramCredentialsRequest(
            upsertions=[scram_upsertion(u, m, pw, i) for u, m, pw, i in upsertions],
            deletions=[security_pb2.ScramCredentialDeletion(user=u, mechanism=m) for u, m in deletions],
        )
        if not req.upsertions and not req.deletions:
            return {}
        resp = self._security_call("AlterUserScramCredentials", req)
        return {r.user: _error(r.error_code, r.error_message) for r in resp.results}
