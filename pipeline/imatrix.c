/* Importance matrices: collected from the forward pass, read and written
 * as llama.cpp's files (see stz_imatrix.h). */
#include "model/forward_internal.h"
#include "gguf/gguf_format.h"
#include "stz_imatrix.h"
#include "stz_model.h"
#include "stz_safetensors.h"

#include <errno.h>
#include <float.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char *name; /* GGUF name (malloc'd) */
    uint64_t cols;
    double *sum;   /* per column: sum of squares */
    double tokens; /* rows added */
    float *w;      /* the mean squares over their mean: a scale the file chose does not matter */
    int usable;    /* some w > 0: weights a quantizer can use */
} entry;

struct stz_imatrix {
    entry *e;
    size_t n, cap;
    size_t *slot, nslot; /* hash index of the names: entry index + 1, 0 free; nslot a power of two */
    char *source;        /* malloc'd; NULL: none */
    uint32_t chunks, chunk_size;
    double *col; /* collecting: one input's sums of squares per column */
    size_t ncol;
    stz_fwd_hook hook; /* collecting from a forward pass: imatrix_input */
};

static stz_status imatrix_input(stz_fwd_hook *h, const stz_fwd *m, uint32_t layer, const int *roles, int k,
                                const float *X, size_t n, size_t cols, stz_err *err);

stz_status stz_imatrix_new(stz_imatrix **out, stz_err *err)
{
    if (!(*out = calloc(1, sizeof **out)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for an importance matrix");
    (*out)->hook.input = imatrix_input, (*out)->hook.user = *out;
    return STZ_OK;
}

void stz_imatrix_free(stz_imatrix *im)
{
    for (size_t i = 0; im && i < im->n; i++)
        free(im->e[i].name), free(im->e[i].sum), free(im->e[i].w);
    if (im)
        free(im->e), free(im->slot), free(im->source), free(im->col);
    free(im);
}

void stz_imatrix_describe(stz_imatrix *im, const char *dataset, uint32_t chunks, uint32_t chunk_size)
{
    free(im->source);
    im->source = dataset ? strdup(dataset) : NULL; /* out of memory: no description */
    im->chunks = chunks, im->chunk_size = chunk_size;
}

const char *stz_imatrix_dataset(const stz_imatrix *im, double *tokens)
{
    double most = 0;
    for (size_t i = 0; i < im->n; i++)
        most = im->e[i].tokens > most ? im->e[i].tokens : most;
    if (tokens)
        *tokens = most;
    return im->source ? im->source : "";
}

size_t stz_imatrix_count(const stz_imatrix *im) { return im->n; }

const char *stz_imatrix_name(const stz_imatrix *im, size_t i, uint64_t *cols, double *tokens)
{
    if (cols)
        *cols = im->e[i].cols;
    if (tokens)
        *tokens = im->e[i].tokens;
    return im->e[i].name;
}

/* ---- the names' index: open addressing, FNV-1a ------------------------------------- */

static size_t name_hash(const char *s)
{
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return (size_t)h;
}

static entry *lookup(const stz_imatrix *im, const char *name)
{
    if (!im->nslot)
        return NULL;
    for (size_t h = name_hash(name) & (im->nslot - 1);; h = (h + 1) & (im->nslot - 1)) { /* never full */
        size_t k = im->slot[h];
        if (!k || !strcmp(im->e[k - 1].name, name))
            return k ? &im->e[k - 1] : NULL;
    }
}

static void index_put(size_t *slot, size_t nslot, const char *name, size_t k)
{
    size_t h = name_hash(name) & (nslot - 1);
    while (slot[h])
        h = (h + 1) & (nslot - 1);
    slot[h] = k;
}

/* Indexes entry im->n (the one being added), the index grown to keep it at
 * most half full; -1 out of memory. */
static int index_add(stz_imatrix *im)
{
    if (2 * (im->n + 1) > im->nslot) {
        size_t nslot = im->nslot ? 2 * im->nslot : 128, *slot = calloc(nslot, sizeof *slot);
        if (!slot)
            return -1;
        for (size_t i = 0; i < im->n; i++)
            index_put(slot, nslot, im->e[i].name, i + 1);
        free(im->slot);
        im->slot = slot, im->nslot = nslot;
    }
    index_put(im->slot, im->nslot, im->e[im->n].name, im->n + 1);
    return 0;
}

/* The entry `name` of `cols` columns, added empty when new; NULL out of memory. */
static entry *entry_for(stz_imatrix *im, const char *name, uint64_t cols)
{
    entry *e = lookup(im, name);
    if (e)
        return e;
    if (im->n == im->cap) {
        size_t cap = im->cap ? 2 * im->cap : 64;
        entry *p = realloc(im->e, cap * sizeof *p);
        if (!p)
            return NULL;
        im->e = p, im->cap = cap;
    }
    e = &im->e[im->n];
    memset(e, 0, sizeof *e);
    e->name = strdup(name);
    e->cols = cols, e->sum = calloc(cols + 1, sizeof *e->sum), e->w = calloc(cols + 1, sizeof *e->w);
    if (!e->name || !e->sum || !e->w || index_add(im)) {
        free(e->name), free(e->sum), free(e->w);
        return NULL;
    }
    im->n++;
    return e;
}

/* The weights again after sums changed: the mean squares over their mean
 * (the sums over theirs), so that they are near 1 whatever the scale of the
 * inputs, and a file's constant factor, 1e35 or 1e-40, changes nothing. */
/* Column j's mean square as a file's float holds it (so that llama.cpp's
 * .dat of the same means, or a GGUF of them pooled, gives the same
 * weights), in double past the float range. */
static double mean_square(const entry *e, uint64_t j)
{
    double m = e->tokens > 0 ? e->sum[j] / e->tokens : 0;
    return m <= FLT_MAX ? (double)(float)m : m;
}

/* The weights again after sums changed: the mean squares divided by their
 * mean, so that a scale of all of them changes nothing. */
static void update_weights(entry *e)
{
    double total = 0;
    for (uint64_t j = 0; j < e->cols; j++)
        total += mean_square(e, j);
    e->usable = e->tokens > 0 && total > 0 && isfinite(total);
    double mean = total / (double)e->cols;
    for (uint64_t j = 0; j < e->cols; j++)
        e->w[j] = e->usable ? (float)(mean_square(e, j) / mean) : 0.0f;
}

/* ---- collecting ------------------------------------------------------------ */

void stz_fwd_set_imatrix(stz_fwd *m, stz_imatrix *im) { stz_fwd_set_imatrix_tokens(m, im, 0); }

/* The importance matrix attached to m, or NULL. */
static stz_imatrix *attached(const stz_fwd *m)
{
    for (stz_fwd_hook *h = m->hooks; h; h = h->next)
        if (h->input == imatrix_input)
            return h->user;
    return NULL;
}

void stz_fwd_set_imatrix_tokens(stz_fwd *m, stz_imatrix *im, size_t len)
{
    stz_imatrix *was = attached(m);
    if (was)
        stz_forward_detach(m, &was->hook);
    if (im)
        im->hook.tokens = len, stz_forward_attach(m, &im->hook);
}

static stz_status imatrix_input(stz_fwd_hook *h, const stz_fwd *m, uint32_t layer, const int *roles, int k,
                                const float *X, size_t n, size_t cols, stz_err *err)
{
    stz_imatrix *im = h->user;
    if (!n)
        return STZ_OK;
    if (im->ncol < cols) {
        double *c = realloc(im->col, cols * sizeof *c);
        if (!c)
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for the importance of %zu columns", cols);
        im->col = c, im->ncol = cols;
    }
    memset(im->col, 0, cols * sizeof *im->col); /* the rows' sums of squares, once for every matrix reading X */
    for (size_t r = 0; r < n; r++) {
        const float *x = X + r * cols;
        for (size_t j = 0; j < cols; j++)
            im->col[j] += (double)x[j] * x[j];
    }
    for (int i = 0; i < k; i++) {
        char name[96];
        int role = roles[i];
        if (role == STZ_ROLE_HEAD && m->global[G_HEAD].f == m->global[G_EMBED].f &&
            m->global[G_HEAD].i == m->global[G_EMBED].i) /* the tied head is the embedding, as llama.cpp names it */
            role = STZ_ROLE_EMBED;
        snprintf(name, sizeof name, stz_roles[role].gguf, layer);
        entry *e = entry_for(im, name, cols);
        if (!e)
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for the importance of '%s'", name);
        if (e->cols != cols)
            return stz_err_set(err, STZ_E_SHAPE, "importance matrix: '%s' has %llu columns, the model's input has %zu",
                               name, (unsigned long long)e->cols, cols);
        for (size_t j = 0; j < cols; j++)
            e->sum[j] += im->col[j];
        e->tokens += (double)n;
        update_weights(e);
    }
    return STZ_OK;
}

/* Rows of at most this many tokens per pass (whole sequences; one longer
 * sequence alone): the activations stay a few of (rows x hidden) floats. */
#define COLLECT_ROWS 1024

stz_status stz_imatrix_collect(stz_imatrix *im, stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride,
                               const size_t *lens, stz_fwd_progress progress, void *user, stz_err *err)
{
    size_t D = m->c.dim, groups = 0;
    for (size_t s = 0; s < nseq; groups++)
        s = stz_forward_batch_end(lens, nseq, s, COLLECT_ROWS, NULL);
    uint64_t done = 0, total = (uint64_t)groups * m->c.n_layers;
    float *X = NULL;
    stz_status st = STZ_OK;
    stz_imatrix *was = attached(m); /* im alone, its own limit kept */
    if (was)
        stz_forward_detach(m, &was->hook);
    stz_forward_attach(m, &im->hook);
    for (size_t s0 = 0, s1, at = 0; !st && s0 < nseq; s0 = s1) {
        size_t rows, first = at;
        s1 = stz_forward_batch_end(lens, nseq, s0, COLLECT_ROWS, &rows);
        at = stz_seq_skip(at, stride, lens, s0, s1);
        float *nx = realloc(X, (rows * D + 1) * sizeof *X);
        if (!nx) {
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu positions", rows);
            break;
        }
        X = nx;
        if (!(st = stz_forward_hidden_states(m, tokens + first, s1 - s0, stride, lens + s0, X, progress, user, &done,
                                             total, err)))
            st = stz_forward_final_norm(m, X, rows, err);
    }
    stz_forward_detach(m, &im->hook);
    if (was)
        stz_forward_attach(m, &was->hook);
    free(X);
    return st;
}

/* ---- finding ------------------------------------------------------------------ */

stz_status stz_imatrix_find(const stz_imatrix *im, const char *name, uint64_t cols, const float **w, stz_err *err)
{
    char gname[96];
    const entry *e = lookup(im, name);
    if (!e && stz_role_gguf_name(name, gname, sizeof gname))
        e = lookup(im, gname);
    *w = NULL;
    if (!e)
        return STZ_OK;
    if (e->cols != cols)
        return stz_err_set(err, STZ_E_SHAPE,
                           "importance matrix entry '%s' has %llu columns, tensor '%s' has %llu "
                           "(an importance matrix of another model?)",
                           e->name, (unsigned long long)e->cols, name, (unsigned long long)cols);
    *w = e->usable ? e->w : NULL; /* collected, no token seen or every column 0: nothing to weigh by (a file's
                                   * entries are all usable) */
    return STZ_OK;
}

/* ---- writing: llama.cpp's imatrix GGUF ------------------------------------------- */

/* The info of an F32 tensor NAME + suffix ([ne0, ne1], at offset) added to
 * head; out of memory marks head. */
static void tensor_info(gbuf *head, const char *name, const char *suffix, const uint64_t *ne, uint64_t offset)
{
    char *full = NULL;
    if (asprintf(&full, "%s%s", name, suffix) < 0)
        head->oom = 1;
    else
        gb_tensor_info(head, full, 2, ne, STZ_GGML_F32, offset);
    free(full);
}

stz_status stz_imatrix_save(const stz_imatrix *im, const char *path, int force, stz_err *err)
{
    if (!im->n)
        return stz_err_set(err, STZ_E_ARG, "%s: the importance matrix is empty (no token went through the model)",
                           path);
    gbuf kv = {0}, head = {0}, data = {0};
    kv_str(&kv, "general.type", "imatrix");
    kv_arr(&kv, "imatrix.datasets", GV_STR, 1);
    gb_str(&kv, stz_imatrix_dataset(im, NULL), strlen(stz_imatrix_dataset(im, NULL)));
    kv_u32(&kv, "imatrix.chunk_count", im->chunks);
    kv_u32(&kv, "imatrix.chunk_size", im->chunk_size);
    gb_u32(&head, 0x46554747u); /* "GGUF" */
    gb_u32(&head, 3);
    gb_u64(&head, 2 * im->n);
    gb_u64(&head, kv.count);
    gb_bytes(&head, kv.p, kv.n);
    for (size_t i = 0; i < im->n; i++) {
        const entry *e = &im->e[i];
        uint64_t ne_sum[2] = {e->cols, 1}, ne_count[2] = {1, 1};
        tensor_info(&head, e->name, ".in_sum2", ne_sum, data.n);
        for (uint64_t j = 0; j < e->cols; j++) {
            float v = (float)e->sum[j];
            uint32_t u;
            memcpy(&u, &v, 4);
            gb_u32(&data, u);
        }
        gb_pad(&data);
        tensor_info(&head, e->name, ".counts", ne_count, data.n);
        float c = (float)e->tokens;
        uint32_t u;
        memcpy(&u, &c, 4);
        gb_u32(&data, u);
        gb_pad(&data);
    }
    gb_pad(&head);
    stz_status st = STZ_OK;
    stz_outfile of = STZ_OUTFILE_INIT;
    if (kv.oom || head.oom || data.oom)
        st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the importance matrix's file", path);
    if (!st && !(st = stz_outfile_open(&of, path, force, err)) && !(st = stz_outfile_write(&of, head.p, head.n, err)) &&
        !(st = stz_outfile_write(&of, data.p, data.n, err)))
        st = stz_outfile_commit(&of, err);
    stz_outfile_abort(&of);
    free(kv.p), free(head.p), free(data.p);
    return st;
}

/* ---- reading ------------------------------------------------------------------ */

static stz_status bad(const char *path, const char *what, stz_err *err)
{
    return stz_err_set(err, STZ_E_FORMAT, "%s: not an importance matrix: %s", path, what);
}

/* Adds a read entry: sums of squares over `tokens` rows (pooled if the name repeats). */
static stz_status add_read(stz_imatrix *im, const char *path, const char *name, const float *sum, uint64_t cols,
                           double tokens, stz_err *err)
{
    entry *e = lookup(im, name);
    if (e && e->cols != cols)
        return stz_err_set(err, STZ_E_FORMAT, "%s: entry '%s' appears with %llu and %llu columns", path, name,
                           (unsigned long long)e->cols, (unsigned long long)cols);
    if (!(tokens >= 0) || !isfinite(tokens))
        return stz_err_set(err, STZ_E_FORMAT, "%s: entry '%s': token count %g", path, name, tokens);
    for (uint64_t j = 0; j < cols; j++)
        if (!(sum[j] >= 0) || !isfinite(sum[j]))
            return stz_err_set(err, STZ_E_FORMAT, "%s: entry '%s': column %llu holds %g, not a sum of squares", path,
                               name, (unsigned long long)j, sum[j]);
    if (!e && !(e = entry_for(im, name, cols)))
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for entry '%s'", path, name);
    for (uint64_t j = 0; j < cols; j++)
        e->sum[j] += sum[j];
    e->tokens += tokens;
    update_weights(e);
    return STZ_OK;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const stz_gguf_tensor *const *)a)->name, (*(const stz_gguf_tensor *const *)b)->name);
}

/* Tensor `name` of the n tensors sorted by name, or NULL. */
static const stz_gguf_tensor *find_tensor(const stz_gguf_tensor **sorted, size_t n, const char *name)
{
    stz_gguf_tensor key = {.name = name};
    const stz_gguf_tensor *k = &key, **hit = bsearch(&k, sorted, n, sizeof *sorted, by_name);
    return hit ? *hit : NULL;
}

/* Entry `name` of a GGUF file: its sums t, its counts (found in sorted),
 * read through fd and added (sum: a buffer the caller frees). */
static stz_status gguf_entry(stz_imatrix *im, int fd, const char *path, const stz_gguf_tensor *t, const char *name,
                             const stz_gguf_tensor **sorted, size_t nt, float **sum, stz_err *err)
{
    char *cname = NULL;
    if (asprintf(&cname, "%s.counts", name) < 0)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for entry '%s'", path, name);
    const stz_gguf_tensor *c = find_tensor(sorted, nt, cname);
    free(cname);
    uint64_t cols = t->ne[0], mats = t->ndim > 1 ? t->ne[1] : 1;
    if (!c)
        return stz_err_set(err, STZ_E_FORMAT, "%s: entry '%s' has sums but no counts", path, name);
    if (t->type != STZ_GGML_F32 || c->type != STZ_GGML_F32 || t->ndim > 2 || !cols || !mats ||
        c->ne[0] * (c->ndim > 1 ? c->ne[1] : 1) != mats || cols > (1u << 24) || mats > (1u << 12))
        return stz_err_set(err, STZ_E_FORMAT,
                           "%s: entry '%s': sums and counts must be F32 tensors of [columns, "
                           "matrices] and [1, matrices]",
                           path, name);
    float *ns = realloc(*sum, (cols * mats + mats) * sizeof *ns);
    if (!ns)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for entry '%s'", path, name);
    *sum = ns;
    float *cnt = ns + cols * mats;
    if (stz_pread_full(fd, ns, cols * mats * 4, t->offset) || stz_pread_full(fd, cnt, mats * 4, c->offset))
        return stz_err_set(err, STZ_E_IO, "%s: cannot read entry '%s'", path, name);
    stz_status st = STZ_OK;
    for (uint64_t k = 0; !st && k < mats; k++) /* stacked experts: pooled */
        st = add_read(im, path, name, ns + k * cols, cols, cnt[k], err);
    return st;
}

/* llama.cpp's GGUF, open at fd: NAME.in_sum2 (F32, [cols, matrices]) and
 * NAME.counts (F32, [1, matrices]). */
static stz_status load_gguf(stz_imatrix *im, int fd, uint64_t fsize, const char *path, stz_err *err)
{
    stz_gguf *g;
    stz_status st = stz_gguf_read_fd(&g, fd, fsize, path, err);
    if (st)
        return st;
    size_t nt = stz_gguf_tensor_count(g);
    const stz_gguf_tensor **sorted = malloc((nt + 1) * sizeof *sorted);
    float *sum = NULL;
    char *name = NULL;
    if (!sorted)
        STZ_TRY(st, stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for %zu tensors", path, nt));
    for (size_t i = 0; i < nt; i++)
        sorted[i] = stz_gguf_tensor_at(g, i);
    qsort(sorted, nt, sizeof *sorted, by_name);
    for (size_t i = 0; i < stz_gguf_kv_count(g); i++)
        if (!strcmp(stz_gguf_kv_key(g, i), "imatrix.datasets"))
            stz_imatrix_describe(im, stz_gguf_kv_text(g, i), im->chunks, im->chunk_size);
    for (size_t i = 0; i < nt; i++) {
        const stz_gguf_tensor *t = stz_gguf_tensor_at(g, i);
        size_t len = strlen(t->name);
        if (len < 8 || strcmp(t->name + len - 8, ".in_sum2"))
            continue;
        if (!(name = strndup(t->name, len - 8)))
            STZ_TRY(st, stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for entry names", path));
        STZ_TRY(st, gguf_entry(im, fd, path, t, name, sorted, nt, &sum, err));
        free(name);
        name = NULL;
    }
    if (!im->n)
        st = bad(path, "a GGUF file without NAME.in_sum2 tensors", err);
cleanup:
    free(name), free(sum), free(sorted);
    stz_gguf_free(g);
    return st;
}

/* llama.cpp's legacy .dat: int32 entries; per entry int32 name length, the
 * name, int32 calls, int32 values, float values (mean square x calls);
 * then optionally int32 chunks, int32 length and the dataset's name. */
typedef struct {
    const uint8_t *p;
    size_t n, at;
} cursor;

static int take(cursor *c, void *out, size_t n)
{
    if (c->n - c->at < n)
        return -1;
    memcpy(out, c->p + c->at, n);
    c->at += n;
    return 0;
}

static int take_i32(cursor *c, int32_t *v)
{
    uint8_t b[4];
    if (take(c, b, 4))
        return -1;
    *v = (int32_t)stz_le32(b);
    return 0;
}

/* Entry i of a .dat file at c: its name (any length the file holds, no NUL),
 * calls and values, added (v: a buffer the caller frees). */
static stz_status dat_entry(stz_imatrix *im, const char *path, cursor *c, int32_t i, float **v, stz_err *err)
{
    int32_t len, calls = 0, nval = 0;
    if (take_i32(c, &len) || len < 1 || (size_t)len > c->n - c->at)
        return stz_err_set(err, STZ_E_FORMAT, "%s: entry %d: bad or truncated name", path, i + 1);
    const char *at = (const char *)c->p + c->at;
    if (memchr(at, 0, (size_t)len))
        return stz_err_set(err, STZ_E_FORMAT, "%s: entry %d: the name holds a NUL", path, i + 1);
    char *name = strndup(at, (size_t)len);
    if (!name)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for entry %d's name", path, i + 1);
    c->at += (size_t)len;
    stz_status st = STZ_OK;
    float *nv = NULL;
    if (take_i32(c, &calls) || take_i32(c, &nval) || calls < 0 || nval < 1 || (size_t)nval > (c->n - c->at) / 4)
        STZ_TRY(st, stz_err_set(err, STZ_E_FORMAT, "%s: entry '%s': bad or truncated values", path, name));
    if (!(nv = realloc(*v, (size_t)nval * sizeof *nv)))
        STZ_TRY(st, stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for entry '%s'", path, name));
    *v = nv;
    take(c, nv, (size_t)nval * 4);
    for (int32_t j = 0; j < nval; j++) { /* little-endian floats */
        uint32_t u = stz_le32((const uint8_t *)&nv[j]);
        memcpy(&nv[j], &u, 4);
    }
    st = add_read(im, path, name, nv, (uint64_t)nval, calls, err); /* values / calls: the mean squares */
cleanup:
    free(name);
    return st;
}

static stz_status parse_dat(stz_imatrix *im, const char *path, cursor *c, stz_err *err)
{
    int32_t n, len, chunks;
    if (take_i32(c, &n) || n < 1)
        return bad(path, "no entry count (neither GGUF nor llama.cpp's .dat)", err);
    stz_status st = STZ_OK;
    float *v = NULL;
    for (int32_t i = 0; !st && i < n; i++)
        st = dat_entry(im, path, c, i, &v, err);
    free(v);
    if (!st && !take_i32(c, &chunks) && chunks > 0 && !take_i32(c, &len) && len > 0 && c->n - c->at >= (size_t)len) {
        free(im->source);
        if (!(im->source = strndup((const char *)c->p + c->at, (size_t)len)))
            return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for the dataset's name", path);
        im->chunks = (uint32_t)chunks;
    }
    return st;
}

/* llama.cpp's .dat, open at fd (fsize bytes). */
static stz_status load_dat(stz_imatrix *im, int fd, uint64_t fsize, const char *path, stz_err *err)
{
    if (fsize > (1ull << 32))
        return bad(path, "a file over 4 GiB", err);
    uint8_t *p = malloc((size_t)fsize + 1);
    stz_status st = p ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "%s: out of memory", path);
    if (!st && stz_pread_full(fd, p, (size_t)fsize, 0))
        st = stz_err_set(err, STZ_E_IO, "%s: cannot read it", path);
    cursor c = {p, (size_t)fsize, 0};
    if (!st)
        st = parse_dat(im, path, &c, err);
    free(p);
    return st;
}

/* Every entry read holds some importance: one that is zero in every column
 * (no token, or only zero inputs) would weigh nothing, and all of them so
 * is no importance matrix at all. */
static stz_status check_entries(const stz_imatrix *im, const char *path, stz_err *err)
{
    for (size_t i = 0; i < im->n; i++)
        if (!im->e[i].usable)
            return stz_err_set(err, STZ_E_FORMAT, "%s: entry '%s': %s, so it weighs nothing", path, im->e[i].name,
                               im->e[i].tokens > 0 ? "its importance is zero in every column" : "a token count of 0");
    return STZ_OK;
}

stz_status stz_imatrix_load(stz_imatrix **out, const char *path, stz_err *err)
{
    *out = NULL;
    stz_imatrix *im = NULL;
    uint8_t magic[4] = {0};
    uint64_t fsize;
    int fd = -1;
    stz_status st;
    STZ_TRY(st, stz_imatrix_new(&im, err));
    STZ_TRY(st, stz_open_regular(path, &fd, &fsize, err)); /* opened once: every read goes through fd */
    if (fsize >= 4 && stz_pread_full(fd, magic, 4, 0))
        STZ_TRY(st, stz_err_set(err, STZ_E_IO, "%s: cannot read it", path));
    STZ_TRY(st, !memcmp(magic, "GGUF", 4) ? load_gguf(im, fd, fsize, path, err) : load_dat(im, fd, fsize, path, err));
    STZ_TRY(st, check_entries(im, path, err));
    *out = im, im = NULL;
cleanup:
    if (fd >= 0)
        close(fd);
    stz_imatrix_free(im);
    return st;
}

/* ---- checked against a model ---------------------------------------- */

/* How many of the matrices of the file at `path` the importance matrix
 * names, into *matched; a mismatch of columns is an error. */
static stz_status match_file(const stz_imatrix *im, const char *path, size_t *matched, char *example, stz_err *err)
{
    stz_reader *r;
    stz_status st = stz_reader_open(&r, path, err);
    for (size_t i = 0; !st && i < stz_reader_count(r); i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        const float *w;
        if (t->ndim < 2 || !stz_dtype_is_float(t->dtype))
            continue;
        if (!*example)
            snprintf(example, 128, "%s", t->name);
        if (!(st = stz_imatrix_find(im, t->name, t->shape[t->ndim - 1], &w, err)))
            *matched += w != NULL;
    }
    stz_reader_free(r);
    return st;
}

stz_status stz_imatrix_load_for(stz_imatrix **im, const char *path, const char *model, stz_err *err)
{
    *im = NULL;
    if (!path)
        return STZ_OK;
    char **files = NULL, example[128] = "";
    size_t n = 0, matched = 0;
    stz_status st = stz_imatrix_load(im, path, err);
    if (!st)
        st = stz_model_files(model, &files, &n, err);
    for (size_t f = 0; !st && f < n; f++)
        st = match_file(*im, files[f], &matched, example, err);
    if (!st && !matched)
        st = stz_err_set(err, STZ_E_ARG,
                         "%s: none of its %zu entries (such as '%s') names a matrix of %s (such as "
                         "'%s'): an importance matrix of another model?",
                         path, stz_imatrix_count(*im),
                         stz_imatrix_count(*im) ? stz_imatrix_name(*im, 0, NULL, NULL) : "", model, example);
    else if (st == STZ_E_SHAPE) { /* the entry's columns: say which file */
        char msg[sizeof err->msg];
        memcpy(msg, err->msg, sizeof msg);
        stz_err_set(err, st, "%s: %s", path, msg);
    }
    stz_model_files_free(files, n);
    if (st) {
        stz_imatrix_free(*im);
        *im = NULL;
    }
    return st;
}
