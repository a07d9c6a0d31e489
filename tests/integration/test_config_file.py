"""The config-file form of the broker command line, on a real process."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kbroker.local.cluster import BrokerProcess
from kclient import AdminClient, NewTopic

pytestmark = pytest.mark.integration


def test_broker_starts_from_properties_file(zk_connect: str, tmp_path: Path) -> None:
    props = tmp_path / "server.properties"
    props.write_text(
        f"broker.id=7\nzookeeper.connect={zk_connect}\nlisteners=PLAINTEXT://127.0.0.1:0\n"
        f"log.dirs={tmp_path / 'data'}\nnum.partitions=3\nzookeeper.session.timeout.ms=4000\n"
    )
    broker = BrokerProcess(7, tmp_path, zk_connect, config_file=props)
    broker.start()
    try:
        with AdminClient(broker.address) as admin:
            admin.create_topics([NewTopic("defaults")])
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                parts = admin.describe_topics(["defaults"])[0].partitions
                if len(parts) == 3 and all(p.leader == 7 for p in parts):
                    break
                time.sleep(0.1)
            assert [p.leader for p in parts] == [7, 7, 7]
    finally:
        assert broker.stop() == 0
