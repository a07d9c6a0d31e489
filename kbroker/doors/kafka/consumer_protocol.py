"""The consumer protocol's payloads, Kafka's binary form <-> kbroker's protobuf form.

A group of protocol type ``"consumer"`` carries each member's subscription in its
JoinGroup metadata and each member's assignment in SyncGroup. Kafka clients write
Kafka's ``ConsumerProtocolSubscription`` / ``ConsumerProtocolAssignment`` (an ``int16``
version, then the struct of that version; kio has the schemas); kclient writes
``kbroker.v1.ConsumerSubscription`` / ``ConsumerAssignment`` (protobuf). The group
coordinator only ever sees the protobuf form: the Kafka door converts Kafka's bytes on
the way in and converts back, to a version the receiving client reads, on the way out.
So members of both doors share one group, one assignor run and one ownership table.

What survives a round trip Kafka -> protobuf -> Kafka at the same version: topics (in
order), user_data, owned_partitions (v1+), generation_id (v2+) and rack_id (v3, null or
not: the leader's rack-aware assignor sees each member's rack, KIP-881). Not kept: the
difference between a null and an empty user_data (both are empty in protobuf; written back as
null, which Kafka's assignors read as "no user data"). A version above 3 is read as v3
(its extra fields ignored), as Kafka's ConsumerProtocol reads a newer version.

Assignment versions 0-3 share one layout; the version only tells the reader what the
writer knows, so an assignment is written back at the version its receiver subscribed
with.

Thread safety: pure functions.
"""

from __future__ import annotations

import io
from typing import Any

from kio.schema.consumer_protocol_assignment.v0 import data as assignment_v0
from kio.schema.consumer_protocol_assignment.v1 import data as assignment_v1
from kio.schema.consumer_protocol_assignment.v2 import data as assignment_v2
from kio.schema.consumer_protocol_assignment.v3 import data as assignment_v3
from kio.schema.consumer_protocol_subscription.v0 import data as subscription_v0
from kio.schema.consumer_protocol_subscription.v1 import data as subscription_v1
from kio.schema.consumer_protocol_subscription.v2 import data as subscription_v2
from kio.schema.consumer_protocol_subscription.v3 import data as subscription_v3
from kio.serial import entity_reader, entity_writer

from kbroker.doors.kafka.length_guard import check as check_lengths
from kclient.proto.kbroker.v1 import group_pb2

CONSUMER = "consumer"
"""The only protocol type whose payloads are translated; others pass through."""

MAX_VERSION = 3
"""The newest ConsumerProtocol version known here (Kafka 3.x's)."""

_SUBSCRIPTION: tuple[Any, ...] = (subscription_v0, subscription_v1, subscription_v2, subscription_v3)
_ASSIGNMENT: tuple[Any, ...] = (assignment_v0, assignment_v1, assignment_v2, assignment_v3)


class ConsumerProtocolError(ValueError):
    """Bytes that are not a consumer-protocol payload of the expected kind."""


def _read(modules: tuple[Any, ...], name: str, data: bytes) -> tuple[Any, int]:
    """The kio entity in ``data`` and the version it was written at."""
    if len(data) < 2:
        raise ConsumerProtocolError(f"a {name} of {len(data)} bytes has no version")
    version = int.from_bytes(data[0:2], "big", signed=True)
    if version < 0:
        raise ConsumerProtocolError(f"{name} version {version}")
    schema = getattr(modules[min(version, MAX_VERSION)], name)
    try:
        check_lengths(schema, data, 2)  # the client's bytes: kio must not size anything from them unchecked
        entity, _ = entity_reader(schema)(data, 2)
    except Exception as exc:
        raise ConsumerProtocolError(f"unreadable {name} v{version}: {exc}") from exc
    return entity, version


def _write(entity: Any, version: int) -> bytes:
    buf = io.BytesIO()
    buf.write(version.to_bytes(2, "big"))
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def _clamp(version: int) -> int:
    return max(0, min(version, MAX_VERSION))


def subscription_to_proto(data: bytes) -> tuple[bytes, int]:
    """Kafka's ConsumerProtocolSubscription -> (serialized ConsumerSubscription, the
    version the member wrote). Raises :class:`ConsumerProtocolError`."""
    s, version = _read(_SUBSCRIPTION, "ConsumerProtocolSubscription", data)
    msg = group_pb2.ConsumerSubscription(
        topics=list(s.topics),
        user_data=s.user_data or b"",
        owned_partitions=[
            group_pb2.TopicPartitions(topic=tp.topic, partitions=list(tp.partitions))
            for tp in getattr(s, "owned_partitions", ())
        ],
        generation_id=int(getattr(s, "generation_id", -1)),
    )
    rack = getattr(s, "rack_id", None)
    if rack is not None:
        msg.rack_id = rack
    return msg.SerializeToString(), version


def subscription_to_kafka(data: bytes, version: int) -> bytes:
    """Serialized ConsumerSubscription -> Kafka's ConsumerProtocolSubscription of
    ``version`` (clamped to 0-3). Raises :class:`ConsumerProtocolError`."""
    msg = _parse(group_pb2.ConsumerSubscription, data)
    version = _clamp(version)
    m = _SUBSCRIPTION[version]
    values: dict[str, Any] = {"topics": tuple(msg.topics), "user_data": msg.user_data or None}
    if version >= 1:
        values["owned_partitions"] = tuple(
            m.TopicPartition(topic=tp.topic, partitions=tuple(tp.partitions)) for tp in msg.owned_partitions
        )
    if version >= 2:
        values["generation_id"] = msg.generation_id
    if version >= 3:
        values["rack_id"] = msg.rack_id if msg.HasField("rack_id") else None
    return _write(m.ConsumerProtocolSubscription(**values), version)


def assignment_to_proto(data: bytes) -> tuple[bytes, int]:
    """Kafka's ConsumerProtocolAssignment -> (serialized ConsumerAssignment, version).
    Empty bytes (no assignment) stay empty. Raises :class:`ConsumerProtocolError`."""
    if not data:
        return b"", 0
    a, version = _read(_ASSIGNMENT, "ConsumerProtocolAssignment", data)
    msg = group_pb2.ConsumerAssignment(
        partitions=[
            group_pb2.TopicPartitions(topic=tp.topic, partitions=list(tp.partitions)) for tp in a.assigned_partitions
        ],
        user_data=a.user_data or b"",
    )
    return msg.SerializeToString(), version


def assignment_to_kafka(data: bytes, version: int) -> bytes:
    """Serialized ConsumerAssignment -> Kafka's ConsumerProtocolAssignment of ``version``
    (clamped to 0-3; empty bytes are the empty assignment). Raises
    :class:`ConsumerProtocolError`."""
    msg = _parse(group_pb2.ConsumerAssignment, data)
    version = _clamp(version)
    m = _ASSIGNMENT[version]
    a = m.ConsumerProtocolAssignment(
        assigned_partitions=tuple(
            m.TopicPartition(topic=tp.topic, partitions=tuple(tp.partitions)) for tp in msg.partitions
        ),
        user_data=msg.user_data or None,
    )
    return _write(a, version)


def _parse(cls: Any, data: bytes) -> Any:
    try:
        return cls.FromString(data)
    except Exception as exc:
        raise ConsumerProtocolError(f"unreadable {cls.__name__}: {exc}") from exc
