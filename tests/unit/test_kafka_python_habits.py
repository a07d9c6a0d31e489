"""kafka-python habits: the Kafka* names, kafka-python's settings, the
three-field OffsetAndMetadata, kafka-python's ``str(error)``, and snappy."""

from __future__ import annotations

import logging
import struct
from typing import Any

import grpc
import pytest

import kclient
from kclient import errors
from kclient import records as rec
from kclient.admin import AdminClient
from kclient.compat import KAFKA_PYTHON_CONFIGS, check_configs
from kclient.consumer import Consumer
from kclient.errors import InvalidConfigError, KafkaTimeoutError, NotLeaderForPartitionError
from kclient.producer import Producer
from kclient.records import ATTRIBUTES_OFFSET, COMPRESSION_CODEC_MASK, HEADER_SIZE, Compression, decode_batch
from kclient.structs import OffsetAndMetadata, TopicPartition
from kclient.transport import map_rpc_error
from tests.unit.test_coordinator import commit_ok, joined, make
from tests.unit.test_records import Input, build_kafka_python, build_kclient, expected_records, kafka_python_decode

NOWHERE = "127.0.0.1:1"
"""No broker: the clients are made and closed without a request."""

# --- aliases -----------------------------------------------------------------------------


def test_kafka_python_names_are_the_same_classes() -> None:
    assert kclient.KafkaProducer is kclient.Producer
    assert kclient.KafkaConsumer is kclient.Consumer
    assert kclient.KafkaAdminClient is kclient.AdminClient
    assert {"KafkaProducer", "KafkaConsumer", "KafkaAdminClient"} <= set(kclient.__all__)


# --- settings ----------------------------------------------------------------------------

KAFKA_PYTHON_HABITS: dict[str, Any] = {
    "client_id": "billing",
    "api_version": (2, 8, 0),
    "retries": 5,
    "max_in_flight_requests_per_connection": 1,
    "socket_options": [],
    "reconnect_backoff_ms": 50,
}


def _compat_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kclient.compat"]


def test_producer_takes_kafka_pythons_settings_and_says_once_which_it_ignores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kclient.compat")
    p = kclient.KafkaProducer(bootstrap_servers=NOWHERE, acks="all", linger_ms=0, **KAFKA_PYTHON_HABITS)
    try:
        assert p.config["client_id"] == "billing" and p.config["api_version"] == (2, 8, 0)
        assert p.config["max_in_flight_requests_per_connection"] == 1  # acted on, not ignored
    finally:
        p.close(timeout=1)
    lines = _compat_lines(caplog)
    assert len(lines) == 1, lines
    assert lines[0].startswith("producer: api_version, reconnect_backoff_ms, retries (")
    assert lines[0].endswith("no meaning for kbroker; ignored")
    assert "client_id" not in lines[0] and "max_in_flight" not in lines[0]


def test_consumer_and_admin_take_kafka_pythons_settings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kclient.compat")
    c = kclient.KafkaConsumer(
        bootstrap_servers=NOWHERE,
        group_id="g",
        isolation_level="read_committed",
        check_crcs=True,
        **KAFKA_PYTHON_HABITS,
    )
    c.close(autocommit=False, timeout_ms=1000)
    a = kclient.KafkaAdminClient(bootstrap_servers=NOWHERE, **KAFKA_PYTHON_HABITS)
    a.close()
    lines = _compat_lines(caplog)
    assert len(lines) == 2, lines
    assert lines[0].startswith(
        "consumer: api_version, check_crcs (CRCs are always checked), max_in_flight_requests_per_connection,"
    )
    assert "max_in_flight_requests_per_connection" in lines[0] and "client_id" not in lines[0]
    assert lines[1].startswith("admin: api_version, client_id, max_in_flight_requests_per_connection,")


def test_no_line_when_every_setting_is_used(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kclient.compat")
    Consumer(bootstrap_servers=NOWHERE, client_id="x").close(autocommit=False)
    AdminClient(NOWHERE).close()
    assert _compat_lines(caplog) == []


@pytest.mark.parametrize("kind", ["producer", "consumer", "admin"])
def test_a_name_kafka_python_lacks_too_is_one_clear_error(kind: str) -> None:
    make_client = {
        "producer": lambda **c: Producer(bootstrap_servers=NOWHERE, **c),
        "consumer": lambda **c: Consumer(bootstrap_servers=NOWHERE, **c),
        "admin": lambda **c: AdminClient(NOWHERE, **c),
    }[kind]
    with pytest.raises(InvalidConfigError) as info:
        make_client(api_version=(2, 8), lingerms=5)
    assert str(info.value) == (
        f"InvalidConfigError: unknown {kind} setting(s): lingerms (neither kclient nor kafka-python has them)"
    )


def test_settings_whose_loss_would_change_the_program_are_refused_when_set() -> None:
    with pytest.raises(InvalidConfigError, match=r"partitioner=.* is not supported: .*pass partition="):
        Producer(bootstrap_servers=NOWHERE, partitioner=lambda key, all_, available: 0)
    with pytest.raises(InvalidConfigError, match="ssl_context"):
        Consumer(bootstrap_servers=NOWHERE, ssl_context=object())
    Producer(bootstrap_servers=NOWHERE, transactional_id=None, partitioner=None).close(timeout=1)


def test_every_kafka_python_setting_is_known() -> None:
    kafka = pytest.importorskip("kafka")
    for kind, cls in (
        ("producer", kafka.KafkaProducer),
        ("consumer", kafka.KafkaConsumer),
        ("admin", kafka.KafkaAdminClient),
    ):
        assert set(cls.DEFAULT_CONFIG) <= KAFKA_PYTHON_CONFIGS[kind], (
            kind,
            set(cls.DEFAULT_CONFIG) - KAFKA_PYTHON_CONFIGS[kind],
        )
    assert check_configs("admin", {"acks": 1, "group_id": "g"}, ()) == ["acks", "group_id"]


# --- OffsetAndMetadata ---------------------------------------------------------------------


def test_offset_and_metadata_takes_one_two_or_three_fields() -> None:
    assert OffsetAndMetadata(5) == (5, "", -1)
    assert OffsetAndMetadata(5, "m") == (5, "m", -1)
    om = OffsetAndMetadata(5, "m", 3)
    assert (om.offset, om.metadata, om.leader_epoch) == (5, "m", 3)
    offset, metadata, leader_epoch = om
    assert (offset, metadata, leader_epoch) == (5, "m", 3)
    assert OffsetAndMetadata(offset=7, metadata="", leader_epoch=-1) == OffsetAndMetadata(7)


def test_commit_takes_every_shape_kafka_python_programs_pass() -> None:
    kafka_structs = pytest.importorskip("kafka.structs")
    tp = TopicPartition("t", 0)
    shapes: list[Any] = [
        5,
        OffsetAndMetadata(5, "m"),
        OffsetAndMetadata(5, "m", 2),
        kafka_structs.OffsetAndMetadata(5, "m", 2),
    ]
    for shape in shapes:
        out = Consumer._offsets({tp: shape})
        assert out[tp].offset == 5 and out[tp].metadata in ("", "m"), shape


def test_three_field_commit_sends_offset_and_metadata() -> None:
    coord, transport, subs, _ = make()
    joined(coord, transport, subs, TopicPartition("t", 0))
    transport.on("CommitOffsets", commit_ok)
    coord.offsets.commit_sync({TopicPartition("t", 0): OffsetAndMetadata(9, "meta", 4)})
    sent = transport.requests("CommitOffsets")[0].topics[0].partitions[0]
    assert (sent.offset, sent.metadata) == (9, "meta")
    coord.close(autocommit=False)


# --- str(error) ----------------------------------------------------------------------------


def test_str_is_kafka_pythons_shape() -> None:
    assert str(NotLeaderForPartitionError("t-0 moved")) == "[Error 6] NotLeaderForPartitionError: t-0 moved"
    assert str(errors.InvalidTopicError("bad")) == "[Error 17] InvalidTopicError: bad"
    assert str(errors.UnknownError()) == (
        "[Error -1] UnknownError: The server experienced an unexpected error when processing the request."
    )
    assert str(errors.KafkaError("x")) == "KafkaError: x"
    assert str(errors.KafkaError()) == "KafkaError"
    assert NotLeaderForPartitionError("t-0 moved").message == "t-0 moved"


def test_str_matches_kafka_python_for_the_same_error() -> None:
    kafka_errors = pytest.importorskip("kafka.errors")
    for name in ("NotLeaderForPartitionError", "OffsetOutOfRangeError", "KafkaTimeoutError", "CommitFailedError"):
        ours, theirs = getattr(errors, name), getattr(kafka_errors, name)
        assert str(ours("some text")) == str(theirs("some text")), name


@pytest.mark.parametrize(
    "text",
    [
        "t-0 moved",
        "NotLeaderForPartitionError: t-0 moved",  # an older broker's abort details
        "[Error 6] NotLeaderForPartitionError: t-0 moved",  # str() of the broker's error
        "[Error 6] NotLeaderForPartitionError: NotLeaderForPartitionError: t-0 moved",
    ],
)
def test_the_name_is_never_repeated(text: str) -> None:
    assert str(NotLeaderForPartitionError(text)) == "[Error 6] NotLeaderForPartitionError: t-0 moved"


def test_a_wrapped_error_of_the_same_class_names_it_once() -> None:
    inner = KafkaTimeoutError("request to b:1 timed out")
    outer = KafkaTimeoutError(f"FindCoordinator: {inner}")
    assert str(outer) == "KafkaTimeoutError: FindCoordinator: request to b:1 timed out"
    other = KafkaTimeoutError(f"commit did not complete: {errors.NotCoordinatorError('moved')}")
    assert str(other) == "KafkaTimeoutError: commit did not complete: [Error 16] NotCoordinatorError: moved"
    wrapped = errors.UnknownError(f"KafkaTimeoutError: {inner}")  # kbroker's as_response_error
    assert str(wrapped) == "[Error -1] UnknownError: KafkaTimeoutError: request to b:1 timed out"


class _AbortedCall(grpc.RpcError):
    """What a broker's ``context.abort(INVALID_ARGUMENT, str(exc))`` looks like to the client."""

    def __init__(self, exc: errors.BrokerResponseError) -> None:
        self._exc = exc

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self) -> str:
        return str(self._exc)

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("kbroker-error-code", str(self._exc.errno)),)


def test_an_error_from_a_broker_reads_once() -> None:
    err = map_rpc_error(_AbortedCall(errors.InvalidTopicError("'a b' is not a valid topic name")), "b:1")
    assert type(err) is errors.InvalidTopicError
    assert str(err) == "[Error 17] InvalidTopicError: 'a b' is not a valid topic name"
    assert err.message == "'a b' is not a valid topic name"


# --- snappy ----------------------------------------------------------------------------------


def _kafka_python_snappy(monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka-python's xerial framing over cramjam's raw snappy (it wants python-snappy)."""
    cramjam = pytest.importorskip("cramjam")
    codec = pytest.importorskip("kafka.codec")

    class _Snappy:
        @staticmethod
        def compress(data: bytes) -> bytes:
            return bytes(cramjam.snappy.compress_raw(bytes(data)))

        @staticmethod
        def decompress(data: bytes) -> bytes:
            return bytes(cramjam.snappy.decompress_raw(bytes(data)))

    monkeypatch.setattr(codec, "snappy", _Snappy)


def test_snappy_is_installed_and_round_trips() -> None:
    assert rec.available(Compression.SNAPPY), "cramjam (a base dependency) provides snappy"
    inputs: list[Input] = [(i, b"k%d" % i, b"v" * (i % 700), [("h", b"x")]) for i in range(300)]  # > 32 KiB
    batch = build_kclient(inputs, Compression.SNAPPY)
    assert batch[HEADER_SIZE : HEADER_SIZE + 8] == b"\x82SNAPPY\x00"
    header, records = decode_batch(batch)
    assert header.compression is Compression.SNAPPY and records == expected_records(inputs)


def test_snappy_batches_interoperate_with_kafka_python_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    _kafka_python_snappy(monkeypatch)
    inputs: list[Input] = [(1700000000000 + i, b"key", b"value-%d" % i * 50, []) for i in range(200)]
    theirs = build_kafka_python(inputs, Compression.SNAPPY)
    assert decode_batch(theirs)[1] == expected_records(inputs)
    ours = build_kclient(inputs, Compression.SNAPPY)
    assert struct.unpack_from(">h", ours, ATTRIBUTES_OFFSET)[0] & COMPRESSION_CODEC_MASK == int(Compression.SNAPPY)
    kbatch, got = kafka_python_decode(ours)
    assert kbatch.compression_type == int(Compression.SNAPPY) and got == inputs


def test_producer_accepts_snappy() -> None:
    Producer(bootstrap_servers=NOWHERE, compression_type="snappy").close(timeout=1)
