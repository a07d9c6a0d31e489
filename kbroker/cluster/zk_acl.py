"""ZooKeeper ACLs on kbroker's znodes (Kafka's ``zookeeper.set.acl``), the ZooKeeper
credential, and the migration of an existing tree (``zookeeper-security-migration.sh``).

**Credential.** ZooKeeper's built-in ``digest`` scheme (no server setting needed): a
session authenticates with ``user:password`` and an ACL names the id
``digest:user:base64(sha1(user:password))``. It is found, in order, in:

- an explicit ``user:password`` (the broker's ``zookeeper.auth.digest``);
- ``$KBROKER_ZK_DIGEST`` (``user:password``);
- a JAAS file named by ``-Djava.security.auth.login.config=FILE`` in ``$KAFKA_OPTS``, as
  Kafka's brokers and tools read it: the ``Client`` section (or the one named by
  ``-Dzookeeper.sasl.clientconfig=``) with ``username="..."`` and ``password="..."``
  (the DigestLoginModule section of Kafka's docs). Its user and password are used with
  the digest scheme, not SASL.

**Policy** (Kafka 2.8 ``ZkData.defaultAcls``). Secure: ALL for the credential's digest id,
plus READ for world unless the path is sensitive (``zkdata.SENSITIVE_ROOT_PATHS``: SCRAM
credentials under ``/config/users``, dynamic broker configs under ``/config/brokers``,
``/delegation_token``), so nobody without the credential can create, change, delete or
re-ACL any znode, and only holders read credentials. Unsecure: world ALL
(``OPEN_ACL_UNSAFE``, ZooKeeper's default). Unlike Kafka, ``/consumers`` is secured too:
Kafka left it open for the old ZooKeeper consumers, which wrote there themselves; in
kbroker only the brokers' group coordinator writes it. ``/kafka-acl*`` stay world
readable, as in Kafka.

**Migration** (:func:`migrate`): the chroot and every znode under
``zkdata.SECURE_ROOT_PATHS`` get :func:`acls_for`. It and :func:`missing_roots` raise
:mod:`kbroker.cluster.zk_errors`' types, not kazoo's (``kctl`` calls them).

Paths here are chroot-relative (what a chrooted kazoo client names); every path is in
:mod:`kbroker.cluster.zkdata`.

Thread safety: pure functions, except :func:`migrate` and :func:`missing_roots`, which
only use the ZooKeeper client they are given (thread-safe).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import NoNodeError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE, make_digest_acl

from kbroker.cluster import zkdata
from kbroker.cluster.zk_errors import mapped

if TYPE_CHECKING:
    from kbroker.cluster.zk_client import ZkClient

DIGEST_ENV = "KBROKER_ZK_DIGEST"
KAFKA_OPTS_ENV = "KAFKA_OPTS"
JAAS_PROPERTY = "java.security.auth.login.config"
JAAS_SECTION_PROPERTY = "zookeeper.sasl.clientconfig"
JAAS_DEFAULT_SECTION = "Client"

NO_AUTH_HINT = (
    f"set {DIGEST_ENV}=USER:PASSWORD, or {KAFKA_OPTS_ENV}=-D{JAAS_PROPERTY}=FILE"
    f" (a JAAS file with a {JAAS_DEFAULT_SECTION} section)"
)


class ZkCredentialError(ValueError):
    """A ZooKeeper credential is malformed or cannot be read (a configuration error)."""


@dataclass(frozen=True)
class ZkCredential:
    """A ZooKeeper digest identity: ``user:password`` (the password never printed)."""

    username: str
    password: str = field(repr=False)

    @classmethod
    def parse(cls, text: str) -> ZkCredential:
        """``"user:password"`` (the password may contain ``:``)."""
        user, colon, password = text.partition(":")
        if not colon or not user.strip() or not password:
            raise ZkCredentialError("a ZooKeeper digest credential must be USER:PASSWORD")
        return cls(user.strip(), password)

    @property
    def digest(self) -> str:
        """``user:password``, as ZooKeeper's ``addauth digest`` and kazoo's auth_data take it."""
        return f"{self.username}:{self.password}"

    @property
    def auth_data(self) -> list[tuple[str, str]]:
        """kazoo's ``auth_data``: the session authenticates with this on every connect."""
        return [("digest", self.digest)]

    def acl(self) -> ACL:
        """ALL for this identity (``digest:user:base64(sha1(user:password))``)."""
        return make_digest_acl(self.username, self.password, all=True)


def is_sensitive(path: str) -> bool:
    """Does ``path`` (chroot-relative) hold secrets, so that world may not even read it?"""
    return any(path == root or path.startswith(root + "/") for root in zkdata.SENSITIVE_ROOT_PATHS)


def acls_for(path: str, credential: ZkCredential | None) -> list[ACL]:
    """The ACLs a znode at ``path`` gets: secure with a credential, world ALL without."""
    if credential is None:
        return list(OPEN_ACL_UNSAFE)
    acls = [credential.acl()]
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


# --- where the credential comes from ---------------------------------------------------


def read_jaas_credential(path: str | os.PathLike[str], section: str = JAAS_DEFAULT_SECTION) -> ZkCredential:
    """``username``/``password`` of one section of a JAAS login file::

    Client {
        org.apache.zookeeper.server.auth.DigestLoginModule required
        username="kafka"
        password="kafka-secret";
    };
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ZkCredentialError(f"cannot read the JAAS file {path}: {exc.strerror or exc}") from None
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", text, flags=re.DOTALL)
    found = re.search(rf"(?<![\w.]){re.escape(section)}\s*\{{(.*?)\}}\s*;", text, flags=re.DOTALL)
    if found is None:
        raise ZkCredentialError(f"the JAAS file {path} has no {section} section")
    options = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', found.group(1)))
    if not options.get("username") or not options.get("password"):
        raise ZkCredentialError(f"the {section} section of the JAAS file {path} needs username and password")
    return ZkCredential(options["username"], options["password"])


def _java_properties(opts: str) -> dict[str, str]:
    """``-Dkey=value`` words of a ``KAFKA_OPTS``-like string."""
    try:
        words = shlex.split(opts)
    except ValueError as exc:
        raise ZkCredentialError(f"cannot parse {KAFKA_OPTS_ENV}: {exc}") from None
    out: dict[str, str] = {}
    for word in words:
        if word.startswith("-D") and "=" in word:
            key, _, value = word[2:].partition("=")
            out[key] = value
    return out


def resolve_credential(digest: str | None = None, environ: Mapping[str, str] | None = None) -> ZkCredential | None:
    """The credential from ``digest``, else ``$KBROKER_ZK_DIGEST``, else a JAAS file named in
    ``$KAFKA_OPTS``; None when none is given. Raises ZkCredentialError when one is malformed."""
    env = os.environ if environ is None else environ
    if digest:
        return ZkCredential.parse(digest)
    if env.get(DIGEST_ENV):
        return ZkCredential.parse(env[DIGEST_ENV])
    props = _java_properties(env.get(KAFKA_OPTS_ENV, ""))
    if props.get(JAAS_PROPERTY):
        return read_jaas_credential(props[JAAS_PROPERTY], props.get(JAAS_SECTION_PROPERTY) or JAAS_DEFAULT_SECTION)
    return None


def no_auth_message(credential: ZkCredential | None) -> str:
    """One line for a write that ZooKeeper refused with NoAuth."""
    if credential is None:
        return f"ZooKeeper refused the write: no authentication for this secured znode (NoAuth); {NO_AUTH_HINT}"
    return (
        f"ZooKeeper refused the write: the credential of user {credential.username!r} may not change"
        " this znode (NoAuth); use the brokers' ZooKeeper credential"
    )


# --- migration ---------------------------------------------------------------------------


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
