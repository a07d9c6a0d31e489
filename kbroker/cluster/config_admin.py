"""Describe and incrementally alter topic and broker configs: Kafka's DescribeConfigs /
IncrementalAlterConfigs over the ZooKeeper config znodes.

Topic configs live in ``/config/topics/<t>``, dynamic broker configs in
``/config/brokers/<id>`` and ``/config/brokers/<default>``; every accepted change is
written with :meth:`ZkClient.set_entity_config` (compare-and-set of the znode plus a
``config_change_`` notification in one transaction; a concurrent change is re-read and
the operations re-applied, so no update is lost).

Checks, all before anything is written (a refused resource changes nothing):

* a repeated config name, or SET/APPEND/SUBTRACT without a value: INVALID_REQUEST;
* APPEND/SUBTRACT on a config that is not a list (topics: ``cleanup.policy`` and the
  throttled-replicas lists; brokers: none): INVALID_REQUEST;
* topics: the resulting overrides must pass topic creation's validation
  (:meth:`LogConfig.from_properties`): unknown name or bad value is INVALID_CONFIG;
  a topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION; DELETE of a config that
  is not set is allowed;
* brokers: only dynamic settings of :data:`~kbroker.config.BROKER_CONFIGS` may be set
  (others: INVALID_REQUEST "Cannot update these configs dynamically"); values are checked
  by the table, as ``server.properties`` checks them (INVALID_CONFIG).

Documentation, types, sensitivity and read-only flags of the answers come from the table.

Without a ZooKeeper connection (its quorum lost), a describe or an alter waits up to
``zookeeper_wait_s`` (5 s) for it once its arguments passed the checks above that need no
ZooKeeper (resource type and name, repeated or missing values, config names and values),
then raises RequestTimedOutError having changed nothing (as a topic creation does,
:mod:`kbroker.cluster.topic_admin`); kazoo would otherwise queue the call for the whole
outage, and the write would land long after its client gave up.

Precedence of a value (Kafka's): topic override > per-broker dynamic > cluster-default
dynamic > static (``server.properties`` / flags) > Kafka's default.

Thread-safe: no mutable state (ZooKeeper is the only state).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from kazoo.exceptions import BadVersionError, NodeExistsError

from kbroker.cluster.zk_client import CONNECTION_WAIT_S, ZkClient
from kbroker.cluster.zkdata import DEFAULT_BROKER_ENTITY, broker_entity
from kbroker.config import BROKER_CONFIGS, LOG_DEFAULT_KEYS
from kbroker.config_def import ConfigKey
from kbroker.storage.log_config import CONFIG_NAMES, LogConfig
from kclient.errors import (
    InvalidConfigError,
    InvalidConfigurationError,
    InvalidRequestError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from kclient.topic_name import validate_topic_name


class ResourceType(IntEnum):
    """Kafka's ConfigResource.Type codes."""

    TOPIC = 2
    BROKER = 4


class ConfigSource(IntEnum):
    TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class OpType(IntEnum):
    """Kafka's AlterConfigOp.OpType codes."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True, slots=True)
class Synonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One config as DescribeConfigs reports it; ``synonyms`` highest precedence first.

    ``documentation`` and ``config_type`` (Kafka's ConfigType code, 0 = unknown) come from
    :data:`~kbroker.config.BROKER_CONFIGS`; a ``sensitive`` entry's values are ``None``.
    """

    name: str
    value: str | None
    source: ConfigSource
    read_only: bool
    synonyms: tuple[Synonym, ...] = ()
    sensitive: bool = False
    documentation: str | None = None
    config_type: int = 0

    @property
    def is_default(self) -> bool:
        return self.source is ConfigSource.DEFAULT_CONFIG


@dataclass(frozen=True, slots=True)
class AlterOp:
    name: str
    op: OpType
    value: str | None = None


LIST_TOPIC_CONFIGS = frozenset(
    {"cleanup.policy", "leader.replication.throttled.replicas", "follower.replication.throttled.replicas"}
)
"""Topic configs of Kafka's LIST type (APPEND/SUBTRACT apply to those LogConfig has)."""

DYNAMIC_BROKER_CONFIGS = BROKER_CONFIGS.names(lambda k: k.dynamic and k.has_effect)
"""Broker configs that change without a restart (Kafka's DynamicBrokerConfig) and that kbroker has."""

log = logging.getLogger(__name__)

TOPIC_TO_BROKER_KEY = {topic: k.name for topic, k in BROKER_CONFIGS.by_topic().items()}
"""Topic config -> its broker-wide default's name (``retention.ms`` -> ``log.retention.ms``)."""

KAFKA_BROKER_DEFAULTS: dict[str, str] = {
    k.name: text
    for k in BROKER_CONFIGS
    if (k.topic is not None or k.name in DYNAMIC_BROKER_CONFIGS) and (text := k.default_text) is not None
}
"""Kafka's default of every broker config this module reports."""


def static_broker_configs(log_defaults: LogConfig) -> dict[str, str]:
    """The broker-key form of a broker's static log defaults, where they differ from Kafka's."""
    kafka = LogConfig().to_properties()
    return {
        TOPIC_TO_BROKER_KEY[k]: v
        for k, v in log_defaults.to_properties().items()
        if k in TOPIC_TO_BROKER_KEY and kafka[k] != v
    }


def validate_broker_config(key: str, value: str) -> None:
    """INVALID_REQUEST if ``key`` cannot change dynamically; INVALID_CONFIG for a bad value."""
    setting = BROKER_CONFIGS.get(key)
    if setting is None or not setting.dynamic:
        raise InvalidRequestError(f"Cannot update these configs dynamically: [{key}]")
    if not setting.has_effect:
        log.info("broker config %s=%r is stored but has no effect: kbroker has no GSSAPI (Kerberos)", key, value)
        return
    if setting.topic is not None:
        try:
            LogConfig.from_properties({setting.topic: value})
        except InvalidConfigurationError as exc:
            raise InvalidConfigurationError(
                exc.message.replace(f"configuration {setting.topic}:", f"configuration {key}:")
            ) from None
        return
    try:
        setting.parse_value(key, value)
    except InvalidConfigError as exc:
        raise InvalidConfigurationError(f"Invalid value {value!r} for configuration {exc.message}") from None


def _entry(name: str, setting: ConfigKey | None, synonyms: list[Synonym], *, read_only: bool) -> ConfigEntry:
    """One described config: its value and source are its first synonym's (else null, default)."""
    sensitive = setting is not None and setting.sensitive
    if sensitive:
        synonyms = [Synonym(s.name, None, s.source) for s in synonyms]
    first = synonyms[0] if synonyms else Synonym(name, None, ConfigSource.DEFAULT_CONFIG)
    return ConfigEntry(
        name,
        first.value,
        first.source,
        read_only,
        tuple(synonyms),
        sensitive=sensitive,
        documentation=None if setting is None else setting.doc,
        config_type=0 if setting is None else setting.type.describe_code,
    )


def broker_name(name: str) -> int | None:
    """A BROKER resource name as a broker id, ``None`` for the cluster default ("" or ``<default>``)."""
    return None if name == "" else broker_entity(name)


def _entity_name(broker: int | None) -> str:
    return DEFAULT_BROKER_ENTITY if broker is None else str(broker)


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def apply_ops(
    current: Mapping[str, str], ops: Iterable[AlterOp], list_configs: frozenset[str], defaults: Mapping[str, str]
) -> dict[str, str]:
    """``current`` with ``ops`` applied (Kafka's prepareIncrementalConfigs).

    APPEND/SUBTRACT start from the current value, else from ``defaults``; INVALID_REQUEST
    for a repeated name, a missing value, or APPEND/SUBTRACT on a non-list config.
    """
    ops = list(ops)
    names = [op.name for op in ops]
    if len(set(names)) != len(names):
        raise InvalidRequestError("Error due to duplicate config keys")
    out = dict(current)
    for op in ops:
        if op.op is not OpType.DELETE and op.value is None:
            raise InvalidRequestError(f"Config value of {op.name} is missing for operation {op.op.name}")
        if op.op in (OpType.APPEND, OpType.SUBTRACT) and op.name not in list_configs:
            verb = "append" if op.op is OpType.APPEND else "subtract"
            raise InvalidRequestError(f"Config value {verb} is not allowed for config key: {op.name}")
        if op.op is OpType.SET:
            assert op.value is not None
            out[op.name] = op.value
        elif op.op is OpType.DELETE:
            out.pop(op.name, None)
        else:
            assert op.value is not None
            old = _items(out.get(op.name, defaults.get(op.name, "")))
            given = _items(op.value)
            if op.op is OpType.APPEND:
                new = old + [item for item in given if item not in old]
            else:
                new = [item for item in old if item not in given]
            out[op.name] = ",".join(new)
    return out


class ConfigAdmin:
    """DescribeConfigs / IncrementalAlterConfigs for one broker (or for ``kctl``).

    ``broker_id``: the answering broker (its static configs are ``static_broker``,
    broker-key names, e.g. from :func:`static_broker_configs`); they are reported only
    for that broker's own resource and as the static layer of topic defaults.
    ``zookeeper_wait_s``: how long a request waits for a lost ZooKeeper connection.
    Thread-safe: no mutable state.
    """

    def __init__(
        self,
        zk: ZkClient,
        *,
        broker_id: int | None = None,
        static_broker: Mapping[str, str] | None = None,
        zookeeper_wait_s: float = CONNECTION_WAIT_S,
    ) -> None:
        self._zk = zk
        self._broker_id = broker_id
        self._static = dict(static_broker or {})
        self.zookeeper_wait_s = zookeeper_wait_s

    def _wait_for_zookeeper(self, what: str, wait_s: float | None) -> None:
        """Return once the session is connected; RequestTimedOutError after ``wait_s``
        (None: ``zookeeper_wait_s``)."""
        self._zk.require_connection(what, RequestTimedOutError, self.zookeeper_wait_s if wait_s is None else wait_s)

    # --- describe ----------------------------------------------------------------

    def describe(
        self, rtype: ResourceType, name: str, keys: Iterable[str] = (), *, zookeeper_wait_s: float | None = None
    ) -> list[ConfigEntry]:
        """Every config of the resource (or only ``keys``), sorted by name; ``zookeeper_wait_s``
        overrides the wait for a lost connection (a request's later resources: 0)."""
        wanted = set(keys)
        if rtype is ResourceType.TOPIC:
            validate_topic_name(name)
            self._wait_for_zookeeper("describing configs", zookeeper_wait_s)
            entries = self._describe_topic(name)
        elif rtype is ResourceType.BROKER:
            broker = broker_name(name)
            self._wait_for_zookeeper("describing configs", zookeeper_wait_s)
            entries = self._describe_broker(broker)
        else:
            raise InvalidRequestError(f"Unsupported resource type {rtype}")
        return [e for e in sorted(entries, key=lambda e: e.name) if not wanted or e.name in wanted]

    def _broker_layers(self, broker: int | None) -> list[tuple[ConfigSource, dict[str, str]]]:
        """The broker-key value layers for ``broker``, highest precedence first."""
        layers: list[tuple[ConfigSource, dict[str, str]]] = []
        if broker is not None:
            layers.append((ConfigSource.DYNAMIC_BROKER_CONFIG, self._zk.entity_config("brokers", str(broker))[0]))
        layers.append(
            (ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, self._zk.entity_config("brokers", DEFAULT_BROKER_ENTITY)[0])
        )
        if broker is not None and broker == self._broker_id:
            layers.append((ConfigSource.STATIC_BROKER_CONFIG, self._static))
        layers.append((ConfigSource.DEFAULT_CONFIG, KAFKA_BROKER_DEFAULTS))
        return layers

    def _describe_topic(self, topic: str) -> list[ConfigEntry]:
        if not self._zk.topic_exists(topic):
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        overrides = self._zk.entity_config("topics", topic)[0]
        layers = self._broker_layers(self._broker_id)
        kafka_topic = LogConfig().to_properties()
        out = []
        for key in sorted(set(CONFIG_NAMES.values()) | set(overrides)):
            synonyms: list[Synonym] = []
            if key in overrides:
                synonyms.append(Synonym(key, overrides[key], ConfigSource.TOPIC_CONFIG))
            broker_key = TOPIC_TO_BROKER_KEY.get(key)
            for source, values in layers:
                if source is ConfigSource.DEFAULT_CONFIG:
                    if key in kafka_topic:
                        synonyms.append(Synonym(broker_key or key, kafka_topic[key], source))
                elif broker_key is not None and broker_key in values:
                    synonyms.append(Synonym(broker_key, values[broker_key], source))
            out.append(_entry(key, BROKER_CONFIGS.get(broker_key or key), synonyms, read_only=False))
        return out

    def _describe_broker(self, broker: int | None) -> list[ConfigEntry]:
        layers = self._broker_layers(broker)
        if broker is None:
            keys = set(layers[0][1])  # only what the cluster default sets, as Kafka
        else:
            keys = set(DYNAMIC_BROKER_CONFIGS)
            for _, values in layers:
                keys |= set(values)
        out = []
        for key in keys:
            setting = BROKER_CONFIGS.get(key)
            synonyms = [Synonym(key, values[key], source) for source, values in layers if key in values]
            out.append(_entry(key, setting, synonyms, read_only=setting is None or not setting.dynamic))
        return out

    # --- alter -------------------------------------------------------------------

    def incremental_alter(
        self,
        rtype: ResourceType,
        name: str,
        ops: Iterable[AlterOp],
        *,
        validate_only: bool = False,
        zookeeper_wait_s: float | None = None,
    ) -> None:
        """Apply ``ops`` to the resource's stored config, or raise (writing nothing);
        ``zookeeper_wait_s`` as :meth:`describe`'s."""
        ops = list(ops)
        if rtype is ResourceType.TOPIC:
            validate_topic_name(name)
            entity_type, entity = "topics", name
        elif rtype is ResourceType.BROKER:
            entity_type, entity = "brokers", _entity_name(broker_name(name))
        else:
            raise InvalidRequestError(f"Unsupported resource type {rtype}")
        self._check_ops(entity_type, ops)
        self._wait_for_zookeeper("altering configs", zookeeper_wait_s)
        while True:
            if entity_type == "topics" and not self._zk.topic_exists(name):
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            current, version = self._zk.entity_config(entity_type, entity)
            new = self._prepare(entity_type, current, ops)
            if validate_only or new == current:
                return
            try:
                self._zk.set_entity_config(entity_type, entity, new, version)
                return
            except (BadVersionError, NodeExistsError):
                continue  # changed meanwhile: re-apply the operations to the new content

    def _check_ops(self, entity_type: str, ops: list[AlterOp]) -> None:
        """The checks of :meth:`_prepare` that do not depend on the stored config, made
        before ZooKeeper is asked: INVALID_REQUEST (a repeated name, a missing value,
        APPEND/SUBTRACT on a non-list config), INVALID_CONFIG (a bad name or SET value)."""
        if entity_type != "topics":
            self._prepare(entity_type, {}, ops)  # a broker's values are checked one by one
            return
        apply_ops({}, ops, LIST_TOPIC_CONFIGS & set(CONFIG_NAMES.values()), {})
        # APPEND/SUBTRACT results depend on the stored list: checked in _prepare only.
        LogConfig.from_properties({op.name: op.value for op in ops if op.op is OpType.SET and op.value is not None})

    def _prepare(self, entity_type: str, current: dict[str, str], ops: list[AlterOp]) -> dict[str, str]:
        if entity_type == "topics":
            defaults = LogConfig.from_properties(
                {LOG_DEFAULT_KEYS[k]: v for k, v in self._static.items() if k in LOG_DEFAULT_KEYS}
            ).to_properties()
            new = apply_ops(current, ops, LIST_TOPIC_CONFIGS & set(CONFIG_NAMES.values()), defaults)
            LogConfig.from_properties(new)  # topic creation's validation: INVALID_CONFIG
            return new
        new = apply_ops(current, ops, frozenset(), KAFKA_BROKER_DEFAULTS)
        for op in ops:
            if op.op is not OpType.DELETE:
                validate_broker_config(op.name, new[op.name])
        return new
