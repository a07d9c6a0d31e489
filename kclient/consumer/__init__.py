"""The consumer, as aiokafka's ``consumer`` package: a thin ``Consumer`` facade over

- ``subscription_state``: what is subscribed or assigned, positions, pause flags;
- ``fetcher``: pipelined Fetches and ListOffsets, records decoded once (or into column buffers);
- ``group``: group membership (FindCoordinator, JoinGroup/SyncGroup, heartbeats, leave);
- ``offsets``: commits (sync, async, auto-commit) and committed offsets of the group;
- ``listener``: the ``ConsumerRebalanceListener`` callbacks.

Imports go one way: consumer -> group -> offsets -> subscription_state -> listener, and
consumer -> fetcher -> subscription_state.
"""

from kclient.consumer.consumer import Consumer
from kclient.consumer.fetcher import Fetcher
from kclient.consumer.group import ConsumerCoordinator, MemberState
from kclient.consumer.listener import ConsumerRebalanceListener
from kclient.consumer.offsets import CommitCallback, GroupOffsets
from kclient.consumer.subscription_state import SubscriptionState
from kclient.records import ColumnBuffers, RecordColumns, arrow_schema

__all__ = [
    "ColumnBuffers",
    "CommitCallback",
    "Consumer",
    "ConsumerCoordinator",
    "ConsumerRebalanceListener",
    "Fetcher",
    "GroupOffsets",
    "MemberState",
    "RecordColumns",
    "SubscriptionState",
    "arrow_schema",
]
