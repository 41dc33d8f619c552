/* Quantize / dequantize whole SafeTensors files, streaming row batches.
 *
 * Per quantized tensor NAME the output holds:
 *   NAME          I8 of the original shape (INT8), or U8 with the last
 *                 dimension ceil(n/2) (INT4, two values per byte, first high)
 *   NAME.scales   F16/F32 of the original shape with the last dimension
 *                 replaced by the block count (omitted for a single block)
 * and __metadata__["stz.quant.NAME"] = JSON {"method", "bits", "block_size",
 * "dtype", "shape", "scales" | "scale", "scale_dtype", "packing"}.
 * docs/FORMAT.md, "Quantized SafeTensors", is the reference. */
#include "stz_internal.h"
#include "stz_pack.h"
#include "stz_quant.h"
#include "stz_safetensors.h"
#include "stz_eval.h"
#include "stz_svd.h"
#include "quant_tensor.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define META_PREFIX "stz.quant."
#define QUANT_VERSION "1"
#define INT4_PACKING "int4-pairs-high-nibble-first"
#define BATCH_BYTES (4u << 20) /* input bytes converted at a time */

typedef struct {
    stz_decision d;
    int bits;            /* 0 kept, 8, 4 */
    uint64_t rows, cols; /* cols = last dimension (whole tensor for 1-D) */
    uint64_t nblocks;    /* per row */
    char *scales_name;   /* NULL: single scale, in metadata */
    char *mins_name;     /* asym: NAME.mins (NULL: single block) */
    float scalar, scalar_min; /* the single scale (and minimum) */
    stz_qformat fmt;     /* bits, method, block, scales (and base, levels) */
    int legacy;          /* 8 or 4 bits, absmax or mse, F16/F32 scales: the first kernels, byte for byte */
    /* svd: INT8 factors, made before the header is written */
    int svd;
    size_t rank;
    double rel_error;          /* of the factorisation, before quantization */
    int8_t *Uq, *Sq, *Vq;      /* m x r, r, r x n */
    float *Us, *Vs, s_scale;   /* per-row scales of U and Vh; S's one scale */
    char *fname[5];            /* NAME.U, .U.scales, .S, .Vh, .Vh.scales */
    double cosine;             /* of the dequantized tensor, measured while quantizing */
} plan_t;

static const char *const factor_suffix[5] = {".U", ".U.scales", ".S", ".Vh", ".Vh.scales"};


uint64_t stz_quant_bytes(const stz_tensor *t, const stz_decision *d)
{
    if (d->action == STZ_ACTION_SVD) {
        stz_decision fb = *d;
        fb.action = d->fallback;
        uint64_t fbb = stz_quant_bytes(t, &fb), n = t->shape[t->ndim - 1], m = t->numel / n;
        if (!d->svd_rank) /* rank comes from the spectrum: at most the fallback's bytes */
            return fbb;
        uint64_t sb = stz_svd_bytes(m, n, d->svd_rank);
        return d->svd_rank < (m < n ? m : n) && sb < fbb ? sb : fbb;
    }
    int bits = stz_action_bits(d->action);
    if (!bits)
        return t->end - t->begin;
    uint64_t cols = t->ndim >= 2 ? t->shape[t->ndim - 1] : t->numel, rows = cols ? t->numel / cols : 0;
    uint64_t blocks = rows * stz_q_blocks(cols, d->block_size), per = stz_dtype_bits(d->scale_dtype) / 8;
    per *= d->method == STZ_QMETHOD_ASYM ? 2 : 1; /* scale and minimum */
    return rows * stz_qf_row_bytes(bits, cols) + (blocks > 1 ? blocks * per : 0);
}

static void row_shape(const stz_tensor *t, uint64_t *rows, uint64_t *cols)
{
    *cols = t->ndim ? t->shape[t->ndim - 1] : 1;
    *rows = *cols ? t->numel / *cols : 0;
}

/* Index of the first NaN/Inf in x[0..n), or n. */
static size_t first_nonfinite(const float *x, size_t n)
{
    size_t i = 0;
    while (i < n && isfinite(x[i]))
        i++;
    return i;
}

/* Finds the first NaN/Inf; returns its element index or -1. Reads the
 * tensor in batches. */
static stz_status find_nonfinite(const stz_reader *r, const stz_tensor *t, uint8_t *buf, float *f, int64_t *at,
                                 stz_err *err)
{
    size_t esz = stz_dtype_bits(t->dtype) / 8, per = BATCH_BYTES / esz;
    *at = -1;
    for (uint64_t e = 0; e < t->numel && *at < 0; e += per) {
        size_t n = t->numel - e < per ? (size_t)(t->numel - e) : per;
        stz_status st = stz_reader_read(r, t, e * esz, buf, n * esz, err);
        if (st || (st = stz_to_f32(t->dtype, buf, n, f, err)))
            return st;
        size_t k = first_nonfinite(f, n);
        if (k < n)
            *at = (int64_t)(e + k);
    }
    return STZ_OK;
}

/* A file stz already quantized holds INT8/INT4 codes and scales tensors:
 * quantizing those again would give a file that no longer reads back. */
static stz_status refuse_quantized(const stz_reader *r, stz_err *err)
{
    for (size_t i = 0; i < stz_reader_meta_count(r); i++)
        if (!strncmp(stz_reader_meta_key(r, i), META_PREFIX, strlen(META_PREFIX)))
            return stz_err_set(err, STZ_E_UNSUPPORTED,
                               "%s: already quantized by stz (metadata '%s'); quantizing it again would quantize "
                               "its codes and scales. Quantize the original model, or dequantize this one first "
                               "(stz dequantize)", stz_reader_path(r), stz_reader_meta_key(r, i));
    return STZ_OK;
}

static int quant_row(const plan_t *pl, const float *x, uint8_t *q, float *scales, float *mins)
{
    return stz_qf_quantize_any(&pl->fmt, pl->legacy, x, pl->cols, q, scales, mins);
}

/* The stored form of a quantized tensor's values: I8 for the symmetric
 * uniform 8-bit methods, else U8 bit strings. */
static stz_dtype values_dtype(int bits, stz_qmethod m)
{
    return bits == 8 && (m == STZ_QMETHOD_ABSMAX || m == STZ_QMETHOD_MSE || m == STZ_QMETHOD_FULL) ? STZ_DTYPE_I8
                                                                                                  : STZ_DTYPE_U8;
}

#define MSB_PACKING "bits-high-first"

static stz_status meta_for(stz_writer *w, const stz_tensor *t, const plan_t *pl, stz_err *err)
{
    cJSON *o = cJSON_CreateObject(), *sh = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "method", pl->d.method == STZ_QMETHOD_NL_FIT ? "nl" : stz_qmethod_name(pl->d.method));
    cJSON_AddNumberToObject(o, "bits", pl->bits);
    cJSON_AddNumberToObject(o, "block_size", pl->d.block_size);
    cJSON_AddStringToObject(o, "dtype", stz_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++)
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
    cJSON_AddItemToObject(o, "shape", sh);
    if (pl->scales_name)
        cJSON_AddStringToObject(o, "scales", pl->scales_name);
    else
        cJSON_AddNumberToObject(o, "scale", pl->scalar);
    cJSON_AddStringToObject(o, "scale_dtype", stz_dtype_name(pl->d.scale_dtype));
    if (pl->d.scale_dtype == STZ_DTYPE_U8)
        cJSON_AddNumberToObject(o, "scale_base", pl->fmt.scale_base);
    if (pl->d.method == STZ_QMETHOD_ASYM) {
        if (pl->mins_name)
            cJSON_AddStringToObject(o, "mins", pl->mins_name);
        else
            cJSON_AddNumberToObject(o, "min", pl->scalar_min);
    }
    if (pl->d.method == STZ_QMETHOD_NL_FIT) {
        cJSON *lv = cJSON_CreateArray();
        for (int k = 0; k < 1 << pl->bits; k++)
            cJSON_AddItemToArray(lv, cJSON_CreateNumber(lrintf(pl->fmt.levels[k] * 32767.0f)));
        cJSON_AddItemToObject(o, "levels", lv);
    }
    if (pl->bits == 4)
        cJSON_AddStringToObject(o, "packing", INT4_PACKING);
    else if (pl->bits != 8)
        cJSON_AddStringToObject(o, "packing", MSB_PACKING);
    char *s = cJSON_PrintUnformatted(o), key[1024];
    cJSON_Delete(o);
    if (!s)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    snprintf(key, sizeof key, "%s%s", META_PREFIX, t->name);
    stz_status st = stz_writer_set_meta(w, key, s, err);
    free(s);
    return st;
}

/* Buffers of one quantizing thread, and the row batch it holds. */
typedef struct {
    uint8_t *in, *q; /* raw input; quantized rows */
    float *f, *y;    /* input as F32; one row dequantized */
    size_t rows;     /* rows in the batch held */
    stz_metrics_acc acc;
} qslot;

/* One tensor quantized by the ordered pipeline: batches of rows are read,
 * quantized and measured in parallel, written and their metrics merged in
 * order, so the output and the figures do not depend on the thread count. */
typedef struct {
    stz_pipeline pl;
    stz_writer *w;
    const stz_reader *r;
    const stz_tensor *t;
    const plan_t *x;
    qslot *slot;
    float *sc;    /* rows x nblocks scales */
    float *mn;    /* asym: rows x nblocks minimums */
    uint64_t per; /* rows per batch */
    stz_metrics_acc acc;
} qjob;

static stz_status q_work(void *ctx, int tid, size_t i, stz_err *err)
{
    qjob *j = ctx;
    qslot *s = &j->slot[tid];
    const plan_t *pl = j->x;
    const stz_tensor *t = j->t;
    size_t esz = stz_dtype_bits(t->dtype) / 8, rb = stz_qf_row_bytes(pl->bits, pl->cols);
    uint64_t row = i * j->per;
    size_t nr = pl->rows - row < j->per ? (size_t)(pl->rows - row) : (size_t)j->per, n = nr * (size_t)pl->cols;
    stz_status st;
    s->rows = nr;
    memset(&s->acc, 0, sizeof s->acc);
    if ((st = stz_reader_read(j->r, t, row * pl->cols * esz, s->in, n * esz, err)) ||
        (st = stz_to_f32(t->dtype, s->in, n, s->f, err)))
        return st;
    size_t bad = first_nonfinite(s->f, n);
    if (bad < n)
        return stz_err_set(err, STZ_E_NUMERIC,
                           "%s: tensor '%s': element %llu is %s; quantization needs finite values "
                           "(or \"nonfinite\": \"keep\" in the policy rule)",
                           stz_reader_path(j->r), t->name, (unsigned long long)(row * pl->cols + bad),
                           isnan(s->f[bad]) ? "NaN" : "infinite");
    for (size_t k = 0; k < nr; k++) {
        const float *x = s->f + k * pl->cols;
        float *s_row = j->sc + (row + k) * pl->nblocks, *m_row = j->mn ? j->mn + (row + k) * pl->nblocks : NULL;
        if (quant_row(pl, x, s->q + k * rb, s_row, m_row))
            return stz_err_set(err, STZ_E_NUMERIC, "%s: tensor '%s': a block scale exceeds the F16 range; "
                               "use \"scale_dtype\": \"F32\"", stz_reader_path(j->r), t->name);
        /* the quality as the reader will see it: stored scales, dequantized */
        stz_qf_dequantize_row(&pl->fmt, s->q + k * rb, s_row, m_row, pl->cols, s->y);
        stz_metrics_add(&s->acc, x, s->y, pl->cols); /* scales are exact in their stored dtype */
    }
    return STZ_OK;
}

static stz_status q_commit(void *ctx, int tid, size_t i, stz_err *err)
{
    qjob *j = ctx;
    qslot *s = &j->slot[tid];
    (void)i;
    stz_metrics_merge(&j->acc, &s->acc);
    return stz_writer_write(j->w, s->q, s->rows * stz_qf_row_bytes(j->x->bits, j->x->cols), err);
}

/* Streams one quantized tensor: values row batch by row batch on
 * `threads` threads, then its scales (held for the tensor: rows x blocks
 * floats). */
/* Writes n per-block floats as the scale dtype (U8: log codes under the base). */
static stz_status write_blockwise(stz_writer *w, const plan_t *pl, const float *v, size_t n, uint8_t *buf, stz_err *err)
{
    stz_dtype dt = pl->d.scale_dtype;
    size_t sz = stz_dtype_bits(dt) / 8;
    stz_status st = STZ_OK;
    for (size_t i = 0; !st && i < n; i += BATCH_BYTES / 4) {
        size_t k = n - i < BATCH_BYTES / 4 ? n - i : BATCH_BYTES / 4;
        stz_qf_store_scales(&pl->fmt, v + i, k, buf);
        st = stz_writer_write(w, buf, k * sz, err);
    }
    return st;
}

/* Streams one quantized tensor: values row batch by row batch on
 * `threads` threads, then its scales (and minimums), held for the tensor:
 * rows x blocks floats. */
static stz_status write_quantized(stz_writer *w, const stz_reader *r, const stz_tensor *t, plan_t *pl, qslot *slot,
                                  int threads, stz_err *err)
{
    size_t esz = stz_dtype_bits(t->dtype) / 8;
    uint64_t per = BATCH_BYTES / esz / pl->cols;
    if (per == 0)
        per = 1; /* one row larger than a batch: the caller sized buffers for it */
    size_t nsc = (size_t)(pl->rows * pl->nblocks);
    int asym = pl->d.method == STZ_QMETHOD_ASYM;
    qjob j = {.w = w, .r = r, .t = t, .x = pl, .slot = slot, .per = per, .sc = malloc(nsc * sizeof(float) + 1),
              .mn = asym ? malloc(nsc * sizeof(float) + 1) : NULL};
    if (!j.sc || (asym && !j.mn)) {
        free(j.sc), free(j.mn);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for %zu scales of '%s'", nsc, t->name);
    }
    j.pl = (stz_pipeline){.n = (size_t)((pl->rows + per - 1) / per), .threads = threads, .ctx = &j,
                          .work = q_work, .commit = q_commit};
    stz_status st = stz_pipeline_run(&j.pl, err);
    if (!st && pl->scales_name)
        st = write_blockwise(w, pl, j.sc, nsc, slot[0].in, err);
    if (!st && pl->mins_name)
        st = write_blockwise(w, pl, j.mn, nsc, slot[0].in, err);
    pl->cosine = stz_metrics_finish(&j.acc).cosine;
    free(j.sc), free(j.mn);
    return st;
}

static stz_status copy_tensor(stz_writer *w, const stz_reader *r, const stz_tensor *t, uint8_t *buf, stz_err *err)
{
    for (uint64_t off = 0; off < t->end - t->begin; off += BATCH_BYTES) {
        size_t n = t->end - t->begin - off < BATCH_BYTES ? (size_t)(t->end - t->begin - off) : BATCH_BYTES;
        stz_status st = stz_reader_read(r, t, off, buf, n, err);
        if (st || (st = stz_writer_write(w, buf, n, err)))
            return st;
    }
    return STZ_OK;
}

/* The kernel format of x's decision: bits, method, block, scale storage. */
static void plan_format(plan_t *x)
{
    x->bits = x->d.action == STZ_ACTION_SVD ? 8 : stz_action_bits(x->d.action); /* svd: INT8 factors */
    x->legacy = stz_qf_of_decision(&x->d, &x->fmt);
}

/* What the format needs from the whole tensor before any row is
 * quantized: U8 scales, its largest magnitude (the base); nl-fit, a
 * codebook fitted to up to 256 rows spread over it. */
static stz_status plan_prepare(const stz_reader *r, const stz_tensor *t, plan_t *x, uint8_t *buf, float *f,
                               stz_err *err)
{
    int fit = x->d.method == STZ_QMETHOD_NL_FIT;
    if (x->legacy || (x->d.scale_dtype != STZ_DTYPE_U8 && !fit))
        return STZ_OK;
    size_t esz = stz_dtype_bits(t->dtype) / 8, per = BATCH_BYTES / esz;
    float amax = 0;
    stz_status st = STZ_OK;
    for (uint64_t e = 0; !st && e < t->numel; e += per) {
        size_t n = t->numel - e < per ? (size_t)(t->numel - e) : per;
        if (!(st = stz_reader_read(r, t, e * esz, buf, n * esz, err)) && !(st = stz_to_f32(t->dtype, buf, n, f, err)))
            for (size_t i = 0; i < n; i++)
                amax = fabsf(f[i]) > amax ? fabsf(f[i]) : amax; /* NaN is reported by the main pass */
    }
    x->fmt.scale_base = amax > 0 && isfinite(amax) ? amax : 1.0f;
    if (st || !fit)
        return st;
    size_t cols = stz_qf_fit_cols(x->cols), nr = stz_qf_fit_rows(x->rows);
    float *smp = malloc(nr * cols * sizeof *smp + 1);
    if (!smp)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    for (size_t k = 0; !st && k < nr; k++) {
        uint64_t row = k * (x->rows / nr);
        if (!(st = stz_reader_read(r, t, row * x->cols * esz, buf, cols * esz, err)))
            st = stz_to_f32(t->dtype, buf, cols, smp + k * cols, err);
    }
    if (!st && first_nonfinite(smp, nr * cols) == nr * cols)
        stz_qf_fit_levels(&x->fmt, smp, nr, cols);
    free(smp);
    return st;
}

/* Turns an svd decision into the rule's fallback action. */
static void use_fallback(plan_t *x, const char *why)
{
    x->svd = 0;
    x->d.action = x->d.fallback;
    x->d.reason = why;
    plan_format(x);
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
static stz_status svd_prepare(const stz_quant_params *p, const stz_reader *r, const stz_tensor *t, plan_t *x,
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
    size_t bad = st ? m * n : first_nonfinite(W, m * n);
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

static stz_status declare_svd(stz_writer *w, const stz_tensor *t, const plan_t *x, stz_err *err)
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
    snprintf(key, sizeof key, "%s%s", META_PREFIX, t->name);
    st = stz_writer_set_meta(w, key, js, err);
    free(js);
    return st;
}

/* Writes n floats as little-endian F32 through buf (BATCH_BYTES). */
static stz_status write_f32(stz_writer *w, const float *v, size_t n, uint8_t *buf, stz_err *err)
{
    for (size_t i = 0; i < n; i += BATCH_BYTES / 4) {
        size_t k = n - i < BATCH_BYTES / 4 ? n - i : BATCH_BYTES / 4;
        stz_status st = stz_from_f32(STZ_DTYPE_F32, v + i, k, buf, err);
        if (st || (st = stz_writer_write(w, buf, k * 4, err)))
            return st;
    }
    return STZ_OK;
}

static stz_status write_svd(stz_writer *w, const plan_t *x, uint8_t *buf, stz_err *err)
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

static void plan_free(plan_t *x)
{
    free(x->scales_name);
    free(x->mins_name);
    free(x->Uq), free(x->Us), free(x->Sq), free(x->Vq), free(x->Vs);
    for (int j = 0; j < 5; j++)
        free(x->fname[j]);
}

stz_status stz_quantize_file(const stz_quant_params *p, stz_policy *policy, const char *in, const char *out,
                             stz_quant_stats *stats, stz_err *err)
{
    stz_reader *r = NULL;
    stz_writer *w = NULL;
    plan_t *pl = NULL;
    qslot *slot = NULL;
    int nslots = 0;
    uint8_t *buf = NULL, *q = NULL; /* slot 0's buffers, for the serial steps */
    float *f = NULL;
    size_t nt = 0, maxrow = 0;
    stz_status st;
    if ((st = stz_reader_open(&r, in, err)))
        return st;
    if ((st = stz_refuse_input_as_output(in, out, err)))
        goto cleanup;
    if ((st = refuse_quantized(r, err)))
        goto cleanup;
    nt = stz_reader_count(r);
    pl = calloc(nt + 1, sizeof *pl);
    if (!pl) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
        goto cleanup;
    }
    for (size_t i = 0; i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        pl[i].d = stz_policy_decide(policy, t);
        if (pl[i].d.action == STZ_ACTION_KEEP)
            continue;
        pl[i].svd = pl[i].d.action == STZ_ACTION_SVD;
        plan_format(&pl[i]);
        row_shape(t, &pl[i].rows, &pl[i].cols);
        pl[i].nblocks = stz_q_blocks(pl[i].cols, pl[i].d.block_size);
        if (t->ndim < 2) /* include_1d: one row */
            pl[i].rows = 1, pl[i].cols = t->numel, pl[i].nblocks = stz_q_blocks(t->numel, pl[i].d.block_size);
        maxrow = pl[i].cols > maxrow ? pl[i].cols : maxrow;
    }
    /* a batch: BATCH_BYTES of input (>= 2-byte values), or one longer row */
    size_t batch_elems = BATCH_BYTES / 2 > maxrow ? BATCH_BYTES / 2 : maxrow;
    nslots = p->threads < 1 ? 1 : p->threads;
    if (!(slot = calloc((size_t)nslots, sizeof *slot))) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
        goto cleanup;
    }
    for (int k = 0; k < nslots; k++) {
        qslot *s = &slot[k];
        s->in = malloc(maxrow * 8 > BATCH_BYTES ? maxrow * 8 : BATCH_BYTES);
        s->f = malloc(batch_elems * sizeof *s->f);
        s->q = malloc(batch_elems + 16);
        s->y = malloc(maxrow * sizeof *s->y + 1);
        if (!s->in || !s->f || !s->q || !s->y) {
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the buffers of %d threads", nslots);
            goto cleanup;
        }
    }
    buf = slot[0].in, f = slot[0].f, q = slot[0].q;
    /* Before the header is written: tensors the policy keeps when they hold
     * NaN/Inf, single-block scales (stored in __metadata__), names. */
    for (size_t i = 0; i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        plan_t *x = &pl[i];
        if (x->svd && (st = svd_prepare(p, r, t, x, err)))
            goto cleanup;
        if (!x->bits || x->svd)
            continue;
        if (x->d.nonfinite == STZ_NONFINITE_KEEP) {
            int64_t at;
            if ((st = find_nonfinite(r, t, buf, f, &at, err)))
                goto cleanup;
            if (at >= 0) {
                x->bits = 0, x->d.action = STZ_ACTION_KEEP, x->d.reason = "holds NaN/Inf (kept by the policy)";
                continue;
            }
        }
        if ((st = plan_prepare(r, t, x, buf, f, err)))
            goto cleanup;
        if (x->rows * x->nblocks == 1) {
            size_t esz = stz_dtype_bits(t->dtype) / 8;
            if ((st = stz_reader_read(r, t, 0, buf, t->numel * esz, err)) ||
                (st = stz_to_f32(t->dtype, buf, (size_t)t->numel, f, err)))
                goto cleanup;
            quant_row(x, f, q, &x->scalar, &x->scalar_min); /* a non-finite value is reported in the main pass */
            continue;
        }
        char **names[2] = {&x->scales_name, &x->mins_name};
        for (int k = 0; k < (x->d.method == STZ_QMETHOD_ASYM ? 2 : 1); k++) {
            size_t len = strlen(t->name) + 8;
            if (!(*names[k] = malloc(len))) {
                st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
                goto cleanup;
            }
            snprintf(*names[k], len, "%s.%s", t->name, k ? "mins" : "scales");
            if (stz_reader_find(r, *names[k]) >= 0) {
                st = stz_err_set(err, STZ_E_DUPLICATE,
                                 "%s: tensor '%s': its %s would be stored as '%s', which already exists in the file",
                                 in, t->name, k ? "minimums" : "scales", *names[k]);
                goto cleanup;
            }
        }
    }
    if ((st = stz_writer_open(&w, out, p->write_flags, err)) ||
        (st = stz_writer_set_meta(w, "stz.quant.version", QUANT_VERSION, err)))
        goto cleanup;
    for (size_t i = 0; i < stz_reader_meta_count(r); i++) /* original metadata first */
        if (strcmp(stz_reader_meta_key(r, i), "format") &&
            (st = stz_writer_set_meta(w, stz_reader_meta_key(r, i), stz_reader_meta_value(r, i), err)))
            goto cleanup;
    for (size_t i = 0; i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        plan_t *x = &pl[i];
        if (!x->bits) {
            st = stz_writer_add(w, t->name, t->dtype, t->ndim, t->shape, err);
        } else if (x->svd) {
            st = declare_svd(w, t, x, err);
        } else {
            uint64_t shape[STZ_ST_MAX_NDIM];
            int nd = t->ndim ? t->ndim : 1;
            memcpy(shape, t->shape, (size_t)t->ndim * sizeof *shape);
            shape[nd - 1] = stz_qf_row_bytes(x->bits, t->ndim ? t->shape[nd - 1] : 1);
            if (t->ndim < 2)
                shape[0] = stz_qf_row_bytes(x->bits, t->numel);
            if (!(st = stz_writer_add(w, t->name, values_dtype(x->bits, x->d.method), nd, shape, err)) &&
                x->scales_name) {
                shape[nd - 1] = x->nblocks;
                st = stz_writer_add(w, x->scales_name, x->d.scale_dtype, nd, shape, err);
                if (!st && x->mins_name)
                    st = stz_writer_add(w, x->mins_name, x->d.scale_dtype, nd, shape, err);
            }
            if (!st)
                st = meta_for(w, t, x, err);
        }
        if (st)
            goto cleanup;
    }
    uint64_t done = 0, total = stz_reader_file_size(r);
    for (size_t i = 0; i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        st = pl[i].svd    ? write_svd(w, &pl[i], buf, err)
             : pl[i].bits ? write_quantized(w, r, t, &pl[i], slot, nslots, err)
                          : copy_tensor(w, r, t, buf, err);
        if (st)
            goto cleanup;
        done += t->end - t->begin;
        if (p->progress && p->progress(p->progress_user, done, total)) {
            st = stz_err_set(err, STZ_E_INTERRUPTED, "%s: interrupted", out);
            goto cleanup;
        }
    }
    if ((st = stz_writer_finish(w, err)))
        goto cleanup;
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->in_bytes = stz_reader_file_size(r);
        stats->tensors = nt;
        stats->min_cosine = 1;
        double wsum = 0, wtot = 0; /* like stz eval: every float tensor, kept ones at cosine 1 */
        for (size_t i = 0; i < nt; i++) {
            const stz_tensor *t = stz_reader_tensor(r, i);
            stats->params += t->numel;
            if (stz_dtype_is_float(t->dtype))
                wtot += (double)t->numel, wsum += pl[i].bits ? 0 : (double)t->numel;
            if (!pl[i].bits)
                continue;
            stats->quantized++, stats->params_quantized += t->numel;
            wsum += pl[i].cosine * (double)t->numel;
            if (pl[i].cosine < stats->min_cosine) {
                stats->min_cosine = pl[i].cosine;
                snprintf(stats->worst, sizeof stats->worst, "%s", t->name);
            }
        }
        stats->weighted_cosine = wtot ? wsum / wtot : 1;
        struct stat sb;
        stats->out_bytes = stat(out, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    }
cleanup:
    stz_writer_free(w);
    for (size_t i = 0; pl && i < nt; i++)
        plan_free(&pl[i]);
    free(pl);
    for (int k = 0; slot && k < nslots; k++)
        free(slot[k].in), free(slot[k].f), free(slot[k].q), free(slot[k].y);
    free(slot);
    stz_reader_free(r);
    return st;
}

/* ---- dequantize ------------------------------------------------------ */

typedef struct {
    const char *name;      /* original name (owned by the reader's metadata) */
    const char *method;    /* "absmax", "mse", "svd" (static) */
    const stz_tensor *t;   /* values tensor (svd: U) in the quantized file */
    const stz_tensor *sc;  /* scales tensor, NULL for a single scale */
    const stz_tensor *mn;  /* asym: minimums tensor, NULL for a single block */
    float scalar_min;
    stz_qformat fmt;       /* how to dequantize (not svd) */
    int bits;
    uint32_t block;
    stz_dtype dtype, scale_dtype;
    int ndim;
    uint64_t shape[STZ_ST_MAX_NDIM];
    uint64_t numel, rows, cols, nblocks;
    float scalar;
    /* svd: W = U diag(S) Vh, INT8 factors with per-row F32 scales */
    int svd;
    uint64_t rank;
    const stz_tensor *Us, *S, *Vh, *Vs;
    float s_scale;
    float *vh, *sv;        /* Vh and S dequantized, on first use */
} qinfo;

/* The levels of an nl entry: absent (the fixed codebook for its bits), or
 * 2^bits integers n in [-32767, 32767], non-decreasing, level n / 32767. */
static int parse_levels(const cJSON *lv, stz_qformat *f)
{
    int k = 1 << f->bits;
    if (!lv) {
        stz_qf_default_levels(f->bits, f->levels);
        return 0;
    }
    if (!cJSON_IsArray(lv) || cJSON_GetArraySize(lv) != k)
        return -1;
    int i = 0;
    for (const cJSON *e = lv->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || fabs(e->valuedouble) > 32767)
            return -1;
        f->levels[i] = (float)e->valuedouble / 32767.0f;
        if (i && f->levels[i] < f->levels[i - 1])
            return -1;
    }
    return 0;
}

/* Parses and checks __metadata__["stz.quant.NAME"] against the file. */
static stz_status parse_qinfo(const stz_reader *r, const stz_tensor *t, const char *json, qinfo *qi, stz_err *err)
{
    const char *P = stz_reader_path(r);
    cJSON *o = cJSON_Parse(json);
    const cJSON *bits = cJSON_GetObjectItemCaseSensitive(o, "bits"), *blk = cJSON_GetObjectItemCaseSensitive(o, "block_size"),
                *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype"), *sh = cJSON_GetObjectItemCaseSensitive(o, "shape"),
                *scn = cJSON_GetObjectItemCaseSensitive(o, "scales"), *scv = cJSON_GetObjectItemCaseSensitive(o, "scale"),
                *sdt = cJSON_GetObjectItemCaseSensitive(o, "scale_dtype"),
                *base = cJSON_GetObjectItemCaseSensitive(o, "scale_base"),
                *mnn = cJSON_GetObjectItemCaseSensitive(o, "mins"), *mnv = cJSON_GetObjectItemCaseSensitive(o, "min"),
                *lv = cJSON_GetObjectItemCaseSensitive(o, "levels");
    static const char *const known[] = {"method", "bits", "block_size", "dtype", "shape", "scales", "scale",
                                        "scale_dtype", "scale_base", "mins", "min", "levels", "packing", NULL};
    const cJSON *meth = cJSON_GetObjectItemCaseSensitive(o, "method"), *pk = cJSON_GetObjectItemCaseSensitive(o, "packing");
    const char *unknown = stz_json_unknown_key(o, known), *dup = stz_json_duplicate_key(o);
    stz_status st = STZ_OK;
    int m = -1;
    memset(qi, 0, sizeof *qi);
    qi->t = t;
    if (unknown || dup) {
        st = stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s': %s%s has %s key '%s'", P, t->name, META_PREFIX,
                         t->name, unknown ? "an unknown" : "a duplicate", unknown ? unknown : dup);
        goto done;
    }
    for (int j = 0; j < STZ_QMETHOD_NL_FIT && cJSON_IsString(meth); j++) /* nl-fit is stored as nl + levels */
        if (!strcmp(meth->valuestring, stz_qmethod_name((stz_qmethod)j)))
            m = j;
    if (m < 0) {
        st = stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s': unknown quantization method '%s'", P, t->name,
                         cJSON_IsString(meth) ? meth->valuestring : "(none)");
        goto done;
    }
    int nb = cJSON_IsNumber(bits) ? (int)bits->valuedouble : 0;
    const char *want_pk = nb == 4 ? INT4_PACKING : nb == 8 ? NULL : MSB_PACKING;
    if (want_pk ? !cJSON_IsString(pk) || strcmp(pk->valuestring, want_pk) : pk != NULL) {
        st = stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s': unknown packing '%s' (this stz reads '%s' for "
                         "4 bits, '%s' for 2, 3, 5 and 6, and none for 8)", P, t->name,
                         cJSON_IsString(pk) ? pk->valuestring : "(none)", INT4_PACKING, MSB_PACKING);
        goto done;
    }
    qi->fmt.method = (stz_qmethod)m;
    if (!cJSON_IsObject(o) || !cJSON_IsNumber(bits) || bits->valuedouble != nb || nb < 2 || nb > 8 || nb == 7 ||
        ((m == STZ_QMETHOD_NL) && nb > 6) || !cJSON_IsNumber(blk) || blk->valuedouble < 1 ||
        blk->valuedouble > (1 << 20) || !cJSON_IsString(dt) || stz_dtype_parse(dt->valuestring, &qi->dtype) ||
        !cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > STZ_ST_MAX_NDIM || !(cJSON_IsString(scn) || cJSON_IsNumber(scv)) ||
        !cJSON_IsString(sdt) || stz_dtype_parse(sdt->valuestring, &qi->scale_dtype) ||
        (qi->scale_dtype != STZ_DTYPE_F16 && qi->scale_dtype != STZ_DTYPE_F32 && qi->scale_dtype != STZ_DTYPE_U8) ||
        (qi->scale_dtype == STZ_DTYPE_U8) != cJSON_IsNumber(base) || (cJSON_IsNumber(base) && !(base->valuedouble > 0)) ||
        (m == STZ_QMETHOD_ASYM) != (cJSON_IsString(mnn) || cJSON_IsNumber(mnv)) ||
        (m == STZ_QMETHOD_ASYM && (qi->scale_dtype == STZ_DTYPE_U8 || cJSON_IsString(scn) != cJSON_IsString(mnn))) ||
        (lv && m != STZ_QMETHOD_NL)) {
        st = stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': invalid %s%s entry", P, t->name, META_PREFIX, t->name);
        goto done;
    }
    qi->bits = nb;
    qi->block = (uint32_t)blk->valuedouble;
    qi->method = stz_qmethod_name((stz_qmethod)m);
    qi->fmt.bits = nb, qi->fmt.block = qi->block, qi->fmt.scale_dtype = qi->scale_dtype;
    qi->fmt.scale_base = base ? (float)base->valuedouble : 0;
    if (m == STZ_QMETHOD_NL && parse_levels(lv, &qi->fmt)) {
        st = stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': 'levels' must be %d whole numbers in [-32767, 32767] "
                         "in increasing order", P, t->name, 1 << nb);
        goto done;
    }
    qi->numel = 1;
    for (const cJSON *d = sh->child; d; d = d->next) {
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble != floor(d->valuedouble) ||
            d->valuedouble > 9007199254740992.0) {
            st = stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': invalid original shape", P, t->name);
            goto done;
        }
        qi->shape[qi->ndim++] = (uint64_t)d->valuedouble;
        qi->numel *= (uint64_t)d->valuedouble;
    }
    qi->cols = qi->ndim >= 2 ? qi->shape[qi->ndim - 1] : qi->numel;
    qi->rows = qi->cols ? qi->numel / qi->cols : 0;
    qi->nblocks = stz_q_blocks(qi->cols, qi->block);
    /* the values tensor must be what the metadata says it is */
    if (t->dtype != values_dtype(nb, (stz_qmethod)m) || t->end - t->begin != qi->rows * stz_qf_row_bytes(nb, qi->cols) || !qi->numel) {
        st = stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': %s values do not match the recorded shape", P, t->name,
                         stz_dtype_name(t->dtype));
        goto done;
    }
    const cJSON *names[2] = {scn, mnn};
    const stz_tensor **found[2] = {&qi->sc, &qi->mn};
    for (int k = 0; k < 2; k++) {
        if (!cJSON_IsString(names[k]))
            continue;
        long si = stz_reader_find(r, names[k]->valuestring);
        *found[k] = si >= 0 ? stz_reader_tensor(r, (size_t)si) : NULL;
        if (!*found[k] || (*found[k])->dtype != qi->scale_dtype || (*found[k])->numel != qi->rows * qi->nblocks) {
            st = stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': %s tensor '%s' is missing or has the wrong "
                             "dtype or size", P, t->name, k ? "minimums" : "scales", names[k]->valuestring);
            goto done;
        }
    }
    if (!qi->sc) {
        if (qi->rows * qi->nblocks != 1) {
            st = stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': one scale for %llu blocks", P, t->name,
                             (unsigned long long)(qi->rows * qi->nblocks));
            goto done;
        }
        qi->scalar = (float)scv->valuedouble;
        qi->scalar_min = cJSON_IsNumber(mnv) ? (float)mnv->valuedouble : 0;
    }
    if (m == STZ_QMETHOD_NL)
        stz_qf_prepare(&qi->fmt);
done:
    cJSON_Delete(o);
    return st;
}

/* Dequantizes rows [row, row + nr) into f. `raw` holds nr * row bytes and
 * `sbytes` the scales' bytes; `sc` receives nr * nblocks floats. */
static void qinfo_free(qinfo *qi)
{
    free(qi->vh);
    free(qi->sv);
}

/* S and Vh of an svd entry, dequantized once. */
static stz_status svd_load(const stz_reader *r, qinfo *qi, stz_err *err)
{
    size_t k = (size_t)qi->rank, n = (size_t)qi->cols;
    int8_t *q = malloc(k * n + k);
    float *vs = malloc(k * sizeof *vs);
    uint8_t *b = malloc(k * 4 + 1);
    qi->vh = malloc(k * n * sizeof *qi->vh), qi->sv = malloc(k * sizeof *qi->sv);
    stz_status st = q && vs && b && qi->vh && qi->sv ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory");
    if (!st && !(st = stz_reader_read(r, qi->Vh, 0, q, k * n, err)) && !(st = stz_reader_read(r, qi->Vs, 0, b, k * 4, err)) &&
        !(st = stz_to_f32(STZ_DTYPE_F32, b, k, vs, err)) && !(st = stz_reader_read(r, qi->S, 0, q + k * n, k, err))) {
        for (size_t i = 0; i < k; i++)
            stz_q8_dequantize_ref(q + i * n, vs + i, n, n, qi->vh + i * n);
        stz_q8_dequantize_ref(q + k * n, &qi->s_scale, k, k, qi->sv);
    }
    free(q), free(vs), free(b);
    if (st)
        qinfo_free(qi), qi->vh = qi->sv = NULL;
    return st;
}

static stz_status qinfo_rows(const stz_reader *r, qinfo *qi, uint64_t row, size_t nr, uint8_t *raw,
                             uint8_t *sbytes, float *sc, float *f, stz_err *err)
{
    if (qi->svd) {
        /* W rows (nr, n) = U rows (nr, k) @ diag(S) @ Vh (k, n) */
        size_t k = (size_t)qi->rank;
        stz_status st = qi->vh ? STZ_OK : svd_load(r, qi, err);
        if (st || (st = stz_reader_read(r, qi->t, row * k, raw, nr * k, err)) ||
            (st = stz_reader_read(r, qi->Us, row * 4, sbytes, nr * 4, err)))
            return st;
        float *us = sc + nr * k; /* row scales after the U values */
        if ((st = stz_to_f32(STZ_DTYPE_F32, sbytes, nr, us, err)))
            return st;
        for (size_t i = 0; i < nr; i++)
            stz_q8_dequantize_ref((const int8_t *)raw + i * k, us + i, k, k, sc + i * k);
        if (stz_svd_reconstruct(sc, qi->sv, qi->vh, nr, (size_t)qi->cols, k, f))
            return stz_err_set(err, STZ_E_NOMEM, "%s: tensor '%s': out of memory rebuilding rows", stz_reader_path(r),
                               qi->name);
        return STZ_OK;
    }
    size_t rb = stz_qf_row_bytes(qi->bits, qi->cols), ssz = stz_dtype_bits(qi->scale_dtype) / 8;
    size_t nsc = nr * (size_t)qi->nblocks;
    float *mn = sc + nsc; /* asym: the minimums after the scales */
    stz_status st = stz_reader_read(r, qi->t, row * rb, raw, nr * rb, err);
    if (st)
        return st;
    const stz_tensor *src[2] = {qi->sc, qi->mn};
    float *dst[2] = {sc, mn};
    for (int k = 0; k < (qi->mn ? 2 : 1) && qi->sc; k++) {
        if ((st = stz_reader_read(r, src[k], row * qi->nblocks * ssz, sbytes, nsc * ssz, err)))
            return st;
        if (qi->scale_dtype == STZ_DTYPE_U8)
            for (size_t i = 0; i < nsc; i++)
                dst[k][i] = stz_qf_scale_value(qi->fmt.scale_base, sbytes[i]);
        else if ((st = stz_to_f32(qi->scale_dtype, sbytes, nsc, dst[k], err)))
            return st;
    }
    if (!qi->sc)
        sc[0] = qi->scalar, mn[0] = qi->scalar_min;
    for (size_t k = 0; k < nr; k++)
        stz_qf_dequantize_row(&qi->fmt, raw + k * rb, sc + k * qi->nblocks, mn + k * qi->nblocks, (size_t)qi->cols,
                              f + k * qi->cols);
    return STZ_OK;
}

static stz_status write_dequantized(stz_writer *w, const stz_reader *r, qinfo *qi, stz_dtype odt, uint8_t *in,
                                    float *f, float *sc, uint8_t *out, stz_err *err)
{
    size_t osz = stz_dtype_bits(odt) / 8;
    uint64_t per = (BATCH_BYTES / 8) / qi->cols;
    if (per == 0)
        per = 1;
    for (uint64_t row = 0; row < qi->rows; row += per) {
        size_t nr = qi->rows - row < per ? (size_t)(qi->rows - row) : (size_t)per;
        stz_status st = qinfo_rows(r, qi, row, nr, in, out, sc, f, err);
        if (st || (st = stz_from_f32(odt, f, nr * qi->cols, out, err)) ||
            (st = stz_writer_write(w, out, nr * qi->cols * osz, err)))
            return st;
    }
    return STZ_OK;
}

/* Reads an svd entry; qi->t is its U tensor. */
static stz_status parse_svd_info(const stz_reader *r, const char *name, const cJSON *o, qinfo *qi, stz_err *err)
{
    const char *P = stz_reader_path(r);
    static const char *const keys[5] = {"U", "U_scales", "S", "Vh", "Vh_scales"};
    const stz_tensor *f[5];
    const cJSON *rk = cJSON_GetObjectItemCaseSensitive(o, "rank"), *dt = cJSON_GetObjectItemCaseSensitive(o, "dtype"),
                *sh = cJSON_GetObjectItemCaseSensitive(o, "shape"), *ss = cJSON_GetObjectItemCaseSensitive(o, "S_scale");
    static const char *const known[] = {"method", "svd_method", "power_iters", "oversample", "bits", "rank",
                                        "dtype", "shape", "U", "U_scales", "S", "S_scale", "Vh", "Vh_scales",
                                        "scale_dtype", "rel_error", NULL};
    const char *unknown = stz_json_unknown_key(o, known), *dup = stz_json_duplicate_key(o);
    const cJSON *bits = cJSON_GetObjectItemCaseSensitive(o, "bits"), *sdt = cJSON_GetObjectItemCaseSensitive(o, "scale_dtype");
    memset(qi, 0, sizeof *qi);
    qi->name = name, qi->svd = 1, qi->bits = 8, qi->method = "svd";
    if (unknown || dup)
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s': svd entry has %s key '%s'", P, name,
                           unknown ? "an unknown" : "a duplicate", unknown ? unknown : dup);
    if (!cJSON_IsNumber(bits) || bits->valuedouble != 8 || !cJSON_IsString(sdt) || strcmp(sdt->valuestring, "F32"))
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s': svd factors with 'bits' other than 8 or "
                           "'scale_dtype' other than F32 (this stz reads INT8 factors with F32 scales)", P, name);
    for (int j = 0; j < 5; j++) {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, keys[j]);
        long ti = cJSON_IsString(k) ? stz_reader_find(r, k->valuestring) : -1;
        f[j] = ti >= 0 ? stz_reader_tensor(r, (size_t)ti) : NULL;
        if (!f[j])
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': svd factor '%s' is missing", P, name, keys[j]);
    }
    if (!cJSON_IsNumber(rk) || rk->valuedouble < 1 || !cJSON_IsString(dt) || stz_dtype_parse(dt->valuestring, &qi->dtype) ||
        !cJSON_IsArray(sh) || cJSON_GetArraySize(sh) < 2 || cJSON_GetArraySize(sh) > STZ_ST_MAX_NDIM || !cJSON_IsNumber(ss))
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': invalid svd entry", P, name);
    qi->numel = 1;
    for (const cJSON *d = sh->child; d; d = d->next) {
        if (!cJSON_IsNumber(d) || d->valuedouble < 1 || d->valuedouble != floor(d->valuedouble) || d->valuedouble > 1e15)
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': invalid original shape", P, name);
        qi->shape[qi->ndim++] = (uint64_t)d->valuedouble;
        qi->numel *= (uint64_t)d->valuedouble;
    }
    qi->rank = (uint64_t)rk->valuedouble;
    qi->cols = qi->shape[qi->ndim - 1];
    qi->rows = qi->numel / qi->cols;
    qi->s_scale = (float)ss->valuedouble;
    qi->t = f[0], qi->Us = f[1], qi->S = f[2], qi->Vh = f[3], qi->Vs = f[4];
    uint64_t m = qi->rows, n = qi->cols, k = qi->rank;
    if (f[0]->dtype != STZ_DTYPE_I8 || f[0]->numel != m * k || f[1]->dtype != STZ_DTYPE_F32 || f[1]->numel != m ||
        f[2]->dtype != STZ_DTYPE_I8 || f[2]->numel != k || f[3]->dtype != STZ_DTYPE_I8 || f[3]->numel != k * n ||
        f[4]->dtype != STZ_DTYPE_F32 || f[4]->numel != k || k >= (m < n ? m : n))
        return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s': svd factors do not match rank %llu of %llu x %llu", P,
                           name, (unsigned long long)k, (unsigned long long)m, (unsigned long long)n);
    return STZ_OK;
}

/* Quantization entries, from the "stz.quant.NAME" metadata: qi[i] is set at
 * the reader index of the entry's values tensor (svd: its U); skip[i] marks
 * the other tensors an entry owns (scales, svd factors). */
static stz_status scan_quantized(const stz_reader *r, qinfo *qi, char *skip, size_t *maxcols, stz_err *err)
{
    const char *P = stz_reader_path(r);
    size_t plen = strlen(META_PREFIX);
    const stz_tensor *base = stz_reader_tensor(r, 0);
    const char *version = stz_reader_meta_get(r, "stz.quant.version");
    *maxcols = 0;
    if (version && strcmp(version, QUANT_VERSION))
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: quantized with format version '%s' (this stz reads version %s)",
                           P, version, QUANT_VERSION);
    for (size_t k = 0; k < stz_reader_meta_count(r); k++) {
        const char *key = stz_reader_meta_key(r, k);
        if (strncmp(key, META_PREFIX, plen) || !strcmp(key, "stz.quant.version"))
            continue;
        if (!version)
            return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: metadata '%s' without 'stz.quant.version': not a file "
                               "this stz wrote, refusing to guess its layout", P, key);
        const char *name = key + plen;
        cJSON *o = cJSON_Parse(stz_reader_meta_value(r, k));
        const cJSON *meth = cJSON_GetObjectItemCaseSensitive(o, "method");
        int is_svd = cJSON_IsString(meth) && !strcmp(meth->valuestring, "svd");
        qinfo tmp;
        stz_status st;
        if (is_svd) {
            st = stz_reader_find(r, name) >= 0
                     ? stz_err_set(err, STZ_E_FORMAT, "%s: SVD entry '%s' has the name of a stored tensor", P, name)
                     : parse_svd_info(r, name, o, &tmp, err);
        } else {
            long ti = stz_reader_find(r, name);
            st = ti < 0 ? stz_err_set(err, STZ_E_FORMAT, "%s: metadata describes tensor '%s', which is missing", P, name)
                        : parse_qinfo(r, stz_reader_tensor(r, (size_t)ti), stz_reader_meta_value(r, k), &tmp, err);
            tmp.name = name;
        }
        cJSON_Delete(o);
        if (st)
            return st;
        size_t at = (size_t)(tmp.t - base);
        if (qi[at].bits)
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s' is described twice", P, tmp.t->name);
        qi[at] = tmp;
        const stz_tensor *owned[6] = {tmp.sc, tmp.Us, tmp.S, tmp.Vh, tmp.Vs, tmp.mn};
        for (int j = 0; j < 6; j++) {
            if (owned[j] && skip[owned[j] - base])
                return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s' belongs to two quantized entries", P,
                                   owned[j]->name);
            if (owned[j])
                skip[owned[j] - base] = 1;
        }
        *maxcols = tmp.cols > *maxcols ? tmp.cols : *maxcols;
    }
    for (size_t i = 0; i < stz_reader_count(r); i++)
        if (skip[i] && qi[i].bits)
            return stz_err_set(err, STZ_E_FORMAT, "%s: tensor '%s' belongs to two quantized entries", P,
                               stz_reader_tensor(r, i)->name);
    return STZ_OK;
}

stz_status stz_dequantize_file(const stz_quant_params *p, const char *in, const char *out, stz_dtype dtype,
                               stz_err *err)
{
    stz_reader *r = NULL;
    stz_writer *w = NULL;
    qinfo *qi = NULL;
    char *skip = NULL; /* 1 for companion scales tensors */
    uint8_t *buf = NULL, *obuf = NULL;
    float *f = NULL, *sc = NULL;
    size_t maxcols = 0;
    stz_status st;
    if (dtype != STZ_DTYPE_COUNT && dtype != STZ_DTYPE_BF16 && dtype != STZ_DTYPE_F16 && dtype != STZ_DTYPE_F32)
        return stz_err_set(err, STZ_E_ARG, "dequantize: output dtype must be BF16, F16 or F32");
    if ((st = stz_reader_open(&r, in, err)))
        return st;
    size_t nt = stz_reader_count(r);
    qi = calloc(nt + 1, sizeof *qi);
    skip = calloc(nt + 1, 1);
    if (!qi || !skip) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
        goto cleanup;
    }
    if ((st = stz_refuse_input_as_output(in, out, err)))
        goto cleanup;
    if ((st = scan_quantized(r, qi, skip, &maxcols, err)))
        goto cleanup;
    size_t elems = BATCH_BYTES / 8 > maxcols ? BATCH_BYTES / 8 : maxcols;
    buf = malloc(elems * 8 > BATCH_BYTES ? elems * 8 : BATCH_BYTES);
    obuf = malloc(elems * 8 > BATCH_BYTES ? elems * 8 : BATCH_BYTES);
    f = malloc(elems * sizeof *f);
    sc = malloc(2 * elems * sizeof *sc); /* scales, then minimums (asym) */
    if (!buf || !obuf || !f || !sc) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
        goto cleanup;
    }
    if ((st = stz_writer_open(&w, out, p->write_flags, err)))
        goto cleanup;
    for (size_t i = 0; i < stz_reader_meta_count(r); i++) {
        const char *k = stz_reader_meta_key(r, i);
        if (strncmp(k, META_PREFIX, strlen(META_PREFIX)) && strcmp(k, "format") &&
            (st = stz_writer_set_meta(w, k, stz_reader_meta_value(r, i), err)))
            goto cleanup;
    }
    for (size_t i = 0; i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        if (skip[i] && !qi[i].bits)
            continue;
        st = qi[i].bits ? stz_writer_add(w, qi[i].name, dtype == STZ_DTYPE_COUNT ? qi[i].dtype : dtype, qi[i].ndim,
                                         qi[i].shape, err)
                        : stz_writer_add(w, t->name, t->dtype, t->ndim, t->shape, err);
        if (st)
            goto cleanup;
    }
    uint64_t done = 0, total = stz_reader_file_size(r);
    for (size_t i = 0; i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        if (skip[i] && !qi[i].bits)
            continue;
        if (qi[i].bits) {
            if ((st = write_dequantized(w, r, &qi[i], dtype == STZ_DTYPE_COUNT ? qi[i].dtype : dtype, buf, f, sc,
                                        obuf, err)))
                goto cleanup;
        } else if ((st = copy_tensor(w, r, t, buf, err))) {
            goto cleanup;
        }
        done += t->end - t->begin;
        if (p->progress && p->progress(p->progress_user, done, total)) {
            st = stz_err_set(err, STZ_E_INTERRUPTED, "%s: interrupted", out);
            goto cleanup;
        }
    }
    st = stz_writer_finish(w, err);
cleanup:
    stz_writer_free(w);
    for (size_t i = 0; qi && i < nt; i++)
        qinfo_free(&qi[i]);
    free(qi);
    free(skip);
    free(buf);
    free(obuf);
    free(f);
    free(sc);
    stz_reader_free(r);
    return st;
}

/* ---- stz_qmodel --------------------------------------------------------- */

struct stz_qmodel {
    stz_reader *r;
    int owns_reader;
    stz_container *container; /* a container opened for r, owned */
    qinfo *qi;         /* per reader tensor */
    stz_qtensor *list; /* listed tensors */
    size_t *idx;       /* reader index of each listed tensor */
    long *pos;         /* list index of each reader tensor, -1 if not listed */
    size_t n;
    uint8_t *scratch;
    size_t scratch_cap;
};

/* Lists the tensors of m->r. */
static stz_status qmodel_init(stz_qmodel *m, stz_err *err)
{
    char *skip = NULL;
    size_t maxcols;
    stz_status st;
    size_t nt = stz_reader_count(m->r);
    m->qi = calloc(nt + 1, sizeof *m->qi);
    m->list = calloc(nt + 1, sizeof *m->list);
    m->idx = calloc(nt + 1, sizeof *m->idx);
    m->pos = malloc((nt + 1) * sizeof *m->pos);
    skip = calloc(nt + 1, 1);
    if (!m->qi || !m->list || !m->idx || !m->pos || !skip) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = scan_quantized(m->r, m->qi, skip, &maxcols, err)))
        goto fail;
    for (size_t i = 0; i < nt; i++)
        m->pos[i] = -1;
    for (size_t i = 0; i < nt; i++) {
        const stz_tensor *t = stz_reader_tensor(m->r, i);
        const qinfo *q = &m->qi[i];
        stz_qtensor *e = &m->list[m->n];
        if (skip[i] && !q->bits)
            continue;
        e->name = q->bits ? q->name : t->name;
        e->bits = q->bits, e->rank = q->svd ? q->rank : 0;
        e->method = q->bits ? q->method : NULL, e->block_size = q->svd ? 0 : q->block;
        e->scale_dtype = q->bits && !q->svd ? q->scale_dtype : STZ_DTYPE_COUNT;
        e->scales_name = q->bits && !q->svd && q->sc ? q->sc->name : NULL;
        if (q->bits) {
            e->dtype = q->dtype, e->ndim = q->ndim, e->shape = q->shape, e->numel = q->numel;
            e->rows = q->rows, e->cols = q->cols;
            const stz_tensor *own[7] = {t, q->sc, q->Us, q->S, q->Vh, q->Vs, q->mn};
            for (int j = 0; j < 7; j++)
                e->stored_bytes += own[j] ? own[j]->end - own[j]->begin : 0;
        } else {
            e->dtype = t->dtype, e->ndim = t->ndim, e->shape = t->shape, e->numel = t->numel;
            e->cols = t->ndim >= 2 ? t->shape[t->ndim - 1] : t->numel;
            e->rows = e->cols ? t->numel / e->cols : 0;
            e->stored_bytes = t->end - t->begin;
        }
        m->pos[i] = (long)m->n;
        m->idx[m->n++] = i;
    }
fail:
    free(skip);
    return st;
}

stz_status stz_qmodel_open(stz_qmodel **out, const char *path, stz_err *err)
{
    *out = NULL;
    stz_qmodel *m = calloc(1, sizeof *m);
    if (!m)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    stz_status st;
    if (stz_is_container(path)) { /* its data decoded where it is read */
        if (!(st = stz_container_open(&m->container, path, err)))
            m->r = (stz_reader *)stz_container_data_reader(m->container);
    } else
        m->owns_reader = 1, st = stz_reader_open(&m->r, path, err);
    if (st || (st = qmodel_init(m, err))) {
        stz_qmodel_free(m);
        return st;
    }
    *out = m;
    return STZ_OK;
}

stz_status stz_qmodel_open_reader(stz_qmodel **out, const stz_reader *r, stz_err *err)
{
    *out = NULL;
    stz_qmodel *m = calloc(1, sizeof *m);
    if (!m)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    m->r = (stz_reader *)r; /* not freed: owns_reader is 0 */
    stz_status st = qmodel_init(m, err);
    if (st) {
        stz_qmodel_free(m);
        return st;
    }
    *out = m;
    return STZ_OK;
}

void stz_qmodel_free(stz_qmodel *m)
{
    if (!m)
        return;
    for (size_t i = 0; m->qi && m->r && i < stz_reader_count(m->r); i++)
        qinfo_free(&m->qi[i]);
    if (m->owns_reader)
        stz_reader_free(m->r);
    stz_container_free(m->container);
    free(m->qi);
    free(m->list);
    free(m->idx);
    free(m->pos);
    free(m->scratch);
    free(m);
}

size_t stz_qmodel_count(const stz_qmodel *m) { return m->n; }
stz_container *stz_qmodel_container(const stz_qmodel *m) { return m->container; }

void stz_qmodel_set_threads(stz_qmodel *m, int threads)
{
    if (m->container)
        stz_container_set_threads(m->container, threads);
}
const stz_qtensor *stz_qmodel_tensor(const stz_qmodel *m, size_t i) { return i < m->n ? &m->list[i] : NULL; }
const stz_reader *stz_qmodel_reader(const stz_qmodel *m) { return m->r; }

long stz_qmodel_find(const stz_qmodel *m, const char *name)
{
    /* a tensor of the file under that name (plain, or the values of an
     * INT8/INT4 entry): O(log n); SVD entries have no such tensor: scan */
    long ri = stz_reader_find(m->r, name);
    if (ri >= 0 && m->pos[ri] >= 0 && !strcmp(m->list[m->pos[ri]].name, name))
        return m->pos[ri];
    for (size_t i = 0; i < m->n; i++)
        if (m->list[i].bits && !strcmp(m->list[i].name, name))
            return (long)i;
    return -1;
}

stz_status stz_qmodel_read_rows(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, float *dst, stz_err *err)
{
    return stz_qmodel_read_rows_scales(m, i, row, nrows, dst, NULL, err);
}

stz_status stz_qmodel_read_rows_scales(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, float *dst,
                                       float *scales, stz_err *err)
{
    const stz_qtensor *e = &m->list[i];
    const stz_tensor *t = stz_reader_tensor(m->r, m->idx[i]);
    if (row > e->rows || nrows > e->rows - row)
        return stz_err_set(err, STZ_E_BOUNDS, "%s: tensor '%s': rows %llu+%zu out of %llu", stz_reader_path(m->r),
                           e->name, (unsigned long long)row, nrows, (unsigned long long)e->rows);
    size_t n = nrows * (size_t)e->cols, need = n * 13 + 64; /* values, scale bytes, scale and minimum floats */
    if (need > m->scratch_cap) {
        uint8_t *b = realloc(m->scratch, need);
        if (!b)
            return stz_err_set(err, STZ_E_NOMEM, "out of memory");
        m->scratch = b, m->scratch_cap = need;
    }
    if (!e->bits) {
        size_t esz = stz_dtype_bits(t->dtype) / 8;
        stz_status st = stz_reader_read(m->r, t, row * e->cols * esz, m->scratch, n * esz, err);
        return st ? st : stz_to_f32(t->dtype, m->scratch, n, dst, err);
    }
    /* raw values, then scale bytes, then scale floats in the scratch */
    qinfo *q = &m->qi[m->idx[i]];
    size_t nsc = nrows * (size_t)q->nblocks;
    uint8_t *raw = m->scratch, *sb = raw + n + 8;
    float *sc = (float *)(void *)(m->scratch + ((n + 8 + nsc * 4 + 15) & ~(size_t)15));
    if (((n + 8 + nsc * 4 + 15) & ~(size_t)15) + nsc * 8 > m->scratch_cap)
        return stz_err_set(err, STZ_E_BOUNDS, "internal: scratch too small"); /* cannot happen: nsc <= n */
    stz_status st = qinfo_rows(m->r, q, row, nrows, raw, sb, sc, dst, err);
    if (!st && scales && !q->svd)
        memcpy(scales, sc, nsc * sizeof *sc);
    return st;
}

stz_status stz_qmodel_read_codes(stz_qmodel *m, size_t i, uint64_t row, size_t nrows, uint8_t *codes,
                                 uint8_t *scales, stz_err *err)
{
    const stz_qtensor *e = &m->list[i];
    const qinfo *q = &m->qi[m->idx[i]];
    if (!e->bits || q->svd || !q->sc)
        return stz_err_set(err, STZ_E_UNSUPPORTED, "%s: tensor '%s' has no stored codes and scales",
                           stz_reader_path(m->r), e->name);
    if (row > e->rows || nrows > e->rows - row)
        return stz_err_set(err, STZ_E_BOUNDS, "%s: tensor '%s': rows %llu+%zu out of %llu", stz_reader_path(m->r),
                           e->name, (unsigned long long)row, nrows, (unsigned long long)e->rows);
    size_t rb = stz_qf_row_bytes(q->bits, q->cols), sb = (size_t)q->nblocks * (stz_dtype_bits(q->scale_dtype) / 8);
    stz_status st = stz_reader_read(m->r, q->t, row * rb, codes, nrows * rb, err);
    return st ? st : stz_reader_read(m->r, q->sc, row * sb, scales, nrows * sb, err);
}
