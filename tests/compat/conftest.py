"""The ``librdkafka`` marker: librdkafka's own test suite against kbroker
(:mod:`tests.compat.librdkafka`). Those tests build librdkafka's test-runner (cached) and
take minutes, so they run only when asked for: ``pytest -m librdkafka tests/compat``
(scripts/test's own step, quick mode on one broker) or ``-m "librdkafka and slow"`` (full
mode, three brokers, SASL_SSL)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "librdkafka: librdkafka's own test suite against a kbroker cluster (pytest -m librdkafka)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "librdkafka" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="librdkafka's suite runs in its own step: pytest -m librdkafka tests/compat")
    for item in items:
        if item.get_closest_marker("librdkafka"):
            item.add_marker(skip)
