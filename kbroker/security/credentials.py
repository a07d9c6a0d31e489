"""Users' SCRAM credentials, and the broker's cache of them.

They are stored in ZooKeeper as Kafka stores them (``/config/users/<user>``, one
``config_change_`` notification per write): :class:`kbroker.cluster.credential_store.ZkCredentialStore`
reads and writes those znodes; this module holds the SCRAM side (mechanisms, salted
credentials, what may be stored) and the cache, and Kafka's admin RPCs over them.

Without a ZooKeeper connection (its quorum lost), the admin side (:meth:`CredentialStore.alter`
and the writes over it, :meth:`CredentialStore.describe`) waits up to ``zookeeper_wait_s``
(5 s) for it once its arguments are checked, then raises RequestTimedOutError having
changed nothing: kazoo would otherwise queue the call for the whole outage, and the write
would land long after its client gave up. The lookups of SASL authentication
(:meth:`CredentialStore.lookup`) are served from the broker's cache, which holds every
user from the start, as Kafka's credential cache does: logins go on through the outage.
A user the cache does not hold (created during the outage, or changed just before it) is
looked up in ZooKeeper, waiting at most :data:`LOGIN_WAIT_S`, then unknown.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kbroker.cluster.credential_store import ZkCredentialStore
from kbroker.cluster.zk_client import CONNECTION_WAIT_S, ZkClient
from kbroker.cluster.zk_events import ZkEventThread
from kclient.errors import (
    BrokerResponseError,
    DuplicateResourceError,
    KafkaError,
    RequestTimedOutError,
    ResourceNotFoundError,
    UnacceptableCredentialError,
    UnsupportedSaslMechanismError,
)
from kclient.scram import (
    ScramCredential,
    ScramCredentialError,
    ScramError,
    ScramMechanism,
    credential_from_salted_password,
    generate_credential,
)

log = logging.getLogger(__name__)

LOGIN_WAIT_S = 1.0
"""How long a SASL lookup of a user the cache does not hold waits for a lost ZooKeeper
connection (it holds a request thread and a client's handshake) before the user is
unknown."""


def mechanism_of(mechanism: ScramMechanism | str) -> ScramMechanism:
    """A mechanism or its name; UnsupportedSaslMechanismError for any other name (as Kafka's
    AlterUserScramCredentials answers)."""
    if isinstance(mechanism, ScramMechanism):
        return mechanism
    found = ScramMechanism.from_name(mechanism)
    if found is None:
        names = ", ".join(m.value for m in ScramMechanism)
        raise UnsupportedSaslMechanismError(f"Unknown SCRAM mechanism {mechanism!r}; expected one of {names}")
    return found


def new_credential(mechanism: ScramMechanism | str, password: str, iterations: int = 4096) -> ScramCredential:
    """A fresh salted credential; UnacceptableCredentialError for a bad password or iterations."""
    try:
        return generate_credential(mechanism_of(mechanism), password, iterations)
    except ScramCredentialError as exc:
        raise UnacceptableCredentialError(str(exc)) from None


def scram_entries(config: dict[str, str]) -> dict[ScramMechanism, ScramCredential]:
    """The SCRAM credentials in one user's config (a malformed one is logged and skipped)."""
    out: dict[ScramMechanism, ScramCredential] = {}
    for key, value in config.items():
        mechanism = ScramMechanism.from_name(key)
        if mechanism is None:
            continue
        try:
            out[mechanism] = ScramCredential.parse(value)
        except ScramError as exc:
            log.error("SCRAM credential %s ignored: %s", key, exc)
    return out


class CredentialStore:
    """Reads and writes users' SCRAM credentials; optionally caches them for a broker.

    Writes (:meth:`set_password`, :meth:`set_credential`, :meth:`delete`) are
    compare-and-set on the user's znode (:meth:`ZkCredentialStore.update`), re-read and
    retried on a concurrent change, so one user's mechanisms can be changed by several
    tools at once without a lost update.

    The cache (:meth:`lookup`): after :meth:`start`, a daemon thread ``scram-credentials``
    loads every user (one pipelined read), then watches ``/config/changes``; each new
    ``users/<u>`` notification drops ``u`` from the cache and then calls
    ``on_user_changed(u)`` (for the broker: revoke ``u``'s sessions). A user not cached is
    read from ZooKeeper on demand and cached. After a ZooKeeper reconnection every user is
    loaded again (a notification may have been missed). Without ZooKeeper, cached users
    are served as they are, and a lookup of another waits :data:`LOGIN_WAIT_S` for the
    connection, then finds nobody. Without :meth:`start` nothing is cached: every lookup
    reads ZooKeeper (tools).

    Admin calls (:meth:`describe`, :meth:`alter` and the writes over it) are refused with
    RequestTimedOutError after ``zookeeper_wait_s`` without a ZooKeeper connection (see
    the module docstring); :meth:`credentials` and :meth:`lookup` do not wait this way.

    Thread safety: every method may be called from any thread. A read that raced with an
    invalidation is not cached (an invalidation counter guards the store), so the cache
    never keeps a credential older than the last notification seen.
    ``on_user_changed`` runs on the watcher thread, one call at a time.
    """

    def __init__(
        self,
        zk: ZkClient,
        *,
        on_user_changed: Callable[[str], object] | None = None,
        zookeeper_wait_s: float = CONNECTION_WAIT_S,
    ) -> None:
        self._zk = zk
        self.zookeeper_wait_s = zookeeper_wait_s
        self._store = ZkCredentialStore(zk)
        self._on_user_changed = on_user_changed
        self._lock = threading.Lock()
        self._cache: dict[str, dict[ScramMechanism, ScramCredential]] = {}
        self._invalidations = 0
        self._caching = False
        self._last_seq = -1
        self._primed = False
        self._events = ZkEventThread(zk, "scram-credentials", self._handle)

    # --- reads -----------------------------------------------------------------------

    def credentials(self, user: str) -> dict[ScramMechanism, ScramCredential]:
        """Every SCRAM credential of ``user`` (cached once :meth:`start` ran)."""
        with self._lock:
            cached = self._cache.get(user)
            if cached is not None:
                return cached
            caching, before = self._caching, self._invalidations
        if caching and not self._zk.await_connection(LOGIN_WAIT_S):
            log.warning("SCRAM user %r is not cached and ZooKeeper is not connected: unknown for now", user)
            return {}
        found = scram_entries(self._store.read(user))
        if caching:
            with self._lock:
                if self._invalidations == before:
                    self._cache[user] = found
        return found

    def lookup(self, user: str, mechanism: ScramMechanism | str) -> ScramCredential | None:
        """``user``'s credential for ``mechanism``, or None (unknown user or mechanism).

        A name ZooKeeper cannot hold (empty, too long) is simply unknown.
        """
        found = ScramMechanism.from_name(mechanism) if isinstance(mechanism, str) else mechanism
        if found is None:
            return None
        try:
            return self.credentials(user).get(found)
        except KafkaError:
            return None

    def describe(self, users: Iterable[str] | None = None) -> dict[str, dict[ScramMechanism, int]]:
        """user -> {mechanism: iterations}, from ZooKeeper (not the cache).

        ``users=None``: every user with at least one SCRAM credential, sorted by name.
        Named users without a credential are absent from the answer. A name ZooKeeper
        cannot hold is refused at once (InvalidRequestError); RequestTimedOutError without
        a ZooKeeper connection.
        """
        named = None if users is None else list(users)
        for name in named or ():
            ZkCredentialStore.check_user(name)
        self._wait_for_zookeeper("describing SCRAM credentials", self.zookeeper_wait_s)
        names = self._store.users() if named is None else named
        out: dict[str, dict[ScramMechanism, int]] = {}
        for name in names:
            entries = scram_entries(self._store.read(name))
            if entries:
                out[name] = {m: c.iterations for m, c in sorted(entries.items(), key=lambda kv: kv[0].value)}
        return out

    # --- writes ----------------------------------------------------------------------

    def set_password(
        self, user: str, mechanism: ScramMechanism | str, password: str, iterations: int = 4096
    ) -> ScramCredential:
        """Create or replace ``user``'s credential for ``mechanism`` from ``password`` (only
        the salted keys are stored). UnacceptableCredentialError for a bad user, password,
        mechanism or iteration count."""
        credential = new_credential(mechanism, password, iterations)
        self.alter(user, upsert={mechanism_of(mechanism): credential})
        return credential

    def set_credential(self, user: str, mechanism: ScramMechanism | str, credential: ScramCredential) -> None:
        """Store a ready credential (AlterUserScramCredentials sends a salted password:
        see :func:`kclient.scram.credential_from_salted_password`)."""
        self.alter(user, upsert={mechanism_of(mechanism): credential})

    def delete(self, user: str, mechanism: ScramMechanism | str | None = None) -> list[ScramMechanism]:
        """Remove ``user``'s credential for ``mechanism`` (None: every SCRAM mechanism he has);
        the mechanisms removed. ResourceNotFoundError if there was none to remove."""
        if mechanism is not None:
            self.alter(user, delete=[mechanism_of(mechanism)])
            return [mechanism_of(mechanism)]
        return self.alter(user, delete=list(ScramMechanism), missing_ok=True)

    def alter(
        self,
        user: str,
        *,
        upsert: dict[ScramMechanism, ScramCredential] | None = None,
        delete: Iterable[ScramMechanism] = (),
        missing_ok: bool = False,
        wait_s: float | None = None,
    ) -> list[ScramMechanism]:
        """Set and remove several of ``user``'s credentials in one write (one notification);
        the mechanisms removed. Nothing is written if a check fails: UnacceptableCredentialError
        (bad user or iterations), ResourceNotFoundError (a credential to delete is absent:
        with ``missing_ok`` only if none of them is there), RequestTimedOutError (no
        ZooKeeper connection within ``wait_s``, by default ``zookeeper_wait_s``)."""
        upsert = dict(upsert or {})
        wanted = list(delete)
        self._check_user(user)
        for m, credential in upsert.items():
            try:
                m.check_iterations(credential.iterations)
            except ScramCredentialError as exc:
                raise UnacceptableCredentialError(str(exc)) from None
        self._wait_for_zookeeper("altering SCRAM credentials", self.zookeeper_wait_s if wait_s is None else wait_s)
        removed: list[ScramMechanism] = []

        def change(config: dict[str, str]) -> dict[str, str]:
            removed[:] = [m for m in wanted if m.value in config]
            absent = [m.value for m in wanted if m.value not in config]
            if wanted and (not removed if missing_ok else absent):
                what = " or ".join(absent)
                raise ResourceNotFoundError(
                    f"Attempt to delete a user credential that does not exist: {what} of user {user!r}"
                )
            out = {k: v for k, v in config.items() if ScramMechanism.from_name(k) not in removed}
            out.update({m.value: str(c) for m, c in upsert.items()})
            return out

        self._store.update(user, change)
        return removed

    def _wait_for_zookeeper(self, what: str, wait_s: float) -> None:
        self._zk.require_connection(what, RequestTimedOutError, wait_s)

    @staticmethod
    def _check_user(user: str) -> None:
        try:
            ZkCredentialStore.check_user(user)
        except KafkaError as exc:
            raise UnacceptableCredentialError(exc.message) from None

    # --- the broker's cache ----------------------------------------------------------

    def start(self) -> None:
        """Cache from now on, kept fresh by the ``/config/changes`` notifications."""
        with self._lock:
            self._caching = True
        self._events.start()

    def stop(self) -> None:
        """Stop watching; lookups read ZooKeeper again (nothing cached)."""
        with self._lock:
            self._caching = False
        self.invalidate()
        self._events.stop()

    def sync(self, timeout_s: float = 10.0) -> None:
        """Wait until every event enqueued so far has been handled (tests)."""
        self._events.sync(timeout_s)

    def invalidate(self, user: str | None = None) -> None:
        """Drop ``user`` (None: everyone) from the cache."""
        with self._lock:
            self._invalidations += 1
            if user is None:
                self._cache.clear()
            else:
                self._cache.pop(user, None)

    # the watcher thread

    def _handle(self, kind: str) -> None:
        self._process_changes()
        if kind == "reconnected":  # a notification may have been missed: load everyone again
            self._load_all()

    def _load_all(self) -> None:
        """Replace the cache by every user's credentials as ZooKeeper has them now. The
        old cache stays until the read is complete: a connection lost again mid-read leaves
        the users cached before it, and the next reconnection loads again."""
        with self._lock:
            before = self._invalidations
        loaded = {user: scram_entries(config) for user, config in self._store.read_all().items()}
        with self._lock:
            if self._invalidations == before and self._caching:
                self._invalidations += 1  # a read-through still in flight is not cached
                self._cache = loaded
        log.info("SCRAM credentials of %d user(s) cached", len(loaded))

    def _process_changes(self) -> None:
        seqs = self._store.notifications(self._events.watch)
        if not self._primed:
            # First look: older notifications are history. Every user is loaded after the
            # newest of them was seen: a later change has a later notification.
            self._primed = True
            self._last_seq = seqs[-1][0] if seqs else -1
            self._load_all()
            return
        for seq, child in seqs:
            if seq <= self._last_seq:
                continue
            self._last_seq = seq
            try:
                user = self._store.changed_user(child)
            except KafkaError as exc:
                log.warning("config change %s ignored: %s", child, exc)
                continue
            if user is None:
                continue
            self.invalidate(user)
            log.info("SCRAM credentials of user %r changed", user)
            if self._on_user_changed is not None:
                try:
                    self._on_user_changed(user)
                except Exception:
                    log.exception("on_user_changed(%r) failed", user)


# --- Kafka's admin RPCs (DescribeUserScramCredentials 50, AlterUserScramCredentials 51) ---


@dataclass(frozen=True)
class ScramUpsertion:
    """One upsertion of AlterUserScramCredentials: the client salted the password itself."""

    user: str
    mechanism: str
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True)
class ScramDeletion:
    user: str
    mechanism: str


def alter_user_scram_credentials(
    store: CredentialStore, deletions: Iterable[ScramDeletion], upsertions: Iterable[ScramUpsertion]
) -> dict[str, BrokerResponseError | None]:
    """Kafka's AlterUserScramCredentials: user -> None (done) or the error of that user, in
    the order users first appear. Each user's changes are checked, then written at once
    (all or nothing per user): UNACCEPTABLE_CREDENTIAL (empty user, iterations out of
    bounds, empty salt or salted password), UNSUPPORTED_SASL_MECHANISM, DUPLICATE_RESOURCE
    (a user and mechanism twice in the request), RESOURCE_NOT_FOUND (deleting what is absent),
    REQUEST_TIMED_OUT (no ZooKeeper connection: the first user to be written waits for it,
    the others are refused at once while it is still down).
    """
    dels, ups = list(deletions), list(upsertions)
    results: dict[str, BrokerResponseError | None] = {}
    for user in [d.user for d in dels] + [u.user for u in ups]:
        results.setdefault(user, None)
    pairs = [(d.user, d.mechanism) for d in dels] + [(u.user, u.mechanism) for u in ups]
    duplicated = {user for user, name in pairs if pairs.count((user, name)) > 1}
    offline: RequestTimedOutError | None = None
    for user in results:
        try:
            if not user:
                raise UnacceptableCredentialError("Username must not be empty")
            if user in duplicated:
                raise DuplicateResourceError("A user credential cannot be altered twice in the same request")
            upsert: dict[ScramMechanism, ScramCredential] = {}
            for up in (up for up in ups if up.user == user):
                scram = mechanism_of(up.mechanism)
                if not up.salted_password:
                    raise UnacceptableCredentialError("the salted password is empty")
                try:
                    upsert[scram] = credential_from_salted_password(scram, up.salt, up.salted_password, up.iterations)
                except ScramCredentialError as exc:
                    raise UnacceptableCredentialError(str(exc)) from None
            delete = [mechanism_of(d.mechanism) for d in dels if d.user == user]
            store.alter(user, upsert=upsert, delete=delete, wait_s=None if offline is None else 0.0)
        except RequestTimedOutError as exc:
            offline = offline or exc
            results[user] = offline
        except BrokerResponseError as exc:
            results[user] = exc
    return results


def describe_user_scram_credentials(
    store: CredentialStore, users: Iterable[str] = ()
) -> list[tuple[str, BrokerResponseError | None, dict[ScramMechanism, int]]]:
    """Kafka's DescribeUserScramCredentials: (user, error or None, {mechanism: iterations}).

    No users named: every user with a credential. A named user without one gets
    RESOURCE_NOT_FOUND, one named twice DUPLICATE_RESOURCE, a name ZooKeeper cannot hold
    INVALID_REQUEST; the others are read at once, and without a ZooKeeper connection the
    request is refused whole (RequestTimedOutError raised).
    """
    named = list(users)
    if not named:
        return [(user, None, found) for user, found in store.describe().items()]
    refused: dict[str, BrokerResponseError] = {}
    for user in dict.fromkeys(named):
        if named.count(user) > 1:
            refused[user] = DuplicateResourceError(
                f"Cannot describe SCRAM credentials for the same user twice in a single request: {user}"
            )
            continue
        try:
            ZkCredentialStore.check_user(user)
        except BrokerResponseError as exc:  # a name ZooKeeper cannot hold
            refused[user] = exc
    wanted = [user for user in dict.fromkeys(named) if user not in refused]
    described = store.describe(wanted) if wanted else {}
    out: list[tuple[str, BrokerResponseError | None, dict[ScramMechanism, int]]] = []
    for user in dict.fromkeys(named):
        found = described.get(user, {})
        if user in refused:
            out.append((user, refused[user], {}))
        elif found:
            out.append((user, None, found))
        else:
            missing = ResourceNotFoundError(f"Attempt to describe a user credential that does not exist: {user}")
            out.append((user, missing, {}))
    return out
