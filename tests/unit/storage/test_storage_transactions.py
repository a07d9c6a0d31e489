"""Transactions in a partition log: open transactions, markers, the first unstable offset,
the aborted-transaction index (.txnindex) and its rebuild by recovery."""

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_testutil import crash, small_config

from kbroker.storage import files
from kbroker.storage.cleaner import Cleaner, first_uncleanable_offset
from kbroker.storage.log import Log
from kbroker.storage.offset_map import OffsetMap
from kbroker.storage.txn_index import ENTRY_SIZE, AbortedTxn, TransactionIndex
from kclient.errors import InvalidProducerEpochError, InvalidTxnStateError
from kclient.records import BatchBuilder, BatchHeader, build_control_batch, decode_batches, iter_headers

CONFIG = small_config(segment_bytes=1000)
NOW = int(time.time() * 1000)
"""Record timestamps (markers are stamped now: older records would roll segments by time)."""


def txn_batch(pid: int, seq: int, count: int = 1, epoch: int = 0, *, transactional: bool = True) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=transactional)
    for i in range(count):
        builder.append(NOW + i, None, f"p{pid}-{seq + i}".encode().ljust(20, b"."))
    return builder.build()


def plain_batch(count: int = 1) -> bytes:
    builder = BatchBuilder()
    for i in range(count):
        builder.append(NOW + i, None, b"plain".ljust(20, b"."))
    return builder.build()


def all_headers(log: Log) -> list[BatchHeader]:
    """Every batch header of the log, segment after segment."""
    out: list[BatchHeader] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        headers = [h for _, h in iter_headers(data.records)]
        out += headers
        offset = max(data.next_offset, headers[-1].last_offset + 1 if headers else offset + 1)
    return out


def marker(log: Log, pid: int, *, commit: bool, epoch: int = 0) -> int:
    return log.append_marker(pid, epoch, commit=commit, coordinator_epoch=0, leader_epoch=0).first_offset


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    log = Log.open(tmp_path / "topic-0", CONFIG)
    yield log
    log.close()


def test_a_transaction_is_unstable_until_its_marker_is_below_the_high_watermark(log: Log) -> None:
    log.append_as_leader(plain_batch(2), 0)  # 0..1
    first = log.append_as_leader(txn_batch(7, 0, 3), 0).first_offset  # 2..4
    assert first == 2
    assert log.first_unstable_offset(5) == 2
    assert log.producer_state.ongoing_transactions == {7: 2}
    end = marker(log, 7, commit=True)  # 5
    assert end == 5
    assert log.producer_state.ongoing_transactions == {}
    # Closed, but the marker is not replicated yet: still unstable below the HW.
    assert log.first_unstable_offset(5) == 2
    assert log.first_unstable_offset(6) is None
    assert log.first_unstable_offset(6) is None  # the closed one is forgotten
    assert log.collect_aborted_transactions(0, 6) == []  # a commit indexes nothing


def test_an_abort_goes_into_the_segment_index_with_the_last_stable_offset(log: Log) -> None:
    log.append_as_leader(txn_batch(1, 0), 0)  # 0: producer 1 opens
    log.append_as_leader(txn_batch(2, 0, 2), 0)  # 1..2: producer 2 opens
    log.append_as_leader(txn_batch(1, 1), 0)  # 3
    aborted_at = marker(log, 1, commit=False)  # 4
    # Producer 2's transaction (from 1) is still open: that is the LSO once 1's closed.
    assert log.collect_aborted_transactions(0, 5) == [AbortedTxn(1, 0, aborted_at, 1)]
    assert log.collect_aborted_transactions(aborted_at + 1, 10) == []
    assert log.collect_aborted_transactions(0, 0) == []  # nothing read: nothing overlaps
    index = files.txn_index_file(log.dir, 0)
    assert index.stat().st_size == ENTRY_SIZE
    assert log.first_unstable_offset(10) == 1
    marker(log, 2, commit=False)  # 5
    assert [t.producer_id for t in log.collect_aborted_transactions(0, 10)] == [1, 2]
    assert log.collect_aborted_transactions(0, 10)[1] == AbortedTxn(2, 1, 5, 6)


def test_the_search_for_aborted_transactions_spans_segments_until_complete(log: Log) -> None:
    log.append_as_leader(txn_batch(1, 0, 10), 0)
    for seq in range(10, 50, 10):  # several segments of producer 1's transaction
        log.append_as_leader(txn_batch(1, seq, 10), 0)
    log.roll()
    abort = marker(log, 1, commit=False)
    assert log.num_segments > 2
    # A read of the first segment learns of the abort recorded in a later one.
    assert log.collect_aborted_transactions(0, 10) == [AbortedTxn(1, 0, abort, abort + 1)]


def test_a_producer_with_an_open_transaction_writes_only_transactional_batches(log: Log) -> None:
    log.append_as_leader(txn_batch(3, 0), 0)
    with pytest.raises(InvalidTxnStateError):
        log.append_as_leader(txn_batch(3, 1, transactional=False), 0)
    marker(log, 3, commit=True)
    log.append_as_leader(txn_batch(3, 1, transactional=False), 0)  # after the marker: fine


def test_a_marker_with_a_newer_epoch_fences_the_old_producer(log: Log) -> None:
    log.append_as_leader(txn_batch(4, 0, epoch=0), 0)
    marker(log, 4, commit=False, epoch=1)  # the coordinator bumped the epoch to abort it
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(txn_batch(4, 1, epoch=0), 0)  # the zombie
    with pytest.raises(InvalidProducerEpochError):
        marker(log, 4, commit=True, epoch=0)  # an older marker
    log.append_as_leader(txn_batch(4, 0, epoch=2), 0)  # the new producer, from sequence 0


def test_a_follower_closes_transactions_from_the_markers_it_fetches(log: Log, tmp_path: Path) -> None:
    log.append_as_leader(txn_batch(5, 0, 2), 0)
    marker(log, 5, commit=False)
    data = log.read(0, 1 << 20).records
    follower = Log.open(tmp_path / "follower-0", CONFIG)
    try:
        follower.append_as_follower(data)
        assert follower.producer_state.ongoing_transactions == {}
        assert follower.collect_aborted_transactions(0, 3) == log.collect_aborted_transactions(0, 3)
        assert [h.is_control for _, h in iter_headers(data)] == [False, True]
    finally:
        follower.close()


def test_an_open_transaction_survives_a_clean_restart(log: Log, tmp_path: Path) -> None:
    log.append_as_leader(plain_batch(), 0)
    log.append_as_leader(txn_batch(6, 0), 0)  # 1
    log.flush()
    log.close()
    reopened = Log.open(log.dir, CONFIG, clean_shutdown=True)
    try:
        assert reopened.producer_state.ongoing_transactions == {6: 1}
        assert reopened.first_unstable_offset(2) == 1
        marker(reopened, 6, commit=False)
        assert reopened.collect_aborted_transactions(0, 3) == [AbortedTxn(6, 1, 2, 3)]
    finally:
        reopened.close()


def test_recovery_rebuilds_the_aborted_transaction_index(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "topic-0", CONFIG)
    log.append_as_leader(txn_batch(1, 0, 5), 0)
    log.roll()
    log.flush()  # the recovery point is past the first segment
    log.append_as_leader(txn_batch(2, 0, 5), 0)
    marker(log, 1, commit=False)
    log.append_as_leader(txn_batch(2, 5, 5), 0)
    marker(log, 2, commit=False)
    expected = log.collect_aborted_transactions(0, 100)
    assert len(expected) == 2
    recovery_point = log.recovery_point
    crash(log)
    for path in log.dir.glob("*.txnindex"):
        path.unlink()  # lost with the page cache
    reopened = Log.open(log.dir, CONFIG, recovery_point=recovery_point)
    try:
        assert reopened.collect_aborted_transactions(0, 100) == expected
        assert reopened.producer_state.ongoing_transactions == {}
    finally:
        reopened.close()


def test_truncation_forgets_aborted_transactions_and_reopens_the_transaction(log: Log) -> None:
    log.append_as_leader(txn_batch(8, 0, 2), 0)  # 0..1
    abort = marker(log, 8, commit=False)  # 2
    assert log.collect_aborted_transactions(0, 3)
    log.truncate_to(abort)
    assert log.collect_aborted_transactions(0, 3) == []
    assert not files.txn_index_file(log.dir, 0).exists()
    assert log.producer_state.ongoing_transactions == {8: 0}


def test_the_index_file_ignores_a_torn_tail_and_keeps_kafkas_layout(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    index = TransactionIndex(path)
    index.append(AbortedTxn(9, 10, 20, 21))
    index.close()
    data = path.read_bytes()
    assert data == (0).to_bytes(2, "big") + b"".join(v.to_bytes(8, "big") for v in (9, 10, 20, 21))
    path.write_bytes(data + b"\x00\x00\x01")
    assert TransactionIndex(path).entries == [AbortedTxn(9, 10, 20, 21)]
    assert path.stat().st_size == ENTRY_SIZE


def test_control_batches_are_refused_from_clients(log: Log) -> None:
    from kclient.errors import InvalidRecordError

    with pytest.raises(InvalidRecordError):
        log.append_as_leader(build_control_batch(1, 0, True, 0), 0)


# --- compaction and retention over transactions -------------------------------------------


def keyed_txn(pid: int, seq: int, items: list[tuple[str, str]], epoch: int = 0) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=True)
    for i, (key, value) in enumerate(items):
        builder.append(NOW + i, key.encode(), value.encode())
    return builder.build()


def test_compaction_keeps_every_committed_keys_latest_value_and_drops_aborted_data(tmp_path: Path) -> None:
    config = small_config(
        segment_bytes=600, cleanup_policy="compact", min_cleanable_dirty_ratio=0.01, file_delete_delay_ms=0
    )
    log = Log.open(tmp_path / "compact-0", config)
    try:
        log.append_as_leader(keyed_txn(1, 0, [("k1", "committed-1"), ("k2", "committed-2")]), 0)
        marker(log, 1, commit=True)
        log.append_as_leader(keyed_txn(1, 2, [("k1", "aborted-1"), ("k3", "aborted-3")]), 0)
        marker(log, 1, commit=False)
        log.append_as_leader(keyed_txn(2, 0, [("k2", "open-2")]), 0)  # undecided: not cleanable
        for i in range(20):  # enough to fill segments past the transactions
            log.append_as_leader(keyed_txn(3, i, [(f"other{i}", "x")]), 0)
            marker(log, 3, commit=True)
        log.roll()
        upper = first_uncleanable_offset(log, NOW + 10**9)
        assert upper == 6  # the first offset of producer 2's open transaction
        cleaner = Cleaner(OffsetMap(1 << 20), pause=lambda *a: None)
        cleaner.clean(log, 0, upper, NOW + 10**9)
        data = log.read(0, 1 << 20, max_offset=upper).records
        batches = list(iter_headers(data))
        values: dict[bytes | None, bytes | None] = {}
        for header, records in decode_batches(data):
            if not header.is_control:
                values.update((r.key, r.value) for r in records)
        assert values[b"k1"] == b"committed-1"  # the aborted later value did not win
        assert b"k3" not in values  # aborted data is gone
        assert values[b"k2"] == b"committed-2"
        assert [h.base_offset for _, h in batches if h.is_control] == [2, 5]  # markers stay, for now
        assert log.collect_aborted_transactions(0, 6) == [AbortedTxn(1, 3, 5, 6)]  # the index moved with the data
        # After delete.retention.ms, the ABORT marker (its data is gone) goes, and its
        # index entry with it; the COMMIT marker of a transaction with kept records stays.
        later = NOW + 10**9 + config.delete_retention_ms + 1
        cleaner.clean(log, 0, first_uncleanable_offset(log, later), later, recopy=True)
        data = log.read(0, 1 << 20, max_offset=upper).records
        assert [h.base_offset for _, h in iter_headers(data) if h.is_control] == [2]
        assert log.collect_aborted_transactions(0, 6) == []
    finally:
        log.close()


def test_retention_keeps_an_undecided_transaction(tmp_path: Path) -> None:
    config = small_config(segment_bytes=300, retention_ms=1, file_delete_delay_ms=0)
    log = Log.open(tmp_path / "retain-0", config)
    try:
        log.append_as_leader(txn_batch(1, 0, 3), 0)  # open: its segment must stay
        for _ in range(10):
            log.append_as_leader(plain_batch(), 0)
        log.roll()
        assert log.num_segments > 2
        log.delete_old_segments(NOW + 10**9, high_watermark=log.log_end_offset)
        assert log.log_start_offset == 0
        marker(log, 1, commit=True)
        log.roll()
        log.delete_old_segments(NOW + 10**9, high_watermark=log.log_end_offset)
        assert log.log_start_offset > 0
    finally:
        log.close()


def test_moving_the_log_start_keeps_a_producer_whose_transaction_is_open(log: Log) -> None:
    log.append_as_leader(txn_batch(9, 0, 3), 0)  # 0..2, open
    log.append_as_leader(plain_batch(), 0)  # 3
    log.maybe_increment_log_start_offset(3)  # DeleteRecords right after a commit, before its marker
    assert log.producer_state.ongoing_transactions == {9: 0}
    marker(log, 9, commit=True)
    log.append_as_leader(txn_batch(9, 3), 0)  # its next transaction goes on from sequence 3


def test_a_producer_known_only_by_a_marker_takes_any_sequence_of_its_epoch(log: Log) -> None:
    marker(log, 11, commit=False, epoch=2)  # its batches were deleted before the marker came
    log.append_as_leader(txn_batch(11, 40, epoch=2), 0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(txn_batch(11, 41, epoch=1), 0)


def test_a_commit_marker_goes_once_every_record_of_its_transaction_was_superseded(tmp_path: Path) -> None:
    config = small_config(
        segment_bytes=600, cleanup_policy="compact", min_cleanable_dirty_ratio=0.01, file_delete_delay_ms=0
    )
    log = Log.open(tmp_path / "superseded-0", config)
    try:
        log.append_as_leader(keyed_txn(4, 0, [("k", "old")]), 0)  # 0
        marker(log, 4, commit=True)  # 1
        for i in range(12):
            log.append_as_leader(keyed_txn(5, i, [("k", f"new{i}")]), 0)  # supersedes producer 4's record
            marker(log, 5, commit=True)
        log.roll()
        cleaner = Cleaner(OffsetMap(1 << 20), pause=lambda *a: None)
        for now in (NOW + 10**9, NOW + 10**9 + config.delete_retention_ms + 1):
            cleaner.clean(log, 0, first_uncleanable_offset(log, now), now, recopy=True)
        kept = [(h.producer_id, h.is_control, h.record_count) for h in all_headers(log)]
        assert (4, True, 1) not in kept  # its transaction has nothing left: the marker went too
        assert (4, False, 0) in kept  # its last batch stays, empty (the producer state needs it)
        assert kept[-2:] == [(5, False, 1), (5, True, 1)]  # the live record's transaction keeps its marker
    finally:
        log.close()
