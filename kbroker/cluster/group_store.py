"""Consumer-group data in ZooKeeper: members, owners, generations, committed offsets.

Layout (see :mod:`kbroker.cluster.zkdata`)::

    /consumers/<g>                      P  {"version":1,"generation":N,"protocol_type":"consumer"}
    /consumers/<g>/ids/<member>         E  member metadata JSON (owned by the coordinator's session)
    /consumers/<g>/owners/<t>/<p>       E  member id owning the partition this generation
    /consumers/<g>/offsets/<t>/<p>      P  committed offset (+ "\\n" + metadata)

A commit request is one ZooKeeper transaction (``multi``) however many partitions it
carries; which offset znodes exist is cached per group so the transaction can say
create or set without a round trip per partition (a stale cache costs one retry).

Thread safety: safe from any thread (kazoo is; the cache has a lock).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping

from kazoo.exceptions import NodeExistsError, NoNodeError

from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import CommittedOffset

TopicPartition = tuple[str, int]


class GroupStore:
    def __init__(self, zk: ZkClient) -> None:
        self._zk = zk
        self._lock = threading.Lock()
        self._existing: dict[str, set[TopicPartition]] = {}
        self._parents: set[str] = set()

    @property
    def kazoo(self):  # type: ignore[no-untyped-def]
        return self._zk.kazoo

    # --- groups --------------------------------------------------------------------

    def groups(self) -> list[str]:
        try:
            return sorted(self.kazoo.get_children(zkdata.CONSUMERS))
        except NoNodeError:
            return []

    def exists(self, group: str) -> bool:
        return self.kazoo.exists(zkdata.group_path(group)) is not None

    def generation(self, group: str) -> int:
        try:
            data, _ = self.kazoo.get(zkdata.group_path(group))
        except NoNodeError:
            return 0
        try:
            return int(json.loads(data.decode()).get("generation", 0)) if data else 0
        except (ValueError, AttributeError):
            return 0

    def set_generation(self, group: str, generation: int, protocol_type: str) -> None:
        body = json.dumps({"version": 1, "generation": generation, "protocol_type": protocol_type}).encode()
        path = zkdata.group_path(group)
        try:
            self.kazoo.set(path, body)
        except NoNodeError:
            self.kazoo.create(path, body, makepath=True)

    def delete_group(self, group: str) -> None:
        self.kazoo.delete(zkdata.group_path(group), recursive=True)
        with self._lock:
            self._existing.pop(group, None)
            self._parents = {p for p in self._parents if not p.startswith(zkdata.group_path(group) + "/")}

    # --- members and owners --------------------------------------------------------

    def add_member(self, group: str, member_id: str, info: Mapping[str, object]) -> None:
        path = zkdata.group_member_path(group, member_id)
        data = json.dumps(dict(info), sort_keys=True).encode()
        try:
            self.kazoo.create(path, data, ephemeral=True, makepath=True)
        except NodeExistsError:
            self.kazoo.set(path, data)

    def remove_member(self, group: str, member_id: str) -> None:
        try:
            self.kazoo.delete(zkdata.group_member_path(group, member_id))
        except NoNodeError:
            pass

    def members(self, group: str) -> list[str]:
        try:
            return sorted(self.kazoo.get_children(zkdata.group_path(group) + "/ids"))
        except NoNodeError:
            return []

    def set_owners(self, group: str, owners: Mapping[TopicPartition, str]) -> None:
        """Replace the ownership znodes with ``owners`` (one transaction)."""
        self.clear_owners(group)
        if not owners:
            return
        for topic in {t for t, _ in owners}:
            self._ensure_parent(f"{zkdata.group_path(group)}/owners/{topic}")
        tx = self.kazoo.transaction()
        for (topic, p), member in sorted(owners.items()):
            tx.create(zkdata.group_owner_path(group, topic, p), member.encode(), ephemeral=True)
        tx.commit()

    def clear_owners(self, group: str) -> None:
        base = f"{zkdata.group_path(group)}/owners"
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
        """Write every offset in one ZooKeeper transaction."""
        if not offsets:
            return
        for topic in {t for t, _ in offsets}:
            self._ensure_parent(f"{zkdata.group_path(group)}/offsets/{topic}")
        for attempt in (0, 1):
            known = self._known(group)
            tx = self.kazoo.transaction()
            for (topic, p), committed in sorted(offsets.items()):
                path = zkdata.group_offset_path(group, topic, p)
                data = zkdata.encode_offset(committed)
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
        wanted = list(partitions) if partitions is not None else sorted(self._scan(group))
        out: dict[TopicPartition, CommittedOffset] = {}
        for topic, p in wanted:
            try:
                data, _ = self.kazoo.get(zkdata.group_offset_path(group, topic, p))
            except NoNodeError:
                continue
            try:
                out[(topic, p)] = zkdata.decode_offset(data)
            except ValueError:
                continue
        return out

    def _scan(self, group: str) -> set[TopicPartition]:
        found: set[TopicPartition] = set()
        base = f"{zkdata.group_path(group)}/offsets"
        try:
            for topic in self.kazoo.get_children(base):
                for p in self.kazoo.get_children(f"{base}/{topic}"):
                    found.add((topic, int(p)))
        except NoNodeError:
            pass
        return found
