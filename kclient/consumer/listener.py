"""The rebalance callbacks an application may give ``Consumer.subscribe``."""

from __future__ import annotations

import abc

from kclient.structs import TopicPartition


class ConsumerRebalanceListener(abc.ABC):
    """Callbacks around a rebalance (kafka-python's names), run on the thread calling ``poll``.

    ``on_partitions_revoked`` runs before the member rejoins, while it still owns the
    partitions (the place to commit what was processed); ``on_partitions_assigned`` runs
    once the new assignment is known, before any record of it is fetched (the place to
    ``seek``). Exceptions raised here are logged and do not stop the rebalance.
    """

    @abc.abstractmethod
    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None: ...

    @abc.abstractmethod
    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None: ...
