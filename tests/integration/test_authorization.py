"""Every RPC authorized as Kafka 2.8's KafkaApis authorizes its equivalent, on
two real brokers with the AclAuthorizer on: SASL users (SCRAM over the SASL_SSL listener,
raw gRPC with the session token) are refused without an ACL and served with one; Deny
beats Allow; PREFIXED ACLs work; the super user may do everything; an ACL written to
ZooKeeper reaches every broker within seconds; replication, a consumer group and
controlled shutdown keep working (the brokers are super users through their certificate).

One cluster serves the whole module; each test uses its own topics, groups and users so
that the ACLs one test grants do not leak into another. The last test stops a broker:
keep it last.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kbroker.cluster.zk_client import ZkClient
from kbroker.local.cluster import LocalCluster
from kbroker.security import certs
from kbroker.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from kbroker.security.authorizer import AclAuthorizer
from kclient import Consumer, Producer
from kclient.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
)
from kclient.proto.kbroker.v1 import (
    admin_pb2,
    cluster_pb2,
    config_pb2,
    group_pb2,
    log_pb2,
    metadata_pb2,
    reassignment_pb2,
    security_pb2,
)
from kclient.records import BatchBuilder
from tests.conftest import FAST_BROKER
from tests.integration.test_broker_listeners import (
    ADMIN,
    ADMIN_PASSWORD,
    scram_login,
    secure_cluster,
    session,
    tls_stub,
)
from tests.support import set_scram_passwords, wait_until

pytestmark = pytest.mark.integration

Op, RT, PT = AclOperation, ResourceType, PatternType
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
T29, G30, C31 = (
    TopicAuthorizationFailedError.errno,
    GroupAuthorizationFailedError.errno,
    ClusterAuthorizationFailedError.errno,
)
PASSWORD = "secret-pw"


class As:
    """Raw gRPC calls to one broker's SASL_SSL listener as one SCRAM user."""

    def __init__(self, address: str, ca: Path, user: str, password: str) -> None:
        self.stub = tls_stub(address, ca)
        self.token = scram_login(self.stub, user, password, "SCRAM-SHA-512")

    def __getattr__(self, rpc: str) -> Callable[..., Any]:
        method = getattr(self.stub, rpc)
        return lambda request, timeout=30: method(request, timeout=timeout, metadata=session(self.token))


@dataclass
class Env:
    cluster: LocalCluster
    ca: Path
    _clients: dict[tuple[str, int], As] = field(default_factory=dict)

    def secure(self, broker: int) -> str:
        return self.cluster.brokers[broker].listeners["SECURE"]

    def user(self, name: str) -> str:
        """A fresh SCRAM user for one test (``name`` made unique)."""
        unique = f"{name}-{uuid.uuid4().hex[:6]}"
        set_scram_passwords(self.cluster.zk_connect, {unique: PASSWORD})
        return unique

    def as_(self, user: str, broker: int = 0) -> As:
        key = (user, broker)
        if key not in self._clients:
            password = ADMIN_PASSWORD if user == ADMIN else PASSWORD
            self._clients[key] = As(self.secure(broker), self.ca, user, password)
        return self._clients[key]

    def grant(self, *bindings: security_pb2.AclBinding) -> None:
        """CreateAcls as the super user on every running broker: each one's cache holds the
        ACLs when this returns (ZooKeeper is written once; the repeat changes nothing)."""
        for bid, b in self.cluster.brokers.items():
            if b.running():
                made = self.as_(ADMIN, bid).CreateAcls(security_pb2.CreateAclsRequest(creations=list(bindings)))
                assert [r.error_code for r in made.results] == [0] * len(bindings), made

    def create_topic(self, name: str, replicas: list[int] | None = None, partitions: int = 1) -> None:
        assignment = {p: admin_pb2.ReplicaList(broker_ids=replicas or [0]) for p in range(partitions)}
        made = self.as_(ADMIN).CreateTopics(
            admin_pb2.CreateTopicsRequest(topics=[admin_pb2.CreatableTopic(name=name, assignments=assignment)])
        )
        assert made.topics[0].error_code == 0, made


def acl(
    user: str,
    op: AclOperation,
    rtype: ResourceType,
    name: str,
    pattern: PatternType = PT.LITERAL,
    permission: AclPermissionType = ALLOW,
) -> security_pb2.AclBinding:
    return security_pb2.AclBinding(
        resource_type=int(rtype),
        resource_name=name,
        pattern_type=int(pattern),
        principal=user if ":" in user else f"User:{user}",
        host="*",
        operation=int(op),
        permission_type=int(permission),
    )


@pytest.fixture(scope="module")
def env(zookeeper: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Env]:
    root = tmp_path_factory.mktemp("authz")
    authority = certs.make_ca(root / "ca")
    broker = certs.issue(authority, root / "ca", "broker")
    zk_connect = f"{zookeeper}/kbroker-authz-{uuid.uuid4().hex[:12]}"
    made: list[LocalCluster] = []

    def factory(n: int, **overrides: str) -> LocalCluster:
        made.append(LocalCluster(root / "cluster", zk_connect, {**FAST_BROKER, **overrides}))
        return made[-1].start(n)

    failed_before = request.session.testsfailed
    try:
        cluster = secure_cluster(
            factory, broker, 2, **{"auto.create.topics.enable": "true", "group.initial.rebalance.delay.ms": "0"}
        )
        set_scram_passwords(zk_connect, {ADMIN: ADMIN_PASSWORD})
        yield Env(cluster, broker.ca_path)
    finally:
        for c in made:
            if request.session.testsfailed > failed_before:
                print(c.logs())
            c.stop()


def _records(value: bytes = b"v") -> bytes:
    batch = BatchBuilder()
    batch.append(int(time.time() * 1000), None, value)
    return batch.build()


def _produce(client: As, *topics: str) -> dict[str, int]:
    req = log_pb2.ProduceRequest(acks=1, timeout_ms=10000)
    for t in topics:
        req.topics.add(name=t).partitions.add(index=0, records=_records(t.encode()))
    resp = client.Produce(req)
    return {t.name: t.partitions[0].error_code for t in resp.topics}


def _fetch(client: As, *topics: str, replica_id: int = -1) -> dict[str, tuple[int, bytes]]:
    req = log_pb2.FetchRequest(replica_id=replica_id, max_wait_ms=0)
    for t in topics:
        req.topics.add(name=t).partitions.add(index=0, fetch_offset=0)
    resp = client.Fetch(req)
    return {t.name: (t.partitions[0].error_code, t.partitions[0].records) for t in resp.topics}


def _metadata(client: As, *topics: str) -> dict[str, int]:
    resp = client.Metadata(metadata_pb2.MetadataRequest(topics=list(topics)))
    return {t.name: t.error_code for t in resp.topics}


# --- the log ---------------------------------------------------------------------------


def test_produce_fetch_and_offsets_need_write_read_describe(env: Env) -> None:
    alice = env.user("alice")
    env.create_topic("pf-a")
    env.create_topic("pf-b")
    a = env.as_(alice)
    assert _produce(a, "pf-a", "pf-b") == {"pf-a": T29, "pf-b": T29}
    assert {t: code for t, (code, _) in _fetch(a, "pf-a").items()} == {"pf-a": T29}
    offsets = a.ListOffsets(log_pb2.ListOffsetsRequest(topics=[log_pb2.ListOffsetsTopic(name="pf-a", partitions=[{}])]))
    assert offsets.topics[0].partitions[0].error_code == T29
    epochs = a.OffsetForLeaderEpoch(
        log_pb2.OffsetForLeaderEpochRequest(
            topics=[log_pb2.OffsetForLeaderEpochTopic(name="pf-a", partitions=[{"leader_epoch": 0}])]
        )
    )
    assert epochs.topics[0].partitions[0].error_code == T29

    env.grant(acl(alice, Op.WRITE, RT.TOPIC, "pf-a"))
    # One topic allowed, the other refused, in the same request.
    assert _produce(a, "pf-a", "pf-b") == {"pf-a": 0, "pf-b": T29}
    assert _fetch(a, "pf-a")["pf-a"][0] == T29  # WRITE is not READ
    # WRITE implies DESCRIBE: offsets are visible.
    offsets = a.ListOffsets(log_pb2.ListOffsetsRequest(topics=[log_pb2.ListOffsetsTopic(name="pf-a", partitions=[{}])]))
    assert offsets.topics[0].partitions[0].error_code == 0 and offsets.topics[0].partitions[0].offset == 1

    env.grant(acl(alice, Op.READ, RT.TOPIC, "pf-a"))
    code, records = _fetch(a, "pf-a")["pf-a"]
    assert code == 0 and b"pf-a" in records
    # A follower's fetch needs CLUSTER_ACTION on the Cluster: refused per partition.
    assert _fetch(a, "pf-a", replica_id=1)["pf-a"][0] == T29
    epochs = a.OffsetForLeaderEpoch(
        log_pb2.OffsetForLeaderEpochRequest(
            topics=[log_pb2.OffsetForLeaderEpochTopic(name="pf-a", partitions=[{"leader_epoch": 0}])]
        )
    )
    assert epochs.topics[0].partitions[0].error_code == 0 and epochs.topics[0].partitions[0].end_offset == 1
    # The super user needs no ACL.
    assert _produce(env.as_(ADMIN), "pf-b") == {"pf-b": 0}


def test_deny_beats_allow_prefixed_acls_and_the_super_user(env: Env) -> None:
    bob = env.user("bob")
    for t in ("bob-1", "bob-2", "other-1"):
        env.create_topic(t)
    b = env.as_(bob)
    env.grant(acl(bob, Op.ALL, RT.TOPIC, "bob-", PT.PREFIXED))
    assert _produce(b, "bob-1", "bob-2", "other-1") == {"bob-1": 0, "bob-2": 0, "other-1": T29}
    env.grant(acl(bob, Op.WRITE, RT.TOPIC, "bob-2", permission=DENY))
    assert _produce(b, "bob-1", "bob-2") == {"bob-1": 0, "bob-2": T29}
    assert _fetch(b, "bob-2")["bob-2"][0] == 0  # only WRITE is denied
    # A deny for everyone does not bind the super user.
    env.grant(acl("User:*", Op.ALL, RT.TOPIC, "bob-2", permission=DENY))
    assert _fetch(b, "bob-2")["bob-2"][0] == T29
    assert _produce(env.as_(ADMIN), "bob-2") == {"bob-2": 0}


# --- metadata and topic administration -------------------------------------------------------


def test_metadata_lists_only_describable_topics_and_auto_creation_needs_create(env: Env) -> None:
    alice = env.user("alice")
    env.create_topic("md-seen")
    env.create_topic("md-hidden")
    a = env.as_(alice)
    listed = _metadata(a)
    assert "md-seen" not in listed and "md-hidden" not in listed
    assert _metadata(a, "md-seen", "md-hidden") == {"md-seen": T29, "md-hidden": T29}

    env.grant(acl(alice, Op.DESCRIBE, RT.TOPIC, "md-seen"))
    listed = _metadata(a)
    assert listed.get("md-seen") == 0 and "md-hidden" not in listed
    assert _metadata(a, "md-seen", "md-hidden") == {"md-seen": 0, "md-hidden": T29}
    assert "md-seen" in _metadata(env.as_(ADMIN)) and "md-hidden" in _metadata(env.as_(ADMIN))

    # auto.create.topics.enable is on: DESCRIBE alone does not create, CREATE on the topic does.
    env.grant(acl(alice, Op.DESCRIBE, RT.TOPIC, "md-auto-", PT.PREFIXED))
    assert _metadata(a, "md-auto-1") == {"md-auto-1": T29}
    assert "md-auto-1" not in _metadata(env.as_(ADMIN))
    env.grant(acl(alice, Op.CREATE, RT.TOPIC, "md-auto-2"))
    assert _metadata(a, "md-auto-2")["md-auto-2"] in (0, 5)  # created (LEADER_NOT_AVAILABLE while it starts)
    wait_until(lambda: _metadata(a, "md-auto-2") == {"md-auto-2": 0}, timeout_s=15, what="the auto-created topic")


def test_topic_admin_configs_and_cluster_rpcs(env: Env) -> None:
    alice = env.user("alice")
    a = env.as_(alice)

    def create(name: str) -> int:
        req = admin_pb2.CreateTopicsRequest(topics=[admin_pb2.CreatableTopic(name=name, num_partitions=1)])
        return int(a.CreateTopics(req).topics[0].error_code)

    def describe_configs(rtype: int, name: str) -> int:
        req = config_pb2.DescribeConfigsRequest(
            resources=[config_pb2.DescribeConfigsResource(resource_type=rtype, resource_name=name)]  # type: ignore[arg-type]
        )
        return int(a.DescribeConfigs(req).results[0].error_code)

    def alter_configs(rtype: int, name: str, key: str, value: str) -> int:
        op = config_pb2.AlterableConfig(name=key, config_operation=config_pb2.SET, value=value)
        req = config_pb2.IncrementalAlterConfigsRequest(
            resources=[config_pb2.AlterConfigsResource(resource_type=rtype, resource_name=name, configs=[op])]  # type: ignore[arg-type]
        )
        return int(a.IncrementalAlterConfigs(req).responses[0].error_code)

    def grow(name: str, count: int) -> int:
        req = admin_pb2.CreatePartitionsRequest(topics=[admin_pb2.PartitionsIncrease(name=name, count=count)])
        return int(a.CreatePartitions(req).topics[0].error_code)

    def describe(name: str) -> admin_pb2.TopicDescription:
        return a.DescribeTopics(admin_pb2.DescribeTopicsRequest(topics=[name])).topics[0]

    def delete(name: str) -> int:
        return int(a.DeleteTopics(admin_pb2.DeleteTopicsRequest(topics=[name])).topics[0].error_code)

    assert create("adm-1") == T29
    env.grant(acl(alice, Op.CREATE, RT.TOPIC, "adm-1"))
    assert create("adm-1") == 0
    assert create("adm-2") == T29
    assert describe("adm-1").error_code == T29  # CREATE does not imply DESCRIBE
    assert describe_configs(config_pb2.TOPIC, "adm-1") == T29
    assert alter_configs(config_pb2.TOPIC, "adm-1", "retention.ms", "60000") == T29
    assert grow("adm-1", 2) == T29
    assert delete("adm-1") == T29

    env.grant(
        acl(alice, Op.ALTER_CONFIGS, RT.TOPIC, "adm-1"),
        acl(alice, Op.ALTER, RT.TOPIC, "adm-1"),
    )
    assert alter_configs(config_pb2.TOPIC, "adm-1", "retention.ms", "60000") == 0
    assert describe_configs(config_pb2.TOPIC, "adm-1") == 0  # implied by ALTER_CONFIGS
    assert grow("adm-1", 2) == 0
    described = describe("adm-1")  # DESCRIBE implied by ALTER; configs by ALTER_CONFIGS
    assert described.error_code == 0 and len(described.partitions) == 2
    assert described.configs["retention.ms"] == "60000"
    env.grant(acl(alice, Op.DELETE, RT.TOPIC, "adm-1"))
    assert delete("adm-1") == 0

    # CREATE on the Cluster creates any topic.
    env.grant(acl(alice, Op.CREATE, RT.CLUSTER, "kafka-cluster"))
    assert create("adm-2") == 0

    # Broker configs and the cluster-wide RPCs need the Cluster.
    assert describe_configs(config_pb2.BROKER, "0") == C31
    assert alter_configs(config_pb2.BROKER, "0", "log.cleaner.threads", "2") == C31
    assert a.DescribeLogDirs(admin_pb2.DescribeLogDirsRequest()).error_code == C31
    elected = a.ElectLeaders(cluster_pb2.ElectLeadersRequest(partitions=[{"topic": "adm-2", "partition": 0}]))
    assert [r.error_code for r in elected.results] == [C31]
    assert [r.error_code for r in a.ElectLeaders(cluster_pb2.ElectLeadersRequest()).results] == [C31]
    moves = reassignment_pb2.AlterPartitionReassignmentsRequest(
        topics=[{"name": "adm-2", "partitions": [{"partition_index": 0, "replicas": {"broker_ids": [0]}}]}]
    )
    assert a.AlterPartitionReassignments(moves).error_code == C31
    assert a.ListPartitionReassignments(reassignment_pb2.ListPartitionReassignmentsRequest()).error_code == C31
    shutdown = a.ControlledShutdown(cluster_pb2.ControlledShutdownRequest(broker_id=99))
    assert shutdown.error_code == C31

    env.grant(
        acl(alice, Op.DESCRIBE, RT.CLUSTER, "kafka-cluster"),
        acl(alice, Op.DESCRIBE_CONFIGS, RT.CLUSTER, "kafka-cluster"),
    )
    assert describe_configs(config_pb2.BROKER, "0") == 0
    assert a.DescribeLogDirs(admin_pb2.DescribeLogDirsRequest()).error_code == 0
    # The super user.
    admin = env.as_(ADMIN)
    assert all(
        r.error_code == 0
        for r in admin.ElectLeaders(
            cluster_pb2.ElectLeadersRequest(partitions=[{"topic": "adm-2", "partition": 0}])
        ).results
    )
    assert admin.DescribeLogDirs(admin_pb2.DescribeLogDirsRequest()).results


def test_init_producer_id_idempotent_write_or_write_on_any_topic(env: Env) -> None:
    carol, dave = env.user("carol"), env.user("dave")
    req = cluster_pb2.InitProducerIdRequest()
    assert env.as_(carol).InitProducerId(req).error_code == C31
    env.grant(acl(carol, Op.IDEMPOTENT_WRITE, RT.CLUSTER, "kafka-cluster"))
    assert env.as_(carol).InitProducerId(req).producer_id >= 0
    # KIP-679: WRITE on any topic (here a prefix) is enough.
    assert env.as_(dave).InitProducerId(req).error_code == C31
    env.grant(acl(dave, Op.WRITE, RT.TOPIC, "dave-", PT.PREFIXED))
    assert env.as_(dave).InitProducerId(req).error_code == 0


# --- groups -----------------------------------------------------------------------------------


def test_group_rpcs(env: Env) -> None:
    alice = env.user("alice")
    group, other_group = f"g-{alice}", f"g2-{alice}"
    env.create_topic("grp-t")
    env.create_topic("grp-hidden")
    admin = env.as_(ADMIN)
    node = admin.FindCoordinator(group_pb2.FindCoordinatorRequest(group_id=group)).node_id
    a, admin_at = env.as_(alice, node), env.as_(ADMIN, node)

    def commit(client: As, gid: str, *topics: str) -> dict[str, int]:
        req = group_pb2.CommitOffsetsRequest(group_id=gid)
        for t in topics:
            req.topics.add(name=t).partitions.add(index=0, offset=1)
        return {t.name: t.partitions[0].error_code for t in client.CommitOffsets(req).topics}

    # The super user commits offsets of two topics for both groups.
    assert commit(admin_at, group, "grp-t", "grp-hidden") == {"grp-t": 0, "grp-hidden": 0}
    other_node = admin.FindCoordinator(group_pb2.FindCoordinatorRequest(group_id=other_group)).node_id
    assert commit(env.as_(ADMIN, other_node), other_group, "grp-t") == {"grp-t": 0}

    assert a.FindCoordinator(group_pb2.FindCoordinatorRequest(group_id=group)).error_code == G30
    join = group_pb2.JoinGroupRequest(group_id=group, protocol_type="consumer", protocols=[{"name": "range"}])
    assert a.JoinGroup(join).error_code == G30
    assert a.SyncGroup(group_pb2.SyncGroupRequest(group_id=group, member_id="m")).error_code == G30
    assert a.Heartbeat(group_pb2.HeartbeatRequest(group_id=group, member_id="m")).error_code == G30
    assert a.LeaveGroup(group_pb2.LeaveGroupRequest(group_id=group, member_id="m")).error_code == G30
    assert commit(a, group, "grp-t") == {"grp-t": G30}
    assert a.FetchOffsets(group_pb2.FetchOffsetsRequest(group_id=group)).error_code == G30
    assert [g.error_code for g in a.DescribeGroups(group_pb2.DescribeGroupsRequest(group_ids=[group])).groups] == [G30]
    assert [r.error_code for r in a.DeleteGroups(group_pb2.DeleteGroupsRequest(group_ids=[group])).results] == [G30]
    assert group not in {g.group_id for g in a.ListGroups(group_pb2.ListGroupsRequest()).groups}

    env.grant(acl(alice, Op.READ, RT.GROUP, group))
    assert a.FindCoordinator(group_pb2.FindCoordinatorRequest(group_id=group)).node_id == node
    assert commit(a, group, "grp-t") == {"grp-t": T29}  # READ on the topic too
    env.grant(acl(alice, Op.READ, RT.TOPIC, "grp-t"))
    assert commit(a, group, "grp-t") == {"grp-t": 0}

    # Offsets: a named undescribable topic answers 29 per partition; fetching all leaves it out.
    named = group_pb2.FetchOffsetsRequest(
        group_id=group, topics=[{"name": "grp-t", "partitions": [0]}, {"name": "grp-hidden", "partitions": [0]}]
    )
    found = {(t.name, p.index): (p.error_code, p.offset) for t in a.FetchOffsets(named).topics for p in t.partitions}
    assert found == {("grp-t", 0): (0, 1), ("grp-hidden", 0): (T29, -1)}
    every = a.FetchOffsets(group_pb2.FetchOffsetsRequest(group_id=group))
    assert every.error_code == 0 and [t.name for t in every.topics] == ["grp-t"]
    assert {t.name for t in admin_at.FetchOffsets(group_pb2.FetchOffsetsRequest(group_id=group)).topics} == {
        "grp-t",
        "grp-hidden",
    }

    # ListGroups: only the describable groups, unless DESCRIBE on the Cluster.
    listed = {g.group_id for g in a.ListGroups(group_pb2.ListGroupsRequest()).groups}
    assert group in listed and other_group not in listed
    described = a.DescribeGroups(group_pb2.DescribeGroupsRequest(group_ids=[group, other_group])).groups
    assert [g.error_code for g in described] == [0, G30]
    assert {group, other_group} <= {g.group_id for g in admin_at.ListGroups(group_pb2.ListGroupsRequest()).groups}
    assert [r.error_code for r in a.DeleteGroups(group_pb2.DeleteGroupsRequest(group_ids=[group])).results] == [G30]
    env.grant(acl(alice, Op.DELETE, RT.GROUP, group))
    assert [r.error_code for r in a.DeleteGroups(group_pb2.DeleteGroupsRequest(group_ids=[group])).results] == [0]


# --- propagation, replication, consumer groups, controlled shutdown ----------------------------


def test_an_acl_written_to_zookeeper_reaches_every_broker_within_seconds(env: Env) -> None:
    bob = env.user("bob")
    env.create_topic("live")
    clients = [env.as_(bob, 0), env.as_(bob, 1)]  # connected before the change
    assert [_metadata(c, "live") for c in clients] == [{"live": T29}] * 2
    zk = ZkClient(env.cluster.zk_connect)
    zk.start()
    try:
        binding = AclBinding(
            ResourcePattern(RT.TOPIC, "live"), AccessControlEntry(f"User:{bob}", "*", Op.DESCRIBE, ALLOW)
        )
        start = time.monotonic()
        assert AclAuthorizer(zk).create_acls([binding]) == [None]
    finally:
        zk.close()
    for c in clients:
        wait_until(lambda c=c: _metadata(c, "live") == {"live": 0}, timeout_s=10, what="the new ACL on every broker")
    assert time.monotonic() - start < 10


def test_replication_consumer_group_and_controlled_shutdown_with_the_authorizer_on(env: Env) -> None:
    alice = env.user("alice")
    admin = env.as_(ADMIN)
    controller = admin.Metadata(metadata_pb2.MetadataRequest()).controller_id
    leaving = 1 - controller
    admin = env.as_(ADMIN, controller)  # the one that stays
    # Replicated over the SSL inter-broker listener, led by the broker that will leave.
    env.create_topic("repl", replicas=[leaving, controller], partitions=2)

    def isr() -> list[list[int]]:
        md = admin.Metadata(metadata_pb2.MetadataRequest(topics=["repl"]))
        return [sorted(p.isr_nodes) for p in md.topics[0].partitions]

    wait_until(lambda: isr() == [[0, 1], [0, 1]], timeout_s=20, what="both replicas in sync")

    env.grant(
        acl(alice, Op.WRITE, RT.TOPIC, "repl"),
        acl(alice, Op.READ, RT.TOPIC, "repl"),
        acl(alice, Op.READ, RT.GROUP, "repl-group"),
    )
    security: dict[str, Any] = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": alice,
        "sasl_plain_password": PASSWORD,
        "ssl_cafile": str(env.ca),
    }
    bootstrap = ",".join(env.secure(b) for b in env.cluster.brokers)
    with Producer(bootstrap_servers=bootstrap, acks="all", **security) as producer:
        futures = [producer.send("repl", f"v{i}".encode(), partition=i % 2) for i in range(20)]
        producer.flush(30)
        assert all(f.get(10).offset >= 0 for f in futures)
    consumer = Consumer(
        "repl", bootstrap_servers=bootstrap, group_id="repl-group", auto_offset_reset="earliest", **security
    )
    try:
        values: list[bytes] = []

        def read() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(r.value or b"" for r in records)
            return len(values) >= 20

        wait_until(read, timeout_s=30, what="the group to read every record")
        assert sorted(values) == sorted(f"v{i}".encode() for i in range(20))
        consumer.commit()
    finally:
        consumer.close()

    # Controlled shutdown: the leaving broker asks the controller over the inter-broker listener.
    broker = env.cluster.brokers[leaving]
    broker.stop()
    assert "controlled shutdown: leadership moved away" in broker.log_tail(200), broker.log_tail(60)
    md = admin.Metadata(metadata_pb2.MetadataRequest(topics=["repl"]))
    assert all(p.leader_id == controller for p in md.topics[0].partitions)
