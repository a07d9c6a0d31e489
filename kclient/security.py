"""Client security settings (kafka-python's names) and the client side of SASL over gRPC.

:class:`SecurityConfig` holds ``security_protocol`` (PLAINTEXT, SSL, SASL_PLAINTEXT,
SASL_SSL), the ``ssl_*`` files and the ``sasl_*`` credentials, checked when it is made:
every mistake is one :class:`~kclient.errors.InvalidConfigError` line, before anything
is sent. ``sasl_mechanism="PLAIN"`` with ``SASL_PLAINTEXT`` is refused here: PLAIN
carries the password, which must never cross a plaintext connection.

SASL (see ``protos/kbroker/v1/security.proto``): :func:`sasl_login` runs SaslHandshake
then SaslAuthenticate (PLAIN: one call; SCRAM: two, tied by ``exchange_id``, and the
broker's server-final signature is verified, so a broker that does not know the
credential is refused too) and returns a session token. :class:`BrokerSession` keeps one
broker's token and logs in again when it is within 10% of its lifetime of expiring;
:class:`SessionInterceptor` (on the channel, so calls made with ``stub(...)`` directly
and with ``.future(...)`` carry it as well) sends it as metadata ``kbroker-session`` and,
when the broker answers UNAUTHENTICATED (the session expired or was revoked: a broker
restart, a changed credential; or the token was issued on another connection: the broker
binds each token to the TCP connection that logged in, so a reconnected channel logs in
again), drops the token so that the next call logs in again; a blocking call is retried
once at once. The login goes over the same channel as the calls, hence the same
connection.

Passwords are never logged nor put in an exception message, and ``repr`` leaves them out.

:func:`java_client_configs` maps Java client property names (``security.protocol``,
``ssl.truststore.location``, ``sasl.jaas.config``, ...) to these settings, for kctl's
``--command-config`` and the Spark connector's ``kafka.*`` options.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import grpc

from kclient import tls
from kclient.errors import (
    IllegalSaslStateError,
    InvalidConfigError,
    KafkaError,
    SaslAuthenticationFailedError,
    for_code,
)
from kclient.proto.kbroker.v1 import security_pb2
from kclient.scram import ScramClient as _ScramClient
from kclient.scram import ScramError, ScramMechanism

log = logging.getLogger(__name__)

PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL = "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
PLAIN = "PLAIN"
SASL_MECHANISMS = (PLAIN, ScramMechanism.SCRAM_SHA_256.value, ScramMechanism.SCRAM_SHA_512.value)
SESSION_METADATA_KEY = "kbroker-session"
ERROR_CODE_METADATA_KEY = "kbroker-error-code"
REAUTH_FRACTION = 0.9
"""A session is renewed once this fraction of its lifetime has passed."""

DEFAULT_SECURITY_CONFIG: dict[str, Any] = {
    "security_protocol": PLAINTEXT,
    "ssl_cafile": None,
    "ssl_certfile": None,
    "ssl_keyfile": None,
    "ssl_password": None,
    "ssl_check_hostname": True,
    "sasl_mechanism": None,
    "sasl_plain_username": None,
    "sasl_plain_password": None,
}
"""The security settings Producer, Consumer and AdminClient accept, with their defaults."""


@dataclass(frozen=True)
class SecurityConfig:
    """Checked client security settings (kafka-python's names). Immutable.

    ``ssl_check_hostname=False``: gRPC cannot skip the host name check; the certificate's
    chain is still verified and the channel checks against a name the broker's
    certificate holds (see :mod:`kclient.tls`).
    """

    security_protocol: str = PLAINTEXT
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        protocol = str(self.security_protocol or "").strip().upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise InvalidConfigError(
                f"security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, got {self.security_protocol!r}"
            )
        object.__setattr__(self, "security_protocol", protocol)
        if not isinstance(self.ssl_check_hostname, bool):
            raise InvalidConfigError(f"ssl_check_hostname must be True or False, got {self.ssl_check_hostname!r}")
        if self.uses_sasl:
            self._check_sasl()
        elif self.sasl_mechanism or self.sasl_plain_username or self.sasl_plain_password:
            raise InvalidConfigError(
                f"sasl_* settings are given but security_protocol is {protocol}: use SASL_SSL or SASL_PLAINTEXT"
            )
        ssl_given = [n for n in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password") if getattr(self, n)]
        if self.uses_tls:
            self.channel_credentials()  # reads and checks the files now
        elif ssl_given:
            raise InvalidConfigError(f"{ssl_given[0]} is set but security_protocol is {protocol}: use SSL or SASL_SSL")

    def _check_sasl(self) -> None:
        protocol = self.security_protocol
        if not self.sasl_mechanism:
            raise InvalidConfigError(
                f"security_protocol {protocol} needs sasl_mechanism ({', '.join(SASL_MECHANISMS)})"
            )
        mechanism = str(self.sasl_mechanism).strip().upper()
        if mechanism not in SASL_MECHANISMS:
            raise InvalidConfigError(
                f"sasl_mechanism must be one of {', '.join(SASL_MECHANISMS)}, got {self.sasl_mechanism!r}"
            )
        object.__setattr__(self, "sasl_mechanism", mechanism)
        if not self.sasl_plain_username:
            raise InvalidConfigError(f"sasl_mechanism {mechanism} needs sasl_plain_username")
        if not self.sasl_plain_password:
            raise InvalidConfigError(f"sasl_mechanism {mechanism} needs sasl_plain_password")
        if mechanism == PLAIN and protocol == SASL_PLAINTEXT:
            raise InvalidConfigError(
                "sasl_mechanism PLAIN sends the password and is refused over SASL_PLAINTEXT: "
                "use security_protocol SASL_SSL, or SCRAM-SHA-256 / SCRAM-SHA-512"
            )

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in (SSL, SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in (SASL_PLAINTEXT, SASL_SSL)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """gRPC TLS credentials from the ``ssl_*`` files (only for SSL and SASL_SSL)."""
        return tls.channel_credentials(self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile, self.ssl_password)

    def certificate_name(self, address: str, timeout_s: float) -> str:
        """The name to check ``address``'s certificate against when ``ssl_check_hostname`` is off."""
        return tls.certificate_name(
            address, self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile, self.ssl_password, timeout_s
        )

    @classmethod
    def from_configs(cls, configs: Mapping[str, Any]) -> SecurityConfig | None:
        """The security settings among a client's ``configs`` (``None``: plain PLAINTEXT)."""
        values = {f.name: configs.get(f.name, DEFAULT_SECURITY_CONFIG[f.name]) for f in fields(cls)}
        if values == DEFAULT_SECURITY_CONFIG:
            return None
        return cls(**values)


# --- Java client property names --------------------------------------------------------

_JAAS_ENTRY = re.compile(r"\s*(?P<module>[A-Za-z_$][\w$.]*)\s+(?P<flag>required|requisite|sufficient|optional)\b")
_JAAS_OPTION = re.compile(r'\s*(?P<key>[A-Za-z_][\w.-]*)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s";]+))')
SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


class JaasConfig(NamedTuple):
    """One ``sasl.jaas.config`` login module entry."""

    login_module: str
    options: dict[str, str]

    def __repr__(self) -> str:  # never show the password
        shown = {k: ("***" if "password" in k.lower() else v) for k, v in self.options.items()}
        return f"JaasConfig({self.login_module!r}, {shown!r})"


def parse_jaas_config(text: str) -> JaasConfig:
    """Kafka's ``sasl.jaas.config`` value, e.g.
    ``org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="secret";``.

    One login module entry, a control flag, ``key=value`` options (values double-quoted,
    with ``\\`` escapes, or bare) and a closing ``;``. InvalidConfigError otherwise; the
    message never quotes the text (it holds a password).
    """
    m = _JAAS_ENTRY.match(text)
    if m is None:
        raise InvalidConfigError(
            'sasl.jaas.config must be \'<LoginModule class> required username="..." password="...";\''
        )
    pos, options = m.end(), {}
    while True:
        opt = _JAAS_OPTION.match(text, pos)
        if opt is None:
            break
        raw = opt["quoted"] if opt["quoted"] is not None else opt["bare"]
        options[opt["key"]] = re.sub(r"\\(.)", r"\1", raw) if opt["quoted"] is not None else raw
        pos = opt.end()
    rest = text[pos:].strip()
    if rest != ";":
        raise InvalidConfigError(
            "sasl.jaas.config: expected key=\"value\" options ending with one ';' (and one login module only)"
        )
    return JaasConfig(m["module"], options)


def jaas_credentials(text: str, mechanism: str | None) -> tuple[str, str]:
    """(username, password) of a ``sasl.jaas.config`` for ``mechanism`` (SCRAM or PLAIN
    login module); InvalidConfigError otherwise."""
    jaas = parse_jaas_config(text)
    expected = {PLAIN: PLAIN_LOGIN_MODULE}.get((mechanism or "").upper(), SCRAM_LOGIN_MODULE)
    if jaas.login_module not in (SCRAM_LOGIN_MODULE, PLAIN_LOGIN_MODULE):
        raise InvalidConfigError(
            f"sasl.jaas.config: login module {jaas.login_module} is not supported "
            f"(use {SCRAM_LOGIN_MODULE} or {PLAIN_LOGIN_MODULE})"
        )
    if mechanism and jaas.login_module != expected:
        raise InvalidConfigError(f"sasl.jaas.config: sasl.mechanism {mechanism} needs {expected}")
    username, password = jaas.options.get("username"), jaas.options.get("password")
    if not username or not password:
        raise InvalidConfigError('sasl.jaas.config needs username="..." and password="..."')
    return username, password


JAVA_SECURITY_PROPERTIES = (
    "security.protocol",
    "ssl.truststore.location",
    "ssl.truststore.type",
    "ssl.keystore.location",
    "ssl.keystore.type",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "sasl.mechanism",
    "sasl.jaas.config",
    "sasl.username",
    "sasl.password",
)
"""The Java client property names :func:`java_client_configs` understands."""


def java_client_configs(props: Mapping[str, str], prefix: str = "") -> dict[str, Any]:
    """The kclient security settings of Java client properties (names as
    ``JAVA_SECURITY_PROPERTIES``, each after ``prefix``; other keys are ignored).

    ``ssl.truststore.location`` (PEM) is ``ssl_cafile``; ``ssl.keystore.location`` (PEM,
    certificate chain and key in one file) is ``ssl_certfile``; ``ssl.key.password`` is
    ``ssl_password``; ``ssl.endpoint.identification.algorithm`` empty turns
    ``ssl_check_hostname`` off; ``sasl.jaas.config`` (Scram/PlainLoginModule) or
    ``sasl.username`` + ``sasl.password`` give the SASL credentials. ``prefix`` is named
    in error messages (the Spark connector passes ``kafka.``).
    """

    def get(name: str) -> str | None:
        value = props.get(prefix + name)
        return None if value is None else str(value).strip()

    out: dict[str, Any] = {}
    for typ in ("ssl.truststore.type", "ssl.keystore.type"):
        value = get(typ)
        if value is not None and value.upper() != "PEM":
            raise InvalidConfigError(f"{prefix}{typ}={value}: only PEM files are supported")
    table = {
        "security.protocol": "security_protocol",
        "ssl.truststore.location": "ssl_cafile",
        "ssl.keystore.location": "ssl_certfile",
        "sasl.mechanism": "sasl_mechanism",
        "sasl.username": "sasl_plain_username",
    }
    for name, attr in table.items():
        value = get(name)
        if value:
            out[attr] = value
    key_password = props.get(prefix + "ssl.key.password")
    if key_password:
        out["ssl_password"] = str(key_password)
    password = props.get(prefix + "sasl.password")
    if password:
        out["sasl_plain_password"] = str(password)
    algorithm = get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        if algorithm.lower() not in ("", "https"):
            raise InvalidConfigError(f"{prefix}ssl.endpoint.identification.algorithm must be https or empty")
        out["ssl_check_hostname"] = algorithm.lower() == "https"
    jaas = props.get(prefix + "sasl.jaas.config")
    if jaas:
        if "sasl_plain_username" in out or "sasl_plain_password" in out:
            raise InvalidConfigError(f"set {prefix}sasl.jaas.config or {prefix}sasl.username/password, not both")
        try:
            out["sasl_plain_username"], out["sasl_plain_password"] = jaas_credentials(
                str(jaas), out.get("sasl_mechanism")
            )
        except InvalidConfigError as exc:
            raise InvalidConfigError(prefix + exc.message) from None
    return out


# --- SASL login ------------------------------------------------------------------------

Call = Callable[[str, Any], Any]
"""(method, request) -> response of one broker; raises mapped KafkaErrors."""


class SaslSessionExpiredError(SaslAuthenticationFailedError):
    """The broker no longer accepts this client's session token (UNAUTHENTICATED with
    SASL_AUTHENTICATION_FAILED, 58): it expired, was revoked, the broker restarted, or the
    channel reconnected (a token is valid on the connection that logged in only).
    Retriable: the next call logs in again (and raises SaslAuthenticationFailedError if
    that login is refused)."""

    retriable = True


def _check(resp: Any) -> None:
    if resp.error_code:
        raise for_code(int(resp.error_code))(resp.error_message)


def sasl_login(call: Call, config: SecurityConfig) -> tuple[str, int]:
    """Authenticate with ``config``'s mechanism and credentials; (session token, lifetime ms).

    Raises SaslAuthenticationFailedError (58), UnsupportedSaslMechanismError (33),
    IllegalSaslStateError (34) with the broker's message, or a connection error.
    """
    mechanism = config.sasl_mechanism or ""
    username, password = config.sasl_plain_username or "", config.sasl_plain_password or ""
    _check(call("SaslHandshake", security_pb2.SaslHandshakeRequest(mechanism=mechanism)))
    if mechanism == PLAIN:
        auth = b"\0" + username.encode() + b"\0" + password.encode()
        resp = call("SaslAuthenticate", security_pb2.SaslAuthenticateRequest(mechanism=mechanism, auth_bytes=auth))
        _check(resp)
    else:
        client = _ScramClient(ScramMechanism(mechanism), username, password)
        first = call(
            "SaslAuthenticate",
            security_pb2.SaslAuthenticateRequest(mechanism=mechanism, auth_bytes=client.first_message()),
        )
        _check(first)
        try:
            final = client.final_message(first.auth_bytes)
        except ScramError as exc:
            raise SaslAuthenticationFailedError(f"SASL {mechanism} with the broker failed: {exc}") from None
        resp = call(
            "SaslAuthenticate",
            security_pb2.SaslAuthenticateRequest(mechanism=mechanism, auth_bytes=final, exchange_id=first.exchange_id),
        )
        _check(resp)
        try:
            client.verify_server_final(resp.auth_bytes)
        except ScramError as exc:
            raise SaslAuthenticationFailedError(
                f"SASL {mechanism}: the broker did not prove it knows the credential of user {username!r}: {exc}"
            ) from None
    if not resp.session_token:
        raise IllegalSaslStateError(f"SASL {mechanism}: the broker completed the exchange without a session token")
    return resp.session_token, int(resp.session_lifetime_ms)


class BrokerSession:
    """The SASL session with one broker: its token, renewed before it expires.

    ``login`` authenticates (e.g. ``lambda: sasl_login(call, config)``). :meth:`token`
    logs in when there is no token or 90% of its lifetime has passed (a lifetime of 0
    never expires). ``logins`` counts the successful logins.

    Thread-safe: one lock; a login holds it, so concurrent callers wait for that one.
    """

    def __init__(
        self, address: str, login: Callable[[], tuple[str, int]], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.address = address
        self._login = login
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._renew_at = 0.0
        self.logins = 0

    def token(self) -> str:
        with self._lock:
            now = self._clock()
            if self._token is None or now >= self._renew_at:
                token, lifetime_ms = self._login()
                self._token = token
                self._renew_at = float("inf") if lifetime_ms <= 0 else now + REAUTH_FRACTION * lifetime_ms / 1000.0
                self.logins += 1
                log.debug("SASL session with %s: lifetime %d ms", self.address, lifetime_ms)
            return self._token

    def invalidate(self, token: str) -> None:
        """``token`` was refused: the next :meth:`token` logs in (unless another did already)."""
        with self._lock:
            if self._token == token:
                self._token = None


class LocalCallError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A call that failed in the client before reaching the broker (a refused login):
    raised from the channel like a gRPC error; ``map_rpc_error`` returns ``error``."""

    def __init__(self, error: KafkaError) -> None:
        super().__init__()
        self.error = error

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAUTHENTICATED

    def details(self) -> str:
        return self.error.message

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        code = getattr(self.error, "errno", None)
        return ((ERROR_CODE_METADATA_KEY, str(code)),) if code else ()

    def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    def __str__(self) -> str:
        return str(self.error)


class _CallDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


class _ClientCallDetails(_CallDetails, grpc.ClientCallDetails):  # type: ignore[misc]
    pass


def session_expired(call: Any) -> bool:
    """Did the broker refuse the call's session token (UNAUTHENTICATED, code 58 or none)?"""
    try:
        if call.code() != grpc.StatusCode.UNAUTHENTICATED:
            return False
        raw = dict(call.trailing_metadata() or ()).get(ERROR_CODE_METADATA_KEY)
    except Exception:  # a cancelled or odd outcome: not a session answer
        return False
    return raw is None or str(raw) == str(SaslAuthenticationFailedError.errno)


class SessionInterceptor(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Sends one broker's session token with every call made on the channel.

    A refused login raises :class:`LocalCallError` (a blocking call raises it, a future
    fails with it). An answer UNAUTHENTICATED invalidates the token; when the answer is
    already there (a blocking call) the call is made once more after a new login.
    """

    def __init__(self, session: BrokerSession) -> None:
        self.session = session

    def _token(self) -> str:
        try:
            return self.session.token()
        except KafkaError as exc:
            raise LocalCallError(exc) from None

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        token = self._token()
        outcome = continuation(self._with(details, token), request)
        if outcome.done():
            if not session_expired(outcome):
                return outcome
            self.session.invalidate(token)
            log.info("SASL session with %s was refused; logging in again", self.session.address)
            return continuation(self._with(details, self._token()), request)
        outcome.add_done_callback(lambda f: self._settled(f, token))
        return outcome

    def _settled(self, call: Any, token: str) -> None:
        if session_expired(call):
            self.session.invalidate(token)

    @staticmethod
    def _with(details: Any, token: str) -> _ClientCallDetails:
        metadata = [*(details.metadata or ()), (SESSION_METADATA_KEY, token)]
        return _ClientCallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )
