"""``kctl users``: SCRAM credentials of users (kafka-configs.sh ``--entity-type users``).

::

    kctl users create alice --password-file pw.txt [--mechanism SCRAM-SHA-256] [--iterations 8192]
    kctl users delete alice [--mechanism SCRAM-SHA-512]
    kctl users list

``create`` sets (or replaces: a password change) the credentials of every ``--mechanism``
given (default: SCRAM-SHA-256 and SCRAM-SHA-512) in one write. Only the salted keys
are stored (``/config/users/<user>``), never the password, and a password is never
printed. ``delete`` without ``--mechanism`` removes every SCRAM credential of the user.
``list`` prints Kafka's line per user::

    SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-256=iterations=4096, SCRAM-SHA-512=iterations=4096

Writes print ``Completed updating config for user alice.``. Every check (name,
password, iterations) runs before anything is written.

Backends (:func:`open_backend`): ``--zookeeper`` writes the znodes
(:class:`ZooKeeperUserBackend`, with the ZooKeeper credential of the environment);
``--bootstrap-server`` (with ``--command-config`` for a secured listener) calls
AlterUserScramCredentials / DescribeUserScramCredentials (:class:`AdminUserBackend`):
the password is salted here and only the salted password is sent (KIP-554). Same
output both ways. ``kctl configs --entity-type users`` uses the same backends.
"""

from __future__ import annotations

import argparse
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import Any

from kbroker.cli.backends import connect_zookeeper, zookeeper_credential
from kbroker.cli.common import UsageError, check_bootstrap, check_zookeeper, client_configs
from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import ZkClient
from kbroker.security.credentials import CredentialStore
from kclient import AdminClient
from kclient.scram import ScramCredentialError, ScramMechanism, generate_credential

MECHANISMS = tuple(m.value for m in ScramMechanism)
DEFAULT_ITERATIONS = 4096


class UserBackend(ABC):
    """SCRAM credential operations over one connection; closed by ``close`` (or ``with``).

    Mechanisms are Kafka's names (``SCRAM-SHA-256``); arguments are already checked.
    """

    @abstractmethod
    def describe(self) -> dict[str, dict[str, int]]:
        """user -> {mechanism: iterations}, every user with a credential."""

    @abstractmethod
    def alter(self, user: str, upserts: dict[str, tuple[str, int]], deletes: list[str] | None) -> None:
        """In one change: set ``user``'s credential of each mechanism in ``upserts`` from
        (password, iterations), and remove those in ``deletes`` (None: all the user has).
        ResourceNotFoundError if a credential to remove is absent."""

    def upsert(self, user: str, upserts: dict[str, tuple[str, int]]) -> None:
        self.alter(user, upserts, [])

    def delete(self, user: str, mechanisms: list[str] | None) -> None:
        self.alter(user, {}, mechanisms)

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> UserBackend:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ZooKeeperUserBackend(UserBackend):
    """Writes ``/config/users/<user>`` (and its change notification) directly."""

    def __init__(self, connect: str) -> None:
        self._zk: ZkClient = connect_zookeeper(connect, credential=zookeeper_credential())
        self._store = CredentialStore(self._zk)

    def describe(self) -> dict[str, dict[str, int]]:
        return {
            user: {m.value: iterations for m, iterations in entries.items()}
            for user, entries in self._store.describe().items()
        }

    def alter(self, user: str, upserts: dict[str, tuple[str, int]], deletes: list[str] | None) -> None:
        credentials = {
            _mechanism(name): generate_credential(_mechanism(name), password, iterations)
            for name, (password, iterations) in upserts.items()
        }
        if deletes is None:
            self._store.alter(user, upsert=credentials, delete=list(ScramMechanism), missing_ok=True)
        else:
            self._store.alter(user, upsert=credentials, delete=[_mechanism(m) for m in deletes])

    def close(self) -> None:
        self._zk.close()


class AdminUserBackend(UserBackend):
    """DescribeUserScramCredentials / AlterUserScramCredentials of any broker."""

    def __init__(self, admin: AdminClient) -> None:
        self._admin = admin

    def describe(self) -> dict[str, dict[str, int]]:
        return dict(sorted(self._admin.describe_user_scram_credentials().items()))

    def alter(self, user: str, upserts: dict[str, tuple[str, int]], deletes: list[str] | None) -> None:
        if deletes is None:  # every credential the user has (ResourceNotFoundError: none)
            held = self._admin.describe_user_scram_credentials([user]).get(user, {})
            deletes = [m for m in MECHANISMS if m in held and m not in upserts]
        results = self._admin.alter_user_scram_credentials(
            [(user, m, password, iterations) for m, (password, iterations) in upserts.items()],
            [(user, m) for m in deletes],
        )
        error = results.get(user)
        if error is not None:
            raise error

    def close(self) -> None:
        self._admin.close()


def open_backend(args: argparse.Namespace) -> UserBackend:
    zookeeper, bootstrap = getattr(args, "zookeeper", None), getattr(args, "bootstrap_server", None)
    if (zookeeper is None) == (bootstrap is None):
        which = "both" if zookeeper is not None else "neither"
        raise UsageError(f"give exactly one of --zookeeper or --bootstrap-server ({which} given)")
    if bootstrap is not None:
        return AdminUserBackend(AdminClient(check_bootstrap(bootstrap), **client_configs(args)))
    assert zookeeper is not None
    return ZooKeeperUserBackend(check_zookeeper(zookeeper))


def _mechanism(name: str) -> ScramMechanism:
    found = ScramMechanism.from_name(name)
    if found is None:
        raise UsageError(f"--mechanism must be one of {', '.join(MECHANISMS)}, got {name!r}")
    return found


# --- argument checks (shared by every backend) ------------------------------------------


def check_user(name: str) -> str:
    if not name:
        raise UsageError("the user name is empty")
    if len(name) > zkdata.MAX_USER_NAME_LENGTH:
        raise UsageError(f"the user name is {len(name)} characters long; the limit is {zkdata.MAX_USER_NAME_LENGTH}")
    return name


def check_iterations(mechanisms: list[str], iterations: int) -> None:
    for name in mechanisms:
        try:
            _mechanism(name).check_iterations(iterations)
        except ScramCredentialError as exc:
            raise UsageError(f"--iterations: {exc}") from None


def read_password(args: argparse.Namespace) -> str:
    """``--password`` or the first line of ``--password-file`` (``-``: standard input)."""
    if args.password is not None:
        password = str(args.password)
    else:
        path = str(args.password_file)
        try:
            text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise UsageError(f"cannot read --password-file {path}: {reason}") from None
        password = text.split("\n", 1)[0].removesuffix("\r")
    if not password:
        raise UsageError("the password is empty")
    return password


def parse_scram_configs(adds: dict[str, str], deletes: list[str]) -> tuple[dict[str, tuple[str, int]], list[str]]:
    """kafka-configs ``--entity-type users`` arguments as (upserts, deletes) for :meth:`UserBackend.alter`.

    ``adds`` is ``--add-config`` parsed (``{"SCRAM-SHA-256": "iterations=8192,password=pw"}``,
    brackets already stripped); ``deletes`` the ``--delete-config`` names. UsageError for
    anything but a SCRAM mechanism (no user quotas here), a missing password, or bad iterations.
    """
    upserts: dict[str, tuple[str, int]] = {}
    for key, value in adds.items():
        _mechanism_config(key)
        fields: dict[str, str] = {}
        for item in value.split(","):
            name, eq, field_value = item.partition("=")
            if not eq or name.strip() not in ("iterations", "password"):
                # The item is not echoed: it may be a piece of a password.
                raise UsageError(f"{key} expects [iterations=N,password=P] (a password cannot hold ',')")
            fields[name.strip()] = field_value
        password = fields.get("password", "")
        if not password:
            raise UsageError(f"{key}: the password is empty")
        text = fields.get("iterations", str(DEFAULT_ITERATIONS)).strip()
        if not text.isascii() or not text.isdigit():
            raise UsageError(f"{key}: iterations must be a number, got {text!r}")
        check_iterations([key], int(text))
        upserts[key] = (password, int(text))
    for key in deletes:
        _mechanism_config(key)
    return upserts, list(dict.fromkeys(deletes))


def _mechanism_config(key: str) -> None:
    if ScramMechanism.from_name(key) is None:
        raise UsageError(f"only SCRAM credentials ({', '.join(MECHANISMS)}) can be set for users here, not {key!r}")


def format_user(user: str, mechanisms: dict[str, int]) -> str:
    """Kafka's ConfigCommand line for one user's SCRAM credentials (no secret in it)."""
    configs = ", ".join(f"{m}=iterations={i}" for m, i in sorted(mechanisms.items()))
    return f"SCRAM credential configs for user-principal '{user}' are {configs}"


# --- commands -------------------------------------------------------------------------


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    users = nouns.add_parser(
        "users",
        help="SCRAM credentials of users (kafka-configs.sh --entity-type users)",
        description="Create, delete and list users' SCRAM credentials. Passwords are never stored or printed.",
    )
    verbs = users.add_subparsers(dest="verb", metavar="VERB", required=True)

    create = verbs.add_parser(
        "create", parents=[connection], help="set a user's SCRAM credentials (also changes a password)"
    )
    create.add_argument("name", metavar="NAME", help="the user name (the principal is User:NAME)")
    create.add_argument(
        "--mechanism",
        action="append",
        choices=MECHANISMS,
        help="SCRAM mechanism (repeatable; default: both)",
    )
    secret = create.add_mutually_exclusive_group(required=True)
    secret.add_argument("--password", help="the password (visible to other local users in the process list)")
    secret.add_argument("--password-file", metavar="FILE", help="a file whose first line is the password ('-': stdin)")
    create.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help=f"PBKDF2 iterations, 4096..16384 (default {DEFAULT_ITERATIONS})",
    )
    create.set_defaults(handler=create_user)

    delete = verbs.add_parser("delete", parents=[connection], help="delete a user's SCRAM credentials")
    delete.add_argument("name", metavar="NAME")
    delete.add_argument(
        "--mechanism", action="append", choices=MECHANISMS, help="only this mechanism (repeatable; default: all)"
    )
    delete.set_defaults(handler=delete_user)

    lister = verbs.add_parser("list", parents=[connection], help="users with SCRAM credentials, and their iterations")
    lister.set_defaults(handler=list_users)


def _unique(mechanisms: list[str] | None) -> list[str] | None:
    return None if not mechanisms else list(dict.fromkeys(mechanisms))


def create_user(args: argparse.Namespace) -> int:
    user = check_user(args.name)
    mechanisms = _unique(args.mechanism) or list(MECHANISMS)
    check_iterations(mechanisms, args.iterations)
    password = read_password(args)
    with open_backend(args) as backend:
        backend.upsert(user, {m: (password, args.iterations) for m in mechanisms})
    print(f"Completed updating config for user {user}.")
    return 0


def delete_user(args: argparse.Namespace) -> int:
    user = check_user(args.name)
    with open_backend(args) as backend:
        backend.delete(user, _unique(args.mechanism))
    print(f"Completed updating config for user {user}.")
    return 0


def list_users(args: argparse.Namespace) -> int:
    with open_backend(args) as backend:
        found = backend.describe()
    for user, mechanisms in found.items():
        print(format_user(user, mechanisms))
    return 0
