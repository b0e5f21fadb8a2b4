"""Coordinator epochs in the state (docs/design/diskless.md#fencing-by-epoch): a record of an epoch
below the highest applied one is skipped, its offset still applied, on every copy alike; the
applier reads each record's epoch from its value."""

from __future__ import annotations

import uuid

from lowtide.coordinator.applier import ApplyWorker
from lowtide.coordinator.records import EpochStarted, PartitionCreated, encode_record
from lowtide.coordinator.state import CoordinatorState

TID = uuid.UUID(int=7).bytes


def _names(state: CoordinatorState) -> list[str]:
    return [row[2] for row in state.dump()["partitions"]]


def test_a_record_of_an_older_epoch_than_one_applied_is_skipped_and_its_offset_counted(tmp_path):
    state = CoordinatorState(tmp_path / "s.sqlite", coordinator_id=0)
    try:
        applied = state.apply_all([
            (EpochStarted("a", 1), 0, 1), (PartitionCreated(TID, "first", 0), 1, 1),
            (EpochStarted("b", 2), 2, 2),
            (PartitionCreated(TID, "zombie", 1), 3, 1),   # the deposed epoch-1 leader, after b opened 2
            (PartitionCreated(TID, "second", 2), 4, 2)])
        assert applied == 5
        assert (state.applied_offset, state.coordinator_epoch) == (4, 2)
        assert _names(state) == ["first", "second"]
        # Applying again changes nothing (offsets already applied), epochs or not.
        assert state.apply_all([(PartitionCreated(TID, "zombie", 1), 3, 9)]) == 0
        assert state.coordinator_epoch == 2
    finally:
        state.close()


def test_the_applier_reads_epochs_from_the_values_and_equals_a_copy_applied_from_records(tmp_path):
    log = [(EpochStarted("a", 1), 1), (PartitionCreated(TID, "first", 0), 1), (EpochStarted("b", 1), 3),
           (PartitionCreated(TID, "zombie", 1), 1), (PartitionCreated(TID, "second", 2), 3)]
    worker = ApplyWorker(CoordinatorState(tmp_path / "values.sqlite", coordinator_id=0))
    records = CoordinatorState(tmp_path / "records.sqlite", coordinator_id=0)
    try:
        worker.apply([(encode_record(r, epoch=e), o) for o, (r, e) in enumerate(log)])
        records.apply_all([(r, o, e) for o, (r, e) in enumerate(log)])
        assert _names(worker.state) == ["first", "second"]
        assert worker.state.dump() == records.dump()
    finally:
        worker.close()
        records.close()
