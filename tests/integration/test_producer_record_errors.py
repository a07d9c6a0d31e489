"""KIP-467 in kclient's producer: a batch that a broker refuses for some of its records
(records without a key on a compacted topic) fails whole, and each record's future says
which part it played: a refused record raises InvalidRecordError with the broker's
message for it, the others one saying they were not written because of the batch's
invalid records; all carry ``record_errors`` (index and message of each refused
record). ``send_batch``'s future names positions in the call's input."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kbroker.local.cluster import LocalCluster
from kclient import AdminClient, NewTopic, Producer
from kclient.errors import InvalidRecordError
from kclient.producer.futures import BATCH_HAD_INVALID_RECORDS

pytestmark = pytest.mark.integration

TOPIC = "compacted"
KEYS = [b"a", None, b"c", None, b"e"]


@pytest.fixture
def broker(cluster_factory: Callable[..., LocalCluster]) -> LocalCluster:
    cluster = cluster_factory(1)
    with AdminClient(bootstrap_servers=cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 1, topic_configs={"cleanup.policy": "compact"})])
    return cluster


def _raised(future: object) -> InvalidRecordError:
    with pytest.raises(InvalidRecordError) as info:
        future.get(30)  # type: ignore[attr-defined]
    return info.value


def test_send_fails_each_record_with_its_part(broker: LocalCluster) -> None:
    with Producer(bootstrap_servers=broker.bootstrap, linger_ms=2000, retries=0) as producer:
        futures = [producer.send(TOPIC, value=b"v%d" % i, key=k, partition=0) for i, k in enumerate(KEYS)]
        producer.flush(30)
        errors = [_raised(f) for f in futures]
        for i, err in enumerate(errors):
            assert [idx for idx, _ in err.record_errors] == [1, 3]
            assert all("without key" in message for _, message in err.record_errors)
            if KEYS[i] is None:
                assert "without key" in err.message and f"record {i}" in err.message
            else:
                assert BATCH_HAD_INVALID_RECORDS in err.message
        assert futures[1].exception() is not None and futures[1].failed()
        # Nothing was written: the next record (with a key) lands at offset 0.
        assert producer.send(TOPIC, value=b"ok", key=b"k", partition=0).get(30).offset == 0


def test_send_batch_names_positions_in_the_input(broker: LocalCluster) -> None:
    with Producer(bootstrap_servers=broker.bootstrap, retries=0) as producer:
        values = [b"v%d" % i for i in range(len(KEYS))]
        err = _raised(producer.send_batch(TOPIC, values, keys=KEYS, partition=0))
        assert [idx for idx, _ in err.record_errors] == [1, 3]
        assert "2 record errors" in err.message
