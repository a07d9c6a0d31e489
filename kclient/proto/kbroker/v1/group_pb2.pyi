from kclient.proto.kbroker.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CoordinatorType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GROUP: _ClassVar[CoordinatorType]
    TRANSACTION: _ClassVar[CoordinatorType]
GROUP: CoordinatorType
TRANSACTION: CoordinatorType

class FindCoordinatorRequest(_message.Message):
    __slots__ = ("group_id", "key_type")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_TYPE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    key_type: CoordinatorType
    def __init__(self, group_id: _Optional[str] = ..., key_type: _Optional[_Union[CoordinatorType, str]] = ...) -> None: ...

class FindCoordinatorResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "node_id", "host", "port")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    node_id: int
    host: str
    port: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., node_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class JoinGroupRequest(_message.Message):
    __slots__ = ("group_id", "session_timeout_ms", "rebalance_timeout_ms", "member_id", "protocol_type", "protocols", "client_id", "client_host", "group_instance_id", "require_known_member_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOLS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_KNOWN_MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_id: str
    protocol_type: str
    protocols: _containers.RepeatedCompositeFieldContainer[JoinGroupProtocol]
    client_id: str
    client_host: str
    group_instance_id: str
    require_known_member_id: bool
    def __init__(self, group_id: _Optional[str] = ..., session_timeout_ms: _Optional[int] = ..., rebalance_timeout_ms: _Optional[int] = ..., member_id: _Optional[str] = ..., protocol_type: _Optional[str] = ..., protocols: _Optional[_Iterable[_Union[JoinGroupProtocol, _Mapping]]] = ..., client_id: _Optional[str] = ..., client_host: _Optional[str] = ..., group_instance_id: _Optional[str] = ..., require_known_member_id: _Optional[bool] = ...) -> None: ...

class JoinGroupProtocol(_message.Message):
    __slots__ = ("name", "metadata")
    NAME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    metadata: bytes
    def __init__(self, name: _Optional[str] = ..., metadata: _Optional[bytes] = ...) -> None: ...

class JoinGroupResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "generation_id", "protocol_name", "leader_id", "member_id", "members")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    generation_id: int
    protocol_name: str
    leader_id: str
    member_id: str
    members: _containers.RepeatedCompositeFieldContainer[JoinGroupMember]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., generation_id: _Optional[int] = ..., protocol_name: _Optional[str] = ..., leader_id: _Optional[str] = ..., member_id: _Optional[str] = ..., members: _Optional[_Iterable[_Union[JoinGroupMember, _Mapping]]] = ...) -> None: ...

class JoinGroupMember(_message.Message):
    __slots__ = ("member_id", "metadata", "group_instance_id")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    metadata: bytes
    group_instance_id: str
    def __init__(self, member_id: _Optional[str] = ..., metadata: _Optional[bytes] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class SyncGroupRequest(_message.Message):
    __slots__ = ("group_id", "generation_id", "member_id", "assignments", "group_instance_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    generation_id: int
    member_id: str
    assignments: _containers.RepeatedCompositeFieldContainer[SyncGroupAssignment]
    group_instance_id: str
    def __init__(self, group_id: _Optional[str] = ..., generation_id: _Optional[int] = ..., member_id: _Optional[str] = ..., assignments: _Optional[_Iterable[_Union[SyncGroupAssignment, _Mapping]]] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class SyncGroupAssignment(_message.Message):
    __slots__ = ("member_id", "assignment")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    assignment: bytes
    def __init__(self, member_id: _Optional[str] = ..., assignment: _Optional[bytes] = ...) -> None: ...

class SyncGroupResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "assignment")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    assignment: bytes
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., assignment: _Optional[bytes] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("group_id", "generation_id", "member_id", "group_instance_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str
    def __init__(self, group_id: _Optional[str] = ..., generation_id: _Optional[int] = ..., member_id: _Optional[str] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class LeaveGroupRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "group_instance_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    group_instance_id: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class LeaveGroupResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class CommitOffsetsRequest(_message.Message):
    __slots__ = ("group_id", "generation_id", "member_id", "topics", "group_instance_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    generation_id: int
    member_id: str
    topics: _containers.RepeatedCompositeFieldContainer[CommitTopic]
    group_instance_id: str
    def __init__(self, group_id: _Optional[str] = ..., generation_id: _Optional[int] = ..., member_id: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[CommitTopic, _Mapping]]] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class CommitTopic(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedCompositeFieldContainer[CommitPartition]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[CommitPartition, _Mapping]]] = ...) -> None: ...

class CommitPartition(_message.Message):
    __slots__ = ("index", "offset", "metadata")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    offset: int
    metadata: str
    def __init__(self, index: _Optional[int] = ..., offset: _Optional[int] = ..., metadata: _Optional[str] = ...) -> None: ...

class CommitOffsetsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CommitTopicResponse]
    def __init__(self, topics: _Optional[_Iterable[_Union[CommitTopicResponse, _Mapping]]] = ...) -> None: ...

class CommitTopicResponse(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionError]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionError, _Mapping]]] = ...) -> None: ...

class PartitionError(_message.Message):
    __slots__ = ("index", "error_code", "error_message")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    index: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, index: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class FetchOffsetsRequest(_message.Message):
    __slots__ = ("group_id", "topics")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topics: _containers.RepeatedCompositeFieldContainer[FetchOffsetsTopic]
    def __init__(self, group_id: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[FetchOffsetsTopic, _Mapping]]] = ...) -> None: ...

class FetchOffsetsTopic(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class FetchOffsetsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "topics")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    topics: _containers.RepeatedCompositeFieldContainer[FetchOffsetsTopicResponse]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[FetchOffsetsTopicResponse, _Mapping]]] = ...) -> None: ...

class FetchOffsetsTopicResponse(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedCompositeFieldContainer[FetchOffsetsPartition]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[FetchOffsetsPartition, _Mapping]]] = ...) -> None: ...

class FetchOffsetsPartition(_message.Message):
    __slots__ = ("index", "offset", "metadata", "error_code")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    index: int
    offset: int
    metadata: str
    error_code: _common_pb2.ErrorCode
    def __init__(self, index: _Optional[int] = ..., offset: _Optional[int] = ..., metadata: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("error_code", "groups")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    groups: _containers.RepeatedCompositeFieldContainer[ListedGroup]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., groups: _Optional[_Iterable[_Union[ListedGroup, _Mapping]]] = ...) -> None: ...

class ListedGroup(_message.Message):
    __slots__ = ("group_id", "protocol_type", "state")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    protocol_type: str
    state: str
    def __init__(self, group_id: _Optional[str] = ..., protocol_type: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class DescribeGroupsRequest(_message.Message):
    __slots__ = ("group_ids",)
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[DescribedGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[DescribedGroup, _Mapping]]] = ...) -> None: ...

class DescribedGroup(_message.Message):
    __slots__ = ("error_code", "error_message", "group_id", "state", "protocol_type", "protocol_name", "generation_id", "leader_id", "members")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    generation_id: int
    leader_id: str
    members: _containers.RepeatedCompositeFieldContainer[DescribedMember]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., group_id: _Optional[str] = ..., state: _Optional[str] = ..., protocol_type: _Optional[str] = ..., protocol_name: _Optional[str] = ..., generation_id: _Optional[int] = ..., leader_id: _Optional[str] = ..., members: _Optional[_Iterable[_Union[DescribedMember, _Mapping]]] = ...) -> None: ...

class DescribedMember(_message.Message):
    __slots__ = ("member_id", "client_id", "client_host", "metadata", "assignment", "group_instance_id")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes
    group_instance_id: str
    def __init__(self, member_id: _Optional[str] = ..., client_id: _Optional[str] = ..., client_host: _Optional[str] = ..., metadata: _Optional[bytes] = ..., assignment: _Optional[bytes] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class DeleteGroupsRequest(_message.Message):
    __slots__ = ("group_ids",)
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteGroupsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[GroupResult]
    def __init__(self, results: _Optional[_Iterable[_Union[GroupResult, _Mapping]]] = ...) -> None: ...

class GroupResult(_message.Message):
    __slots__ = ("group_id", "error_code", "error_message")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, group_id: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class OffsetDeleteRequest(_message.Message):
    __slots__ = ("group_id", "topics")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topics: _containers.RepeatedCompositeFieldContainer[OffsetDeleteTopic]
    def __init__(self, group_id: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[OffsetDeleteTopic, _Mapping]]] = ...) -> None: ...

class OffsetDeleteTopic(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class OffsetDeleteResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "topics")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    topics: _containers.RepeatedCompositeFieldContainer[OffsetDeleteTopicResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[OffsetDeleteTopicResult, _Mapping]]] = ...) -> None: ...

class OffsetDeleteTopicResult(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetDeletePartitionResult]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[OffsetDeletePartitionResult, _Mapping]]] = ...) -> None: ...

class OffsetDeletePartitionResult(_message.Message):
    __slots__ = ("index", "error_code", "error_message")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    index: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, index: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class ConsumerSubscription(_message.Message):
    __slots__ = ("topics", "user_data", "owned_partitions", "generation_id", "rack_id")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    USER_DATA_FIELD_NUMBER: _ClassVar[int]
    OWNED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_ID_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    user_data: bytes
    owned_partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    generation_id: int
    rack_id: str
    def __init__(self, topics: _Optional[_Iterable[str]] = ..., user_data: _Optional[bytes] = ..., owned_partitions: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ..., generation_id: _Optional[int] = ..., rack_id: _Optional[str] = ...) -> None: ...

class ConsumerAssignment(_message.Message):
    __slots__ = ("partitions", "user_data")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    USER_DATA_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    user_data: bytes
    def __init__(self, partitions: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ..., user_data: _Optional[bytes] = ...) -> None: ...

class TopicPartitions(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...
