"""``kbroker --version`` and ``kctl --version`` (issue 25): the installed distribution's
version, whose one definition is pyproject.toml's ``version``; exit status 0."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import kbroker
from kbroker import server
from kbroker.cli import main as kctl

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_version_is_pyprojects() -> None:
    assert kbroker.version() == PROJECT["version"]


def test_a_tree_never_installed_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert kbroker.version() == "0+unknown"


@pytest.mark.parametrize(("script", "entry"), [("kbroker", server.main), ("kctl", kctl.main)])
def test_version_flag(script: str, entry: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert callable(entry)
    with pytest.raises(SystemExit) as exited:
        entry(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"{script} {PROJECT['version']}\n"


def test_the_console_scripts_are_these_mains() -> None:
    assert PROJECT["scripts"] == {"kbroker": "kbroker.server:main", "kctl": "kbroker.cli.main:main"}
