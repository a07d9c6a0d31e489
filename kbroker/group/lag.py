"""Log end offsets of any partition, asked of its leader, for the consumer-group lag
metric (``kafka_consumergroup_lag``): a coordinator reports every partition its groups
committed, wherever the partition's leader is, as kafka-exporter does (ListOffsets
"latest" to each leader: the high watermark a consumer can read up to).

One ListOffsets call per leader per scrape, with a short deadline; a leader that does
not answer leaves its partitions out of that scrape (no series rather than a wrong one).

Thread safety: the channel cache has a lock; calls run on the scraping thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

import grpc

from kbroker.cluster.metadata_cache import MetadataCache
from kbroker.replication.broker_stubs import BrokerStubs
from kclient.proto.kbroker.v1 import log_pb2

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
TIMEOUT_S = 2.0
"""How long one leader may take to answer a scrape's ListOffsets."""


class LeaderEndOffsets:
    def __init__(self, metadata: MetadataCache, channel: Callable[[str], grpc.Channel] | None = None) -> None:
        self._metadata = metadata
        self._stubs = BrokerStubs(channel)

    def __call__(self, partitions: Collection[TopicPartition]) -> dict[TopicPartition, int]:
        """High watermark of each partition whose leader answered."""
        snap = self._metadata.snapshot()
        by_leader: dict[int, dict[str, list[int]]] = {}
        for topic, p in partitions:
            info = snap.topics.get(topic)
            state = info.states.get(p) if info is not None else None
            if state is None or state.leader < 0:
                continue
            by_leader.setdefault(state.leader, {}).setdefault(topic, []).append(p)
        out: dict[TopicPartition, int] = {}
        for leader, topics in by_leader.items():
            broker = snap.brokers.get(leader)
            if broker is None:
                continue
            request = log_pb2.ListOffsetsRequest(
                topics=[
                    log_pb2.ListOffsetsTopic(
                        name=t, partitions=[log_pb2.ListOffsetsPartition(index=p, timestamp=-1) for p in ps]
                    )
                    for t, ps in topics.items()
                ]
            )
            try:
                resp = self._stubs.stub(broker.address).ListOffsets(request, timeout=TIMEOUT_S)
            except grpc.RpcError as exc:
                log.debug("lag: broker %d did not answer ListOffsets: %s", leader, exc)
                self._stubs.forget(broker.address)
                continue
            for t in resp.topics:
                for r in t.partitions:
                    if r.error_code == 0 and r.offset >= 0:
                        out[(t.name, r.index)] = r.offset
        return out

    def close(self) -> None:
        self._stubs.close()
