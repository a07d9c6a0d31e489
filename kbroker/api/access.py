"""Authorization of requests, as Kafka's ``KafkaApis`` asks its authorizer: the caller of
the RPC being served (:func:`kbroker.api.call_context.current`) against the ACLs.

Without an authorizer (``authorizer.class.name`` unset) everything is allowed, as in
Kafka, and no check does any work beyond noticing that. The gRPC servicer asks once per
resource of a request (per topic, never per partition); a refusal becomes that
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
    BrokerResponseError,
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
        *,
        log_denied: bool = True,
    ) -> bool: ...

    def authorize_by_resource_type(
        self, principal: str | KafkaPrincipal, host: str, operation: AclOperation, resource_type: ResourceType
    ) -> bool: ...


class Access:
    """Answers "may the caller do ``operation`` on this resource?"."""

    def __init__(self, authorizer: Authorizer | None = None) -> None:
        self.authorizer = authorizer

    @property
    def enabled(self) -> bool:
        return self.authorizer is not None

    def allows(self, operation: AclOperation, resource_type: ResourceType, name: str, *, quiet: bool = False) -> bool:
        """``quiet``: a check that only filters what is shown (Kafka's logIfDenied=false):
        a refusal is not logged as a denial."""
        if self.authorizer is None:
            return True
        call = current()
        return self.authorizer.authorize(
            call.principal, call.client_host, operation, resource_type, name, log_denied=not quiet
        )

    def cluster(self, operation: AclOperation, *, quiet: bool = False) -> bool:
        return self.allows(operation, ResourceType.CLUSTER, CLUSTER_NAME, quiet=quiet)

    def topic(self, operation: AclOperation, name: str, *, quiet: bool = False) -> bool:
        return self.allows(operation, ResourceType.TOPIC, name, quiet=quiet)

    def group(self, operation: AclOperation, name: str, *, quiet: bool = False) -> bool:
        return self.allows(operation, ResourceType.GROUP, name, quiet=quiet)

    def topics(self, operation: AclOperation, names: Iterable[str]) -> set[str]:
        """The names among ``names`` the caller may ``operation`` (a filter: quiet)."""
        return {n for n in set(names) if self.topic(operation, n, quiet=True)}

    def any_of_type(self, operation: AclOperation, resource_type: ResourceType) -> bool:
        """May the caller ``operation`` some resource of the type (Kafka's
        ``authorizeByResourceType``, KIP-679)?"""
        if self.authorizer is None:
            return True
        call = current()
        return self.authorizer.authorize_by_resource_type(call.principal, call.client_host, operation, resource_type)

    def refused_topics(self, operation: AclOperation, names: Iterable[str]) -> dict[str, BrokerResponseError]:
        """TOPIC_AUTHORIZATION_FAILED for each of ``names`` the caller may not ``operation``:
        one check per distinct name; empty, without looking at ``names``, when there is no
        authorizer."""
        if self.authorizer is None:
            return {}
        return {n: self.topic_error(operation, n) for n in set(names) if not self.topic(operation, n)}

    def creatable(self, names: Iterable[str]) -> set[str]:
        """The names among ``names`` the caller may create: CREATE on the Cluster allows all,
        else CREATE on each topic (CreateTopics, auto-creation)."""
        wanted = set(names)
        if not wanted or self.cluster(AclOperation.CREATE):
            return wanted
        return {n for n in wanted if self.topic(AclOperation.CREATE, n)}

    # --- the errors Kafka answers --------------------------------------------------------

    def check_cluster(self, operation: AclOperation) -> None:
        if not self.cluster(operation):
            raise self.cluster_error(operation)

    def check_group(self, operation: AclOperation, name: str) -> None:
        if not self.group(operation, name):
            raise self.group_error(operation, name)

    def check_topic(self, operation: AclOperation, name: str) -> None:
        if not self.topic(operation, name):
            raise self.topic_error(operation, name)

    def cluster_error(self, operation: AclOperation) -> ClusterAuthorizationFailedError:
        return ClusterAuthorizationFailedError(self.denied(operation, "the cluster"))

    def group_error(self, operation: AclOperation, name: str) -> GroupAuthorizationFailedError:
        return GroupAuthorizationFailedError(self.denied(operation, f"group {name!r}"))

    def topic_error(self, operation: AclOperation, name: str) -> TopicAuthorizationFailedError:
        return TopicAuthorizationFailedError(self.denied(operation, f"topic {name!r}"))

    @staticmethod
    def denied(operation: AclOperation, what: str) -> str:
        return f"{current().principal} is not authorized to {operation.name} {what}"
