"""The ZooKeeper credential: the digest identity with which brokers and tools authenticate
to ZooKeeper, and where it comes from.

ZooKeeper's built-in ``digest`` scheme (no server setting needed): a session
authenticates with ``user:password`` and an ACL names the id
``digest:user:base64(sha1(user:password))`` (:mod:`kbroker.cluster.zk_acl`, which also
sets those ACLs). The credential is found, in order, in:

- an explicit ``user:password`` (the broker's ``zookeeper.auth.digest``);
- ``$KBROKER_ZK_DIGEST`` (``user:password``);
- a JAAS file named by ``-Djava.security.auth.login.config=FILE`` in ``$KAFKA_OPTS``, as
  Kafka's brokers and tools read it: the ``Client`` section (or the one named by
  ``-Dzookeeper.sasl.clientconfig=``) with ``username="..."`` and ``password="..."``
  (the DigestLoginModule section of Kafka's docs). Its user and password are used with
  the digest scheme, not SASL.

Thread safety: immutable values and pure functions (they read the environment and files).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

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
        """``user:password``, as ZooKeeper's ``addauth digest`` takes it."""
        return f"{self.username}:{self.password}"

    @property
    def auth_data(self) -> list[tuple[str, str]]:
        """A ZooKeeper client's ``auth_data``: the session authenticates with this on every connect."""
        return [("digest", self.digest)]


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
