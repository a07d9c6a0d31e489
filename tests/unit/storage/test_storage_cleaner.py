"""Log compaction on real files: the offset map, passes, grouping, tombstones, producer
batches, compression, crash recovery of every swap stage, and the cleaner manager."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from storage_testutil import read_all

from kbroker.storage import files
from kbroker.storage.batch_filter import filter_batch, parse_records
from kbroker.storage.cleaner import Cleaner, CleanerAbortedError, first_uncleanable_offset, group_segments_by_size
from kbroker.storage.cleaner_manager import CLEANER_CHECKPOINT, CleanerConfig, LogCleaner
from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kbroker.storage.offset_map import BYTES_PER_ENTRY, OffsetMap
from kclient.errors import InvalidConfigurationError, InvalidRecordError
from kclient.records import HEADER_SIZE, BatchBuilder, Compression, Record, decode_batches, iter_headers, read_header


def compact_config(**changes: object) -> LogConfig:
    base = LogConfig(
        segment_bytes=2048,
        index_interval_bytes=128,
        file_delete_delay_ms=0,
        cleanup_policy="compact",
        min_cleanable_dirty_ratio=0.01,
    )
    return base.replace(**changes)


def keyed_batch(
    items: Sequence[tuple[bytes | None, bytes | None]],
    *,
    compression: Compression = Compression.NONE,
    timestamp: int = 1_000,
    producer: tuple[int, int, int] | None = None,
) -> bytes:
    pid, epoch, seq = producer if producer else (-1, -1, -1)
    builder = BatchBuilder(compression, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for i, (key, value) in enumerate(items):
        builder.append(timestamp + i, key, value)
    return builder.build()


def update(log: Log, key: str, value: str | None, **kw: object) -> int:
    data = keyed_batch([(key.encode(), None if value is None else value.encode())], **kw)  # type: ignore[arg-type]
    return log.append_as_leader(data, 0).first_offset


def latest_by_key(records: Sequence[Record]) -> dict[bytes | None, bytes | None]:
    out: dict[bytes | None, bytes | None] = {}
    for r in records:
        out[r.key] = r.value
    return out


def clean_all(log: Log, cleaner: Cleaner, now_ms: int = 10**13) -> int:
    """Clean passes until the dirty part is gone; returns the number of passes."""
    first_dirty = log.log_start_offset
    passes = 0
    while True:
        upper = first_uncleanable_offset(log, now_ms)
        if first_dirty >= upper:
            return passes
        first_dirty, _ = cleaner.clean(log, first_dirty, upper, now_ms)
        passes += 1
        assert passes < 100


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    log = Log.open(tmp_path / "t-0", compact_config())
    yield log
    log.close()


def no_pause(stage: str, data_dir: Path, what: str) -> None:
    pass


def big_cleaner(memory: int = 1 << 20) -> Cleaner:
    return Cleaner(OffsetMap(memory), pause=no_pause)


# ---------------------------------------------------------------------------- offset map


def test_offset_map_keeps_the_latest_offset_and_is_bounded() -> None:
    m = OffsetMap(BYTES_PER_ENTRY * 10, load_factor=0.5)
    assert m.max_entries == 5
    for i in range(5):
        m.put(f"k{i}".encode(), i)
    m.put(b"k0", 9)  # an update of a known key always fits
    assert m.get(b"k0") == 9 and m.get(b"k1") == 1 and m.get(b"zz") == -1
    assert m.free == 0 and m.latest_offset == 9
    with pytest.raises(OverflowError):
        m.put(b"k5", 10)
    m.clear()
    assert len(m) == 0 and m.latest_offset == -1


# ---------------------------------------------------------------------------- cleaning


def test_cleaning_keeps_the_latest_value_of_every_key_at_its_offset(log: Log) -> None:
    last: dict[str, tuple[int, str]] = {}
    for i in range(600):
        key = f"key-{i % 37}"
        value = f"value-{i}"
        last[key] = (update(log, key, value), value)
    log.roll()
    segments_before = log.num_segments
    size_before = log.size_in_bytes
    clean_all(log, big_cleaner())
    records = read_all(log)
    assert [r.offset for r in records] == sorted({o for o, _ in last.values()})
    assert {r.key.decode(): (r.offset, r.value.decode()) for r in records if r.key and r.value} == last
    assert log.size_in_bytes < size_before / 5
    # Groups are sized by the segments before cleaning (as Kafka): the next pass merges them.
    update(log, "key-0", "again")
    log.roll()
    clean_all(log, big_cleaner())
    assert log.num_segments < segments_before / 5, "small cleaned neighbours are merged"
    assert latest_by_key(read_all(log))[b"key-0"] == b"again"
    assert not [p for p in log.dir.iterdir() if files.is_temporary_file(p)]


def test_fetch_at_a_compacted_away_offset_returns_the_next_record_and_list_offsets_hold(log: Log) -> None:
    for i in range(200):
        key = "hot" if i % 2 else f"cold-{i}"
        log.append_as_leader(keyed_batch([(key.encode(), b"x")], timestamp=1_000 + i), 0)
    log.roll()
    clean_all(log, big_cleaner())
    # Offset 1 (the first "hot" update) is gone: reading there starts at the next record.
    info = log.read(1, 1 << 16)
    first = next(r for _, rs in decode_batches(info.records) for r in rs)
    assert first.offset == 2
    # ListOffsets: the first record stamped at or after 1_003 is now offset 4 (3 was "hot").
    assert log.offset_for_timestamp(1_003) == (4, 1_004)
    assert log.offset_for_timestamp(1_199) == (199, 1_199)  # the last "hot" survives


def test_a_full_offset_map_cleans_in_several_passes(log: Log) -> None:
    expected: dict[bytes, bytes] = {}
    for i in range(400):
        key, value = f"k{i % 60}".encode(), f"v{i}".encode()
        log.append_as_leader(keyed_batch([(key, value)]), 0)
        expected[key] = value
    log.roll()
    cleaner = Cleaner(OffsetMap(BYTES_PER_ENTRY * 25, load_factor=1.0), pause=no_pause)  # 25 keys at once
    passes = clean_all(log, cleaner)
    assert passes > 2
    records = read_all(log)
    assert len(records) == 60
    assert latest_by_key(records) == expected
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets))


def test_group_segments_by_size_merges_small_neighbours(log: Log) -> None:
    for i in range(120):
        update(log, f"k{i}", "v" * 40)
    log.roll()
    segments = log.segments[:-1]
    assert len(segments) >= 4
    one = segments[0].size
    groups = group_segments_by_size(segments, max_size=2 * one + 1, max_index_size=1 << 20)
    assert all(len(g) <= 2 for g in groups) and sum(len(g) for g in groups) == len(segments)
    assert [s for g in groups for s in g] == segments
    assert len(group_segments_by_size(segments, 1 << 30, 1 << 20)) == 1


def test_tombstones_delete_the_key_and_go_after_delete_retention(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", compact_config(delete_retention_ms=60_000))
    try:
        for i in range(50):
            update(log, f"k{i % 5}", f"v{i}", timestamp=5_000 + i)
        tombstone_offset = update(log, "k1", None, timestamp=7_777)
        log.roll()
        cleaner = big_cleaner()
        t0 = 10**12
        clean_all(log, cleaner, now_ms=t0)
        records = read_all(log)
        assert latest_by_key(records)[b"k1"] is None, "the tombstone deletes the key and is kept for now"
        assert [(r.offset, r.timestamp) for r in records if r.key == b"k1"] == [(tombstone_offset, 7_777)]
        stamped = [h for s in log.segments for _, h in s.iter_headers() if h.attributes & 0x40]
        assert [h.first_timestamp for h in stamped] == [t0 + 60_000], "its batch got a delete horizon"
        # Cleaned again before the horizon: still there; after it: gone, and only it.
        clean_from(log, cleaner, 0, now_ms=t0 + 59_999)
        assert b"k1" in [r.key for r in read_all(log)]
        clean_from(log, cleaner, 0, now_ms=t0 + 60_000)
        records = read_all(log)
        assert sorted(latest_by_key(records)) == [b"k0", b"k2", b"k3", b"k4"]
        assert all(r.timestamp == 5_000 + int(r.value[1:]) for r in records if r.value)  # type: ignore[index]
    finally:
        log.close()


def clean_from(log: Log, cleaner: Cleaner, first_dirty: int, *, now_ms: int) -> int:
    """Clean passes from ``first_dirty`` (a whole recopy when 0) until nothing is dirty."""
    while True:
        upper = first_uncleanable_offset(log, now_ms)
        if first_dirty >= upper:
            return first_dirty
        end, _ = cleaner.clean(log, first_dirty, upper, now_ms)
        if end == first_dirty:
            return end
        first_dirty = end


def test_the_last_batch_of_each_producer_survives_so_retries_stay_duplicates(log: Log) -> None:
    pid = 42
    retry = keyed_batch([(b"a", b"1"), (b"b", b"1")], producer=(pid, 0, 0))
    info = log.append_as_leader(retry, 0)
    for i in range(60):
        update(log, "a" if i % 2 else "b", f"later-{i}")
    log.roll()
    clean_all(log, big_cleaner())
    assert all(r.offset > info.last_offset for r in read_all(log)), "its records were superseded"
    headers = [h for s in log.segments for _, h in s.iter_headers()]
    kept = [h for h in headers if h.producer_id == pid]
    assert len(kept) == 1 and kept[0].record_count == 0
    assert (kept[0].base_offset, kept[0].last_offset, kept[0].base_sequence) == (0, 1, 0)
    # The producer retries its batch: still recognised as a duplicate, nothing appended.
    end = log.log_end_offset
    again = log.append_as_leader(retry, 0)
    assert (again.first_offset, again.last_offset, again.num_records) == (0, 1, 0)
    assert log.log_end_offset == end
    # A reopened log rebuilds the same producer state from the kept header.
    log.close()
    reopened = Log.open(log.dir, log.config)
    try:
        assert reopened.append_as_leader(retry, 0).num_records == 0
    finally:
        reopened.close()


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_compressed_batches_are_filtered_and_recompressed_with_their_codec(log: Log, codec: Compression) -> None:
    for round in range(12):
        items = [(f"k{i}".encode(), f"r{round}-{i}".encode()) for i in range(8)]
        items.append((f"unique-{round}".encode(), b"u"))
        log.append_as_leader(keyed_batch(items, compression=codec), 0)
    log.append_as_leader(keyed_batch([(b"k0", b"final")], compression=codec), 0)
    log.roll()
    clean_all(log, big_cleaner())
    data = b"".join(log.read(s.base_offset, 1 << 20).records for s in log.segments[:-1])
    codecs = {h.compression for _, h in iter_headers(data) if h.record_count}
    assert codecs == {codec}
    records = read_all(log)
    latest = latest_by_key(records)
    assert latest[b"k0"] == b"final" and latest[b"k5"] == b"r11-5"
    assert all(latest[f"unique-{r}".encode()] == b"u" for r in range(12))
    assert len(records) == 8 + 12


def test_filter_batch_keeps_offsets_and_sequence_fields() -> None:
    data = keyed_batch([(b"a", b"1"), (b"b", None), (b"c", b"3")], producer=(7, 1, 10))
    header = read_header(data)
    tombstones = [False, True, False]
    result = filter_batch(data, 0, header, [True, False, True], tombstones, keep_empty=False)
    assert result.data is not None and result.kept == 2
    new = read_header(result.data)
    assert (new.base_offset, new.last_offset_delta, new.base_sequence, new.producer_id) == (0, 2, 10, 7)
    ((_, records),) = decode_batches(result.data)  # the CRC checks out
    assert [(r.offset, r.key, r.value) for r in records] == [(0, b"a", b"1"), (2, b"c", b"3")]
    raw = parse_records(data[HEADER_SIZE:], 3)
    assert [r.tombstone for r in raw] == [False, True, False]
    assert filter_batch(data, 0, header, [False] * 3, tombstones, keep_empty=False).data is None
    empty = filter_batch(data, 0, header, [False] * 3, tombstones, keep_empty=True).data
    assert empty is not None and read_header(empty).record_count == 0 and len(empty) == 61
    # A kept tombstone gets a delete horizon; every record keeps its timestamp.
    stamped = filter_batch(data, 0, header, [True] * 3, tombstones, keep_empty=False, now_ms=10**12)
    assert stamped.horizon == 10**12 and stamped.data is not None
    ((h, rs),) = decode_batches(stamped.data)
    assert h.attributes & 0x40 and h.first_timestamp == 10**12
    assert [r.timestamp for r in rs] == [r.timestamp for _, recs in decode_batches(data) for r in recs]
    gone = filter_batch(stamped.data, 0, h, [True] * 3, tombstones, keep_empty=False, now_ms=10**12)
    assert gone.kept == 2 and gone.horizon is None


def test_a_keyless_record_to_a_compacted_topic_is_refused(log: Log) -> None:
    with pytest.raises(InvalidRecordError, match=r"without (a )?key"):
        log.append_as_leader(keyed_batch([(b"k", b"v"), (None, b"v")]), 0)
    assert log.log_end_offset == 0
    log.update_config(log.config.replace(cleanup_policy="delete"))
    assert log.append_as_leader(keyed_batch([(None, b"v")]), 0).first_offset == 0


def test_the_high_watermark_and_min_compaction_lag_bound_the_cleaning(log: Log) -> None:
    for i in range(100):
        update(log, "k", f"v{i}")
    log.roll()
    update(log, "k", "active")
    log.cleaner_upper_bound = lambda: 40
    segments = log.segments
    bound = first_uncleanable_offset(log, 10**13)
    assert bound <= 40
    clean_all(log, big_cleaner())
    offsets = [r.offset for r in read_all(log)]
    assert [o for o in offsets if o >= bound] == list(range(bound, 101)), "nothing at or above the bound is touched"
    log.cleaner_upper_bound = None
    assert first_uncleanable_offset(log, 10**13) == log.segments[-1].base_offset
    young = log.config.replace(min_compaction_lag_ms=10**6)
    log.update_config(young)
    assert first_uncleanable_offset(log, 1_100) == segments[0].base_offset  # everything is "young"


def test_follower_append_accepts_the_gaps_of_a_compacted_leader(tmp_path: Path) -> None:
    follower = Log.open(tmp_path / "f-0", compact_config())
    try:
        batch = bytearray(keyed_batch([(b"k", b"v")]))
        batch[0:8] = (5).to_bytes(8, "big")  # base offset 5: offsets 0..4 were compacted away
        info = follower.append_as_follower(bytes(batch))
        assert info.first_offset == 5 and follower.log_end_offset == 6
    finally:
        follower.close()


# ---------------------------------------------------------------------------- crash recovery


class Crash(BaseException):
    pass


@pytest.mark.parametrize("stage", ["after-cleaned", "after-swap", "after-delete", "after-replace"])
def test_a_crash_at_any_swap_stage_recovers_every_latest_value(tmp_path: Path, stage: str) -> None:
    dir = tmp_path / "t-0"
    log = Log.open(dir, compact_config())
    expected: dict[bytes, bytes] = {}
    for i in range(300):
        key, value = f"k{i % 20}".encode(), f"v{i}".encode()
        log.append_as_leader(keyed_batch([(key, value)]), 0)
        expected[key] = value
    log.roll()
    log.flush()
    end = log.log_end_offset

    def crash(at: str, data_dir: Path, what: str) -> None:
        if at == stage:
            raise Crash(at)

    with pytest.raises(Crash):
        clean_all(log, Cleaner(OffsetMap(1 << 20), pause=crash))
    # The process dies here: nothing more is written, the files stay as they are.
    reopened = Log.open(dir, compact_config(), recovery_point=0)
    try:
        records = read_all(reopened)
        offsets = [r.offset for r in records]
        assert offsets == sorted(set(offsets)), "no duplicate offsets"
        assert latest_by_key(records) == expected
        assert reopened.log_end_offset == end
        assert not [p for p in dir.iterdir() if files.is_temporary_file(p)]
        # And cleaning after the restart finishes the job.
        clean_all(reopened, big_cleaner())
        assert len(read_all(reopened)) == 20
    finally:
        reopened.close()


def test_replace_segments_refuses_segments_no_longer_in_the_log(log: Log) -> None:
    for i in range(100):
        update(log, "k", f"v{i}")
    log.roll()
    cleaner = big_cleaner()
    first = log.segments[0]
    log.maybe_increment_log_start_offset(log.segments[1].base_offset)  # retention took it
    assert first not in log.segments
    with pytest.raises(CleanerAbortedError):
        cleaner._clean_segments(log, [first], -1, set(), cleaner_stats())
    assert not [p for p in log.dir.iterdir() if p.name.endswith(files.CLEANED_SUFFIX)]


def cleaner_stats():  # type: ignore[no-untyped-def]
    from kbroker.storage.cleaner import CleanerStats

    return CleanerStats()


# ---------------------------------------------------------------------------- the manager


def test_manager_cleans_the_filthiest_log_writes_its_checkpoint_and_reports_state(tmp_path: Path) -> None:
    logs = {
        ("a", 0): Log.open(tmp_path / "a-0", compact_config()),
        ("b", 0): Log.open(tmp_path / "b-0", compact_config()),
        ("c", 0): Log.open(tmp_path / "c-0", compact_config(cleanup_policy="delete")),
    }
    try:
        for i in range(200):
            update(logs[("a", 0)], "k", f"v{i}")
            update(logs[("c", 0)], "k", f"v{i}")
        for i in range(40):
            update(logs[("b", 0)], f"k{i}", "v")
        for log in logs.values():
            log.roll()
        manager = LogCleaner(tmp_path, lambda: logs, CleanerConfig(backoff_ms=10, dedupe_buffer_size=1 << 20))
        state = manager.state()
        assert set(state) == {("a", 0), ("b", 0)}
        assert state[("a", 0)]["dirty_ratio"] == 1.0 and state[("a", 0)]["last_cleaned_offset"] == -1
        cleaner = manager.new_cleaner()
        assert manager.clean_filthiest_log(cleaner)
        assert manager.clean_filthiest_log(cleaner)
        assert not manager.clean_filthiest_log(cleaner), "both are clean now"
        state = manager.state()
        assert state[("a", 0)]["last_cleaned_offset"] == logs[("a", 0)].segments[-1].base_offset
        assert state[("a", 0)]["dirty_ratio"] == 0.0 and int(state[("a", 0)]["bytes_cleaned"]) > 0  # type: ignore[call-overload]
        assert len(read_all(logs[("a", 0)])) == 1 and len(read_all(logs[("c", 0)])) == 200
        saved = files.read_offsets_checkpoint(tmp_path / CLEANER_CHECKPOINT)
        assert saved == {("a", 0): 200, ("b", 0): 40}
        # A fresh manager (a restart) starts from the checkpoint: nothing to clean.
        again = LogCleaner(tmp_path, lambda: logs, CleanerConfig())
        assert not again.clean_filthiest_log(again.new_cleaner())
    finally:
        for log in logs.values():
            log.close()


def test_a_failing_cleaning_marks_the_partition_uncleanable_and_the_thread_lives(tmp_path: Path) -> None:
    logs = {("a", 0): Log.open(tmp_path / "a-0", compact_config())}
    try:
        for i in range(100):
            update(logs[("a", 0)], "k", f"v{i}")
        logs[("a", 0)].roll()
        segment = logs[("a", 0)].segments[0]
        with open(segment.log_path, "r+b") as f:  # a batch the cleaner cannot read
            f.seek(61)
            f.write(b"\xff" * 8)
        manager = LogCleaner(tmp_path, lambda: logs, CleanerConfig(backoff_ms=10, dedupe_buffer_size=1 << 20))
        assert manager.clean_filthiest_log(manager.new_cleaner())
        reason = manager.state()[("a", 0)]["uncleanable"]
        assert reason is not None and "CRC" in str(reason)
        assert not manager.clean_filthiest_log(manager.new_cleaner()), "skipped from now on"
        manager.startup()
        manager.shutdown()
    finally:
        logs[("a", 0)].close()


def test_compaction_topic_configs_have_kafkas_defaults_and_validation() -> None:
    config = LogConfig()
    assert (config.min_cleanable_dirty_ratio, config.min_compaction_lag_ms) == (0.5, 0)
    assert (config.max_compaction_lag_ms, config.delete_retention_ms) == (2**63 - 1, 86_400_000)
    parsed = LogConfig.from_properties({"min.cleanable.dirty.ratio": "0.2", "delete.retention.ms": "5"})
    assert parsed.min_cleanable_dirty_ratio == 0.2 and parsed.delete_retention_ms == 5
    assert LogConfig.from_properties(parsed.to_properties()) == parsed
    for key, bad in (
        ("min.cleanable.dirty.ratio", "1.5"),
        ("min.cleanable.dirty.ratio", "x"),
        ("min.compaction.lag.ms", "-1"),
        ("max.compaction.lag.ms", "0"),
        ("delete.retention.ms", "-1"),
    ):
        with pytest.raises(InvalidConfigurationError, match=key):
            LogConfig.from_properties({key: bad})


def test_get_or_create_gives_a_log_loaded_at_startup_its_topic_config(tmp_path: Path) -> None:
    from kbroker.storage.log_manager import LogManager

    manager = LogManager(tmp_path, LogConfig(), cleaner_config=CleanerConfig(enable=False))
    manager.startup()
    manager.get_or_create("t", 0, compact_config())
    manager.shutdown()
    restarted = LogManager(tmp_path, LogConfig(), cleaner_config=CleanerConfig(enable=False))
    restarted.startup()
    try:
        assert restarted.get("t", 0).config.cleanup_policy == "delete"  # type: ignore[union-attr]
        log = restarted.get_or_create("t", 0, compact_config())
        assert log.config.compact_enabled, "the topic is compacted again, not deleted by retention"
    finally:
        restarted.shutdown()


def test_broker_log_cleaner_settings_have_kafkas_names_and_defaults() -> None:
    from kbroker.config import build_config
    from kclient.errors import InvalidConfigError

    required = {"broker.id": "0", "zookeeper.connect": "127.0.0.1:2181", "log.dirs": "/tmp/x"}
    default = build_config(required).cleaner_config()
    assert default == CleanerConfig()
    assert (default.enable, default.threads, default.backoff_ms) == (True, 1, 15_000)
    assert default.dedupe_buffer_size == 128 * 1024 * 1024 and default.io_max_bytes_per_second == float("inf")
    config = build_config(
        {
            **required,
            "log.cleaner.enable": "false",
            "log.cleaner.threads": "2",
            "log.cleaner.backoff.ms": "100",
            "log.cleaner.dedupe.buffer.size": "1048576",
            "log.cleaner.io.max.bytes.per.second": "1e6",
            "log.cleaner.min.cleanable.ratio": "0.25",
            "log.cleaner.delete.retention.ms": "1000",
        }
    )
    assert config.cleaner_config() == CleanerConfig(False, 2, 100, 1 << 20, 1e6)
    topic_defaults = LogConfig.from_properties(config.log_defaults)
    assert (topic_defaults.min_cleanable_dirty_ratio, topic_defaults.delete_retention_ms) == (0.25, 1000)
    for key, bad in (("log.cleaner.threads", "0"), ("log.cleaner.io.max.bytes.per.second", "x")):
        with pytest.raises(InvalidConfigError, match=key):
            build_config({**required, key: bad})


def test_the_throttler_holds_the_cleaner_to_its_io_rate() -> None:
    from kbroker.storage.cleaner import Throttler

    throttler = Throttler(1_000_000)
    started = time.monotonic()
    for _ in range(5):
        throttler.maybe_throttle(50_000)
    assert time.monotonic() - started >= 0.2
    unlimited = Throttler(float("inf"))
    started = time.monotonic()
    unlimited.maybe_throttle(10**12)
    assert time.monotonic() - started < 0.1


def test_max_compaction_lag_forces_a_log_below_its_dirty_ratio(tmp_path: Path) -> None:
    config = compact_config(min_cleanable_dirty_ratio=0.9)
    logs = {("a", 0): Log.open(tmp_path / "a-0", config)}
    log = logs[("a", 0)]
    try:
        for i in range(100):
            update(log, f"k{i}", "v", timestamp=1_000)
        log.roll()
        manager = LogCleaner(tmp_path, lambda: logs, CleanerConfig(dedupe_buffer_size=1 << 20))
        cleaner = manager.new_cleaner()
        assert manager.clean_filthiest_log(cleaner, now_ms=10**12)  # all dirty: ratio 1.0
        update(log, "k0", "new", timestamp=2_000)
        log.roll()
        assert manager.cleanable(("a", 0), log, 10**12).dirty_ratio < 0.9
        assert not manager.clean_filthiest_log(cleaner, now_ms=10**12)
        log.update_config(config.replace(max_compaction_lag_ms=60_000))
        assert manager.cleanable(("a", 0), log, 10**12).forced
        assert manager.clean_filthiest_log(cleaner, now_ms=10**12)
        assert latest_by_key(read_all(log))[b"k0"] == b"new" and len(read_all(log)) == 100
    finally:
        log.close()


def test_compact_delete_both_compacts_and_applies_retention(tmp_path: Path) -> None:
    log = Log.open(tmp_path / "t-0", compact_config(cleanup_policy="compact,delete", retention_ms=60_000))
    try:
        for i in range(100):
            update(log, f"k{i % 10}", f"old-{i}", timestamp=1_000)  # long past retention.ms
        log.roll()
        now = int(time.time() * 1000)
        for i in range(100):
            update(log, f"k{i % 5}", f"new-{i}", timestamp=now)
        log.roll()
        assert log.delete_old_segments(now) > 0
        assert log.log_start_offset == 100
        clean_all(log, big_cleaner(), now_ms=now)
        assert latest_by_key(read_all(log)) == {f"k{i}".encode(): f"new-{95 + i}".encode() for i in range(5)}
    finally:
        log.close()


def test_a_truncation_below_the_cleaner_checkpoint_moves_it_back(tmp_path: Path) -> None:
    logs = {("a", 0): Log.open(tmp_path / "a-0", compact_config())}
    log = logs[("a", 0)]
    try:
        for i in range(100):
            update(log, f"k{i % 3}", f"v{i}")
        log.roll()
        manager = LogCleaner(tmp_path, lambda: logs, CleanerConfig(dedupe_buffer_size=1 << 20))
        assert manager.clean_filthiest_log(manager.new_cleaner())
        assert manager.state()[("a", 0)]["last_cleaned_offset"] == 100
        log.truncate_to(50)  # a follower truncated: new data follows from the log end
        end = log.log_end_offset
        assert end <= 50
        for i in range(100 - end):
            update(log, f"t{i % 10}", f"new{i}")  # below the old checkpoint, yet dirty
        for i in range(30):
            update(log, f"k{i % 3}", f"new{i}")
        log.roll()
        assert manager.clean_filthiest_log(manager.new_cleaner())
        assert manager.state()[("a", 0)]["last_cleaned_offset"] == 130
        assert len(read_all(log)) == 13, "the data written after the truncation was cleaned too"
    finally:
        log.close()


def test_the_offset_map_stays_within_its_memory_budget() -> None:
    import tracemalloc

    budget = 4 << 20
    tracemalloc.start()
    try:
        m = OffsetMap(budget, load_factor=1.0)
        for i in range(m.max_entries):
            m.put(b"key-%d" % i, 10**9 + i)
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert m.free == 0 and used <= budget, f"{used} bytes for a {budget}-byte map"
