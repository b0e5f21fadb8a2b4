"""DisklessCoordinatorClient's CommitFile rows: the packed request bytes it sends, byte for byte."""

from __future__ import annotations

from lowtide.client.diskless import pack_batch_fields
from lowtide.messages.commit_wire import PACKED_BATCH, pack_batches
from lowtide.messages.coordinator import BatchToCommit

TOPIC = bytes(range(16))


def test_a_files_batches_pack_as_magic_2_their_index_and_their_fields_in_protobuf_order() -> None:
    batches = [BatchToCommit(topic_id=TOPIC, partition=3, byte_offset=4096, size=512, base_offset=0, last_offset=9,
                             max_timestamp=1_700_000_000_123, timestamp_type=1, producer_id=42, producer_epoch=5,
                             base_sequence=100, last_sequence=109),
               BatchToCommit(topic_id=TOPIC, partition=0, byte_offset=0, size=1, base_offset=0, last_offset=0,
                             max_timestamp=-1, timestamp_type=0)]
    packed = pack_batch_fields(batches)
    assert packed == pack_batches([(2, 0, TOPIC, 3, 4096, 512, 0, 9, 1_700_000_000_123, 1, 42, 5, 100, 109),
                                   (2, 1, TOPIC, 0, 0, 1, 0, 0, -1, 0, -1, -1, -1, -1)])
    assert packed[:5] == b"\x02\x00\x00\x00\x00" and len(packed) == 2 * PACKED_BATCH.size
    assert pack_batch_fields([]) == b""


def test_a_batch_whose_field_does_not_fit_the_packed_form_is_refused_before_sending() -> None:
    import pytest

    from lowtide.errors import InvalidRequest
    with pytest.raises(InvalidRequest):
        pack_batch_fields([BatchToCommit(topic_id=TOPIC, partition=0, byte_offset=0, size=1, base_offset=0,
                                         last_offset=0, max_timestamp=0, timestamp_type=300)])
