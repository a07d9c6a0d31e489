"""``kctl``'s argparse tree, and the one place where errors become exit codes.

Connection flags (``--zookeeper``, ``--bootstrap-server``, ``--command-config``) and ``--verbose`` are
accepted before the noun (``kctl --zookeeper zk:2181 topics list``) and after the verb
(``kctl topics list --zookeeper zk:2181``, as Kafka's scripts take them).

Without ``--bootstrap-server`` and ``--zookeeper`` the connection comes from
``$KBROKER_BOOTSTRAP``, else from the local cluster's ``.run/cluster.json`` (its
``bootstrap``; its ZooKeeper ``connect`` for commands that only work on ZooKeeper; its
``command_config`` when present), found in the current directory or a parent
(:func:`apply_default_connection`). ``--verbose`` says which was used.

Exit codes: 0 success; 1 the operation failed (any KafkaError, ZooKeeper or brokers
unreachable, records not acknowledged); 2 the command line is wrong; 130 interrupted.
Every failure is exactly one line on stderr, prefixed ``kctl: ``; ``--verbose`` adds
client logs and, for an unexpected error, its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

import kbroker
from kbroker.cli import (
    acls,
    backends,
    brokers,
    configs,
    console,
    delete_records,
    dump_log,
    groups,
    leaders,
    log_dirs,
    perf,
    reassign,
    top,
    topics,
    transactions,
    users,
    zk_security,
)
from kbroker.cli.common import (
    CliError,
    DefaultConnection,
    UsageError,
    client_configs,
    default_connection,
    describe_default,
    one_line,
)
from kbroker.cluster.zk_errors import ZooKeeperError, ZooKeeperNoAuthError, ZooKeeperTimeoutError, mapped
from kclient.errors import KafkaConnectionError, KafkaError, NoBrokersAvailable

PROG = "kctl"
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class KctlArgumentParser(argparse.ArgumentParser):
    """argparse with usage errors as one ``kctl: ...`` line (still exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{PROG}: {one_line(message)} (see '{self.prog} --help')\n")


NO_CONNECTION = frozenset({dump_log.NOUN})
"""Commands that read local files only."""
ZOOKEEPER_ONLY = frozenset({zk_security.NOUN})
"""Commands that work on ZooKeeper only: their default connection is cluster.json's ZooKeeper."""


def _connection_flags(
    parser: argparse.ArgumentParser, *, zookeeper: bool, default: object, found: DefaultConnection | None = None
) -> None:
    if zookeeper:
        parser.add_argument(
            "--zookeeper",
            metavar="HOST:PORT[/chroot]",
            default=default,
            help="read and write the znodes directly (kafka-topics.sh --zookeeper)",
        )
    parser.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT[,HOST:PORT]",
        default=default,
        help="talk to the brokers over gRPC (without this and --zookeeper: $KBROKER_BOOTSTRAP, else the local "
        f"cluster's .run/cluster.json; {describe_default(found)})",
    )
    parser.add_argument(
        "--command-config",
        metavar="FILE",
        default=default,
        help="Java client properties for the brokers (security.protocol, ssl.truststore.location, "
        "ssl.keystore.location, ssl.key.password, sasl.mechanism, sasl.jaas.config, ...)",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="client logs and summaries on stderr"
    )


def build_parser() -> KctlArgumentParser:
    found = default_connection()
    parser = KctlArgumentParser(
        prog=PROG,
        description="Operate a kbroker cluster: topics, brokers, leaders, consumer groups, console produce, consume.",
        epilog="Exit status: 0 ok, 1 failed, 2 bad command line. Errors are one 'kctl: ...' line on stderr.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {kbroker.version()}")
    _connection_flags(parser, zookeeper=True, default=None, found=found)
    parser.set_defaults(verbose=False)
    # The same flags after the verb; SUPPRESS keeps a value given before the noun.
    admin_flags = KctlArgumentParser(add_help=False)
    _connection_flags(admin_flags, zookeeper=True, default=argparse.SUPPRESS, found=found)
    client_flags = KctlArgumentParser(add_help=False)
    _connection_flags(client_flags, zookeeper=False, default=argparse.SUPPRESS, found=found)

    nouns = parser.add_subparsers(dest="noun", metavar="NOUN", required=True)
    topics.add_parser(nouns, admin_flags)
    brokers.add_parser(nouns, admin_flags)
    leaders.add_parser(nouns, admin_flags)
    groups.add_parser(nouns, admin_flags)
    configs.add_parser(nouns, admin_flags)
    reassign.add_parser(nouns, admin_flags)
    acls.add_parser(nouns, admin_flags)
    users.add_parser(nouns, admin_flags)
    zk_security.add_parser(nouns, admin_flags)
    log_dirs.add_parser(nouns, client_flags)
    delete_records.add_parser(nouns, client_flags)
    transactions.add_parser(nouns, client_flags)
    console.add_parsers(nouns, client_flags)
    perf.add_parser(nouns, client_flags)
    dump_log.add_parser(nouns)
    top.add_parser(nouns, admin_flags)
    return parser


def _names_zookeeper_elsewhere(args: argparse.Namespace) -> bool:
    """A ZooKeeper given by a command's own flag (kafka-acls.sh's --authorizer-properties,
    zookeeper-security-migration's --zookeeper.connect)."""
    if getattr(args, "zookeeper_connect", None):
        return True
    return any(
        str(p).strip().startswith("zookeeper.connect=") for p in getattr(args, "authorizer_properties", None) or ()
    )


def apply_default_connection(args: argparse.Namespace, found: DefaultConnection | None) -> str | None:
    """Fill ``args`` from ``found`` when the command line names no cluster; returns a note
    saying what was used (None when nothing was filled in)."""
    if args.noun in NO_CONNECTION or found is None:
        return None
    if getattr(args, "zookeeper", None) is not None or getattr(args, "bootstrap_server", None) is not None:
        return None
    if _names_zookeeper_elsewhere(args):
        return None
    if args.noun in ZOOKEEPER_ONLY:
        if found.zookeeper is None:
            return None
        args.zookeeper = found.zookeeper
        return f"using --zookeeper {found.zookeeper} from {found.source}"
    if found.bootstrap is None:
        return None
    args.bootstrap_server = found.bootstrap
    note = f"using --bootstrap-server {found.bootstrap} from {found.source}"
    if getattr(args, "command_config", None) is None and found.command_config is not None:
        args.command_config = found.command_config
        note += f" (and --command-config {found.command_config})"
    return note


def _configure_logging(verbose: bool) -> None:
    root = logging.getLogger()
    if verbose:
        logging.basicConfig(
            level=logging.WARNING, stream=sys.stderr, format=f"{PROG}: %(levelname)s %(name)s: %(message)s"
        )
    else:
        # ZooKeeper's client and kclient log retries as warnings; without --verbose only our one line shows.
        root.addHandler(logging.NullHandler())
        root.setLevel(logging.CRITICAL + 1)


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {one_line(message)}", file=sys.stderr)
    return code


def _security_hint(args: argparse.Namespace, exc: KafkaError) -> str:
    """For brokers that answered but not as gRPC over plaintext (the TLS port closed the
    socket), reached over --bootstrap-server without --command-config: the listener may
    be SSL or SASL_SSL. Not for a refused connection (nothing listens there)."""
    if not isinstance(exc, KafkaConnectionError | NoBrokersAvailable) or "Connection refused" in str(exc):
        return ""
    if getattr(args, "bootstrap_server", None) is None or getattr(args, "command_config", None) is not None:
        return ""
    return " (an SSL or SASL listener needs --command-config with security.protocol and its settings)"


def _silence_stdout() -> None:
    """After a broken pipe: stop Python from failing again when it flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose)
    note = apply_default_connection(args, default_connection())
    if note is not None and args.verbose:
        print(f"{PROG}: {note}", file=sys.stderr)
    try:
        client_configs(args)  # a bad --command-config fails before anything is done
        with mapped():  # ZooKeeper's failures as ZooKeeperError
            return int(args.handler(args))
    except UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except ZooKeeperTimeoutError:
        return _fail("ZooKeeper did not answer in time", EXIT_FAILURE)
    except ZooKeeperNoAuthError:
        return _fail(backends.refused_write_message(), EXIT_FAILURE)
    except ZooKeeperError as exc:
        return _fail(f"ZooKeeper error: {exc.message}", EXIT_FAILURE)
    except KafkaError as exc:
        return _fail(str(exc) + _security_hint(args, exc), EXIT_FAILURE)
    except CliError as exc:
        return _fail(str(exc), EXIT_FAILURE)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except Exception as exc:
        if args.verbose:
            traceback.print_exc()
        return _fail(f"unexpected error: {type(exc).__name__}: {exc} (--verbose shows the traceback)", EXIT_FAILURE)


if __name__ == "__main__":
    raise SystemExit(main())
