"""deploy/systemd's units pass ``systemd-analyze verify`` and ``systemd-analyze security``.

Both run offline against a fake root in a temporary directory (``--root``): the units in
its /etc/systemd/system, stubs of the targets every service depends on (sysinit.target,
basic.target, shutdown.target) and of those the units name, executable stubs where
ExecStart points (/opt/kbroker/bin/kbroker, /usr/bin/java) and /etc/passwd and /etc/group
entries for the users. Nothing is created outside the temporary directory and no process
but systemd-analyze starts, so this is a unit test (each call takes some 10 ms).

The checks can fail: a broken copy of a unit is reported by verify, and a unit without the
hardening scores above the threshold. Skipped, saying why, where systemd-analyze is absent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
BROKER_UNIT = UNITS / "kbroker@.service"
ZOOKEEPER_UNIT = UNITS / "zookeeper.service"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")

MAX_EXPOSURE = 2.0
"""The highest overall exposure level ``systemd-analyze security`` may give a unit (0 to
10; systemd calls below 2 "OK"). systemd 252 rates kbroker@1.service 1.2 and
zookeeper.service 1.4."""

STUB_TARGETS = ("sysinit.target", "basic.target", "shutdown.target", "network-online.target", "multi-user.target")
EXECUTABLES = ("opt/kbroker/bin/kbroker", "usr/bin/java")
USERS = {"kbroker": 990, "zookeeper": 991}

pytestmark = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed (package systemd)")

_EXPOSURE = re.compile(r"Overall exposure level for (?P<unit>\S+): (?P<score>\d+(?:\.\d+)?) (?P<level>\w+)")


def fake_root(base: Path, units: dict[str, str]) -> Path:
    """A root directory for ``systemd-analyze --root``: ``units`` (name -> text) in
    /etc/systemd/system, the stub targets, the stub executables and the users."""
    root = base / "root"
    system = root / "etc" / "systemd" / "system"
    system.mkdir(parents=True)
    for name, text in units.items():
        (system / name).write_text(text, encoding="utf-8")
    targets = root / "usr" / "lib" / "systemd" / "system"
    targets.mkdir(parents=True)
    for target in STUB_TARGETS:
        (targets / target).write_text(f"[Unit]\nDescription=stub {target}\n", encoding="utf-8")
    for executable in EXECUTABLES:
        path = root / executable
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
        path.chmod(0o755)
    passwd = "".join(f"{u}:x:{i}:{i}::/var/lib/{u}:/usr/sbin/nologin\n" for u, i in USERS.items())
    group = "".join(f"{u}:x:{i}:\n" for u, i in USERS.items())
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n" + passwd, encoding="utf-8")
    (root / "etc" / "group").write_text("root:x:0:\n" + group, encoding="utf-8")
    return root


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run(
        [SYSTEMD_ANALYZE, "--no-pager", *args], capture_output=True, text=True, timeout=60, check=False
    )


def verify(root: Path, *units: str) -> tuple[int, list[str]]:
    """``systemd-analyze verify`` of ``units`` in ``root``: its status and the lines it
    printed about kbroker's or ZooKeeper's units (warnings and errors: it prints nothing
    else)."""
    done = analyze("verify", f"--root={root}", *units)
    lines = (done.stdout + done.stderr).splitlines()
    return done.returncode, [ln for ln in lines if "kbroker" in ln or "zookeeper" in ln or "broken" in ln]


def exposure(root: Path, unit: str) -> tuple[float, str, str]:
    """``systemd-analyze security --offline=true``'s overall exposure level of ``unit``:
    (score, level, the whole output). Its own verdict agrees: with ``--threshold`` (in
    tenths, 0 to 100) it exits non-zero exactly when the score is above MAX_EXPOSURE."""
    threshold = f"--threshold={round(MAX_EXPOSURE * 10)}"
    done = analyze("security", "--offline=true", threshold, f"--root={root}", unit)
    output = done.stdout + done.stderr
    m = _EXPOSURE.search(output)
    assert m is not None, f"no overall exposure level in systemd-analyze security's output:\n{output}"
    assert m.group("unit") == unit
    score = float(m.group("score"))
    assert (done.returncode != 0) == (score > MAX_EXPOSURE), f"exit status {done.returncode}:\n{output}"
    return score, m.group("level"), output


def shipped_units() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in (BROKER_UNIT, ZOOKEEPER_UNIT)}


@pytest.mark.parametrize("unit", ["kbroker@1.service", "zookeeper.service"])
def test_unit_verifies_clean(tmp_path: Path, unit: str) -> None:
    root = fake_root(tmp_path, shipped_units())
    status, complaints = verify(root, unit)
    assert complaints == [], "\n".join(complaints)
    assert status == 0


def test_broken_unit_is_reported(tmp_path: Path) -> None:
    """What verify is trusted to find: an unknown key, a bad value, a missing executable."""
    text = BROKER_UNIT.read_text(encoding="utf-8")
    text = text.replace("Restart=on-failure", "Restart=sometimes\nHardenEverything=yes")
    text = text.replace("/opt/kbroker/bin/kbroker", "/opt/kbroker/.venv/bin/kbroker")
    root = fake_root(tmp_path, {"broken@.service": text})
    status, complaints = verify(root, "broken@1.service")
    report = "\n".join(complaints)
    assert "Unknown key 'HardenEverything'" in report, report
    assert "sometimes" in report, report
    assert "/opt/kbroker/.venv/bin/kbroker is not executable" in report, report
    assert status != 0


def test_missing_executable_is_reported(tmp_path: Path) -> None:
    """Without the fake root's java, the shipped ZooKeeper unit fails verify: the clean
    verdict above depends on the stubs, not on verify seeing nothing."""
    root = fake_root(tmp_path, shipped_units())
    (root / "usr" / "bin" / "java").unlink()
    status, complaints = verify(root, "zookeeper.service")
    assert any("/usr/bin/java is not executable" in ln for ln in complaints), complaints
    assert status != 0


@pytest.mark.parametrize("unit", ["kbroker@1.service", "zookeeper.service"])
def test_exposure_is_low(tmp_path: Path, unit: str) -> None:
    root = fake_root(tmp_path, shipped_units())
    score, level, output = exposure(root, unit)
    print(f"{unit}: exposure {score} {level}")
    assert score <= MAX_EXPOSURE, output
    assert level == "OK", output


def test_unhardened_unit_scores_above_threshold(tmp_path: Path) -> None:
    """The broker's unit with its [Service] cut down to what deploy/kbroker@.service had
    before (root, no hardening) scores above the threshold: the score check can fail."""
    bare = "[Service]\nExecStart=/opt/kbroker/bin/kbroker /etc/kbroker/server-%i.properties\nLimitNOFILE=100000\n"
    root = fake_root(tmp_path, {"bare@.service": bare})
    score, level, output = exposure(root, "bare@1.service")
    assert score > MAX_EXPOSURE, output
    assert level != "OK", output


def test_units_match_the_install_layout() -> None:
    """The broker unit runs the venv that docs/deployment/index.md installs, as kbroker;
    the open-file limit and stop timeout are a broker's; ZooKeeper runs as zookeeper."""
    broker = BROKER_UNIT.read_text(encoding="utf-8")
    settings = dict(line.split("=", 1) for line in broker.splitlines() if "=" in line and not line.startswith("#"))
    assert settings["ExecStart"] == "/opt/kbroker/bin/kbroker /etc/kbroker/server-%i.properties"
    assert "python3 -m venv /opt/kbroker " in (ROOT / "docs" / "deployment" / "index.md").read_text(encoding="utf-8")
    assert (settings["User"], settings["Group"]) == ("kbroker", "kbroker")
    assert int(settings["LimitNOFILE"]) >= 100000
    assert int(settings["TimeoutStopSec"]) >= 60
    assert settings["KillSignal"] == "SIGTERM"
    assert settings["MemoryDenyWriteExecute"] == "yes"
    zookeeper = ZOOKEEPER_UNIT.read_text(encoding="utf-8")
    assert "\nUser=zookeeper\n" in zookeeper
    assert "\nMemoryDenyWriteExecute=" not in zookeeper  # the JVM's JIT needs W+X memory
    assert "org.apache.zookeeper.server.quorum.QuorumPeerMain /etc/zookeeper/conf/zoo.cfg" in zookeeper
