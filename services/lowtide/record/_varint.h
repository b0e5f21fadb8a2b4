/*
 * lowtide.record: the zig-zag varint reader of the record walker (_walk.h).
 *
 *     Varint = zig-zag, 7 bits per byte, low group first, high bit = more bytes follow; an int32
 *     takes at most 5 bytes (the 5th holds 4 bits), an int64 at most 10 (the 10th holds 1 bit).
 *     Anything longer or wider is malformed, as in Kafka's ByteUtils.
 */
#ifndef LOWTIDE_RECORD_VARINT_H
#define LOWTIDE_RECORD_VARINT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum { VARINT_OK = 0, VARINT_TRUNCATED = 1, VARINT_MALFORMED = 2 };

/* Zig-zag varint of at most max_bytes bytes ending before `end`; the last allowed byte may hold
 * only last_bits bits (which also rules out its continuation bit). */
static inline int
read_varint(const unsigned char *buf, Py_ssize_t end, Py_ssize_t *pos, int max_bytes, int last_bits,
            int64_t *value)
{
    Py_ssize_t p = *pos;
    if (p < end && buf[p] < 0x80) { /* one byte: almost every length and delta */
        *pos = p + 1;
        *value = (int64_t)(buf[p] >> 1) ^ -(int64_t)(buf[p] & 1);
        return VARINT_OK;
    }
    uint64_t raw = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (p >= end)
            return VARINT_TRUNCATED;
        unsigned char c = buf[p++];
        if (i == max_bytes - 1 && (c >> last_bits) != 0)
            return VARINT_MALFORMED;
        raw |= (uint64_t)(c & 0x7F) << (7 * i);
        if (c < 0x80) {
            *pos = p;
            *value = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return VARINT_OK;
        }
    }
    return VARINT_MALFORMED; /* not reached: the last byte is checked above */
}

#endif /* LOWTIDE_RECORD_VARINT_H */
