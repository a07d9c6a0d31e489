"""Replica placement for new topics and partitions, as Kafka's AdminUtils does it."""

from __future__ import annotations

import random
from collections.abc import Sequence

from kbroker.cluster.zkdata import Assignment
from kclient.errors import InvalidPartitionsError, InvalidReplicationFactorError


def _check(num_partitions: int, replication_factor: int, brokers: int) -> None:
    if num_partitions < 1:
        raise InvalidPartitionsError(f"number of partitions must be at least 1, got {num_partitions}")
    if replication_factor < 1:
        raise InvalidReplicationFactorError(f"replication factor must be at least 1, got {replication_factor}")
    if replication_factor > brokers:
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} is larger than the {brokers} live broker(s)"
        )


def assign_replicas(
    brokers: Sequence[int],
    num_partitions: int,
    replication_factor: int,
    *,
    first_partition: int = 0,
    start_index: int | None = None,
    shift: int | None = None,
    rng: random.Random | None = None,
) -> Assignment:
    """Round-robin placement with a shifting follower start (rack-unaware).

    The first replica of partition ``p`` is ``brokers[(p + start) % n]``; the j-th
    follower is ``brokers[(first + 1 + (shift + j) % (n - 1)) % n]``; ``shift`` grows by
    one every ``n`` partitions, so leaders and followers spread evenly.
    """
    if num_partitions < 1:
        raise InvalidPartitionsError(f"number of partitions must be at least 1, got {num_partitions}")
    if replication_factor < 1:
        raise InvalidReplicationFactorError(f"replication factor must be at least 1, got {replication_factor}")
    ids = sorted(brokers)
    n = len(ids)
    if replication_factor > n:
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} is larger than the {n} live broker(s)"
        )
    r = rng or random.Random()
    start = start_index if start_index is not None else r.randrange(n)
    next_shift = shift if shift is not None else r.randrange(n)
    out: Assignment = {}
    for p in range(first_partition, first_partition + num_partitions):
        if p > 0 and p % n == 0:
            next_shift += 1
        first = (p + start) % n
        replicas = [ids[first]]
        for j in range(replication_factor - 1):
            replicas.append(ids[(first + 1 + (next_shift + j) % (n - 1)) % n])
        out[p] = replicas
    return out


def rack_alternated(racks: dict[int, str]) -> list[int]:
    """Brokers interleaved by rack: r1's first, r2's first, ..., r1's second, ..."""
    by_rack: dict[str, list[int]] = {}
    for b in sorted(racks):
        by_rack.setdefault(racks[b], []).append(b)
    queues = [by_rack[r] for r in sorted(by_rack)]
    out: list[int] = []
    i = 0
    while len(out) < len(racks):
        for q in queues:
            if i < len(q):
                out.append(q[i])
        i += 1
    return out


def assign_replicas_rack_aware(
    racks: dict[int, str],
    num_partitions: int,
    replication_factor: int,
    *,
    first_partition: int = 0,
    start_index: int | None = None,
    shift: int | None = None,
    rng: random.Random | None = None,
) -> Assignment:
    """Kafka's rack-aware placement: each partition's replicas spread over as many racks
    as possible, leaders and followers still balanced across brokers."""
    n = len(racks)
    _check(num_partitions, replication_factor, n)
    arranged = rack_alternated(racks)
    num_racks = len(set(racks.values()))
    r = rng or random.Random()
    start = start_index if start_index is not None else r.randrange(n)
    next_shift = shift if shift is not None else r.randrange(n)
    out: Assignment = {}
    for p in range(first_partition, first_partition + num_partitions):
        if p > 0 and p % n == 0:
            next_shift += 1
        first = (p + start) % n
        leader = arranged[first]
        replicas = [leader]
        racks_used = {racks[leader]}
        brokers_used = {leader}
        k = 0
        for _ in range(replication_factor - 1):
            while True:
                broker = arranged[(first + 1 + (next_shift * num_racks + k) % (n - 1)) % n]
                k += 1
                rack = racks[broker]
                if (rack not in racks_used or len(racks_used) == num_racks) and (
                    broker not in brokers_used or len(brokers_used) == n
                ):
                    replicas.append(broker)
                    racks_used.add(rack)
                    brokers_used.add(broker)
                    break
        out[p] = replicas
    return out
