/* The quantizing writer's per-tensor plan: the kernel format of a
 * decision, its bytes, what it needs from the whole tensor before any row
 * is quantized, and its metadata entry (plan.h); shared by quantize.c and
 * svd_factors.c, which call each other through nothing else. */
#include "plan.h"
#include "stz_kernels.h"
#include "quant/ggml_types.h"
#include "stz_svd.h"

#include <cjson/cJSON.h>
#include <stdio.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

void stz_quant_plan_format(stz_quant_plan *x)
{
    x->bits = x->d.action == STZ_ACTION_SVD ? 8 : stz_action_bits(x->d.action, x->d.ggml_type); /* svd: INT8 factors */
    stz_qf_of_decision(&x->d, &x->fmt);
}

/* The largest magnitude of a tensor, and whether it holds NaN or Inf,
 * batch by batch on the slots' threads. */
typedef struct {
    const stz_reader *r;
    const stz_tensor *t;
    qslot *slot;
    size_t per;  /* elements per batch */
    float *amax; /* per thread */
    int *bad;    /* per thread: a NaN or Inf seen (F32 and F64: looked for only if want_bad) */
    int want_bad;
} amax_job;

/* BF16 and F16: the largest magnitude straight from the bits (their order
 * is the values' order, infinity's pattern the largest but NaN's), then
 * converted: the same float as converting every value first. */
static float amax16(const uint8_t *b, size_t n, uint16_t inf, int *bad)
{
    typedef int16_t v8s __attribute__((vector_size(16))); /* magnitudes fit: signed compares, SSE2's */
    v8s vm = {0}, vt = {0};
    size_t k = 0;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ /* eight at a time (the compiler leaves the scalar loop alone) */
    for (; k + 8 <= n; k += 8) {
        v8s u, v, gt;
        memcpy(&u, b + 2 * k, sizeof u);
        u &= 0x7fff, v = u & (v8s)(u <= (int16_t)inf); /* NaN counts as 0 */
        gt = (v8s)(v > vm), vm = (vm & ~gt) | (v & gt);
        gt = (v8s)(u > vt), vt = (vt & ~gt) | (u & gt);
    }
#endif
    int16_t m = 0, top = 0;
    for (int j = 0; j < 8; j++)
        m = vm[j] > m ? vm[j] : m, top = vt[j] > top ? vt[j] : top;
    for (; k < n; k++) {
        int16_t u = (int16_t)(stz_le16(b + 2 * k) & 0x7fff);
        m = u <= inf && u > m ? u : m, top = u > top ? u : top;
    }
    *bad |= top >= inf;
    return inf == 0x7f80 ? stz_bf16_to_f32((uint16_t)m) : stz_f16_to_f32((uint16_t)m);
}

static stz_status amax_work(void *ctx, int tid, size_t i, stz_err *err)
{
    amax_job *j = ctx;
    stz_dtype dt = j->t->dtype;
    size_t esz = stz_dtype_bits(dt) / 8, e = i * j->per;
    size_t n = j->t->numel - e < j->per ? (size_t)(j->t->numel - e) : j->per;
    float *f = j->slot[tid].f, m = j->amax[tid], v;
    stz_status st = stz_reader_read(j->r, j->t, e * esz, j->slot[tid].in, n * esz, err);
    if (!st && (dt == STZ_DTYPE_BF16 || dt == STZ_DTYPE_F16)) {
        v = amax16(j->slot[tid].in, n, dt == STZ_DTYPE_BF16 ? 0x7f80 : 0x7c00, &j->bad[tid]);
        m = v > m ? v : m;
    } else if (!st && !(st = stz_to_f32(dt, j->slot[tid].in, n, f, err))) {
        for (size_t k = 0; k < n; k++)
            m = fabsf(f[k]) > m ? fabsf(f[k]) : m; /* not NaN: fabsf(NaN) > m is false */
        j->bad[tid] |= j->want_bad && stz_quant_first_nonfinite(f, n) < n;
    }
    j->amax[tid] = m;
    return st;
}

void stz_quant_plan_keep_nonfinite(stz_quant_plan *x)
{
    x->svd = 0, x->bits = 0, x->d.action = STZ_ACTION_KEEP, x->d.reason = "holds NaN/Inf (kept by the policy)";
}

stz_status stz_quant_plan_prepare(const stz_reader *r, const stz_tensor *t, stz_quant_plan *x, qslot *slot, int threads,
                                  stz_err *err)
{
    int fit = x->d.method == STZ_QMETHOD_NL_FIT, keep = x->d.nonfinite == STZ_NONFINITE_KEEP, bad = 0;
    if (!keep && (x->fmt.first_kernels || (x->d.scale_dtype != STZ_DTYPE_U8 && !fit)))
        return STZ_OK;
    size_t esz = stz_dtype_bits(t->dtype) / 8, per = STZ_QUANT_BATCH_BYTES / esz;
    uint8_t *buf = slot[0].in;
    float amaxes[256] = {0}, amax = 0;
    int bads[256] = {0};
    amax_job j = {.r = r, .t = t, .slot = slot, .per = per, .amax = amaxes, .bad = bads, .want_bad = keep};
    stz_ordered pl = {.n = (size_t)((t->numel + per - 1) / per),
                      .threads = threads < 256 ? threads : 256,
                      .ctx = &j,
                      .work = amax_work};
    stz_status st = stz_ordered_run(&pl, err);
    for (int k = 0; k < pl.threads; k++)
        amax = amaxes[k] > amax ? amaxes[k] : amax, bad |= bads[k];
    x->fmt.scale_base = amax > 0 && isfinite(amax) ? amax : 1.0f;
    if (!st && keep && bad) { /* the policy keeps such a tensor as it is */
        stz_quant_plan_keep_nonfinite(x);
        return st;
    }
    if (st || !fit)
        return st;
    size_t cols = stz_qf_fit_cols(x->cols), nr = stz_qf_fit_rows(x->rows);
    float *smp = malloc(nr * cols * sizeof *smp + 1), *row_f = malloc(x->cols * sizeof *row_f + 1);
    st = smp && row_f ? stz_quant_plan_hold(r, t, x, err)
                      : stz_err_set(err, STZ_E_NOMEM, "out of memory for the sample of rows");
    for (size_t k = 0; !st && k < nr; k++) /* the first cols of rows spread over the tensor */
        if (!(st = stz_quant_plan_rows(r, t, x, k * (x->rows / nr), 1, buf, row_f, err)))
            memcpy(smp + k * cols, row_f, cols * sizeof *smp);
    if (!st && stz_quant_first_nonfinite(smp, nr * cols) == nr * cols)
        stz_qf_fit_levels(&x->fmt, smp, nr, cols);
    stz_quant_plan_release(x);
    free(smp), free(row_f);
    return st;
}

stz_status stz_quant_plan_hold(const stz_reader *r, const stz_tensor *t, stz_quant_plan *x, stz_err *err)
{
    if (!x->transposed || x->held)
        return STZ_OK;
    size_t R = (size_t)x->cols, C = (size_t)x->rows, esz = stz_dtype_bits(t->dtype) / 8; /* as stored: R x C */
    size_t per = STZ_QUANT_BATCH_BYTES / esz / C ? STZ_QUANT_BATCH_BYTES / esz / C : 1;
    float *f = malloc(R * C * sizeof *f + 1);
    uint8_t *in = malloc(per * C * esz + 1);
    x->held = malloc(R * C * sizeof *x->held + 1);
    stz_status st =
        f && in && x->held
            ? STZ_OK
            : stz_err_set(err, STZ_E_NOMEM, "out of memory transposing tensor '%s' (%zu x %zu)", t->name, R, C);
    for (size_t r0 = 0; !st && r0 < R; r0 += per) {
        size_t k = R - r0 < per ? R - r0 : per;
        if (!(st = stz_reader_read(r, t, r0 * C * esz, in, k * C * esz, err)))
            st = stz_to_f32(t->dtype, in, k * C, f + r0 * C, err);
    }
    if (!st)
        stz_transpose(x->held, f, R, C);
    free(f), free(in);
    if (st)
        stz_quant_plan_release(x);
    return st;
}

void stz_quant_plan_release(stz_quant_plan *x)
{
    free(x->held);
    x->held = NULL;
}

stz_status stz_quant_plan_rows(const stz_reader *r, const stz_tensor *t, const stz_quant_plan *x, uint64_t row,
                               size_t nr, uint8_t *buf, float *f, stz_err *err)
{
    size_t n = nr * (size_t)x->cols, esz = stz_dtype_bits(t->dtype) / 8;
    if (x->held) {
        memcpy(f, x->held + row * x->cols, n * sizeof *f);
        return STZ_OK;
    }
    stz_status st = stz_reader_read(r, t, row * x->cols * esz, buf, n * esz, err);
    return st ? st : stz_to_f32(t->dtype, buf, n, f, err);
}

void stz_quant_plan_free(stz_quant_plan *x)
{
    stz_quant_plan_release(x);
    free(x->scales_name);
    free(x->mins_name);
    free(x->Uq), free(x->Us), free(x->Sq), free(x->Vq), free(x->Vs);
    for (int j = 0; j < 5; j++)
        free(x->fname[j]);
}

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
    int bits = stz_action_bits(d->action, d->ggml_type), type = stz_decision_ggml_type(d);
    if (!bits)
        return t->end - t->begin;
    uint64_t cols = t->ndim >= 2 ? t->shape[t->ndim - 1] : t->numel, rows = cols ? t->numel / cols : 0;
    if (type >= 0) /* the type's blocks, scales inside */
        return rows * stz_ggml_row_bytes(stz_ggml_fit(type, cols, d->pad), cols);
    uint64_t blocks = rows * stz_q_blocks(cols, d->block_size), per = stz_dtype_bits(d->scale_dtype) / 8;
    per *= d->method == STZ_QMETHOD_ASYM ? 2 : 1; /* scale and minimum */
    return rows * stz_qf_row_bytes(bits, cols) + (blocks > 1 ? blocks * per : 0);
}

stz_status stz_quant_put_meta(stz_writer *w, const stz_tensor *t, struct cJSON *o, const char *what, stz_err *err)
{
    char *s = cJSON_PrintUnformatted(o), key[1024];
    cJSON_Delete(o);
    if (!s || stz_json_failed()) {
        free(s);
        return stz_err_set(err, STZ_E_NOMEM, "tensor '%s': out of memory for its %s metadata", t->name, what);
    }
    snprintf(key, sizeof key, "%s%s", STZ_QUANT_META_PREFIX, t->name);
    stz_status st = stz_writer_set_meta(w, key, s, err);
    free(s);
    return st;
}
