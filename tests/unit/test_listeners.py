"""Listener parsing (Kafka's rules and messages), the security config keys, and the
broker znode's endpoints (Kafka's v4 ``endpoints`` and ``listener_security_protocol_map``,
and old znodes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kbroker.cluster import zkdata
from kbroker.config import build_config, load_properties, with_overrides
from kbroker.security.listeners import (
    EndPoint,
    build_listener_config,
    listener_config,
    parse_listeners,
    parse_protocol_map,
    split_listener_key,
    with_bound_ports,
)
from kclient.errors import InvalidConfigError

BASE = {"broker.id": "1", "zookeeper.connect": "127.0.0.1:2181", "log.dirs": "/tmp/kb-listeners"}
PMAP = parse_protocol_map("PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL")


def test_listeners_parse_as_kafka() -> None:
    eps = parse_listeners("PLAINTEXT://127.0.0.1:9092, ssl://broker1:9093,SASL_SSL://[::1]:9094", PMAP)
    assert eps == (
        EndPoint("PLAINTEXT", "127.0.0.1", 9092, "PLAINTEXT"),
        EndPoint("SSL", "broker1", 9093, "SSL"),
        EndPoint("SASL_SSL", "::1", 9094, "SASL_SSL"),
    )
    assert eps[2].connection_string() == "SASL_SSL://[::1]:9094" and eps[2].address == "[::1]:9094"
    every = parse_listeners("PLAINTEXT://:9092", PMAP)[0]
    assert (every.host, every.bind_host) == ("", "0.0.0.0")
    # port 0 (a free port) may repeat; other ports may not
    assert len(parse_listeners("PLAINTEXT://h:0,SSL://h:0", PMAP)) == 2


@pytest.mark.parametrize(
    ("listeners", "message"),
    [
        ("PLAINTEXT://h:9092,PLAINTEXT://h:9093", "Each listener must have a different name, listeners: "),
        ("PLAINTEXT://h:9092,SSL://h:9092", "Each listener must have a different port, listeners: "),
        ("CLIENT://h:9092", "No security protocol defined for listener CLIENT"),
        ("h:9092", "Unable to parse h:9092 to a broker endpoint"),
        ("PLAINTEXT://h:x", "Unable to parse PLAINTEXT://h:x to a broker endpoint"),
        ("PLAINTEXT://h:70000", "port 70000 out of range"),
    ],
)
def test_bad_listeners(listeners: str, message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message.replace("(", r"\(")) as info:
        parse_listeners(listeners, PMAP)
    if "Unable" in message or "No security" in message:
        assert info.value.message.startswith(f"Error creating broker listeners from '{listeners}': ")


def test_protocol_map_and_inter_broker_listener() -> None:
    cfg = build_listener_config(
        "CLIENT://0.0.0.0:9093,REPLICATION://10.0.0.1:9094",
        advertised_listeners="CLIENT://kafka.example.com:9093,REPLICATION://10.0.0.1:9094",
        protocol_map="client:SASL_SSL,REPLICATION:ssl",
        inter_broker_listener_name="replication",
    )
    assert cfg.inter_broker == EndPoint("REPLICATION", "10.0.0.1", 9094, "SSL")
    assert cfg.inter_broker_protocol == "SSL"
    assert cfg.advertised("client") == EndPoint("CLIENT", "kafka.example.com", 9093, "SASL_SSL")
    # security.inter.broker.protocol names the listener of the same name
    assert (
        build_listener_config("SSL://h:1,PLAINTEXT://h:2", inter_broker_security_protocol="SSL").inter_broker.port == 1
    )
    # the default is PLAINTEXT
    assert build_listener_config("SSL://h:1,PLAINTEXT://h:2").inter_broker_listener_name == "PLAINTEXT"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"inter_broker_listener_name": "PLAINTEXT", "inter_broker_security_protocol": "PLAINTEXT"},
            "Only one of inter.broker.listener.name and security.inter.broker.protocol should be set.",
        ),
        (
            {"inter_broker_listener_name": "OTHER"},
            "Listener with name OTHER defined in inter.broker.listener.name not found in "
            "listener.security.protocol.map.",
        ),
        (
            {"inter_broker_security_protocol": "TLS"},
            "Invalid security protocol `TLS` defined in security.inter.broker.protocol",
        ),
        (
            {"inter_broker_security_protocol": "SSL"},
            "inter.broker.listener.name must be a listener name defined in advertised.listeners. "
            "The valid options based on currently configured listeners are PLAINTEXT",
        ),
        (
            {"advertised_listeners": "PLAINTEXT://h:9092,SSL://h:9093"},
            "advertised.listeners listener names must be equal to or a subset of the ones defined in listeners. "
            "Found PLAINTEXT,SSL. The valid options based on the current configuration are PLAINTEXT",
        ),
        (
            {"advertised_listeners": "PLAINTEXT://0.0.0.0:9092"},
            "advertised.listeners cannot use the nonroutable meta-address 0.0.0.0. Use a routable IP address.",
        ),
        ({"protocol_map": "PLAINTEXT:PLAIN"}, "Invalid security protocol `PLAIN` defined in listener.security"),
        ({"protocol_map": "PLAINTEXT"}, "Error parsing configuration property 'listener.security.protocol.map'"),
    ],
)
def test_listener_config_errors(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError) as info:
        build_listener_config("PLAINTEXT://h:9092", **kwargs)
    assert message in info.value.message


def test_advertised_listeners_may_share_a_port_and_advertise_the_bound_port() -> None:
    cfg = build_listener_config(
        "PLAINTEXT://127.0.0.1:0,SSL://:0", advertised_listeners="PLAINTEXT://proxy:9092,SSL://proxy:9092"
    )
    assert [e.port for e in cfg.advertised_listeners] == [9092, 9092]
    bound = with_bound_ports(
        build_listener_config("PLAINTEXT://127.0.0.1:0,SSL://:0").advertised_listeners,
        {
            "PLAINTEXT": 41000,
            "SSL": 41001,
        },
    )
    assert bound[0] == EndPoint("PLAINTEXT", "127.0.0.1", 41000, "PLAINTEXT")
    assert bound[1].port == 41001 and bound[1].host  # an empty host is advertised as this machine's name


def test_per_listener_keys() -> None:
    props = {"ssl.client.auth": "none", "listener.name.internal.ssl.client.auth": "required"}
    assert listener_config(props, "INTERNAL", "ssl.client.auth") == "required"
    assert listener_config(props, "EXTERNAL", "ssl.client.auth") == "none"
    assert listener_config(props, "EXTERNAL", "ssl.keystore.location") is None
    assert split_listener_key("listener.name.ssl.ssl.client.auth") == ("SSL", "ssl.client.auth")
    assert split_listener_key("listener.name.sasl_ssl.sasl.enabled.mechanisms") == (
        "SASL_SSL",
        "sasl.enabled.mechanisms",
    )
    assert split_listener_key("listener.name.ssl.bogus") is None


# --- kbroker.config ------------------------------------------------------------------


def test_listen_shorthand_and_plain_listeners_keep_working() -> None:
    cfg = build_config({**BASE, "listen": "127.0.0.1:0"})
    assert cfg.listeners == (EndPoint("PLAINTEXT", "127.0.0.1", 0, "PLAINTEXT"),)
    assert (cfg.listen_host, cfg.listen_port, cfg.advertised) == ("127.0.0.1", 0, "127.0.0.1")
    cfg = build_config({**BASE, "listeners": "PLAINTEXT://10.1.2.3:9092"})
    assert (cfg.listen_host, cfg.listen_port, cfg.inter_broker_listener_name) == ("10.1.2.3", 9092, "PLAINTEXT")
    default = build_config(BASE)
    assert default.listeners == (EndPoint("PLAINTEXT", "127.0.0.1", 9092, "PLAINTEXT"),)
    assert default.advertised_listeners == default.listeners
    legacy = build_config({**BASE, "advertised.host.name": "b1.example.com"})
    assert legacy.advertised == "b1.example.com" and legacy.advertised_listeners[0].host == "b1.example.com"
    with pytest.raises(InvalidConfigError, match=r"listen .--listen. and listeners are both set"):
        build_config({**BASE, "listen": "127.0.0.1:0", "listeners": "PLAINTEXT://127.0.0.1:0"})


def test_several_listeners_in_broker_config(tmp_path: Path) -> None:
    ks, ts = str(tmp_path / "ks.pem"), str(tmp_path / "ca.pem")
    cfg = build_config(
        {
            **BASE,
            "listeners": "PLAINTEXT://127.0.0.1:9092,INTERNAL://127.0.0.1:9093,SASL_SSL://127.0.0.1:9094",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SSL,SASL_SSL:SASL_SSL",
            "inter.broker.listener.name": "INTERNAL",
            "ssl.keystore.type": "pem",
            "ssl.keystore.location": ks,
            "ssl.truststore.location": ts,
            "listener.name.internal.ssl.client.auth": "REQUIRED",
            "listener.name.sasl_ssl.sasl.enabled.mechanisms": "plain,SCRAM-SHA-512",
            "super.users": "User:CN=broker,OU=eng;User:admin",
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "zookeeper.set.acl": "true",
            "connections.max.reauth.ms": "60000",
        }
    )
    assert (cfg.listen_host, cfg.listen_port, cfg.inter_broker_listener_name) == ("127.0.0.1", 9093, "INTERNAL")
    assert cfg.listener("internal") == EndPoint("INTERNAL", "127.0.0.1", 9093, "SSL")
    assert cfg.ssl_client_auth("INTERNAL") == "required" and cfg.ssl_client_auth("SASL_SSL") == "none"
    assert cfg.listener_setting("SASL_SSL", "ssl.keystore.location") == ks
    assert cfg.sasl_enabled_mechanisms("SASL_SSL") == ("PLAIN", "SCRAM-SHA-512")
    assert cfg.sasl_enabled_mechanisms("PLAINTEXT") == ("SCRAM-SHA-256", "SCRAM-SHA-512")
    assert cfg.super_users == ("User:CN=broker,OU=eng", "User:admin")
    assert cfg.authorizer_enabled and cfg.zookeeper_set_acl and not cfg.allow_everyone_if_no_acl_found
    assert cfg.connections_max_reauth_ms == 60000
    secret = build_config({**BASE, "ssl.key.password": "hunter2", "ssl.keystore.key": "-----BEGIN PRIVATE KEY--"})
    assert "hunter2" not in repr(secret) and "PRIVATE" not in repr(secret)
    defaults = build_config(BASE)
    assert not defaults.authorizer_enabled and defaults.super_users == () and not defaults.zookeeper_set_acl
    assert defaults.connections_max_reauth_ms == 3_600_000
    assert defaults.sasl_mechanism_inter_broker_protocol == "SCRAM-SHA-512"
    with pytest.raises(InvalidConfigError, match=r"connections\.max\.reauth\.ms: 0 is below the minimum 1"):
        build_config({**BASE, "connections.max.reauth.ms": "0"})  # a session of no length


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"listeners": "SSL://h:1", "security.inter.broker.protocol": "SSL"}, "listener SSL .SSL. needs a key store"),
        (
            {
                "listeners": "SSL://h:1",
                "security.inter.broker.protocol": "SSL",
                "ssl.keystore.location": "/k",
                "ssl.keystore.key": "x",
            },
            "not both",
        ),
        (
            {
                "listeners": "SSL://h:1",
                "security.inter.broker.protocol": "SSL",
                "ssl.keystore.location": "/k",
                "ssl.client.auth": "required",
            },
            "ssl.client.auth=required needs ssl.truststore.location",
        ),
        ({"ssl.client.auth": "always"}, "Invalid value always for configuration ssl.client.auth: String must be one"),
        ({"ssl.keystore.type": "JKS"}, "ssl.keystore.type: 'JKS' is not supported; kbroker reads PEM only"),
        ({"sasl.enabled.mechanisms": "GSSAPI"}, "SASL mechanism GSSAPI is not supported"),
        ({"super.users": "alice"}, "super.users: 'alice' is not a principal"),
        ({"authorizer.class.name": "com.example.Mine"}, "authorizer.class.name: 'com.example.Mine' is not supported"),
        ({"listener.name.ssl.ssl.client.auth": "required"}, "there is no listener SSL in listeners"),
        ({"listener.name.ssl.ssl.client.auth": "maybe"}, "Invalid value maybe for configuration ssl.client.auth"),
        (
            {
                "listeners": "SASL_PLAINTEXT://h:1",
                "security.inter.broker.protocol": "SASL_PLAINTEXT",
                "sasl.enabled.mechanisms": "SCRAM-SHA-256",
            },
            "sasl.mechanism.inter.broker.protocol must be included in sasl.enabled.mechanisms",
        ),
        ({"listeners": "PLAINTEXT://h:1,SSL://h:1"}, "Each listener must have a different port"),
    ],
)
def test_security_config_errors(props: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidConfigError, match=message):
        build_config({**BASE, **props})


def test_security_keys_are_static_only() -> None:
    cfg = build_config(BASE)
    for key, value in (("listeners", "PLAINTEXT://h:1"), ("ssl.client.auth", "required"), ("super.users", "User:a")):
        with pytest.raises(InvalidConfigError, match="cannot be changed on a running broker"):
            with_overrides(cfg, {key: value})


def test_properties_file_continuation_lines_carry_inline_pem(tmp_path: Path) -> None:
    f = tmp_path / "server.properties"
    f.write_text(
        "broker.id=1\n"
        "ssl.keystore.certificate.chain=-----BEGIN CERTIFICATE----- \\\n"
        "    MIIBxx \\\n"
        "    -----END CERTIFICATE-----\n"
        "odd=a\\\\\n"
        "num.partitions=2\n"
    )
    props = load_properties(f)
    assert props["ssl.keystore.certificate.chain"] == "-----BEGIN CERTIFICATE----- MIIBxx -----END CERTIFICATE-----"
    assert props["odd"] == "a\\\\" and props["num.partitions"] == "2"


def test_broker_znode_round_trips_several_endpoints() -> None:
    endpoints = (
        EndPoint("CLIENT", "kafka.example.com", 9093, "SASL_SSL"),
        EndPoint("REPLICATION", "10.0.0.1", 9094, "SSL"),
        EndPoint("PLAINTEXT", "::1", 9092, "PLAINTEXT"),
    )
    info = zkdata.BrokerInfo.of(3, endpoints, "replication", rack="r1")
    assert (info.host, info.port, info.address) == ("10.0.0.1", 9094, "10.0.0.1:9094")
    body = json.loads(zkdata.encode_broker(info))
    assert body["endpoints"] == [
        "CLIENT://kafka.example.com:9093",
        "REPLICATION://10.0.0.1:9094",
        "PLAINTEXT://[::1]:9092",
    ]
    assert body["listener_security_protocol_map"] == {
        "CLIENT": "SASL_SSL",
        "REPLICATION": "SSL",
        "PLAINTEXT": "PLAINTEXT",
    }
    assert body["version"] == 4 and body["rack"] == "r1"
    back = zkdata.decode_broker(3, zkdata.encode_broker(info), epoch=7)
    assert back.endpoints == endpoints and (back.host, back.port, back.epoch) == ("10.0.0.1", 9094, 7)
    assert back.endpoint("client") == endpoints[0] and back.endpoint("OTHER") is None
    with pytest.raises(ValueError):
        zkdata.BrokerInfo.of(3, endpoints, "missing")


def test_old_and_kafka_written_broker_znodes_decode() -> None:
    old = zkdata.decode_broker(1, b'{"version":1,"host":"10.0.0.5","port":9092,"jmx_port":-1}')
    assert old.endpoints == (EndPoint("PLAINTEXT", "10.0.0.5", 9092, "PLAINTEXT"),) and old.address == "10.0.0.5:9092"
    # Kafka writes host/port of its PLAINTEXT endpoint, null/-1 without one
    kafka = json.dumps(
        {
            "version": 4,
            "host": None,
            "port": -1,
            "jmx_port": -1,
            "timestamp": "1700000000000",
            "endpoints": ["INTERNAL://b1:9093", "EXTERNAL://b1.example.com:9094"],
            "listener_security_protocol_map": {"INTERNAL": "SSL", "EXTERNAL": "SASL_SSL"},
        }
    ).encode()
    info = zkdata.decode_broker(2, kafka)
    assert info.endpoints[1] == EndPoint("EXTERNAL", "b1.example.com", 9094, "SASL_SSL")
    assert (info.host, info.port, info.timestamp_ms) == ("b1", 9093, 1700000000000)
    # v2 had endpoints without the map: the protocol is the listener's name
    v2 = zkdata.decode_broker(2, b'{"version":2,"host":"h","port":1,"endpoints":["SSL://h:2","PLAINTEXT://h:1"]}')
    assert v2.endpoint("SSL") == EndPoint("SSL", "h", 2, "SSL")
    # built without endpoints: one PLAINTEXT endpoint, equal to its decoded self
    plain = zkdata.BrokerInfo(4, "127.0.0.1", 9092, "r1", 123)
    assert zkdata.decode_broker(4, zkdata.encode_broker(plain)) == plain
