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

ZooKeeper failures come out as :mod:`kbroker.cluster.zk_errors`' typed errors.

Thread safety: safe from any thread (kazoo is); callers serialise per transactional id.
"""

from __future__ import annotations

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zk_errors import mapped
from kbroker.cluster.zkdata import TransactionMetadata
from kclient.errors import InvalidRequestError, TransactionCoordinatorFencedError


class TransactionStore:
    """Loads and writes transaction state (see the module docstring)."""

    def __init__(self, zk: ZkClient) -> None:
        self._zk = zk

    def load(self, transactional_id: str) -> tuple[TransactionMetadata, int] | None:
        """The stored state and its znode version, or None."""
        path = zkdata.transaction_state_path(transactional_id)
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
        with mapped():
            try:
                children = self._zk.kazoo.get_children(zkdata.TRANSACTION_STATE)
            except NoNodeError:
                return []
        return sorted(zkdata.decode_segment(c) for c in children)
