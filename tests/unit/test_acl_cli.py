"""``kctl acls``: parsing, kafka-acls.sh's output and refusals, over an in-memory backend."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kbroker.cli import acls as acls_cli
from kbroker.cli.common import UsageError
from kbroker.cli.main import build_parser, main
from kbroker.cluster.acl_store import AclDeleteResult
from kbroker.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    ResourcePattern,
    bindings_matching,
)
from kclient.errors import KafkaError


class MemoryBackend:
    """ACLs in a dict, with the store's filter semantics."""

    def __init__(self) -> None:
        self.acls: dict[ResourcePattern, frozenset[AccessControlEntry]] = {}
        self.writes = 0

    def create_acls(self, bindings: Sequence[AclBinding]) -> list[KafkaError | None]:
        self.writes += 1
        for b in bindings:
            self.acls[b.pattern] = self.acls.get(b.pattern, frozenset()) | {b.entry}
        return [None] * len(bindings)

    def describe_acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        return bindings_matching(self.acls, acl_filter)

    def delete_acls(self, filters: Sequence[AclBindingFilter]) -> list[AclDeleteResult]:
        self.writes += 1
        out = []
        for f in filters:
            gone = bindings_matching(self.acls, f)
            for b in gone:
                self.acls[b.pattern] -= {b.entry}
                if not self.acls[b.pattern]:
                    del self.acls[b.pattern]
            out.append(AclDeleteResult(gone))
        return out


def run(backend: MemoryBackend, line: str, *, confirm: bool | None = None) -> str:
    args = build_parser().parse_args(["acls", *line.split(), "--zookeeper", "127.0.0.1:1"])
    command = acls_cli.parse_command(args)
    printed: list[str] = []
    acls_cli.execute(command, backend, out=printed.append, confirm=None if confirm is None else (lambda _q: confirm))
    return "\n".join(printed) + ("\n" if printed else "")


TOPIC_T = "ResourcePattern(resourceType=TOPIC, name=t, patternType=LITERAL)"


def test_add_prints_as_kafka_acls_sh_then_lists() -> None:
    backend = MemoryBackend()
    out = run(backend, "--add --allow-principal User:alice --operation Read --operation Describe --topic t")
    assert out == (
        f"Adding ACLs for resource `{TOPIC_T}`: \n"
        " \t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)\n"
        "\t(principal=User:alice, host=*, operation=DESCRIBE, permissionType=ALLOW) \n"
        "\n"
        f"Current ACLs for resource `{TOPIC_T}`: \n"
        " \t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)\n"
        "\t(principal=User:alice, host=*, operation=DESCRIBE, permissionType=ALLOW) \n"
        "\n"
    )
    # The verb form, deny entries with hosts, a prefixed pattern.
    run(backend, "add --deny-principal User:bob --deny-host 10.0.0.9 --operation write --topic t-")
    run(backend, "add --allow-principal User:carol --topic orders- --resource-pattern-type prefixed")
    listing = run(backend, "--list")
    assert "(principal=User:bob, host=10.0.0.9, operation=WRITE, permissionType=DENY)" in listing
    assert "ResourcePattern(resourceType=TOPIC, name=orders-, patternType=PREFIXED)" in listing
    assert "(principal=User:carol, host=*, operation=ALL, permissionType=ALLOW)" in listing  # All by default
    # MATCH lists every pattern that applies to a topic name.
    assert run(backend, "--list --topic orders-eu --resource-pattern-type match").count("Current ACLs") == 1
    only_alice = run(backend, "--list --principal User:alice")
    assert only_alice.startswith("ACLs for principal `User:alice`\n") and "carol" not in only_alice


def test_producer_and_consumer_roles() -> None:
    backend = MemoryBackend()
    run(backend, "--add --producer --idempotent --allow-principal User:p --topic t")
    ops = {(b.pattern.resource_type.name, b.entry.operation.name) for b in backend.describe_acls(AclBindingFilter.ANY)}
    assert ops == {("TOPIC", "WRITE"), ("TOPIC", "DESCRIBE"), ("TOPIC", "CREATE"), ("CLUSTER", "IDEMPOTENT_WRITE")}
    backend = MemoryBackend()
    run(backend, "--add --consumer --allow-principal User:c --topic t --group g")
    ops = {(b.pattern.resource_type.name, b.entry.operation.name) for b in backend.describe_acls(AclBindingFilter.ANY)}
    assert ops == {("TOPIC", "READ"), ("TOPIC", "DESCRIBE"), ("GROUP", "READ")}


def test_remove_selected_or_all_and_confirmation() -> None:
    backend = MemoryBackend()
    run(backend, "--add --allow-principal User:a --allow-principal User:b --operation Read --topic t")
    run(backend, "--remove --force --allow-principal User:a --operation Read --topic t")
    assert [b.entry.principal for b in backend.describe_acls(AclBindingFilter.ANY)] == ["User:b"]
    writes = backend.writes
    run(backend, "--remove --topic t", confirm=False)  # answered "n"
    assert backend.writes == writes and len(backend.acls) == 1
    run(backend, "--remove --topic t", confirm=True)
    assert backend.acls == {}


@pytest.mark.parametrize(
    ("line", "mentions"),
    [
        ("--topic t", "exactly one action"),
        ("--add --list --topic t", "exactly one action"),
        ("add --remove --topic t", "exactly one action"),
        ("--add --allow-principal alice --topic t", "TYPE:NAME"),
        ("--add --allow-principal User:a --operation Raed --topic t", "'Raed' is not an operation"),
        ("--add --allow-principal User:a --operation Write --group g", "GROUP only supports operations READ"),
        ("--add --allow-principal User:a --topic t --resource-pattern-type match", "not valid when adding"),
        ("--add --allow-principal User:a --topic t --resource-pattern-type regex", "literal, prefixed, any or match"),
        ("--add --allow-principal User:a --cluster --resource-pattern-type prefixed", "kafka-cluster"),
        ("--add --allow-principal User:a --topic a/b", "invalid resource name"),
        ("--add --operation Read --topic t", "--allow-principal, --deny-principal"),
        ("--add --allow-principal User:a", "at least one resource"),
        ("--add --producer --allow-principal User:a --group g", "With --producer you must specify a --topic"),
        ("--add --consumer --allow-principal User:a --topic t", "With --consumer"),
        ("--add --producer --operation Read --allow-principal User:a --topic t", "set the operations"),
        ("--list --allow-principal User:a", "does not apply to --list"),
        ("--remove --principal User:a --topic t", "--list only"),
        ("--add --allow-principal User:a --topic t --authorizer-properties x=y", "only zookeeper.connect"),
    ],
)
def test_bad_input_is_one_line_and_nothing_is_written(
    line: str, mentions: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Port 1 answers nobody: a command that got as far as connecting would fail differently (exit 1).
    code = main(["acls", *line.split(), "--zookeeper", "127.0.0.1:1"])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1 and captured.err.startswith("kctl: ")
    assert mentions in captured.err


def test_remove_without_force_off_a_terminal_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["acls", "--remove", "--topic", "t", "--zookeeper", "127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2 and "--force" in err and len(err.splitlines()) == 1


def test_parse_is_pure_and_checks_everything_before_any_backend() -> None:
    args = build_parser().parse_args(
        ["acls", "--add", "--allow-principal", "User:a", "--cluster", "--operation", "Read"]
    )
    with pytest.raises(UsageError, match="CLUSTER only supports"):
        acls_cli.parse_command(args)
    args = build_parser().parse_args(["acls", "--add", "--allow-principal", "User:a", "--cluster"])
    command = acls_cli.parse_command(args)
    assert [str(f) for f in command.filters] == [
        "ResourcePatternFilter(resourceType=CLUSTER, name=kafka-cluster, patternType=LITERAL)"
    ]
    assert {e.operation for e in command.changes[command.filters[0]]} == {AclOperation.ALL}
