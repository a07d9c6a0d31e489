"""Listeners: ``listeners``, ``advertised.listeners``, ``listener.security.protocol.map``
and ``inter.broker.listener.name``, parsed and checked as Kafka's ``KafkaConfig`` does.

A listener is a named endpoint ``NAME://host:port`` (Kafka's ``EndPoint``); its security
protocol comes from ``listener.security.protocol.map`` (default: every protocol is a
listener of its own name). Names are upper-cased (Kafka's ``ListenerName.normalised``).
An empty host binds every interface and is advertised as this machine's name; port 0
binds a free port, which the broker then advertises (:func:`with_bound_ports`).

Per-listener settings are Kafka's prefixed keys ``listener.name.<lower name>.<key>``
(for the ``ssl.*`` keys and ``sasl.enabled.mechanisms``); :func:`listener_config`
gives a listener's value of a key, the prefixed one winning over the plain one.

Every error is an :class:`InvalidConfigError` worded as Kafka words it.
Thread safety: pure functions and immutable values.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from kclient.errors import InvalidConfigError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

DEFAULT_PROTOCOL_MAP = "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"
"""Kafka's default ``listener.security.protocol.map``."""

LISTENER_PREFIX = "listener.name."

PER_LISTENER_KEYS = (
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.keystore.certificate.chain",
    "ssl.keystore.key",
    "ssl.key.password",
    "ssl.truststore.type",
    "ssl.truststore.location",
    "ssl.truststore.certificates",
    "ssl.client.auth",
    "sasl.enabled.mechanisms",
    "sasl.jaas.config",
)
"""Keys that may be set per listener as ``listener.name.<name>.<key>`` (``sasl.jaas.config``
also per mechanism: ``listener.name.<name>.<mechanism>.sasl.jaas.config``, Kafka's form)."""

_URI = re.compile(r"^(.*)://\[?([0-9a-zA-Z\-%._:]*)\]?:(-?[0-9]+)$")  # Kafka's uriParseExp


@dataclass(frozen=True)
class EndPoint:
    """One listener: ``NAME://host:port`` with its security protocol.

    ``host`` is ``""`` for "every interface" (Kafka's null host).
    """

    listener_name: str
    host: str
    port: int
    security_protocol: str

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def bind_host(self) -> str:
        """The host to bind: ``0.0.0.0`` for an empty host."""
        return self.host or "0.0.0.0"

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def connection_string(self) -> str:
        """``NAME://host:port`` as in ``listeners`` and the broker znode's ``endpoints``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.listener_name}://{host}:{self.port}"


def normalised(name: str) -> str:
    """Kafka's ``ListenerName.normalised``: names are case-insensitive, kept upper-case."""
    return name.strip().upper()


def security_protocol(name: str, key: str) -> str:
    """A security protocol name, checked (Kafka's ``getSecurityProtocol``)."""
    protocol = name.strip().upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise InvalidConfigError(f"Invalid security protocol `{name.strip()}` defined in {key}")
    return protocol


def parse_protocol_map(value: str, key: str = "listener.security.protocol.map") -> dict[str, str]:
    """``"CLIENT:SSL,REPLICATION:PLAINTEXT"`` -> ``{"CLIENT": "SSL", "REPLICATION": "PLAINTEXT"}``."""
    out: dict[str, str] = {}
    for item in _csv(value):
        name, sep, protocol = item.rpartition(":")
        if not sep or not name.strip():
            raise InvalidConfigError(
                f"Error parsing configuration property '{key}': {item!r} is not LISTENER_NAME:SECURITY_PROTOCOL"
            )
        listener = normalised(name)
        if listener in out:
            raise InvalidConfigError(f"Error parsing configuration property '{key}': duplicate listener {listener}")
        out[listener] = security_protocol(protocol, key)
    return out


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def create_end_point(text: str, protocol_map: Mapping[str, str]) -> EndPoint:
    """One ``NAME://host:port`` (Kafka's ``EndPoint.createEndPoint``)."""
    match = _URI.match(text.strip())
    if match is None:
        raise InvalidConfigError(f"Unable to parse {text.strip()} to a broker endpoint")
    name = normalised(match.group(1))
    if name not in protocol_map:
        raise InvalidConfigError(f"No security protocol defined for listener {name}")
    port = int(match.group(3))
    if not 0 <= port <= 65535:
        raise InvalidConfigError(f"Unable to parse {text.strip()} to a broker endpoint: port {port} out of range")
    return EndPoint(name, match.group(2), port, protocol_map[name])


def parse_listeners(
    value: str, protocol_map: Mapping[str, str], *, key: str = "listeners", distinct_ports: bool = True
) -> tuple[EndPoint, ...]:
    """A ``listeners`` list (Kafka's ``CoreUtils.listenerListToEndPoints``).

    Names must differ; ports other than 0 must differ too when ``distinct_ports`` (the
    bound listeners; ``advertised.listeners`` may share a port, behind a proxy).
    """
    try:
        endpoints = tuple(create_end_point(item, protocol_map) for item in _csv(value))
    except InvalidConfigError as exc:
        raise InvalidConfigError(f"Error creating broker listeners from '{value}': {exc.message}") from None
    if not endpoints:
        raise InvalidConfigError(f"{key}: no listener in {value!r}")
    names = [e.listener_name for e in endpoints]
    if len(set(names)) != len(names):
        raise InvalidConfigError(f"Each listener must have a different name, listeners: {value}")
    ports = [e.port for e in endpoints if e.port != 0]
    if distinct_ports and len(set(ports)) != len(ports):
        raise InvalidConfigError(f"Each listener must have a different port, listeners: {value}")
    return endpoints


@dataclass(frozen=True)
class ListenerConfig:
    """The checked listener settings of a broker.

    Invariants: ``listeners`` is not empty and has distinct names (and non-zero ports);
    every advertised listener's name is a listener's name and its host is not
    ``0.0.0.0``; ``inter_broker_listener_name`` names an advertised listener.
    """

    listeners: tuple[EndPoint, ...]
    advertised_listeners: tuple[EndPoint, ...]
    inter_broker_listener_name: str
    protocol_map: Mapping[str, str]

    def listener(self, name: str) -> EndPoint | None:
        return _find(self.listeners, name)

    def advertised(self, name: str) -> EndPoint | None:
        return _find(self.advertised_listeners, name)

    @property
    def inter_broker(self) -> EndPoint:
        """The bound inter-broker listener."""
        found = self.listener(self.inter_broker_listener_name)
        assert found is not None  # an invariant
        return found

    @property
    def inter_broker_protocol(self) -> str:
        return self.protocol_map[self.inter_broker_listener_name]


def _find(endpoints: Iterable[EndPoint], name: str) -> EndPoint | None:
    want = normalised(name)
    return next((e for e in endpoints if e.listener_name == want), None)


def build_listener_config(
    listeners: str,
    advertised_listeners: str | None = None,
    protocol_map: str | None = None,
    inter_broker_listener_name: str | None = None,
    inter_broker_security_protocol: str | None = None,
) -> ListenerConfig:
    """Check the listener keys together, as ``KafkaConfig.validateValues`` does.

    ``None`` means the key is not set. ``advertised.listeners`` defaults to
    ``listeners``; the inter-broker listener is ``inter.broker.listener.name`` or else
    the listener named after ``security.inter.broker.protocol`` (default PLAINTEXT);
    setting both is an error.
    """
    pmap = parse_protocol_map(protocol_map if protocol_map is not None else DEFAULT_PROTOCOL_MAP)
    bound = parse_listeners(listeners, pmap)
    advertised = (
        bound
        if advertised_listeners is None
        else parse_listeners(advertised_listeners, pmap, key="advertised.listeners", distinct_ports=False)
    )
    if inter_broker_listener_name is not None and inter_broker_security_protocol is not None:
        raise InvalidConfigError(
            "Only one of inter.broker.listener.name and security.inter.broker.protocol should be set."
        )
    if inter_broker_listener_name is not None:
        inter = normalised(inter_broker_listener_name)
        if inter not in pmap:
            raise InvalidConfigError(
                f"Listener with name {inter} defined in inter.broker.listener.name not found in "
                "listener.security.protocol.map."
            )
    else:
        protocol = security_protocol(inter_broker_security_protocol or "PLAINTEXT", "security.inter.broker.protocol")
        inter = protocol  # ListenerName.forSecurityProtocol
    advertised_names = [e.listener_name for e in advertised]
    names = [e.listener_name for e in bound]
    if inter not in advertised_names:
        raise InvalidConfigError(
            "inter.broker.listener.name must be a listener name defined in advertised.listeners. "
            f"The valid options based on currently configured listeners are {','.join(advertised_names)}"
        )
    if not set(advertised_names) <= set(names):
        raise InvalidConfigError(
            "advertised.listeners listener names must be equal to or a subset of the ones defined in listeners. "
            f"Found {','.join(advertised_names)}. The valid options based on the current configuration are "
            f"{','.join(names)}"
        )
    if any(e.host == "0.0.0.0" for e in advertised):
        raise InvalidConfigError(
            "advertised.listeners cannot use the nonroutable meta-address 0.0.0.0. Use a routable IP address."
        )
    return ListenerConfig(bound, advertised, inter, pmap)


def listener_config(props: Mapping[str, str], listener: str, key: str) -> str | None:
    """``listener.name.<listener>.<key>`` if set, else ``key``, else ``None``.

    Kafka's per-listener override: the prefix uses the lower-cased listener name.
    """
    prefixed = props.get(f"{LISTENER_PREFIX}{listener.lower()}.{key}")
    return prefixed if prefixed is not None else props.get(key)


def split_listener_key(key: str) -> tuple[str, str] | None:
    """``"listener.name.ssl.ssl.client.auth"`` -> ``("SSL", "ssl.client.auth")``; ``None`` if
    ``key`` is not a per-listener key of :data:`PER_LISTENER_KEYS`."""
    if not key.startswith(LISTENER_PREFIX):
        return None
    rest = key[len(LISTENER_PREFIX) :]
    for inner in PER_LISTENER_KEYS:
        if rest.endswith("." + inner) and len(rest) > len(inner) + 1:
            listener = rest[: -len(inner) - 1]
            if inner == "sasl.jaas.config" and "." in listener:  # <listener>.<mechanism>.sasl.jaas.config
                listener, mechanism = listener.rsplit(".", 1)
                return normalised(listener), f"{mechanism.lower()}.{inner}"
            return normalised(listener), inner
    return None


def with_bound_ports(advertised: Iterable[EndPoint], bound: Mapping[str, int]) -> tuple[EndPoint, ...]:
    """The endpoints to register: port 0 replaced by the listener's bound port, and an
    empty host by this machine's fully qualified name (as KafkaServer does)."""
    out = []
    for e in advertised:
        if e.port == 0 and e.listener_name in bound:
            e = replace(e, port=bound[e.listener_name])
        if not e.host.strip():
            e = replace(e, host=socket.getfqdn())
        out.append(e)
    return tuple(out)
