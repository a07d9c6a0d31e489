"""Names as ZooKeeper path segments: one reversible encoding, ordinary names unchanged."""

from __future__ import annotations

import pytest

from kbroker.cluster import zkdata
from kclient.errors import InvalidGroupIdError, InvalidRequestError, InvalidTopicError


@pytest.mark.parametrize(
    "name",
    ["victim/offsets", ".", "..", "...", "%", "%2E", "a\x00b", "\x1f\x7f\x9f", "\ue000", "\uffff", "🦆", "ü/ß"],
)
def test_hostile_names_become_one_safe_segment_and_round_trip(name: str) -> None:
    seg = zkdata.encode_segment(name)
    assert "/" not in seg and seg not in (".", "..") and "\x00" not in seg
    assert all(ord(c) >= 0x20 and not 0x7F <= ord(c) <= 0x9F and ord(c) < 0xD800 for c in seg)
    assert zkdata.decode_segment(seg) == name


@pytest.mark.parametrize("name", ["my-group", "A.b_c-d", "ümlaut", "日本", "with space", ".hidden", "a..b"])
def test_ordinary_names_are_their_own_segment(name: str) -> None:
    assert zkdata.encode_segment(name) == name
    assert zkdata.group_path(name) == f"/consumers/{name}"


def test_paths_reject_empty_and_overlong_names_with_typed_errors() -> None:
    assert zkdata.group_offset_path("a/b", "t", 0) == "/consumers/a%2Fb/offsets/t/0"
    assert zkdata.group_member_path("..", "m/1") == "/consumers/%2E%2E/ids/m%2F1"
    assert zkdata.partition_state_path("..", 1) == "/brokers/topics/%2E%2E/partitions/1/state"
    with pytest.raises(InvalidGroupIdError):
        zkdata.group_path("")
    with pytest.raises(InvalidGroupIdError, match="255"):
        zkdata.group_path("g" * 256)
    zkdata.group_path("g" * 255)
    with pytest.raises(InvalidRequestError, match="member id"):
        zkdata.group_member_path("g", "m" * 2_000_000)
    with pytest.raises(InvalidTopicError):
        zkdata.group_offset_path("g", "t" * 256, 0)
