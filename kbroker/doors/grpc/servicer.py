"""The gRPC ``kbroker.v1.Broker`` servicer: decode, delegate, encode. No logic.

Handlers are coroutines on the server's event loop (:mod:`kbroker.doors.grpc.server`):
blocking core calls go through ``offload`` (a bounded thread pool); long polls
(Fetch, acks=all Produce, JoinGroup, SyncGroup) park in the core's purgatories and hold
no thread.

Per-partition problems travel as error codes inside the response; a malformed request
as a whole fails with gRPC status INVALID_ARGUMENT (plus the Kafka code in the
``kbroker-error-code`` trailing metadata) and changes nothing. Every ``optional``
proto field that is unset takes the default the .proto documents (Kafka's).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kbroker.api.apis import BrokerApis
from kbroker.api.call_context import Offload
from kbroker.api.log_dirs import describe_log_dirs
from kbroker.api.metadata_api import partition_metadata
from kbroker.cluster.config_admin import AlterOp, ConfigAdmin, OpType, ResourceType, static_broker_configs
from kbroker.cluster.controller import Controller
from kbroker.cluster.controller_channel import PartitionStateUpdate
from kbroker.cluster.metadata_cache import ClusterSnapshot, MetadataCache
from kbroker.cluster.preferred_election import request_preferred_election
from kbroker.cluster.producer_ids import ProducerIdManager
from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zk_errors import mapped
from kbroker.doors.grpc.group_rpcs import GroupRpcs
from kbroker.doors.grpc.log_rpcs import LogRpcs, partitions_pb
from kbroker.doors.grpc.rpc import blocking, opt, set_error
from kbroker.doors.grpc.security_rpcs import SecurityRpcs
from kbroker.group.coordinator import GroupCoordinator
from kbroker.metrics import BrokerMetrics
from kbroker.replication.replica_manager import (
    ReplicaManager,
)
from kbroker.security.acl import AclOperation as Op
from kbroker.security.authorizer import AclAuthorizer
from kbroker.security.credentials import CredentialStore
from kbroker.security.sasl import SaslAuthenticator
from kclient.errors import (
    BrokerResponseError,
    ClusterAuthorizationFailedError,
    InvalidRequestError,
    KafkaError,
    NotControllerError,
    PreferredLeaderNotAvailableError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
    as_response_error,
)
from kclient.proto.kbroker.v1 import (
    admin_pb2,
    broker_pb2_grpc,
    cluster_pb2,
    config_pb2,
    reassignment_pb2,
)
from kclient.topic_name import validate_topic_name

log = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT_MS = 30000
DEFAULT_REASSIGNMENT_TIMEOUT_MS = 60000


def _code(exc: BrokerResponseError | None) -> tuple[int, str]:
    return (0, "") if exc is None else (exc.errno, exc.message)


class BrokerService(LogRpcs, GroupRpcs, SecurityRpcs, broker_pb2_grpc.BrokerServicer):
    def __init__(
        self,
        broker_id: int,
        cluster_id: Callable[[], str],
        replicas: ReplicaManager,
        metadata: MetadataCache,
        zk: ZkClient,
        admin: TopicAdmin,
        producer_ids: ProducerIdManager,
        controller: Controller,
        groups: GroupCoordinator,
        offload: Offload,
        *,
        auto_create_topics: bool = False,
        credentials: CredentialStore,
        sasl: Callable[[str], SaslAuthenticator | None] = lambda listener: None,
        authorizer: AclAuthorizer | None = None,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self.apis = BrokerApis(
            cluster_id,
            replicas,
            metadata,
            admin,
            producer_ids,
            groups,
            offload,
            auto_create_topics=auto_create_topics,
            authorizer=authorizer,
            metrics=metrics,
        )
        self.log_api, self.metadata_api, self.groups_api = self.apis.log, self.apis.metadata, self.apis.groups
        self._metrics = metrics
        self._offload = self.offload = offload
        self._credentials = credentials
        self._sasl = sasl
        self._acls = authorizer
        self._access = self.apis.access
        self._auto_create = auto_create_topics
        self._groups = groups
        self._producer_ids = producer_ids
        self._controller = controller
        self._broker_id = broker_id
        self._cluster_id = cluster_id
        self._replicas = replicas
        self._metadata = metadata
        self._zk = zk
        self._admin = admin

    # --- authorization (kbroker.api.access) ----------------------------------------

    def _refuse_cluster(self, resp: Any, operation: Op) -> bool:
        """True, with CLUSTER_AUTHORIZATION_FAILED in ``resp``, if the caller may not
        ``operation`` the Cluster."""
        if self._access.cluster(operation):
            return False
        set_error(resp, self._access.cluster_error(operation))
        return True

    # --- admin ---------------------------------------------------------------------

    def _wait(self, predicate: Callable[[ClusterSnapshot], bool], timeout_ms: int) -> bool:
        return self._metadata.wait_for(predicate, max(timeout_ms, 0) / 1000.0)

    def _wait_for_leaders(self, topic: str, partitions: int, timeout_ms: int) -> None:
        if self._leaderless({topic: partitions}, timeout_ms):
            raise RequestTimedOutError(f"topic {topic!r} was written but not every partition has a leader yet")

    def _leaderless(self, expected: Mapping[str, int], timeout_ms: int) -> list[str]:
        """Wait (up to ``timeout_ms``) until each topic of ``expected`` has that many
        partitions with a leader; the topics that still have not, in order."""

        def missing(snap: ClusterSnapshot) -> list[str]:
            out = []
            for topic, partitions in expected.items():
                info = snap.topics.get(topic)
                if info is None or sum(1 for s in info.states.values() if s.has_leader) < partitions:
                    out.append(topic)
            return out

        if self._wait(lambda snap: not missing(snap), timeout_ms):
            return []
        return missing(self._metadata.snapshot())

    @staticmethod
    def _topic_results(
        names: list[str],
        action: Callable[[str, int], None],
        results: Any,
        refused: Mapping[str, BrokerResponseError],
    ) -> None:
        """Run ``action(name, index)`` per topic but the ``refused`` ones (their error is
        their answer); failures become that topic's error code."""
        for i, name in enumerate(names):
            result = results.add(name=name)
            if name in refused:
                set_error(result, refused[name])
                continue
            try:
                action(name, i)
            except KafkaError as exc:
                set_error(result, as_response_error(exc))

    @blocking
    def CreateTopics(self, request: admin_pb2.CreateTopicsRequest) -> admin_pb2.CreateTopicsResponse:
        resp = admin_pb2.CreateTopicsResponse()
        timeout = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)

        def create(name: str, i: int) -> None:
            t = request.topics[i]
            assignment = {p: list(r.broker_ids) for p, r in t.assignments.items()} or None
            chosen = self._admin.create_topic(
                name,
                opt(t, "num_partitions", -1),
                opt(t, "replication_factor", -1),
                assignment=assignment,
                configs=dict(t.configs),
                validate_only=request.validate_only,
            )
            if not request.validate_only:
                written[name] = (i, len(chosen))

        names = [t.name for t in request.topics]
        creatable = self._access.creatable(names)
        refused = {n: self._access.topic_error(Op.CREATE, n) for n in names if n not in creatable}
        written: dict[str, tuple[int, int]] = {}
        self._topic_results(names, create, resp.topics, refused)
        # Every topic written first, then one wait for all their leaders (Kafka's
        # DelayedCreatePartitions): the controller sets them up in batches meanwhile.
        for name in self._leaderless({n: count for n, (_, count) in written.items()}, timeout):
            err = RequestTimedOutError(f"topic {name!r} was written but not every partition has a leader yet")
            set_error(resp.topics[written[name][0]], err)
        return resp

    @blocking
    def DeleteTopics(self, request: admin_pb2.DeleteTopicsRequest) -> admin_pb2.DeleteTopicsResponse:
        resp = admin_pb2.DeleteTopicsResponse()
        timeout = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)

        def delete(name: str, _: int) -> None:
            self._admin.delete_topic(name)
            if not self._wait(lambda snap: name not in snap.topics, timeout):
                raise RequestTimedOutError(f"topic {name!r} is marked for deletion but not deleted yet")

        names = list(request.topics)
        self._topic_results(names, delete, resp.topics, self._access.refused_topics(Op.DELETE, names))
        return resp

    @blocking
    def DescribeTopics(self, request: admin_pb2.DescribeTopicsRequest) -> admin_pb2.DescribeTopicsResponse:
        """DESCRIBE on each topic (all topics: the describable ones); the configs only with
        DESCRIBE_CONFIGS on the topic, as DescribeConfigs would."""
        snap = self._metadata.snapshot()
        resp = admin_pb2.DescribeTopicsResponse()
        names = list(request.topics)
        refused = self._access.refused_topics(Op.DESCRIBE, names)
        if not names:
            names = [n for n in sorted(snap.topics) if self._access.topic(Op.DESCRIBE, n, quiet=True)]
        for name in names:
            d = resp.topics.add(name=name)
            info = snap.topics.get(name)
            if name in refused:
                set_error(d, refused[name])
                continue
            if info is None:
                d.error_code = UnknownTopicOrPartitionError.errno  # type: ignore[assignment]
                d.error_message = f"topic {name!r} does not exist"
                continue
            d.partitions.extend(partitions_pb(partition_metadata(snap, name)))
            d.topic_id = info.topic_id or ""
            if self._access.topic(Op.DESCRIBE_CONFIGS, name, quiet=True):
                d.configs.update(info.config)
        return resp

    @blocking
    def DescribeLogDirs(self, request: admin_pb2.DescribeLogDirsRequest) -> admin_pb2.DescribeLogDirsResponse:
        if not self._access.cluster(Op.DESCRIBE):  # the response has a code, no message
            return admin_pb2.DescribeLogDirsResponse(
                broker_id=self._broker_id,
                error_code=ClusterAuthorizationFailedError.errno,  # type: ignore[arg-type]
            )
        return describe_log_dirs(self._broker_id, self._replicas, request)

    def _check_config_access(self, operation: Op, resource_type: int, name: str) -> None:
        """DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic, or on the Cluster for a broker."""
        if resource_type == ResourceType.BROKER:
            self._access.check_cluster(operation)
        elif resource_type == ResourceType.TOPIC:
            self._access.check_topic(operation, name)

    def _config_admin(self) -> ConfigAdmin:
        static = static_broker_configs(self._replicas.log_manager.default_config)
        return ConfigAdmin(self._zk, broker_id=self._broker_id, static_broker=static)

    @blocking
    def DescribeConfigs(self, request: config_pb2.DescribeConfigsRequest) -> config_pb2.DescribeConfigsResponse:
        configs, resp = self._config_admin(), config_pb2.DescribeConfigsResponse()
        for res in request.resources:
            result = resp.results.add(resource_type=res.resource_type, resource_name=res.resource_name)

            def describe(res: Any = res, result: Any = result) -> None:
                if res.resource_type not in set(ResourceType):
                    raise InvalidRequestError(f"Unsupported resource type {res.resource_type}")
                self._check_config_access(Op.DESCRIBE_CONFIGS, res.resource_type, res.resource_name)
                keys = list(res.configuration_keys)
                for e in configs.describe(ResourceType(res.resource_type), res.resource_name, keys):
                    entry = result.configs.add(
                        name=e.name, read_only=e.read_only, is_default=e.is_default, config_source=int(e.source)
                    )
                    if e.value is not None:
                        entry.value = e.value
                    for syn in e.synonyms if request.include_synonyms else ():
                        s = entry.synonyms.add(name=syn.name, source=int(syn.source))
                        if syn.value is not None:
                            s.value = syn.value

            _answer(result, describe)
        return resp

    @blocking
    def IncrementalAlterConfigs(
        self, request: config_pb2.IncrementalAlterConfigsRequest
    ) -> config_pb2.IncrementalAlterConfigsResponse:
        configs, resp = self._config_admin(), config_pb2.IncrementalAlterConfigsResponse()
        seen = Counter((r.resource_type, r.resource_name) for r in request.resources)
        for res in request.resources:
            result = resp.responses.add(resource_type=res.resource_type, resource_name=res.resource_name)

            def alter(res: Any = res) -> None:
                if seen[(res.resource_type, res.resource_name)] > 1:
                    raise InvalidRequestError("Duplicate resources in request are not allowed")
                if res.resource_type not in set(ResourceType):
                    raise InvalidRequestError(f"Unsupported resource type {res.resource_type}")
                self._check_config_access(Op.ALTER_CONFIGS, res.resource_type, res.resource_name)
                unknown = [c.name for c in res.configs if c.config_operation not in set(OpType)]
                if unknown:
                    raise InvalidRequestError(f"Unknown config operation for {unknown[0]}")
                ops = [
                    AlterOp(c.name, OpType(c.config_operation), c.value if c.HasField("value") else None)
                    for c in res.configs
                ]
                configs.incremental_alter(
                    ResourceType(res.resource_type), res.resource_name, ops, validate_only=request.validate_only
                )

            _answer(result, alter)
        return resp

    @blocking
    def CreatePartitions(self, request: admin_pb2.CreatePartitionsRequest) -> admin_pb2.CreatePartitionsResponse:
        resp = admin_pb2.CreatePartitionsResponse()
        timeout = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)

        def grow(name: str, i: int) -> None:
            count = request.topics[i].count
            assignments = [list(r.broker_ids) for r in request.topics[i].assignments]
            self._admin.create_partitions(name, count, validate_only=request.validate_only, assignments=assignments)
            if not request.validate_only:
                self._wait_for_leaders(name, count, timeout)

        names = [t.name for t in request.topics]
        self._topic_results(names, grow, resp.topics, self._access.refused_topics(Op.ALTER, names))
        return resp

    # --- cluster -------------------------------------------------------------------

    @blocking
    def ControlledShutdown(
        self, request: cluster_pb2.ControlledShutdownRequest
    ) -> cluster_pb2.ControlledShutdownResponse:
        resp = cluster_pb2.ControlledShutdownResponse()
        if self._refuse_cluster(resp, Op.CLUSTER_ACTION):
            return resp
        if not self._controller.is_active:
            err: BrokerResponseError = NotControllerError(f"broker {self._broker_id} is not the controller")
            set_error(resp, err)
            return resp
        try:
            remaining = self._controller.controlled_shutdown(request.broker_id, opt(request, "broker_epoch", -1))
        except Exception as exc:
            set_error(resp, as_response_error(exc))
            return resp
        for topic, p in remaining:
            resp.remaining.add(topic=topic, partition=p)
        return resp

    @blocking
    def LeaderAndIsr(self, request: cluster_pb2.LeaderAndIsrRequest) -> cluster_pb2.LeaderAndIsrResponse:
        """The controller's roles for this broker's replicas (controller channel)."""
        resp = cluster_pb2.LeaderAndIsrResponse()
        self._apply_controller_states(request, resp)
        return resp

    @blocking
    def UpdateMetadata(self, request: cluster_pb2.UpdateMetadataRequest) -> cluster_pb2.UpdateMetadataResponse:
        """The controller's partition states for this broker's metadata (controller channel)."""
        resp = cluster_pb2.UpdateMetadataResponse()
        self._apply_controller_states(request, resp)
        return resp

    def _apply_controller_states(self, request: Any, resp: Any) -> None:
        if self._refuse_cluster(resp, Op.CLUSTER_ACTION):
            return
        try:
            self._metadata.apply_controller_states(
                request.controller_id,
                request.controller_epoch,
                request.broker_epoch,
                [PartitionStateUpdate.from_proto(m) for m in request.partition_states],
            )
        except Exception as exc:
            set_error(resp, as_response_error(exc))

    @blocking
    def AlterPartitionReassignments(
        self, request: reassignment_pb2.AlterPartitionReassignmentsRequest
    ) -> reassignment_pb2.AlterPartitionReassignmentsResponse:
        """Start, replace or cancel (``replicas`` unset) moves; the controller only."""
        resp = reassignment_pb2.AlterPartitionReassignmentsResponse()
        if self._refuse_cluster(resp, Op.ALTER):
            return resp
        targets: dict[tuple[str, int], list[int] | None] = {}
        for t in request.topics:
            for p in t.partitions:
                if (t.name, p.partition_index) in targets:
                    set_error(resp, InvalidRequestError(f"{t.name}-{p.partition_index} appears more than once"))
                    return resp
                targets[(t.name, p.partition_index)] = list(p.replicas.broker_ids) if p.HasField("replicas") else None
        if not self._controller.is_active:
            set_error(resp, NotControllerError(f"broker {self._broker_id} is not the controller"))
            return resp
        timeout_s = opt(request, "timeout_ms", DEFAULT_REASSIGNMENT_TIMEOUT_MS) / 1000.0
        results = _answer(resp, lambda: self._controller.alter_partition_reassignments(targets, timeout_s))
        if results is None:
            return resp
        for t in request.topics:
            topic = resp.responses.add(name=t.name)
            for p in t.partitions:
                err = results.get((t.name, p.partition_index))
                code, message = _code(as_response_error(err) if err is not None else None)
                topic.partitions.add(
                    partition_index=p.partition_index,
                    error_code=code,  # type: ignore[arg-type]
                    error_message=message,
                )
        return resp

    @blocking
    def ListPartitionReassignments(
        self, request: reassignment_pb2.ListPartitionReassignmentsRequest
    ) -> reassignment_pb2.ListPartitionReassignmentsResponse:
        """Ongoing moves (of the named partitions, or all); the controller only."""
        resp = reassignment_pb2.ListPartitionReassignmentsResponse()
        if self._refuse_cluster(resp, Op.DESCRIBE):
            return resp
        if not self._controller.is_active:
            set_error(resp, NotControllerError(f"broker {self._broker_id} is not the controller"))
            return resp
        tps = [(t.name, p) for t in request.topics for p in t.partition_indexes] if request.topics else None
        timeout_s = opt(request, "timeout_ms", DEFAULT_REASSIGNMENT_TIMEOUT_MS) / 1000.0
        ongoing = _answer(resp, lambda: self._controller.list_partition_reassignments(tps, timeout_s))
        if ongoing is None:
            return resp
        topic: Any = None
        for (name, p), (replicas, adding, removing) in sorted(ongoing.items()):
            if topic is None or topic.name != name:
                topic = resp.topics.add(name=name)
            topic.partitions.add(
                partition_index=p, replicas=replicas, adding_replicas=adding, removing_replicas=removing
            )
        return resp

    @blocking
    def ElectLeaders(self, request: cluster_pb2.ElectLeadersRequest) -> cluster_pb2.ElectLeadersResponse:
        """ALTER on the Cluster; refused, every partition asked for (or, for all of them,
        one entry with no topic and partition -1) answers CLUSTER_AUTHORIZATION_FAILED."""
        wanted = [(r.topic, r.partition) for r in request.partitions]
        resp = cluster_pb2.ElectLeadersResponse()
        if not self._access.cluster(Op.ALTER):
            refusal = self._access.cluster_error(Op.ALTER)
            for t, p in wanted or [("", -1)]:
                set_error(resp.results.add(topic=t, partition=p), refusal)
            return resp
        snap = self._metadata.snapshot()
        unknown = [(t, p) for t, p in wanted if t not in snap.topics or p not in snap.topics[t].assignment]
        for t, p in unknown:
            resp.results.add(
                topic=t,
                partition=p,
                error_code=UnknownTopicOrPartitionError.errno,  # type: ignore[arg-type]
                error_message=f"{t}-{p} does not exist",
            )
        known = [tp for tp in wanted if tp not in unknown]
        if wanted and not known:
            return resp
        timeout_s = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS) / 1000.0
        deadline = time.monotonic() + timeout_s
        request_preferred_election(self._zk, known or None, timeout_s, join_pending=True)  # or wait for a pending one
        self._metadata.sync()
        snap = self._metadata.snapshot()
        targets = known or [(t, p) for t, info in sorted(snap.topics.items()) for p in sorted(info.assignment)]
        # The outcome as ZooKeeper has it (pipelined reads): this broker's own metadata
        # learns it from the controller's UpdateMetadata, a moment later.
        with mapped():  # ZooKeeper out of reach: a typed ZooKeeperError, as the request above
            states = self._zk.partition_states(targets)
        for t, p in targets:
            info = snap.topics.get(t)
            state = states.get((t, p))
            preferred = info.assignment[p][0] if info and info.assignment.get(p) else -1
            if state is not None and state.leader == preferred:
                resp.results.add(topic=t, partition=p)
            else:
                err = PreferredLeaderNotAvailableError(
                    f"{t}-{p}: preferred leader {preferred} is not alive and in sync"
                    if time.monotonic() < deadline
                    else f"{t}-{p}: election did not finish within {timeout_s:.0f}s"
                )
                resp.results.add(
                    topic=t,
                    partition=p,
                    error_code=err.errno,
                    error_message=err.message,  # type: ignore[arg-type]
                )
        return resp


def _topic_name_error(name: str) -> BrokerResponseError | None:
    try:
        validate_topic_name(name)
    except BrokerResponseError as exc:
        return exc
    return None


T = TypeVar("T")


def _answer(resp: Any, call: Callable[[], T]) -> T | None:
    """``call()``'s result, or None with its failure written into ``resp`` as an error code."""
    try:
        return call()
    except Exception as exc:
        set_error(resp, as_response_error(exc))
        return None
