"""The layers of docs/internals/layers.md, read from the code's own imports: a new import
that runs back up (or past the core) fails here, named by file and line."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imports(package: str) -> Iterator[tuple[str, int, str]]:
    """(file, line, imported module) for every import in ``package``'s files."""
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield rel, node.lineno, alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                yield rel, node.lineno, node.module


def offending(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{file}:{line} imports {module}"
        for file, line, module in imports(package)
        if any(module == f or module.startswith(f + ".") for f in forbidden)
    ]


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        (
            "kbroker/storage",
            (
                "kbroker.api",
                "kbroker.doors",
                "kbroker.cluster",
                "kbroker.replication",
                "kbroker.group",
                "kbroker.security",
                "kbroker.server",
                "kazoo",
                "grpc",
            ),
        ),
        ("kbroker/doors", ("kbroker.replication", "kbroker.cluster", "kbroker.group", "kbroker.storage", "kazoo")),
        ("kbroker/api", ("kbroker.doors", "kbroker.server", "kazoo", "grpc")),
        ("kbroker/group", ("kbroker.api", "kbroker.doors", "kbroker.server")),
        ("kbroker/txn", ("kbroker.api", "kbroker.doors", "kbroker.server")),
        ("kbroker/replication", ("kbroker.api", "kbroker.doors", "kbroker.group", "kbroker.server")),
        ("kbroker/cluster", ("kbroker.api", "kbroker.doors", "kbroker.group", "kbroker.server")),
        ("kclient", ("kbroker",)),
    ],
)
def test_no_import_runs_back_up(package: str, forbidden: tuple[str, ...]) -> None:
    assert offending(package, forbidden) == []


def test_only_the_cluster_package_imports_kazoo() -> None:
    users = sorted(
        {
            file
            for package in ("kbroker", "kclient")
            for file, _, module in imports(package)
            if module.split(".")[0] == "kazoo"
        }
    )
    assert users and all(f.startswith("kbroker/cluster/") for f in users), users


def test_the_check_sees_an_import_that_runs_back_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kbroker" / "storage").mkdir(parents=True)
    (tmp_path / "kbroker" / "storage" / "bad.py").write_text("from kbroker.cluster import zkdata\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert offending("kbroker/storage", ("kbroker.cluster",)) == ["kbroker/storage/bad.py:1 imports kbroker.cluster"]


def test_the_broker_uses_the_records_package_through_its_public_names() -> None:
    private = []
    for package in ("kbroker",):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kclient.records"):
                    private += [
                        f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_") or node.module != "kclient.records"
                    ]
    assert private == []
