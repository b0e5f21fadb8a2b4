"""The record walker: byte-exact cases on hand-written bodies, C and pure Python compared.

Each case is the records part of a batch (what follows the 61-byte header) written out byte by
byte, with the exact (code, message) both walkers must return. A seeded mutation run then checks
that the two walkers agree on thousands of damaged bodies.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import sys

import pytest

from lowtide.record import encode_batch
from lowtide.record.batch import BATCH_HEADER_SIZE
from lowtide.record.validate import CORRUPT_MESSAGE, INVALID_RECORD, walk_records_c, walk_records_py

C_MISSING = "lowtide.record._validate is not built (needs gcc and Python headers; rerun pip install -e .)"


def require_c_walker() -> None:
    """Skip without the C walker, except in CI, which installs a compiler and must build it."""
    if walk_records_c is None:
        if os.environ.get("CI") == "true":
            pytest.fail(C_MISSING)
        pytest.skip(C_MISSING)


@pytest.fixture(params=["c", "python"])
def walk(request):
    if request.param == "c":
        require_c_walker()
        return walk_records_c
    return walk_records_py


# One record: length 7 | attributes 0 | timestamp delta 0 | offset delta 0 | key length -1 (null) |
# value length 1 | value "a" | header count 0.
REC0 = "0e" "00" "00" "00" "01" "02" "61" "00"
REC1 = "0e" "00" "00" "02" "01" "02" "62" "00"  # the same with offset delta 1, value "b"

CASES = [
    # (id, records hex, expected count, last offset delta, result)
    ("one record", REC0, 1, 0, None),
    ("two records", REC0 + REC1, 2, 1, None),
    ("no records in a compacted batch", "", 0, 4, None),
    (
        "record with a header",  # header "h" -> null value
        "12" "00" "00" "00" "01" "01" "02" "02" "68" "01",
        1, 0, None,
    ),
    (
        "timestamp delta of 10 bytes",  # -2**63: the widest varlong
        "1e" "00" "ffffffffffffffffff01" "00" "01" "01" "00",
        1, 0, None,
    ),
    (
        "compacted offset deltas 3 and 7 of 0..9",
        "0e00000601026100" "0e00000e01026200",
        2, 9, None,
    ),
    (
        "offset deltas 0 and 2",
        REC0 + "0e" "00" "00" "04" "01" "02" "62" "00",
        2, 1, (INVALID_RECORD, "record 1 at byte 8: offset delta 2, expected 1"),
    ),
    (
        "first offset delta 1",
        "0e" "00" "00" "02" "01" "02" "61" "00",
        1, 0, (INVALID_RECORD, "record 0 at byte 0: offset delta 1, expected 0"),
    ),
    (
        "compacted offset deltas that do not rise",
        "0e00000601026100" "0e00000601026200",
        2, 9, (INVALID_RECORD, "record 1 at byte 8: offset delta 3 is not above 3 or is past the last offset delta 9"),
    ),
    (
        "compacted offset delta past the last offset delta",
        "0e00001401026100",
        1, 9,
        (INVALID_RECORD, "record 0 at byte 0: offset delta 10 is not above -1 or is past the last offset delta 9"),
    ),
    (
        "2**31-1 records declared, one present",
        REC0, 2**31 - 1, 2**31 - 2,
        (CORRUPT_MESSAGE, "the batch declares 2147483647 records but its records hold 1"),
    ),
    (
        "one record more declared than present",
        REC0 + REC1, 3, 2, (CORRUPT_MESSAGE, "the batch declares 3 records but its records hold 2"),
    ),
    (
        "one record fewer declared than present",
        REC0 + REC1, 1, 0, (CORRUPT_MESSAGE, "8 bytes at byte 8 after the 1 records the batch declares"),
    ),
    (
        "no records where one is declared",
        "", 1, 0, (CORRUPT_MESSAGE, "the batch declares 1 records but its records hold 0"),
    ),
    (
        "trailing garbage",
        REC0 + "0000", 1, 0, (CORRUPT_MESSAGE, "2 bytes at byte 8 after the 1 records the batch declares"),
    ),
    (
        "length running past the end of the records",
        "10" "00" "00" "00" "01" "02" "61" "00",  # length 8, 7 bytes follow
        1, 0, (CORRUPT_MESSAGE, "record 0 at byte 0: length 8 runs past the end of the records (7 bytes left)"),
    ),
    (
        "length varint cut off",
        "80", 1, 0, (CORRUPT_MESSAGE, "record 0 at byte 0: its length runs past the end of the records"),
    ),
    (
        "length varint of 6 bytes",
        "808080808000", 1, 0, (CORRUPT_MESSAGE, "record 0 at byte 0: its length is not a valid varint"),
    ),
    (
        "length varint wider than 32 bits",
        "8080808010", 1, 0, (CORRUPT_MESSAGE, "record 0 at byte 0: its length is not a valid varint"),
    ),
    (
        "negative length",
        "01", 1, 0, (CORRUPT_MESSAGE, "record 0 at byte 0: negative length -1"),
    ),
    (
        "length 0: no attributes",
        "00", 1, 0, (INVALID_RECORD, "record 0 at byte 0: attributes runs past the record's length 0"),
    ),
    (
        "length shorter than the fields",
        "0c" "00" "00" "00" "01" "02" "61" "00",  # length 6: the header count is outside
        1, 0, (INVALID_RECORD, "record 0 at byte 0: header count runs past the record's length 6"),
    ),
    (
        "length longer than the fields",
        "10" "00" "00" "00" "01" "02" "61" "00" "00",  # length 8, fields take 7
        1, 0, (INVALID_RECORD, "record 0 at byte 0: its fields take 7 of its length 8 bytes"),
    ),
    (
        "key length -2",
        "0e" "00" "00" "00" "03" "02" "61" "00",
        1, 0, (INVALID_RECORD, "record 0 at byte 0: invalid key length -2"),
    ),
    (
        "key running past the record",
        "0e" "00" "00" "00" "14" "02" "61" "00",  # key length 10
        1, 0, (INVALID_RECORD, "record 0 at byte 0: key runs past the record's length 7"),
    ),
    (
        "value running past the record",
        "0e" "00" "00" "00" "01" "04" "61" "00",  # value length 2: takes the header count
        1, 0, (INVALID_RECORD, "record 0 at byte 0: header count runs past the record's length 7"),
    ),
    (
        "negative header count",
        "0c" "00" "00" "00" "01" "01" "01",
        1, 0, (INVALID_RECORD, "record 0 at byte 0: invalid header count -1"),
    ),
    (
        "null header key",
        "10" "00" "00" "00" "01" "01" "02" "01" "01",
        1, 0, (INVALID_RECORD, "record 0 at byte 0: invalid header key length -1"),
    ),
    (
        "header count beyond the record",
        "0e" "00" "00" "00" "01" "01" "fe0f",  # 1023 headers, room for none
        1, 0, (INVALID_RECORD, "record 0 at byte 0: header key length runs past the record's length 7"),
    ),
    (
        "timestamp delta wider than 64 bits",
        "1e" "00" "ffffffffffffffffff02" "00" "01" "01" "00",
        1, 0, (INVALID_RECORD, "record 0 at byte 0: timestamp delta is not a valid varint"),
    ),
    (
        "offset delta of 6 bytes",
        "14" "00" "00" "808080808000" "01" "01" "00",
        1, 0, (INVALID_RECORD, "record 0 at byte 0: offset delta is not a valid varint"),
    ),
    (
        "second record broken",
        REC0 + "0e" "00" "00" "02" "01" "03" "62" "00",  # value length -2
        2, 1, (INVALID_RECORD, "record 1 at byte 8: invalid value length -2"),
    ),
]


@pytest.mark.parametrize(("records_hex", "count", "last_delta", "result"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_walker_returns_the_exact_result_for_each_hand_written_body(walk, records_hex, count, last_delta, result):
    assert walk(bytes.fromhex(records_hex), count, last_delta) == result


def test_hand_written_one_record_body_is_what_the_encoder_writes():
    raw = encode_batch([b"a"], timestamp_ms=0)
    assert raw[BATCH_HEADER_SIZE:].hex() == REC0


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_walker_accepts_any_buffer(walk, kind):
    assert walk(kind(bytes.fromhex(REC0 + REC1)), 2, 1) is None


def test_walker_of_a_sliced_memoryview_sees_only_the_slice(walk):
    data = memoryview(bytes.fromhex("ff" + REC0 + "ff"))
    assert walk(data[1:-1], 1, 0) is None


def test_walker_of_many_records_releases_the_gil_and_still_checks_them(walk):
    # 5000 records: above GIL_RELEASE_MIN_RECORDS, so the C walker runs without the GIL.
    raw = encode_batch([b"x"] * 5000, timestamp_ms=1)
    body = raw[BATCH_HEADER_SIZE:]
    assert walk(body, 5000, 4999) is None
    assert walk(body, 5001, 5000) == (CORRUPT_MESSAGE, "the batch declares 5001 records but its records hold 5000")


def test_walker_rejects_a_non_buffer_argument():
    require_c_walker()
    with pytest.raises(TypeError):
        walk_records_c("not bytes", 1, 0)  # type: ignore[arg-type]


def _mutations(rng: random.Random, body: bytes) -> bytes:
    data = bytearray(body)
    kind = rng.randrange(4)
    if kind == 0 and data:  # flip a byte
        data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == 1 and data:  # cut the end
        del data[rng.randrange(len(data)) :]
    elif kind == 2:  # insert bytes
        pos = rng.randrange(len(data) + 1)
        data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
    else:  # delete a short run
        pos = rng.randrange(max(len(data), 1))
        del data[pos : pos + rng.randrange(1, 4)]
    return bytes(data)


def test_c_and_python_walkers_agree_on_thousands_of_damaged_bodies():
    require_c_walker()
    rng = random.Random(20240611)
    bodies = [
        encode_batch([b"v" * (i % 5) for i in range(6)], keys=[b"k", None, b"", b"key", None, b"z"],
                     timestamp_ms=[5, 1, 900, 2**40, 3, 0],
                     headers=[[("a", b"1")], [], [("b", None), ("", b"")], [], [("h" * 3, b"x" * 200)], []]
                     )[BATCH_HEADER_SIZE:],
        bytes.fromhex(REC0 + REC1),
        bytes.fromhex("1e00ffffffffffffffffff0100010100"),
    ]
    disagreements = []
    outcomes = {None: 0, CORRUPT_MESSAGE: 0, INVALID_RECORD: 0}
    for _ in range(4000):
        body = _mutations(rng, rng.choice(bodies))
        count = rng.choice([1, 2, 3, 6, 7])
        last_delta = count - 1 if rng.random() < 0.8 else count + rng.randrange(4)
        c_result = walk_records_c(body, count, last_delta)
        py_result = walk_records_py(body, count, last_delta)
        outcomes[None if c_result is None else c_result[0]] += 1
        if c_result != py_result:
            disagreements.append((body.hex(), count, last_delta, c_result, py_result))
    assert disagreements == []
    assert all(outcomes.values()), outcomes  # the run reached valid, corrupt and invalid bodies


def test_missing_c_module_selects_the_python_walker_with_one_warning(monkeypatch, caplog):
    import lowtide.record.validate as validate

    monkeypatch.setitem(sys.modules, "lowtide.record._validate", None)  # import now raises ImportError
    spec = importlib.util.spec_from_file_location("lowtide_validate_without_c", validate.__file__)
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    with caplog.at_level(logging.WARNING):
        spec.loader.exec_module(probe)
    assert probe.WALKER == "python"
    assert probe.walk_records is probe.walk_records_py
    assert probe.record_fields is probe.record_fields_py
    warnings = [r for r in caplog.records if r.name == "lowtide_validate_without_c"]
    assert len(warnings) == 1 and "pure Python" in warnings[0].getMessage()
