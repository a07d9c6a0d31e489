"""Closing a producer whose broker is gone, and records larger than the broker takes.

``close()`` without a timeout waits for every batch's outcome, and a batch's outcome comes
within ``delivery_timeout_ms`` (a metadata refresh and a request in flight included), so
close returns then. ``close(timeout)`` returns within about its timeout and leaves no
thread behind. A record the broker cannot take fails with MessageSizeTooLargeError,
whatever limit (the producer's ``max_request_size``, gRPC's message size) is met first.
"""

from __future__ import annotations

import threading
import time

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic, Producer
from kclient.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError
from tests.support import wait_until

pytestmark = pytest.mark.integration


def sender_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "kclient-producer-sender" and t.is_alive()]


def producer_with_dead_broker(cluster: LocalCluster, stopped: bool = False, **config: int) -> tuple[Producer, list]:
    """A producer with 20 records sent after its broker was SIGKILLed (or SIGSTOPped: its
    connections then hang rather than being refused)."""
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("gone", 1, 1)])
    p = Producer(bootstrap_servers=cluster.bootstrap, **config)
    p.send("gone", b"first").get(10)
    if stopped:
        cluster.brokers[0].pause()
    else:
        cluster.brokers[0].kill()
    return p, [p.send("gone", b"after %d" % i) for i in range(20)]


def test_close_without_timeout_returns_once_delivery_timeout_passed(cluster: LocalCluster) -> None:
    before = len(sender_threads())
    p, futures = producer_with_dead_broker(cluster, delivery_timeout_ms=6000, request_timeout_ms=5000)
    started = time.monotonic()
    p.close()
    took = time.monotonic() - started
    # Was 29.75 s with delivery_timeout_ms=20000: a metadata refresh waited out the whole
    # request timeout, and a request in flight its own, past the batches' delivery time.
    assert took < 6 + 5, f"close() took {took:.1f} s with delivery_timeout_ms=6000"
    for f in futures:
        assert isinstance(f.exception(0), KafkaError)
        assert "delivery_timeout_ms" in str(f.exception(0)) or isinstance(f.exception(0), KafkaTimeoutError)
    assert len(sender_threads()) == before


@pytest.mark.parametrize("stopped", [False, True], ids=["killed", "stopped"])
def test_close_with_a_timeout_leaves_no_sender_thread_behind(cluster: LocalCluster, stopped: bool) -> None:
    before = len(sender_threads())
    p, futures = producer_with_dead_broker(cluster, stopped, delivery_timeout_ms=60000, request_timeout_ms=30000)
    started = time.monotonic()
    p.close(timeout=1)
    assert time.monotonic() - started < 1 + 5.5
    for f in futures:
        assert isinstance(f.exception(0), KafkaTimeoutError)
    # Was still alive 30 s later (blocked in a metadata refresh that retried for the
    # whole request timeout).
    wait_until(lambda: len(sender_threads()) == before, timeout_s=5, what="the sender thread to end")
    cluster.brokers[0].resume() if stopped else None


@pytest.mark.slow  # a 130 MiB record
def test_a_record_over_the_brokers_limit_fails_with_message_size_too_large(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(1, **{"socket.request.max.bytes": str(8 << 20), "message.max.bytes": str(64 << 20)})
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic("big", 1, 1)])
    with Producer(bootstrap_servers=cluster.bootstrap, max_request_size=256 << 20, buffer_memory=512 << 20) as p:
        over_grpc_default = p.send("big", b"x" * (130 << 20))  # beyond gRPC's 128 MiB default
        over_broker = p.send("big", b"y" * (10 << 20))  # beyond the broker's socket.request.max.bytes
        with pytest.raises(MessageSizeTooLargeError):
            over_grpc_default.get(60)
        with pytest.raises(MessageSizeTooLargeError):
            over_broker.get(60)
        assert p.send("big", b"small").get(10).offset == 0
