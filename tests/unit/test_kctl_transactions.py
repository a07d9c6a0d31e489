"""``kctl transactions`` (kafka-transactions.sh) over a fake AdminClient: parsing, Kafka's
tables, the abort forms and their errors; and AdminClient.abort_transaction / batch_at
over a fake transport (the WriteTxnMarkers and Fetch they send, where, and retries)."""

from __future__ import annotations

from typing import Any

import pytest

from kbroker.cli import main, transactions
from kclient.admin import AdminClient, PartitionBatch, TransactionDescription, TransactionListing
from kclient.errors import (
    ClusterAuthorizationFailedError,
    InvalidProducerEpochError,
    TransactionalIdNotFoundError,
    UnknownTopicOrPartitionError,
)
from kclient.proto.kbroker.v1 import log_pb2, txn_pb2
from kclient.records import build_control_batch, encode_batch, read_header
from kclient.structs import TopicPartition
from tests.support import FakeMetadata, FakeTransport

B = ["--bootstrap-server", "127.0.0.1:9092"]


class FakeAdmin:
    """The AdminClient methods ``kctl transactions`` calls, answering from fields."""

    def __init__(self) -> None:
        self.listings: list[TransactionListing] = []
        self.descriptions: dict[str, TransactionDescription] = {}
        self.batch: PartitionBatch | Exception | None = None
        self.abort_error: Exception | None = None
        self.aborted: list[tuple[str, int, int, int, int]] = []
        self.batches_read: list[tuple[str, int, int]] = []

    def __enter__(self) -> FakeAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def list_transactions(self) -> list[TransactionListing]:
        return list(self.listings)

    def describe_transactions(self, ids: list[str]) -> list[TransactionDescription]:
        out = []
        for tid in ids:
            if tid not in self.descriptions:
                raise TransactionalIdNotFoundError(f"transactional id {tid!r}")
            out.append(self.descriptions[tid])
        return out

    def batch_at(self, topic: str, partition: int, offset: int) -> PartitionBatch:
        self.batches_read.append((topic, partition, offset))
        if isinstance(self.batch, Exception):
            raise self.batch
        assert self.batch is not None
        return self.batch

    def abort_transaction(self, topic: str, partition: int, pid: int, epoch: int, coordinator_epoch: int) -> None:
        if self.abort_error is not None:
            raise self.abort_error
        self.aborted.append((topic, partition, pid, epoch, coordinator_epoch))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    admin = FakeAdmin()
    monkeypatch.setattr(transactions, "AdminClient", lambda *a, **k: admin)
    monkeypatch.setattr(transactions, "_now_ms", lambda: 10_000)
    return admin


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main.main(["transactions", *argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def _ongoing(tid: str = "tx") -> TransactionDescription:
    return TransactionDescription(
        tid, 1, "Ongoing", 7, 2, 60000, 4_000, [TopicPartition("t", 0), TopicPartition("u", 3)]
    )


def _batch(offset: int = 5, *, transactional: bool = True, lso: int = 5, hw: int = 9) -> PartitionBatch:
    raw = encode_batch(
        [b"a", b"b"],
        producer_id=42,
        producer_epoch=3,
        base_sequence=0,
        is_transactional=transactional,
        base_offset=offset,
    )
    return PartitionBatch(read_header(raw), hw, lso, 0)


# --- output --------------------------------------------------------------------------------


def test_table_pads_each_column_and_ends_cells_with_a_tab() -> None:
    assert transactions.table(("A", "Bee"), [["long", "x"]]) == ["A   \tBee", "long\tx"]


def test_list_prints_kafkas_columns(fake: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    fake.listings = [TransactionListing("a", 7, "Ongoing", 1), TransactionListing("bb", 12, "CompleteCommit", 0)]
    code, out, err = run(capsys, "list", *B)
    assert code == 0 and err == ""
    assert [line.split("\t") for line in out] == [
        ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"],
        ["a              ", "1          ", "7         ", "Ongoing"],
        ["bb             ", "0          ", "12        ", "CompleteCommit"],
    ]


def test_list_with_nothing_prints_the_header(fake: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "list", *B)
    assert code == 0 and [line.split() for line in out] == [list(transactions.LIST_HEADER)]


def test_list_duration_filter_keeps_transactions_open_longer(
    fake: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.listings = [
        TransactionListing("old", 1, "Ongoing", 0),
        TransactionListing("new", 2, "Ongoing", 0),
        TransactionListing("idle", 3, "CompleteCommit", 0),
        TransactionListing("gone", 4, "Ongoing", 0),
    ]
    fake.descriptions = {
        "old": _ongoing("old"),  # started at 4000, now 10000: 6000 ms
        "new": TransactionDescription("new", 0, "Ongoing", 2, 0, 60000, 9_500, []),
        "idle": TransactionDescription("idle", 0, "CompleteCommit", 3, 0, 60000, None, []),
    }
    code, out, _ = run(capsys, "list", "--duration-filter", "1000", *B)
    assert code == 0 and [line.split()[0] for line in out[1:]] == ["old"]
    code, out, _ = run(capsys, "list", "--duration-filter", "-1", *B)
    assert [line.split()[0] for line in out[1:]] == ["old", "new", "idle", "gone"]


def test_describe_prints_kafkas_columns(fake: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    fake.descriptions["tx"] = _ongoing()
    code, out, _ = run(capsys, "describe", "--transactional-id", "tx", *B)
    assert code == 0
    assert out[0].split() == list(transactions.DESCRIBE_HEADER)
    assert out[1].split() == ["1", "tx", "7", "2", "Ongoing", "60000", "4000", "6000", "t-0,u-3"]


def test_describe_without_an_open_transaction_says_none(fake: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    fake.descriptions["tx"] = TransactionDescription("tx", 2, "CompleteAbort", 7, 3, 60000, None, [])
    code, out, _ = run(capsys, "describe", "--transactional-id", "tx", *B)
    assert code == 0 and out[1].split() == ["2", "tx", "7", "3", "CompleteAbort", "60000", "None", "None"]


def test_describe_an_unknown_id_is_one_line_and_exit_1(fake: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "describe", "--transactional-id", "nope", *B)
    assert code == 1 and out == []
    assert err.count("\n") == 1
    assert err.startswith("kctl: Failed to describe transaction state of transactional-id `nope`: ")
    assert "TransactionalIdNotFoundError" in err


def test_describe_needs_the_id(fake: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main.main(["transactions", "describe", *B])
    assert exc.value.code == 2
    assert "--transactional-id" in capsys.readouterr().err


# --- abort -----------------------------------------------------------------------------------


ABORT = ["abort", "--topic", "t", "--partition", "0", *B]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "must be identified either with --start-offset or with --producer-id"),
        (["--start-offset", "5", "--producer-id", "1"], "--start-offset cannot be combined with --producer-id"),
        (["--producer-id", "1"], "Missing required argument --producer-epoch"),
        (["--producer-id", "1", "--producer-epoch", "0"], "Missing required argument --coordinator-epoch"),
        (["--producer-epoch", "0", "--coordinator-epoch", "0"], "Missing required argument --producer-id"),
        (["--start-offset", "-1"], "--start-offset must be >= 0"),
        (["--producer-id", "1", "--producer-epoch", "40000", "--coordinator-epoch", "0"], "--producer-epoch must be"),
    ],
)
def test_abort_flags_are_checked(
    fake: FakeAdmin, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    code, out, err = run(capsys, *ABORT, *extra)
    assert code == 2 and out == [] and fake.aborted == [] and fake.batches_read == []
    assert err.startswith("kctl: ") and message in err and err.count("\n") == 1


def test_abort_needs_topic_and_partition(fake: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main.main(["transactions", "abort", "--start-offset", "3", *B])
    assert exc.value.code == 2


def test_abort_by_producer(fake: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--producer-id", "42", "--producer-epoch", "3", "--coordinator-epoch", "-1"]
    code, out, err = run(capsys, *ABORT, *argv)
    assert (code, out, err) == (0, [], "")
    assert fake.aborted == [("t", 0, 42, 3, 0)]  # a coordinator epoch of -1 (none seen) becomes 0, as Kafka's


def test_abort_by_start_offset_reads_the_producer_from_the_batch(
    fake: FakeAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.batch = _batch(5)
    code, out, err = run(capsys, *ABORT, "--start-offset", "5", "--verbose")
    assert code == 0 and out == []
    assert fake.batches_read == [("t", 0, 5)]
    assert fake.aborted == [("t", 0, 42, 3, 0)]
    assert "aborted the transaction {topicPartition=t-0, producerId=42, producerEpoch=3" in err


@pytest.mark.parametrize(
    ("batch", "offset", "why"),
    [
        (PartitionBatch(None, 5, 5, 0), 5, "there is no record at that offset yet"),
        (_batch(4), 5, "inside a batch that starts at 4"),
        (_batch(5, transactional=False), 5, "is not transactional (producer id 42)"),
        (_batch(5, lso=9), 5, "has completed (the last stable offset is 9)"),
        (
            PartitionBatch(read_header(build_control_batch(42, 3, True, 0, base_offset=5)), 9, 9, 0),
            5,
            "holds a transaction marker",
        ),
    ],
)
def test_abort_by_start_offset_refuses_what_is_no_open_transaction(
    fake: FakeAdmin, capsys: pytest.CaptureFixture[str], batch: PartitionBatch, offset: int, why: str
) -> None:
    fake.batch = batch
    code, _, err = run(capsys, *ABORT, "--start-offset", str(offset))
    assert code == 1 and fake.aborted == []
    assert err.startswith(f"kctl: Could not find any open transactions starting at offset {offset} on partition t-0: ")
    assert why in err and err.count("\n") == 1


def test_abort_refused_is_one_line_and_exit_1(fake: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    fake.abort_error = ClusterAuthorizationFailedError("CLUSTER_ACTION on the Cluster is denied")
    code, _, err = run(capsys, *ABORT, "--producer-id", "1", "--producer-epoch", "0", "--coordinator-epoch", "0")
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("kctl: Failed to abort transaction {topicPartition=t-0, producerId=1, producerEpoch=0")
    assert "ClusterAuthorizationFailedError" in err


def test_abort_of_an_unknown_partition_is_one_line(fake: FakeAdmin, capsys: pytest.CaptureFixture[str]) -> None:
    fake.batch = UnknownTopicOrPartitionError("t-0 does not exist")
    code, _, err = run(capsys, *ABORT, "--start-offset", "0")
    assert code == 1 and "Failed to read the batch at offset 0 of t-0" in err and err.count("\n") == 1


# --- AdminClient.abort_transaction and batch_at over a fake transport ----------------------------


class _Metadata(FakeMetadata):
    def refresh(self, topics: Any = None, *, all_topics: bool = False, deadline: float | None = None) -> None:
        super().refresh(topics, all_topics=all_topics)


def _admin(answers: dict[str, Any]) -> tuple[AdminClient, FakeTransport]:
    admin = AdminClient.__new__(AdminClient)
    transport = FakeTransport(answers)
    admin._transport = transport  # type: ignore[assignment]
    admin._metadata = _Metadata({"t": 2}, addresses=["b1:1", "b2:1"], leader="b2:1")  # type: ignore[assignment]
    admin._timeout_ms = 2000
    return admin, transport


def _markers_answer(code: int) -> Any:
    def answer(request: txn_pb2.WriteTxnMarkersRequest) -> txn_pb2.WriteTxnMarkersResponse:
        resp = txn_pb2.WriteTxnMarkersResponse()
        for m in request.markers:
            mr = resp.markers.add(producer_id=m.producer_id)
            for t in m.topics:
                mr.topics.add(name=t.name).partitions.add(index=t.partitions[0], error_code=code)  # type: ignore[arg-type]
        return resp

    return answer


def test_abort_transaction_writes_an_abort_marker_at_the_leader() -> None:
    admin, transport = _admin({"WriteTxnMarkers": _markers_answer(0)})
    admin.abort_transaction("t", 1, 42, 3, 0)
    [(address, method, request)] = transport.calls
    assert (address, method) == ("b2:1", "WriteTxnMarkers")
    [m] = request.markers
    assert (m.producer_id, m.producer_epoch, m.committed, m.coordinator_epoch) == (42, 3, False, 0)
    assert [(t.name, list(t.partitions)) for t in m.topics] == [("t", [1])]


def test_abort_transaction_retries_while_leadership_moves() -> None:
    admin, transport = _admin({})
    transport.on("WriteTxnMarkers", _markers_answer(6), _markers_answer(0))  # NOT_LEADER_OR_FOLLOWER, then ok
    admin.abort_transaction("t", 0, 42, 3, 0)
    assert transport.methods() == ["WriteTxnMarkers", "WriteTxnMarkers"]


def test_abort_transaction_raises_refusals() -> None:
    denied = txn_pb2.WriteTxnMarkersResponse(error_code=31, error_message="denied")  # type: ignore[arg-type]
    admin, _ = _admin({"WriteTxnMarkers": denied})
    with pytest.raises(ClusterAuthorizationFailedError, match="denied"):
        admin.abort_transaction("t", 0, 42, 3, 0)
    admin, _ = _admin({"WriteTxnMarkers": _markers_answer(47)})
    with pytest.raises(InvalidProducerEpochError):
        admin.abort_transaction("t", 0, 42, 3, 0)
    admin, transport = _admin({})
    with pytest.raises(UnknownTopicOrPartitionError, match="t-5 does not exist"):
        admin.abort_transaction("t", 5, 42, 3, 0)
    assert transport.calls == []


def test_batch_at_reads_one_batch_header_at_the_leader() -> None:
    raw = encode_batch([b"x"], producer_id=42, producer_epoch=3, base_sequence=0, is_transactional=True, base_offset=7)

    def fetched(request: log_pb2.FetchRequest) -> log_pb2.FetchResponse:
        [t] = request.topics
        [p] = t.partitions
        assert (t.name, p.index, p.fetch_offset) == ("t", 1, 7)
        assert not request.HasField("isolation_level")  # read_uncommitted: the open transaction's records
        resp = log_pb2.FetchResponse()
        resp.topics.add(name="t").partitions.add(
            index=1, records=raw, high_watermark=8, last_stable_offset=7, log_start_offset=0
        )
        return resp

    admin, transport = _admin({"Fetch": fetched})
    got = admin.batch_at("t", 1, 7)
    assert got.header is not None and got.header.is_transactional
    assert (got.header.producer_id, got.header.producer_epoch, got.header.base_offset) == (42, 3, 7)
    assert got[1:] == (8, 7, 0)
    assert transport.addresses() == ["b2:1"]
