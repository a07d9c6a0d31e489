"""acks=all with min.insync.replicas=2 is never acknowledged while the in-sync follower
is stopped, and is once it runs again.

A follower is "stopped" here only once every one of its threads is: SIGSTOP is
asynchronous. ``kill()`` returns as soon as the signal is queued; the kernel stops the
process's threads one by one as each is next scheduled (the first thread to take the
signal starts the group stop and wakes the others). Until then the follower runs on.
Measured on an idle 2-core machine, no thread was stopped yet when ``kill()`` returned
and the last stopped 1.5-6 ms later; a loaded machine makes that longer. That is enough
for the follower to take a write sent just after the signal: the leader answers the
follower's parked fetch with it, the follower appends it and fetches from past it, and
the leader acknowledges it, correctly, since the follower has it. (Beside an
integration run, 7 of 80 such writes were acknowledged, 0 of 80 once the stop was waited for;
in one, the follower appended the write 1.8 ms after ``kill()`` returned, the leader
acknowledged it 0.7 ms later, and the follower's threads were all stopped 3.8 ms after
``kill()``.) So a test that means "the follower cannot have this write" must wait for
the stop first, as :meth:`BrokerProcess.pause` does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic
from kclient.proto.kbroker.v1 import broker_pb2_grpc, common_pb2, config_pb2, log_pb2
from kclient.records import BatchBuilder
from tests.support import wait_until

pytestmark = pytest.mark.integration

ROUNDS = 6

REFUSALS = (
    common_pb2.REQUEST_TIMED_OUT,
    common_pb2.NOT_ENOUGH_REPLICAS,
    common_pb2.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
)
"""What an acks=all write may get while the follower is stopped: it times out waiting for
the follower, or (the ISR shrank, e.g. the follower's ZooKeeper session expired) is refused."""


def produce(topic: str, acks: int = -1, timeout_ms: int = 10000) -> log_pb2.ProduceRequest:
    b = BatchBuilder()
    b.append(int(time.time() * 1000), None, b"v" * 100)
    req = log_pb2.ProduceRequest(acks=acks, timeout_ms=timeout_ms)
    req.topics.add(name=topic).partitions.add(index=0, records=b.build())
    return req


def isr_of(admin: AdminClient, topic: str) -> list[int]:
    return sorted(admin.describe_topics([topic])[0].partitions[0].isr)


def test_acks_all_is_never_acknowledged_while_the_in_sync_follower_is_stopped(
    cluster_factory: Callable[..., LocalCluster],
) -> None:
    cluster = cluster_factory(2, **{"min.insync.replicas": "2", "replica.lag.time.max.ms": "30000"})
    leader, follower = cluster.brokers[0], cluster.brokers[1]
    stub = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(leader.address))
    with AdminClient(leader.address) as admin:
        # min.insync.replicas reached the broker (given as an -o override) and the topic.
        broker = admin.describe_configs([(config_pb2.BROKER, "0")])[(config_pb2.BROKER, "0")]
        assert broker["min.insync.replicas"].value == "2"
        admin.create_topics([NewTopic("t", replica_assignments={0: [0, 1]})])
        topic = admin.describe_configs([(config_pb2.TOPIC, "t")])[(config_pb2.TOPIC, "t")]
        assert topic["min.insync.replicas"].value == "2"
        wait_until(lambda: isr_of(admin, "t") == [0, 1], 30, "both replicas in sync")
        wait_until(
            lambda: stub.Produce(produce("t"), timeout=20).topics[0].partitions[0].error_code == 0,
            30,
            "a first acks=all write",
        )
        for i in range(ROUNDS):
            stopping = follower.pause()
            try:
                sent = time.monotonic()
                answer = stub.Produce(produce("t", timeout_ms=1000), timeout=20).topics[0].partitions[0]
                took = time.monotonic() - sent
                isr = isr_of(admin, "t")
            finally:
                follower.resume()
            assert answer.error_code in REFUSALS, (
                f"round {i}: acks=all answered {answer} after {took:.3f} s while the follower was stopped "
                f"(all its threads stopped {stopping * 1000:.1f} ms after SIGSTOP, before the write was sent); "
                f"ISR {isr}"
            )
            # Running again, the follower takes the write and the next one is acknowledged.
            wait_until(
                lambda: stub.Produce(produce("t"), timeout=20).topics[0].partitions[0].error_code == 0,
                30,
                f"round {i}: an acks=all write once the follower runs again",
            )
            time.sleep(0.5)  # a running spell between stops (the follower's ZooKeeper pings)
