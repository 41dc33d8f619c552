/* Error feedback (GPTQ, Frantar et al. 2022): the columns of a matrix are
 * quantized in order, and each rounding error is pushed onto the columns
 * not yet quantized, weighted by the inverse Hessian of the layer's inputs
 * (H = sum over tokens of x x^T), so that the layer's outputs X W^T move
 * as little as the format allows; the stored format does not change.
 *
 * With U the upper Cholesky factor of H^-1, quantizing column k of every
 * row to q gives e = (w_k - q) / U[k][k], and w_j -= e * U[k][j] for every
 * later column j. Blocks keep their parameters: when the sweep reaches a
 * block, its scale (and minimum, sub-block scales) is chosen for the
 * block's weights as they are then (stz's searches, weighted by diag(H)),
 * and the block's codes follow one by one within it; the errors of a whole
 * block then reach the later columns through one sgemm. Rows are
 * independent: they go in pieces of FB_ROWS to the threads, each piece the
 * same whatever the thread count, so the bytes do not depend on it.
 *
 * With D (asymmetric calibration, as GPTAQ, Li et al. 2025): the inputs
 * the quantized model gives the layer (Xq, whose Gram matrix is H) are not
 * the original model's (X), and what should be kept is the original
 * output X W^T. Its least-squares fit through Xq is W (X^T Xq) H^-1 =
 * W + W D H^-1 with D = (X - Xq)^T Xq; the rows are moved there (H^-1
 * dampened, as U^T U), FB_DRIFT of the way, before the sweep, whose
 * output error then measures from there.
 *
 * A trellis (trellis.c) codes a whole column of a segment of rows at once:
 * its pieces are the segments, and within a block the columns go in
 * order, each column's errors fed to the block's later columns; without U
 * the same sweep quantizes a trellis with no feedback. */
#include "quant_tensor.h"
#include "stz_kernels.h"
#include "ggml_types.h"
#include "core/stz_core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FB_ROWS  32    /* rows per piece of work */
#define FB_DAMP  0.01  /* of the mean diagonal, added to H's diagonal */
#define FB_DRIFT 0.75f /* of the move to the fit of the original outputs (D): the fit is measured, and noisy */

/* The mean of H's positive diagonal (1 when none is). */
static double mean_diag(const float *H, size_t n)
{
    double mean = 0;
    for (size_t j = 0; j < n; j++)
        mean += H[j * n + j] > 0 ? H[j * n + j] : 0;
    return mean > 0 ? mean / (double)n : 1;
}

/* H[j][j] dampened: a column no token reached takes the mean. */
static double damped_diag(const float *H, size_t n, size_t j, double mean, double damp)
{
    return (H[j * n + j] > 0 ? H[j * n + j] : mean) + damp * mean;
}

/* U (n x n, upper, row-major floats) with U^T U = (H + damp * mean(diag H) * I)^-1,
 * the columns no token reached (H[j][j] = 0) given the mean on the
 * diagonal. With J the reversal of the columns and J H J = L L^T, U is
 * J L^-1 J: one Cholesky factorization and one triangular inverse, in
 * double, with the same bits on every machine (core/matmul.c). The
 * damping grows tenfold while H stays not positive definite (at most 1). */
static stz_status factor(const float *H, size_t n, double damp, float *U, int threads, stz_err *err)
{
    double *A = malloc(n * n * sizeof *A + 1), *X = malloc(n * n * sizeof *X + 1), mean = mean_diag(H, n);
    int bad = A && X ? -1 : -2;
    for (; bad == -1 && damp <= 1; damp *= 10) {
        for (size_t i = 0; i < n; i++) /* J H J, damped: the lower triangle */
            for (size_t j = 0; j <= i; j++) {
                size_t a = n - 1 - i, b = n - 1 - j;
                A[i * n + j] = a == b ? damped_diag(H, n, a, mean, damp) : H[a * n + b];
            }
        bad = stz_cholesky(A, n, threads);
    }
    if (!bad)
        bad = stz_tri_inverse(A, X, n, threads);
    for (size_t i = 0; !bad && i < n; i++)
        for (size_t j = 0; j < n; j++)
            U[i * n + j] = j >= i ? (float)X[(n - 1 - i) * n + (n - 1 - j)] : 0.0f;
    free(A), free(X);
    if (bad == -2)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for a %zu x %zu Hessian", n, n);
    if (bad == -3)
        return stz_err_set(err, STZ_E_INTERRUPTED, "interrupted");
    return bad ? stz_err_set(err, STZ_E_LAPACK, "the Hessian of %zu columns is not positive definite even damped", n)
               : STZ_OK;
}

typedef struct {
    float *W, *E;         /* the piece's rows as they are updated; a block's fed errors (rows x G) */
    float *Z;             /* with D: the piece's move (rows x cols) */
    uint8_t *codes;       /* stz formats: the piece's codes, one per byte */
    stz_trellis_work *tw; /* trellis: Viterbi's buffers, and a column's values, scales, codes */
    float *col;
    uint8_t *ccol;
} fb_slot;

typedef struct {
    const stz_qformat *f;
    const float *x, *U, *w, *D;          /* U NULL: no feedback (a trellis) */
    size_t rows, cols, first, G, nb, rb; /* first: the number of row 0 in messages */
    size_t most;                         /* rows of the largest piece */
    uint8_t *q;                          /* the values, rows x rb */
    float *sc, *mn;                      /* stz formats: per row and block */
    double *loss;                        /* per piece: the output error, sum of the fed errors squared */
    fb_slot *slot;
} fb_job;

/* A row's partial last 32-block of a ggml type (qformat.c's ggml_row):
 * x[len] and its importance zero-padded, U's len x len corner with an
 * identity for the padding, so that the padding is coded but weighs and
 * feeds nothing. */
static int ggml_partial_feedback(int type, float *x, const float *w, size_t len, const float *U, size_t ldu,
                                 uint8_t *out, float *E)
{
    float px[STZ_GGML_QK] = {0}, pw[STZ_GGML_QK] = {0}, pU[STZ_GGML_QK * STZ_GGML_QK] = {0}, pE[STZ_GGML_QK];
    for (size_t a = 0; a < STZ_GGML_QK; a++) {
        pU[a * STZ_GGML_QK + a] = 1;
        for (size_t k = a; a < len && k < len; k++)
            pU[a * STZ_GGML_QK + k] = U[a * ldu + k];
    }
    for (size_t k = 0; k < len; k++)
        px[k] = x[k], pw[k] = w ? w[k] : 1.0f;
    if (stz_ggml_block_feedback(type, px, pw, pU, STZ_GGML_QK, out, pE))
        return -1;
    memcpy(x, px, len * sizeof *x), memcpy(E, pE, len * sizeof *E);
    return 0;
}

/* One block of row r (of the piece at row r0) quantized with feedback. */
static int fb_block(const fb_job *j, fb_slot *s, size_t r0, size_t r, size_t c0, size_t len)
{
    const float *U = j->U + c0 * j->cols + c0, *w = j->w + c0;
    float *x = s->W + r * j->cols + c0, *E = s->E + r * j->G;
    size_t b = c0 / j->G, row = r0 + r;
    uint8_t *out = j->q + row * j->rb + b * (j->f->ggml ? j->f->ggml->bytes : 0);
    if (j->f->ggml && len < j->G)
        return ggml_partial_feedback(j->f->ggml->type, x, w, len, U, j->cols, out, E);
    if (j->f->ggml)
        return stz_ggml_block_feedback(j->f->ggml->type, x, w, U, j->cols, out, E);
    return stz_qf_block_feedback(j->f, x, w, len, U, j->cols, s->codes + r * j->cols + c0, &j->sc[row * j->nb + b],
                                 j->mn ? &j->mn[row * j->nb + b] : NULL, E);
}

/* A trellis block: columns [c0, c0 + len) of the piece's nr rows (from
 * row r0), each row's scale from its values as they are, then column by
 * column, each column's errors fed to the block's later columns. */
static int tr_block(const fb_job *j, fb_slot *s, size_t r0, size_t nr, size_t c0, size_t len)
{
    size_t n = j->cols, b = c0 / j->G;
    float *xc = s->col, *sc = xc + j->most, *yc = sc + j->most;
    for (size_t r = 0; r < nr; r++)
        if (isnan(sc[r] = j->sc[(r0 + r) * j->nb + b] = stz_trellis_scale(j->f, s->W + r * n + c0, len)))
            return -1;
    for (size_t k = 0; k < len; k++) {
        for (size_t r = 0; r < nr; r++)
            xc[r] = s->W[r * n + c0 + k];
        stz_trellis_column(s->tw, j->f->bits, xc, sc, nr, s->ccol, yc);
        for (size_t r = 0; r < nr; r++) {
            s->codes[r * n + c0 + k] = s->ccol[r];
            s->E[r * j->G + k] =
                j->U ? stz_fb_step(s->W + r * n + c0, k, len, yc[r], j->U + c0 * n + c0, n) : xc[r] - yc[r];
        }
    }
    return 0;
}

/* Piece i's rows: FB_ROWS from i * FB_ROWS, or a trellis segment. */
static void piece_rows(const fb_job *j, size_t i, size_t *r0, size_t *nr)
{
    if (j->f->method == STZ_QMETHOD_TRELLIS) {
        uint64_t a, b;
        stz_trellis_segment(j->rows, (uint64_t)i * STZ_TRELLIS_ROWS, &a, &b);
        *r0 = (size_t)a, *nr = (size_t)(b - a);
    } else
        *r0 = i * FB_ROWS, *nr = j->rows - *r0 < FB_ROWS ? j->rows - *r0 : FB_ROWS;
}

static size_t piece_count(const stz_qformat *f, size_t rows)
{
    return f->method == STZ_QMETHOD_TRELLIS ? stz_trellis_segments(rows) : (rows + FB_ROWS - 1) / FB_ROWS;
}

/* The piece's nr rows W moved FB_DRIFT of the way to their fit of the
 * original outputs: W += FB_DRIFT ((W D) U^T) U. A fit made on a few
 * thousand positions over-corrects: on stories260K, 3/4 of the move gave
 * 0.93-0.94x the KL of the whole move (int2 nl, int3 nl, q4_0 in one
 * format; 0.85x tuned at 3.5 bits/weight; within 4% on iq4_nl, int4 nl,
 * int3 mse), half of it 0.95-1.01x. */
static void fb_move(const fb_job *j, fb_slot *s, size_t nr)
{
    size_t n = j->cols;
    float *Z = s->Z, *Z2 = s->Z + nr * n;
    stz_mm_nn(Z, n, s->W, n, 1, j->D, n, nr, n, n, 0, 1); /* Z (nr, n) = W (nr, n) @ D (n, n) */
    stz_mm_nt(Z2, n, Z, n, j->U, n, nr, n, n, 1);         /* Z2 = Z @ U^T */
    stz_mm_nn(Z, n, Z2, n, 1, j->U, n, nr, n, n, 0, 1);   /* Z = Z2 @ U */
    for (size_t k = 0; k < nr * n; k++)
        s->W[k] += FB_DRIFT * Z[k];
}

static stz_status fb_work(void *ctx, int tid, size_t i, stz_err *err)
{
    fb_job *j = ctx;
    fb_slot *s = &j->slot[tid];
    size_t r0, nr, n = j->cols;
    piece_rows(j, i, &r0, &nr);
    memcpy(s->W, j->x + r0 * n, nr * n * sizeof *s->W);
    if (j->D)
        fb_move(j, s, nr);
    for (size_t c0 = 0; c0 < n; c0 += j->G) {
        size_t len = n - c0 < j->G ? n - c0 : j->G, rest = n - c0 - len;
        if (s->tw && tr_block(j, s, r0, nr, c0, len))
            return stz_err_set(err, STZ_E_NUMERIC, "rows %zu-%zu: %s", j->first + r0, j->first + r0 + nr - 1,
                               stz_qtensor_overflow(j->f));
        for (size_t r = 0; r < nr; r++) {
            if (!s->tw && fb_block(j, s, r0, r, c0, len))
                return stz_err_set(err, STZ_E_NUMERIC, "row %zu: %s", j->first + r0 + r, stz_qtensor_overflow(j->f));
            for (size_t k = 0; k < len; k++)
                j->loss[i] += (double)s->E[r * j->G + k] * s->E[r * j->G + k];
        }
        if (rest && j->U) { /* the later columns: W[:, c0 + len:] += -E (nr x len) @ U[c0:c0 + len, c0 + len:] */
            for (size_t k = 0; k < nr * j->G; k++)
                s->E[k] = -s->E[k];
            stz_mm_nn(s->W + c0 + len, n, s->E, j->G, 1, j->U + c0 * n + c0 + len, n, nr, len, rest, 1, 1);
        }
    }
    for (size_t r = 0; !j->f->ggml && r < nr; r++)
        stz_qf_pack_codes(j->f->bits, s->codes + r * n, n, j->q + (r0 + r) * j->rb);
    return STZ_OK;
}

/* The pieces of rows on `threads` threads, each with its buffers. */
static stz_status fb_run(fb_job *j, int threads, stz_err *err)
{
    threads = threads < 1 ? 1 : threads;
    size_t pieces = piece_count(j->f, j->rows), m = j->most;
    int tr = j->f->method == STZ_QMETHOD_TRELLIS;
    stz_status st =
        (j->slot = calloc((size_t)threads, sizeof *j->slot)) && (j->loss = calloc(pieces + 1, sizeof *j->loss))
            ? STZ_OK
            : stz_err_set(err, STZ_E_NOMEM, "out of memory for the feedback threads");
    for (int t = 0; !st && t < threads; t++) {
        fb_slot *s = &j->slot[t];
        s->W = malloc(m * j->cols * sizeof *s->W), s->E = malloc(m * j->G * sizeof *s->E);
        s->codes = j->f->ggml ? NULL : malloc(m * j->cols);
        s->Z = j->D ? malloc(2 * m * j->cols * sizeof *s->Z) : NULL;
        if (tr)
            s->tw = stz_trellis_work_new(), s->col = malloc(3 * m * sizeof *s->col), s->ccol = malloc(m);
        if (!s->W || !s->E || (!j->f->ggml && !s->codes) || (j->D && !s->Z) || (tr && (!s->tw || !s->col || !s->ccol)))
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the rows in feedback");
    }
    if (!st) {
        stz_ordered pl = {.n = pieces, .threads = threads, .ctx = j, .work = fb_work};
        st = stz_ordered_run(&pl, err);
    }
    for (int t = 0; j->slot && t < threads; t++)
        free(j->slot[t].W), free(j->slot[t].E), free(j->slot[t].codes), free(j->slot[t].Z),
            stz_trellis_work_free(j->slot[t].tw), free(j->slot[t].col), free(j->slot[t].ccol);
    free(j->slot);
    return st;
}

/* The sum of n pieces' figures, in order (the same for any thread count). */
static double sum_pieces(const double *v, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += v[i];
    return s;
}

/* The job of a sweep over rows x cols values x in format f (U NULL: no
 * feedback), its codes into q, its blocks' scales (and minimums) into sc
 * (mn); rows numbered from `first` in its messages. */
static fb_job job_of(const stz_qformat *f, const float *x, const float *U, const float *w, const float *D, size_t rows,
                     size_t cols, size_t first, uint8_t *q, float *sc, float *mn)
{
    fb_job j = {.f = f,
                .x = x,
                .U = U,
                .w = w,
                .D = D,
                .rows = rows,
                .cols = cols,
                .first = first,
                .G = f->block,
                .nb = (size_t)stz_q_blocks(cols, f->block),
                .rb = stz_qf_bytes(f, cols),
                .q = q,
                .sc = sc,
                .mn = mn,
                .most = f->method == STZ_QMETHOD_TRELLIS ? 2 * STZ_TRELLIS_ROWS : FB_ROWS};
    j.most = j.most < rows ? j.most : rows;
    return j;
}

/* The sweep over rows x cols values x, their format begun by
 * stz_qtensor_begin (sc, mn), with U (NULL: no feedback), then the end. */
static stz_status sweep(const float *x, const float *U, const float *w, const float *D, size_t rows, size_t cols,
                        int threads, stz_qmem *out, float *sc, float *mn, float *y, stz_err *err)
{
    const stz_qformat *f = &out->fmt;
    fb_job j = job_of(f, x, U, w, D, rows, cols, 0, out->part[STZ_PART_VALUES], sc, mn);
    stz_status st = fb_run(&j, threads, err);
    out->err_out = st || !U ? 0 : sum_pieces(j.loss, piece_count(f, rows));
    free(j.loss);
    return st ? st : stz_qtensor_end(x, rows, cols, out, sc, mn, y, err);
}

stz_status stz_trellis_rows(const stz_qformat *f, const float *x, size_t rows, size_t cols, size_t first, int threads,
                            uint8_t *q, float *sc, stz_err *err)
{
    fb_job j = job_of(f, x, NULL, f->weights, NULL, rows, cols, first, q, sc, NULL);
    stz_status st = fb_run(&j, threads, err);
    free(j.loss);
    return st;
}

stz_status stz_trellis_tensor(const stz_decision *d, const float *x, const float *weights, uint64_t rows, uint64_t cols,
                              int threads, stz_qmem *out, float *y, stz_err *err)
{
    float *sc, *mn;
    stz_status st = stz_qtensor_begin(d, x, weights, rows, cols, out, &sc, &mn, err);
    if (!st)
        st = sweep(x, NULL, weights, NULL, (size_t)rows, (size_t)cols, threads, out, sc, mn, y, err);
    free(sc), free(mn);
    if (st)
        stz_qmem_free(out);
    return st;
}

stz_status stz_quantize_tensor_feedback(const stz_decision *d, const float *x, const float *H, const float *D,
                                        uint64_t rows, uint64_t cols, int threads, stz_qmem *out, float *y,
                                        stz_err *err)
{
    if (!stz_action_is_block(d->action, d->ggml_type))
        return stz_err_set(err, STZ_E_ARG, "error feedback needs a block quantization, not '%s'",
                           stz_action_name(d->action, d->ggml_type));
    memset(out, 0, sizeof *out); /* freed on every failure, also before stz_qtensor_begin fills it */
    float *w = malloc(cols * sizeof *w + 1), *U = malloc(cols * cols * sizeof *U + 1), *sc = NULL, *mn = NULL;
    stz_status st = w && U ? STZ_OK
                           : stz_err_set(err, STZ_E_NOMEM, "out of memory for a %llu x %llu Hessian",
                                         (unsigned long long)cols, (unsigned long long)cols);
    for (uint64_t k = 0; !st && k < cols; k++) /* the block searches weigh by the columns' importance */
        w[k] = H[k * cols + k] > 0 ? H[k * cols + k] : 0.0f;
    if (!st)
        st = stz_qtensor_begin(d, x, w, rows, cols, out, &sc, &mn, err);
    if (!st)
        st = factor(H, (size_t)cols, FB_DAMP, U, threads, err);
    if (!st)
        st = sweep(x, U, w, D, (size_t)rows, (size_t)cols, threads, out, sc, mn, y, err);
    out->fmt.weights = NULL; /* w is freed */
    free(w), free(U), free(sc), free(mn);
    if (st)
        stz_qmem_free(out);
    return st;
}

/* ---- the output error of any quantization -------------------------------------- */

typedef struct {
    const float *x, *y;
    float *H;     /* H made symmetric from its upper triangle */
    double *damp; /* per column: what dampening adds to H's diagonal */
    size_t rows, cols;
    float **E, **F; /* per thread: a piece's errors, and them times H */
    double *loss;
} oe_job;

/* A piece of rows: sum of e H e^T over its rows' errors e, dampened. */
static stz_status oe_work(void *ctx, int tid, size_t i, stz_err *err)
{
    (void)err;
    oe_job *j = ctx;
    size_t r0 = i * FB_ROWS, nr = j->rows - r0 < FB_ROWS ? j->rows - r0 : FB_ROWS, n = nr * j->cols;
    float *E = j->E[tid], *F = j->F[tid];
    for (size_t k = 0; k < n; k++)
        E[k] = j->x[r0 * j->cols + k] - j->y[r0 * j->cols + k];
    stz_mm_nt(F, j->cols, E, j->cols, j->H, j->cols, nr, j->cols, j->cols, 1); /* F (nr, n) = E @ H (H = H^T) */
    for (size_t k = 0; k < n; k++)
        j->loss[i] += (double)E[k] * F[k] + (double)E[k] * E[k] * j->damp[k % j->cols];
    return STZ_OK;
}

stz_status stz_quant_output_error(const float *x, const float *y, const float *H, uint64_t rows, uint64_t cols,
                                  int threads, double *out, stz_err *err)
{
    size_t n = (size_t)cols, pieces = ((size_t)rows + FB_ROWS - 1) / FB_ROWS;
    threads = threads < 1 ? 1 : threads;
    oe_job j = {.x = x, .y = y, .rows = (size_t)rows, .cols = n};
    j.damp = malloc(n * sizeof *j.damp + 1), j.H = malloc(n * n * sizeof *j.H + 1);
    j.E = calloc((size_t)threads, sizeof *j.E), j.F = calloc((size_t)threads, sizeof *j.F);
    j.loss = calloc(pieces + 1, sizeof *j.loss);
    stz_status st = j.damp && j.H && j.E && j.F && j.loss ? STZ_OK : STZ_E_NOMEM;
    for (int t = 0; !st && t < threads; t++)
        if (!(j.E[t] = malloc(FB_ROWS * n * sizeof *j.E[t])) || !(j.F[t] = malloc(FB_ROWS * n * sizeof *j.F[t])))
            st = STZ_E_NOMEM;
    if (st)
        st = stz_err_set(err, st, "out of memory for the output error of %zu columns", n);
    if (!st) {
        double mean = mean_diag(H, n);
        for (size_t k = 0; k < n; k++)
            j.damp[k] = damped_diag(H, n, k, mean, FB_DAMP) - H[k * n + k];
        for (size_t a = 0; a < n; a++)
            for (size_t b = a; b < n; b++)
                j.H[a * n + b] = j.H[b * n + a] = H[a * n + b];
        stz_ordered pl = {.n = pieces, .threads = threads, .ctx = &j, .work = oe_work};
        st = stz_ordered_run(&pl, err);
    }
    *out = st ? 0 : sum_pieces(j.loss, pieces);
    for (int t = 0; j.E && j.F && t < threads; t++)
        free(j.E[t]), free(j.F[t]);
    free(j.E), free(j.F), free(j.loss), free(j.damp), free(j.H);
    return st;
}
