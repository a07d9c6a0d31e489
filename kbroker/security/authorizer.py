"""Kafka's ``AclAuthorizer`` (ZooKeeper era): ACLs stored in ZooKeeper, cached on every broker.

:class:`~kbroker.cluster.acl_store.ZkAclStore` reads and writes the ACL znodes (``kctl
acls --zookeeper`` uses it directly); :class:`AclAuthorizer` keeps a cache of all of
them, refreshed from change notifications, and answers :meth:`AclAuthorizer.authorize`
from memory. :func:`decide` is the decision itself, a pure function.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kbroker.cluster.acl_store import AclDeleteResult, Acls, ZkAclStore
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zk_events import ZkEventThread
from kbroker.security.acl import (
    IMPLIED_BY,
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
    bindings_matching,
)
from kbroker.security.principal import KafkaPrincipal
from kclient.errors import KafkaError

log = logging.getLogger(__name__)
audit_log = logging.getLogger("kbroker.authorizer")
"""Kafka's ``kafka.authorizer.logger``: denials at INFO (when ``log_denied``), grants at DEBUG."""

AUTHORIZER_CLASS_NAMES = frozenset(
    {"kafka.security.authorizer.AclAuthorizer", "kafka.security.auth.SimpleAclAuthorizer"}
)
"""Values of ``authorizer.class.name`` that turn this authorizer on."""


def parse_super_users(value: str) -> frozenset[str]:
    """``super.users`` (``User:admin;User:CN=broker``) -> normalized principal strings."""
    return frozenset(str(KafkaPrincipal.parse(p.strip())) for p in value.split(";") if p.strip())


def decide(
    acls: Iterable[AccessControlEntry],
    principal: str,
    host: str,
    operation: AclOperation,
    *,
    allow_if_no_acl: bool,
) -> bool:
    """Kafka's decision over the ACLs that apply to one resource (super users aside).

    No ACL at all -> ``allow_if_no_acl``. Otherwise a matching DENY wins; else a matching
    ALLOW for the operation or one implying it (:data:`IMPLIED_BY`) allows. An entry
    matches when its principal is ``principal`` or ``User:*``, its host is ``host`` or
    ``*``, and its operation is the one asked or ALL.
    """
    entries = list(acls)
    if not entries:
        return allow_if_no_acl

    def found(ops: tuple[AclOperation, ...], permission: AclPermissionType) -> bool:
        return any(
            e.permission_type is permission
            and (e.operation in ops or e.operation is AclOperation.ALL)
            and (e.principal == principal or e.principal == WILDCARD_PRINCIPAL)
            and (e.host == host or e.host == WILDCARD_HOST)
            for e in entries
        )

    if found((operation,), AclPermissionType.DENY):
        return False
    return found(IMPLIED_BY.get(operation, (operation,)), AclPermissionType.ALLOW)


def _audit(who: str, verdict: str, op: AclOperation, host: str, rtype: ResourceType, name: str) -> str:
    """Kafka's authorizer log line."""
    return (
        f"Principal = {who} is {verdict} Operation = {op.camel} from host = {host} "
        f"on resource = {rtype.znode_name}:LITERAL:{name}"
    )


# --- the cache -------------------------------------------------------------------------


@dataclass(frozen=True)
class _Snapshot:
    """Every resource's entries, plus the PREFIXED ones indexed by type. Never mutated."""

    acls: Mapping[ResourcePattern, Acls] = field(default_factory=dict)
    prefixed: Mapping[ResourceType, Mapping[str, Acls]] = field(default_factory=dict)

    @classmethod
    def of(cls, acls: Mapping[ResourcePattern, Acls]) -> _Snapshot:
        prefixed: dict[ResourceType, dict[str, Acls]] = {}
        for pattern, entries in acls.items():
            if pattern.pattern_type is PatternType.PREFIXED:
                prefixed.setdefault(pattern.resource_type, {})[pattern.name] = entries
        return cls(acls, prefixed)

    def with_resource(self, pattern: ResourcePattern, entries: Acls) -> _Snapshot:
        acls = dict(self.acls)
        if entries:
            acls[pattern] = entries
        else:
            acls.pop(pattern, None)
        if pattern.pattern_type is not PatternType.PREFIXED:
            return _Snapshot(acls, self.prefixed)
        return _Snapshot.of(acls)

    def matching(self, resource_type: ResourceType, name: str) -> list[AccessControlEntry]:
        """The entries that apply to a resource: its literal name, literal ``*``, and every
        PREFIXED pattern that is a prefix of ``name``."""
        out: list[AccessControlEntry] = []
        for literal in (name, WILDCARD_RESOURCE):
            out.extend(self.acls.get(ResourcePattern(resource_type, literal, PatternType.LITERAL), ()))
            if name == WILDCARD_RESOURCE:
                break
        prefixes = self.prefixed.get(resource_type)
        if prefixes:
            if len(prefixes) < len(name):
                for prefix, entries in prefixes.items():
                    if name.startswith(prefix):
                        out.extend(entries)
            else:
                for end in range(1, len(name) + 1):
                    out.extend(prefixes.get(name[:end], ()))
        return out


class AclAuthorizer:
    """Kafka's ``kafka.security.authorizer.AclAuthorizer`` over ZooKeeper.

    **Znodes** (Kafka's layout, see :mod:`kbroker.cluster.zkdata`): LITERAL patterns in
    ``/kafka-acl/<Type>/<name>``, PREFIXED ones in ``/kafka-acl-extended/prefixed/<Type>/<name>``,
    each ``{"version":1,"acls":[{"principal","permissionType","operation","host"}]}``.
    Every write adds, in the same transaction, a sequential notification naming the
    resource: ``/kafka-acl-changes/acl_changes_N`` (``Topic:<name>``) for a literal one,
    ``/kafka-acl-extended-changes/acl_changes_N`` (JSON) for a prefixed one.

    **Cache.** :meth:`start` notes the newest notification of each kind, reads every ACL
    znode, then watches both notification parents; each notification with a higher
    sequence number than the last one processed re-reads only the resource it names
    (Kafka's ``ZkNodeChangeNotificationListener``), and notifications older than 15
    minutes are deleted. After a ZooKeeper disconnection or session loss everything is
    read again. Invariant: once a notification is processed, the cache holds that
    resource's znode as it was read at or after the notification, so every broker
    converges within one ZooKeeper round trip of the change.

    **Decision** (:meth:`authorize`): super users may do everything; otherwise
    :func:`decide` over the entries of the literal resource, of the literal ``*`` and of
    every PREFIXED pattern that prefixes the name; ``allow_everyone_if_no_acl_found``
    decides for a resource with no entry at all.

    **Thread safety.** The cache is an immutable :class:`_Snapshot`; readers
    (:meth:`authorize`, :meth:`describe_acls`, from any number of gRPC threads) take the
    current reference without locking. Writers (the ``acl-changes`` thread and
    :meth:`create_acls` / :meth:`delete_acls` callers) build a new snapshot and swap it in
    under ``_lock``. ZooKeeper's callbacks only enqueue work for the ``acl-changes`` thread.
    """

    def __init__(
        self,
        zk: ZkClient,
        *,
        super_users: Iterable[str | KafkaPrincipal] = (),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        self.store = ZkAclStore(zk)
        self._super_users = frozenset(str(KafkaPrincipal.parse(str(p))) for p in super_users)
        self._allow_everyone = allow_everyone_if_no_acl_found
        self._snapshot = _Snapshot()
        self._lock = threading.Lock()
        self._last_seq = {False: -1, True: -1}
        self._pending_reload = False
        self._events = ZkEventThread(zk, "acl-changes", self._handle, on_error=self._failed)

    @property
    def super_users(self) -> frozenset[str]:
        return self._super_users

    # --- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Create the ACL paths, load every ACL (so :meth:`authorize` is right from the
        first call), then follow changes on the ``acl-changes`` thread."""
        self.store.ensure_paths()
        self._reload()
        self._events.start()  # arms the watches; catches a change since the load

    def stop(self) -> None:
        self._events.stop(join_s=5)

    def sync(self, timeout_s: float = 10.0) -> bool:
        """Process every notification present now; True when done within ``timeout_s``."""
        return self._events.sync(timeout_s, poke=True)

    # --- decisions -----------------------------------------------------------------------

    def authorize(
        self,
        principal: str | KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        resource_name: str,
        *,
        log_denied: bool = True,
    ) -> bool:
        """May ``principal`` (``User:alice``), calling from ``host`` (the client's IP address
        as a string, e.g. ``127.0.0.1``), perform ``operation`` on the resource?

        ``resource_name`` is the topic, the group id, or ``kafka-cluster`` for CLUSTER.
        Reads the cache only: no ZooKeeper round trip, no lock. ``log_denied=False`` for
        checks that only filter (Metadata listing the topics a principal may Describe), as
        Kafka's ``logIfDenied``.
        """
        who = str(principal)
        if who in self._super_users:
            return True
        entries = self._snapshot.matching(resource_type, resource_name)
        allowed = decide(entries, who, host, operation, allow_if_no_acl=self._allow_everyone)
        if allowed:
            if audit_log.isEnabledFor(logging.DEBUG):
                audit_log.debug(_audit(who, "Allowed", operation, host, resource_type, resource_name))
        elif log_denied and audit_log.isEnabledFor(logging.INFO):
            audit_log.info(_audit(who, "Denied", operation, host, resource_type, resource_name))
        return allowed

    def authorize_by_resource_type(
        self, principal: str | KafkaPrincipal, host: str, operation: AclOperation, resource_type: ResourceType
    ) -> bool:
        """May ``principal`` ``operation`` on at least one resource of ``resource_type``?

        Kafka's ``AclAuthorizer.authorizeByResourceType`` (KIP-679; InitProducerId without
        a transactional id asks it for WRITE on any topic): super users may; a LITERAL ``*``
        DENY refuses; ``allow.everyone.if.no.acl.found`` allows; otherwise some ALLOW
        (LITERAL or PREFIXED, the operation itself or ALL; no implied operations) must name
        a resource that no LITERAL DENY of the same name and no PREFIXED DENY of one of its
        prefixes covers. Reads the cache only.
        """
        who = str(principal)
        if who in self._super_users:
            return True
        names: dict[tuple[AclPermissionType, PatternType], set[str]] = {
            (permission, pattern): set()
            for permission in (AclPermissionType.ALLOW, AclPermissionType.DENY)
            for pattern in (PatternType.LITERAL, PatternType.PREFIXED)
        }
        for pattern, entries in self._snapshot.acls.items():
            if pattern.resource_type is not resource_type:
                continue
            for e in entries:
                if (
                    (e.operation is operation or e.operation is AclOperation.ALL)
                    and (e.principal == who or e.principal == WILDCARD_PRINCIPAL)
                    and (e.host == host or e.host == WILDCARD_HOST)
                ):
                    names[(e.permission_type, pattern.pattern_type)].add(pattern.name)
        deny_literals = names[(AclPermissionType.DENY, PatternType.LITERAL)]
        deny_prefixes = names[(AclPermissionType.DENY, PatternType.PREFIXED)]
        if WILDCARD_RESOURCE in deny_literals:
            return False
        if self._allow_everyone:
            return True

        def dominated(name: str) -> bool:
            return any(name[:end] in deny_prefixes for end in range(1, len(name) + 1))

        allow_literals = names[(AclPermissionType.ALLOW, PatternType.LITERAL)]
        allow_prefixes = names[(AclPermissionType.ALLOW, PatternType.PREFIXED)]
        return any(not dominated(p) for p in allow_prefixes) or any(
            n == WILDCARD_RESOURCE or (n not in deny_literals and not dominated(n)) for n in allow_literals
        )

    def describe_acls(self, acl_filter: AclBindingFilter = AclBindingFilter.ANY) -> list[AclBinding]:
        """The cached bindings the filter matches (DescribeAcls), sorted."""
        return bindings_matching(self._snapshot.acls, acl_filter)

    # --- writes --------------------------------------------------------------------------

    def create_acls(self, bindings: Sequence[AclBinding]) -> list[KafkaError | None]:
        """CreateAcls: per binding None (stored) or the error; this broker's cache is
        updated at once, the others' through the notification."""
        return self.store.create_acls(bindings, on_change=self._set_resource)

    def delete_acls(self, filters: Sequence[AclBindingFilter]) -> list[AclDeleteResult]:
        """DeleteAcls: per filter the bindings it removed (and an error, if any)."""
        return self.store.delete_acls(filters, on_change=self._set_resource)

    def _set_resource(self, pattern: ResourcePattern, entries: Acls) -> None:
        with self._lock:
            self._snapshot = self._snapshot.with_resource(pattern, entries)

    # --- the acl-changes thread ----------------------------------------------------------

    def _handle(self, kind: str) -> None:
        """After a reconnection (notifications may have been missed, watches lost) or a
        failed round, everything is read again; then the new notifications."""
        if kind == "reconnected" or self._pending_reload:
            self._pending_reload = False
            self._reload()
        self._process_changes()

    def _failed(self, exc: BaseException) -> None:
        self._pending_reload = True

    def _reload(self) -> None:
        seqs = self.store.change_seqs()  # before the load: later changes get processed after it
        snapshot = _Snapshot.of(self.store.load_all())
        with self._lock:
            self._snapshot = snapshot
            self._last_seq = seqs
        log.info("ACL cache loaded: %d resources", len(snapshot.acls))

    def _process_changes(self) -> None:
        now_ms = int(time.time() * 1000)
        for prefixed in (False, True):
            notifications = self.store.notifications(prefixed, watch=self._events.watch)
            if notifications and notifications[-1][0] < self._last_seq[prefixed]:
                log.warning("ACL change notifications were reset; reloading every ACL")
                self._reload()
                continue
            for seq, child in notifications:
                if seq <= self._last_seq[prefixed]:
                    continue
                try:
                    found = self.store.notification(prefixed, child)
                except KafkaError as exc:
                    log.error("ignoring ACL change notification %s: %s", child, exc)
                    found = None
                if found is not None:
                    pattern = found[0]
                    entries, _ = self.store.read(pattern)
                    self._set_resource(pattern, entries)
                    log.debug("ACLs of %s reloaded after %s", pattern, child)
                self._last_seq[prefixed] = seq
            self.store.purge_notifications(prefixed, [c for _, c in notifications], now_ms)
