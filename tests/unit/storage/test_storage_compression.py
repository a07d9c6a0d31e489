"""Topic config ``compression.type``: the leader recompresses a producer's batch whose
codec differs from the topic's (Kafka's LogValidator), keeping offsets, timestamps,
producer id, epoch and sequence; ``producer`` keeps the producer's codec."""

from __future__ import annotations

from pathlib import Path

import pytest

from kbroker.storage.log import Log
from kbroker.storage.log_config import LogConfig
from kclient.errors import InvalidConfigurationError
from kclient.records import Compression, decode_batch, encode_batch

VALUES = [b"value-%d" % i * 20 for i in range(50)]
KEYS = [b"k%d" % i for i in range(50)]


def _batch(codec: Compression) -> bytes:
    return encode_batch(
        VALUES,
        keys=KEYS,
        base_timestamp=1_700_000_000_000,
        compression=codec,
        producer_id=7,
        producer_epoch=3,
        base_sequence=0,
    )


@pytest.mark.parametrize("name", ["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"])
def test_compression_type_is_a_topic_config(name: str) -> None:
    config = LogConfig.from_properties({"compression.type": name})
    assert config.compression_type == name
    assert config.to_properties()["compression.type"] == name
    assert LogConfig().compression_type == "producer"


def test_unknown_compression_type_is_refused() -> None:
    with pytest.raises(InvalidConfigurationError, match=r"compression\.type"):
        LogConfig.from_properties({"compression.type": "brotli"})


@pytest.mark.parametrize(
    ("topic", "sent", "stored"),
    [
        ("gzip", Compression.NONE, Compression.GZIP),
        ("zstd", Compression.LZ4, Compression.ZSTD),
        ("uncompressed", Compression.GZIP, Compression.NONE),
        ("lz4", Compression.LZ4, Compression.LZ4),
        ("producer", Compression.SNAPPY, Compression.SNAPPY),
    ],
)
def test_leader_recompresses_to_the_topic_codec(
    tmp_path: Path, topic: str, sent: Compression, stored: Compression
) -> None:
    log = Log.open(tmp_path / "t-0", LogConfig(compression_type=topic))
    try:
        log.append_as_leader(encode_batch([b"first"], base_timestamp=1), leader_epoch=2)
        info = log.append_as_leader(_batch(sent), leader_epoch=2)
        assert (info.first_offset, info.last_offset) == (1, 50)
        data = log.read(1, 1 << 20).records
        header, records = decode_batch(data)
        assert header.compression == stored
        assert (header.base_offset, header.partition_leader_epoch) == (1, 2)
        assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 3, 0)
        assert header.record_count == 50 and header.last_offset_delta == 49
        assert header.first_timestamp == 1_700_000_000_000
        assert [r.value for r in records] == VALUES
        assert [r.key for r in records] == KEYS
        assert [r.offset for r in records] == list(range(1, 51))
        # a retry of the same producer batch is still recognised as a duplicate
        again = log.append_as_leader(_batch(sent), leader_epoch=2)
        assert (again.first_offset, again.num_records) == (1, 0)
    finally:
        log.close()
