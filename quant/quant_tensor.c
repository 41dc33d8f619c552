/* A whole tensor quantized in memory, exactly as stz_quantize_file stores
 * it (values, scales, minimums), with its squared error: what stz tune
 * measures each candidate by. */
#include "quant_tensor.h"
#include "stz_kernels.h"
#include "ggml_types.h"
#include "stz_svd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const action_names[STZ_ACTION_GGML] = {"keep", "int8", "int4", "svd",
                                                          "int2", "int3", "int5", "int6"};

/* A ggml action's traits (a type stz writes), else NULL. */
static const stz_ggml_traits *ggml_of(stz_action a, int type)
{
    const stz_ggml_traits *t = a == STZ_ACTION_GGML ? stz_ggml_traits_of(type) : NULL;
    return t && t->policy ? t : NULL;
}

const char *stz_action_name(stz_action a, int type)
{
    const stz_ggml_traits *t = ggml_of(a, type);
    return t ? t->name : (unsigned)a < STZ_ACTION_GGML ? action_names[a] : "?";
}

const char *stz_action_nth(size_t i, stz_action *a, int *type)
{
    const stz_ggml_traits *t = i < STZ_ACTION_GGML ? NULL : stz_ggml_traits_of_policy((int)(i - STZ_ACTION_GGML + 1));
    if (i >= STZ_ACTION_GGML && !t)
        return NULL;
    *a = t ? STZ_ACTION_GGML : (stz_action)i;
    *type = t ? t->type : -1;
    return stz_action_name(*a, *type);
}

int stz_action_parse(const char *name, stz_action *a, int *type)
{
    const char *n;
    for (size_t i = 0; name && (n = stz_action_nth(i, a, type)); i++)
        if (!strcmp(name, n))
            return 0;
    *a = STZ_ACTION_COUNT, *type = -1;
    return -1;
}

int stz_action_is_block(stz_action a, int type)
{
    return stz_action_bits(a, type) && !(a == STZ_ACTION_GGML && (type == STZ_GGML_F16 || type == STZ_GGML_BF16));
}

int stz_action_bits(stz_action a, int type)
{
    static const int bits[STZ_ACTION_GGML] = {0, 8, 4, 0, 2, 3, 5, 6};
    const stz_ggml_traits *t = ggml_of(a, type);
    return t ? t->bits : (unsigned)a < STZ_ACTION_GGML ? bits[a] : 0;
}

static const char *const method_names[STZ_QMETHOD_COUNT] = {"absmax", "mse", "full", "asym", "nl", "nl-fit", "trellis"};
const char *stz_qmethod_name(stz_qmethod m) { return (unsigned)m < STZ_QMETHOD_COUNT ? method_names[m] : "?"; }

size_t stz_quant_first_nonfinite(const float *x, size_t n)
{
    size_t i = 0;
    for (; i + 64 <= n; i += 64) { /* skips finite pieces in a form that vectorises */
        uint32_t u[64], any = 0;
        memcpy(u, x + i, sizeof u);
        for (int j = 0; j < 64; j++)
            any |= (u[j] & 0x7f800000u) == 0x7f800000u;
        if (any)
            break;
    }
    while (i < n && isfinite(x[i]))
        i++;
    return i;
}

size_t stz_qf_bytes(const stz_qformat *f, size_t n)
{
    return f->ggml ? (size_t)stz_ggml_row_bytes(f->ggml->type, n) : stz_qf_row_bytes(f->bits, n);
}

void stz_qf_of_decision(const stz_decision *d, stz_qformat *f)
{
    int bits = d->action == STZ_ACTION_SVD ? 8 : stz_action_bits(d->action, d->ggml_type);
    memset(f, 0, sizeof *f);
    f->bits = bits, f->method = d->method == STZ_QMETHOD_NL_FIT ? STZ_QMETHOD_NL : d->method;
    f->block = d->block_size, f->scale_dtype = d->scale_dtype;
    if (f->method == STZ_QMETHOD_NL && bits)
        stz_qf_default_levels(bits, f->levels), stz_qf_prepare(f);
    f->first_kernels = (bits == 8 || bits == 4) && (d->method == STZ_QMETHOD_ABSMAX || d->method == STZ_QMETHOD_MSE) &&
                       d->scale_dtype != STZ_DTYPE_U8;
    int t = stz_decision_ggml_type(d);
    if (t >= 0) { /* the type's own blocks: no stz scales or method */
        f->ggml = stz_ggml_traits_of(t);
        f->method = STZ_QMETHOD_ABSMAX, f->block = f->ggml->block, f->scale_dtype = STZ_DTYPE_F16, f->first_kernels = 0;
    }
}

int stz_qf_quantize_any(const stz_qformat *f, const float *x, size_t n, uint8_t *q, float *scales, float *mins)
{
    if (!f->first_kernels || (f->weights && f->method == STZ_QMETHOD_MSE)) /* absmax's scale ignores weights */
        return stz_qf_quantize_row(f, x, n, q, scales, mins);
    return f->bits == 8 ? stz_q8_quantize_ref(x, n, f->block, f->method, f->scale_dtype, (int8_t *)q, scales)
                        : stz_q4_quantize_ref(x, n, f->block, f->method, f->scale_dtype, q, scales);
}

stz_status stz_qf_fit_tensor(stz_qformat *f, const float *x, uint64_t rows, uint64_t cols, stz_err *err)
{
    size_t nr = stz_qf_fit_rows(rows), fc = stz_qf_fit_cols(cols);
    float *smp = malloc(nr * fc * sizeof *smp + 1);
    if (!smp)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the sample of rows");
    for (size_t k = 0; k < nr; k++)
        memcpy(smp + k * fc, x + k * (rows / nr) * cols, fc * sizeof *smp);
    if (nr)
        stz_qf_fit_levels(f, smp, nr, fc);
    free(smp);
    return STZ_OK;
}

void stz_qf_store_scales(const stz_qformat *f, const float *v, size_t n, uint8_t *dst)
{
    stz_err ignored; /* F16 and F32 always convert */
    if (f->scale_dtype == STZ_DTYPE_U8)
        for (size_t j = 0; j < n; j++)
            dst[j] = stz_qf_scale_code(f->scale_base, v[j]);
    else
        stz_from_f32(f->scale_dtype, v, n, dst, &ignored);
}

void stz_svd_q8(const stz_svd_result *f, int8_t *Uq, float *Us, int8_t *Sq, float *s_scale, int8_t *Vq, float *Vs)
{
    size_t m = f->m, n = f->n, rk = f->rank;
    for (size_t i = 0; i < m; i++)
        stz_q8_quantize_ref(f->U + i * rk, rk, rk, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F32, Uq + i * rk, Us + i);
    for (size_t i = 0; i < rk; i++)
        stz_q8_quantize_ref(f->Vh + i * n, n, n, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F32, Vq + i * n, Vs + i);
    stz_q8_quantize_ref(f->S, rk, rk, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F32, Sq, s_scale);
}

stz_status stz_svd_q8_rebuild(const int8_t *Uq, const float *Us, const int8_t *Sq, float s_scale, const int8_t *Vq,
                              const float *Vs, size_t m, size_t n, size_t k, float *W, stz_err *err)
{
    float *U = malloc(m * k * sizeof *U + 1), *S = malloc(k * sizeof *S + 1), *V = malloc(k * n * sizeof *V + 1);
    stz_status st = U && S && V ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for the SVD factors");
    if (!st) {
        for (size_t i = 0; i < m; i++)
            stz_q8_dequantize_ref(Uq + i * k, Us + i, k, k, U + i * k);
        for (size_t i = 0; i < k; i++)
            stz_q8_dequantize_ref(Vq + i * n, Vs + i, n, n, V + i * n);
        stz_q8_dequantize_ref(Sq, &s_scale, k, k, S);
        if (stz_svd_reconstruct(U, S, V, m, n, k, W))
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the rebuilt matrix");
    }
    free(U), free(S), free(V);
    return st;
}

/* svd: INT8 factors at the decision's rank (U, U.scales, S, Vh, Vh.scales). */
stz_svd_params stz_svd_params_of(const stz_decision *d)
{
    stz_svd_params sp = STZ_SVD_PARAMS_DEFAULT; /* one OpenBLAS thread */
    sp.method = d->svd_randomized ? STZ_SVD_RANDOMIZED : STZ_SVD_EXACT;
    sp.rank = d->svd_rank, sp.energy = d->svd_energy, sp.max_error = d->svd_max_error;
    sp.power_iters = (int)d->svd_power_iters, sp.oversample = d->svd_oversample;
    return sp;
}

/* The sums of a cosine between x and y: x.y, x.x, y.y. */
typedef struct {
    double xy, xx, yy;
} cos_sums;

/* Adds rows of cols values x and their reconstruction y to the squared
 * error and norm, each column weighted by w[j] when given, and to c. */
static void add_error(stz_qmem *out, cos_sums *c, const float *x, const float *y, const float *w, size_t rows,
                      size_t cols)
{
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < cols; j++) {
            double v = x[r * cols + j], u = y[r * cols + j], e = v - u, wj = w ? w[j] : 1.0;
            out->err2 += wj * e * e, out->norm2 += wj * v * v;
            c->xy += v * u, c->xx += v * v, c->yy += u * u;
        }
}

static double cosine_of(const cos_sums *c)
{
    return c->xx > 0 && c->yy > 0 ? c->xy / sqrt(c->xx * c->yy) : c->xx == c->yy;
}

stz_status stz_svd_tensor(const stz_decision *d, const float *x, const float *w, size_t m, size_t n, stz_qmem *out,
                          float *y, stz_err *err)
{
    stz_svd_params sp = stz_svd_params_of(d);
    stz_svd_result f = {0};
    stz_status st = stz_svd_factor(x, m, n, &sp, &f, err);
    if (st)
        return st;
    size_t rk = f.rank;
    static const stz_dtype dt[STZ_PART_COUNT] = {STZ_DTYPE_I8, STZ_DTYPE_F32, STZ_DTYPE_I8, STZ_DTYPE_I8,
                                                 STZ_DTYPE_F32};
    const size_t len[STZ_PART_COUNT] = {[STZ_PART_U] = m * rk,
                                        [STZ_PART_U_SCALES] = 4 * m,
                                        [STZ_PART_S] = rk,
                                        [STZ_PART_VH] = rk * n,
                                        [STZ_PART_VH_SCALES] = 4 * rk};
    float *Us = malloc(m * sizeof *Us), *Vs = malloc(rk * sizeof *Vs), *W = y ? y : malloc(m * n * sizeof *W), s_scale;
    int got = 1;
    for (int k = 0; k < STZ_PART_COUNT; k++)
        got &= !!(out->part[k] = malloc(len[k] + 1)), out->len[k] = len[k], out->dtype[k] = dt[k];
    if (!Us || !Vs || !W || !got)
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the SVD factors");
    if (!st) {
        int8_t *Uq = (int8_t *)out->part[STZ_PART_U], *Sq = (int8_t *)out->part[STZ_PART_S];
        int8_t *Vq = (int8_t *)out->part[STZ_PART_VH];
        stz_svd_q8(&f, Uq, Us, Sq, &s_scale, Vq, Vs);
        stz_from_f32(STZ_DTYPE_F32, Us, m, out->part[STZ_PART_U_SCALES], err);
        stz_from_f32(STZ_DTYPE_F32, Vs, rk, out->part[STZ_PART_VH_SCALES], err);
        st = stz_svd_q8_rebuild(Uq, Us, Sq, s_scale, Vq, Vs, m, n, rk, W, err);
    }
    cos_sums c = {0};
    if (!st)
        add_error(out, &c, x, W, w, m, n);
    out->cosine = cosine_of(&c);
    out->rank = rk;
    stz_svd_result_free(&f);
    free(Us), free(Vs);
    if (W != y)
        free(W);
    return st;
}

void stz_qmem_free(stz_qmem *q)
{
    for (int k = 0; k < STZ_PART_COUNT; k++)
        free(q->part[k]);
    memset(q, 0, sizeof *q);
}

stz_status stz_qtensor_begin(const stz_decision *d, const float *x, const float *weights, uint64_t rows, uint64_t cols,
                             stz_qmem *out, float **sc, float **mn, stz_err *err)
{
    memset(out, 0, sizeof *out);
    *sc = *mn = NULL;
    stz_qformat *f = &out->fmt;
    if (!stz_action_bits(d->action, d->ggml_type))
        return stz_err_set(err, STZ_E_ARG, "stz_quantize_tensor: '%s' is not a block quantization",
                           stz_action_name(d->action, d->ggml_type));
    stz_qf_of_decision(d, f);
    f->weights = weights;
    if (f->ggml && cols % f->block && f->block != STZ_GGML_QK) /* 32-blocks: the last one padded */
        return stz_err_set(err, STZ_E_ARG,
                           "rows of %llu are not whole blocks of %s (%u): use the type "
                           "stz_ggml_fallback gives",
                           (unsigned long long)cols, f->ggml->name, f->block);
    if (f->method == STZ_QMETHOD_TRELLIS && !stz_trellis_fits(f->bits, rows))
        return stz_err_set(err, STZ_E_ARG,
                           "method \"trellis\" takes int2..int4 matrices of at least %d rows, not "
                           "%d bits and %llu rows",
                           STZ_TRELLIS_L / (f->bits >= 2 ? f->bits : 2), f->bits, (unsigned long long)rows);
    uint64_t n = rows * cols, ns = rows * stz_q_blocks(cols, f->block);
    size_t bad = stz_quant_first_nonfinite(x, (size_t)n);
    if (bad < n)
        return stz_err_set(err, STZ_E_NUMERIC, "element %llu is %s; quantization needs finite values",
                           (unsigned long long)bad, isnan(x[bad]) ? "NaN" : "infinite");
    float amax = 0;
    for (uint64_t i = 0; i < n; i++)
        amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    f->scale_base = amax > 0 ? amax : 1.0f;
    stz_status st = d->method == STZ_QMETHOD_NL_FIT ? stz_qf_fit_tensor(f, x, rows, cols, err) : STZ_OK;
    if (st)
        return st;
    int asym = d->method == STZ_QMETHOD_ASYM;
    out->dtype[STZ_PART_VALUES] = f->ggml ? STZ_DTYPE_U8 : stz_quant_values_dtype(f->bits, f->method);
    out->dtype[STZ_PART_SCALES] = out->dtype[STZ_PART_MINS] = d->scale_dtype;
    out->len[STZ_PART_VALUES] = (size_t)rows * stz_qf_bytes(f, (size_t)cols);
    out->part[STZ_PART_VALUES] = malloc(out->len[STZ_PART_VALUES] + 1);
    *sc = malloc(ns * sizeof **sc + 1), *mn = asym ? malloc(ns * sizeof **mn + 1) : NULL;
    if (!*sc || (asym && !*mn) || !out->part[STZ_PART_VALUES])
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the codes and scales");
    return STZ_OK;
}

stz_status stz_qtensor_end(const float *x, uint64_t rows, uint64_t cols, stz_qmem *out, float *sc, float *mn,
                           float *all, stz_err *err)
{
    const stz_qformat *f = &out->fmt;
    uint64_t nb = stz_q_blocks(cols, f->block), ns = rows * nb;
    size_t rb = stz_qf_bytes(f, (size_t)cols), ssz = stz_dtype_bits(out->dtype[STZ_PART_SCALES]) / 8;
    int tr = f->method == STZ_QMETHOD_TRELLIS; /* read a segment at a time */
    float *y = all ? NULL : malloc((tr ? 2 * STZ_TRELLIS_ROWS : 1) * cols * sizeof *y + 1);
    stz_status st = y || all ? STZ_OK : stz_err_set(err, STZ_E_NOMEM, "out of memory for a row");
    cos_sums c = {0};
    for (uint64_t r = 0, a, b; !st && r < rows; r = b) { /* the error as the reader will see it */
        float *yr = all ? all + r * cols : y;
        b = r + 1;
        if (tr)
            stz_trellis_segment(rows, r, &a, &b);
        if (!tr)
            stz_qf_dequantize_row(f, out->part[STZ_PART_VALUES] + r * rb, sc + r * nb, mn ? mn + r * nb : NULL,
                                  (size_t)cols, yr);
        else if (stz_trellis_dequantize_rows(f, out->part[STZ_PART_VALUES], 0, rows, r, (size_t)(b - r), sc + r * nb,
                                             (size_t)cols, yr))
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for a segment's rows");
        add_error(out, &c, x + r * cols, yr, f->weights, (size_t)(b - r), (size_t)cols);
    }
    out->cosine = cosine_of(&c);
    for (int k = STZ_PART_SCALES; !st && ns > 1 && !f->ggml && k <= (mn ? STZ_PART_MINS : STZ_PART_SCALES);
         k++) { /* one block: its scale is in the metadata */
        out->len[k] = (size_t)ns * ssz;
        if (!(out->part[k] = malloc(out->len[k] + 1)))
            st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the scales");
        else
            stz_qf_store_scales(f, k == STZ_PART_SCALES ? sc : mn, (size_t)ns, out->part[k]);
    }
    free(y);
    return st;
}

const char *stz_qtensor_overflow(const stz_qformat *f)
{
    return f->ggml ? "a block scale (or value) exceeds the F16 range"
                   : "a block scale exceeds the F16 range; use \"scale_dtype\": \"F32\"";
}
