"""Kafka's RecordBatch v2 (magic 2) format, byte-exact with Apache Kafka 0.11+.

Shared by the client (which encodes and decodes records) and the broker (which reads
batch headers, checks CRCs, stamps offsets and walks records: it never decodes them
into objects). One module per concept, in the shape of Kafka's ``common/record`` and
aiokafka's ``record/``:

- :mod:`~kclient.records.layout`: the batch layout (offsets, masks, sizes, magic);
- :mod:`~kclient.records.varint`: zigzag varints;
- :mod:`~kclient.records.record`: one record's layout, :class:`Record`, its size;
- :mod:`~kclient.records.compression`: gzip, snappy, lz4, zstd; bounded inflation;
- :mod:`~kclient.records.header`: :class:`BatchHeader`, header reads, CRC checks, stamps;
- :mod:`~kclient.records.builder`: :class:`BatchBuilder`, :func:`encode_batch`;
- :mod:`~kclient.records.control`: transaction markers (control records) and
  :func:`drop_aborted`, a read_committed consumer's filter;
- :mod:`~kclient.records.decoder`: records, columns and Arrow buffers out of batches;
- :mod:`~kclient.records.buffers`: :class:`ColumnBuffers` (Arrow's memory layout);
- :mod:`~kclient.records.pyrecords`: the pure-Python twin of the compiled hot loops;
- :mod:`~kclient.records.native` and :mod:`~kclient.records.twins`: which twin runs
  (``kclient._crecords`` unless ``KBROKER_NO_EXTENSIONS=1``), :data:`IMPLEMENTATION`.

Everything a caller needs is exported here; ``kbroker.storage`` uses nothing else.
"""

from kclient.records.buffers import ColumnBuffers, arrow_schema
from kclient.records.builder import BatchBuilder, build_control_batch, encode_batch
from kclient.records.compression import Compression, available, compress, decompress
from kclient.records.control import ControlRecord, control_type, drop_aborted, read_control_record
from kclient.records.decoder import (
    decode_batch,
    decode_batches,
    decode_buffers,
    decode_columns,
    decode_consumer_records,
    walk_records,
)
from kclient.records.header import (
    BatchHeader,
    assemble_batch,
    batch_body,
    check_batch,
    check_shape,
    iter_headers,
    read_header,
    set_log_append_time,
    stamp_batch,
)
from kclient.records.layout import (
    ATTRIBUTES_OFFSET,
    BASE_OFFSET_OFFSET,
    BASE_SEQUENCE_OFFSET,
    BASE_TIMESTAMP_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    CONTROL_KEY_VERSION,
    CONTROL_TYPE_ABORT,
    CONTROL_TYPE_COMMIT,
    CRC_OFFSET,
    DELETE_HORIZON_FLAG_MASK,
    END_TXN_MARKER_VERSION,
    HEADER,
    HEADER_SIZE,
    LAST_OFFSET_DELTA_OFFSET,
    LENGTH_OFFSET,
    LOG_OVERHEAD,
    MAGIC,
    MAGIC_OFFSET,
    MAX_TIMESTAMP_OFFSET,
    MIN_BATCH_LENGTH,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    PARTITION_LEADER_EPOCH_OFFSET,
    PRODUCER_EPOCH_OFFSET,
    PRODUCER_ID_OFFSET,
    RECORDS_COUNT_OFFSET,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    TimestampType,
)
from kclient.records.record import (
    MAX_RECORD_OVERHEAD,
    MIN_RECORD_SIZE,
    Record,
    RecordColumns,
    record_size_in_bytes,
)
from kclient.records.twins import IMPLEMENTATION, CodecAPI, implementations
from kclient.records.varint import encode_varint, read_varint

__all__ = [
    "ATTRIBUTES_OFFSET",
    "BASE_OFFSET_OFFSET",
    "BASE_SEQUENCE_OFFSET",
    "BASE_TIMESTAMP_OFFSET",
    "COMPRESSION_CODEC_MASK",
    "CONTROL_FLAG_MASK",
    "CONTROL_KEY_VERSION",
    "CONTROL_TYPE_ABORT",
    "CONTROL_TYPE_COMMIT",
    "CRC_OFFSET",
    "DELETE_HORIZON_FLAG_MASK",
    "END_TXN_MARKER_VERSION",
    "HEADER",
    "HEADER_SIZE",
    "IMPLEMENTATION",
    "LAST_OFFSET_DELTA_OFFSET",
    "LENGTH_OFFSET",
    "LOG_OVERHEAD",
    "MAGIC",
    "MAGIC_OFFSET",
    "MAX_RECORD_OVERHEAD",
    "MAX_TIMESTAMP_OFFSET",
    "MIN_BATCH_LENGTH",
    "MIN_RECORD_SIZE",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "PARTITION_LEADER_EPOCH_OFFSET",
    "PRODUCER_EPOCH_OFFSET",
    "PRODUCER_ID_OFFSET",
    "RECORDS_COUNT_OFFSET",
    "TIMESTAMP_TYPE_MASK",
    "TRANSACTIONAL_FLAG_MASK",
    "BatchBuilder",
    "BatchHeader",
    "CodecAPI",
    "ColumnBuffers",
    "Compression",
    "ControlRecord",
    "Record",
    "RecordColumns",
    "TimestampType",
    "arrow_schema",
    "assemble_batch",
    "available",
    "batch_body",
    "build_control_batch",
    "check_batch",
    "check_shape",
    "compress",
    "control_type",
    "decode_batch",
    "decode_batches",
    "decode_buffers",
    "decode_columns",
    "decode_consumer_records",
    "decompress",
    "drop_aborted",
    "encode_batch",
    "encode_varint",
    "implementations",
    "iter_headers",
    "read_control_record",
    "read_header",
    "read_varint",
    "record_size_in_bytes",
    "set_log_append_time",
    "stamp_batch",
    "walk_records",
]
