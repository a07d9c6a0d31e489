"""The core request layer of one broker (Kafka's ``KafkaApis``): one object per area,
each taking plain typed values and returning typed results or raising the error table's
exceptions. Both doors (:mod:`kbroker.doors`) hold one :class:`BrokerApis` and are codecs
over it; authorization (one :class:`~kbroker.api.access.Access`), metrics and the
purgatory sizes live here once.

Thread safety: see each area's module; the facade itself is immutable after construction.
"""

from __future__ import annotations

from collections.abc import Callable

from kbroker.api.access import Access
from kbroker.api.admin_api import AdminApi
from kbroker.api.call_context import Offload
from kbroker.api.cluster_api import ClusterApi
from kbroker.api.group_api import GroupApi
from kbroker.api.log_api import LogApi
from kbroker.api.metadata_api import MetadataApi
from kbroker.api.security_api import SecurityApi
from kbroker.api.txn_api import TransactionApi
from kbroker.cluster.controller import Controller
from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.cluster.producer_ids import ProducerIdManager
from kbroker.cluster.topic_admin import TopicAdmin
from kbroker.cluster.zk_client import ZkClient
from kbroker.group.coordinator import GroupCoordinator
from kbroker.metrics import BrokerMetrics
from kbroker.replication.replica_manager import ReplicaManager
from kbroker.security.authorizer import AclAuthorizer
from kbroker.security.credentials import CredentialStore
from kbroker.txn.coordinator import TransactionCoordinator


class BrokerApis:
    """``metadata``, ``log``, ``groups``, ``transactions``, ``admin``, ``cluster`` and
    ``security``: the areas of the core; ``offload`` runs a blocking core call on the
    request pool of the door calling it."""

    def __init__(
        self,
        broker_id: int,
        cluster_id: Callable[[], str],
        replicas: ReplicaManager,
        metadata: MetadataCache,
        zk: ZkClient,
        admin: TopicAdmin,
        producer_ids: ProducerIdManager,
        controller: Controller,
        groups: GroupCoordinator,
        offload: Offload,
        *,
        credentials: CredentialStore,
        transactions: TransactionCoordinator,
        auto_create_topics: bool = False,
        authorizer: AclAuthorizer | None = None,
        metrics: BrokerMetrics | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.access = Access(authorizer)
        self.offload = offload
        self.metadata = MetadataApi(
            cluster_id,
            metadata,
            admin,
            self.access,
            replicas.fenced_partition,
            replicas.any_fenced,
            auto_create_topics=auto_create_topics,
        )
        self.log = LogApi(replicas, metadata, self.metadata, producer_ids, self.access, offload, metrics)
        self.groups = GroupApi(groups, metadata, self.access, offload)
        self.transactions = TransactionApi(broker_id, transactions, metadata, self.access, groups.check_txn_commit)
        self.admin = AdminApi(broker_id, replicas, metadata, zk, admin, self.access)
        self.cluster = ClusterApi(broker_id, controller, metadata, zk, self.access)
        self.credentials = credentials
        """The SCRAM credentials (the doors' SASL authenticators look users up here)."""
        self.security = SecurityApi(authorizer, credentials, self.access)
