"""Following config changes in ZooKeeper: watches on ``/config/changes`` (Kafka's
``config_change_<seq>`` notifications, written with every entity config change by
:meth:`ZkClient.set_entity_config <kbroker.cluster.zk_client.ZkClient.set_entity_config>`)
and on the entity config znodes themselves.

The dynamic broker configs (:mod:`kbroker.dynamic_config`) and the SCRAM credential cache
(:mod:`kbroker.security.credentials`) arm their watches here; ``watch`` is a
:meth:`ZkEventThread.watch <kbroker.cluster.zk_events.ZkEventThread.watch>`, fired once
per arming. Reading one notification or deleting it are ZkClient's
(:meth:`~kbroker.cluster.zk_client.ZkClient.config_change`,
:meth:`~kbroker.cluster.zk_client.ZkClient.delete_config_change`).

Thread safety: stateless functions over a thread-safe ZkClient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kazoo.exceptions import NoNodeError

from kbroker.cluster import zkdata
from kbroker.cluster.zk_client import ZkClient

Watch = Callable[[Any], object]


def watch_config_changes(zk: ZkClient, watch: Watch) -> list[tuple[int, str]]:
    """(sequence number, child) of every notification, oldest first, arming ``watch`` on
    the children; without ``/config/changes``, [] and ``watch`` armed on its creation."""
    try:
        children = zk.kazoo.get_children(zkdata.CONFIG_CHANGES, watch=watch)
    except NoNodeError:
        zk.kazoo.exists(zkdata.CONFIG_CHANGES, watch=watch)
        return []
    return sorted((zkdata.config_change_seq(c), c) for c in children if zkdata.config_change_seq(c) >= 0)


def watch_entity_config(zk: ZkClient, entity_type: str, name: str, watch: Watch) -> None:
    """Arm ``watch`` on ``/config/<entity_type>/<name>``: it fires on creation, change and deletion."""
    zk.kazoo.exists(zkdata.entity_config_path(entity_type, name), watch=watch)
