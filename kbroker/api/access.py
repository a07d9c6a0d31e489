"""Authorization of requests, as Kafka's ``KafkaApis`` asks its authorizer: the caller of
the RPC being served (:func:`kbroker.api.call_context.current`) against the ACLs.

Without an authorizer (``authorizer.class.name`` unset) everything is allowed, as in
Kafka. The gRPC servicer asks it once per resource of a request; a refusal becomes that
resource's TOPIC_/GROUP_/CLUSTER_AUTHORIZATION_FAILED.

Thread safety: stateless; the authorizer's cache is safe from any thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from kbroker.api.call_context import current
from kbroker.security.acl import CLUSTER_NAME, AclOperation, ResourceType
from kbroker.security.principal import KafkaPrincipal
from kclient.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
)


class Authorizer(Protocol):
    def authorize(
        self,
        principal: str | KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: str,
    ) -> bool: ...


class Access:
    """Answers "may the caller do ``operation`` on this resource?"."""

    def __init__(self, authorizer: Authorizer | None = None) -> None:
        self.authorizer = authorizer

    @property
    def enabled(self) -> bool:
        return self.authorizer is not None

    def allows(self, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        if self.authorizer is None:
            return True
        call = current()
        return self.authorizer.authorize(call.principal, call.client_host, operation, resource_type, name)

    def cluster(self, operation: AclOperation) -> bool:
        return self.allows(operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def topic(self, operation: AclOperation, name: str) -> bool:
        return self.allows(operation, ResourceType.TOPIC, name)

    def group(self, operation: AclOperation, name: str) -> bool:
        return self.allows(operation, ResourceType.GROUP, name)

    def topics(self, operation: AclOperation, names: Iterable[str]) -> set[str]:
        """The names among ``names`` the caller may ``operation``."""
        return {n for n in set(names) if self.topic(operation, n)}

    # --- the errors Kafka answers --------------------------------------------------------

    def check_cluster(self, operation: AclOperation) -> None:
        if not self.cluster(operation):
            raise ClusterAuthorizationFailedError(self.denied(operation, "the cluster"))

    def check_group(self, operation: AclOperation, name: str) -> None:
        if not self.group(operation, name):
            raise GroupAuthorizationFailedError(self.denied(operation, f"group {name!r}"))

    def check_topic(self, operation: AclOperation, name: str) -> None:
        if not self.topic(operation, name):
            raise TopicAuthorizationFailedError(self.denied(operation, f"topic {name!r}"))

    @staticmethod
    def denied(operation: AclOperation, what: str) -> str:
        return f"{current().principal} is not authorized to {operation.name} {what}"
