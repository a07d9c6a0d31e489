"""What several ``kctl`` commands share: its two error kinds, flag parsers, and the
client settings of ``--command-config``.

``--command-config FILE`` (Kafka's tools' flag) is a Java properties file with Java
client property names (``security.protocol``, ``ssl.truststore.location``,
``ssl.keystore.location``, ``ssl.key.password``, ``ssl.endpoint.identification.algorithm``,
``sasl.mechanism``, ``sasl.jaas.config``, ...; see
:data:`kclient.security.JAVA_SECURITY_PROPERTIES`). :func:`client_configs` turns it into
kafka-python's keyword arguments, which every ``AdminClient``/``Producer``/``Consumer``
that kctl makes receives. Unknown keys are ignored with a warning (shown with
``--verbose``), as Kafka's clients warn; an unreadable file or a bad value is a
UsageError (exit 2) that never quotes a secret.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kclient.errors import InvalidConfigError
from kclient.security import JAVA_SECURITY_PROPERTIES, SecurityConfig, java_client_configs

log = logging.getLogger("kbroker.cli")

INLINE_PEM_PROPERTIES = ("ssl.keystore.certificate.chain", "ssl.keystore.key", "ssl.truststore.certificates")
"""Kafka's inline PEM keys: not supported by kctl (name files with the *.location keys)."""


class UsageError(Exception):
    """The command line is wrong (exit 2): a flag is missing, malformed or misplaced."""


class CliError(Exception):
    """The command could not be carried out (exit 1), for a reason that is no KafkaError."""


def one_line(text: str) -> str:
    """``text`` with its lines joined, so an error is always one line on stderr."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def parse_key_values(items: Iterable[str], flag: str) -> dict[str, str]:
    """``["k=v", ...]`` (one pair per flag, as Kafka's ``--config``) -> ``{k: v}``."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise UsageError(f"{flag} expects KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def parse_bool(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise UsageError(f"property {name} must be true or false, got {value!r}")


def client_config(items: Iterable[str], flag: str, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Kafka-named ``k=v`` settings as kclient keyword arguments, typed by kclient's defaults.

    ``linger.ms`` becomes ``linger_ms``; a setting kclient does not have, or one that
    takes a Python object (serializers, assignors), is a UsageError.
    """
    out: dict[str, Any] = {}
    for name, text in parse_key_values(items, flag).items():
        key = name.replace(".", "_").replace("-", "_")
        if key not in defaults:
            known = ", ".join(sorted(k.replace("_", ".") for k, v in defaults.items() if _settable(k, v)))
            raise UsageError(f"unknown {flag} setting {name!r} (known: {known})")
        default = defaults[key]
        if not _settable(key, default):
            raise UsageError(f"{flag} cannot set {name} (it takes a Python object)")
        out[key] = _typed(text, default, name)
    return out


def _settable(key: str, default: Any) -> bool:
    return "serializer" not in key and (default is None or isinstance(default, bool | int | float | str))


def _typed(text: str, default: Any, name: str) -> Any:
    if isinstance(default, bool):
        return parse_bool(text, name)
    try:
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        raise UsageError(f"property {name} must be a number, got {text!r}") from None
    return text


def parse_replica_assignment(text: str) -> dict[int, list[int]]:
    """Kafka's ``--replica-assignment``: ``"0:1,1:2"`` -> ``{0: [0, 1], 1: [1, 2]}``.

    Partitions are comma-separated and numbered from 0 in order; each is a
    colon-separated list of broker ids, the first being the preferred leader.
    """
    out: dict[int, list[int]] = {}
    for p, part in enumerate(text.split(",")):
        ids = [b.strip() for b in part.split(":")]
        if not all(b.isdigit() for b in ids):
            raise UsageError(f"--replica-assignment expects broker ids like 0:1,1:2; partition {p} is {part.strip()!r}")
        out[p] = [int(b) for b in ids]
    return out


def _check_hosts(hosts: str, what: str, example: str) -> None:
    for hp in hosts.split(","):
        host, colon, port = hp.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"{what} must be {example}, got {hp.strip()!r}")


def check_zookeeper(connect: str) -> str:
    """``HOST:PORT[,HOST:PORT...][/chroot]``, or a UsageError."""
    hosts, _, _ = connect.partition("/")
    _check_hosts(hosts, "--zookeeper", "HOST:PORT[,HOST:PORT...][/chroot]")
    return connect


def check_bootstrap(servers: str) -> str:
    """``HOST:PORT[,HOST:PORT...]``, or a UsageError."""
    _check_hosts(servers, "--bootstrap-server", "HOST:PORT[,HOST:PORT...]")
    return servers


# --- --command-config ------------------------------------------------------------------


def _unescape(text: str) -> str:
    """Java properties escapes: ``\\t \\n \\r \\f``, ``\\uXXXX``, and ``\\x`` = ``x``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 == len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u" and len(text) >= i + 6:
            try:
                out.append(chr(int(text[i + 2 : i + 6], 16)))
                i += 6
                continue
            except ValueError:
                pass
        out.append({"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(nxt, nxt))
        i += 2
    return "".join(out)


def _split_property(line: str) -> tuple[str, str]:
    """``key=value``, ``key: value`` or ``key value`` (the first unescaped separator)."""
    i = 0
    while i < len(line):
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in "=: \t\f":
            key, rest = line[:i], line[i:].lstrip(" \t\f")
            if ch in " \t\f" and rest[:1] in ("=", ":"):
                rest = rest[1:]
            elif ch in "=:":
                rest = rest[1:]
            return _unescape(key), _unescape(rest.lstrip(" \t\f"))
        i += 1
    return _unescape(line), ""


def read_properties(path: str, flag: str = "--command-config") -> dict[str, str]:
    """A Java properties file (comments ``#``/``!``, ``=``/``:``/space separators, ``\\``
    continuation lines, escapes). UsageError naming ``flag`` if it cannot be read; no
    error quotes the file's text (it holds passwords)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {flag} {path}: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError:
        raise UsageError(f"cannot read {flag} {path}: not UTF-8 text") from None
    props: dict[str, str] = {}
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip(" \t\f")
        if not pending and (not line or line.startswith(("#", "!"))):
            continue
        line = pending + line
        if (len(line) - len(line.rstrip("\\"))) % 2 == 1:
            pending = line[:-1]
            continue
        pending = ""
        key, value = _split_property(line)
        props[key] = value
    if pending:
        key, value = _split_property(pending)
        props[key] = value
    return props


def client_settings(props: dict[str, str], where: str) -> dict[str, Any]:
    """kafka-python's security settings of Java client ``props``, checked (the files are
    read now): UsageError naming ``where`` for a bad value. Unknown keys are logged."""
    inline = [k for k in INLINE_PEM_PROPERTIES if k in props]
    if inline:
        raise UsageError(
            f"{where}: {inline[0]} (inline PEM) is not supported; put the PEM in a file and use "
            "ssl.keystore.location / ssl.truststore.location"
        )
    unknown = sorted(set(props) - set(JAVA_SECURITY_PROPERTIES))
    for key in unknown:
        log.warning("%s: the configuration '%s' was supplied but isn't a known config (ignored)", where, key)
    try:
        configs = java_client_configs(props)
        SecurityConfig.from_configs(configs)
    except InvalidConfigError as exc:
        raise UsageError(f"{where}: {exc.message}") from None
    return configs


def client_configs(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments for every AdminClient, Producer and Consumer kctl makes:
    the security settings of ``--command-config`` (empty without it). Read once per
    command (kept on ``args``)."""
    cached = vars(args).get("_client_configs")
    if cached is not None:
        return dict(cached)
    path = getattr(args, "command_config", None)
    configs = {} if path is None else client_settings(read_properties(str(path)), f"--command-config {path}")
    vars(args)["_client_configs"] = configs
    return dict(configs)


# --- the default connection ---------------------------------------------------------

BOOTSTRAP_ENV = "KBROKER_BOOTSTRAP"
"""The bootstrap servers kctl uses when neither --bootstrap-server nor --zookeeper is given."""
CLUSTER_STATE = Path(".run") / "cluster.json"
"""What ``scripts/run`` writes: ``{"bootstrap": ..., "zookeeper": {"connect": ..., "pid": ...},
"command_config": ...}`` (``command_config`` with ``--secure`` only)."""


@dataclass(frozen=True)
class DefaultConnection:
    """Where kctl connects when the command line names no cluster, and where that came from."""

    bootstrap: str | None
    zookeeper: str | None
    command_config: str | None
    source: str
    """``$KBROKER_BOOTSTRAP`` or the path of the cluster.json it was read from."""


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return True  # no pid recorded: trust the file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_cluster_state(cwd: Path | None = None) -> Path | None:
    """``.run/cluster.json`` in ``cwd`` (default: the current directory) or its nearest parent."""
    here = (cwd or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / CLUSTER_STATE
        if candidate.is_file():
            return candidate
    return None


def read_cluster_state(path: Path) -> DefaultConnection | None:
    """The connection a running local cluster's state file gives; None if unreadable or if its
    ZooKeeper process is gone (a stale file of a stopped cluster)."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    found = state.get("zookeeper")
    zk: dict[str, Any] = found if isinstance(found, dict) else {}
    if not _pid_alive(zk.get("pid")):
        return None
    bootstrap, connect, config = state.get("bootstrap"), zk.get("connect"), state.get("command_config")
    return DefaultConnection(
        bootstrap if isinstance(bootstrap, str) and bootstrap else None,
        connect if isinstance(connect, str) and connect else None,
        config if isinstance(config, str) and config else None,
        str(path),
    )


def default_connection(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> DefaultConnection | None:
    """``$KBROKER_BOOTSTRAP`` (with cluster.json's ZooKeeper and command config when it names
    the same bootstrap servers), else the local cluster's ``.run/cluster.json``; None if neither."""
    environ = os.environ if env is None else env
    path = find_cluster_state(cwd)
    state = read_cluster_state(path) if path is not None else None
    servers = environ.get(BOOTSTRAP_ENV, "").strip()
    if servers:
        same = state is not None and state.bootstrap == servers
        return DefaultConnection(
            servers,
            state.zookeeper if same and state is not None else None,
            state.command_config if same and state is not None else None,
            f"${BOOTSTRAP_ENV}",
        )
    return state


def describe_default(found: DefaultConnection | None) -> str:
    """For --help: what kctl would connect to now without connection flags."""
    if found is None:
        return f"none now: set ${BOOTSTRAP_ENV} or start a local cluster with scripts/run"
    where = found.bootstrap or found.zookeeper
    return f"now {where} from {found.source}"
