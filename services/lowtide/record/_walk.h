/*
 * lowtide.record: THE record walker, shared by the C extensions _validate.c (validation, batch parsing,
 * the cleaner's rewrite) and _columns.c (records -> Arrow columns, the cleaner's rows). Its Python twin
 * is lowtide.record.walk.iter_records: same checks in the same order, same messages.
 *
 * Input: the records of one batch (after decompression), i.e. what follows the 61-byte header:
 *
 *     Records => Record x RecordCount, back to back, nothing after the last one
 *
 *     Record =>                                       checked here            walk_record field
 *       Length            => Varint   (int32)         >= 0, inside the body   start (its byte)
 *       Attributes        => Int8                     present (value unused)  body (its byte)
 *       TimestampDelta    => Varlong  (int64)         well formed             timestamp_delta
 *       OffsetDelta       => Varint                   see "offset deltas"     delta_pos, offset_delta
 *       KeyLength         => Varint   (-1 = null)     >= -1, key inside       key_len
 *       Key               => Bytes                                            key (its byte)
 *       ValueLength       => Varint   (-1 = null)     >= -1, value inside     value_len
 *       Value             => Bytes                                            value (its byte)
 *       HeaderCount       => Varint                   >= 0                    header_count
 *       Headers           => Header x HeaderCount                             headers (first byte)
 *         HeaderKeyLength   => Varint                 >= 0 (a header key is never null)
 *         HeaderKey         => Bytes (UTF-8, not checked)
 *         HeaderValueLength => Varint  (-1 = null)    >= -1
 *         HeaderValue       => Bytes
 *       (the fields end exactly Length bytes after the Length varint)                end
 *
 *     Varint = zig-zag, 7 bits per byte, low group first, high bit = more bytes follow (_varint.h).
 *
 * Offset deltas: always well formed, and BaseOffset + delta must fit an int64. With check_deltas
 * (the leader's validation), when RecordCount == LastOffsetDelta + 1 (every produced batch) record i
 * must have delta i; otherwise (a compacted batch) deltas rise strictly and stay <= LastOffsetDelta.
 *
 * Errors: code 2 CORRUPT_MESSAGE when the body cannot be cut into the declared records (a Length
 * runs past the end, bytes left over, fewer records), 87 INVALID_RECORD when one record is
 * inconsistent inside; the message names the record and the byte where it starts. The walk stops
 * after RecordCount records, so its cost is bounded by the header's count even for a large body.
 *
 * How the users hook in: walk_records calls on_header(ctx, buf, record, header, error) for each
 * header as it is read (so the headers are walked once, even by a user that collects them) and
 * on_record(ctx, buf, record, error) once per record, after every check of that record passed.
 * Either may fail (return -1, error filled in with walk_fail_record or a code of the user's own);
 * either may be NULL. walk_records is always inlined and the hooks are constants at each call
 * site, so each user gets its own specialised loop with its hooks inlined (no indirect call per
 * record), and validation, which passes NULL, gets the bare walk.
 */
#ifndef LOWTIDE_RECORD_WALK_H
#define LOWTIDE_RECORD_WALK_H

#include "_varint.h" /* read_varint, VARINT_OK / _TRUNCATED / _MALFORMED; Python.h */
#include <stdarg.h>
#include <stdio.h>

#define CORRUPT_MESSAGE 2
#define INVALID_RECORD 87

typedef struct {
    long long expected;          /* RecordCount */
    long long base_offset;       /* offset = base_offset + offset delta */
    int check_deltas;            /* the offset delta rules above (validation) */
    long long last_offset_delta; /* LastOffsetDelta: only with check_deltas */
} walk_batch;

/* One record: byte positions in the records buffer, and the values of its fields. */
typedef struct {
    long long index;
    Py_ssize_t start, body, delta_pos, end;
    int64_t timestamp_delta, offset_delta;
    long long offset;
    Py_ssize_t key, value, headers;
    int64_t key_len, value_len, header_count; /* lengths < 0: null */
} walk_record;

typedef struct {
    int code; /* 0 = no error; CORRUPT_MESSAGE / INVALID_RECORD, or a hook's own code */
    char message[240];
} walk_error;

/* One header of the record being walked: positions of its key and value, their lengths. */
typedef struct {
    Py_ssize_t key, value;
    int64_t key_len, value_len; /* value_len < 0: null */
} walk_header;

typedef int (*walk_hook)(void *ctx, const unsigned char *buf, const walk_record *rec, walk_error *err);
typedef int (*walk_header_hook)(void *ctx, const unsigned char *buf, const walk_record *rec, const walk_header *h,
                                walk_error *err);

static int __attribute__((format(printf, 3, 4)))
walk_fail(walk_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* "record I at byte S: <problem>": what every per-record message looks like (hooks use it too). */
static int __attribute__((format(printf, 5, 6)))
walk_fail_record(walk_error *err, int code, long long index, Py_ssize_t start, const char *fmt, ...)
{
    char problem[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problem, sizeof problem, fmt, ap);
    va_end(ap);
    return walk_fail(err, code, "record %lld at byte %zd: %s", index, start, problem);
}

/* A varint field inside the record: errors are per record (INVALID_RECORD). */
#define WALK_FIELD_VARINT(NAME, MAX, BITS, OUT)                                                 \
    do {                                                                                        \
        int st_ = read_varint(buf, r.end, &pos, (MAX), (BITS), &(OUT));                         \
        if (st_ == VARINT_TRUNCATED)                                                            \
            return walk_fail_record(err, INVALID_RECORD, r.index, r.start,                      \
                                    "%s runs past the record's length %lld", (NAME), (long long)length); \
        if (st_ == VARINT_MALFORMED)                                                            \
            return walk_fail_record(err, INVALID_RECORD, r.index, r.start, "%s is not a valid varint", \
                                    (NAME));                                                    \
    } while (0)

/* A length varint that must be >= LOW (into LEN), where the bytes start (into AT), then step over
 * them (negative = null, nothing to step over). */
#define WALK_FIELD_BYTES(NAME, LOW, LEN, AT)                                                    \
    do {                                                                                        \
        WALK_FIELD_VARINT(NAME " length", 5, 4, LEN);                                           \
        if ((LEN) < (LOW))                                                                      \
            return walk_fail_record(err, INVALID_RECORD, r.index, r.start, "invalid %s %lld",   \
                                    NAME " length", (long long)(LEN));                          \
        (AT) = pos;                                                                             \
        if ((LEN) > 0) {                                                                        \
            if ((LEN) > r.end - pos)                                                            \
                return walk_fail_record(err, INVALID_RECORD, r.index, r.start,                  \
                                        "%s runs past the record's length %lld", NAME, (long long)length); \
            pos += (Py_ssize_t)(LEN);                                                           \
        }                                                                                       \
    } while (0)

/* Walk the n bytes of records at buf: 0 when they are exactly b->expected well-formed records
 * (on_record, when not NULL, was called for each), -1 with *err filled in otherwise. */
/* Hooks are declared WALK_HOOK: inlined into the walk (a hook used by two specialisations of the
 * walk would otherwise stay a call per record). */
#define WALK_HOOK static inline __attribute__((always_inline)) int

static inline __attribute__((always_inline)) int
walk_records(const unsigned char *buf, Py_ssize_t n, const walk_batch *b, walk_hook on_record,
             walk_header_hook on_header, void *ctx, walk_error *err)
{
    const int consecutive = b->expected == b->last_offset_delta + 1;
    Py_ssize_t pos = 0;
    int64_t prev_delta = -1, length;
    walk_record r;
    walk_header h;
    r.index = 0;
    err->code = 0;
    while (pos < n) {
        if (r.index >= b->expected)
            return walk_fail(err, CORRUPT_MESSAGE, "%zd bytes at byte %zd after the %lld records the batch declares",
                             n - pos, pos, b->expected);
        r.start = pos;
        int st = read_varint(buf, n, &pos, 5, 4, &length);
        if (st == VARINT_TRUNCATED)
            return walk_fail_record(err, CORRUPT_MESSAGE, r.index, r.start,
                                    "its length runs past the end of the records");
        if (st == VARINT_MALFORMED)
            return walk_fail_record(err, CORRUPT_MESSAGE, r.index, r.start, "its length is not a valid varint");
        if (length < 0)
            return walk_fail_record(err, CORRUPT_MESSAGE, r.index, r.start, "negative length %lld",
                                    (long long)length);
        if (length > n - pos)
            return walk_fail_record(err, CORRUPT_MESSAGE, r.index, r.start,
                                    "length %lld runs past the end of the records (%zd bytes left)",
                                    (long long)length, n - pos);
        r.body = pos;
        r.end = pos + (Py_ssize_t)length;
        if (pos >= r.end)
            return walk_fail_record(err, INVALID_RECORD, r.index, r.start, "%s runs past the record's length %lld",
                                    "attributes", (long long)length);
        pos++; /* attributes: unused by RecordBatch v2 */
        WALK_FIELD_VARINT("timestamp delta", 10, 1, r.timestamp_delta);
        r.delta_pos = pos;
        WALK_FIELD_VARINT("offset delta", 5, 4, r.offset_delta);
        if (b->check_deltas) {
            if (consecutive) {
                if (r.offset_delta != r.index)
                    return walk_fail_record(err, INVALID_RECORD, r.index, r.start, "offset delta %lld, expected %lld",
                                            (long long)r.offset_delta, r.index);
            } else if (r.offset_delta <= prev_delta || r.offset_delta > b->last_offset_delta) {
                return walk_fail_record(err, INVALID_RECORD, r.index, r.start,
                                        "offset delta %lld is not above %lld or is past the last offset delta %lld",
                                        (long long)r.offset_delta, (long long)prev_delta, b->last_offset_delta);
            }
            prev_delta = r.offset_delta;
        }
        if (__builtin_add_overflow(b->base_offset, (long long)r.offset_delta, &r.offset))
            return walk_fail_record(err, INVALID_RECORD, r.index, r.start, "offset delta %lld overflows the base offset",
                                    (long long)r.offset_delta);
        WALK_FIELD_BYTES("key", -1, r.key_len, r.key);
        WALK_FIELD_BYTES("value", -1, r.value_len, r.value);
        WALK_FIELD_VARINT("header count", 5, 4, r.header_count);
        if (r.header_count < 0)
            return walk_fail_record(err, INVALID_RECORD, r.index, r.start, "invalid %s %lld", "header count",
                                    (long long)r.header_count);
        r.headers = pos;
        /* Each header takes at least 2 bytes, so a huge count ends at the record's end. */
        for (int64_t i = 0; i < r.header_count; i++) {
            WALK_FIELD_BYTES("header key", 0, h.key_len, h.key);
            WALK_FIELD_BYTES("header value", -1, h.value_len, h.value);
            if (on_header != NULL && on_header(ctx, buf, &r, &h, err) < 0)
                return -1;
        }
        if (pos != r.end)
            return walk_fail_record(err, INVALID_RECORD, r.index, r.start, "its fields take %zd of its length %lld bytes",
                                    pos - r.body, (long long)length);
        if (on_record != NULL && on_record(ctx, buf, &r, err) < 0)
            return -1;
        r.index++;
    }
    if (r.index != b->expected)
        return walk_fail(err, CORRUPT_MESSAGE, "the batch declares %lld records but its records hold %lld", b->expected,
                         r.index);
    return 0;
}

#undef WALK_FIELD_VARINT
#undef WALK_FIELD_BYTES

#endif /* LOWTIDE_RECORD_WALK_H */
