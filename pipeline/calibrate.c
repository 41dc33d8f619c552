/* Error feedback with sequential calibration (stz_feedback.h): the
 * forward pass layer by layer, each layer's input Gram matrices collected
 * (grams_input, a hook on the layers' observation points), its
 * matrices quantized by stz_quantize_tensor_feedback input by input, with
 * the drift of their inputs from the original model's (which runs
 * alongside), the layer run again with them; results kept in an unlinked
 * temporary file. */
#include "model/forward_internal.h"
#include "stz_kernels.h"
#include "quant/quant_tensor.h"
#include "stz_feedback.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The inputs a layer's matrices read: attention (q, k, v), its output (o),
 * the feed-forward (gate, up), its down projection; and the head's. */
enum { IN_ATTN, IN_OUT, IN_FFN, IN_DOWN, IN_HEAD, IN_COUNT };

struct stz_fb_hess {
    uint32_t layer;        /* the layer whose inputs are collected */
    int only;              /* -1: every input; else the one collected */
    int keep;              /* 1: the original model runs: its inputs are kept in X0 */
    int stopped;           /* 1: `only` was collected and the run stopped there */
    size_t cols[IN_COUNT]; /* of each input wanted (0: not wanted) */
    float *H[IN_COUNT];    /* cols x cols, upper triangle */
    float *D[IN_COUNT];    /* with X0: (X0 - X)^T X, cols x cols */
    float *X0[IN_COUNT];   /* the original model's inputs, tokens x cols (taken by D) */
};

static int input_of(int role)
{
    switch (role) {
    case STZ_ROLE_WQ:
    case STZ_ROLE_WK:
    case STZ_ROLE_WV:
    case STZ_ROLE_WQKV: return IN_ATTN;
    case STZ_ROLE_WO: return IN_OUT;
    case STZ_ROLE_GATE:
    case STZ_ROLE_UP:
    case STZ_ROLE_GATE_UP: return IN_FFN;
    case STZ_ROLE_DOWN: return IN_DOWN;
    default: return IN_HEAD;
    }
}

/* The Gram matrices' hook: the layer's inputs added up (or kept, or the
 * run stopped once `only` is collected). */
static stz_status grams_input(stz_fwd_hook *hook, const stz_fwd *m, uint32_t layer, const int *roles, int k,
                              const float *X, size_t n, size_t cols, stz_err *err)
{
    (void)k; /* the matrices of one input share its Gram matrix */
    struct stz_fb_hess *h = hook->user;
    if (stz_interrupt_pending()) /* a batch's products take seconds on wide models */
        return stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    int g = input_of(roles[0]);
    if (!h->cols[g] || (g != IN_HEAD && layer != h->layer) || (h->only >= 0 && g != h->only))
        return STZ_OK;
    if (h->cols[g] != cols)
        return stz_err_set(err, STZ_E_SHAPE, "%s: an input of %zu columns where %zu were expected", m->label, cols,
                           h->cols[g]);
    if (h->keep) {
        memcpy(h->X0[g], X, n * cols * sizeof *X);
        return STZ_OK;
    }
    stz_mm_gram(h->H[g], X, n, cols, m->threads); /* H (cols, cols) += X^T X */
    if (h->X0[g]) {
        for (size_t i = 0; i < n * cols; i++)
            h->X0[g][i] -= X[i];
        /* D (cols, cols) = (X0 - X)^T (cols, n) @ X (n, cols) */
        stz_mm_nn(h->D[g], cols, h->X0[g], 1, cols, X, cols, cols, n, cols, 0, m->threads);
        free(h->X0[g]);
        h->X0[g] = NULL;
    }
    if (h->only < 0)
        return STZ_OK;
    h->stopped = 1; /* the rest of the layer is not needed */
    return stz_err_set(err, STZ_E_INTERRUPTED, "stopped after the input collected");
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
    char *skip_name; /* an example of the tensors skipped (NULL: none) */
};

void stz_feedback_free(stz_feedback *fb)
{
    for (size_t i = 0; fb && i < fb->n; i++)
        free(fb->e[i].name);
    if (fb && fb->spill)
        fclose(fb->spill);
    if (fb)
        free(fb->e), free(fb->skip_name);
    free(fb);
}

size_t stz_feedback_count(const stz_feedback *fb) { return fb->n; }

size_t stz_feedback_skipped(const stz_feedback *fb, const char **example)
{
    if (example)
        *example = fb->skip_name ? fb->skip_name : "";
    return fb->skipped;
}

/* Where the feedback results wait for the writer: $TMPDIR, else /tmp. */
static const char *spill_dir(void)
{
    const char *dir = getenv("TMPDIR");
    return dir && *dir ? dir : "/tmp";
}

/* A write to the spill file failed. */
static stz_status spill_write_error(stz_err *err)
{
    return stz_err_set(err, STZ_E_IO, "cannot write the feedback results to a temporary file in %s (disk full?)",
                       spill_dir());
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
            return spill_write_error(err);
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
    if (e->d.action != d->action || stz_decision_ggml_type(&e->d) != stz_decision_ggml_type(d) ||
        e->d.method != d->method || e->d.block_size != d->block_size || e->d.scale_dtype != d->scale_dtype)
        return stz_err_set(err, STZ_E_ARG,
                           "tensor '%s' was quantized with feedback as %s, and is now asked as %s "
                           "(another policy?)",
                           name, stz_action_name(e->d.action, e->d.ggml_type),
                           stz_action_name(d->action, d->ggml_type));
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
    stz_fwd_hook grams, rewrite; /* on m while the Gram matrices are collected; while the layer runs rewritten */
    gram_matrix mat[STZ_ROLE_PER_LAYER + 1];
    int nmat, drifted; /* drifted: a matrix was rewritten, the original model's states differ */
    size_t n;          /* positions */
    struct stz_fb_hess h;
} gram_run;

static int wanted(gram_run *R, loc at)
{
    const stz_qtensor *q = stz_forward_tensor(R->m, at);
    return q->ndim == 2 && R->v->wants(R->v->user, q);
}

/* Replaces the rows of the matrices visited so far with their values as rewritten. */
static int rewrite_rows(stz_fwd_hook *h, const stz_fwd *m, loc at, float *rows, uint64_t r0, size_t n, size_t cols)
{
    (void)m;
    gram_run *R = h->user;
    for (int i = 0; i < R->nmat; i++)
        if (R->mat[i].y && R->mat[i].at.f == at.f && R->mat[i].at.i == at.i)
            memcpy(rows, R->mat[i].y + r0 * cols, n * cols * sizeof *rows);
    return 0;
}

static void free_input(gram_run *R, int g)
{
    free(R->h.H[g]), free(R->h.D[g]), free(R->h.X0[g]);
    R->h.H[g] = R->h.D[g] = R->h.X0[g] = NULL;
}

static void clear_layer(gram_run *R)
{
    for (int i = 0; i < R->nmat; i++)
        free(R->mat[i].y);
    for (int g = 0; g < IN_COUNT; g++)
        free_input(R, g);
    memset(R->mat, 0, sizeof R->mat), memset(&R->h, 0, sizeof R->h);
    R->nmat = 0;
}

/* Input g's Gram matrix (and with D, the difference's), zeroed. */
static stz_status alloc_gram(gram_run *R, int g, int with_D, stz_err *err)
{
    size_t c = R->h.cols[g];
    if (!(R->h.H[g] = calloc(c * c + 1, sizeof *R->h.H[g])) || (with_D && !(R->h.D[g] = malloc(c * c * sizeof(float)))))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for a %zu x %zu Gram matrix", c, c);
    return STZ_OK;
}

/* The inputs the chosen matrices read: their widths. */
static void mark_inputs(gram_run *R)
{
    for (int i = 0; i < R->nmat; i++)
        R->h.cols[R->mat[i].input] = (size_t)stz_forward_tensor(R->m, R->mat[i].at)->cols;
}

/* Matrix x read whole and given to the visitor with its inputs' Gram
 * matrices; its rewritten values kept for the layer's next runs (the head
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
        st = R->v->matrix(R->v->user, t, W, H, R->h.D[x->input], x->y, err);
    free(W);
    return st;
}

/* Layer l over X in place, the matrices visited so far as rewritten; a
 * run collecting one input stops there (X is then left part way). */
static stz_status run_layer(gram_run *R, uint32_t l, float *X, const batch *b, size_t nseq, stz_err *err)
{
    if (R->v->rewrite)
        stz_forward_attach(R->m, &R->rewrite);
    R->h.stopped = 0;
    stz_status st = stz_forward_run_layers(R->m, X, b, nseq, l, l + 1, NULL, NULL, &(uint64_t){0}, 0, err);
    stz_forward_detach(R->m, &R->rewrite);
    return st == STZ_E_INTERRUPTED && R->h.stopped ? STZ_OK : st;
}

/* Without rewrite: one run collects every input, then the matrices are visited. */
static stz_status visit_as_read(gram_run *R, uint32_t l, float *X, const batch *b, size_t nseq, stz_err *err)
{
    stz_status st = STZ_OK;
    for (int g = 0; !st && g < IN_COUNT; g++)
        st = R->h.cols[g] ? alloc_gram(R, g, 0, err) : STZ_OK;
    R->h.only = -1;
    if (!st)
        st = run_layer(R, l, X, b, nseq, err);
    for (int i = 0; !st && i < R->nmat; i++)
        st = visit_one(R, &R->mat[i], err);
    return st;
}

/* With rewrite: the original model's layer runs on X0, keeping its
 * inputs; then input by input in the layer's order, the layer runs on X
 * (from Xin) with the matrices rewritten so far, collecting that input's
 * Gram matrix and its difference from the original's, and the matrices
 * reading it are visited. Each matrix thus sees the inputs the rewritten
 * model gives it, and how they drifted from the original's. */
static stz_status visit_rewriting(gram_run *R, uint32_t l, float *X, float *Xin, float *X0, const batch *b, size_t nseq,
                                  stz_err *err)
{
    stz_status st = STZ_OK;
    for (int g = 0; !st && g < IN_HEAD; g++)
        if (R->h.cols[g] && !(R->h.X0[g] = malloc(R->n * R->h.cols[g] * sizeof(float) + 1)))
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu positions", R->n);
    R->h.keep = 1, R->h.only = -1;
    if (!st)
        st = run_layer(R, l, X0, b, nseq, err);
    R->h.keep = 0;
    memcpy(Xin, X, R->n * R->m->c.dim * sizeof *X);
    for (int g = 0; !st && g < IN_HEAD; g++) {
        if (!R->h.cols[g])
            continue;
        R->h.only = g;
        memcpy(X, Xin, R->n * R->m->c.dim * sizeof *X);
        if (!(st = alloc_gram(R, g, 1, err)))
            st = run_layer(R, l, X, b, nseq, err);
        for (int i = 0; !st && i < R->nmat; i++)
            st = R->mat[i].input == g ? visit_one(R, &R->mat[i], err) : STZ_OK;
        free_input(R, g);
    }
    R->drifted = 1;
    return st;
}

/* Layer l: its chosen matrices visited with their inputs' Gram matrices;
 * with rewrite, X (and the original model's states X0) carried to the
 * next layer. */
static stz_status walk_layer(gram_run *R, uint32_t l, float *X, float *Xin, float *X0, const batch *b, size_t nseq,
                             stz_err *err)
{
    stz_fwd *m = R->m;
    for (int k = 0; k < STZ_ROLE_PER_LAYER; k++) {
        loc at = m->layer[(size_t)l * STZ_ROLE_PER_LAYER + k];
        if (at.f >= 0 && wanted(R, at))
            R->mat[R->nmat].at = at, R->mat[R->nmat].input = input_of(k), R->nmat++;
    }
    mark_inputs(R);
    R->h.layer = l;
    stz_forward_attach(m, &R->grams);
    stz_status st = !R->v->rewrite ? visit_as_read(R, l, X, b, nseq, err)
                    : R->nmat      ? visit_rewriting(R, l, X, Xin, X0, b, nseq, err)
                                   : STZ_OK;
    stz_forward_detach(m, &R->grams);
    if (!st && R->v->rewrite) { /* the layer as rewritten carries X on */
        if (R->nmat)
            memcpy(X, Xin, R->n * m->c.dim * sizeof *X);
        st = run_layer(R, l, X, b, nseq, err);
        if (!st && !R->nmat && R->drifted)
            st = run_layer(R, l, X0, b, nseq, err);
        else if (!st && !R->nmat)
            memcpy(X0, X, R->n * m->c.dim * sizeof *X);
    }
    clear_layer(R);
    return st;
}

/* The head (or the tied embedding) after the last layer: its input
 * collected through the final norm; an untied head with rewrite also sees
 * the original model's (a tied one is the embedding too, which the
 * original's inputs do not describe). */
static stz_status walk_head(gram_run *R, float *X, float *X0, stz_err *err)
{
    stz_fwd *m = R->m;
    gram_matrix *x = &R->mat[0];
    loc head = m->global[G_HEAD];
    int untied = !stz_forward_tied(m);
    if (head.f < 0 || !wanted(R, head))
        return STZ_OK;
    x->at = head, x->input = IN_HEAD, R->nmat = 1;
    mark_inputs(R);
    int with_D = R->v->rewrite && untied && R->drifted;
    stz_status st = alloc_gram(R, IN_HEAD, with_D, err);
    if (!st && with_D && !(R->h.X0[IN_HEAD] = malloc(R->n * m->c.dim * sizeof(float) + 1)))
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu positions", R->n);
    stz_forward_attach(m, &R->grams);
    R->h.only = -1, R->h.keep = with_D;
    if (!st && with_D)
        st = stz_forward_final_norm(m, X0, R->n, err);
    R->h.keep = 0;
    if (!st)
        st = stz_forward_final_norm(m, X, R->n, err);
    stz_forward_detach(m, &R->grams);
    if (!st)
        st = visit_one(R, x, err);
    clear_layer(R);
    return st;
}

stz_status stz_forward_grams(stz_fwd *m, const int32_t *tokens, size_t nseq, size_t stride, const size_t *lens,
                             const stz_gram_visitor *v, stz_fwd_progress progress, void *user, stz_err *err)
{
    gram_run R = {.m = m, .v = v, .grams.input = grams_input, .rewrite.weights = rewrite_rows};
    R.grams.user = &R.h, R.rewrite.user = &R;
    seq_rows S = {0};
    float *X = NULL, *Xin = NULL, *X0 = NULL;
    if (v->rewrite)
        stz_forward_drop_kept(m); /* layers run as read, so that the rewritten ones replace them */
    stz_status st = stz_forward_rows_make(m, tokens, nseq, stride, lens, &S, err);
    size_t n = R.n = S.b.n, D = m->c.dim;
    int ok = !st && (X = malloc((n * D + 1) * sizeof *X)) &&
             (!v->rewrite || ((Xin = malloc((n * D + 1) * sizeof *Xin)) && (X0 = malloc((n * D + 1) * sizeof *X0))));
    if (!st && !ok)
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu positions", n);
    if (!st)
        st = stz_forward_embed(m, S.tok, S.pos, n, X, err);
    if (!st && X0)
        memcpy(X0, X, n * D * sizeof *X);
    for (uint32_t l = 0; !st && l < m->c.n_layers; l++) {
        st = walk_layer(&R, l, X, Xin, X0, &S.b, nseq, err);
        if (!st && progress && progress(user, l + 1, m->c.n_layers + 1))
            st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    }
    if (!st)
        st = walk_head(&R, X, X0, err);
    if (!st && progress && progress(user, m->c.n_layers + 1, m->c.n_layers + 1))
        st = stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    clear_layer(&R);
    stz_forward_rows_free(&S);
    free(X), free(Xin), free(X0);
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
static stz_status fb_matrix(void *user, const stz_qtensor *t, const float *W, const float *H, const float *D, float *y,
                            stz_err *err)
{
    fb_run *R = user;
    stz_decision d = decide(R, t);
    stz_qmem q;
    stz_err sub;
    stz_status st = stz_quantize_tensor_feedback(&d, W, H, D, t->rows, t->cols, R->threads, &q, y, &sub);
    if (st)
        return stz_err_set(err, st, "%s: tensor '%s': %s", R->m->label, t->name, sub.msg);
    st = spill_put(R->fb, t->name, &d, &q, err);
    stz_qmem_free(&q);
    return st;
}

/* An unlinked temporary file in spill_dir(), or NULL. */
static FILE *spill_open(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/stz-feedback-XXXXXX", spill_dir());
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
    stz_status st =
        (R.fb = calloc(1, sizeof *R.fb)) && (R.fb->spill = spill_open())
            ? STZ_OK
            : stz_err_set(
                  err, STZ_E_IO,
                  "cannot create a temporary file for the feedback results in %s (set TMPDIR to a writable directory)",
                  spill_dir());
    if (!st)
        st = stz_forward_grams(m, tokens, nseq, stride, lens, &v, progress, user, err);
    if (!st && fflush(R.fb->spill)) /* read back with pread */
        st = spill_write_error(err);
    loc emb = m->global[G_EMBED];
    if (!st && !stz_forward_tied(m) && emb.f >= 0 && fb_wants(&R, stz_forward_tensor(m, emb))) {
        R.fb->skipped++; /* an untied embedding: no matrix product reads it */
        if (!(R.fb->skip_name = strdup(stz_forward_tensor(m, emb)->name)))
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for a tensor's name");
    }
    if (st) {
        stz_feedback_free(R.fb);
        R.fb = NULL;
    }
    *out = R.fb;
    return st;
}
