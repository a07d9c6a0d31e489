"""kctl's --bootstrap-server backends for ACLs and SCRAM users, against fake
admin clients: kbroker's ACL model crosses to kclient's flat bindings and back
unchanged, and a user's "delete every credential" names what the user has."""

from __future__ import annotations

from typing import Any

import pytest

from kbroker.cli import acls, configs, users
from kbroker.cli.common import UsageError
from kbroker.cli.main import build_parser
from kbroker.security.acl import (
    AccessControlEntry,
    AccessControlEntryFilter,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from kclient import admin_security as client_acl
from kclient.errors import KafkaError, ResourceNotFoundError

BINDINGS = [
    AclBinding(
        ResourcePattern(ResourceType.TOPIC, "logs-", PatternType.PREFIXED),
        AccessControlEntry("User:p", "10.0.0.1", AclOperation.WRITE, AclPermissionType.DENY),
    ),
    AclBinding(
        ResourcePattern(ResourceType.CLUSTER, "kafka-cluster"),
        AccessControlEntry("User:*", "*", AclOperation.IDEMPOTENT_WRITE, AclPermissionType.ALLOW),
    ),
]


def test_acl_bindings_round_trip_through_kclient() -> None:
    for b in BINDINGS:
        assert acls.from_client_binding(acls.to_client_binding(b)) == b
    f = AclBindingFilter(
        ResourcePatternFilter(ResourceType.GROUP, None, PatternType.MATCH),
        AccessControlEntryFilter("User:a", None, AclOperation.ANY, AclPermissionType.ALLOW),
    )
    assert acls.to_client_filter(f) == client_acl.AclBindingFilter(
        client_acl.ResourceType.GROUP,
        None,
        client_acl.PatternType.MATCH,
        "User:a",
        None,
        client_acl.AclOperation.ANY,
        client_acl.AclPermissionType.ALLOW,
    )


class FakeAclAdmin:
    def __init__(self) -> None:
        self.stored: list[client_acl.AclBinding] = []

    def create_acls(self, bindings: list[client_acl.AclBinding]) -> list[KafkaError | None]:
        self.stored.extend(bindings)
        return [None] * len(bindings)

    def describe_acls(self, acl_filter: client_acl.AclBindingFilter) -> list[client_acl.AclBinding]:
        return list(self.stored)

    def delete_acls(
        self, filters: list[client_acl.AclBindingFilter]
    ) -> list[tuple[list[client_acl.AclBinding], KafkaError | None]]:
        gone, self.stored = self.stored, []
        return [(gone, None)] + [([], None)] * (len(filters) - 1)


def test_acl_backend_speaks_kbroker_types() -> None:
    backend = acls.AdminAclBackend(FakeAclAdmin())  # type: ignore[arg-type]
    assert backend.create_acls(BINDINGS) == [None, None]
    assert backend.describe_acls(AclBindingFilter()) == BINDINGS
    (result,) = backend.delete_acls([AclBindingFilter()])
    assert result.deleted == BINDINGS and result.error is None


class FakeUserAdmin:
    def __init__(self, held: dict[str, dict[str, int]]) -> None:
        self.held = held
        self.altered: list[tuple[list[Any], list[Any]]] = []

    def describe_user_scram_credentials(self, names: list[str] | None = None) -> dict[str, dict[str, int]]:
        if names:
            missing = [n for n in names if n not in self.held]
            if missing:
                raise ResourceNotFoundError(f"no credentials for {missing[0]}")
            return {n: self.held[n] for n in names}
        return dict(self.held)

    def alter_user_scram_credentials(self, upsertions: list[Any], deletions: list[Any]) -> dict[str, Any]:
        self.altered.append((list(upsertions), list(deletions)))
        return {"alice": None}

    def close(self) -> None:
        pass


def test_user_backend_deletes_what_the_user_has() -> None:
    admin = FakeUserAdmin({"alice": {"SCRAM-SHA-512": 4096}})
    backend = users.AdminUserBackend(admin)  # type: ignore[arg-type]
    backend.delete("alice", None)
    assert admin.altered == [([], [("alice", "SCRAM-SHA-512")])]
    backend.upsert("alice", {"SCRAM-SHA-256": ("pw", 8192)})
    assert admin.altered[-1] == ([("alice", "SCRAM-SHA-256", "pw", 8192)], [])
    with pytest.raises(ResourceNotFoundError):
        backend.delete("bob", None)


def test_configs_users_never_echoes_a_malformed_password() -> None:
    argv = ["configs", "--alter", "--entity-type", "users", "--entity-name", "alice", "--bootstrap-server", "h:1"]
    args = build_parser().parse_args([*argv, "--add-config", "SCRAM-SHA-256=password=se,cret"])
    with pytest.raises(UsageError) as err:
        configs.run(args)
    assert "cret" not in str(err.value) and "value is not shown" in str(err.value)
    args = build_parser().parse_args([*argv, "--add-config", "retention.ms=5"])
    with pytest.raises(UsageError, match="only SCRAM credentials"):
        configs.run(args)
    args = build_parser().parse_args(["configs", "--alter", "--entity-type", "users", "--bootstrap-server", "h:1"])
    with pytest.raises(UsageError, match="--alter needs --entity-name"):
        configs.run(args)
