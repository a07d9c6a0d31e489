"""The ACL znodes: Kafka's ``AclAuthorizer`` storage in ZooKeeper (paths and formats in
:mod:`kbroker.cluster.zkdata`, the ACL model and its JSON in :mod:`kbroker.security.acl`).

:class:`ZkAclStore` reads and writes them for the brokers' authorizer
(:class:`kbroker.security.authorizer.AclAuthorizer`, which caches them) and for
``kctl acls --zookeeper``, which uses it directly.

Without a ZooKeeper connection (its quorum lost), :meth:`ZkAclStore.create_acls` and
:meth:`ZkAclStore.delete_acls` wait up to ``zookeeper_wait_s`` (5 s) for it, after their
bindings and filters are checked, then answer each valid item RequestTimedOutError
having changed nothing (kazoo would queue the writes for the whole outage). The
broker's DescribeAcls answers from the authorizer's cache and does not wait.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
)

from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import CONNECTION_WAIT_S, ZkClient
from kbroker.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    PatternType,
    ResourcePattern,
    ResourceType,
    bindings_matching,
    decode_acls,
    encode_acls,
    validate_binding,
)
from kclient.errors import InvalidRequestError, KafkaError, RequestTimedOutError, UnknownError

log = logging.getLogger(__name__)

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

    ZooKeeper failures other than a lost race come out as kazoo's exceptions, which the
    watcher thread (:class:`~kbroker.cluster.zk_events.ZkEventThread`) recognises and
    ``kctl`` maps (:func:`kbroker.cluster.zk_errors.mapped`); :meth:`create_acls` and
    :meth:`delete_acls` report them per binding as UnknownError.

    Thread safety: stateless over a thread-safe ZkClient; concurrent writers (threads,
    brokers, kctl) are serialized by the znode versions.
    """

    def __init__(self, zk: ZkClient, *, zookeeper_wait_s: float = CONNECTION_WAIT_S) -> None:
        self.zk = zk
        self.zookeeper_wait_s = zookeeper_wait_s

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

    def _offline(self, what: str) -> KafkaError | None:
        """None once the session is connected; the RequestTimedOutError to answer after
        ``zookeeper_wait_s`` without it."""
        try:
            self.zk.require_connection(what, RequestTimedOutError, self.zookeeper_wait_s)
        except RequestTimedOutError as exc:
            return exc
        return None

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
        written one transaction per resource, or all get RequestTimedOutError without a
        ZooKeeper connection (see the module docstring).
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
        offline = self._offline(f"creating {sum(map(len, by_pattern.values()))} ACL(s)") if by_pattern else None
        if offline is not None:
            for indexes in by_pattern.values():
                for i in indexes:
                    results[i] = offline
            return results
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
        values get InvalidRequestError; without a ZooKeeper connection the others get
        RequestTimedOutError, nothing removed.
        """
        deleted: list[list[AclBinding]] = [[] for _ in filters]
        errors: list[KafkaError | None] = [None] * len(filters)
        usable = []
        for i, f in enumerate(filters):
            if f.is_unknown():
                errors[i] = InvalidRequestError(f"ACL filter contains UNKNOWN elements: {f}")
            else:
                usable.append(i)
        offline = self._offline(f"deleting the ACLs of {len(usable)} filter(s)") if usable else None
        if offline is not None:
            for i in usable:
                errors[i] = offline
            usable = []
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

    def notifications(self, prefixed: bool, *, watch: Callable[[Any], object] | None = None) -> list[tuple[int, str]]:
        """(sequence number, child) of each notification, oldest first (arming ``watch``, a
        :meth:`ZkEventThread.watch <kbroker.cluster.zk_events.ZkEventThread.watch>`, on the children)."""
        root = zkdata.acl_change_root(prefixed)
        try:
            children = self.zk.kazoo.get_children(root, watch=watch)
        except NoNodeError:
            self.zk.kazoo.ensure_path(root)
            children = self.zk.kazoo.get_children(root, watch=watch)
        return sorted((zkdata.acl_change_seq(c), c) for c in children if zkdata.acl_change_seq(c) >= 0)

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
