/* Error feedback with sequential calibration (stz_feedback.h): the
 * forward pass layer by layer, each layer's input Gram matrices collected
 * (stz_feedback_observe, from the layers' observation points), its
 * matrices quantized by stz_quantize_tensor_feedback, the layer run again
 * with them; results kept in an unlinked temporary file. */
#include "forward_internal.h"
#include "quant/quant_tensor.h"
#include "stz_feedback.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The inputs a layer's matrices read: attention (q, k, v), its output (o),
 * the feed-forward (gate, up), its down projection; and the head's. */
enum { IN_ATTN, IN_OUT, IN_FFN, IN_DOWN, IN_HEAD, IN_COUNT };

struct stz_fb_hess {
    uint32_t layer; /* the layer whose inputs are collected */
    float *H[IN_COUNT]; /* cols x cols, upper triangle (NULL: not wanted) */
    size_t cols[IN_COUNT];
};

static int input_of(int role)
{
    switch (role) {
    case STZ_ROLE_WQ: case STZ_ROLE_WK: case STZ_ROLE_WV: return IN_ATTN;
    case STZ_ROLE_WO: return IN_OUT;
    case STZ_ROLE_GATE: case STZ_ROLE_UP: return IN_FFN;
    case STZ_ROLE_DOWN: return IN_DOWN;
    default: return IN_HEAD;
    }
}

stz_status stz_feedback_observe(stz_fwd *m, uint32_t layer, const int *roles, const float *X, size_t n, size_t cols,
                                stz_err *err)
{
    struct stz_fb_hess *h = m->hess;
    int g = input_of(roles[0]);
    if (!h->H[g] || (g != IN_HEAD && layer != h->layer))
        return STZ_OK;
    if (h->cols[g] != cols)
        return stz_err_set(err, STZ_E_SHAPE, "%s: an input of %zu columns where %zu were expected", m->label, cols,
                           h->cols[g]);
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)cols, (int)n, 1.0f, X, (int)cols, 1.0f, h->H[g], (int)cols);
    return STZ_OK;
}

/* ---- the results, in an unlinked temporary file ------------------------------- */

typedef struct {
    char *name;
    stz_decision d;
    long off[STZ_PART_COUNT];
    size_t len[STZ_PART_COUNT];
    stz_dtype dtype[STZ_PART_COUNT];
    stz_qformat fmt;
    double err2, norm2, cosine;
} fb_entry;

struct stz_feedback {
    FILE *spill;
    fb_entry *e;
    size_t n, cap, skipped;
    char skip_name[256];
};

void stz_feedback_free(stz_feedback *fb)
{
    for (size_t i = 0; fb && i < fb->n; i++)
        free(fb->e[i].name);
    if (fb && fb->spill)
        fclose(fb->spill);
    if (fb)
        free(fb->e);
    free(fb);
}

size_t stz_feedback_count(const stz_feedback *fb) { return fb->n; }

size_t stz_feedback_skipped(const stz_feedback *fb, const char **example)
{
    if (example)
        *example = fb->skip_name;
    return fb->skipped;
}

static stz_status spill_put(stz_feedback *fb, const char *name, const stz_decision *d, const stz_qmem *q, stz_err *err)
{
    if (fb->n == fb->cap) {
        size_t cap = fb->cap ? 2 * fb->cap : 32;
        fb_entry *e = realloc(fb->e, cap * sizeof *e);
        if (!e)
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for the feedback results");
        fb->e = e, fb->cap = cap;
    }
    fb_entry *e = &fb->e[fb->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the feedback results");
    e->d = *d, e->fmt = q->fmt, e->err2 = q->err2, e->norm2 = q->norm2, e->cosine = q->cosine;
    e->fmt.weights = NULL;
    fb->n++;
    for (int k = 0; k < STZ_PART_COUNT; k++) {
        e->len[k] = q->part[k] ? q->len[k] : 0, e->dtype[k] = q->dtype[k];
        e->off[k] = ftell(fb->spill);
        if (e->len[k] && fwrite(q->part[k], 1, e->len[k], fb->spill) != e->len[k])
            return stz_err_set(err, STZ_E_IO, "cannot write the feedback results to a temporary file (disk full?)");
    }
    return STZ_OK;
}

stz_status stz_feedback_take(stz_feedback *fb, const char *name, const stz_decision *d, stz_qmem *out, int *found,
                             stz_err *err)
{
    memset(out, 0, sizeof *out);
    *found = 0;
    const fb_entry *e = NULL;
    for (size_t i = 0; i < fb->n && !e; i++)
        e = strcmp(fb->e[i].name, name) ? NULL : &fb->e[i];
    if (!e)
        return STZ_OK;
    if (e->d.action != d->action || e->d.method != d->method || e->d.block_size != d->block_size ||
        e->d.scale_dtype != d->scale_dtype)
        return stz_err_set(err, STZ_E_ARG, "tensor '%s' was quantized with feedback as %s, and is now asked as %s "
                           "(another policy?)", name, stz_action_name(e->d.action), stz_action_name(d->action));
    out->fmt = e->fmt, out->err2 = e->err2, out->norm2 = e->norm2, out->cosine = e->cosine;
    for (int k = 0; k < STZ_PART_COUNT; k++) {
        out->dtype[k] = e->dtype[k], out->len[k] = e->len[k];
        if (!e->len[k])
            continue;
        if (!(out->part[k] = malloc(e->len[k]))) {
            stz_qmem_free(out);
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for tensor '%s'", name);
        }
        if (pread(fileno(fb->spill), out->part[k], e->len[k], e->off[k]) != (ssize_t)e->len[k]) { /* shards at once */
            stz_qmem_free(out);
            return stz_err_set(err, STZ_E_IO, "cannot read the feedback results back from their temporary file");
        }
    }
    *found = 1;
    return STZ_OK;
}

/* ---- the walk, layer by layer --------------------------------------------------- */

/* A matrix of the layer being visited: its values as the layer then runs
 * with them (rewrite; NULL: as read). */
typedef struct {
    loc at;
    int input;
    float *y;
} gram_matrix;

typedef struct {
    stz_fwd *m;
    const stz_gram_visitor *v;
    gram_matrix mat[STZ_ROLE_PER_LAYER + 1];
    int nmat;
    struct stz_fb_hess h;
} gram_run;

static int wanted(gram_run *R, loc at)
{
    const stz_qtensor *q = stz_forward_tensor(R->m, at);
    return q->ndim == 2 && R->v->wants(R->v->user, q);
}

/* Replaces the rows of the matrices visited so far with their values as rewritten. */
static int rewrite_rows(void *user, const char *name, float *rows, uint64_t r0, size_t n, size_t cols)
{
    gram_run *R = user;
    for (int i = 0; i < R->nmat; i++)
        if (R->mat[i].y && !strcmp(stz_forward_tensor(R->m, R->mat[i].at)->name, name))
            memcpy(rows, R->mat[i].y + r0 * cols, n * cols * sizeof *rows);
    return 0;
}

static void clear_layer(gram_run *R)
{
    for (int i = 0; i < R->nmat; i++)
        free(R->mat[i].y);
    for (int g = 0; g < IN_COUNT; g++)
        free(R->h.H[g]);
    memset(R->mat, 0, sizeof R->mat), memset(&R->h, 0, sizeof R->h);
    R->nmat = 0;
}

/* Gram matrices for the inputs the chosen matrices read. */
static stz_status alloc_inputs(gram_run *R, stz_err *err)
{
    for (int i = 0; i < R->nmat; i++) {
        int g = R->mat[i].input;
        size_t c = (size_t)stz_forward_tensor(R->m, R->mat[i].at)->cols;
        if (R->h.H[g])
            continue;
        if (!(R->h.H[g] = calloc(c * c + 1, sizeof *R->h.H[g])))
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for a %zu x %zu Gram matrix", c, c);
        R->h.cols[g] = c;
    }
    return STZ_OK;
}

/* Matrix x read whole and given to the visitor with its inputs' Gram
 * matrix; its rewritten values kept for the layer's second run (the head
 * has none). */
static stz_status visit_one(gram_run *R, gram_matrix *x, stz_err *err)
{
    const stz_qtensor *t = stz_forward_tensor(R->m, x->at);
    size_t rows = (size_t)t->rows, cols = (size_t)t->cols;
    float *H = R->h.H[x->input], *W = malloc(rows * cols * sizeof *W + 1);
    x->y = R->v->rewrite && x->input != IN_HEAD ? malloc(rows * cols * sizeof *x->y + 1) : NULL;
    if (!W || (R->v->rewrite && x->input != IN_HEAD && !x->y)) {
        free(W);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for tensor '%s'", t->name);
    }
    for (size_t i = 0; i < cols; i++) /* ssyrk filled the upper triangle */
        for (size_t j = 0; j < i; j++)
            H[i * cols + j] = H[j * cols + i];
    stz_status st = stz_forward_read_rows(R->m, x->at, 0, rows, W, err);
    if (!st)
        st = R->v->matrix(R->v->user, t, W, H, x->y, err);
    free(W);
    return st;
}

/* Layer l: its chosen matrices' inputs collected over X as it runs, the
 * matrices visited; with rewrite, X restored and the layer run again with
 * their new values. */
static stz_status walk_layer(gram_run *R, uint32_t l, float *X, float *Xin, const batch *b, size_t nseq, stz_err *err)
{
    stz_fwd *m = R->m;
    size_t n = b->n * m->c.dim;
    for (int k = 0; k < STZ_ROLE_PER_LAYER; k++) {
        loc at = m->layer[(size_t)l * STZ_ROLE_PER_LAYER + k];
        if (at.f >= 0 && wanted(R, at))
            R->mat[R->nmat].at = at, R->mat[R->nmat].input = input_of(k), R->nmat++;
    }
    int rewrite = R->nmat && R->v->rewrite;
    if (rewrite)
        memcpy(Xin, X, n * sizeof *X);
    R->h.layer = l;
    stz_status st = alloc_inputs(R, err);
    if (!st) {
        m->hess = &R->h;
        st = stz_forward_run_layers(m, X, b, nseq, l, l + 1, NULL, NULL, &(uint64_t){0}, 0, err);
        m->hess = NULL;
    }
    for (int i = 0; !st && i < R->nmat; i++)
        st = visit_one(R, &R->mat[i], err);
    if (!st && rewrite) {
        stz_fwd_probe rw = {.perturb = rewrite_rows, .user = R};
        memcpy(X, Xin, n * sizeof *X);
        m->rewrite = &rw;
        st = stz_forward_run_layers(m, X, b, nseq, l, l + 1, NULL, NULL, &(uint64_t){0}, 0, err);
        m->rewrite = NULL;
    }
    clear_layer(R);
    return st;
}

/* The head (or the tied embedding) after the last layer: its input
 * collected through the final norm. */
static stz_status walk_head(gram_run *R, float *X, size_t n, stz_err *err)
{
    stz_fwd *m = R->m;
    gram_matrix *x = &R->mat[0];
    loc head = m->global[G_HEAD];
    if (head.f < 0 || !wanted(R, head))
        return STZ_OK;
    x->at = head, x->input = IN_HEAD, R->nmat = 1;
    stz_status st = alloc_inputs(R, err);
    if (!st) {
        m->hess = &R->h;
        st = stz_forward_final_norm(m, X, n, err);
        m->hess = NULL;
    }
    if (!st)
        st = visit_one(R, x, err);
    clear_layer(R);
    return st;
}

stz_status stz_forward_grams(stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride, const size_t *lens,
                             const stz_gram_visitor *v, stz_fwd_progress progress, void *user, stz_err *err)
{
    gram_run R = {.m = m, .v = v};
    seq_rows S = {0};
    float *X = NULL, *Xin = NULL;
    if (v->rewrite)
        stz_forward_drop_kept(m); /* layers run as read, so that the rewritten ones replace them */
    stz_status st = stz_forward_rows_make(m, tokens, nseq, stride, lens, &S, err);
    size_t n = S.b.n, D = m->c.dim;
    if (!st && (!(X = malloc((n * D + 1) * sizeof *X)) || (v->rewrite && !(Xin = malloc((n * D + 1) * sizeof *Xin)))))
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu positions", n);
    stz_blas_threads(m->threads);
    if (!st)
        st = stz_forward_embed(m, S.tok, n, X, err);
    for (uint32_t l = 0; !st && l < m->c.n_layers; l++) {
        st = walk_layer(&R, l, X, Xin, &S.b, nseq, err);
        stz_blas_threads(m->threads); /* the visitor may set one */
        if (!st && progress && progress(user, l + 1, m->c.n_layers + 1))
            st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    }
    if (!st)
        st = walk_head(&R, X, n, err);
    if (!st && progress && progress(user, m->c.n_layers + 1, m->c.n_layers + 1))
        st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    clear_layer(&R);
    stz_blas_threads(m->threads);
    stz_forward_rows_free(&S);
    free(X), free(Xin);
    return st;
}

/* ---- error feedback: the walk quantizing ---------------------------------------- */

typedef struct {
    stz_fwd *m;
    stz_feedback *fb;
    stz_policy *policy;
    int threads;
} fb_run;

static stz_decision decide(const fb_run *R, const stz_qtensor *q)
{
    stz_tensor t = {.name = q->name, .dtype = q->dtype, .ndim = q->ndim, .shape = q->shape, .numel = q->numel};
    return stz_policy_decide(R->policy, &t);
}

/* 1 when the tensor's decision asks for feedback (of more than one block). */
static int fb_wants(void *user, const stz_qtensor *q)
{
    stz_decision d = decide(user, q);
    return d.feedback && q->ndim == 2 && q->rows * stz_q_blocks(q->cols, d.block_size) > 1;
}

/* The matrix quantized with feedback, stored in the temporary file. */
static stz_status fb_matrix(void *user, const stz_qtensor *t, const float *W, const float *H, float *y, stz_err *err)
{
    fb_run *R = user;
    stz_decision d = decide(R, t);
    stz_qmem q;
    stz_err sub;
    stz_status st = stz_quantize_tensor_feedback(&d, W, H, t->rows, t->cols, R->threads, &q, y, &sub);
    if (st)
        return stz_err_set(err, st, "%s: tensor '%s': %s", R->m->label, t->name, sub.msg);
    st = spill_put(R->fb, t->name, &d, &q, err);
    stz_qmem_free(&q);
    return st;
}

/* An unlinked temporary file in $TMPDIR (else /tmp), or NULL. */
static FILE *spill_open(void)
{
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/stz-feedback-XXXXXX", dir && *dir ? dir : "/tmp");
    int handle, fd = stz_tmp_make(path, 0, &handle); /* tracked until unlinked: no signal leaves it behind */
    if (fd < 0)
        return NULL;
    unlink(path); /* gone with the process, however it ends */
    stz_tmp_untrack(handle);
    FILE *f = fdopen(fd, "w+b");
    if (!f)
        close(fd);
    return f;
}

stz_status stz_feedback_run(stz_feedback **out, stz_fwd *m, stz_policy *policy, const int32_t *tokens, size_t nseq,
                            size_t stride, const size_t *lens, int threads, stz_fwd_progress progress, void *user,
                            stz_err *err)
{
    fb_run R = {.m = m, .policy = policy, .threads = threads};
    stz_gram_visitor v = {fb_wants, fb_matrix, &R, 1};
    stz_status st = (R.fb = calloc(1, sizeof *R.fb)) && (R.fb->spill = spill_open())
                        ? STZ_OK
                        : stz_err_set(err, STZ_E_IO, "cannot create a temporary file for the feedback results");
    if (!st)
        st = stz_forward_grams(m, tokens, nseq, stride, lens, &v, progress, user, err);
    if (!st && fflush(R.fb->spill)) /* read back with pread */
        st = stz_err_set(err, STZ_E_IO, "cannot write the feedback results to a temporary file (disk full?)");
    loc emb = m->global[G_EMBED], head = m->global[G_HEAD];
    if (!st && (emb.f != head.f || emb.i != head.i) && emb.f >= 0 && fb_wants(&R, stz_forward_tensor(m, emb))) {
        R.fb->skipped++; /* an untied embedding: no matrix product reads it */
        snprintf(R.fb->skip_name, sizeof R.fb->skip_name, "%s", stz_forward_tensor(m, emb)->name);
    }
    if (st) {
        stz_feedback_free(R.fb);
        R.fb = NULL;
    }
    *out = R.fb;
    return st;
}
