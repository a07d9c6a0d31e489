"""Setting kbroker's ZooKeeper ACLs on an existing tree, as Kafka's
``zookeeper-security-migration.sh`` (``ZkSecurityMigrator``): ``kctl
zookeeper-security-migration``.

:func:`migrate` gives the chroot and every znode under ``zkdata.SECURE_ROOT_PATHS`` the
ACLs of :func:`kbroker.cluster.zk_acl.acls_for`; :func:`missing_roots` checks that the
tree is kbroker's. Both raise :mod:`kbroker.cluster.zk_errors`' types, not kazoo's.

Thread safety: stateless over the (thread-safe) ZkClient they are given.
"""

from __future__ import annotations

from collections.abc import Iterable

from kazoo.exceptions import NoNodeError

from kbroker.cluster import zkdata
from kbroker.cluster.zk_acl import acls_for
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zk_errors import mapped
from kbroker.security.zk_credential import ZkCredential


def _join(parent: str, child: str) -> str:
    return f"/{child}" if parent == "/" else f"{parent}/{child}"


@mapped()
def missing_roots(zk: ZkClient) -> list[str]:
    """Of the paths every kbroker broker creates at start-up, those absent (a wrong chroot?)."""
    return [p for p in zkdata.PERSISTENT_PATHS if zk.kazoo.exists(p) is None]


@mapped()
def migrate(
    zk: ZkClient,
    credential: ZkCredential | None,
    *,
    roots: Iterable[str] = zkdata.SECURE_ROOT_PATHS,
    batch: int = 500,
) -> int:
    """Set :func:`acls_for` on ``/`` (the chroot) and on every znode under each of
    ``roots`` that exists: secure ACLs with a ``credential``, world ALL without (Kafka's
    ``--zookeeper.acl secure|unsecure``). Returns how many znodes were set.

    A znode deleted during the walk is skipped; ZooKeeperNoAuthError if a znode is secured
    by another identity. ``zk`` must be authenticated with ``credential`` when securing,
    and with the identity that secured the tree when unsecuring.
    """
    kazoo = zk.kazoo
    kazoo.set_acls("/", acls_for("/", credential))
    count = 1
    level = [r for r in roots if kazoo.exists(r) is not None]
    while level:
        next_level: list[str] = []
        for start in range(0, len(level), batch):
            chunk = level[start : start + batch]
            sets = [kazoo.set_acls_async(p, acls_for(p, credential)) for p in chunk]
            kids = [kazoo.get_children_async(p) for p in chunk]
            for path, set_result, kids_result in zip(chunk, sets, kids, strict=True):
                try:
                    set_result.get()
                    count += 1
                except NoNodeError:
                    continue  # deleted meanwhile
                try:
                    next_level.extend(_join(path, c) for c in kids_result.get())
                except NoNodeError:
                    pass
        level = next_level
    return count
