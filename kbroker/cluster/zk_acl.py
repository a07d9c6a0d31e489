"""ZooKeeper ACLs on kbroker's znodes: Kafka's ``zookeeper.set.acl``.

**Policy** (Kafka 2.8 ``ZkData.defaultAcls``). Secure: ALL for the
:class:`~kbroker.security.zk_credential.ZkCredential`'s digest id, plus READ for world
unless the path is sensitive (``zkdata.SENSITIVE_ROOT_PATHS``: SCRAM credentials under
``/config/users``, dynamic broker configs under ``/config/brokers``,
``/delegation_token``), so nobody without the credential can create, change, delete or
re-ACL any znode, and only holders read credentials. Unsecure: world ALL
(``OPEN_ACL_UNSAFE``, ZooKeeper's default). Unlike Kafka, ``/consumers`` is secured too:
Kafka left it open for the old ZooKeeper consumers, which wrote there themselves; in
kbroker only the brokers' group coordinator writes it. ``/kafka-acl*`` stay world
readable, as in Kafka.

:class:`AclKazooClient` applies the policy to every znode a client creates
(:class:`~kbroker.cluster.zk_client.ZkClient` with ``set_acl``);
:mod:`kbroker.cluster.zk_acl_migration` applies it to an existing tree.

Paths here are chroot-relative (what a chrooted kazoo client names); every path is in
:mod:`kbroker.cluster.zkdata`.

Thread safety: pure functions; :class:`AclKazooClient` is as thread-safe as KazooClient.
"""

from __future__ import annotations

from kazoo.client import KazooClient, TransactionRequest
from kazoo.security import ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, make_digest_acl

from kbroker.cluster import zkdata
from kbroker.security.zk_credential import ZkCredential


def digest_acl(credential: ZkCredential) -> ACL:
    """ALL for this identity (``digest:user:base64(sha1(user:password))``)."""
    return make_digest_acl(credential.username, credential.password, all=True)


def is_sensitive(path: str) -> bool:
    """Does ``path`` (chroot-relative) hold secrets, so that world may not even read it?"""
    return any(path == root or path.startswith(root + "/") for root in zkdata.SENSITIVE_ROOT_PATHS)


def acls_for(path: str, credential: ZkCredential | None) -> list[ACL]:
    """The ACLs a znode at ``path`` gets: secure with a credential, world ALL without."""
    if credential is None:
        return list(OPEN_ACL_UNSAFE)
    acls = [digest_acl(credential)]
    if not is_sensitive(path):
        acls.extend(READ_ACL_UNSAFE)
    return acls


class AclKazooClient(KazooClient):
    """A KazooClient whose every create without an explicit ``acl`` gets
    ``acls_for(path, credential)`` for the path actually created: plain creates,
    ``makepath`` parents, ``ensure_path`` ancestors and transaction creates alike. So
    callers need not know which paths are sensitive.

    kazoo resolves a missing ``acl`` to ``default_acl`` everywhere (and hands that same
    list down to the parents it makes); the override of the one low-level create below
    recognises that list by identity and replaces it by the path's ACLs. That method
    (``_create_async_inner``) is kazoo-internal (2.10, 2.11); the integration tests in
    ``tests/integration/test_zookeeper_acls.py`` fail if a kazoo upgrade bypasses it.
    Thread-safe as KazooClient is (the credential is immutable).
    """

    def __init__(self, credential: ZkCredential, **kwargs: object) -> None:
        self.credential = credential
        super().__init__(default_acl=acls_for("/", credential), auth_data=credential.auth_data, **kwargs)

    def _create_async_inner(self, path: str, value: bytes, acl: list[ACL], *args: object, **kwargs: object) -> object:
        if acl is self.default_acl:
            acl = acls_for(path, self.credential)
        return super()._create_async_inner(path, value, acl, *args, **kwargs)  # type: ignore[misc]

    def transaction(self) -> TransactionRequest:
        return _AclTransaction(self)


class _AclTransaction(TransactionRequest):  # type: ignore[misc]
    client: AclKazooClient

    def create(self, path: str, value: bytes = b"", acl: list[ACL] | None = None, **kwargs: object) -> None:
        super().create(path, value, acl if acl is not None else acls_for(path, self.client.credential), **kwargs)
