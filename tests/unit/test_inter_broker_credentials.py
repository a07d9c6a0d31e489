"""Broker settings for authenticating as a broker: the inter-broker SASL user (Kafka's
``listener.name.<l>.<mechanism>.sasl.jaas.config`` / ``sasl.jaas.config``) and the
ZooKeeper digest credential (``zookeeper.auth.digest``)."""

from __future__ import annotations

import re

import pytest

from kbroker.config import build_config, with_overrides
from kbroker.security.listeners import split_listener_key
from kclient.errors import InvalidConfigError

BASE = {"broker.id": "1", "zookeeper.connect": "127.0.0.1:2181", "log.dirs": "/tmp/kb-listeners"}
SASL = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "inter.broker.listener.name": "SASL_PLAINTEXT"}
JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="{}" password="{}";'


def test_per_mechanism_jaas_keys_split_into_listener_and_key() -> None:
    assert split_listener_key("listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config") == (
        "SASL_SSL",
        "scram-sha-512.sasl.jaas.config",
    )
    assert split_listener_key("listener.name.sasl_ssl.sasl.jaas.config") == ("SASL_SSL", "sasl.jaas.config")


def test_the_inter_broker_user_comes_from_the_most_specific_jaas_key() -> None:
    cfg = build_config(
        {
            **BASE,
            **SASL,
            "sasl.jaas.config": JAAS.format("general", "g"),
            "listener.name.sasl_plaintext.sasl.jaas.config": JAAS.format("listener", "l"),
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": JAAS.format("broker", "b"),
        }
    )
    assert cfg.inter_broker_sasl_credentials() == ("broker", "b")
    cfg = build_config({**BASE, **SASL, "sasl.jaas.config": JAAS.format("general", "g")})
    assert cfg.inter_broker_sasl_credentials() == ("general", "g")
    assert build_config(BASE).inter_broker_sasl_credentials() is None
    assert "password" not in repr(cfg) and '"g"' not in repr(cfg)


def test_a_sasl_inter_broker_listener_needs_the_brokers_user() -> None:
    key = "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config"
    with pytest.raises(InvalidConfigError, match=re.escape(key)):
        build_config({**BASE, **SASL})


def test_a_malformed_jaas_value_is_refused_without_quoting_it() -> None:
    with pytest.raises(InvalidConfigError) as info:
        build_config({**BASE, "sasl.jaas.config": 'Module required password="hunter2"'})
    assert "hunter2" not in str(info.value)


def test_zookeeper_auth_digest_is_checked_static_and_hidden() -> None:
    cfg = build_config({**BASE, "zookeeper.auth.digest": "kafka:s3cret"})
    assert cfg.zookeeper_auth_digest == "kafka:s3cret"
    assert "s3cret" not in repr(cfg)
    with pytest.raises(InvalidConfigError, match=re.escape("zookeeper.auth.digest")):
        build_config({**BASE, "zookeeper.auth.digest": "no-colon"})
    with pytest.raises(InvalidConfigError, match="cannot be changed on a running broker"):
        with_overrides(cfg, {"zookeeper.auth.digest": "kafka:other"})
