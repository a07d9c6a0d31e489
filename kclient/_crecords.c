/*
 * kclient._crecords: the compiled twin of kclient/records/pyrecords.py's hot loops.
 *
 * RecordBatch v2 record encoding (one record, or a whole sequence), record
 * decoding (into Record, ConsumerRecord or columns, with the batch walk, shape
 * checks and CRC-32C done here too), and the broker's record walk. The batch
 * layout is documented in kclient/records/layout.py; every function here has a
 * pure-Python equivalent in pyrecords.py that produces the same bytes and the same objects, and
 * raises the same error classes (the tests compare them).
 *
 * kclient/records/twins.py calls configure() once with the Python types and the error
 * class; compressed bodies are inflated by calling back kclient.records.compression.decompress.
 * CRC-32C uses SSE4.2 when the CPU has it (checked at import), else a
 * slice-by-8 table.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SSE42_PATH 1
#include <nmmintrin.h>
#endif

#define HEADER_SIZE 61
#define LOG_OVERHEAD 12
#define MIN_BATCH_LENGTH (HEADER_SIZE - LOG_OVERHEAD)
/* length, attributes, timestamp delta, offset delta, key, value, header count: a byte each at least */
#define MIN_RECORD_SIZE 7

static PyObject *RecordType = NULL;
static PyObject *ConsumerRecordType = NULL;
static PyObject *CorruptError = NULL;
static PyObject *Decompress = NULL;
static PyObject *SmallZero = NULL, *SmallOne = NULL;

/* ------------------------------------------------------------------------ */
/* CRC-32C (Castagnoli)                                                      */
/* ------------------------------------------------------------------------ */

static uint32_t crc_table[8][256];
static int crc_hw = 0;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
}

static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t n);

static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | ((uint32_t)p[5] << 8) | ((uint32_t)p[6] << 16) | ((uint32_t)p[7] << 24);
        lo ^= c;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
            crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#ifdef HAVE_SSE42_PATH
/* Three interleaved streams of STREAM bytes hide the crc32 instruction's latency; the
 * streams are joined with shift tables: shift(x, n) = raw CRC of x followed by n zero
 * bytes, which is linear in x, so four 256-entry tables per length do it. */
#define STREAM 512
static uint32_t shift1[4][256], shift2[4][256];

static void shift_init(uint32_t table[4][256], size_t n) {
    static const uint8_t zeros[2 * STREAM] = {0};
    uint32_t bit[32];
    for (int i = 0; i < 32; i++) bit[i] = crc_sw(1u << i, zeros, n);
    for (int k = 0; k < 4; k++)
        for (int v = 0; v < 256; v++) {
            uint32_t x = 0;
            for (int j = 0; j < 8; j++)
                if (v & (1 << j)) x ^= bit[8 * k + j];
            table[k][v] = x;
        }
}

static inline uint32_t shift(uint32_t table[4][256], uint32_t x) {
    return table[0][x & 0xFF] ^ table[1][(x >> 8) & 0xFF] ^ table[2][(x >> 16) & 0xFF] ^ table[3][x >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t c, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8(c, *p++);
        n--;
    }
    while (n >= 3 * STREAM) {
        uint64_t a = c, b = 0, d = 0;
        const uint8_t *q = p;
        for (int i = 0; i < STREAM / 8; i++) {
            uint64_t va, vb, vd;
            memcpy(&va, q, 8);
            memcpy(&vb, q + STREAM, 8);
            memcpy(&vd, q + 2 * STREAM, 8);
            a = _mm_crc32_u64(a, va);
            b = _mm_crc32_u64(b, vb);
            d = _mm_crc32_u64(d, vd);
            q += 8;
        }
        c = shift(shift2, (uint32_t)a) ^ shift(shift1, (uint32_t)b) ^ (uint32_t)d;
        p += 3 * STREAM;
        n -= 3 * STREAM;
    }
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = _mm_crc32_u64(c64, v);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n--) c = _mm_crc32_u8(c, *p++);
    return c;
}
#endif

static uint32_t crc32c_update(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t c = ~crc;
#ifdef HAVE_SSE42_PATH
    if (crc_hw) return ~crc_sse42(c, p, n);
#endif
    return ~crc_sw(c, p, n);
}

/* ------------------------------------------------------------------------ */
/* Varints and small helpers                                                 */
/* ------------------------------------------------------------------------ */

static inline uint64_t zigzag(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }
static inline int64_t unzigzag(uint64_t z) { return (int64_t)(z >> 1) ^ -(int64_t)(z & 1); }

static inline Py_ssize_t varint_size(uint64_t z) {
    Py_ssize_t n = 1;
    while (z > 0x7F) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *put_varint(uint8_t *p, uint64_t z) {
    while (z > 0x7F) {
        *p++ = (uint8_t)(z | 0x80);
        z >>= 7;
    }
    *p++ = (uint8_t)z;
    return p;
}

/* 0 ok, -1 runs past end, -2 longer than 10 bytes */
static inline int get_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    if (p < end && *p < 0x80) {
        *out = *p;
        *pp = p + 1;
        return 0;
    }
    uint64_t z = 0;
    int shift = 0;
    for (;;) {
        if (p >= end) return -1;
        uint8_t b = *p++;
        z |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) break;
        shift += 7;
        if (shift > 63) return -2;
    }
    *out = z;
    *pp = p;
    return 0;
}

static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static inline uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }
static inline int16_t be16(const uint8_t *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }

/* A bytes-like object's bytes; bytes objects without the buffer protocol's cost. */
typedef struct {
    const uint8_t *ptr;
    Py_ssize_t len;
    int is_null;
    int has_view;
    Py_buffer view;
} Blob;

static int blob_get(PyObject *obj, Blob *b) {
    b->has_view = 0;
    if (obj == Py_None) {
        b->is_null = 1;
        b->ptr = NULL;
        b->len = 0;
        return 0;
    }
    b->is_null = 0;
    if (PyBytes_CheckExact(obj)) {
        b->ptr = (const uint8_t *)PyBytes_AS_STRING(obj);
        b->len = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_SIMPLE) < 0) return -1;
    b->has_view = 1;
    b->ptr = (const uint8_t *)b->view.buf;
    b->len = b->view.len;
    return 0;
}

static inline void blob_release(Blob *b) {
    if (b->has_view) {
        PyBuffer_Release(&b->view);
        b->has_view = 0;
    }
}

static inline Py_ssize_t blob_field_size(const Blob *b) {
    return b->is_null ? 1 : varint_size((uint64_t)b->len << 1) + b->len;
}

static inline uint8_t *blob_put(uint8_t *p, const Blob *b) {
    if (b->is_null) {
        *p++ = 1;
        return p;
    }
    p = put_varint(p, (uint64_t)b->len << 1);
    if (b->len) memcpy(p, b->ptr, (size_t)b->len);
    return p + b->len;
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                  */
/* ------------------------------------------------------------------------ */

/* Headers: size (out == NULL) or write (returns the end) of the encoded header list. */
static Py_ssize_t headers_size(PyObject *fast) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Py_ssize_t size = varint_size((uint64_t)n << 1);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast(items[i], "a record header must be a (key, value) pair");
        if (!pair) return -1;
        if (PySequence_Fast_GET_SIZE(pair) != 2) {
            Py_DECREF(pair);
            PyErr_SetString(PyExc_ValueError, "a record header must be a (key, value) pair");
            return -1;
        }
        Py_ssize_t klen;
        if (!PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(pair, 0), &klen)) {
            Py_DECREF(pair);
            return -1;
        }
        Blob v;
        if (blob_get(PySequence_Fast_GET_ITEM(pair, 1), &v) < 0) {
            Py_DECREF(pair);
            return -1;
        }
        size += varint_size((uint64_t)klen << 1) + klen + blob_field_size(&v);
        blob_release(&v);
        Py_DECREF(pair);
    }
    return size;
}

static uint8_t *headers_put(uint8_t *p, PyObject *fast) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **items = PySequence_Fast_ITEMS(fast);
    p = put_varint(p, (uint64_t)n << 1);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast(items[i], "a record header must be a (key, value) pair");
        if (!pair) return NULL;
        Py_ssize_t klen;
        const char *k = PyUnicode_AsUTF8AndSize(PySequence_Fast_GET_ITEM(pair, 0), &klen);
        Blob v;
        if (!k || blob_get(PySequence_Fast_GET_ITEM(pair, 1), &v) < 0) {
            Py_DECREF(pair);
            return NULL;
        }
        p = put_varint(p, (uint64_t)klen << 1);
        memcpy(p, k, (size_t)klen);
        p += klen;
        p = blob_put(p, &v);
        blob_release(&v);
        Py_DECREF(pair);
    }
    return p;
}

/* One prepared record: its fields, and its size with and without the length prefix. */
typedef struct {
    Blob key, value;
    PyObject *headers_fast; /* NULL when there are no headers */
    Py_ssize_t headers_size;
    Py_ssize_t body;
    Py_ssize_t total;
    uint64_t zts, zoff;
} Prepared;

static void prepared_release(Prepared *r) {
    blob_release(&r->key);
    blob_release(&r->value);
    Py_CLEAR(r->headers_fast);
}

static int prepare(Prepared *r, int64_t offset_delta, int64_t ts_delta, PyObject *key, PyObject *value,
                   PyObject *headers) {
    r->headers_fast = NULL;
    r->key.has_view = r->value.has_view = 0;
    if (blob_get(key, &r->key) < 0) return -1;
    if (blob_get(value, &r->value) < 0) {
        blob_release(&r->key);
        return -1;
    }
    r->headers_size = 1;
    if (headers != NULL && headers != Py_None) {
        int truth;
        if (PyTuple_CheckExact(headers))
            truth = PyTuple_GET_SIZE(headers) > 0;
        else if (PyList_CheckExact(headers))
            truth = PyList_GET_SIZE(headers) > 0;
        else
            truth = PyObject_IsTrue(headers);
        if (truth < 0) goto fail;
        if (truth) {
            r->headers_fast = PySequence_Fast(headers, "record headers must be a sequence of (key, value) pairs");
            if (!r->headers_fast) goto fail;
            r->headers_size = headers_size(r->headers_fast);
            if (r->headers_size < 0) goto fail;
        }
    }
    r->zts = zigzag(ts_delta);
    r->zoff = zigzag(offset_delta);
    r->body = 1 + varint_size(r->zts) + varint_size(r->zoff) + blob_field_size(&r->key) +
              blob_field_size(&r->value) + r->headers_size;
    r->total = varint_size((uint64_t)r->body << 1) + r->body;
    return 0;
fail:
    prepared_release(r);
    return -1;
}

static uint8_t *prepared_put(uint8_t *p, Prepared *r) {
    p = put_varint(p, (uint64_t)r->body << 1);
    *p++ = 0; /* attributes */
    p = put_varint(p, r->zts);
    p = put_varint(p, r->zoff);
    p = blob_put(p, &r->key);
    p = blob_put(p, &r->value);
    if (r->headers_fast) {
        p = headers_put(p, r->headers_fast);
    } else {
        *p++ = 0;
    }
    return p;
}

static int as_i64(PyObject *o, int64_t *out) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)v;
    return 0;
}

/* append_record(buf, offset_delta, timestamp_delta, key, value, headers, limit) -> bool
 * Appends one record to the bytearray unless limit >= 0 and it would grow past it. */
static PyObject *py_append_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "append_record takes 7 arguments");
        return NULL;
    }
    PyObject *buf = args[0];
    if (!PyByteArray_CheckExact(buf)) {
        PyErr_SetString(PyExc_TypeError, "append_record needs a bytearray");
        return NULL;
    }
    int64_t od, td, limit;
    if (as_i64(args[1], &od) < 0 || as_i64(args[2], &td) < 0 || as_i64(args[6], &limit) < 0) return NULL;
    Prepared r;
    if (prepare(&r, od, td, args[3], args[4], args[5]) < 0) return NULL;
    Py_ssize_t old = PyByteArray_GET_SIZE(buf);
    if (limit >= 0 && old + r.total > limit) {
        prepared_release(&r);
        Py_RETURN_FALSE;
    }
    if (PyByteArray_Resize(buf, old + r.total) < 0) {
        prepared_release(&r);
        return NULL;
    }
    uint8_t *p = (uint8_t *)PyByteArray_AS_STRING(buf) + old;
    uint8_t *e = prepared_put(p, &r);
    prepared_release(&r);
    if (!e) {
        PyByteArray_Resize(buf, old);
        return NULL;
    }
    Py_RETURN_TRUE;
}

/* record_size(offset_delta, timestamp_delta, key, value, headers) -> int */
static PyObject *py_record_size(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "record_size takes 5 arguments");
        return NULL;
    }
    int64_t od, td;
    if (as_i64(args[0], &od) < 0 || as_i64(args[1], &td) < 0) return NULL;
    Prepared r;
    if (prepare(&r, od, td, args[2], args[3], args[4]) < 0) return NULL;
    prepared_release(&r);
    return PyLong_FromSsize_t(r.total);
}

/* encode_records(buf, count, first_ts, max_ts, values, keys, headers, timestamps, base_ts)
 *   -> (first_ts, max_ts)
 * Appends len(values) records (offset deltas from count) to the bytearray. */
static PyObject *py_encode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "encode_records takes 9 arguments");
        return NULL;
    }
    PyObject *buf = args[0];
    if (!PyByteArray_CheckExact(buf)) {
        PyErr_SetString(PyExc_TypeError, "encode_records needs a bytearray");
        return NULL;
    }
    int64_t count, first_ts, max_ts, base_ts = 0;
    if (as_i64(args[1], &count) < 0 || as_i64(args[2], &first_ts) < 0 || as_i64(args[3], &max_ts) < 0) return NULL;
    PyObject *values = NULL, *keys = NULL, *headers = NULL, *timestamps = NULL, *result = NULL;
    Py_ssize_t start = PyByteArray_GET_SIZE(buf), used = start, cap = start;
    values = PySequence_Fast(args[4], "values must be a sequence");
    if (!values) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(values);
    if (args[5] != Py_None) {
        keys = PySequence_Fast(args[5], "keys must be a sequence");
        if (!keys) goto done;
    }
    if (args[6] != Py_None) {
        headers = PySequence_Fast(args[6], "headers must be a sequence");
        if (!headers) goto done;
    }
    if (args[7] != Py_None) {
        timestamps = PySequence_Fast(args[7], "timestamps must be a sequence");
        if (!timestamps) goto done;
    } else if (as_i64(args[8], &base_ts) < 0) {
        goto done;
    }
    if ((keys && PySequence_Fast_GET_SIZE(keys) != n) || (headers && PySequence_Fast_GET_SIZE(headers) != n) ||
        (timestamps && PySequence_Fast_GET_SIZE(timestamps) != n)) {
        PyErr_SetString(PyExc_ValueError, "keys, headers and timestamps must have one entry per value");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t ts = base_ts;
        if (timestamps && as_i64(PySequence_Fast_GET_ITEM(timestamps, i), &ts) < 0) goto fail;
        if (count == 0) {
            first_ts = max_ts = ts;
        } else if (ts > max_ts) {
            max_ts = ts;
        }
        Prepared r;
        if (prepare(&r, count, (int64_t)((uint64_t)ts - (uint64_t)first_ts),
                    keys ? PySequence_Fast_GET_ITEM(keys, i) : Py_None, PySequence_Fast_GET_ITEM(values, i),
                    headers ? PySequence_Fast_GET_ITEM(headers, i) : NULL) < 0)
            goto fail;
        if (used + r.total > cap) {
            Py_ssize_t want = used + r.total;
            Py_ssize_t grow = (want - start) + (want - start) / (i + 1) * (n - i) + 64;
            if (PyByteArray_Resize(buf, start + grow) < 0) {
                prepared_release(&r);
                goto fail;
            }
            cap = start + grow;
        }
        uint8_t *e = prepared_put((uint8_t *)PyByteArray_AS_STRING(buf) + used, &r);
        prepared_release(&r);
        if (!e) goto fail;
        used += r.total;
        count++;
    }
    if (PyByteArray_Resize(buf, used) < 0) goto done;
    result = Py_BuildValue("(LL)", (long long)first_ts, (long long)max_ts);
    goto done;
fail:
    PyByteArray_Resize(buf, start);
done:
    Py_XDECREF(values);
    Py_XDECREF(keys);
    Py_XDECREF(headers);
    Py_XDECREF(timestamps);
    return result;
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                  */
/* ------------------------------------------------------------------------ */

enum { MODE_RECORD = 0, MODE_CONSUMER = 1, MODE_COLUMNS = 2, MODE_BUFFERS = 3 };

/* The parts of a ColumnBuffers, in kclient/records/buffers.py's order. */
enum {
    P_OFFSETS, P_TIMESTAMPS, P_TYPES,
    P_KEY_VALID, P_KEY_OFFS, P_KEY_DATA,
    P_VALUE_VALID, P_VALUE_OFFS, P_VALUE_DATA,
    P_HEADERS, N_PARTS
};

/* A bytearray filled up to `used`; its size is the capacity (trimmed to `used` at the end). */
typedef struct {
    PyObject *ba; /* borrowed from the parts list */
    Py_ssize_t used;
} Grow;

typedef struct {
    int mode;
    int64_t start_offset;
    /* MODE_RECORD / MODE_CONSUMER: out; MODE_COLUMNS: the six lists */
    PyObject *out;
    PyObject *cols[6];
    PyObject *topic, *partition, *kd, *vd;
    PyObject *ts_type;
    /* reused between consecutive records with the same timestamp */
    PyObject *last_ts_obj;
    int64_t last_ts;
    /* MODE_BUFFERS: the parts list of a ColumnBuffers (see kclient/records/buffers.py) being built */
    PyObject *parts;
    Grow g[P_HEADERS];  /* validity parts: ba NULL while no record is null */
    PyObject *headers;  /* parts[P_HEADERS]: NULL while no record has headers */
    Py_ssize_t n;       /* records in the buffers */
    int32_t ts_type_i;
    int64_t batch_count; /* records in the batch being decoded (an upper bound of what it adds) */
} Sink;

static PyObject *corrupt(const char *fmt, ...) {
    va_list va;
    va_start(va, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (msg) {
        PyErr_SetObject(CorruptError, msg);
        Py_DECREF(msg);
    }
    return NULL;
}

static PyObject *make_tuple(PyObject *type, Py_ssize_t n) {
    PyTypeObject *t = (PyTypeObject *)type;
    return t->tp_alloc(t, n);
}

static int decode_headers(const uint8_t **pp, const uint8_t *end, PyObject **out, int64_t offset) {
    uint64_t z;
    const uint8_t *p = *pp;
    if (get_varint(&p, end, &z) < 0) goto trunc;
    int64_t n = unzigzag(z);
    if (n < 0) {
        corrupt("invalid record header count %lld", (long long)n);
        return -1;
    }
    PyObject *list = PyList_New(0);
    if (!list) return -1;
    for (int64_t i = 0; i < n; i++) {
        if (get_varint(&p, end, &z) < 0) goto trunc_list;
        if (z & 1) {
            Py_DECREF(list);
            corrupt("record header key cannot be null");
            return -1;
        }
        uint64_t klen = z >> 1;
        if (klen > (uint64_t)(end - p)) goto trunc_list;
        PyObject *k = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)klen, "strict");
        if (!k) {
            Py_DECREF(list);
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                corrupt("malformed record at offset %lld: a header key is not UTF-8", (long long)offset);
            }
            return -1;
        }
        p += klen;
        PyObject *v;
        if (get_varint(&p, end, &z) < 0) {
            Py_DECREF(k);
            goto trunc_list;
        }
        if (z & 1) {
            v = Py_NewRef(Py_None);
        } else {
            uint64_t vlen = z >> 1;
            if (vlen > (uint64_t)(end - p)) {
                Py_DECREF(k);
                goto trunc_list;
            }
            v = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)vlen);
            if (!v) {
                Py_DECREF(k);
                Py_DECREF(list);
                return -1;
            }
            p += vlen;
        }
        PyObject *pair = PyTuple_Pack(2, k, v);
        Py_DECREF(k);
        Py_DECREF(v);
        if (!pair || PyList_Append(list, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(list);
            return -1;
        }
        Py_DECREF(pair);
    }
    *pp = p;
    *out = list;
    return 0;
trunc_list:
    Py_DECREF(list);
trunc:
    corrupt("malformed record at offset %lld: its headers run past the end of the batch", (long long)offset);
    return -1;
}

static inline PyObject *ts_object(Sink *s, int64_t ts) {
    if (s->last_ts_obj && s->last_ts == ts) return Py_NewRef(s->last_ts_obj);
    PyObject *o = PyLong_FromLongLong(ts);
    if (!o) return NULL;
    Py_XSETREF(s->last_ts_obj, Py_NewRef(o));
    s->last_ts = ts;
    return o;
}

static int emit(Sink *s, int64_t offset, int64_t ts, PyObject *key, PyObject *value, PyObject *headers) {
    /* steals key, value, headers */
    PyObject *o = NULL, *t = NULL, *rec = NULL;
    if (s->mode == MODE_CONSUMER) {
        if (s->kd != Py_None && key != Py_None) {
            PyObject *k = PyObject_CallOneArg(s->kd, key);
            Py_SETREF(key, k);
            if (!key) goto fail;
        }
        if (s->vd != Py_None && value != Py_None) {
            PyObject *v = PyObject_CallOneArg(s->vd, value);
            Py_SETREF(value, v);
            if (!value) goto fail;
        }
    }
    o = PyLong_FromLongLong(offset);
    t = ts_object(s, ts);
    if (!o || !t) goto fail;
    switch (s->mode) {
    case MODE_RECORD:
        rec = make_tuple(RecordType, 5);
        if (!rec) goto fail;
        PyTuple_SET_ITEM(rec, 0, o);
        PyTuple_SET_ITEM(rec, 1, t);
        PyTuple_SET_ITEM(rec, 2, key);
        PyTuple_SET_ITEM(rec, 3, value);
        PyTuple_SET_ITEM(rec, 4, headers);
        break;
    case MODE_CONSUMER:
        rec = make_tuple(ConsumerRecordType, 8);
        if (!rec) goto fail;
        PyTuple_SET_ITEM(rec, 0, Py_NewRef(s->topic));
        PyTuple_SET_ITEM(rec, 1, Py_NewRef(s->partition));
        PyTuple_SET_ITEM(rec, 2, o);
        PyTuple_SET_ITEM(rec, 3, t);
        PyTuple_SET_ITEM(rec, 4, Py_NewRef(s->ts_type));
        PyTuple_SET_ITEM(rec, 5, key);
        PyTuple_SET_ITEM(rec, 6, value);
        PyTuple_SET_ITEM(rec, 7, headers);
        break;
    default: {
        PyObject *items[6] = {o, t, s->ts_type, key, value, headers};
        int rc = 0;
        for (int i = 0; i < 6 && rc == 0; i++) rc = PyList_Append(s->cols[i], items[i]);
        Py_DECREF(o);
        Py_DECREF(t);
        Py_DECREF(key);
        Py_DECREF(value);
        Py_DECREF(headers);
        return rc;
    }
    }
    if (PyList_Append(s->out, rec) < 0) {
        Py_DECREF(rec);
        return -1;
    }
    Py_DECREF(rec);
    return 0;
fail:
    Py_XDECREF(o);
    Py_XDECREF(t);
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(headers);
    return -1;
}

/* --- MODE_BUFFERS: records appended to a ColumnBuffers' bytearrays --- */

static int grow_reserve(Grow *g, Py_ssize_t extra) {
    Py_ssize_t need = g->used + extra, size = PyByteArray_GET_SIZE(g->ba);
    if (need <= size) return 0;
    Py_ssize_t cap = size > need / 2 ? 2 * size : need;
    return PyByteArray_Resize(g->ba, cap < 256 ? 256 : cap);
}

static inline void grow_put(Grow *g, const void *src, Py_ssize_t n) {
    memcpy(PyByteArray_AS_STRING(g->ba) + g->used, src, (size_t)n);
    g->used += n;
}

/* Take the parts list: check that its buffers agree, and continue after what they hold. */
static int buffers_open(Sink *s, PyObject *parts) {
    if (!PyList_CheckExact(parts) || PyList_GET_SIZE(parts) != N_PARTS) {
        PyErr_SetString(PyExc_TypeError, "parts must be a list of the 10 ColumnBuffers parts");
        return -1;
    }
    s->parts = parts;
    for (int i = 0; i < P_HEADERS; i++) {
        PyObject *o = PyList_GET_ITEM(parts, i);
        if (o == Py_None && (i == P_KEY_VALID || i == P_VALUE_VALID)) {
            s->g[i].ba = NULL;
            s->g[i].used = 0;
            continue;
        }
        if (!PyByteArray_CheckExact(o)) {
            PyErr_Format(PyExc_TypeError, "ColumnBuffers part %d must be a bytearray", i);
            return -1;
        }
        s->g[i].ba = o;
        s->g[i].used = PyByteArray_GET_SIZE(o);
    }
    PyObject *h = PyList_GET_ITEM(parts, P_HEADERS);
    if (h != Py_None && !PyList_CheckExact(h)) {
        PyErr_SetString(PyExc_TypeError, "ColumnBuffers headers must be a list or None");
        return -1;
    }
    s->headers = h == Py_None ? NULL : h;
    Py_ssize_t n = s->g[P_OFFSETS].used / 8;
    int ok = s->g[P_OFFSETS].used == 8 * n && s->g[P_TIMESTAMPS].used == 8 * n && s->g[P_TYPES].used == 4 * n;
    for (int b = P_KEY_VALID; b <= P_VALUE_VALID; b += 3) {
        ok = ok && s->g[b + 1].used == 4 * (n + 1) && (!s->g[b].ba || s->g[b].used == (n + 7) / 8);
        if (ok) {
            int32_t last;
            memcpy(&last, PyByteArray_AS_STRING(s->g[b + 1].ba) + 4 * n, 4);
            ok = last == s->g[b + 2].used;
        }
    }
    if (!ok || (s->headers && PyList_GET_SIZE(s->headers) != n)) {
        PyErr_SetString(PyExc_ValueError, "the ColumnBuffers parts do not agree in length");
        return -1;
    }
    s->n = n;
    return 0;
}

/* Trim every buffer to what it holds. */
static int buffers_close(Sink *s) {
    int rc = 0;
    for (int i = 0; i < P_HEADERS; i++)
        if (s->g[i].ba && PyByteArray_Resize(s->g[i].ba, s->g[i].used) < 0) rc = -1;
    return rc;
}

/* Room for one more batch of `count` records (fixed-width columns; data grows per record). */
static int buffers_reserve(Sink *s, int64_t count) {
    static const int width[P_HEADERS] = {8, 8, 4, 0, 4, 0, 0, 4, 0};
    s->batch_count = count;
    for (int i = 0; i < P_HEADERS; i++) {
        Grow *g = &s->g[i];
        if (!g->ba) continue;
        if (i == P_KEY_VALID || i == P_VALUE_VALID) {
            Py_ssize_t extra = (Py_ssize_t)(count / 8 + 2);
            if (grow_reserve(g, extra) < 0) return -1;
            memset(PyByteArray_AS_STRING(g->ba) + g->used, 0, (size_t)(PyByteArray_GET_SIZE(g->ba) - g->used));
        } else if (width[i] && grow_reserve(g, (Py_ssize_t)count * width[i]) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Room for every record of the complete batches in [b, b + n) at once (one allocation
 * per buffer rather than a doubling per batch): their counts, and for the values their
 * bodies (the values cannot take more, unless compressed). Checks nothing: the decode
 * loop does. */
static int buffers_presize(Sink *s, const uint8_t *b, Py_ssize_t n) {
    int64_t count = 0;
    Py_ssize_t body = 0, pos = 0;
    while (n - pos >= HEADER_SIZE) {
        int32_t length = (int32_t)be32(b + pos + 8);
        if (length < MIN_BATCH_LENGTH || pos + (Py_ssize_t)length + LOG_OVERHEAD > n) break;
        int32_t c = (int32_t)be32(b + pos + 57);
        Py_ssize_t records = (Py_ssize_t)length + LOG_OVERHEAD - HEADER_SIZE;
        if (!(be16(b + pos + 21) & 0x07)) { /* compressed batches reserve as they are inflated */
            count += c < records / MIN_RECORD_SIZE ? (c > 0 ? c : 0) : records / MIN_RECORD_SIZE;
            body += records;
        }
        pos += (Py_ssize_t)length + LOG_OVERHEAD;
    }
    if (buffers_reserve(s, count) < 0) return -1;
    if (body > INT32_MAX) body = INT32_MAX;
    return grow_reserve(&s->g[P_VALUE_DATA], body); /* keys are mostly small or null: they grow as they come */
}

/* A validity bitmap for the first null: every record before it is valid. */
static int validity_create(Sink *s, int slot) {
    Py_ssize_t n = s->n, size = (n + (Py_ssize_t)s->batch_count) / 8 + 2;
    PyObject *ba = PyByteArray_FromStringAndSize(NULL, size);
    if (!ba) return -1;
    uint8_t *p = (uint8_t *)PyByteArray_AS_STRING(ba);
    memset(p, 0, (size_t)size);
    memset(p, 0xFF, (size_t)(n >> 3));
    if (n & 7) p[n >> 3] = (uint8_t)((1u << (n & 7)) - 1);
    PyList_SetItem(s->parts, slot, ba); /* steals; drops the None */
    s->g[slot].ba = ba;
    s->g[slot].used = (n + 7) >> 3;
    return 0;
}

static int binary_put(Sink *s, int slot, const uint8_t *ptr, Py_ssize_t len) {
    Grow *valid = &s->g[slot], *offs = &s->g[slot + 1], *data = &s->g[slot + 2];
    Py_ssize_t i = s->n;
    if (!ptr) {
        if (!valid->ba && validity_create(s, slot) < 0) return -1;
    } else {
        if (len) {
            if (data->used + len > INT32_MAX) {
                PyErr_SetString(PyExc_OverflowError, "a ColumnBuffers binary column holds at most 2 GiB");
                return -1;
            }
            if (grow_reserve(data, len) < 0) return -1;
            grow_put(data, ptr, len);
        }
        if (valid->ba) PyByteArray_AS_STRING(valid->ba)[i >> 3] |= (char)(1u << (i & 7));
    }
    if (valid->ba) valid->used = (i + 8) >> 3;
    int32_t end = (int32_t)data->used;
    grow_put(offs, &end, 4);
    return 0;
}

/* Append one record (steals headers, NULL when it has none). */
static int buffers_emit(Sink *s, int64_t offset, int64_t ts, const uint8_t *kp, Py_ssize_t klen, const uint8_t *vp,
                        Py_ssize_t vlen, PyObject *headers) {
    if (headers || s->headers) {
        if (!s->headers) { /* the first record with headers: every one before has none */
            PyObject *list = PyList_New(s->n);
            if (!list) goto fail;
            for (Py_ssize_t i = 0; i < s->n; i++) {
                PyObject *e = PyList_New(0);
                if (!e) {
                    Py_DECREF(list);
                    goto fail;
                }
                PyList_SET_ITEM(list, i, e);
            }
            PyList_SetItem(s->parts, P_HEADERS, list);
            s->headers = list;
        }
        if (!headers && !(headers = PyList_New(0))) return -1;
        int rc = PyList_Append(s->headers, headers);
        Py_DECREF(headers);
        if (rc < 0) return -1;
    }
    if (binary_put(s, P_KEY_VALID, kp, klen) < 0 || binary_put(s, P_VALUE_VALID, vp, vlen) < 0) return -1;
    grow_put(&s->g[P_OFFSETS], &offset, 8);
    grow_put(&s->g[P_TIMESTAMPS], &ts, 8);
    grow_put(&s->g[P_TYPES], &s->ts_type_i, 4);
    s->n++;
    return 0;
fail:
    Py_XDECREF(headers);
    return -1;
}

/* What a batch may undo. */
typedef struct {
    Py_ssize_t n;
    Py_ssize_t used[P_HEADERS];
    int had_valid[2], had_headers;
} Mark;

static void buffers_mark(Sink *s, Mark *m) {
    m->n = s->n;
    for (int i = 0; i < P_HEADERS; i++) m->used[i] = s->g[i].used;
    m->had_valid[0] = s->g[P_KEY_VALID].ba != NULL;
    m->had_valid[1] = s->g[P_VALUE_VALID].ba != NULL;
    m->had_headers = s->headers != NULL;
}

/* Drop what the batch after `m` added (nothing of it is kept when it does not decode). */
static int buffers_undo(Sink *s, const Mark *m) {
    Py_ssize_t n = m->n;
    s->n = n;
    for (int i = 0; i < P_HEADERS; i++) s->g[i].used = m->used[i];
    for (int k = 0; k < 2; k++) {
        int slot = k ? P_VALUE_VALID : P_KEY_VALID;
        Grow *g = &s->g[slot];
        if (!g->ba) continue;
        if (!m->had_valid[k]) {
            PyList_SetItem(s->parts, slot, Py_NewRef(Py_None));
            g->ba = NULL;
            g->used = 0;
        } else if (n & 7) {
            PyByteArray_AS_STRING(g->ba)[n >> 3] &= (char)((1u << (n & 7)) - 1);
        }
    }
    if (s->headers && !m->had_headers) {
        PyList_SetItem(s->parts, P_HEADERS, Py_NewRef(Py_None));
        s->headers = NULL;
    } else if (s->headers) {
        return PyList_SetSlice(s->headers, n, PyList_GET_SIZE(s->headers), NULL);
    }
    return 0;
}

/* Decode `count` records from [p, end); 0 or -1 with the error set. */
static int decode_body(const uint8_t *p, const uint8_t *end, int64_t count, int64_t base_offset, int64_t first_ts,
                       int log_append, int64_t max_ts, Sink *s) {
    uint64_t z;
    if (s->mode == MODE_BUFFERS) { /* room for what the body can hold, whatever count claims */
        int64_t most = (int64_t)(end - p) / MIN_RECORD_SIZE;
        if (buffers_reserve(s, count < most ? count : most) < 0) return -1;
    }
    for (int64_t i = 0; i < count; i++) {
        uint64_t zl;
        if (get_varint(&p, end, &zl) < 0) goto malformed;
        const uint8_t *start = p;
        if (p >= end) goto malformed;
        p++; /* attributes */
        if (get_varint(&p, end, &z) < 0) goto malformed;
        int64_t ts = log_append ? max_ts : (int64_t)((uint64_t)first_ts + (uint64_t)unzigzag(z));
        if (get_varint(&p, end, &z) < 0) goto malformed;
        int64_t offset = (int64_t)((uint64_t)base_offset + (uint64_t)unzigzag(z));
        /* key */
        if (get_varint(&p, end, &z) < 0) goto malformed;
        const uint8_t *kp = NULL;
        uint64_t klen = 0;
        if (!(z & 1)) {
            klen = z >> 1;
            if (klen > (uint64_t)(end - p)) goto malformed;
            kp = p;
            p += klen;
        }
        /* value */
        if (get_varint(&p, end, &z) < 0) goto malformed;
        const uint8_t *vp = NULL;
        uint64_t vlen = 0;
        if (!(z & 1)) {
            vlen = z >> 1;
            if (vlen > (uint64_t)(end - p)) goto malformed;
            vp = p;
            p += vlen;
        }
        /* headers (NULL: none) */
        PyObject *headers = NULL;
        if (p >= end) goto malformed;
        if (*p) {
            if (decode_headers(&p, end, &headers, offset) < 0) return -1;
        } else {
            p++;
        }
        if ((uint64_t)(p - start) << 1 != zl) {
            Py_XDECREF(headers);
            corrupt("record at offset %lld declares %lld bytes but holds %lld", (long long)offset,
                    (long long)unzigzag(zl), (long long)(p - start));
            return -1;
        }
        if (offset < s->start_offset) {
            Py_XDECREF(headers);
            continue;
        }
        if (s->mode == MODE_BUFFERS) {
            if (buffers_emit(s, offset, ts, kp, (Py_ssize_t)klen, vp, (Py_ssize_t)vlen, headers) < 0) return -1;
            continue;
        }
        if (!headers && !(headers = PyList_New(0))) return -1;
        PyObject *key = kp ? PyBytes_FromStringAndSize((const char *)kp, (Py_ssize_t)klen) : Py_NewRef(Py_None);
        PyObject *value = vp ? PyBytes_FromStringAndSize((const char *)vp, (Py_ssize_t)vlen) : Py_NewRef(Py_None);
        if (!key || !value) {
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_DECREF(headers);
            return -1;
        }
        if (emit(s, offset, ts, key, value, headers) < 0) return -1;
    }
    if (p != end) {
        corrupt("batch at base offset %lld: %lld records decoded but %+lld bytes remain", (long long)base_offset,
                (long long)count, (long long)(end - p));
        return -1;
    }
    return 0;
malformed:
    corrupt("malformed record in batch at base offset %lld: a record runs past the end of the batch",
            (long long)base_offset);
    return -1;
}

static int get_read_buffer(PyObject *obj, Py_buffer *view) { return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE); }

/* decode_records(data, start, end, count, base_offset, first_ts, log_append_ts or None) -> list[Record] */
static PyObject *py_decode_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "decode_records takes 7 arguments");
        return NULL;
    }
    int64_t start, end, count, base_offset, first_ts, max_ts = 0;
    if (as_i64(args[1], &start) < 0 || as_i64(args[2], &end) < 0 || as_i64(args[3], &count) < 0 ||
        as_i64(args[4], &base_offset) < 0 || as_i64(args[5], &first_ts) < 0)
        return NULL;
    int log_append = args[6] != Py_None;
    if (log_append && as_i64(args[6], &max_ts) < 0) return NULL;
    Py_buffer view;
    if (get_read_buffer(args[0], &view) < 0) return NULL;
    if (start < 0 || end > view.len || start > end) {
        PyBuffer_Release(&view);
        return corrupt("records [%lld, %lld) lie outside the buffer", (long long)start, (long long)end);
    }
    Sink s = {0};
    s.mode = MODE_RECORD;
    s.start_offset = INT64_MIN;
    s.out = PyList_New(0);
    if (!s.out) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *base = (const uint8_t *)view.buf;
    int was_enabled = PyGC_Disable(); /* see decode_all */
    int rc = decode_body(base + start, base + end, count, base_offset, first_ts, log_append, max_ts, &s);
    if (was_enabled) PyGC_Enable();
    PyBuffer_Release(&view);
    Py_XDECREF(s.last_ts_obj);
    if (rc < 0) {
        Py_DECREF(s.out);
        return NULL;
    }
    return s.out;
}

static Py_ssize_t sink_len(Sink *s) {
    return PyList_GET_SIZE(s->mode == MODE_COLUMNS ? s->cols[0] : s->out);
}

static int sink_truncate(Sink *s, Py_ssize_t n) {
    if (s->mode == MODE_COLUMNS) {
        for (int i = 0; i < 6; i++)
            if (PyList_SetSlice(s->cols[i], n, PyList_GET_SIZE(s->cols[i]), NULL) < 0) return -1;
        return 0;
    }
    return PyList_SetSlice(s->out, n, PyList_GET_SIZE(s->out), NULL);
}

/* The batch loop of decode_consumer_records / decode_columns: shape, CRC, skip control
 * batches and batches below start_offset, decode the rest. */
static int decode_all_gc(PyObject *bufobj, Sink *s);

/* The cyclic GC is paused while records are made: they hold no cycles, and a
 * collection every few hundred new tuples (a full one now and then, over every
 * record the application still holds) costs more than the decoding itself. */
static int decode_all(PyObject *bufobj, Sink *s) {
    int was_enabled = PyGC_Disable();
    int rc = decode_all_gc(bufobj, s);
    if (was_enabled) PyGC_Enable();
    return rc;
}

static int decode_all_gc(PyObject *bufobj, Sink *s) {
    Py_buffer view;
    if (get_read_buffer(bufobj, &view) < 0) return -1;
    const uint8_t *b = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len, pos = 0;
    int rc = 0;
    if (s->mode == MODE_BUFFERS && buffers_presize(s, b, n) < 0) {
        PyBuffer_Release(&view);
        return -1;
    }
    while (n - pos >= HEADER_SIZE) {
        const uint8_t *h = b + pos;
        int32_t length = (int32_t)be32(h + 8);
        if (length < MIN_BATCH_LENGTH) {
            corrupt("batch at position %zd has batchLength %d, less than the minimum %d", pos, (int)length,
                    MIN_BATCH_LENGTH);
            rc = -1;
            break;
        }
        Py_ssize_t end = pos + (Py_ssize_t)length + LOG_OVERHEAD;
        if (end > n) break;
        int64_t base_offset = (int64_t)be64(h);
        int magic = (int8_t)h[16];
        uint32_t crc = be32(h + 17);
        int attributes = be16(h + 21);
        int32_t last_delta = (int32_t)be32(h + 23);
        int64_t first_ts = (int64_t)be64(h + 27);
        int64_t max_ts = (int64_t)be64(h + 35);
        int32_t count = (int32_t)be32(h + 57);
        if (magic != 2) {
            corrupt("batch at position %zd has magic %d, only magic 2 is supported", pos, magic);
            rc = -1;
            break;
        }
        if (count < 0) {
            corrupt("batch at position %zd has a negative record count %d", pos, (int)count);
            rc = -1;
            break;
        }
        int codec = attributes & 0x07;
        if (codec > 4) {
            corrupt("batch at position %zd has unknown compression codec %d", pos, codec);
            rc = -1;
            break;
        }
        uint32_t computed = crc32c_update(0, h + 21, (size_t)(end - pos - 21));
        if (computed != crc) {
            corrupt("batch at position %zd (base offset %lld) fails its CRC check: stored 0x%08x, computed 0x%08x",
                    pos, (long long)base_offset, crc, computed);
            rc = -1;
            break;
        }
        if ((attributes & 0x20) || base_offset + (int64_t)last_delta < s->start_offset) {
            pos = end;
            continue;
        }
        s->ts_type = (attributes & 0x08) ? SmallOne : SmallZero;
        s->ts_type_i = (attributes & 0x08) ? 1 : 0;
        Py_ssize_t before = 0;
        Mark mark = {0};
        if (s->mode == MODE_BUFFERS) {
            buffers_mark(s, &mark);
        } else {
            before = sink_len(s);
        }
        if (codec) {
            PyObject *mv = PyMemoryView_FromMemory((char *)(h + HEADER_SIZE), end - pos - HEADER_SIZE, PyBUF_READ);
            PyObject *codec_obj = mv ? PyLong_FromLong(codec) : NULL;
            PyObject *raw = codec_obj ? PyObject_CallFunctionObjArgs(Decompress, codec_obj, mv, NULL) : NULL;
            Py_XDECREF(codec_obj);
            if (mv) { /* the callee must not keep a view of our buffer */
                PyObject *et = NULL, *ev = NULL, *tb = NULL;
                if (!raw) PyErr_Fetch(&et, &ev, &tb);
                PyObject *r = PyObject_CallMethod(mv, "release", NULL);
                if (!raw) {
                    Py_XDECREF(r);
                    PyErr_Restore(et, ev, tb);
                } else if (!r) {
                    Py_CLEAR(raw);
                } else {
                    Py_DECREF(r);
                }
                Py_DECREF(mv);
            }
            if (!raw) {
                rc = -1;
                break;
            }
            Py_buffer rv;
            if (get_read_buffer(raw, &rv) < 0) {
                Py_DECREF(raw);
                rc = -1;
                break;
            }
            const uint8_t *rb = (const uint8_t *)rv.buf;
            rc = decode_body(rb, rb + rv.len, count, base_offset, first_ts, attributes & 0x08, max_ts, s);
            PyBuffer_Release(&rv);
            Py_DECREF(raw);
        } else {
            rc = decode_body(h + HEADER_SIZE, b + end, count, base_offset, first_ts, attributes & 0x08, max_ts, s);
        }
        if (rc < 0) {
            PyObject *et, *ev, *tb;
            PyErr_Fetch(&et, &ev, &tb);
            if (s->mode == MODE_BUFFERS)
                buffers_undo(s, &mark);
            else
                sink_truncate(s, before);
            PyErr_Restore(et, ev, tb);
            break;
        }
        pos = end;
    }
    PyBuffer_Release(&view);
    Py_CLEAR(s->last_ts_obj);
    return rc;
}

/* decode_consumer_records(buf, topic, partition, start_offset, kd, vd, out) -> out */
static PyObject *py_decode_consumer_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "decode_consumer_records takes 7 arguments");
        return NULL;
    }
    Sink s = {0};
    s.mode = MODE_CONSUMER;
    if (as_i64(args[3], &s.start_offset) < 0) return NULL;
    s.topic = args[1];
    s.partition = args[2];
    s.kd = args[4];
    s.vd = args[5];
    if (!PyList_Check(args[6])) {
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        return NULL;
    }
    s.out = args[6];
    if (decode_all(args[0], &s) < 0) return NULL;
    return Py_NewRef(s.out);
}

/* decode_columns(buf, start_offset, offsets, timestamps, timestamp_types, keys, values, headers) -> None */
static PyObject *py_decode_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "decode_columns takes 8 arguments");
        return NULL;
    }
    Sink s = {0};
    s.mode = MODE_COLUMNS;
    if (as_i64(args[1], &s.start_offset) < 0) return NULL;
    for (int i = 0; i < 6; i++) {
        if (!PyList_Check(args[2 + i])) {
            PyErr_SetString(PyExc_TypeError, "columns must be lists");
            return NULL;
        }
        s.cols[i] = args[2 + i];
    }
    if (decode_all(args[0], &s) < 0) return NULL;
    Py_RETURN_NONE;
}

/* decode_buffers(buf, start_offset, parts) -> None: appends to a ColumnBuffers' parts list */
static PyObject *py_decode_buffers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "decode_buffers takes 3 arguments");
        return NULL;
    }
    Sink s = {0};
    s.mode = MODE_BUFFERS;
    if (as_i64(args[1], &s.start_offset) < 0 || buffers_open(&s, args[2]) < 0) return NULL;
    int rc = decode_all(args[0], &s);
    if (rc < 0) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        buffers_close(&s);
        PyErr_Restore(et, ev, tb);
        return NULL;
    }
    if (buffers_close(&s) < 0) return NULL;
    Py_RETURN_NONE;
}

/* Records [start, start + n) of an Arrow binary column as a new list of bytes / None. */
static PyObject *binary_list(PyObject *validobj, PyObject *offsobj, PyObject *dataobj, Py_ssize_t start, Py_ssize_t n) {
    Py_buffer valid = {0}, offs = {0}, data = {0};
    int has_valid = validobj != Py_None;
    PyObject *list = NULL;
    if (has_valid && get_read_buffer(validobj, &valid) < 0) return NULL;
    if (get_read_buffer(offsobj, &offs) < 0) goto done;
    if (get_read_buffer(dataobj, &data) < 0) goto done;
    if (start < 0 || n < 0 || (start + n + 1) * 4 > offs.len || (has_valid && (start + n + 7) / 8 > valid.len)) {
        PyErr_SetString(PyExc_ValueError, "ColumnBuffers: records outside the buffers");
        goto done;
    }
    list = PyList_New(n);
    if (!list) goto done;
    const uint8_t *bits = (const uint8_t *)valid.buf, *d = (const uint8_t *)data.buf;
    const char *o = (const char *)offs.buf + 4 * start;
    int32_t a, b;
    memcpy(&a, o, 4);
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(&b, o + 4 * (i + 1), 4);
        PyObject *item;
        Py_ssize_t bit = start + i;
        if (has_valid && !(bits[bit >> 3] & (1u << (bit & 7)))) {
            item = Py_NewRef(Py_None);
        } else if (a < 0 || b < a || b > data.len) {
            PyErr_SetString(PyExc_ValueError, "ColumnBuffers: an offset outside the data");
            Py_CLEAR(list);
            goto done;
        } else if (!(item = PyBytes_FromStringAndSize((const char *)d + a, b - a))) {
            Py_CLEAR(list);
            goto done;
        }
        PyList_SET_ITEM(list, i, item);
        a = b;
    }
done:
    if (valid.obj) PyBuffer_Release(&valid);
    if (offs.obj) PyBuffer_Release(&offs);
    if (data.obj) PyBuffer_Release(&data);
    return list;
}

/* Records [start, start + n) of a fixed-width column as a new list of ints (a run of
 * equal values shares one int object, as decode_columns' timestamps do). */
static PyObject *int_list(PyObject *obj, Py_ssize_t start, Py_ssize_t n, int width) {
    Py_buffer view;
    if (get_read_buffer(obj, &view) < 0) return NULL;
    PyObject *list = NULL, *last = NULL;
    int64_t last_v = 0;
    if (start < 0 || n < 0 || (start + n) * width > view.len) {
        PyErr_SetString(PyExc_ValueError, "ColumnBuffers: records outside the buffers");
        goto done;
    }
    list = PyList_New(n);
    if (!list) goto done;
    const char *p = (const char *)view.buf + start * width;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v;
        if (width == 8) {
            memcpy(&v, p + 8 * i, 8);
        } else {
            int32_t v32;
            memcpy(&v32, p + 4 * i, 4);
            v = v32;
        }
        if (!last || v != last_v) {
            PyObject *o = PyLong_FromLongLong(v);
            if (!o) {
                Py_CLEAR(list);
                goto done;
            }
            Py_XSETREF(last, o);
            last_v = v;
        }
        PyList_SET_ITEM(list, i, Py_NewRef(last));
    }
done:
    Py_XDECREF(last);
    PyBuffer_Release(&view);
    return list;
}

/* columns_of(parts, start, n) -> (offsets, timestamps, timestamp_types, keys, values, headers):
 * records [start, start + n) of a ColumnBuffers' parts as RecordColumns' lists */
static PyObject *py_columns_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "columns_of takes 3 arguments");
        return NULL;
    }
    int64_t start, n;
    if (as_i64(args[1], &start) < 0 || as_i64(args[2], &n) < 0) return NULL;
    PyObject *parts = args[0];
    if (!PyList_CheckExact(parts) || PyList_GET_SIZE(parts) != N_PARTS) {
        PyErr_SetString(PyExc_TypeError, "parts must be a list of the 10 ColumnBuffers parts");
        return NULL;
    }
    PyObject *out = PyTuple_New(6);
    if (!out) return NULL;
    int was_enabled = PyGC_Disable(); /* see decode_all */
    PyObject *item;
#define PART(i) PyList_GET_ITEM(parts, i)
    if (!(item = int_list(PART(P_OFFSETS), start, n, 8))) goto fail;
    PyTuple_SET_ITEM(out, 0, item);
    if (!(item = int_list(PART(P_TIMESTAMPS), start, n, 8))) goto fail;
    PyTuple_SET_ITEM(out, 1, item);
    if (!(item = int_list(PART(P_TYPES), start, n, 4))) goto fail;
    PyTuple_SET_ITEM(out, 2, item);
    if (!(item = binary_list(PART(P_KEY_VALID), PART(P_KEY_OFFS), PART(P_KEY_DATA), start, n))) goto fail;
    PyTuple_SET_ITEM(out, 3, item);
    if (!(item = binary_list(PART(P_VALUE_VALID), PART(P_VALUE_OFFS), PART(P_VALUE_DATA), start, n))) goto fail;
    PyTuple_SET_ITEM(out, 4, item);
    PyObject *h = PART(P_HEADERS);
#undef PART
    if (h != Py_None) {
        if (!PyList_CheckExact(h) || start + n > PyList_GET_SIZE(h)) {
            PyErr_SetString(PyExc_ValueError, "ColumnBuffers: records outside the headers");
            goto fail;
        }
        item = PyList_GetSlice(h, start, start + n);
    } else if ((item = PyList_New(n))) {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *e = PyList_New(0);
            if (!e) {
                Py_CLEAR(item);
                break;
            }
            PyList_SET_ITEM(item, i, e);
        }
    }
    if (!item) goto fail;
    PyTuple_SET_ITEM(out, 5, item);
    if (was_enabled) PyGC_Enable();
    return out;
fail:
    if (was_enabled) PyGC_Enable();
    Py_DECREF(out);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* The broker's walk                                                         */
/* ------------------------------------------------------------------------ */

static PyObject *walk_error(const char *fmt, ...) {
    va_list va;
    va_start(va, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (msg) {
        PyErr_SetObject(PyExc_ValueError, msg);
        Py_DECREF(msg);
    }
    return NULL;
}

/* walk_records(data, start, end, count) -> position after the last record; ValueError if malformed */
#define WALK_VARINT(ptr, out)                          \
    do {                                               \
        int r_ = get_varint(&(ptr), end, &(out));      \
        if (r_ == -2) goto long_varint;                \
        if (r_ < 0) goto past;                         \
    } while (0)

static PyObject *py_walk_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "walk_records takes 4 arguments");
        return NULL;
    }
    int64_t start, endpos, count;
    if (as_i64(args[1], &start) < 0 || as_i64(args[2], &endpos) < 0 || as_i64(args[3], &count) < 0) return NULL;
    Py_buffer view;
    if (get_read_buffer(args[0], &view) < 0) return NULL;
    if (start < 0 || endpos > view.len || start > endpos) {
        PyBuffer_Release(&view);
        return walk_error("records [%lld, %lld) lie outside the buffer of %zd bytes", (long long)start,
                          (long long)endpos, view.len);
    }
    const uint8_t *base = (const uint8_t *)view.buf;
    const uint8_t *p = base + start, *end = base + endpos;
    PyObject *result = NULL;
    uint64_t z, zl;
    int64_t i;
    for (i = 0; i < count; i++) {
        if (p >= end) {
            walk_error("the records end after %lld of %lld", (long long)i, (long long)count);
            goto done;
        }
        int vr = get_varint(&p, end, &zl);
        if (vr == -2) goto long_varint;
        if (vr < 0) goto past;
        const uint8_t *q = p;
        if (q >= end) goto past;
        q++; /* attributes */
        WALK_VARINT(q, z); /* timestampDelta */
        WALK_VARINT(q, z);
        if (z != (uint64_t)i << 1) {
            walk_error("record %lld has offsetDelta %lld", (long long)i, (long long)unzigzag(z));
            goto done;
        }
        WALK_VARINT(q, z);
        if (!(z & 1)) {
            if ((z >> 1) > (uint64_t)(end - q)) goto past;
            q += z >> 1;
        }
        WALK_VARINT(q, z);
        if (!(z & 1)) {
            if ((z >> 1) > (uint64_t)(end - q)) goto past;
            q += z >> 1;
        }
        if (q >= end) goto past;
        if (*q) {
            WALK_VARINT(q, z);
            if (z & 1) {
                walk_error("a negative header count %lld", (long long)unzigzag(z));
                goto done;
            }
            for (uint64_t h = 0, nh = z >> 1; h < nh; h++) {
                WALK_VARINT(q, z);
                if (z & 1) {
                    walk_error("a record header with a null key");
                    goto done;
                }
                if ((z >> 1) > (uint64_t)(end - q)) goto past;
                PyObject *k = PyUnicode_DecodeUTF8((const char *)q, (Py_ssize_t)(z >> 1), "strict");
                if (!k) {
                    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                        PyErr_Clear();
                        walk_error("a record header key that is not valid utf-8");
                    }
                    goto done;
                }
                Py_DECREF(k);
                q += z >> 1;
                WALK_VARINT(q, z);
                if (!(z & 1)) {
                    if ((z >> 1) > (uint64_t)(end - q)) goto past;
                    q += z >> 1;
                }
            }
        } else {
            q++;
        }
        if ((uint64_t)(q - p) << 1 != zl) {
            walk_error("record %lld declares %lld bytes but its fields take %lld", (long long)i,
                       (long long)unzigzag(zl), (long long)(q - p));
            goto done;
        }
        p = q;
    }
    result = PyLong_FromSsize_t((Py_ssize_t)(p - base));
    goto done;
past:
    walk_error("record %lld is a record running past the end of the batch", (long long)i);
    goto done;
long_varint:
    walk_error("record %lld has a varint longer than 10 bytes", (long long)i);
done:
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------------ */
/* Module                                                                    */
/* ------------------------------------------------------------------------ */

static PyObject *py_crc32c(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "crc32c(data, crc=0)");
        return NULL;
    }
    uint32_t crc = 0;
    if (nargs == 2) {
        unsigned long v = PyLong_AsUnsignedLong(args[1]);
        if (v == (unsigned long)-1 && PyErr_Occurred()) return NULL;
        crc = (uint32_t)v;
    }
    Py_buffer view;
    if (get_read_buffer(args[0], &view) < 0) return NULL;
    uint32_t c;
    if (view.len > 4096) {
        Py_BEGIN_ALLOW_THREADS c = crc32c_update(crc, (const uint8_t *)view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        c = crc32c_update(crc, (const uint8_t *)view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyObject *py_configure(PyObject *self, PyObject *args) {
    PyObject *rt, *crt, *err, *dec;
    if (!PyArg_ParseTuple(args, "O!O!OO", &PyType_Type, &rt, &PyType_Type, &crt, &err, &dec)) return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)rt, &PyTuple_Type) || !PyType_IsSubtype((PyTypeObject *)crt, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "record types must be tuple subclasses");
        return NULL;
    }
    Py_XSETREF(RecordType, Py_NewRef(rt));
    Py_XSETREF(ConsumerRecordType, Py_NewRef(crt));
    Py_XSETREF(CorruptError, Py_NewRef(err));
    Py_XSETREF(Decompress, Py_NewRef(dec));
    Py_RETURN_NONE;
}

static PyObject *py_hardware_crc(PyObject *self, PyObject *unused) { return PyBool_FromLong(crc_hw); }

static PyMethodDef methods[] = {
    {"configure", py_configure, METH_VARARGS, "configure(Record, ConsumerRecord, CorruptRecordError, decompress)"},
    {"crc32c", (PyCFunction)(void (*)(void))py_crc32c, METH_FASTCALL, "crc32c(data, crc=0) -> int"},
    {"hardware_crc", py_hardware_crc, METH_NOARGS, "Whether CRC-32C uses SSE4.2."},
    {"append_record", (PyCFunction)(void (*)(void))py_append_record, METH_FASTCALL,
     "append_record(buf, offset_delta, timestamp_delta, key, value, headers, limit) -> bool"},
    {"record_size", (PyCFunction)(void (*)(void))py_record_size, METH_FASTCALL,
     "record_size(offset_delta, timestamp_delta, key, value, headers) -> int"},
    {"encode_records", (PyCFunction)(void (*)(void))py_encode_records, METH_FASTCALL,
     "encode_records(buf, count, first_ts, max_ts, values, keys, headers, timestamps, base_ts) -> (first, max)"},
    {"decode_records", (PyCFunction)(void (*)(void))py_decode_records, METH_FASTCALL,
     "decode_records(data, start, end, count, base_offset, first_ts, log_append_ts) -> list[Record]"},
    {"decode_consumer_records", (PyCFunction)(void (*)(void))py_decode_consumer_records, METH_FASTCALL,
     "decode_consumer_records(buf, topic, partition, start_offset, kd, vd, out) -> out"},
    {"decode_columns", (PyCFunction)(void (*)(void))py_decode_columns, METH_FASTCALL,
     "decode_columns(buf, start_offset, offsets, timestamps, types, keys, values, headers) -> None"},
    {"decode_buffers", (PyCFunction)(void (*)(void))py_decode_buffers, METH_FASTCALL,
     "decode_buffers(buf, start_offset, parts) -> None (appends to a ColumnBuffers' parts)"},
    {"columns_of", (PyCFunction)(void (*)(void))py_columns_of, METH_FASTCALL,
     "columns_of(parts, start, n) -> (offsets, timestamps, types, keys, values, headers) lists"},
    {"walk_records", (PyCFunction)(void (*)(void))py_walk_records, METH_FASTCALL,
     "walk_records(data, start, end, count) -> end position; ValueError if a record is malformed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "kclient._crecords", "Compiled RecordBatch v2 hot loops (see kclient/records/).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__crecords(void) {
    crc_init();
#ifdef HAVE_SSE42_PATH
    shift_init(shift1, STREAM);
    shift_init(shift2, 2 * STREAM);
#endif
    SmallZero = PyLong_FromLong(0);
    SmallOne = PyLong_FromLong(1);
    if (!SmallZero || !SmallOne) return NULL;
    return PyModule_Create(&moduledef);
}
