"""Conditional appends (replica.proto ``expected_log_end_offset``) at the partition log: the
condition on the log end and on the writer's last batch, and that a refusal stores nothing."""

from __future__ import annotations

import pytest

from lowtide.errors import OutOfOrderSequenceNumber
from lowtide.log.partition_log import PartitionLog
from lowtide.record import decode_batches, encode_batch

WRITER, OTHER = 7001, 7002


def batch(values: list[bytes], producer_id: int = WRITER) -> bytes:
    return encode_batch(values, timestamp_ms=1_000, producer_id=producer_id, producer_epoch=0)


def values(log: PartitionLog) -> list[bytes]:
    data = log.read(0, max_bytes=1 << 20, max_offset=log.log_end_offset)
    return [r.value for _, records in decode_batches(data) for r in records]


def test_an_append_expecting_the_current_log_end_is_appended_there(log):
    assert log.append_as_leader(batch([b"a", b"b"]), leader_epoch=0, expected_end_offset=0).base_offset == 0
    assert log.append_as_leader(batch([b"c"]), leader_epoch=0, expected_end_offset=2).base_offset == 2
    assert log.log_end_offset == 3


def test_an_append_expecting_another_log_end_is_refused_and_stores_nothing(log):
    log.append_as_leader(batch([b"a"]), leader_epoch=0, expected_end_offset=0)
    for wrong in (0, 2, 100):
        with pytest.raises(OutOfOrderSequenceNumber, match=f"ends at offset 1, not at {wrong}"):
            log.append_as_leader(batch([b"x"]), leader_epoch=0, expected_end_offset=wrong)
    assert log.log_end_offset == 1
    assert values(log) == [b"a"]


def test_a_writer_whose_last_batch_is_no_longer_the_logs_last_is_refused_even_at_the_right_offset(log):
    # Two writers raced for offset 0 with one record each; OTHER won. WRITER's next append was
    # sent expecting offset 1 (after its own, lost, batch): the offset matches, the writer does not.
    log.append_as_leader(batch([b"writer"]), leader_epoch=0, expected_end_offset=0)
    log.append_as_leader(batch([b"other"], OTHER), leader_epoch=0, expected_end_offset=1)
    with pytest.raises(OutOfOrderSequenceNumber, match=f"last batch of producer {WRITER} ends at offset 0"):
        log.append_as_leader(batch([b"next"]), leader_epoch=0, expected_end_offset=2)
    assert values(log) == [b"writer", b"other"]


def test_a_writer_new_to_the_log_needs_only_the_offset_and_an_unconditional_append_needs_nothing(log):
    log.append_as_leader(batch([b"old"], OTHER), leader_epoch=0)
    assert log.append_as_leader(batch([b"new"]), leader_epoch=0, expected_end_offset=1).base_offset == 1
    assert log.append_as_leader(batch([b"any"], OTHER), leader_epoch=0).base_offset == 2
    assert values(log) == [b"old", b"new", b"any"]
