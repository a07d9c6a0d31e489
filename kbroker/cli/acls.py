"""``kctl acls``: placeholder registered while issue 12's module is written (replaced entirely)."""

from __future__ import annotations

import argparse
from typing import Any

from kbroker.cli.common import CliError


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    p = nouns.add_parser("acls", parents=[connection], help="(not available yet)")
    p.set_defaults(handler=_unavailable)


def _unavailable(args: argparse.Namespace) -> int:
    raise CliError("kctl acls is not available in this build")
