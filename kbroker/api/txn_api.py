"""The transaction requests, protocol-neutral (Kafka's ``handleFindCoordinatorRequest``
for key type TRANSACTION, ``handleInitProducerIdRequest`` with a transactional id,
``handleAddPartitionToTxnRequest``, ``handleAddOffsetsToTxnRequest``,
``handleTxnOffsetCommitRequest``, ``handleEndTxnRequest``, ``handleDescribeTransactionsRequest``,
``handleListTransactionsRequest``): plain values in, typed results out, a refusal of the
whole request raised as the error table's exception.

Authorization, as Kafka's: WRITE on the TransactionalId for every request that changes a
transaction (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), DESCRIBE on it to find its
coordinator; AddPartitionsToTxn also WRITE on each topic, and when any partition is
refused or unknown the others are not added and answer OPERATION_NOT_ATTEMPTED;
AddOffsetsToTxn and TxnOffsetCommit READ on the group (GROUP_AUTHORIZATION_FAILED), the
latter READ on each topic.

A transactional id is coordinated by one live broker, chosen as a group's is
(rendezvous hashing over the live brokers); a request for an id this broker does not
coordinate answers NOT_COORDINATOR. TxnOffsetCommit is the exception, as in Kafka: the
client sends it to the group's coordinator, so it answers NOT_COORDINATOR when this
broker does not coordinate the group, and writes the transaction's state from whichever
broker that is (the store's compare-and-set orders it against the id's coordinator). The
state machine is :class:`~kbroker.txn.coordinator.TransactionCoordinator`'s.

Thread safety: every method blocks (ZooKeeper) and runs on a door's request pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kbroker.api.access import Access
from kbroker.api.call_context import current
from kbroker.api.metadata_api import Node, advertised
from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.zkdata import CommittedOffset as CommittedOffset
from kbroker.cluster.zkdata import TransactionMetadata as TransactionMetadata
from kbroker.cluster.zkdata import TxnState as TxnState
from kbroker.group.coordinator import coordinator_for
from kbroker.security.acl import AclOperation as Op
from kbroker.security.acl import ResourceType
from kbroker.txn.coordinator import TransactionCoordinator
from kclient.errors import (
    BrokerResponseError,
    CoordinatorNotAvailableError,
    InvalidRequestError,
    NotCoordinatorError,
    OperationNotAttemptedError,
    TransactionalIdAuthorizationFailedError,
)

TopicPartition = tuple[str, int]
MemberCheck = Callable[[str, str, int, "str | None"], None]
"""(group id, member id, generation, group instance id) -> None, or the refusal raised."""
UNLISTED_STATES = frozenset({"Dead", "PrepareEpochFence"})
"""Kafka's transaction states that kbroker's coordinator never stores: a known state for
ListTransactions' filter, matching nothing."""


class TransactionApi:
    """The transaction requests of one broker (see the module docstring)."""

    def __init__(
        self,
        broker_id: int,
        coordinator: TransactionCoordinator,
        metadata: MetadataCache,
        access: Access,
        check_member: MemberCheck | None = None,
    ) -> None:
        self._broker_id = broker_id
        self._coordinator = coordinator
        self._metadata = metadata
        self._access = access
        self._check_member = check_member
        """The group coordinator's check of a TxnOffsetCommit's member (KIP-447); None: unchecked."""

    def _check_id(self, operation: Op, transactional_id: str) -> None:
        if not transactional_id:
            raise InvalidRequestError("the transactional id is empty")
        if not self._access.allows(operation, ResourceType.TRANSACTIONAL_ID, transactional_id):
            raise TransactionalIdAuthorizationFailedError(
                self._access.denied(operation, f"transactional id {transactional_id!r}")
            )

    def coordinator_of(self, transactional_id: str) -> int:
        return coordinator_for(transactional_id, sorted(self._metadata.snapshot().brokers))

    def _check_coordinator(self, transactional_id: str) -> None:
        node = self.coordinator_of(transactional_id)
        if node != self._broker_id:
            raise NotCoordinatorError(
                f"broker {self._broker_id} does not coordinate transactional id {transactional_id!r} "
                f"(broker {node} does)"
            )

    def _check_group_coordinator(self, group_id: str) -> None:
        if not group_id:
            raise InvalidRequestError("the group id is empty")
        node = coordinator_for(group_id, sorted(self._metadata.snapshot().brokers))
        if node != self._broker_id:
            raise NotCoordinatorError(
                f"broker {self._broker_id} does not coordinate group {group_id!r} (broker {node} does)"
            )

    def find_coordinator(self, transactional_id: str) -> Node:
        """DESCRIBE on the TransactionalId; its coordinator as the caller reaches it."""
        self._check_id(Op.DESCRIBE, transactional_id)
        info = self._metadata.snapshot().brokers.get(self.coordinator_of(transactional_id))
        if info is None:
            raise CoordinatorNotAvailableError("no live broker can coordinate transactions")
        where = advertised(info)
        if where is None:
            raise CoordinatorNotAvailableError(f"broker {info.broker_id} has no listener {current().listener}")
        return Node(info.broker_id, where[0], where[1])

    def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int = -1, producer_epoch: int = -1
    ) -> tuple[int, int]:
        """``producer_id``/``producer_epoch``: the producer the caller holds (InitProducerId
        v3+, KIP-360), -1 for none; a stale one is fenced (PRODUCER_FENCED)."""
        self._check_id(Op.WRITE, transactional_id)
        self._check_coordinator(transactional_id)
        expected = (producer_id, producer_epoch) if producer_id >= 0 and producer_epoch >= 0 else None
        return self._coordinator.init_producer_id(transactional_id, timeout_ms, expected)

    def add_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, BrokerResponseError | None]:
        """Per partition None (added) or why not; all or nothing."""
        self._check_id(Op.WRITE, transactional_id)
        self._check_coordinator(transactional_id)
        refused = self._access.refused_topics(Op.WRITE, (t for t, _ in partitions))
        failed: dict[TopicPartition, BrokerResponseError | None] = {
            tp: refused[tp[0]] for tp in partitions if tp[0] in refused
        }
        failed.update(self._metadata.snapshot().unknown_partitions(tp for tp in partitions if tp not in failed))
        if failed:
            skipped = OperationNotAttemptedError("another partition of the request was refused")
            return {tp: failed.get(tp, skipped) for tp in partitions}
        self._coordinator.add_partitions(transactional_id, producer_id, producer_epoch, partitions)
        return dict.fromkeys(partitions)

    def add_offsets(self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str) -> None:
        self._check_id(Op.WRITE, transactional_id)
        self._access.check_group(Op.READ, group_id)
        self._check_coordinator(transactional_id)
        self._coordinator.add_offsets(transactional_id, producer_id, producer_epoch, group_id)

    def commit_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group_id: str,
        offsets: Mapping[TopicPartition, CommittedOffset],
        *,
        member_id: str = "",
        generation_id: int = -1,
        group_instance_id: str | None = None,
    ) -> dict[TopicPartition, BrokerResponseError | None]:
        """TxnOffsetCommit, sent to the group's coordinator as Kafka's clients do (another
        broker: NOT_COORDINATOR): the offsets are held with the transaction until it ends.
        A request naming the consumer's member (KIP-447: its generation, member id and
        static instance) is refused whole if that member is not current
        (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID): a zombie consumer's
        producer cannot commit.
        The transaction's state is written from here whether or not this broker
        coordinates the transactional id; a write that raced another broker's answers the
        retriable CONCURRENT_TRANSACTIONS."""
        self._check_id(Op.WRITE, transactional_id)
        self._access.check_group(Op.READ, group_id)
        self._check_group_coordinator(group_id)
        if self._check_member is not None and (member_id or generation_id >= 0 or group_instance_id):
            self._check_member(group_id, member_id, generation_id, group_instance_id)
        refused = self._access.refused_topics(Op.READ, (t for t, _ in offsets))
        results: dict[TopicPartition, BrokerResponseError | None] = {
            tp: refused[tp[0]] for tp in offsets if tp[0] in refused
        }
        results.update(self._metadata.snapshot().unknown_partitions(tp for tp in offsets if tp not in results))
        valid = {tp: c for tp, c in offsets.items() if tp not in results}
        if valid:
            self._coordinator.commit_offsets(transactional_id, producer_id, producer_epoch, group_id, valid)
        results.update(dict.fromkeys(valid))
        return results

    def unstable_offsets(self, group_id: str, partitions: Sequence[TopicPartition] | None) -> set[TopicPartition]:
        """OffsetFetch's ``require_stable`` (KIP-447): the partitions of ``partitions``
        (None: any) whose offsets in ``group_id`` a transaction holds and has not yet
        completed; they answer UNSTABLE_OFFSET_COMMIT (retriable). The caller has checked
        DESCRIBE on the group."""
        return self._coordinator.unstable_offsets(group_id, partitions)

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> None:
        self._check_id(Op.WRITE, transactional_id)
        self._check_coordinator(transactional_id)
        self._coordinator.end_txn(transactional_id, producer_id, producer_epoch, commit)

    def describe(
        self, transactional_ids: Sequence[str]
    ) -> list[tuple[str, BrokerResponseError | None, TransactionMetadata | None]]:
        """DescribeTransactions (KIP-664): DESCRIBE on each id; each answers its own error.
        Once one id's state could not be loaded (COORDINATOR_NOT_AVAILABLE: ZooKeeper out
        of reach after the store's wait), the later ids that pass their checks answer the
        same without waiting again."""
        out: list[tuple[str, BrokerResponseError | None, TransactionMetadata | None]] = []
        unavailable: CoordinatorNotAvailableError | None = None
        for tid in transactional_ids:
            try:
                self._check_id(Op.DESCRIBE, tid)
                self._check_coordinator(tid)
                if unavailable is not None:
                    raise unavailable
                out.append((tid, None, self._coordinator.describe(tid)))
            except CoordinatorNotAvailableError as exc:
                unavailable = exc
                out.append((tid, exc, None))
            except BrokerResponseError as exc:
                out.append((tid, exc, None))
        return out

    def list_transactions(
        self, state_filters: Sequence[str] = (), producer_id_filters: Sequence[int] = ()
    ) -> tuple[list[str], list[TransactionMetadata]]:
        """ListTransactions (KIP-664): the transactions this broker coordinates, in a
        state named in ``state_filters`` and of a producer id in ``producer_id_filters``
        (an empty filter passes all). Ids the caller may not DESCRIBE are left out
        silently, as Kafka does. Also the filters that name no state (Kafka answers them
        in ``unknown_state_filters``, and lists no transaction for them)."""
        names = {s.value: s for s in TxnState}
        unknown = [f for f in state_filters if f not in names and f not in UNLISTED_STATES]
        states = [names[f] for f in state_filters if f in names]
        if state_filters and not states:
            return unknown, []  # only states no transaction here is ever in
        brokers = sorted(self._metadata.snapshot().brokers)
        listed = self._coordinator.list_transactions(
            states, producer_id_filters, lambda tid: coordinator_for(tid, brokers) == self._broker_id
        )
        return unknown, [
            m for m in listed if self._access.allows(Op.DESCRIBE, ResourceType.TRANSACTIONAL_ID, m.transactional_id)
        ]
