"""Messages of the ``lowtide.v1.Replica`` service (protos/lowtide/v1/replica.proto), as dataclasses.

Both ends of each call use these: the replica's servicer and request paths (``lowtide.replica``),
its callers in other services (the front door's ListOffsets/DeleteRecords fan-out and
WriteTxnMarkers, the follower fetcher, the diskless broker, the coordinator's metadata log) and
``lowtide.client.replica.ReplicaClient``, which converts them to and from protobuf. Per-partition
answers carry ``error`` (None = success) rather than raising.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lowtide.errors import LowtideError
from lowtide.messages import TopicPartition

MiB = 1 << 20
# Kafka's isolation levels (Fetch, ListOffsets).
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
ISOLATION_LEVELS = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED}


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """What every per-partition answer starts with; ``error`` (where present) None = success."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class ProduceItem:
    """One partition of a Produce: its record batches as sent, and the conditions it carries
    (None: unchecked): the leader epoch the producer believes current, and for a conditional
    append (lowtide's coordinators) the log end offset the append must land at."""

    topic: str
    partition: int
    records: bytes
    current_leader_epoch: int | None = None
    expected_log_end_offset: int | None = None


@dataclass(frozen=True, slots=True)
class ProducedPartition(PartitionResult):
    """Where a partition's batches of one Produce landed (offsets -1 on error; the append time -1
    unless the topic uses LogAppendTime)."""

    base_offset: int = -1
    log_start_offset: int = -1
    error: LowtideError | None = None
    log_append_time_ms: int = -1


@dataclass(frozen=True, slots=True)
class FetchPosition:
    """One partition of a Fetch: read from ``fetch_offset``. A follower also reports its log start
    offset (KIP-107) and leader epoch; a consumer leaves them at 0 / -1."""

    topic: str
    partition: int
    fetch_offset: int
    log_start_offset: int = 0
    max_bytes: int = MiB
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class FetchSessionRound:
    """A follower round's place in its fetch session with the leader (KIP-227; the protocol is
    drawn in lowtide/replica/fetch_session.py): ``epoch`` 1 opens session ``session_id``, a
    higher one continues it; ``forgotten`` leave it."""

    session_id: int
    epoch: int
    forgotten: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class FetchedPartition(PartitionResult):
    """One partition of a Fetch response: whole record batches, and the leader's offsets."""

    error: LowtideError | None = None
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    leader_epoch: int = -1
    # bytes, or a read-only memoryview of the received message (a follower's Replicate stream)
    records: bytes | memoryview = b""
    # READ_COMMITTED only (-1 / empty otherwise): where committed data ends, and the aborted
    # transactions (producer id, first offset) overlapping ``records``.
    last_stable_offset: int = -1
    aborted_transactions: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class TxnMarkerRequest:
    """One WriteTxnMarkers entry: end the transaction of ``producer_id`` on these partitions."""

    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: tuple[TopicPartition, ...]
    coordinator_epoch: int = 0


@dataclass(frozen=True, slots=True)
class TxnMarkerResult(PartitionResult):
    """Whether one partition holds the marker (``error`` None) of producer ``producer_id``."""

    producer_id: int = -1
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class OffsetQuery:
    """One partition of a ListOffsets: a timestamp, or Kafka's specs -1 latest, -2 earliest,
    -3 max timestamp; the leader epoch the caller believes current (None: unchecked)."""

    topic: str
    partition: int
    timestamp: int
    current_leader_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class PartitionOffset(PartitionResult):
    """A ListOffsets answer of one partition: ``offset`` -1 when nothing matches or on error."""

    offset: int = -1
    timestamp: int = -1
    leader_epoch: int = -1
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class DeleteRecordsResult(PartitionResult):
    """A DeleteRecords answer of one partition (KIP-107): the low watermark, or -1 and the error.

    The one shape of this answer from the replica to every door: the leader's
    ``DeleteRecordsHandler`` and the diskless shards' answers, the front door's fan-out, the
    ``Admin`` client (KIP-107 ``DeleteDataResult``), the CLI and the Kafka listener all hand it on;
    ``lowtide.rpc.messages`` puts it on the wire and reads it back."""

    low_watermark: int = -1
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class EpochQuery:
    """One partition of OffsetForLeaderEpoch: where does ``leader_epoch`` end on the leader?"""

    topic: str
    partition: int
    leader_epoch: int
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class EpochEndOffset(PartitionResult):
    """The leader's answer: the largest epoch <= the asked one it knows and its end offset
    (both -1 when the asked epoch is newer than any it knows)."""

    leader_epoch: int = -1
    end_offset: int = -1
    error: LowtideError | None = None


@dataclass(frozen=True, slots=True)
class LogDescription(PartitionResult):
    """One hosted replica as DescribeLogs reports it (``low_watermark`` -1 on followers)."""

    role: str
    leader: int
    leader_epoch: int
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    low_watermark: int
    size_bytes: int
    segments: int
    isr: tuple[int, ...] = ()
    dir: str = ""


@dataclass(frozen=True, slots=True)
class ReplicaLogs:
    replica_id: int
    logs: list[LogDescription] = field(default_factory=list)


# ---- DescribeProducers (KIP-664) ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ProducerDescription:
    """One active producer of a partition as Kafka's DescribeProducers answers it (KIP-664): its
    epoch, the sequence of its last record (-1: none in this epoch), its newest batch timestamp,
    the coordinator epoch of its last marker (-1: not tracked here) and the first offset of its
    ongoing transaction (-1: none). The log's producer state (``lowtide.log.producer_state``)
    describes itself with it."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


@dataclass(frozen=True, slots=True)
class PartitionProducers(PartitionResult):
    """A DescribeProducers answer of one partition: its active producers, or the error."""

    producers: tuple[ProducerDescription, ...] = ()
    error: LowtideError | None = None
