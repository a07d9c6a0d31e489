"""Topic, config, leader, record and reassignment administration on the Kafka door:
Kafka's request -> one call of the core (:mod:`kbroker.api.admin_api`,
:mod:`kbroker.api.cluster_api`; the same validation and ACL checks as gRPC) -> Kafka's
response.

Versions: CreateTopics 2-7, DeleteTopics 1-5, CreatePartitions 0-3, DescribeConfigs
1-4, AlterConfigs 0-2 (the whole-set API, see :meth:`AdminApis.alter_configs`),
IncrementalAlterConfigs 0-1, ElectLeaders 0-2, DeleteRecords 0-2,
AlterPartitionReassignments 0, ListPartitionReassignments 0, DescribeLogDirs 1-4.
Not served: the versions below those (kio, Kafka's generated schemas, no longer carries
them; every current client speaks the served ones), DeleteTopics 6 (topics named by id),
ElectLeaders with ``election_type`` UNCLEAN (1) (the gRPC side elects preferred leaders
only: INVALID_REQUEST; unclean election follows ``unclean.leader.election.enable``).
DescribeConfigs v3+ answers each config's ``config_type`` and, when asked, its
``documentation`` (both from :data:`kbroker.config.BROKER_CONFIGS`).

CreateTopics v5+ answers what was created: the partition count and replication factor,
and the topic's configs (with their sources, as DescribeConfigs gives them; without
DESCRIBE_CONFIGS on the topic ``topic_config_error_code`` says so); v7 the topic id.
For ``validate_only`` nothing exists yet: the counts asked for (-1 for the broker
default) and the configs given.

Thread safety: handlers run on the door's loop; blocking core calls run on the request pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from kbroker.api.admin_api import ConfigChange, ConfigChanges, ConfigEntry, ConfigResource, NewPartitions, NewTopic
from kbroker.api.apis import BrokerApis
from kbroker.api.log_api import DeleteRecordsResult
from kbroker.doors.kafka.codec import build, millis, response_class, topic_uuid
from kbroker.doors.kafka.server import Api, KafkaRequest
from kclient.errors import BrokerResponseError, ClusterAuthorizationFailedError, InvalidRequestError, as_response_error

T = TypeVar("T")

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


def _message(err: BrokerResponseError | None) -> str | None:
    return err.message or None if err is not None else None


def _code(err: BrokerResponseError | None) -> int:
    return err.errno if err is not None else 0


def _config_entries(
    entries: list[ConfigEntry], synonyms: bool = True, documentation: bool = False
) -> list[dict[str, Any]]:
    return [
        {
            "name": e.name,
            "value": e.value,
            "read_only": e.read_only,
            "is_default": e.is_default,
            "config_source": int(e.source),
            "is_sensitive": e.sensitive,
            "synonyms": [
                {"name": s.name, "value": s.value, "source": int(s.source)} for s in (e.synonyms if synonyms else ())
            ],
            "config_type": e.config_type,
            "documentation": e.documentation if documentation else None,
        }
        for e in entries
    ]


class AdminApis:
    """The administration APIs over the core's :class:`BrokerApis`."""

    def __init__(self, core: BrokerApis) -> None:
        self._admin = core.admin
        self._cluster = core.cluster
        self._log = core.log
        self._offload = core.offload

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

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._offload(fn, *args)  # type: ignore[no-any-return]

    # --- topics ---------------------------------------------------------------------

    async def create_topics(self, req: KafkaRequest) -> Any:
        p = req.payload
        asked = [
            NewTopic(
                t.name,
                int(t.num_partitions),
                int(t.replication_factor),
                {int(a.partition_index): [int(b) for b in a.broker_ids] for a in t.assignments},
                {c.name: c.value for c in t.configs if c.value is not None},
            )
            for t in p.topics
        ]
        validate_only = bool(p.validate_only)
        outcomes = dict(await self._call(self._admin.create_topics, asked, millis(p.timeout), validate_only))
        created = [t for t in asked if outcomes.get(t.name) is None]
        details = await self._created(req, created, validate_only)
        topics = []
        for t in p.topics:
            err = outcomes[t.name]
            entry: dict[str, Any] = {"name": t.name, "error_code": _code(err), "error_message": _message(err)}
            if err is None:
                entry.update(details.get(t.name, {}))
            topics.append(entry)
        return build(response_class(CREATE_TOPICS, req.version), {"topics": topics})

    async def _created(
        self, req: KafkaRequest, created: list[NewTopic], validate_only: bool
    ) -> dict[str, dict[str, Any]]:
        """What CreateTopics v5+ tells about each created topic (see the module docstring)."""
        if req.version < 5 or not created:
            return {}
        if validate_only:
            return {
                t.name: {
                    "num_partitions": len(t.assignment or {}) or t.num_partitions,
                    "replication_factor": (
                        len(next(iter(t.assignment.values()))) if t.assignment else t.replication_factor
                    ),
                    "configs": [{"name": k, "value": v, "config_source": 1} for k, v in sorted(t.configs.items())],
                }
                for t in created
            }
        names = [t.name for t in created]
        described = await self._call(self._admin.describe_topics, names)
        configs = await self._call(self._admin.describe_configs, [ConfigResource(TOPIC_RESOURCE, n) for n in names])
        out: dict[str, dict[str, Any]] = {}
        for d in described:
            if d.error is not None:
                continue
            out[d.name] = {
                "topic_id": topic_uuid(d.topic_id),
                "num_partitions": len(d.partitions),
                "replication_factor": len(d.partitions[0].replicas) if d.partitions else -1,
            }
        for c in configs:
            entry = out.setdefault(c.name, {})
            if c.error is not None:
                entry["topic_config_error_code"] = c.error.errno
            else:
                entry["configs"] = _config_entries(c.entries, synonyms=False)
        return out

    async def delete_topics(self, req: KafkaRequest) -> Any:
        p = req.payload
        outcomes = await self._call(self._admin.delete_topics, [str(n) for n in p.topic_names], millis(p.timeout))
        return build(
            response_class(DELETE_TOPICS, req.version),
            {"responses": [{"name": n, "error_code": _code(e), "error_message": _message(e)} for n, e in outcomes]},
        )

    async def create_partitions(self, req: KafkaRequest) -> Any:
        p = req.payload
        asked = [
            NewPartitions(t.name, int(t.count), [[int(b) for b in a.broker_ids] for a in t.assignments or ()])
            for t in p.topics
        ]
        results: dict[str, BrokerResponseError | None] = {}
        if asked:
            results = dict(
                await self._call(self._admin.create_partitions, asked, millis(p.timeout), bool(p.validate_only))
            )
        return build(
            response_class(CREATE_PARTITIONS, req.version),
            {
                "results": [
                    {"name": t.name, "error_code": _code(results[t.name]), "error_message": _message(results[t.name])}
                    for t in p.topics
                ]
            },
        )

    # --- configs --------------------------------------------------------------------

    async def describe_configs(self, req: KafkaRequest) -> Any:
        p = req.payload
        wanted = [
            ConfigResource(int(r.resource_type), r.resource_name, list(r.configuration_keys or ())) for r in p.resources
        ]
        described = await self._call(self._admin.describe_configs, wanted)
        synonyms, documentation = bool(p.include_synonyms), bool(getattr(p, "include_documentation", False))
        return build(
            response_class(DESCRIBE_CONFIGS, req.version),
            {
                "results": [
                    {
                        "error_code": _code(d.error),
                        "error_message": _message(d.error),
                        "resource_type": d.resource_type,
                        "resource_name": d.name,
                        "configs": _config_entries(d.entries, synonyms, documentation),
                    }
                    for d in described
                ]
            },
        )

    async def incremental_alter_configs(self, req: KafkaRequest) -> Any:
        p = req.payload
        changes = [
            ConfigChanges(
                int(r.resource_type),
                r.resource_name,
                [ConfigChange(c.name, int(c.config_operation), c.value) for c in r.configs],
            )
            for r in p.resources
        ]
        answered = await self._call(self._admin.incremental_alter_configs, changes, bool(p.validate_only))
        return build(
            response_class(INCREMENTAL_ALTER_CONFIGS, req.version),
            {
                "responses": [
                    {
                        "error_code": _code(err),
                        "error_message": _message(err),
                        "resource_type": r.resource_type,
                        "resource_name": r.name,
                    }
                    for r, err in answered
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
        described = {
            (d.resource_type, d.name): d
            for d in await self._call(self._admin.describe_configs, [ConfigResource(t, n) for t, n in wanted])
        }
        refused: dict[tuple[int, str], BrokerResponseError] = {}
        changes = []
        for key, r in wanted.items():
            current = described.get(key)
            if current is not None and current.error is not None:
                refused[key] = current.error
                continue
            given = {c.name for c in r.configs}
            ops = [ConfigChange(c.name, SET, c.value) for c in r.configs]
            ops += [
                ConfigChange(e.name, DELETE)
                for e in (current.entries if current is not None else ())
                if int(e.source) in _OVERRIDE_SOURCES.get((key[0], bool(key[1])), ()) and e.name not in given
            ]
            changes.append(ConfigChanges(key[0], key[1], ops))
        answered: dict[tuple[int, str], BrokerResponseError | None] = {}
        if changes:
            done = await self._call(self._admin.incremental_alter_configs, changes, bool(p.validate_only))
            answered = {(r.resource_type, r.name): err for r, err in done}
        out = []
        for key in wanted:
            err = refused.get(key) or answered.get(key)
            out.append(
                {
                    "error_code": _code(err),
                    "error_message": _message(err),
                    "resource_type": key[0],
                    "resource_name": key[1],
                }
            )
        return build(response_class(ALTER_CONFIGS, req.version), {"responses": out})

    # --- leaders, records, log dirs ---------------------------------------------------

    async def elect_leaders(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(ELECT_LEADERS, req.version)
        if int(getattr(p, "election_type", PREFERRED_ELECTION)) != PREFERRED_ELECTION:
            return build(cls, {"error_code": INVALID_REQUEST})  # see the module docstring
        wanted = [(t.topic, int(i)) for t in p.topic_partitions or () for i in t.partitions]
        top = 0
        try:
            results = await self._call(self._cluster.elect_leaders, wanted, millis(p.timeout))
        except ClusterAuthorizationFailedError as exc:  # as Kafka: at the top (v1+) and per partition
            top, results = exc.errno, dict.fromkeys(wanted, exc)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), err in results.items():
            by_topic.setdefault(topic, []).append(
                {"partition_id": partition, "error_code": _code(err), "error_message": _message(err)}
            )
        return build(
            cls,
            {
                "error_code": top,
                "replica_election_results": [{"topic": t, "partition_result": rs} for t, rs in by_topic.items()],
            },
        )

    async def delete_records(self, req: KafkaRequest) -> Any:
        p = req.payload
        offsets = [((t.name, int(x.partition_index)), int(x.offset)) for t in p.topics for x in t.partitions]
        try:
            results = await self._log.delete_records(millis(p.timeout), offsets)
        except BrokerResponseError as exc:
            results = {tp: DeleteRecordsResult(exc) for tp, _ in offsets}
        return build(
            response_class(DELETE_RECORDS, req.version),
            {
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            _low_watermark(int(x.partition_index), results[(t.name, int(x.partition_index))])
                            for x in t.partitions
                        ],
                    }
                    for t in p.topics
                ]
            },
        )

    async def describe_log_dirs(self, req: KafkaRequest) -> Any:
        p = req.payload
        wanted: dict[str, set[int] | None] | None = None
        if p.topics:
            wanted = {}
            for t in p.topics:
                parts = {int(i) for i in t.partitions}
                known = wanted.get(t.topic, set())
                wanted[t.topic] = None if known is None or not parts else known | parts
        cls = response_class(DESCRIBE_LOG_DIRS, req.version)
        try:
            dirs = await self._call(self._admin.describe_log_dirs, wanted)
        except BrokerResponseError as exc:
            return build(cls, {"error_code": exc.errno, "results": []})
        return build(
            cls,
            {
                "error_code": 0,
                "results": [
                    {
                        "error_code": _code(d.error),
                        "log_dir": d.path,
                        "total_bytes": d.total_bytes,
                        "usable_bytes": d.usable_bytes,
                        "topics": [
                            {
                                "name": name,
                                "partitions": [
                                    {
                                        "partition_index": x.partition,
                                        "partition_size": x.size,
                                        "offset_lag": x.offset_lag,
                                        "is_future_key": False,
                                    }
                                    for x in parts
                                ],
                            }
                            for name, parts in d.topics.items()
                        ],
                    }
                    for d in dirs
                ],
            },
        )

    # --- reassignments ------------------------------------------------------------------

    async def alter_reassignments(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(ALTER_PARTITION_REASSIGNMENTS, req.version)
        targets = [
            ((t.name, int(x.partition_index)), [int(b) for b in x.replicas] if x.replicas is not None else None)
            for t in p.topics
            for x in t.partitions
        ]  # null replicas: cancel the move
        try:
            results = await self._call(self._cluster.alter_partition_reassignments, targets, millis(p.timeout))
        except Exception as exc:
            err = as_response_error(exc)
            return build(cls, {"error_code": err.errno, "error_message": _message(err), "responses": []})
        return build(
            cls,
            {
                "error_code": 0,
                "error_message": None,
                "responses": [
                    {
                        "name": t.name,
                        "partitions": [
                            {
                                "partition_index": int(x.partition_index),
                                "error_code": _code(results.get((t.name, int(x.partition_index)))),
                                "error_message": _message(results.get((t.name, int(x.partition_index)))),
                            }
                            for x in t.partitions
                        ],
                    }
                    for t in p.topics
                ],
            },
        )

    async def list_reassignments(self, req: KafkaRequest) -> Any:
        p = req.payload
        cls = response_class(LIST_PARTITION_REASSIGNMENTS, req.version)
        tps = [(t.name, int(i)) for t in p.topics for i in t.partition_indexes] if p.topics else None
        try:
            ongoing = await self._call(self._cluster.list_partition_reassignments, tps, millis(p.timeout))
        except Exception as exc:
            err = as_response_error(exc)
            return build(cls, {"error_code": err.errno, "error_message": _message(err), "topics": []})
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (name, partition), (replicas, adding, removing) in sorted(ongoing.items()):
            by_topic.setdefault(name, []).append(
                {
                    "partition_index": partition,
                    "replicas": replicas,
                    "adding_replicas": adding,
                    "removing_replicas": removing,
                }
            )
        return build(
            cls,
            {
                "error_code": 0,
                "error_message": None,
                "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
            },
        )


def _low_watermark(partition: int, r: DeleteRecordsResult) -> dict[str, Any]:
    return {
        "partition_index": partition,
        "low_watermark": r.low_watermark if r.error is None else -1,
        "error_code": _code(r.error),
    }
