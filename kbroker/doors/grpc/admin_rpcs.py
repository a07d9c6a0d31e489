"""The administration and cluster RPCs of the ``kbroker.v1.Broker`` servicer: protobuf in,
one call of the core (:class:`~kbroker.api.admin_api.AdminApi`,
:class:`~kbroker.api.cluster_api.ClusterApi`), protobuf out. A refusal of the whole
request is the response's own ``error_code``; unset ``optional`` fields take the defaults
the .proto documents.

Thread safety: every handler blocks and runs on the server's request pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kbroker.api.admin_api import (
    AdminApi,
    ConfigChange,
    ConfigChanges,
    ConfigResource,
    NewPartitions,
    NewTopic,
    Outcome,
)
from kbroker.api.cluster_api import ClusterApi, PartitionStateUpdate
from kbroker.api.log_dirs import LogDirPartition
from kbroker.doors.grpc.log_rpcs import partitions_pb
from kbroker.doors.grpc.rpc import blocking, opt, set_error
from kclient.errors import BrokerResponseError, ClusterAuthorizationFailedError, as_response_error
from kclient.proto.kbroker.v1 import admin_pb2, cluster_pb2, config_pb2, reassignment_pb2

DEFAULT_REQUEST_TIMEOUT_MS = 30000
DEFAULT_REASSIGNMENT_TIMEOUT_MS = 60000


def _outcomes(results: Any, outcomes: list[Outcome]) -> None:
    for name, err in outcomes:
        r = results.add(name=name)
        if err is not None:
            set_error(r, err)


def _log_dir_filter(topics: Any) -> Mapping[str, set[int] | None] | None:
    """None: everything; else topic -> partitions (None: all of the topic's)."""
    out: dict[str, set[int] | None] = {}
    for f in topics:
        parts = set(f.partitions)
        if f.name in out and (out[f.name] is None or not parts):
            out[f.name] = None
            continue
        known = out.get(f.name)
        out[f.name] = (known or set()) | parts if parts else None
    return out or None


def _log_dir_partition(p: LogDirPartition) -> admin_pb2.LogDirPartition:
    row = admin_pb2.LogDirPartition(
        partition_index=p.partition,
        partition_size=p.size,
        log_start_offset=p.log_start_offset,
        log_end_offset=p.log_end_offset,
        num_segments=p.num_segments,
        offset_lag=p.offset_lag,
        offline_reason=p.offline_reason,
    )
    if p.cleaner is not None:
        c, state = row.cleaner, p.cleaner
        c.dirty_ratio = float(state["dirty_ratio"])
        c.last_cleaned_offset = int(state["last_cleaned_offset"])
        c.first_uncleanable_offset = int(state["first_uncleanable_offset"])
        c.bytes_cleaned = int(state["bytes_cleaned"])
        reason = state["uncleanable"]
        c.uncleanable = reason is not None
        c.uncleanable_reason = str(reason or "")
    return row


class AdminRpcs:
    """Mixin of the servicer: needs ``self.admin_api``, ``self.cluster_api``,
    ``self._broker_id`` and ``self._offload``."""

    admin_api: AdminApi
    cluster_api: ClusterApi
    _broker_id: int

    # --- topics -------------------------------------------------------------------------

    @blocking
    def CreateTopics(self, request: admin_pb2.CreateTopicsRequest) -> admin_pb2.CreateTopicsResponse:
        topics = [
            NewTopic(
                t.name,
                opt(t, "num_partitions", -1),
                opt(t, "replication_factor", -1),
                {p: list(r.broker_ids) for p, r in t.assignments.items()},
                dict(t.configs),
            )
            for t in request.topics
        ]
        timeout = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)
        resp = admin_pb2.CreateTopicsResponse()
        _outcomes(resp.topics, self.admin_api.create_topics(topics, timeout, request.validate_only))
        return resp

    @blocking
    def DeleteTopics(self, request: admin_pb2.DeleteTopicsRequest) -> admin_pb2.DeleteTopicsResponse:
        timeout = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)
        resp = admin_pb2.DeleteTopicsResponse()
        _outcomes(resp.topics, self.admin_api.delete_topics(list(request.topics), timeout))
        return resp

    @blocking
    def CreatePartitions(self, request: admin_pb2.CreatePartitionsRequest) -> admin_pb2.CreatePartitionsResponse:
        topics = [NewPartitions(t.name, t.count, [list(r.broker_ids) for r in t.assignments]) for t in request.topics]
        timeout = opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS)
        resp = admin_pb2.CreatePartitionsResponse()
        _outcomes(resp.topics, self.admin_api.create_partitions(topics, timeout, request.validate_only))
        return resp

    @blocking
    def DescribeTopics(self, request: admin_pb2.DescribeTopicsRequest) -> admin_pb2.DescribeTopicsResponse:
        resp = admin_pb2.DescribeTopicsResponse()
        for t in self.admin_api.describe_topics(list(request.topics)):
            d = resp.topics.add(name=t.name)
            if t.error is not None:
                set_error(d, t.error)
                continue
            d.partitions.extend(partitions_pb(t.partitions))
            d.topic_id = t.topic_id
            if t.configs is not None:
                d.configs.update(t.configs)
        return resp

    @blocking
    def DescribeLogDirs(self, request: admin_pb2.DescribeLogDirsRequest) -> admin_pb2.DescribeLogDirsResponse:
        resp = admin_pb2.DescribeLogDirsResponse(broker_id=self._broker_id)
        try:
            dirs = self.admin_api.describe_log_dirs(_log_dir_filter(request.topics))
        except BrokerResponseError as exc:
            resp.error_code = exc.errno  # type: ignore[assignment]  # the response has a code, no message
            return resp
        for d in dirs:
            result = resp.results.add(log_dir=d.path, total_bytes=d.total_bytes, usable_bytes=d.usable_bytes)
            if d.error is not None:
                result.error_code = d.error.errno  # type: ignore[assignment]
            for name, parts in d.topics.items():
                result.topics.add(name=name, partitions=[_log_dir_partition(p) for p in parts])
        return resp

    # --- configs ------------------------------------------------------------------------

    @blocking
    def DescribeConfigs(self, request: config_pb2.DescribeConfigsRequest) -> config_pb2.DescribeConfigsResponse:
        wanted = [
            ConfigResource(r.resource_type, r.resource_name, list(r.configuration_keys)) for r in request.resources
        ]
        resp = config_pb2.DescribeConfigsResponse()
        for d in self.admin_api.describe_configs(wanted):
            result = resp.results.add(resource_type=d.resource_type, resource_name=d.name)  # type: ignore[arg-type]
            if d.error is not None:
                set_error(result, d.error)
                continue
            for e in d.entries:
                entry = result.configs.add(
                    name=e.name,
                    read_only=e.read_only,
                    is_default=e.is_default,
                    config_source=int(e.source),  # type: ignore[arg-type]
                    is_sensitive=e.sensitive,
                    config_type=e.config_type,
                )
                if request.include_documentation and e.documentation is not None:
                    entry.documentation = e.documentation
                if e.value is not None:
                    entry.value = e.value
                for syn in e.synonyms if request.include_synonyms else ():
                    s = entry.synonyms.add(name=syn.name, source=int(syn.source))
                    if syn.value is not None:
                        s.value = syn.value
        return resp

    @blocking
    def IncrementalAlterConfigs(
        self, request: config_pb2.IncrementalAlterConfigsRequest
    ) -> config_pb2.IncrementalAlterConfigsResponse:
        changes = [
            ConfigChanges(
                r.resource_type,
                r.resource_name,
                [ConfigChange(c.name, c.config_operation, c.value if c.HasField("value") else None) for c in r.configs],
            )
            for r in request.resources
        ]
        resp = config_pb2.IncrementalAlterConfigsResponse()
        for r, err in self.admin_api.incremental_alter_configs(changes, request.validate_only):
            result = resp.responses.add(resource_type=r.resource_type, resource_name=r.name)  # type: ignore[arg-type]
            if err is not None:
                set_error(result, err)
        return resp

    # --- cluster ------------------------------------------------------------------------

    @blocking
    def ControlledShutdown(
        self, request: cluster_pb2.ControlledShutdownRequest
    ) -> cluster_pb2.ControlledShutdownResponse:
        resp = cluster_pb2.ControlledShutdownResponse()
        try:
            remaining = self.cluster_api.controlled_shutdown(request.broker_id, opt(request, "broker_epoch", -1))
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
        try:
            self.cluster_api.apply_controller_states(
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
        targets = [
            ((t.name, p.partition_index), list(p.replicas.broker_ids) if p.HasField("replicas") else None)
            for t in request.topics
            for p in t.partitions
        ]
        timeout = opt(request, "timeout_ms", DEFAULT_REASSIGNMENT_TIMEOUT_MS)
        try:
            results = self.cluster_api.alter_partition_reassignments(targets, timeout)
        except Exception as exc:
            set_error(resp, as_response_error(exc))
            return resp
        for t in request.topics:
            topic = resp.responses.add(name=t.name)
            for p in t.partitions:
                r = topic.partitions.add(partition_index=p.partition_index)
                err = results.get((t.name, p.partition_index))
                if err is not None:
                    set_error(r, err)
        return resp

    @blocking
    def ListPartitionReassignments(
        self, request: reassignment_pb2.ListPartitionReassignmentsRequest
    ) -> reassignment_pb2.ListPartitionReassignmentsResponse:
        """Ongoing moves (of the named partitions, or all); the controller only."""
        resp = reassignment_pb2.ListPartitionReassignmentsResponse()
        tps = [(t.name, p) for t in request.topics for p in t.partition_indexes] if request.topics else None
        timeout = opt(request, "timeout_ms", DEFAULT_REASSIGNMENT_TIMEOUT_MS)
        try:
            ongoing = self.cluster_api.list_partition_reassignments(tps, timeout)
        except Exception as exc:
            set_error(resp, as_response_error(exc))
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
        try:
            results = self.cluster_api.elect_leaders(wanted, opt(request, "timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS))
        except ClusterAuthorizationFailedError as exc:
            for t, p in wanted or [("", -1)]:
                set_error(resp.results.add(topic=t, partition=p), exc)
            return resp
        for (t, p), err in results.items():
            r = resp.results.add(topic=t, partition=p)
            if err is not None:
                set_error(r, err)
        return resp
