"""Topic, config, leader, record and reassignment administration on the Kafka door:
Kafka's request -> the servicer's protobuf request -> the same handler as gRPC (its
validation, ACL checks and core calls) -> Kafka's response.

Versions: CreateTopics 2-7, DeleteTopics 1-5, CreatePartitions 0-3, DescribeConfigs
1-4, AlterConfigs 0-2 (the whole-set API, see :meth:`AdminApis.alter_configs`),
IncrementalAlterConfigs 0-1, ElectLeaders 0-2, DeleteRecords 0-2,
AlterPartitionReassignments 0, ListPartitionReassignments 0, DescribeLogDirs 1-4.
Not served: the versions below those (kio, Kafka's generated schemas, no longer carries
them; every current client speaks the served ones), DeleteTopics 6 (topics named by id),
ElectLeaders with ``election_type`` UNCLEAN (1) (the gRPC side elects preferred leaders
only: INVALID_REQUEST; unclean election follows ``unclean.leader.election.enable``), and
DescribeConfigs' ``config_type``/``documentation`` (UNKNOWN and null: the servicer has
neither).

CreateTopics v5+ answers what was created: the partition count and replication factor,
and the topic's configs (with their sources, as DescribeConfigs gives them; without
DESCRIBE_CONFIGS on the topic ``topic_config_error_code`` says so); v7 the topic id.
For ``validate_only`` nothing exists yet: the counts asked for (-1 for the broker
default) and the configs given.

Thread safety: handlers run on the door's loop; the servicer offloads blocking work.
"""

from __future__ import annotations

from typing import Any

from kbroker.doors.grpc.servicer import BrokerService
from kbroker.doors.kafka.codec import build, millis, response_class, topic_uuid
from kbroker.doors.kafka.server import Api, KafkaRequest
from kbroker.doors.kafka.service_call import RequestRefused
from kclient.errors import InvalidRequestError
from kclient.proto.kbroker.v1 import admin_pb2, cluster_pb2, config_pb2, log_pb2, reassignment_pb2

INVALID_REQUEST = InvalidRequestError.errno

CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, DESCRIBE_CONFIGS = 19, 20, 21, 32
ALTER_CONFIGS = 33
DESCRIBE_LOG_DIRS, CREATE_PARTITIONS, ELECT_LEADERS, INCREMENTAL_ALTER_CONFIGS = 35, 37, 43, 44
ALTER_PARTITION_REASSIGNMENTS, LIST_PARTITION_REASSIGNMENTS = 45, 46
PREFERRED_ELECTION = 0
SET, DELETE = 0, 1  # IncrementalAlterConfigs' config_operation
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
_OVERRIDE_SOURCES = {
    (TOPIC_RESOURCE, True): (1,),  # DYNAMIC_TOPIC_CONFIG
    (BROKER_RESOURCE, True): (2,),  # DYNAMIC_BROKER_CONFIG (one broker)
    (BROKER_RESOURCE, False): (3,),  # DYNAMIC_DEFAULT_BROKER_CONFIG (resource name "")
}
"""(resource type, named) -> the DescribeConfigs sources AlterConfigs replaces."""


def _message(msg: Any) -> str | None:
    return msg.error_message or None


def _config_entries(result: config_pb2.DescribeConfigsResult) -> list[dict[str, Any]]:
    return [
        {
            "name": c.name,
            "value": c.value if c.HasField("value") else None,
            "read_only": c.read_only,
            "is_default": c.is_default,
            "config_source": int(c.config_source),
            "is_sensitive": c.is_sensitive,
            "synonyms": [
                {"name": s.name, "value": s.value if s.HasField("value") else None, "source": int(s.source)}
                for s in c.synonyms
            ],
            "documentation": None,
        }
        for c in result.configs
    ]


class AdminApis:
    """The administration APIs over one :class:`BrokerService`."""

    def __init__(self, service: BrokerService) -> None:
        self._service = service

    def apis(self) -> list[Api]:
        return [
            Api(CREATE_TOPICS, "CreateTopics", 2, 7, self.create_topics),
            Api(DELETE_TOPICS, "DeleteTopics", 1, 5, self.delete_topics),
            Api(DELETE_RECORDS, "DeleteRecords", 0, 2, self.delete_records),
            Api(DESCRIBE_CONFIGS, "DescribeConfigs", 1, 4, self.describe_configs),
            Api(DESCRIBE_LOG_DIRS, "DescribeLogDirs", 1, 4, self.describe_log_dirs),
            Api(CREATE_PARTITIONS, "CreatePartitions", 0, 3, self.create_partitions),
            Api(ELECT_LEADERS, "ElectLeaders", 0, 2, self.elect_leaders),
            Api(ALTER_CONFIGS, "AlterConfigs", 0, 2, self.alter_configs),
            Api(INCREMENTAL_ALTER_CONFIGS, "IncrementalAlterConfigs", 0, 1, self.incremental_alter_configs),
            Api(ALTER_PARTITION_REASSIGNMENTS, "AlterPartitionReassignments", 0, 0, self.alter_reassignments),
            Api(LIST_PARTITION_REASSIGNMENTS, "ListPartitionReassignments", 0, 0, self.list_reassignments),
        ]

    async def _call(self, rpc: str, proto: Any, req: KafkaRequest) -> Any:
        """The servicer's answer to ``proto`` (RequestRefused if it refused the whole request)."""
        return await getattr(self._service, rpc)(proto, req.service_context())

    # --- topics ---------------------------------------------------------------------

    async def create_topics(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = admin_pb2.CreateTopicsRequest(timeout_ms=millis(p.timeout), validate_only=bool(p.validate_only))
        for t in p.topics:
            ct = proto.topics.add(name=t.name, num_partitions=int(t.num_partitions))
            ct.replication_factor = int(t.replication_factor)
            for a in t.assignments:
                ct.assignments[int(a.partition_index)].broker_ids.extend(int(b) for b in a.broker_ids)
            ct.configs.update({c.name: c.value for c in t.configs if c.value is not None})
        resp = await self._call("CreateTopics", proto, req)
        created = {r.name: r for r in resp.topics}
        details = await self._created(req, proto, [r.name for r in resp.topics if r.error_code == 0])
        topics = []
        for t in p.topics:
            r = created[t.name]
            entry: dict[str, Any] = {"name": t.name, "error_code": r.error_code, "error_message": _message(r)}
            if r.error_code == 0:
                entry.update(details.get(t.name, {}))
            topics.append(entry)
        return build(response_class(CREATE_TOPICS, req.version), {"topics": topics})

    async def _created(
        self, req: KafkaRequest, proto: admin_pb2.CreateTopicsRequest, names: list[str]
    ) -> dict[str, dict[str, Any]]:
        """What CreateTopics v5+ tells about each created topic (see the module docstring)."""
        if req.version < 5 or not names:
            return {}
        if proto.validate_only:
            asked = {t.name: t for t in proto.topics}
            return {
                n: {
                    "num_partitions": len(asked[n].assignments) or asked[n].num_partitions,
                    "replication_factor": (
                        len(next(iter(asked[n].assignments.values())).broker_ids)
                        if asked[n].assignments
                        else asked[n].replication_factor
                    ),
                    "configs": [
                        {"name": k, "value": v, "config_source": 1} for k, v in sorted(asked[n].configs.items())
                    ],
                }
                for n in names
            }
        described = await self._call("DescribeTopics", admin_pb2.DescribeTopicsRequest(topics=names), req)
        configs = await self._call(
            "DescribeConfigs",
            config_pb2.DescribeConfigsRequest(
                resources=[
                    config_pb2.DescribeConfigsResource(resource_type=config_pb2.TOPIC, resource_name=n) for n in names
                ]
            ),
            req,
        )
        out: dict[str, dict[str, Any]] = {}
        for d in described.topics:
            if d.error_code != 0:
                continue
            out[d.name] = {
                "topic_id": topic_uuid(d.topic_id),
                "num_partitions": len(d.partitions),
                "replication_factor": len(d.partitions[0].replica_nodes) if d.partitions else -1,
            }
        for c in configs.results:
            entry = out.setdefault(c.resource_name, {})
            if c.error_code != 0:
                entry["topic_config_error_code"] = int(c.error_code)
            else:
                entry["configs"] = _config_entries(c)
        return out

    async def delete_topics(self, req: KafkaRequest) -> Any:
        p = req.payload
        names = [str(n) for n in p.topic_names]
        resp = await self._call(
            "DeleteTopics", admin_pb2.DeleteTopicsRequest(topics=names, timeout_ms=millis(p.timeout)), req
        )
        return build(
            response_class(DELETE_TOPICS, req.version),
            {
                "responses": [
                    {"name": r.name, "error_code": r.error_code, "error_message": _message(r)} for r in resp.topics
                ]
            },
        )

    async def create_partitions(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = admin_pb2.CreatePartitionsRequest(timeout_ms=millis(p.timeout), validate_only=bool(p.validate_only))
        for t in p.topics:
            proto.topics.append(
                admin_pb2.PartitionsIncrease(
                    name=t.name,
                    count=int(t.count),
                    assignments=[
                        admin_pb2.ReplicaList(broker_ids=[int(b) for b in a.broker_ids]) for a in t.assignments or ()
                    ],
                )
            )
        results = {}
        if proto.topics:
            resp = await self._call("CreatePartitions", proto, req)
            results = {r.name: {"error_code": r.error_code, "error_message": _message(r)} for r in resp.topics}
        return build(
            response_class(CREATE_PARTITIONS, req.version),
            {"results": [{"name": t.name, **results[t.name]} for t in p.topics]},
        )

    # --- configs --------------------------------------------------------------------

    async def describe_configs(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = config_pb2.DescribeConfigsRequest(include_synonyms=bool(p.include_synonyms))
        for r in p.resources:
            proto.resources.add(
                resource_type=int(r.resource_type),
                resource_name=r.resource_name,
                configuration_keys=list(r.configuration_keys or ()),
            )
        resp = await self._call("DescribeConfigs", proto, req)
        return build(
            response_class(DESCRIBE_CONFIGS, req.version),
            {
                "results": [
                    {
                        "error_code": r.error_code,
                        "error_message": _message(r),
                        "resource_type": int(r.resource_type),
                        "resource_name": r.resource_name,
                        "configs": _config_entries(r),
                    }
                    for r in resp.results
                ]
            },
        )

    async def incremental_alter_configs(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = config_pb2.IncrementalAlterConfigsRequest(validate_only=bool(p.validate_only))
        for r in p.resources:
            res = proto.resources.add(resource_type=int(r.resource_type), resource_name=r.resource_name)
            for c in r.configs:
                entry = res.configs.add(name=c.name, config_operation=int(c.config_operation))
                if c.value is not None:
                    entry.value = c.value
        resp = await self._call("IncrementalAlterConfigs", proto, req)
        return build(
            response_class(INCREMENTAL_ALTER_CONFIGS, req.version),
            {
                "responses": [
                    {
                        "error_code": r.error_code,
                        "error_message": _message(r),
                        "resource_type": int(r.resource_type),
                        "resource_name": r.resource_name,
                    }
                    for r in resp.responses
                ]
            },
        )

    async def alter_configs(self, req: KafkaRequest) -> Any:
        """The whole-set AlterConfigs (librdkafka before 2.2 knows no other): the configs
        given are set, and the resource's other dynamic overrides removed, as Kafka does.
        Served as DescribeConfigs (which overrides the resource has now) then one
        IncrementalAlterConfigs of SETs and DELETEs: not atomic against a concurrent
        change of the same resource (Kafka's is not either across brokers)."""
        p = req.payload
        wanted = {(int(r.resource_type), r.resource_name): r for r in p.resources}
        describe = config_pb2.DescribeConfigsRequest()
        for rtype, name in wanted:
            describe.resources.add(resource_type=rtype, resource_name=name)  # type: ignore[arg-type]
        described = {
            (int(r.resource_type), r.resource_name): r
            for r in (await self._call("DescribeConfigs", describe, req)).results
        }
        refused: dict[tuple[int, str], Any] = {}
        proto = config_pb2.IncrementalAlterConfigsRequest(validate_only=bool(p.validate_only))
        for key, r in wanted.items():
            current = described.get(key)
            if current is not None and current.error_code:
                refused[key] = current
                continue
            res = proto.resources.add(resource_type=key[0], resource_name=key[1])  # type: ignore[arg-type]
            given = {c.name for c in r.configs}
            for c in r.configs:
                entry = res.configs.add(name=c.name, config_operation=SET)
                if c.value is not None:
                    entry.value = c.value
            for c in current.configs if current is not None else ():
                if int(c.config_source) in _OVERRIDE_SOURCES.get((key[0], bool(key[1])), ()) and c.name not in given:
                    res.configs.add(name=c.name, config_operation=DELETE)
        answered = {}
        if proto.resources:
            resp = await self._call("IncrementalAlterConfigs", proto, req)
            answered = {(int(r.resource_type), r.resource_name): r for r in resp.responses}
        out = []
        for key in wanted:
            r = refused.get(key) or answered.get(key)
            code, message = (r.error_code, _message(r)) if r is not None else (0, None)
            out.append({"error_code": code, "error_message": message, "resource_type": key[0], "resource_name": key[1]})
        return build(response_class(ALTER_CONFIGS, req.version), {"responses": out})

    # --- leaders, records, log dirs ---------------------------------------------------

    async def elect_leaders(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(ELECT_LEADERS, req.version)
        if int(getattr(p, "election_type", PREFERRED_ELECTION)) != PREFERRED_ELECTION:
            return build(cls, {"error_code": INVALID_REQUEST})  # see the module docstring
        proto = cluster_pb2.ElectLeadersRequest(timeout_ms=millis(p.timeout))
        for t in p.topic_partitions or ():
            proto.partitions.extend(cluster_pb2.PartitionRef(topic=t.topic, partition=int(i)) for i in t.partitions)
        resp = await self._call("ElectLeaders", proto, req)
        whole = [r for r in resp.results if not r.topic and r.partition == -1]
        if whole and req.version >= 1:  # refused as a whole (CLUSTER_AUTHORIZATION_FAILED)
            return build(cls, {"error_code": whole[0].error_code})
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for r in resp.results:
            if r.topic:
                by_topic.setdefault(r.topic, []).append(
                    {"partition_id": r.partition, "error_code": r.error_code, "error_message": _message(r)}
                )
        return build(
            cls,
            {"replica_election_results": [{"topic": t, "partition_result": rs} for t, rs in by_topic.items()]},
        )

    async def delete_records(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = log_pb2.DeleteRecordsRequest(timeout_ms=millis(p.timeout))
        for t in p.topics:
            proto.topics.add(
                name=t.name,
                partitions=[
                    log_pb2.DeleteRecordsPartition(index=int(x.partition_index), offset=int(x.offset))
                    for x in t.partitions
                ],
            )
        cls = response_class(DELETE_RECORDS, req.version)
        try:
            resp = await self._call("DeleteRecords", proto, req)
        except RequestRefused as exc:
            resp = log_pb2.DeleteRecordsResponse()
            for t in proto.topics:
                resp.topics.add(
                    name=t.name,
                    partitions=[
                        log_pb2.DeleteRecordsPartitionResult(index=x.index, low_watermark=-1, error_code=exc.errno)  # type: ignore[arg-type]
                        for x in t.partitions
                    ],
                )
        return build(
            cls,
            {
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            {"partition_index": r.index, "low_watermark": r.low_watermark, "error_code": r.error_code}
                            for r in t.partitions
                        ],
                    }
                    for t in resp.topics
                ]
            },
        )

    async def describe_log_dirs(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = admin_pb2.DescribeLogDirsRequest()
        for t in p.topics or ():
            proto.topics.add(name=t.topic, partitions=[int(i) for i in t.partitions])
        resp = await self._call("DescribeLogDirs", proto, req)
        return build(
            response_class(DESCRIBE_LOG_DIRS, req.version),
            {
                "error_code": resp.error_code,
                "results": [
                    {
                        "error_code": d.error_code,
                        "log_dir": d.log_dir,
                        "total_bytes": d.total_bytes,
                        "usable_bytes": d.usable_bytes,
                        "topics": [
                            {
                                "name": t.name,
                                "partitions": [
                                    {
                                        "partition_index": x.partition_index,
                                        "partition_size": x.partition_size,
                                        "offset_lag": x.offset_lag,
                                        "is_future_key": x.is_future_key,
                                    }
                                    for x in t.partitions
                                ],
                            }
                            for t in d.topics
                        ],
                    }
                    for d in resp.results
                ],
            },
        )

    # --- reassignments ------------------------------------------------------------------

    async def alter_reassignments(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = reassignment_pb2.AlterPartitionReassignmentsRequest(timeout_ms=millis(p.timeout))
        for t in p.topics:
            rt = proto.topics.add(name=t.name)
            for x in t.partitions:
                rp = rt.partitions.add(partition_index=int(x.partition_index))
                if x.replicas is not None:  # null: cancel the move
                    rp.replicas.broker_ids.extend(int(b) for b in x.replicas)
        resp = await self._call("AlterPartitionReassignments", proto, req)
        return build(
            response_class(ALTER_PARTITION_REASSIGNMENTS, req.version),
            {
                "error_code": resp.error_code,
                "error_message": _message(resp),
                "responses": [
                    {
                        "name": t.name,
                        "partitions": [
                            {
                                "partition_index": x.partition_index,
                                "error_code": x.error_code,
                                "error_message": _message(x),
                            }
                            for x in t.partitions
                        ],
                    }
                    for t in resp.responses
                ],
            },
        )

    async def list_reassignments(self, req: KafkaRequest) -> Any:
        p = req.payload
        proto = reassignment_pb2.ListPartitionReassignmentsRequest(timeout_ms=millis(p.timeout))
        for t in p.topics or ():
            proto.topics.add(name=t.name, partition_indexes=[int(i) for i in t.partition_indexes])
        resp = await self._call("ListPartitionReassignments", proto, req)
        return build(
            response_class(LIST_PARTITION_REASSIGNMENTS, req.version),
            {
                "error_code": resp.error_code,
                "error_message": _message(resp),
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            {
                                "partition_index": x.partition_index,
                                "replicas": list(x.replicas),
                                "adding_replicas": list(x.adding_replicas),
                                "removing_replicas": list(x.removing_replicas),
                            }
                            for x in t.partitions
                        ],
                    }
                    for t in resp.topics
                ],
            },
        )
