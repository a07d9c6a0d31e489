"""Topic administration in ZooKeeper: what ``kafka-topics.sh --zookeeper`` did.

Used by the broker's admin RPCs and by ``kctl --zookeeper``. It validates, computes a
replica assignment and writes ``/config/topics/<t>`` + ``/brokers/topics/<t>``; the
controller reacts through its watches (partition state, deletion). Every check runs
before anything is written, so bad input changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from kbroker.cluster.assignment import assign_replicas, assign_replicas_rack_aware
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import Assignment, BrokerInfo
from kbroker.storage.log_config import LogConfig
from kclient.errors import (
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from kclient.topic_name import validate_topic_name


class TopicAdmin:
    """Create, delete and grow topics by writing their znodes."""

    def __init__(self, zk: ZkClient, *, default_partitions: int = 1, default_replication_factor: int = 1) -> None:
        self._zk = zk
        self.default_partitions = default_partitions
        self.default_replication_factor = default_replication_factor

    def create_topic(
        self,
        name: str,
        num_partitions: int = -1,
        replication_factor: int = -1,
        *,
        assignment: Mapping[int, list[int]] | None = None,
        configs: Mapping[str, str] | None = None,
        validate_only: bool = False,
    ) -> Assignment:
        validate_topic_name(name)
        config = dict(configs or {})
        LogConfig.from_properties(config)  # raises InvalidConfigurationError
        if self._zk.topic_exists(name):
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        normal = name.replace(".", "_")
        for existing in self._zk.topics():
            if existing != name and existing.replace(".", "_") == normal:
                raise InvalidTopicError(
                    f"topic {name!r} collides with existing topic {existing!r} ('.' and '_' collide in metric names)"
                )
        brokers = self._zk.live_brokers()
        live = sorted(brokers)
        if assignment:
            if num_partitions not in (-1, len(assignment)) or (
                replication_factor != -1 and any(len(r) != replication_factor for r in assignment.values())
            ):
                raise InvalidReplicaAssignmentError(
                    "give either an explicit replica assignment or partitions/replication factor, not both"
                )
            chosen = self._check_assignment(dict(assignment), set(live), first=0)
        else:
            partitions = self.default_partitions if num_partitions == -1 else num_partitions
            rf = self.default_replication_factor if replication_factor == -1 else replication_factor
            if partitions < 1:
                raise InvalidPartitionsError(f"number of partitions must be at least 1, got {partitions}")
            if rf < 1:
                raise InvalidReplicationFactorError(f"replication factor must be at least 1, got {rf}")
            if not live:
                raise InvalidReplicationFactorError("no broker is alive to host the topic")
            chosen = self._place(brokers, partitions, rf)
        if not validate_only:
            self._zk.create_topic(name, chosen, config)
        return chosen

    def delete_topic(self, name: str) -> None:
        validate_topic_name(name)
        if not self._zk.topic_exists(name):
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        self._zk.mark_topic_for_deletion(name)

    def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> Assignment:
        validate_topic_name(name)
        found = self._zk.topic_assignment(name)
        if found is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        current, version = found
        if total <= len(current):
            raise InvalidPartitionsError(
                f"topic {name!r} has {len(current)} partitions; the new count must be larger, got {total}"
            )
        rf = len(next(iter(current.values())))
        added = self._place(self._zk.live_brokers(), total - len(current), rf, first=len(current))
        new = {**current, **added}
        if not validate_only:
            self._zk.set_topic_assignment(name, new, version)
        return new

    def alter_config(self, name: str, configs: Mapping[str, str]) -> None:
        validate_topic_name(name)
        if not self._zk.topic_exists(name):
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        merged = {**self._zk.topic_config(name), **configs}
        LogConfig.from_properties(merged)
        self._zk.set_topic_config(name, merged)

    @staticmethod
    def _place(brokers: Mapping[int, BrokerInfo], partitions: int, rf: int, first: int = 0) -> Assignment:
        """Rack-aware when every live broker has a rack, rack-unaware when none has."""
        racks = {b: info.rack for b, info in brokers.items() if info.rack}
        if racks and len(racks) != len(brokers):
            missing = sorted(set(brokers) - set(racks))
            raise InvalidReplicaAssignmentError(
                f"some brokers have a rack and some do not (no rack: {missing}); give every broker a rack or none"
            )
        if racks:
            return assign_replicas_rack_aware(racks, partitions, rf, first_partition=first)
        return assign_replicas(sorted(brokers), partitions, rf, first_partition=first)

    @staticmethod
    def _check_assignment(assignment: Assignment, live: set[int], first: int) -> Assignment:
        if sorted(assignment) != list(range(first, first + len(assignment))):
            raise InvalidReplicaAssignmentError(
                f"partitions must be numbered {first}..{first + len(assignment) - 1}, got {sorted(assignment)}"
            )
        sizes = {len(r) for r in assignment.values()}
        if len(sizes) != 1 or 0 in sizes:
            raise InvalidReplicaAssignmentError("every partition needs the same, non-zero number of replicas")
        for p, replicas in assignment.items():
            if len(set(replicas)) != len(replicas):
                raise InvalidReplicaAssignmentError(f"partition {p} lists a broker twice: {replicas}")
            unknown = [b for b in replicas if b not in live]
            if unknown:
                raise InvalidReplicaAssignmentError(f"partition {p} names brokers that are not alive: {unknown}")
        return assignment
