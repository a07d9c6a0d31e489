"""ZooKeeper failures as kbroker errors, for code outside :mod:`kbroker.cluster`.

Hierarchy::

    KafkaError
    └── ZooKeeperError            ZooKeeper refused a request or failed (any of kazoo's errors)
        ├── ZooKeeperTimeoutError  no answer in time (connecting, or a bounded wait)
        └── ZooKeeperNoAuthError   a secured znode refused this session's identity (NoAuth)

:func:`mapped` turns kazoo's exceptions into these at a boundary, ``raise ... from`` the
original (httpx's ``map_exceptions``): ``kctl`` runs each command inside it, and the
cluster modules that tools call directly (:mod:`kbroker.cluster.zk_acl_migration`,
:mod:`kbroker.cluster.preferred_election`) map their own. Inside ``cluster/`` kazoo's
exceptions stay as they are (compare-and-set loops branch on them, and
:class:`~kbroker.cluster.zk_events.ZkEventThread` recognises a connection loss by its
type), so the broker's ZooKeeper watcher threads are unaffected.

Thread safety: stateless.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kazoo.exceptions import KazooException, NoAuthError
from kazoo.handlers.threading import KazooTimeoutError

from kclient.errors import KafkaError


class ZooKeeperError(KafkaError):
    """ZooKeeper failed a request. ``message`` is kazoo's error name and its text
    (``ConnectionLoss``, ``BadVersionError: ...``)."""


class ZooKeeperTimeoutError(ZooKeeperError):
    """ZooKeeper did not answer in time."""

    retriable = True


class ZooKeeperNoAuthError(ZooKeeperError):
    """ZooKeeper refused a write (or an ACL change) on a secured znode: this session has no
    credential, or not the one that owns the znode."""


def _named(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextmanager
def mapped() -> Iterator[None]:
    """Re-raise kazoo's exceptions met inside as :class:`ZooKeeperError` and its subclasses
    (also usable as a decorator). Anything else passes through unchanged."""
    try:
        yield
    except KazooTimeoutError as exc:
        raise ZooKeeperTimeoutError(_named(exc)) from exc
    except NoAuthError as exc:
        raise ZooKeeperNoAuthError(_named(exc)) from exc
    except KazooException as exc:
        raise ZooKeeperError(_named(exc)) from exc
