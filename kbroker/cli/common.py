"""What several ``kctl`` commands share: its two error kinds and flag parsers."""

from __future__ import annotations

from collections.abc import Iterable


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
