"""Fetch sessions (Kafka's KIP-227), the fetching side: Kafka's FetchSessionHandler.

A fetcher (a follower broker's replica fetcher, a consumer) keeps one
:class:`FetchSessionHandler` per broker it fetches from. The first fetch is a full one
(session id 0, epoch 0: every partition); if the broker answers with a session id, the
following fetches are incremental: they carry only the partitions whose fetch data
(:class:`PartitionData`) changed since they were last sent, and the partitions to forget.
The broker then answers only the partitions with something new.

The handler never scans the fetcher's partitions on an incremental fetch: the fetcher
calls :meth:`FetchSessionHandler.touch` for every partition whose fetch data may have
changed (records appended, truncated, added, removed, delayed, throttled), and only those
are compared with what the session holds.

On any failure (a connection error, FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH)
the fetcher calls :meth:`FetchSessionHandler.reset`: the next fetch is a full one again
(closing the old session on the broker, if it still has it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_EPOCH = 2**31 - 1


def next_epoch(epoch: int) -> int:
    """The epoch that follows ``epoch`` (Kafka's FetchMetadata.nextEpoch)."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch >= MAX_EPOCH else epoch + 1


@dataclass(frozen=True, slots=True)
class PartitionData:
    """What a fetch asks of one partition."""

    fetch_offset: int
    log_start_offset: int
    current_leader_epoch: int
    max_bytes: int


@dataclass
class FetchRequestData:
    """One fetch to send: its session id and epoch, the partitions to name (every one in
    a full fetch) and those to forget."""

    session_id: int
    epoch: int
    full: bool
    to_send: dict[TopicPartition, PartitionData] = field(default_factory=dict)
    forgotten: list[TopicPartition] = field(default_factory=list)


class FetchSessionHandler:
    """The client side of one fetch session (one per broker fetched from).

    Invariants: ``session_id`` is 0 or the broker's session; ``epoch`` is the epoch of
    the next fetch (0: the next fetch is full); ``_sent`` is what the broker's session
    holds once the last built fetch is answered.

    Thread safety: none; the one thread that fetches from the broker owns it.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        """False: every fetch is sessionless (session epoch -1), as before sessions."""
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self._close_id = INVALID_SESSION_ID
        self._sent: dict[TopicPartition, PartitionData] = {}
        self._touched: set[TopicPartition] = set()

    @property
    def incremental(self) -> bool:
        return self.session_id != INVALID_SESSION_ID and self.epoch != INITIAL_EPOCH

    def touch(self, tp: TopicPartition) -> None:
        """The fetch data of ``tp`` may have changed (or it may now be fetched or not)."""
        self._touched.add(tp)

    def sent(self, tp: TopicPartition) -> PartitionData | None:
        """What the session holds for ``tp`` (as last sent)."""
        return self._sent.get(tp)

    def build(
        self,
        wanted: Callable[[TopicPartition], PartitionData | None],
        every: Callable[[], Iterable[TopicPartition]],
    ) -> FetchRequestData:
        """The next fetch. ``wanted(tp)``: what to ask of ``tp`` now, None if it is not to
        be fetched now; ``every()``: all the fetcher's partitions (read for a full fetch
        only)."""
        if not self.enabled:
            data = {tp: w for tp in every() if (w := wanted(tp)) is not None}
            self._touched.clear()
            return FetchRequestData(INVALID_SESSION_ID, FINAL_EPOCH, True, data)
        if not self.incremental:
            data = {tp: w for tp in every() if (w := wanted(tp)) is not None}
            self._touched.clear()
            self._sent = dict(data)
            close, self._close_id = self._close_id, INVALID_SESSION_ID
            return FetchRequestData(close, INITIAL_EPOCH, True, data)
        req = FetchRequestData(self.session_id, self.epoch, False)
        touched, self._touched = self._touched, set()
        for tp in touched:
            w = wanted(tp)
            s = self._sent.get(tp)
            if w is None:
                if s is not None:
                    del self._sent[tp]
                    req.forgotten.append(tp)
            elif w != s:
                self._sent[tp] = w
                req.to_send[tp] = w
        return req

    def build_all(self, wanted: Mapping[TopicPartition, PartitionData]) -> FetchRequestData:
        """The next fetch, given every partition to fetch now (Kafka's FetchSessionHandler
        Builder: the fetcher lists them all, the handler sends the difference)."""
        self._touched.update(wanted)
        self._touched.update(tp for tp in self._sent if tp not in wanted)
        return self.build(wanted.get, lambda: wanted)

    def handle_response(self, req: FetchRequestData, session_id: int, error_code: int) -> bool:
        """Take the answer to ``req``; False when it is a session error (nothing in it
        is usable, and the next fetch is a full one)."""
        if not self.enabled:
            return error_code == 0
        if error_code:
            self.reset()
            return False
        if req.full:
            self.session_id = session_id
            self.epoch = next_epoch(INITIAL_EPOCH) if session_id != INVALID_SESSION_ID else INITIAL_EPOCH
        elif session_id == INVALID_SESSION_ID:
            self._forget()  # the broker closed the session (it emptied): start again
        else:
            self.epoch = next_epoch(self.epoch)
        return True

    def reset(self) -> None:
        """The session is lost or unknown (a connection error, a session error): the next
        fetch is a full one, closing the old session if the broker still has it."""
        if self.session_id != INVALID_SESSION_ID:
            self._close_id = self.session_id
        self._forget()

    def _forget(self) -> None:
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self._sent.clear()
        self._touched.clear()
