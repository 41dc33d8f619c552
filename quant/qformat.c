/* Block quantization of any width (2..8 bits) and method: uniform
 * symmetric (absmax, full, mse), asymmetric scale + min (asym), and a
 * non-uniform codebook (nl); scales as F16, F32 or 8-bit log codes.
 * The scalar reference; see stz_quant.h for the definitions. */
#include "core/stz_core.h"
#include "stz_kernels.h"
#include "stz_quant.h"
#include "ggml_types.h"
#include "quant_tensor.h"
#include "quant_vec.h"

#include <math.h>
#include <string.h>

/* ---- 8-bit log-coded scales: a sign bit and m in 1..127, s = +-base * 2^((m - 120) / 8) ---- */

/* 2^(k/8) rounded to float, k = 0..7: the reader's table too (FORMAT.md). */
static const float frac8[8] = {1.0f,        1.09050773f, 1.18920712f, 1.29683955f,
                               1.41421356f, 1.54221083f, 1.68179283f, 1.83400809f};

static inline float scale_value(float base, uint8_t c)
{
    int m = c & 0x7f;
    uint32_t p2 = (uint32_t)(127 + (m >> 3) - 15) << 23; /* 2^((m >> 3) - 15): ldexpf, without the call */
    float two, v;
    memcpy(&two, &p2, sizeof two);
    v = m ? base * frac8[m & 7] * two : 0.0f;
    return c & 0x80 ? -v : v;
}

float stz_qf_scale_value(float base, uint8_t c) { return scale_value(base, c); }

/* 2^((k + 0.5) / 8), k = 0..7: the rounding points between codes. */
static const float half8[8] = {1.04427378f, 1.13878863f, 1.24185781f, 1.35425555f,
                               1.47682615f, 1.61049033f, 1.75625216f, 1.91520656f};

/* The code whose value is nearest s in log scale; 0 for s == 0. */
static uint8_t scale_code(float base, float s)
{
    if (s == 0 || !(base > 0))
        return 0;
    int e;
    float r = fabsf(s) / base, m;
    uint32_t u;
    memcpy(&u, &r, sizeof u);
    if (u >> 23 && u >> 23 < 255) { /* normal: frexpf from the bits */
        e = (int)(u >> 23) - 126, u = (u & 0x7fffff) | 127u << 23;
        memcpy(&m, &u, sizeof m);
    } else {
        m = 2 * frexpf(r, &e);
    } /* |s| / base = m * 2^(e - 1), m in [1, 2) */
    int k = 0;
    for (int j = 0; j < 8; j++) /* no branches: k is not predictable */
        k += m >= half8[j];
    int c = 120 + 8 * (e - 1) + k;
    c = c < 1 ? 1 : c > 127 ? 127 : c;
    return (uint8_t)(c | (s < 0 ? 0x80 : 0));
}

uint8_t stz_qf_scale_code(float base, float s) { return scale_code(base, s); }

/* The stored scale nearest s, same sign; NAN if F16 cannot hold it. */
static float store_scale(const stz_qformat *f, float s)
{
    if (f->scale_dtype == STZ_DTYPE_F32)
        return s;
    if (f->scale_dtype == STZ_DTYPE_F16) {
        float r = stz_f16_to_f32(stz_f32_to_f16(s));
        return isinf(r) ? NAN : r;
    }
    return scale_value(f->scale_base, scale_code(f->scale_base, s));
}

float stz_qf_store_scale(const stz_qformat *f, float s) { return store_scale(f, s); }

/* The nearest stored scale at or above |s| in magnitude, same sign. */
static float store_scale_up(const stz_qformat *f, float s)
{
    float r = store_scale(f, s);
    if (!(fabsf(r) < fabsf(s)))
        return r;
    if (f->scale_dtype == STZ_DTYPE_F16) {
        uint16_t h = stz_f32_to_f16(s);
        r = stz_f16_to_f32((uint16_t)(h + 1));
        return isinf(r) ? NAN : r;
    }
    uint8_t c = scale_code(f->scale_base, s);
    return scale_value(f->scale_base, (c & 0x7f) < 127 ? (uint8_t)(c + 1) : c);
}

/* ---- codes ------------------------------------------------------------------ */

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The code range of the uniform methods. */
static void uniform_range(const stz_qformat *f, int *lo, int *hi)
{
    int q = 1 << (f->bits - 1);
    *lo = f->method == STZ_QMETHOD_ABSMAX ? -(q - 1) : -q, *hi = q - 1;
}

/* Round half away from zero; a form the compiler vectorises. */
static inline float rndf(float v) { return (float)(int)(v + (v < 0 ? -0.5f : 0.5f)); }

/* nl: the code of t = x / s is the number of midpoints between
 * neighbouring levels below t (so the nearest level, the upper one on a
 * tie): a branch-free binary search over the midpoints (f->mid, +inf past
 * the last). Past 16 levels, when no bin of a table over t holds two
 * midpoints, the table's count below the bin and one comparison. */
#define LUT_BINS  1024
#define LUT_RANGE 1.25f

static inline int nl_bin(float t)
{
    float u = (t + LUT_RANGE) * (LUT_BINS / (2 * LUT_RANGE));
    return (int)(u < 0 ? 0 : u > LUT_BINS - 1 ? LUT_BINS - 1 : u);
}

void stz_qf_prepare(stz_qformat *f)
{
    int k = 1 << f->bits, j = 0;
    for (int i = 0; f->method == STZ_QMETHOD_NL && i < 64; i++)
        f->mid[i] = i + 1 < k ? (f->levels[i] + f->levels[i + 1]) * 0.5f : INFINITY;
    f->lut_exact = f->method == STZ_QMETHOD_NL && k > 16;
    for (int i = 0; f->lut_exact && i < LUT_BINS; i++) { /* bin() is monotone: t > every mid of a lower bin */
        f->lut[i] = (uint8_t)j;
        while (j + 1 < k && nl_bin(f->mid[j]) == i)
            j++;
        f->lut_exact = j - f->lut[i] <= 1;
    }
}

static inline int nl_code(const stz_qformat *f, float t)
{
    int q = 0;
    if (f->lut_exact) {
        q = f->lut[nl_bin(t)];
        return q + (t > f->mid[q]);
    }
    for (int step = 1 << (f->bits - 1); step; step >>= 1)
        q += t > f->mid[q + step - 1] ? step : 0;
    return q;
}

/* Code of t = x / s: the value (uniform) or the level's index (nl). */
static inline int code_of(const stz_qformat *f, int lo, int hi, float t)
{
    return f->method == STZ_QMETHOD_NL ? nl_code(f, t) : clampi((int)rndf(t), lo, hi);
}

/* Squared error of x[n] coded at scale s, and the sums for the
 * least-squares scale of that assignment (sxl = sum x l, sll = sum l^2).
 * Eight lanes (GCC's vector extensions: AVX-512 or AVX2 where the machine
 * has it, the same arithmetic in the same order without), then the rest one
 * by one in lane 0; a block is short enough for float sums. */
#ifndef STZ_QF_CLONES /* tests/test_qformat.c builds this file once more without them */
#define STZ_QF_CLONES STZ_CLONES("arch=x86-64-v4", "avx2", "default")
#endif

STZ_QF_CLONES static double assign(const stz_qformat *f, int lo, int hi, const float *x, size_t n, float s, double *sxl,
                                   double *sll, uint8_t *codes)
{
    float inv = s != 0 ? 1.0f / s : 0.0f, flo = (float)lo, fhi = (float)hi;
    v8f e = {0}, a = {0}, b = {0}, m0, m1, l0, l1;
    size_t i = 0;
    if (f->method == STZ_QMETHOD_NL && f->bits <= 4) { /* nl_code, eight at a time */
        memcpy(&m0, f->mid, sizeof m0), memcpy(&m1, f->mid + 8, sizeof m1);
        memcpy(&l0, f->levels, sizeof l0), memcpy(&l1, f->levels + 8, sizeof l1);
        for (; i + 8 <= n; i += 8) {
            v8f xv, t, l, d;
            memcpy(&xv, x + i, sizeof xv);
            t = xv * inv;
            v8i q = (t > f->mid[7]) & 8;
            q += (t > pick2(m0, m1, q + 3)) & 4;
            q += (t > pick2(m0, m1, q + 1)) & 2;
            q += (t > pick2(m0, m1, q)) & 1;
            l = pick2(l0, l1, q), d = xv - l * s;
            e += d * d, a += xv * l, b += l * l;
            if (codes)
                low_bytes(q, codes + i);
        }
    } else if (f->method != STZ_QMETHOD_NL && !codes) {
        float ue[8] = {0}, ua[8] = {0}, ub[8] = {0};
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++) {
                float l = rndf(x[i + j] * inv);
                l = l < flo ? flo : l > fhi ? fhi : l;
                float d = x[i + j] - l * s;
                ue[j] += d * d, ua[j] += x[i + j] * l, ub[j] += l * l;
            }
        for (int j = 0; j < 8; j++)
            e[j] = ue[j], a[j] = ua[j], b[j] = ub[j];
    }
    for (; i < n; i++) {
        int q = code_of(f, lo, hi, x[i] * inv);
        float l = f->method == STZ_QMETHOD_NL ? f->levels[q] : (float)q, d = x[i] - l * s;
        e[0] += d * d, a[0] += x[i] * l, b[0] += l * l;
        if (codes)
            codes[i] = (uint8_t)q;
    }
    for (int w = 4; w; w /= 2) { /* lane j plus lane j ^ w: a tree */
        v8i h = (v8i){0, 1, 2, 3, 4, 5, 6, 7} ^ w;
        e += pick1(e, h), a += pick1(a, h), b += pick1(b, h);
    }
    if (sxl)
        *sxl = a[0], *sll = b[0];
    return e[0];
}

/* assign with each element's squared error weighted by w[i] (the
 * importance of its column), in double precision, one by one. */
static double assign_w(const stz_qformat *f, int lo, int hi, const float *x, const float *w, size_t n, float s,
                       double *sxl, double *sll, uint8_t *codes)
{
    float inv = s != 0 ? 1.0f / s : 0.0f;
    double e = 0, a = 0, b = 0;
    for (size_t i = 0; i < n; i++) {
        int q = code_of(f, lo, hi, x[i] * inv);
        float l = f->method == STZ_QMETHOD_NL ? f->levels[q] : (float)q, d = x[i] - l * s;
        e += (double)w[i] * d * d, a += (double)w[i] * x[i] * l, b += (double)w[i] * l * l;
        if (codes)
            codes[i] = (uint8_t)q;
    }
    if (sxl)
        *sxl = a, *sll = b;
    return e;
}

/* The error of x at scale s, weighted by w when given. */
static double assign_any(const stz_qformat *f, int lo, int hi, const float *x, const float *w, size_t n, float s,
                         double *sxl, double *sll, uint8_t *codes)
{
    return w ? assign_w(f, lo, hi, x, w, n, s, sxl, sll, codes) : assign(f, lo, hi, x, n, s, sxl, sll, codes);
}

/* The scale of a symmetric block (0 for all zeros); NAN if none can be
 * stored. w: the elements' importance (NULL: 1), which the least-squares
 * search of mse and nl minimizes the weighted error by. */
static float block_sym(const stz_qformat *f, const float *x, const float *w, size_t n, uint8_t *codes, uint8_t *tmp)
{
    int lo, hi, nl = f->method == STZ_QMETHOD_NL, k = 1 << f->bits;
    uniform_range(f, &lo, &hi);
    float mx[8] = {0}, mn[8] = {0}; /* lanes, so that it vectorises */
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            mx[j] = x[i + j] > mx[j] ? x[i + j] : mx[j], mn[j] = x[i + j] < mn[j] ? x[i + j] : mn[j];
    for (; i < n; i++)
        mx[0] = x[i] > mx[0] ? x[i] : mx[0], mn[0] = x[i] < mn[0] ? x[i] : mn[0];
    for (int j = 1; j < 8; j++)
        mx[0] = mx[j] > mx[0] ? mx[j] : mx[0], mn[0] = mn[j] < mn[0] ? mn[j] : mn[0];
    float vmax = mx[0] >= -mn[0] ? mx[0] : mn[0], amax = fabsf(vmax); /* the largest magnitude, signed */
    if (amax == 0) {
        if (codes)
            memset(codes, code_of(f, lo, hi, 0.0f), n);
        return 0;
    }
    float top = nl ? f->levels[k - 1] : (float)hi, bottom = nl ? f->levels[0] : (float)lo;
    int u8 = f->scale_dtype == STZ_DTYPE_U8;
    if (f->method == STZ_QMETHOD_ABSMAX) /* the extreme maps to +-top, the scale rounded up */
        return store_scale_up(f, amax / top);
    if (f->method == STZ_QMETHOD_FULL) /* the extreme maps to the bottom level, Q4_0's rule (U8: positive) */
        return store_scale_up(f, vmax / bottom);
    /* mse / nl: the extreme on either end of the code set (a negative
     * scale mirrors the codes); from the better, one least-squares step
     * (which cannot raise the error); then the better stored scale around it */
    double best = INFINITY;
    float cand = NAN;
    const float ends[2] = {vmax > 0 ? top : bottom, vmax > 0 ? bottom : top};
    for (int e = 0; e < 2; e++) {
        if (ends[e] == 0)
            continue;
        double sxl, sll, err = assign_any(f, lo, hi, x, w, n, vmax / ends[e], &sxl, &sll, NULL);
        if (err < best)
            best = err, cand = sll > 0 ? (float)(sxl / sll) : vmax / ends[e];
    }
    float sl, sh;
    if (u8) { /* the codes either side of cand */
        uint8_t cc = scale_code(f->scale_base, cand), sg = cc & 0x80, m = cc & 0x7f;
        sl = scale_value(f->scale_base, cc);
        if (fabsf(sl) > fabsf(cand) && m > 1)
            sh = sl, sl = scale_value(f->scale_base, sg | --m);
        else
            sh = scale_value(f->scale_base, sg | (m < 127 ? m + 1 : m));
    } else if (isnan(sl = store_scale(f, cand))) {
        return NAN;
    } else {
        sh = fabsf(sl) < fabsf(cand) ? store_scale_up(f, cand) : sl;
    }
    if (isnan(sh) || sh == sl) {
        assign_any(f, lo, hi, x, w, n, sl, NULL, NULL, codes);
        return sl;
    }
    if (assign_any(f, lo, hi, x, w, n, sl, NULL, NULL, codes) <= assign_any(f, lo, hi, x, w, n, sh, NULL, NULL, tmp))
        return sl;
    if (codes)
        memcpy(codes, tmp, n);
    return sh;
}

/* Asymmetric block: y = u * s + m, u in [0, 2^bits - 1]; least squares on
 * (s, m) alternating with the assignment, from the full range and from a
 * slightly narrower one. Returns -1 if s or m cannot be stored. */
static int block_asym(const stz_qformat *f, const float *x, const float *w, size_t n, float *s, float *m)
{
    float lo = x[0], hi = x[0];
    int top = (1 << f->bits) - 1;
    for (size_t i = 1; i < n; i++)
        lo = x[i] < lo ? x[i] : lo, hi = x[i] > hi ? x[i] : hi;
    float bs = (hi - lo) / (float)top, bm = lo;
    double best = INFINITY;
    for (int start = 0; start < 2 && hi > lo; start++) {
        float cs = start ? (hi - lo) * 0.9f / (float)top : bs, cm = start ? lo + (hi - lo) * 0.05f : lo;
        for (int it = 0; it < 4 && cs > 0; it++) {
            double sw = 0, su = 0, sx = 0, suu = 0, sux = 0, e = 0; /* weighted by w (1 without) */
            float inv = 1.0f / cs;
            for (size_t i = 0; i < n; i++) {
                int u = clampi((int)rndf((x[i] - cm) * inv), 0, top);
                float d = x[i] - ((float)u * cs + cm);
                double wi = w ? w[i] : 1.0;
                e += wi * d * d, sw += wi, su += wi * u, sx += wi * x[i], suu += wi * u * u, sux += wi * u * x[i];
            }
            if (e < best)
                best = e, bs = cs, bm = cm;
            double det = sw * suu - su * su;
            if (det <= 0)
                break;
            cs = (float)((sw * sux - su * sx) / det), cm = (float)((sx - cs * su) / sw);
        }
    }
    *s = store_scale(f, bs), *m = store_scale(f, bm);
    return isnan(*s) || isnan(*m) ? -1 : 0;
}

/* ---- rows ----------------------------------------------------------------- */

size_t stz_qf_row_bytes(int bits, size_t n) { return (n * (size_t)bits + 7) / 8; }

/* A row's bit string, high bits first. */
typedef struct {
    uint8_t *q;
    uint64_t acc;
    int n;
} bitw;

static inline void bw_put(bitw *w, int bits, unsigned v)
{
    w->acc = w->acc << bits | (v & ((1u << bits) - 1)), w->n += bits;
    while (w->n >= 8)
        w->n -= 8, *w->q++ = (uint8_t)(w->acc >> w->n);
}

static inline void bw_flush(bitw *w)
{
    if (w->n)
        *w->q++ = (uint8_t)(w->acc << (8 - w->n)), w->n = 0;
}

/* Appends n codes; 4-bit pairs on a byte boundary go in whole. */
static void bw_put_codes(bitw *w, int bits, const uint8_t *c, size_t n)
{
    size_t j = 0;
    if (bits == 4 && !w->n)
        for (; j + 1 < n; j += 2)
            *w->q++ = (uint8_t)(c[j] << 4 | (c[j + 1] & 15));
    for (; j < n; j++)
        bw_put(w, bits, c[j]);
}

/* Block b's parameters (scale, and minimum for asym) for x[len], as the
 * method chooses them; nl's search leaves the codes of a block of at most
 * 256 in `codes` (*have = 1). -1: a scale cannot be stored. */
static int block_params(const stz_qformat *f, const float *x, const float *wb, size_t len, float *scale, float *min,
                        uint8_t *codes, int *have)
{
    uint8_t tmp[256];
    *have = len <= sizeof tmp && f->method == STZ_QMETHOD_NL;
    if (f->method == STZ_QMETHOD_ASYM)
        return block_asym(f, x, wb, len, scale, min);
    *scale = block_sym(f, x, wb, len, *have ? codes : NULL, *have ? tmp : NULL);
    return isnan(*scale) ? -1 : 0;
}

/* The code of v in a block of scale s (inv: 1 / s, or 0; asym: minimum
 * m), and its value. */
static inline int block_code(const stz_qformat *f, int lo, int hi, float v, float s, float inv, float m, float *y)
{
    if (f->method == STZ_QMETHOD_ASYM) {
        int u = clampi((int)rndf((v - m) * inv), 0, (1 << f->bits) - 1);
        return *y = (float)u * s + m, u;
    }
    int q = code_of(f, lo, hi, v * inv);
    *y = (f->method == STZ_QMETHOD_NL ? f->levels[q] : (float)q) * s;
    return q;
}

/* A row of a 32-block type whose last block is partial: the whole blocks,
 * then the rest zero-padded, the padding weighted 0 (its values are never
 * read: stz's reader drops them, and the FFN's padded units that export
 * adds are zero, so llama.cpp multiplies them by 0). */
static int ggml_row(const stz_qformat *f, const float *x, size_t n, uint8_t *q)
{
    int type = f->ggml->type;
    size_t whole = n / f->block * f->block, rest = n - whole;
    if (!rest || f->block != STZ_GGML_QK)
        return stz_ggml_quantize_row(type, x, f->weights, n, q);
    if (whole && stz_ggml_quantize_row(type, x, f->weights, whole, q))
        return -1;
    float px[STZ_GGML_QK] = {0}, pw[STZ_GGML_QK] = {0};
    for (size_t k = 0; k < rest; k++)
        px[k] = x[whole + k], pw[k] = f->weights ? f->weights[whole + k] : 1.0f;
    return stz_ggml_quantize_row(type, px, pw, STZ_GGML_QK, q + stz_ggml_row_bytes(type, whole));
}

int stz_qf_quantize_row(const stz_qformat *f, const float *x, size_t n, uint8_t *q, float *scales, float *mins)
{
    if (f->ggml)
        return ggml_row(f, x, n, q);
    int lo, hi;
    uint8_t codes[256];
    uniform_range(f, &lo, &hi);
    bitw w = {q, 0, 0};
    for (size_t b = 0, i = 0; i < n; b++, i += f->block) {
        size_t len = n - i < f->block ? n - i : f->block;
        int have;
        if (block_params(f, x + i, f->weights ? f->weights + i : NULL, len, &scales[b], mins ? &mins[b] : NULL, codes,
                         &have))
            return -1;
        float inv = scales[b] != 0 ? 1.0f / scales[b] : 0.0f;
        for (size_t k = 0; k < len; k += sizeof codes) { /* pieces of a long block */
            size_t piece = len - k < sizeof codes ? len - k : sizeof codes;
            float m = mins ? mins[b] : 0.0f, y;
            for (size_t j = 0; !have && j < piece; j++)
                codes[j] = (uint8_t)block_code(f, lo, hi, x[i + k + j], scales[b], inv, m, &y);
            bw_put_codes(&w, f->bits, codes, piece);
        }
    }
    bw_flush(&w);
    return 0;
}

int stz_qf_block_feedback(const stz_qformat *f, float *x, const float *w, size_t len, const float *U, size_t ldu,
                          uint8_t *codes, float *scale, float *min, float *E)
{
    int lo, hi, have;
    uniform_range(f, &lo, &hi);
    if (block_params(f, x, w, len, scale, min, codes, &have))
        return -1;
    float inv = *scale != 0 ? 1.0f / *scale : 0.0f;
    for (size_t k = 0; k < len; k++) {
        float y;
        codes[k] = (uint8_t)block_code(f, lo, hi, x[k], *scale, inv, min ? *min : 0.0f, &y);
        E[k] = stz_fb_step(x, k, len, y, U, ldu);
    }
    return 0;
}

void stz_qf_pack_codes(int bits, const uint8_t *codes, size_t n, uint8_t *q)
{
    bitw w = {q, 0, 0};
    bw_put_codes(&w, bits, codes, n);
    bw_flush(&w);
}

void stz_qf_unpack_codes(int bits, const uint8_t *q, size_t n, uint8_t *codes)
{
    uint32_t acc = 0;
    int have = 0;
    for (size_t i = 0; i < n; i++) {
        if (have < bits)
            acc = acc << 8 | *q++, have += 8;
        have -= bits;
        codes[i] = (uint8_t)((acc >> have) & ((1u << bits) - 1));
    }
}

STZ_QF_CLONES void stz_qf_dequantize_row(const stz_qformat *f, const uint8_t *q, const float *scales, const float *mins,
                                         size_t n, float *y)
{
    if (f->ggml) { /* a partial last block (ggml_row): its first values */
        size_t whole = n / f->block * f->block;
        float last[256];
        stz_ggml_dequantize_row(f->ggml->type, q, whole, y);
        if (whole < n) {
            stz_ggml_dequantize_row(f->ggml->type, q + stz_ggml_row_bytes(f->ggml->type, whole), f->block, last);
            memcpy(y + whole, last, (n - whole) * sizeof *y);
        }
        return;
    }
    int bits = f->bits, sh = 32 - bits, have = 0;
    float tab[256]; /* each code's value before the scale */
    for (int v = 0; v < 1 << bits; v++)
        tab[v] = f->method == STZ_QMETHOD_NL     ? f->levels[v]
                 : f->method == STZ_QMETHOD_ASYM ? (float)v
                                                 : (float)((int32_t)((uint32_t)v << sh) >> sh);
    v8f t0, t1;
    memcpy(&t0, tab, sizeof t0), memcpy(&t1, tab + 8, sizeof t1);
    uint64_t acc = 0;
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += f->block) {
        size_t i = i0, end = n - i0 < f->block ? n : i0 + f->block;
        float s = scales[b], m = f->method == STZ_QMETHOD_ASYM ? mins[b] : 0.0f;
        for (; bits == 4 && !have && i + 8 <= end; i += 8, q += 4) { /* four whole bytes, eight codes */
            uint32_t w = stz_le32(q);
            v8i c = (v8i)((((v8u){0} + w) >> (v8u){4, 0, 12, 8, 20, 16, 28, 24}) & 15);
            v8f v = pick2(t0, t1, c) * s + m;
            memcpy(y + i, &v, sizeof v);
        }
        for (; bits == 4 && !have && i + 2 <= end; i += 2, q++) /* whole bytes, two codes each */
            y[i] = tab[*q >> 4] * s + m, y[i + 1] = tab[*q & 15] * s + m;
        for (; i < end; i++) {
            if (have < bits)
                acc = acc << 8 | *q++, have += 8;
            have -= bits;
            y[i] = tab[(acc >> have) & ((1u << bits) - 1)] * s + m;
        }
    }
}

/* ---- nl codebooks ------------------------------------------------------------ */

/* Levels are stored as n / 32767 (n a 16-bit integer), exactly as read. */
static float level_of(double v) { return (float)lround((v < -1 ? -1 : v > 1 ? 1 : v) * 32767.0) / 32767.0f; }

void stz_qf_default_levels(int bits, float *levels)
{
    int k = 1 << bits;
    for (int i = 0; i < k; i++) { /* like two's complement: -1 .. 1 - 2/k, zero included; denser near zero */
        double u = (double)(i - k / 2) / (double)(k / 2);
        levels[i] = level_of(bits == 4 ? stz_iq4nl_levels[i] / 127.0 : u * (0.6 + 0.4 * fabs(u)));
    }
}

void stz_qf_fit_levels(stz_qformat *f, const float *x, size_t rows, size_t cols)
{
    int k = 1 << f->bits;
    double num[64], den[64];
    size_t nrows = rows;
    while (nrows > 1 && nrows * cols > 65536) /* enough values to place 64 levels */
        nrows /= 2;
    stz_qf_default_levels(f->bits, f->levels);
    for (int it = 0; it < 4; it++) {
        stz_qf_prepare(f);
        memset(num, 0, sizeof num), memset(den, 0, sizeof den);
        for (size_t r = 0; r < nrows; r++)
            for (size_t i = 0; i < cols; i += f->block) {
                const float *b = x + r * (rows / nrows) * cols + i;
                size_t len = cols - i < f->block ? cols - i : f->block;
                float s = block_sym(f, b, NULL, len, NULL, NULL);
                if (!(s != 0) || isnan(s))
                    continue;
                /* level j minimises sum (x - s L_j)^2 over its values: L_j = sum s x / sum s^2 */
                float inv = 1.0f / s;
                for (size_t j = 0; j < len; j++) {
                    int q = nl_code(f, b[j] * inv);
                    num[q] += (double)s * b[j], den[q] += (double)s * s;
                }
            }
        float l[64], mx = 0;
        for (int j = 0; j < k; j++) {
            l[j] = den[j] > 0 ? (float)(num[j] / den[j]) : f->levels[j];
            mx = fabsf(l[j]) > mx ? fabsf(l[j]) : mx;
        }
        if (!(mx > 0))
            break;
        for (int j = 0; j < k; j++)
            l[j] = level_of(l[j] / mx);
        for (int j = 1; j < k; j++) /* keep them sorted */
            if (!(l[j] >= l[j - 1]))
                l[j] = l[j - 1];
        memcpy(f->levels, l, (size_t)k * sizeof *l);
    }
    stz_qf_prepare(f);
}
