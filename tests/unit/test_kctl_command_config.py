"""kctl --command-config: the Java properties reader and the mapping of Java
client property names to kclient's security settings, as every kctl client gets them."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from kbroker.cli.common import UsageError, client_configs, client_settings, read_properties
from kbroker.cli.main import build_parser, main
from kbroker.security import certs

JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="p=w;d";'


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> certs.IssuedCert:
    root = tmp_path_factory.mktemp("ca")
    return certs.issue(certs.make_ca(root), root, "client")


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return str(path)


def test_read_properties_java_syntax(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "# a comment\n"
        "! another\n"
        "\n"
        "security.protocol=SASL_SSL\n"
        "  sasl.mechanism : SCRAM-SHA-512\n"
        "ssl.truststore.location /etc/ca.pem\n"
        f"sasl.jaas.config={JAAS[:40]}\\\n"
        f"    {JAAS[40:]}\n"
        "key\\=with\\:escapes=tab\\there\n"
        "empty=\n",
    )
    assert read_properties(path) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "ssl.truststore.location": "/etc/ca.pem",
        "sasl.jaas.config": JAAS,
        "key=with:escapes": "tab\there",
        "empty": "",
    }


def test_read_properties_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"cannot read --command-config .*nope\.properties: No such file"):
        read_properties(str(tmp_path / "nope.properties"))


def test_sasl_ssl_properties_map_to_kafka_python_names(pem: certs.IssuedCert) -> None:
    props = {
        "security.protocol": "SASL_SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(pem.ca_path),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(pem.keystore_path),
        "ssl.endpoint.identification.algorithm": "",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": JAAS,
    }
    assert client_settings(props, "f") == {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(pem.ca_path),
        "ssl_certfile": str(pem.keystore_path),
        "ssl_check_hostname": False,
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "admin",
        "sasl_plain_password": "p=w;d",
    }
    assert client_settings({}, "f") == {}


@pytest.mark.parametrize(
    ("props", "says"),
    [
        ({"security.protocol": "SASL_TLS"}, "security_protocol must be one of"),
        ({"security.protocol": "SSL", "ssl.truststore.type": "JKS"}, "only PEM"),
        ({"security.protocol": "SSL", "ssl.truststore.location": "/no/such/ca.pem"}, "cannot read /no/such/ca.pem"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256"}, "needs sasl_plain_username"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.jaas.config": "x y;"}, "jaas"),
        ({"ssl.keystore.key": "-----BEGIN PRIVATE KEY-----"}, "inline PEM"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_file(props: dict[str, str], says: str) -> None:
    with pytest.raises(UsageError) as err:
        client_settings(props, "--command-config f.properties")
    assert str(err.value).startswith("--command-config f.properties: ")
    assert says in str(err.value)


def test_the_password_is_never_in_an_error() -> None:
    props = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config": JAAS + " junk"}
    with pytest.raises(UsageError) as err:
        client_settings(props, "f")
    assert "p=w;d" not in str(err.value)


def test_unknown_keys_are_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="kbroker.cli"):
        assert client_settings({"request.timeout.ms": "5000", "security.protocol": "PLAINTEXT"}, "f") == {
            "security_protocol": "PLAINTEXT"
        }
    assert "the configuration 'request.timeout.ms' was supplied but isn't a known config" in caplog.text


@pytest.mark.parametrize(
    "argv",
    [
        ["--command-config", "{f}", "topics", "list", "--bootstrap-server", "127.0.0.1:1"],
        ["topics", "list", "--bootstrap-server", "127.0.0.1:1", "--command-config", "{f}"],
        ["users", "list", "--bootstrap-server", "127.0.0.1:1", "--command-config", "{f}"],
        ["produce", "--topic", "t", "--bootstrap-server", "127.0.0.1:1", "--command-config", "{f}"],
        ["acls", "--list", "--bootstrap-server", "127.0.0.1:1", "--command-config", "{f}"],
    ],
)
def test_command_config_before_the_noun_or_after_the_verb(tmp_path: Path, argv: list[str]) -> None:
    path = write(tmp_path, "security.protocol=SSL\nssl.truststore.location=/no/such/ca.pem\n")
    args = build_parser().parse_args([a.replace("{f}", path) for a in argv])
    assert args.command_config == path
    with pytest.raises(UsageError, match=r"ssl_cafile: cannot read /no/such/ca\.pem"):
        client_configs(args)


def test_a_bad_command_config_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.properties")
    assert main(["topics", "list", "--bootstrap-server", "127.0.0.1:1", "--command-config", missing]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"kctl: cannot read --command-config {missing}")


def test_client_configs_reads_the_file_once(tmp_path: Path) -> None:
    path = write(tmp_path, "security.protocol=PLAINTEXT\n")
    args = argparse.Namespace(command_config=path)
    assert client_configs(args) == {"security_protocol": "PLAINTEXT"}
    Path(path).unlink()
    assert client_configs(args) == {"security_protocol": "PLAINTEXT"}
    assert client_configs(argparse.Namespace()) == {}
