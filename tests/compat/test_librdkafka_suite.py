"""librdkafka's own test suite against kbroker, checked against the compatibility table
(tests/compat/librdkafka_expected.json, shown in docs/kafka-compatibility.md).

The suite tests (marker ``librdkafka``) run only when selected: scripts/test runs
``pytest -m "librdkafka and not slow" tests/compat`` (quick mode, one broker); the full
mode, three brokers and SASL_SSL are ``-m "librdkafka and slow"``. The table tests below
them run everywhere and need no build."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compat import librdkafka as suite

DOC = suite.ROOT / "docs" / "kafka-compatibility.md"


def _run(
    tmp_path: Path, *, brokers: int = 1, quick: bool = True, secure: bool = False, scenario: str = "default"
) -> None:
    expected = suite.load_expected()
    result = suite.run_suite(
        tmp_path,
        brokers=brokers,
        quick=quick,
        secure=secure,
        skip=suite.excluded(expected, brokers, quick, secure, scenario),
        echo=False,
        scenario=scenario,
    )
    verdict = suite.compare(result, expected)
    suite.write_json(result, verdict, tmp_path / "verdict.json")
    text = suite.report_text(result, verdict)
    print(text)
    if not verdict.ok:
        pytest.fail(text, pytrace=False)


@pytest.mark.librdkafka
@pytest.mark.timeout(2400)
def test_quick_mode_on_one_broker_matches_the_table(tmp_path: Path) -> None:
    _run(tmp_path)


@pytest.mark.librdkafka
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_quick_mode_on_three_brokers_matches_the_table(tmp_path: Path) -> None:
    _run(tmp_path, brokers=3)


@pytest.mark.librdkafka
@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_full_mode_on_one_broker_matches_the_table(tmp_path: Path) -> None:
    _run(tmp_path, quick=False)


@pytest.mark.librdkafka
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_quick_mode_over_sasl_ssl_scram_matches_the_table(tmp_path: Path) -> None:
    _run(tmp_path, secure=True)


@pytest.mark.librdkafka
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_noautocreate_scenario_matches_the_table(tmp_path: Path) -> None:
    _run(tmp_path, brokers=3, quick=False, scenario="noautocreate")


def test_every_test_of_the_suite_has_an_expected_outcome_with_a_reason_for_each_skip() -> None:
    table = suite.load_expected()["tests"]
    assert len(table) > 140
    for name, entry in table.items():
        assert entry["expect"] in ("pass", "skip"), name
        assert entry["expect"] == "pass" or entry.get("reason"), f"{name}: a skip needs its reason"
        for key, value in entry.get("when", {}).items():
            assert value in ("pass", "skip"), (name, key)
            assert value == "pass" or entry.get("reason"), f"{name}: a skip needs its reason"


def test_the_docs_table_is_the_expected_table() -> None:
    text = DOC.read_text()
    table = suite.markdown_table(suite.load_expected())
    assert table in text, "docs/kafka-compatibility.md is stale: python -m tests.compat.librdkafka --write-docs"


def test_parse_report_reads_states_and_failure_reasons() -> None:
    report = (
        '{ "id": "x", "tests": {"<MAIN>": {"name": "<MAIN>", "state": "PASSED", "known_issue": false, '
        '"extra": "", "duration": 9.0, "report": [ ] }, "0001_multiobj": {"name": "0001_multiobj", '
        '"state": "PASSED", "known_issue": false, "extra": "", "duration": 1.5, "report": [ ] }, '
        '"0030_offset_commit": {"name": "0030_offset_commit", "state": "FAILED", "known_issue": false, '
        '"extra": "", "duration": 12.25, "report": [ ] }}, "tests_run": 2 }'
    )
    log = (
        "|\x1b[32m 0001_multiobj                            |     PASSED |   1.500s \x1b[0m|\n"
        "|\x1b[31m 0030_offset_commit                       |     FAILED |  12.250s \x1b[0m|"
        "\x1b[31m 0030-offset_commit.c:120: committed offset 7, expected 50\x1b[0m\n"
    )
    out = suite.parse_report(report, log)
    assert set(out) == {"0001_multiobj", "0030_offset_commit"}
    assert out["0030_offset_commit"].state == "FAILED"
    assert out["0030_offset_commit"].reason == "0030-offset_commit.c:120: committed offset 7, expected 50"
    # A report broken by an unescaped quote in "extra" is still read.
    broken = report.replace('"extra": "", "duration": 1.5', '"extra": "say "hi"", "duration": 1.5')
    assert suite.parse_report(broken)["0001_multiobj"].state == "PASSED"


def test_compare_flags_regressions_and_newly_passing_skips() -> None:
    expected = {
        "tests": {
            "0001_a": {"expect": "pass"},
            "0002_b": {"expect": "pass"},
            "0003_c": {"expect": "skip", "reason": "r"},
            "0004_d": {"expect": "skip", "reason": "r"},
            "0005_e": {"expect": "skip", "reason": "r", "when": {"brokers=3": "pass"}},
        }
    }
    outcomes = {
        "0001_a": suite.Outcome("0001_a", "PASSED"),
        "0002_b": suite.Outcome("0002_b", "FAILED"),
        "0003_c": suite.Outcome("0003_c", "PASSED"),
        "0004_d": suite.Outcome("0004_d", "SKIPPED"),
        "0005_e": suite.Outcome("0005_e", "SKIPPED"),
    }
    result = suite.RunResult(outcomes, 1.0, 1, Path("log"), Path("report"), brokers=1, quick=True, secure=False)
    v = suite.compare(result, expected)
    assert v.failed == ["0002_b"] and v.newly_passing == ["0003_c"] and not v.ok
    v3 = suite.compare(suite.RunResult(outcomes, 1.0, 1, Path("l"), Path("r"), 3, True, False), expected)
    assert "0005_e" in v3.failed
