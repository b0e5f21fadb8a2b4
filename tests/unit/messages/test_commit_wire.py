"""CommitFile's packed form (lowtide.messages.commit_wire): byte-exact layouts and refusals."""

from __future__ import annotations

import pytest

from lowtide.errors import InvalidRequest
from lowtide.messages.commit_wire import (
    PACKED_BATCH,
    PACKED_RESULT,
    pack_batches,
    pack_result_rows,
    pack_results,
    unpack_batches,
    unpack_results,
)

TOPIC = bytes(range(16))
BATCH_ROW = (2, 7, TOPIC, 3, 4096, 512, 0, 9, 1_700_000_000_123, 1, 42, 5, 100, 109)


def test_a_packed_batch_is_its_fields_in_protobuf_order_big_endian() -> None:
    packed = pack_batches([BATCH_ROW])
    assert packed == (
        b"\x02" + b"\x00\x00\x00\x07" + TOPIC + b"\x00\x00\x00\x03" + b"\x00\x00\x10\x00" + b"\x00\x00\x02\x00"
        + bytes(8) + b"\x00" * 7 + b"\x09" + (1_700_000_000_123).to_bytes(8, "big") + b"\x01"
        + (42).to_bytes(8, "big") + b"\x00\x05" + (100).to_bytes(4, "big") + (109).to_bytes(4, "big"))
    assert len(packed) == PACKED_BATCH.size == 76


def test_packed_batches_read_back_as_the_rows_they_were_built_from() -> None:
    rows = [BATCH_ROW, (2, 8, TOPIC, 0, 0, 1, 0, 0, -1, 0, -1, -1, -1, -1)]
    assert list(unpack_batches(pack_batches(rows))) == rows


def test_a_packed_result_is_code_offsets_and_duplicate_flag() -> None:
    packed = pack_results([(0, 10, -1, 3, True), (47, -1, -1, 0, False)])
    assert packed[:PACKED_RESULT.size] == (b"\x00\x00" + (10).to_bytes(8, "big") + b"\xff" * 8
                                           + (3).to_bytes(8, "big") + b"\x01")
    assert packed[PACKED_RESULT.size:PACKED_RESULT.size + 2] == b"\x00\x2f"
    assert list(unpack_results(packed)) == [(0, 10, -1, 3, 1), (47, -1, -1, 0, 0)]


def test_the_shards_result_rows_pack_to_the_same_bytes_without_their_messages() -> None:
    rows = [(0, None, 10, -1, 3, True), (47, "OUT_OF_ORDER", -1, -1, 0, False)]
    assert pack_result_rows(rows) == pack_results([(0, 10, -1, 3, True), (47, -1, -1, 0, False)])
    assert pack_result_rows([]) == b""


@pytest.mark.parametrize("unpack,size", [(unpack_batches, PACKED_BATCH.size), (unpack_results, PACKED_RESULT.size)])
def test_a_length_that_is_not_whole_rows_is_an_invalid_request(unpack, size) -> None:
    with pytest.raises(InvalidRequest, match=f"not a multiple of {size}"):
        unpack(bytes(size + 1))


def test_a_producer_epoch_beyond_int16_cannot_be_packed() -> None:
    with pytest.raises(InvalidRequest, match="packed form"):
        pack_batches([BATCH_ROW[:11] + (1 << 15,) + BATCH_ROW[12:]])


def test_results_without_an_error_code_are_told_apart_from_any_with_one() -> None:
    from lowtide.messages.commit_wire import no_result_errors
    ok = pack_results([(0, 10, -1, 3, True), (0, 11, 5, 3, False)])
    assert no_result_errors(ok) and no_result_errors(b"")
    for code in (1, 256, 47, -1):  # either byte of the int16, or both
        assert not no_result_errors(ok + pack_results([(code, -1, -1, 0, False)]))
        assert not no_result_errors(pack_results([(code, -1, -1, 0, False)]) + ok)
    assert not no_result_errors(ok[:-1])  # not whole rows: left to unpack_results to refuse
