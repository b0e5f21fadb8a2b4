"""Kafka's RecordBatch v2 (magic 2) codec and its compression: the byte format shared by the
storage engine (``lowtide.log``), the clients (``lowtide.client``) and, later, WAL files.

Imports only ``lowtide.errors``, the C CRC-32C module, the C record walker (``_validate``,
built by ``pip install -e .``; ``validate.py`` falls back to Python without it) and, on first use of
those codecs, ``lz4`` and ``zstandard`` (``compression.py``), so a client that
encodes or decodes batches loads no storage, server or metrics code (as Kafka keeps ``common.record`` with its
clients and aiokafka keeps ``record/`` beside its client).
"""

from lowtide.record.batch import (
    BATCH_HEADER_SIZE,
    COMPRESSION_MASK,
    CONTROL_MASK,
    DELETE_HORIZON_MASK,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    NO_PRODUCER_ID,
    NO_TIMESTAMP,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchBuilder,
    BatchHeader,
    OwnedBatches,
    Record,
    assign_offsets,
    compose_attributes,
    crc32c,
    decode_batch,
    decode_batches,
    encode_batch,
    iter_batches,
    read_header,
    validate_batches,
)
from lowtide.record.compression import Compression
from lowtide.record.varint import decode_varint, encode_uvarint, encode_varint

__all__ = [
    "BATCH_HEADER_SIZE",
    "COMPRESSION_MASK",
    "CONTROL_MASK",
    "DELETE_HORIZON_MASK",
    "LOG_OVERHEAD",
    "MAGIC",
    "MIN_BATCH_LENGTH",
    "NO_PRODUCER_ID",
    "NO_TIMESTAMP",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_TYPE_MASK",
    "TRANSACTIONAL_MASK",
    "BatchBuilder",
    "BatchHeader",
    "Compression",
    "OwnedBatches",
    "Record",
    "assign_offsets",
    "compose_attributes",
    "crc32c",
    "decode_batch",
    "decode_batches",
    "decode_varint",
    "encode_batch",
    "encode_uvarint",
    "encode_varint",
    "iter_batches",
    "read_header",
    "validate_batches",
]
