"""The per-batch uses of the record walker: the C module ``_validate``, or the pure-Python twins.

The leader validates every record of a produced batch (docs/design/invariants.md, rule 5;
Kafka's LogValidator) without a per-record Python loop on the produce path
(docs/testing.md#targets), so the walk is C: ``_walk.h``, entered through ``_validate.c`` (built
by ``pip install -e .``). Two entry points: ``walk_records`` (validation: None or a problem) and
``record_fields`` (each record's field positions, for ``decode_batch`` and the cleaner's
``rewrite_batch``). When the build failed (no compiler or Python headers) they are
``walk_records_py`` / ``record_fields_py`` below, both on the one Python walker
(``walk.iter_records``), with the same rules, results and messages, and one warning is logged at
import. Tests run both on the same inputs and compare.

Input: the records of one batch, after decompression (what follows the 61-byte header)::

    Records => Record x RecordCount, back to back, nothing after the last one

    Record =>                                       checked
      Length            => Varint   (int32)         >= 0, record ends inside the body
      Attributes        => Int8                     present (value unused)
      TimestampDelta    => Varlong  (int64)         well formed
      OffsetDelta       => Varint                   == record index (see below)
      KeyLength         => Varint   (-1 = null)     >= -1, key inside the record
      Key               => Bytes
      ValueLength       => Varint   (-1 = null)     >= -1, value inside the record
      Value             => Bytes
      HeaderCount       => Varint                   >= 0
      Headers           => Header x HeaderCount
        HeaderKeyLength   => Varint                 >= 0 (a header key is never null)
        HeaderKey         => Bytes (UTF-8)
        HeaderValueLength => Varint  (-1 = null)    >= -1
        HeaderValue       => Bytes
      (the fields end exactly Length bytes after the Length varint)

    Varint = zig-zag, 7 bits per byte, low group first, high bit = more bytes follow; an int32
    takes at most 5 bytes (the 5th holds 4 bits), an int64 at most 10 (the 10th holds 1 bit).

Offset deltas: when RecordCount == LastOffsetDelta + 1 (every produced batch) record i must have
delta i; otherwise (a compacted batch) deltas rise strictly and stay <= LastOffsetDelta.

``walk_records`` result: None, or (code, message) with Kafka's code: 2 CORRUPT_MESSAGE when the body cannot be cut
into the declared records (a length runs past the end, bytes left over, fewer records), 87
INVALID_RECORD when one record is inconsistent inside (Kafka's InvalidRecordException cases).

``record_fields`` result: one ``walk.RecordFields`` tuple per record (byte positions and field values;
offset deltas in any order); a body the walk refuses raises ValueError(code, message).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from lowtide.record.walk import CORRUPT_MESSAGE, INVALID_RECORD, RecordFields, WalkError, iter_records

__all__ = ["CORRUPT_MESSAGE", "INVALID_RECORD", "WALKER", "record_fields", "record_fields_py", "walk_records",
           "walk_records_py"]

WalkResult = tuple[int, str] | None
Walker = Callable[[bytes | bytearray | memoryview, int, int], WalkResult]
FieldsWalker = Callable[[bytes | bytearray | memoryview, int], list[RecordFields]]

log = logging.getLogger(__name__)


def walk_records_py(buffer: bytes | bytearray | memoryview, expected_count: int, last_offset_delta: int) -> WalkResult:
    """Pure-Python twin of ``_validate.walk_records`` (only used when the C module is missing)."""
    try:
        for _ in iter_records(bytes(buffer), expected_count, last_offset_delta=last_offset_delta):
            pass
    except WalkError as exc:
        return exc.code, exc.message
    return None


def record_fields_py(buffer: bytes | bytearray | memoryview, expected_count: int) -> list[RecordFields]:
    """Pure-Python twin of ``_validate.record_fields`` (only used when the C module is missing)."""
    try:
        return list(iter_records(bytes(buffer), expected_count))
    except WalkError as exc:
        raise ValueError(exc.code, exc.message) from None


walk_records_c: Walker | None
record_fields_c: FieldsWalker | None
try:
    from lowtide.record._validate import record_fields as record_fields_c
    from lowtide.record._validate import walk_records as walk_records_c
except ImportError as exc:  # the optional C build failed: slower, same answers
    walk_records_c = record_fields_c = None
    log.warning(
        "lowtide.record._validate (C record walker) is not built (%s); validating and parsing records in "
        "pure Python, which is much slower. Install gcc and the Python headers, then rerun "
        "'pip install -e .' (make setup).",
        exc,
    )

walk_records: Walker = walk_records_c if walk_records_c is not None else walk_records_py
record_fields: FieldsWalker = record_fields_c if record_fields_c is not None else record_fields_py
WALKER = "c" if walk_records_c is not None else "python"
