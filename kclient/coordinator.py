"""Moved to kclient/consumer/ (group.py, offsets.py, listener.py); kept for old imports."""

from kclient.consumer.group import ConsumerCoordinator, MemberState
from kclient.consumer.listener import ConsumerRebalanceListener
from kclient.consumer.offsets import CommitCallback

__all__ = ["CommitCallback", "ConsumerCoordinator", "ConsumerRebalanceListener", "MemberState"]
