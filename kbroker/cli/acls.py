"""``kctl acls``: add, list and remove ACLs, as kafka-acls.sh.

::

    kctl acls --add --allow-principal User:alice --operation Read --topic t --zookeeper zk:2181
    kctl acls --add --allow-principal User:alice --operation Read --topic t \
        --bootstrap-server broker:9093 --command-config admin.properties
    kctl acls add --producer --allow-principal User:p --topic t --zookeeper zk:2181
    kctl acls --list [--topic t] [--resource-pattern-type match] --zookeeper zk:2181
    kctl acls --remove --force --allow-principal User:alice --operation Read --topic t --zookeeper zk:2181

The action is a verb (``add``, ``list``, ``remove``) or Kafka's flag (``--add``, ``--list``,
``--remove``). ``--authorizer-properties zookeeper.connect=zk:2181`` is accepted for
``--zookeeper``. Output is kafka-acls.sh's::

    Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name=t, patternType=LITERAL)`:
     \t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)

    Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=t, patternType=LITERAL)`:
     \t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)

The command line becomes an :class:`AclCommand` (:func:`parse_command`, pure; every
check happens there, so bad input writes nothing); :func:`execute` carries it out
against any :class:`AclBackend` (create/describe/delete): over ``--zookeeper`` that is
:class:`~kbroker.cluster.acl_store.ZkAclStore`; over ``--bootstrap-server`` it is
:class:`AdminAclBackend` (the CreateAcls / DescribeAcls / DeleteAcls RPCs through
``kclient.AdminClient``, with the ``--command-config`` client settings). The output is
the same both ways.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from kbroker.cli.backends import connect_zookeeper, refused_writes, zookeeper_credential
from kbroker.cli.common import UsageError, check_bootstrap, check_zookeeper, client_configs, parse_key_values
from kbroker.cluster.acl_store import AclDeleteResult, ZkAclStore
from kbroker.security.acl import (
    CLUSTER_NAME,
    AccessControlEntry,
    AccessControlEntryFilter,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
    validate_binding,
)
from kbroker.security.principal import KafkaPrincipal
from kclient import AdminClient
from kclient import admin_security as client_acl
from kclient.errors import KafkaError

Op = AclOperation

VALID_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (
        Op.READ,
        Op.WRITE,
        Op.CREATE,
        Op.DESCRIBE,
        Op.DELETE,
        Op.ALTER,
        Op.DESCRIBE_CONFIGS,
        Op.ALTER_CONFIGS,
        Op.ALL,
    ),
    ResourceType.GROUP: (Op.READ, Op.DESCRIBE, Op.DELETE, Op.ALL),
    ResourceType.CLUSTER: (
        Op.CREATE,
        Op.CLUSTER_ACTION,
        Op.DESCRIBE_CONFIGS,
        Op.ALTER_CONFIGS,
        Op.IDEMPOTENT_WRITE,
        Op.ALTER,
        Op.DESCRIBE,
        Op.ALL,
    ),
    ResourceType.TRANSACTIONAL_ID: (Op.DESCRIBE, Op.WRITE, Op.ALL),
}
"""kafka-acls.sh's ResourceTypeToValidOperations."""

OPERATION_NAMES = ", ".join(o.camel for o in AclOperation if o not in (Op.ANY, Op.UNKNOWN))


class AclBackend(Protocol):
    """Where ACLs live: ZooKeeper (:class:`ZkAclStore`) or a broker's admin RPCs."""

    def create_acls(self, bindings: Sequence[AclBinding]) -> list[KafkaError | None]: ...

    def describe_acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]: ...

    def delete_acls(self, filters: Sequence[AclBindingFilter]) -> list[AclDeleteResult]: ...


@dataclass(frozen=True)
class AclCommand:
    """A checked kafka-acls.sh command line.

    ``changes`` (add/remove): each resource filter with the entries to add or remove
    (empty for remove = every ACL of the resource). ``filters`` (list, and the listing that
    follows add/remove): the resources to show, empty = every ACL. ``principals``: list only
    these principals' ACLs.
    """

    action: str
    changes: dict[ResourcePatternFilter, frozenset[AccessControlEntry]] = field(default_factory=dict)
    filters: tuple[ResourcePatternFilter, ...] = ()
    principals: tuple[str, ...] = ()
    force: bool = False


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    p = nouns.add_parser(
        "acls",
        parents=[connection],
        help="add, list or remove ACLs (kafka-acls.sh)",
        description="kafka-acls.sh: add, list or remove the ACLs the brokers' AclAuthorizer enforces.",
        epilog=f"Operations: {OPERATION_NAMES}. Deny ACLs win over allow ACLs.",
    )
    p.add_argument("verb", nargs="?", choices=("add", "list", "remove"), help="or --add / --list / --remove")
    for verb in ("add", "list", "remove"):
        p.add_argument(f"--{verb}", dest=f"flag_{verb}", action="store_true", help=f"same as the verb {verb}")
    p.add_argument(
        "--authorizer-properties",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="zookeeper.connect=HOST:PORT[/chroot] (kafka-acls.sh's way to say --zookeeper)",
    )
    p.add_argument("--allow-principal", action="append", default=[], metavar="TYPE:NAME", help="e.g. User:alice")
    p.add_argument("--deny-principal", action="append", default=[], metavar="TYPE:NAME", help="deny wins over allow")
    p.add_argument("--allow-host", action="append", default=[], metavar="HOST", help="IP address; default *")
    p.add_argument("--deny-host", action="append", default=[], metavar="HOST", help="IP address; default *")
    p.add_argument("--principal", action="append", default=[], metavar="TYPE:NAME", help="--list: only theirs")
    p.add_argument("--operation", action="append", default=[], metavar="OP", help=f"default All; {OPERATION_NAMES}")
    p.add_argument("--topic", action="append", default=[], help="a topic, or * for every topic")
    p.add_argument("--group", action="append", default=[], help="a consumer group, or * for every group")
    p.add_argument("--transactional-id", action="append", default=[], help="a transactional id, or *")
    p.add_argument("--cluster", action="store_true", help="the cluster resource (kafka-cluster)")
    p.add_argument(
        "--resource-pattern-type",
        default="literal",
        metavar="TYPE",
        help="literal (default), prefixed; for --list/--remove also any, match",
    )
    p.add_argument("--producer", action="store_true", help="Write, Describe, Create on --topic")
    p.add_argument("--consumer", action="store_true", help="Read, Describe on --topic and Read on --group")
    p.add_argument("--idempotent", action="store_true", help="with --producer: IdempotentWrite on the cluster")
    p.add_argument("--force", action="store_true", help="--remove without asking")
    p.set_defaults(handler=run)


# --- parsing (pure) --------------------------------------------------------------------


def _action(args: argparse.Namespace) -> str:
    given = {v for v in ("add", "list", "remove") if getattr(args, f"flag_{v}")}
    if args.verb:
        given.add(args.verb)
    if len(given) != 1:
        raise UsageError("Command must include exactly one action: --list, --add, --remove.")
    return given.pop()


def _principals(values: list[str], flag: str) -> list[str]:
    out: list[str] = []
    for value in values:
        try:
            out.append(str(KafkaPrincipal.parse(value.strip())))
        except KafkaError:
            raise UsageError(f"{flag} expects a principal TYPE:NAME such as User:alice, got {value!r}") from None
    return out


def _hosts(values: list[str], principals: list[str], flag: str) -> list[str]:
    hosts = [h.strip() for h in values]
    if any(not h for h in hosts):
        raise UsageError(f"{flag} must not be empty (use * for every host)")
    return hosts or (["*"] if principals else [])


def _operations(values: list[str]) -> list[AclOperation]:
    ops: list[AclOperation] = []
    for value in values or ["All"]:
        try:
            op = AclOperation.parse(value)
        except KafkaError:
            op = AclOperation.UNKNOWN
        if op in (Op.ANY, Op.UNKNOWN):
            raise UsageError(f"--operation {value!r} is not an operation; valid: {OPERATION_NAMES}")
        ops.append(op)
    return ops


def _pattern_type(text: str, action: str) -> PatternType:
    try:
        pattern_type = PatternType.parse(text)
    except KafkaError:
        pattern_type = PatternType.UNKNOWN
    if pattern_type is PatternType.UNKNOWN:
        raise UsageError(f"--resource-pattern-type must be literal, prefixed, any or match, got {text!r}")
    if action == "add" and not pattern_type.is_specific:
        raise UsageError(f"A '--resource-pattern-type' value of '{text}' is not valid when adding acls.")
    return pattern_type


def _resources(args: argparse.Namespace, pattern_type: PatternType) -> list[ResourcePatternFilter]:
    out: list[ResourcePatternFilter] = []
    for rtype, names in (
        (ResourceType.TOPIC, args.topic),
        (ResourceType.GROUP, args.group),
        (ResourceType.TRANSACTIONAL_ID, args.transactional_id),
    ):
        for name in names:
            if not name.strip():
                raise UsageError(f"--{rtype.name.lower().replace('_', '-')} must not be empty")
            out.append(ResourcePatternFilter(rtype, name.strip(), pattern_type))
    if args.cluster:
        out.append(ResourcePatternFilter(ResourceType.CLUSTER, CLUSTER_NAME, pattern_type))
    return list(dict.fromkeys(out))


def _entries(
    args: argparse.Namespace, ops: Sequence[AclOperation], allow: list[str], deny: list[str]
) -> frozenset[AccessControlEntry]:
    out: set[AccessControlEntry] = set()
    for principals, hosts, permission in (
        (allow, _hosts(args.allow_host, allow, "--allow-host"), AclPermissionType.ALLOW),
        (deny, _hosts(args.deny_host, deny, "--deny-host"), AclPermissionType.DENY),
    ):
        out.update(AccessControlEntry(p, h, op, permission) for p in principals for h in hosts for op in ops)
    return frozenset(out)


def parse_command(args: argparse.Namespace) -> AclCommand:
    """The command line as an :class:`AclCommand`; UsageError (one line) when it is wrong."""
    action = _action(args)
    allow = _principals(args.allow_principal, "--allow-principal")
    deny = _principals(args.deny_principal, "--deny-principal")
    listed = _principals(args.principal, "--principal")
    pattern_type = _pattern_type(args.resource_pattern_type, action)
    resources = _resources(args, pattern_type)
    role = args.producer or args.consumer
    if action == "list":
        for flag in ("producer", "consumer", "idempotent", "allow_host", "allow_principal", "deny_host"):
            if getattr(args, flag):
                raise UsageError(f"--{flag.replace('_', '-')} does not apply to --list")
        if deny:
            raise UsageError("--deny-principal does not apply to --list")
        return AclCommand("list", filters=tuple(resources), principals=tuple(listed))
    if listed:
        raise UsageError("--principal applies to --list only")
    if role and (args.operation or deny or args.deny_host):
        raise UsageError("--producer/--consumer set the operations: no --operation, --deny-principal or --deny-host")
    if args.idempotent and not args.producer:
        raise UsageError("--idempotent goes with --producer")
    if args.producer and not args.topic:
        raise UsageError("With --producer you must specify a --topic")
    if args.consumer and (not args.topic or not args.group or (not args.producer and args.cluster)):
        raise UsageError(
            "With --consumer you must specify a --topic and a --group and no --cluster option should be specified."
        )
    if not resources:
        raise UsageError("You must provide at least one resource: --topic <topic> or --cluster or --group <group>")
    changes: dict[ResourcePatternFilter, frozenset[AccessControlEntry]] = {}
    if not role:
        entries = _entries(args, _operations(args.operation), allow, deny)
        changes = dict.fromkeys(resources, entries)
    else:
        by_type: dict[ResourceType, list[AclOperation]] = {}
        if args.producer:
            by_type[ResourceType.TOPIC] = [Op.WRITE, Op.DESCRIBE, Op.CREATE]
            by_type[ResourceType.TRANSACTIONAL_ID] = [Op.WRITE, Op.DESCRIBE]
        if args.consumer:
            by_type[ResourceType.TOPIC] = [*by_type.get(ResourceType.TOPIC, []), Op.READ, Op.DESCRIBE]
            by_type[ResourceType.GROUP] = [Op.READ]
        for r in resources:
            if r.resource_type in by_type:
                changes[r] = _entries(args, by_type[r.resource_type], allow, [])
        if args.idempotent:
            cluster = ResourcePatternFilter(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL)
            changes[cluster] = _entries(args, [Op.IDEMPOTENT_WRITE], allow, [])
    if action == "add":
        if not allow and not deny:
            raise UsageError("You must specify one of: --allow-principal, --deny-principal when trying to add ACLs.")
        for r, entries in changes.items():
            for entry in entries:
                try:
                    validate_binding(AclBinding(ResourcePattern(r.resource_type, str(r.name), r.pattern_type), entry))
                except KafkaError as exc:
                    raise UsageError(exc.message) from None
    for r, entries in changes.items():
        valid = VALID_OPERATIONS.get(r.resource_type, ())
        if any(e.operation not in valid for e in entries):
            raise UsageError(
                f"ResourceType {r.resource_type.name} only supports operations {','.join(o.name for o in valid)}"
            )
    return AclCommand(action, changes, tuple(changes), force=args.force)


# --- execution (any backend) -----------------------------------------------------------


def _entry_lines(entries: Sequence[AccessControlEntry] | frozenset[AccessControlEntry]) -> str:
    ordered = sorted(entries, key=lambda e: (e.principal, e.host, e.operation, e.permission_type))
    return "\n".join(f"\t{e}" for e in ordered)


def _block(header: str, entries: Sequence[AccessControlEntry] | frozenset[AccessControlEntry]) -> str:
    """kafka-acls.sh's block: header, the entries one per line, a blank line (its spacing too)."""
    return f"{header}: \n {_entry_lines(entries)} \n"


def list_acls(
    backend: AclBackend, filters: Sequence[ResourcePatternFilter], principals: Sequence[str], out: Callable[[str], None]
) -> None:
    """``Current ACLs for resource `...`:`` blocks (per principal with ``--principal``)."""
    bindings: list[AclBinding] = []
    for f in filters or [ResourcePatternFilter(ResourceType.ANY, None, PatternType.ANY)]:
        bindings.extend(backend.describe_acls(AclBindingFilter(f, AccessControlEntryFilter())))
    by_resource: dict[ResourcePattern, set[AccessControlEntry]] = {}
    for b in bindings:
        by_resource.setdefault(b.pattern, set()).add(b.entry)
    order = sorted(by_resource, key=lambda p: (p.resource_type, p.pattern_type, p.name))
    if not principals:
        for pattern in order:
            out(_block(f"Current ACLs for resource `{pattern}`", frozenset(by_resource[pattern])))
        return
    for principal in principals:
        out(f"ACLs for principal `{principal}`")
        for pattern in order:
            theirs = frozenset(e for e in by_resource[pattern] if e.principal == principal)
            if theirs:
                out(_block(f"Current ACLs for resource `{pattern}`", theirs))


def execute(
    command: AclCommand,
    backend: AclBackend,
    *,
    out: Callable[[str], None] = print,
    confirm: Callable[[str], bool] | None = None,
) -> int:
    """Carry out ``command``; ``confirm`` asks before a removal (None: ``command.force`` must be set)."""
    if command.action == "add":
        bindings: list[AclBinding] = []
        for r, entries in command.changes.items():
            pattern = ResourcePattern(r.resource_type, str(r.name), r.pattern_type)
            out(_block(f"Adding ACLs for resource `{pattern}`", entries))
            bindings.extend(AclBinding(pattern, e) for e in sorted(entries, key=str))
        failed = next((e for e in backend.create_acls(bindings) if e is not None), None)
        if failed is not None:
            raise failed
    elif command.action == "remove":
        for r, entries in command.changes.items():
            if not command.force:
                if entries:
                    listed = _entry_lines(entries)
                    question = f"Are you sure you want to remove ACLs: \n {listed} \n from resource filter `{r}`? (y/n)"
                else:
                    question = f"Are you sure you want to delete all ACLs for resource filter `{r}`? (y/n)"
                if confirm is None or not confirm(question):
                    continue
            filters = [AclBindingFilter(r, _exact(e)) for e in sorted(entries, key=str)] or [AclBindingFilter(r)]
            failed = next((res.error for res in backend.delete_acls(filters) if res.error is not None), None)
            if failed is not None:
                raise failed
    list_acls(backend, command.filters, command.principals, out)
    return 0


def _exact(entry: AccessControlEntry) -> AccessControlEntryFilter:
    return AccessControlEntryFilter(entry.principal, entry.host, entry.operation, entry.permission_type)


# --- the command -----------------------------------------------------------------------


def _zookeeper(args: argparse.Namespace) -> str | None:
    props = parse_key_values(args.authorizer_properties, "--authorizer-properties")
    unknown = sorted(set(props) - {"zookeeper.connect"})
    if unknown:
        raise UsageError(f"--authorizer-properties: only zookeeper.connect is understood, got {','.join(unknown)}")
    from_props = props.get("zookeeper.connect")
    zookeeper = getattr(args, "zookeeper", None)
    if from_props is not None and zookeeper is not None and from_props != zookeeper:
        raise UsageError("--zookeeper and --authorizer-properties zookeeper.connect disagree")
    return zookeeper or from_props


@contextmanager
def _backend(args: argparse.Namespace) -> Iterator[AclBackend]:
    zookeeper, bootstrap = _zookeeper(args), getattr(args, "bootstrap_server", None)
    if bootstrap is not None:
        if zookeeper is not None:
            raise UsageError("give --bootstrap-server or --zookeeper (--authorizer-properties), not both")
        admin = AdminClient(check_bootstrap(bootstrap), **client_configs(args))
        try:
            yield AdminAclBackend(admin)
        finally:
            admin.close()
        return
    if zookeeper is None:
        raise UsageError(
            "give --bootstrap-server HOST:PORT or --zookeeper HOST:PORT "
            "(or --authorizer-properties zookeeper.connect=HOST:PORT)"
        )
    credential = zookeeper_credential()
    zk = connect_zookeeper(check_zookeeper(zookeeper), credential=credential)
    try:
        with refused_writes(credential):
            yield ZkAclStore(zk)
    finally:
        zk.close()


class AdminAclBackend:
    """The ACL RPCs of the brokers (any broker answers), through ``kclient.AdminClient``;
    kbroker's ACL model converted to and from kclient's flat bindings (same int codes)."""

    def __init__(self, admin: AdminClient) -> None:
        self._admin = admin

    def create_acls(self, bindings: Sequence[AclBinding]) -> list[KafkaError | None]:
        return self._admin.create_acls([to_client_binding(b) for b in bindings])

    def describe_acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        return [from_client_binding(b) for b in self._admin.describe_acls(to_client_filter(acl_filter))]

    def delete_acls(self, filters: Sequence[AclBindingFilter]) -> list[AclDeleteResult]:
        results = self._admin.delete_acls([to_client_filter(f) for f in filters])
        return [AclDeleteResult([from_client_binding(b) for b in deleted], error) for deleted, error in results]


def to_client_binding(b: AclBinding) -> client_acl.AclBinding:
    p, e = b.pattern, b.entry
    return client_acl.AclBinding(
        client_acl.ResourceType(int(p.resource_type)),
        p.name,
        client_acl.PatternType(int(p.pattern_type)),
        e.principal,
        e.host,
        client_acl.AclOperation(int(e.operation)),
        client_acl.AclPermissionType(int(e.permission_type)),
    )


def from_client_binding(b: client_acl.AclBinding) -> AclBinding:
    return AclBinding(
        ResourcePattern(ResourceType(int(b.resource_type)), b.resource_name, PatternType(int(b.pattern_type))),
        AccessControlEntry(
            b.principal, b.host, AclOperation(int(b.operation)), AclPermissionType(int(b.permission_type))
        ),
    )


def to_client_filter(f: AclBindingFilter) -> client_acl.AclBindingFilter:
    p, e = f.pattern_filter, f.entry_filter
    return client_acl.AclBindingFilter(
        client_acl.ResourceType(int(p.resource_type)),
        p.name,
        client_acl.PatternType(int(p.pattern_type)),
        e.principal,
        e.host,
        client_acl.AclOperation(int(e.operation)),
        client_acl.AclPermissionType(int(e.permission_type)),
    )


def _ask(question: str) -> bool:
    print(question, flush=True)
    return sys.stdin.readline().strip().lower() == "y"


def run(args: argparse.Namespace) -> int:
    command = parse_command(args)
    if command.action == "remove" and not command.force and not sys.stdin.isatty():
        raise UsageError("--remove asks for confirmation on a terminal; add --force to remove without asking")
    with _backend(args) as backend:
        return execute(command, backend, confirm=_ask)
