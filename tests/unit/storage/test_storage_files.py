from pathlib import Path

import pytest

from kbroker.storage import files
from kclient.errors import KafkaStorageError


def test_segment_names_are_zero_padded_to_20_digits(tmp_path: Path) -> None:
    assert files.filename_prefix_from_offset(42) == "00000000000000000042"
    assert files.log_file(tmp_path, 42).name == "00000000000000000042.log"
    assert files.offset_index_file(tmp_path, 0).name == "00000000000000000000.index"
    assert files.time_index_file(tmp_path, 7).name == "00000000000000000007.timeindex"
    assert files.log_file(tmp_path, 7, files.DELETED_SUFFIX).name == "00000000000000000007.log.deleted"
    assert files.offset_from_filename("00000000000000001234.timeindex") == 1234
    assert files.offset_from_filename("00000000000000001234.log.swap") == 1234
    names = [files.log_file(tmp_path, o).name for o in (100, 9, 10_000)]
    assert sorted(names) == [files.log_file(tmp_path, o).name for o in (9, 100, 10_000)]


@pytest.mark.parametrize("name", ["1234.log", "leader-epoch-checkpoint", "0000000000000000000x.log", ""])
def test_offset_from_bad_filename(name: str) -> None:
    with pytest.raises(ValueError):
        files.offset_from_filename(name)


def test_negative_base_offset_is_rejected() -> None:
    with pytest.raises(ValueError):
        files.filename_prefix_from_offset(-1)


def test_suffix_predicates(tmp_path: Path) -> None:
    for suffix in (".deleted", ".cleaned", ".swap"):
        assert files.is_temporary_file(tmp_path / f"00000000000000000000.log{suffix}")
    assert files.is_temporary_file(tmp_path / "leader-epoch-checkpoint.tmp")
    assert not files.is_temporary_file(tmp_path / "00000000000000000000.log")
    assert files.is_log_file(tmp_path / "00000000000000000000.log")
    assert files.is_index_file(tmp_path / "00000000000000000000.timeindex")
    assert files.is_index_file(tmp_path / "00000000000000000000.index")


@pytest.mark.parametrize(
    ("topic", "partition"),
    [("orders", 0), ("my-topic", 12), ("a.b_c-d", 3), ("x-1", 1), ("-", 0), ("9", 999)],
)
def test_partition_dir_round_trip(topic: str, partition: int) -> None:
    name = files.partition_dir_name(topic, partition)
    assert name == f"{topic}-{partition}"
    assert files.parse_partition_dir_name(name) == (topic, partition)


@pytest.mark.parametrize("name", ["orders", "orders-", "-3", "orders-x", "orders-01", "t-0.abc-delete"])
def test_parse_bad_partition_dir(name: str) -> None:
    with pytest.raises(ValueError):
        files.parse_partition_dir_name(name)


def test_delete_dir_name_is_unique_and_recognised() -> None:
    a = files.delete_dir_name("my.topic", 3)
    b = files.delete_dir_name("my.topic", 3)
    assert a != b
    assert a.startswith("my.topic-3.") and a.endswith("-delete")
    assert files.is_delete_dir_name(a)
    assert not files.is_delete_dir_name("my.topic-3")


def test_offsets_checkpoint_round_trip_and_exact_format(tmp_path: Path) -> None:
    path = tmp_path / files.RECOVERY_POINT_CHECKPOINT
    offsets = {("b.topic", 1): 10, ("a-topic", 0): 0, ("a-topic", 10): 123456789012}
    files.write_offsets_checkpoint(path, offsets)
    assert path.read_text() == "0\n3\na-topic 0 0\na-topic 10 123456789012\nb.topic 1 10\n"
    assert files.read_offsets_checkpoint(path) == offsets
    assert not (tmp_path / (path.name + ".tmp")).exists()


def test_epoch_checkpoint_round_trip(tmp_path: Path) -> None:
    path = tmp_path / files.LEADER_EPOCH_CHECKPOINT
    files.write_epoch_checkpoint(path, [(0, 0), (3, 120), (4, 500)])
    assert path.read_text() == "0\n3\n0 0\n3 120\n4 500\n"
    assert files.read_epoch_checkpoint(path) == [(0, 0), (3, 120), (4, 500)]


def test_empty_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    files.write_offsets_checkpoint(path, {})
    assert path.read_text() == "0\n0\n"
    assert files.read_offsets_checkpoint(path) == {}


def test_missing_checkpoint(tmp_path: Path) -> None:
    assert files.read_offsets_checkpoint(tmp_path / "absent") == {}
    assert files.read_epoch_checkpoint(tmp_path / "absent") is None


def test_checkpoint_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    files.write_offsets_checkpoint(path, {("t", 0): 1})
    files.write_offsets_checkpoint(path, {("t", 0): 2})
    assert files.read_offsets_checkpoint(path) == {("t", 0): 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("1\n0\n", "version"),
        ("0\n", "truncated"),
        ("0\nx\n", "count"),
        ("0\n2\nt 0 1\n", "declares 2"),
        ("0\n1\nt 0\n", "malformed line"),
        ("0\n1\nt zero 1\n", "malformed number"),
    ],
)
def test_malformed_checkpoint(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "cp"
    path.write_text(text)
    with pytest.raises(KafkaStorageError, match=problem) as info:
        files.read_offsets_checkpoint(path)
    assert str(path) in str(info.value)
