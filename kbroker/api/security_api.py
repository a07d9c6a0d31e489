"""ACL and SCRAM-user administration, protocol-neutral (Kafka's ``handleCreateAcls``,
``handleDescribeAcls``, ``handleDeleteAcls``, ``handleDescribeUserScramCredentials`` and
``handleAlterUserScramCredentials``): plain values in, one answer per item out, in
request order; a refusal of the whole request (SECURITY_DISABLED without an authorizer,
CLUSTER_AUTHORIZATION_FAILED) is raised. ACL changes need ALTER on the Cluster, reads
DESCRIBE, as in Kafka.

Both doors decode their wire's codes with :func:`binding` and :func:`binding_filter` (an
unknown code is refused with INVALID_REQUEST, for that item only) and hand the items, or
the error that refused each, to :class:`SecurityApi`.

SASL is not here: like Kafka's SaslServerAuthenticator it belongs to the connection, so
each door runs the listener's :class:`~kbroker.security.sasl.SaslAuthenticator` itself.

Thread safety: every method blocks (ZooKeeper) and runs on a door's request pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, TypeVar, Union

from kbroker.api.access import Access
from kbroker.cluster.acl_store import AclDeleteResult
from kbroker.security.acl import (
    AccessControlEntry,
    AccessControlEntryFilter,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
    validate_binding,
)
from kbroker.security.authorizer import AclAuthorizer
from kbroker.security.credentials import (
    CredentialStore,
    ScramDeletion,
    ScramUpsertion,
    alter_user_scram_credentials,
    describe_user_scram_credentials,
)
from kclient.errors import BrokerResponseError, InvalidRequestError, SecurityDisabledError, as_response_error
from kclient.scram import ScramMechanism

T = TypeVar("T")
R = TypeVar("R")
Decoded: TypeAlias = Union[T, BrokerResponseError]  # noqa: UP007  (a generic alias)
"""An item of a request as a door decoded it, or the error that refused it."""


def _enum(kind: type[Any], value: int, what: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise InvalidRequestError(f"unknown {what} code {value}") from None


def binding(
    resource_type: int,
    resource_name: str,
    pattern_type: int,
    principal: str,
    host: str,
    operation: int,
    permission_type: int,
) -> AclBinding:
    """An ACL from its wire codes (an unknown code: InvalidRequestError)."""
    return AclBinding(
        ResourcePattern(
            _enum(ResourceType, resource_type, "resource type"),
            resource_name,
            _enum(PatternType, pattern_type, "pattern type"),
        ),
        AccessControlEntry(
            principal,
            host,
            _enum(AclOperation, operation, "operation"),
            _enum(AclPermissionType, permission_type, "permission type"),
        ),
    )


def binding_filter(
    resource_type: int,
    resource_name: str | None,
    pattern_type: int,
    principal: str | None,
    host: str | None,
    operation: int,
    permission_type: int,
) -> AclBindingFilter:
    """A filter from its wire codes (None: any); an UNKNOWN type, pattern, operation or
    permission is refused (InvalidRequestError): ANY matches everything."""
    out = AclBindingFilter(
        ResourcePatternFilter(
            _enum(ResourceType, resource_type, "resource type"),
            resource_name,
            _enum(PatternType, pattern_type, "pattern type"),
        ),
        AccessControlEntryFilter(
            principal,
            host,
            _enum(AclOperation, operation, "operation"),
            _enum(AclPermissionType, permission_type, "permission type"),
        ),
    )
    if out.is_unknown():
        raise InvalidRequestError(f"the filter {out} has an UNKNOWN field (use ANY to match everything)")
    return out


def decoded(decode: Callable[..., T], *args: Any) -> Decoded[T]:
    """``decode(*args)``, or the error that refused it."""
    try:
        return decode(*args)
    except BrokerResponseError as exc:
        return exc


def _in_order(items: Sequence[Decoded[T]], apply: Callable[[list[T]], Sequence[R]]) -> list[R | BrokerResponseError]:
    """``apply`` to the decoded items at once; its results and the refusals, in request order."""
    valid = [d for d in items if not isinstance(d, BrokerResponseError)]
    done = iter(apply(valid) if valid else [])
    return [d if isinstance(d, BrokerResponseError) else next(done) for d in items]


def _validated(b: AclBinding) -> Decoded[AclBinding]:
    try:
        validate_binding(b)
    except BrokerResponseError as exc:
        return exc
    return b


class SecurityApi:
    """The ACL and SCRAM-user requests of one broker (see the module docstring)."""

    def __init__(self, authorizer: AclAuthorizer | None, credentials: CredentialStore, access: Access) -> None:
        self._acls = authorizer
        self._credentials = credentials
        self._access = access

    def _authorizer_for(self, operation: AclOperation) -> AclAuthorizer:
        if self._acls is None:
            raise SecurityDisabledError("No Authorizer is configured on the broker (authorizer.class.name)")
        self._access.check_cluster(operation)
        return self._acls

    def create_acls(self, bindings: Sequence[Decoded[AclBinding]]) -> list[BrokerResponseError | None]:
        acls = self._authorizer_for(AclOperation.ALTER)
        checked = [b if isinstance(b, BrokerResponseError) else _validated(b) for b in bindings]
        done = _in_order(checked, acls.create_acls)
        return [as_response_error(e) if e is not None else None for e in done]

    def describe_acls(self, wanted: AclBindingFilter) -> list[AclBinding]:
        return self._authorizer_for(AclOperation.DESCRIBE).describe_acls(wanted)

    def delete_acls(self, filters: Sequence[Decoded[AclBindingFilter]]) -> list[AclDeleteResult | BrokerResponseError]:
        return _in_order(filters, self._authorizer_for(AclOperation.ALTER).delete_acls)

    def describe_scram_users(
        self, users: Sequence[str]
    ) -> list[tuple[str, BrokerResponseError | None, dict[ScramMechanism, int]]]:
        """Every user with a credential (``users`` empty), or the named ones."""
        self._access.check_cluster(AclOperation.DESCRIBE)
        try:
            return describe_user_scram_credentials(self._credentials, list(users))
        except Exception as exc:
            raise as_response_error(exc) from exc

    def alter_scram_users(
        self, deletions: Sequence[ScramDeletion], upsertions: Sequence[ScramUpsertion]
    ) -> dict[str, BrokerResponseError | None]:
        """User -> None (done) or its error, in the order users first appear."""
        self._access.check_cluster(AclOperation.ALTER)
        return alter_user_scram_credentials(self._credentials, deletions, upsertions)
