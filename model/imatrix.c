/* Importance matrices: collected from the forward pass, read and written
 * as llama.cpp's files (see stz_imatrix.h). */
#include "forward_internal.h"
#include "gguf/gguf_format.h"
#include "stz_imatrix.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char name[96];   /* GGUF name */
    uint64_t cols;
    double *sum;     /* per column: sum of squares */
    double tokens;   /* rows added */
    float *w;        /* sum / tokens */
    int usable;      /* some w > 0: weights a quantizer can use */
} entry;

struct stz_imatrix {
    entry *e;
    size_t n, cap;
    char source[512];
    uint32_t chunks, chunk_size;
    double *col; /* collecting: one input's sums of squares per column */
    size_t ncol;
};

stz_status stz_imatrix_new(stz_imatrix **out, stz_err *err)
{
    if (!(*out = calloc(1, sizeof **out)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for an importance matrix");
    return STZ_OK;
}

void stz_imatrix_free(stz_imatrix *im)
{
    for (size_t i = 0; im && i < im->n; i++)
        free(im->e[i].sum), free(im->e[i].w);
    if (im)
        free(im->e), free(im->col);
    free(im);
}

void stz_imatrix_describe(stz_imatrix *im, const char *dataset, uint32_t chunks, uint32_t chunk_size)
{
    snprintf(im->source, sizeof im->source, "%s", dataset ? dataset : "");
    im->chunks = chunks, im->chunk_size = chunk_size;
}

const char *stz_imatrix_dataset(const stz_imatrix *im, double *tokens)
{
    double most = 0;
    for (size_t i = 0; i < im->n; i++)
        most = im->e[i].tokens > most ? im->e[i].tokens : most;
    if (tokens)
        *tokens = most;
    return im->source;
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

static entry *lookup(const stz_imatrix *im, const char *name)
{
    for (size_t i = 0; i < im->n; i++)
        if (!strcmp(im->e[i].name, name))
            return &im->e[i];
    return NULL;
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
    snprintf(e->name, sizeof e->name, "%s", name);
    e->cols = cols, e->sum = calloc(cols + 1, sizeof *e->sum), e->w = calloc(cols + 1, sizeof *e->w);
    if (!e->sum || !e->w) {
        free(e->sum), free(e->w);
        return NULL;
    }
    im->n++;
    return e;
}

/* The mean squares again after sums changed. */
static void update_weights(entry *e)
{
    e->usable = 0;
    for (uint64_t j = 0; j < e->cols; j++)
        e->usable |= (e->w[j] = e->tokens > 0 ? (float)(e->sum[j] / e->tokens) : 0.0f) > 0;
}

/* ---- collecting ------------------------------------------------------------ */

void stz_fwd_set_imatrix(stz_fwd *m, stz_imatrix *im) { m->imatrix = im; }

stz_status stz_imatrix_observe(stz_fwd *m, uint32_t layer, const int *roles, int k, const float *X, size_t n,
                               size_t cols, stz_err *err)
{
    stz_imatrix *im = m->imatrix;
    if (!im || !n)
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
    for (size_t s = 0, rows = 0; s < nseq; s++) {
        groups += !rows || rows + lens[s] > COLLECT_ROWS;
        rows = !rows || rows + lens[s] > COLLECT_ROWS ? lens[s] : rows + lens[s];
    }
    uint64_t done = 0, total = (uint64_t)groups * m->c.n_layers;
    float *X = NULL;
    stz_status st = STZ_OK;
    stz_imatrix *was = m->imatrix;
    m->imatrix = im;
    for (size_t s0 = 0, s1; !st && s0 < nseq; s0 = s1) {
        size_t rows = lens[s0];
        for (s1 = s0 + 1; s1 < nseq && rows + lens[s1] <= COLLECT_ROWS; s1++)
            rows += lens[s1];
        float *nx = realloc(X, (rows * D + 1) * sizeof *X);
        if (!nx) {
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu positions", rows);
            break;
        }
        X = nx;
        if (!(st = stz_forward_hidden_states(m, tokens + s0 * stride, s1 - s0, stride, lens + s0, X, progress, user,
                                             &done, total, err)))
            st = stz_forward_final_norm(m, X, rows, err);
    }
    m->imatrix = was;
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
        return stz_err_set(err, STZ_E_SHAPE, "importance matrix entry '%s' has %llu columns, tensor '%s' has %llu "
                           "(an importance matrix of another model?)", e->name, (unsigned long long)e->cols, name,
                           (unsigned long long)cols);
    *w = e->usable ? e->w : NULL; /* no token seen, or every column 0: nothing to weigh by */
    return STZ_OK;
}

/* ---- writing: llama.cpp's imatrix GGUF ------------------------------------------- */

stz_status stz_imatrix_save(const stz_imatrix *im, const char *path, int force, stz_err *err)
{
    if (!im->n)
        return stz_err_set(err, STZ_E_ARG, "%s: the importance matrix is empty (no token went through the model)",
                           path);
    gbuf kv = {0}, head = {0}, data = {0};
    kv_str(&kv, "general.type", "imatrix");
    kv_arr(&kv, "imatrix.datasets", GV_STR, 1);
    gb_str(&kv, im->source, strlen(im->source));
    kv_u32(&kv, "imatrix.chunk_count", im->chunks);
    kv_u32(&kv, "imatrix.chunk_size", im->chunk_size);
    gb_u32(&head, 0x46554747u); /* "GGUF" */
    gb_u32(&head, 3);
    gb_u64(&head, 2 * im->n);
    gb_u64(&head, kv.count);
    gb_bytes(&head, kv.p, kv.n);
    char name[128];
    for (size_t i = 0; i < im->n; i++) {
        const entry *e = &im->e[i];
        uint64_t ne_sum[2] = {e->cols, 1}, ne_count[2] = {1, 1};
        snprintf(name, sizeof name, "%s.in_sum2", e->name);
        gb_tensor_info(&head, name, 2, ne_sum, STZ_GGML_F32, data.n);
        for (uint64_t j = 0; j < e->cols; j++) {
            float v = (float)e->sum[j];
            uint32_t u;
            memcpy(&u, &v, 4);
            gb_u32(&data, u);
        }
        gb_pad(&data);
        snprintf(name, sizeof name, "%s.counts", e->name);
        gb_tensor_info(&head, name, 2, ne_count, STZ_GGML_F32, data.n);
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
    double total = (e ? e->tokens : 0) + tokens;
    for (uint64_t j = 0; j < cols && total > 0; j++) /* the mean squares, as floats */
        if (!isfinite((float)(((e ? e->sum[j] : 0) + sum[j]) / total)))
            return stz_err_set(err, STZ_E_FORMAT, "%s: entry '%s': column %llu's mean square (%g over %g tokens) "
                               "is beyond a float", path, name, (unsigned long long)j, sum[j], tokens);
    if (!e && !(e = entry_for(im, name, cols)))
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for entry '%s'", path, name);
    for (uint64_t j = 0; j < cols; j++)
        e->sum[j] += sum[j];
    e->tokens += tokens;
    update_weights(e);
    return STZ_OK;
}

/* llama.cpp's GGUF: NAME.in_sum2 (F32, [cols, matrices]) and NAME.counts (F32, [1, matrices]). */
static stz_status load_gguf(stz_imatrix *im, const char *path, stz_err *err)
{
    stz_gguf *g;
    stz_status st = stz_gguf_open(&g, path, err);
    if (st)
        return st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        st = stz_err_set(err, STZ_E_IO, "%s: %s", path, strerror(errno));
    for (size_t i = 0; !st && i < stz_gguf_kv_count(g); i++)
        if (!strcmp(stz_gguf_kv_key(g, i), "imatrix.datasets"))
            snprintf(im->source, sizeof im->source, "%s", stz_gguf_kv_text(g, i));
    float *sum = NULL;
    for (size_t i = 0; !st && i < stz_gguf_tensor_count(g); i++) {
        const stz_gguf_tensor *t = stz_gguf_tensor_at(g, i), *c = NULL;
        size_t len = strlen(t->name);
        if (len < 8 || strcmp(t->name + len - 8, ".in_sum2"))
            continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s.counts", (int)(len - 8), t->name);
        for (size_t k = 0; k < stz_gguf_tensor_count(g) && !c; k++)
            c = strcmp(stz_gguf_tensor_at(g, k)->name, name) ? NULL : stz_gguf_tensor_at(g, k);
        name[len - 8] = 0;
        uint64_t cols = t->ne[0], mats = t->ndim > 1 ? t->ne[1] : 1;
        if (!c)
            st = stz_err_set(err, STZ_E_FORMAT, "%s: entry '%s' has sums but no counts", path, name);
        else if (t->type != STZ_GGML_F32 || c->type != STZ_GGML_F32 || t->ndim > 2 || !cols ||
                 c->ne[0] * (c->ndim > 1 ? c->ne[1] : 1) != mats || cols > (1u << 24) || mats > (1u << 12))
            st = stz_err_set(err, STZ_E_FORMAT, "%s: entry '%s': sums and counts must be F32 tensors of [columns, "
                             "matrices] and [1, matrices]", path, name);
        float *ns = st ? NULL : realloc(sum, (cols * mats + mats) * sizeof *sum);
        if (!st && !ns)
            st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for entry '%s'", path, name);
        if (st)
            break;
        sum = ns;
        float *cnt = sum + cols * mats;
        if (stz_pread_full(fd, sum, cols * mats * 4, t->offset) || stz_pread_full(fd, cnt, mats * 4, c->offset)) {
            st = stz_err_set(err, STZ_E_IO, "%s: cannot read entry '%s'", path, name);
            break;
        }
        for (uint64_t k = 0; !st && k < mats; k++) /* stacked experts: pooled */
            st = add_read(im, path, name, sum + k * cols, cols, cnt[k], err);
    }
    if (!st && !im->n)
        st = bad(path, "a GGUF file without NAME.in_sum2 tensors", err);
    free(sum);
    if (fd >= 0)
        close(fd);
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

static stz_status parse_dat(stz_imatrix *im, const char *path, cursor *c, stz_err *err)
{
    int32_t n, len, calls, nval;
    if (take_i32(c, &n) || n < 1)
        return bad(path, "no entry count (neither GGUF nor llama.cpp's .dat)", err);
    stz_status st = STZ_OK;
    float *v = NULL;
    for (int32_t i = 0; !st && i < n; i++) {
        char name[256];
        if (take_i32(c, &len) || len < 1 || len >= (int32_t)sizeof name || take(c, name, (size_t)len))
            return free(v), stz_err_set(err, STZ_E_FORMAT, "%s: entry %d: bad or truncated name", path, i + 1);
        name[len] = 0;
        if (memchr(name, 0, (size_t)len) || take_i32(c, &calls) || take_i32(c, &nval) || calls < 0 || nval < 1 ||
            (size_t)nval > (c->n - c->at) / 4)
            return free(v), stz_err_set(err, STZ_E_FORMAT, "%s: entry '%s': bad or truncated values", path, name);
        float *nv = realloc(v, (size_t)nval * sizeof *v);
        if (!nv)
            return free(v), stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for entry '%s'", path, name);
        v = nv;
        take(c, v, (size_t)nval * 4);
        for (int32_t j = 0; j < nval; j++) { /* little-endian floats */
            uint32_t u = stz_le32((const uint8_t *)&v[j]);
            memcpy(&v[j], &u, 4);
        }
        st = add_read(im, path, name, v, (uint64_t)nval, calls, err); /* values / calls: the mean squares */
    }
    free(v);
    int32_t chunks;
    if (!st && !take_i32(c, &chunks) && chunks > 0 && !take_i32(c, &len) && len > 0 && (size_t)len < sizeof im->source &&
        c->n - c->at >= (size_t)len)
        snprintf(im->source, sizeof im->source, "%.*s", (int)len, (const char *)c->p + c->at), im->chunks = (uint32_t)chunks;
    return st;
}

static stz_status load_dat(stz_imatrix *im, const char *path, stz_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0)
        return stz_err_set(err, STZ_E_IO, "%s: %s", path, strerror(errno));
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode) || sb.st_size > (1ll << 32)) {
        close(fd);
        return bad(path, "not a regular file under 4 GiB", err);
    }
    uint8_t *p = malloc((size_t)sb.st_size + 1);
    stz_status st = p ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "%s: out of memory", path);
    if (!st && stz_pread_full(fd, p, (size_t)sb.st_size, 0))
        st = stz_err_set(err, STZ_E_IO, "%s: cannot read it", path);
    close(fd);
    cursor c = {p, (size_t)sb.st_size, 0};
    if (!st)
        st = parse_dat(im, path, &c, err);
    free(p);
    return st;
}

stz_status stz_imatrix_load(stz_imatrix **out, const char *path, stz_err *err)
{
    *out = NULL;
    stz_imatrix *im;
    stz_status st = stz_imatrix_new(&im, err);
    if (st)
        return st;
    uint8_t magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) {
        stz_imatrix_free(im);
        return stz_err_set(err, STZ_E_IO, "%s: %s", path, strerror(errno));
    }
    size_t got = fread(magic, 1, 4, f);
    fclose(f);
    st = got == 4 && !memcmp(magic, "GGUF", 4) ? load_gguf(im, path, err) : load_dat(im, path, err);
    if (st) {
        stz_imatrix_free(im);
        return st;
    }
    *out = im;
    return STZ_OK;
}
