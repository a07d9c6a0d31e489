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
(DescribeUserScramCredentials, AlterUserScramCredentials 0) call the core's
:class:`~kbroker.api.security_api.SecurityApi`: the same checks (ALTER/DESCRIBE on the
Cluster, SECURITY_DISABLED without an authorizer) and the same ZooKeeper writes as gRPC.

Thread safety: handlers run on the door's loop; a connection's SASL requests are served
one at a time (the server reads the next one after answering), the exchange itself runs
on the request pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from kbroker.api.apis import BrokerApis
from kbroker.api.call_context import current
from kbroker.api.security_api import binding, binding_filter, decoded
from kbroker.doors.kafka.codec import build, response_class
from kbroker.doors.kafka.server import Api, CloseConnection, Connection, KafkaRequest
from kbroker.security.acl import AclBinding, AclBindingFilter
from kbroker.security.credentials import ScramDeletion, ScramUpsertion
from kbroker.security.sasl import SaslAuthenticator, SaslResult
from kclient.errors import (
    BrokerResponseError,
    IllegalSaslStateError,
    SaslAuthenticationFailedError,
    as_response_error,
)

T = TypeVar("T")

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


def _message(err: BrokerResponseError | None) -> str | None:
    return err.message or None if err is not None else None


def _code(err: BrokerResponseError | None) -> int:
    return err.errno if err is not None else 0


def _filter(f: Any) -> AclBindingFilter:
    return binding_filter(
        int(f.resource_type_filter),
        f.resource_name_filter,
        int(getattr(f, "pattern_type_filter", LITERAL)),
        f.principal_filter,
        f.host_filter,
        int(f.operation),
        int(f.permission_type),
    )


def _binding(b: AclBinding) -> dict[str, Any]:
    return {
        "resource_type": int(b.pattern.resource_type),
        "resource_name": b.pattern.name,
        "pattern_type": int(b.pattern.pattern_type),
        "principal": b.entry.principal,
        "host": b.entry.host,
        "operation": int(b.entry.operation),
        "permission_type": int(b.entry.permission_type),
    }


class _Refused(Exception):
    """A SASL step refused: ``error`` to answer, ``close`` the connection after it."""

    def __init__(self, error: BrokerResponseError, *, close: bool = True) -> None:
        super().__init__(str(error))
        self.error, self.close = error, close


class SecurityApis:
    """The SASL, ACL and SCRAM-user APIs over the core's :class:`SecurityApi`; ``sasl``
    gives each Kafka listener's authenticator."""

    def __init__(self, core: BrokerApis, sasl: SaslLookup) -> None:
        self._security = core.security
        self._offload = core.offload
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

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._offload(fn, *args)  # type: ignore[no-any-return]

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
            result: SaslResult = await self._offload(
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
        creations = [
            decoded(
                binding,
                int(c.resource_type),
                c.resource_name,
                int(getattr(c, "resource_pattern_type", LITERAL)),
                c.principal,
                c.host,
                int(c.operation),
                int(c.permission_type),
            )
            for c in req.payload.creations
        ]
        try:
            outcomes = await self._call(self._security.create_acls, creations)
        except BrokerResponseError as exc:
            outcomes = [exc] * len(creations)
        return build(
            response_class(CREATE_ACLS, req.version),
            {"results": [{"error_code": _code(e), "error_message": _message(e)} for e in outcomes]},
        )

    async def describe_acls(self, req: KafkaRequest) -> Any:
        cls = response_class(DESCRIBE_ACLS, req.version)
        try:
            found = await self._call(self._security.describe_acls, _filter(req.payload))
        except BrokerResponseError as exc:
            return build(cls, {"error_code": exc.errno, "error_message": _message(exc), "resources": []})
        resources: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
        for b in found:
            entry = _binding(b)
            key = (entry["resource_type"], entry["resource_name"], entry["pattern_type"])
            resources.setdefault(key, []).append(entry)
        return build(
            cls,
            {
                "error_code": 0,
                "error_message": None,
                "resources": [
                    {"resource_type": t, "resource_name": n, "pattern_type": p, "acls": acls}
                    for (t, n, p), acls in resources.items()
                ],
            },
        )

    async def delete_acls(self, req: KafkaRequest) -> Any:
        filters = [decoded(_filter, f) for f in req.payload.filters]
        try:
            outcomes = await self._call(self._security.delete_acls, filters)
        except BrokerResponseError as exc:
            outcomes = [exc] * len(filters)
        results: list[dict[str, Any]] = []
        for o in outcomes:
            if isinstance(o, BrokerResponseError):
                results.append({"error_code": o.errno, "error_message": _message(o), "matching_acls": []})
                continue
            err = as_response_error(o.error) if o.error is not None else None
            results.append(
                {
                    "error_code": _code(err),
                    "error_message": _message(err),
                    "matching_acls": [{"error_code": 0, **_binding(b)} for b in o.deleted],
                }
            )
        return build(response_class(DELETE_ACLS, req.version), {"filter_results": results})

    # --- SCRAM users --------------------------------------------------------------------

    async def describe_scram(self, req: KafkaRequest) -> Any:
        cls = response_class(DESCRIBE_USER_SCRAM_CREDENTIALS, req.version)
        users = [u.name for u in req.payload.users or ()]
        try:
            found = await self._call(self._security.describe_scram_users, users)
        except BrokerResponseError as exc:
            return build(cls, {"error_code": exc.errno, "error_message": _message(exc), "results": []})
        return build(
            cls,
            {
                "error_code": 0,
                "error_message": None,
                "results": [
                    {
                        "user": user,
                        "error_code": _code(err),
                        "error_message": _message(err),
                        "credential_infos": [
                            {"mechanism": SCRAM_CODES.get(m.value, 0), "iterations": n}
                            for m, n in sorted(mechanisms.items(), key=lambda kv: kv[0].value)
                        ],
                    }
                    for user, err, mechanisms in found
                ],
            },
        )

    async def alter_scram(self, req: KafkaRequest) -> Any:
        p = req.payload
        deletions = [ScramDeletion(d.name, _scram_name(int(d.mechanism))) for d in p.deletions]
        upsertions = [
            ScramUpsertion(
                u.name, _scram_name(int(u.mechanism)), int(u.iterations), bytes(u.salt), bytes(u.salted_password)
            )
            for u in p.upsertions
        ]
        try:
            outcomes = await self._call(self._security.alter_scram_users, deletions, upsertions)
        except BrokerResponseError as exc:
            users = dict.fromkeys([d.user for d in deletions] + [u.user for u in upsertions])
            outcomes = dict.fromkeys(users, exc)
        return build(
            response_class(ALTER_USER_SCRAM_CREDENTIALS, req.version),
            {
                "results": [
                    {"user": user, "error_code": _code(err), "error_message": _message(err)}
                    for user, err in outcomes.items()
                ]
            },
        )
