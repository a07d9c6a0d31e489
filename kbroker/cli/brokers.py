"""``kctl brokers list``: the live brokers, one per line, the controller marked; and
``kctl brokers decommission N``: move every replica off broker N.

``list`` output::

    0 127.0.0.1:9092 rack-a (controller)
    1 127.0.0.1:9093 -

(``-`` when a broker has no rack.)

``decommission N`` (over ``--zookeeper`` or ``--bootstrap-server``) plans, for every partition with a replica on
N, a replacement in place on the least loaded other live broker (same rack first), prints
the current and proposed assignments as ``partitions reassign --generate`` does, starts
the moves, and waits until N holds no replica (planning again for partitions created on N
meanwhile), then prints ``Broker N holds no partition replicas; it can be stopped.``
``--dry-run`` only prints the plan, ``--no-wait`` returns once the moves started. N may be
down: its replicas are rebuilt from the other in-sync copies. ``--throttle BYTES/s`` bounds
the moves' replication traffic as ``partitions reassign --execute --throttle`` does; the
throttles are removed when the broker is empty (unless ``--no-wait`` or
``--preserve-throttles``).
"""

from __future__ import annotations

import argparse
from typing import Any

from kbroker.cli.backends import BrokerView, open_backend
from kbroker.cli.common import UsageError, client_configs
from kbroker.cli.reassign import add_throttle_flags, check_throttle, decommission_broker, open_source


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    brokers = nouns.add_parser("brokers", help="live brokers and the controller")
    verbs = brokers.add_subparsers(dest="verb", metavar="VERB", required=True)
    lister = verbs.add_parser("list", parents=[connection], help="one line per live broker: id host:port rack")
    lister.set_defaults(handler=list_brokers)
    drain = verbs.add_parser(
        "decommission",
        parents=[connection],
        help="move every partition replica off a broker, so that it can be stopped",
        description="Plan and run the reassignments that leave broker N without replicas.",
    )
    drain.add_argument("broker", type=int, metavar="N", help="the broker to empty")
    drain.add_argument("--dry-run", action="store_true", help="print the plan only")
    drain.add_argument("--no-wait", action="store_true", help="return once the moves have started")
    drain.add_argument(
        "--timeout-ms", type=int, default=600_000, help="how long to wait for the moves (default 600000)"
    )
    add_throttle_flags(drain)
    drain.set_defaults(handler=decommission)


def broker_line(b: BrokerView, controller_id: int) -> str:
    line = f"{b.broker_id} {b.host}:{b.port} {b.rack or '-'}"
    return line + " (controller)" if b.broker_id == controller_id else line


def list_brokers(args: argparse.Namespace) -> int:
    with open_backend(args.zookeeper, args.bootstrap_server, client_configs(args)) as backend:
        brokers, controller_id = backend.brokers()
    for b in brokers:
        print(broker_line(b, controller_id))
    return 0


def decommission(args: argparse.Namespace) -> int:
    if args.timeout_ms <= 0:
        raise UsageError("--timeout-ms must be positive")
    with open_source(args.zookeeper, args.bootstrap_server, client_configs(args)) as src:
        return decommission_broker(
            src,
            args.broker,
            dry_run=args.dry_run,
            wait=not args.no_wait,
            timeout_s=args.timeout_ms / 1000,
            throttle=check_throttle(args.throttle),
            preserve_throttles=args.preserve_throttles,
        )
