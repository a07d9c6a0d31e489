"""``kctl brokers list``: the live brokers, one per line, the controller marked.

Output::

    0 127.0.0.1:9092 rack-a (controller)
    1 127.0.0.1:9093 -

(``-`` when a broker has no rack.)
"""

from __future__ import annotations

import argparse
from typing import Any

from kbroker.cli.backends import BrokerView, open_backend


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    brokers = nouns.add_parser("brokers", help="live brokers and the controller")
    verbs = brokers.add_subparsers(dest="verb", metavar="VERB", required=True)
    lister = verbs.add_parser("list", parents=[connection], help="one line per live broker: id host:port rack")
    lister.set_defaults(handler=list_brokers)


def broker_line(b: BrokerView, controller_id: int) -> str:
    line = f"{b.broker_id} {b.host}:{b.port} {b.rack or '-'}"
    return line + " (controller)" if b.broker_id == controller_id else line


def list_brokers(args: argparse.Namespace) -> int:
    with open_backend(args.zookeeper, args.bootstrap_server) as backend:
        brokers, controller_id = backend.brokers()
    for b in brokers:
        print(broker_line(b, controller_id))
    return 0
