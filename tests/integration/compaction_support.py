"""Shared by the compaction reader tests: a compacted topic whose log has offset gaps."""

from __future__ import annotations

import time

from kclient import AdminClient, NewTopic, Producer

FAST_CLEANER = {"log.cleaner.backoff.ms": "100"}
"""Broker overrides: the cleaner looks for work every 100 ms."""

COMPACTED = {
    "cleanup.policy": "compact",
    "segment.bytes": "16384",
    "segment.ms": "500",
    "min.cleanable.dirty.ratio": "0.01",
    "file.delete.delay.ms": "0",
}


def compacted_topic_with_gaps(
    bootstrap: str, topic: str, *, partitions: int = 2, keys: int = 40, updates: int = 4000, timeout_s: float = 60
) -> dict[tuple[int, bytes], tuple[int, bytes]]:
    """Create ``topic`` compacted; on each partition write 10 keys once ("cold-N", offsets
    0-9), then ``updates`` values over ``keys`` keys; roll, and wait until the cleaner has
    removed older values on every partition, so the log keeps 0-9, a gap, and each hot
    key's last value. Returns (partition, key) -> (offset, latest value)."""
    with AdminClient(bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=COMPACTED)])
    latest: dict[tuple[int, bytes], tuple[int, bytes]] = {}
    with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5) as producer:
        for p in range(partitions):
            for start in range(0, updates, 100):  # batches well under segment.bytes
                ks = [
                    b"cold-%d" % i if i < 10 else b"key-%03d" % (i % keys)
                    for i in range(start, min(start + 100, updates))
                ]
                vs = [b"value-%d-%d" % (p, i) for i in range(start, min(start + 100, updates))]
                result = producer.send_batch(topic, vs, keys=ks, partition=p).get(30)
                for i, (k, v) in enumerate(zip(ks, vs, strict=True)):
                    latest[(p, k)] = (result[i].offset, v)
        time.sleep(0.6)  # past segment.ms: the next append rolls, so everything above is cleanable
        for p in range(partitions):
            producer.send(topic, b"end", key=b"sentinel", partition=p).get(10)
            latest[(p, b"sentinel")] = (updates, b"end")
    with AdminClient(bootstrap) as admin:
        deadline = time.monotonic() + timeout_s
        while True:
            states = [
                part.cleaner.last_cleaned_offset
                for resp in admin.describe_log_dirs(topics=[topic]).values()
                for d in resp.results
                for t in d.topics
                for part in t.partitions
            ]
            if len(states) == partitions and all(s > 0 for s in states):
                return latest
            assert time.monotonic() < deadline, f"{topic} not cleaned within {timeout_s}s: {states}"
            time.sleep(0.2)
