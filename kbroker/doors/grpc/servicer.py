"""The gRPC ``kbroker.v1.Broker`` servicer: a thin codec over the core request layer
(:class:`~kbroker.api.apis.BrokerApis`). Each RPC decodes its protobuf request into the
core's plain values, makes one call and encodes the answer; the handlers live in one
mixin per area (:mod:`~kbroker.doors.grpc.log_rpcs`, :mod:`~kbroker.doors.grpc.group_rpcs`,
:mod:`~kbroker.doors.grpc.admin_rpcs`, :mod:`~kbroker.doors.grpc.security_rpcs`,
:mod:`~kbroker.doors.grpc.txn_rpcs`).

Handlers are coroutines on the server's event loop (:mod:`kbroker.doors.grpc.server`):
blocking core calls go through ``offload`` (a bounded thread pool); long polls
(Fetch, acks=all Produce, JoinGroup, SyncGroup) park in the core's purgatories and hold
no thread.

Per-partition problems travel as error codes inside the response; a malformed request
as a whole fails with gRPC status INVALID_ARGUMENT (plus the Kafka code in the
``kbroker-error-code`` trailing metadata) and changes nothing. Every ``optional``
proto field that is unset takes the default the .proto documents (Kafka's).
"""

from __future__ import annotations

from collections.abc import Callable

from kbroker.api.apis import BrokerApis
from kbroker.doors.grpc.admin_rpcs import AdminRpcs
from kbroker.doors.grpc.group_rpcs import GroupRpcs
from kbroker.doors.grpc.log_rpcs import LogRpcs
from kbroker.doors.grpc.security_rpcs import SecurityRpcs
from kbroker.doors.grpc.txn_rpcs import TxnRpcs
from kbroker.security.sasl import SaslAuthenticator
from kclient.proto.kbroker.v1 import broker_pb2_grpc


class BrokerService(LogRpcs, GroupRpcs, AdminRpcs, SecurityRpcs, TxnRpcs, broker_pb2_grpc.BrokerServicer):
    """The servicer of one gRPC server over ``apis`` (the mixins read the areas below);
    ``sasl`` gives each gRPC listener's SASL authenticator (None: SASL not served)."""

    def __init__(self, apis: BrokerApis, sasl: Callable[[str], SaslAuthenticator | None] = lambda name: None) -> None:
        self.apis = apis
        self.log_api, self.metadata_api, self.groups_api = apis.log, apis.metadata, apis.groups
        self.admin_api, self.cluster_api, self.security_api = apis.admin, apis.cluster, apis.security
        self.txn_api = apis.transactions
        self._broker_id = apis.broker_id
        self._offload = apis.offload
        self._sasl = sasl
