"""Messages of the ``lowtide.v1.DisklessCoordinator`` service (KIP-1164), as dataclasses.

Two sets, one module: imported by the coordinator (its servicer converts protobuf into the request
and response dataclasses, its domain core and state take them), by ``DisklessCoordinatorClient``
(``lowtide.client.diskless``) and by its callers (the brokers' ``lowtide.diskless``, the front
door's diskless topics, benches and tests).

* The requests and responses of the seven operations, as the domain core takes and answers them.
  Field names are the KIP's in snake_case, as in protos/lowtide/v1/coordinator.proto; the gRPC
  servicer converts between the two, so the domain core never imports generated code. Topic ids
  are Kafka Uuids as 16 raw bytes. Error codes are Kafka's numbers (0 = NONE); ``error_message``
  is None when there is no error. Additions to the KIP's fields are marked "not in the KIP" with
  the reason.
* What ``DisklessCoordinatorClient`` takes and returns per batch or partition (end of module):
  flatter shapes for the brokers, errors as ``LowtideError`` (None = success).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from lowtide.errors import LowtideError

DEFAULT_TIMEOUT_MS = 60_000

# ListOffsets special timestamps (Kafka's ListOffsetsRequest constants).
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4

NO_PRODUCER_ID = -1

# Transactions on diskless topics (not in the KIP): what a batch of a CommitFile is to its
# producer's transaction, one byte per batch in ``CommitFileRequest.txn_kinds``.
TXN_NONE, TXN_DATA, TXN_COMMIT, TXN_ABORT = 0, 1, 2, 3
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


# ---- CreatePartitions ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class CreatablePartitions:
    topic_id: bytes
    name: str
    # The topic's partition count after the call (Kafka CreatePartitions' meaning): creates the
    # indexes below it that this shard does not have yet.
    num_partitions: int
    # Not in the KIP: user partitions are spread over shards, so a shard is told exactly which
    # indexes are its own; when given, exactly these are created (num_partitions is then ignored).
    partition_indexes: Sequence[int] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CreatePartitionsRequest:
    topics: Sequence[CreatablePartitions]
    timeout_ms: int = DEFAULT_TIMEOUT_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class CreatablePartitionsResult:
    topic_id: bytes
    error_code: int = 0
    error_message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CreatePartitionsResponse:
    topics: list[CreatablePartitionsResult]
    throttle_time_ms: int = 0


# ---- DeleteTopics ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopicsRequest:
    topic_ids: Sequence[bytes]
    timeout_ms: int = DEFAULT_TIMEOUT_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class DeletableTopicResult:
    topic_id: bytes
    error_code: int = 0
    error_message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopicsResponse:
    responses: list[DeletableTopicResult]
    throttle_time_ms: int = 0


# ---- CommitFile ------------------------------------------------------------------------------------
class CommitBatch(NamedTuple):
    # A NamedTuple, not a dataclass like the other messages: a CommitFile carries ~100 of these
    # (1,600 in a busy production cluster's file) and a tuple is built ~4x faster than a frozen
    # dataclass; field order is the protobuf's, so the servicer builds one from a plain tuple.
    magic: int
    request_id: int
    topic_id: bytes
    partition_index: int
    byte_offset: int
    size: int
    base_offset: int      # as in the batch header the producer sent (normally 0)
    last_offset: int      # base_offset + record count - 1
    batch_max_timestamp: int
    timestamp_type: int   # 0 CreateTime, 1 LogAppendTime
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    base_sequence: int = -1
    last_sequence: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitFileRequest:
    object_key: str
    object_format: int
    file_size: int
    owner_ids: Sequence[int]
    batches: Sequence[CommitBatch]
    # Not in the KIP's request, but in its FileCommitted record: the broker that uploaded the file
    # (the servicer takes it from the caller's authenticated identity).
    uploader_broker_id: int = -1
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    # Transactions on diskless topics: one TXN_* byte per batch, in batch order; empty when none is
    # transactional (the proto's ``txn_kinds``).
    txn_kinds: bytes = b""


class CommitBatchResult(NamedTuple):
    # A NamedTuple for the same reason as CommitBatch: one per batch of the file.
    error_code: int = 0
    error_message: str | None = None
    assigned_base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    is_duplicate: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitFileResponse:
    batches: list[CommitBatchResult]
    throttle_time_ms: int = 0


# ---- DeleteRecords ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteRecordsPartition:
    partition_index: int
    offset: int  # -1: the high watermark


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteRecordsTopic:
    topic_id: bytes
    partitions: Sequence[DeleteRecordsPartition]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteRecordsRequest:
    topics: Sequence[DeleteRecordsTopic]
    timeout_ms: int = DEFAULT_TIMEOUT_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteRecordsPartitionResult:
    partition_index: int
    low_watermark: int = -1
    error_code: int = 0
    error_message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteRecordsTopicResult:
    topic_id: bytes
    partitions: list[DeleteRecordsPartitionResult]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteRecordsResponse:
    topics: list[DeleteRecordsTopicResult]
    throttle_time_ms: int = 0


# ---- ListOffsets -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsPartition:
    partition_index: int
    timestamp: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsTopic:
    topic_id: bytes
    partitions: Sequence[ListOffsetsPartition]


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsRequest:
    topics: Sequence[ListOffsetsTopic]
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    isolation_level: int = READ_UNCOMMITTED  # READ_COMMITTED: latest is the last stable offset


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsPartitionResponse:
    partition_index: int
    error_code: int = 0
    error_message: str | None = None
    timestamp: int = -1
    offset: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsTopicResponse:
    topic_id: bytes
    partitions: list[ListOffsetsPartitionResponse]


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsResponse:
    topics: list[ListOffsetsTopicResponse]
    throttle_time_ms: int = 0


# ---- FindBatches -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class FindBatchesPartition:
    partition_index: int
    offset: int
    max_partition_fetch_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FindBatchesTopic:
    topic_id: bytes
    partitions: Sequence[FindBatchesPartition]


@dataclass(frozen=True, slots=True, kw_only=True)
class FindBatchesRequest:
    fetch_max_bytes: int
    max_batches_per_partition: int
    topics: Sequence[FindBatchesTopic]
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    isolation_level: int = READ_UNCOMMITTED


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchInfo:
    batch_id: int
    object_key: str
    magic: int
    byte_offset: int
    byte_size: int
    base_offset: int
    last_offset: int
    log_append_timestamp: int
    batch_max_timestamp: int
    timestamp_type: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FindBatchesPartitionResponse:
    partition_index: int
    error_code: int = 0
    log_start_offset: int = -1
    high_watermark: int = -1
    batches: list[BatchInfo] = field(default_factory=list)
    last_stable_offset: int = -1
    # READ_COMMITTED: (producer id, first offset) of the aborted transactions overlapping ``batches``.
    aborted_transactions: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class FindBatchesTopicResponse:
    topic_id: bytes
    partitions: list[FindBatchesPartitionResponse]


@dataclass(frozen=True, slots=True, kw_only=True)
class FindBatchesResponse:
    topics: list[FindBatchesTopicResponse]
    throttle_time_ms: int = 0


# ---- DescribeFiles ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeFilesRequest:
    object_keys: Sequence[str]
    timeout_ms: int = DEFAULT_TIMEOUT_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeFileResult:
    object_key: str
    error_code: int = 0
    error_message: str | None = None
    has_live_batches: bool = False
    # Not in the KIP (the orphan scanner's question): any row of the file on this shard (live,
    # released, handing over, deletable within its grace) or a pending commit of it.
    known: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DescribeFilesResponse:
    files: list[DescribeFileResult]
    throttle_time_ms: int = 0
    # Not in the KIP (the orphan scanner's threshold): creation time of the oldest file this shard
    # has a row for, epoch ms; -1 when none.
    oldest_file_created_at_ms: int = -1


# ---- DisklessCoordinatorClient's per-batch and per-partition shapes -------------------------------
@dataclass(frozen=True, slots=True)
class BatchToCommit:
    """One batch of a WAL file, as CommitFile takes it (offsets are the batch's own, from 0)."""

    topic_id: bytes
    partition: int
    byte_offset: int
    size: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    timestamp_type: int
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    last_sequence: int = -1
    txn_kind: int = 0   # TXN_NONE, TXN_DATA, TXN_COMMIT or TXN_ABORT


class CommitResult(NamedTuple):
    # A NamedTuple, as CommitBatch: one per batch of every file, built from packed rows.
    error: LowtideError | None = None
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    is_duplicate: bool = False


@dataclass(frozen=True, slots=True)
class FoundBatch:
    object_key: str
    byte_offset: int
    byte_size: int
    base_offset: int
    last_offset: int
    log_append_timestamp: int
    max_timestamp: int
    timestamp_type: int


@dataclass(frozen=True, slots=True)
class FoundPartition:
    topic_id: bytes
    partition: int
    error: LowtideError | None = None
    log_start_offset: int = -1
    high_watermark: int = -1
    batches: list[FoundBatch] = field(default_factory=list)
    last_stable_offset: int = -1
    aborted_transactions: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionAnswer:
    """A DeleteRecords (``offset`` = low watermark) or ListOffsets answer for one partition."""

    topic_id: bytes
    partition: int
    error: LowtideError | None = None
    offset: int = -1
    timestamp: int = -1
