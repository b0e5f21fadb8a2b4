"""CommitFile's column-wise form: a file's batches and their results as packed byte arrays.

A broker's CommitFile names every batch of its WAL file (~100 in the benchmarks, 1,600 in a busy
cluster's 8 MiB file). As a ``repeated DisklessCommitBatch`` each batch is a protobuf message built
on the broker, parsed into a message object on the shard and copied field by field into a tuple;
each result goes back the same way. Packed, the whole list is one ``bytes`` field, built with one
``struct.pack`` per batch and read with one ``struct.iter_unpack`` (no per-batch Python frame on
the shard). coordinator.proto carries both: ``packed_batches`` (what ``DisklessCoordinatorClient``
sends) and ``batches`` (readable with grpcurl); a request sets one of them. A response answers in
the form it was asked: ``packed_results`` for ``packed_batches``.

Layouts, big-endian, fixed size, back to back (N = len // size; a length that is not a multiple
of the size is INVALID_REQUEST)::

    packed batch, 76 bytes (DisklessCommitBatch's fields, in its order):
    +-------+------------+----------+-----------+-------------+------+-------------+-------------+
    | magic | request_id | topic_id | partition | byte_offset | size | base_offset | last_offset |
    | int8  | int32      | uuid(16) | int32     | int32       |int32 | int64       | int64       |
    +-------+------------+----------+-----------+-------------+------+-------------+-------------+
    | batch_max_timestamp | timestamp_type | producer_id | producer_epoch | base_seq | last_seq |
    | int64               | int8           | int64       | int16          | int32    | int32    |
    +---------------------+----------------+-------------+----------------+----------+----------+

    packed result, 27 bytes (DisklessCommitBatchResult's fields, in its order; its message, if
    any, goes in ``error_messages`` under the batch's index):
    +------------+----------------------+-----------------+------------------+--------------+
    | error_code | assigned_base_offset | log_append_time | log_start_offset | is_duplicate |
    | int16      | int64                | int64           | int64            | int8 (0 / 1) |
    +------------+----------------------+-----------------+------------------+--------------+

Narrower than the protobuf's int32s where Kafka's own fields are (magic and timestamp type int8,
producer epoch int16, error codes int16): a value that does not fit cannot be packed, and the
client raises before sending.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from lowtide.errors import InvalidRequest

PACKED_BATCH = struct.Struct(">bi16siiiqqqbqhii")
PACKED_RESULT = struct.Struct(">hqqqb")
assert PACKED_BATCH.size == 76 and PACKED_RESULT.size == 27


def pack_batches(rows: Iterable[tuple]) -> bytes:
    """Rows in the packed batch's field order (magic first) as one byte string."""
    pack = PACKED_BATCH.pack
    try:
        return b"".join([pack(*row) for row in rows])
    except struct.error as exc:
        raise InvalidRequest(f"a batch does not fit CommitFile's packed form: {exc}") from None


def unpack_batches(data: bytes) -> Iterator[tuple]:
    """The rows of ``pack_batches``; INVALID_REQUEST for a length that is not whole batches."""
    if len(data) % PACKED_BATCH.size:
        raise InvalidRequest(f"packed_batches has {len(data)} bytes, not a multiple of {PACKED_BATCH.size}")
    return PACKED_BATCH.iter_unpack(data)


def pack_results(rows: Iterable[tuple[int, int, int, int, bool]]) -> bytes:
    """(error code, assigned base offset, log append time, log start offset, is duplicate) rows."""
    pack = PACKED_RESULT.pack
    return b"".join([pack(*row) for row in rows])


def pack_result_rows(results: Iterable[tuple[int, str | None, int, int, int, bool]]) -> bytes:
    """``pack_results`` of CommitBatchResult rows (error code, message, assigned base offset, log
    append time, log start offset, is duplicate) as the shard answers them, the message left out
    (it goes in ``error_messages``): one pass, no per-row generator step in between."""
    pack = PACKED_RESULT.pack
    return b"".join([pack(code, base, append_time, lso, duplicate)
                     for code, _message, base, append_time, lso, duplicate in results])


def no_result_errors(data: bytes) -> bool:
    """Whether every packed result's error code is 0: its two bytes, picked out of each row by
    slicing (in C), are all zero. A length that is not whole rows is left to ``unpack_results``."""
    size = PACKED_RESULT.size
    if len(data) % size:
        return False
    return not data[0::size].strip(b"\x00") and not data[1::size].strip(b"\x00")


def unpack_results(data: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    if len(data) % PACKED_RESULT.size:
        raise InvalidRequest(f"packed_results has {len(data)} bytes, not a multiple of {PACKED_RESULT.size}")
    return PACKED_RESULT.iter_unpack(data)
