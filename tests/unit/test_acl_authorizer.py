"""ACL model, codecs and the AclAuthorizer's decision, without ZooKeeper."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kbroker.cluster import zkdata
from kbroker.security.acl import (
    CLUSTER_NAME,
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
    decode_acls,
    encode_acls,
    validate_binding,
)
from kbroker.security.authorizer import AclAuthorizer, decide, parse_super_users
from kbroker.security.principal import ANONYMOUS, KafkaPrincipal
from kclient.errors import InvalidRequestError

Op, Perm, RT, PT = AclOperation, AclPermissionType, ResourceType, PatternType
ALLOW, DENY = Perm.ALLOW, Perm.DENY


def ace(principal: str, op: AclOperation, perm: AclPermissionType = ALLOW, host: str = "*") -> AccessControlEntry:
    return AccessControlEntry(principal, host, op, perm)


def topic(name: str, pattern_type: PatternType = PT.LITERAL) -> ResourcePattern:
    return ResourcePattern(RT.TOPIC, name, pattern_type)


def authorizer(acls: dict[ResourcePattern, list[AccessControlEntry]], **kw: Any) -> AclAuthorizer:
    """An authorizer whose cache holds ``acls`` (never started: no ZooKeeper)."""
    a = AclAuthorizer(None, **kw)  # type: ignore[arg-type]
    for pattern, entries in acls.items():
        a._set_resource(pattern, frozenset(entries))
    return a


# --- principal -------------------------------------------------------------------------


def test_principal_parse_and_str() -> None:
    p = KafkaPrincipal.parse("User:CN=alice,OU=eng")
    assert (p.type, p.name, str(p)) == ("User", "CN=alice,OU=eng", "User:CN=alice,OU=eng")
    assert str(ANONYMOUS) == "User:ANONYMOUS"
    with pytest.raises(InvalidRequestError, match="<type>:<name>"):
        KafkaPrincipal.parse("alice")
    assert parse_super_users(" User:admin ; User:CN=broker;") == {"User:admin", "User:CN=broker"}


# --- enums -----------------------------------------------------------------------------


def test_kafka_codes_and_names() -> None:
    assert [int(m) for m in (RT.UNKNOWN, RT.ANY, RT.TOPIC, RT.GROUP, RT.CLUSTER, RT.TRANSACTIONAL_ID)] == list(range(6))
    assert (int(Op.ALL), int(Op.DESCRIBE), int(Op.IDEMPOTENT_WRITE)) == (2, 8, 12)
    assert (int(PT.MATCH), int(PT.PREFIXED), int(Perm.DENY), int(Perm.ALLOW)) == (2, 4, 2, 3)
    assert RT.TRANSACTIONAL_ID.znode_name == "TransactionalId"
    assert Op.DESCRIBE_CONFIGS.camel == "DescribeConfigs"
    for text in ("DescribeConfigs", "DESCRIBE_CONFIGS", "describe-configs", " describeconfigs "):
        assert Op.parse(text) is Op.DESCRIBE_CONFIGS
    with pytest.raises(InvalidRequestError, match=r"unknown operation 'Raed'.*Read"):
        Op.parse("Raed")


def test_str_reads_as_kafka() -> None:
    assert str(topic("t")) == "ResourcePattern(resourceType=TOPIC, name=t, patternType=LITERAL)"
    assert str(ace("User:alice", Op.READ)) == "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)"
    assert str(ResourcePatternFilter(RT.ANY, None, PT.ANY)) == (
        "ResourcePatternFilter(resourceType=ANY, name=<any>, patternType=ANY)"
    )


# --- decision --------------------------------------------------------------------------


def test_no_acl_found_follows_allow_everyone() -> None:
    assert authorizer({}).authorize("User:alice", "10.0.0.1", Op.READ, RT.TOPIC, "t") is False
    assert authorizer({}, allow_everyone_if_no_acl_found=True).authorize(
        "User:alice", "10.0.0.1", Op.READ, RT.TOPIC, "t"
    )
    # An ACL on the resource for someone else: ACLs exist, so bob is denied even with allow.everyone.
    a = authorizer({topic("t"): [ace("User:alice", Op.READ)]}, allow_everyone_if_no_acl_found=True)
    assert a.authorize("User:bob", "h", Op.READ, RT.TOPIC, "t") is False
    assert a.authorize("User:bob", "h", Op.READ, RT.TOPIC, "other") is True


def test_deny_wins_over_allow() -> None:
    a = authorizer(
        {
            topic("t"): [ace("User:alice", Op.ALL), ace("User:alice", Op.WRITE, DENY)],
            topic("*"): [ace("User:*", Op.READ), ace("User:bob", Op.READ, DENY, host="10.0.0.9")],
        }
    )
    assert a.authorize("User:alice", "h", Op.READ, RT.TOPIC, "t")
    assert not a.authorize("User:alice", "h", Op.WRITE, RT.TOPIC, "t")
    assert a.authorize("User:bob", "10.0.0.1", Op.READ, RT.TOPIC, "t")  # User:* via the wildcard topic
    assert not a.authorize("User:bob", "10.0.0.9", Op.READ, RT.TOPIC, "t")  # deny from that host
    assert not a.authorize("User:bob", "10.0.0.1", Op.WRITE, RT.TOPIC, "t")


def test_deny_of_all_denies_every_operation_and_user_wildcard() -> None:
    a = authorizer({topic("t"): [ace("User:alice", Op.READ), ace("User:*", Op.ALL, DENY)]})
    for op in (Op.READ, Op.DESCRIBE, Op.WRITE):
        assert not a.authorize("User:alice", "h", op, RT.TOPIC, "t")


def test_implied_operations() -> None:
    for granted in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        a = authorizer({topic("t"): [ace("User:alice", granted)]})
        assert a.authorize("User:alice", "h", Op.DESCRIBE, RT.TOPIC, "t"), granted
    a = authorizer({topic("t"): [ace("User:alice", Op.ALTER_CONFIGS)]})
    assert a.authorize("User:alice", "h", Op.DESCRIBE_CONFIGS, RT.TOPIC, "t")
    assert not a.authorize("User:alice", "h", Op.DESCRIBE, RT.TOPIC, "t")
    a = authorizer({topic("t"): [ace("User:alice", Op.DESCRIBE)]})
    assert not a.authorize("User:alice", "h", Op.READ, RT.TOPIC, "t")  # implication is one way
    # A deny of READ does not deny DESCRIBE (deny is never implied).
    a = authorizer({topic("t"): [ace("User:alice", Op.WRITE), ace("User:alice", Op.READ, DENY)]})
    assert a.authorize("User:alice", "h", Op.DESCRIBE, RT.TOPIC, "t")


def test_prefixed_patterns() -> None:
    a = authorizer(
        {
            topic("orders-", PT.PREFIXED): [ace("User:alice", Op.READ)],
            topic("orders-secret", PT.PREFIXED): [ace("User:alice", Op.READ, DENY)],
            ResourcePattern(RT.GROUP, "orders-", PT.PREFIXED): [ace("User:alice", Op.READ)],
        }
    )
    assert a.authorize("User:alice", "h", Op.READ, RT.TOPIC, "orders-eu")
    assert a.authorize("User:alice", "h", Op.READ, RT.TOPIC, "orders-")
    assert not a.authorize("User:alice", "h", Op.READ, RT.TOPIC, "orders")
    assert not a.authorize("User:alice", "h", Op.READ, RT.TOPIC, "orders-secret-1")
    assert not a.authorize("User:alice", "h", Op.READ, RT.TOPIC, "xorders-eu")
    assert a.authorize("User:alice", "h", Op.READ, RT.GROUP, "orders-app")
    assert not a.authorize("User:alice", "h", Op.READ, RT.GROUP, "billing")
    # A literal pattern named like a prefix applies to that name only.
    b = authorizer({topic("orders-"): [ace("User:alice", Op.READ)]})
    assert not b.authorize("User:alice", "h", Op.READ, RT.TOPIC, "orders-eu")


def test_many_prefixes_same_answer_both_lookup_paths() -> None:
    prefixes = {topic(f"p{i}", PT.PREFIXED): [ace("User:alice", Op.READ)] for i in range(30)}
    a = authorizer(prefixes)
    assert a.authorize("User:alice", "h", Op.READ, RT.TOPIC, "p7-x")  # more prefixes than name chars
    assert a.authorize("User:alice", "h", Op.READ, RT.TOPIC, "p29" + "y" * 50)  # fewer
    assert not a.authorize("User:alice", "h", Op.READ, RT.TOPIC, "q" * 50)


def test_resource_types_are_separate_and_cluster() -> None:
    cluster = ResourcePattern(RT.CLUSTER, CLUSTER_NAME)
    a = authorizer({cluster: [ace("User:broker", Op.CLUSTER_ACTION)], topic("t"): [ace("User:alice", Op.READ)]})
    assert a.authorize(KafkaPrincipal.parse("User:broker"), "h", Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER_NAME)
    assert not a.authorize("User:alice", "h", Op.READ, RT.GROUP, "t")
    assert not a.authorize("User:alice", "h", Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER_NAME)


def test_super_users_bypass_deny() -> None:
    a = authorizer({topic("t"): [ace("User:*", Op.ALL, DENY)]}, super_users={"User:admin"})
    assert a.authorize("User:admin", "h", Op.WRITE, RT.TOPIC, "t")
    assert a.authorize(KafkaPrincipal("User", "admin"), "h", Op.ALTER, RT.CLUSTER, CLUSTER_NAME)
    assert not a.authorize("User:ADMIN", "h", Op.WRITE, RT.TOPIC, "t")


def test_decide_principal_and_host_must_match_exactly() -> None:
    acls = [ace("User:alice", Op.READ, host="10.0.0.1")]
    assert decide(acls, "User:alice", "10.0.0.1", Op.READ, allow_if_no_acl=False)
    assert not decide(acls, "User:alice", "10.0.0.2", Op.READ, allow_if_no_acl=True)
    assert not decide(acls, "User:Alice", "10.0.0.1", Op.READ, allow_if_no_acl=True)
    assert not decide(acls, "Group:alice", "10.0.0.1", Op.READ, allow_if_no_acl=True)


def test_cache_removal_of_a_resource() -> None:
    a = authorizer({topic("t"): [ace("User:alice", Op.READ)], topic("p", PT.PREFIXED): [ace("User:bob", Op.READ)]})
    a._set_resource(topic("t"), frozenset())
    a._set_resource(topic("p", PT.PREFIXED), frozenset())
    assert a.describe_acls() == []
    assert not a.authorize("User:alice", "h", Op.READ, RT.TOPIC, "t")
    assert not a.authorize("User:bob", "h", Op.READ, RT.TOPIC, "px")


# --- validation ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "entry", "reason"),
    [
        (ResourcePattern(RT.ANY, "t"), ace("User:a", Op.READ), "concrete resource type"),
        (ResourcePattern(RT.UNKNOWN, "t"), ace("User:a", Op.READ), "concrete resource type"),
        (topic("t", PT.MATCH), ace("User:a", Op.READ), "LITERAL or PREFIXED"),
        (topic("t", PT.ANY), ace("User:a", Op.READ), "LITERAL or PREFIXED"),
        (topic("t"), ace("User:a", Op.ANY), "concrete operation"),
        (topic("t"), ace("User:a", Op.READ, Perm.ANY), "ALLOW or DENY"),
        (topic(""), ace("User:a", Op.READ), "empty resource name"),
        (topic("a/b"), ace("User:a", Op.READ), "invalid resource name"),
        (ResourcePattern(RT.CLUSTER, "c"), ace("User:a", Op.ALTER), "kafka-cluster"),
        (ResourcePattern(RT.CLUSTER, CLUSTER_NAME, PT.PREFIXED), ace("User:a", Op.ALTER), "kafka-cluster"),
        (topic("t"), ace("alice", Op.READ), "<type>:<name>"),
        (topic("t"), ace("User:a", Op.READ, host=""), "host"),
    ],
)
def test_validation_refuses(pattern: ResourcePattern, entry: AccessControlEntry, reason: str) -> None:
    with pytest.raises(InvalidRequestError, match=reason):
        validate_binding(AclBinding(pattern, entry))


def test_validation_accepts_wildcards() -> None:
    validate_binding(AclBinding(topic("*"), ace("User:*", Op.ALL)))
    validate_binding(AclBinding(topic("x", PT.PREFIXED), ace("User:CN=a,O=b", Op.IDEMPOTENT_WRITE, DENY, "::1")))
    validate_binding(AclBinding(ResourcePattern(RT.CLUSTER, CLUSTER_NAME), ace("User:b", Op.CLUSTER_ACTION)))


# --- filters ---------------------------------------------------------------------------


def test_pattern_filter_semantics() -> None:
    lit, wild, pre = topic("orders-eu"), topic("*"), topic("orders-", PT.PREFIXED)
    group = ResourcePattern(RT.GROUP, "orders-eu")
    match = ResourcePatternFilter(RT.TOPIC, "orders-eu", PT.MATCH)
    assert [match.matches(p) for p in (lit, wild, pre, group, topic("orders-e"))] == [True, True, True, False, False]
    anyf = ResourcePatternFilter(RT.TOPIC, "orders-", PT.ANY)
    assert [anyf.matches(p) for p in (lit, wild, pre, topic("orders-"))] == [False, False, True, True]
    exact = ResourcePatternFilter(RT.TOPIC, "orders-eu", PT.LITERAL)
    assert [exact.matches(p) for p in (lit, wild, pre)] == [True, False, False]
    everything = ResourcePatternFilter(RT.ANY, None, PT.ANY)
    assert all(everything.matches(p) for p in (lit, wild, pre, group))
    all_prefixed = ResourcePatternFilter(RT.ANY, None, PT.PREFIXED)
    assert [all_prefixed.matches(p) for p in (lit, pre)] == [False, True]
    assert exact.matches_at_most_one() and not match.matches_at_most_one() and not anyf.matches_at_most_one()
    assert ResourcePatternFilter(RT.ANY, "x", PT.LITERAL).indefinite_field() == "Resource type is ANY."


def test_entry_filter_semantics() -> None:
    e = ace("User:alice", Op.READ, ALLOW, "10.0.0.1")
    assert AccessControlEntryFilter().matches(e)
    assert AccessControlEntryFilter("User:alice", "10.0.0.1", Op.READ, ALLOW).matches(e)
    assert not AccessControlEntryFilter("User:*").matches(e)  # exact, no wildcard expansion
    assert not AccessControlEntryFilter(host="*").matches(e)
    assert not AccessControlEntryFilter(operation=Op.ALL).matches(e)
    assert not AccessControlEntryFilter(permission_type=DENY).matches(e)
    f = AclBindingFilter(
        ResourcePatternFilter(RT.TOPIC, None, PT.ANY), AccessControlEntryFilter(principal="User:alice")
    )
    assert f.matches(AclBinding(topic("t"), e)) and not f.matches(AclBinding(topic("t"), ace("User:bob", Op.READ)))
    assert AclBindingFilter(ResourcePatternFilter(RT.UNKNOWN)).is_unknown()
    assert AclBindingFilter(entry_filter=AccessControlEntryFilter(operation=Op.UNKNOWN)).is_unknown()
    assert not AclBindingFilter.ANY.is_unknown()


def test_describe_filters_the_cache() -> None:
    a = authorizer(
        {
            topic("t"): [ace("User:alice", Op.READ), ace("User:bob", Op.WRITE)],
            topic("t", PT.PREFIXED): [ace("User:alice", Op.WRITE)],
            ResourcePattern(RT.GROUP, "g"): [ace("User:alice", Op.READ)],
        }
    )
    assert len(a.describe_acls()) == 4
    alice_topics = AclBindingFilter(
        ResourcePatternFilter(RT.TOPIC, None, PT.ANY), AccessControlEntryFilter(principal="User:alice")
    )
    assert [(str(b.pattern.pattern_type.name), b.entry.operation) for b in a.describe_acls(alice_topics)] == [
        ("LITERAL", Op.READ),
        ("PREFIXED", Op.WRITE),
    ]


# --- codecs ----------------------------------------------------------------------------


def test_acl_znode_is_kafkas_json() -> None:
    data = encode_acls([ace("User:alice", Op.READ), ace("User:bob", Op.DESCRIBE_CONFIGS, DENY, "10.0.0.1")])
    assert data == (
        b'{"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow","operation":"Read","host":"*"},'
        b'{"principal":"User:bob","permissionType":"Deny","operation":"DescribeConfigs","host":"10.0.0.1"}]}'
    )
    # Kafka's own znodes (key order, upper-case names) read back.
    kafka = (
        b'{"version":1,"acls":[{"host":"*","permissionType":"Allow",'
        b'"operation":"IdempotentWrite","principal":"User:p"}]}'
    )
    assert decode_acls(kafka) == {ace("User:p", Op.IDEMPOTENT_WRITE)}
    assert decode_acls(b"") == frozenset()
    for bad in (b"{", b'{"version":1}', b'{"version":1,"acls":[{"principal":"User:a"}]}', b"[1]"):
        with pytest.raises(InvalidRequestError):
            decode_acls(bad)


entries = st.builds(
    AccessControlEntry,
    principal=st.builds(lambda t, n: f"{t}:{n}", st.sampled_from(["User", "Group"]), st.text(max_size=20)),
    host=st.one_of(st.just("*"), st.ip_addresses().map(str)),
    operation=st.sampled_from([o for o in Op if o not in (Op.ANY, Op.UNKNOWN)]),
    permission_type=st.sampled_from([ALLOW, DENY]),
)


@given(st.frozensets(entries, max_size=10))
def test_acl_codec_round_trip(acls: frozenset[AccessControlEntry]) -> None:
    assert decode_acls(encode_acls(acls)) == acls
    assert encode_acls(acls) == encode_acls(list(acls)[::-1])


@given(
    st.sampled_from([RT.TOPIC, RT.GROUP, RT.TRANSACTIONAL_ID, RT.DELEGATION_TOKEN]),
    st.text(min_size=1).filter(lambda s: "/" not in s),
    st.booleans(),
)
def test_change_notification_round_trip(rtype: ResourceType, name: str, prefixed: bool) -> None:
    pattern_name = PT.PREFIXED.camel if prefixed else None
    data = zkdata.encode_acl_change(rtype.znode_name, name, pattern_name)
    assert zkdata.decode_acl_change(data, prefixed) == (rtype.znode_name, name, pattern_name)


def test_change_notification_formats_and_paths() -> None:
    assert zkdata.encode_acl_change("Topic", "a:b", None) == b"Topic:a:b"
    assert zkdata.decode_acl_change(b"Topic:a:b", False) == ("Topic", "a:b", None)
    extended = zkdata.encode_acl_change("Topic", "x", "Prefixed")
    assert extended == b'{"name":"x","patternType":"Prefixed","resourceType":"Topic","version":1}'
    assert zkdata.acl_resource_path("Topic", "t", False) == "/kafka-acl/Topic/t"
    assert zkdata.acl_resource_path("Group", "g", True) == "/kafka-acl-extended/prefixed/Group/g"
    assert zkdata.acl_change_path(False) == "/kafka-acl-changes/acl_changes_"
    assert zkdata.acl_change_path(True) == "/kafka-acl-extended-changes/acl_changes_"
    assert zkdata.acl_change_seq("acl_changes_0000000042") == 42 and zkdata.acl_change_seq("junk") == -1
    for bad in (b"NoColon", b":x"):
        with pytest.raises(InvalidRequestError):
            zkdata.decode_acl_change(bad, False)
    with pytest.raises(InvalidRequestError):
        zkdata.decode_acl_change(b'{"version":1}', True)


def test_denials_are_logged_as_kafka_unless_only_filtering(caplog: pytest.LogCaptureFixture) -> None:
    a = authorizer({topic("t"): [ace("User:alice", Op.READ)]})
    with caplog.at_level("INFO", logger="kbroker.authorizer"):
        assert not a.authorize("User:bob", "10.0.0.2", Op.WRITE, RT.TOPIC, "t")
        assert not a.authorize("User:bob", "10.0.0.2", Op.DESCRIBE, RT.TOPIC, "t", log_denied=False)
        assert a.authorize("User:alice", "10.0.0.1", Op.READ, RT.TOPIC, "t")
    assert [r.getMessage() for r in caplog.records] == [
        "Principal = User:bob is Denied Operation = Write from host = 10.0.0.2 on resource = Topic:LITERAL:t"
    ]
