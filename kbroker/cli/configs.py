"""``kctl configs``: describe and alter topic and broker configs, and users' SCRAM
credentials, as kafka-configs.sh.

Over ``--bootstrap-server`` (DescribeConfigs / IncrementalAlterConfigs)::

    Dynamic configs for topic t are:
      retention.ms=1000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=1000,
        DEFAULT_CONFIG:log.retention.ms=604800000}          (one line)
    Completed updating config for topic t.

``Dynamic configs for broker 1 are:`` / ``Default configs for brokers in the cluster are:``
/ ``All configs for topic t are:`` (``--all``); ``Completed updating config for broker 1.`` /
``Completed updating default config for brokers in the cluster.``

Over ``--zookeeper`` (the znodes, validated the same way)::

    Configs for topic 't' are cleanup.policy=compact,retention.ms=1000
    Completed updating config for entity: topic 't'.

``--describe`` without ``--entity-name`` describes every topic, or every live broker
and then the cluster default. ``--add-config k=v,k2=[a,b]`` (brackets hold a list
value's commas), ``--delete-config k1,k2``: deleting a config that is not set is
refused, as Kafka's tool does (``Invalid config(s): k``, exit 1).

``--entity-type users`` (both modes, through :mod:`kbroker.cli.users`' backends)::

    kctl configs --alter --entity-type users --entity-name alice \
        --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=alice-secret]'
    Completed updating config for user alice.
    kctl configs --alter --entity-type users --entity-name alice --delete-config SCRAM-SHA-512
    kctl configs --describe --entity-type users [--entity-name alice]
    SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-256=iterations=8192

Only SCRAM credentials are configs of users here (no quotas). A named user without
credentials prints nothing, as Kafka's tool; a password is never printed.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from kbroker.cli import users
from kbroker.cli.backends import connect_zookeeper, zookeeper_credential
from kbroker.cli.common import UsageError, check_bootstrap, check_zookeeper, client_configs
from kbroker.cluster.config_admin import AlterOp, ConfigAdmin, ConfigSource, OpType, ResourceType
from kbroker.cluster.zk_client import ZkClient
from kbroker.cluster.zkdata import DEFAULT_BROKER_ENTITY
from kbroker.config import load_properties
from kclient import AdminClient
from kclient.errors import InvalidConfigError, InvalidConfigurationError
from kclient.proto.kbroker.v1 import config_pb2

SOURCE_NAMES = {
    ConfigSource.TOPIC_CONFIG: "DYNAMIC_TOPIC_CONFIG",  # Kafka's name for it
    ConfigSource.DYNAMIC_BROKER_CONFIG: "DYNAMIC_BROKER_CONFIG",
    ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    ConfigSource.STATIC_BROKER_CONFIG: "STATIC_BROKER_CONFIG",
    ConfigSource.DEFAULT_CONFIG: "DEFAULT_CONFIG",
}

_SPLIT = re.compile(r",(?=[^\]]*(?:\[|$))")
"""Commas outside ``[...]`` (Kafka's ConfigCommand regex)."""


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    p = nouns.add_parser(
        "configs",
        parents=[connection],
        help="describe or alter topic and broker configs (kafka-configs.sh)",
        description="kafka-configs.sh: describe or alter topic configs and dynamic broker configs.",
    )
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true", help="list the entity's configs")
    action.add_argument("--alter", action="store_true", help="add or delete configs")
    p.add_argument("--entity-type", choices=("topics", "brokers", "users"), required=True)
    p.add_argument("--entity-name", help="a topic, a broker id, or a user")
    p.add_argument("--entity-default", action="store_true", help="the cluster-wide default of brokers")
    p.add_argument("--add-config", help="k=v,k2=[a,b]: configs to set")
    p.add_argument("--add-config-file", help="a properties file of configs to set")
    p.add_argument("--delete-config", help="k1,k2: configs to remove (their default applies again)")
    p.add_argument("--all", action="store_true", help="with --describe: every config, not only dynamic ones")
    p.set_defaults(handler=run)


def parse_add_config(text: str) -> dict[str, str]:
    """``k=v,k2=[a,b]`` -> ``{"k": "v", "k2": "a,b"}``; UsageError when malformed."""
    out: dict[str, str] = {}
    for item in _SPLIT.split(text):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise UsageError(f'--add-config: all configs to be added must be in the format "key=val", got {item!r}')
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        out[key] = value
    return out


def _entity(args: argparse.Namespace) -> tuple[ResourceType, str | None]:
    """(type, name); name "" = the brokers' cluster default, None = every entity (--describe only)."""
    rtype = ResourceType.TOPIC if args.entity_type == "topics" else ResourceType.BROKER
    if args.entity_default and rtype is ResourceType.TOPIC:
        raise UsageError("--entity-default applies to --entity-type brokers only")
    if args.entity_default and args.entity_name:
        raise UsageError("give --entity-name or --entity-default, not both")
    if args.entity_default:
        return rtype, ""
    if not args.entity_name:
        if args.alter:
            raise UsageError(
                f"--alter needs --entity-name{' or --entity-default' if rtype is ResourceType.BROKER else ''}"
            )
        return rtype, None
    if rtype is ResourceType.BROKER and not args.entity_name.isdigit():
        raise UsageError(f"--entity-name of a broker is its id, got {args.entity_name!r}")
    return rtype, args.entity_name


def _changes(args: argparse.Namespace) -> tuple[dict[str, str], list[str]]:
    adds = parse_add_config(args.add_config) if args.add_config else {}
    if args.add_config_file:
        try:
            adds.update(load_properties(Path(args.add_config_file)))
        except InvalidConfigError as exc:
            raise UsageError(str(exc)) from None
    deletes = [k.strip() for k in (args.delete_config or "").split(",") if k.strip()]
    if not adds and not deletes:
        raise UsageError("--alter needs --add-config, --add-config-file or --delete-config")
    both = sorted(set(adds) & set(deletes))
    if both:
        raise UsageError(f"config(s) both added and deleted: {','.join(both)}")
    return adds, deletes


def _ops(adds: dict[str, str], deletes: list[str]) -> list[AlterOp]:
    return [AlterOp(k, OpType.SET, v) for k, v in adds.items()] + [AlterOp(k, OpType.DELETE) for k in deletes]


def _check_deletes(deletes: list[str], dynamic: set[str]) -> None:
    missing = [k for k in deletes if k not in dynamic]
    if missing:
        raise InvalidConfigurationError(f"Invalid config(s): {','.join(missing)}")


def run(args: argparse.Namespace) -> int:
    if not args.alter and (args.add_config or args.add_config_file or args.delete_config):
        raise UsageError("--add-config/--delete-config need --alter")
    if args.alter and args.all:
        raise UsageError("--all applies to --describe only")
    if args.entity_type == "users":
        return _users(args)
    rtype, name = _entity(args)
    changes = _changes(args) if args.alter else None
    zookeeper, bootstrap = getattr(args, "zookeeper", None), getattr(args, "bootstrap_server", None)
    if (zookeeper is None) == (bootstrap is None):
        which = "both" if zookeeper is not None else "neither"
        raise UsageError(f"give exactly one of --zookeeper or --bootstrap-server ({which} given)")
    if bootstrap is not None:
        with AdminClient(check_bootstrap(bootstrap), **client_configs(args)) as admin:
            if name is not None:
                return _over_grpc(admin, rtype, name, changes, args.all)
            if rtype is ResourceType.TOPIC:
                names = admin.list_topics()
            else:  # as Kafka: every broker, then the cluster default
                names = [str(b.node_id) for b in admin.describe_cluster()[0]] + [""]
            for each in names:
                _over_grpc(admin, rtype, each, None, args.all)
            return 0
    assert zookeeper is not None
    zk = _connect(check_zookeeper(zookeeper))
    try:
        if name is not None:
            return _over_zookeeper(ConfigAdmin(zk), rtype, name, changes)
        names = zk.topics() if rtype is ResourceType.TOPIC else [str(b) for b in sorted(zk.live_brokers())] + [""]
        for each in names:
            _over_zookeeper(ConfigAdmin(zk), rtype, each, None)
        return 0
    finally:
        zk.close()


def _dynamic_source(rtype: ResourceType, name: str) -> ConfigSource:
    if rtype is ResourceType.TOPIC:
        return ConfigSource.TOPIC_CONFIG
    return ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG if name == "" else ConfigSource.DYNAMIC_BROKER_CONFIG


def _over_grpc(
    admin: AdminClient,
    rtype: ResourceType,
    name: str,
    changes: tuple[dict[str, str], list[str]] | None,
    describe_all: bool,
) -> int:
    resource = (int(rtype), name)
    what = f"topic {name}" if rtype is ResourceType.TOPIC else f"broker {name}"
    dynamic = _dynamic_source(rtype, name)
    entries = admin.describe_configs([resource], include_synonyms=changes is None)[resource]
    if changes is None:
        if name == "" and rtype is ResourceType.BROKER:
            print("Default configs for brokers in the cluster are:")
        else:
            print(f"{'All' if describe_all else 'Dynamic'} configs for {what} are:")
        for key in sorted(entries):
            e = entries[key]
            if describe_all or e.config_source == dynamic:
                print(f"  {_entry_line(e)}")
        return 0
    adds, deletes = changes
    _check_deletes(deletes, {k for k, e in entries.items() if e.config_source == dynamic})
    admin.incremental_alter_configs({resource: [(op.name, int(op.op), op.value) for op in _ops(adds, deletes)]})
    if name == "" and rtype is ResourceType.BROKER:
        print("Completed updating default config for brokers in the cluster.")
    else:
        print(f"Completed updating config for {what}.")
    return 0


def _entry_line(e: config_pb2.DescribeConfigsResourceResult) -> str:
    synonyms = ", ".join(
        f"{SOURCE_NAMES.get(ConfigSource(s.source), str(s.source)) if s.source else 'UNKNOWN'}:"
        f"{s.name}={s.value if s.HasField('value') else 'null'}"
        for s in e.synonyms
    )
    value = e.value if e.HasField("value") else "null"
    return f"{e.name}={value} sensitive={'true' if e.is_sensitive else 'false'} synonyms={{{synonyms}}}"


def _over_zookeeper(
    configs: ConfigAdmin, rtype: ResourceType, name: str, changes: tuple[dict[str, str], list[str]] | None
) -> int:
    label = f"topic '{name}'" if rtype is ResourceType.TOPIC else f"brokers '{name or DEFAULT_BROKER_ENTITY}'"
    dynamic = _dynamic_source(rtype, name)
    current = {e.name: e.value for e in configs.describe(rtype, name) if e.source is dynamic}
    if changes is None:
        print(f"Configs for {label} are {','.join(f'{k}={v}' for k, v in sorted(current.items()))}")
        return 0
    adds, deletes = changes
    _check_deletes(deletes, set(current))
    configs.incremental_alter(rtype, name, _ops(adds, deletes))
    print(f"Completed updating config for entity: {label}.")
    return 0


def _connect(connect: str) -> ZkClient:
    return connect_zookeeper(connect, credential=zookeeper_credential())


def _users(args: argparse.Namespace) -> int:
    """``--entity-type users``: SCRAM credentials, over either connection mode."""
    if args.entity_default:
        raise UsageError("--entity-default applies to --entity-type brokers only (users have no default here)")
    if args.all:
        raise UsageError("--all applies to topics and brokers")
    name = None if args.entity_name is None else users.check_user(args.entity_name)
    if not args.alter:
        with users.open_backend(args) as backend:
            found = backend.describe()
        for user, mechanisms in found.items():
            if name is None or user == name:
                print(users.format_user(user, mechanisms))
        return 0
    if name is None:
        raise UsageError("--alter needs --entity-name")
    try:
        adds, deletes = _changes(args)
    except UsageError as exc:  # the messages of other types may quote a piece of a password
        if args.add_config and "format" in str(exc):
            raise UsageError(
                "--add-config for users must be MECHANISM=[iterations=N,password=P],... (the value is not shown)"
            ) from None
        raise
    upserts, removals = users.parse_scram_configs(adds, deletes)
    with users.open_backend(args) as backend:
        backend.alter(name, upserts, removals)
    print(f"Completed updating config for user {name}.")
    return 0
