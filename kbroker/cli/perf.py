"""``kctl perf produce`` and ``kctl perf consume``: kafka-producer-perf-test.sh and
kafka-consumer-perf-test.sh for kbroker, against any running cluster.

produce sends ``--num-records`` records of ``--record-size`` random bytes (a pool of
payloads, cycled) to ``--topic``, unthrottled or at ``--throughput`` records/s, with
``Producer.send`` or, with ``--bulk``, ``Producer.send_batch`` (``--bulk-size`` records a
call). ``--producer-props`` takes Kafka's names (``acks=all linger.ms=0 batch.size=65536
compression.type=lz4 ...``; a dot becomes an underscore, so any kclient producer setting
works). Every 5 s it prints Kafka's window line, and at the end Kafka's summary::

    1000000 records sent, 512345.6 records/sec (48.86 MB/sec), 3.10 ms avg latency, 18.40 ms max latency,
    2.51 ms 50th, 7.02 ms 95th, 11.30 ms 99th, 16.83 ms 99.9th.

(one line; percentiles in fractional ms since ours are below one). Latency runs from the
call to the acknowledgement callback: per record for ``send`` -- measured on a sample of
at most ``LATENCY_SAMPLES`` records spread evenly, because a callback on every record
costs a Python producer a third of its rate; delivery errors are seen on that sample --
and per call for ``--bulk`` (all of a call's futures done).

Transactions, as kafka-producer-perf-test.sh: ``--transactional-id`` (default
``performance-producer-default-transactional-id``) and ``--transaction-duration-ms``
(commit once the open transaction is that old, checked after each send) make the
producer transactional; ``--transaction-size N`` (kbroker's own) commits every N records.
Any of the three (or ``transactional.id`` among ``--producer-props``) turns transactions
on; without a size or a duration a transaction lasts Kafka's default, 3000 ms; with both
it commits at whichever comes first. ``init_transactions`` comes before the clock starts;
every commit, the last one included, is timed. With ``--bulk`` a ``send_batch`` call never
spans two transactions. The summary line stays Kafka's; the line before it counts the
transactions and their commit times::

    100 transactions committed, 10000.0 records each, 4.12 ms avg commit, 9.80 ms max commit.

consume assigns every partition of ``--topic`` (no group; ``--consumer-props`` takes
Kafka's names, e.g. ``max.poll.records=10000``), starts at the earliest offset and reads until
``--num-records`` records or ``--timeout-ms`` without one, then prints Kafka's CSV pair::

    start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms,
    fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec

(each on one line; ``rebalance.time.ms`` is the time to find the partitions and their
earliest offsets, as no group is joined; the fetch rates exclude it). ``--columnar`` reads with
``Consumer.poll_columns``, ``poll_arrow`` or ``poll_buffers`` instead of ``poll`` (``auto``, the
default: ``poll_arrow`` when pyarrow is installed, else ``poll_columns``); bytes are counted
from the columns' offsets, never record by record.

MB is 2**20 bytes, as Kafka's tools count. A missing feature (no ``send_batch``, no
columnar poll) or bad input is one ``kctl: ...`` line and a non-zero exit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kbroker.cli.common import CliError, UsageError, check_bootstrap, client_config, client_configs
from kbroker.cli.console import require_topic
from kclient import Consumer, Producer, TopicPartition
from kclient.errors import InvalidConfigError
from kclient.security import DEFAULT_SECURITY_CONFIG

MB = 1024.0 * 1024.0
REPORT_INTERVAL_S = 5.0
LATENCY_SAMPLES = 20_000
"""At most this many send() latencies are measured (every record of a smaller run)."""
PAYLOAD_POOL = 1024
DEFAULT_BULK_SIZE = 10_000
DEFAULT_CONSUME_TIMEOUT_MS = 10_000
DEFAULT_TRANSACTIONAL_ID = "performance-producer-default-transactional-id"
DEFAULT_TRANSACTION_DURATION_MS = 3000
"""Kafka's, when transactions are on and neither a duration nor a size is given."""
TRANSACTION_CHECK = 256
"""A transaction's age is read every this many records (not each: a per-record cost)."""
POLL_MS = 100
Report = Callable[[str], None]


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    perf = nouns.add_parser("perf", help="throughput and latency tests (kafka-*-perf-test.sh)")
    verbs = perf.add_subparsers(dest="verb", metavar="VERB", required=True)

    produce = verbs.add_parser(
        "produce", parents=[connection], help="send records as fast as asked and print Kafka's summary line"
    )
    produce.add_argument("--topic", required=True)
    produce.add_argument("--num-records", type=int, required=True)
    produce.add_argument("--record-size", type=int, default=100, help="value bytes (default 100)")
    produce.add_argument("--throughput", type=float, default=-1, help="records/s, -1 unthrottled (default)")
    produce.add_argument(
        "--producer-props",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="Kafka producer settings: acks=all linger.ms=5 batch.size=16384 compression.type=lz4 ...",
    )
    produce.add_argument("--bulk", action="store_true", help="send with Producer.send_batch")
    produce.add_argument(
        "--bulk-size", type=int, default=DEFAULT_BULK_SIZE, help=f"records per send_batch (default {DEFAULT_BULK_SIZE})"
    )
    produce.add_argument(
        "--transactional-id",
        help=f"transactions on, with this transactional.id (default {DEFAULT_TRANSACTIONAL_ID} "
        "when another transaction flag turns them on)",
    )
    produce.add_argument(
        "--transaction-duration-ms",
        type=int,
        help="transactions on: commit once the open transaction is this old "
        f"(default {DEFAULT_TRANSACTION_DURATION_MS} without --transaction-size)",
    )
    produce.add_argument(
        "--transaction-size", type=int, help="transactions on: commit every N records (kbroker's; Kafka has none)"
    )
    produce.set_defaults(handler=produce_command)

    consume = verbs.add_parser("consume", parents=[connection], help="read a topic from the start and print rates")
    consume.add_argument("--topic", required=True)
    consume.add_argument("--num-records", "--messages", type=int, required=True, dest="num_records")
    consume.add_argument(
        "--timeout-ms",
        type=int,
        default=DEFAULT_CONSUME_TIMEOUT_MS,
        help=f"stop after this long without a record (default {DEFAULT_CONSUME_TIMEOUT_MS})",
    )
    consume.add_argument(
        "--consumer-props",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="Kafka consumer settings: max.poll.records=10000 fetch.max.bytes=... ",
    )
    consume.add_argument(
        "--columnar",
        nargs="?",
        const="auto",
        choices=("auto", "columns", "arrow", "buffers"),
        help="poll_columns, poll_arrow or poll_buffers instead of poll (auto: the fastest there is)",
    )
    consume.set_defaults(handler=consume_command)


# --- settings ------------------------------------------------------------------------


def _security(config: Mapping[str, Any]) -> dict[str, Any]:
    """The security settings among a producer's or consumer's ``config`` (for its AdminClient)."""
    return {k: v for k, v in config.items() if k in DEFAULT_SECURITY_CONFIG}


def _bootstrap(args: argparse.Namespace, config: dict[str, Any]) -> str:
    if args.zookeeper is not None:
        raise UsageError("perf talks to brokers: give --bootstrap-server, not --zookeeper")
    servers = config.pop("bootstrap_servers", None) or args.bootstrap_server
    if servers is None:
        raise UsageError("perf needs --bootstrap-server HOST:PORT")
    return check_bootstrap(servers)


def _at_least(value: float, low: float, flag: str) -> None:
    if value < low:
        raise UsageError(f"{flag} must be at least {low:g}, got {value:g}")


@dataclass(frozen=True)
class TransactionPlan:
    """When a perf producer commits: every ``size`` records and/or once a transaction is
    ``duration_ms`` old (whichever comes first)."""

    transactional_id: str
    size: int | None = None
    duration_ms: int | None = None


def transaction_plan(
    transactional_id: str | None, duration_ms: int | None, size: int | None, producer_config: Mapping[str, Any]
) -> TransactionPlan | None:
    """The plan of ``--transactional-id``, ``--transaction-duration-ms`` and
    ``--transaction-size`` (and a ``transactional.id`` among the producer settings), None
    when none of them asks for transactions; a UsageError for bad values."""
    in_props = producer_config.get("transactional_id")
    if transactional_id is None and duration_ms is None and size is None and not in_props:
        return None
    if transactional_id is not None and in_props and transactional_id != in_props:
        raise UsageError(
            f"--transactional-id {transactional_id!r} and --producer-props transactional.id={in_props} differ"
        )
    tid = transactional_id if transactional_id is not None else in_props or DEFAULT_TRANSACTIONAL_ID
    if not tid.strip():
        raise UsageError("--transactional-id must not be empty")
    if duration_ms is not None and duration_ms <= 0:
        raise UsageError(f"--transaction-duration-ms must be positive, got {duration_ms}")
    if size is not None and size < 1:
        raise UsageError(f"--transaction-size must be at least 1, got {size}")
    if producer_config.get("enable_idempotence") is False:
        raise UsageError("transactions need an idempotent producer: drop enable.idempotence=false")
    acks = producer_config.get("acks")
    if acks is not None and str(acks) not in ("all", "-1"):
        raise UsageError(f"transactions need acks=all, got acks={acks}")
    if duration_ms is None and size is None:
        duration_ms = DEFAULT_TRANSACTION_DURATION_MS
    return TransactionPlan(tid, size, duration_ms)


class Transactions:
    """Begins and commits a perf producer's transactions as its ``plan`` says. Works with
    any producer with ``begin_transaction`` / ``commit_transaction`` (kclient's, or
    confluent-kafka's, whose commit flushes too); ``init_transactions`` is the caller's."""

    def __init__(self, producer: Any, plan: TransactionPlan) -> None:
        self._producer = producer
        self.plan = plan
        self.commits_ms: list[float] = []
        self.records = 0
        self._open: int | None = None  # records in the open transaction; None: none open
        self._began = 0.0

    def room(self, check: int = 1) -> int:
        """How many records may go before the next ``sent``: what the open transaction
        has room for, and at most ``check`` when it commits by age (read at ``sent``).
        Begins a transaction when none is open."""
        if self._open is None:
            self._producer.begin_transaction()
            self._began = time.perf_counter()
            self._open = 0
        size, duration_ms = self.plan.size, self.plan.duration_ms
        room = sys.maxsize if size is None else size - self._open
        return min(room, check) if duration_ms is not None else room

    def sent(self, n: int = 1) -> None:
        """``n`` records went into the open transaction: commit it if it is full or old."""
        assert self._open is not None, "sent() without room()"
        self._open += n
        size, duration_ms = self.plan.size, self.plan.duration_ms
        if (size is not None and self._open >= size) or (
            duration_ms is not None and (time.perf_counter() - self._began) * 1000.0 >= duration_ms
        ):
            self.commit()

    def commit(self) -> None:
        """Commit the open transaction, if one is open (an empty one too: nothing to send)."""
        if self._open is None:
            return
        t0 = time.perf_counter()
        self._producer.commit_transaction()
        self.commits_ms.append((time.perf_counter() - t0) * 1000.0)
        self.records += self._open
        self._open = None

    def line(self) -> str:
        n = len(self.commits_ms)
        return (
            f"{n} transactions committed, {self.records / n if n else 0.0:.1f} records each, "
            f"{sum(self.commits_ms) / n if n else 0.0:.2f} ms avg commit, {max(self.commits_ms, default=0.0):.2f} ms "
            "max commit."
        )


# --- statistics ----------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """Latency figures in ms over the measured samples."""

    count: int
    avg: float
    max: float
    p50: float
    p95: float
    p99: float
    p999: float

    @classmethod
    def of(cls, samples_ms: Sequence[float]) -> Latency:
        if not samples_ms:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        s = sorted(samples_ms)
        n = len(s)

        def pct(p: float) -> float:
            return s[min(n - 1, int(p * n))]  # Kafka's ProducerPerformance.percentiles

        return cls(n, sum(s) / n, s[-1], pct(0.5), pct(0.95), pct(0.99), pct(0.999))


@dataclass(frozen=True)
class ProduceSummary:
    records: int
    bytes: int
    elapsed_s: float
    latency: Latency

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def line(self) -> str:
        lat = self.latency
        return (
            f"{self.records} records sent, {self.records_per_s:.1f} records/sec ({self.mb_per_s:.2f} MB/sec), "
            f"{lat.avg:.2f} ms avg latency, {lat.max:.2f} ms max latency, {lat.p50:.2f} ms 50th, "
            f"{lat.p95:.2f} ms 95th, {lat.p99:.2f} ms 99th, {lat.p999:.2f} ms 99.9th."
        )


class _ProduceStats:
    """Latency samples and errors, fed from the producer's network thread (hence the lock)
    and read by the sending thread for the 5-second window lines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.samples: list[float] = []
        self.errors = 0
        self.first_error: BaseException | None = None
        self._window: list[float] = []

    def done(self, t0: float, error: BaseException | None) -> None:
        ms = (time.perf_counter() - t0) * 1000.0
        with self._lock:
            if error is not None:
                self.errors += 1
                self.first_error = self.first_error or error
                return
            self.samples.append(ms)
            self._window.append(ms)

    def take_window(self) -> list[float]:
        with self._lock:
            window, self._window = self._window, []
        return window


class _Progress:
    """Kafka's window line every ``REPORT_INTERVAL_S``: records handed to the producer in
    the window, their rate, and the latency of the acknowledgements in it."""

    def __init__(self, stats: _ProduceStats, record_size: int, report: Report | None) -> None:
        self._stats = stats
        self._size = record_size
        self._report = report
        self._start = self._next = time.perf_counter()
        self._sent = 0
        self._next += REPORT_INTERVAL_S

    def tick(self, sent: int) -> None:
        now = time.perf_counter()
        if now < self._next or self._report is None:
            return
        took = now - (self._next - REPORT_INTERVAL_S)
        n = sent - self._sent
        window = self._stats.take_window()
        avg = sum(window) / len(window) if window else 0.0
        self._report(
            f"{n} records sent, {n / took:.1f} records/sec ({n * self._size / MB / took:.2f} MB/sec), "
            f"{avg:.1f} ms avg latency, {max(window, default=0.0):.1f} ms max latency."
        )
        self._sent = sent
        self._next = now + REPORT_INTERVAL_S


class _Throttle:
    """Kafka's ThroughputThrottler: sleep whenever the sender is ahead of ``per_s``."""

    def __init__(self, per_s: float) -> None:
        self.per_s = per_s
        self.start = time.perf_counter()

    def wait(self, sent: int) -> None:
        ahead = self.start + sent / self.per_s - time.perf_counter()
        if ahead > 0:
            time.sleep(ahead)


def _payloads(size: int) -> list[bytes]:
    """Random uppercase letters as Kafka's perf test sends, a pool cycled through."""
    raw = bytes(65 + b % 26 for b in os.urandom(size * PAYLOAD_POOL))
    return [raw[i * size : (i + 1) * size] for i in range(PAYLOAD_POOL)]


def _on_done(future: Any, done: Callable[[BaseException | None], None]) -> None:
    """Call ``done(error_or_None)`` once ``future`` completes (kclient's futures or
    ``concurrent.futures``)."""
    if hasattr(future, "add_callback") and hasattr(future, "add_errback"):
        future.add_callback(lambda *_: done(None))
        future.add_errback(lambda *a: done(a[-1] if a else RuntimeError("send failed")))
    elif hasattr(future, "add_done_callback"):
        future.add_done_callback(lambda f: done(f.exception()))
    else:
        raise CliError(f"send_batch returned {type(future).__name__}, not a future")


def _futures(result: Any) -> list[Any]:
    if isinstance(result, Mapping):
        return list(result.values())
    if isinstance(result, list | tuple):
        return list(result)
    return [result]


class _AllDone:
    """Completes once every future of one send_batch call has; then one latency sample."""

    def __init__(self, stats: _ProduceStats, t0: float, futures: list[Any]) -> None:
        self._stats = stats
        self._t0 = t0
        self._left = len(futures)
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        for f in futures:
            _on_done(f, self._one)

    def _one(self, error: BaseException | None) -> None:
        with self._lock:
            self._left -= 1
            self._error = self._error or error
            last = self._left == 0
        if last:
            self._stats.done(self._t0, self._error)


def produce(
    producer: Producer,
    topic: str,
    num_records: int,
    record_size: int,
    *,
    throughput: float = -1,
    bulk: bool = False,
    bulk_size: int = DEFAULT_BULK_SIZE,
    partition: int | None = None,
    report: Report | None = None,
    transactions: Transactions | None = None,
) -> ProduceSummary:
    """Send ``num_records`` records with ``producer`` and wait for every outcome; with
    ``transactions`` (on a producer whose ``init_transactions`` is done), in transactions
    it begins and commits.

    Raises CliError when ``bulk`` and the producer has no ``send_batch``, or when a
    measured record failed (after ``report`` got the summary line).
    """
    send_batch = getattr(producer, "send_batch", None)
    if bulk and send_batch is None:
        raise CliError("--bulk needs Producer.send_batch, which this kclient does not have")
    payloads = _payloads(record_size)
    stats = _ProduceStats()
    progress = _Progress(stats, record_size, report)
    throttle = _Throttle(throughput) if throughput > 0 else None
    start = time.perf_counter()
    if bulk:
        assert send_batch is not None
        values = tuple(payloads[i % PAYLOAD_POOL] for i in range(min(bulk_size, num_records)))
        sent = 0
        while sent < num_records:
            k = min(len(values), num_records - sent)
            if transactions is not None:
                k = min(k, transactions.room(k))
            if throttle:
                throttle.wait(sent)
            t0 = time.perf_counter()
            _AllDone(
                stats, t0, _futures(send_batch(topic, values if k == len(values) else values[:k], partition=partition))
            )
            sent += k
            if transactions is not None:
                transactions.sent(k)
            progress.tick(sent)
    else:
        _send_each(producer, topic, partition, num_records, payloads, stats, progress, throttle, transactions)
    if transactions is not None:
        transactions.commit()
    producer.flush()
    elapsed = time.perf_counter() - start
    summary = ProduceSummary(num_records, num_records * record_size, elapsed, Latency.of(stats.samples))
    if report is not None:
        if transactions is not None:
            report(transactions.line())
        report(summary.line())
    if stats.errors:
        raise CliError(f"{stats.errors} measured send(s) to {topic} failed: {stats.first_error}")
    return summary


def _send_each(
    producer: Producer,
    topic: str,
    partition: int | None,
    n: int,
    payloads: list[bytes],
    stats: _ProduceStats,
    progress: _Progress,
    throttle: _Throttle | None,
    transactions: Transactions | None = None,
) -> None:
    send = producer.send
    clock = time.perf_counter
    sampling = max(1, -(-n // LATENCY_SAMPLES))
    check = 1 if throttle else 1024
    pool = len(payloads)
    chunk = left = 0  # records of this transaction chunk: sent() after each chunk, not each record
    for i in range(n):
        if throttle:
            throttle.wait(i)
        if transactions is not None and not left:
            chunk = left = transactions.room(1 if throttle else TRANSACTION_CHECK)
        if i % sampling:
            send(topic, payloads[i % pool], partition=partition)
        else:
            t0 = clock()
            _on_done(send(topic, payloads[i % pool], partition=partition), functools.partial(stats.done, t0))
        if transactions is not None:
            left -= 1
            if not left:
                transactions.sent(chunk)
        if not i % check:
            progress.tick(i)
    if transactions is not None and left:
        transactions.sent(chunk - left)


def end_to_end_latency(producer: Producer, consumer: Consumer, topic: str, num_records: int, size: int) -> Latency:
    """Kafka's EndToEndLatency: send one record, poll until it arrives, repeat. The
    consumer must be assigned ``topic``'s partitions at their end; ``producer`` should
    have ``linger_ms=0``."""
    payloads = _payloads(size)
    samples: list[float] = []
    for i in range(num_records):
        t0 = time.perf_counter()
        producer.send(topic, payloads[i % PAYLOAD_POOL])
        got = 0
        deadline = t0 + 30.0
        while not got:
            if time.perf_counter() > deadline:
                raise CliError(f"record {i} did not come back from {topic} within 30 s")
            got = sum(len(recs) for recs in consumer.poll(timeout_ms=POLL_MS).values())
        samples.append((time.perf_counter() - t0) * 1000.0)
        if got != 1:
            raise CliError(f"expected one record back from {topic}, got {got}")
    return Latency.of(samples)


# --- consume -------------------------------------------------------------------------


@dataclass
class ConsumeSummary:
    records: int = 0
    bytes: int = 0
    polls: int = 0
    start_wall: float = field(default_factory=time.time)
    elapsed_s: float = 0.0
    setup_s: float = 0.0
    """Seconds to find the partitions and their earliest offsets (Kafka's rebalance.time.ms slot)."""

    HEADER = (
        "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
        "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
    )

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def fetch_s(self) -> float:
        return self.elapsed_s - self.setup_s

    @property
    def fetch_records_per_s(self) -> float:
        return self.records / self.fetch_s if self.fetch_s > 0 else 0.0

    def line(self) -> str:
        def stamp(t: float) -> str:
            return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S:%f")[:-3]

        mb = self.bytes / MB
        fetch = self.fetch_s
        return (
            f"{stamp(self.start_wall)}, {stamp(self.start_wall + self.elapsed_s)}, {mb:.4f}, "
            f"{mb / self.elapsed_s if self.elapsed_s > 0 else 0.0:.4f}, {self.records}, {self.records_per_s:.4f}, "
            f"{self.setup_s * 1000:.0f}, {fetch * 1000:.0f}, {mb / fetch if fetch > 0 else 0.0:.4f}, "
            f"{self.fetch_records_per_s:.4f}"
        )


def _row_bytes(records: Iterable[Any]) -> int:
    return sum(len(r.value or b"") + len(r.key or b"") for r in records)


def _column_counts(result: Any) -> tuple[int, int]:
    """(records, key + value bytes) of what a columnar poll returned: a pyarrow
    RecordBatch or Table, a mapping of partition -> columns, or one columns object with
    ``value``/``values`` (and ``key``/``keys``) as sequences or Arrow arrays."""
    if result is None:
        return 0, 0
    if hasattr(result, "value_bytes"):  # a ColumnBuffers
        return len(result), result.key_bytes + result.value_bytes
    if hasattr(result, "num_rows") and hasattr(result, "column"):
        names = set(result.schema.names)
        size = sum(_binary_bytes(result.column(c)) for c in ("key", "value") if c in names)
        return int(result.num_rows), size
    if isinstance(result, Mapping) and not any(k in result for k in ("value", "values")):
        totals = [_column_counts(v) for v in result.values()]
        return sum(t[0] for t in totals), sum(t[1] for t in totals)
    values = _column(result, "value")
    if values is None:
        raise CliError(f"cannot count the records of a columnar poll result {type(result).__name__}")
    keys = _column(result, "key")
    return len(values), _binary_bytes(values) + (_binary_bytes(keys) if keys is not None else 0)


def _column(columns: Any, name: str) -> Any:
    for attr in (name, name + "s"):
        if isinstance(columns, Mapping) and attr in columns:
            return columns[attr]
        if hasattr(columns, attr):
            return getattr(columns, attr)
    return None


def _binary_bytes(column: Any) -> int:
    if hasattr(column, "num_chunks"):  # a pyarrow chunked array
        return sum(_binary_bytes(chunk) for chunk in column.chunks)
    if hasattr(column, "null_count"):  # a pyarrow binary array: from its offsets (nulls take none)
        if not len(column):
            return 0
        import pyarrow as pa

        large = pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type)
        offsets = memoryview(column.buffers()[1]).cast("q" if large else "i")
        return int(offsets[column.offset + len(column)] - offsets[column.offset])
    return sum(map(len, filter(None, column)))


def columnar_poll(consumer: Consumer, kind: str) -> Callable[..., Any]:
    """The consumer's columnar poll: ``poll_columns``, ``poll_arrow`` or ``poll_buffers``
    (``kind`` auto: the fastest, ``poll_arrow`` when pyarrow is installed); a CliError
    when this kclient has none of them."""
    fastest = ("poll_arrow", "poll_columns") if _has_pyarrow() else ("poll_columns",)
    names = {
        "auto": fastest,
        "columns": ("poll_columns",),
        "arrow": ("poll_arrow",),
        "buffers": ("poll_buffers",),
    }[kind]
    for name in names:
        poll = getattr(consumer, name, None)
        if poll is not None:
            return poll  # type: ignore[no-any-return]
    raise CliError(f"--columnar needs Consumer.{' or Consumer.'.join(names)}, which this kclient does not have")


def _has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def consume(
    consumer: Consumer,
    topic: str,
    num_records: int,
    *,
    timeout_ms: int = DEFAULT_CONSUME_TIMEOUT_MS,
    columnar: str | None = None,
    report: Report | None = None,
) -> ConsumeSummary:
    """Read ``num_records`` records of every partition of ``topic`` from the earliest
    offset (fewer when ``timeout_ms`` passes without a record: then a CliError after
    ``report`` got the summary)."""
    poll = columnar_poll(consumer, columnar) if columnar else None
    summary = ConsumeSummary()
    start = time.perf_counter()
    partitions = consumer.partitions_for_topic(topic)
    if not partitions:
        raise CliError(f"topic {topic!r} does not exist")
    tps = [TopicPartition(topic, p) for p in sorted(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    for tp in tps:
        consumer.position(tp)  # ListOffsets now: setup, not fetch time
    summary.setup_s = time.perf_counter() - start
    last_record = start + summary.setup_s
    next_report = start + REPORT_INTERVAL_S
    reported = (start, 0, 0)
    while summary.records < num_records:
        left = num_records - summary.records
        if poll is not None:
            n, size = _column_counts(poll(timeout_ms=POLL_MS, max_records=left))
        else:
            batch = consumer.poll(timeout_ms=POLL_MS, max_records=left)
            n = size = 0
            for records in batch.values():
                n += len(records)
                size += _row_bytes(records)
        summary.polls += 1
        now = time.perf_counter()
        if n:
            summary.records += n
            summary.bytes += size
            last_record = now
        elif (now - last_record) * 1000 >= timeout_ms:
            break
        if report is not None and now >= next_report:
            t, r, b = reported
            report(
                f"{summary.records - r} records read, {(summary.records - r) / (now - t):.1f} records/sec "
                f"({(summary.bytes - b) / MB / (now - t):.2f} MB/sec), {summary.polls} polls."
            )
            reported = (now, summary.records, summary.bytes)
            next_report = now + REPORT_INTERVAL_S
    summary.elapsed_s = last_record - start
    if report is not None:
        report(ConsumeSummary.HEADER)
        report(summary.line())
    if summary.records < num_records:
        raise CliError(
            f"read {summary.records} of {num_records} records from {topic}: none for {timeout_ms} ms (--timeout-ms)"
        )
    return summary


# --- commands ------------------------------------------------------------------------


def _print(line: str) -> None:
    print(line, flush=True)


def produce_command(args: argparse.Namespace) -> int:
    config = {**client_configs(args), **client_config(args.producer_props, "--producer-props", Producer.DEFAULT_CONFIG)}
    bootstrap = _bootstrap(args, config)
    _at_least(args.num_records, 1, "--num-records")
    _at_least(args.record_size, 0, "--record-size")
    _at_least(args.bulk_size, 1, "--bulk-size")
    if args.throughput <= 0 and args.throughput != -1:
        raise UsageError(f"--throughput must be positive, or -1 for unthrottled, got {args.throughput:g}")
    if args.bulk and not hasattr(Producer, "send_batch"):
        raise CliError("--bulk needs Producer.send_batch, which this kclient does not have")
    plan = transaction_plan(args.transactional_id, args.transaction_duration_ms, args.transaction_size, config)
    if plan is not None:
        config["transactional_id"] = plan.transactional_id
    try:
        producer = Producer(bootstrap_servers=bootstrap, **config)
    except InvalidConfigError as exc:
        raise UsageError(str(exc)) from None
    try:
        require_topic(bootstrap, args.topic, _security(config))
        transactions = None
        if plan is not None:
            producer.init_transactions()
            transactions = Transactions(producer, plan)
        produce(
            producer,
            args.topic,
            args.num_records,
            args.record_size,
            throughput=args.throughput,
            bulk=args.bulk,
            bulk_size=args.bulk_size,
            report=_print,
            transactions=transactions,
        )
    finally:
        producer.close()
    return 0


def consume_command(args: argparse.Namespace) -> int:
    config = {**client_configs(args), **client_config(args.consumer_props, "--consumer-props", Consumer.DEFAULT_CONFIG)}
    bootstrap = _bootstrap(args, config)
    _at_least(args.num_records, 1, "--num-records")
    _at_least(args.timeout_ms, 0, "--timeout-ms")
    if config.get("group_id"):
        raise UsageError("perf consume assigns every partition itself: group.id is not used")
    config.setdefault("enable_auto_commit", False)
    try:
        consumer = Consumer(bootstrap_servers=bootstrap, **config)
    except InvalidConfigError as exc:
        raise UsageError(str(exc)) from None
    with consumer:
        if args.columnar:
            columnar_poll(consumer, args.columnar)  # fail before reading, not after
        require_topic(bootstrap, args.topic, _security(config))
        consume(
            consumer, args.topic, args.num_records, timeout_ms=args.timeout_ms, columnar=args.columnar, report=_print
        )
    return 0
