"""Users' SCRAM credentials in ZooKeeper, as Kafka stores them: the znodes.

``/config/users/<sanitized user>`` holds ``{"version":1,"config":{"SCRAM-SHA-256":
"salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=4096", ...}}`` (other user
configs, e.g. quotas, may sit beside them and are kept). Every write goes with a
``/config/changes/config_change_N`` notification ``{"version":2,"entity_path":"users/<u>"}``
in the same transaction (:meth:`ZkClient.set_entity_config`), which is how every broker
learns of it. Removing a user's last credential leaves ``{"config":{}}``, as Kafka does.

The SCRAM side (mechanisms, salting, the broker's cache, the admin RPCs) is
:class:`kbroker.security.credentials.CredentialStore`, which keeps a user's config as
plain ``{name: value}`` strings and goes through :class:`ZkCredentialStore` only.
"""

from __future__ import annotations

from collections.abc import Callable

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from kbroker.cluster import zkdata
from kbroker.cluster.config_changes import Watch, watch_config_changes
from kbroker.cluster.zk_client import ZkClient
from kclient.errors import KafkaError

MAX_CAS_ATTEMPTS = 10

USERS = "users"
"""The config entity type of ``/config/users``."""


class ZkCredentialStore:
    """Read, compare-and-set and follow the changes of ``/config/users/<user>``.

    Invariant: :meth:`update` applies a change to the config as read and writes the result
    only if the znode is unchanged since (else it re-reads and applies the change again),
    so concurrent writers (threads, brokers, kctl) lose no update. ZooKeeper failures come
    out as kazoo's exceptions (see :class:`~kbroker.cluster.acl_store.ZkAclStore`).

    Thread safety: stateless over a thread-safe ZkClient.
    """

    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk

    @staticmethod
    def check_user(user: str) -> None:
        """A KafkaError if ZooKeeper cannot hold ``user``'s znode (empty, too long)."""
        zkdata.user_config_path(user)

    def read(self, user: str) -> dict[str, str]:
        """``user``'s config ({} if none)."""
        return self.zk.entity_config(USERS, user)[0]

    def users(self) -> list[str]:
        """Every user with a config znode, sorted."""
        try:
            return sorted(zkdata.desanitize(c) for c in self.zk.kazoo.get_children(zkdata.CONFIG_USERS))
        except NoNodeError:
            return []

    def read_all(self) -> dict[str, dict[str, str]]:
        """Every user's config, read in one pipeline (a broker's cache at start)."""
        pending = [(u, self.zk.kazoo.get_async(zkdata.user_config_path(u))) for u in self.users()]
        out: dict[str, dict[str, str]] = {}
        for user, result in pending:
            try:
                data, _ = result.get()
            except NoNodeError:
                continue  # deleted meanwhile
            out[user] = zkdata.decode_entity_config(data)
        return out

    def update(self, user: str, change: Callable[[dict[str, str]], dict[str, str]]) -> None:
        """Write ``change(config)`` over ``user``'s config with compare-and-set (and its
        notification); exceptions of ``change`` propagate, nothing written. KafkaError after
        :data:`MAX_CAS_ATTEMPTS` lost races."""
        for _ in range(MAX_CAS_ATTEMPTS):
            config, version = self.zk.entity_config(USERS, user)
            try:
                self.zk.set_entity_config(USERS, user, change(config), version)
                return
            except (BadVersionError, NodeExistsError, NoNodeError):
                continue  # changed since read: re-read and apply again
        raise KafkaError(f"the credentials of user {user!r} kept changing; gave up after {MAX_CAS_ATTEMPTS} attempts")

    def notifications(self, watch: Watch) -> list[tuple[int, str]]:
        """(sequence number, child) of every config change notification, oldest first,
        arming ``watch`` (:func:`~kbroker.cluster.config_changes.watch_config_changes`)."""
        return watch_config_changes(self.zk, watch)

    def changed_user(self, child: str) -> str | None:
        """The user a notification names; None if it is gone or names another entity.
        InvalidRequestError if it is malformed."""
        found = self.zk.config_change(child)
        if found is None or found[0] != USERS:
            return None
        return found[1]
