"""The shape of a broker setting, in the shape of Kafka's ``ConfigDef``.

A :class:`ConfigKey` is one setting: its Kafka name, type, default, validator,
importance, documentation, and how it may change (Kafka's DynamicBrokerConfig update
modes), or which per-topic config it is the broker-wide default of. A :class:`ConfigDef`
is the table of them. :mod:`kbroker.config` holds the broker's table; everything that
reads a setting by name (``server.properties`` parsing, dynamic config validation,
DescribeConfigs, ``docs/config-reference.md``) asks the table.

Errors are :class:`InvalidConfigError` with one line that names the key
(``num.partitions: 0 is below the minimum 1``).

Thread safety: every object here is immutable once the table is built.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kclient.errors import InvalidConfigError

LONG_MAX = 2**63 - 1

JAVA_DOUBLE_MAX = "1.7976931348623157E308"
"""How Kafka prints Double.MAX_VALUE, kbroker's ``inf`` (no limit)."""


class Type(enum.Enum):
    """Kafka's ConfigDef.Type, in the order DescribeConfigs' config_type numbers them."""

    BOOLEAN = "boolean"
    STRING = "string"
    INT = "int"
    SHORT = "short"
    LONG = "long"
    DOUBLE = "double"
    LIST = "list"
    CLASS = "class"
    PASSWORD = "password"

    @property
    def describe_code(self) -> int:
        """DescribeConfigs' ConfigType (BOOLEAN=1, STRING=2, INT=3, SHORT=4, LONG=5, DOUBLE=6,
        LIST=7, CLASS=8, PASSWORD=9)."""
        return list(Type).index(self) + 1


class Importance(enum.Enum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class UpdateMode(enum.Enum):
    """How a broker setting may change (Kafka's DynamicBrokerConfig): only with a restart
    (``server.properties``), per broker (``/config/brokers/<id>``), or also cluster-wide
    (``/config/brokers/<default>``)."""

    READ_ONLY = "read-only"
    PER_BROKER = "per-broker"
    CLUSTER_WIDE = "cluster-wide"


class _Required:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _Required()
"""The default of a setting that must be given (``broker.id``)."""


@dataclass(frozen=True)
class Range:
    """``value >= min`` (Kafka's ConfigDef.Range.atLeast)."""

    min: int | float

    def __call__(self, key: str, raw: str, value: Any) -> None:
        if not value >= self.min:  # NaN too
            shown = value if isinstance(value, int) else repr(raw)
            raise InvalidConfigError(f"{key}: {shown} is below the minimum {self.min}")

    def __str__(self) -> str:
        """Kafka's "Valid Values" text."""
        return f"[{self.min},...]"


# --- parsing by type ----------------------------------------------------------------------


def parse_int(key: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise InvalidConfigError(f"{key}: {raw!r} is not an integer") from None


def parse_float(key: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise InvalidConfigError(f"{key}: {raw!r} is not a number") from None


def parse_bool(key: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("true", "1", "yes"):
        return True
    if low in ("false", "0", "no"):
        return False
    raise InvalidConfigError(f"{key}: {raw!r} is not true or false")


def parse_str(key: str, raw: str) -> str:
    return raw.strip()


_PARSERS: dict[Type, Callable[[str, str], Any]] = {
    Type.BOOLEAN: parse_bool,
    Type.INT: parse_int,
    Type.SHORT: parse_int,
    Type.LONG: parse_int,
    Type.DOUBLE: parse_float,
}


def format_value(value: Any) -> str | None:
    """A typed value as Kafka prints it (DescribeConfigs, the reference): ``None`` is null."""
    if value is None or value is NO_DEFAULT:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value == float("inf"):
        return JAVA_DOUBLE_MAX
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    return str(value)


@dataclass(frozen=True)
class ConfigKey:
    """One setting (Kafka's ConfigDef.ConfigKey plus its dynamic update mode).

    Where a parsed value goes, checked in this order: ``topic`` (the broker-wide default
    of that per-topic config: the text is kept for the log defaults, and the topic
    config's own validation checks it), ``bucket`` (a dict field of the config object,
    the value under the key's name), ``attr`` (a field; ``convert`` maps the setting's
    unit to the field's), else ``synonym_of`` (a lower-precedence spelling of another
    setting, in ``convert``'s unit of that setting).
    """

    name: str
    type: Type
    default: Any
    """Typed (``NO_DEFAULT``: required; ``None``: no value, Kafka's null). For a topic-linked
    setting, the topic config's default (see :class:`ConfigDef`)."""
    importance: Importance
    doc: str
    group: str
    validator: Range | None = None
    parse: Callable[[str, str], Any] | None = None
    """Text -> checked value, raising InvalidConfigError; default: by ``type``, then ``validator``."""
    valid_values: str = ""
    """The reference's "Valid Values" when ``parse`` checks more than a validator shows."""
    update: UpdateMode = UpdateMode.READ_ONLY
    topic: str | None = None
    attr: str | None = None
    """Default: the name with ``_`` for ``.`` (``num.partitions`` -> ``num_partitions``)."""
    bucket: str | None = None
    convert: Callable[[Any], Any] | None = None
    synonym_of: str | None = None
    aliases: tuple[str, ...] = ()
    """Other names of the same setting (``log.dir`` for ``log.dirs``)."""
    per_listener: bool = False
    """Also settable as ``listener.name.<listener>.<name>``."""
    dynamic_only: bool = False
    """Set only as a dynamic config, never in ``server.properties`` (the throttle rates)."""
    has_effect: bool = True
    """False: accepted and stored as Kafka would, changing nothing in kbroker."""
    flag: str | None = None
    """kbroker's command-line flag for it (``--broker-id``)."""
    synonyms: tuple[str, ...] = field(default=(), compare=False)
    """Filled by :class:`ConfigDef`: the settings whose ``synonym_of`` is this one, highest
    precedence first."""

    @property
    def dynamic(self) -> bool:
        return self.update is not UpdateMode.READ_ONLY

    @property
    def sensitive(self) -> bool:
        """A secret: never printed (Kafka's PASSWORD type)."""
        return self.type is Type.PASSWORD

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT

    def parse_value(self, key: str, raw: str) -> Any:
        """``raw`` as this setting's typed, checked value; ``key`` is the name as given."""
        if self.parse is not None:
            return self.parse(key, raw)
        value = _PARSERS.get(self.type, parse_str)(key, raw)
        if self.validator is not None:
            self.validator(key, raw, value)
        return value

    def field_value(self, value: Any) -> Any:
        """A parsed value in its field's unit."""
        return value if self.convert is None or value is None else self.convert(value)

    @property
    def field_default(self) -> Any:
        return self.field_value(self.default)

    @property
    def default_text(self) -> str | None:
        return format_value(self.default)

    @property
    def valid_values_text(self) -> str:
        return self.valid_values or (str(self.validator) if self.validator is not None else "")


class ConfigDef:
    """A table of :class:`ConfigKey`, looked up by name or alias.

    ``topic_defaults``: the per-topic configs' defaults as text; a topic-linked key's
    ``default`` is filled from it, so the topic config stays its only definition.
    Immutable once built.
    """

    def __init__(self, keys: Iterable[ConfigKey], *, topic_defaults: Mapping[str, str] = {}) -> None:
        keys = list(keys)
        synonyms: dict[str, list[str]] = {}
        for k in keys:
            if k.synonym_of is not None:
                synonyms.setdefault(k.synonym_of, []).append(k.name)
        self._keys: dict[str, ConfigKey] = {}
        self._names: dict[str, ConfigKey] = {}
        for k in keys:
            if k.topic is not None:
                k = _replace(k, default=topic_defaults.get(k.topic, k.default))
            elif k.attr is None and k.bucket is None and k.synonym_of is None and k.has_effect:
                k = _replace(k, attr=k.name.replace(".", "_"))
            if k.name in synonyms:
                k = _replace(k, synonyms=tuple(synonyms[k.name]))
            for name in (k.name, *k.aliases):
                if name in self._names:
                    raise ValueError(f"setting {name} is defined twice")
                self._names[name] = k
            self._keys[k.name] = k
        for k in self._keys.values():
            if k.synonym_of is not None and k.synonym_of not in self._keys:
                raise ValueError(f"{k.name} is a synonym of the unknown {k.synonym_of}")

    def __iter__(self) -> Iterator[ConfigKey]:
        return iter(self._keys.values())

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __getitem__(self, name: str) -> ConfigKey:
        """By name or alias; KeyError if unknown."""
        return self._names[name]

    def get(self, name: str) -> ConfigKey | None:
        return self._names.get(name)

    def by_topic(self) -> dict[str, ConfigKey]:
        """Per-topic config name -> the broker setting that is its default."""
        return {k.topic: k for k in self if k.topic is not None}

    def names(self, keep: Callable[[ConfigKey], bool]) -> tuple[str, ...]:
        return tuple(k.name for k in self if keep(k))

    def groups(self) -> Sequence[str]:
        """Group names in table order."""
        return list(dict.fromkeys(k.group for k in self))


def _replace(key: ConfigKey, **changes: Any) -> ConfigKey:
    return replace(key, **changes)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str | None) -> str:
    if text is None:
        return "null"
    if text == "":
        return '""'
    return "`" + text.replace("`", "'") + "`"


def reference_markdown(table: ConfigDef, *, title: str, intro: str) -> str:
    """The configuration reference (``docs/config-reference.md``): one table per group."""
    lines = [f"# {title}", "", intro.strip(), ""]
    for group in table.groups():
        lines += [
            f"## {group}",
            "",
            "| Setting | Description | Type | Default | Valid values | Importance | Update mode |",
            "|---|---|---|---|---|---|---|",
        ]
        for k in table:
            if k.group != group:
                continue
            notes = [k.doc]
            if k.topic is not None:
                notes.append(f"Per-topic config: `{k.topic}`.")
            if k.synonym_of is not None:
                notes.append(f"Synonym of `{k.synonym_of}`.")
            if k.aliases:
                notes.append("Also spelled " + ", ".join(f"`{a}`" for a in k.aliases) + ".")
            if k.per_listener:
                notes.append(f"Also per listener: `listener.name.<listener>.{k.name}`.")
            if k.flag is not None:
                notes.append(f"Flag: `{k.flag}`.")
            if k.dynamic_only:
                notes.append("Not in `server.properties`.")
            if k.sensitive:
                notes.append("Sensitive: never shown.")
            if k.required:
                default = "(required)"
            elif k.sensitive:
                default = "null"
            else:
                default = _code(k.default_text)
            valid = k.valid_values_text or (f"as `{k.topic}`" if k.topic is not None else "")
            lines.append(
                f"| `{k.name}` | {_cell(' '.join(notes))} | {k.type.value} | {_cell(default)} | {_cell(valid)} "
                f"| {k.importance.value} | {k.update.value} |"
            )
        lines.append("")
    return "\n".join(lines)
