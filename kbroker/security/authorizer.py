"""Kafka's ``AclAuthorizer`` (ZooKeeper era): ACLs stored in ZooKeeper, cached on every broker.

:class:`ZkAclStore` reads and writes the ACL znodes (``kctl acls --zookeeper`` uses it
directly); :class:`AclAuthorizer` keeps a cache of all of them, refreshed from change
notifications, and answers :meth:`AclAuthorizer.authorize` from memory. :func:`decide`
is the decision itself, a pure function.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
)
from kazoo.protocol.states import WatchedEvent

from kbroker.cluster import zkdata
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
    decode_acls,
    encode_acls,
    validate_binding,
)
from kbroker.security.principal import KafkaPrincipal
from kclient.errors import InvalidRequestError, KafkaError, UnknownError

log = logging.getLogger(__name__)
audit_log = logging.getLogger("kbroker.authorizer")
"""Kafka's ``kafka.authorizer.logger``: denials at INFO (when ``log_denied``), grants at DEBUG."""

AUTHORIZER_CLASS_NAMES = frozenset(
    {"kafka.security.authorizer.AclAuthorizer", "kafka.security.auth.SimpleAclAuthorizer"}
)
"""Values of ``authorizer.class.name`` that turn this authorizer on."""

CHANGE_EXPIRATION_MS = 15 * 60 * 1000
"""Notifications older than this are deleted (Kafka's changeExpirationMs)."""

MAX_UPDATE_TRIES = 50
"""Compare-and-set attempts on one resource before giving up (contention from many writers)."""

STORED_TYPES = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
    ResourceType.DELEGATION_TOKEN,
)

Acls = frozenset[AccessControlEntry]
Change = Callable[[Acls], Acls]


class AclDeleteResult(NamedTuple):
    """What one DeleteAcls filter removed; ``error`` if it could not be (fully) applied."""

    deleted: list[AclBinding]
    error: KafkaError | None = None


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


# --- the store -------------------------------------------------------------------------


def _path(pattern: ResourcePattern) -> str:
    return zkdata.acl_resource_path(
        pattern.resource_type.znode_name, pattern.name, pattern.pattern_type is PatternType.PREFIXED
    )


def _notification(pattern: ResourcePattern) -> tuple[str, bytes]:
    prefixed = pattern.pattern_type is PatternType.PREFIXED
    data = zkdata.encode_acl_change(
        pattern.resource_type.znode_name, pattern.name, pattern.pattern_type.camel if prefixed else None
    )
    return zkdata.acl_change_path(prefixed), data


def _as_kafka_error(exc: Exception) -> KafkaError:
    if isinstance(exc, KafkaError):
        return exc
    return UnknownError(f"ZooKeeper: {type(exc).__name__} {exc}".rstrip())


class ZkAclStore:
    """The ACL znodes (paths and formats in :mod:`kbroker.cluster.zkdata`).

    Every change to a resource's znode is one ZooKeeper transaction: the compare-and-set
    of ``/kafka-acl[-extended/prefixed]/<Type>/<name>`` against the version read (create
    when absent, delete when no ACL is left) plus one sequential change notification, so
    no update is lost to a concurrent writer and no change goes unannounced.

    Thread safety: stateless over a thread-safe kazoo client; concurrent writers (threads,
    brokers, kctl) are serialized by the znode versions.
    """

    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk

    def ensure_paths(self) -> None:
        kazoo = self.zk.kazoo
        for prefixed in (False, True):
            for rtype in STORED_TYPES:
                kazoo.ensure_path(zkdata.acl_type_path(rtype.znode_name, prefixed))
            kazoo.ensure_path(zkdata.acl_change_root(prefixed))

    # --- reads ---------------------------------------------------------------------------

    def read(self, pattern: ResourcePattern) -> tuple[Acls, int]:
        """(entries, znode version) of one resource; (empty, -1) if it has no znode.

        A malformed znode is logged and reads as empty.
        """
        try:
            data, stat = self.zk.kazoo.get(_path(pattern))
        except NoNodeError:
            return frozenset(), -1
        return self._decode(pattern, data), int(stat.version)

    def resources(self) -> list[ResourcePattern]:
        """Every pattern that has a znode (unknown type nodes are skipped with a warning)."""
        out: list[ResourcePattern] = []
        for pattern_type in (PatternType.LITERAL, PatternType.PREFIXED):
            prefixed = pattern_type is PatternType.PREFIXED
            for type_name in self._children(zkdata.acl_store_root(prefixed)):
                try:
                    rtype = ResourceType.parse(type_name)
                except InvalidRequestError:
                    rtype = ResourceType.UNKNOWN
                if rtype not in STORED_TYPES:
                    log.warning("ignoring ACLs of unknown resource type %r", type_name)
                    continue
                for child in self._children(zkdata.acl_type_path(type_name, prefixed)):
                    out.append(ResourcePattern(rtype, zkdata.decode_segment(child), pattern_type))
        return out

    def load_all(self) -> dict[ResourcePattern, Acls]:
        """Every resource's entries (pipelined reads); resources with none are left out."""
        pending = [(p, self.zk.kazoo.get_async(_path(p))) for p in self.resources()]
        out: dict[ResourcePattern, Acls] = {}
        for pattern, result in pending:
            try:
                data, _ = result.get(timeout=30)
            except NoNodeError:
                continue
            acls = self._decode(pattern, data)
            if acls:
                out[pattern] = acls
        return out

    def describe_acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        return bindings_matching(self.load_all(), acl_filter)

    def change_seqs(self) -> dict[bool, int]:
        """The highest notification sequence number under each change root (-1 if none)."""
        return {
            prefixed: max(
                (zkdata.acl_change_seq(c) for c in self._children(zkdata.acl_change_root(prefixed))), default=-1
            )
            for prefixed in (False, True)
        }

    def _children(self, path: str) -> list[str]:
        try:
            return list(self.zk.kazoo.get_children(path))
        except NoNodeError:
            return []

    @staticmethod
    def _decode(pattern: ResourcePattern, data: bytes) -> Acls:
        try:
            return decode_acls(data)
        except InvalidRequestError as exc:
            log.error("ACLs of %s ignored: %s", pattern, exc)
            return frozenset()

    # --- writes --------------------------------------------------------------------------

    def update(self, pattern: ResourcePattern, change: Change) -> tuple[Acls, Acls]:
        """Apply ``change`` to the resource's entries with compare-and-set; (old, new).

        Nothing is written when ``change`` leaves the entries as they are. Retries with a
        fresh read when another writer got there first; InvalidRequestError if the znode
        would be too large, UnknownError after :data:`MAX_UPDATE_TRIES` lost races.
        """
        path = _path(pattern)
        change_path, change_data = _notification(pattern)
        kazoo = self.zk.kazoo
        for attempt in range(MAX_UPDATE_TRIES):
            current, version = self.read(pattern)
            new = frozenset(change(current))
            if new == current:
                return current, new
            data = encode_acls(new)
            self.zk.check_request_size([(path, data), (change_path, change_data)], f"the ACLs of {pattern}")
            kazoo.ensure_path(path.rsplit("/", 1)[0])
            kazoo.ensure_path(zkdata.acl_change_root(pattern.pattern_type is PatternType.PREFIXED))
            tx = kazoo.transaction()
            if not new:
                tx.delete(path, version=version)
            elif version < 0:
                tx.create(path, data)
            else:
                tx.set_data(path, data, version=version)
            tx.create(change_path, change_data, sequence=True)
            results = tx.commit()
            failure = next(
                (r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None
            )
            if failure is None:
                return current, new
            if not isinstance(failure, (BadVersionError, NoNodeError, NodeExistsError)):
                raise failure
            time.sleep(random.uniform(0.005, 0.02) * min(attempt + 1, 10))
        raise UnknownError(f"the ACLs of {pattern} kept changing; gave up after {MAX_UPDATE_TRIES} attempts")

    def create_acls(
        self, bindings: Sequence[AclBinding], on_change: Callable[[ResourcePattern, Acls], None] | None = None
    ) -> list[KafkaError | None]:
        """Add each binding (already present is fine); per binding None or the error.

        Invalid bindings get InvalidRequestError and are not written; the others are
        written one transaction per resource.
        """
        results: list[KafkaError | None] = [None] * len(bindings)
        by_pattern: dict[ResourcePattern, list[int]] = {}
        for i, binding in enumerate(bindings):
            try:
                validate_binding(binding)
            except KafkaError as exc:
                results[i] = InvalidRequestError(f"Failed to create ACL {binding}: {exc.message}")
                continue
            by_pattern.setdefault(binding.pattern, []).append(i)
        for pattern, indexes in by_pattern.items():
            added = frozenset(bindings[i].entry for i in indexes)
            try:
                _, new = self.update(pattern, added.union)
            except Exception as exc:
                for i in indexes:
                    results[i] = _as_kafka_error(exc)
                continue
            if on_change is not None:
                on_change(pattern, new)
        return results

    def delete_acls(
        self,
        filters: Sequence[AclBindingFilter],
        on_change: Callable[[ResourcePattern, Acls], None] | None = None,
    ) -> list[AclDeleteResult]:
        """Remove every stored binding each filter matches; per filter what it removed.

        The resources looked at are every stored one plus those a filter names exactly
        (ACLs written a moment ago by another client included). Filters with UNKNOWN
        values get InvalidRequestError.
        """
        deleted: list[list[AclBinding]] = [[] for _ in filters]
        errors: list[KafkaError | None] = [None] * len(filters)
        usable = []
        for i, f in enumerate(filters):
            if f.is_unknown():
                errors[i] = InvalidRequestError(f"ACL filter contains UNKNOWN elements: {f}")
            else:
                usable.append(i)
        if usable:
            candidates = dict.fromkeys(self.resources())
            for i in usable:
                pf = filters[i].pattern_filter
                if pf.matches_at_most_one():
                    assert pf.name is not None
                    candidates[ResourcePattern(pf.resource_type, pf.name, pf.pattern_type)] = None
            for pattern in candidates:
                matching = [i for i in usable if filters[i].pattern_filter.matches(pattern)]
                if not matching:
                    continue
                removed: dict[int, list[AclBinding]] = {}
                try:
                    _, new = self.update(pattern, _stripper(filters, matching, pattern, removed))
                except Exception as exc:
                    for i in matching:
                        errors[i] = errors[i] or _as_kafka_error(exc)
                    continue
                for i, gone in removed.items():
                    deleted[i].extend(gone)
                if removed and on_change is not None:
                    on_change(pattern, new)
        return [AclDeleteResult(d, e) for d, e in zip(deleted, errors, strict=True)]

    # --- change notifications ------------------------------------------------------------

    def notifications(self, prefixed: bool, *, watch: Callable[[WatchedEvent], None] | None = None) -> list[str]:
        """The notification children, oldest first (arming ``watch`` on the children)."""
        root = zkdata.acl_change_root(prefixed)
        try:
            children = self.zk.kazoo.get_children(root, watch=watch)
        except NoNodeError:
            self.zk.kazoo.ensure_path(root)
            children = self.zk.kazoo.get_children(root, watch=watch)
        seqs = [c for c in children if zkdata.acl_change_seq(c) >= 0]
        return sorted(seqs, key=zkdata.acl_change_seq)

    def notification(self, prefixed: bool, child: str) -> tuple[ResourcePattern, int] | None:
        """(the resource a notification names, its creation time in ms); None if gone.

        InvalidRequestError if it is malformed (the caller skips it).
        """
        try:
            data, stat = self.zk.kazoo.get(f"{zkdata.acl_change_root(prefixed)}/{child}")
        except NoNodeError:
            return None
        type_name, name, pattern_name = zkdata.decode_acl_change(data, prefixed)
        pattern_type = PatternType.LITERAL if pattern_name is None else PatternType.parse(pattern_name)
        return ResourcePattern(ResourceType.parse(type_name), name, pattern_type), int(stat.ctime)

    def purge_notifications(self, prefixed: bool, children: list[str], now_ms: int) -> None:
        """Delete notifications older than :data:`CHANGE_EXPIRATION_MS` (oldest first; stops at a young one)."""
        root = zkdata.acl_change_root(prefixed)
        for child in children:
            stat = self.zk.kazoo.exists(f"{root}/{child}")
            if stat is None:
                continue
            if now_ms - int(stat.ctime) <= CHANGE_EXPIRATION_MS:
                return
            try:
                self.zk.kazoo.delete(f"{root}/{child}")
            except NoNodeError:
                pass


def _stripper(
    filters: Sequence[AclBindingFilter],
    matching: list[int],
    pattern: ResourcePattern,
    removed: dict[int, list[AclBinding]],
) -> Change:
    """A change removing the entries the ``matching`` filters select; ``removed`` records them
    per filter (filled anew on each compare-and-set attempt)."""

    def strip(current: Acls) -> Acls:
        removed.clear()
        keep = set(current)
        for entry in sorted(current, key=lambda e: (e.principal, e.host, e.operation, e.permission_type)):
            for i in matching:
                if filters[i].entry_filter.matches(entry):
                    removed.setdefault(i, []).append(AclBinding(pattern, entry))
                    keep.discard(entry)
        return frozenset(keep)

    return strip


def bindings_matching(acls: Mapping[ResourcePattern, Acls], acl_filter: AclBindingFilter) -> list[AclBinding]:
    """Every binding in ``acls`` the filter matches, sorted by resource then entry."""
    out: list[AclBinding] = []
    for pattern in sorted(acls, key=lambda p: (p.resource_type, p.pattern_type, p.name)):
        if not acl_filter.pattern_filter.matches(pattern):
            continue
        for entry in sorted(acls[pattern], key=lambda e: (e.principal, e.host, e.operation, e.permission_type)):
            if acl_filter.entry_filter.matches(entry):
                out.append(AclBinding(pattern, entry))
    return out


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
    under ``_lock``. kazoo callbacks only enqueue work for the ``acl-changes`` thread.
    """

    def __init__(
        self,
        zk: ZkClient,
        *,
        super_users: Iterable[str | KafkaPrincipal] = (),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        self.store = ZkAclStore(zk)
        self._zk = zk
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
            children = self.store.notifications(prefixed, watch=self._events.watch)
            seqs = [zkdata.acl_change_seq(c) for c in children]
            if seqs and seqs[-1] < self._last_seq[prefixed]:
                log.warning("ACL change notifications were reset; reloading every ACL")
                self._reload()
                continue
            for child, seq in zip(children, seqs, strict=True):
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
            self.store.purge_notifications(prefixed, children, now_ms)
