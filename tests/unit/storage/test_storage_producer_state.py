"""Idempotent-producer state of a log: duplicates, sequences, epochs, rebuilds."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_testutil import crash, make_batch, read_all, small_config

from kbroker.storage.log import Log
from kbroker.storage.producer_state import (
    MAX_SEQUENCE,
    NUM_BATCHES_TO_RETAIN,
    BatchMetadata,
    ProducerStateManager,
    next_sequence,
    snapshot_file,
)
from kclient.errors import (
    InvalidProducerEpochError,
    InvalidRequestError,
    OutOfOrderSequenceNumberError,
)
from kclient.records import BatchBuilder, iter_headers, read_header

CONFIG = small_config(segment_bytes=1000)


def pbatch(pid: int, seq: int, count: int = 1, epoch: int = 0, tag: str = "v") -> bytes:
    """A batch of ``count`` records from producer ``pid`` starting at sequence ``seq``."""
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for i in range(count):
        builder.append(1_000 + i, None, f"{tag}{i}".encode().ljust(20, b"."))
    return builder.build()


def state_of(log: Log) -> dict[int, tuple[int, list[BatchMetadata]]]:
    return {pid: (e.epoch, list(e.batches)) for pid, e in log.producer_state.producers.items()}


def dir_files(log: Log) -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in sorted(log.dir.iterdir()) if not p.name.endswith(".snapshot")]


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    log = Log.open(tmp_path / "topic-0", CONFIG)
    yield log
    log.close()


# --- sequence arithmetic -------------------------------------------------------------


def test_next_sequence_wraps_at_int32_max() -> None:
    assert next_sequence(0) == 1
    assert next_sequence(MAX_SEQUENCE) == 0
    assert next_sequence(MAX_SEQUENCE - 2, 5) == 2
    # The batch header computes the same last sequence.
    header = read_header(pbatch(1, MAX_SEQUENCE - 2, 5))
    assert header.last_sequence == 1 == next_sequence(MAX_SEQUENCE - 2, 4)


# --- duplicates ----------------------------------------------------------------------


def test_duplicate_returns_original_offsets_and_writes_nothing(log: Log) -> None:
    log.append_as_leader(make_batch(2), 0)  # offsets 0, 1 without a producer id
    first = pbatch(7, 0, 3)
    info = log.append_as_leader(first, 0)
    assert (info.first_offset, info.last_offset, info.num_records) == (2, 4, 3)
    before = dir_files(log)
    again = log.append_as_leader(first, 0)
    assert (again.first_offset, again.last_offset) == (2, 4)
    assert again.num_records == 0 and again.valid_bytes == 0
    assert log.log_end_offset == 5
    assert dir_files(log) == before
    assert [r.offset for r in read_all(log)] == [0, 1, 2, 3, 4]


def test_duplicate_of_any_of_the_last_five_batches(log: Log) -> None:
    batches = [pbatch(7, 2 * i, 2, tag=f"b{i}") for i in range(7)]
    offsets = []
    for b in batches:
        info = log.append_as_leader(b, 0)
        offsets.append((info.first_offset, info.last_offset))
    end = log.log_end_offset
    for i in range(7 - NUM_BATCHES_TO_RETAIN, 7):
        info = log.append_as_leader(batches[i], 0)
        assert (info.first_offset, info.last_offset) == offsets[i]
    # Older ones are forgotten: their sequence is simply out of order now.
    with pytest.raises(OutOfOrderSequenceNumberError):
        log.append_as_leader(batches[1], 0)
    assert log.log_end_offset == end


def test_batches_without_producer_id_are_never_deduplicated(log: Log) -> None:
    data = make_batch(2)
    log.append_as_leader(data, 0)
    assert log.append_as_leader(data, 0).first_offset == 2
    assert log.producer_state.producers == {}


def test_producers_are_independent(log: Log) -> None:
    log.append_as_leader(pbatch(1, 0, 2), 0)
    log.append_as_leader(pbatch(2, 0, 3), 0)
    log.append_as_leader(pbatch(1, 2, 1), 0)
    assert log.append_as_leader(pbatch(2, 0, 3), 0).first_offset == 2  # duplicate
    assert log.append_as_leader(pbatch(2, 3, 1), 0).first_offset == 6
    assert state_of(log) == {
        1: (0, [BatchMetadata(0, 1, 0, 1), BatchMetadata(2, 2, 5, 5)]),
        2: (0, [BatchMetadata(0, 2, 2, 4), BatchMetadata(3, 3, 6, 6)]),
    }


# --- sequences and epochs ------------------------------------------------------------


def test_skipped_sequence_is_out_of_order_and_writes_nothing(log: Log) -> None:
    log.append_as_leader(pbatch(7, 0, 3), 0)
    before = dir_files(log)
    for seq in (4, 2, 1, 0 + 1_000):
        with pytest.raises(OutOfOrderSequenceNumberError) as info:
            log.append_as_leader(pbatch(7, seq, 1), 0)
        assert info.value.errno == 45
    assert dir_files(log) == before and log.log_end_offset == 3
    assert log.append_as_leader(pbatch(7, 3, 1), 0).first_offset == 3


def test_partially_overlapping_retry_is_out_of_order(log: Log) -> None:
    log.append_as_leader(pbatch(7, 0, 3), 0)
    with pytest.raises(OutOfOrderSequenceNumberError):
        log.append_as_leader(pbatch(7, 1, 3), 0)


def test_older_epoch_is_fenced(log: Log) -> None:
    log.append_as_leader(pbatch(7, 0, 2, epoch=3), 0)
    with pytest.raises(InvalidProducerEpochError) as info:
        log.append_as_leader(pbatch(7, 2, 1, epoch=2), 0)
    assert info.value.errno == 47
    assert log.log_end_offset == 2


def test_new_epoch_must_start_at_zero(log: Log) -> None:
    old = pbatch(7, 0, 2, epoch=0)
    log.append_as_leader(old, 0)
    with pytest.raises(OutOfOrderSequenceNumberError):
        log.append_as_leader(pbatch(7, 2, 1, epoch=1), 0)
    assert log.append_as_leader(pbatch(7, 0, 1, epoch=1), 0).first_offset == 2
    # The old epoch is fenced now, even for a retry of a batch it wrote.
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(old, 0)
    assert state_of(log) == {7: (1, [BatchMetadata(0, 0, 2, 2)])}


def test_unknown_producer_accepts_any_first_sequence(log: Log) -> None:
    assert log.append_as_leader(pbatch(7, 0, 1), 0).first_offset == 0
    assert log.append_as_leader(pbatch(8, 500, 2), 0).first_offset == 1
    assert log.append_as_leader(pbatch(8, 502, 1), 0).first_offset == 3
    with pytest.raises(OutOfOrderSequenceNumberError):
        log.append_as_leader(pbatch(8, 504, 1), 0)


def test_sequence_wraps_around(log: Log) -> None:
    log.append_as_leader(pbatch(7, MAX_SEQUENCE - 4, 3), 0)  # sequences 2**31-5 .. 2**31-3
    wrapping = pbatch(7, MAX_SEQUENCE - 1, 4)  # 2**31-2, 2**31-1, 0, 1
    assert log.append_as_leader(wrapping, 0).first_offset == 3
    assert log.append_as_leader(wrapping, 0).first_offset == 3  # duplicate across the wrap
    with pytest.raises(OutOfOrderSequenceNumberError):
        log.append_as_leader(pbatch(7, 0, 1), 0)
    assert log.append_as_leader(pbatch(7, 2, 1), 0).first_offset == 7


def test_idempotent_batch_needs_sequence_and_epoch(log: Log) -> None:
    with pytest.raises(InvalidRequestError):
        log.append_as_leader(pbatch(7, -1, 1), 0)
    with pytest.raises(InvalidRequestError):
        log.append_as_leader(pbatch(7, 0, 1, epoch=-1), 0)
    assert log.log_end_offset == 0


# --- several batches in one request --------------------------------------------------


def test_request_of_consecutive_batches(log: Log) -> None:
    request = pbatch(7, 0, 2) + pbatch(7, 2, 3) + make_batch(1) + pbatch(9, 0, 1)
    info = log.append_as_leader(request, 0)
    assert (info.first_offset, info.last_offset) == (0, 6)
    # The same request again is a duplicate as a whole... except for the batch
    # without a producer id, which cannot be recognised: that mix is refused.
    with pytest.raises(InvalidRequestError, match="duplicates"):
        log.append_as_leader(request, 0)
    only_producers = pbatch(7, 0, 2) + pbatch(7, 2, 3)
    again = log.append_as_leader(only_producers, 0)
    assert (again.first_offset, again.last_offset) == (0, 4)
    assert log.log_end_offset == 7


def test_request_mixing_duplicates_and_new_batches_is_refused(log: Log) -> None:
    log.append_as_leader(pbatch(7, 0, 2), 0)
    with pytest.raises(InvalidRequestError):
        log.append_as_leader(pbatch(7, 0, 2) + pbatch(7, 2, 1), 0)
    assert log.log_end_offset == 2


def test_out_of_order_inside_one_request(log: Log) -> None:
    with pytest.raises(OutOfOrderSequenceNumberError):
        log.append_as_leader(pbatch(7, 0, 2) + pbatch(7, 3, 1), 0)
    assert log.log_end_offset == 0 and log.producer_state.producers == {}


# --- followers -----------------------------------------------------------------------


def test_follower_updates_state_without_checks(tmp_path: Path) -> None:
    leader = Log.open(tmp_path / "leader-0", CONFIG)
    follower = Log.open(tmp_path / "follower-0", CONFIG)
    try:
        for i in range(8):
            leader.append_as_leader(pbatch(7, 3 * i, 3, tag=f"{i}-"), 0)
        leader.append_as_leader(pbatch(8, 40, 2), 0)
        offset = 0
        while offset < leader.log_end_offset:
            data = leader.read(offset, 1 << 20)
            follower.append_as_follower(data.records)
            offset = data.next_offset
        assert state_of(follower) == state_of(leader)
        # A follower takes what the leader wrote, in or out of sequence.
        gap = bytearray(pbatch(7, 1_000, 1))
        gap[:8] = follower.log_end_offset.to_bytes(8, "big")
        follower.append_as_follower(bytes(gap))
        entry = follower.producer_state.entry(7)
        assert entry is not None and entry.last_seq == 1_000
        # Become leader: a retry of the producer's last batch is a duplicate.
        info = follower.append_as_leader(bytes(gap), 1)
        assert info.first_offset == follower.log_end_offset - 1 and info.num_records == 0
    finally:
        leader.close()
        follower.close()


# --- rebuilding ----------------------------------------------------------------------


def fill(log: Log, batches: int = 30) -> list[bytes]:
    """Batches of two producers across several segments; returns them in order."""
    written = []
    for i in range(batches):
        pid = 7 if i % 3 else 8
        seq = sum(3 for j in range(i) if (7 if j % 3 else 8) == pid)
        data = pbatch(pid, seq, 3, tag=f"{i}-")
        log.append_as_leader(data, 0)
        written.append(data)
    assert log.num_segments > 3 or batches < 30
    return written


def test_state_survives_a_clean_reopen(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = Log.open(dir, CONFIG)
    written = fill(log)
    expected = state_of(log)
    end = log.log_end_offset
    log.close()
    assert snapshot_file(dir, end).exists()
    log = Log.open(dir, CONFIG, clean_shutdown=True)
    try:
        assert state_of(log) == expected
        assert log.append_as_leader(written[-1], 0).last_offset == end - 1
        assert log.log_end_offset == end
    finally:
        log.close()


@pytest.mark.parametrize("snapshots", ["kept", "deleted", "corrupt", "stale"])
def test_state_rebuilt_after_a_crash(tmp_path: Path, snapshots: str) -> None:
    dir = tmp_path / "t-0"
    log = Log.open(dir, CONFIG)
    written = fill(log)
    expected = state_of(log)
    end = log.log_end_offset
    crash(log)
    found = sorted(dir.glob("*.snapshot"))
    assert found, "segment rolls write snapshots"
    if snapshots == "deleted":
        for p in found:
            p.unlink()
    elif snapshots == "corrupt":
        for p in found:
            p.write_bytes(b'{"version": 1, "offs')
    elif snapshots == "stale":
        # A snapshot claiming more than the log holds (the tail was lost after it).
        bogus = snapshot_file(dir, end + 100)
        producers = '[{"id":7,"epoch":5,"batches":[[0,0,0,0]]}]'
        bogus.write_text(f'{{"version":1,"offset":{end + 100},"producers":{producers}}}')
    log = Log.open(dir, CONFIG)
    try:
        assert state_of(log) == expected
        for data in written[-3:]:  # the last batch of each producer (and one more)
            info = log.append_as_leader(data, 0)
            assert info.num_records == 0
        assert log.log_end_offset == end
        assert all(int(p.name.split(".")[0]) <= end for p in dir.glob("*.snapshot"))
        if snapshots == "corrupt":
            assert not any(p.read_bytes().startswith(b'{"version": 1, "offs') for p in dir.glob("*.snapshot"))
    finally:
        log.close()


def test_snapshot_and_full_scan_agree(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = Log.open(dir, CONFIG)
    fill(log, 40)
    segments = log.segments
    from_snapshots = ProducerStateManager(dir)
    from_snapshots.load(segments, log.log_start_offset, log.log_end_offset)
    full = ProducerStateManager(None)
    full.load(segments, log.log_start_offset, log.log_end_offset)
    as_dict = {pid: (e.epoch, list(e.batches)) for pid, e in full.producers.items()}
    assert {pid: (e.epoch, list(e.batches)) for pid, e in from_snapshots.producers.items()} == as_dict
    assert as_dict == state_of(log)
    assert 0 < len(from_snapshots.snapshot_offsets) <= 3
    log.close()


def test_truncate_to_rebuilds_state(log: Log) -> None:
    written = fill(log)
    end = log.log_end_offset
    snapshots_before = log.producer_state.snapshot_offsets
    cut = end - 9  # the last three batches go
    assert log.truncate_to(cut)
    assert all(o <= cut for o in log.producer_state.snapshot_offsets)
    assert len(log.producer_state.snapshot_offsets) <= len(snapshots_before)
    # The removed batches are new again and must come back in order.
    with pytest.raises(OutOfOrderSequenceNumberError):
        log.append_as_leader(written[-1], 1)
    for data in written[-3:]:
        info = log.append_as_leader(data, 1)
        assert info.num_records == 3
    assert log.log_end_offset == end
    # And the ones that stayed are still duplicates.
    assert log.append_as_leader(written[-4], 1).num_records == 0


def test_truncate_fully_forgets_every_producer(log: Log) -> None:
    written = fill(log, 10)
    log.truncate_fully_and_start_at(100)
    assert log.producer_state.producers == {}
    assert log.producer_state.snapshot_offsets == []
    assert not list(log.dir.glob("*.snapshot"))
    assert log.append_as_leader(written[-1], 1).first_offset == 100  # unknown producer: accepted


def test_producers_below_the_log_start_are_evicted(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = Log.open(dir, CONFIG)
    log.append_as_leader(pbatch(5, 0, 2), 0)
    fill(log)
    assert log.producer_state.entry(5) is not None
    log.maybe_increment_log_start_offset(2)
    assert log.producer_state.entry(5) is None
    kept = state_of(log)
    log.close()
    log = Log.open(dir, CONFIG, log_start_offset=2)
    try:
        assert state_of(log) == kept
        # Its state is gone: any sequence is accepted again (no UNKNOWN_PRODUCER_ID).
        assert log.append_as_leader(pbatch(5, 2, 1), 0).num_records == 1
    finally:
        log.close()


def test_deleting_a_log_writes_no_snapshot(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", CONFIG)
    log.append_as_leader(pbatch(7, 0, 1), 0)
    log.delete()
    assert not (tmp_path / "t-0").exists()


def test_batch_headers_in_the_log_keep_producer_fields(log: Log) -> None:
    log.append_as_leader(pbatch(7, 10, 4, epoch=2), 0)
    ((_, header),) = list(iter_headers(log.read(0, 1 << 20).records))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 10)


def test_a_clean_reopen_trusts_the_snapshot_and_scans_nothing(tmp_path: Path) -> None:
    dir = tmp_path / "t-0"
    log = Log.open(dir, CONFIG)
    fill(log, 6)
    end = log.log_end_offset
    log.close()
    path = snapshot_file(dir, end)
    path.write_text(
        path.read_text().replace('"producers":[', '"producers":[{"id":99,"epoch":4,"batches":[[0,0,0,0]]},')
    )
    log = Log.open(dir, CONFIG, clean_shutdown=True)
    try:
        entry = log.producer_state.entry(99)
        assert entry is not None and entry.epoch == 4
    finally:
        log.close()
