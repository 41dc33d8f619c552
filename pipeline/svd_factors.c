/* SVD decisions in the quantizing writer: each matrix factored (and its
 * rank chosen, or the rule's fallback taken) before the header is written,
 * its INT8 factors declared, then written: held from planning while they
 * fit the caller's budget, else factored again when written (the same
 * bits, checked by a hash). */
#include "plan.h"
#include "stz_kernels.h"
#include "stz_eval.h"
#include "stz_svd.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <xxhash.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const factor_suffix[5] = {".U", ".U.scales", ".S", ".Vh", ".Vh.scales"};

/* Turns an svd decision into the rule's fallback action. */
static void use_fallback(stz_quant_plan *x, const char *why)
{
    x->svd = 0;
    x->d.action = x->d.fallback;
    x->d.reason = why;
    stz_quant_plan_format(x);
    x->nblocks = stz_q_blocks(x->cols, x->d.block_size);
}

/* Cosine of W (m x n) against the tensor rebuilt from x's INT8 factors,
 * as readers will see it. */
static stz_status svd_quality(const float *W, stz_quant_plan *x, stz_err *err)
{
    size_t m = (size_t)x->rows, n = (size_t)x->cols;
    float *Wr = malloc(m * n * sizeof *Wr + 1);
    stz_status st = Wr ? stz_svd_q8_rebuild(x->Uq, x->Us, x->Sq, x->s_scale, x->Vq, x->Vs, m, n, x->rank, Wr, err)
                       : stz_err_set(err, STZ_E_NOMEM, "out of memory for the rebuilt matrix");
    if (!st) {
        stz_metrics_acc acc;
        memset(&acc, 0, sizeof acc);
        stz_metrics_add(&acc, W, Wr, m * n);
        x->cosine = stz_metrics_finish(&acc).cosine;
    }
    free(Wr);
    return st;
}

/* Reads tensor t as F32 into *W (m x n, malloc'd) and factors it as x's
 * rule says into f. A NaN/Inf is an error, or (*bad set, st OK) for the
 * caller to keep the tensor. */
static stz_status factor(const stz_reader *r, const stz_tensor *t, const stz_quant_plan *x, float **W,
                         stz_svd_result *f, int *bad, stz_err *err)
{
    size_t m = (size_t)x->rows, n = (size_t)x->cols, esz = stz_dtype_bits(t->dtype) / 8;
    uint8_t *raw = malloc(m * n * esz + 1);
    *W = malloc(m * n * sizeof **W + 1), *bad = 0;
    stz_status st =
        raw && *W ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for '%s' (%zu x %zu)", t->name, m, n);
    if (!st && !(st = stz_reader_read(r, t, 0, raw, m * n * esz, err)))
        st = stz_to_f32(t->dtype, raw, m * n, *W, err);
    free(raw);
    size_t at = st ? m * n : stz_quant_first_nonfinite(*W, m * n);
    if (at < m * n) {
        if (x->d.nonfinite == STZ_NONFINITE_KEEP) {
            *bad = 1;
            return STZ_OK;
        }
        return stz_err_set(err, STZ_E_NUMERIC, "%s: tensor '%s': element %zu is %s; SVD needs finite values",
                           stz_reader_path(r), t->name, at, isnan((*W)[at]) ? "NaN" : "infinite");
    }
    if (st)
        return st;
    stz_svd_params sp = stz_svd_params_of(&x->d); /* one OpenBLAS thread: the same bytes at any -T */
    stz_err sub;
    if ((st = stz_svd_factor(*W, m, n, &sp, f, &sub)))
        st = stz_err_set(err, st, "%s: tensor '%s': %s", stz_reader_path(r), t->name, sub.msg);
    return st;
}

/* x's INT8 factors of f (rank x->rank), and their hash. */
static stz_status quantize_factors(const stz_tensor *t, stz_quant_plan *x, const stz_svd_result *f, stz_err *err)
{
    size_t m = (size_t)x->rows, n = (size_t)x->cols, rk = x->rank;
    x->Uq = malloc(m * rk), x->Us = malloc(m * sizeof(float)), x->Sq = malloc(rk);
    x->Vq = malloc(rk * n), x->Vs = malloc(rk * sizeof(float));
    if (!x->Uq || !x->Us || !x->Sq || !x->Vq || !x->Vs)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the factors of '%s'", t->name);
    stz_svd_q8(f, x->Uq, x->Us, x->Sq, &x->s_scale, x->Vq, x->Vs);
    XXH3_state_t *h = XXH3_createState();
    if (!h)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for a hash state");
    XXH3_64bits_reset(h);
    XXH3_64bits_update(h, x->Uq, m * rk), XXH3_64bits_update(h, x->Us, m * sizeof(float));
    XXH3_64bits_update(h, x->Sq, rk), XXH3_64bits_update(h, &x->s_scale, sizeof x->s_scale);
    XXH3_64bits_update(h, x->Vq, rk * n), XXH3_64bits_update(h, x->Vs, rk * sizeof(float));
    x->factors_hash = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return STZ_OK;
}

static void free_factors(stz_quant_plan *x)
{
    free(x->Uq), free(x->Us), free(x->Sq), free(x->Vq), free(x->Vs);
    x->Uq = x->Sq = x->Vq = NULL, x->Us = x->Vs = NULL;
}

/* Factors a tensor, picks the rank, and either quantizes the factors or
 * falls back when they would not be smaller than the fallback action. */
static stz_status svd_prepare(const stz_reader *r, const stz_tensor *t, stz_quant_plan *x, stz_err *err)
{
    size_t m = (size_t)x->rows, n = (size_t)x->cols, k = m < n ? m : n;
    stz_decision fb = x->d;
    fb.action = x->d.fallback;
    uint64_t fbytes = stz_quant_bytes(t, &fb);
    if (x->d.svd_rank && (x->d.svd_rank >= k || stz_svd_bytes(m, n, x->d.svd_rank) >= fbytes)) {
        use_fallback(x, "SVD factors at this rank would not be smaller: fallback");
        return STZ_OK;
    }
    float *W = NULL;
    stz_svd_result f = {0};
    int bad;
    stz_status st = factor(r, t, x, &W, &f, &bad, err);
    if (!st && bad)
        stz_quant_plan_keep_nonfinite(x);
    else if (!st && (f.rank >= k || stz_svd_bytes(m, n, f.rank) >= fbytes))
        use_fallback(x, "SVD factors at the chosen rank would not be smaller: fallback");
    else if (!st) {
        x->rank = f.rank, x->rel_error = f.rel_error;
        if (!(st = quantize_factors(t, x, &f, err)))
            st = svd_quality(W, x, err);
    }
    stz_svd_result_free(&f);
    free(W);
    if (st || !x->svd)
        return st;
    for (int j = 0; j < 5; j++) {
        size_t len = strlen(t->name) + 16;
        if (!(x->fname[j] = malloc(len)))
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for the factors' names");
        snprintf(x->fname[j], len, "%s%s", t->name, factor_suffix[j]);
        if (stz_reader_find(r, x->fname[j]) >= 0)
            return stz_err_set(err, STZ_E_DUPLICATE,
                               "%s: tensor '%s': its factor would be stored as '%s', which "
                               "already exists in the file",
                               stz_reader_path(r), t->name, x->fname[j]);
    }
    return STZ_OK;
}

/* The SVD decisions of a file, a tensor per thread. */
typedef struct {
    const stz_reader *r;
    stz_quant_plan *pl;
    size_t *idx; /* the tensors with SVD decisions */
    uint64_t held, budget;
} svd_job;

static stz_status svd_work(void *ctx, int tid, size_t i, stz_err *err)
{
    svd_job *j = ctx;
    (void)tid;
    return svd_prepare(j->r, stz_reader_tensor(j->r, j->idx[i]), &j->pl[j->idx[i]], err);
}

/* In the work's order (largest first, a fixed order): the factors that
 * fit the budget are held, the others made again when written
 * (stz_quant_write_svd). */
static stz_status svd_commit(void *ctx, int tid, size_t i, stz_err *err)
{
    svd_job *j = ctx;
    stz_quant_plan *x = &j->pl[j->idx[i]];
    uint64_t bytes = stz_svd_bytes(x->rows, x->cols, x->rank);
    (void)tid, (void)err;
    if (x->svd && j->held + bytes <= j->budget)
        j->held += bytes;
    else if (x->svd)
        free_factors(x);
    return STZ_OK;
}

stz_status stz_quant_plan_svd(const stz_quant_params *p, const stz_reader *r, stz_quant_plan *pl, size_t nt,
                              stz_err *err)
{
    svd_job j = {.r = r, .pl = pl, .budget = p->svd_hold_bytes ? p->svd_hold_bytes : STZ_SVD_HOLD_DEFAULT};
    size_t n = 0;
    uint64_t largest = 0;
    for (size_t i = 0; i < nt; i++)
        if (pl[i].svd)
            n++, largest = pl[i].rows * pl[i].cols > largest ? pl[i].rows * pl[i].cols : largest;
    if (!n)
        return STZ_OK;
    if (!(j.idx = malloc(n * sizeof *j.idx)))
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the SVD work list");
    for (size_t i = 0, k = 0; i < nt; i++)
        if (pl[i].svd)
            j.idx[k++] = i;
    for (size_t a = 1; a < n; a++) /* largest first (stable), so that the large ones run side by side */
        for (size_t b = a;
             b > 0 && pl[j.idx[b]].rows * pl[j.idx[b]].cols > pl[j.idx[b - 1]].rows * pl[j.idx[b - 1]].cols; b--) {
            size_t tmp = j.idx[b];
            j.idx[b] = j.idx[b - 1], j.idx[b - 1] = tmp;
        }
    /* a factorisation holds about 6 copies of its matrix (F32): as many at
     * once as -T allows within STZ_SVD_WORK_BYTES, at least one */
    uint64_t fit = STZ_SVD_WORK_BYTES / (24 * largest + 1);
    int threads = fit < (uint64_t)p->threads ? (int)(fit ? fit : 1) : p->threads;
    stz_blas_threads(1); /* before the threads start: each factorisation sets it again */
    stz_ordered run = {.n = n, .threads = threads, .ctx = &j, .work = svd_work, .commit = svd_commit};
    stz_status st = stz_ordered_run(&run, err);
    free(j.idx);
    return st;
}

stz_status stz_quant_declare_svd(stz_writer *w, const stz_tensor *t, const stz_quant_plan *x, stz_err *err)
{
    uint64_t m = x->rows, n = x->cols, rk = x->rank;
    uint64_t shp[5][2] = {{m, rk}, {m, 0}, {rk, 0}, {rk, n}, {rk, 0}};
    stz_dtype dt[5] = {STZ_DTYPE_I8, STZ_DTYPE_F32, STZ_DTYPE_I8, STZ_DTYPE_I8, STZ_DTYPE_F32};
    stz_status st = STZ_OK;
    for (int j = 0; j < 5 && !st; j++)
        st = stz_writer_add(w, x->fname[j], dt[j], shp[j][1] ? 2 : 1, shp[j], err);
    if (st)
        return st;
    stz_json_begin();
    cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "method", "svd");
    cJSON_AddStringToObject(o, "svd_method", x->d.svd_randomized ? "randomized" : "exact");
    if (x->d.svd_randomized) {
        cJSON_AddNumberToObject(o, "power_iters", x->d.svd_power_iters);
        cJSON_AddNumberToObject(o, "oversample", x->d.svd_oversample);
    }
    cJSON_AddNumberToObject(o, "bits", 8);
    cJSON_AddNumberToObject(o, "rank", (double)rk);
    cJSON_AddStringToObject(o, "dtype", stz_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++)
        stz_json_put(sh, NULL, cJSON_CreateNumber((double)t->shape[d]));
    stz_json_put(o, "shape", sh);
    cJSON_AddStringToObject(o, "U", x->fname[0]);
    cJSON_AddStringToObject(o, "U_scales", x->fname[1]);
    cJSON_AddStringToObject(o, "S", x->fname[2]);
    cJSON_AddNumberToObject(o, "S_scale", x->s_scale);
    cJSON_AddStringToObject(o, "Vh", x->fname[3]);
    cJSON_AddStringToObject(o, "Vh_scales", x->fname[4]);
    cJSON_AddStringToObject(o, "scale_dtype", "F32");
    cJSON_AddNumberToObject(o, "rel_error", x->rel_error);
    return stz_quant_put_meta(w, t, o, "SVD", err);
}

/* Writes n floats as little-endian F32 through buf (STZ_QUANT_BATCH_BYTES). */
static stz_status write_f32(stz_writer *w, const float *v, size_t n, uint8_t *buf, stz_err *err)
{
    for (size_t i = 0; i < n; i += STZ_QUANT_BATCH_BYTES / 4) {
        size_t k = n - i < STZ_QUANT_BATCH_BYTES / 4 ? n - i : STZ_QUANT_BATCH_BYTES / 4;
        stz_status st = stz_from_f32(STZ_DTYPE_F32, v + i, k, buf, err);
        if (st || (st = stz_writer_write(w, buf, k * 4, err)))
            return st;
    }
    return STZ_OK;
}

stz_status stz_quant_write_svd(const stz_reader *r, const stz_tensor *t, stz_writer *w, stz_quant_plan *x, uint8_t *buf,
                               stz_err *err)
{
    size_t m = (size_t)x->rows, n = (size_t)x->cols, rk = x->rank;
    stz_status st = STZ_OK;
    if (!x->Uq) { /* not held: the same factorisation again (one OpenBLAS thread: the same bits) */
        float *W = NULL;
        stz_svd_result f = {0};
        uint64_t planned = x->factors_hash;
        int bad;
        if (!(st = factor(r, t, x, &W, &f, &bad, err)) && (bad || f.rank != rk))
            st = stz_err_set(err, STZ_E_CHECKSUM, "%s: tensor '%s': factored again, it %s", stz_reader_path(r), t->name,
                             bad ? "holds NaN/Inf (the file changed?)" : "has another rank");
        if (!st && !(st = quantize_factors(t, x, &f, err)) && x->factors_hash != planned)
            st = stz_err_set(err, STZ_E_CHECKSUM,
                             "%s: tensor '%s': factored again, it gave other bits (the file "
                             "changed, or BLAS is not reproducible here)",
                             stz_reader_path(r), t->name);
        stz_svd_result_free(&f);
        free(W);
    }
    if (!st)
        st = stz_writer_write(w, x->Uq, m * rk, err);
    if (!st)
        st = write_f32(w, x->Us, m, buf, err);
    if (!st)
        st = stz_writer_write(w, x->Sq, rk, err);
    if (!st)
        st = stz_writer_write(w, x->Vq, rk * n, err);
    if (!st)
        st = write_f32(w, x->Vs, rk, buf, err);
    free_factors(x); /* written: no longer needed */
    return st;
}
