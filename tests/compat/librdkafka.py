"""librdkafka's own test suite (Debian's librdkafka 2.0.2 source) against a kbroker cluster.

``scripts/librdkafka-suite`` and ``tests/compat/test_librdkafka_suite.py`` drive this:

1. **Source.** ``apt-get source librdkafka`` (a ``deb-src`` entry for bookworm is added
   under /etc/apt/sources.list.d/ when none is there), with the build dependencies
   (build-essential zlib1g-dev libssl-dev libsasl2-dev libzstd-dev liblz4-dev).
2. **Build, once.** ``./configure && make -j2 libs && make -j2 -C tests build`` under
   ``.cache/librdkafka/`` (git-ignored; ``$KBROKER_LIBRDKAFKA_CACHE`` moves it). A stamp
   file records the build; a rerun goes straight to the tests.
3. **Cluster.** A real ZooKeeper from the local jars and N ``kbroker`` processes with the
   Kafka door on a free port, ``auto.create.topics.enable=true``, ``num.partitions=4``
   (as in issue 21). ``secure=True``: the cluster of ``scripts/run --secure`` (SASL_SSL
   with SCRAM-SHA-512 on the door, TLS between brokers, ACLs, ZooKeeper ACLs), the
   client logging in as its super user.
4. **Run.** ``test-runner -E -L [-Q]`` from the source's ``tests/`` directory with
   ``TEST_KAFKA_VERSION=2.8.0``, ``test.conf`` naming the door, ``KAFKA_PATH`` pointing at
   a ``bin/kafka-topics.sh`` shim over ``kctl`` (tests 0052 and 0077), ``ZK_ADDRESS`` the
   cluster's ZooKeeper chroot. ``TEST_REPORT`` makes the runner write its JSON report.
5. **Verdict.** Each test's state (PASSED / SKIPPED / FAILED, and RUNNING for a test
   that never finished) against ``librdkafka_expected.json``: a test expected to pass
   that did not is a failure; a skipped test that passed is reported, so the table can
   be updated.

Thread safety: none; one caller drives a run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "librdkafka_expected.json"
SHIM = HERE / "kafka"
"""``KAFKA_PATH`` for the runner: ``bin/kafka-topics.sh`` over kctl."""
VERSION = "2.0.2"
BROKER_VERSION = "2.8.0"
"""``TEST_KAFKA_VERSION``: the Kafka release whose APIs the door serves."""
BUILD_DEPS = (
    "build-essential",
    "zlib1g-dev",
    "libssl-dev",
    "libsasl2-dev",
    "libzstd-dev",
    "liblz4-dev",
    "rapidjson-dev",  # else the runner skips the tests that parse JSON (0053, 0101, 0110)
)
RUNNER_FLAGS = ("-E", "-L")
"""-E: no sockem tests (socket fault injection); -L: no local tests (no broker needed)."""
DEB_SRC = """\
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
STATES = ("PASSED", "SKIPPED", "FAILED", "RUNNING", "DNS")


def say(msg: str) -> None:
    print(f"librdkafka-suite: {msg}", flush=True)


def cache_dir() -> Path:
    return Path(os.environ.get("KBROKER_LIBRDKAFKA_CACHE") or ROOT / ".cache" / "librdkafka")


def source_dir() -> Path:
    return cache_dir() / f"librdkafka-{VERSION}"


def runner_path() -> Path:
    return source_dir() / "tests" / "test-runner"


def _stamp() -> Path:
    return cache_dir() / f"built-{VERSION}.json"


def runner_built() -> bool:
    """Built, and with the build dependencies of this version of the harness."""
    if not (runner_path().is_file() and _stamp().is_file()):
        return False
    try:
        return bool(json.loads(_stamp().read_text()).get("deps") == list(BUILD_DEPS))
    except ValueError:
        return False


# ----------------------------------------------------------------------------- source


def _root_cmd(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return cmd
    if shutil.which("sudo"):
        return ["sudo", *cmd]
    raise SystemExit(f"librdkafka-suite: `{' '.join(cmd)}` needs root (no sudo here)")


def _has_deb_src() -> bool:
    files = [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]
    for f in files:
        if f.suffix not in (".list", ".sources") or not f.is_file():
            continue
        text = f.read_text(errors="replace")
        if re.search(r"^\s*deb-src\s+\S*debian\.org/debian\s+bookworm\s", text, re.M):
            return True
        if re.search(r"^Types:.*\bdeb-src\b", text, re.M) and re.search(r"^Suites:.*\bbookworm\b", text, re.M):
            return True
    return False


def _missing_packages(names: tuple[str, ...]) -> list[str]:
    missing = []
    for name in names:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True)
        if "install ok installed" not in r.stdout:
            missing.append(name)
    return missing


def fetch_source() -> Path:
    """Debian's librdkafka source under the cache (``apt-get source``), build deps installed."""
    src = source_dir()
    if (src / "tests" / "test.c").is_file():
        return src
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _has_deb_src():
        target = Path("/etc/apt/sources.list.d/kbroker-deb-src.sources")
        say(f"adding a deb-src entry for bookworm: {target}")
        subprocess.run(_root_cmd(["tee", str(target)]), input=DEB_SRC, text=True, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(_root_cmd(["apt-get", "update", "-q"]), check=True, env=env, stdout=subprocess.DEVNULL)
    missing = _missing_packages(BUILD_DEPS)
    if missing:
        say(f"installing build dependencies: {' '.join(missing)}")
        subprocess.run(_root_cmd(["apt-get", "update", "-q"]), check=False, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(
            _root_cmd(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]),
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        say(f"apt-get source librdkafka={VERSION}*")
        r = subprocess.run(["apt-get", "source", f"librdkafka={VERSION}*"], cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            # Another revision than 2.0.2's: take what the mirror has and check below.
            r = subprocess.run(["apt-get", "source", "librdkafka"], cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"librdkafka-suite: apt-get source librdkafka failed:\n{r.stdout}{r.stderr}")
        unpacked = [p for p in Path(tmp).iterdir() if p.is_dir() and p.name.startswith("librdkafka-")]
        if not unpacked:
            raise SystemExit(f"librdkafka-suite: apt-get source unpacked nothing:\n{r.stdout}{r.stderr}")
        if unpacked[0].name != src.name:
            raise SystemExit(f"librdkafka-suite: the mirror has {unpacked[0].name}, the table is for {src.name}")
        unpacked[0].rename(src)
    return src


def build(jobs: int = 2) -> Path:
    """``tests/test-runner``, built once (the stamp says it is complete)."""
    if runner_built():
        return runner_path()
    src = fetch_source()
    missing = _missing_packages(BUILD_DEPS)
    if missing:
        say(f"installing build dependencies: {' '.join(missing)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
        subprocess.run(_root_cmd(install), check=True, env=env, stdout=subprocess.DEVNULL)
    logs = cache_dir()
    t0 = time.monotonic()
    steps = [("configure", ["./configure"], src)]
    if _stamp().exists():  # built before with other dependencies: the tests see config.h anew
        steps.append(("make clean (tests)", ["make", "-C", "tests", "clean"], src))
    steps += [
        ("make libs", ["make", f"-j{jobs}", "libs"], src),
        ("make tests", ["make", f"-j{jobs}", "build"], src / "tests"),
    ]
    for name, cmd, cwd in steps:
        say(f"{name} (log: {logs / 'build.log'})")
        with open(logs / "build.log", "a") as log:
            r = subprocess.run(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise SystemExit(f"librdkafka-suite: {name} failed (exit {r.returncode}); see {logs / 'build.log'}")
    took = time.monotonic() - t0
    _stamp().write_text(
        json.dumps({"version": VERSION, "build_seconds": round(took, 1), "jobs": jobs, "deps": list(BUILD_DEPS)}) + "\n"
    )
    say(f"built {runner_path()} in {took:.0f} s")
    return runner_path()


# ---------------------------------------------------------------------------- cluster


@dataclass
class Cluster:
    bootstrap: str
    """The Kafka door's addresses."""
    zk_connect: str
    """ZooKeeper with the cluster's chroot (``ZK_ADDRESS`` for kafka-topics.sh)."""
    client_conf: dict[str, str]
    """librdkafka properties beyond bootstrap.servers (security)."""
    env: dict[str, str] = field(default_factory=dict)
    """For the kctl shim (KBROKER_ZK_DIGEST on the secured cluster)."""
    logs: list[Path] = field(default_factory=list)


BROKER_SETTINGS = {
    "auto.create.topics.enable": "true",
    "num.partitions": "4",
}
PLAINTEXT_AUTHORIZER = {
    # Tests 0109, 0115 and 0119 deny User:* a topic with kafka-acls.sh and expect the
    # authorization errors; every other resource has no ACL and stays open to everyone.
    "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
    "allow.everyone.if.no.acl.found": "true",
}
SCENARIOS = ("default", "noautocreate")
"""The runner's -s: ``noautocreate`` runs the 4 tests that need auto-creation off."""


@contextmanager
def cluster(root: Path, brokers: int = 1, secure: bool = False, scenario: str = "default") -> Iterator[Cluster]:
    """ZooKeeper and ``brokers`` kbroker processes with the Kafka door, under ``root``."""
    from kbroker.local.cluster import LocalCluster
    from kbroker.local.zookeeper import ZooKeeperEnsemble

    zk = ZooKeeperEnsemble(root / "zookeeper", size=1)
    zk.start()
    local: LocalCluster | None = None
    try:
        zk_connect = f"{zk.connect_string}/kbroker"
        overrides = dict(BROKER_SETTINGS)
        if scenario == "noautocreate":
            overrides["auto.create.topics.enable"] = "false"
        if not secure:
            overrides.update(PLAINTEXT_AUTHORIZER)
        conf: dict[str, str] = {}
        env: dict[str, str] = {}
        listener = "PLAINTEXT"
        if secure:
            from kbroker.local.secure import CLIENT_LISTENER, create_admin, prepare

            setup = prepare(root / "secure")
            overrides.update(setup.broker_overrides)
            listener = CLIENT_LISTENER
            c = setup.client_configs
            conf = {
                "security.protocol": "SASL_SSL",
                "sasl.mechanisms": c["sasl_mechanism"],
                "sasl.username": c["sasl_plain_username"],
                "sasl.password": c["sasl_plain_password"],
                "ssl.ca.location": c["ssl_cafile"],
            }
            env["KBROKER_ZK_DIGEST"] = setup.zk_digest
            overrides["zookeeper.auth.digest"] = setup.zk_digest  # the brokers' ZooKeeper credential
        overrides["kafka.listeners"] = f"{listener}://127.0.0.1:0"
        if secure:
            # The admin user must exist before a client logs in; brokers make the chroot.
            local = LocalCluster(root / "brokers", zk_connect, overrides)
            local.start(brokers)
            create_admin(zk_connect, setup)
        else:
            local = LocalCluster(root / "brokers", zk_connect, overrides).start(brokers)
        yield Cluster(
            bootstrap=local.kafka_bootstrap(listener),
            zk_connect=zk_connect,
            client_conf=conf,
            env=env,
            logs=[b.log_path for b in local.brokers.values()],
        )
    finally:
        if local is not None:
            local.stop()
        zk.stop()


# -------------------------------------------------------------------------------- run


@dataclass
class Outcome:
    name: str
    state: str
    """PASSED, SKIPPED, FAILED, RUNNING (never finished) or DNS (did not start)."""
    duration: float = 0.0
    reason: str = ""


@dataclass
class RunResult:
    outcomes: dict[str, Outcome]
    seconds: float
    returncode: int
    log: Path
    report: Path
    """The work directory: report-N.json per runner start, broker logs."""
    brokers: int
    quick: bool
    secure: bool
    scenario: str = "default"


_SUMMARY = re.compile(r"^\|\S*\s+(\d{4}\w*)\s+\|\s+(\w+)\s+\|\s+([\d.]+)s\s*\S*\|\s*(.*)$")
_FAILURE = re.compile(r'^### Test "(\d{4}\w*)[ "].* failed at .*###$')
_SKIPPING = re.compile(r"^\[(\d{4}\w*)\s*/\s*[\d.]+s\] WARN: SKIPPING TEST: (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_report(report_text: str, log_text: str = "") -> dict[str, Outcome]:
    """Per-test outcomes from the runner's ``TEST_REPORT`` JSON; failure reasons from
    the summary table it prints. The report is written with printf, unescaped: when a
    test's ``extra`` breaks the JSON, the names and states are read with a pattern."""
    outcomes: dict[str, Outcome] = {}
    try:
        tests = json.loads(report_text)["tests"]
        for name, t in tests.items():
            outcomes[name] = Outcome(name, t["state"], float(t.get("duration") or 0.0))
    except (ValueError, KeyError, TypeError):
        pat = r'"name": "([^"]+)", "state": "(\w+)",.*?"duration": ([\d.]+)'
        for m in re.finditer(pat, report_text):
            outcomes[m.group(1)] = Outcome(m.group(1), m.group(2), float(m.group(3)))
    outcomes.pop("<MAIN>", None)
    lines = _ANSI.sub("", log_text).splitlines()
    for i, line in enumerate(lines):
        failure = _FAILURE.match(line.strip())
        if failure and failure.group(1) in outcomes and not outcomes[failure.group(1)].reason and i + 1 < len(lines):
            outcomes[failure.group(1)].reason = lines[i + 1].strip()
            continue
        row = _SUMMARY.match(line.strip())
        if row and row.group(1) in outcomes:
            outcomes[row.group(1)].reason = row.group(4).strip()
            continue
        skipping = _SKIPPING.match(line.strip())
        if skipping and skipping.group(1) in outcomes and not outcomes[skipping.group(1)].reason:
            outcomes[skipping.group(1)].reason = skipping.group(2).strip()
    return outcomes


def write_test_conf(path: Path, c: Cluster, extra: dict[str, str] | None = None) -> None:
    lines = [
        "# written by tests/compat/librdkafka.py: the kbroker cluster under test",
        f"bootstrap.servers={c.bootstrap}",
        "test.topic.random=true",
    ]
    lines += [f"{k}={v}" for k, v in {**c.client_conf, **(extra or {})}.items()]
    path.write_text("\n".join(lines) + "\n")


def test_number(name: str) -> str:
    return name.split("_", 1)[0]


def run_suite(
    workdir: Path,
    *,
    brokers: int = 1,
    quick: bool = True,
    secure: bool = False,
    tests: str | None = None,
    parallel: int | None = None,
    timeout_s: float = 3600.0,
    skip: list[str] | None = None,
    echo: bool = True,
    scenario: str = "default",
) -> RunResult:
    """Start a cluster under ``workdir``, run the suite against it, parse the reports.

    A test that overruns its timeout ends the whole runner (its thread cannot be
    stopped): that test counts as failed (state RUNNING) and the runner starts again on
    the tests that had not started yet, until every test has an outcome."""
    runner = build()
    workdir = workdir.resolve()  # the runner runs in its tests/ directory
    workdir.mkdir(parents=True, exist_ok=True)
    conf_path, log_path = workdir / "test.conf", workdir / "test-runner.log"
    log_path.unlink(missing_ok=True)
    outcomes: dict[str, Outcome] = {}
    t0 = time.monotonic()
    rc = 0
    with cluster(workdir / "cluster", brokers=brokers, secure=secure, scenario=scenario) as c:
        write_test_conf(conf_path, c)
        env = {
            **os.environ,
            **c.env,
            "TEST_KAFKA_VERSION": BROKER_VERSION,
            "RDKAFKA_TEST_CONF": str(conf_path),
            "KAFKA_PATH": str(SHIM),
            "ZK_ADDRESS": c.zk_connect,
            "BROKERS": c.bootstrap,
            "KBROKER_KCTL": str(Path(sys.executable).with_name("kctl")),
            # test-runner links librdkafka's shared libraries from the build tree
            "LD_LIBRARY_PATH": os.pathsep.join(
                [str(runner.parent.parent / "src"), str(runner.parent.parent / "src-cpp")]
                + ([os.environ["LD_LIBRARY_PATH"]] if os.environ.get("LD_LIBRARY_PATH") else [])
            ),
        }
        env.pop("CI", None)  # the runner reads CI as "3 tests at a time"; -p decides here
        if skip:
            env["TESTS_SKIP"] = ",".join(skip)
        cmd = [str(runner), *RUNNER_FLAGS, *(["-Q"] if quick else []), "-s", scenario]
        if parallel:
            cmd.append(f"-p{parallel}")
        say(
            f"{' '.join(cmd)} against {brokers} broker(s){' (SASL_SSL/SCRAM)' if secure else ''} at {c.bootstrap}"
            f"; log: {log_path}"
        )
        selection = tests
        interrupted: set[str] = set()
        decided = -1
        for attempt in range(1, 100):
            report = workdir / f"report-{attempt}.json"
            env["TEST_REPORT"] = str(report)
            if selection:
                env["TESTS"] = selection
            start = log_path.stat().st_size if log_path.exists() else 0
            left = timeout_s - (time.monotonic() - t0)
            rc = _run_runner(cmd, runner.parent, env, log_path, left, echo)
            log_text = log_path.read_bytes()[start:].decode(errors="replace")
            if not report.exists():
                say(f"the runner wrote no report (exit {rc}); the end of its log:\n{log_text[-3000:]}")
                break
            chosen = selection.split(",") if selection else None
            again: set[str] = set()
            for name, o in parse_report(report.read_text(errors="replace"), log_text).items():
                if name in outcomes or (chosen is not None and test_number(name) not in chosen):
                    continue  # decided before, or "not included in TESTS list"
                if o.state == "DNS":
                    again.add(test_number(name))
                elif o.state == "RUNNING" and name not in interrupted:
                    # cut short by another test's timeout: once more, on its own terms
                    interrupted.add(name)
                    again.add(test_number(name))
                else:
                    if o.state == "RUNNING":
                        o.reason = o.reason or "never finished: the runner stopped (a test timed out) twice"
                    outcomes[name] = o
            pending = sorted(again)
            if not pending or time.monotonic() - t0 > timeout_s or len(outcomes) == decided:
                break  # done, out of time, or a rerun that decided nothing (the same test timed out again)
            decided = len(outcomes)
            say(f"the runner stopped early (exit {rc}); again for the {len(pending)} tests not finished")
            selection = ",".join(pending)
        for broker_log in c.logs:
            if broker_log.exists():
                shutil.copy(broker_log, workdir / broker_log.name)
    return RunResult(outcomes, time.monotonic() - t0, rc, log_path, workdir, brokers, quick, secure, scenario)


def _run_runner(cmd: list[str], cwd: Path, env: dict[str, str], log_path: Path, timeout_s: float, echo: bool) -> int:
    deadline = time.monotonic() + timeout_s
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                if echo and _echo(line):
                    sys.stdout.write(_ANSI.sub("", line.decode(errors="replace")))
                    sys.stdout.flush()
                if time.monotonic() > deadline:
                    say(f"the runner is still going after {timeout_s:.0f} s: stopping it")
                    proc.kill()
                    break
        finally:
            rc = proc.wait()
    return rc


def _echo(line: bytes) -> bool:
    """Lines worth showing live: test start/finish, failures and the summary."""
    text = _ANSI.sub("", line.decode(errors="replace"))
    return bool(
        re.search(r"=+ (Running|PASSED|FAILED|SKIPPED)|TEST FAILURE|^\||SUMMARY|^#=+|test\(s\) (passed|failed)", text)
    )


# ---------------------------------------------------------------------------- verdict


def load_expected(path: Path = EXPECTED) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def expectation(entry: dict[str, Any], brokers: int, quick: bool, secure: bool, scenario: str = "default") -> str:
    """``pass`` or ``skip`` for this configuration: the first matching key of ``when``
    (``brokers=N``, ``quick``, ``full``, ``secure``, ``plaintext``, ``noautocreate``),
    else ``expect``."""
    keys = {f"brokers={brokers}", "quick" if quick else "full", "secure" if secure else "plaintext", scenario}
    for key, value in entry.get("when", {}).items():
        if key in keys:
            return str(value)
    return str(entry["expect"])


@dataclass
class Verdict:
    passed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    """Expected to pass, and did not (FAILED, never finished, or skipped by the runner)."""
    failed_expected: list[str] = field(default_factory=list)
    """Expected skips that ran and failed (not counted as failures)."""
    newly_passing: list[str] = field(default_factory=list)
    """Expected skips that passed: the table can say pass."""
    missing: list[str] = field(default_factory=list)
    """Tests of the run that the table does not list (or listed but absent from the run)."""

    @property
    def ok(self) -> bool:
        return not self.failed and not self.missing


def compare(result: RunResult, expected: dict[str, Any], only: str | None = None) -> Verdict:
    table: dict[str, dict[str, Any]] = expected["tests"]
    v = Verdict()
    for name, o in sorted(result.outcomes.items()):
        entry = table.get(name)
        if entry is None:
            v.missing.append(name)
            continue
        if only and not any(t in name for t in only.split(",")):
            continue  # not selected (TESTS=...): the runner marks it skipped
        if result.scenario != "default" and entry.get("scenario") != result.scenario:
            continue  # the runner skips the other scenarios' tests silently
        want = expectation(entry, result.brokers, result.quick, result.secure, result.scenario)
        if o.state == "PASSED":
            v.passed.append(name)
            if want == "skip":
                v.newly_passing.append(name)
        elif o.state == "SKIPPED":
            v.skipped.append(name)
            if want == "pass":
                v.failed.append(name)
        else:
            if want == "pass":
                v.failed.append(name)
            else:
                v.failed_expected.append(name)
    if not only:
        v.missing += sorted(n for n in table if n not in result.outcomes)
    return v


def counts(result: RunResult) -> dict[str, int]:
    """The runner's own verdicts: passed, skipped, failed (RUNNING and DNS count as failed)."""
    states = [o.state for o in result.outcomes.values()]
    passed, skipped = states.count("PASSED"), states.count("SKIPPED")
    return {"passed": passed, "skipped": skipped, "failed": len(states) - passed - skipped}


def report_text(result: RunResult, v: Verdict) -> str:
    mode = "quick" if result.quick else "full"
    sec = (", SASL_SSL/SCRAM" if result.secure else "") + (
        f", scenario {result.scenario}" if result.scenario != "default" else ""
    )
    c = counts(result)
    lines = [
        f"librdkafka {VERSION} suite, {mode} mode, {result.brokers} broker(s){sec}: "
        f"{c['passed']} passed, {c['skipped']} skipped, {c['failed']} failed; "
        f"{len(v.failed)} expected to pass did not, {len(v.newly_passing)} listed as skip passed; "
        f"{result.seconds:.0f} s (runner exit {result.returncode})"
    ]
    for title, names in (
        ("EXPECTED TO PASS, did not", v.failed),
        ("failed, as expected (a documented skip)", v.failed_expected),
        ("NEWLY PASSING (listed as skip: update the table)", v.newly_passing),
        ("not in the table / not in the run", v.missing),
    ):
        if names:
            lines.append(f"{title}:")
            for n in names:
                o = result.outcomes.get(n)
                detail = f"{o.state}: {o.reason}" if o else "absent from the run"
                lines.append(f"  {n}: {detail}"[:300])
    lines.append(f"runner log: {result.log}; reports: {result.report}")
    return "\n".join(lines)


def write_json(result: RunResult, v: Verdict, path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "version": VERSION,
                "brokers": result.brokers,
                "mode": "quick" if result.quick else "full",
                "secure": result.secure,
                "scenario": result.scenario,
                "seconds": round(result.seconds, 1),
                "counts": counts(result),
                "failed": v.failed,
                "failed_expected": v.failed_expected,
                "newly_passing": v.newly_passing,
                "missing": v.missing,
                "tests": {
                    n: {"state": o.state, "duration": o.duration, "reason": o.reason}
                    for n, o in sorted(result.outcomes.items())
                },
            },
            indent=1,
        )
        + "\n"
    )


def excluded(expected: dict[str, Any], brokers: int, quick: bool, secure: bool, scenario: str = "default") -> list[str]:
    """Test numbers the table keeps out of the run (``"run": false``: they hang or take
    minutes to fail, e.g. transactions)."""
    out = []
    for name, entry in expected["tests"].items():
        if entry.get("run", True) is False and expectation(entry, brokers, quick, secure, scenario) == "skip":
            out.append(name.split("_", 1)[0])
    return sorted(set(out))


DOC = ROOT / "docs" / "kafka-compatibility.md"
TABLE_START, TABLE_END = "<!-- librdkafka-table:start -->", "<!-- librdkafka-table:end -->"


_LABELS = {
    "brokers=1": "on 1 broker",
    "brokers=3": "on 3 brokers",
    "quick": "in quick mode",
    "full": "in full mode",
    "secure": "over SASL_SSL",
    "plaintext": "over PLAINTEXT",
    "noautocreate": "in scenario noautocreate",
}


def markdown_table(expected: dict[str, Any]) -> str:
    """The compatibility table of docs/kafka-compatibility.md, made from the JSON table."""
    rows = [TABLE_START, "", "| test | expected | why / note |", "|---|---|---|"]
    for name, entry in expected["tests"].items():
        outcome = entry["expect"]
        when = "; ".join(f"{_LABELS.get(k, k)}: {v}" for k, v in entry.get("when", {}).items())
        if when:
            outcome = f"{outcome} ({when})"
        note = entry.get("reason", "")
        if entry.get("note"):
            note = f"{note}; {entry['note']}" if note else entry["note"]
        rows.append(f"| {name} | {outcome} | {note} |")
    rows += ["", TABLE_END]
    return "\n".join(rows)


def write_docs(expected: dict[str, Any], doc: Path = DOC) -> None:
    text = doc.read_text()
    start, end = text.index(TABLE_START), text.index(TABLE_END) + len(TABLE_END)
    doc.write_text(text[:start] + markdown_table(expected) + text[end:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="scripts/librdkafka-suite",
        description="Run librdkafka's own test suite (Debian's 2.0.2 source) against a local kbroker cluster "
        "and compare the outcome with tests/compat/librdkafka_expected.json.",
    )
    p.add_argument("--brokers", type=int, default=1, help="brokers in the cluster (1 or 3; default 1)")
    p.add_argument("--full", action="store_true", help="full mode (default: quick mode, test-runner -Q)")
    p.add_argument("--secure", action="store_true", help="SASL_SSL with SCRAM on the door (scripts/run --secure)")
    p.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default="default",
        help="noautocreate: auto-creation off, only the tests of that scenario (0045 two of them, 0107, 0111)",
    )
    p.add_argument("--tests", help="only these tests: comma-separated numbers (the runner's TESTS), e.g. 0030,0118")
    p.add_argument("--parallel", type=int, help="tests at a time (test-runner -pN; its default is 5)")
    p.add_argument("--all", action="store_true", help='also run the tests the table keeps out ("run": false)')
    p.add_argument("--build-only", action="store_true", help="fetch and build test-runner, then exit")
    p.add_argument(
        "--compare", type=Path, metavar="DIR", help="compare an earlier run (its verdict.json) with the table"
    )
    p.add_argument(
        "--write-docs", action="store_true", help="rewrite docs/kafka-compatibility.md's table from the JSON"
    )
    p.add_argument("--dir", type=Path, help="work directory (default: .cache/librdkafka/runs/<time>)")
    p.add_argument("--timeout", type=float, default=3600.0, help="stop the runner after this many seconds")
    args = p.parse_args(argv)
    if args.compare:
        saved = json.loads((args.compare / "verdict.json").read_text())
        earlier = RunResult(
            {n: Outcome(n, t["state"], t["duration"], t["reason"]) for n, t in saved["tests"].items()},
            saved["seconds"],
            0,
            args.compare / "test-runner.log",
            args.compare,
            saved["brokers"],
            saved["mode"] == "quick",
            saved["secure"],
            saved.get("scenario", "default"),
        )
        v = compare(earlier, load_expected())
        print(report_text(earlier, v))
        return 0 if v.ok else 1
    if args.write_docs:
        write_docs(load_expected())
        return 0
    if args.build_only:
        t0 = time.monotonic()
        build()
        say(f"test-runner ready ({time.monotonic() - t0:.0f} s)")
        return 0
    expected = load_expected()
    quick = not args.full
    skip = [] if args.all else excluded(expected, args.brokers, quick, args.secure, args.scenario)
    mode = ("quick" if quick else "full") + ("-secure" if args.secure else "") + f"-{args.scenario}"
    tag = f"{time.strftime('%Y%m%d-%H%M%S')}-{args.brokers}b-{mode}"
    workdir = args.dir or cache_dir() / "runs" / tag
    result = run_suite(
        workdir,
        brokers=args.brokers,
        quick=quick,
        secure=args.secure,
        tests=args.tests,
        parallel=args.parallel,
        timeout_s=args.timeout,
        skip=skip,
        scenario=args.scenario,
    )
    v = compare(result, expected, only=args.tests)
    write_json(result, v, workdir / "verdict.json")
    print(report_text(result, v))
    return 0 if v.ok else 1


if __name__ == "__main__":
    sys.exit(main())
