/*
 * lowtide.record._validate: the record walker's (_walk.h) entry points for the per-batch users:
 * the leader's validation, batch parsing (decode_batch) and the cleaner's rewrite_batch.
 *
 * The leader must check every record of a produced batch (docs/design/invariants.md, rule 5) but the
 * produce path may not loop per record in Python (docs/testing.md#targets), so the walk is C. The
 * Python twins are lowtide.record.validate.walk_records_py and record_fields_py, both on the one
 * Python walker (lowtide.record.walk.iter_records): same rules, same return values, same messages,
 * used only when this module failed to build; tests run both on the same inputs and compare.
 *
 * Input: the records of one batch (after decompression), drawn with what is checked at the top of
 * _walk.h.
 *
 * walk_records(buffer, expected_count, last_offset_delta) -> None | (code, message)
 *   None when the body holds exactly expected_count well-formed records whose offset deltas follow
 *   the rules (_walk.h, check_deltas); else Kafka's error code (2 CORRUPT_MESSAGE: the body cannot
 *   be cut into the declared records; 87 INVALID_RECORD: one record is inconsistent inside) and a
 *   message naming the record and its byte position. Any contiguous buffer is accepted ("y*").
 *
 * record_fields(buffer, expected_count) -> list of tuples, one per record:
 *     (start, body, delta_pos, end, timestamp_delta, offset_delta,
 *      key, key_len, value, value_len, headers, header_count)
 *   byte positions in the buffer and field values as in _walk.h's walk_record (lengths -1 = null;
 *   offset deltas are not checked against an order). A body the walk refuses raises
 *   ValueError(code, message) with walk_records' code and message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include "_walk.h" /* walk_records, CORRUPT_MESSAGE, INVALID_RECORD */

/* Releasing the GIL costs a reacquire that can wait out another thread's switch interval (5 ms),
 * far more than walking a few records. Only batches with this many records (tens of microseconds
 * of walking) release it. */
#define GIL_RELEASE_MIN_RECORDS 2048

static PyObject *
validate_records(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    long long expected, last_offset_delta;
    walk_error err;
    int rc;
    if (!PyArg_ParseTuple(args, "y*LL:walk_records", &view, &expected, &last_offset_delta))
        return NULL;
    /* Filled in after the parse, never by address: the compiler then knows base_offset is 0 and
     * drops the walk's overflow check, which cannot fire here. */
    const walk_batch b = {.expected = expected, .check_deltas = 1, .last_offset_delta = last_offset_delta};
    if (b.expected >= GIL_RELEASE_MIN_RECORDS) {
        /* The exported buffer stays pinned (a bytearray cannot resize while exported). */
        Py_BEGIN_ALLOW_THREADS
        rc = walk_records((const unsigned char *)view.buf, view.len, &b, NULL, NULL, NULL, &err);
        Py_END_ALLOW_THREADS
    } else {
        rc = walk_records((const unsigned char *)view.buf, view.len, &b, NULL, NULL, NULL, &err);
    }
    PyBuffer_Release(&view);
    if (rc == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(is)", err.code, err.message);
}

/* record_fields' hook: one tuple per record (needs the GIL: it builds objects). Built item by item:
 * Py_BuildValue would parse its format string for every record, a third of the cost. */
WALK_HOOK
append_fields(void *ctx, const unsigned char *Py_UNUSED(buf), const walk_record *r, walk_error *err)
{
    const long long items[12] = {r->start, r->body, r->delta_pos, r->end, r->timestamp_delta, r->offset_delta,
                                 r->key, r->key_len, r->value, r->value_len, r->headers, r->header_count};
    PyObject *row = PyTuple_New(12);
    if (row == NULL)
        goto error;
    for (int i = 0; i < 12; i++) {
        PyObject *item = PyLong_FromLongLong(items[i]);
        if (item == NULL) {
            Py_DECREF(row); /* a tuple with NULL slots deallocates fine */
            goto error;
        }
        PyTuple_SET_ITEM(row, i, item);
    }
    if (PyList_Append((PyObject *)ctx, row) < 0) {
        Py_DECREF(row);
        goto error;
    }
    Py_DECREF(row);
    return 0;
error:
    err->code = -1; /* a Python exception is set */
    return -1;
}

static PyObject *
record_fields(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    long long expected;
    walk_error err;
    if (!PyArg_ParseTuple(args, "y*L:record_fields", &view, &expected))
        return NULL;
    const walk_batch b = {.expected = expected};
    PyObject *rows = PyList_New(0);
    if (rows != NULL &&
        walk_records((const unsigned char *)view.buf, view.len, &b, append_fields, NULL, rows, &err) < 0) {
        Py_CLEAR(rows);
        PyObject *exc_args = err.code != -1 ? Py_BuildValue("(is)", err.code, err.message) : NULL;
        if (exc_args != NULL) { /* ValueError(code, message) */
            PyErr_SetObject(PyExc_ValueError, exc_args);
            Py_DECREF(exc_args);
        }
    }
    PyBuffer_Release(&view);
    return rows;
}

static PyMethodDef methods[] = {
    {"walk_records", validate_records, METH_VARARGS,
     "walk_records(buffer, expected_count, last_offset_delta) -> None | (code, message)\n\n"
     "Walk the records of one RecordBatch v2 body; None when they are exactly expected_count\n"
     "well-formed records, else (2 CORRUPT_MESSAGE | 87 INVALID_RECORD, what is wrong)."},
    {"record_fields", record_fields, METH_VARARGS,
     "record_fields(buffer, expected_count) -> list[tuple]\n\n"
     "Walk the records of one RecordBatch v2 body; per record (start, body, delta_pos, end,\n"
     "timestamp_delta, offset_delta, key, key_len, value, value_len, headers, header_count).\n"
     "ValueError(code, message) for a body walk_records refuses."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "lowtide.record._validate",
    "The record walker's per-batch entry points (see lowtide.record.validate).",
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
