"""Consumer-group data in ZooKeeper: members, owners, generations, committed offsets.

Layout (see :mod:`kbroker.cluster.zkdata`)::

    /consumers/<g>                      P  {"version":1,"generation":N,"protocol_type":"consumer"}
    /consumers/<g>/ids/<member>         E  member metadata JSON (owned by the coordinator's session)
    /consumers/<g>/owners/<t>/<p>       E  member id owning the partition this generation
    /consumers/<g>/offsets/<t>/<p>      P  committed offset (+ "\\n" + metadata)

Group ids, member ids and topics are path segments through :mod:`zkdata`'s one gate
(escaped, length-bounded: InvalidGroupIdError / InvalidRequestError), so no name can
reach another group's znodes; listings decode them back.

A commit request is one ZooKeeper transaction (``multi``) however many partitions it
carries, so it is atomic; a commit whose transaction would exceed
:data:`zkdata.MAX_REQUEST_BYTES` is refused whole with InvalidCommitOffsetSizeError
(Kafka's answer to an offset batch too large to append) before anything is sent, since
ZooKeeper drops the session of a client that sends a packet over ``jute.maxbuffer``.
Which offset znodes exist is cached per group so the transaction can say create or set
without a round trip per partition (a stale cache costs one retry).

Committed-offset retention (:meth:`GroupStore.offsets_with_times`,
:meth:`GroupStore.expire_offsets`): an offset znode's ``mtime`` (ZooKeeper's time of its
last write) is the offset's commit timestamp, and the group znode's data and ``mtime``
tell whether the group ever had members. Expired offsets are deleted with the version
that was read, so a commit that lands in between keeps its offset (Kafka's "pending
commits are not expired").

Ownership znodes are advisory (Kafka-era tools read them), so a large assignment is
written in several multis of at most MAX_REQUEST_BYTES each, up to
:data:`MAX_OWNER_WRITE_BYTES` in all (InvalidRequestError beyond).

Without a ZooKeeper connection (its quorum lost, or this broker cut off from it) the
store refuses rather than waits: a read or a commit waits up to
:data:`~kbroker.cluster.zk_client.CONNECTION_WAIT_S` for the connection, and the
coordinator's mirror writes (generation, members, owners) up to :data:`MIRROR_WAIT_S`, a
blip's length (they run under the group's lock), then raise
CoordinatorNotAvailableError having done nothing (Kafka's answer when a coordinator
cannot write its group log; clients retry it). kazoo would otherwise queue the call and
block a request thread, holding the coordinator's locks, until the quorum returned.

Thread safety: safe from any thread (kazoo is; the cache has a lock).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError

from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import CONNECTION_WAIT_S, ZkClient
from kbroker.cluster.zkdata import CommittedOffset
from kclient.errors import (
    CoordinatorNotAvailableError,
    InvalidCommitOffsetSizeError,
    InvalidRequestError,
    InvalidTopicError,
)

TopicPartition = tuple[str, int]

MAX_OWNER_WRITE_BYTES = 8 * zkdata.MAX_REQUEST_BYTES
"""All ownership znodes of one group generation together (several multis)."""


MIRROR_WAIT_S = 1.0
"""How long a mirror write (generation, members, owners) waits for a lost ZooKeeper
connection: long enough for a blip, short enough that a group under its lock moves on."""


@dataclass(frozen=True)
class StoredOffset:
    """A committed offset with its znode's commit time (epoch ms) and version."""

    committed: CommittedOffset
    commit_time_ms: int
    version: int


@dataclass(frozen=True)
class StoredGroup:
    """The group znode: generation (0: never had members) and protocol type as last
    written, and when it was last written (epoch ms)."""

    generation: int
    protocol_type: str
    changed_ms: int


class GroupStore:
    def __init__(self, zk: ZkClient) -> None:
        self._zk = zk
        self._lock = threading.Lock()
        self._existing: dict[str, set[TopicPartition]] = {}
        self._parents: set[str] = set()

    @property
    def kazoo(self):  # type: ignore[no-untyped-def]
        return self._zk.kazoo

    def _online(self, what: str, wait_s: float = CONNECTION_WAIT_S, *, group: str | None = None) -> None:
        """Return once ZooKeeper is connected; CoordinatorNotAvailableError after ``wait_s``.
        A ``group`` id ZooKeeper cannot hold is refused first (InvalidGroupIdError, at once)."""
        if group is not None:
            zkdata.group_path(group)
        self._zk.require_connection(what, CoordinatorNotAvailableError, wait_s)

    # --- groups --------------------------------------------------------------------

    def groups(self) -> list[str]:
        self._online("listing groups")
        try:
            return sorted(zkdata.decode_segment(c) for c in self.kazoo.get_children(zkdata.CONSUMERS))
        except NoNodeError:
            return []

    def exists(self, group: str) -> bool:
        self._online(f"group {group!r}", group=group)
        return self.kazoo.exists(zkdata.group_path(group)) is not None

    def generation(self, group: str) -> int:
        self._online(f"loading group {group!r}", group=group)
        try:
            data, _ = self.kazoo.get(zkdata.group_path(group))
        except NoNodeError:
            return 0
        try:
            return int(json.loads(data.decode()).get("generation", 0)) if data else 0
        except (ValueError, AttributeError):
            return 0

    def stored_group(self, group: str) -> StoredGroup | None:
        """The group znode (None when there is none)."""
        self._online(f"group {group!r}", group=group)
        try:
            data, stat = self.kazoo.get(zkdata.group_path(group))
        except NoNodeError:
            return None
        generation, protocol_type = 0, ""
        try:
            body = json.loads(data.decode()) if data else {}
            if isinstance(body, dict):
                generation = int(body.get("generation", 0))
                protocol_type = str(body.get("protocol_type", ""))
        except (ValueError, TypeError, UnicodeDecodeError):
            pass
        return StoredGroup(generation, protocol_type, int(stat.mtime))

    def set_generation(self, group: str, generation: int, protocol_type: str) -> None:
        self._online(f"storing group {group!r}", MIRROR_WAIT_S, group=group)
        body = json.dumps({"version": 1, "generation": generation, "protocol_type": protocol_type}).encode()
        path = zkdata.group_path(group)
        self._zk.check_request_size([(path, body)], f"group {group!r}")
        try:
            self.kazoo.set(path, body)
        except NoNodeError:
            self.kazoo.create(path, body, makepath=True)

    def delete_group(self, group: str) -> None:
        self._online(f"deleting group {group!r}", group=group)
        path = zkdata.group_path(group)
        self.kazoo.delete(path, recursive=True)
        with self._lock:
            self._existing.pop(group, None)
            self._parents = {p for p in self._parents if not p.startswith(path + "/")}

    # --- members and owners --------------------------------------------------------

    def add_member(self, group: str, member_id: str, info: Mapping[str, object]) -> None:
        self._online(f"storing a member of group {group!r}", MIRROR_WAIT_S, group=group)
        path = zkdata.group_member_path(group, member_id)
        data = json.dumps(dict(info), sort_keys=True).encode()
        self._zk.check_request_size([(path, data)], f"member {member_id!r} of group {group!r}")
        try:
            self.kazoo.create(path, data, ephemeral=True, makepath=True)
        except NodeExistsError:
            self.kazoo.set(path, data)

    def remove_member(self, group: str, member_id: str) -> None:
        self._online(f"removing a member of group {group!r}", MIRROR_WAIT_S, group=group)
        try:
            self.kazoo.delete(zkdata.group_member_path(group, member_id))
        except NoNodeError:
            pass

    def members(self, group: str) -> list[str]:
        self._online(f"members of group {group!r}", MIRROR_WAIT_S, group=group)
        try:
            return sorted(zkdata.decode_segment(c) for c in self.kazoo.get_children(zkdata.group_members_path(group)))
        except NoNodeError:
            return []

    def set_owners(self, group: str, owners: Mapping[TopicPartition, str]) -> None:
        """Replace the ownership znodes with ``owners`` (multis of bounded size)."""
        ops = [(zkdata.group_owner_path(group, t, p), m.encode()) for (t, p), m in sorted(owners.items())]
        total = sum(zkdata.request_bytes(self._zk.chroot + path, data) for path, data in ops)
        if total > MAX_OWNER_WRITE_BYTES:
            raise InvalidRequestError(
                f"group {group!r}: the ownership of {len(ops)} partitions is {total} bytes in ZooKeeper; "
                f"the limit is {MAX_OWNER_WRITE_BYTES}"
            )
        self._online(f"storing the owners of group {group!r}", MIRROR_WAIT_S, group=group)
        self.clear_owners(group)
        for topic in {t for t, _ in owners}:
            self._ensure_parent(zkdata.group_owners_path(group, topic))
        for chunk in _chunks(ops, self._zk.chroot):
            tx = self.kazoo.transaction()
            for path, data in chunk:
                tx.create(path, data, ephemeral=True)
            tx.commit()

    def clear_owners(self, group: str) -> None:
        self._online(f"clearing the owners of group {group!r}", MIRROR_WAIT_S, group=group)
        base = zkdata.group_owners_path(group)
        try:
            topics = self.kazoo.get_children(base)
        except NoNodeError:
            return
        for topic in topics:
            try:
                for p in self.kazoo.get_children(f"{base}/{topic}"):
                    try:
                        self.kazoo.delete(f"{base}/{topic}/{p}")
                    except NoNodeError:
                        pass
            except NoNodeError:
                pass

    # --- offsets -------------------------------------------------------------------

    def _ensure_parent(self, path: str) -> None:
        with self._lock:
            if path in self._parents:
                return
        self.kazoo.ensure_path(path)
        with self._lock:
            self._parents.add(path)

    def _known(self, group: str) -> set[TopicPartition]:
        with self._lock:
            known = self._existing.get(group)
        if known is not None:
            return known
        found = self._scan(group)
        with self._lock:
            self._existing[group] = found
        return found

    def commit(self, group: str, offsets: Mapping[TopicPartition, CommittedOffset]) -> None:
        """Write every offset in one ZooKeeper transaction (all or nothing).

        Raises InvalidCommitOffsetSizeError, writing nothing, if that transaction would
        be larger than :data:`zkdata.MAX_REQUEST_BYTES`.
        """
        if not offsets:
            return
        ops = {tp: (zkdata.group_offset_path(group, *tp), zkdata.encode_offset(c)) for tp, c in offsets.items()}
        self._zk.check_request_size(
            list(ops.values()), f"a commit of {len(ops)} offsets to group {group!r}", InvalidCommitOffsetSizeError
        )
        self._online(f"committing offsets of group {group!r}", group=group)
        for topic in {t for t, _ in offsets}:
            self._ensure_parent(zkdata.group_offsets_path(group, topic))
        for attempt in (0, 1):
            known = self._known(group)
            tx = self.kazoo.transaction()
            for (topic, p), (path, data) in sorted(ops.items()):
                if (topic, p) in known:
                    tx.set_data(path, data)
                else:
                    tx.create(path, data)
            results = tx.commit()
            failure = next((r for r in results if isinstance(r, Exception)), None)
            if failure is None:
                with self._lock:
                    self._existing.setdefault(group, set()).update(offsets)
                return
            with self._lock:
                self._existing.pop(group, None)  # stale cache: reload and retry once
            if attempt == 1:
                raise failure

    def fetch(
        self, group: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        """Committed offsets (only those that exist) for ``partitions`` (None = all)."""
        self._online(f"fetching offsets of group {group!r}", group=group)
        wanted = list(partitions) if partitions is not None else sorted(self._scan(group))
        out: dict[TopicPartition, CommittedOffset] = {}
        for topic, p in wanted:
            try:
                data, _ = self.kazoo.get(zkdata.group_offset_path(group, topic, p))
            except (NoNodeError, InvalidTopicError):
                continue  # nothing committed (no topic of that name can have offsets)
            try:
                out[(topic, p)] = zkdata.decode_offset(data)
            except ValueError:
                continue
        return out

    def offsets_with_times(self, group: str) -> dict[TopicPartition, StoredOffset]:
        """Every committed offset of ``group`` with its commit time and znode version."""
        zkdata.group_path(group)  # InvalidGroupIdError before anything else
        out: dict[TopicPartition, StoredOffset] = {}
        for topic, p in sorted(self._scan(group)):
            try:
                data, stat = self.kazoo.get(zkdata.group_offset_path(group, topic, p))
            except (NoNodeError, InvalidTopicError):
                continue
            try:
                committed = zkdata.decode_offset(data)
            except ValueError:
                continue
            out[(topic, p)] = StoredOffset(committed, int(stat.mtime), int(stat.version))
        return out

    def expire_offsets(self, group: str, expired: Mapping[TopicPartition, int]) -> bool:
        """Delete the offsets of ``expired`` (partition -> the znode version that was
        found expired) in one transaction. False, deleting nothing, when one of them was
        committed again (or deleted) meanwhile: the caller looks again at its next check."""
        if not expired:
            return True
        tx = self.kazoo.transaction()
        for (topic, p), version in sorted(expired.items()):
            tx.delete(zkdata.group_offset_path(group, topic, p), version=version)
        results = tx.commit()
        with self._lock:
            self._existing.pop(group, None)  # rescanned at the next commit
        failure = next((r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None)
        if failure is None:
            return True
        if isinstance(failure, (BadVersionError, NoNodeError)):
            return False
        raise failure

    def delete_offsets(self, group: str, partitions: Iterable[TopicPartition]) -> None:
        """Delete ``group``'s committed offsets of ``partitions`` (those that exist) in one
        transaction (OffsetDelete, KIP-496). The per-topic parent znodes stay."""
        wanted = list(partitions)
        for attempt in (0, 1):
            found = self.fetch(group, wanted)
            if not found:
                return
            tx = self.kazoo.transaction()
            for topic, p in sorted(found):
                tx.delete(zkdata.group_offset_path(group, topic, p))
            results = tx.commit()
            with self._lock:
                self._existing.pop(group, None)  # rescanned at the next commit
            failure = next(
                (r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None
            )
            if failure is None:
                return
            if attempt == 1 or not isinstance(failure, NoNodeError):
                raise failure
            # Another coordinator's delete won a race: look again.

    def _scan(self, group: str) -> set[TopicPartition]:
        found: set[TopicPartition] = set()
        base = zkdata.group_offsets_path(group)
        try:
            topics = self.kazoo.get_children(base)
        except NoNodeError:
            return found
        for segment in topics:
            try:
                children = self.kazoo.get_children(f"{base}/{segment}")
            except NoNodeError:
                continue
            topic = zkdata.decode_segment(segment)
            found.update((topic, int(p)) for p in children if p.lstrip("-").isdigit())
        return found


def _chunks(ops: list[tuple[str, bytes]], chroot: str) -> list[list[tuple[str, bytes]]]:
    """``ops`` cut into runs of at most MAX_REQUEST_BYTES each."""
    out: list[list[tuple[str, bytes]]] = []
    size = 0
    for path, data in ops:
        n = zkdata.request_bytes(chroot + path, data)
        if not out or size + n > zkdata.MAX_REQUEST_BYTES:
            out.append([])
            size = 0
        out[-1].append((path, data))
        size += n
    return out
