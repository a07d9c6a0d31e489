"""Removing committed offsets from ZooKeeper (OffsetDelete, KIP-496).

The offset znodes and their codec are :mod:`kbroker.cluster.zkdata`'s; reading them is
:class:`GroupStore`'s. This function belongs in ``GroupStore`` (as ``delete_offsets``)
and lives here until it moves there.

The deletion is one ZooKeeper transaction (all or nothing) of the offsets that exist;
a partition without a committed offset is nothing to delete. The per-topic parent
znodes stay (``GroupStore`` caches that they exist). ``GroupStore``'s cache of which
offset znodes exist may still name a deleted one: its next commit of that partition
costs one retry, as it does for any stale entry.
"""

from __future__ import annotations

from collections.abc import Collection

from kazoo.exceptions import NoNodeError, RolledBackError

from kbroker.cluster import zkdata
from kbroker.cluster.group_store import GroupStore

TopicPartition = tuple[str, int]


def erase_offsets(store: GroupStore, group: str, partitions: Collection[TopicPartition]) -> None:
    """Delete ``group``'s committed offsets of ``partitions`` (those that exist)."""
    for attempt in (0, 1):
        found = store.fetch(group, partitions)
        if not found:
            return
        tx = store.kazoo.transaction()
        for topic, p in sorted(found):
            tx.delete(zkdata.group_offset_path(group, topic, p))
        results = tx.commit()
        failure = next((r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)), None)
        if failure is None:
            return
        if attempt == 1 or not isinstance(failure, NoNodeError):
            raise failure
        # Another coordinator's delete won a race: look again.
