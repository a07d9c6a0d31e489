"""``kctl users``: placeholder registered while issue 12's module is written (replaced entirely)."""

from __future__ import annotations

import argparse
from typing import Any

from kbroker.cli.common import CliError


def add_parser(nouns: argparse._SubParsersAction[Any], connection: argparse.ArgumentParser) -> None:
    p = nouns.add_parser("users", parents=[connection], help="(not available yet)")
    p.set_defaults(handler=_unavailable)


def _unavailable(args: argparse.Namespace) -> int:
    raise CliError("kctl users is not available in this build")
