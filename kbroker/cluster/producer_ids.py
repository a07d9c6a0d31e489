"""Producer ids for idempotent producers (placeholder; being written)."""

from __future__ import annotations

from kbroker.cluster.zk_client import ZkClient


class ProducerIdManager:
    def __init__(self, zk: ZkClient, broker_id: int) -> None:
        self._zk = zk
        self._broker_id = broker_id

    def generate(self) -> tuple[int, int]:
        raise NotImplementedError
