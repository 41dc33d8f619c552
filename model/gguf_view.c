/* A GGUF file seen as a SafeTensors file of floats (gguf_view.h): a header
 * built from the GGUF tensor table, and a reader source that decodes rows
 * with the ggml types' reference dequantizers. */
#include "arch.h"
#include "gguf_view.h"
#include "quant/ggml_types.h"
#include "roles.h"
#include "safetensors/st_sink.h"
#include "stz_gguf.h"
#include "gguf/gguf_format.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A row at most, and a tensor as floats at most (its offsets are JSON
 * numbers, exact up to 2^53). */
#define VIEW_MAX_COLS  ((uint64_t)1 << 27)
#define VIEW_MAX_BYTES ((uint64_t)1 << 53)

/* One tensor of the view. */
typedef struct {
    const stz_gguf_tensor *g;
    const stz_ggml_traits *tr;
    char *name;              /* the view's name (malloc'd) */
    uint64_t heads;          /* heads whose rows export permuted (0: none) */
    uint64_t rows, cols, rb; /* rb: bytes of a GGUF row */
    uint64_t gcols;          /* elements of a GGUF row: cols, or more in a widened FFN's down projection */
    uint64_t hd;             /* export's permutation undone: rows (2-D) or elements (1-D) per head; 0: none */
    float add;               /* added to every value: -1 for Gemma's norms, which GGUF holds as 1 + w */
    int transposed;          /* GPT-2's Conv1D: the view's rows are the GGUF rows' columns (rows, cols: the view's) */
    stz_dtype dtype;
    uint64_t begin, end; /* in the view's data section */
} vtensor;

struct stz_gguf_view {
    char *path;
    int fd;
    stz_gguf *g;
    vtensor *t;
    size_t n;
    uint8_t *head; /* the view's header image: 8-byte length, JSON */
    stz_reader *r;
    uint64_t data0;         /* file offset of the view's data section */
    uint8_t *raw;           /* a GGUF row */
    float *row, *all;       /* a decoded row; a whole 1-D tensor */
    uint8_t *conv;          /* a row in the view's dtype */
    float *held;            /* a transposed tensor decoded whole, GGUF rows after rows */
    const vtensor *held_t;  /* which (NULL: none) */
    uint64_t ffn, ffn_wide; /* an FFN stz export widened from ffn to ffn_wide units (0: none) */
};

/* A whole-number key of the model's architecture (*out 0 when absent); one
 * that holds anything else, such as per-layer values that differ, is
 * refused: stz reads one value for every layer. */
static stz_status arch_u64(const stz_gguf_view *v, const char *arch, const char *what, uint64_t *out, stz_err *err)
{
    char *key = NULL;
    *out = 0;
    if (asprintf(&key, "%s.%s", arch, what) < 0)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for a key name", v->path);
    int r = stz_gguf_kv_uint(v->g, key, out);
    stz_status st = r >= 0 ? STZ_OK
                           : stz_err_set(err, STZ_E_UNSUPPORTED,
                                         "%s: key '%s' is not a whole number, or holds "
                                         "per-layer values that differ (stz reads one value for every layer)",
                                         v->path, key);
    free(key);
    return st;
}

/* Name, shape and permutation of GGUF tensor i. 0: listed; 1: left out
 * (rope_freqs: export derives it from the configuration); -1: out of
 * memory. arch: the file's family (NULL: unknown), which tells GGUF names
 * that two families use for different roles apart. */
static int map_tensor(stz_gguf_view *v, size_t i, stz_names names, const stz_arch *arch, int permute, uint64_t heads,
                      uint64_t kv_heads, vtensor *t)
{
    const stz_gguf_tensor *g = stz_gguf_tensor_at(v->g, i);
    if (!strcmp(g->name, "rope_freqs.weight"))
        return 1;
    unsigned layer = 0;
    int role = names < 0 ? -1 : stz_role_find(g->name, STZ_NAMES_GGUF, arch, &layer);
    if (role >= 0 && !stz_roles[role].name[names])
        role = -1; /* a role these names do not have (a file of an unknown family): its GGUF name kept */
    if (role >= 0 ? asprintf(&t->name, stz_roles[role].name[names], layer) < 0 : !(t->name = strdup(g->name)))
        return t->name = NULL, -1;
    t->add = role >= 0 && arch && arch->norm == STZ_NORM_RMS_1W && stz_role_is_norm(role) ? -1.0f : 0.0f;
    t->g = g, t->tr = stz_ggml_traits_of(g->type);
    t->cols = t->gcols = g->ne[0];
    t->rows = 1;
    for (uint32_t d = 1; d < g->ndim; d++)
        t->rows *= g->ne[d];
    t->rb = stz_ggml_row_bytes(g->type, t->cols);
    if (v->ffn && g->ndim == 2 && (role == STZ_ROLE_GATE || role == STZ_ROLE_UP) && t->rows == v->ffn_wide)
        t->rows = v->ffn; /* stz export's zero units taken out */
    else if (v->ffn && g->ndim == 2 && role == STZ_ROLE_DOWN && t->cols == v->ffn_wide)
        t->cols = v->ffn;
    if (role >= 0 && arch && stz_arch_conv1d(arch, role) && g->ndim == 2) { /* HF's (in, out) */
        uint64_t r = t->rows;
        t->rows = t->cols, t->cols = r, t->transposed = 1;
    }
    t->heads = role >= 0 && permute && stz_roles[role].perm ? (stz_roles[role].perm == 1 ? heads : kv_heads) : 0;
    t->hd = t->heads ? (g->ndim == 1 ? t->cols : t->rows) / t->heads : 0;
    return 0;
}

/* The SafeTensors header of the view (tensors in GGUF order). */
static stz_status build_header(stz_gguf_view *v, const char *arch, stz_err *err)
{
    cJSON *o = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "format", "pt");
    cJSON_AddStringToObject(meta, "stz.gguf.architecture", arch);
    cJSON_AddItemToObject(o, "__metadata__", meta);
    uint64_t at = 0;
    for (size_t i = 0; i < v->n; i++) {
        vtensor *t = &v->t[i];
        cJSON *e = cJSON_CreateObject(), *sh = cJSON_CreateArray(), *offs = cJSON_CreateArray();
        for (uint32_t d = t->g->ndim; d-- > 0;)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)(t->g->ndim != 2 ? t->g->ne[d]
                                                                 : d             ? t->rows
                                                                                 : t->cols)));
        size_t esz = stz_dtype_bits(t->dtype) / 8;
        t->begin = at, t->end = at + t->rows * t->cols * esz, at = t->end;
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)t->begin));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)t->end));
        cJSON_AddStringToObject(e, "dtype", stz_dtype_name(t->dtype));
        cJSON_AddItemToObject(e, "shape", sh);
        cJSON_AddItemToObject(e, "data_offsets", offs);
        if (!cJSON_AddItemToObject(o, t->name, e))
            cJSON_Delete(e);
    }
    char *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!json)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the view's header", v->path);
    size_t len = strlen(json);
    if ((v->head = malloc(8 + len))) {
        stz_put_le64(v->head, len);
        memcpy(v->head + 8, json, len);
    }
    free(json);
    if (!v->head)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the view's header", v->path);
    v->data0 = 8 + len;
    return stz_reader_open_header(&v->r, v->head, 8 + len, 8 + len + at, v->path, err);
}

/* Export's permutation undone: within each head of hd rows (or elements),
 * Hugging Face's row h*hd + s*hd/2 + j is llama.cpp's row h*hd + 2j + s. */
static uint64_t gguf_index(uint64_t i, uint64_t hd)
{
    uint64_t h = i / hd, rem = i % hd, s = rem / (hd / 2), j = rem % (hd / 2);
    return h * hd + 2 * j + s;
}

/* HF row r of t, decoded into v->row (export's permutation undone). */
static stz_status decode_row(stz_gguf_view *v, const vtensor *t, uint64_t r, stz_err *err)
{
    uint64_t gr = t->hd && t->g->ndim > 1 ? gguf_index(r, t->hd) : r;
    int e = stz_pread_full(v->fd, v->raw, (size_t)t->rb, t->g->offset + gr * t->rb);
    if (e)
        return stz_err_set(err, STZ_E_IO, "%s: tensor '%s': cannot read row %llu", v->path, t->g->name,
                           (unsigned long long)gr);
    stz_ggml_decode(t->tr, v->raw, (size_t)t->gcols, v->row);
    if (t->hd && t->g->ndim == 1) { /* a bias: elements within each head */
        memcpy(v->all, v->row, (size_t)t->cols * sizeof *v->all);
        for (uint64_t i = 0; i < t->cols; i++)
            v->row[i] = v->all[gguf_index(i, t->hd)];
    }
    return STZ_OK;
}

/* Row r of transposed tensor t into v->row: column r of its GGUF rows,
 * all decoded once and held while its rows are read. */
static stz_status transposed_row(stz_gguf_view *v, const vtensor *t, uint64_t r, stz_err *err)
{
    size_t in = (size_t)t->rows, out = (size_t)t->cols;
    if (v->held_t != t) {
        float *h = realloc(v->held, in * out * sizeof *h + 1);
        if (!h)
            return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory transposing tensor '%s'", v->path, t->g->name);
        v->held = h, v->held_t = NULL;
        for (size_t j = 0; j < out; j++) {
            stz_status st = decode_row(v, t, j, err);
            if (st)
                return st;
            memcpy(h + j * in, v->row, in * sizeof *h);
        }
        v->held_t = t;
    }
    for (size_t j = 0; j < out; j++)
        v->row[j] = v->held[j * in + r];
    return STZ_OK;
}

/* A widened FFN's units taken out of gate or up projection t must be the
 * zero rows stz export wrote: anything else would change what the model
 * computes once they are gone. */
static stz_status zero_units(stz_gguf_view *v, const vtensor *t, stz_err *err)
{
    uint64_t all = t->g->ndim == 2 && !t->transposed ? t->g->ne[1] : t->rows;
    for (uint64_t r = t->rows; r < all; r++) {
        stz_status st = decode_row(v, t, r, err);
        for (uint64_t i = 0; !st && i < t->gcols; i++)
            if (v->row[i] != 0)
                return stz_err_set(err, STZ_E_FORMAT,
                                   "%s: tensor '%s': row %llu is not zero, but %s (%llu) says "
                                   "the FFN's units past it are stz export's padding",
                                   v->path, t->g->name, (unsigned long long)r, STZ_GGUF_KEY_FFN,
                                   (unsigned long long)v->ffn);
        if (st)
            return st;
    }
    return STZ_OK;
}

/* The reader's source: n bytes at file offset off of the view. */
static stz_status view_read(void *user, uint64_t off, void *dst, size_t n, stz_err *err)
{
    stz_gguf_view *v = user;
    uint8_t *d = dst;
    while (n) {
        uint64_t o = off - v->data0;
        size_t lo = 0, hi = v->n;
        while (hi - lo > 1) { /* the tensor holding o */
            size_t mid = (lo + hi) / 2;
            if (v->t[mid].begin <= o)
                lo = mid;
            else
                hi = mid;
        }
        const vtensor *t = &v->t[lo];
        size_t esz = stz_dtype_bits(t->dtype) / 8, rowb = (size_t)t->cols * esz;
        if (!rowb || o >= t->end) /* the reader reads only inside its tensors */
            return stz_err_set(err, STZ_E_BOUNDS, "%s: a read at byte %llu of the view holds no tensor", v->path,
                               (unsigned long long)off);
        uint64_t r = (o - t->begin) / rowb, in = (o - t->begin) % rowb;
        stz_status st = t->transposed ? transposed_row(v, t, r, err) : decode_row(v, t, r, err);
        for (size_t i = 0; !st && t->add && i < t->cols; i++)
            v->row[i] += t->add;
        if (!st)
            st = stz_from_f32(t->dtype, v->row, (size_t)t->cols, v->conv, err);
        if (st)
            return st;
        size_t k = rowb - in < n ? (size_t)(rowb - in) : n;
        memcpy(d, v->conv + in, k);
        d += k, off += k, n -= k;
    }
    return STZ_OK;
}

/* Every tensor mapped, of a type stz decodes; the row buffers. */
static stz_status list_tensors(stz_gguf_view *v, stz_names names, stz_dtype dtype, const char *arch, stz_err *err)
{
    const stz_arch *row = stz_arch_get(stz_arch_find(arch, STZ_ARCH_BY_GGUF));
    if (names == STZ_NAMES_HF && row && row->layout != STZ_NAMES_LLAMA2C)
        names = (stz_names)row->layout; /* Hugging Face's names of the family (Gemma's, GPT-2's) */
    int permute = names == STZ_NAMES_HF && row && (row->flags & STZ_ARCH_ROPE_PAIRS); /* llama.cpp's pairs undone */
    uint64_t heads = 0, kv = 0;
    stz_status st = STZ_OK; /* the keys read only where they are used: GGUF's own names need none */
    if ((names >= 0 && (st = arch_u64(v, arch, "feed_forward_length", &v->ffn_wide, err))) ||
        (permute && ((st = arch_u64(v, arch, "attention.head_count", &heads, err)) ||
                     (st = arch_u64(v, arch, "attention.head_count_kv", &kv, err)))))
        return st;
    if (names < 0 || stz_gguf_kv_uint(v->g, STZ_GGUF_KEY_FFN, &v->ffn) <= 0 || v->ffn >= v->ffn_wide)
        v->ffn = 0; /* nothing to take out */
    size_t nt = stz_gguf_tensor_count(v->g);
    uint64_t maxcols = 1, maxrb = 1;
    if (!(v->t = calloc(nt + 1, sizeof *v->t)))
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for %zu tensors", v->path, nt);
    for (size_t i = 0; i < nt; i++) {
        vtensor *t = &v->t[v->n];
        int r = map_tensor(v, i, names, row, permute, heads, kv ? kv : heads, t);
        if (r < 0)
            return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for tensor names", v->path);
        if (r)
            continue;
        char why[768], own[512], lib[256];
        if (!t->tr || !stz_ggml_can_decode(t->tr, why, sizeof why))
            return stz_err_set(err, STZ_E_UNSUPPORTED,
                               "%s: tensor '%s': ggml type %s cannot be read: %s (stz reads %s; and through "
                               "llama.cpp's library %s)",
                               v->path, t->g->name, t->tr ? t->tr->name : "?", t->tr ? why : "unknown type number",
                               stz_ggml_type_names(own, sizeof own, 0), stz_ggml_type_names(lib, sizeof lib, 1));
        if (t->cols > VIEW_MAX_COLS || (t->rows && t->cols > VIEW_MAX_BYTES / 4 / t->rows))
            return stz_err_set(err, STZ_E_SHAPE,
                               "%s: tensor '%s': %llu rows of %llu elements, beyond what stz reads as "
                               "floats",
                               v->path, t->g->name, (unsigned long long)t->rows, (unsigned long long)t->cols);
        if (t->heads && !t->hd)
            return stz_err_set(err, STZ_E_SHAPE,
                               "%s: tensor '%s': %llu heads but %llu rows, so its rows cannot be "
                               "put back in Hugging Face's order",
                               v->path, t->g->name, (unsigned long long)t->heads,
                               (unsigned long long)(t->g->ndim == 1 ? t->cols : t->rows));
        if ((t->hd && (t->hd % 2 || (t->g->ndim == 1 ? t->cols : t->rows) % t->hd)))
            return stz_err_set(err, STZ_E_SHAPE, "%s: tensor '%s': %llu rows are not whole heads", v->path, t->g->name,
                               (unsigned long long)t->rows);
        t->dtype = t->g->ndim == 1 ? STZ_DTYPE_F32 : dtype;
        maxcols = t->gcols > maxcols ? t->gcols : maxcols, maxrb = t->rb > maxrb ? t->rb : maxrb;
        maxcols = t->cols > maxcols ? t->cols : maxcols;
        v->n++;
    }
    v->raw = malloc(maxrb), v->row = malloc(maxcols * sizeof *v->row), v->all = malloc(maxcols * sizeof *v->all);
    v->conv = malloc(maxcols * 4);
    if (!v->raw || !v->row || !v->all || !v->conv)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for rows of %llu elements", v->path,
                           (unsigned long long)maxcols);
    for (size_t i = 0; !st && i < v->n; i++)
        st = zero_units(v, &v->t[i], err);
    return st;
}

/* general.architecture without its quotes (malloc'd; llama when absent). */
static char *gguf_arch(const stz_gguf *g)
{
    for (size_t i = 0; i < stz_gguf_kv_count(g); i++) {
        const char *a = stz_gguf_kv_text(g, i);
        if (!strcmp(stz_gguf_kv_key(g, i), "general.architecture") && *a == '"')
            return strndup(a + 1, strcspn(a + 1, "\""));
    }
    return strdup("llama");
}

stz_status stz_gguf_view_open(stz_gguf_view **out, const char *path, stz_names names, stz_dtype dtype, stz_err *err)
{
    *out = NULL;
    if (dtype != STZ_DTYPE_F32 && dtype != STZ_DTYPE_BF16 && dtype != STZ_DTYPE_F16)
        return stz_err_set(err, STZ_E_ARG, "%s: a GGUF file is read as F32, BF16 or F16", path);
    stz_gguf_view *v = calloc(1, sizeof *v);
    if (!v || !(v->path = strdup(path))) {
        free(v);
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the GGUF view", path);
    }
    v->fd = -1;
    uint64_t fsize;
    char *arch = NULL;
    stz_status st = stz_open_regular(path, &v->fd, &fsize, err);
    if (!st)
        st = stz_gguf_read_fd(&v->g, v->fd, fsize, path, err);
    if (!st && !(arch = gguf_arch(v->g)))
        st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the architecture's name", path);
    if (!st)
        st = list_tensors(v, names, dtype, arch, err);
    if (!st)
        st = build_header(v, arch, err);
    free(arch);
    if (st) {
        stz_gguf_view_free(v);
        return st;
    }
    stz_reader_set_source(v->r, view_read, v);
    *out = v;
    return STZ_OK;
}

const stz_reader *stz_gguf_view_reader(const stz_gguf_view *v) { return v->r; }

const char *stz_gguf_view_type(const stz_gguf_view *v, size_t i, uint64_t *bytes)
{
    *bytes = v->t[i].g->bytes;
    return v->t[i].tr->name;
}

void stz_gguf_view_free(stz_gguf_view *v)
{
    if (!v)
        return;
    stz_reader_free(v->r);
    stz_gguf_free(v->g);
    if (v->fd >= 0)
        close(v->fd);
    for (size_t i = 0; v->t && i <= v->n; i++) /* the one past n may hold a name mapped, then refused */
        free(v->t[i].name);
    free(v->t), free(v->head), free(v->raw), free(v->row), free(v->all), free(v->conv), free(v->held), free(v->path);
    free(v);
}
