"""What the Kafka door advertises: every (API, version) in ApiVersions has schemas both
ways, kio's or the door's own for the versions Kafka 4 dropped (else a request the door
invited would fail to decode), and the docs' table (docs/kafka-clients.md) is the table the door serves."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from kbroker.doors.kafka.codec import request_schema, response_class
from kbroker.doors.kafka.door import api_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "kafka-clients.md"
UNCALLED = SimpleNamespace(
    apis=SimpleNamespace(log=None, metadata=None, groups=None, admin=None, cluster=None, security=None, offload=None)
)
"""A broker whose handlers are never called: the table is only listed."""


def test_every_advertised_version_has_request_and_response_schemas() -> None:
    table = api_table(UNCALLED.apis)  # type: ignore[arg-type]
    missing = []
    for api in table.apis.values():
        for version in range(api.min_version, api.max_version + 1):
            try:
                request_schema(api.key, version)  # kio's, or the door's own (Produce v0-2)
                response_class(api.key, version)
            except Exception:
                missing.append(f"{api.name} v{version}")
    assert not missing


def test_the_docs_table_is_what_api_versions_answers() -> None:
    table = api_table(UNCALLED.apis)  # type: ignore[arg-type]
    dash = "\u2013"  # the docs write ranges with an en dash
    served = set()
    for a in table.apis.values():
        versions = f"{a.min_version}" if a.min_version == a.max_version else f"{a.min_version}{dash}{a.max_version}"
        served.add((a.name, a.key, versions))
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## What the door serves") :]
    rows = re.findall(r"^\| (\w+) \| (\d+) \| ([\d\u2013]+) \|", section, re.M)
    assert {(name, int(key), versions) for name, key, versions in rows} == served
