/*
 * lowtide.record._columns: RecordBatch v2 records <-> Arrow columns, per record in C.
 *
 * The Spark data source (lowtide.spark) turns fetched batches into Arrow arrays and Arrow arrays into
 * produced batches. The project rule is that hot paths handle batches as bytes and never loop per
 * record in Python, so the per-record work lives here; lowtide.record.columns does the per-batch work
 * (cutting the fetch into batches, CRC, skipping control batches, gzip) and calls this module ONCE for
 * all batches. The Python twins (columnize_py, encode_records_py, partitions_py in columns.py) follow
 * the same rules and build the same messages, character for character; they are used only when this
 * module failed to build, and tests run both on the same inputs and compare.
 *
 * Input of columnize: the records of each batch (after decompression), what follows its 61-byte
 * header. They are walked by the one record walker (_walk.h: every check below is its, in its order);
 * this module's hook (columnize_record) turns each accepted record into a row:
 *
 *     Records => Record x RecordCount, back to back, nothing after the last one
 *
 *     Record =>                                       checked here           becomes
 *       Length            => Varint   (int32)         >= 0, inside the body
 *       Attributes        => Int8                     present                (unused)
 *       TimestampDelta    => Varlong  (int64)         well formed            timestamps_us (*)
 *       OffsetDelta       => Varint                   well formed            offsets = BaseOffset + delta
 *       KeyLength         => Varint   (-1 = null)     >= -1, inside          keys (null bit clear)
 *       Key               => Bytes
 *       ValueLength       => Varint   (-1 = null)     >= -1, inside          values (null bit clear)
 *       Value             => Bytes
 *       HeaderCount       => Varint                   >= 0                   header list offsets
 *       Headers           => Header x HeaderCount
 *         HeaderKeyLength   => Varint                 >= 0 (never null)      header keys
 *         HeaderKey         => Bytes (UTF-8, passed through unchecked)
 *         HeaderValueLength => Varint  (-1 = null)    >= -1                  header values
 *         HeaderValue       => Bytes
 *       (the fields end exactly Length bytes after the Length varint)
 *
 *     Varint  = zig-zag, 7 bits per byte, low group first, high bit = more bytes follow; an int32
 *               takes at most 5 bytes (the 5th holds 4 bits), an int64 at most 10 (the 10th holds
 *               1 bit). Anything longer or wider is malformed, as in Kafka's ByteUtils.
 *
 *     (*) timestamp = BaseTimestamp + TimestampDelta (CreateTime, type 0), or the batch's
 *         MaxTimestamp for every record of a LogAppendTime batch (attributes bit 3, type 1);
 *         timestamps_us = timestamp * 1000 (Spark's TimestampType is microseconds).
 *
 * Output columns (Arrow layouts, little-endian whatever the host):
 *
 *     int64 offsets, int64 timestamps_us, int32 timestamp_types        one entry per row
 *     binary column = validity bitmap (bit i set = row i not null, LSB first; None without nulls),
 *                     null count, int32 offsets (rows + 1 entries, first 0), data (concatenated bytes)
 *     headers       = int32 list offsets (rows + 1: row i has headers [lo[i], lo[i+1])),
 *                     header keys (binary column, never null), header values (binary column)
 *
 * Only records with min_offset <= offset < max_offset become rows; every record is still checked.
 *
 * columnize(batches, min_offset, max_offset, with_headers) -> tuple
 *   batches: a sequence of (records, position, base_offset, base_timestamp, max_timestamp,
 *   log_append_time, record_count), records any contiguous buffer. Returns
 *   (rows, offsets, timestamps_us, timestamp_types, *keys, *values, headers) where a binary column is
 *   the 4 items (validity | None, null_count, offsets, data) and headers is None or
 *   (list_offsets, *header_keys, *header_values, header_count). Malformed records raise ValueError
 *   naming the batch position, the record index and its byte position inside the batch's records;
 *   more than 2**31 - 1 bytes in one binary column raise OverflowError.
 *
 * encode_records(count, values, keys) -> bytes
 *   values / keys (keys may be None) are (validity | None, offsets, data) buffers of an Arrow binary
 *   column; the offsets need not start at 0 (row i = data[offsets[i]:offsets[i + 1]]), the validity
 *   bitmap starts at bit 0. Returns the Records of a batch: record i has attributes 0, timestamp
 *   delta 0, offset delta i, its key and value (null when its validity bit is clear, or no keys) and
 *   no headers, exactly as BatchBuilder.append writes them. Bad columns raise ValueError.
 *
 * partitions_for_keys(count, keys, num_partitions) -> bytes
 *   int32 LE per row: Kafka's toPositive(murmur2(key)) % num_partitions, -1 for a null key.
 *
 * murmur2(buffer) -> int: Kafka's Utils.murmur2 (seed 0x9747b28c) as a signed 32-bit int.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdarg.h>
#include <stdint.h>
#include "_walk.h" /* walk_records, walk_fail_record */
#include <stdio.h>
#include <string.h>

/* Releasing the GIL costs a reacquire that can wait out another thread's switch interval (5 ms),
 * far more than handling a few records. Only calls with this many records (tens of microseconds of
 * work) or this many bytes to copy (about a millisecond) release it. */
#define GIL_RELEASE_MIN_RECORDS 2048
#define GIL_RELEASE_MIN_BYTES (4 << 20)

#define MAYBE_WITHOUT_GIL(RELEASE, STATEMENT)                                                   \
    do {                                                                                        \
        if (RELEASE) {                                                                          \
            Py_BEGIN_ALLOW_THREADS STATEMENT;                                                   \
            Py_END_ALLOW_THREADS                                                                \
        } else {                                                                                \
            STATEMENT;                                                                          \
        }                                                                                       \
    } while (0)

/* ---------------------------------------------------------------------------------------------- */
/* Failures are recorded while the GIL may be released and raised after it is taken back.         */

enum { FAIL_NONE = 0, FAIL_VALUE, FAIL_OVERFLOW, FAIL_MEMORY };

typedef struct {
    int kind;
    char message[320];
} failure;

static int
fail(failure *f, int kind, const char *fmt, ...)
{
    va_list ap;
    f->kind = kind;
    va_start(ap, fmt);
    vsnprintf(f->message, sizeof f->message, fmt, ap);
    va_end(ap);
    return -1;
}

static PyObject *
raise_failure(const failure *f)
{
    switch (f->kind) {
    case FAIL_OVERFLOW:
        PyErr_SetString(PyExc_OverflowError, f->message);
        break;
    case FAIL_MEMORY:
        PyErr_NoMemory();
        break;
    default:
        PyErr_SetString(PyExc_ValueError, f->message);
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* Little-endian stores and loads (compiled to plain moves on little-endian hosts).                */

static inline void
store_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static inline void
store_le64(unsigned char *p, uint64_t v)
{
    store_le32(p, (uint32_t)v);
    store_le32(p + 4, (uint32_t)(v >> 32));
}

static inline int32_t
load_le32(const unsigned char *p)
{
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* ---------------------------------------------------------------------------------------------- */
/* Growable output buffers: PyMem_Raw* (callable without the GIL), doubling capacity.             */

typedef struct {
    unsigned char *p;
    size_t len, cap;
} growbuf;

static int
grow(growbuf *b, size_t extra)
{
    size_t need = b->len + extra, cap = b->cap ? b->cap : (need > 1024 ? need : 1024);
    if (need < b->len)
        return -1;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    unsigned char *p = PyMem_RawRealloc(b->p, cap);
    if (p == NULL)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

/* always_inline: per record in columnize, where GCC's growth limits would outline it */
static inline __attribute__((always_inline)) int
put32(growbuf *b, uint32_t v)
{
    if (b->cap - b->len < 4 && grow(b, 4) < 0)
        return -1;
    store_le32(b->p + b->len, v);
    b->len += 4;
    return 0;
}

/* always_inline: per record in columnize, where GCC's growth limits would outline it */
static inline __attribute__((always_inline)) int
put64(growbuf *b, uint64_t v)
{
    if (b->cap - b->len < 8 && grow(b, 8) < 0)
        return -1;
    store_le64(b->p + b->len, v);
    b->len += 8;
    return 0;
}

static void
growbuf_free(growbuf *b)
{
    PyMem_RawFree(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static PyObject *
growbuf_bytes(const growbuf *b)
{
    return PyBytes_FromStringAndSize((const char *)b->p, (Py_ssize_t)b->len);
}

/* An Arrow binary column being built. Its data is either a growbuf or, after column_preallocate, a
 * bytes object (data_obj) as large as an upper bound of what it will hold: the bytes are then written
 * where they are returned, with no final copy, and the object is shrunk to size at the end. */
typedef struct {
    const char *name; /* for messages: "keys", "values", "header keys", "header values" */
    growbuf validity, offsets, data;
    PyObject *data_obj;
    int64_t rows, nulls;
} column;

static int
column_init(column *c, const char *name, failure *f)
{
    memset(c, 0, sizeof *c);
    c->name = name;
    if (put32(&c->offsets, 0) < 0)
        return fail(f, FAIL_MEMORY, "out of memory");
    return 0;
}

/* Back the column's data with a bytes object of `cap` bytes, which must bound what it will hold (the
 * caller passes the size of all the input records: each row is a distinct part of them). Needs the
 * GIL. Untouched pages of a large allocation cost no memory, so the bound can be generous. */
static int
column_preallocate(column *c, Py_ssize_t cap)
{
    if (cap <= 0)
        return 0;
    c->data_obj = PyBytes_FromStringAndSize(NULL, cap);
    if (c->data_obj == NULL)
        return -1;
    c->data.p = (unsigned char *)PyBytes_AS_STRING(c->data_obj);
    c->data.len = 0;
    c->data.cap = (size_t)cap;
    return 0;
}

/* Append one row: `len` bytes at `src`, or null when len < 0. */
static inline int
column_append(column *c, const unsigned char *src, int64_t len, failure *f)
{
    if ((c->rows & 7) == 0) {
        if (c->validity.cap == c->validity.len && grow(&c->validity, 1) < 0)
            return fail(f, FAIL_MEMORY, "out of memory");
        c->validity.p[c->validity.len++] = 0;
    }
    if (len < 0) {
        c->nulls++;
    } else {
        c->validity.p[c->rows >> 3] |= (unsigned char)(1u << (c->rows & 7));
        if ((uint64_t)len > (uint64_t)INT32_MAX - c->data.len)
            return fail(f, FAIL_OVERFLOW,
                        "%s hold more than 2147483647 bytes: too many for one Arrow binary column", c->name);
        if (len > 0) {
            if (c->data.cap - c->data.len < (size_t)len) {
                if (c->data_obj != NULL) /* cannot happen: the preallocation is an upper bound */
                    return fail(f, FAIL_VALUE, "%s outgrow their preallocated %zu bytes", c->name, c->data.cap);
                if (grow(&c->data, (size_t)len) < 0)
                    return fail(f, FAIL_MEMORY, "out of memory");
            }
            memcpy(c->data.p + c->data.len, src, (size_t)len);
            c->data.len += (size_t)len;
        }
    }
    if (put32(&c->offsets, (uint32_t)c->data.len) < 0)
        return fail(f, FAIL_MEMORY, "out of memory");
    c->rows++;
    return 0;
}

/* Needs the GIL (data_obj). */
static void
column_free(column *c)
{
    growbuf_free(&c->validity);
    growbuf_free(&c->offsets);
    if (c->data_obj != NULL) {
        Py_CLEAR(c->data_obj);
        c->data.p = NULL;
        c->data.len = c->data.cap = 0;
    } else {
        growbuf_free(&c->data);
    }
}

/* The column's data as a bytes object: the preallocated one shrunk to size (taken from the column),
 * or a copy of the growbuf. */
static PyObject *
column_data_bytes(column *c)
{
    if (c->data_obj == NULL)
        return growbuf_bytes(&c->data);
    PyObject *data = c->data_obj;
    c->data_obj = NULL;
    c->data.p = NULL;
    c->data.cap = 0;
    if (_PyBytes_Resize(&data, (Py_ssize_t)c->data.len) < 0) /* frees it on failure */
        return NULL;
    return data;
}

/* Set items start..start+3 of `tuple` to the column's (validity | None, null_count, offsets, data). */
static int
column_to_tuple(column *c, PyObject *tuple, Py_ssize_t start)
{
    PyObject *validity;
    if (c->nulls) {
        validity = PyBytes_FromStringAndSize((const char *)c->validity.p, (Py_ssize_t)((c->rows + 7) / 8));
        if (validity == NULL)
            return -1;
    } else {
        validity = Py_NewRef(Py_None);
    }
    PyTuple_SET_ITEM(tuple, start, validity);
    PyObject *items[3] = {PyLong_FromLongLong(c->nulls), growbuf_bytes(&c->offsets), column_data_bytes(c)};
    for (int i = 0; i < 3; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 3; j++)
                Py_XDECREF(items[j]);
            return -1;
        }
    }
    for (int i = 0; i < 3; i++)
        PyTuple_SET_ITEM(tuple, start + 1 + i, items[i]);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* Varints.                                                                                        */

static inline int
uvarint_size(uint64_t z)
{
    int n = 1;
    while (z > 0x7F) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline unsigned char *
write_varint(unsigned char *p, int64_t value)
{
    uint64_t z = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    while (z > 0x7F) {
        *p++ = (unsigned char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    *p++ = (unsigned char)z;
    return p;
}

static inline int
varint_size(int64_t value)
{
    return uvarint_size(((uint64_t)value << 1) ^ (uint64_t)(value >> 63));
}

/* ---------------------------------------------------------------------------------------------- */
/* columnize                                                                                       */

typedef struct {
    Py_buffer view;
    Py_ssize_t position;
    long long base_offset, base_timestamp, max_timestamp, count;
    int log_append_time;
} batch;

typedef struct {
    long long min_offset, max_offset;
    int with_headers;
    int64_t rows;
    growbuf offsets, timestamps, types, list_offsets;
    column keys, values, header_keys, header_values;
    failure fail;
    const batch *batch; /* the one being walked */
} columnizer;

/* The walker's record hook: a record in [min_offset, max_offset) becomes a row. Called once the walk
 * has checked the whole record. */
WALK_HOOK
columnize_record(void *ctx, const unsigned char *buf, const walk_record *r, walk_error *err)
{
    columnizer *st = (columnizer *)ctx;
    const batch *b = st->batch;
    if (r->offset < st->min_offset || r->offset >= st->max_offset)
        return 0;
    long long ts_ms, ts_us;
    if (b->log_append_time)
        ts_ms = b->max_timestamp;
    else if (__builtin_add_overflow(b->base_timestamp, (long long)r->timestamp_delta, &ts_ms))
        return walk_fail_record(err, INVALID_RECORD, r->index, r->start,
                                "timestamp delta %lld overflows the base timestamp", (long long)r->timestamp_delta);
    if (__builtin_mul_overflow(ts_ms, 1000LL, &ts_us))
        return walk_fail_record(err, INVALID_RECORD, r->index, r->start,
                                "timestamp %lld ms is out of range in microseconds", ts_ms);
    /* From here on failures are the columns' own (memory, 2 GiB columns): err->code -1, st->fail. */
    err->code = -1;
    if (put64(&st->offsets, (uint64_t)r->offset) < 0 || put64(&st->timestamps, (uint64_t)ts_us) < 0 ||
        put32(&st->types, (uint32_t)b->log_append_time) < 0)
        return fail(&st->fail, FAIL_MEMORY, "out of memory");
    if (column_append(&st->keys, buf + r->key, r->key_len, &st->fail) < 0 ||
        column_append(&st->values, buf + r->value, r->value_len, &st->fail) < 0)
        return -1;
    st->rows++;
    if (st->with_headers && put32(&st->list_offsets, (uint32_t)st->header_keys.rows) < 0)
        return fail(&st->fail, FAIL_MEMORY, "out of memory");
    err->code = 0;
    return 0;
}

/* The walker's header hook (only when with_headers): the headers of a record in range. Called as
 * the walk reads them, before the record's last checks: a failing record fails the whole call, so
 * what was appended for it is never seen. */
WALK_HOOK
columnize_header(void *ctx, const unsigned char *buf, const walk_record *r, const walk_header *h, walk_error *err)
{
    columnizer *st = (columnizer *)ctx;
    if (r->offset < st->min_offset || r->offset >= st->max_offset)
        return 0;
    err->code = -1; /* failures are the columns' own, in st->fail */
    if (st->header_keys.rows >= INT32_MAX)
        return fail(&st->fail, FAIL_OVERFLOW, "more than 2147483647 headers: too many for one Arrow list");
    if (column_append(&st->header_keys, buf + h->key, h->key_len, &st->fail) < 0 ||
        column_append(&st->header_values, buf + h->value, h->value_len, &st->fail) < 0)
        return -1;
    err->code = 0;
    return 0;
}

static int
columnize_batch(columnizer *st, const batch *b)
{
    walk_batch wb = {.expected = b->count, .base_offset = b->base_offset};
    walk_error err;
    const unsigned char *buf = (const unsigned char *)b->view.buf;
    st->batch = b;
    /* Two specialisations of the walk: without headers, none of the header hook's code runs. */
    int rc = st->with_headers ? walk_records(buf, b->view.len, &wb, columnize_record, columnize_header, st, &err)
                              : walk_records(buf, b->view.len, &wb, columnize_record, NULL, st, &err);
    if (rc == 0)
        return 0;
    if (err.code == -1) /* the hook's own failure, in st->fail */
        return -1;
    return fail(&st->fail, FAIL_VALUE, "batch at position %zd (base offset %lld): %s", b->position, b->base_offset,
                err.message);
}

static int
columnize_all(columnizer *st, const batch *batches, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++)
        if (columnize_batch(st, &batches[i]) < 0)
            return -1;
    return 0;
}

static PyObject *
columnizer_result(columnizer *st)
{
    PyObject *result = PyTuple_New(13);
    if (result == NULL)
        return NULL;
    PyObject *first[4] = {PyLong_FromLongLong(st->rows), growbuf_bytes(&st->offsets),
                          growbuf_bytes(&st->timestamps), growbuf_bytes(&st->types)};
    for (int i = 0; i < 4; i++) {
        if (first[i] == NULL) {
            for (int j = 0; j < 4; j++)
                Py_XDECREF(first[j]);
            Py_DECREF(result);
            return NULL;
        }
    }
    for (int i = 0; i < 4; i++)
        PyTuple_SET_ITEM(result, i, first[i]);
    if (column_to_tuple(&st->keys, result, 4) < 0 || column_to_tuple(&st->values, result, 8) < 0)
        goto error;
    if (!st->with_headers) {
        PyTuple_SET_ITEM(result, 12, Py_NewRef(Py_None));
        return result;
    }
    PyObject *headers = PyTuple_New(10);
    if (headers == NULL)
        goto error;
    PyTuple_SET_ITEM(result, 12, headers);
    PyObject *list_offsets = growbuf_bytes(&st->list_offsets);
    if (list_offsets == NULL)
        goto error;
    PyTuple_SET_ITEM(headers, 0, list_offsets);
    if (column_to_tuple(&st->header_keys, headers, 1) < 0 || column_to_tuple(&st->header_values, headers, 5) < 0)
        goto error;
    PyObject *total = PyLong_FromLongLong(st->header_keys.rows);
    if (total == NULL)
        goto error;
    PyTuple_SET_ITEM(headers, 9, total);
    return result;
error:
    Py_DECREF(result); /* a tuple with NULL slots deallocates fine */
    return NULL;
}

static PyObject *
columnize(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *sequence, *fast, *result = NULL;
    long long min_offset, max_offset;
    int with_headers;
    if (!PyArg_ParseTuple(args, "OLLp:columnize", &sequence, &min_offset, &max_offset, &with_headers))
        return NULL;
    fast = PySequence_Fast(sequence, "columnize: batches must be a sequence of tuples");
    if (fast == NULL)
        return NULL;
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
    Py_ssize_t acquired = 0;
    long long records = 0;
    Py_ssize_t bytes = 0;
    columnizer st;
    memset(&st, 0, sizeof st);
    batch *batches = PyMem_Calloc(count ? (size_t)count : 1, sizeof *batches);
    if (batches == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        batch *b = &batches[i];
        if (!PyTuple_Check(item)) {
            PyErr_Format(PyExc_TypeError, "columnize: batch %zd is %.100s, not a tuple", i, Py_TYPE(item)->tp_name);
            goto done;
        }
        if (!PyArg_ParseTuple(item, "y*nLLLpL:columnize", &b->view, &b->position, &b->base_offset,
                              &b->base_timestamp, &b->max_timestamp, &b->log_append_time, &b->count))
            goto done;
        acquired++;
        records += b->count > 0 ? b->count : 0;
        bytes += b->view.len;
    }
    st.min_offset = min_offset;
    st.max_offset = max_offset;
    st.with_headers = with_headers;
    if (column_init(&st.keys, "keys", &st.fail) < 0 || column_init(&st.values, "values", &st.fail) < 0 ||
        column_init(&st.header_keys, "header keys", &st.fail) < 0 ||
        column_init(&st.header_values, "header values", &st.fail) < 0 ||
        (with_headers && put32(&st.list_offsets, 0) < 0)) {
        PyErr_NoMemory();
        goto done;
    }
    /* Each data column takes at most the records' bytes: preallocated at that, the bytes are copied
     * once, straight into the bytes objects returned. */
    if (column_preallocate(&st.keys, bytes) < 0 || column_preallocate(&st.values, bytes) < 0 ||
        (with_headers &&
         (column_preallocate(&st.header_keys, bytes) < 0 || column_preallocate(&st.header_values, bytes) < 0)))
        goto done;
    int rc;
    /* The buffers stay exported (pinned) while the GIL is released; `fast` keeps the tuples alive. */
    MAYBE_WITHOUT_GIL(records >= GIL_RELEASE_MIN_RECORDS || bytes >= GIL_RELEASE_MIN_BYTES,
                      rc = columnize_all(&st, batches, count));
    if (rc < 0)
        raise_failure(&st.fail);
    else
        result = columnizer_result(&st);
done:
    for (Py_ssize_t i = 0; i < acquired; i++)
        PyBuffer_Release(&batches[i].view);
    PyMem_Free(batches);
    growbuf_free(&st.offsets);
    growbuf_free(&st.timestamps);
    growbuf_free(&st.types);
    growbuf_free(&st.list_offsets);
    column_free(&st.keys);
    column_free(&st.values);
    column_free(&st.header_keys);
    column_free(&st.header_values);
    Py_DECREF(fast);
    return result;
}

/* ---------------------------------------------------------------------------------------------- */
/* Arrow binary columns as input (encode_records, partitions_for_keys).                            */

typedef struct {
    const char *name;
    Py_buffer validity, offsets, data;
    int has_validity, has_offsets, has_data;
} column_in;

static void
column_in_release(column_in *c)
{
    if (c->has_validity)
        PyBuffer_Release(&c->validity);
    if (c->has_offsets)
        PyBuffer_Release(&c->offsets);
    if (c->has_data)
        PyBuffer_Release(&c->data);
    c->has_validity = c->has_offsets = c->has_data = 0;
}

/* Export the buffers of (validity | None, offsets, data) and check their sizes for `count` rows. */
static int
column_in_get(PyObject *tuple, const char *name, Py_ssize_t count, column_in *c)
{
    PyObject *validity, *offsets, *data;
    memset(c, 0, sizeof *c);
    c->name = name;
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 3) {
        PyErr_Format(PyExc_TypeError, "%s must be a tuple (validity, offsets, data)", name);
        return -1;
    }
    validity = PyTuple_GET_ITEM(tuple, 0);
    offsets = PyTuple_GET_ITEM(tuple, 1);
    data = PyTuple_GET_ITEM(tuple, 2);
    if (validity != Py_None) {
        if (PyObject_GetBuffer(validity, &c->validity, PyBUF_SIMPLE) < 0)
            goto error;
        c->has_validity = 1;
    }
    if (PyObject_GetBuffer(offsets, &c->offsets, PyBUF_SIMPLE) < 0)
        goto error;
    c->has_offsets = 1;
    if (PyObject_GetBuffer(data, &c->data, PyBUF_SIMPLE) < 0)
        goto error;
    c->has_data = 1;
    if (c->offsets.len / 4 < count + 1) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes of offsets hold %zd int32 entries; %zd rows need %zd", name,
                     c->offsets.len, c->offsets.len / 4, count, count + 1);
        goto error;
    }
    if (c->has_validity && c->validity.len < (count + 7) / 8) {
        PyErr_Format(PyExc_ValueError, "%s: a validity bitmap of %zd bytes is too short for %zd rows", name,
                     c->validity.len, count);
        goto error;
    }
    return 0;
error:
    column_in_release(c);
    return -1;
}

static inline int
column_in_valid(const column_in *c, Py_ssize_t i)
{
    return !c->has_validity || (((const unsigned char *)c->validity.buf)[i >> 3] >> (i & 7)) & 1;
}

/* Row i of a column: its length (-1 for null) and start, or -1 (failure set) when its offsets are
 * outside the data or decreasing. */
static inline int
column_in_row(const column_in *c, Py_ssize_t i, const unsigned char **start, int64_t *len, failure *f)
{
    if (!column_in_valid(c, i)) {
        *len = -1;
        *start = NULL;
        return 0;
    }
    const unsigned char *o = (const unsigned char *)c->offsets.buf + 4 * i;
    const int32_t begin = load_le32(o), end = load_le32(o + 4);
    if (begin < 0 || end < begin || end > c->data.len)
        return fail(f, FAIL_VALUE, "%s row %zd: offsets %ld..%ld are outside the %zd bytes of data", c->name, i,
                    (long)begin, (long)end, c->data.len);
    *start = (const unsigned char *)c->data.buf + begin;
    *len = end - begin;
    return 0;
}

/* Size of record i (after its Length varint), with no headers. */
static inline int64_t
record_size(Py_ssize_t i, int64_t key_len, int64_t value_len)
{
    return 1 /* attributes */ + 1 /* timestamp delta 0 */ + varint_size(i) + varint_size(key_len) +
           (key_len > 0 ? key_len : 0) + varint_size(value_len) + (value_len > 0 ? value_len : 0) +
           1 /* header count 0 */;
}

typedef struct {
    Py_ssize_t count;
    column_in values, keys;
    int has_keys;
    size_t total;
    unsigned char *out;
    failure fail;
} encoder;

static int
encode_measure(encoder *e)
{
    size_t total = 0;
    const unsigned char *key = NULL, *value = NULL;
    int64_t key_len = -1, value_len = -1;
    for (Py_ssize_t i = 0; i < e->count; i++) {
        if (column_in_row(&e->values, i, &value, &value_len, &e->fail) < 0)
            return -1;
        if (e->has_keys && column_in_row(&e->keys, i, &key, &key_len, &e->fail) < 0)
            return -1;
        const int64_t size = record_size(i, key_len, value_len);
        if (size > INT32_MAX)
            return fail(&e->fail, FAIL_VALUE, "row %zd: a record of %lld bytes is larger than a record can be", i,
                        (long long)size);
        total += (size_t)(varint_size(size) + size);
    }
    e->total = total;
    return 0;
}

static void
encode_write(encoder *e)
{
    unsigned char *p = e->out;
    const unsigned char *key = NULL, *value = NULL;
    int64_t key_len = -1, value_len = -1;
    for (Py_ssize_t i = 0; i < e->count; i++) {
        /* Checked by encode_measure: cannot fail. */
        (void)column_in_row(&e->values, i, &value, &value_len, &e->fail);
        if (e->has_keys)
            (void)column_in_row(&e->keys, i, &key, &key_len, &e->fail);
        p = write_varint(p, record_size(i, key_len, value_len));
        *p++ = 0; /* attributes */
        *p++ = 0; /* timestamp delta 0 */
        p = write_varint(p, i);
        p = write_varint(p, key_len);
        if (key_len > 0) {
            memcpy(p, key, (size_t)key_len);
            p += key_len;
        }
        p = write_varint(p, value_len);
        if (value_len > 0) {
            memcpy(p, value, (size_t)value_len);
            p += value_len;
        }
        *p++ = 0; /* header count */
    }
}

static PyObject *
encode_records(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *values, *keys, *result = NULL;
    encoder e;
    memset(&e, 0, sizeof e);
    if (!PyArg_ParseTuple(args, "nOO:encode_records", &e.count, &values, &keys))
        return NULL;
    if (e.count < 0 || e.count > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "count %zd is not a record count (0 .. 2147483647)", e.count);
        return NULL;
    }
    if (column_in_get(values, "values", e.count, &e.values) < 0)
        return NULL;
    if (keys != Py_None) {
        if (column_in_get(keys, "keys", e.count, &e.keys) < 0)
            goto done;
        e.has_keys = 1;
    }
    const int release = e.count >= GIL_RELEASE_MIN_RECORDS ||
                        e.values.data.len + (e.has_keys ? e.keys.data.len : 0) >= GIL_RELEASE_MIN_BYTES;
    int rc;
    MAYBE_WITHOUT_GIL(release, rc = encode_measure(&e));
    if (rc < 0) {
        raise_failure(&e.fail);
        goto done;
    }
    if (e.total > PY_SSIZE_T_MAX) {
        PyErr_SetString(PyExc_OverflowError, "the records are too large for one bytes object");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)e.total);
    if (result == NULL)
        goto done;
    e.out = (unsigned char *)PyBytes_AS_STRING(result);
    MAYBE_WITHOUT_GIL(release, encode_write(&e));
done:
    column_in_release(&e.values);
    column_in_release(&e.keys);
    return result;
}

/* ---------------------------------------------------------------------------------------------- */
/* murmur2 / partitions_for_keys                                                                   */

/* org.apache.kafka.common.utils.Utils.murmur2: 32-bit MurmurHash2, seed 0x9747b28c, little-endian
 * 4-byte groups. */
static inline uint32_t
murmur2_hash(const unsigned char *data, size_t length)
{
    const uint32_t m = 0x5bd1e995;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    const size_t end = length & ~(size_t)3;
    for (size_t i = 0; i < end; i += 4) {
        uint32_t k = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 | (uint32_t)data[i + 2] << 16 |
                     (uint32_t)data[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    const size_t rest = length & 3;
    if (rest == 3)
        h ^= (uint32_t)data[end + 2] << 16;
    if (rest >= 2)
        h ^= (uint32_t)data[end + 1] << 8;
    if (rest >= 1) {
        h ^= data[end];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

static PyObject *
murmur2(PyObject *Py_UNUSED(module), PyObject *args)
{
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*:murmur2", &view))
        return NULL;
    const uint32_t h = murmur2_hash((const unsigned char *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong((long)(int32_t)h);
}

typedef struct {
    Py_ssize_t count;
    long num_partitions;
    column_in keys;
    unsigned char *out;
    failure fail;
} partitioner;

static int
partition_all(partitioner *pt)
{
    const unsigned char *key = NULL;
    int64_t len = -1;
    for (Py_ssize_t i = 0; i < pt->count; i++) {
        if (column_in_row(&pt->keys, i, &key, &len, &pt->fail) < 0)
            return -1;
        int32_t partition = -1;
        if (len >= 0)
            partition = (int32_t)((murmur2_hash(key, (size_t)len) & 0x7fffffffu) % (uint32_t)pt->num_partitions);
        store_le32(pt->out + 4 * i, (uint32_t)partition);
    }
    return 0;
}

static PyObject *
partitions_for_keys(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *keys, *result = NULL;
    partitioner pt;
    memset(&pt, 0, sizeof pt);
    if (!PyArg_ParseTuple(args, "nOl:partitions_for_keys", &pt.count, &keys, &pt.num_partitions))
        return NULL;
    if (pt.num_partitions < 1 || pt.num_partitions > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "num_partitions %ld is not a partition count (1 .. 2147483647)",
                     pt.num_partitions);
        return NULL;
    }
    if (pt.count < 0 || pt.count > PY_SSIZE_T_MAX / 4) {
        PyErr_Format(PyExc_ValueError, "count %zd is not a row count", pt.count);
        return NULL;
    }
    if (column_in_get(keys, "keys", pt.count, &pt.keys) < 0)
        return NULL;
    result = PyBytes_FromStringAndSize(NULL, 4 * pt.count);
    if (result == NULL)
        goto done;
    pt.out = (unsigned char *)PyBytes_AS_STRING(result);
    int rc;
    MAYBE_WITHOUT_GIL(pt.count >= GIL_RELEASE_MIN_RECORDS || pt.keys.data.len >= GIL_RELEASE_MIN_BYTES,
                      rc = partition_all(&pt));
    if (rc < 0) {
        Py_CLEAR(result);
        raise_failure(&pt.fail);
    }
done:
    column_in_release(&pt.keys);
    return result;
}

/* ---------------------------------------------------------------------------------------------- */
/* text_lines: a console consumer's output                                                         */

/* 1 when every byte of [p, p + n) is printable ASCII other than the backslash (the bytes the CLI
 * prints as they are). Eight bytes a step (SWAR): with ones = 0x01 in every byte, a byte of w is
 * zero somewhere iff (w - ones) & ~w has a high bit set, below 0x20 iff (w - 0x20 * ones) & ~w
 * does, and 0x7f or 0x5c iff w ^ that byte has a zero. Borrows can only mark a byte above a truly
 * marked one, so "any byte is bad" is exact; a byte >= 0x80 is bad through its own high bit. */
static inline int
plain_text(const unsigned char *p, int64_t n)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    uint64_t bad = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        const uint64_t del = w ^ (ones * 0x7f), slash = w ^ (ones * 0x5c);
        bad |= w | ((w - ones * 0x20) & ~w) | ((del - ones) & ~del) | ((slash - ones) & ~slash);
    }
    if (bad & highs)
        return 0;
    for (; i < n; i++)
        if (p[i] < 0x20 || p[i] > 0x7e || p[i] == 0x5c)
            return 0;
    return 1;
}

typedef struct {
    Py_ssize_t count;
    column_in values, keys;
    int has_keys;
    int64_t total;
    unsigned char *out;
    failure fail;
} liner;

/* The output size, or 1 when a cell is null or not plain (no lines then), or -1 on bad offsets. */
static int
lines_measure(liner *l)
{
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < l->count; i++) {
        const unsigned char *cell = NULL;
        int64_t len = 0;
        for (int k = l->has_keys ? 0 : 1; k < 2; k++) {
            if (column_in_row(k ? &l->values : &l->keys, i, &cell, &len, &l->fail) < 0)
                return -1;
            if (len < 0 || !plain_text(cell, len))
                return 1;
            total += len + 1; /* the tab after the key, the newline after the value */
        }
    }
    l->total = total;
    return 0;
}

static void
lines_write(liner *l)
{
    unsigned char *p = l->out;
    for (Py_ssize_t i = 0; i < l->count; i++) {
        const unsigned char *cell = NULL;
        int64_t len = 0;
        for (int k = l->has_keys ? 0 : 1; k < 2; k++) {
            (void)column_in_row(k ? &l->values : &l->keys, i, &cell, &len, &l->fail); /* measured: valid */
            memcpy(p, cell, (size_t)len);
            p += len;
            *p++ = k ? '\n' : '\t';
        }
    }
}

static PyObject *
text_lines(PyObject *Py_UNUSED(module), PyObject *args)
{
    PyObject *values, *keys, *result = NULL;
    liner l;
    memset(&l, 0, sizeof l);
    if (!PyArg_ParseTuple(args, "nOO:text_lines", &l.count, &values, &keys))
        return NULL;
    if (l.count < 0) {
        PyErr_Format(PyExc_ValueError, "count %zd is not a row count", l.count);
        return NULL;
    }
    if (column_in_get(values, "values", l.count, &l.values) < 0)
        return NULL;
    if (keys != Py_None) {
        if (column_in_get(keys, "keys", l.count, &l.keys) < 0)
            goto done;
        l.has_keys = 1;
    }
    const int release = l.count >= GIL_RELEASE_MIN_RECORDS ||
                        l.values.data.len + (l.has_keys ? l.keys.data.len : 0) >= GIL_RELEASE_MIN_BYTES;
    int rc;
    MAYBE_WITHOUT_GIL(release, rc = lines_measure(&l));
    if (rc < 0) {
        raise_failure(&l.fail);
        goto done;
    }
    if (rc > 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)l.total);
    if (result == NULL)
        goto done;
    l.out = (unsigned char *)PyBytes_AS_STRING(result);
    MAYBE_WITHOUT_GIL(release, lines_write(&l));
done:
    column_in_release(&l.values);
    column_in_release(&l.keys);
    return result;
}

/* ---------------------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"columnize", columnize, METH_VARARGS,
     "columnize(batches, min_offset, max_offset, with_headers) -> tuple\n\n"
     "The records of every batch with min_offset <= offset < max_offset as Arrow column buffers\n"
     "(see lowtide.record.columns.columnize_py for the layout); ValueError on a malformed record."},
    {"encode_records", encode_records, METH_VARARGS,
     "encode_records(count, values, keys) -> bytes\n\n"
     "The Records of a batch holding `count` rows of Arrow binary columns (validity, offsets, data);\n"
     "record i has offset delta i, timestamp delta 0, no headers."},
    {"partitions_for_keys", partitions_for_keys, METH_VARARGS,
     "partitions_for_keys(count, keys, num_partitions) -> bytes\n\n"
     "int32 LE per row: toPositive(murmur2(key)) % num_partitions, -1 for a null key."},
    {"murmur2", murmur2, METH_VARARGS, "murmur2(buffer) -> int: Kafka's Utils.murmur2 as a signed int."},
    {"text_lines", text_lines, METH_VARARGS,
     "text_lines(count, values, keys) -> bytes | None\n\n"
     "Each row as a line: value + '\\n' (keys not None: key + '\\t' + value + '\\n'); None when a cell\n"
     "is null or holds a byte other than printable ASCII but the backslash."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "lowtide.record._columns",
    "RecordBatch v2 records <-> Arrow column buffers (see lowtide.record.columns).",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__columns(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "GIL_RELEASE_MIN_RECORDS", GIL_RELEASE_MIN_RECORDS) < 0 ||
        PyModule_AddIntConstant(m, "GIL_RELEASE_MIN_BYTES", GIL_RELEASE_MIN_BYTES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
