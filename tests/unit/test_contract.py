"""The wire contract: generated code is fresh, and one error table serves both sides."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kclient import errors
from kclient.proto.kbroker.v1 import common_pb2

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh() -> None:
    proc = subprocess.run([str(ROOT / "scripts" / "gen-protos"), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_error_code_has_one_exception_class_and_back() -> None:
    proto_codes = {v.number: v.name for v in common_pb2.ErrorCode.DESCRIPTOR.values if v.number != 0}
    assert set(proto_codes) == set(errors.ERRORS) | {-1}
    for code in proto_codes:
        cls = errors.for_code(code)
        assert cls.errno == code
    assert errors.for_code(12345) is errors.UnknownError


def test_retriable_flags_follow_kafka() -> None:
    assert errors.NotLeaderForPartitionError.retriable and errors.NotLeaderForPartitionError.invalid_metadata
    assert errors.UnknownTopicOrPartitionError.invalid_metadata
    assert not errors.OffsetOutOfRangeError.retriable
    assert errors.NotEnoughReplicasError.retriable and not errors.NotEnoughReplicasError.invalid_metadata
    assert str(errors.InvalidTopicError("bad")) == "[Error 17] InvalidTopicError: bad"
