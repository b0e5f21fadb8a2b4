"""Conditional appends by a writer id whose producer epoch is a diskless coordinator's epoch (one
per leadership, docs/design/diskless.md#fencing-by-epoch): an older epoch is fenced whatever the
offset, a newer one opens a new term bound by the offset alone."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidProducerEpoch, OutOfOrderSequenceNumber
from lowtide.record import encode_batch

WRITER, OTHER = 7001, 7002


def batch(value: bytes, *, producer_id: int = WRITER, epoch: int) -> bytes:
    return encode_batch([value], timestamp_ms=1_000, producer_id=producer_id, producer_epoch=epoch)


def test_a_newer_epoch_of_the_writer_opens_a_term_after_another_writers_batch(log):
    log.append_as_leader(batch(b"a", epoch=1), leader_epoch=0, expected_end_offset=0)
    log.append_as_leader(batch(b"x", producer_id=OTHER, epoch=0), leader_epoch=0, expected_end_offset=1)
    # The same epoch may not go on after the other writer's batch ...
    with pytest.raises(OutOfOrderSequenceNumber, match="another writer appended after it"):
        log.append_as_leader(batch(b"b", epoch=1), leader_epoch=0, expected_end_offset=2)
    # ... a new term (the next leadership's epoch) may, at the log's end.
    assert log.append_as_leader(batch(b"c", epoch=2), leader_epoch=0, expected_end_offset=2).base_offset == 2


@pytest.mark.parametrize("expected", [2, 1, 7])
def test_an_older_epoch_is_fenced_at_any_offset_and_stores_nothing(log, expected):
    log.append_as_leader(batch(b"a", epoch=1), leader_epoch=0, expected_end_offset=0)
    log.append_as_leader(batch(b"b", epoch=2), leader_epoch=0, expected_end_offset=1)
    with pytest.raises(InvalidProducerEpoch, match="epoch 1, below its current epoch 2"):
        log.append_as_leader(batch(b"z", epoch=1), leader_epoch=0, expected_end_offset=expected)
    assert log.log_end_offset == 2
