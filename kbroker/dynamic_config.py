"""Dynamic broker configs applied to a running broker (Kafka's DynamicBrokerConfig).

The values live in ``/config/brokers/<id>`` (this broker) and ``/config/brokers/<default>``
(every broker); :mod:`kbroker.cluster.config_admin` writes them, each write with a
``/config/changes/config_change_N`` notification.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import fields

from kbroker.cluster import zkdata
from kbroker.cluster.config_admin import validate_broker_config
from kbroker.cluster.config_changes import watch_config_changes, watch_entity_config
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zk_events import ZkEventThread
from kbroker.config import BrokerConfig, with_overrides
from kbroker.storage.log_config import LogConfig
from kclient.errors import KafkaError

log = logging.getLogger(__name__)

Listener = Callable[[BrokerConfig, BrokerConfig], None]
"""Called with (old, new) effective config after a change."""

CHANGE_EXPIRATION_MS = 15 * 60 * 1000
"""Notifications older than this are deleted (Kafka's changeExpirationMs)."""


def merge(static: BrokerConfig, default_layer: Mapping[str, str], broker_layer: Mapping[str, str]) -> BrokerConfig:
    """The effective config: per-broker dynamic > cluster ``<default>`` dynamic > static.

    Each stored value is checked as IncrementalAlterConfigs checks it; a bad one (not a
    dynamic config, or a bad value) is logged at ERROR and ignored, never fatal. If the
    log defaults that result do not form a valid :class:`LogConfig` together, the log
    defaults of the static config plus the ``<default>`` layer are tried, then the static.
    """
    layers: list[dict[str, str]] = []
    for where, layer in (("<default>", default_layer), ("broker", broker_layer)):
        good: dict[str, str] = {}
        for key, value in layer.items():
            try:
                validate_broker_config(key, value)
            except KafkaError as exc:
                log.error("dynamic config %s=%r at %s ignored: %s", key, value, where, exc)
                continue
            good[key] = value
        layers.append(good)
    for tried in ({**layers[0], **layers[1]}, layers[0], {}):
        try:
            out = with_overrides(static, tried)
            LogConfig.from_properties(out.log_defaults)
            return out
        except KafkaError as exc:
            log.error("dynamic configs %s ignored: %s", tried, exc)
    return static


class DynamicBrokerConfig:
    """The broker's effective config, kept up to date from ZooKeeper.

    Precedence (Kafka's): ``/config/brokers/<id>`` > ``/config/brokers/<default>`` >
    ``server.properties`` / command-line flags > Kafka's default. :meth:`load` reads the
    znodes at start-up (before the log manager is built, so a restarted broker starts with
    the same values); :meth:`start` then watches both znodes and ``/config/changes`` and
    re-reads them on every change, calling each :meth:`on_change` listener with the old
    and new effective config when it changed. Bad stored values are logged and skipped.

    Notifications older than 15 minutes are deleted (Kafka's changeExpirationMs), by
    whichever broker sees them.

    Thread safety: ZooKeeper's watch callbacks only enqueue; one daemon thread
    ``dynamic-config`` (a :class:`ZkEventThread`) reads ZooKeeper and runs the listeners, so listeners never run
    concurrently with each other. :meth:`effective` may be called from any thread (it
    returns an immutable snapshot reference).
    """

    def __init__(self, static: BrokerConfig, zk: ZkClient) -> None:
        self._static = static
        self._zk = zk
        self._effective = static
        self._listeners: list[Listener] = []
        self._events = ZkEventThread(zk, "dynamic-config", lambda _kind: self._reload())

    @property
    def static(self) -> BrokerConfig:
        return self._static

    def effective(self) -> BrokerConfig:
        return self._effective

    def on_change(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def load(self) -> BrokerConfig:
        """Read the dynamic configs once (no watches, no listeners); the effective config."""
        self._effective = self._read(watch=False)
        if self._effective != self._static:
            log.info("dynamic broker configs in force: %s", describe_change(self._static, self._effective))
        return self._effective

    def start(self) -> None:
        """Watch from now on (every event re-reads both znodes and re-arms the watches)."""
        self._events.start()

    def stop(self) -> None:
        self._events.stop()

    def sync(self, timeout_s: float = 10.0) -> None:
        """Wait until every event enqueued so far has been handled (tests)."""
        self._events.sync(timeout_s)

    def _reload(self) -> None:
        new = self._read(watch=True)
        self._purge_changes()
        old, self._effective = self._effective, new
        if new == old:
            return
        log.info("dynamic broker configs changed: %s", describe_change(old, new))
        for listener in self._listeners:
            try:
                listener(old, new)
            except Exception:
                log.exception("a dynamic config listener failed")

    def _read(self, *, watch: bool) -> BrokerConfig:
        if watch:
            for name in (str(self._static.broker_id), zkdata.DEFAULT_BROKER_ENTITY):
                watch_entity_config(self._zk, "brokers", name, self._events.watch)
            watch_config_changes(self._zk, self._events.watch)
        broker = self._entity(str(self._static.broker_id))
        default = self._entity(zkdata.DEFAULT_BROKER_ENTITY)
        return merge(self._static, default, broker)

    def _entity(self, name: str) -> dict[str, str]:
        """One config znode; a malformed one is logged and counts as empty (never fatal)."""
        try:
            return self._zk.entity_config("brokers", name)[0]
        except (ValueError, AttributeError, TypeError, KafkaError) as exc:
            log.error("dynamic configs of brokers/%s ignored: malformed znode (%s)", name, exc)
            return {}

    def _purge_changes(self) -> None:
        now_ms = int(time.time() * 1000)
        for child in self._zk.config_changes():
            try:
                found = self._zk.config_change(child)
            except KafkaError:
                continue
            if found is not None and now_ms - found[2] > CHANGE_EXPIRATION_MS:
                self._zk.delete_config_change(child)


def describe_change(old: BrokerConfig, new: BrokerConfig) -> str:
    """``name: old -> new`` for every field that differs (log lines)."""
    parts: list[str] = []
    for name in (f.name for f in fields(new)):
        a, b = getattr(old, name), getattr(new, name)
        if name == "log_defaults":
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    parts.append(f"{key}: {a.get(key)} -> {b.get(key)}")
        elif a != b:
            parts.append(f"{name}: {a} -> {b}")
    return ", ".join(parts) or "none"


class DynamicConfigApplier:
    """Applies a changed effective config to a running broker's parts.

    * ``log.*`` defaults, ``min.insync.replicas``, ``message.max.bytes``: a new default
      :class:`LogConfig` for the log manager (logs loaded or created later) and the
      replica manager (every hosted log of a topic without its own override is
      reconfigured at once; a topic override keeps winning);
    * ``unclean.leader.election.enable``: also the controller's default (turning it on
      re-runs elections of offline partitions);
    * ``log.cleaner.*``: the cleaner threads restart between cleanings with the new config;
    * the replication throttle rates: the leader and follower replication quotas.

    Runs on the ``dynamic-config`` thread (see :class:`DynamicBrokerConfig`).
    """

    def __init__(
        self,
        *,
        set_log_defaults: Callable[[LogConfig], None],
        set_unclean_default: Callable[[bool], None],
        reconfigure_cleaner: Callable[[BrokerConfig], None],
        set_replication_throttles: Callable[[int, int], None],
    ) -> None:
        self._set_log_defaults = set_log_defaults
        self._set_unclean = set_unclean_default
        self._reconfigure_cleaner = reconfigure_cleaner
        self._set_throttles = set_replication_throttles

    def __call__(self, old: BrokerConfig, new: BrokerConfig) -> None:
        if new.log_defaults != old.log_defaults:
            before = LogConfig.from_properties(old.log_defaults)
            after = LogConfig.from_properties(new.log_defaults)
            self._set_log_defaults(after)
            if after.unclean_leader_election_enable != before.unclean_leader_election_enable:
                self._set_unclean(after.unclean_leader_election_enable)
        if new.cleaner_config() != old.cleaner_config():
            self._reconfigure_cleaner(new)
        rates = (new.leader_replication_throttled_rate, new.follower_replication_throttled_rate)
        if rates != (old.leader_replication_throttled_rate, old.follower_replication_throttled_rate):
            self._set_throttles(*rates)
            log.info("replication throttle rates now leader %d, follower %d bytes/s", *rates)
