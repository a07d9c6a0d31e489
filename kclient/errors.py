"""Errors shared by broker and client: one table of Kafka error codes.

Hierarchy::

    KafkaError                        base of everything kclient raises
    ├── KafkaTimeoutError             a request or a wait ran out of time (retriable)
    ├── KafkaConnectionError          a broker could not be reached (retriable)
    ├── NoBrokersAvailable            none of the bootstrap servers answered
    ├── IllegalStateError             the client was used wrongly (e.g. poll after close)
    ├── InvalidConfigError            a client or broker setting is wrong
    ├── UnsupportedCodecError         a compression codec is unknown or not installed
    ├── NoOffsetForPartitionError     no position and auto_offset_reset is "none"
    ├── CommitFailedError             a group refused a commit: this member's generation is over
    └── BrokerResponseError           an error code carried by a broker response
        ├── OffsetOutOfRangeError ... (one class per code in ``ERRORS``)

Each ``BrokerResponseError`` subclass has the numeric ``errno`` Kafka gives it (the
same numbers as ``kbroker.v1.ErrorCode`` in ``protos/kbroker/v1/common.proto``; codes
never change), a ``retriable`` flag (the same request may succeed later) and an
``invalid_metadata`` flag (refresh metadata before retrying). The broker raises these
classes internally too; the gRPC layer turns ``errno`` into the response code and the
client turns the code back into the class with :func:`for_code`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

_REPEATED_NAME = re.compile(r"((?:\[Error -?\d+\] )?)\b([A-Z]\w*): (?:\[Error -?\d+\] )?\2: ")
"""``Name: Name: `` (either half may carry ``[Error N] ``): one error's text nested in its own."""


def _own_text(cls: type[KafkaError], message: str) -> str:
    """``message`` without the class's own name in front of it or repeated inside it.

    Messages often carry another error's ``str()``: a broker's abort details, a wrapped
    error (``KafkaTimeoutError(f"{what}: {err}")``). ``str()`` adds the name once, so the
    text keeps only what it says beyond the name.
    """
    name = cls.__name__
    errno = getattr(cls, "errno", None)
    own = ([f"[Error {errno}] {name}: "] if errno is not None else []) + [f"{name}: "]
    while True:
        before = message
        message = _REPEATED_NAME.sub(r"\1\2: ", message)
        for prefix in own:
            message = message.removeprefix(prefix).replace(f": {prefix}", ": ")
        if message in (name, f"[Error {errno}] {name}"):
            message = ""
        if message == before:
            return message


class KafkaError(Exception):
    """Base class of every kclient and kbroker error.

    ``str(error)`` is kafka-python's: ``Name: message`` (``[Error N] Name: message`` for
    a :class:`BrokerResponseError`), the class name said once; ``message`` is the text
    alone.
    """

    retriable = False
    invalid_metadata = False

    def __init__(self, message: str = "") -> None:
        message = _own_text(type(self), str(message))
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        name = type(self).__name__
        return f"{name}: {self.message}" if self.message else name


class KafkaTimeoutError(KafkaError):
    retriable = True


class KafkaConnectionError(KafkaError):
    retriable = True
    invalid_metadata = True


class NoBrokersAvailable(KafkaError):
    retriable = True
    invalid_metadata = True


class IllegalStateError(KafkaError):
    pass


class InvalidConfigError(KafkaError):
    pass


class UnsupportedCodecError(KafkaError):
    """A compression codec is unknown or its library is not installed (e.g. snappy)."""


class NoOffsetForPartitionError(KafkaError):
    """No position for a partition and ``auto_offset_reset`` is ``"none"``."""


class CommitFailedError(KafkaError):
    """The group refused an offset commit: the member is no longer part of the generation
    that owns the partitions (the group rebalanced, the member was removed, or it left).

    Not retriable: the partitions may belong to another member now. The member rejoins
    on its next ``poll`` and resumes from the last committed offsets.
    """


class BrokerResponseError(KafkaError):
    """An error a broker reported with a Kafka error code."""

    errno = -1
    description = "The server experienced an unexpected error."

    def __init__(self, message: str = "") -> None:
        super().__init__(_own_text(type(self), str(message)) or self.description)

    def __str__(self) -> str:
        return f"[Error {self.errno}] {super().__str__()}"


class UnknownError(BrokerResponseError):
    errno = -1
    description = "The server experienced an unexpected error when processing the request."


class OffsetOutOfRangeError(BrokerResponseError):
    errno = 1
    description = "The requested offset is not within the range of offsets maintained by the server."


class CorruptRecordError(BrokerResponseError):
    errno = 2
    retriable = True
    description = "The record failed its CRC check, exceeds the valid size or is otherwise corrupt."


class UnknownTopicOrPartitionError(BrokerResponseError):
    errno = 3
    retriable = True
    invalid_metadata = True
    description = "This server does not host this topic-partition."


class InvalidFetchSizeError(BrokerResponseError):
    errno = 4
    description = "The requested fetch size is invalid."


class LeaderNotAvailableError(BrokerResponseError):
    errno = 5
    retriable = True
    invalid_metadata = True
    description = "There is no leader for this topic-partition as we are in the middle of a leadership election."


class NotLeaderForPartitionError(BrokerResponseError):
    errno = 6
    retriable = True
    invalid_metadata = True
    description = "This server is not the leader for that topic-partition."


class RequestTimedOutError(BrokerResponseError):
    errno = 7
    retriable = True
    description = "The request timed out."


class BrokerNotAvailableError(BrokerResponseError):
    errno = 8
    description = "The broker is not available."


class ReplicaNotAvailableError(BrokerResponseError):
    errno = 9
    retriable = True
    invalid_metadata = True
    description = "The replica is not available for the requested topic-partition."


class MessageSizeTooLargeError(BrokerResponseError):
    errno = 10
    description = "The request included a message larger than the max message size the server will accept."


class StaleControllerEpochError(BrokerResponseError):
    errno = 11
    description = "The controller moved to another broker."


class OffsetMetadataTooLargeError(BrokerResponseError):
    errno = 12
    description = "The metadata field of the offset request was too large."


class NetworkError(BrokerResponseError):
    errno = 13
    retriable = True
    invalid_metadata = True
    description = "The server disconnected before a response was received."


class CoordinatorLoadInProgressError(BrokerResponseError):
    errno = 14
    retriable = True
    description = "The coordinator is loading and hence can't process requests."


class CoordinatorNotAvailableError(BrokerResponseError):
    errno = 15
    retriable = True
    description = "The coordinator is not available."


class NotCoordinatorError(BrokerResponseError):
    errno = 16
    retriable = True
    description = "This is not the correct coordinator."


class InvalidTopicError(BrokerResponseError):
    errno = 17
    description = "The request attempted to perform an operation on an invalid topic."


class RecordListTooLargeError(BrokerResponseError):
    errno = 18
    description = "The request included message batch larger than the configured segment size on the server."


class NotEnoughReplicasError(BrokerResponseError):
    errno = 19
    retriable = True
    description = "Messages are rejected since there are fewer in-sync replicas than required."


class NotEnoughReplicasAfterAppendError(BrokerResponseError):
    errno = 20
    retriable = True
    description = "Messages are written to the log, but to fewer in-sync replicas than required."


class InvalidRequiredAcksError(BrokerResponseError):
    errno = 21
    description = "Produce request specified an invalid value for required acks."


class IllegalGenerationError(BrokerResponseError):
    errno = 22
    description = "Specified group generation id is not valid."


class InconsistentGroupProtocolError(BrokerResponseError):
    errno = 23
    description = "The group member's supported protocols are incompatible with those of existing members."


class InvalidGroupIdError(BrokerResponseError):
    errno = 24
    description = "The configured groupId is invalid."


class UnknownMemberIdError(BrokerResponseError):
    errno = 25
    description = "The coordinator is not aware of this member."


class InvalidSessionTimeoutError(BrokerResponseError):
    errno = 26
    description = "The session timeout is not within the range allowed by the broker."


class RebalanceInProgressError(BrokerResponseError):
    errno = 27
    description = "The group is rebalancing, so a rejoin is needed."


class InvalidCommitOffsetSizeError(BrokerResponseError):
    errno = 28
    description = "The committing offset data size is not valid."


class TopicAuthorizationFailedError(BrokerResponseError):
    errno = 29
    description = "Topic authorization failed."


class GroupAuthorizationFailedError(BrokerResponseError):
    errno = 30
    description = "Group authorization failed."


class ClusterAuthorizationFailedError(BrokerResponseError):
    errno = 31
    description = "Cluster authorization failed."


class InvalidTimestampError(BrokerResponseError):
    errno = 32
    description = "The timestamp of the message is out of acceptable range."


class UnsupportedSaslMechanismError(BrokerResponseError):
    errno = 33
    description = "The broker does not support the requested SASL mechanism."


class IllegalSaslStateError(BrokerResponseError):
    errno = 34
    description = "Request is not valid given the current SASL state."


class UnsupportedVersionError(BrokerResponseError):
    errno = 35
    description = "The version of API is not supported."


class TopicAlreadyExistsError(BrokerResponseError):
    errno = 36
    description = "Topic with this name already exists."


class InvalidPartitionsError(BrokerResponseError):
    errno = 37
    description = "Number of partitions is below 1."


class InvalidReplicationFactorError(BrokerResponseError):
    errno = 38
    description = "Replication factor is below 1 or larger than the number of available brokers."


class InvalidReplicaAssignmentError(BrokerResponseError):
    errno = 39
    description = "Replica assignment is invalid."


class InvalidConfigurationError(BrokerResponseError):
    errno = 40
    description = "Configuration is invalid."


class NotControllerError(BrokerResponseError):
    errno = 41
    retriable = True
    description = "This is not the correct controller for this cluster."


class InvalidRequestError(BrokerResponseError):
    errno = 42
    description = "This most likely occurs because of a request being malformed by the client library."


class OutOfOrderSequenceNumberError(BrokerResponseError):
    errno = 45
    description = "The broker received an out of order sequence number."


class DuplicateSequenceNumberError(BrokerResponseError):
    errno = 46
    description = "The broker received a duplicate sequence number."


class InvalidProducerEpochError(BrokerResponseError):
    errno = 47
    description = "Producer attempted to produce with an old epoch."


class InvalidTxnStateError(BrokerResponseError):
    errno = 48
    description = "The producer attempted a transactional operation in an invalid state."


class InvalidProducerIdMappingError(BrokerResponseError):
    errno = 49
    description = "The producer attempted to use a producer id which is not currently assigned to its transactional id."


class InvalidTransactionTimeoutError(BrokerResponseError):
    errno = 50
    description = (
        "The transaction timeout is larger than the maximum value allowed by the broker "
        "(as configured by transaction.max.timeout.ms)."
    )


class ConcurrentTransactionsError(BrokerResponseError):
    errno = 51
    retriable = True
    description = (
        "The producer attempted to update a transaction while another concurrent operation on the same "
        "transaction was ongoing."
    )


class TransactionCoordinatorFencedError(BrokerResponseError):
    errno = 52
    description = (
        "Indicates that the transaction coordinator sending a WriteTxnMarker is no longer the current coordinator "
        "for a given producer."
    )


class TransactionalIdAuthorizationFailedError(BrokerResponseError):
    errno = 53
    description = "Transactional Id authorization failed."


class SecurityDisabledError(BrokerResponseError):
    errno = 54
    description = "Security features are disabled."


class OperationNotAttemptedError(BrokerResponseError):
    errno = 55
    description = "The broker did not attempt to execute this operation."


class KafkaStorageError(BrokerResponseError):
    errno = 56
    retriable = True
    invalid_metadata = True
    description = "Disk error when trying to access log file on the disk."


class SaslAuthenticationFailedError(BrokerResponseError):
    errno = 58
    description = "SASL Authentication failed."


class UnknownProducerIdError(BrokerResponseError):
    errno = 59
    description = "The broker could not locate the producer metadata associated with the producer id."


class PolicyViolationError(BrokerResponseError):
    errno = 44
    description = "Request parameters do not satisfy the configured policy."


class ReassignmentInProgressError(BrokerResponseError):
    errno = 60
    description = "A partition reassignment is in progress."


class NonEmptyGroupError(BrokerResponseError):
    errno = 68
    description = "The group is not empty."


class GroupIdNotFoundError(BrokerResponseError):
    errno = 69
    description = "The group id does not exist."


class FetchSessionIdNotFoundError(BrokerResponseError):
    errno = 70
    retriable = True
    description = "The fetch session ID was not found."


class InvalidFetchSessionEpochError(BrokerResponseError):
    errno = 71
    retriable = True
    description = "The fetch session epoch is invalid."


class FencedLeaderEpochError(BrokerResponseError):
    errno = 74
    retriable = True
    invalid_metadata = True
    description = "The leader epoch in the request is older than the epoch on the broker."


class UnknownLeaderEpochError(BrokerResponseError):
    errno = 75
    retriable = True
    invalid_metadata = True
    description = "The leader epoch in the request is newer than the epoch on the broker."


class StaleBrokerEpochError(BrokerResponseError):
    errno = 77
    description = "Broker epoch has changed."


class OffsetNotAvailableError(BrokerResponseError):
    errno = 78
    retriable = True
    description = "The leader high watermark has not caught up from a recent leader election."


class MemberIdRequiredError(BrokerResponseError):
    errno = 79
    description = "The group member needs to have a valid member id before actually entering a consumer group."


class PreferredLeaderNotAvailableError(BrokerResponseError):
    errno = 80
    retriable = True
    invalid_metadata = True
    description = "The preferred leader was not available."


class FencedInstanceIdError(BrokerResponseError):
    errno = 82
    description = (
        "The broker rejected this static consumer since another consumer with the same group.instance.id "
        "has registered with a different member.id."
    )


class ElectionNotNeededError(BrokerResponseError):
    errno = 84
    description = "Leader election not needed for topic partition."


class NoReassignmentInProgressError(BrokerResponseError):
    errno = 85
    description = "No partition reassignment is in progress."


class GroupSubscribedToTopicError(BrokerResponseError):
    errno = 86
    description = "Deleting offsets of a topic is forbidden while the consumer group is actively subscribed to it."


class RecordError(NamedTuple):
    """One record a broker refused (KIP-467): its index in its batch, and why."""

    batch_index: int
    message: str


class InvalidRecordError(BrokerResponseError):
    """INVALID_RECORD. ``record_errors`` names the records the broker refused, when it
    said (KIP-467: Produce v8+ on the Kafka door, always on gRPC): their indexes and
    messages. The producer's futures give each record its own error (see
    :mod:`kclient.producer.futures`); the indexes are batch positions for ``send`` and
    positions in the call's input for ``send_batch``."""

    errno = 87
    description = "This record has failed the validation on broker and hence will be rejected."

    def __init__(self, message: str = "", record_errors: Iterable[tuple[int, str]] = ()) -> None:
        super().__init__(message)
        self.record_errors: Sequence[tuple[int, str]] = [RecordError(int(i), str(m)) for i, m in record_errors]
        """(batch index, message) of each refused record (:class:`RecordError` here)."""


class UnstableOffsetCommitError(BrokerResponseError):
    errno = 88
    retriable = True
    description = "There are unstable offsets that need to be cleared."


class ProducerFencedError(BrokerResponseError):
    errno = 90
    description = "There is a newer producer with the same transactionalId which fences the current one."


class ResourceNotFoundError(BrokerResponseError):
    errno = 91
    description = "A request illegally referred to a resource that does not exist."


class DuplicateResourceError(BrokerResponseError):
    errno = 92
    description = "A request illegally referred to the same resource twice."


class UnacceptableCredentialError(BrokerResponseError):
    errno = 93
    description = "Requested credential would not meet criteria for acceptability."


class TransactionalIdNotFoundError(BrokerResponseError):
    errno = 105
    description = "The transactionalId could not be found."


def _collect() -> dict[int, type[BrokerResponseError]]:
    table: dict[int, type[BrokerResponseError]] = {}
    pending: list[type[BrokerResponseError]] = [BrokerResponseError]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            if sub.errno in table and table[sub.errno] is not sub:
                raise RuntimeError(f"error code {sub.errno} defined twice")
            table[sub.errno] = sub
            pending.append(sub)
    return table


ERRORS: dict[int, type[BrokerResponseError]] = _collect()
"""Error code -> exception class. ``0`` (NONE) is not an error and is absent."""


def for_code(code: int) -> type[BrokerResponseError]:
    """The exception class for a Kafka error code (``UnknownError`` if unknown)."""
    return ERRORS.get(code, UnknownError)


def raise_for_code(code: int, message: str = "") -> None:
    """Raise the exception for ``code`` unless it is ``0`` (no error)."""
    if code:
        raise for_code(code)(message)


_log = logging.getLogger("kbroker.errors")


def as_response_error(exc: Exception) -> BrokerResponseError:
    """``exc`` as the error code a response carries: itself when it is one of the table's,
    else UNKNOWN_SERVER_ERROR (a bug or an unexpected failure: logged with its traceback)."""
    if isinstance(exc, BrokerResponseError):
        return exc
    _log.exception("unexpected error", exc_info=exc)
    return UnknownError(str(exc) if isinstance(exc, KafkaError) else f"{type(exc).__name__}: {exc}")
