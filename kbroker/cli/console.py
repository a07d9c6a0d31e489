"""``kctl produce`` and ``kctl consume``: stdin to a topic, a topic to stdout.

produce reads lines from stdin and sends one record per line. A line is
``key<SEP>value`` when it contains the separator (TAB unless ``--property
key.separator=...``), otherwise the whole line is the value; ``--property
parse.key=true`` makes the key mandatory and ``parse.key=false`` never splits.
``--property parse.headers=true`` reads Kafka's console-producer headers first::

    h1:v1,h2:v2<TAB>[key<TAB>]value

(``headers.delimiter`` TAB ends the headers, ``headers.separator`` ``,`` between
headers, ``headers.key.separator`` ``:`` between a header's key and value; a line
without the delimiter, or a header without the key separator, fails the command
unless ``ignore.error=true``, which then sends the whole line as the value, or the
header with a null value). ``--producer-property k=v`` (repeatable) sets any producer
setting by its Java name (``linger.ms``) or kafka-python name (``linger_ms``); the
explicit flags (--acks, --compression-type, --max-block-ms) win over it. At EOF
(or Ctrl-C) it flushes, and fails if any record was not acknowledged. It prints
nothing on success (``--verbose``: one summary line on stderr).

consume prints one record per line, as Kafka's console consumer formats it::

    [CreateTime:<ts>\\t][Partition:<p>\\t][Offset:<o>\\t][<headers>\\t][<key>\\t]<value>

(the bracketed fields with ``--property print.timestamp|print.partition|print.offset|
print.headers|print.key=true``; ``\\t`` is ``key.separator``; keys and values are
decoded as UTF-8 with errors replaced, a missing one prints ``null``). It stops after
``--max-messages`` records or ``--timeout-ms`` without a new one, and otherwise runs
until Ctrl-C (exit 0).

``consume --group G`` reads as a member of group G (subscribed to ``--topic``, or to
every topic matching ``--include REGEX``, a full match, as kafka-console-consumer's
``--include``): it starts from the group's committed offsets (``--from-beginning`` or
the latest offset where it has none) and commits, after each printed batch, exactly
the offsets it has printed. ``--include`` without ``--group`` joins a fresh
``console-consumer-NNNNN`` group and commits nothing, as Kafka's console consumer does.
With ``--partition`` the partition is assigned and ``--group`` only keeps the offsets.
``--consumer-property k=v`` sets any consumer setting, as ``--producer-property``.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO

from kbroker.cli.common import (
    CliError,
    UsageError,
    check_bootstrap,
    client_config,
    client_configs,
    parse_bool,
    parse_key_values,
)
from kclient import (
    AdminClient,
    Consumer,
    ConsumerRecord,
    FutureRecordMetadata,
    Producer,
    TopicPartition,
)
from kclient.errors import InvalidConfigError, KafkaError, UnknownTopicOrPartitionError

COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")
TOPIC_WAIT_S = 2.0
"""How long an unknown topic is looked for (a topic just created elsewhere may lag)."""
POLL_MS = 500
SETTLE_TIMEOUT_S = 10.0
TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


def add_parsers(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    produce = nouns.add_parser("produce", parents=[connection], help="send lines of stdin as records ([key<TAB>]value)")
    produce.add_argument("--topic", required=True)
    produce.add_argument("--acks", choices=("0", "1", "all", "-1"), help="default: all")
    produce.add_argument("--compression-type", choices=COMPRESSION_TYPES, help="default: none")
    produce.add_argument(
        "--max-block-ms", type=int, help="how long send may wait for metadata or buffer space (default 60000)"
    )
    produce.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="parse.key=true|false (default: split when the separator is present), key.separator=SEP (default TAB), "
        "parse.headers=true|false, headers.delimiter (TAB), headers.separator (,), headers.key.separator (:), "
        "ignore.error=true|false",
    )
    produce.add_argument(
        "--producer-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a producer setting, Java or kafka-python name: linger.ms=5, batch.size=65536, ... (repeatable)",
    )
    produce.set_defaults(handler=produce_lines)

    consume = nouns.add_parser("consume", parents=[connection], help="print a topic's records to stdout")
    source = consume.add_mutually_exclusive_group(required=True)
    source.add_argument("--topic")
    source.add_argument("--include", metavar="REGEX", help="every topic whose name matches REGEX (a group member)")
    consume.add_argument("--group", help="consume as a member of this group and commit what was printed")
    consume.add_argument(
        "--consumer-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a consumer setting, Java or kafka-python name: max.poll.records=100, ... (repeatable)",
    )
    consume.add_argument(
        "--from-beginning", action="store_true", help="start at the earliest offset (default: only new records)"
    )
    consume.add_argument("--partition", type=int, help="read only this partition")
    consume.add_argument("--offset", help="N, earliest or latest: where to start in --partition")
    consume.add_argument("--max-messages", type=int, help="exit after this many records")
    consume.add_argument("--timeout-ms", type=int, help="exit after this long without a new record")
    consume.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="print.key, print.value, print.offset, print.partition, print.timestamp, print.headers (true|false), "
        "key.separator (default TAB), line.separator (default newline)",
    )
    consume.set_defaults(handler=consume_records)


def _bootstrap(args: argparse.Namespace, command: str) -> str:
    if args.zookeeper is not None:
        raise UsageError(f"{command} talks to brokers: give --bootstrap-server, not --zookeeper")
    if args.bootstrap_server is None:
        raise UsageError(f"{command} needs --bootstrap-server HOST:PORT")
    return check_bootstrap(args.bootstrap_server)


def require_topic(bootstrap: str, topic: str, configs: Mapping[str, Any] | None = None) -> list[int]:
    """The topic's partitions, or UnknownTopicOrPartitionError soon (not after max_block_ms).
    ``configs``: the client's security settings (:func:`kbroker.cli.common.client_configs`)."""
    deadline = time.monotonic() + TOPIC_WAIT_S
    with AdminClient(bootstrap, **dict(configs or {})) as admin:
        while True:
            try:
                (description,) = admin.describe_topics([topic])
                return sorted(p.partition for p in description.partitions)
            except UnknownTopicOrPartitionError:
                if time.monotonic() >= deadline:
                    raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist") from None
                time.sleep(0.2)


def _unescape(text: str) -> str:
    """``\\t``, ``\\n`` and ``\\\\`` in a --property value, as a shell user writes them."""
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape") if "\\" in text else text


# --- produce -------------------------------------------------------------------------


class _Outcomes:
    """The futures of every send, tallied as they complete (kept only while pending)."""

    PRUNE_EVERY = 1024

    def __init__(self) -> None:
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.first_error: BaseException | None = None
        self._pending: list[FutureRecordMetadata] = []

    def watch(self, future: FutureRecordMetadata) -> None:
        self.sent += 1
        self._pending.append(future)
        if len(self._pending) >= self.PRUNE_EVERY:
            self._pending = [f for f in self._pending if not self._tally(f, wait=False)]

    def settle(self) -> None:
        """Tally every outstanding send (after ``close``, each has an outcome or soon will)."""
        for f in self._pending:
            self._tally(f, wait=True)
        self._pending = []

    def _tally(self, future: FutureRecordMetadata, *, wait: bool) -> bool:
        if not wait and not future.is_done():
            return False
        try:
            error = future.exception(timeout=SETTLE_TIMEOUT_S)
        except KafkaError as exc:
            error = exc
        if error is None:
            self.acked += 1
        else:
            self.failed += 1
            self.first_error = self.first_error or error
        return True


def read_lines(stream: BinaryIO) -> Iterator[bytes]:
    """Lines without their terminator (``\\n`` or ``\\r\\n``)."""
    for raw in stream:
        line = raw[:-1] if raw.endswith(b"\n") else raw
        yield line[:-1] if line.endswith(b"\r") else line


def split_line(line: bytes, separator: bytes, parse_key: bool | None, lineno: int) -> tuple[bytes | None, bytes]:
    """(key, value) of one input line; ``parse_key`` None splits only when it can."""
    if parse_key is False:
        return None, line
    key, sep, value = line.partition(separator)
    if sep:
        return key, value
    if parse_key:
        raise CliError(f"line {lineno} has no key separator {separator.decode(errors='replace')!r} (parse.key=true)")
    return None, line


Header = tuple[str, bytes | None]


@dataclass(frozen=True)
class LineFormat:
    """Kafka's console producer LineMessageReader settings (``--property``)."""

    parse_key: bool | None = None
    key_separator: bytes = b"\t"
    parse_headers: bool = False
    headers_delimiter: bytes = b"\t"
    headers_separator: bytes = b","
    headers_key_separator: bytes = b":"
    ignore_error: bool = False

    KNOWN = (
        "parse.key",
        "key.separator",
        "parse.headers",
        "headers.delimiter",
        "headers.separator",
        "headers.key.separator",
        "ignore.error",
    )

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> LineFormat:
        unknown = set(props) - set(cls.KNOWN)
        if unknown:
            raise UsageError(
                f"unknown --property for produce: {', '.join(sorted(unknown))} (known: {', '.join(cls.KNOWN)})"
            )
        texts = {
            name: _unescape(props[name]).encode()
            for name in ("key.separator", "headers.delimiter", "headers.separator", "headers.key.separator")
            if name in props
        }
        for name, text in texts.items():
            if not text:
                raise UsageError(f"{name} must not be empty")
        return cls(
            parse_key=parse_bool(props["parse.key"], "parse.key") if "parse.key" in props else None,
            key_separator=texts.get("key.separator", b"\t"),
            parse_headers=parse_bool(props.get("parse.headers", "false"), "parse.headers"),
            headers_delimiter=texts.get("headers.delimiter", b"\t"),
            headers_separator=texts.get("headers.separator", b","),
            headers_key_separator=texts.get("headers.key.separator", b":"),
            ignore_error=parse_bool(props.get("ignore.error", "false"), "ignore.error"),
        )

    def headers(self, text: bytes, lineno: int) -> list[Header]:
        out: list[Header] = []
        if not text:
            return out
        for pair in text.split(self.headers_separator):
            key, sep, value = pair.partition(self.headers_key_separator)
            if not sep:
                if not self.ignore_error:
                    shown = pair.decode(errors="replace")
                    raise CliError(f"No header key separator found in pair '{shown}' on line number {lineno}")
                out.append((pair.decode("utf-8", errors="replace"), None))
                continue
            out.append((key.decode("utf-8", errors="replace"), value))
        return out

    def parse(self, line: bytes, lineno: int) -> tuple[bytes | None, bytes, list[Header]]:
        """(key, value, headers) of one input line."""
        headers: list[Header] = []
        if self.parse_headers:
            head, sep, rest = line.partition(self.headers_delimiter)
            if sep:
                headers, line = self.headers(head, lineno), rest
            elif not self.ignore_error:
                raise CliError(f"No headers delimiter found on line number {lineno}")
        key, value = split_line(line, self.key_separator, self.parse_key, lineno)
        return key, value, headers


def producer_config(args: argparse.Namespace) -> dict[str, Any]:
    """The Producer's keyword arguments: --command-config, then --producer-property, then the
    explicit flags (which win)."""

    config = {
        **client_configs(args),
        **client_config(args.producer_property, "--producer-property", Producer.DEFAULT_CONFIG),
    }
    config.pop("bootstrap_servers", None)
    config.setdefault("acks", "all")
    config.setdefault("compression_type", "none")
    config.setdefault("max_block_ms", 60000)
    for key, value in (
        ("acks", args.acks),
        ("compression_type", args.compression_type),
        ("max_block_ms", args.max_block_ms),
    ):
        if value is not None:
            config[key] = value
    if config["max_block_ms"] < 0:
        raise UsageError(f"--max-block-ms must be >= 0, got {config['max_block_ms']}")
    return config


def produce_lines(args: argparse.Namespace) -> int:
    bootstrap = _bootstrap(args, "produce")
    fmt = LineFormat.from_properties(parse_key_values(args.property, "--property"))
    config = producer_config(args)
    require_topic(bootstrap, args.topic, client_configs(args))
    outcomes = _Outcomes()
    try:
        producer = Producer(bootstrap_servers=bootstrap, **config)
    except InvalidConfigError as exc:
        raise UsageError(str(exc)) from None
    try:
        try:
            for lineno, line in enumerate(read_lines(sys.stdin.buffer), 1):
                key, value, headers = fmt.parse(line, lineno)
                outcomes.watch(producer.send(args.topic, value, key=key, headers=headers or None))
        except KeyboardInterrupt:
            pass  # Ctrl-C ends the input, as Ctrl-D does
        producer.flush()
    finally:
        producer.close()
    outcomes.settle()
    if outcomes.failed:
        raise CliError(
            f"{outcomes.failed} of {outcomes.sent} record(s) to {args.topic} were not acknowledged: "
            f"{outcomes.first_error}"
        )
    if args.verbose:
        print(f"kctl: produced {outcomes.acked} record(s) to {args.topic} (acks={config['acks']})", file=sys.stderr)
    return 0


# --- consume -------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordFormat:
    """Kafka's DefaultMessageFormatter settings."""

    print_key: bool = False
    print_value: bool = True
    print_offset: bool = False
    print_partition: bool = False
    print_timestamp: bool = False
    print_headers: bool = False
    key_separator: str = "\t"
    line_separator: str = "\n"

    FLAGS = ("print.key", "print.value", "print.offset", "print.partition", "print.timestamp", "print.headers")

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> RecordFormat:
        unknown = set(props) - {*cls.FLAGS, "key.separator", "line.separator"}
        if unknown:
            known = ", ".join((*cls.FLAGS, "key.separator", "line.separator"))
            raise UsageError(f"unknown --property for consume: {', '.join(sorted(unknown))} (known: {known})")
        flags = {name.replace(".", "_"): parse_bool(props[name], name) for name in cls.FLAGS if name in props}
        return cls(
            **flags,
            key_separator=_unescape(props.get("key.separator", "\t")),
            line_separator=_unescape(props.get("line.separator", "\n")),
        )

    def format(self, r: ConsumerRecord) -> str:
        fields: list[str] = []
        if self.print_timestamp:
            kind = TIMESTAMP_TYPES.get(r.timestamp_type)
            fields.append(f"{kind}:{r.timestamp}" if kind else "NO_TIMESTAMP")
        if self.print_partition:
            fields.append(f"Partition:{r.partition}")
        if self.print_offset:
            fields.append(f"Offset:{r.offset}")
        if self.print_headers:
            fields.append(",".join(f"{k}:{_text(v)}" for k, v in r.headers) if r.headers else "NO_HEADERS")
        if self.print_key:
            fields.append(_text(r.key))
        if self.print_value:
            fields.append(_text(r.value))
        return self.key_separator.join(fields) + self.line_separator


def _text(data: bytes | None) -> str:
    return "null" if data is None else data.decode("utf-8", errors="replace")


def _start(offset: str | None) -> int | str | None:
    if offset is None or offset in ("earliest", "latest"):
        return offset
    if offset.isdigit():
        return int(offset)
    raise UsageError(f"--offset must be a non-negative number, earliest or latest, got {offset!r}")


def consumer_config(args: argparse.Namespace) -> dict[str, Any]:
    """The Consumer's keyword arguments: --command-config, then --consumer-property, then
    the group and where to start."""

    props = client_config(args.consumer_property, "--consumer-property", Consumer.DEFAULT_CONFIG)
    config = {**client_configs(args), **props}
    config.pop("bootstrap_servers", None)
    if args.group is not None:
        config["group_id"] = args.group
    elif args.include is not None:
        config["group_id"] = f"console-consumer-{random.randint(10000, 99999)}"  # Kafka's throwaway group
    if "auto_offset_reset" not in props:
        config["auto_offset_reset"] = "earliest" if args.from_beginning else "latest"
    config["enable_auto_commit"] = False  # --group commits what it printed, itself
    return config


def consume_records(args: argparse.Namespace) -> int:
    bootstrap = _bootstrap(args, "consume")
    fmt = RecordFormat.from_properties(parse_key_values(args.property, "--property"))
    start = _start(args.offset)
    if start is not None and args.partition is None:
        raise UsageError("--offset needs --partition")
    if start is not None and args.from_beginning:
        raise UsageError("--from-beginning and --offset cannot be used together")
    if args.include is not None and args.partition is not None:
        raise UsageError("--partition needs --topic, not --include")
    if args.include is not None:
        try:
            re.compile(args.include)
        except re.error as exc:
            raise UsageError(f"--include {args.include!r} is not a regular expression: {exc}") from None
    if args.group is not None and not args.group.strip():
        raise UsageError("--group is empty")
    if args.max_messages is not None and args.max_messages < 1:
        raise UsageError(f"--max-messages must be at least 1, got {args.max_messages}")
    if args.timeout_ms is not None and args.timeout_ms < 0:
        raise UsageError(f"--timeout-ms must be >= 0, got {args.timeout_ms}")
    config = consumer_config(args)
    try:
        with _interrupt_stops() as stop:
            count = _consume(args, bootstrap, fmt, start, config, stop)
    except KeyboardInterrupt:  # a second Ctrl-C, or one before the loop began
        return 0
    if args.verbose:
        print(f"kctl: processed a total of {count} message(s)", file=sys.stderr)
    return 0


def _place(args: argparse.Namespace, consumer: Consumer, bootstrap: str, start: int | str | None) -> None:
    """Subscribe (a group member) or assign the partitions asked for."""
    if args.include is not None:
        consumer.subscribe(pattern=args.include)
        return
    topic = args.topic
    partitions = require_topic(bootstrap, topic, client_configs(args))
    if args.partition is not None and args.partition not in partitions:
        raise UnknownTopicOrPartitionError(
            f"topic {topic!r} has no partition {args.partition} (it has {len(partitions)})"
        )
    if args.group is not None and args.partition is None:
        consumer.subscribe([topic])
        return
    found = consumer.partitions_for_topic(topic)
    if not found:
        raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
    tps = [TopicPartition(topic, p) for p in sorted(found) if args.partition in (None, p)]
    consumer.assign(tps)
    if start == "earliest":
        consumer.seek_to_beginning(*tps)
    elif start == "latest":
        consumer.seek_to_end(*tps)
    elif isinstance(start, int):
        consumer.seek(tps[0], start)


@contextmanager
def _interrupt_stops() -> Iterator[threading.Event]:
    """Ctrl-C (SIGINT) sets the event instead of raising KeyboardInterrupt wherever the
    main thread happens to be (inside the client, holding one of its locks, the consumer
    could not close after it); the poll loop sees it within POLL_MS and the consumer
    closes normally. A second Ctrl-C raises as usual. Outside the main thread: as is."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_interrupt(signum: int, frame: object) -> None:
        stop.set()
        signal.signal(signal.SIGINT, previous)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _consume(
    args: argparse.Namespace,
    bootstrap: str,
    fmt: RecordFormat,
    start: int | str | None,
    config: dict[str, Any],
    stop: threading.Event,
) -> int:
    out = sys.stdout.buffer
    count = 0
    commits = args.group is not None
    consumer = Consumer(bootstrap_servers=bootstrap, **config)
    try:
        _place(args, consumer, bootstrap, start)
        timeout_s = None if args.timeout_ms is None else args.timeout_ms / 1000.0
        idle_since = time.monotonic()
        while (args.max_messages is None or count < args.max_messages) and not stop.is_set():
            wait_ms = POLL_MS
            if timeout_s is not None:
                left_ms = int((idle_since + timeout_s - time.monotonic()) * 1000)
                if left_ms <= 0:
                    break
                wait_ms = max(1, min(POLL_MS, left_ms))
            left = None if args.max_messages is None else args.max_messages - count
            batch = consumer.poll(timeout_ms=wait_ms, max_records=left)
            if not batch:
                continue
            idle_since = time.monotonic()
            for records in batch.values():
                for r in records:
                    out.write(fmt.format(r).encode("utf-8", errors="replace"))
                    count += 1
            out.flush()
            if commits:
                consumer.commit()  # exactly what was printed: positions advance over returned records only
    finally:
        consumer.close(autocommit=False)
    return count
