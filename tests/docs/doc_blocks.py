"""Docs that run: the fenced code blocks of README.md and of every page of docs/, each run
against a real local cluster or marked as not runnable.

Marker (an HTML comment, invisible on GitHub and on the site) on the line before the
fence, blank lines allowed between::

    <!-- doc: run -->                     run the block (```sh or ```python)
    <!-- doc: run timeout=300 -->         ... with its own time limit in seconds (120)
    <!-- doc: skip needs a second broker -->   not runnable, and why (required)

A block with no marker fails (the file and line say where), unless
``KBROKER_DOCS_STRICT=0`` (report mode: unmarked blocks are skipped).
``KBROKER_DOCS_FILES=a.md:b.md`` checks those files instead (drafts, say).

The files run in a defined order: README.md, then the pages of ``mkdocs.yml``'s nav in
nav order, then any other page under docs/ by name. Their blocks run in that order
against one cluster for the whole module, in the state ``scripts/run`` leaves
(``--brokers 3``): ZooKeeper, three brokers, topic ``demo`` (3 partitions, replication
factor 3) holding 9 records; a block may build on those before it (a topic one page
creates, another page reads). In each block the example addresses ``scripts/run`` prints
(``127.0.0.1:9092`` or ``localhost:9092`` for a broker, ``127.0.0.1:2181/kbroker`` for
ZooKeeper, ``127.0.0.1:29092`` for the Kafka door) are replaced by the cluster's, and
``B`` / ``BOOTSTRAP`` / ``KBROKER_BOOTSTRAP``, ``K`` and ``Z`` / ``ZOOKEEPER`` are set
(environment for sh, globals for python, except ``K``).

- ``sh``: ``bash -euo pipefail`` in a fresh temporary directory that links the
  repository's ``.venv``, ``examples``, ``deploy``, ``protos`` and ``tests`` (so
  ``.venv/bin/kctl`` works); a block may not start a cluster of its own (``scripts/run``).
- ``python``: ``exec`` of the block in a fresh namespace, in a child Python (a hung or
  crashing block cannot take pytest with it) in the same kind of directory. What a
  block defines must work when used: after it, the streaming queries it left running
  process the data available (their failure fails the block), every batch DataFrame left
  in its namespace is counted, and then the queries and the Spark session are stopped.

Errors name the file's own line numbers (``docs/spark.md:52``): the block is padded so
that tracebacks and bash's messages count lines from the top of its file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MKDOCS = ROOT / "mkdocs.yml"
BROKERS = 3
DEFAULT_TIMEOUT_S = 120.0
RUNNABLE = ("sh", "python")
EXAMPLE_ZOOKEEPERS = ("127.0.0.1:2181/kbroker",)
"""ZooKeeper as scripts/run prints it ("ZooKeeper: 127.0.0.1:2181/kbroker")."""
EXAMPLE_BOOTSTRAPS = ("127.0.0.1:9092", "localhost:9092")
"""Broker 0 as scripts/run prints it ("broker 0: 127.0.0.1:9092")."""
EXAMPLE_KAFKA_BOOTSTRAPS = ("127.0.0.1:29092",)
"""The Kafka-protocol door's example address (scripts/run's broker 0: 29092)."""
LINKED = (".venv", "examples", "deploy", "protos", "tests")

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[ \t]*$")
_MARKER = re.compile(r"^\s*<!--\s*doc:\s*(?P<body>.*?)\s*-->\s*$")


def strict() -> bool:
    return os.environ.get("KBROKER_DOCS_STRICT", "1") not in ("0", "false", "no")


@dataclass(frozen=True)
class Marker:
    action: str  # "run" or "skip"
    reason: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    error: str = ""  # a malformed marker: what is wrong


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: Marker | None
    path: Path = ROOT / "README.md"  # the file it is in

    @property
    def where(self) -> str:
        """``docs/spark.md:52``: the file (from the repository's root) and the fence's line."""
        return f"{display(self.path)}:{self.line}"

    @property
    def id(self) -> str:
        return f"{display(self.path)}:L{self.line}-{self.lang or 'text'}"


def display(path: Path) -> str:
    """``path`` as the docs name it: from the repository's root where it is inside."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def parse_marker(body: str, lang: str) -> Marker:
    words = body.split(None, 1)
    action = words[0] if words else ""
    rest = words[1].strip() if len(words) > 1 else ""
    if action == "skip":
        reason = rest.strip("() ")
        return Marker("skip", reason) if reason else Marker("skip", error="'doc: skip' needs a reason")
    if action != "run":
        return Marker("skip", error=f"unknown doc marker {body!r}: expected 'run' or 'skip REASON'")
    timeout_s = DEFAULT_TIMEOUT_S
    for word in rest.split():
        if word.startswith("timeout="):
            try:
                timeout_s = float(word.removeprefix("timeout="))
            except ValueError:
                return Marker("run", error=f"bad {word!r} in doc marker")
        elif word != lang:
            return Marker("run", error=f"doc marker says {word!r} but the fence says {lang or 'nothing'!r}")
    if lang not in RUNNABLE:
        return Marker("run", error=f"only {' and '.join(RUNNABLE)} blocks run; mark this {lang or 'text'} block skip")
    return Marker("run", timeout_s=timeout_s)


def parse_blocks(text: str, path: Path = ROOT / "README.md") -> list[Block]:
    """Every fenced block of a Markdown text (the file ``path``), with the marker before it
    (or None)."""
    lines = text.split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, indent, lang = i, m.group("indent"), m.group("lang")
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            raise ValueError(f"{display(path)}:{start + 1}: the fence is never closed")
        body = [ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines[start + 1 : j]]
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mm = _MARKER.match(lines[k]) if k >= 0 else None
        marker = parse_marker(mm.group("body"), lang) if mm else None
        blocks.append(Block(start + 1, lang, "\n".join(body) + "\n", marker, path))
        i = j + 1
    return blocks


_NAV_PAGE = re.compile(r"^\s*-\s*(?:[^:#]*:\s*)?(?P<page>[\w./-]+\.md)\s*$")


def nav_pages(mkdocs_yml: str) -> list[str]:
    """The pages of mkdocs.yml's ``nav``, in order (paths inside docs/). Read line by line
    rather than with a YAML parser: the nav is a plain list of ``- Title: page.md``."""
    pages: list[str] = []
    in_nav = False
    for line in mkdocs_yml.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line[0].isspace():
            in_nav = line.startswith("nav:")
            continue
        m = _NAV_PAGE.match(line) if in_nav else None
        if m:
            pages.append(m.group("page"))
    return pages


def doc_files() -> list[Path]:
    """The files whose blocks run, in order: ``$KBROKER_DOCS_FILES`` if set, else README.md,
    the nav's pages, then the other pages under docs/ by name."""
    chosen = os.environ.get("KBROKER_DOCS_FILES")
    if chosen:
        return [Path(p).resolve() for p in chosen.split(os.pathsep) if p]
    files = [ROOT / "README.md"]
    nav = [DOCS / page for page in nav_pages(MKDOCS.read_text(encoding="utf-8"))] if MKDOCS.exists() else []
    files += [p for p in nav if p.exists()]
    files += sorted(p for p in DOCS.rglob("*.md") if p not in nav)
    return files


def doc_blocks() -> list[Block]:
    """Every fenced block of every file of :func:`doc_files`, in order."""
    return [block for path in doc_files() for block in parse_blocks(path.read_text(encoding="utf-8"), path)]


def localize(
    code: str, bootstrap: str, zookeeper: str, scratch: str | None = None, kafka_bootstrap: str | None = None
) -> str:
    """The block with the docs' example addresses replaced by the cluster's (gRPC, the
    Kafka-protocol door, ZooKeeper), and its ``/tmp/`` paths by ``scratch`` (this run's own
    directory: nothing left in /tmp by an earlier run, such as a Spark checkpoint, can
    change what a block does)."""
    if scratch is not None:
        code = code.replace("/tmp/", scratch.rstrip("/") + "/")
    if kafka_bootstrap is not None:
        for example in EXAMPLE_KAFKA_BOOTSTRAPS:
            code = code.replace(example, kafka_bootstrap)
    for example in EXAMPLE_ZOOKEEPERS:
        code = code.replace(example, zookeeper)
    for example in EXAMPLE_BOOTSTRAPS:
        code = code.replace(example, bootstrap)
    return code
