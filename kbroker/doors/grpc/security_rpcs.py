"""The security RPCs of the ``kbroker.v1.Broker`` servicer (security.proto): SASL
authentication, ACLs and SCRAM users. Decode, delegate, encode: ACLs and SCRAM users go to
the core's :class:`~kbroker.api.security_api.SecurityApi`; SASL belongs to the connection
and runs the listener's :class:`~kbroker.security.sasl.SaslAuthenticator` here.

A mixin of :class:`kbroker.doors.grpc.servicer.BrokerService`, which sets the attributes
declared here. Each handler runs on the request pool (``blocking``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kbroker.api.call_context import current
from kbroker.api.security_api import SecurityApi, binding, binding_filter, decoded
from kbroker.doors.grpc.rpc import blocking
from kbroker.security.acl import (
    AclBinding,
    AclBindingFilter,
)
from kbroker.security.credentials import (
    ScramDeletion,
    ScramUpsertion,
)
from kbroker.security.sasl import SaslAuthenticator
from kclient.errors import (
    BrokerResponseError,
    IllegalSaslStateError,
    KafkaError,
    UnknownError,
    as_response_error,
)
from kclient.proto.kbroker.v1 import security_pb2


def _error(msg: Any, exc: BaseException) -> None:
    err = exc if isinstance(exc, BrokerResponseError) else UnknownError(str(exc))
    msg.error_code, msg.error_message = err.errno, err.message


def binding_from_proto(b: security_pb2.AclBinding) -> AclBinding:
    return binding(
        b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host, b.operation, b.permission_type
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
    return binding_filter(
        f.resource_type,
        f.resource_name if f.HasField("resource_name") else None,
        f.pattern_type,
        f.principal if f.HasField("principal") else None,
        f.host if f.HasField("host") else None,
        f.operation,
        f.permission_type,
    )


class SecurityRpcs:
    """SaslHandshake, SaslAuthenticate, CreateAcls, DescribeAcls, DeleteAcls,
    DescribeUserScramCredentials and AlterUserScramCredentials."""

    _sasl: Callable[[str], SaslAuthenticator | None]
    """The SASL authenticator of a listener (by name); None where SASL is not served."""
    security_api: SecurityApi

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

    # --- ACLs and SCRAM users (the core's SecurityApi) ------------------------------------

    @blocking
    def CreateAcls(self, request: security_pb2.CreateAclsRequest) -> security_pb2.CreateAclsResponse:
        resp = security_pb2.CreateAclsResponse()
        try:
            outcomes = self.security_api.create_acls([decoded(binding_from_proto, b) for b in request.creations])
        except KafkaError as exc:
            outcomes = [as_response_error(exc)] * len(request.creations)
        for outcome in outcomes:
            result = resp.results.add()
            if outcome is not None:
                _error(result, outcome)
        return resp

    @blocking
    def DescribeAcls(self, request: security_pb2.DescribeAclsRequest) -> security_pb2.DescribeAclsResponse:
        resp = security_pb2.DescribeAclsResponse()
        try:
            found = self.security_api.describe_acls(filter_from_proto(request.filter))
        except KafkaError as exc:
            _error(resp, exc)
            return resp
        resp.acls.extend(binding_to_proto(b) for b in found)
        return resp

    @blocking
    def DeleteAcls(self, request: security_pb2.DeleteAclsRequest) -> security_pb2.DeleteAclsResponse:
        resp = security_pb2.DeleteAclsResponse()
        try:
            outcomes = self.security_api.delete_acls([decoded(filter_from_proto, f) for f in request.filters])
        except KafkaError as exc:
            for _ in request.filters:
                _error(resp.filter_results.add(), exc)
            return resp
        for outcome in outcomes:
            result = resp.filter_results.add()
            if isinstance(outcome, BrokerResponseError):
                _error(result, outcome)
                continue
            result.deleted.extend(binding_to_proto(b) for b in outcome.deleted)
            if outcome.error is not None:
                _error(result, outcome.error)
        return resp

    @blocking
    def DescribeUserScramCredentials(
        self, request: security_pb2.DescribeUserScramCredentialsRequest
    ) -> security_pb2.DescribeUserScramCredentialsResponse:
        resp = security_pb2.DescribeUserScramCredentialsResponse()
        try:
            found = self.security_api.describe_scram_users(list(request.users))
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
        try:
            outcomes = self.security_api.alter_scram_users(deletions, upsertions)
        except KafkaError as exc:
            users = dict.fromkeys([d.user for d in deletions] + [u.user for u in upsertions])
            outcomes = dict.fromkeys(users, as_response_error(exc))
        for user, err in outcomes.items():
            r = resp.results.add(user=user)
            if err is not None:
                _error(r, err)
        return resp
