"""The transaction RPCs of the ``kbroker.v1.Broker`` servicer (txn.proto): protobuf in, one
call of the core (:class:`~kbroker.api.txn_api.TransactionApi`), protobuf out.

A refusal of the whole request (the core raised one of the error table's exceptions) is
the response's own ``error_code`` and, in the responses with partitions, every
partition's too, as Kafka's AddPartitionsToTxn and TxnOffsetCommit put it. A broker
whose core has no transaction layer answers COORDINATOR_NOT_AVAILABLE.

Thread safety: every handler blocks (ZooKeeper) and runs on the server's request pool.
"""

from __future__ import annotations

from typing import Any

from kbroker.api.txn_api import CommittedOffset, TransactionApi
from kbroker.doors.grpc.rpc import blocking, set_error
from kclient.errors import (
    BrokerResponseError,
    CoordinatorNotAvailableError,
    TransactionalIdNotFoundError,
    as_response_error,
)
from kclient.proto.kbroker.v1 import txn_pb2


def _no_transactions() -> CoordinatorNotAvailableError:
    return CoordinatorNotAvailableError("this broker does not serve transactions")


def _fill_partition_errors(
    topics: Any, asked: list[tuple[str, list[int]]], errors: dict[tuple[str, int], BrokerResponseError | None]
) -> None:
    for name, partitions in asked:
        tr = topics.add(name=name)
        for index in partitions:
            pe = tr.partitions.add(index=index)
            err = errors.get((name, index))
            if err is not None:
                set_error(pe, err)


class TxnRpcs:
    """Mixin of the servicer: needs ``self.txn_api`` (None: transactions not served) and
    ``self._offload``."""

    txn_api: TransactionApi | None

    def _txn(self) -> TransactionApi:
        if self.txn_api is None:
            raise _no_transactions()
        return self.txn_api

    @blocking
    def AddPartitionsToTxn(self, request: txn_pb2.AddPartitionsToTxnRequest) -> txn_pb2.AddPartitionsToTxnResponse:
        asked = [(t.name, list(t.partitions)) for t in request.topics]
        wanted = [(name, p) for name, parts in asked for p in parts]
        resp = txn_pb2.AddPartitionsToTxnResponse()
        try:
            errors = self._txn().add_partitions(
                request.transactional_id, request.producer_id, request.producer_epoch, wanted
            )
        except Exception as exc:
            err = as_response_error(exc)
            set_error(resp, err)
            errors = dict.fromkeys(wanted, err)
        _fill_partition_errors(resp.topics, asked, errors)
        return resp

    @blocking
    def AddOffsetsToTxn(self, request: txn_pb2.AddOffsetsToTxnRequest) -> txn_pb2.AddOffsetsToTxnResponse:
        resp = txn_pb2.AddOffsetsToTxnResponse()
        try:
            self._txn().add_offsets(
                request.transactional_id, request.producer_id, request.producer_epoch, request.group_id
            )
        except Exception as exc:
            set_error(resp, as_response_error(exc))
        return resp

    @blocking
    def TxnOffsetCommit(self, request: txn_pb2.TxnOffsetCommitRequest) -> txn_pb2.TxnOffsetCommitResponse:
        asked = [(t.name, [p.index for p in t.partitions]) for t in request.topics]
        offsets = {
            (t.name, p.index): CommittedOffset(p.offset, p.metadata) for t in request.topics for p in t.partitions
        }
        resp = txn_pb2.TxnOffsetCommitResponse()
        try:
            errors = self._txn().commit_offsets(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.group_id,
                offsets,
                member_id=request.member_id,
                generation_id=request.generation_id if request.HasField("generation_id") else -1,
                group_instance_id=request.group_instance_id if request.HasField("group_instance_id") else None,
            )
        except Exception as exc:
            err = as_response_error(exc)
            set_error(resp, err)
            errors = dict.fromkeys(offsets, err)
        _fill_partition_errors(resp.topics, asked, errors)
        return resp

    @blocking
    def EndTxn(self, request: txn_pb2.EndTxnRequest) -> txn_pb2.EndTxnResponse:
        resp = txn_pb2.EndTxnResponse()
        try:
            self._txn().end_txn(
                request.transactional_id, request.producer_id, request.producer_epoch, request.committed
            )
        except Exception as exc:
            set_error(resp, as_response_error(exc))
        return resp

    @blocking
    def DescribeTransactions(
        self, request: txn_pb2.DescribeTransactionsRequest
    ) -> txn_pb2.DescribeTransactionsResponse:
        resp = txn_pb2.DescribeTransactionsResponse()
        try:
            described = self._txn().describe(list(request.transactional_ids))
        except Exception as exc:
            failed: BrokerResponseError | None = as_response_error(exc)
            described = [(tid, failed, None) for tid in request.transactional_ids]
        for tid, err, meta in described:
            d = resp.transaction_states.add(transactional_id=tid, producer_id=-1, producer_epoch=-1)
            d.transaction_start_time_ms = -1
            if err is not None:
                set_error(d, err)
                continue
            if meta is None:
                set_error(d, TransactionalIdNotFoundError(f"transactional id {tid!r} is not known"))
                continue
            d.transaction_state = str(meta.state.value)
            d.transaction_timeout_ms = meta.timeout_ms
            d.producer_id, d.producer_epoch = meta.producer_id, meta.producer_epoch
            if meta.state.value == "Ongoing" or meta.state.preparing:
                d.transaction_start_time_ms = meta.start_ms
            by_topic: dict[str, list[int]] = {}
            for topic, index in sorted(meta.partitions):
                by_topic.setdefault(topic, []).append(index)
            for topic, indexes in by_topic.items():
                d.topics.add(name=topic, partitions=indexes)
        return resp

    @blocking
    def ListTransactions(self, request: txn_pb2.ListTransactionsRequest) -> txn_pb2.ListTransactionsResponse:
        resp = txn_pb2.ListTransactionsResponse()
        try:
            unknown, listed = self._txn().list_transactions(
                list(request.state_filters), list(request.producer_id_filters)
            )
        except Exception as exc:
            set_error(resp, as_response_error(exc))
            return resp
        resp.unknown_state_filters.extend(unknown)
        for meta in listed:
            resp.transaction_states.add(
                transactional_id=meta.transactional_id,
                producer_id=meta.producer_id,
                transaction_state=str(meta.state.value),
            )
        return resp
