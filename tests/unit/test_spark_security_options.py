"""The Spark source and sink pass kafka.security.protocol, kafka.ssl.* and
kafka.sasl.* through to every kclient client they make (option parsing only)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from kclient.spark.errors import KbrokerOptionError
from kclient.spark.options import parse_sink_options, parse_source_options

JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="s3cret";'


@pytest.fixture
def ca(tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    return str(path)


def secure(ca: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": "localhost:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": ca,
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": JAAS,
    }


EXPECTED = {
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_plain_username": "alice",
    "sasl_plain_password": "s3cret",
}


def test_source_passes_security_to_consumer_and_admin(ca: str) -> None:
    opts = parse_source_options({**secure(ca), "subscribe": "t"}, streaming=True)
    expected = {**EXPECTED, "ssl_cafile": ca}
    assert expected.items() <= opts.consumer_config().items()
    assert expected.items() <= opts.admin_config().items()


def test_sink_passes_security_to_producer_and_admin(ca: str) -> None:
    opts = parse_sink_options({**secure(ca), "topic": "t", "kafka.acks": "1"})
    expected = {**EXPECTED, "ssl_cafile": ca}
    assert expected.items() <= opts.producer_config().items()
    assert opts.producer_config()["acks"] == 1
    assert expected.items() <= opts.admin_config().items()


@pytest.mark.parametrize(
    ("extra", "mentions"),
    [
        ({"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN"}, "PlainLoginModule"),
        (
            {
                "kafka.security.protocol": "SASL_PLAINTEXT",
                "kafka.sasl.mechanism": "PLAIN",
                "kafka.sasl.jaas.config": JAAS.replace("scram.ScramLoginModule", "plain.PlainLoginModule"),
            },
            "refused over SASL_PLAINTEXT",
        ),
        ({"kafka.ssl.truststore.type": "JKS"}, "only PEM"),
        ({"kafka.ssl.truststore.location": "/nonexistent/ca.pem"}, "cannot read /nonexistent/ca.pem"),
        ({"kafka.sasl.jaas.config": JAAS.rstrip(";")}, "ending with one ';'"),
        ({"kafka.ssl.truststore.password": "x"}, "kafka.ssl.truststore.location"),
    ],
)
def test_bad_security_options_are_one_line(ca: str, extra: dict[str, str], mentions: str) -> None:
    with pytest.raises(KbrokerOptionError) as info:
        parse_sink_options({**secure(ca), "topic": "t", **extra})
    message = str(info.value)
    assert mentions in message and "\n" not in message and message.startswith("kbroker:")
    assert "s3cret" not in message


def test_no_security_options_means_plaintext() -> None:
    opts = parse_sink_options({"bootstrap.servers": "localhost:9092", "topic": "t"})
    assert opts.security_settings == {}
    assert "security_protocol" not in opts.producer_config()
