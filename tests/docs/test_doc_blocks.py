"""Every code block of README.md and docs/ runs against a real cluster, or says why it
cannot (see tests/docs/doc_blocks.py for the markers, the order and how blocks run); and
the example addresses of the docs are those scripts/run prints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.conftest import DocsCluster
from tests.docs.doc_blocks import (
    DOCS,
    EXAMPLE_BOOTSTRAPS,
    EXAMPLE_KAFKA_BOOTSTRAPS,
    EXAMPLE_ZOOKEEPERS,
    MKDOCS,
    ROOT,
    Block,
    display,
    doc_blocks,
    doc_files,
    localize,
    nav_pages,
    parse_blocks,
    strict,
)

pytestmark = [pytest.mark.docs, pytest.mark.integration]

BLOCKS = doc_blocks()

_STARTS_A_CLUSTER = re.compile(r"(^|[\s;&|(])(\./)?scripts/(run|test|bench)\b", re.MULTILINE)
_COMMENT = re.compile(r"(^|\s)#.*$", re.MULTILINE)

_PYTHON_RUNNER = """
import os, sys
path, first = sys.argv[1], int(sys.argv[2])
with open(path, encoding="utf-8") as f:
    source = "\\n" * first + f.read()
namespace = {"__name__": "__main__"}
for name in ("B", "BOOTSTRAP", "Z", "ZOOKEEPER"):
    namespace[name] = os.environ[name]
session = None
try:
    exec(compile(source, sys.argv[3], "exec"), namespace)
    if "pyspark" in sys.modules:
        # What a block defines must work when used: streams it left running process what
        # is there (raising their failure), and batch DataFrames it left are read.
        from pyspark.sql import DataFrame, SparkSession
        session = SparkSession.getActiveSession()
        if session is not None:
            for query in session.streams.active:
                query.processAllAvailable()
        for name, value in list(namespace.items()):
            if isinstance(value, DataFrame) and not value.isStreaming:
                print(f"[docs harness] {name}.count() = {value.count()}")
finally:
    if session is not None:
        for query in session.streams.active:
            query.stop()
        session.stop()
"""


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``cmd`` in its own process group, all of it killed when ``timeout_s`` runs out."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout_s:g} s\n--- stdout ---\n{_tail(out)}\n--- stderr ---\n{_tail(err)}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _env(docs: DocsCluster) -> dict[str, str]:
    bootstrap = docs.bootstrap
    return {
        **os.environ,
        "B": bootstrap,
        "BOOTSTRAP": bootstrap,
        "KBROKER_BOOTSTRAP": bootstrap,
        "K": docs.kafka_bootstrap,
        "Z": docs.zookeeper,
        "ZOOKEEPER": docs.zookeeper,
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }


def test_markers_parse() -> None:
    """The harness itself: markers, padding lines, example addresses."""
    text = (
        "intro\n\n<!-- doc: run -->\n```sh\necho hi\n```\n"
        "<!-- doc: skip (needs a second broker) -->\n\n```python\nx = 1\n```\n"
        "```\noutput\n```\n"
        "- item\n  <!-- doc: run sh timeout=5 -->\n  ```sh\n  echo nested\n  ```\n"
        "<!-- doc: run -->\n```properties\na=b\n```\n<!-- doc: skip -->\n```sh\nx\n```\n"
    )
    run, skip, bare, nested, props, no_reason = parse_blocks(text)
    assert (run.line, run.lang, run.code, run.marker and run.marker.action) == (4, "sh", "echo hi\n", "run")
    assert skip.marker is not None and (skip.marker.action, skip.marker.reason) == ("skip", "needs a second broker")
    assert bare.marker is None and bare.lang == ""
    assert nested.code == "echo nested\n" and nested.marker is not None and nested.marker.timeout_s == 5
    assert props.marker is not None and "only sh and python" in props.marker.error
    assert no_reason.marker is not None and "needs a reason" in no_reason.marker.error
    assert localize("B=127.0.0.1:9092 Z=127.0.0.1:2181/kbroker", "h:1", "zk:2/c") == "B=h:1 Z=zk:2/c"
    assert localize("--output /tmp/demo-counts", "h:1", "zk:2", "/s/") == "--output /s/demo-counts"
    assert localize("kcat -b 127.0.0.1:29092 -L", "h:1", "zk:2", None, "k:3") == "kcat -b k:3 -L"


def test_blocks_name_their_file() -> None:
    """A block knows its file: errors say docs/page.md:LINE, ids are unique across files."""
    (block,) = parse_blocks("x\n<!-- doc: run -->\n```sh\ntrue\n```\n", DOCS / "spark.md")
    assert (block.where, block.id) == ("docs/spark.md:3", "docs/spark.md:L3-sh")
    assert len({b.id for b in BLOCKS}) == len(BLOCKS)


def test_doc_files_in_order() -> None:
    """README.md first, then mkdocs.yml's nav in its order, then pages outside the nav."""
    assert nav_pages(
        "site_name: x\nnav:\n  - Home: index.md\n  - Ops:\n      - kctl: kctl.md\n"
        "      - internals/index.md\ntheme: mkdocs\n"
    ) == ["index.md", "kctl.md", "internals/index.md"]
    files = doc_files()
    if os.environ.get("KBROKER_DOCS_FILES"):
        pytest.skip("KBROKER_DOCS_FILES chooses the files")
    nav = nav_pages(MKDOCS.read_text(encoding="utf-8"))
    assert files[0] == ROOT / "README.md"
    assert [display(f) for f in files[1 : 1 + len(nav)]] == [f"docs/{page}" for page in nav]
    assert sorted(files) == sorted({ROOT / "README.md", *DOCS.rglob("*.md")})


_ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):(?P<port>\d+)(?P<chroot>/[\w-]+)?")


def test_example_addresses_are_those_scripts_run_prints() -> None:
    """New users paste the docs' addresses: every 127.0.0.1/localhost address in them is one
    of scripts/run's ports (ZooKeeper 2181 with its /kbroker chroot; broker i's gRPC 9092+i,
    INTERNAL 19092+i, Kafka door 29092+i, metrics 9404+i) or one that deploy/compose.yaml
    publishes by default (Prometheus 9090), and the harness substitutes those scripts/run
    prints for broker 0."""
    from kbroker.local import run

    ports = {run.ZK_PORT} | {
        base + i for base in (run.CLIENT_PORT, run.INTERNAL_PORT, run.KAFKA_PORT, run.METRICS_PORT) for i in range(10)
    }
    compose = (ROOT / "deploy" / "compose.yaml").read_text(encoding="utf-8")
    ports |= {int(p) for p in re.findall(r"\$\{KBROKER_\w+_PORT\w*:-(\d+)\}", compose)}
    wrong = []
    for path in doc_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in _ADDRESS.finditer(line):
                port, chroot = int(m.group("port")), m.group("chroot")
                if port not in ports or (port == run.ZK_PORT and chroot not in (None, run.CHROOT)):
                    wrong.append(f"{display(path)}:{n}: {m.group(0)}")
    assert not wrong, "addresses scripts/run does not print:\n" + "\n".join(wrong)
    assert f"127.0.0.1:{run.CLIENT_PORT}" in EXAMPLE_BOOTSTRAPS
    assert f"127.0.0.1:{run.ZK_PORT}{run.CHROOT}" in EXAMPLE_ZOOKEEPERS
    assert f"127.0.0.1:{run.KAFKA_PORT}" in EXAMPLE_KAFKA_BOOTSTRAPS


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_block(block: Block, request: pytest.FixtureRequest) -> None:
    where = block.where
    marker = block.marker
    if marker is None:
        message = (
            f"{where}: a ```{block.lang or ''} block with no marker: put `<!-- doc: run -->` or "
            "`<!-- doc: skip REASON -->` on the line before its fence"
        )
        if strict():
            pytest.fail(message, pytrace=False)
        pytest.skip(f"unmarked (KBROKER_DOCS_STRICT=0): {message}")
    if marker.error:
        pytest.fail(f"{where}: {marker.error}", pytrace=False)
    if marker.action == "skip":
        pytest.skip(f"{where}: {marker.reason}")
    if block.lang == "sh" and _STARTS_A_CLUSTER.search(_COMMENT.sub("", block.code)):
        pytest.fail(
            f"{where}: a run block may not start a cluster of its own (scripts/run, scripts/test, scripts/bench): "
            "the harness provides one; mark it skip or move that line out",
            pytrace=False,
        )
    docs: DocsCluster = request.getfixturevalue("docs_cluster")
    cwd: Path = request.getfixturevalue("block_dir")
    env = _env(docs)
    code = localize(block.code, docs.bootstrap, docs.zookeeper, str(docs.scratch), docs.kafka_bootstrap)
    name = display(block.path)
    if block.lang == "sh":
        script = cwd / name  # bash's messages then read "docs/kctl.md: line N: ..."
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text("\n" * block.line + code, encoding="utf-8")
        result = _run(["bash", "-euo", "pipefail", name], cwd, env, marker.timeout_s)
    else:
        script = cwd / "block.py"
        script.write_text(code, encoding="utf-8")
        result = _run(
            [sys.executable, "-c", _PYTHON_RUNNER, str(script), str(block.line), str(block.path)],
            cwd,
            env,
            marker.timeout_s,
        )
    if result.returncode != 0:
        pytest.fail(
            f"{where}: the {block.lang} block failed (exit {result.returncode})\n"
            f"--- stdout ---\n{_tail(result.stdout)}\n--- stderr ---\n{_tail(result.stderr)}",
            pytrace=False,
        )
