"""Request authorization helpers: :class:`kbroker.api.access.Access` over an
authorizer, for the caller bound in the call context, and Kafka's KIP-679
``authorizeByResourceType`` in the AclAuthorizer (InitProducerId's rule)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kbroker.api import call_context
from kbroker.api.access import Access
from kbroker.api.call_context import CallContext
from kbroker.security.acl import (
    CLUSTER_RESOURCE,
    AccessControlEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from kbroker.security.authorizer import AclAuthorizer
from kbroker.security.principal import KafkaPrincipal
from kclient.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
)

Op, RT, PT = AclOperation, ResourceType, PatternType
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
ALICE = "User:alice"


class FakeAuthorizer:
    """Allows what ``allowed`` lists as (principal, host, operation, type, name); records each question."""

    def __init__(self, *allowed: tuple[str, str, AclOperation, ResourceType, str]) -> None:
        self.allowed = set(allowed)
        self.asked: list[tuple[str, str, AclOperation, ResourceType, str]] = []
        self.quiet: list[tuple[str, str, AclOperation, ResourceType, str]] = []

    def authorize(
        self,
        principal: str | KafkaPrincipal,
        host: str,
        operation: AclOperation,
        rtype: ResourceType,
        name: str,
        *,
        log_denied: bool = True,
    ) -> bool:
        key = (str(principal), host, operation, rtype, name)
        self.asked.append(key)
        if not log_denied:
            self.quiet.append(key)
        return key in self.allowed

    def authorize_by_resource_type(
        self, principal: str | KafkaPrincipal, host: str, operation: AclOperation, rtype: ResourceType
    ) -> bool:
        return any(a[:4] == (str(principal), host, operation, rtype) for a in self.allowed)


@pytest.fixture
def alice() -> Iterator[None]:
    token = call_context.bind(CallContext(KafkaPrincipal.parse(ALICE), "SECURE", "SASL_SSL", "10.0.0.7"))
    yield
    call_context.unbind(token)


def test_without_an_authorizer_everything_is_allowed_and_nothing_is_looked_at() -> None:
    access = Access()
    assert not access.enabled
    assert access.cluster(Op.CLUSTER_ACTION) and access.group(Op.READ, "g") and access.topic(Op.WRITE, "t")
    assert access.any_of_type(Op.WRITE, RT.TOPIC)

    def never() -> Iterator[str]:
        raise AssertionError("the names were iterated")
        yield ""

    assert access.refused_topics(Op.WRITE, never()) == {}
    assert access.creatable(["a", "b"]) == {"a", "b"}


def test_the_caller_comes_from_the_call_context(alice: None) -> None:
    fake = FakeAuthorizer((ALICE, "10.0.0.7", Op.READ, RT.TOPIC, "t"))
    access = Access(fake)
    assert access.topic(Op.READ, "t")
    assert not access.topic(Op.READ, "u")
    assert not access.topic(Op.WRITE, "t")
    assert fake.asked[0] == (ALICE, "10.0.0.7", Op.READ, RT.TOPIC, "t")


def test_refused_topics_asks_once_per_distinct_topic(alice: None) -> None:
    fake = FakeAuthorizer((ALICE, "10.0.0.7", Op.WRITE, RT.TOPIC, "ok"))
    refused = Access(fake).refused_topics(Op.WRITE, ["ok", "no", "ok", "no", "no"])
    assert list(refused) == ["no"]
    assert isinstance(refused["no"], TopicAuthorizationFailedError)
    assert refused["no"].errno == 29
    assert "User:alice is not authorized to WRITE topic 'no'" in str(refused["no"])
    assert sorted(q[4] for q in fake.asked) == ["no", "ok"]


def test_filtering_checks_do_not_log_denials_but_refusals_do(alice: None) -> None:
    fake = FakeAuthorizer((ALICE, "10.0.0.7", Op.DESCRIBE, RT.TOPIC, "seen"))
    access = Access(fake)
    assert access.topics(Op.DESCRIBE, ["seen", "hidden"]) == {"seen"}
    assert sorted(q[4] for q in fake.quiet) == ["hidden", "seen"]
    access.refused_topics(Op.DESCRIBE, ["hidden"])
    assert len(fake.quiet) == 2  # a refusal the caller sees is logged


def test_creatable_cluster_create_or_topic_create(alice: None) -> None:
    per_topic = Access(FakeAuthorizer((ALICE, "10.0.0.7", Op.CREATE, RT.TOPIC, "mine")))
    assert per_topic.creatable(["mine", "other"]) == {"mine"}
    cluster = Access(FakeAuthorizer((ALICE, "10.0.0.7", Op.CREATE, RT.CLUSTER, "kafka-cluster")))
    assert cluster.creatable(["mine", "other"]) == {"mine", "other"}


def test_checks_raise_kafkas_typed_errors(alice: None) -> None:
    access = Access(FakeAuthorizer())
    with pytest.raises(ClusterAuthorizationFailedError):
        access.check_cluster(Op.ALTER)
    with pytest.raises(GroupAuthorizationFailedError) as group:
        access.check_group(Op.READ, "g")
    assert group.value.errno == 30
    with pytest.raises(TopicAuthorizationFailedError):
        access.check_topic(Op.DESCRIBE, "t")
    assert access.cluster_error(Op.ALTER).errno == 31


def test_access_over_the_real_authorizer(alice: None) -> None:
    a = _authorizer({ResourcePattern(RT.TOPIC, "orders-", PT.PREFIXED): [_ace(ALICE, Op.READ)]})
    access = Access(a)
    assert access.topic(Op.READ, "orders-eu")
    assert access.topic(Op.DESCRIBE, "orders-eu")  # implied by READ
    assert not access.topic(Op.READ, "payments")
    assert set(access.refused_topics(Op.READ, ["orders-eu", "payments"])) == {"payments"}


# --- KIP-679: authorize_by_resource_type ---------------------------------------------------


def _ace(principal: str, op: AclOperation, perm: AclPermissionType = ALLOW, host: str = "*") -> AccessControlEntry:
    return AccessControlEntry(principal, host, op, perm)


def _authorizer(acls: dict[ResourcePattern, list[AccessControlEntry]], **kw: Any) -> AclAuthorizer:
    a = AclAuthorizer(None, **kw)  # type: ignore[arg-type]
    for pattern, entries in acls.items():
        a._set_resource(pattern, frozenset(entries))
    return a


def _topic(name: str, pattern_type: PatternType = PT.LITERAL) -> ResourcePattern:
    return ResourcePattern(RT.TOPIC, name, pattern_type)


def _any_write(a: AclAuthorizer, principal: str = ALICE, host: str = "10.0.0.7") -> bool:
    return a.authorize_by_resource_type(principal, host, Op.WRITE, RT.TOPIC)


def test_by_resource_type_needs_one_allow_on_the_type() -> None:
    assert not _any_write(_authorizer({}))
    assert _any_write(_authorizer({_topic("t"): [_ace(ALICE, Op.WRITE)]}))
    assert _any_write(_authorizer({_topic("t"): [_ace(ALICE, Op.ALL)]}))
    assert _any_write(_authorizer({_topic("p-", PT.PREFIXED): [_ace("User:*", Op.WRITE)]}))
    # Other operations, principals, hosts and resource types do not count; nor do implied ones.
    assert not _any_write(_authorizer({_topic("t"): [_ace(ALICE, Op.READ)]}))
    assert not _any_write(_authorizer({_topic("t"): [_ace("User:bob", Op.WRITE)]}))
    assert not _any_write(_authorizer({_topic("t"): [_ace(ALICE, Op.WRITE, host="10.0.0.8")]}))
    assert _any_write(_authorizer({_topic("t"): [_ace(ALICE, Op.WRITE, host="10.0.0.7")]}))
    assert not _any_write(_authorizer({ResourcePattern(RT.GROUP, "t"): [_ace(ALICE, Op.WRITE)]}))
    assert not _any_write(_authorizer({CLUSTER_RESOURCE: [_ace(ALICE, Op.WRITE)]}))


def test_by_resource_type_denies() -> None:
    allow_t = [_ace(ALICE, Op.WRITE)]
    # A literal deny of the same name, or a prefixed deny covering it, cancels an allow.
    assert not _any_write(_authorizer({_topic("t"): [*allow_t, _ace(ALICE, Op.WRITE, DENY)]}))
    assert not _any_write(_authorizer({_topic("t1"): allow_t, _topic("t", PT.PREFIXED): [_ace(ALICE, Op.ALL, DENY)]}))
    assert not _any_write(
        _authorizer({_topic("ab", PT.PREFIXED): allow_t, _topic("a", PT.PREFIXED): [_ace(ALICE, Op.WRITE, DENY)]})
    )
    # A deny elsewhere leaves the allow standing; a literal deny does not cover a prefix.
    assert _any_write(_authorizer({_topic("t"): allow_t, _topic("u"): [_ace(ALICE, Op.WRITE, DENY)]}))
    assert _any_write(_authorizer({_topic("t", PT.PREFIXED): allow_t, _topic("t"): [_ace(ALICE, Op.WRITE, DENY)]}))
    # A wildcard literal deny refuses everything; a wildcard allow survives literal denies.
    assert not _any_write(_authorizer({_topic("t"): allow_t, _topic("*"): [_ace("User:*", Op.WRITE, DENY)]}))
    assert _any_write(_authorizer({_topic("*"): allow_t, _topic("t"): [_ace(ALICE, Op.WRITE, DENY)]}))


def test_by_resource_type_super_users_and_allow_everyone() -> None:
    deny_all = {_topic("*"): [_ace("User:*", Op.ALL, DENY)]}
    assert _any_write(_authorizer(deny_all, super_users=["User:admin"]), principal="User:admin")
    assert _any_write(_authorizer({}, allow_everyone_if_no_acl_found=True))
    assert not _any_write(_authorizer(deny_all, allow_everyone_if_no_acl_found=True))
