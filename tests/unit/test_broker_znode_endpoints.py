"""The broker znode's endpoints (Kafka's v4 ``endpoints`` and
``listener_security_protocol_map``) and old znodes."""

from __future__ import annotations

import json

import pytest

from kbroker.cluster import zkdata
from kbroker.security.listeners import EndPoint


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
