"""Issue 13, logging: a reassignment that moves leadership logs "leader elected" with its reason."""

from __future__ import annotations

import logging

import pytest

from kbroker.cluster.reassignment import ReassignmentManager
from tests.unit.test_reassignment_manager import InMemoryStore


def test_a_move_off_the_leader_logs_the_election_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kbroker.cluster.reassignment")
    store = InMemoryStore()
    store.add_topic("t", {0: [1, 2, 3]})
    store.write_request({("t", 0): [3, 4, 5]})
    m = ReassignmentManager(store, 2)
    m.process_request({1, 2, 3, 4, 5})
    store.join_isr("t", 0, 4)
    store.join_isr("t", 0, 5)
    m.try_complete({1, 2, 3, 4, 5})
    elections = [r.getMessage() for r in caplog.records if "elected" in r.getMessage()]
    want = "t-0: leader 3 elected (was 1), reason: reassignment; epoch 2, ISR [1, 2, 3, 4, 5] -> [3, 4, 5]"
    assert elections == [want]
