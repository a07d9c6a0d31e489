"""A consume-transform-produce application with exactly-once semantics over confluent-kafka,
run as its own process so that a test can SIGKILL it: ``python -m
tests.integration.eos_copier BOOTSTRAP IN OUT GROUP TRANSACTIONAL_ID``.

It reads ``IN`` in group ``GROUP`` (read_committed, no auto commit) and, for each batch,
in one transaction: writes every value, prefixed ``copy:``, to ``OUT`` (same partition),
and commits the consumed positions with ``send_offsets_to_transaction``. An abortable
error aborts the transaction and rewinds to the committed offsets; a fatal one (fenced by
a newer instance) exits 3. It exits 0 once it has seen ``--idle-exit-s`` seconds with
nothing to read (never, by default). Each commit prints ``committed N``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable

import confluent_kafka as ck


def rewind(consumer: ck.Consumer) -> None:
    """Back to the group's committed offsets (what the aborted transaction did not commit)."""
    assignment = consumer.assignment()
    if not assignment:
        return
    for tp in consumer.committed(assignment, timeout=30):
        consumer.seek(ck.TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else ck.OFFSET_BEGINNING))


def retrying(call: Callable[[], object]) -> None:
    """``call`` again while it fails with a retriable error that needs no abort."""
    while True:
        try:
            call()
            return
        except ck.KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or error.txn_requires_abort() or error.fatal():
                raise
            time.sleep(0.1)


def produce(producer: ck.Producer, topic: str, value: bytes, partition: int) -> None:
    while True:
        try:
            producer.produce(topic, value=value, partition=partition)
            return
        except BufferError:
            producer.poll(0.1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("bootstrap")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("group")
    p.add_argument("transactional_id")
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--idle-exit-s", type=float, default=0.0)
    args = p.parse_args(argv)
    consumer = ck.Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
            "group.instance.id": f"{args.group}-copier",
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    producer = ck.Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "transactional.id": args.transactional_id,
            "transaction.timeout.ms": 20000,
            "linger.ms": 5,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    producer.init_transactions(60)
    consumer.subscribe([args.input])
    idle_since = time.monotonic()
    total = 0
    while True:
        msgs = consumer.consume(args.batch, 1.0)
        msgs = [m for m in msgs if m.error() is None]
        if not msgs:
            if args.idle_exit_s and time.monotonic() - idle_since > args.idle_exit_s:
                return 0
            continue
        idle_since = time.monotonic()
        try:
            producer.begin_transaction()
            for m in msgs:
                produce(producer, args.output, b"copy:" + (m.value() or b""), m.partition() or 0)
            offsets = consumer.position(consumer.assignment())
            metadata = consumer.consumer_group_metadata()
            retrying(functools.partial(producer.send_offsets_to_transaction, offsets, metadata, 60))
            retrying(lambda: producer.commit_transaction(60))
            total += len(msgs)
            print(f"committed {total}", flush=True)
        except ck.KafkaException as exc:
            error = exc.args[0]
            if error.fatal():
                print(f"fatal: {error}", flush=True)
                return 3
            print(f"aborting: {error}", flush=True)
            try:
                retrying(lambda: producer.abort_transaction(60))
            except ck.KafkaException as again:
                print(f"fatal: abort failed: {again}", flush=True)
                return 3
            rewind(consumer)


if __name__ == "__main__":
    sys.exit(main())
