"""The domain core of one diskless coordinator shard (KIP-1164): the seven operations, checked
against committed state plus pending records, producing the metadata records to append.

How a service drives it (docs/design/diskless.md#the-coordinator-shard)::

    decision = core.commit_file(request)      # check vs SQLite + pending; records become pending
    offsets  = metadata_log.append(decision.records, acks=all)   # atomically, one batch
    ... wait until the high watermark passes them ...
    for record, offset in zip(decision.records, offsets): core.apply(record, offset)
    reply(decision.response)

The next request may be checked while the previous one waits (pipelining); ``list_offsets`` must
only be called once the preceding records are applied (strict consistency, the service waits);
``find_batches`` reads the committed state and may be stale. A follower or a restart calls only
``apply`` for each record of the log. Requests with a broken structure (byte ranges outside the
file, an owner list without this shard, a bad object key...) raise a typed error before anything
changes; per-partition and per-batch problems are error codes in the response, as in Kafka.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from lowtide.clock import Clock, now_ms
from lowtide.coordinator import transactions as txn
from lowtide.coordinator.pending import PendingState
from lowtide.coordinator.records import (
    CommittedBatch,
    FileCommitted,
    FileDeleted,
    FileHandedOver,
    MetadataRecord,
    PartitionCreated,
    RecordsDeleted,
    TopicDeleted,
)
from lowtide.coordinator.state import (
    MAX_PRODUCER_BATCHES,
    CacheChanges,
    CoordinatorState,
    PartitionRow,
    ProducerEntry,
    ProducerRow,
)
from lowtide.errors import (
    InvalidFetchSize,
    InvalidPartitions,
    InvalidProducerEpoch,
    InvalidRequest,
    InvalidTopic,
    InvalidTxnState,
    LowtideError,
    OffsetOutOfRange,
    OutOfOrderSequenceNumber,
    TopicAlreadyExists,
    UnknownTopicId,
    UnknownTopicOrPartition,
    UnsupportedForMessageFormat,
)
from lowtide.messages.coordinator import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    READ_COMMITTED,
    TXN_COMMIT,
    TXN_DATA,
    CommitBatchResult,
    CommitFileRequest,
    CommitFileResponse,
    CreatablePartitionsResult,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    DeletableTopicResult,
    DeleteRecordsPartitionResult,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteRecordsTopicResult,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeFileResult,
    DescribeFilesRequest,
    DescribeFilesResponse,
    FindBatchesPartitionResponse,
    FindBatchesRequest,
    FindBatchesResponse,
    FindBatchesTopicResponse,
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
)
from lowtide.objectstore.base import check_key

R = TypeVar("R")
INT32_MAX = 2**31 - 1
ZERO_UUID = bytes(16)
RECORD_BATCH_MAGIC = 2
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_UNSEEN = object()
# ``tuple.__new__(SomeNamedTuple, values)`` builds the same tuple as ``SomeNamedTuple(*values)``
# without its Python-level ``__new__`` frame: used where CommitFile builds one per batch.
_new = tuple.__new__


@dataclass(frozen=True, slots=True)
class Decision(Generic[R]):
    """A checked request: the response to send once ``records`` (possibly none) are applied."""

    response: R
    records: list[MetadataRecord]


def _check_topic_id(topic_id: bytes) -> None:
    if not isinstance(topic_id, bytes) or len(topic_id) != 16 or topic_id == ZERO_UUID:
        raise InvalidRequest("topic id must be 16 bytes and not the zero Uuid")


def check_sequence(producer: ProducerRow | None, *, producer_id: int, epoch: int, base_sequence: int,
                   last_sequence: int) -> LowtideError | ProducerEntry | None:
    """Kafka's idempotent-producer rule for one batch: None to accept it, the original entry for an
    exact duplicate of one of the producer's last 5 batches, or the error to answer."""
    # No entries in the current epoch: a transaction marker of a newer epoch (transactions
    # version 2's bump) moved the producer there, and its next batch starts the epoch at 0.
    if producer is None or epoch > producer.producer_epoch or not producer.entries:
        if producer is not None and epoch < producer.producer_epoch:
            return InvalidProducerEpoch(f"producer {producer_id} epoch {epoch} is fenced by "
                                        f"epoch {producer.producer_epoch}")
        if base_sequence != 0:
            return OutOfOrderSequenceNumber(f"producer {producer_id} epoch {epoch}: the first "
                                            f"sequence of an epoch must be 0, got {base_sequence}")
        return None
    if epoch < producer.producer_epoch:
        return InvalidProducerEpoch(f"producer {producer_id} epoch {epoch} is fenced by "
                                    f"epoch {producer.producer_epoch}")
    for entry in producer.entries:
        if entry.base_sequence == base_sequence and entry.last_sequence == last_sequence:
            return entry
    last = producer.entries[-1].last_sequence
    expected = 0 if last == INT32_MAX else last + 1
    if base_sequence != expected:
        return OutOfOrderSequenceNumber(f"producer {producer_id}: expected sequence {expected}, "
                                        f"got {base_sequence}")
    return None


def _failed(error: LowtideError, **fields: object) -> dict:
    return {"error_code": error.code, "error_message": error.message, **fields}


def _refused(error: LowtideError, log_start_offset: int = -1) -> CommitBatchResult:
    return CommitBatchResult(error.code, error.message, -1, -1, log_start_offset, False)


class CoordinatorCore:
    """The operations of shard ``state.coordinator_id`` over its SQLite state and pending records.

    Contract: see the module docstring; every mutating method returns a ``Decision`` whose records
    are already pending (so the next check sees them) and must be appended in order, or the
    pending records dropped with ``reset_pending``. Thread-safety: none; one thread (the shard's
    request loop) calls every method. ``find_batches`` may instead run on another thread over its
    own ``CoordinatorState`` opened on the same database file.
    """

    def __init__(self, state: CoordinatorState, *, clock: Clock = now_ms) -> None:
        self.state = state
        self.pending = PendingState(state)
        self.coordinator_id = state.coordinator_id
        self.clock = clock

    # ---- applying ------------------------------------------------------------------------------
    def apply(self, record: MetadataRecord, offset: int, *, epoch: int = 0) -> bool:
        """Apply a replicated record; if it is the oldest pending one, it stops being pending."""
        applied = self.state.apply(record, offset, epoch=epoch)
        self._leave_pending([record])
        return applied

    def apply_all(self, records: Sequence[tuple[MetadataRecord, int] | tuple[MetadataRecord, int, int]]) -> int:
        """Apply replicated records (log order) in one SQLite transaction; those that were the
        oldest pending ones stop being pending. Returns how many were new to the state. Each is
        ``(record, offset[, coordinator epoch])`` (``CoordinatorState.apply_all``)."""
        applied = self.state.apply_all(records)
        self._leave_pending([item[0] for item in records])
        return applied

    def applied_elsewhere(self, records: Sequence[MetadataRecord], changes: CacheChanges) -> None:
        """Another ``CoordinatorState`` of the same database (the applier) has committed
        ``records`` (log order), changing its cached rows by ``changes``: make this state's caches
        the same, then let those that were the oldest pending ones stop being pending. In this
        order, so that no check sees a row neither in the overlay nor up to date."""
        self.state.mirror_cache_changes(changes)
        self._leave_pending(records)

    def _leave_pending(self, records: Sequence[MetadataRecord]) -> None:
        """Applied ``records`` (log order) that are the oldest pending ones stop being pending."""
        for record in records:
            head = self.pending.head()
            if head is not None and (head is record or head == record):
                self.pending.applied()

    def reset_pending(self) -> None:
        """The pending records' append failed: check from committed state alone again."""
        self.pending.reset()

    def _decide(self, response: R, records: list[MetadataRecord]) -> Decision[R]:
        for record in records:
            self.pending.push(record)
        return Decision(response, records)

    # ---- CreatePartitions / DeleteTopics -----------------------------------------------------
    def create_partitions(self, request: CreatePartitionsRequest) -> Decision[CreatePartitionsResponse]:
        results, records = [], []
        for topic in request.topics:
            try:
                new = self._check_create(topic.topic_id, topic.name, topic.num_partitions,
                                         list(topic.partition_indexes), records)
            except LowtideError as exc:
                results.append(CreatablePartitionsResult(topic_id=topic.topic_id, **_failed(exc)))
                continue
            records.extend(PartitionCreated(topic.topic_id, topic.name, i) for i in new)
            results.append(CreatablePartitionsResult(topic_id=topic.topic_id))
        return self._decide(CreatePartitionsResponse(topics=results), records)

    def _check_create(self, topic_id: bytes, name: str, num_partitions: int, indexes: list[int],
                      earlier: list[MetadataRecord]) -> list[int]:
        _check_topic_id(topic_id)
        if not isinstance(name, str) or not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
            raise InvalidTopic(f"invalid topic name {name!r}")
        if any(isinstance(r, PartitionCreated) and r.topic_id == topic_id for r in earlier):
            raise InvalidRequest("topic id appears twice in the request")
        if self.pending.topic_deletion_pending(topic_id):
            raise TopicAlreadyExists(f"topic {name} is marked for deletion")
        owner = self.pending.topic_id_for_name(name)
        if owner is not None and owner != topic_id:
            raise TopicAlreadyExists(f"topic {name} already exists with another id")
        if any(isinstance(r, PartitionCreated) and r.name == name for r in earlier):
            raise TopicAlreadyExists(f"topic {name} appears twice in the request")
        existing = self.pending.topic(topic_id)
        if existing is not None and existing[0] != name:
            raise InvalidRequest(f"topic id is topic {existing[0]}, not {name}")
        have = existing[1] if existing else frozenset()
        if indexes:
            if any(i < 0 for i in indexes) or len(set(indexes)) != len(indexes):
                raise InvalidPartitions(f"partition indexes must be distinct and >= 0: {indexes}")
            clash = sorted(set(indexes) & have)
            if clash:
                raise InvalidPartitions(f"partitions {clash} of topic {name} already exist")
            return sorted(indexes)
        if num_partitions < 1:
            raise InvalidPartitions(f"number of partitions must be >= 1, got {num_partitions}")
        new = [i for i in range(num_partitions) if i not in have]
        if not new:
            raise InvalidPartitions(f"topic {name} already has {len(have)} partitions")
        return new

    def delete_topics(self, request: DeleteTopicsRequest) -> Decision[DeleteTopicsResponse]:
        results, records = [], []
        now = self.clock()
        for topic_id in request.topic_ids:
            try:
                _check_topic_id(topic_id)
                if self.pending.topic(topic_id) is None or any(
                        isinstance(r, TopicDeleted) and r.topic_id == topic_id for r in records):
                    raise UnknownTopicId("no partition of this topic id on this coordinator")
            except LowtideError as exc:
                results.append(DeletableTopicResult(topic_id=topic_id, **_failed(exc)))
                continue
            records.append(TopicDeleted(topic_id, now))
            results.append(DeletableTopicResult(topic_id=topic_id))
        return self._decide(DeleteTopicsResponse(responses=results), records)

    # ---- CommitFile ----------------------------------------------------------------------------
    def _check_commit_request(self, request: CommitFileRequest) -> int:
        check_key(request.object_key)
        if not -128 <= request.object_format <= 127:
            raise InvalidRequest(f"object format {request.object_format} is not an int8")
        file_size = request.file_size
        if file_size < 0:
            raise InvalidRequest(f"file size {file_size} < 0")
        owners = list(request.owner_ids)
        if len(set(owners)) != len(owners) or self.coordinator_id not in owners:
            raise InvalidRequest(f"owner ids {owners} must be distinct and include coordinator {self.coordinator_id}")
        # Each batch's own fields are checked in commit_file's pass over the batches.
        return owners.index(self.coordinator_id)

    def commit_file(self, request: CommitFileRequest) -> Decision[CommitFileResponse]:
        """Offsets per partition in request order, idempotence per producer; one result per batch.

        The loop is the coordinator's hottest Python (one pass per batch of every file): it unpacks
        each batch once, touches each partition's and producer's row once, and builds tuples."""
        self._check_commit_request(request)
        now = self.clock()
        object_key = request.object_key
        already_known = self.pending.file_known(object_key)
        kinds = request.txn_kinds
        if kinds and (len(kinds) != len(request.batches) or max(kinds) > 3):
            raise InvalidRequest(f"{len(kinds)} transaction kinds (0-3) for {len(request.batches)} batches")
        accepted_kinds: list[int] = []
        txns: dict[tuple[bytes, int, int], int | None] = {}  # ongoing transactions after this file
        anywhere: list[bool | None] = [None]  # whether the shard has any ongoing transaction (asked once)
        # (topic id, partition) -> [row, log start offset, next offset], or None: not on this shard
        partitions: dict[tuple[bytes, int], list | None] = {}
        producers: dict[tuple[bytes, int, int], ProducerRow | None] = {}
        advanced: set[tuple[bytes, int, int]] = set()  # producers with an accepted batch
        results: list[CommitBatchResult] = []
        accepted: list[CommittedBatch] = []
        add_result = results.append
        file_size = request.file_size
        for i, (magic, _request_id, topic_id, index, byte_offset, size, base_offset, last_offset, max_ts, ts_type,
                pid, epoch, base_seq, last_seq) in enumerate(request.batches):
            # The request's own faults first, in this same pass: one raises INVALID_REQUEST for the
            # whole request, and nothing is pending before the loop ends, so nothing changes.
            if topic_id.__class__ is not bytes or len(topic_id) != 16 or topic_id == ZERO_UUID:
                _check_topic_id(topic_id)
            if byte_offset < 0 or size <= 0 or byte_offset + size > file_size:
                raise InvalidRequest(f"batch {i}: bytes [{byte_offset}, +{size}) are not inside the file "
                                     f"of {file_size} bytes")
            if base_offset < 0 or last_offset < base_offset:
                raise InvalidRequest(f"batch {i}: offsets {base_offset}..{last_offset}")
            if ts_type != 0 and ts_type != 1:
                raise InvalidRequest(f"batch {i}: timestamp type {ts_type}")
            where = (topic_id, index)
            part = partitions.get(where, _UNSEEN)
            if part is _UNSEEN:
                row = self.pending.partition(topic_id, index)
                part = partitions[where] = None if row is None else [row, row.log_start_offset, row.high_watermark]
            if part is None:
                add_result(_refused(UnknownTopicOrPartition(
                    f"partition {index} of the topic is not on coordinator {self.coordinator_id}")))
                continue
            lso = part[1]
            if magic != RECORD_BATCH_MAGIC:
                add_result(_refused(UnsupportedForMessageFormat(
                    f"record batch magic {magic}; only {RECORD_BATCH_MAGIC} is supported"), lso))
                continue
            count = last_offset - base_offset + 1
            kind = kinds[i] if kinds else 0
            if kind >= TXN_COMMIT:
                outcome = self._check_marker(pid, epoch, count, (topic_id, index, pid), producers, txns,
                                             already_known)
                if outcome is not None:
                    add_result(_refused(outcome, lso) if isinstance(outcome, LowtideError)
                               else CommitBatchResult(0, None, -1, -1, lso, True))
                    continue
                base = part[2]
                part[2] = base + 1
                accepted.append(_new(CommittedBatch, (topic_id, index, magic, byte_offset, size, base, base, now,
                                                      max_ts, ts_type, pid, epoch, -1, -1)))
                accepted_kinds.append(kind)
                txns[(topic_id, index, pid)] = None
                advanced.add((topic_id, index, pid))
                add_result(_new(CommitBatchResult, (0, None, base, now if ts_type == 1 else -1, lso, False)))
                continue
            if kind == TXN_DATA and pid < 0:
                add_result(_refused(InvalidRequest(f"batch {i}: a transactional batch needs a producer id"), lso))
                continue
            if pid >= 0:
                if epoch < 0 or base_seq < 0 or last_seq < 0 or \
                        (last_seq - base_seq) % (INT32_MAX + 1) != count - 1:
                    add_result(_refused(InvalidRequest(
                        f"producer {pid}: epoch {epoch}, sequences {base_seq}..{last_seq} do not fit "
                        f"{count} records"), lso))
                    continue
                pkey = (topic_id, index, pid)
                if pkey not in producers:
                    producers[pkey] = self.pending.producer(*pkey)
                verdict = check_sequence(producers[pkey], epoch=epoch, base_sequence=base_seq,
                                         last_sequence=last_seq, producer_id=pid)
                if isinstance(verdict, ProducerEntry):
                    add_result(CommitBatchResult(0, None, verdict.base_offset,
                                                 verdict.log_append_timestamp if ts_type == 1 else -1, lso, True))
                    continue
                if verdict is not None:
                    add_result(_refused(verdict, lso))
                    continue
                if not kind and self._in_transaction(pkey, txns, anywhere):
                    add_result(_refused(InvalidTxnState(
                        f"producer {pid} sent a non-transactional batch during its ongoing transaction"), lso))
                    continue
            if already_known:
                add_result(_refused(InvalidRequest(f"file {object_key} is already committed"), lso))
                continue
            base = part[2]
            part[2] = base + count
            last = base + count - 1
            accepted.append(_new(CommittedBatch, (topic_id, index, magic, byte_offset, size, base, last, now, max_ts,
                                                  ts_type, pid, epoch, base_seq, last_seq)))
            if kinds:
                accepted_kinds.append(kind)
                if kind == TXN_DATA and (txns[pkey] if pkey in txns else self.pending.ongoing_txn(*pkey)) is None:
                    txns[pkey] = base  # this batch starts the producer's transaction in the partition
            if pid >= 0:
                entry = ProducerEntry(base_seq, last_seq, base, last, now)
                prev = producers[pkey]
                producers[pkey] = ProducerRow(epoch, (entry,)) if prev is None or prev.producer_epoch != epoch \
                    else ProducerRow(epoch, (prev.entries + (entry,))[-MAX_PRODUCER_BATCHES:])
                advanced.add(pkey)
            add_result(_new(CommitBatchResult, (0, None, base, now if ts_type == 1 else -1, lso, False)))
        response = CommitFileResponse(batches=results)
        if already_known:
            return Decision(response, [])
        # Also with no accepted batch: the file is then recorded with none, which makes it
        # deletable at once (or handed to the next owner), so the object does not leak.
        record = FileCommitted(object_key, request.object_format, request.file_size,
                               request.uploader_broker_id, now, tuple(request.owner_ids), tuple(accepted),
                               bytes(accepted_kinds) if any(accepted_kinds) else b"")
        # The rows this check computed are exactly what the record makes of them: hand them to
        # the overlay rather than have it work them out again batch by batch.
        self.pending.push_checked_file(
            record,
            partitions={where: _new(PartitionRow, (row[0], row[1], row[2], row[3], row[4], part[2], row[6], row[7]))
                        for where, part in partitions.items()  # part[2]: the new high_watermark (row[5])
                        if part is not None and part[2] != (row := part[0])[5]},
            producers={pkey: producers[pkey] for pkey in advanced}, txns=txns)
        return Decision(response, [record])

    def _in_transaction(self, pkey: tuple[bytes, int, int], txns: dict[tuple[bytes, int, int], int | None],
                        anywhere: list[bool | None]) -> bool:
        """Whether the producer has an ongoing transaction in the partition: a non-transactional
        batch of it is then INVALID_TXN_STATE, as Kafka's leader answers. Whether the shard has
        any ongoing transaction at all is asked once per file, so a shard without transactions
        pays no lookup per producer."""
        if pkey in txns:
            return txns[pkey] is not None
        if anywhere[0] is None:
            anywhere[0] = self.pending.any_ongoing_txn()
        return bool(anywhere[0]) and self.pending.ongoing_txn(*pkey) is not None

    def _check_marker(self, pid: int, epoch: int, count: int, pkey: tuple[bytes, int, int],
                      producers: dict[tuple[bytes, int, int], ProducerRow | None],
                      txns: dict[tuple[bytes, int, int], int | None],
                      already_known: bool) -> LowtideError | bool | None:
        """A COMMIT/ABORT marker batch (one control record): None to write it; True when there is
        no ongoing transaction of the producer to end (a retry of a marker already written, or a
        partition the transaction never wrote to): answered as a duplicate, nothing written; or the
        error. Epoch-fenced as Kafka's markers: an epoch older than the producer's is
        INVALID_PRODUCER_EPOCH. A newer one (transactions version 2) becomes the producer's."""
        if pid < 0 or epoch < 0 or count != 1:
            return InvalidRequest(f"a transaction marker needs a producer id, an epoch and one record "
                                  f"(producer {pid}, epoch {epoch}, {count} records)")
        if pkey not in producers:
            producers[pkey] = self.pending.producer(*pkey)
        row = producers[pkey]
        if row is not None and epoch < row.producer_epoch:
            return InvalidProducerEpoch(f"marker of producer {pid} epoch {epoch} is fenced by epoch "
                                        f"{row.producer_epoch}")
        ongoing = txns[pkey] if pkey in txns else self.pending.ongoing_txn(*pkey)
        if ongoing is None or already_known:
            return True
        if row is None or epoch > row.producer_epoch:
            producers[pkey] = ProducerRow(epoch, ())
        return None

    # ---- DeleteRecords ---------------------------------------------------------------------------
    def delete_records(self, request: DeleteRecordsRequest) -> Decision[DeleteRecordsResponse]:
        topics, records = [], []
        now = self.clock()
        lso_after: dict[tuple[bytes, int], int] = {}
        for topic in request.topics:
            results = []
            for part in topic.partitions:
                where = (topic.topic_id, part.partition_index)
                try:
                    _check_topic_id(topic.topic_id)
                    p = self.pending.partition(*where)
                    if p is None:
                        raise UnknownTopicOrPartition(f"partition {part.partition_index} is not on coordinator "
                                                      f"{self.coordinator_id}")
                    lso = lso_after.get(where, p.log_start_offset)
                    target = p.high_watermark if part.offset == -1 else part.offset
                    if target < 0 or target > p.high_watermark:
                        raise OffsetOutOfRange(f"offset {part.offset} is not in [0, high watermark "
                                               f"{p.high_watermark}] (-1 = high watermark)")
                except LowtideError as exc:
                    results.append(DeleteRecordsPartitionResult(partition_index=part.partition_index, **_failed(exc)))
                    continue
                if target > lso:
                    records.append(RecordsDeleted(topic.topic_id, part.partition_index, target, now))
                    lso_after[where] = lso = target
                results.append(DeleteRecordsPartitionResult(partition_index=part.partition_index, low_watermark=lso))
            topics.append(DeleteRecordsTopicResult(topic_id=topic.topic_id, partitions=results))
        return self._decide(DeleteRecordsResponse(topics=topics), records)

    # ---- file lifetime -----------------------------------------------------------------------
    def hand_over_file(self, *, object_key: str, owner_ids: tuple[int, ...],
                       to_owner_index: int) -> Decision[None]:
        """Record that owner ``to_owner_index`` now owns the file: on the receiving shard when the
        previous owner hands it over, and on the giving shard once the receiver has it."""
        check_key(object_key)
        if self.coordinator_id not in owner_ids or not 0 <= to_owner_index < len(owner_ids):
            raise InvalidRequest(f"owner index {to_owner_index} of {list(owner_ids)} (coordinator "
                                 f"{self.coordinator_id})")
        return self._decide(None, [FileHandedOver(object_key, tuple(owner_ids), to_owner_index, self.clock())])

    def file_deleted(self, *, object_key: str) -> Decision[None]:
        """Record that the object of a deletable file is gone, so its row goes too."""
        row = self.state.file(object_key)
        if row is None or row.state != "deletable":
            raise InvalidRequest(f"file {object_key} is not deletable on coordinator {self.coordinator_id}")
        return self._decide(None, [FileDeleted(object_key)])

    # ---- reads ---------------------------------------------------------------------------------
    def list_offsets(self, request: ListOffsetsRequest) -> ListOffsetsResponse:
        """Offsets by timestamp from the committed state (call once preceding records are applied)."""
        topics = []
        for topic in request.topics:
            results = []
            for part in topic.partitions:
                p = self.state.partition(topic.topic_id, part.partition_index)
                ts = part.timestamp
                if p is None:
                    error: LowtideError = UnknownTopicOrPartition(f"partition {part.partition_index} is not on "
                                                                  f"coordinator {self.coordinator_id}")
                    results.append(ListOffsetsPartitionResponse(partition_index=part.partition_index, **_failed(error)))
                    continue
                if ts == LATEST_TIMESTAMP:
                    found = (-1, txn.last_stable_offset(self.state.db, p.partition_key, p.high_watermark)
                             if request.isolation_level == READ_COMMITTED
                             else p.high_watermark)
                elif ts in (EARLIEST_TIMESTAMP, EARLIEST_LOCAL_TIMESTAMP):
                    found = (-1, p.log_start_offset)
                elif ts == MAX_TIMESTAMP:
                    found = (p.max_timestamp, p.max_timestamp_offset) if p.max_timestamp_offset >= 0 else (-1, -1)
                elif ts >= 0:
                    found = self.state.offset_for_timestamp(p, ts) or (-1, -1)
                else:
                    error = InvalidRequest(f"timestamp {ts}: use -1, -2, -3, -4 or a time >= 0")
                    results.append(ListOffsetsPartitionResponse(partition_index=part.partition_index, **_failed(error)))
                    continue
                results.append(ListOffsetsPartitionResponse(partition_index=part.partition_index, timestamp=found[0],
                                                            offset=found[1]))
            topics.append(ListOffsetsTopicResponse(topic_id=topic.topic_id, partitions=results))
        return ListOffsetsResponse(topics=topics)

    def find_batches(self, request: FindBatchesRequest) -> FindBatchesResponse:
        """Batches from each requested offset on, within the byte budgets (committed state)."""
        if request.fetch_max_bytes <= 0 or request.max_batches_per_partition <= 0:
            raise InvalidRequest(f"fetch_max_bytes {request.fetch_max_bytes} and max_batches_per_partition "
                                 f"{request.max_batches_per_partition} must be > 0")
        remaining = request.fetch_max_bytes
        first_returned = False
        committed = request.isolation_level == READ_COMMITTED
        topics = []
        for topic in request.topics:
            results = []
            for part in topic.partitions:
                index = part.partition_index
                p = self.state.partition(topic.topic_id, index)
                if p is None:
                    results.append(FindBatchesPartitionResponse(
                        partition_index=index, error_code=UnknownTopicOrPartition.code))
                    continue
                # READ_COMMITTED stops at the LSO (one more indexed read: only those fetches pay it).
                end = txn.last_stable_offset(self.state.db, p.partition_key, p.high_watermark) if committed \
                    else p.high_watermark
                known = {"partition_index": index, "log_start_offset": p.log_start_offset,
                         "high_watermark": p.high_watermark, "last_stable_offset": end if committed else -1}
                if part.max_partition_fetch_bytes <= 0:
                    results.append(FindBatchesPartitionResponse(error_code=InvalidFetchSize.code, **known))
                    continue
                if part.offset < p.log_start_offset or part.offset > p.high_watermark:
                    results.append(FindBatchesPartitionResponse(error_code=OffsetOutOfRange.code, **known))
                    continue
                if part.offset >= end or (remaining <= 0 and first_returned):
                    results.append(FindBatchesPartitionResponse(**known))
                    continue
                batches, size = self.state.find_batches(
                    p.partition_key, part.offset, max_batches=request.max_batches_per_partition,
                    max_bytes=min(part.max_partition_fetch_bytes, remaining), always_first=not first_returned,
                    below=end)
                remaining -= size
                first_returned = first_returned or bool(batches)
                aborted = txn.aborted_between(self.state.db, p.partition_key, part.offset,
                                              batches[-1].last_offset + 1) if committed and batches else []
                results.append(FindBatchesPartitionResponse(batches=batches, aborted_transactions=aborted, **known))
            topics.append(FindBatchesTopicResponse(topic_id=topic.topic_id, partitions=results))
        return FindBatchesResponse(topics=topics)

    def describe_files(self, request: DescribeFilesRequest) -> DescribeFilesResponse:
        """Whether this shard has live batches in each file (a pending commit counts as live)."""
        results = []
        for key in request.object_keys:
            try:
                check_key(key)
            except LowtideError as exc:
                results.append(DescribeFileResult(object_key=key, **_failed(exc)))
                continue
            row = self.state.file(key)
            pending = self.pending.file_pending(key)
            live = pending or (row is not None and row.live_batches > 0)
            results.append(DescribeFileResult(object_key=key, has_live_batches=live,
                                              known=pending or row is not None))
        oldest = self.state.oldest_file_created_ms()
        return DescribeFilesResponse(files=results, oldest_file_created_at_ms=-1 if oldest is None else oldest)
