/* GGUF: the key/value builder and a strict reader
 * (see stz_gguf.h). All integers in a GGUF file are little-endian. */
#include "gguf_format.h"
#include "gguf_layout.h"
#include "core/stz_core.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- building ------------------------------------------------------------ */

void gb_bytes(gbuf *b, const void *v, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, v, n);
    b->n += n;
}

void gb_u32(gbuf *b, uint32_t v)
{
    uint8_t o[4];
    stz_put_le32(o, v);
    gb_bytes(b, o, 4);
}

void gb_u64(gbuf *b, uint64_t v)
{
    uint8_t o[8];
    stz_put_le64(o, v);
    gb_bytes(b, o, 8);
}

void gb_str(gbuf *b, const char *s, size_t n)
{
    gb_u64(b, n);
    gb_bytes(b, s, n);
}

static void kv_key(gbuf *b, const char *key, uint32_t type)
{
    gb_str(b, key, strlen(key));
    gb_u32(b, type);
    b->count++;
}

void kv_u32(gbuf *b, const char *key, uint32_t v) { kv_key(b, key, GV_U32), gb_u32(b, v); }
void kv_i32(gbuf *b, const char *key, int32_t v) { kv_key(b, key, GV_I32), gb_u32(b, (uint32_t)v); }
void kv_bool(gbuf *b, const char *key, int v)
{
    uint8_t c = v != 0;
    kv_key(b, key, GV_BOOL), gb_bytes(b, &c, 1);
}
void kv_f32(gbuf *b, const char *key, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    kv_key(b, key, GV_F32), gb_u32(b, u);
}
void kv_str(gbuf *b, const char *key, const char *v) { kv_key(b, key, GV_STR), gb_str(b, v, strlen(v)); }
void kv_arr(gbuf *b, const char *key, uint32_t type, uint64_t n)
{
    kv_key(b, key, GV_ARR);
    gb_u32(b, type);
    gb_u64(b, n);
}

void gb_tensor_info(gbuf *b, const char *name, uint32_t ndim, const uint64_t *ne, int type, uint64_t offset)
{
    gb_str(b, name, strlen(name));
    gb_u32(b, ndim);
    for (uint32_t d = 0; d < ndim; d++)
        gb_u64(b, ne[d]);
    gb_u32(b, (uint32_t)type);
    gb_u64(b, offset);
}

void gb_pad(gbuf *b)
{
    static const uint8_t zero[GGUF_ALIGN];
    gb_bytes(b, zero, (GGUF_ALIGN - b->n % GGUF_ALIGN) % GGUF_ALIGN);
}

/* ---- blocks -------------------------------------------------------------- */

/* ---- reading ------------------------------------------------------------- */

typedef struct {
    char *key, *text;
    uint32_t type; /* GV_*, GV_ARR for arrays */
    int whole;     /* num is the value: an integer, or an integer array's every element */
    uint64_t num;
} gkv;

struct stz_gguf {
    uint32_t version;
    gkv *kv;
    size_t nkv, kv_cap; /* read, allocated (entries past nkv may hold a partial read) */
    stz_gguf_tensor *t;
    size_t nt, t_cap;
    char **names;
    int lenient;   /* stz_gguf_layout: any type, offset and alignment */
    uint64_t data; /* where the data section starts */
    uint64_t size; /* of the file */
};

typedef struct {
    const uint8_t *p;
    size_t n, at;
    int bad;
} cur;

static uint64_t rd(cur *c, int n)
{
    if (c->bad || c->n - c->at < (size_t)n)
        return c->bad = 1, 0;
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)c->p[c->at + i] << (8 * i);
    c->at += (size_t)n;
    return v;
}

/* A string, copied and NUL-terminated (NULL when it does not fit the
 * file); *len its length, which counts any NUL inside. */
static char *rd_str_len(cur *c, size_t *len)
{
    uint64_t n = rd(c, 8);
    if (c->bad || n > c->n - c->at)
        return c->bad = 1, NULL;
    char *s = malloc(n + 1);
    if (!s)
        return c->bad = 2, NULL;
    memcpy(s, c->p + c->at, n);
    s[n] = 0;
    c->at += n;
    *len = (size_t)n;
    return s;
}

static char *rd_str(cur *c)
{
    size_t len;
    return rd_str_len(c, &len);
}

/* ---- values as text ------------------------------------------------------ */

/* Display text of a value is built in a growing buffer (a gbuf ending in a
 * NUL once done), so nothing from the file can overrun a fixed one; it stays
 * short because strings are cut after STR_SHOWN bytes and arrays after
 * ARR_SHOWN elements, each cut marked. */
#define STR_SHOWN 200
#define ARR_SHOWN 4

static void tb_text(gbuf *b, const char *s) { gb_bytes(b, s, strlen(s)); }

/* A string value: quoted, NUL and control characters escaped as the
 * program escapes them (\a to \r by name, others \xHH), cut after STR_SHOWN
 * bytes with "..." after it. */
static void string_text(gbuf *b, const char *s, size_t len)
{
    tb_text(b, "\"");
    for (size_t i = 0; i < len && i < STR_SHOWN; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        if (ch >= 7 && ch <= 13)
            snprintf(esc, sizeof esc, "\\%c", "abtnvfr"[ch - 7]), tb_text(b, esc);
        else if (ch < 0x20 || ch == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", ch), tb_text(b, esc);
        else
            gb_bytes(b, &ch, 1);
    }
    tb_text(b, len > STR_SHOWN ? "\"..." : "\"");
}

static const int vsize[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* A scalar read as a whole number: 1 with *v for the integer types (and bool),
 * 0 for floats; negative numbers are not whole numbers of a count. */
static int scalar_uint(uint32_t t, uint64_t raw, uint64_t *v)
{
    switch (t) {
    case GV_I8: *v = (uint64_t)(int64_t)(int8_t)raw; return (int8_t)raw >= 0;
    case GV_I16: *v = (uint64_t)(int64_t)(int16_t)raw; return (int16_t)raw >= 0;
    case GV_I32: *v = (uint64_t)(int64_t)(int32_t)raw; return (int32_t)raw >= 0;
    case GV_I64: *v = raw; return (int64_t)raw >= 0;
    case GV_F32:
    case GV_F64:
    case GV_STR: return 0;
    default: *v = raw; return 1;
    }
}

/* One scalar of type t read from c, appended to b as text; *raw its bits
 * (0 for strings). */
static void scalar_text(cur *c, uint32_t t, gbuf *b, uint64_t *raw)
{
    *raw = 0;
    if (t == GV_STR) {
        size_t len = 0;
        char *s = rd_str_len(c, &len);
        if (s)
            string_text(b, s, len);
        free(s);
        return;
    }
    uint64_t v = *raw = rd(c, vsize[t]);
    char o[40]; /* a number's text: at most 24 characters */
    float f;
    double d;
    switch (t) {
    case GV_F32: memcpy(&f, &(uint32_t){(uint32_t)v}, 4), snprintf(o, sizeof o, "%.9g", f); break;
    case GV_F64: memcpy(&d, &v, 8), snprintf(o, sizeof o, "%.17g", d); break;
    case GV_BOOL: snprintf(o, sizeof o, "%s", v ? "true" : "false"); break;
    case GV_I8: snprintf(o, sizeof o, "%d", (int8_t)v); break;
    case GV_I16: snprintf(o, sizeof o, "%d", (int16_t)v); break;
    case GV_I32: snprintf(o, sizeof o, "%d", (int32_t)v); break;
    case GV_I64: snprintf(o, sizeof o, "%lld", (long long)v); break;
    default: snprintf(o, sizeof o, "%llu", (unsigned long long)v);
    }
    tb_text(b, o);
}

static const char *const vname[13] = {"u8",   "i8",  "u16", "i16", "u32", "i32", "f32",
                                      "bool", "str", "arr", "u64", "i64", "f64"};

/* The rest of an array of n elements of type et, after its first ARR_SHOWN:
 * skipped (strings read one by one, to check they lie in the file), integers
 * compared with e's whole number while they all equal it. */
static void array_rest(cur *c, gkv *e, uint32_t et, uint64_t n)
{
    if (n > ARR_SHOWN && et != GV_STR && !e->whole) { /* nothing to compare: its size was checked */
        c->at += (size_t)(n - ARR_SHOWN) * (size_t)vsize[et];
        return;
    }
    for (uint64_t i = ARR_SHOWN; i < n && !c->bad; i++) {
        uint64_t raw, v = 0;
        if (et == GV_STR) {
            free(rd_str(c));
            continue;
        }
        raw = rd(c, vsize[et]);
        e->whole = e->whole && scalar_uint(et, raw, &v) && v == e->num;
    }
}

/* The value of pair e as text (e->text): scalars as themselves, arrays as
 * "[N x type: first, second, third, fourth, ...]"; its type, and as a whole
 * number (e->whole) an integer scalar or an integer array whose elements
 * are all equal. */
static void value_text(cur *c, gkv *e)
{
    gbuf b = {0};
    uint64_t raw = 0, v = 0;
    uint32_t t = e->type = (uint32_t)rd(c, 4);
    if (c->bad || t > GV_F64) {
        c->bad = c->bad ? c->bad : 1;
        return;
    }
    if (t != GV_ARR) {
        scalar_text(c, t, &b, &raw);
        e->whole = scalar_uint(t, raw, &e->num);
    } else {
        uint32_t et = (uint32_t)rd(c, 4);
        uint64_t n = rd(c, 8);
        if (c->bad || et > GV_F64 || et == GV_ARR || n > (c->n - c->at) / (uint64_t)(et == GV_STR ? 8 : vsize[et])) {
            c->bad = 1;
            return;
        }
        char head[64];
        snprintf(head, sizeof head, "[%llu x %s", (unsigned long long)n, vname[et]);
        tb_text(&b, head);
        e->whole = n > 0 && et != GV_STR && et != GV_F32 && et != GV_F64;
        for (uint64_t i = 0; i < n && i < ARR_SHOWN && !c->bad; i++) {
            tb_text(&b, i ? ", " : ": ");
            scalar_text(c, et, &b, &raw);
            e->whole = e->whole && scalar_uint(et, raw, &v) && (!i || v == e->num);
            e->num = v;
        }
        array_rest(c, e, et, n);
        tb_text(&b, n > ARR_SHOWN ? ", ...]" : "]");
    }
    gb_bytes(&b, "", 1);
    if (b.oom && !c->bad)
        c->bad = 2;
    if (c->bad)
        free(b.p);
    else
        e->text = (char *)b.p;
}

void stz_gguf_free(stz_gguf *g)
{
    if (!g)
        return;
    for (size_t i = 0; g->kv && i < g->kv_cap; i++)
        free(g->kv[i].key), free(g->kv[i].text);
    for (size_t i = 0; g->names && i < g->t_cap; i++)
        free(g->names[i]);
    free(g->kv), free(g->t), free(g->names), free(g);
}

static int by_offset(const void *a, const void *b)
{
    const stz_gguf_tensor *x = *(const stz_gguf_tensor *const *)a, *y = *(const stz_gguf_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* llama.cpp refuses a file whose keys or tensor names repeat: so does stz
 * (a lookup would see one of them). */
static stz_status no_duplicates(const stz_gguf *g, const char *path, stz_err *err)
{
    size_t n = g->nkv > g->nt ? g->nkv : g->nt;
    const char **names = malloc((n + 1) * sizeof *names), *dup = NULL;
    if (!names)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory checking %zu names", path, n);
    for (size_t i = 0; i < g->nkv; i++)
        names[i] = g->kv[i].key;
    if ((dup = stz_first_duplicate(names, g->nkv))) {
        stz_status st = stz_err_set(err, STZ_E_DUPLICATE, "%s: key '%s' appears twice", path, dup);
        free(names);
        return st;
    }
    for (size_t i = 0; i < g->nt; i++)
        names[i] = g->t[i].name;
    dup = stz_first_duplicate(names, g->nt);
    stz_status st = dup ? stz_err_set(err, STZ_E_DUPLICATE, "%s: tensor '%s' appears twice", path, dup) : STZ_OK;
    free(names);
    return st;
}

/* Checks the header in `c` (the whole file) into g. */
/* The nkv key/value pairs; the data alignment they give. */
static stz_status read_kvs(stz_gguf *g, cur *c, uint64_t nkv, uint64_t *align, const char *path, stz_err *err)
{
    for (; g->nkv < nkv; g->nkv++) {
        gkv *e = &g->kv[g->nkv];
        size_t at = c->at, klen = 0;
        if ((e->key = rd_str_len(c, &klen)))
            value_text(c, e);
        if (!e->key || !e->text)
            return stz_err_set(err, c->bad == 2 ? STZ_E_NOMEM : STZ_E_FORMAT,
                               "%s: key/value pair %zu (at byte %zu) runs past the end of the file or has an "
                               "unknown type",
                               path, g->nkv, at);
        if (stz_control_char(e->key, klen))
            return stz_err_set(err, STZ_E_FORMAT,
                               "%s: key/value pair %zu (at byte %zu): the key has a NUL or "
                               "control character",
                               path, g->nkv, at);
        if (!strcmp(e->key, "general.alignment")) { /* llama.cpp reads it as a u32 only */
            if (e->type != GV_U32)
                return stz_err_set(err, STZ_E_FORMAT, "%s: general.alignment is of type %s, not u32", path,
                                   e->type == GV_ARR ? "array" : vname[e->type]);
            *align = e->num;
            if (!*align || (*align & (*align - 1)) || *align > 65536)
                return stz_err_set(err, STZ_E_FORMAT, "%s: general.alignment %s is not a power of two", path, e->text);
        }
    }
    return STZ_OK;
}

/* The next tensor info: name, shape, a known type whose blocks divide the
 * rows, its size. */
static stz_status read_tensor_info(stz_gguf *g, cur *c, const char *path, stz_err *err)
{
    stz_gguf_tensor *t = &g->t[g->nt];
    size_t nlen = 0;
    if (!(g->names[g->nt] = rd_str_len(c, &nlen)))
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor info %zu runs past the end of the file", path, g->nt);
    if (stz_control_char(g->names[g->nt], nlen))
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor info %zu: the name has a NUL or control character", path,
                           g->nt);
    t->name = g->names[g->nt];
    t->ndim = (uint32_t)rd(c, 4);
    if (c->bad || t->ndim < 1 || t->ndim > 4)
        return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s': %u dimensions (1 to 4 allowed)", path, t->name, t->ndim);
    uint64_t numel = 1;
    for (uint32_t d = 0; d < t->ndim; d++) {
        t->ne[d] = rd(c, 8);
        if (t->ne[d] && numel > UINT64_MAX / t->ne[d])
            return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s': element count overflows", path, t->name);
        numel *= t->ne[d];
    }
    t->type = (int)rd(c, 4);
    t->offset = rd(c, 8);
    const stz_ggml_traits *ty = stz_ggml_traits_of(t->type);
    if (c->bad)
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor info '%s' runs past the end of the file", path, t->name);
    if (g->lenient && (!ty || t->ne[0] % ty->block || numel / ty->block > UINT64_MAX / ty->bytes))
        return STZ_OK; /* a layout only: its size is not needed */
    if (!ty)           /* its size is unknown, so nothing after it can be checked */
        return stz_err_set(err, STZ_E_DTYPE, "%s: tensor '%s': unknown ggml type %u", path, t->name, (unsigned)t->type);
    if (t->ne[0] % ty->block)
        return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s': rows of %llu are not whole %s blocks", path, t->name,
                           (unsigned long long)t->ne[0], ty->name);
    t->bytes = numel / ty->block * ty->bytes;
    if (numel / ty->block > UINT64_MAX / ty->bytes)
        return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s': size overflows", path, t->name);
    return STZ_OK;
}

/* Every tensor's data aligned, inside the file from `data` on, and apart
 * from the others; offsets made absolute. */
static stz_status check_data(stz_gguf *g, uint64_t data, uint64_t align, const char *path, uint64_t fsize, stz_err *err)
{
    size_t nt = g->nt;
    stz_gguf_tensor **order = malloc((nt + 1) * sizeof *order);
    if (!order)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the tensor order");
    stz_status st = STZ_OK;
    for (size_t i = 0; !st && i < nt; i++) {
        stz_gguf_tensor *t = &g->t[i];
        order[i] = t;
        if (t->offset % align || t->offset > fsize - data || t->bytes > fsize - data - t->offset)
            st = stz_err_set(err, STZ_E_OFFSETS, "%s: tensor '%s': data at offset %llu (+%llu bytes) is %s", path,
                             t->name, (unsigned long long)t->offset, (unsigned long long)t->bytes,
                             t->offset % align ? "not aligned" : "past the end of the file");
        else
            t->offset += data;
    }
    if (!st)
        qsort(order, nt, sizeof *order, by_offset);
    for (size_t i = 1; !st && i < nt; i++)
        if (order[i - 1]->offset + order[i - 1]->bytes > order[i]->offset)
            st = stz_err_set(err, STZ_E_OFFSETS, "%s: tensors '%s' and '%s' overlap", path, order[i - 1]->name,
                             order[i]->name);
    free(order);
    return st;
}

static stz_status parse(stz_gguf *g, cur *c, const char *path, uint64_t fsize, stz_err *err)
{
    stz_status st;
    if (rd(c, 4) != 0x46554747u) /* "GGUF" */
        return stz_err_set(err, STZ_E_FORMAT, "%s: not a GGUF file (no GGUF magic)", path);
    g->version = (uint32_t)rd(c, 4);
    if (g->version != 2 && g->version != 3)
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: GGUF version %u (this stz reads 2 and 3)", path, g->version);
    uint64_t nt = rd(c, 8), nkv = rd(c, 8), align = GGUF_ALIGN;
    if (c->bad)
        return stz_err_set(err, STZ_E_TRUNCATED, "%s: the file ends inside its GGUF header", path);
    if (nt > (c->n - c->at) / 24 || nkv > (c->n - c->at) / 12)
        return stz_err_set(err, STZ_E_FORMAT, "%s: %llu tensors and %llu keys cannot fit the file", path,
                           (unsigned long long)nt, (unsigned long long)nkv);
    if (!(g->kv = calloc(nkv + 1, sizeof *g->kv)) || !(g->t = calloc(nt + 1, sizeof *g->t)) ||
        !(g->names = calloc(nt + 1, sizeof *g->names)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the keys and tensor table");
    g->kv_cap = nkv, g->t_cap = nt;
    if ((st = read_kvs(g, c, nkv, &align, path, err)))
        return st;
    for (; g->nt < nt; g->nt++)
        if ((st = read_tensor_info(g, c, path, err)))
            return st;
    if ((st = no_duplicates(g, path, err)))
        return st;
    uint64_t data = (c->at + align - 1) / align * align;
    if (data > fsize && !nt && c->at <= fsize) /* keys only, without the padding: llama.cpp loads it too */
        data = fsize;
    if (data > fsize)
        return stz_err_set(err, STZ_E_TRUNCATED, "%s: the file ends inside its header", path);
    g->data = data, g->size = fsize;
    if (g->lenient) { /* offsets made absolute; those past the end of the file stay past it */
        for (size_t i = 0; i < g->nt; i++)
            g->t[i].offset = g->t[i].offset > UINT64_MAX - data ? UINT64_MAX : g->t[i].offset + data;
        return STZ_OK;
    }
    return check_data(g, data, align, path, fsize, err);
}

/* The header of the GGUF file open at fd (fsize bytes), read through fd. */
static stz_status gguf_read(stz_gguf **out, int fd, uint64_t fsize, const char *path, int lenient, stz_err *err)
{
    *out = NULL;
    uint64_t n = 0;
    stz_status st;
    /* the header: the first 16 MiB, more while it does not parse (vocabularies
     * are large), up to 256 MiB: a header that fails for another reason must
     * not read a 100 GB file into memory */
    stz_gguf *g = NULL;
    do {
        n = fsize < (n ? n * 4 : 16u << 20) ? fsize : (n ? n * 4 : 16u << 20);
        stz_gguf_free(g);
        g = NULL;
        uint8_t *buf = malloc(n + 1);
        if (!buf || !(g = calloc(1, sizeof *g)))
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the GGUF header");
        else if (stz_pread_full(fd, buf, n, 0))
            st = stz_err_set(err, STZ_E_IO, "%s: read failed", path);
        else {
            cur c = {buf, n, 0, 0};
            g->lenient = lenient;
            st = parse(g, &c, path, fsize, err);
        }
        free(buf);
    } while (st && st != STZ_E_NOMEM && st != STZ_E_IO && n < fsize && n < (256u << 20));
    if (st) {
        stz_gguf_free(g);
        return st;
    }
    *out = g;
    return STZ_OK;
}

static stz_status gguf_open(stz_gguf **out, const char *path, stz_err *err)
{
    int fd;
    uint64_t fsize;
    *out = NULL;
    stz_status st = stz_open_regular(path, &fd, &fsize, err);
    if (st)
        return st;
    st = gguf_read(out, fd, fsize, path, 0, err);
    close(fd);
    return st;
}

stz_status stz_gguf_read_fd(stz_gguf **out, int fd, uint64_t fsize, const char *path, stz_err *err)
{
    return gguf_read(out, fd, fsize, path, 0, err);
}

stz_status stz_gguf_read_layout_fd(stz_gguf **out, int fd, uint64_t fsize, const char *path, stz_err *err)
{
    return gguf_read(out, fd, fsize, path, 1, err);
}

int stz_gguf_kv_uint(const stz_gguf *g, const char *key, uint64_t *v)
{
    for (size_t i = 0; i < g->nkv; i++)
        if (!strcmp(g->kv[i].key, key)) {
            *v = g->kv[i].num;
            return g->kv[i].whole ? 1 : -1;
        }
    return 0;
}

int stz_is_gguf(const char *path) { return stz_has_magic(path, "GGUF", 4); }

stz_status stz_gguf_open(stz_gguf **out, const char *path, stz_err *err) { return gguf_open(out, path, err); }

stz_status stz_gguf_parse_layout(stz_gguf **out, const uint8_t *img, size_t n, uint64_t fsize, const char *label,
                                 stz_err *err)
{
    stz_gguf *g = calloc(1, sizeof *g);
    if (!(*out = g))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the GGUF header");
    g->lenient = 1;
    cur c = {img, n, 0, 0};
    stz_status st = parse(g, &c, label, fsize, err);
    if (!st && g->data != n)
        st = stz_err_set(err, STZ_E_FORMAT, "%s: GGUF header of %zu bytes declares its data at %llu", label, n,
                         (unsigned long long)g->data);
    if (st) {
        stz_gguf_free(g);
        *out = NULL;
    }
    return st;
}

uint64_t stz_gguf_data_offset(const stz_gguf *g) { return g->data; }
uint64_t stz_gguf_file_size(const stz_gguf *g) { return g->size; }

static int by_start(const void *a, const void *b)
{
    const stz_gguf_tensor *x = *(const stz_gguf_tensor *const *)a, *y = *(const stz_gguf_tensor *const *)b;
    return x->offset != y->offset ? (x->offset < y->offset ? -1 : 1) : (x < y ? -1 : x > y);
}

/* The stz dtype a ggml type's bytes are read as (U8 for blocks and types
 * stz does not know). */
static stz_dtype span_dtype(int type)
{
    switch (type) {
    case 0: return STZ_DTYPE_F32;
    case 1: return STZ_DTYPE_F16;
    case 24: return STZ_DTYPE_I8;
    case 25: return STZ_DTYPE_I16;
    case 26: return STZ_DTYPE_I32;
    case 27: return STZ_DTYPE_I64;
    case 28: return STZ_DTYPE_F64;
    case 30: return STZ_DTYPE_BF16;
    default: return STZ_DTYPE_U8;
    }
}

stz_status stz_gguf_spans(const stz_gguf *g, stz_span **out, size_t *n, stz_err *err)
{
    uint64_t fsize = g->size;
    const stz_gguf_tensor **order = malloc((g->nt + 1) * sizeof *order);
    stz_span *sp = malloc((g->nt + 2) * sizeof *sp);
    if (!order || !sp) {
        free(order), free(sp);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu tensor spans", g->nt);
    }
    size_t k = 0, m = 0;
    for (size_t i = 0; i < g->nt; i++)
        if (g->t[i].offset <= fsize)
            order[k++] = &g->t[i];
    qsort(order, k, sizeof *order, by_start);
    uint64_t first = k ? order[0]->offset : fsize;
    if (first > g->data || !k) /* bytes no tensor claims before the first one (or no tensor at all) */
        sp[m++] = (stz_span){.dtype = STZ_DTYPE_U8, .end = first - g->data, .name = "(data before the first tensor)"};
    for (size_t i = 0; i < k; i++) {
        uint64_t end = i + 1 < k ? order[i + 1]->offset : fsize;
        int type = order[i]->type;
        sp[m++] = (stz_span){.dtype = span_dtype(type),
                             .begin = order[i]->offset - g->data,
                             .end = end - g->data,
                             .name = order[i]->name,
                             .block_type = span_dtype(type) == STZ_DTYPE_U8 ? type : 0};
    }
    free(order);
    *out = sp, *n = m;
    return STZ_OK;
}

uint32_t stz_gguf_version(const stz_gguf *g) { return g->version; }
size_t stz_gguf_tensor_count(const stz_gguf *g) { return g->nt; }
const stz_gguf_tensor *stz_gguf_tensor_at(const stz_gguf *g, size_t i) { return i < g->nt ? &g->t[i] : NULL; }
size_t stz_gguf_kv_count(const stz_gguf *g) { return g->nkv; }
const char *stz_gguf_kv_key(const stz_gguf *g, size_t i) { return i < g->nkv ? g->kv[i].key : NULL; }
const char *stz_gguf_kv_text(const stz_gguf *g, size_t i) { return i < g->nkv ? g->kv[i].text : NULL; }
