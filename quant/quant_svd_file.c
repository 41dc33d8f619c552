/* SVD decisions in the quantizing writer: each matrix factored (and its
 * rank chosen, or the rule's fallback taken) before the header is written,
 * its INT8 factors declared, then written. */
#include "quant_plan.h"
#include "stz_eval.h"
#include "stz_svd.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const factor_suffix[5] = {".U", ".U.scales", ".S", ".Vh", ".Vh.scales"};

/* Turns an svd decision into the rule's fallback action. */
static void use_fallback(plan_t *x, const char *why)
{
    x->svd = 0;
    x->d.action = x->d.fallback;
    x->d.reason = why;
    stz_qw_plan_format(x);
    x->nblocks = stz_q_blocks(x->cols, x->d.block_size);
}

/* Cosine of W (m x n) against the tensor rebuilt from x's INT8 factors,
 * as readers will see it. */
static stz_status svd_quality(const float *W, plan_t *x, stz_err *err)
{
    size_t m = (size_t)x->rows, n = (size_t)x->cols;
    float *Wr = malloc(m * n * sizeof *Wr + 1);
    stz_status st = Wr ? stz_svd_q8_rebuild(x->Uq, x->Us, x->Sq, x->s_scale, x->Vq, x->Vs, m, n, x->rank, Wr, err)
                       : stz_err_set(err, STZ_E_NOMEM, "out of memory");
    if (!st) {
        stz_metrics_acc acc;
        memset(&acc, 0, sizeof acc);
        stz_metrics_add(&acc, W, Wr, m * n);
        x->cosine = stz_metrics_finish(&acc).cosine;
    }
    free(Wr);
    return st;
}

/* Factors a tensor, picks the rank, and either quantizes the factors or
 * falls back when they would not be smaller than the fallback action. */
stz_status stz_qw_svd_prepare(const stz_quant_params *p, const stz_reader *r, const stz_tensor *t, plan_t *x,
                              stz_err *err)
{
    size_t m = (size_t)x->rows, n = (size_t)x->cols, k = m < n ? m : n, esz = stz_dtype_bits(t->dtype) / 8;
    stz_decision fb = x->d;
    fb.action = x->d.fallback;
    uint64_t fbytes = stz_quant_bytes(t, &fb);
    if (x->d.svd_rank && (x->d.svd_rank >= k || stz_svd_bytes(m, n, x->d.svd_rank) >= fbytes)) {
        use_fallback(x, "SVD factors at this rank would not be smaller: fallback");
        return STZ_OK;
    }
    uint8_t *raw = malloc(m * n * esz + 1);
    float *W = malloc(m * n * sizeof *W + 1);
    stz_svd_result f = {0};
    stz_status st = raw && W ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for '%s' (%zu x %zu)", t->name, m, n);
    if (!st && !(st = stz_reader_read(r, t, 0, raw, m * n * esz, err)))
        st = stz_to_f32(t->dtype, raw, m * n, W, err);
    free(raw);
    size_t bad = st ? m * n : stz_qw_first_nonfinite(W, m * n);
    if (bad < m * n) {
        if (x->d.nonfinite == STZ_NONFINITE_KEEP) {
            x->svd = 0, x->bits = 0, x->d.action = STZ_ACTION_KEEP, x->d.reason = "holds NaN/Inf (kept by the policy)";
            goto done;
        }
        st = stz_err_set(err, STZ_E_NUMERIC, "%s: tensor '%s': element %zu is %s; SVD needs finite values",
                         stz_reader_path(r), t->name, bad, isnan(W[bad]) ? "NaN" : "infinite");
    }
    stz_svd_params sp = STZ_SVD_PARAMS_DEFAULT;
    sp.method = x->d.svd_randomized ? STZ_SVD_RANDOMIZED : STZ_SVD_EXACT;
    sp.rank = x->d.svd_rank, sp.energy = x->d.svd_energy, sp.max_error = x->d.svd_max_error;
    sp.power_iters = (int)x->d.svd_power_iters, sp.oversample = x->d.svd_oversample;
    sp.threads = p->threads;
    stz_err sub;
    if (!st && (st = stz_svd_factor(W, m, n, &sp, &f, &sub)))
        st = stz_err_set(err, st, "%s: tensor '%s': %s", stz_reader_path(r), t->name, sub.msg);
    if (st)
        goto done;
    if (f.rank >= k || stz_svd_bytes(m, n, f.rank) >= fbytes) {
        use_fallback(x, "SVD factors at the chosen rank would not be smaller: fallback");
        goto done;
    }
    size_t rk = f.rank;
    x->rank = rk, x->rel_error = f.rel_error;
    x->Uq = malloc(m * rk), x->Us = malloc(m * sizeof(float)), x->Sq = malloc(rk);
    x->Vq = malloc(rk * n), x->Vs = malloc(rk * sizeof(float));
    if (!x->Uq || !x->Us || !x->Sq || !x->Vq || !x->Vs) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the factors of '%s'", t->name);
        goto done;
    }
    stz_svd_q8(&f, x->Uq, x->Us, x->Sq, &x->s_scale, x->Vq, x->Vs);
    st = svd_quality(W, x, err);
done:
    stz_svd_result_free(&f);
    free(W);
    if (st || !x->svd)
        return st;
    for (int j = 0; j < 5; j++) {
        size_t len = strlen(t->name) + 16;
        if (!(x->fname[j] = malloc(len)))
            return stz_err_set(err, STZ_E_NOMEM, "out of memory");
        snprintf(x->fname[j], len, "%s%s", t->name, factor_suffix[j]);
        if (stz_reader_find(r, x->fname[j]) >= 0)
            return stz_err_set(err, STZ_E_DUPLICATE, "%s: tensor '%s': its factor would be stored as '%s', which "
                               "already exists in the file", stz_reader_path(r), t->name, x->fname[j]);
    }
    return STZ_OK;
}

stz_status stz_qw_declare_svd(stz_writer *w, const stz_tensor *t, const plan_t *x, stz_err *err)
{
    uint64_t m = x->rows, n = x->cols, rk = x->rank;
    uint64_t shp[5][2] = {{m, rk}, {m, 0}, {rk, 0}, {rk, n}, {rk, 0}};
    stz_dtype dt[5] = {STZ_DTYPE_I8, STZ_DTYPE_F32, STZ_DTYPE_I8, STZ_DTYPE_I8, STZ_DTYPE_F32};
    stz_status st = STZ_OK;
    for (int j = 0; j < 5 && !st; j++)
        st = stz_writer_add(w, x->fname[j], dt[j], shp[j][1] ? 2 : 1, shp[j], err);
    if (st)
        return st;
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
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
    cJSON_AddItemToObject(o, "shape", sh);
    cJSON_AddStringToObject(o, "U", x->fname[0]);
    cJSON_AddStringToObject(o, "U_scales", x->fname[1]);
    cJSON_AddStringToObject(o, "S", x->fname[2]);
    cJSON_AddNumberToObject(o, "S_scale", x->s_scale);
    cJSON_AddStringToObject(o, "Vh", x->fname[3]);
    cJSON_AddStringToObject(o, "Vh_scales", x->fname[4]);
    cJSON_AddStringToObject(o, "scale_dtype", "F32");
    cJSON_AddNumberToObject(o, "rel_error", x->rel_error);
    char *js = cJSON_PrintUnformatted(o), key[1024];
    cJSON_Delete(o);
    if (!js)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    snprintf(key, sizeof key, "%s%s", STZ_QUANT_META_PREFIX, t->name);
    st = stz_writer_set_meta(w, key, js, err);
    free(js);
    return st;
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

stz_status stz_qw_write_svd(stz_writer *w, const plan_t *x, uint8_t *buf, stz_err *err)
{
    size_t m = (size_t)x->rows, n = (size_t)x->cols, rk = x->rank;
    stz_status st = stz_writer_write(w, x->Uq, m * rk, err);
    if (!st)
        st = write_f32(w, x->Us, m, buf, err);
    if (!st)
        st = stz_writer_write(w, x->Sq, rk, err);
    if (!st)
        st = stz_writer_write(w, x->Vq, rk * n, err);
    if (!st)
        st = write_f32(w, x->Vs, rk, buf, err);
    return st;
}
