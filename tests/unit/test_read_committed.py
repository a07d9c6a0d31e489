"""drop_aborted: a read_committed consumer's batch filter (Java's CompletedFetch).

Logs are built with kclient.records' builder (data batches with encode_batch, markers
with build_control_batch), filtered with the aborted transactions a broker would answer,
and decoded by every codec implementation: only non-transactional records and the
records of committed transactions remain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kclient import records as rec
from kclient.errors import CorruptRecordError
from kclient.records import (
    CRC_OFFSET,
    Compression,
    build_control_batch,
    drop_aborted,
    encode_batch,
    iter_headers,
)
from kclient.records.compression import available
from kclient.structs import AbortedTransaction

IMPLS = list(rec.implementations().values())
CODECS = [c for c in (Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD)
          if available(c)]  # fmt: skip


@dataclass
class Log:
    """A partition's log, batch by batch, with the aborted transactions a broker would index."""

    data: bytearray = field(default_factory=bytearray)
    next_offset: int = 0
    open_txns: dict[int, int] = field(default_factory=dict)  # producer id -> first offset
    aborted: list[AbortedTransaction] = field(default_factory=list)
    shown: list[tuple[int, bytes]] = field(default_factory=list)  # (offset, value) read_committed must see
    pending: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)  # an open transaction's
    batch_ends: list[int] = field(default_factory=list)  # byte position after each batch

    def append(
        self,
        pid: int,
        values: Sequence[bytes],
        *,
        transactional: bool = True,
        compression: Compression = Compression.NONE,
    ) -> None:
        """A data batch of ``pid`` (-1: no producer id), in its open transaction if transactional."""
        self.data += encode_batch(
            list(values),
            base_timestamp=1_000 + self.next_offset,
            producer_id=pid,
            producer_epoch=0 if pid >= 0 else -1,
            is_transactional=transactional,
            compression=compression,
            base_offset=self.next_offset,
        )
        records = [(self.next_offset + i, v) for i, v in enumerate(values)]
        if transactional:
            self.open_txns.setdefault(pid, self.next_offset)
            self.pending.setdefault(pid, []).extend(records)
        else:
            self.shown.extend(records)
        self.next_offset += len(values)
        self.batch_ends.append(len(self.data))

    def end(self, pid: int, commit: bool) -> None:
        """The marker that ends ``pid``'s open transaction."""
        first = self.open_txns.pop(pid)
        records = self.pending.pop(pid)
        if commit:
            self.shown.extend(records)
        else:
            self.aborted.append(AbortedTransaction(pid, first))
        self.data += build_control_batch(pid, 0, commit, 1, base_offset=self.next_offset, timestamp_ms=1)
        self.next_offset += 1
        self.batch_ends.append(len(self.data))

    @property
    def visible(self) -> list[bytes]:
        """What a read_committed consumer must see: its values in offset order."""
        return [v for _, v in sorted(self.shown)]


def values(buf: bytes | bytearray | memoryview) -> list[bytes | None]:
    """The values of every record of ``buf`` as the consumer's poll decodes them."""
    return [r.value for r in rec.decode_consumer_records(buf, "t", 0)]


def kept_offsets(buf: bytes | bytearray | memoryview) -> list[int]:
    return [h.base_offset for _, h in iter_headers(buf)]


# --- nothing to drop: the same object, no copy ---------------------------------------


def test_no_aborted_transactions_returns_the_same_object() -> None:
    log = Log()
    log.append(7, [b"a", b"b"])
    log.end(7, commit=False)
    data = bytes(log.data)
    assert drop_aborted(data, []) is data
    view = memoryview(data)
    assert drop_aborted(view, ()) is view


def test_nothing_dropped_returns_the_same_object() -> None:
    log = Log()
    log.append(1, [b"a"])
    log.end(1, commit=True)
    log.append(-1, [b"plain"], transactional=False)
    data = bytes(log.data)
    # An aborted transaction of a producer with no batch here, and one past the data.
    assert drop_aborted(data, [AbortedTransaction(99, 0), AbortedTransaction(1, 500)]) is data


def test_empty_records() -> None:
    assert drop_aborted(b"", [AbortedTransaction(1, 0)]) == b""


# --- the rules -----------------------------------------------------------------------


def test_interleaved_producers_aborted_and_committed() -> None:
    log = Log()
    log.append(1, [b"1a"])
    log.append(2, [b"2a"])
    log.append(-1, [b"plain1"], transactional=False)
    log.append(1, [b"1b", b"1c"])
    log.append(2, [b"2b"])
    log.end(1, commit=False)
    log.append(3, [b"3a"])
    log.end(2, commit=True)
    log.append(1, [b"1d"])  # pid 1's next transaction, committed
    log.end(3, commit=False)
    log.end(1, commit=True)
    out = drop_aborted(bytes(log.data), log.aborted)
    assert values(out) == [b"2a", b"plain1", b"2b", b"1d"]
    assert values(out) == log.visible
    # read_uncommitted (no filter) sees everything
    assert values(bytes(log.data)) == [b"1a", b"2a", b"plain1", b"1b", b"1c", b"2b", b"3a", b"1d"]


def test_control_batches_are_kept_so_the_position_moves_past_them() -> None:
    log = Log()
    log.append(1, [b"x", b"y"])
    log.end(1, commit=False)
    out = drop_aborted(bytes(log.data), log.aborted)
    headers = [h for _, h in iter_headers(out)]
    assert [(h.base_offset, h.is_control) for h in headers] == [(2, True)]
    assert values(out) == []


def test_non_transactional_batches_of_an_aborted_producer_are_kept() -> None:
    # An idempotent (not transactional) batch with the aborted producer's id, inside
    # its aborted transaction's range: only transactional batches are dropped.
    log = Log()
    log.append(5, [b"t1"])
    log.append(5, [b"idem"], transactional=False)
    log.append(5, [b"t2"])
    log.end(5, commit=False)
    assert values(drop_aborted(bytes(log.data), log.aborted)) == [b"idem"]


def test_a_producers_committed_transaction_before_its_aborted_one_is_kept() -> None:
    log = Log()
    log.append(4, [b"c1", b"c2"])
    log.end(4, commit=True)
    log.append(4, [b"a1"])
    log.append(4, [b"a2"])
    log.end(4, commit=False)
    log.append(4, [b"c3"])
    log.end(4, commit=True)
    assert log.aborted == [AbortedTransaction(4, 3)]
    assert values(drop_aborted(bytes(log.data), log.aborted)) == [b"c1", b"c2", b"c3"]


def test_two_aborted_transactions_of_one_producer() -> None:
    log = Log()
    log.append(4, [b"a1"])
    log.end(4, commit=False)
    log.append(4, [b"c1"])
    log.end(4, commit=True)
    log.append(4, [b"a2"])
    log.end(4, commit=False)
    assert values(drop_aborted(bytes(log.data), log.aborted)) == [b"c1"]


def test_the_aborted_list_in_any_order() -> None:
    log = Log()
    log.append(1, [b"1"])
    log.append(2, [b"2"])
    log.end(2, commit=False)
    log.append(3, [b"3"])
    log.end(1, commit=False)
    log.end(3, commit=True)
    assert values(drop_aborted(bytes(log.data), list(reversed(log.aborted)))) == [b"3"]


def test_abort_marker_without_its_producer_listed_changes_nothing() -> None:
    log = Log()
    log.append(1, [b"a"])
    log.end(1, commit=False)
    log.append(2, [b"b"])
    log.end(2, commit=False)
    data = bytes(log.data)
    # only pid 2's transaction listed (pid 1's lies before the fetch range, say)
    assert values(drop_aborted(data, [AbortedTransaction(2, 2)])) == [b"a"]


def test_a_commit_marker_does_not_end_an_aborted_transaction() -> None:
    # A (malformed) COMMIT marker of an aborted-open producer does not reopen its batches.
    data = (
        encode_batch([b"a"], producer_id=1, is_transactional=True, base_offset=0, base_timestamp=0)
        + build_control_batch(1, 0, True, 0, base_offset=1, timestamp_ms=0)
        + encode_batch([b"b"], producer_id=1, is_transactional=True, base_offset=2, base_timestamp=0)
        + build_control_batch(1, 0, False, 0, base_offset=3, timestamp_ms=0)
    )
    assert values(drop_aborted(data, [AbortedTransaction(1, 0)])) == []


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_batches(codec: Compression) -> None:
    log = Log()
    log.append(1, [b"a%d" % i for i in range(50)], compression=codec)
    log.append(2, [b"b%d" % i for i in range(50)], compression=codec)
    log.append(-1, [b"p%d" % i for i in range(5)], transactional=False, compression=codec)
    log.end(1, commit=False)
    log.end(2, commit=True)
    out = drop_aborted(bytes(log.data), log.aborted)
    assert values(out) == [b"b%d" % i for i in range(50)] + [b"p%d" % i for i in range(5)]


def test_a_transaction_spanning_two_fetches() -> None:
    # Fetch 1 ends before the ABORT marker; fetch 2 starts inside the transaction and
    # the broker lists the same aborted transaction again (its first offset is before
    # fetch 2's start): both fetches drop its batches.
    log = Log()
    log.append(1, [b"a1", b"a2"])  # 0-1
    log.append(2, [b"c1"])  # 2
    log.append(1, [b"a3"])  # 3
    cut = len(log.data)
    log.append(1, [b"a4"])  # 4
    log.append(-1, [b"plain"], transactional=False)  # 5
    log.end(1, commit=False)  # 6
    log.end(2, commit=True)  # 7
    log.append(1, [b"n1"])  # 8: the next transaction
    log.end(1, commit=True)  # 9
    first, second = bytes(log.data[:cut]), bytes(log.data[cut:])
    aborted = [AbortedTransaction(1, 0)]
    assert values(drop_aborted(first, aborted)) == [b"c1"]
    assert values(drop_aborted(second, aborted)) == [b"plain", b"n1"]
    assert kept_offsets(drop_aborted(second, aborted)) == [5, 6, 7, 8, 9]


def test_incomplete_tail_is_kept() -> None:
    log = Log()
    log.append(1, [b"a"])
    log.append(2, [b"b"])
    log.end(1, commit=False)
    whole = bytes(log.data)
    tail = encode_batch([b"t"], producer_id=1, is_transactional=True, base_offset=3, base_timestamp=0)[:30]
    out = drop_aborted(whole + tail, log.aborted)
    assert bytes(out).endswith(tail)
    assert values(out) == [b"b"]


def test_a_corrupt_batch_to_drop_is_kept_for_the_decoder_to_raise() -> None:
    log = Log()
    log.append(1, [b"a"])
    log.append(2, [b"b"])
    log.end(1, commit=False)
    data = bytearray(log.data)
    data[CRC_OFFSET] ^= 0xFF  # pid 1's batch at position 0
    out = drop_aborted(bytes(data), log.aborted)
    assert bytes(out) == bytes(data)
    with pytest.raises(CorruptRecordError):
        values(out)


def test_an_unwalkable_header_keeps_the_rest() -> None:
    log = Log()
    log.append(1, [b"a"])
    log.end(1, commit=False)
    good = bytes(log.data)
    bad = bytearray(encode_batch([b"z"], producer_id=1, is_transactional=True, base_offset=2, base_timestamp=0))
    bad[8:12] = (3).to_bytes(4, "big")  # batchLength below the minimum
    out = drop_aborted(good[: log.batch_ends[0]] + bytes(bad) + good[log.batch_ends[0] :], log.aborted)
    # the aborted batch before it is dropped, everything from the bad header kept
    assert bytes(out) == bytes(bad) + good[log.batch_ends[0] :]


@pytest.mark.parametrize("impl", IMPLS, ids=lambda i: i.name)
def test_every_decoder_gets_the_filter(impl: rec.CodecAPI) -> None:
    log = Log()
    log.append(1, [b"a1", b"a2"], compression=Compression.GZIP)
    log.append(2, [b"c1"])
    log.end(1, commit=False)
    log.append(-1, [b"p"], transactional=False)
    log.end(2, commit=True)
    out = drop_aborted(bytes(log.data), log.aborted)
    assert [r.value for r in impl.decode_consumer_records(out, "t", 0)] == [b"c1", b"p"]
    cols = impl.decode_columns(out)
    assert (cols.offsets, cols.values) == ([2, 4], [b"c1", b"p"])
    buffers = impl.decode_buffers(out)
    assert list(buffers.offsets) == [2, 4]


# --- a model: any interleaving, any cut into fetches ----------------------------------

events = st.lists(
    st.one_of(
        st.tuples(st.just("data"), st.integers(0, 3), st.integers(1, 3), st.sampled_from(CODECS), st.booleans()),
        st.tuples(st.just("end"), st.integers(0, 3), st.booleans()),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=events, cuts=st.lists(st.integers(0, 60), max_size=4))
def test_model(events: list[tuple[Any, ...]], cuts: list[int]) -> None:
    """Random producers (0-3, or no producer id), transactions ended by COMMIT or ABORT,
    cut into fetches at batch boundaries: read_committed sees exactly the
    non-transactional records and the committed transactions' records, in log order."""
    log = Log()
    n = 0
    for event in events:
        if event[0] == "data":
            _, pid, count, codec, transactional = event
            pid = pid if pid else -1
            transactional = transactional and pid >= 0
            if pid >= 0 and not transactional and pid in log.open_txns:
                transactional = True  # a transactional producer writes nothing else meanwhile
            log.append(pid, [b"v%d" % (n + i) for i in range(count)], transactional=transactional, compression=codec)
            n += count
        else:
            _, pid, commit = event
            if pid in log.open_txns:
                log.end(pid, commit)
    for pid in list(log.open_txns):  # read_committed stops at the LSO: end them all
        log.end(pid, commit=False)
    data = bytes(log.data)
    bounds = sorted({0, len(data), *(log.batch_ends[c % len(log.batch_ends)] for c in cuts if log.batch_ends)})
    got: list[bytes | None] = []
    for lo, hi in pairwise(bounds):
        part = data[lo:hi]
        first = next(iter_headers(part))[1].base_offset
        last = first
        for _, h in iter_headers(part):
            last = h.last_offset
        # The broker lists the aborted transactions overlapping the fetched range.
        listed = [t for t in log.aborted if t.first_offset <= last and _abort_offset(log, t) >= first]
        got += values(drop_aborted(part, listed))
    assert got == log.visible


def _abort_offset(log: Log, txn: AbortedTransaction) -> int:
    """The offset of the ABORT marker that ended ``txn``."""
    for _, h in iter_headers(bytes(log.data)):
        if h.is_control and h.producer_id == txn.producer_id and h.base_offset > txn.first_offset:
            return h.base_offset
    raise AssertionError(txn)
