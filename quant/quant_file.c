/* Quantize whole SafeTensors files, streaming row batches (the readers of
 * the result, stz_dequantize_file and stz_qmodel, are in quant_read.c).
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
    size_t esz = stz_dtype_bits(t->dtype) / 8, per = STZ_QUANT_BATCH_BYTES / esz;
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
        if (!strncmp(stz_reader_meta_key(r, i), STZ_QUANT_META_PREFIX, strlen(STZ_QUANT_META_PREFIX)))
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
        cJSON_AddStringToObject(o, "packing", STZ_QUANT_INT4_PACKING);
    else if (pl->bits != 8)
        cJSON_AddStringToObject(o, "packing", STZ_QUANT_MSB_PACKING);
    char *s = cJSON_PrintUnformatted(o), key[1024];
    cJSON_Delete(o);
    if (!s)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory");
    snprintf(key, sizeof key, "%s%s", STZ_QUANT_META_PREFIX, t->name);
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
    for (size_t i = 0; !st && i < n; i += STZ_QUANT_BATCH_BYTES / 4) {
        size_t k = n - i < STZ_QUANT_BATCH_BYTES / 4 ? n - i : STZ_QUANT_BATCH_BYTES / 4;
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
    /* batches of at most STZ_QUANT_BATCH_BYTES, and a tensor in at least 16
     * when batches stay over 64 KB, so that threads share even the small
     * matrices (the same for any thread count: the figures merge alike) */
    uint64_t per = STZ_QUANT_BATCH_BYTES / esz / pl->cols, split = (pl->rows + 15) / 16,
             least = (64u << 10) / esz / pl->cols;
    split = split > least ? split : least;
    per = split < per ? split : per;
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

stz_status stz_quant_copy_tensor(stz_writer *w, const stz_reader *r, const stz_tensor *t, uint8_t *buf, stz_err *err)
{
    for (uint64_t off = 0; off < t->end - t->begin; off += STZ_QUANT_BATCH_BYTES) {
        size_t n = t->end - t->begin - off < STZ_QUANT_BATCH_BYTES ? (size_t)(t->end - t->begin - off) : STZ_QUANT_BATCH_BYTES;
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

/* The largest magnitude of a tensor, batch by batch on the slots' threads. */
typedef struct {
    const stz_reader *r;
    const stz_tensor *t;
    qslot *slot;
    size_t per; /* elements per batch */
    float *amax; /* per thread */
} amax_job;

static stz_status amax_work(void *ctx, int tid, size_t i, stz_err *err)
{
    amax_job *j = ctx;
    size_t esz = stz_dtype_bits(j->t->dtype) / 8, e = i * j->per;
    size_t n = j->t->numel - e < j->per ? (size_t)(j->t->numel - e) : j->per;
    float *f = j->slot[tid].f, m = j->amax[tid];
    stz_status st = stz_reader_read(j->r, j->t, e * esz, j->slot[tid].in, n * esz, err);
    if (!st && !(st = stz_to_f32(j->t->dtype, j->slot[tid].in, n, f, err)))
        for (size_t k = 0; k < n; k++)
            m = fabsf(f[k]) > m ? fabsf(f[k]) : m; /* NaN is reported by the main pass */
    j->amax[tid] = m;
    return st;
}

/* What the format needs from the whole tensor before any row is
 * quantized: U8 scales, its largest magnitude (the base); nl-fit, a
 * codebook fitted to up to 256 rows spread over it. */
static stz_status plan_prepare(const stz_reader *r, const stz_tensor *t, plan_t *x, qslot *slot, int threads,
                               stz_err *err)
{
    int fit = x->d.method == STZ_QMETHOD_NL_FIT;
    if (x->legacy || (x->d.scale_dtype != STZ_DTYPE_U8 && !fit))
        return STZ_OK;
    size_t esz = stz_dtype_bits(t->dtype) / 8, per = STZ_QUANT_BATCH_BYTES / esz;
    uint8_t *buf = slot[0].in;
    float amaxes[256] = {0}, amax = 0;
    amax_job j = {.r = r, .t = t, .slot = slot, .per = per, .amax = amaxes};
    stz_pipeline pl = {.n = (size_t)((t->numel + per - 1) / per), .threads = threads < 256 ? threads : 256,
                       .ctx = &j, .work = amax_work};
    stz_status st = stz_pipeline_run(&pl, err);
    for (int k = 0; k < pl.threads; k++)
        amax = amaxes[k] > amax ? amaxes[k] : amax;
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

/* stz_quantize_file, or with pp the container of its output (stz_compress_file). */
static stz_status quantize(const stz_quant_params *p, const stz_pack_params *pp, stz_policy *policy, const char *in,
                           const char *out, stz_quant_stats *stats, stz_pack_stats *pstats, stz_err *err)
{
    stz_reader *r = NULL;
    stz_writer *w = NULL;
    stz_pack_sink *sink = NULL;
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
    /* a batch: STZ_QUANT_BATCH_BYTES of input (>= 2-byte values), or one longer row */
    size_t batch_elems = STZ_QUANT_BATCH_BYTES / 2 > maxrow ? STZ_QUANT_BATCH_BYTES / 2 : maxrow;
    nslots = p->threads < 1 ? 1 : p->threads;
    if (!(slot = calloc((size_t)nslots, sizeof *slot))) {
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory");
        goto cleanup;
    }
    for (int k = 0; k < nslots; k++) {
        qslot *s = &slot[k];
        s->in = malloc(maxrow * 8 > STZ_QUANT_BATCH_BYTES ? maxrow * 8 : STZ_QUANT_BATCH_BYTES);
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
        if ((st = plan_prepare(r, t, x, slot, nslots, err)))
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
    if (pp ? (st = stz_pack_sink_open(&sink, pp, out, err)) ||
                 (st = stz_writer_open_sink(&w, out, stz_pack_sink_wsink(sink), err))
           : (st = stz_writer_open(&w, out, p->write_flags, err)))
        goto cleanup;
    if ((st = stz_writer_set_meta(w, "stz.quant.version", STZ_QUANT_VERSION, err)))
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
            if (!(st = stz_writer_add(w, t->name, stz_quant_values_dtype(x->bits, x->d.method), nd, shape, err)) &&
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
                          : stz_quant_copy_tensor(w, r, t, buf, err);
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
    stz_pack_stats ps = {0};
    if (sink)
        stz_pack_sink_stats(sink, &ps);
    if (pstats)
        *pstats = ps;
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
        stats->out_bytes = sink ? ps.in_bytes : stat(out, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    }
cleanup:
    stz_writer_free(w);
    stz_pack_sink_free(sink);
    for (size_t i = 0; pl && i < nt; i++)
        plan_free(&pl[i]);
    free(pl);
    for (int k = 0; slot && k < nslots; k++)
        free(slot[k].in), free(slot[k].f), free(slot[k].q), free(slot[k].y);
    free(slot);
    stz_reader_free(r);
    return st;
}


stz_status stz_quantize_file(const stz_quant_params *p, stz_policy *policy, const char *in, const char *out,
                             stz_quant_stats *stats, stz_err *err)
{
    return quantize(p, NULL, policy, in, out, stats, NULL, err);
}

stz_status stz_compress_file(const stz_quant_params *qp, const stz_pack_params *pp, stz_policy *policy,
                             const char *in, const char *out, stz_quant_stats *qstats, stz_pack_stats *pstats,
                             stz_err *err)
{
    return quantize(qp, pp, policy, in, out, qstats, pstats, err);
}
