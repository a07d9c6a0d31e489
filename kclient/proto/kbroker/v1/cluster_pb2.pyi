from kclient.proto.kbroker.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InitProducerIdRequest(_message.Message):
    __slots__ = ("transactional_id", "transaction_timeout_ms", "producer_id", "producer_epoch")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    transaction_timeout_ms: int
    producer_id: int
    producer_epoch: int
    def __init__(self, transactional_id: _Optional[str] = ..., transaction_timeout_ms: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class InitProducerIdResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "producer_id", "producer_epoch")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    producer_id: int
    producer_epoch: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class ControlledShutdownRequest(_message.Message):
    __slots__ = ("broker_id", "broker_epoch")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class ControlledShutdownResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "remaining")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    remaining: _containers.RepeatedCompositeFieldContainer[PartitionRef]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., remaining: _Optional[_Iterable[_Union[PartitionRef, _Mapping]]] = ...) -> None: ...

class PartitionRef(_message.Message):
    __slots__ = ("topic", "partition")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class PartitionState(_message.Message):
    __slots__ = ("topic", "partition", "topic_id", "leader", "leader_epoch", "isr", "controller_epoch", "zk_version")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ZK_VERSION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    topic_id: str
    leader: int
    leader_epoch: int
    isr: _containers.RepeatedScalarFieldContainer[int]
    controller_epoch: int
    zk_version: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., topic_id: _Optional[str] = ..., leader: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., isr: _Optional[_Iterable[int]] = ..., controller_epoch: _Optional[int] = ..., zk_version: _Optional[int] = ...) -> None: ...

class LeaderAndIsrRequest(_message.Message):
    __slots__ = ("controller_id", "controller_epoch", "broker_epoch", "partition_states")
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_STATES_FIELD_NUMBER: _ClassVar[int]
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partition_states: _containers.RepeatedCompositeFieldContainer[PartitionState]
    def __init__(self, controller_id: _Optional[int] = ..., controller_epoch: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., partition_states: _Optional[_Iterable[_Union[PartitionState, _Mapping]]] = ...) -> None: ...

class LeaderAndIsrResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class UpdateMetadataRequest(_message.Message):
    __slots__ = ("controller_id", "controller_epoch", "broker_epoch", "partition_states")
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_STATES_FIELD_NUMBER: _ClassVar[int]
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partition_states: _containers.RepeatedCompositeFieldContainer[PartitionState]
    def __init__(self, controller_id: _Optional[int] = ..., controller_epoch: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., partition_states: _Optional[_Iterable[_Union[PartitionState, _Mapping]]] = ...) -> None: ...

class UpdateMetadataResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class ElectLeadersRequest(_message.Message):
    __slots__ = ("partitions", "timeout_ms")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionRef]
    timeout_ms: int
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionRef, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ElectLeadersResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ElectLeadersResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ElectLeadersResult, _Mapping]]] = ...) -> None: ...

class ElectLeadersResult(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...
