/* stz's quantizers for llama.cpp's block types (ggml_types.h): the layouts
 * are ggml's, the choice of scales, minimums and sub-block scales is a
 * search for the lowest weighted squared error sum w[i] (x[i] - y[i])^2,
 * y the values the block stores (w: an importance per element, or 1).
 *
 * One block (or sub-block) is fitted by trying a grid of scales that map
 * its extreme element near the extreme code, each with its nearest codes;
 * the three best get the least-squares scale (and minimum) for their
 * codes, and the best of those is refined by alternating the two (F16
 * scales for the 32-blocks, floats for sub-blocks). The super-block types then
 * round the sub-block scales (and minimums) to their integer fields under
 * one F16 scale, re-pick the codes, try each integer field one step up and
 * down, and refit the F16 scales by least squares, keeping any step that
 * lowers the error. Stored scales are rounded to F16 before the codes are
 * final, so the error measured is the error stored. */
#include "ggml_types.h"
#include "quant_tensor.h"
#include "quant_vec.h"
#include "core/stz_core.h"

#include <math.h>
#include <string.h>

#ifndef STZ_GQ_CLONES /* tests build this file once more without them */
#define STZ_GQ_CLONES STZ_CLONES("avx2", "default")
#endif

#define QK   32
#define QK_K 256
#define GRID 5      /* grid scales on each side of the extreme's ... */
#define SPAN 0.125f /* ... up to this far from it (relative) */

/* The midpoints between neighbouring IQ4_NL levels (stz_iq4nl_levels;
 * the 16th only pads the search's table). */
static const float nl_mid[16] = {-115.5f, -93.5f, -74,   -57,   -42, -28.5f, -16, -4.5f,
                                 7,       19,     31.5f, 45.5f, 61,  79,     101, INFINITY};

/* How a (sub-)block's codes stand for values: y = D * level(q) + M, with
 * q in lo..hi; level(q) = q (uniform) or stz_iq4nl_levels[q] (nl). */
typedef struct {
    int lo, hi, nl;
} codes;

static inline float rnd(float v) { return (float)(int)(v + (v < 0 ? -0.5f : 0.5f)); }
static inline float clampf(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }
static inline float level(const codes *c, int q) { return c->nl ? (float)stz_iq4nl_levels[q] : (float)q; }

/* Lane-wise t clamped to lo..hi (C has no vector ?:). */
#define vclamp(t, lo, hi)                                                                                              \
    do {                                                                                                               \
        v8i m_ = (t) < (lo);                                                                                           \
        (t) = (v8f)((m_ & (v8i)((v8f){} + (lo))) | (~m_ & (v8i)(t)));                                                  \
        m_ = (t) > (hi);                                                                                               \
        (t) = (v8f)((m_ & (v8i)((v8f){} + (hi))) | (~m_ & (v8i)(t)));                                                  \
    } while (0)

/* The IQ4_NL levels as lanes 0-7 and 8-15. */
static inline void nl_levels(v8f *l0, v8f *l1)
{
    for (int j = 0; j < 8; j++)
        (*l0)[j] = stz_iq4nl_levels[j], (*l1)[j] = stz_iq4nl_levels[j + 8];
}

/* Picks the nearest codes L for scale D and offset M, eight at a time (nl:
 * a binary search over the midpoints); returns the error, summed in 8
 * lanes and then pairwise: a fixed order, so that the vectorised clones
 * and the plain build give the same bits. n is a multiple of 8 (every
 * (sub-)block is). */
STZ_GQ_CLONES static float pick(const codes *c, const float *x, const float *w, int n, float D, float M, int8_t *L)
{
    float id = D != 0 ? 1.0f / D : 0, lo = (float)c->lo, hi = (float)c->hi;
    v8f e = {0}, m0 = {0}, m1 = {0}, l0 = {0}, l1 = {0};
    if (c->nl)
        memcpy(&m0, nl_mid, sizeof m0), memcpy(&m1, nl_mid + 8, sizeof m1), nl_levels(&l0, &l1);
    for (int i = 0; i < n; i += 8) {
        v8f xv, wv, t, l, r;
        v8i q;
        memcpy(&xv, x + i, sizeof xv), memcpy(&wv, w + i, sizeof wv);
        t = (xv - M) * id;
        if (c->nl) {
            q = (t > nl_mid[7]) & 8;
            q += (t > pick2(m0, m1, q + 3)) & 4;
            q += (t > pick2(m0, m1, q + 1)) & 2;
            q += (t > pick2(m0, m1, q)) & 1;
            l = pick2(l0, l1, q);
        } else {
            vclamp(t, lo, hi);
            q = __builtin_convertvector(t + (v8f)(((v8u)t & 0x80000000u) | 0x3f000000u), v8i); /* half away from 0 */
            l = __builtin_convertvector(q, v8f);
        }
        r = xv - (D * l + M);
        e += wv * r * r;
        low_bytes(q, L + i);
    }
    return ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

/* Weighted sums a (sub-)block's least squares need. */
typedef struct {
    double w, x, l, ll, xl; /* sum w, w x, w l, w l^2, w x l (l = level of the code) */
} sums;

/* By pointer: a vector argument would pass in AVX registers from the avx2
 * clone and in memory to a callee built without AVX when not inlined (-O0). */
static inline double lanes_sum(const v8f *v)
{
    return (((double)(*v)[0] + (*v)[1]) + ((*v)[2] + (*v)[3])) + (((*v)[4] + (*v)[5]) + ((*v)[6] + (*v)[7]));
}

/* Eight lanes of float sums (a (sub-)block is short), added in double in
 * a fixed order. */
STZ_GQ_CLONES static sums sums_of(const codes *c, const float *x, const float *w, int n, const int8_t *L)
{
    typedef int8_t v8c __attribute__((vector_size(8)));
    v8f sw = {0}, sx = {0}, sl = {0}, sll = {0}, sxl = {0}, l0 = {0}, l1 = {0};
    if (c->nl)
        nl_levels(&l0, &l1);
    for (int i = 0; i < n; i += 8) {
        v8f xv, wv, l, wl;
        v8c lc;
        memcpy(&xv, x + i, sizeof xv), memcpy(&wv, w + i, sizeof wv), memcpy(&lc, L + i, sizeof lc);
        v8i q = __builtin_convertvector(lc, v8i);
        l = c->nl ? pick2(l0, l1, q) : __builtin_convertvector(q, v8f), wl = wv * l;
        sw += wv, sx += wv * xv, sl += wl, sll += wl * l, sxl += wl * xv;
    }
    return (sums){lanes_sum(&sw), lanes_sum(&sx), lanes_sum(&sl), lanes_sum(&sll), lanes_sum(&sxl)};
}

/* The least-squares D (and M if with_min; mmax caps M, for the k-quants'
 * non-positive minimums) for fixed codes. */
static void lsq(const sums *s, int with_min, float mmax, float *D, float *M)
{
    double d = 0, m = 0;
    if (with_min) {
        double det = s->w * s->ll - s->l * s->l;
        if (det > 1e-12 * s->w * s->ll) {
            d = (s->w * s->xl - s->l * s->x) / det, m = (s->ll * s->x - s->l * s->xl) / det;
        } else {
            m = s->w > 0 ? s->x / s->w : 0;
        }
        if (m > mmax) { /* the cap holds: D alone, with M there */
            m = mmax;
            d = s->ll > 0 ? (s->xl - m * s->l) / s->ll : 0;
        }
    } else {
        d = s->ll > 0 ? s->xl / s->ll : 0;
    }
    *D = (float)d, *M = (float)m;
}

static inline float f16(float v) { return stz_f16_to_f32(stz_f32_to_f16(v)); }

/* The least-squares scale (and minimum) for the codes T, rounded to F16 if
 * `r16`, with the codes picked again for them: the error, measured. */
static float refit(const codes *c, const float *x, const float *w, int n, int with_min, float mmax, int r16, int8_t *T,
                   float *D, float *M)
{
    sums s = sums_of(c, x, w, n, T);
    lsq(&s, with_min, mmax, D, M);
    if (r16)
        *D = f16(*D), *M = f16(*M);
    return isfinite(*D) && isfinite(*M) ? pick(c, x, w, n, *D, *M, T) : INFINITY;
}

/* The fit of one (sub-)block: a grid of scales that map the extreme
 * element near the extreme code, each refitted (refit), the best refined by
 * alternating codes and scales; every error measured as stored (F16 scales
 * when r16). */
STZ_GQ_CLONES static float fit(const codes *c, const float *x, const float *w, int n, int with_min, float mmax, int r16,
                               float *D, float *M, int8_t *L)
{
    float mn = x[0], mx = x[0], amax = 0, vmax = 0;
    for (int i = 0; i < n; i++) {
        mn = x[i] < mn ? x[i] : mn, mx = x[i] > mx ? x[i] : mx;
        if (fabsf(x[i]) > amax)
            amax = fabsf(x[i]), vmax = x[i];
    }
    if (with_min && mn > mmax)
        mn = mmax;
    float best = INFINITY, bd = 0, bm = with_min ? mn : 0;
    int8_t T[QK_K];
    if (amax == 0 || (with_min && mx == mn)) {
        *D = 0, *M = r16 ? f16(bm) : bm;
        return pick(c, x, w, n, 0, *M, L);
    }
    /* every grid scale's error as it stands; the best TOP refitted */
    enum { TOP = 3 };
    float top_e[TOP] = {INFINITY, INFINITY, INFINITY}, top_d[TOP] = {0}, top_m[TOP] = {0};
    for (int side = 0; side < (with_min ? 1 : 2); side++) {
        float ext = level(c, side ? c->hi : c->lo); /* the code the extreme element maps near */
        for (int k = -GRID; k <= GRID; k++) {
            float f = 1 + SPAN * (float)k / GRID, id, m0 = 0;
            if (with_min)
                id = (level(c, c->hi) - level(c, c->lo)) * f / (mx - mn), m0 = mn - level(c, c->lo) / id;
            else
                id = ext * f / vmax;
            float e = pick(c, x, w, n, 1.0f / id, m0, T);
            for (int j = 0; j < TOP; j++) /* insert in order */
                if (e < top_e[j]) {
                    for (int u = TOP - 1; u > j; u--)
                        top_e[u] = top_e[u - 1], top_d[u] = top_d[u - 1], top_m[u] = top_m[u - 1];
                    top_e[j] = e, top_d[j] = 1.0f / id, top_m[j] = m0;
                    break;
                }
        }
    }
    for (int j = 0; j < TOP && isfinite(top_e[j]); j++) {
        float dd, mm;
        pick(c, x, w, n, top_d[j], top_m[j], T);
        float e = refit(c, x, w, n, with_min, mmax, r16, T, &dd, &mm);
        if (e < best)
            best = e, bd = dd, bm = mm, memcpy(L, T, (size_t)n);
    }
    memcpy(T, L, (size_t)n);
    for (int it = 0; it < 2; it++) { /* alternate scales and codes */
        float dd, mm, e = refit(c, x, w, n, with_min, mmax, r16, T, &dd, &mm);
        if (!(e < best))
            break;
        best = e, bd = dd, bm = mm, memcpy(L, T, (size_t)n);
    }
    *D = bd, *M = bm;
    return best;
}

/* The F16 value nearest d, or a neighbour (k = -1, 1). */
static inline float f16_step(float d, int k)
{
    uint16_t h = stz_f32_to_f16(d);
    return stz_f16_to_f32((uint16_t)(h + k));
}

/* ---- the 32-blocks: one F16 scale (and minimum) ------------------------ */

/* Fits a 32-block with F16 scale (and minimum), then tries the F16
 * neighbours of the scale; L gets the final codes. Returns the error, or
 * INFINITY when the scale does not fit F16. */
static float block32(const codes *c, const float *x, const float *w, int with_min, float *D, float *M, int8_t *L)
{
    float best = fit(c, x, w, QK, with_min, INFINITY, 1, D, M, L);
    int8_t T[QK];
    for (int k = -1; k <= 1; k += 2) {
        float dk = f16_step(*D, k), e;
        if (isfinite(dk) && (e = pick(c, x, w, QK, dk, *M, T)) < best)
            best = e, *D = dk, memcpy(L, T, QK);
    }
    return best;
}

static const codes C_Q4_0 = {-8, 7, 0}, C_Q5_0 = {-16, 15, 0}, C_Q8_0 = {-128, 127, 0}, C_Q4_1 = {0, 15, 0},
                   C_Q5_1 = {0, 31, 0}, C_NL = {0, 15, 1};

/* The 32-block types share a loop: each block fitted, its header and codes
 * written. */
static const float ones[QK_K] = {[0 ... QK_K - 1] = 1.0f};

/* A 32-block type's codes, whether it has a minimum, and its code width. */
static const codes *codes32(int type, int *with_min, int *bits)
{
    *with_min = type == STZ_GGML_Q4_1 || type == STZ_GGML_Q5_1;
    *bits = type == STZ_GGML_Q5_0 || type == STZ_GGML_Q5_1 ? 5 : 4;
    return type == STZ_GGML_Q4_0   ? &C_Q4_0
           : type == STZ_GGML_Q5_0 ? &C_Q5_0
           : type == STZ_GGML_Q8_0 ? &C_Q8_0
           : type == STZ_GGML_Q4_1 ? &C_Q4_1
           : type == STZ_GGML_Q5_1 ? &C_Q5_1
                                   : &C_NL;
}

/* A 32-block's header (d, and m) and codes L as the type stores them. */
static void put_block32(int type, const codes *c, int with_min, int bits, float d, float m, const int8_t *L,
                        uint8_t *out)
{
    stz_put_le16(out, stz_f32_to_f16(d));
    if (type == STZ_GGML_Q8_0)
        memcpy(out + 2, L, QK);
    else if (type == STZ_GGML_IQ4_NL)
        stz_ggml_put_nibbles(L, 0, 4, NULL, out + 2);
    else if (with_min)
        stz_put_le16(out + 2, stz_f32_to_f16(m)), stz_ggml_put_nibbles(L, 0, bits, out + 4, out + 4 + (bits == 5) * 4);
    else
        stz_ggml_put_nibbles(L, c->lo, bits, out + 2, out + 2 + (bits == 5) * 4);
}

int stz_ggml_quant32(int type, const float *x, const float *w, size_t n, uint8_t *out)
{
    int with_min, bits;
    const codes *c = codes32(type, &with_min, &bits);
    size_t bb = stz_ggml_traits_of(type)->bytes;
    for (size_t b = 0; b < n / QK; b++, out += bb) {
        int8_t L[QK];
        float d, m;
        if (!isfinite(block32(c, x + b * QK, w ? w + b * QK : ones, with_min, &d, &m, L)))
            return -1;
        put_block32(type, c, with_min, bits, d, m, L, out);
    }
    return 0;
}

/* ---- the super-blocks of 256 ------------------------------------------ */

/* A super-block type: nsub sub-blocks of `sub` elements, codes c; each
 * sub-block's scale is d * sc[j] with sc[j] in slo..shi, and with a minimum
 * -dmin * mn[j], mn[j] in 0..shi. */
typedef struct {
    int nsub, sub, with_min, slo, shi;
    codes c;
} kspec;

typedef struct {
    float d, dmin;
    int sc[16], mn[16];
    int8_t L[QK_K];
    float err[16]; /* per sub-block */
} kblock;

/* The codes and error of sub-block j under kb's scales. */
static float sub_pick(const kspec *k, const float *x, const float *w, kblock *kb, int j)
{
    int o = j * k->sub;
    return kb->err[j] =
               pick(&k->c, x + o, w + o, k->sub, kb->d * (float)kb->sc[j], -kb->dmin * (float)kb->mn[j], kb->L + o);
}

static float total(const kspec *k, const kblock *kb)
{
    float e = 0;
    for (int j = 0; j < k->nsub; j++)
        e += kb->err[j];
    return e;
}

/* Each sub-block's integer fields one step up and down, keeping the best. */
static void local_steps(const kspec *k, const float *x, const float *w, kblock *kb)
{
    int8_t keep[QK_K / 8];
    for (int j = 0; j < k->nsub; j++) {
        int o = j * k->sub, s0 = kb->sc[j], m0 = kb->mn[j], bs = s0, bm = m0;
        float be = kb->err[j];
        memcpy(keep, kb->L + o, (size_t)k->sub);
        for (int ds = -1; ds <= 1; ds++)
            for (int dm = k->with_min ? -1 : 0; dm <= (k->with_min ? 1 : 0); dm++) {
                int s = s0 + ds, m = m0 + dm;
                if ((!ds && !dm) || s < k->slo || s > k->shi || m < 0 || m > k->shi)
                    continue;
                kb->sc[j] = s, kb->mn[j] = m;
                if (sub_pick(k, x, w, kb, j) < be)
                    be = kb->err[j], bs = s, bm = m, memcpy(keep, kb->L + o, (size_t)k->sub);
            }
        kb->sc[j] = bs, kb->mn[j] = bm, kb->err[j] = be;
        memcpy(kb->L + o, keep, (size_t)k->sub);
    }
}

/* d (and dmin) by least squares for the current codes and integer fields,
 * rounded to F16; kept when the error falls. */
static void refit_scales(const kspec *k, const float *x, const float *w, kblock *kb)
{
    double a = 0, b = 0, c = 0, p = 0, q = 0; /* normal equations in (d, dmin) */
    for (int j = 0; j < k->nsub; j++) {
        int o = j * k->sub;
        sums s = sums_of(&k->c, x + o, w + o, k->sub, kb->L + o);
        double sc = kb->sc[j], mn = kb->mn[j];
        a += sc * sc * s.ll, b -= sc * mn * s.l, c += mn * mn * s.w, p += sc * s.xl, q -= mn * s.x;
    }
    double d, dmin = 0, det = a * c - b * b;
    if (k->with_min && det > 1e-12 * a * c)
        d = (p * c - b * q) / det, dmin = (a * q - b * p) / det;
    else
        d = a > 0 ? p / a : 0;
    kblock t = *kb;
    t.d = f16((float)d), t.dmin = f16((float)dmin);
    if (!isfinite(t.d) || !isfinite(t.dmin) || (k->with_min && t.dmin < 0))
        return;
    for (int j = 0; j < k->nsub; j++)
        sub_pick(k, x, w, &t, j);
    if (total(k, &t) < total(k, kb))
        *kb = t;
}

/* The integer fields of every sub-block for F16 scales from the largest
 * fitted scale (mapped to `top`) and minimum; the codes picked. */
static void round_fields(const kspec *k, const float *x, const float *w, const float *fs, const float *fm, float top,
                         kblock *kb)
{
    float smax = 0, vmax = 0, mmax = 0;
    for (int j = 0; j < k->nsub; j++) {
        if (fabsf(fs[j]) > smax)
            smax = fabsf(fs[j]), vmax = fs[j];
        mmax = -fm[j] > mmax ? -fm[j] : mmax;
    }
    kb->d = smax > 0 ? f16(vmax / top) : 0, kb->dmin = f16(mmax / (float)k->shi); /* never -0 */
    for (int j = 0; j < k->nsub; j++) {
        kb->sc[j] = kb->d != 0 ? (int)clampf(rnd(fs[j] / kb->d), (float)k->slo, (float)k->shi) : 0;
        kb->mn[j] = kb->dmin != 0 ? (int)clampf(rnd(-fm[j] / kb->dmin), 0, (float)k->shi) : 0;
        sub_pick(k, x, w, kb, j);
    }
}

/* One super-block: float fits per sub-block, then the integer fields under
 * F16 scales for both ends of the scale range, refined. -1: F16 overflow. */
STZ_GQ_CLONES static int kquant(const kspec *k, const float *x, const float *w, kblock *out)
{
    float fs[16], fm[16];
    for (int j = 0; j < k->nsub; j++)
        fit(&k->c, x + j * k->sub, w + j * k->sub, k->sub, k->with_min, 0, 0, &fs[j], &fm[j], out->L + j * k->sub);
    float best = INFINITY;
    for (int side = 0; side < (k->slo < 0 ? 2 : 1); side++) {
        kblock kb;
        round_fields(k, x, w, fs, fm, (float)(side || !k->slo ? k->shi : k->slo), &kb);
        if (!isfinite(kb.d) || !isfinite(kb.dmin))
            continue;
        for (int it = 0; it < 2; it++)
            local_steps(k, x, w, &kb), refit_scales(k, x, w, &kb);
        if (total(k, &kb) < best)
            best = total(k, &kb), *out = kb;
    }
    return isfinite(best) ? 0 : -1;
}

static const kspec K_Q2 = {16, 16, 1, 0, 15, {0, 3, 0}}, K_Q3 = {16, 16, 0, -32, 31, {-4, 3, 0}},
                   K_Q4 = {8, 32, 1, 0, 63, {0, 15, 0}}, K_Q5 = {8, 32, 1, 0, 63, {0, 31, 0}},
                   K_Q6 = {16, 16, 0, -128, 127, {-32, 31, 0}}, K_XS = {8, 32, 0, -32, 31, {0, 15, 1}};

/* Element e of a 128-half in the 2-bit layout of Q2_K / Q3_K: byte
 * e % 32 of the half's 32, bits 2 * (e / 32). */
static void put_2bit(const int8_t *L, int off, uint8_t *qs)
{
    memset(qs, 0, 64);
    for (int e = 0; e < QK_K; e++)
        qs[(e / 128) * 32 + e % 32] |= (uint8_t)(((L[e] + off) & 3) << (2 * ((e % 128) / 32)));
}

/* Q4_K / Q5_K: 6-bit scales and minimums, 8 in 12 bytes. */
static void put_scales_k4(const kblock *kb, uint8_t *s)
{
    for (int j = 0; j < 4; j++)
        s[j] = (uint8_t)kb->sc[j], s[j + 4] = (uint8_t)kb->mn[j];
    for (int j = 4; j < 8; j++) {
        s[j + 4] = (uint8_t)((kb->sc[j] & 15) | (kb->mn[j] & 15) << 4);
        s[j - 4] |= (uint8_t)((kb->sc[j] >> 4) << 6), s[j] |= (uint8_t)((kb->mn[j] >> 4) << 6);
    }
}

static void pack_k(int type, const kblock *kb, uint8_t *o)
{
    const int8_t *L = kb->L;
    if (type == STZ_GGML_Q2_K) {
        for (int j = 0; j < 16; j++)
            o[j] = (uint8_t)(kb->sc[j] | kb->mn[j] << 4);
        put_2bit(L, 0, o + 16);
        stz_put_le16(o + 80, stz_f32_to_f16(kb->d)), stz_put_le16(o + 82, stz_f32_to_f16(kb->dmin));
    } else if (type == STZ_GGML_Q3_K) {
        memset(o, 0, 32);
        for (int e = 0; e < QK_K; e++)
            o[e % 32] |= (uint8_t)((L[e] >= 0) << ((e / 128) * 4 + (e % 128) / 32));
        put_2bit(L, 4, o + 32);
        uint8_t *s = o + 96;
        memset(s, 0, 12);
        for (int j = 0; j < 16; j++) {
            int v = kb->sc[j] + 32;
            s[j % 8] |= (uint8_t)((v & 15) << (4 * (j / 8)));
            s[8 + j % 4] |= (uint8_t)((v >> 4) << (2 * (j / 4)));
        }
        stz_put_le16(o + 108, stz_f32_to_f16(kb->d));
    } else if (type == STZ_GGML_Q4_K || type == STZ_GGML_Q5_K) {
        int five = type == STZ_GGML_Q5_K;
        uint8_t *qh = o + 16, *qs = o + (five ? 48 : 16);
        stz_put_le16(o, stz_f32_to_f16(kb->d)), stz_put_le16(o + 2, stz_f32_to_f16(kb->dmin));
        put_scales_k4(kb, o + 4);
        if (five)
            memset(qh, 0, 32);
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) {
                int a = L[64 * p + l], b = L[64 * p + 32 + l];
                qs[32 * p + l] = (uint8_t)((a & 15) | (b & 15) << 4);
                if (five)
                    qh[l] |= (uint8_t)((a >> 4) << (2 * p) | (b >> 4) << (2 * p + 1));
            }
    } else if (type == STZ_GGML_Q6_K) {
        uint8_t *ql = o, *qh = o + 128;
        memset(o, 0, 192);
        for (int e = 0; e < QK_K; e++) {
            int h = e / 128, t = (e % 128) / 32, l = e % 32, v = L[e] + 32;
            ql[64 * h + l + 32 * (t & 1)] |= (uint8_t)((v & 15) << (4 * (t >> 1)));
            qh[32 * h + l] |= (uint8_t)((v >> 4) << (2 * t));
        }
        for (int j = 0; j < 16; j++)
            o[192 + j] = (uint8_t)(int8_t)kb->sc[j];
        stz_put_le16(o + 208, stz_f32_to_f16(kb->d));
    } else { /* IQ4_XS */
        unsigned sh = 0;
        stz_put_le16(o, stz_f32_to_f16(kb->d));
        memset(o + 4, 0, 4);
        for (int ib = 0; ib < 8; ib++) {
            int v = kb->sc[ib] + 32;
            o[4 + ib / 2] |= (uint8_t)((v & 15) << (4 * (ib % 2)));
            sh |= (unsigned)(v >> 4) << (2 * ib);
            stz_ggml_put_nibbles(L + 32 * ib, 0, 4, NULL, o + 8 + 16 * ib);
        }
        stz_put_le16(o + 2, (uint16_t)sh);
    }
}

static const kspec *kspec_of(int type)
{
    return type == STZ_GGML_Q2_K   ? &K_Q2
           : type == STZ_GGML_Q3_K ? &K_Q3
           : type == STZ_GGML_Q4_K ? &K_Q4
           : type == STZ_GGML_Q5_K ? &K_Q5
           : type == STZ_GGML_Q6_K ? &K_Q6
                                   : &K_XS;
}

int stz_ggml_quant256(int type, const float *x, const float *w, size_t n, uint8_t *out)
{
    const kspec *k = kspec_of(type);
    size_t bb = stz_ggml_traits_of(type)->bytes;
    for (size_t b = 0; b < n / QK_K; b++, out += bb) {
        kblock kb;
        if (kquant(k, x + b * QK_K, w ? w + b * QK_K : ones, &kb))
            return -1;
        pack_k(type, &kb, out);
    }
    return 0;
}

/* ---- error feedback ------------------------------------------------------- */

/* The code of x nearest D * level + M (pick's rule, one element). */
static int nearest(const codes *c, float x, float D, float M)
{
    float t = (x - M) * (D != 0 ? 1.0f / D : 0);
    if (c->nl) {
        int q = 0;
        while (q < 15 && t > nl_mid[q])
            q++;
        return q;
    }
    t = clampf(t, (float)c->lo, (float)c->hi);
    return (int)rnd(t);
}

/* The codes of a block of n in order, each element's rounding error fed
 * to the elements after it; sub-blocks of `sub` with scales D[j] and
 * minimums M[j]. */
static void sweep(const codes *c, float *x, int n, int sub, const float *D, const float *M, const float *U, size_t ldu,
                  int8_t *L, float *E)
{
    for (int i = 0; i < n; i++) {
        int j = i / sub;
        L[i] = (int8_t)nearest(c, x[i], D[j], M[j]);
        E[i] = stz_fb_step(x, (size_t)i, (size_t)n, D[j] * level(c, L[i]) + M[j], U, ldu);
    }
}

int stz_ggml_block_feedback(int type, float *x, const float *w, const float *U, size_t ldu, uint8_t *out, float *E)
{
    w = w ? w : ones;
    if (stz_ggml_block(type) == QK) {
        int with_min, bits;
        const codes *c = codes32(type, &with_min, &bits);
        int8_t L[QK];
        float d, m;
        if (!isfinite(block32(c, x, w, with_min, &d, &m, L)))
            return -1;
        sweep(c, x, QK, QK, &d, &m, U, ldu, L, E);
        put_block32(type, c, with_min, bits, d, m, L, out);
        return 0;
    }
    const kspec *k = kspec_of(type);
    kblock kb;
    float D[16], M[16];
    if (kquant(k, x, w, &kb))
        return -1;
    for (int j = 0; j < k->nsub; j++)
        D[j] = kb.d * (float)kb.sc[j], M[j] = -kb.dmin * (float)kb.mn[j];
    sweep(&k->c, x, QK_K, k->sub, D, M, U, ldu, kb.L, E);
    pack_k(type, &kb, out);
    return 0;
}
