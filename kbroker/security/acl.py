"""Kafka's ACL model: resource patterns, entries, bindings, filters, and the ACL znode codec.

Names and numeric codes are Kafka's (``org.apache.kafka.common.acl`` and
``org.apache.kafka.common.resource``), so they travel unchanged through the CreateAcls /
DescribeAcls / DeleteAcls RPCs. ``str()`` of a pattern, an entry and a filter reads as
Kafka's ``toString`` (kafka-acls.sh prints those).

* A :class:`AclBinding` (pattern + entry) is one ACL. Only concrete values may be stored:
  :func:`validate_binding` refuses ``ANY``/``UNKNOWN``/``MATCH`` and the names Kafka refuses.
* A :class:`AclBindingFilter` selects bindings (DescribeAcls, DeleteAcls) with Kafka's
  semantics: ``ANY`` matches every value, a ``None`` name/principal/host matches all, and
  pattern type ``MATCH`` matches every pattern that would apply to the named resource
  (the literal name, the literal wildcard ``*``, and each PREFIXED pattern that is a prefix).

ACL znode content (Kafka's ``AclEntry`` JSON)::

    {"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow","operation":"Read","host":"*"}]}

Thread safety: every type here is immutable; functions are pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from kbroker.security.principal import KafkaPrincipal
from kclient.acl import AclOperation, AclPermissionType, PatternType, ResourceType
from kclient.errors import InvalidRequestError

WILDCARD_RESOURCE = "*"
"""A LITERAL pattern named ``*`` applies to every resource of its type."""
WILDCARD_HOST = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"
"""The one name of the CLUSTER resource."""

IMPLIED_BY: dict[AclOperation, tuple[AclOperation, ...]] = {
    AclOperation.DESCRIBE: (
        AclOperation.DESCRIBE,
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.DELETE,
        AclOperation.ALTER,
    ),
    AclOperation.DESCRIBE_CONFIGS: (AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS),
}
"""An ALLOW ACL for any of these operations also allows the key (Kafka's implied operations).
DENY is never implied: denying READ does not deny DESCRIBE."""


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    """A stored pattern: a concrete resource type, a name and LITERAL or PREFIXED."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType = PatternType.LITERAL

    def __str__(self) -> str:
        return (
            f"ResourcePattern(resourceType={self.resource_type.name}, name={self.name}, "
            f"patternType={self.pattern_type.name})"
        )


CLUSTER_RESOURCE = ResourcePattern(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL)


@dataclass(frozen=True, slots=True)
class AccessControlEntry:
    """Who (principal ``Type:name``, ``User:*`` = everyone), from where (host, ``*`` = anywhere),
    may or may not (permission) do what (operation)."""

    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType

    def __str__(self) -> str:
        return (
            f"(principal={self.principal}, host={self.host}, operation={self.operation.name}, "
            f"permissionType={self.permission_type.name})"
        )


@dataclass(frozen=True, slots=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry

    def __str__(self) -> str:
        return f"(pattern={self.pattern}, entry={self.entry})"


@dataclass(frozen=True, slots=True)
class ResourcePatternFilter:
    """Selects patterns. ``name`` None matches every name; see :meth:`matches`."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.LITERAL

    def __str__(self) -> str:
        name = "<any>" if self.name is None else self.name
        return (
            f"ResourcePatternFilter(resourceType={self.resource_type.name}, name={name}, "
            f"patternType={self.pattern_type.name})"
        )

    def is_unknown(self) -> bool:
        return self.resource_type is ResourceType.UNKNOWN or self.pattern_type is PatternType.UNKNOWN

    def matches(self, pattern: ResourcePattern) -> bool:
        """Kafka's ``ResourcePatternFilter.matches``."""
        if self.resource_type is not ResourceType.ANY and self.resource_type != pattern.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != pattern.pattern_type:
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, pattern.pattern_type):
            return self.name == pattern.name
        if pattern.pattern_type is PatternType.LITERAL:  # pattern_type is MATCH from here on
            return self.name == pattern.name or pattern.name == WILDCARD_RESOURCE
        if pattern.pattern_type is PatternType.PREFIXED:
            return self.name.startswith(pattern.name)
        return False

    def indefinite_field(self) -> str | None:
        """Why this filter may match more than one pattern; None if it matches at most one."""
        if self.resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
            return f"Resource type is {self.resource_type.name}."
        if not self.pattern_type.is_specific:
            return f"Resource pattern type is {self.pattern_type.name}."
        if self.name is None:
            return "Resource name is NULL."
        return None

    def matches_at_most_one(self) -> bool:
        return self.indefinite_field() is None


@dataclass(frozen=True, slots=True)
class AccessControlEntryFilter:
    """Selects entries: None / ANY match every value."""

    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def __str__(self) -> str:
        principal = "<any>" if self.principal is None else self.principal
        host = "<any>" if self.host is None else self.host
        return (
            f"(principal={principal}, host={host}, operation={self.operation.name}, "
            f"permissionType={self.permission_type.name})"
        )

    def is_unknown(self) -> bool:
        return self.operation is AclOperation.UNKNOWN or self.permission_type is AclPermissionType.UNKNOWN

    def matches(self, entry: AccessControlEntry) -> bool:
        """Kafka's ``AccessControlEntryFilter.matches`` (exact principal and host; no wildcard expansion)."""
        if self.principal is not None and self.principal != entry.principal:
            return False
        if self.host is not None and self.host != entry.host:
            return False
        if self.operation is not AclOperation.ANY and self.operation != entry.operation:
            return False
        return self.permission_type is AclPermissionType.ANY or self.permission_type == entry.permission_type


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    pattern_filter: ResourcePatternFilter = ResourcePatternFilter(pattern_type=PatternType.ANY)
    entry_filter: AccessControlEntryFilter = AccessControlEntryFilter()

    ANY: ClassVar[AclBindingFilter]

    def __str__(self) -> str:
        return f"(patternFilter={self.pattern_filter}, entryFilter={self.entry_filter})"

    def is_unknown(self) -> bool:
        return self.pattern_filter.is_unknown() or self.entry_filter.is_unknown()

    def matches(self, binding: AclBinding) -> bool:
        return self.pattern_filter.matches(binding.pattern) and self.entry_filter.matches(binding.entry)


AclBindingFilter.ANY = AclBindingFilter()


# --- validation --------------------------------------------------------------------------


def validate_binding(binding: AclBinding) -> None:
    """Refuse, with InvalidRequestError and the reason, a binding Kafka would not store."""
    pattern, entry = binding.pattern, binding.entry
    if pattern.resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
        raise InvalidRequestError(f"an ACL needs a concrete resource type, not {pattern.resource_type.name}")
    if not pattern.pattern_type.is_specific:
        raise InvalidRequestError(
            f"an ACL's resource pattern type must be LITERAL or PREFIXED, not {pattern.pattern_type.name}"
        )
    if entry.operation in (AclOperation.ANY, AclOperation.UNKNOWN):
        raise InvalidRequestError(f"an ACL needs a concrete operation, not {entry.operation.name}")
    if entry.permission_type in (AclPermissionType.ANY, AclPermissionType.UNKNOWN):
        raise InvalidRequestError(f"an ACL's permission type must be ALLOW or DENY, not {entry.permission_type.name}")
    if not pattern.name:
        raise InvalidRequestError("Invalid empty resource name")
    if "/" in pattern.name:
        raise InvalidRequestError(f"ACL binding contains invalid resource name: {pattern.name}")
    if pattern.resource_type is ResourceType.CLUSTER and (
        pattern.name != CLUSTER_NAME or pattern.pattern_type is not PatternType.LITERAL
    ):
        raise InvalidRequestError(
            f"The only valid name for the CLUSTER resource is {CLUSTER_NAME} (LITERAL), not {pattern.name!r}"
        )
    KafkaPrincipal.parse(entry.principal)
    if not entry.host:
        raise InvalidRequestError("an ACL's host must not be empty (use * for every host)")


# --- znode codec -------------------------------------------------------------------------


def encode_acls(entries: Iterable[AccessControlEntry]) -> bytes:
    """The content of one ACL znode; entries sorted so equal sets encode equally."""
    ordered = sorted(set(entries), key=lambda e: (e.principal, e.host, e.operation, e.permission_type))
    acls = [
        {
            "principal": e.principal,
            "permissionType": e.permission_type.camel,
            "operation": e.operation.camel,
            "host": e.host,
        }
        for e in ordered
    ]
    return json.dumps({"version": 1, "acls": acls}, separators=(",", ":")).encode()


def decode_acls(data: bytes) -> frozenset[AccessControlEntry]:
    """The entries of one ACL znode (empty content = none); InvalidRequestError if malformed."""
    if not data:
        return frozenset()
    try:
        body: Any = json.loads(data.decode())
        out = frozenset(
            AccessControlEntry(
                principal=str(acl["principal"]),
                host=str(acl["host"]),
                operation=AclOperation.parse(str(acl["operation"])),
                permission_type=AclPermissionType.parse(str(acl["permissionType"])),
            )
            for acl in body["acls"]
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidRequestError(f"malformed ACL znode {data[:200]!r}: {exc}") from None
    return out


def bindings_matching(
    acls: Mapping[ResourcePattern, frozenset[AccessControlEntry]], acl_filter: AclBindingFilter
) -> list[AclBinding]:
    """Every binding in ``acls`` the filter matches, sorted by resource then entry."""
    out: list[AclBinding] = []
    for pattern in sorted(acls, key=lambda p: (p.resource_type, p.pattern_type, p.name)):
        if not acl_filter.pattern_filter.matches(pattern):
            continue
        for entry in sorted(acls[pattern], key=lambda e: (e.principal, e.host, e.operation, e.permission_type)):
            if acl_filter.entry_filter.matches(entry):
                out.append(AclBinding(pattern, entry))
    return out
