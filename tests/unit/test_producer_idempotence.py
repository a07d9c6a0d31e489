"""The idempotent producer when answers are lost, refused or arrive out of order.

The producer's role objects run against the in-process fake leader, which checks batches
with the broker's own ProducerStateManager (5 batches remembered per producer). Every
test ends by checking the leader's log: each record at most once, in send order, and
every acknowledged record at its acknowledged offset.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kclient import Producer
from kclient.errors import KafkaError, OutOfOrderSequenceNumberError
from kclient.producer.futures import FutureRecordMetadata
from tests.unit.test_producer_fakes import (
    NOT_LEADER_OR_FOLLOWER,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    REQUEST_TIMED_OUT,
    FakeCall,
    FakeLeader,
    install_fake_leader,
)


def wait_until(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.002)


def values(n: int) -> list[bytes]:
    return [f"{i:06d}".encode() for i in range(n)]


def check_log(leader: FakeLeader, sent: Sequence[bytes], futures: Sequence[FutureRecordMetadata]) -> int:
    """No duplicate, no reorder, every acknowledged record where its answer said; returns
    how many were acknowledged."""
    log = leader.logs.get(("t", 0), [])
    assert len(set(log)) == len(log), f"{len(log) - len(set(log))} records written twice"
    assert log == sorted(log), "records written out of order"
    acked = 0
    for v, f in zip(sent, futures, strict=True):
        try:
            offset = f.get(0).offset
        except KafkaError:
            continue
        acked += 1
        assert log[offset] == v
    return acked


def send_all(p: Producer, leader: FakeLeader, sent: Sequence[bytes]) -> list[FutureRecordMetadata]:
    """Send ``sent`` to t-0; the first record is acknowledged alone first (until a leader
    acknowledged a batch of the stream, one batch is in flight at a time)."""
    futures = [p.send("t", sent[0], partition=0)]
    wait_until(lambda: len(leader.held) == 1)
    leader.take(0).complete()
    futures[0].get(5)
    return futures + [p.send("t", v, partition=0) for v in sent[1:]]


def serve(leader: FakeLeader, until, pick, idle=None) -> None:  # type: ignore[no-untyped-def]
    """Answer held calls, the call and the way chosen by ``pick(held) -> (index, action)``;
    ``idle()`` runs whenever no call is held."""
    deadline = time.monotonic() + 30
    while not until():
        assert time.monotonic() < deadline, "the producer did not finish"
        with leader.lock:
            n = len(leader.held)
        if not n:
            if idle is not None:
                idle()
            time.sleep(0.0005)
            continue
        i, action = pick(n)
        call: FakeCall = leader.take(i)
        action(call)


def answer_held_for(leader: FakeLeader, seconds: float) -> int:
    """Answer every call held during ``seconds``, in arrival order; returns how many."""
    n = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        while leader.held:
            leader.take(0).complete()
            n += 1
        time.sleep(0.002)
    return n


def test_a_lost_answer_behind_five_in_flight_writes_nothing_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reproduction from the field: 5 requests in flight; the leader writes the first,
    but its answer is lost (a reset reported later), while the answers behind it arrive.
    The window stays at the unresolved batch, so its retry is recognised as a duplicate:
    every record is in the log once, in order."""
    leader = install_fake_leader(monkeypatch)
    leader.hold = True
    sent = values(300)
    with Producer(bootstrap_servers="x:1", batch_size=100, linger_ms=0, retry_backoff_ms=5) as p:
        futures = send_all(p, leader, sent)
        wait_until(lambda: len(leader.held) == 5)
        lost = leader.take(0)
        lost.serve()
        # The four answered batches free no slot while the oldest is unresolved.
        assert answer_held_for(leader, 0.3) == 4, "batches were sent beyond the leader's duplicate window"
        lost.deliver(lost=True)
        leader.hold = False
        answer_held_for(leader, 0.1)
        p.flush(10)
    assert check_log(leader, sent, futures) == len(sent)
    assert leader.logs[("t", 0)] == sent


def test_the_window_never_passes_the_oldest_unresolved_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Round after round the oldest batch is written but answered last: no more than
    max_in_flight batches are ever sent from the oldest unresolved one on."""
    leader = install_fake_leader(monkeypatch)
    leader.hold = True
    with Producer(
        bootstrap_servers="x:1", batch_size=100, linger_ms=0, max_in_flight_requests_per_connection=3
    ) as p:
        futures = send_all(p, leader, values(200))
        for _ in range(10):
            wait_until(lambda: len(leader.held) == 3)
            oldest = leader.take(0)
            oldest.serve()
            assert answer_held_for(leader, 0.05) == 2
            oldest.deliver()
        leader.hold = False
        answer_held_for(leader, 0.05)
        p.flush(10)
    assert check_log(leader, values(200), futures) == 200
    assert leader.logs[("t", 0)] == values(200)


def test_an_out_of_order_answer_for_a_batch_that_may_be_written_fails_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first unresolved batch, written once with its answer lost, is refused as out of
    order on its retry (the leader lost its memory of the producer): it fails rather than
    being resent under a new epoch, and the batches behind it are written once, in order."""
    leader = install_fake_leader(monkeypatch)
    leader.hold = True
    with Producer(bootstrap_servers="x:1", batch_size=1024, linger_ms=0, retry_backoff_ms=5) as p:
        f1 = p.send("t", b"000000", partition=0)
        wait_until(lambda: len(leader.held) == 1)
        leader.take().complete(lost=True)
        wait_until(lambda: len(leader.held) == 1)
        leader.take().complete(OUT_OF_ORDER_SEQUENCE_NUMBER)
        with pytest.raises(OutOfOrderSequenceNumberError, match="not resent"):
            f1.get(5)
        leader.hold = False
        f2 = p.send("t", b"000001", partition=0)
        assert f2.get(5).offset == 1
    assert leader.logs[("t", 0)] == [b"000000", b"000001"]
    h1, h2 = leader.batch_headers[("t", 0)]
    assert (h1.producer_epoch, h1.base_sequence) == (0, 0)
    assert (h2.producer_epoch, h2.base_sequence) == (1, 0)


def test_an_out_of_order_answer_that_predates_the_write_ahead_of_it_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches 1 and 2 are in flight; the leader serves 2 first (out of order: 1 is not
    written yet), then 1. 2's refusal arrives after 1's acknowledgement, when 2 is the
    first unresolved batch: it says nothing of a gap (1 was in flight when 2 was sent),
    so 2 is resent as it is, not restarted in a new epoch, and nothing fails."""
    leader = install_fake_leader(monkeypatch)
    leader.hold = True
    sent = values(3)
    with Producer(bootstrap_servers="x:1", batch_size=1, linger_ms=0, retry_backoff_ms=5) as p:
        futures = send_all(p, leader, sent)
        wait_until(lambda: len(leader.held) == 2)
        one, two = leader.take(0), leader.take(0)
        two.serve()  # refused: sequence 2 while the leader expects 1
        one.complete()
        futures[1].get(5)
        two.deliver()
        leader.hold = False
        assert futures[2].get(5).offset == 2
    assert leader.logs[("t", 0)] == sent
    assert {h.producer_epoch for h in leader.batch_headers[("t", 0)]} == {0}


def test_a_failed_batch_restarts_the_stream_and_fails_those_that_may_be_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batch 1 is written with its answer lost; batch 2 then fails for good. The stream
    restarts in a new epoch once nothing is in flight: batch 1 may already be in the log
    under its old stamp, so it fails too instead of being written a second time."""
    leader = install_fake_leader(monkeypatch)
    leader.hold = True
    with Producer(
        bootstrap_servers="x:1", batch_size=100, linger_ms=0, retry_backoff_ms=5, delivery_timeout_ms=60000
    ) as p:
        futures = send_all(p, leader, values(40))
        wait_until(lambda: len(leader.held) == 5)
        first = leader.take(0)
        second = leader.take(0)
        first.complete(lost=True)
        second.complete(87)  # INVALID_RECORD: not retriable
        time.sleep(0.05)  # the lost batch's retry backoff passes before the restart
        leader.hold = False
        answer_held_for(leader, 0.1)
        for f in futures:
            try:
                f.get(10)
            except KafkaError:
                pass
        acc = p._accumulator  # type: ignore[attr-defined]
        assert (acc.pending, acc.buffered) == (0, 0), "every batch completed exactly once"
        calls = len(leader.calls)
    assert len(leader.calls) == calls
    assert check_log(leader, values(40), futures) >= 25
    assert any(f.exception() is not None and "outcome" in str(f.exception()) for f in futures)
    assert len({h.producer_epoch for h in leader.batch_headers[("t", 0)]}) == 2


ACTIONS = ["ok", "ok", "ok", "lost_after_write", "lost_before_write", "not_leader", "timed_out_after_write"]


def _act(name: str, call: FakeCall) -> None:
    if name == "ok":
        call.complete()
    elif name == "lost_after_write":
        call.complete(lost=True, write=True)
    elif name == "lost_before_write":
        call.complete(lost=True, write=False)
    elif name == "not_leader":
        call.complete(NOT_LEADER_OR_FOLLOWER)
    else:
        call.complete(REQUEST_TIMED_OUT, write=True)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(rng=st.randoms(use_true_random=False), in_flight=st.integers(1, 5), batch_size=st.sampled_from([60, 200, 1000]))
def test_random_loss_and_reordering_never_duplicate_or_reorder(
    rng: random.Random, in_flight: int, batch_size: int
) -> None:
    """Property: answers lost before or after the write, refused, served in any order, or
    answered long after they were served never put a record in the log twice or out of
    order, and every record is acknowledged in the end (every error here is retriable)."""
    with pytest.MonkeyPatch.context() as mp:
        leader = install_fake_leader(mp)
        leader.hold = True
        sent = values(250)
        steps = [0]
        late: list[FakeCall] = []
        """Served, their answers (a success or a refusal) not yet delivered."""
        when = random.Random(rng.random())
        """Draws as many times as the threads' timing makes it: not hypothesis's own."""

        def deliver_late() -> None:
            if late:
                late.pop(when.randrange(len(late))).deliver()

        def act(name: str, call: FakeCall) -> None:
            if when.random() < 0.5:
                deliver_late()
            if name == "served_answered_late":
                call.serve()
                late.append(call)
            else:
                _act(name, call)

        def pick(n: int) -> tuple[int, object]:
            steps[0] += 1
            if steps[0] > 400:  # the network heals: answers arrive in order
                deliver_late()
                return 0, lambda c: c.complete()
            name = rng.choice([*ACTIONS, "served_answered_late"])
            return rng.randrange(n), lambda c: act(name, c)

        with Producer(
            bootstrap_servers="x:1",
            batch_size=batch_size,
            linger_ms=0,
            retry_backoff_ms=1,
            max_in_flight_requests_per_connection=in_flight,
        ) as p:
            futures = [p.send("t", v, partition=0) for v in sent]
            serve(leader, lambda: all(f.done() for f in futures), pick, deliver_late)  # type: ignore[arg-type]
        assert check_log(leader, sent, futures) == len(sent)
        assert leader.logs[("t", 0)] == sent
