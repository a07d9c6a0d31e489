"""The security RPCs of the ``kbroker.v1.Broker`` servicer (security.proto): SASL
authentication, ACLs and SCRAM users. Decode, delegate, encode — the work is in
:mod:`kbroker.security` (SaslAuthenticator, AclAuthorizer, CredentialStore).

A mixin of :class:`kbroker.doors.grpc.servicer.BrokerService`, which sets the attributes
declared here. Each handler runs on the request pool (``blocking``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from kbroker.api.access import Access
from kbroker.api.call_context import current
from kbroker.doors.grpc.rpc import blocking
from kbroker.security.acl import (
    AccessControlEntry,
    AccessControlEntryFilter,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
    validate_binding,
)
from kbroker.security.authorizer import AclAuthorizer
from kbroker.security.credentials import (
    CredentialStore,
    ScramDeletion,
    ScramUpsertion,
    alter_user_scram_credentials,
    describe_user_scram_credentials,
)
from kbroker.security.sasl import SaslAuthenticator
from kclient.errors import (
    BrokerResponseError,
    IllegalSaslStateError,
    InvalidRequestError,
    KafkaError,
    SecurityDisabledError,
    UnknownError,
)
from kclient.proto.kbroker.v1 import security_pb2


def _error(msg: Any, exc: BaseException) -> None:
    err = exc if isinstance(exc, BrokerResponseError) else UnknownError(str(exc))
    msg.error_code, msg.error_message = err.errno, err.message


def _enum(kind: type[Any], value: int, what: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise InvalidRequestError(f"unknown {what} code {value}") from None


def binding_from_proto(b: security_pb2.AclBinding) -> AclBinding:
    return AclBinding(
        ResourcePattern(
            _enum(ResourceType, b.resource_type, "resource type"),
            b.resource_name,
            _enum(PatternType, b.pattern_type, "pattern type"),
        ),
        AccessControlEntry(
            b.principal,
            b.host,
            _enum(AclOperation, b.operation, "operation"),
            _enum(AclPermissionType, b.permission_type, "permission type"),
        ),
    )


def binding_to_proto(b: AclBinding) -> security_pb2.AclBinding:
    return security_pb2.AclBinding(
        resource_type=int(b.pattern.resource_type),
        resource_name=b.pattern.name,
        pattern_type=int(b.pattern.pattern_type),
        principal=b.entry.principal,
        host=b.entry.host,
        operation=int(b.entry.operation),
        permission_type=int(b.entry.permission_type),
    )


def filter_from_proto(f: security_pb2.AclBindingFilter) -> AclBindingFilter:
    """A filter; an unset (UNKNOWN) type, pattern, operation or permission is refused."""
    out = AclBindingFilter(
        ResourcePatternFilter(
            _enum(ResourceType, f.resource_type, "resource type"),
            f.resource_name if f.HasField("resource_name") else None,
            _enum(PatternType, f.pattern_type, "pattern type"),
        ),
        AccessControlEntryFilter(
            f.principal if f.HasField("principal") else None,
            f.host if f.HasField("host") else None,
            _enum(AclOperation, f.operation, "operation"),
            _enum(AclPermissionType, f.permission_type, "permission type"),
        ),
    )
    if out.is_unknown():
        raise InvalidRequestError(f"the filter {out} has an UNKNOWN field (use ANY to match everything)")
    return out


T = TypeVar("T")
R = TypeVar("R")


def _decoded(items: Iterable[Any], decode: Callable[[Any], T]) -> list[T | BrokerResponseError]:
    """Each item decoded, or the error that refused it."""
    out: list[T | BrokerResponseError] = []
    for item in items:
        try:
            out.append(decode(item))
        except BrokerResponseError as exc:
            out.append(exc)
    return out


def _in_order(
    decoded: list[T | BrokerResponseError], apply: Callable[[list[T]], Sequence[R]]
) -> list[R | BrokerResponseError]:
    """``apply`` to the decoded items at once; its results and the refusals, in request order."""
    valid = [d for d in decoded if not isinstance(d, BrokerResponseError)]
    done = iter(apply(valid) if valid else [])
    return [d if isinstance(d, BrokerResponseError) else next(done) for d in decoded]


def _checked_binding(b: security_pb2.AclBinding) -> AclBinding:
    binding = binding_from_proto(b)
    validate_binding(binding)
    return binding


def _no_sasl() -> IllegalSaslStateError:
    call = current()
    return IllegalSaslStateError(f"listener {call.listener} ({call.security_protocol}) does not serve SASL")


class SecurityRpcs:
    """SaslHandshake, SaslAuthenticate, CreateAcls, DescribeAcls, DeleteAcls,
    DescribeUserScramCredentials and AlterUserScramCredentials."""

    _sasl: Callable[[str], SaslAuthenticator | None]
    """The SASL authenticator of a listener (by name); None where SASL is not served."""
    _acls: AclAuthorizer | None
    _credentials: CredentialStore
    _access: Access

    @blocking
    def SaslHandshake(self, request: security_pb2.SaslHandshakeRequest) -> security_pb2.SaslHandshakeResponse:
        call = current()
        sasl = self._sasl(call.listener)
        resp = security_pb2.SaslHandshakeResponse()
        if sasl is None:
            _error(
                resp, IllegalSaslStateError(f"listener {call.listener} ({call.security_protocol}) does not serve SASL")
            )
            return resp
        resp.enabled_mechanisms.extend(sasl.mechanisms(call.security_protocol))
        try:
            sasl.handshake(request.mechanism, call.security_protocol)
        except KafkaError as exc:
            _error(resp, exc)
        return resp

    @blocking
    def SaslAuthenticate(self, request: security_pb2.SaslAuthenticateRequest) -> security_pb2.SaslAuthenticateResponse:
        call = current()
        sasl = self._sasl(call.listener)
        resp = security_pb2.SaslAuthenticateResponse()
        if sasl is None:
            _error(
                resp, IllegalSaslStateError(f"listener {call.listener} ({call.security_protocol}) does not serve SASL")
            )
            return resp
        try:
            r = sasl.authenticate(
                request.mechanism, request.exchange_id, request.auth_bytes, call.security_protocol, call.channel
            )
        except KafkaError as exc:
            _error(resp, exc)
            return resp
        resp.auth_bytes, resp.exchange_id = r.auth_bytes, r.exchange_id
        if r.session_token is not None:
            resp.session_token, resp.session_lifetime_ms = r.session_token, r.session_lifetime_ms
        return resp

    # --- ACLs (Alter / Describe on the Cluster) ----------------------------------------------

    def _authorizer_for(self, operation: AclOperation) -> AclAuthorizer:
        if self._acls is None:
            raise SecurityDisabledError("No Authorizer is configured on the broker (authorizer.class.name)")
        self._access.check_cluster(operation)
        return self._acls

    @blocking
    def CreateAcls(self, request: security_pb2.CreateAclsRequest) -> security_pb2.CreateAclsResponse:
        resp = security_pb2.CreateAclsResponse()
        try:
            acls = self._authorizer_for(AclOperation.ALTER)
        except KafkaError as exc:
            for _ in request.creations:
                _error(resp.results.add(), exc)
            return resp
        for outcome in _in_order(_decoded(request.creations, _checked_binding), acls.create_acls):
            result = resp.results.add()
            if outcome is not None:
                _error(result, outcome)
        return resp

    @blocking
    def DescribeAcls(self, request: security_pb2.DescribeAclsRequest) -> security_pb2.DescribeAclsResponse:
        resp = security_pb2.DescribeAclsResponse()
        try:
            acls = self._authorizer_for(AclOperation.DESCRIBE)
            found = acls.describe_acls(filter_from_proto(request.filter))
        except KafkaError as exc:
            _error(resp, exc)
            return resp
        resp.acls.extend(binding_to_proto(b) for b in found)
        return resp

    @blocking
    def DeleteAcls(self, request: security_pb2.DeleteAclsRequest) -> security_pb2.DeleteAclsResponse:
        resp = security_pb2.DeleteAclsResponse()
        try:
            acls = self._authorizer_for(AclOperation.ALTER)
        except KafkaError as exc:
            for _ in request.filters:
                _error(resp.filter_results.add(), exc)
            return resp
        for outcome in _in_order(_decoded(request.filters, filter_from_proto), acls.delete_acls):
            result = resp.filter_results.add()
            if isinstance(outcome, BrokerResponseError):
                _error(result, outcome)
                continue
            result.deleted.extend(binding_to_proto(b) for b in outcome.deleted)
            if outcome.error is not None:
                _error(result, outcome.error)
        return resp

    # --- SCRAM users (Alter / Describe on the Cluster) ----------------------------------------

    @blocking
    def DescribeUserScramCredentials(
        self, request: security_pb2.DescribeUserScramCredentialsRequest
    ) -> security_pb2.DescribeUserScramCredentialsResponse:
        resp = security_pb2.DescribeUserScramCredentialsResponse()
        try:
            self._access.check_cluster(AclOperation.DESCRIBE)
            found = describe_user_scram_credentials(self._credentials, list(request.users))
        except KafkaError as exc:
            _error(resp, exc)
            return resp
        for user, err, mechanisms in found:
            r = resp.results.add(user=user)
            if err is not None:
                _error(r, err)
            for mechanism, iterations in sorted(mechanisms.items(), key=lambda kv: kv[0].value):
                r.credentials.add(mechanism=mechanism.value, iterations=iterations)
        return resp

    @blocking
    def AlterUserScramCredentials(
        self, request: security_pb2.AlterUserScramCredentialsRequest
    ) -> security_pb2.AlterUserScramCredentialsResponse:
        resp = security_pb2.AlterUserScramCredentialsResponse()
        deletions = [ScramDeletion(d.user, d.mechanism) for d in request.deletions]
        upsertions = [
            ScramUpsertion(u.user, u.mechanism, u.iterations, u.salt, u.salted_password) for u in request.upsertions
        ]
        users: Sequence[str] = list(dict.fromkeys([d.user for d in deletions] + [u.user for u in upsertions]))
        try:
            self._access.check_cluster(AclOperation.ALTER)
        except KafkaError as exc:
            for user in users:
                _error(resp.results.add(user=user), exc)
            return resp
        for user, err in alter_user_scram_credentials(self._credentials, deletions, upsertions).items():
            r = resp.results.add(user=user)
            if err is not None:
                _error(r, err)
        return resp
