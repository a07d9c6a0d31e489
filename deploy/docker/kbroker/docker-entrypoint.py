#!/opt/kbroker/bin/python
"""The kbroker image's entrypoint and healthcheck (issue 25).

Configuration, as Kafka's images take it:

- a properties file: ``$KBROKER_CONFIG`` (default ``/etc/kbroker/server.properties``;
  mount one there), used when it exists;
- environment variables ``KBROKER_<KEY>`` over it: the key is the rest of the name in
  lower case, with ``_`` for ``.``, ``__`` for ``_`` and ``___`` for ``-``, as Kafka's
  images map ``KAFKA_*`` (``KBROKER_BROKER_ID=1`` is ``broker.id=1``,
  ``KBROKER_ZOOKEEPER_CONNECT`` is ``zookeeper.connect``, ``KBROKER_LOG_DIRS`` is
  ``log.dirs``). The names kbroker itself reads (``KBROKER_ZK_DIGEST``,
  ``KBROKER_BOOTSTRAP``, ...) and ``KBROKER_CONFIG`` are not settings. The broker rejects
  a key it does not know, so a misspelt variable stops it with the key's name;
- arguments after the image name: kbroker's own flags (``--broker-id 2``, ``-o key=value``).

``kbroker-docker-entrypoint`` runs ``kbroker [file] -o key=value ... [args]`` (exec: the
broker is PID 1 and gets docker stop's SIGTERM, a controlled shutdown). Any other first
argument runs that command instead (``kctl ...``, ``bash``).

``kbroker-docker-entrypoint --health`` is the image's HEALTHCHECK: healthy once the broker
answers on its first listener and the cluster's metadata lists its ``broker.id`` (it is
registered in ZooKeeper). A listener with TLS or SASL is only checked to accept
connections.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

PREFIX = "KBROKER_"
NOT_SETTINGS = frozenset(
    {
        "KBROKER_CONFIG",  # the properties file
        "KBROKER_VERSION",  # the image's version label
        "KBROKER_ZK_DIGEST",  # kbroker's ZooKeeper digest credential
        "KBROKER_BOOTSTRAP",  # kctl's default brokers
        "KBROKER_NO_EXTENSIONS",  # kclient without its C codec
        "KBROKER_KCTL",
    }
)
DEFAULT_CONFIG = "/etc/kbroker/server.properties"
IMAGE_DEFAULTS = {"listeners": "PLAINTEXT://0.0.0.0:9092", "log.dirs": "/var/lib/kbroker/data"}
"""Settings of the image, under the file's and the environment's."""


def key_of(variable: str) -> str:
    """``KBROKER_LOG_RETENTION_HOURS`` -> ``log.retention.hours`` (``__`` -> ``_``, ``___`` -> ``-``)."""
    name = variable[len(PREFIX) :].lower()
    return name.replace("___", "\0").replace("__", "\1").replace("_", ".").replace("\0", "-").replace("\1", "_")


def env_settings(environ: dict[str, str]) -> dict[str, str]:
    return {
        key_of(name): value
        for name, value in sorted(environ.items())
        if name.startswith(PREFIX) and name not in NOT_SETTINGS and len(name) > len(PREFIX)
    }


def config_file(environ: dict[str, str]) -> Path | None:
    path = Path(environ.get("KBROKER_CONFIG", DEFAULT_CONFIG))
    return path if path.is_file() else None


def file_settings(environ: dict[str, str]) -> dict[str, str]:
    from kbroker.config import load_properties

    path = config_file(environ)
    return load_properties(path) if path is not None else {}


def settings(environ: dict[str, str]) -> dict[str, str]:
    """What the broker runs with (before its command-line flags): the image's defaults,
    the file, the environment."""
    return {**IMAGE_DEFAULTS, **file_settings(environ), **env_settings(environ)}


def command(environ: dict[str, str], args: list[str]) -> list[str]:
    cmd = ["kbroker"]
    path = config_file(environ)
    if path is not None:
        cmd.append(str(path))
    given = file_settings(environ)
    overrides = {k: v for k, v in IMAGE_DEFAULTS.items() if k not in given} | env_settings(environ)
    for key, value in overrides.items():
        cmd += ["-o", f"{key}={value}"]
    return cmd + args


def health(environ: dict[str, str]) -> int:
    effective = settings(environ)
    listeners = effective["listeners"]
    first = listeners.split(",")[0].strip()
    name, _, address = first.partition("://")
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    broker_id = int(effective.get("broker.id", "0"))
    with socket.create_connection((host, int(port)), timeout=3):
        pass
    protocol_map = effective.get("listener.security.protocol.map", "")
    protocol = dict(p.split(":", 1) for p in protocol_map.split(",") if ":" in p).get(name, name)
    if protocol != "PLAINTEXT":
        print(f"{first} accepts connections")
        return 0
    from kclient.admin import AdminClient

    with AdminClient(f"{host}:{port}", request_timeout_ms=3000) as admin:
        brokers, controller, _ = admin.describe_cluster()
    ids = [b.node_id for b in brokers]
    if broker_id not in ids:
        print(f"broker {broker_id} is not in the cluster's metadata (brokers {ids})")
        return 1
    print(f"broker {broker_id} serves on {first}; brokers {ids}, controller {controller}")
    return 0


def main(argv: list[str]) -> int:
    environ = dict(os.environ)
    if argv[:1] == ["--health"]:
        try:
            return health(environ)
        except Exception as exc:
            print(f"unhealthy: {type(exc).__name__}: {exc}")
            return 1
    if argv and not argv[0].startswith("-"):
        os.execvp(argv[0], argv)  # another command: kctl, bash, ...
    cmd = command(environ, argv)
    shown = [a.split("=")[0] + "=***" if "jaas" in a or "password" in a else a for a in cmd]
    print("kbroker-docker-entrypoint: " + " ".join(shown), file=sys.stderr, flush=True)
    os.execvp(cmd[0], cmd)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
