/* Streaming SafeTensors writer: declare tensors, then stream their bytes. */
#include "st_sink.h"
#include "stz_safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The output in messages. */
#define WNAME(w) ((w)->sink ? (w)->sink_name : (w)->out.path ? (w)->out.path : "standard output")

typedef struct {
    char *name;
    stz_dtype dtype;
    int ndim;
    uint64_t *shape;
    uint64_t nbytes;
} wtensor;

struct stz_writer {
    stz_outfile out;
    const stz_wsink *sink; /* NULL: bytes go to out */
    char *sink_name;
    char **meta; /* key, value pairs; meta[0] is "format" */
    size_t nmeta, cap_meta;
    wtensor *t;
    size_t nt, cap_t;
    size_t *hash; /* open addressing over t[], holds index+1; 0 is empty */
    size_t hash_cap;
    uint64_t total, written;
    int started;
};

/* Growable text buffer for the header. */
typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_json_str(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c;
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_put(b, esc, 6);
        } else {
            sb_put(b, (const char *)s, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static void sb_u64(sbuf *b, uint64_t v)
{
    char num[24];
    sb_put(b, num, (size_t)snprintf(num, sizeof num, "%llu", (unsigned long long)v));
}

static stz_status check_text(const stz_writer *w, const char *what, const char *s, stz_err *err)
{
    size_t n = strlen(s);
    if (stz_utf8_check((const uint8_t *)s, n) != n)
        return stz_err_set(err, STZ_E_ARG, "%s: %s '%s' is not valid UTF-8", WNAME(w), what, s);
    return STZ_OK;
}

stz_status stz_writer_open(stz_writer **out, const char *path, unsigned flags, stz_err *err)
{
    *out = NULL;
    stz_writer *w = calloc(1, sizeof *w);
    if (!w)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the writer", path);
    stz_status st = STZ_OK;
    if (!strcmp(path, "-")) /* standard output: written in order (the header first) */
        stz_outfile_stdout(&w->out);
    else
        st = stz_outfile_open(&w->out, path, flags & STZ_WRITE_FORCE, err);
    if (st == STZ_OK)
        st = stz_writer_set_meta(w, "format", "pt", err);
    if (st != STZ_OK) {
        stz_writer_free(w);
        return st;
    }
    *out = w;
    return STZ_OK;
}

stz_status stz_writer_open_sink(stz_writer **out, const char *name, const stz_wsink *sink, stz_err *err)
{
    *out = NULL;
    stz_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->sink_name = strdup(name))) {
        free(w);
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the writer", name);
    }
    w->out = (stz_outfile)STZ_OUTFILE_INIT;
    w->sink = sink;
    stz_status st = stz_writer_set_meta(w, "format", "pt", err);
    if (st != STZ_OK) {
        stz_writer_free(w);
        return st;
    }
    *out = w;
    return STZ_OK;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 1;
    size_t c = *cap ? *cap * 2 : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return 0;
    *p = q;
    *cap = c;
    return 1;
}

stz_status stz_writer_set_meta(stz_writer *w, const char *key, const char *value, stz_err *err)
{
    stz_status st;
    if (w->started)
        return stz_err_set(err, STZ_E_ARG, "%s: metadata set after data was written", WNAME(w));
    if ((st = check_text(w, "metadata key", key, err)) || (st = check_text(w, "metadata value", value, err)))
        return st;
    char *v = strdup(value);
    if (!v)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for a metadata value", WNAME(w));
    for (size_t i = 0; i < w->nmeta; i++)
        if (strcmp(w->meta[2 * i], key) == 0) {
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = v;
            return STZ_OK;
        }
    char *k = strdup(key);
    size_t cap2 = w->cap_meta * 2;
    if (!k || !grow((void **)&w->meta, &cap2, 2 * w->nmeta + 2, sizeof *w->meta)) {
        free(k);
        free(v);
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for a metadata entry", WNAME(w));
    }
    w->cap_meta = cap2 / 2;
    w->meta[2 * w->nmeta] = k;
    w->meta[2 * w->nmeta + 1] = v;
    w->nmeta++;
    return STZ_OK;
}

static size_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (size_t)h;
}

/* Returns the slot holding `name`, or the empty slot where it would go. */
static size_t *hash_slot(const stz_writer *w, const char *name)
{
    size_t mask = w->hash_cap - 1, i = name_hash(name) & mask;
    while (w->hash[i] && strcmp(w->t[w->hash[i] - 1].name, name) != 0)
        i = (i + 1) & mask;
    return &w->hash[i];
}

/* Keeps the table at most half full. */
static int hash_reserve(stz_writer *w, size_t n)
{
    if (2 * n <= w->hash_cap)
        return 1;
    size_t cap = w->hash_cap ? w->hash_cap * 2 : 64;
    while (2 * n > cap)
        cap *= 2;
    size_t *old = w->hash, old_cap = w->hash_cap;
    if (!(w->hash = calloc(cap, sizeof *w->hash))) {
        w->hash = old;
        return 0;
    }
    w->hash_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i])
            *hash_slot(w, w->t[old[i] - 1].name) = old[i];
    free(old);
    return 1;
}

stz_status stz_writer_add(stz_writer *w, const char *name, stz_dtype dtype, int ndim, const uint64_t *shape,
                          stz_err *err)
{
    const char *P = WNAME(w);
    stz_status st;
    if (w->started)
        return stz_err_set(err, STZ_E_ARG, "%s: tensor '%s' declared after data was written", P, name);
    if (!*name || strcmp(name, "__metadata__") == 0)
        return stz_err_set(err, STZ_E_ARG, "%s: '%s' cannot be a tensor name", P, name);
    if ((st = check_text(w, "tensor name", name, err)))
        return st;
    if (!stz_dtype_name(dtype))
        return stz_err_set(err, STZ_E_DTYPE, "%s: tensor '%s': dtype code %d out of range", P, name, (int)dtype);
    if (ndim < 0 || ndim > STZ_ST_MAX_NDIM)
        return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s': %d dimensions", P, name, ndim);
    if (!hash_reserve(w, w->nt + 1))
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the tensor table", P);
    size_t *slot = hash_slot(w, name);
    if (*slot)
        return stz_err_set(err, STZ_E_DUPLICATE, "%s: tensor '%s' declared twice", P, name);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] > (1ull << 53))
            return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s': shape[%d] above 2^53", P, name, i);
        if (shape[i] && numel > UINT64_MAX / shape[i])
            return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s': shape product overflows", P, name);
        numel *= shape[i];
    }
    uint64_t nbytes;
    stz_err sub;
    if (stz_dtype_nbytes(dtype, numel, &nbytes, &sub))
        return stz_err_set(err, sub.code, "%s: tensor '%s': %s", P, name, sub.msg);
    if (!grow((void **)&w->t, &w->cap_t, w->nt + 1, sizeof *w->t))
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the tensor list", P);
    wtensor *t = &w->t[w->nt];
    t->name = strdup(name);
    t->shape = malloc((size_t)ndim * sizeof *shape + 1);
    if (!t->name || !t->shape) {
        free(t->name);
        free(t->shape);
        return stz_err_set(err, STZ_E_NOMEM, "%s: tensor '%s': out of memory for its name and shape", P, name);
    }
    t->dtype = dtype;
    t->ndim = ndim;
    if (ndim)
        memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->nbytes = nbytes;
    w->total += nbytes;
    *slot = ++w->nt;
    return STZ_OK;
}

/* Serialises the header like the reference writer: compact JSON, metadata
 * first, padded with spaces so the data starts on an 8-byte boundary. */
static stz_status write_header(stz_writer *w, stz_err *err)
{
    sbuf b = {0};
    sb_str(&b, "{\"__metadata__\":{");
    for (size_t i = 0; i < w->nmeta; i++) {
        if (i)
            sb_str(&b, ",");
        sb_json_str(&b, w->meta[2 * i]);
        sb_str(&b, ":");
        sb_json_str(&b, w->meta[2 * i + 1]);
    }
    sb_str(&b, "}");
    uint64_t off = 0;
    for (size_t i = 0; i < w->nt; i++) {
        const wtensor *t = &w->t[i];
        sb_str(&b, ",");
        sb_json_str(&b, t->name);
        sb_str(&b, ":{\"dtype\":\"");
        sb_str(&b, stz_dtype_name(t->dtype));
        sb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d)
                sb_str(&b, ",");
            sb_u64(&b, t->shape[d]);
        }
        sb_str(&b, "],\"data_offsets\":[");
        sb_u64(&b, off);
        sb_str(&b, ",");
        sb_u64(&b, off + t->nbytes);
        sb_str(&b, "]}");
        off += t->nbytes;
    }
    sb_str(&b, "}");
    while (!b.oom && b.len % 8) /* an allocation failure leaves len as it is */
        sb_str(&b, " ");
    stz_status st = STZ_OK;
    if (b.oom)
        st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the header", WNAME(w));
    else if (b.len > STZ_ST_MAX_HEADER)
        st = stz_err_set(err, STZ_E_HEADER_SIZE, "%s: header would be %zu bytes, over the %u-byte limit", WNAME(w),
                         b.len, STZ_ST_MAX_HEADER);
    uint8_t *img = st == STZ_OK ? malloc(8 + b.len) : NULL; /* the length, then the JSON */
    if (st == STZ_OK && !img)
        st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the header", WNAME(w));
    if (st == STZ_OK) {
        stz_put_le64(img, b.len);
        memcpy(img + 8, b.p, b.len);
        if (w->sink) {
            stz_span *sp = malloc((w->nt + 1) * sizeof *sp);
            uint64_t at = 0;
            for (size_t i = 0; sp && i < w->nt; at += w->t[i++].nbytes)
                sp[i] =
                    (stz_span){.dtype = w->t[i].dtype, .begin = at, .end = at + w->t[i].nbytes, .name = w->t[i].name};
            st = sp ? w->sink->begin(w->sink->user, img, 8 + b.len, sp, w->nt, err)
                    : stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the tensor spans", WNAME(w));
            free(sp);
        } else {
            st = stz_outfile_write(&w->out, img, 8 + b.len, err);
        }
    }
    free(img);
    free(b.p);
    w->started = 1;
    return st;
}

/* Before n more data bytes: the header out, and room for them. */
static stz_status before_data(stz_writer *w, uint64_t n, stz_err *err)
{
    stz_status st;
    if (!w->started && (st = write_header(w, err)))
        return st;
    if (n > w->total - w->written)
        return stz_err_set(err, STZ_E_BOUNDS, "%s: %llu bytes written past the %llu declared", WNAME(w),
                           (unsigned long long)n, (unsigned long long)w->total);
    return STZ_OK;
}

stz_status stz_writer_write(stz_writer *w, const void *data, size_t n, stz_err *err)
{
    stz_status st;
    if ((st = before_data(w, n, err)) ||
        (st = w->sink ? w->sink->write(w->sink->user, data, n, err) : stz_outfile_write(&w->out, data, n, err)))
        return st;
    w->written += n;
    return STZ_OK;
}

stz_status stz_writer_refer(stz_writer *w, const stz_reader *r, const stz_tensor *t, int *taken, stz_err *err)
{
    stz_status st;
    *taken = 0;
    if (!w->sink || !w->sink->refer)
        return STZ_OK;
    if (!(st = before_data(w, t->end - t->begin, err)) && !(st = w->sink->refer(w->sink->user, r, t, taken, err)) &&
        *taken)
        w->written += t->end - t->begin;
    return st;
}

uint64_t stz_writer_remaining(const stz_writer *w) { return w->total - w->written; }

stz_status stz_writer_finish(stz_writer *w, stz_err *err)
{
    stz_status st;
    if (!w->started && (st = write_header(w, err)))
        return st;
    if (w->written != w->total)
        return stz_err_set(err, STZ_E_BOUNDS, "%s: only %llu of %llu declared data bytes were written", WNAME(w),
                           (unsigned long long)w->written, (unsigned long long)w->total);
    return w->sink ? w->sink->finish(w->sink->user, err) : stz_outfile_commit(&w->out, err);
}

void stz_writer_free(stz_writer *w)
{
    if (!w)
        return;
    stz_outfile_abort(&w->out);
    for (size_t i = 0; i < 2 * w->nmeta; i++)
        free(w->meta[i]);
    for (size_t i = 0; i < w->nt; i++) {
        free(w->t[i].name);
        free(w->t[i].shape);
    }
    free(w->meta);
    free(w->t);
    free(w->hash);
    free(w->sink_name);
    free(w);
}
