"""Packaging (issue 25): ``python -m build`` makes an sdist and a wheel from a clean copy of
the tree; a fresh virtualenv installs each one (the sdist compiles the C record codec from
source); ``kbroker --version`` and ``kctl --version`` work there, and kclient runs on the
compiled twin.

Only one step uses the network: a wheelhouse of the runtime dependencies (pinned to the
versions installed here, so pip's cache usually answers) and of the build backend. The
build and both installs then run with ``--no-index`` against it. About 30 s on two cores
(a cold pip cache adds the download of the dependencies' wheels, about 30 MB).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION: str = PYPROJECT["project"]["version"]
BUILD_REQUIRES: list[str] = PYPROJECT["build-system"]["requires"]


def _env(**extra: str) -> dict[str, str]:
    """This environment without what would point a child at the project's own venv or tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KBROKER_NO_EXTENSIONS")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def _run(cmd: Sequence[str | Path], *, cwd: Path, timeout: float = 300, **env: str) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _source_files() -> list[str]:
    """What a clean clone holds (tracked files, and new ones git does not ignore)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return [p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Wheels of the runtime dependencies and of the build backend, pinned (by a constraints
    file) to what this venv has installed."""
    house = tmp_path_factory.mktemp("wheelhouse")
    pins = sorted(
        {
            f"{d.metadata['Name']}=={d.version}"
            for d in metadata.distributions()
            if d.metadata["Name"] and d.metadata["Name"].lower() not in ("kbroker", "pip")
        }
    )
    constraints = house / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    wanted = [*PYPROJECT["project"]["dependencies"], *BUILD_REQUIRES]
    started = time.monotonic()
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", house, "-c", constraints, *wanted],
        cwd=house,
        timeout=600,
    )
    print(f"wheelhouse: {len(list(house.glob('*.whl')))} wheels in {time.monotonic() - started:.1f} s")
    return house


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> Path:
    """``python -m build`` (the sdist, then the wheel built from the sdist) on a copy of the
    tree, so that the working tree is left alone and nothing git ignores (an in-place .so,
    egg-info) leaks in."""
    base = tmp_path_factory.mktemp("build")
    src = base / "src"
    for name in _source_files():
        target = src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    out = base / "dist"
    started = time.monotonic()
    _run(
        [sys.executable, "-m", "build", "--outdir", out, src],
        cwd=base,
        timeout=600,
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(wheelhouse),
    )
    took = time.monotonic() - started
    for f in sorted(out.iterdir()):
        print(f"built {f.name}: {f.stat().st_size / 1024:.0f} KiB")
    print(f"python -m build took {took:.1f} s")
    return out


def _sdist(dist: Path) -> Path:
    (found,) = dist.glob(f"kbroker-{VERSION}.tar.gz")
    return found


def _wheel(dist: Path) -> Path:
    (found,) = dist.glob(f"kbroker-{VERSION}-*.whl")
    return found


def test_the_sdist_holds_what_building_and_running_need(dist: Path) -> None:
    with tarfile.open(_sdist(dist)) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    needed = {"pyproject.toml", "setup.py", "README.md", "MANIFEST.in", "kclient/_crecords.c"}
    needed |= {p for p in _source_files() if p.startswith(("kbroker/", "kclient/")) and p.endswith(".py")}
    needed |= {p for p in _source_files() if p.startswith("kclient/proto/") and p.endswith(".pyi")}
    needed |= {p for p in _source_files() if p.startswith("protos/")}
    needed |= {f"kbroker/local/{n}" for n in PYPROJECT["tool"]["setuptools"]["package-data"]["kbroker.local"]}
    assert not needed - names, sorted(needed - names)
    assert not [n for n in names if n.endswith((".so", ".pyc"))]


def test_the_wheel_holds_the_compiled_codec_and_the_package_data(dist: Path) -> None:
    wheel = _wheel(dist)
    assert "-cp3" in wheel.name, f"{wheel.name}: a wheel with a compiled extension names its Python"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = zf.read(f"kbroker-{VERSION}.dist-info/entry_points.txt").decode()
    assert [n for n in names if n.startswith("kclient/_crecords.") and n.endswith(".so")]
    assert "kbroker/local/zookeeper-log4j.properties" in names
    assert "kclient/proto/kbroker/v1/broker_pb2.pyi" in names
    assert "kclient/proto/kbroker/v1/broker_pb2.py" in names
    assert "kbroker = kbroker.server:main" in entry_points
    assert "kctl = kbroker.cli.main:main" in entry_points


CHECK_CODEC = """
import kclient, kclient._crecords
from kclient.records.twins import IMPLEMENTATION
print(kclient.__file__)
print(kclient._crecords.__file__)
print(IMPLEMENTATION)
"""


@pytest.mark.parametrize("kind", ["sdist", "wheel"])
def test_a_clean_virtualenv_installs_it(kind: str, dist: Path, wheelhouse: Path, tmp_path: Path) -> None:
    artifact = _sdist(dist) if kind == "sdist" else _wheel(dist)
    venv = tmp_path / "venv"
    bin_ = venv / "bin"
    _run([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    started = time.monotonic()
    # pip builds the sdist into a wheel (setuptools from the wheelhouse; gcc compiles the
    # codec); --no-cache-dir keeps it from reusing a wheel an earlier run built.
    installed = _run(
        [bin_ / "python", "-m", "pip", "install", "--no-cache-dir", "--no-index", "--find-links", wheelhouse, artifact],
        cwd=tmp_path,
        timeout=600,
    )
    print(f"{kind}: pip install took {time.monotonic() - started:.1f} s")
    assert ("Building wheel for kbroker" in installed) == (kind == "sdist"), installed

    kclient_file, codec_file, implementation = _run([bin_ / "python", "-c", CHECK_CODEC], cwd=tmp_path).split()
    assert Path(kclient_file).is_relative_to(venv), kclient_file  # the installed copy, not the tree's
    assert Path(codec_file).is_relative_to(venv), codec_file
    assert implementation == "c"

    assert _run([bin_ / "kbroker", "--version"], cwd=tmp_path) == f"kbroker {VERSION}\n"
    assert _run([bin_ / "kctl", "--version"], cwd=tmp_path) == f"kctl {VERSION}\n"
    _run([bin_ / "kctl", "--help"], cwd=tmp_path)  # the whole CLI imports
