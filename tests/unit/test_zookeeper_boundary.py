"""Only ``kbroker/cluster/`` talks to ZooKeeper: the sources of kbroker and kclient are
scanned for kazoo imports, uses of a raw kazoo handle (``zk.kazoo``) and znode path
literals outside it."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "kbroker/cluster/"

ALLOWED_KAZOO_USERS: set[str] = set()
"""Modules outside cluster/ still allowed to import kazoo or use ``.kazoo``; each says why."""

ZNODE_PATH = re.compile(
    r"^/(admin|brokers|cluster|config|consumers|controller|controller_epoch|delegation_token"
    r"|isr_change_notification|kafka-acl[\w-]*|latest_producer_id_block|log_dir_event_notification)(/|$)"
)
"""A string that names one of Kafka's znodes: those belong in kbroker/cluster/zkdata.py."""


@cache
def _sources() -> tuple[tuple[str, ast.Module], ...]:
    files = sorted((ROOT / "kbroker").rglob("*.py")) + sorted((ROOT / "kclient").rglob("*.py"))
    return tuple((f.relative_to(ROOT).as_posix(), ast.parse(f.read_text(), str(f))) for f in files)


def _kazoo_uses(tree: ast.Module) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] == "kazoo"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kazoo":
            found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Attribute) and node.attr == "kazoo":
            found.append(f"line {node.lineno}: .kazoo")
    return found


def test_only_the_cluster_package_uses_kazoo() -> None:
    offenders = {
        path: uses
        for path, tree in _sources()
        if not path.startswith(CLUSTER) and path not in ALLOWED_KAZOO_USERS and (uses := _kazoo_uses(tree))
    }
    assert offenders == {}, "kazoo outside kbroker/cluster/ (go through a cluster module instead)"


def test_the_allow_list_is_not_stale() -> None:
    sources = dict(_sources())
    stale = sorted(p for p in ALLOWED_KAZOO_USERS if p not in sources or not _kazoo_uses(sources[p]))
    assert stale == [], "these no longer use kazoo: remove them from ALLOWED_KAZOO_USERS"


def test_znode_paths_are_named_in_zkdata_only() -> None:
    offenders: list[str] = []
    for path, tree in _sources():
        if path == "kbroker/cluster/zkdata.py":
            continue
        prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # docstrings
        offenders += [
            f"{path}:{n.lineno}: {n.value!r}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and id(n) not in prose
            and ZNODE_PATH.match(n.value)
        ]
    assert offenders == [], "znode path literals outside kbroker/cluster/zkdata.py"
