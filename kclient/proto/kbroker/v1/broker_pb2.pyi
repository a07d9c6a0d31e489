from kclient.proto.kbroker.v1 import admin_pb2 as _admin_pb2
from kclient.proto.kbroker.v1 import cluster_pb2 as _cluster_pb2
from kclient.proto.kbroker.v1 import config_pb2 as _config_pb2
from kclient.proto.kbroker.v1 import group_pb2 as _group_pb2
from kclient.proto.kbroker.v1 import log_pb2 as _log_pb2
from kclient.proto.kbroker.v1 import metadata_pb2 as _metadata_pb2
from kclient.proto.kbroker.v1 import reassignment_pb2 as _reassignment_pb2
from kclient.proto.kbroker.v1 import security_pb2 as _security_pb2
from kclient.proto.kbroker.v1 import txn_pb2 as _txn_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
