"""Topic and consumer-group administration over gRPC (kafka-python's ``KafkaAdminClient``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from google.protobuf.message import DecodeError

from kclient import structs as _structs
from kclient.admin_security import AdminSecurityMixin
from kclient.compat import check_configs
from kclient.errors import (
    CoordinatorNotAvailableError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    LeaderNotAvailableError,
    NotControllerError,
    NotCoordinatorError,
    UnknownTopicOrPartitionError,
    for_code,
)
from kclient.metadata import ClusterMetadata
from kclient.proto.kbroker.v1 import admin_pb2, cluster_pb2, config_pb2, group_pb2, log_pb2, reassignment_pb2, txn_pb2
from kclient.records import BatchHeader, read_header
from kclient.retry import retry
from kclient.security import DEFAULT_SECURITY_CONFIG, SecurityConfig
from kclient.structs import BrokerMetadata, PartitionMetadata, TopicPartition
from kclient.topic_name import validate_topic_name
from kclient.transport import Transport


@dataclass
class NewTopic:
    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    replica_assignments: Mapping[int, list[int]] | None = None
    topic_configs: Mapping[str, str] = field(default_factory=dict)


@dataclass
class TopicDescription:
    name: str
    partitions: list[PartitionMetadata]
    configs: dict[str, str]
    topic_id: str = ""
    """Kafka 2.8's TopicId (22 characters of URL-safe base64); "" when the topic has none."""


class DeletedRecords(NamedTuple):
    """One partition's DeleteRecords outcome: its new low watermark (the log start offset
    every in-sync replica reached), or the error (low watermark -1)."""

    low_watermark: int
    error: KafkaError | None = None


class _OffsetAndMetadata(NamedTuple):
    """A committed offset and its metadata string (until ``kclient.structs`` defines one)."""

    offset: int
    metadata: str


OffsetAndMetadata: type[_OffsetAndMetadata] = getattr(_structs, "OffsetAndMetadata", _OffsetAndMetadata)
"""``kclient.structs.OffsetAndMetadata`` when it exists, else the local ``(offset, metadata)`` pair."""


@dataclass
class MemberDescription:
    member_id: str
    client_id: str
    host: str
    assignment: list[TopicPartition]


@dataclass
class GroupDescription:
    """A consumer group as its coordinator sees it (state ``Dead``: the group does not exist)."""

    group_id: str
    state: str
    protocol_type: str
    protocol: str
    generation: int
    members: list[MemberDescription]


@dataclass
class TransactionDescription:
    """A transactional id's transaction as its coordinator sees it (Kafka's
    ``TransactionDescription``, KIP-664). ``state`` is Kafka's name (Empty, Ongoing,
    PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort)."""

    transactional_id: str
    coordinator_id: int
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int | None
    """When the open transaction began (ms since the epoch); None when none is open."""
    partitions: list[TopicPartition]
    """The partitions of the open transaction."""


class TransactionListing(NamedTuple):
    """One transaction of ``list_transactions`` (Kafka's ``TransactionListing``), with
    the id of the broker whose coordinator listed it (Kafka's ``allByBrokerId`` key;
    -1 when only a bootstrap address, of unknown id, answered)."""

    transactional_id: str
    producer_id: int
    state: str
    coordinator_id: int = -1


class PartitionBatch(NamedTuple):
    """What ``batch_at`` read at a partition's leader: the header of the batch holding
    the offset asked (None when the offset is the high watermark: no record there yet),
    and the partition's offsets as that Fetch answered them."""

    header: BatchHeader | None
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


_T = TypeVar("_T")
_COORDINATOR_MOVED = (NotCoordinatorError.errno, CoordinatorNotAvailableError.errno)
_COORDINATOR_RETRY_BACKOFF_S = 0.2
_REASSIGNMENT_TIMEOUT_MS = 60000
_WRITE_TXN_MARKERS_TIMEOUT_MS = 30000
"""How long a WriteTxnMarkers may wait for the in-sync replicas (the broker's own limit)."""


def _decode_assignment(protocol_type: str, data: bytes) -> list[TopicPartition]:
    """The partitions of a serialized ``ConsumerAssignment`` (none for another protocol)."""
    if protocol_type not in ("", "consumer") or not data:
        return []
    try:
        a = group_pb2.ConsumerAssignment.FromString(data)
    except DecodeError:
        return []
    return sorted(TopicPartition(tp.topic, p) for tp in a.partitions for p in tp.partitions)


def _raise_first(results: Iterable[Any]) -> None:
    for r in results:
        if r.error_code:
            raise for_code(r.error_code)(r.error_message or f"topic {r.name!r}")


class AdminClient(AdminSecurityMixin):
    """Create, delete, grow, list and describe topics.

    Takes the security settings of :data:`kclient.security.DEFAULT_SECURITY_CONFIG`
    (``security_protocol``, ``ssl_*``, ``sasl_*``) as keyword arguments; kafka-python's
    other client settings (``client_id``, ``api_version``, ...) are accepted, logged once
    and ignored; any other name is an InvalidConfigError.
    """

    def __init__(
        self,
        bootstrap_servers: str | Iterable[str] = "localhost:9092",
        request_timeout_ms: int = 30000,
        **configs: Any,
    ) -> None:
        check_configs("admin", configs, DEFAULT_SECURITY_CONFIG)  # kafka-python's extras: logged, ignored
        self._transport = Transport(bootstrap_servers, request_timeout_ms, SecurityConfig.from_configs(configs))
        self._metadata = ClusterMetadata(self._transport)
        self._timeout_ms = request_timeout_ms

    def _call(self, method: str, request: Any) -> Any:
        return self._transport.call_any(
            method, request, self._metadata.broker_addresses(), self._timeout_ms / 1000.0 + 5
        )

    def create_topics(
        self, new_topics: Iterable[NewTopic], timeout_ms: int | None = None, validate_only: bool = False
    ) -> None:
        req = admin_pb2.CreateTopicsRequest(timeout_ms=timeout_ms or self._timeout_ms, validate_only=validate_only)
        for t in new_topics:
            validate_topic_name(t.name)
            ct = req.topics.add(name=t.name, num_partitions=t.num_partitions, replication_factor=t.replication_factor)
            for p, replicas in (t.replica_assignments or {}).items():
                ct.assignments[p].broker_ids.extend(replicas)
            ct.configs.update({k: str(v) for k, v in t.topic_configs.items()})
        _raise_first(self._call("CreateTopics", req).topics)

    def delete_topics(self, topics: Iterable[str], timeout_ms: int | None = None) -> None:
        req = admin_pb2.DeleteTopicsRequest(topics=list(topics), timeout_ms=timeout_ms or self._timeout_ms)
        _raise_first(self._call("DeleteTopics", req).topics)

    def create_partitions(
        self, counts: Mapping[str, int], timeout_ms: int | None = None, validate_only: bool = False
    ) -> None:
        req = admin_pb2.CreatePartitionsRequest(timeout_ms=timeout_ms or self._timeout_ms, validate_only=validate_only)
        for name, count in counts.items():
            req.topics.add(name=name, count=count)
        _raise_first(self._call("CreatePartitions", req).topics)

    def list_topics(self) -> list[str]:
        resp = self._call("DescribeTopics", admin_pb2.DescribeTopicsRequest())
        return sorted(t.name for t in resp.topics if not t.error_code)

    def describe_topics(self, topics: Iterable[str] | None = None) -> list[TopicDescription]:
        resp = self._call("DescribeTopics", admin_pb2.DescribeTopicsRequest(topics=list(topics or ())))
        out = []
        for t in resp.topics:
            if t.error_code:
                raise for_code(t.error_code)(t.error_message)
            parts = [
                PartitionMetadata(
                    t.name,
                    p.index,
                    p.leader_id,
                    p.leader_epoch,
                    list(p.replica_nodes),
                    list(p.isr_nodes),
                    list(p.offline_replicas),
                    p.error_code,
                )
                for p in t.partitions
            ]
            out.append(TopicDescription(t.name, parts, dict(t.configs), t.topic_id))
        return out

    def elect_leaders(
        self, partitions: Iterable[tuple[str, int]] | None = None, timeout_ms: int | None = None
    ) -> dict[TopicPartition, Exception | None]:
        """Preferred-leader election: move each partition's leadership to its first replica.

        ``partitions`` are ``(topic, partition)`` pairs; ``None`` (or empty) means every
        partition. Returns, per partition, ``None`` when its preferred replica leads now,
        else the error (``PreferredLeaderNotAvailableError`` when that replica is not
        alive and in sync, ``UnknownTopicOrPartitionError`` for a partition that does not
        exist). The broker waits up to ``timeout_ms`` for the controller.
        """
        timeout = timeout_ms or self._timeout_ms
        req = cluster_pb2.ElectLeadersRequest(timeout_ms=timeout)
        for topic, partition in partitions or ():
            req.partitions.add(topic=topic, partition=partition)
        resp = self._transport.call_any(
            "ElectLeaders", req, self._metadata.broker_addresses(), max(timeout, self._timeout_ms) / 1000.0 + 5
        )
        out: dict[TopicPartition, Exception | None] = {}
        for r in resp.results:
            tp = TopicPartition(r.topic, r.partition)
            out[tp] = for_code(r.error_code)(r.error_message) if r.error_code else None
        return out

    # --- consumer groups -------------------------------------------------------------

    def find_coordinator(self, group_id: str) -> str:
        """The ``host:port`` of the broker coordinating ``group_id``."""
        resp = self._call("FindCoordinator", group_pb2.FindCoordinatorRequest(group_id=group_id))
        if resp.error_code:
            raise for_code(resp.error_code)(resp.error_message or f"no coordinator for group {group_id!r}")
        return f"{resp.host}:{resp.port}"

    def _at_coordinator(self, group_id: str, method: str, request: Any, error_of: Callable[[Any], int]) -> Any:
        """``method`` at the group's coordinator, found again while it moves (until the
        admin timeout; then the last error)."""

        def at_current_coordinator() -> Any:
            address = self.find_coordinator(group_id)
            resp = self._transport.call(address, method, request, self._timeout_ms / 1000.0 + 5)
            code = error_of(resp)
            if code in _COORDINATOR_MOVED:
                raise for_code(code)(f"{method} for group {group_id!r}")
            return resp

        def on_error(err: KafkaError) -> None:  # the coordinator's broker may be gone
            if err.retriable:
                self._metadata.request_update()
                self._metadata.maybe_refresh()

        return retry(
            at_current_coordinator,
            what=f"{method} for group {group_id!r}",
            deadline=time.monotonic() + self._timeout_ms / 1000.0,
            backoff_s=_COORDINATOR_RETRY_BACKOFF_S,
            on_error=on_error,
            raise_last=True,
        )

    # --- transactions (KIP-664; kafka-transactions.sh) ---------------------------------------

    def find_transaction_coordinator(self, transactional_id: str) -> tuple[int, str]:
        """The id and ``host:port`` of the broker coordinating ``transactional_id``."""
        req = group_pb2.FindCoordinatorRequest(group_id=transactional_id, key_type=group_pb2.TRANSACTION)
        resp = self._call("FindCoordinator", req)
        if resp.error_code:
            raise for_code(resp.error_code)(
                resp.error_message or f"no coordinator for transactional id {transactional_id!r}"
            )
        return resp.node_id, f"{resp.host}:{resp.port}"

    def describe_transactions(self, transactional_ids: Iterable[str]) -> list[TransactionDescription]:
        """Each transactional id's transaction, in the order asked, from its coordinator
        (found again while it moves). An id never used raises Kafka's
        TRANSACTIONAL_ID_NOT_FOUND; any other refusal its error."""
        out = []
        for tid in transactional_ids:
            where: list[int] = []

            def at_current_coordinator(tid: str = tid, where: list[int] = where) -> Any:
                node, address = self.find_transaction_coordinator(tid)
                req = txn_pb2.DescribeTransactionsRequest(transactional_ids=[tid])
                resp = self._transport.call(address, "DescribeTransactions", req, self._timeout_ms / 1000.0 + 5)
                code = resp.transaction_states[0].error_code
                if code in _COORDINATOR_MOVED:
                    raise for_code(code)(f"DescribeTransactions for transactional id {tid!r}")
                where[:] = [node]
                return resp

            resp = retry(
                at_current_coordinator,
                what=f"DescribeTransactions for transactional id {tid!r}",
                deadline=time.monotonic() + self._timeout_ms / 1000.0,
                backoff_s=_COORDINATOR_RETRY_BACKOFF_S,
                on_error=self._coordinator_gone,
                raise_last=True,
            )
            (d,) = resp.transaction_states
            if d.error_code:
                raise for_code(d.error_code)(d.error_message or f"transactional id {tid!r}")
            out.append(
                TransactionDescription(
                    d.transactional_id,
                    where[0],
                    d.transaction_state,
                    d.producer_id,
                    d.producer_epoch,
                    d.transaction_timeout_ms,
                    d.transaction_start_time_ms if d.transaction_start_time_ms >= 0 else None,
                    sorted(TopicPartition(t.name, p) for t in d.topics for p in t.partitions),
                )
            )
        return out

    def list_transactions(
        self, states: Iterable[str] | None = None, producer_ids: Iterable[int] | None = None
    ) -> list[TransactionListing]:
        """The transactions of every live broker's coordinator, sorted by transactional id,
        each with the id of the broker that listed it: only those in ``states`` (Kafka's
        names; None: all) and of ``producer_ids`` (None: all). Ids the caller may not
        DESCRIBE are left out. Every live broker is asked; one that does not answer
        raises unless another did."""
        self._metadata.refresh()
        req = txn_pb2.ListTransactionsRequest(
            state_filters=list(states or ()), producer_id_filters=list(producer_ids or ())
        )
        # Broker ids from the metadata (a view without them, as a test's, lists as -1).
        known: dict[int, BrokerMetadata] = getattr(self._metadata, "brokers", {})
        ids = {f"{b.host}:{b.port}": b.node_id for b in known.values()}
        targets = [(ids.get(a, -1), a) for a in self._metadata.broker_addresses() or self._transport.bootstrap]
        found: dict[str, TransactionListing] = {}
        answered = False
        last: KafkaError | None = None
        for node, address in targets:
            try:
                resp = self._transport.call(address, "ListTransactions", req)
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                last = exc
                continue
            if resp.error_code:
                last = for_code(resp.error_code)(resp.error_message or "ListTransactions failed")
                continue
            answered = True
            for t in resp.transaction_states:
                found[t.transactional_id] = TransactionListing(
                    t.transactional_id, t.producer_id, t.transaction_state, node
                )
        if not answered:
            raise last or KafkaError("no broker answered ListTransactions")
        return [found[tid] for tid in sorted(found)]

    def abort_transaction(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int = 0,
        timeout_ms: int | None = None,
    ) -> None:
        """Abort a producer's open transaction on one partition (Kafka's
        ``Admin.abortTransaction(AbortTransactionSpec)``, for a hanging transaction whose
        coordinator no longer knows it): an ABORT marker of ``producer_id`` /
        ``producer_epoch`` written by WriteTxnMarkers at the partition's leader (found
        through metadata, and again while leadership moves, until the admin timeout),
        answered once the in-sync replicas have it. The last stable offset then moves
        past the transaction and read_committed consumers skip its records.

        Needs CLUSTER_ACTION on the Cluster (ClusterAuthorizationFailedError). Raises
        InvalidProducerEpochError for an epoch older than the producer's on that
        partition, UnknownTopicOrPartitionError for a partition that does not exist.
        """
        tp = TopicPartition(topic, partition)
        req = txn_pb2.WriteTxnMarkersRequest()
        marker = req.markers.add(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            committed=False,
            coordinator_epoch=max(coordinator_epoch, 0),
        )
        marker.topics.add(name=topic, partitions=[partition])

        def outcome(resp: Any) -> tuple[int, str]:
            if resp.error_code:
                return resp.error_code, resp.error_message
            for m in resp.markers:
                for t in m.topics:
                    for p in t.partitions:
                        if p.error_code:
                            return p.error_code, p.error_message
            return 0, ""

        self._at_leader(tp, "WriteTxnMarkers", req, outcome, timeout_ms or _WRITE_TXN_MARKERS_TIMEOUT_MS)

    def batch_at(self, topic: str, partition: int, offset: int) -> PartitionBatch:
        """The header of the batch that holds ``offset`` (a read_uncommitted Fetch of one
        batch at the partition's leader), with the partition's high watermark, last
        stable offset and log start offset. kbroker's stand-in for Kafka's
        DescribeProducers when looking for the producer of a hanging transaction: a
        transactional batch names its producer id and epoch. Raises
        OffsetOutOfRangeError outside [log start, high watermark]."""
        tp = TopicPartition(topic, partition)
        req = log_pb2.FetchRequest(max_wait_ms=0, min_bytes=1)
        req.topics.add(name=topic).partitions.add(index=partition, fetch_offset=offset, partition_max_bytes=1)

        def outcome(resp: Any) -> tuple[int, str]:
            if resp.error_code:
                return resp.error_code, resp.error_message
            for t in resp.topics:
                for p in t.partitions:
                    if p.error_code:
                        return p.error_code, p.error_message
            return 0, ""

        resp = self._at_leader(tp, "Fetch", req, outcome, self._timeout_ms)
        p = next(p for t in resp.topics for p in t.partitions if t.name == topic and p.index == partition)
        header = read_header(p.records) if len(p.records) else None
        return PartitionBatch(header, p.high_watermark, p.last_stable_offset, p.log_start_offset)

    def _at_leader(
        self, tp: TopicPartition, method: str, request: Any, outcome: Callable[[Any], tuple[int, str]], timeout_ms: int
    ) -> Any:
        """``method`` at ``tp``'s leader, whose answer ``outcome`` reads as (error code,
        message): found again through metadata while leadership moves or the leader is
        unreachable (retriable errors), until the admin timeout; then the last error."""
        where = f"{tp.topic}-{tp.partition}"
        deadline = time.monotonic() + self._timeout_ms / 1000.0
        while True:
            try:
                self._metadata.refresh(all_topics=True, deadline=deadline)  # never auto-creates a topic
                parts = self._metadata.partitions_for(tp.topic)
                if parts is None or tp.partition not in parts:
                    code = self._metadata.topic_error(tp.topic) if parts is None else 0
                    if not code:  # a name the metadata does not have: no point waiting
                        missing: KafkaError = UnknownTopicOrPartitionError(f"{where} does not exist")
                        missing.retriable = False
                        raise missing
                    raise for_code(code)(f"{where}: topic {tp.topic!r} has no metadata")
                address = self._metadata.leader_address(tp)
                if address is None:
                    raise LeaderNotAvailableError(f"{where} has no leader")
                resp = self._transport.call(address, method, request, timeout_ms / 1000.0 + 5)
                code, message = outcome(resp)
                if code:
                    raise for_code(code)(message or f"{method} on {where}")
                return resp
            except KafkaError as exc:
                if not exc.retriable or time.monotonic() + _COORDINATOR_RETRY_BACKOFF_S >= deadline:
                    raise
                self._metadata.request_update()
                time.sleep(_COORDINATOR_RETRY_BACKOFF_S)

    def _coordinator_gone(self, err: KafkaError) -> None:
        if err.retriable:  # the coordinator's broker may be gone
            self._metadata.request_update()
            self._metadata.maybe_refresh()

    def list_consumer_groups(self) -> list[tuple[str, str]]:
        """``(group id, state)`` of every group with state in ZooKeeper, sorted by id.

        Every live broker is asked: a broker knows the live state only of the groups it
        coordinates (``Unknown`` for the rest).
        """
        self._metadata.refresh()
        states: dict[str, str] = {}
        answered = False
        last: KafkaError | None = None
        for address in self._metadata.broker_addresses() or self._transport.bootstrap:
            try:
                resp = self._transport.call(address, "ListGroups", group_pb2.ListGroupsRequest())
            except (KafkaConnectionError, KafkaTimeoutError) as exc:
                last = exc
                continue
            if resp.error_code:
                last = for_code(resp.error_code)("ListGroups failed")
                continue
            answered = True
            for g in resp.groups:
                if g.state != "Unknown" or g.group_id not in states:
                    states[g.group_id] = g.state
        if not answered:
            raise last or KafkaError("no broker answered ListGroups")
        return sorted(states.items())

    def describe_consumer_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        """Each group as its coordinator sees it, in the order asked (state ``Dead``: unknown)."""
        out = []
        for gid in group_ids:
            req = group_pb2.DescribeGroupsRequest(group_ids=[gid])
            resp = self._at_coordinator(gid, "DescribeGroups", req, lambda r: r.groups[0].error_code)
            (d,) = resp.groups
            if d.error_code:
                raise for_code(d.error_code)(d.error_message or f"group {gid!r}")
            members = [
                MemberDescription(
                    m.member_id, m.client_id, m.client_host, _decode_assignment(d.protocol_type, m.assignment)
                )
                for m in d.members
            ]
            out.append(
                GroupDescription(d.group_id, d.state, d.protocol_type, d.protocol_name, d.generation_id, members)
            )
        return out

    def list_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, _OffsetAndMetadata]:
        """Committed offsets of ``group_id``.

        ``partitions=None``: every partition with a committed offset. Otherwise exactly
        those partitions, offset ``-1`` where nothing is committed.
        """
        req = group_pb2.FetchOffsetsRequest(group_id=group_id)
        by_topic: dict[str, list[int]] = {}
        for tp in partitions or ():
            by_topic.setdefault(tp[0], []).append(tp[1])
        for topic, ps in by_topic.items():
            req.topics.add(name=topic, partitions=ps)
        resp = self._call("FetchOffsets", req)
        if resp.error_code:
            raise for_code(resp.error_code)(resp.error_message or f"group {group_id!r}")
        out: dict[TopicPartition, _OffsetAndMetadata] = {}
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code:
                    raise for_code(p.error_code)(f"{t.name}-{p.index} of group {group_id!r}")
                out[TopicPartition(t.name, p.index)] = OffsetAndMetadata(p.offset, p.metadata)
        return out

    def delete_consumer_groups(self, group_ids: Iterable[str]) -> dict[str, Exception | None]:
        """Delete groups without members (and their committed offsets).

        Returns, per group, ``None`` when deleted, else the error (``NonEmptyGroupError``
        while it has members, ``GroupIdNotFoundError`` when it does not exist).
        """
        out: dict[str, Exception | None] = {}
        for gid in group_ids:
            req = group_pb2.DeleteGroupsRequest(group_ids=[gid])
            resp = self._at_coordinator(gid, "DeleteGroups", req, lambda r: r.results[0].error_code)
            (r,) = resp.results
            out[gid] = for_code(r.error_code)(r.error_message or f"group {gid!r}") if r.error_code else None
        return out

    def delete_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, Exception | None]:
        """Delete the group's committed offsets of ``partitions`` (Kafka's
        ``deleteConsumerGroupOffsets``, OffsetDelete; kafka-python's ``delete_group_offsets``).

        Returns, per partition, ``None`` when deleted (or nothing was committed), else its
        error: ``GroupSubscribedToTopicError`` while an active member subscribes to the
        topic, ``UnknownTopicOrPartitionError``, ``TopicAuthorizationFailedError``. Raises
        what fails the whole group: ``GroupIdNotFoundError`` (no members, no offsets),
        ``NonEmptyGroupError``, ``GroupAuthorizationFailedError``.
        """
        req = group_pb2.OffsetDeleteRequest(group_id=group_id)
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp[0], []).append(tp[1])
        for topic, ps in sorted(by_topic.items()):
            req.topics.add(name=topic, partitions=sorted(set(ps)))
        resp = self._at_coordinator(group_id, "OffsetDelete", req, lambda r: r.error_code)
        if resp.error_code:
            raise for_code(resp.error_code)(resp.error_message or f"group {group_id!r}")
        return {
            TopicPartition(t.name, p.index): for_code(p.error_code)(p.error_message) if p.error_code else None
            for t in resp.topics
            for p in t.partitions
        }

    delete_group_offsets = delete_consumer_group_offsets

    def delete_records(
        self,
        records_to_delete: Mapping[TopicPartition, int],
        timeout_ms: int | None = None,
        raise_errors: bool = True,
    ) -> dict[TopicPartition, DeletedRecords]:
        """Delete every record below the given offset of each partition (kafka-python's
        ``delete_records``, Kafka's ``deleteRecords``): the partition's log start offset
        moves there; offset ``-1`` means its high watermark.

        Each partition goes to its leader (found again while leadership moves, until the
        admin timeout); the leader answers once every in-sync replica has the new start,
        or after ``timeout_ms`` with ``RequestTimedOutError``. Returns
        :class:`DeletedRecords` per partition; with ``raise_errors`` the first failed
        partition's error is raised instead (``OffsetOutOfRangeError`` above the high
        watermark, ``UnknownTopicOrPartitionError``, ``PolicyViolationError`` for a
        compact-only topic, ``TopicAuthorizationFailedError``).
        """
        timeout = timeout_ms or self._timeout_ms
        deadline = time.monotonic() + max(timeout, self._timeout_ms) / 1000.0
        todo = {TopicPartition(tp[0], tp[1]): int(offset) for tp, offset in records_to_delete.items()}
        out: dict[TopicPartition, DeletedRecords] = {}
        while todo:
            retry_now: dict[TopicPartition, KafkaError] = {}
            self._metadata.refresh(all_topics=True, deadline=deadline)  # never auto-creates a topic
            by_leader: dict[str, dict[TopicPartition, int]] = {}
            for tp, offset in todo.items():
                parts = self._metadata.partitions_for(tp.topic)
                address = self._metadata.leader_address(tp)
                if parts is None or tp.partition not in parts:
                    code = self._metadata.topic_error(tp.topic) if parts is None else 0
                    cls = for_code(code) if code else UnknownTopicOrPartitionError
                    out[tp] = DeletedRecords(-1, cls(f"{tp.topic}-{tp.partition} does not exist"))
                elif address is None:
                    retry_now[tp] = LeaderNotAvailableError(f"{tp.topic}-{tp.partition} has no leader")
                else:
                    by_leader.setdefault(address, {})[tp] = offset
            for address, offsets in by_leader.items():
                req = log_pb2.DeleteRecordsRequest(timeout_ms=timeout)
                for topic in sorted({tp.topic for tp in offsets}):
                    t = req.topics.add(name=topic)
                    for tp, offset in sorted(offsets.items()):
                        if tp.topic == topic:
                            t.partitions.add(index=tp.partition, offset=offset)
                try:
                    resp = self._transport.call(address, "DeleteRecords", req, timeout / 1000.0 + 5)
                except (KafkaConnectionError, KafkaTimeoutError) as exc:
                    retry_now.update(dict.fromkeys(offsets, exc))
                    continue
                for t in resp.topics:
                    for r in t.partitions:
                        tp = TopicPartition(t.name, r.index)
                        err: KafkaError | None = for_code(r.error_code)(r.error_message) if r.error_code else None
                        if err is not None and err.invalid_metadata:
                            retry_now[tp] = err
                        else:
                            out[tp] = DeletedRecords(r.low_watermark if err is None else -1, err)
            todo = {tp: todo[tp] for tp in retry_now}
            if todo and time.monotonic() + _COORDINATOR_RETRY_BACKOFF_S >= deadline:
                out.update((tp, DeletedRecords(-1, err)) for tp, err in retry_now.items())
                break
            if todo:
                self._metadata.request_update()
                time.sleep(_COORDINATOR_RETRY_BACKOFF_S)
        if raise_errors:
            failed = next((r.error for _, r in sorted(out.items()) if r.error is not None), None)
            if failed is not None:
                raise failed
        return out

    def alter_consumer_group_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit ``offsets`` for a group without active members, in one request.

        Raises the first partition's error (``UnknownMemberIdError`` while the group has
        members, ``UnknownTopicOrPartitionError`` for a partition that does not exist).
        """
        req = group_pb2.CommitOffsetsRequest(group_id=group_id, generation_id=-1, member_id="")
        by_topic: dict[str, list[tuple[int, int]]] = {}
        for tp, offset in offsets.items():
            by_topic.setdefault(tp[0], []).append((tp[1], offset))
        for topic, ps in sorted(by_topic.items()):
            ct = req.topics.add(name=topic)
            for p, offset in sorted(ps):
                ct.partitions.add(index=p, offset=offset)

        def moved(resp: Any) -> int:
            codes = {p.error_code for t in resp.topics for p in t.partitions}
            return next((c for c in _COORDINATOR_MOVED if c in codes), 0)

        resp = self._at_coordinator(group_id, "CommitOffsets", req, moved)
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code:
                    raise for_code(p.error_code)(p.error_message or f"{t.name}-{p.index} of group {group_id!r}")

    def describe_cluster(self) -> tuple[list[BrokerMetadata], int, str]:
        """(brokers, controller id, cluster id)."""
        self._metadata.refresh(all_topics=True)
        return sorted(self._metadata.brokers.values()), self._metadata.controller_id, self._metadata.cluster_id

    def describe_log_dirs(
        self, broker_ids: Iterable[int] | None = None, topics: Iterable[str] | None = None
    ) -> dict[int, admin_pb2.DescribeLogDirsResponse]:
        """Each broker's DescribeLogDirs answer (every live broker without ``broker_ids``),
        for ``topics`` or every partition it holds. Raises the error of a broker that
        cannot be asked (unknown id, unreachable); a directory with an offline log
        answers KAFKA_STORAGE_ERROR in its ``error_code`` and is still described."""
        self._metadata.refresh(all_topics=True)
        ids = sorted(self._metadata.brokers) if broker_ids is None else list(broker_ids)
        req = admin_pb2.DescribeLogDirsRequest(topics=[admin_pb2.LogDirTopicFilter(name=t) for t in topics or ()])
        out: dict[int, admin_pb2.DescribeLogDirsResponse] = {}
        for broker_id in ids:
            address = self._metadata.address_of(broker_id)
            if address is None:
                raise KafkaConnectionError(f"broker {broker_id} is not a live broker")
            resp = self._transport.call(address, "DescribeLogDirs", req, self._timeout_ms / 1000.0 + 5)
            if resp.error_code:
                raise for_code(resp.error_code)(f"DescribeLogDirs on broker {broker_id}")
            out[broker_id] = resp
        return out

    def _config_call(self, resource: tuple[int, str], method: str, request: Any) -> Any:
        """A config RPC for one resource: a broker id's resource at that broker (its static
        configs are known there only), anything else at any broker."""
        rtype, name = resource
        if rtype == config_pb2.BROKER and name.isdigit():
            self._metadata.refresh(all_topics=False)
            address = self._metadata.address_of(int(name))
            if address is not None:
                return self._transport.call(address, method, request, self._timeout_ms / 1000.0 + 5)
        return self._call(method, request)

    def describe_configs(
        self, resources: Iterable[tuple[int, str]], include_synonyms: bool = False
    ) -> dict[tuple[int, str], dict[str, config_pb2.DescribeConfigsResourceResult]]:
        """Every config of each ``(resource_type, name)`` (``config_pb2.TOPIC`` / ``BROKER``;
        a broker id, or "" for the cluster-wide broker defaults), as Kafka's ConfigEntry
        (name, value, config_source, read_only, is_sensitive, synonyms), keyed by name.
        Raises a failed resource's typed error (UnknownTopicOrPartitionError, ...)."""
        out: dict[tuple[int, str], dict[str, config_pb2.DescribeConfigsResourceResult]] = {}
        for rtype, name in resources:
            req = config_pb2.DescribeConfigsRequest(include_synonyms=include_synonyms)
            req.resources.add(resource_type=rtype, resource_name=name)
            result = self._config_call((rtype, name), "DescribeConfigs", req).results[0]
            if result.error_code:
                raise for_code(result.error_code)(result.error_message or f"configs of {name!r}")
            out[(rtype, name)] = {c.name: c for c in result.configs}
        return out

    def incremental_alter_configs(
        self,
        configs: Mapping[tuple[int, str], Iterable[tuple[str, int, str | None]]],
        validate_only: bool = False,
    ) -> None:
        """Apply ``(name, op, value)`` operations (``config_pb2.SET`` / ``DELETE`` / ``APPEND``
        / ``SUBTRACT``) to each ``(resource_type, name)``. Each resource is applied or
        refused as a whole; raises the typed error of the first refused one
        (InvalidConfigurationError, InvalidRequestError, UnknownTopicOrPartitionError)
        after trying them all."""
        first: KafkaError | None = None
        for (rtype, name), ops in configs.items():
            req = config_pb2.IncrementalAlterConfigsRequest(validate_only=validate_only)
            res = req.resources.add(resource_type=rtype, resource_name=name)
            for key, op, value in ops:
                c = res.configs.add(name=key, config_operation=op)
                if value is not None:
                    c.value = value
            result = self._config_call((rtype, name), "IncrementalAlterConfigs", req).responses[0]
            if result.error_code and first is None:
                first = for_code(result.error_code)(result.error_message or f"configs of {name!r}")
        if first is not None:
            raise first

    # --- partition reassignment ------------------------------------------------------

    def _at_controller(self, method: str, request: Any, timeout_ms: int) -> Any:
        """``method`` at the controller (Metadata's controller_id), found again while it
        moves (NOT_CONTROLLER, no controller yet, its broker gone) until the admin timeout."""

        def at_current_controller() -> Any:
            self._metadata.refresh(all_topics=False)
            address = self._metadata.address_of(self._metadata.controller_id)
            if address is None:
                raise NotControllerError(f"no live controller (controller id {self._metadata.controller_id})")
            resp = self._transport.call(address, method, request, max(timeout_ms, self._timeout_ms) / 1000.0 + 5)
            if resp.error_code == NotControllerError.errno:
                raise NotControllerError(resp.error_message or method)
            return resp

        return retry(
            at_current_controller,
            what=method,
            deadline=time.monotonic() + self._timeout_ms / 1000.0,
            backoff_s=_COORDINATOR_RETRY_BACKOFF_S,
        )

    def alter_partition_reassignments(
        self, reassignments: Mapping[tuple[str, int], list[int] | None], timeout_ms: int | None = None
    ) -> dict[TopicPartition, Exception | None]:
        """Start moves to the given replica lists (preferred leader first), or cancel a
        partition's move with ``None``; Kafka's AlterPartitionReassignments.

        Returns once the controller has started the moves (not when they finish): per
        partition ``None`` when accepted, else its error, as the values of Kafka's
        ``AlterPartitionReassignmentsResult.values()`` futures
        (UnknownTopicOrPartitionError, InvalidReplicaAssignmentError,
        NoReassignmentInProgressError for a cancel of a partition that is not moving).
        Raises what failed the whole request (InvalidRequestError for a partition named
        twice, a timeout). Goes to the controller, found again while it moves.
        """
        timeout = timeout_ms or _REASSIGNMENT_TIMEOUT_MS
        req = reassignment_pb2.AlterPartitionReassignmentsRequest(timeout_ms=timeout)
        by_topic: dict[str, Any] = {}
        for (topic, partition), replicas in reassignments.items():
            if topic not in by_topic:
                by_topic[topic] = req.topics.add(name=topic)
            p = by_topic[topic].partitions.add(partition_index=partition)
            if replicas is not None:
                p.replicas.SetInParent()
                p.replicas.broker_ids.extend(replicas)
        resp = self._at_controller("AlterPartitionReassignments", req, timeout)
        if resp.error_code:
            raise for_code(resp.error_code)(resp.error_message or "AlterPartitionReassignments")
        out: dict[TopicPartition, Exception | None] = {}
        for t in resp.responses:
            for r in t.partitions:
                code = r.error_code
                out[TopicPartition(t.name, r.partition_index)] = for_code(code)(r.error_message) if code else None
        return out

    def list_partition_reassignments(
        self, partitions: Iterable[tuple[str, int]] | None = None, timeout_ms: int | None = None
    ) -> dict[TopicPartition, tuple[list[int], list[int], list[int]]]:
        """Ongoing moves (of ``partitions``, or every one): ``(replicas, adding_replicas,
        removing_replicas)`` per partition; partitions that are not moving are left out."""
        timeout = timeout_ms or _REASSIGNMENT_TIMEOUT_MS
        req = reassignment_pb2.ListPartitionReassignmentsRequest(timeout_ms=timeout)
        by_topic: dict[str, Any] = {}
        for topic, partition in partitions or ():
            if topic not in by_topic:
                by_topic[topic] = req.topics.add(name=topic)
            by_topic[topic].partition_indexes.append(partition)
        resp = self._at_controller("ListPartitionReassignments", req, timeout)
        if resp.error_code:
            raise for_code(resp.error_code)(resp.error_message or "ListPartitionReassignments")
        return {
            TopicPartition(t.name, p.partition_index): (
                list(p.replicas),
                list(p.adding_replicas),
                list(p.removing_replicas),
            )
            for t in resp.topics
            for p in t.partitions
        }

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
