"""The one record walker's field positions (``record_fields``): byte-exact on hand-written bodies, and
the C walker (``_walk.h`` through ``_validate.record_fields``) against its Python twin
(``walk.iter_records``) on the same corpus, damaged bodies included; then its users, ``decode_batch``,
the cleaner's ``rewrite_batch`` and ``read_marker_type``, run through both and compared.
"""

from __future__ import annotations

import random

import pytest

import lowtide.log.cleaner.batch_filter as batch_filter
import lowtide.record.batch as batch_module
import lowtide.record.control as control
from lowtide.errors import CorruptMessage
from lowtide.log.cleaner.batch_filter import rewrite_batch
from lowtide.record import Compression, Record, decode_batch, encode_batch
from lowtide.record.batch import BATCH_HEADER_SIZE, seal_batch
from lowtide.record.control import ABORT, build_marker_batch, read_marker_type
from lowtide.record.validate import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    record_fields_c,
    record_fields_py,
    walk_records_c,
    walk_records_py,
)
from lowtide.record.walk import iter_headers
from tests.unit.record.test_walk_records import REC0, REC1, _mutations, require_c_walker


@pytest.fixture(params=["c", "python"])
def fields(request):
    if request.param == "c":
        require_c_walker()
        return record_fields_c
    return record_fields_py


@pytest.fixture(params=["c", "python"])
def walker(request, monkeypatch) -> str:
    """Run the test with every user of record_fields on the C walker, then on the Python twin."""
    chosen = record_fields_py
    if request.param == "c":
        require_c_walker()
        chosen = record_fields_c
    for module in (batch_module, batch_filter, control):
        monkeypatch.setattr(module, "record_fields", chosen)
    return request.param


def outcome(fn, *args):
    """What a call returns, or its exception as (type name, args): comparable across walkers."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - any outcome, compared across walkers
        return type(exc).__name__, exc.args


# (start, body, delta_pos, end, timestamp_delta, offset_delta, key, key_len, value, value_len,
#  headers, header_count)
REC0_FIELDS = (0, 1, 3, 8, 0, 0, 5, -1, 6, 1, 8, 0)
REC1_FIELDS = (8, 9, 11, 16, 0, 1, 13, -1, 14, 1, 16, 0)
# length 13 | attributes 0 | timestamp delta -1 | offset delta 0 | key "k" | value null |
# 2 headers: "h" -> "v", "" -> null.
WITH_HEADERS = "1a" "00" "01" "00" "02" "6b" "01" "04" "02" "68" "02" "76" "00" "01"
WITH_HEADERS_FIELDS = (0, 1, 3, 14, -1, 0, 5, 1, 7, -1, 8, 2)


@pytest.mark.parametrize(("records_hex", "count", "expected"), [
    (REC0, 1, [REC0_FIELDS]),
    (REC0 + REC1, 2, [REC0_FIELDS, REC1_FIELDS]),
    (WITH_HEADERS, 1, [WITH_HEADERS_FIELDS]),
    ("", 0, []),
    # offset deltas are not checked for order here (decode_batch and the cleaner read compacted batches)
    ("0e00000601026100" "0e00000201026200", 2, [(0, 1, 3, 8, 0, 3, 5, -1, 6, 1, 8, 0), REC1_FIELDS]),
])
def test_record_fields_are_byte_exact_on_hand_written_bodies(fields, records_hex, count, expected):
    assert fields(bytes.fromhex(records_hex), count) == expected


def test_the_headers_of_a_walked_record_read_back_without_checks():
    data = bytes.fromhex(WITH_HEADERS)
    assert list(iter_headers(data, 8, 2)) == [(9, 1, 11, 1), (13, 0, 14, -1)]


@pytest.mark.parametrize(("records_hex", "count", "code", "message"), [
    ("80", 1, CORRUPT_MESSAGE, "record 0 at byte 0: its length runs past the end of the records"),
    ("808080808000", 1, CORRUPT_MESSAGE, "record 0 at byte 0: its length is not a valid varint"),
    ("10" "00" "00" "00" "01" "02" "61" "00", 1, CORRUPT_MESSAGE,
     "record 0 at byte 0: length 8 runs past the end of the records (7 bytes left)"),
    ("04" "00" "80", 1, INVALID_RECORD, "record 0 at byte 0: timestamp delta runs past the record's length 2"),
    ("0e" "00" "00" "00" "14" "02" "61" "00", 1, INVALID_RECORD,
     "record 0 at byte 0: key runs past the record's length 7"),
    (REC0 + REC1, 3, CORRUPT_MESSAGE, "the batch declares 3 records but its records hold 2"),
    (REC0 + REC1, 1, CORRUPT_MESSAGE, "8 bytes at byte 8 after the 1 records the batch declares"),
])
def test_a_body_the_walk_refuses_raises_value_error_with_its_code_and_message(fields, records_hex, count, code,
                                                                               message):
    with pytest.raises(ValueError) as info:
        fields(bytes.fromhex(records_hex), count)
    assert info.value.args == (code, message)
    # the validation entry point says the same of the same body
    last_delta = count - 1
    assert walk_records_py(bytes.fromhex(records_hex), count, last_delta) == (code, message)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_record_fields_accepts_any_buffer(fields, kind):
    assert fields(kind(bytes.fromhex(REC0 + REC1)), 2) == [REC0_FIELDS, REC1_FIELDS]


def corpus() -> list[bytes]:
    return [
        encode_batch([b"v" * (i % 5) for i in range(6)], keys=[b"k", None, b"", b"key", None, b"z"],
                     timestamp_ms=[5, 1, 900, 2**40, 3, 0],
                     headers=[[("a", b"1")], [], [("b", None), ("", b"")], [], [("h" * 3, b"x" * 200)], []]
                     )[BATCH_HEADER_SIZE:],
        bytes.fromhex(REC0 + REC1),
        bytes.fromhex(WITH_HEADERS),
        bytes.fromhex("1e00ffffffffffffffffff0100010100"),
    ]


def test_c_and_python_record_fields_agree_on_thousands_of_damaged_bodies():
    require_c_walker()
    rng = random.Random(20261202)
    disagreements = []
    outcomes = {"ok": 0, CORRUPT_MESSAGE: 0, INVALID_RECORD: 0}
    for _ in range(4000):
        body = _mutations(rng, rng.choice(corpus()))
        count = rng.choice([1, 2, 3, 6, 7])
        c_result = outcome(record_fields_c, body, count)
        py_result = outcome(record_fields_py, body, count)
        outcomes["ok" if isinstance(c_result, list) else c_result[1][0]] += 1
        if c_result != py_result:
            disagreements.append((body.hex(), count, c_result, py_result))
        # The same walk as validation: with consecutive deltas both accept and refuse the same
        # bodies, with the same code and message unless validation stops at an offset delta first.
        refused = walk_records_c(body, count, count - 1)
        if isinstance(c_result, list):
            assert refused is None or "offset delta" in refused[1]
        elif refused is None or "offset delta" not in refused[1]:
            assert refused == c_result[1]
    assert disagreements == []
    assert all(outcomes.values()), outcomes  # the run reached valid, corrupt and invalid bodies


# ---------------------------------------------------------------------------------------------------
# The users: decode_batch, rewrite_batch, read_marker_type on both walkers.


def test_decode_batch_of_a_hand_written_batch_is_exact(walker):
    raw = seal_batch(bytes.fromhex(REC0 + REC1), record_count=2, base_timestamp=1000, max_timestamp=1000,
                     base_offset=40)
    header, records = decode_batch(raw)
    assert header.record_count == 2
    assert records == [Record(offset=40, timestamp=1000, key=None, value=b"a"),
                       Record(offset=41, timestamp=1000, key=None, value=b"b")]
    raw = seal_batch(bytes.fromhex(WITH_HEADERS), record_count=1, base_timestamp=1000, max_timestamp=999)
    assert decode_batch(raw)[1] == [Record(offset=0, timestamp=999, key=b"k", value=None,
                                           headers=(("h", b"v"), ("", None)))]


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_decode_batch_reads_back_what_was_encoded(walker, compression):
    keys = [b"k%d" % i if i % 3 else None for i in range(50)]
    values = [b"v" * i if i % 7 else None for i in range(50)]
    headers = [[("h", b"x"), ("n", None)] if i % 5 == 0 else [] for i in range(50)]
    raw = encode_batch(values, keys=keys, headers=headers, timestamp_ms=[1_700_000_000_000 + i for i in range(50)],
                       compression=compression, base_offset=7)
    _, records = decode_batch(raw)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records] == [
        (7 + i, 1_700_000_000_000 + i, keys[i], values[i], tuple(headers[i])) for i in range(50)]


def test_decode_batch_refuses_a_damaged_body_with_the_walks_message(walker):
    raw = seal_batch(bytes.fromhex(REC0 + "0e" "00" "00" "02" "01" "03" "62" "00"), record_count=2,
                     base_timestamp=0, max_timestamp=0, base_offset=9)
    with pytest.raises(CorruptMessage, match=r"^batch at offset 9: record 1 at byte 8: invalid value length -2$"):
        decode_batch(raw)


def rewrite(raw: bytes, keep: list[bool]) -> bytes | None:
    return rewrite_batch(raw, keep, delete_horizon_ms=5000)


def test_decode_batch_and_rewrite_batch_agree_between_walkers_on_damaged_batches(monkeypatch):
    require_c_walker()
    rng = random.Random(47)
    disagreements = []
    for _ in range(1500):
        body = _mutations(rng, rng.choice(corpus()))
        count = rng.choice([1, 2, 6])
        raw = seal_batch(body, record_count=count, base_timestamp=100, max_timestamp=100, base_offset=5)
        keep = [rng.random() < 0.5 for _ in range(count)]
        results = []
        for chosen in (record_fields_c, record_fields_py):
            monkeypatch.setattr(batch_module, "record_fields", chosen)
            monkeypatch.setattr(batch_filter, "record_fields", chosen)
            results.append((outcome(decode_batch, raw), outcome(rewrite, raw, keep)))
        if results[0] != results[1]:
            disagreements.append((body.hex(), count, *results))
    assert disagreements == []


def test_rewrite_batch_refuses_a_damaged_body_with_the_walks_message(walker):
    raw = seal_batch(bytes.fromhex(REC0 + "10" "00" "00" "02" "01" "02" "62" "00"), record_count=2,
                     base_timestamp=0, max_timestamp=0, base_offset=3)
    with pytest.raises(CorruptMessage, match=r"^batch at offset 3: record 1 at byte 8: length 8 runs past the end"):
        rewrite_batch(raw, [True, False], delete_horizon_ms=None)


def test_read_marker_type_reads_the_first_records_key_through_the_walk(walker):
    assert read_marker_type(build_marker_batch(producer_id=1, producer_epoch=0, commit=False, coordinator_epoch=0,
                                               timestamp_ms=1)) == ABORT
    broken = seal_batch(bytes.fromhex("0e" "00" "00" "00" "03" "02" "61" "00"), record_count=1, base_timestamp=0,
                        max_timestamp=0, is_control=True, is_transactional=True)
    with pytest.raises(CorruptMessage, match="control batch at offset 0: record 0 at byte 0: invalid key length -2"):
        read_marker_type(broken)
