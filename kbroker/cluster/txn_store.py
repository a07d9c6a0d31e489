"""Transaction state in ZooKeeper: one znode per transactional id,
``/transaction_state/<transactional id>`` (:mod:`kbroker.cluster.zkdata`).

Why ZooKeeper and not Kafka's ``__transaction_state`` topic: kbroker keeps every other
piece of coordinator state (group generations, committed offsets) in ZooKeeper, and a
transaction changes state a handful of times (Ongoing, PrepareCommit or PrepareAbort,
CompleteCommit or CompleteAbort: three writes for a transaction of any size), which
ZooKeeper takes in a few milliseconds. Every write is compare-and-set on the znode's
version, so two brokers that both think they coordinate an id cannot both move it: the
one that read an older version is refused (TRANSACTION_COORDINATOR_FENCED) and must load
again. A coordinator that is SIGKILLed loses nothing it acknowledged: its successor loads
the znode and finishes a transaction that reached PrepareCommit or PrepareAbort. The cost
is ZooKeeper's size limit: a transaction's partitions and pending offsets must fit one
znode (:data:`zkdata.MAX_REQUEST_BYTES`), refused with INVALID_REQUEST beyond.

ZooKeeper failures come out as :mod:`kbroker.cluster.zk_errors`' typed errors. Without a
ZooKeeper connection (its quorum lost) the store refuses rather than waits: a read waits
up to :data:`~kbroker.cluster.zk_client.CONNECTION_WAIT_S` for the connection, a write,
which follows a read of the same request under the transactional id's lock, up to
:data:`WRITE_WAIT_S`; then CoordinatorNotAvailableError (retriable: Kafka's clients find
the coordinator again and retry), nothing written. kazoo would otherwise queue the call
and pin the request thread, holding the id's lock, for the whole outage.

Thread safety: safe from any thread (kazoo is); callers serialise per transactional id.
"""

from __future__ import annotations

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import CONNECTION_WAIT_S, ZkClient
from kbroker.cluster.zk_errors import mapped
from kbroker.cluster.zkdata import TransactionMetadata
from kclient.errors import CoordinatorNotAvailableError, InvalidRequestError, TransactionCoordinatorFencedError

WRITE_WAIT_S = 1.0
"""How long a write waits for a lost ZooKeeper connection: a blip's length (the request's
read a moment before found it up, and the transactional id's lock is held)."""


class TransactionStore:
    """Loads and writes transaction state (see the module docstring)."""

    def __init__(
        self, zk: ZkClient, *, read_wait_s: float = CONNECTION_WAIT_S, write_wait_s: float = WRITE_WAIT_S
    ) -> None:
        self._zk = zk
        self.read_wait_s = read_wait_s
        self.write_wait_s = write_wait_s

    def _online(self, what: str, wait_s: float) -> None:
        """Return once ZooKeeper is connected; CoordinatorNotAvailableError after ``wait_s``."""
        if not self._zk.kazoo.connected:  # (connected: nothing to wait for)
            self._zk.require_connection(what, CoordinatorNotAvailableError, wait_s)

    def load(self, transactional_id: str) -> tuple[TransactionMetadata, int] | None:
        """The stored state and its znode version, or None."""
        path = zkdata.transaction_state_path(transactional_id)
        self._online(f"loading transaction {transactional_id!r}", self.read_wait_s)
        with mapped():
            try:
                data, stat = self._zk.kazoo.get(path)
            except NoNodeError:
                return None
        return zkdata.decode_transaction(transactional_id, data), stat.version

    def write(self, meta: TransactionMetadata, version: int | None) -> int:
        """Store ``meta`` over the znode at ``version`` (None: create it); the new version.
        Someone else wrote first: TransactionCoordinatorFencedError, nothing written."""
        path = zkdata.transaction_state_path(meta.transactional_id)
        data = zkdata.encode_transaction(meta)
        if zkdata.request_bytes(path, data) > zkdata.MAX_REQUEST_BYTES:
            raise InvalidRequestError(
                f"transaction {meta.transactional_id!r}: its partitions and offsets exceed "
                f"{zkdata.MAX_REQUEST_BYTES} bytes"
            )
        self._online(f"storing transaction {meta.transactional_id!r}", self.write_wait_s)
        with mapped():
            try:
                if version is None:
                    self._zk.kazoo.create(path, data, makepath=True)
                    return 0
                return int(self._zk.kazoo.set(path, data, version=version).version)
            except (BadVersionError, NodeExistsError, NoNodeError) as exc:
                raise TransactionCoordinatorFencedError(
                    f"transaction {meta.transactional_id!r} was changed by another coordinator: load it again"
                ) from exc

    def transactional_ids(self) -> list[str]:
        self._online("listing transactions", self.read_wait_s)
        with mapped():
            try:
                children = self._zk.kazoo.get_children(zkdata.TRANSACTION_STATE)
            except NoNodeError:
                return []
        return sorted(zkdata.decode_segment(c) for c in children)
