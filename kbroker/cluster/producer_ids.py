"""Producer ids for idempotent producers (Kafka's ZooKeeper-era ``ProducerIdManager``).

Every broker hands out producer ids from a block of ``BLOCK_SIZE`` (1000) ids that it
claims from the persistent znode ``/latest_producer_id_block``. The znode holds the
last block claimed by any broker (``{"version":1,"broker","block_start","block_end"}``);
claiming the next block is a compare-and-set on the znode version, retried when another
broker won the race, so two brokers never hand out the same id. The znode is created
(with the first block, 0..999) if it does not exist; an empty znode (created by an
operator or an older tool) counts as "no block claimed yet".

Ids of a block that a broker did not hand out before it stopped are never used: the
next claim always starts after the last block recorded in ZooKeeper. The epoch of a
new producer id is always 0 (epochs are bumped by the producer itself, KIP-360).

Errors: a ZooKeeper problem (connection loss, session expiry) becomes
:class:`CoordinatorNotAvailableError` (retriable: the producer asks again); a
malformed znode or an exhausted id space is a non-retriable :class:`KafkaError`.
Without a ZooKeeper connection (its quorum lost) a claim waits up to
:data:`CLAIM_WAIT_S` for it, then raises CoordinatorNotAvailableError having claimed
nothing (kazoo would queue the call for the whole outage, under the manager's lock,
which every InitProducerId of this broker then queues behind). Ids of the current block
are handed out as before.

Thread safety: ``generate`` may be called from any thread (one lock; a block claim
happens under it, once every 1000 ids).
"""

from __future__ import annotations

import logging
import threading

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import (
    LATEST_PRODUCER_ID_BLOCK,
    ProducerIdBlock,
    decode_producer_id_block,
    encode_producer_id_block,
)
from kclient.errors import CoordinatorNotAvailableError, KafkaError

log = logging.getLogger(__name__)

BLOCK_SIZE = 1000
"""Producer ids claimed at once (Kafka's ``ProducerIdsBlockSize``)."""
MAX_PRODUCER_ID = 2**63 - 1
MAX_CLAIM_ATTEMPTS = 100
"""Compare-and-set attempts before giving up (only lost races count)."""
CLAIM_WAIT_S = 1.0
"""How long a block claim waits for a lost ZooKeeper connection: a blip's length (it holds
the lock every producer id of this broker is handed out under)."""


class ProducerIdManager:
    """Hands out producer ids from blocks claimed in ZooKeeper."""

    def __init__(self, zk: ZkClient, broker_id: int, *, claim_wait_s: float = CLAIM_WAIT_S) -> None:
        self._zk = zk
        self._broker_id = broker_id
        self.claim_wait_s = claim_wait_s
        self._lock = threading.Lock()
        self._next_id = 0
        self._block_end = -1  # nothing claimed yet: the first generate() claims a block

    def generate(self) -> tuple[int, int]:
        """A new (producer id, epoch=0), never handed out before by any broker."""
        with self._lock:
            if self._next_id > self._block_end:
                block = self._claim_block()
                self._next_id, self._block_end = block.block_start, block.block_end
            pid = self._next_id
            self._next_id += 1
            return pid, 0

    def _claim_block(self) -> ProducerIdBlock:
        self._zk.require_connection(
            f"broker {self._broker_id} claiming a block of producer ids",
            CoordinatorNotAvailableError,
            self.claim_wait_s,
        )
        try:
            return self._claim_block_once()
        except (KazooException, KazooTimeoutError) as exc:
            raise CoordinatorNotAvailableError(
                f"broker {self._broker_id} could not claim a block of producer ids in ZooKeeper: "
                f"{type(exc).__name__} {exc}"
            ) from exc

    def _claim_block_once(self) -> ProducerIdBlock:
        kazoo = self._zk.kazoo
        for _ in range(MAX_CLAIM_ATTEMPTS):
            try:
                data, stat = kazoo.get(LATEST_PRODUCER_ID_BLOCK)
            except NoNodeError:
                block = ProducerIdBlock(self._broker_id, 0, BLOCK_SIZE - 1)
                try:
                    kazoo.create(LATEST_PRODUCER_ID_BLOCK, encode_producer_id_block(block), makepath=True)
                except NodeExistsError:
                    continue  # another broker created it first: read its block
                log.info("claimed producer id block %d..%d (first block)", block.block_start, block.block_end)
                return block
            start = self._next_block_start(data)
            if start > MAX_PRODUCER_ID - (BLOCK_SIZE - 1):
                raise KafkaError(f"producer ids are exhausted: the last block claimed ends at {start - 1}")
            block = ProducerIdBlock(self._broker_id, start, start + BLOCK_SIZE - 1)
            try:
                kazoo.set(LATEST_PRODUCER_ID_BLOCK, encode_producer_id_block(block), version=stat.version)
            except (BadVersionError, NoNodeError):
                continue  # another broker claimed a block meanwhile: read again
            log.info("claimed producer id block %d..%d", block.block_start, block.block_end)
            return block
        raise CoordinatorNotAvailableError(
            f"could not claim a block of producer ids after {MAX_CLAIM_ATTEMPTS} attempts (heavy contention)"
        )

    @staticmethod
    def _next_block_start(data: bytes) -> int:
        if not data:
            return 0
        try:
            last = decode_producer_id_block(data)
        except (ValueError, KeyError, TypeError) as exc:
            raise KafkaError(f"malformed {LATEST_PRODUCER_ID_BLOCK} znode {data[:200]!r}: {exc}") from exc
        if last.block_end < -1:
            raise KafkaError(f"malformed {LATEST_PRODUCER_ID_BLOCK} znode: block_end {last.block_end}")
        return last.block_end + 1
