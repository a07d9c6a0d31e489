"""A consume-transform-produce application with exactly-once semantics, run as its own
process so that a test can SIGKILL it: ``python -m tests.integration.eos_copier
[--client confluent|kclient] BOOTSTRAP IN OUT GROUP TRANSACTIONAL_ID``: confluent-kafka
through the Kafka door (BOOTSTRAP its address), or kclient over gRPC.

It reads ``IN`` in group ``GROUP`` (read_committed, no auto commit) and, for each batch,
in one transaction: writes every value, prefixed ``copy:``, to ``OUT`` (same partition),
and commits the consumed positions with ``send_offsets_to_transaction``. An abortable
error aborts the transaction and rewinds to the committed offsets; a fatal one (fenced by
a newer instance) exits 3. Each commit prints ``committed N``.
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
    """``call`` again while it fails with a retriable error that needs no abort (each
    error printed: a test that finds the copier stalled shows what it kept retrying)."""
    while True:
        try:
            call()
            return
        except ck.KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or error.txn_requires_abort() or error.fatal():
                raise
            print(f"retrying: {error}", flush=True)
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
    p.add_argument("--client", choices=("confluent", "kclient"), default="confluent")
    args = p.parse_args(argv)
    if args.client == "kclient":
        return copy_with_kclient(args)
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
            "debug": "cgrp",  # the group's side of a stall, in the log a failing test shows
        }
    )
    producer = ck.Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "transactional.id": args.transactional_id,
            "transaction.timeout.ms": 60000,
            "linger.ms": 5,
            "topic.metadata.refresh.interval.ms": 1000,
            "debug": "eos",  # every transactional request and its answer
            # librdkafka #5511/#5456 (open): send_offsets_to_transaction() waits forever, past its
            # timeout, for a group coordinator that died and left the metadata, unless another
            # broker connection changes state. With a connection to every broker, the dead
            # one's return does that (CI once saw this copier silent for 96 s after the bounce).
            "enable.sparse.connections": False,
        }
    )
    producer.init_transactions(60)
    consumer.subscribe([args.input])
    total = 0
    while True:
        msgs = consumer.consume(args.batch, 1.0)
        for m in msgs:
            if m.error() is not None:  # a fenced static member, say: the log shows why nothing is copied
                print(f"consumer error: {m.error()}", flush=True)
        msgs = [m for m in msgs if m.error() is None]
        if not msgs:
            continue
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


def copy_with_kclient(args: argparse.Namespace) -> int:
    """The same loop with kclient over gRPC."""
    import kclient
    from kclient.errors import KafkaError, ProducerFencedError

    consumer = kclient.Consumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        max_poll_records=args.batch,
    )
    producer = kclient.Producer(
        bootstrap_servers=args.bootstrap, transactional_id=args.transactional_id, transaction_timeout_ms=60000
    )
    producer.init_transactions(60)
    consumer.subscribe([args.input])
    total = 0
    while True:
        batch = consumer.poll(timeout_ms=1000)
        if not batch:
            continue
        try:
            producer.begin_transaction()
            n = 0
            for tp, records in batch.items():
                for r in records:
                    producer.send(args.output, b"copy:" + (r.value or b""), partition=tp.partition)
                    n += 1
            positions = {tp: consumer.position(tp) for tp in batch}
            producer.send_offsets_to_transaction(positions, args.group, 60)
            producer.commit_transaction(60)
            total += n
            print(f"committed {total}", flush=True)
        except ProducerFencedError as exc:
            print(f"fatal: {exc}", flush=True)
            return 3
        except KafkaError as exc:
            print(f"aborting: {exc}", flush=True)
            try:
                producer.abort_transaction(60)
            except KafkaError as again:
                print(f"fatal: abort failed: {again}", flush=True)
                return 3
            for tp in consumer.assignment():
                committed = consumer.committed(tp)
                if committed is None:
                    consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, committed)


if __name__ == "__main__":
    sys.exit(main())
