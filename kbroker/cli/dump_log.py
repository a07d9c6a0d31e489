"""``kctl dump-log --files a.log[,b.index,...]``: kafka-dump-log.sh over kbroker's segment files.

Reads the files directly (no broker, no connection flags; read-only). A segment's
``.log`` is a sequence of Kafka v2 record batches (decoded with :mod:`kclient.records`),
its ``.index`` 8-byte entries ``relative offset int32 | position int32`` and its
``.timeindex`` 12-byte entries ``timestamp int64 | relative offset int32``, the base
offset being the file name's 20 digits. Output, as Kafka 2.8 prints it::

    Dumping 00000000000000000000.log
    Starting offset: 0
    baseOffset: 0 lastOffset: 2 count: 3 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1
      partitionLeaderEpoch: 0 isTransactional: false isControl: false position: 0 CreateTime: 1700000000000
      size: 99 magic: 2 compresscodec: NONE crc: 2913232187 isvalid: true      (one line per batch)
    | offset: 0 CreateTime: 1700000000000 keySize: 1 valueSize: 5 sequence: -1 headerKeys: [h]
      key: k payload: hello                     (one line per record, with --deep-iteration;
                                                 key and payload with --print-data-log)
    Dumping 00000000000000000000.index
    offset: 2 position: 0
    Dumping 00000000000000000000.timeindex
    timestamp: 1700000000000 offset: 2

A ``.log`` with bytes after its last complete batch ends with ``Found N invalid bytes
at the end of NAME``; an index stops at its first zero (unused) entry as Kafka's does.
Any other file is ``Ignoring unknown file NAME``. A missing or unreadable file is one
``kctl:`` line (exit 1).
"""

from __future__ import annotations

import argparse
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kbroker.cli.common import CliError, UsageError
from kbroker.storage import files
from kclient.errors import CorruptRecordError, KafkaError
from kclient.records import NO_SEQUENCE, BatchHeader, Record, TimestampType, check_batch, decode_batch, iter_headers

NOUN = "dump-log"
TIMESTAMP_NAMES = {TimestampType.CREATE_TIME: "CreateTime", TimestampType.LOG_APPEND_TIME: "LogAppendTime"}
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


def add_parser(nouns: argparse._SubParsersAction[Any]) -> None:
    p = nouns.add_parser(
        NOUN,
        help="print segment files (.log, .index, .timeindex) as kafka-dump-log.sh does",
        description="kafka-dump-log.sh for kbroker's segment files: batches, records and index entries. "
        "Reads local files only.",
    )
    p.add_argument("--files", required=True, metavar="FILE[,FILE...]", help="comma-separated .log/.index/.timeindex")
    p.add_argument("--print-data-log", action="store_true", help="print each record's key and payload")
    p.add_argument("--deep-iteration", action="store_true", help="print every record, not just the batches")
    p.set_defaults(handler=dump)


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def batch_line(h: BatchHeader, position: int, valid: bool) -> str:
    count = h.record_count
    return (
        f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {count} "
        f"baseSequence: {h.base_sequence} lastSequence: {h.last_sequence} producerId: {h.producer_id} "
        f"producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch} "
        f"isTransactional: {_bool(h.is_transactional)} isControl: {_bool(h.is_control)} position: {position} "
        f"{TIMESTAMP_NAMES[h.timestamp_type]}: {h.max_timestamp} size: {h.size} magic: {h.magic} "
        f"compresscodec: {h.compression.name} crc: {h.crc} isvalid: {_bool(valid)}"
    )


def record_line(h: BatchHeader, r: Record, print_data: bool) -> str:
    sequence = NO_SEQUENCE if h.base_sequence == NO_SEQUENCE else h.base_sequence + (r.offset - h.base_offset)
    line = (
        f"| offset: {r.offset} {TIMESTAMP_NAMES[h.timestamp_type]}: {r.timestamp} "
        f"keySize: {-1 if r.key is None else len(r.key)} valueSize: {-1 if r.value is None else len(r.value)} "
        f"sequence: {sequence} headerKeys: [{','.join(k for k, _ in r.headers)}]"
    )
    if print_data:
        if r.key is not None:
            line += f" key: {_text(r.key)}"
        if r.value is not None:
            line += f" payload: {_text(r.value)}"
    return line


def _batches(data: bytes) -> Iterator[tuple[int, BatchHeader]]:
    """Every complete batch; stops (without raising) where the bytes stop being batches."""
    try:
        yield from iter_headers(data)
    except CorruptRecordError:
        return


def dump_log_file(name: str, data: bytes, *, deep: bool, print_data: bool) -> list[str]:
    out = [f"Starting offset: {files.offset_from_filename(name)}"]
    valid_end = 0
    for pos, header in _batches(data):
        valid = True
        try:
            check_batch(data, pos, header)
        except CorruptRecordError:
            valid = False
        out.append(batch_line(header, pos, valid))
        valid_end = pos + header.size
        if deep or print_data:
            try:
                _, records = decode_batch(data, pos, check_crc=False)
            except KafkaError as exc:
                out.append(f"| cannot decode the records of this batch: {exc}")
                continue
            out.extend(record_line(header, r, print_data) for r in records)
    if valid_end != len(data):
        out.append(f"Found {len(data) - valid_end} invalid bytes at the end of {name}")
    return out


def dump_offset_index(name: str, data: bytes) -> list[str]:
    base = files.offset_from_filename(name)
    out = []
    for i, (relative, position) in enumerate(_OFFSET_ENTRY.iter_unpack(data[: len(data) - len(data) % 8])):
        if i > 0 and relative == 0:
            break  # an unused (zero) entry: the end of the index
        out.append(f"offset: {base + relative} position: {position}")
    return out


def dump_time_index(name: str, data: bytes) -> list[str]:
    base = files.offset_from_filename(name)
    out = []
    for i, (timestamp, relative) in enumerate(_TIME_ENTRY.iter_unpack(data[: len(data) - len(data) % 12])):
        if i > 0 and timestamp == 0 and relative == 0:
            break
        out.append(f"timestamp: {timestamp} offset: {base + relative}")
    return out


def dump_file(path: Path, *, deep: bool = False, print_data: bool = False) -> list[str]:
    """kafka-dump-log.sh's lines for one file (``Dumping ...`` first)."""
    name = path.name
    kinds = {files.LOG_SUFFIX: "log", files.INDEX_SUFFIX: "index", files.TIME_INDEX_SUFFIX: "timeindex"}
    kind = kinds.get(path.suffix)
    if kind is None:
        return [f"Ignoring unknown file {path}"]
    try:
        files.offset_from_filename(name)
    except ValueError:
        return [f"Ignoring unknown file {path} (not a segment file name: 20-digit base offset)"]
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    out = [f"Dumping {path}"]
    if kind == "log":
        out.extend(dump_log_file(name, data, deep=deep, print_data=print_data))
    elif kind == "index":
        out.extend(dump_offset_index(name, data))
    else:
        out.extend(dump_time_index(name, data))
    return out


def dump(args: argparse.Namespace) -> int:
    paths = [Path(p.strip()) for p in args.files.split(",") if p.strip()]
    if not paths:
        raise UsageError("--files is empty")
    for path in paths:
        if not path.is_file():
            raise CliError(f"{path}: no such file")
    for path in paths:
        for line in dump_file(path, deep=args.deep_iteration, print_data=args.print_data_log):
            print(line)
    return 0
