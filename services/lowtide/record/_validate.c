/*
 * lowtide.record._validate: the per-record walk of a RecordBatch v2 body, in C.
 *
 * The leader must check every record of a produced batch (docs/design/invariants.md, rule 5) but the produce path
 * may not loop per record in Python (docs/testing.md#targets), so the walk lives here. The Python twin
 * is lowtide.record.validate.walk_records_py: same rules, same return values, same messages, used
 * only when this module failed to build; tests run both on the same inputs and compare.
 *
 * Input: the records of one batch (after decompression), i.e. what follows the 61-byte header:
 *
 *     Records => Record x RecordCount, back to back, nothing after the last one
 *
 *     Record =>                                       checked here
 *       Length            => Varint   (int32)         >= 0, record ends inside the body
 *       Attributes        => Int8                     present (value unused)
 *       TimestampDelta    => Varlong  (int64)         well formed
 *       OffsetDelta       => Varint                   == record index (see "offset deltas")
 *       KeyLength         => Varint   (-1 = null)     >= -1, key inside the record
 *       Key               => Bytes
 *       ValueLength       => Varint   (-1 = null)     >= -1, value inside the record
 *       Value             => Bytes
 *       HeaderCount       => Varint                   >= 0
 *       Headers           => Header x HeaderCount
 *         HeaderKeyLength   => Varint                 >= 0 (a header key is never null)
 *         HeaderKey         => Bytes (UTF-8)
 *         HeaderValueLength => Varint  (-1 = null)    >= -1
 *         HeaderValue       => Bytes
 *       (the fields end exactly Length bytes after the Length varint)
 *
 *     Varint  = zig-zag, 7 bits per byte, low group first, high bit = more bytes follow;
 *               an int32 takes at most 5 bytes (the 5th holds 4 bits), an int64 at most 10 (the
 *               10th holds 1 bit). Anything longer or wider is malformed, as in Kafka's ByteUtils.
 *
 * Offset deltas: when RecordCount == LastOffsetDelta + 1 (every produced batch) record i must have
 * delta i. Otherwise (a compacted batch) deltas must rise strictly and stay <= LastOffsetDelta.
 *
 * walk_records(buffer, expected_count, last_offset_delta) -> None | (code, message)
 *   None when the body holds exactly expected_count well-formed records; else Kafka's error code
 *   (2 CORRUPT_MESSAGE: the body cannot be cut into the declared records; 87 INVALID_RECORD: one
 *   record is inconsistent inside) and a message naming the record and its byte position.
 *   Any contiguous buffer is accepted ("y*"). The walk stops after expected_count records, so its
 *   cost is bounded by the header's count even when the body is large.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include "_varint.h" /* read_varint, VARINT_OK / _TRUNCATED / _MALFORMED */
#include <stdio.h>

#define CORRUPT_MESSAGE 2
#define INVALID_RECORD 87

/* Releasing the GIL costs a reacquire that can wait out another thread's switch interval (5 ms),
 * far more than walking a few records. Only batches with this many records (tens of microseconds
 * of walking) release it. */
#define GIL_RELEASE_MIN_RECORDS 2048

typedef struct {
    int code; /* 0 = valid */
    char message[200];
} walk_result;

#define FAIL(CODE, ...)                                                                         \
    do {                                                                                        \
        res->code = (CODE);                                                                     \
        snprintf(res->message, sizeof res->message, __VA_ARGS__);                              \
        return;                                                                                 \
    } while (0)

/* A varint field inside record `index`: errors are per-record (INVALID_RECORD). */
#define FIELD_VARINT(NAME, MAX, BITS, OUT)                                                      \
    do {                                                                                        \
        int st_ = read_varint(buf, rec_end, &pos, (MAX), (BITS), &(OUT));                      \
        if (st_ == VARINT_TRUNCATED)                                                            \
            FAIL(INVALID_RECORD, "record %lld at byte %zd: %s runs past the record's length %lld", \
                 index, start, (NAME), (long long)length);                                      \
        if (st_ == VARINT_MALFORMED)                                                            \
            FAIL(INVALID_RECORD, "record %lld at byte %zd: %s is not a valid varint", index,     \
                 start, (NAME));                                                                \
    } while (0)

/* Skip `LEN` bytes of field NAME (negative = null, nothing to skip). */
#define FIELD_BYTES(NAME, LEN)                                                                  \
    do {                                                                                        \
        if ((LEN) > 0) {                                                                        \
            if ((LEN) > rec_end - pos)                                                          \
                FAIL(INVALID_RECORD, "record %lld at byte %zd: %s runs past the record's length %lld", \
                     index, start, (NAME), (long long)length);                                  \
            pos += (Py_ssize_t)(LEN);                                                           \
        }                                                                                       \
    } while (0)

static void
walk(const unsigned char *buf, Py_ssize_t n, long long expected, long long last_offset_delta,
     walk_result *res)
{
    const int consecutive = expected == last_offset_delta + 1;
    Py_ssize_t pos = 0;
    long long index = 0;
    int64_t prev_delta = -1;
    res->code = 0;
    while (pos < n) {
        if (index >= expected)
            FAIL(CORRUPT_MESSAGE, "%zd bytes at byte %zd after the %lld records the batch declares",
                 n - pos, pos, expected);
        const Py_ssize_t start = pos;
        int64_t length, value, delta, count;
        int st = read_varint(buf, n, &pos, 5, 4, &length);
        if (st == VARINT_TRUNCATED)
            FAIL(CORRUPT_MESSAGE, "record %lld at byte %zd: its length runs past the end of the records",
                 index, start);
        if (st == VARINT_MALFORMED)
            FAIL(CORRUPT_MESSAGE, "record %lld at byte %zd: its length is not a valid varint", index,
                 start);
        if (length < 0)
            FAIL(CORRUPT_MESSAGE, "record %lld at byte %zd: negative length %lld", index, start,
                 (long long)length);
        if (length > n - pos)
            FAIL(CORRUPT_MESSAGE,
                 "record %lld at byte %zd: length %lld runs past the end of the records (%zd bytes left)",
                 index, start, (long long)length, n - pos);
        const Py_ssize_t body_start = pos, rec_end = pos + (Py_ssize_t)length;

        if (pos >= rec_end)
            FAIL(INVALID_RECORD, "record %lld at byte %zd: %s runs past the record's length %lld", index,
                 start, "attributes", (long long)length);
        pos++; /* attributes: unused by RecordBatch v2 */
        FIELD_VARINT("timestamp delta", 10, 1, value);
        FIELD_VARINT("offset delta", 5, 4, delta);
        if (consecutive) {
            if (delta != index)
                FAIL(INVALID_RECORD, "record %lld at byte %zd: offset delta %lld, expected %lld", index,
                     start, (long long)delta, index);
        } else if (delta <= prev_delta || delta > last_offset_delta) {
            FAIL(INVALID_RECORD,
                 "record %lld at byte %zd: offset delta %lld is not above %lld or is past the last "
                 "offset delta %lld",
                 index, start, (long long)delta, (long long)prev_delta, last_offset_delta);
        }
        prev_delta = delta;
        FIELD_VARINT("key length", 5, 4, value);
        if (value < -1)
            FAIL(INVALID_RECORD, "record %lld at byte %zd: invalid %s %lld", index, start, "key length",
                 (long long)value);
        FIELD_BYTES("key", value);
        FIELD_VARINT("value length", 5, 4, value);
        if (value < -1)
            FAIL(INVALID_RECORD, "record %lld at byte %zd: invalid %s %lld", index, start,
                 "value length", (long long)value);
        FIELD_BYTES("value", value);
        FIELD_VARINT("header count", 5, 4, count);
        if (count < 0)
            FAIL(INVALID_RECORD, "record %lld at byte %zd: invalid %s %lld", index, start,
                 "header count", (long long)count);
        /* Each header takes at least 2 bytes, so a huge count ends at the record's end. */
        for (int64_t h = 0; h < count; h++) {
            FIELD_VARINT("header key length", 5, 4, value);
            if (value < 0)
                FAIL(INVALID_RECORD, "record %lld at byte %zd: invalid %s %lld", index, start,
                     "header key length", (long long)value);
            FIELD_BYTES("header key", value);
            FIELD_VARINT("header value length", 5, 4, value);
            if (value < -1)
                FAIL(INVALID_RECORD, "record %lld at byte %zd: invalid %s %lld", index, start,
                     "header value length", (long long)value);
            FIELD_BYTES("header value", value);
        }
        if (pos != rec_end)
            FAIL(INVALID_RECORD, "record %lld at byte %zd: its fields take %zd of its length %lld bytes",
                 index, start, pos - body_start, (long long)length);
        index++;
    }
    if (index != expected)
        FAIL(CORRUPT_MESSAGE, "the batch declares %lld records but its records hold %lld", expected,
             index);
}

static PyObject *
walk_records(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    long long expected, last_offset_delta;
    walk_result res;
    if (!PyArg_ParseTuple(args, "y*LL:walk_records", &view, &expected, &last_offset_delta))
        return NULL;
    if (expected >= GIL_RELEASE_MIN_RECORDS) {
        /* The exported buffer stays pinned (a bytearray cannot resize while exported). */
        Py_BEGIN_ALLOW_THREADS
        walk((const unsigned char *)view.buf, view.len, expected, last_offset_delta, &res);
        Py_END_ALLOW_THREADS
    } else {
        walk((const unsigned char *)view.buf, view.len, expected, last_offset_delta, &res);
    }
    PyBuffer_Release(&view);
    if (res.code == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(is)", res.code, res.message);
}

static PyMethodDef methods[] = {
    {"walk_records", walk_records, METH_VARARGS,
     "walk_records(buffer, expected_count, last_offset_delta) -> None | (code, message)\n\n"
     "Walk the records of one RecordBatch v2 body; None when they are exactly expected_count\n"
     "well-formed records, else (2 CORRUPT_MESSAGE | 87 INVALID_RECORD, what is wrong)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "lowtide.record._validate",
    "Per-record walk of RecordBatch v2 bodies (see lowtide.record.validate).",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__validate(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "CORRUPT_MESSAGE", CORRUPT_MESSAGE) < 0 ||
        PyModule_AddIntConstant(m, "INVALID_RECORD", INVALID_RECORD) < 0 ||
        PyModule_AddIntConstant(m, "GIL_RELEASE_MIN_RECORDS", GIL_RELEASE_MIN_RECORDS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
