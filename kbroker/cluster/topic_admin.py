"""Topic administration in ZooKeeper: what ``kafka-topics.sh --zookeeper`` did.

Used by the broker's admin RPCs and by ``kctl --zookeeper``. It validates, computes a
replica assignment and writes ``/config/topics/<t>`` + ``/brokers/topics/<t>``; the
controller reacts through its watches (partition state, deletion). Every check runs
before anything is written, so bad input changes nothing.

Adding partitions is refused (ReassignmentInProgressError, as Kafka's
``AdminZkClient.addPartitions``) while a partition of the topic is being reassigned;
new partitions get the replication factor of the existing partitions' targets.

Counts: -1 means the broker default (``num.partitions``, ``default.replication.factor``);
0 or below -1 is refused (InvalidPartitionsError / InvalidReplicationFactorError), as is
a replication factor above the live brokers.

Bounds (each partition replica costs a broker a directory and three open files, and a
topic's assignment is one znode):

* ``max.partitions.per.topic`` (default 10,000): more partitions in one topic, created
  or grown to, is InvalidPartitionsError. It refuses absurd counts (10^6) before any
  placement is computed; 10,000 partitions at RF 3 is a ~200 KB assignment znode.
* ``max.broker.partitions`` (KIP-578's name; default 4,000, the ZooKeeper-era guidance
  per broker, ~12,000 file descriptors): a creation that would put more partition
  replicas than that on any broker is PolicyViolationError. It counts every topic's
  assignment, so it also bounds a request that creates many topics. Two concurrent
  creations may together pass it by the size of one (it is checked, not reserved).

Without a ZooKeeper connection (its quorum lost, or this broker cut off from it), a
create, delete or grow waits up to ``zookeeper_wait_s`` (default 5 s) for it, then raises
RequestTimedOutError having changed nothing. kazoo queues a request made while
disconnected and blocks until the connection returns: without this bound a request
thread would be pinned for the whole outage, and a creation the client had long seen
time out would happen when the quorum returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kazoo.exceptions import BadVersionError, NodeExistsError

from kbroker.cluster.assignment import assign_replicas, assign_replicas_rack_aware
from kbroker.cluster.zk_client import CONNECTION_WAIT_S, ZkClient
from kbroker.cluster.zkdata import Assignment, BrokerInfo
from kbroker.storage.log_config import LogConfig
from kclient.errors import (
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    PolicyViolationError,
    ReassignmentInProgressError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from kclient.topic_name import validate_topic_name

MAX_PARTITIONS_PER_TOPIC = 10_000
MAX_BROKER_PARTITIONS = 4_000


class TopicAdmin:
    """Create, delete and grow topics by writing their znodes (thread-safe: no state)."""

    def __init__(
        self,
        zk: ZkClient,
        *,
        default_partitions: int = 1,
        default_replication_factor: int = 1,
        max_partitions_per_topic: int = MAX_PARTITIONS_PER_TOPIC,
        max_broker_partitions: int = MAX_BROKER_PARTITIONS,
        zookeeper_wait_s: float = CONNECTION_WAIT_S,
    ) -> None:
        self._zk = zk
        self.zookeeper_wait_s = zookeeper_wait_s
        self.default_partitions = default_partitions
        self.default_replication_factor = default_replication_factor
        self.max_partitions_per_topic = max_partitions_per_topic
        self.max_broker_partitions = max_broker_partitions

    def auto_create_topic(self, name: str) -> bool:
        """``auto.create.topics.enable``: create ``name`` with the broker defaults.

        True if this call created it, False if it exists already (another request,
        or another broker, won the race: not an error). Raises as :meth:`create_topic`
        does otherwise (InvalidTopicError, InvalidReplicationFactorError when fewer
        brokers are alive than ``default.replication.factor``, PolicyViolationError).
        """
        try:
            self.create_topic(name)
        except TopicAlreadyExistsError:
            return False
        return True

    def create_topic(
        self,
        name: str,
        num_partitions: int = -1,
        replication_factor: int = -1,
        *,
        assignment: Mapping[int, list[int]] | None = None,
        configs: Mapping[str, str] | None = None,
        validate_only: bool = False,
        zookeeper_wait_s: float | None = None,
    ) -> Assignment:
        """Write a new topic (not with ``validate_only``); its assignment. ``zookeeper_wait_s``
        overrides the wait for a lost connection (a request's later topics: 0)."""
        validate_topic_name(name)
        config = dict(configs or {})
        LogConfig.from_properties(config)  # raises InvalidConfigurationError
        partitions = self._count(
            num_partitions, self.default_partitions, "number of partitions", InvalidPartitionsError
        )
        rf = self._count(
            replication_factor, self.default_replication_factor, "replication factor", InvalidReplicationFactorError
        )
        if assignment:
            partitions = len(assignment)
        self._check_partitions(name, partitions)
        self._wait_for_zookeeper(f"creating topic {name!r}", zookeeper_wait_s)
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
            if not live:
                raise InvalidReplicationFactorError("no broker is alive to host the topic")
            if rf > len(live):
                raise InvalidReplicationFactorError(
                    f"replication factor {rf} is larger than the {len(live)} live broker(s)"
                )
            self._check_broker_load(name, partitions * rf, len(live), None)
            chosen = self._place(brokers, partitions, rf)
        self._check_broker_load(name, 0, len(live), chosen)
        if not validate_only:
            self._zk.create_topic(name, chosen, config)
        return chosen

    def _wait_for_zookeeper(self, what: str, wait_s: float | None) -> None:
        """Return once the session is connected; RequestTimedOutError after ``wait_s``
        (None: ``zookeeper_wait_s``)."""
        self._zk.require_connection(what, RequestTimedOutError, self.zookeeper_wait_s if wait_s is None else wait_s)

    def delete_topic(self, name: str, *, zookeeper_wait_s: float | None = None) -> None:
        validate_topic_name(name)
        self._wait_for_zookeeper(f"deleting topic {name!r}", zookeeper_wait_s)
        if not self._zk.topic_exists(name):
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        self._zk.mark_topic_for_deletion(name)

    def create_partitions(
        self,
        name: str,
        total: int,
        *,
        validate_only: bool = False,
        assignments: Sequence[Sequence[int]] = (),
        zookeeper_wait_s: float | None = None,
    ) -> Assignment:
        """Grow ``name`` to ``total`` partitions; ``assignments``: the replicas of each new
        partition in order (Kafka's CreatePartitions assignments), else placed here."""
        validate_topic_name(name)
        self._wait_for_zookeeper(f"adding partitions to topic {name!r}", zookeeper_wait_s)
        found = self._zk.topic_znode(name)
        if found is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        znode, version = found
        moving = znode.reassigning_partitions
        if moving:
            raise ReassignmentInProgressError(
                f"topic {name!r} has partitions being reassigned ({moving}); add partitions after the move"
            )
        current = znode.partitions
        if total <= len(current):
            raise InvalidPartitionsError(
                f"topic {name!r} has {len(current)} partitions; the new count must be larger, got {total}"
            )
        self._check_partitions(name, total)
        rf = len(znode.target(min(current))) if current else self.default_replication_factor
        brokers = self._zk.live_brokers()
        self._check_broker_load(name, (total - len(current)) * rf, len(brokers), None)
        if assignments:
            if len(assignments) != total - len(current):
                raise InvalidReplicaAssignmentError(
                    f"{len(assignments)} replica assignments for {total - len(current)} new partitions of {name!r}"
                )
            if any(len(r) != rf for r in assignments):
                raise InvalidReplicaAssignmentError(f"every new partition of {name!r} needs {rf} replicas")
            explicit = {len(current) + i: list(r) for i, r in enumerate(assignments)}
            added = self._check_assignment(explicit, set(brokers), first=len(current))
        else:
            added = self._place(brokers, total - len(current), rf, first=len(current))
        self._check_broker_load(name, 0, len(brokers), added)
        new = {**current, **added}
        if not validate_only:
            self._zk.set_topic_assignment(name, new, version)
        return new

    def alter_config(self, name: str, configs: Mapping[str, str]) -> None:
        validate_topic_name(name)
        if not self._zk.topic_exists(name):
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        while True:
            current, version = self._zk.entity_config("topics", name)
            merged = {**current, **configs}
            LogConfig.from_properties(merged)
            try:
                self._zk.set_entity_config("topics", name, merged, version)
                return
            except (BadVersionError, NodeExistsError):
                continue  # changed meanwhile: merge into the new content

    @staticmethod
    def _count(
        value: int, default: int, what: str, error: type[InvalidPartitionsError | InvalidReplicationFactorError]
    ) -> int:
        """-1 = the broker default; anything below 1 otherwise is refused."""
        if value == -1:
            return default
        if value < 1:
            raise error(f"{what} must be at least 1 (or -1 for the broker default {default}), got {value}")
        return value

    def _check_partitions(self, name: str, partitions: int) -> None:
        if partitions > self.max_partitions_per_topic:
            raise InvalidPartitionsError(
                f"topic {name!r}: {partitions} partitions is more than max.partitions.per.topic "
                f"({self.max_partitions_per_topic})"
            )

    def _check_broker_load(self, name: str, replicas: int, brokers: int, added: Assignment | None) -> None:
        """PolicyViolationError if adding ``replicas`` (spread evenly over ``brokers``), or
        exactly the replicas of ``added``, would put more than max.broker.partitions
        partition replicas on a broker."""
        limit = self.max_broker_partitions
        if added is None:
            if brokers and replicas > limit * brokers:
                raise PolicyViolationError(
                    f"topic {name!r}: {replicas} partition replicas do not fit on {brokers} live broker(s) "
                    f"at max.broker.partitions={limit}"
                )
            return
        load: dict[int, int] = {}
        for assignment in [*self._zk.all_assignments().values(), added]:
            for replica_list in assignment.values():
                for b in replica_list:
                    load[b] = load.get(b, 0) + 1
        over = {b: n for b, n in sorted(load.items()) if n > limit}
        if over:
            raise PolicyViolationError(
                f"topic {name!r} would put more than max.broker.partitions={limit} partition replicas on "
                f"broker(s) {over}"
            )

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
