"""``kctl``'s argparse tree, and the one place where errors become exit codes.

Connection flags (``--zookeeper``, ``--bootstrap-server``, ``--command-config``) and ``--verbose`` are
accepted before the noun (``kctl --zookeeper zk:2181 topics list``) and after the verb
(``kctl topics list --zookeeper zk:2181``, as Kafka's scripts take them).

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

from kazoo.exceptions import KazooException, NoAuthError
from kazoo.handlers.threading import KazooTimeoutError

from kbroker.cli import (
    acls,
    backends,
    brokers,
    configs,
    console,
    groups,
    leaders,
    log_dirs,
    perf,
    reassign,
    topics,
    users,
    zk_security,
)
from kbroker.cli.common import CliError, UsageError, client_configs, one_line
from kclient.errors import KafkaConnectionError, KafkaError, NoBrokersAvailable

PROG = "kctl"
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class KctlArgumentParser(argparse.ArgumentParser):
    """argparse with usage errors as one ``kctl: ...`` line (still exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{PROG}: {one_line(message)} (see '{self.prog} --help')\n")


def _connection_flags(parser: argparse.ArgumentParser, *, zookeeper: bool, default: object) -> None:
    if zookeeper:
        parser.add_argument(
            "--zookeeper",
            metavar="HOST:PORT[/chroot]",
            default=default,
            help="read and write the znodes directly (kafka-topics.sh --zookeeper)",
        )
    parser.add_argument(
        "--bootstrap-server", metavar="HOST:PORT[,HOST:PORT]", default=default, help="talk to the brokers over gRPC"
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
    parser = KctlArgumentParser(
        prog=PROG,
        description="Operate a kbroker cluster: topics, brokers, leaders, consumer groups, console produce, consume.",
        epilog="Exit status: 0 ok, 1 failed, 2 bad command line. Errors are one 'kctl: ...' line on stderr.",
    )
    _connection_flags(parser, zookeeper=True, default=None)
    parser.set_defaults(verbose=False)
    # The same flags after the verb; SUPPRESS keeps a value given before the noun.
    admin_flags = KctlArgumentParser(add_help=False)
    _connection_flags(admin_flags, zookeeper=True, default=argparse.SUPPRESS)
    client_flags = KctlArgumentParser(add_help=False)
    _connection_flags(client_flags, zookeeper=False, default=argparse.SUPPRESS)

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
    console.add_parsers(nouns, client_flags)
    perf.add_parser(nouns, client_flags)
    return parser


def _configure_logging(verbose: bool) -> None:
    root = logging.getLogger()
    if verbose:
        logging.basicConfig(
            level=logging.WARNING, stream=sys.stderr, format=f"{PROG}: %(levelname)s %(name)s: %(message)s"
        )
    else:
        # kazoo and kclient log retries as warnings; without --verbose only our one line shows.
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
    try:
        client_configs(args)  # a bad --command-config fails before anything is done
        return int(args.handler(args))
    except UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except KafkaError as exc:
        return _fail(str(exc) + _security_hint(args, exc), EXIT_FAILURE)
    except CliError as exc:
        return _fail(str(exc), EXIT_FAILURE)
    except KazooTimeoutError:
        return _fail("ZooKeeper did not answer in time", EXIT_FAILURE)
    except NoAuthError:
        return _fail(backends.refused_write_message(), EXIT_FAILURE)
    except KazooException as exc:
        detail = f": {exc}" if str(exc) else ""
        return _fail(f"ZooKeeper error: {type(exc).__name__}{detail}", EXIT_FAILURE)
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
