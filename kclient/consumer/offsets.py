"""A group's committed offsets: CommitOffsets (sync, async, auto-commit) and FetchOffsets.

Knows the group member only through the small ``GroupMember`` protocol below (the
coordinator's address, the generation to commit in, what a fencing error means), so it
imports nothing of the membership code (kclient/consumer/group.py builds it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from kclient.errors import (
    BrokerResponseError,
    CommitFailedError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    IllegalGenerationError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NoBrokersAvailable,
    NotCoordinatorError,
    RebalanceInProgressError,
    UnknownMemberIdError,
    for_code,
    raise_for_code,
)
from kclient.proto.kbroker.v1 import group_pb2
from kclient.retry import retry
from kclient.structs import OffsetAndMetadata, TopicPartition
from kclient.transport import map_rpc_error

if TYPE_CHECKING:
    from kclient.consumer.subscription_state import SubscriptionState
    from kclient.metadata import ClusterMetadata
    from kclient.transport import Transport

log = logging.getLogger(__name__)

Offsets = dict[TopicPartition, OffsetAndMetadata]
CommitCallback = Callable[[Offsets, Exception | None], Any]
"""``callback(offsets, exception)``: ``exception`` is ``None`` when the commit succeeded."""

# The coordinator moved or cannot be reached: find it again and retry.
COORDINATOR_ERRORS = (
    NotCoordinatorError,
    CoordinatorNotAvailableError,
    CoordinatorLoadInProgressError,
    KafkaConnectionError,
    KafkaTimeoutError,
    NoBrokersAvailable,
)
# The member is not (or no longer) in the generation that owns the partitions (a coordinator
# that just took the group over answers UNKNOWN_MEMBER_ID too).
UNKNOWN_MEMBER = (UnknownMemberIdError,)
FENCED = (IllegalGenerationError, RebalanceInProgressError, *UNKNOWN_MEMBER)


class GroupMember(Protocol):
    """What the offsets need from the group membership (thread-safe, like the member)."""

    group_id: str

    def coordinator(self) -> str | None: ...

    def ensure_coordinator(self, deadline: float) -> str: ...

    def mark_coordinator_dead(self, reason: object) -> None: ...

    def commit_identity(self) -> tuple[int, str]:
        """(generation, member id) to commit with; (-1, "") outside group management.
        Raises CommitFailedError when not in an active generation."""
        ...

    def fenced(self, err: KafkaError, generation: int) -> None:
        """The coordinator refused ``generation`` with ``err``: fix the member state."""
        ...

    def stable(self) -> bool:
        """``True`` when in a stable generation (or not group-managed): auto-commit may run."""
        ...


class GroupOffsets:
    """Commits and committed-offset lookups of one consumer's group.

    Synchronous calls run on the application thread; asynchronous commits complete on
    gRPC threads, which only record the result and queue the callback: callbacks run on
    the application thread from ``invoke_completed_callbacks`` (poll, commit, close).
    ``_inflight_lock`` guards the in-flight commits and the last committed offsets.
    """

    def __init__(
        self,
        transport: Transport,
        metadata: ClusterMetadata,
        subscription: SubscriptionState,
        member: GroupMember,
        config: Mapping[str, Any],
    ) -> None:
        self._transport = transport
        self._metadata = metadata
        self._subs = subscription
        self._member = member
        self.group_id: str = config["group_id"]
        self.auto_commit = bool(config["enable_auto_commit"])
        self._auto_commit_interval_s = config["auto_commit_interval_ms"] / 1000.0
        self._retry_backoff_s = config["retry_backoff_ms"] / 1000.0
        self._request_timeout_s = transport.request_timeout_s
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval_s
        self._inflight_lock = threading.Lock()
        self._inflight: set[Any] = set()
        self._completed: queue.SimpleQueue[tuple[CommitCallback | None, Offsets, Exception | None]] = (
            queue.SimpleQueue()
        )
        self._committed: dict[TopicPartition, int] = {}  # last offsets committed (auto-commit skips them)

    def new_generation(self, now: float) -> None:
        """A new assignment: nothing of it is known committed; auto-commit starts over."""
        with self._inflight_lock:
            self._committed = {}
        self._next_auto_commit = now + self._auto_commit_interval_s

    def _commit_request(self, offsets: Offsets, generation: int, member_id: str) -> group_pb2.CommitOffsetsRequest:
        req = group_pb2.CommitOffsetsRequest(group_id=self.group_id, generation_id=generation, member_id=member_id)
        topics: dict[str, Any] = {}
        for tp, om in sorted(offsets.items()):
            t = topics.get(tp.topic)
            if t is None:
                t = topics[tp.topic] = req.topics.add(name=tp.topic)
            t.partitions.add(index=tp.partition, offset=om.offset, metadata=om.metadata or "")
        return req

    def _commit_result(self, resp: group_pb2.CommitOffsetsResponse, offsets: Offsets) -> KafkaError | None:
        """The error of a commit response (group-level errors first); records successes."""
        errors: list[BrokerResponseError] = []
        done: dict[TopicPartition, int] = {}
        for t in resp.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.index)
                if p.error_code:
                    errors.append(for_code(p.error_code)(f"{t.name}-{p.index}: {p.error_message}"))
                elif tp in offsets:
                    done[tp] = offsets[tp].offset
        with self._inflight_lock:
            self._committed.update(done)
        for e in errors:
            if isinstance(e, FENCED):
                return e
        return errors[0] if errors else None

    def _commit_failed(self, err: KafkaError, generation: int) -> CommitFailedError:
        """Turn a fencing error into CommitFailedError, and fix the member state it reveals."""
        if generation < 0:
            return CommitFailedError(
                f"group {self.group_id!r} refused a commit from outside group management: a consumer using "
                f"assign() may commit a group's offsets only while the group has no active members ({err})"
            )
        self._member.fenced(err, generation)
        return CommitFailedError(
            f"commit refused by group {self.group_id!r}: generation {generation} of this member is over "
            f"({err}). The group has rebalanced (or is rebalancing) and the partitions may belong to another "
            "member now; usually poll() was not called within max_poll_interval_ms or heartbeats stopped for "
            "session_timeout_ms. The consumer rejoins on its next poll()."
        )

    def commit_sync(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], timeout_s: float | None = None) -> None:
        """Commit and wait: retries while the coordinator moves; CommitFailedError when fenced,
        KafkaTimeoutError when not done within ``timeout_s`` (default: the request timeout)."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self._request_timeout_s)
        self.wait_inflight(max(deadline - time.monotonic(), 0.0))  # keep commits in order
        self.invoke_completed_callbacks()
        offsets = dict(offsets)
        if not offsets:
            return
        member = self._member

        def commit() -> None:
            generation, member_id = member.commit_identity()
            addr = member.ensure_coordinator(deadline)
            req = self._commit_request(offsets, generation, member_id)
            timeout = min(self._request_timeout_s, max(deadline - time.monotonic(), 0.1))
            resp = self._transport.call(addr, "CommitOffsets", req, timeout_s=timeout)
            err = self._commit_result(resp, offsets)
            if err is not None:
                if isinstance(err, FENCED):
                    raise self._commit_failed(err, generation) from err
                raise err

        def on_error(err: KafkaError) -> None:
            if isinstance(err, COORDINATOR_ERRORS):
                member.mark_coordinator_dead(err)

        retry(
            commit,
            what=f"commit to group {self.group_id!r} did not complete",
            deadline=deadline,
            backoff_s=self._retry_backoff_s,
            on_error=on_error,
        )

    def commit_async(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], callback: CommitCallback | None = None
    ) -> None:
        """Send a commit without waiting; ``callback(offsets, exception)`` runs from a later poll/commit/close.

        Not retried (a later commit supersedes it); failures without a callback are logged.
        """
        offsets = dict(offsets)
        self.invoke_completed_callbacks()
        if not offsets:
            self._completed.put((callback, offsets, None))
            return
        try:
            generation, member_id = self._member.commit_identity()
            addr = self._member.ensure_coordinator(time.monotonic() + self._request_timeout_s)
            req = self._commit_request(offsets, generation, member_id)
            future = self._transport.stub(addr).CommitOffsets.future(req, timeout=self._request_timeout_s)
        except KafkaError as exc:
            self._completed.put((callback, offsets, exc))
            return
        with self._inflight_lock:
            self._inflight.add(future)

        def done(f: Any) -> None:
            err: Exception | None
            try:
                err = self._commit_result(f.result(), offsets)
            except KafkaError as exc:
                err = exc
            except Exception as exc:
                err = map_rpc_error(exc, addr) if hasattr(exc, "code") else KafkaError(f"commit failed: {exc!r}")
            if isinstance(err, FENCED):
                err = self._commit_failed(err, generation)
            elif isinstance(err, COORDINATOR_ERRORS):
                self._member.mark_coordinator_dead(err)
            with self._inflight_lock:
                self._inflight.discard(f)
            self._completed.put((callback, offsets, err))

        future.add_done_callback(done)

    def wait_inflight(self, timeout_s: float) -> None:
        with self._inflight_lock:
            pending = list(self._inflight)
        deadline = time.monotonic() + timeout_s
        for f in pending:
            try:
                f.result(timeout=max(deadline - time.monotonic(), 0.0))
            except Exception:
                pass  # reported through the callback

    def invoke_completed_callbacks(self) -> None:
        while True:
            try:
                callback, offsets, err = self._completed.get_nowait()
            except queue.Empty:
                return
            if callback is None:
                if err is not None:
                    log.warning("group %s: offset commit failed: %s", self.group_id, err)
                continue
            try:
                callback(offsets, err)
            except Exception:
                log.exception("group %s: offset commit callback raised", self.group_id)

    def maybe_auto_commit(self, now: float) -> None:
        """Every ``auto_commit_interval_ms``: commit the positions (records already returned)."""
        if not self.auto_commit or now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self._auto_commit_interval_s
        if not self._member.stable():
            return
        with self._inflight_lock:
            if self._inflight:
                return
            committed = dict(self._committed)
        offsets = {tp: om for tp, om in self._subs.all_consumed().items() if committed.get(tp) != om.offset}
        if offsets:
            self.commit_async(offsets)

    def fetch_committed(
        self, partitions: Iterable[TopicPartition], timeout_s: float | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets (``None`` where nothing is committed); any broker
        answers. KafkaTimeoutError after ``timeout_s`` (default: the request timeout)."""
        tps = sorted({TopicPartition(*tp) for tp in partitions})
        if not tps:
            return {}
        req = group_pb2.FetchOffsetsRequest(group_id=self.group_id)
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        for topic, parts in by_topic.items():
            req.topics.add(name=topic, partitions=parts)
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self._request_timeout_s)

        def fetch() -> dict[TopicPartition, OffsetAndMetadata | None]:
            addr = self._member.coordinator()
            timeout = min(self._request_timeout_s, max(deadline - time.monotonic(), 0.1))
            if addr is not None:
                resp = self._transport.call(addr, "FetchOffsets", req, timeout)
            else:
                resp = self._transport.call_any("FetchOffsets", req, self._metadata.broker_addresses(), timeout)
            raise_for_code(resp.error_code, resp.error_message)
            found: dict[TopicPartition, OffsetAndMetadata | None] = {}
            for t in resp.topics:
                for p in t.partitions:
                    raise_for_code(p.error_code, f"{t.name}-{p.index}")
                    found[TopicPartition(t.name, p.index)] = (
                        OffsetAndMetadata(p.offset, p.metadata) if p.offset >= 0 else None
                    )
            return {tp: found.get(tp) for tp in tps}

        def on_error(err: KafkaError) -> None:
            if isinstance(err, COORDINATOR_ERRORS):
                self._member.mark_coordinator_dead(err)

        return retry(
            fetch,
            what=f"committed offsets of group {self.group_id!r} not fetched",
            deadline=deadline,
            backoff_s=self._retry_backoff_s,
            on_error=on_error,
        )
