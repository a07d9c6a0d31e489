"""SASL authentication, ACLs and SCRAM users on the Kafka door.

SASL (SaslHandshake 0-1, SaslAuthenticate 0-2): the connection is the exchange, as in
Kafka. SaslHandshake picks the mechanism (kept in ``Connection.sasl``); each
SaslAuthenticate passes one client message to the listener's
:class:`~kbroker.security.sasl.SaslAuthenticator` (the same one the gRPC side uses:
PLAIN only on SASL_SSL, SCRAM-SHA-256/512 checked against the credentials in
ZooKeeper), carrying the SCRAM exchange id from one message to the next. When the
exchange completes the connection takes the session's principal and is authenticated;
the token the authenticator made is dropped at once (the connection is the session).
A failed exchange answers SASL_AUTHENTICATION_FAILED (58) and starts over.

Session lifetime (KIP-368): SaslAuthenticate v1+ answers ``session_lifetime_ms``
(``connections.max.reauth.ms``); the client re-authenticates on the open connection
before it ends (SaslHandshake + SaslAuthenticate again, as the same principal: another
one is refused with SASL_AUTHENTICATION_FAILED); a request after the end closes the
connection, as Kafka does.

SaslHandshake v0 (Kafka clients before 1.0; librdkafka with ``api.version.request=false``
and a ``broker.version.fallback`` below 1.0; kafka-python with an ``api_version`` below
1.0): the tokens follow the handshake as raw size-prefixed frames, without SaslAuthenticate
framing. The handshake marks the connection (``Connection.sasl["raw_tokens"]``); the
frame loop (``kafka/server.py``) hands each following frame to :meth:`raw_sasl_token`
until the exchange ends. Same mechanisms, credentials and session as with v1; a failed
exchange closes the connection without an answer (Kafka's v0 behaviour; v0 has no
error field to carry it). A v0 exchange has no session lifetime to tell the client, so
KIP-368 re-authentication needs v1: a SaslHandshake v0 on an authenticated connection
answers ILLEGAL_SASL_STATE. librdkafka (Debian's 2.0.2 among others) also needs v0 in
the advertised range to enable SASL at all ("SASL Handshake not supported by broker"
otherwise); with v1 in the range it sends v1 and SaslAuthenticate.

ACLs (CreateAcls, DescribeAcls, DeleteAcls 1-3) and SCRAM users
(DescribeUserScramCredentials, AlterUserScramCredentials 0) call the servicer's
handlers: the same checks (ALTER/DESCRIBE on the Cluster, SECURITY_DISABLED without an
authorizer) and the same ZooKeeper writes as gRPC.

Thread safety: handlers run on the door's loop; a connection's SASL requests are served
one at a time (the server reads the next one after answering), the exchange itself runs
on the request pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kbroker.api.call_context import current
from kbroker.doors.grpc.servicer import BrokerService
from kbroker.doors.kafka.codec import build, response_class
from kbroker.doors.kafka.server import Api, CloseConnection, Connection, KafkaRequest
from kbroker.security.sasl import SaslAuthenticator, SaslResult
from kclient.errors import (
    BrokerResponseError,
    IllegalSaslStateError,
    SaslAuthenticationFailedError,
)
from kclient.proto.kbroker.v1 import security_pb2

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
DESCRIBE_USER_SCRAM_CREDENTIALS, ALTER_USER_SCRAM_CREDENTIALS = 50, 51
LITERAL = 3
SCRAM_MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
"""Kafka's ScramMechanism type codes (0 is UNKNOWN)."""
SCRAM_CODES = {name: code for code, name in SCRAM_MECHANISMS.items()}

SaslLookup = Callable[[str], SaslAuthenticator | None]
"""The SASL authenticator of a Kafka listener (by name); None where SASL is not served."""


def _scram_name(code: int) -> str:
    return SCRAM_MECHANISMS.get(code, f"UNKNOWN({code})")


def _error(exc: BrokerResponseError) -> dict[str, Any]:
    return {"error_code": exc.errno, "error_message": exc.message}


def _message(msg: Any) -> str | None:
    return msg.error_message or None


def _filter(f: Any) -> security_pb2.AclBindingFilter:
    out = security_pb2.AclBindingFilter(
        resource_type=int(f.resource_type_filter),
        pattern_type=int(getattr(f, "pattern_type_filter", LITERAL)),
        operation=int(f.operation),
        permission_type=int(f.permission_type),
    )
    if f.resource_name_filter is not None:
        out.resource_name = f.resource_name_filter
    if f.principal_filter is not None:
        out.principal = f.principal_filter
    if f.host_filter is not None:
        out.host = f.host_filter
    return out


def _binding(b: security_pb2.AclBinding) -> dict[str, Any]:
    return {
        "resource_type": b.resource_type,
        "resource_name": b.resource_name,
        "pattern_type": b.pattern_type,
        "principal": b.principal,
        "host": b.host,
        "operation": b.operation,
        "permission_type": b.permission_type,
    }


class _Refused(Exception):
    """A SASL step refused: ``error`` to answer, ``close`` the connection after it."""

    def __init__(self, error: BrokerResponseError, *, close: bool = True) -> None:
        super().__init__(str(error))
        self.error, self.close = error, close


class SecurityApis:
    """The SASL, ACL and SCRAM-user APIs over one :class:`BrokerService`; ``sasl`` gives
    each Kafka listener's authenticator."""

    def __init__(self, service: BrokerService, sasl: SaslLookup) -> None:
        self._service = service
        self._sasl = sasl

    def apis(self) -> list[Api]:
        return [
            Api(SASL_HANDSHAKE, "SaslHandshake", 0, 1, self.sasl_handshake, raw_tokens=self.raw_sasl_token),
            Api(SASL_AUTHENTICATE, "SaslAuthenticate", 0, 2, self.sasl_authenticate),
            Api(DESCRIBE_ACLS, "DescribeAcls", 1, 3, self.describe_acls),
            Api(CREATE_ACLS, "CreateAcls", 1, 3, self.create_acls),
            Api(DELETE_ACLS, "DeleteAcls", 1, 3, self.delete_acls),
            Api(DESCRIBE_USER_SCRAM_CREDENTIALS, "DescribeUserScramCredentials", 0, 0, self.describe_scram),
            Api(ALTER_USER_SCRAM_CREDENTIALS, "AlterUserScramCredentials", 0, 0, self.alter_scram),
        ]

    async def _call(self, rpc: str, proto: Any, req: KafkaRequest) -> Any:
        return await getattr(self._service, rpc)(proto, req.service_context())

    # --- SASL -------------------------------------------------------------------------

    async def sasl_handshake(self, req: KafkaRequest) -> Any:
        conn = req.connection
        call = current()
        sasl = self._sasl(call.listener)
        cls = response_class(SASL_HANDSHAKE, req.version)
        conn.sasl.clear()
        if sasl is None:
            err = IllegalSaslStateError(f"listener {call.listener} ({call.security_protocol}) does not serve SASL")
            return build(cls, {"error_code": err.errno})
        if req.version == 0 and conn.authenticated:
            err = IllegalSaslStateError("re-authentication needs SaslHandshake v1 and SaslAuthenticate (KIP-368)")
            return build(cls, {"error_code": err.errno, "mechanisms": sasl.mechanisms(call.security_protocol)})
        mechanism = str(req.payload.mechanism)
        try:
            allowed = sasl.handshake(mechanism, call.security_protocol)
        except BrokerResponseError as exc:
            return build(cls, {"error_code": exc.errno, "mechanisms": sasl.mechanisms(call.security_protocol)})
        conn.sasl["mechanism"] = mechanism
        if req.version == 0:
            conn.sasl["raw_tokens"] = True  # the tokens come as raw frames (the module docstring)
        return build(cls, {"error_code": 0, "mechanisms": allowed})

    async def sasl_authenticate(self, req: KafkaRequest) -> Any:
        cls = response_class(SASL_AUTHENTICATE, req.version)
        try:
            auth_bytes, lifetime_ms = await self._exchange(req.connection, bytes(req.payload.auth_bytes))
        except _Refused as refused:
            if refused.close:
                raise CloseConnection(build(cls, _error(refused.error))) from refused.error
            return build(cls, _error(refused.error))
        if lifetime_ms is None:
            return build(cls, {"error_code": 0, "auth_bytes": auth_bytes})
        return build(cls, {"error_code": 0, "auth_bytes": auth_bytes, "session_lifetime": lifetime_ms})

    async def raw_sasl_token(self, conn: Connection, token: bytes) -> bytes:
        """One client token of a SaslHandshake v0 exchange (a raw size-prefixed frame, no
        request header): the server's token to send back as a raw size-prefixed frame
        (empty when the mechanism has nothing to send, as PLAIN's last step). A failed
        exchange raises CloseConnection without an answer, as Kafka closes it."""
        try:
            auth_bytes, _ = await self._exchange(conn, token)
        except _Refused as refused:
            raise CloseConnection() from refused.error
        return auth_bytes

    async def _exchange(self, conn: Connection, auth_bytes: bytes) -> tuple[bytes, int | None]:
        """One step of the connection's SASL exchange: (the server's bytes, the session
        lifetime in ms once authenticated, else None). Raises _Refused."""
        call = current()
        sasl = self._sasl(call.listener)
        mechanism = conn.sasl.get("mechanism")
        if sasl is None or mechanism is None:
            raise _Refused(IllegalSaslStateError("SaslAuthenticate before a successful SaslHandshake"), close=False)
        exchange_id = str(conn.sasl.get("exchange_id", ""))
        try:
            result: SaslResult = await self._service._offload(
                sasl.authenticate, mechanism, exchange_id, auth_bytes, call.security_protocol
            )
        except BrokerResponseError as exc:
            conn.sasl.clear()
            raise _Refused(exc) from exc  # Kafka closes after a failed exchange
        if result.session_token is None:
            conn.sasl["exchange_id"] = result.exchange_id
            return result.auth_bytes, None
        session = sasl.sessions.session(result.session_token)
        sasl.sessions.revoke(result.session_token)  # the connection is the session
        conn.sasl.clear()
        if session is None:  # revoked in between (its credential changed)
            raise _Refused(SaslAuthenticationFailedError("the credential changed: authenticate again"))
        if conn.authenticated and conn.principal != session.principal:  # KIP-368: then Kafka closes
            raise _Refused(
                SaslAuthenticationFailedError(
                    f"re-authentication as {session.principal} on a connection of {conn.principal} is not allowed"
                )
            )
        conn.principal, conn.authenticated = session.principal, True
        conn.session_expiry = time.monotonic() + result.session_lifetime_ms / 1000.0
        return result.auth_bytes, result.session_lifetime_ms

    # --- ACLs -------------------------------------------------------------------------

    async def create_acls(self, req: KafkaRequest) -> Any:
        proto = security_pb2.CreateAclsRequest(
            creations=[
                security_pb2.AclBinding(
                    resource_type=int(c.resource_type),
                    resource_name=c.resource_name,
                    pattern_type=int(getattr(c, "resource_pattern_type", LITERAL)),
                    principal=c.principal,
                    host=c.host,
                    operation=int(c.operation),
                    permission_type=int(c.permission_type),
                )
                for c in req.payload.creations
            ]
        )
        resp = await self._call("CreateAcls", proto, req)
        return build(
            response_class(CREATE_ACLS, req.version),
            {"results": [{"error_code": r.error_code, "error_message": _message(r)} for r in resp.results]},
        )

    async def describe_acls(self, req: KafkaRequest) -> Any:
        resp = await self._call("DescribeAcls", security_pb2.DescribeAclsRequest(filter=_filter(req.payload)), req)
        resources: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
        for b in resp.acls:
            resources.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(_binding(b))
        return build(
            response_class(DESCRIBE_ACLS, req.version),
            {
                "error_code": resp.error_code,
                "error_message": _message(resp),
                "resources": [
                    {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
                    for (t, n, p), acls in resources.items()
                ],
            },
        )

    async def delete_acls(self, req: KafkaRequest) -> Any:
        proto = security_pb2.DeleteAclsRequest(filters=[_filter(f) for f in req.payload.filters])
        resp = await self._call("DeleteAcls", proto, req)
        return build(
            response_class(DELETE_ACLS, req.version),
            {
                "filter_results": [
                    {
                        "error_code": r.error_code,
                        "error_message": _message(r),
                        "matching_acls": [{"error_code": 0, **_binding(b)} for b in r.deleted],
                    }
                    for r in resp.filter_results
                ]
            },
        )

    # --- SCRAM users --------------------------------------------------------------------

    async def describe_scram(self, req: KafkaRequest) -> Any:
        users = [u.name for u in req.payload.users or ()]
        resp = await self._call(
            "DescribeUserScramCredentials", security_pb2.DescribeUserScramCredentialsRequest(users=users), req
        )
        return build(
            response_class(DESCRIBE_USER_SCRAM_CREDENTIALS, req.version),
            {
                "error_code": resp.error_code,
                "error_message": _message(resp),
                "results": [
                    {
                        "user": r.user,
                        "error_code": r.error_code,
                        "error_message": _message(r),
                        "credential_infos": [
                            {"mechanism": SCRAM_CODES.get(c.mechanism, 0), "iterations": c.iterations}
                            for c in r.credentials
                        ],
                    }
                    for r in resp.results
                ],
            },
        )

    async def alter_scram(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = security_pb2.AlterUserScramCredentialsRequest(
            deletions=[
                security_pb2.ScramCredentialDeletion(user=d.name, mechanism=_scram_name(int(d.mechanism)))
                for d in p.deletions
            ],
            upsertions=[
                security_pb2.ScramCredentialUpsertion(
                    user=u.name,
                    mechanism=_scram_name(int(u.mechanism)),
                    iterations=int(u.iterations),
                    salt=bytes(u.salt),
                    salted_password=bytes(u.salted_password),
                )
                for u in p.upsertions
            ],
        )
        resp = await self._call("AlterUserScramCredentials", proto, req)
        return build(
            response_class(ALTER_USER_SCRAM_CREDENTIALS, req.version),
            {
                "results": [
                    {"user": r.user, "error_code": r.error_code, "error_message": _message(r)} for r in resp.results
                ]
            },
        )
