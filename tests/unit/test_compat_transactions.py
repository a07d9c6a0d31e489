"""kclient.compat with transactions: isolation_level and transactional_id are acted on by
the consumer and the producer, so neither is refused nor named as ignored by them; a
tool handing one settings dict to the admin client too sees them ignored there."""

from __future__ import annotations

import logging

import pytest

from kclient.compat import check_configs
from kclient.consumer import Consumer
from kclient.producer import Producer


def test_consumer_acts_on_isolation_level() -> None:
    assert check_configs("consumer", {"isolation_level": "read_committed"}, Consumer.DEFAULT_CONFIG) == []


def test_producer_acts_on_transactional_id() -> None:
    settings = {"transactional_id": "tx", "transaction_timeout_ms": 1000}
    assert check_configs("producer", settings, Producer.DEFAULT_CONFIG) == []


def test_admin_ignores_them_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kclient.compat")
    ignored = check_configs("admin", {"transactional_id": "tx", "isolation_level": "read_committed"}, ())
    assert ignored == ["isolation_level", "transactional_id"]
    [line] = [r.getMessage() for r in caplog.records if r.name == "kclient.compat"]
    assert line == "admin: isolation_level, transactional_id: no meaning for kbroker; ignored"
