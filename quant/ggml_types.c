/* llama.cpp's tensor types (ggml_types.h): the traits table, and the
 * packers and reference dequantizers of the types stz writes. */
#include "ggml_types.h"
#include "stz_kernels.h"
#include "core/stz_core.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- floats ---------------------------------------------------------- */

static long pack_float(stz_dtype d, const float *v, size_t n, uint8_t *out)
{
    return stz_from_f32(d, v, n, out, NULL) ? 0 : -1;
}
static long pack_f32(const float *v, const float *s, size_t n, uint8_t *o)
{
    return (void)s, pack_float(STZ_DTYPE_F32, v, n, o);
}
static long pack_f16(const float *v, const float *s, size_t n, uint8_t *o)
{
    return (void)s, pack_float(STZ_DTYPE_F16, v, n, o);
}
static long pack_bf16(const float *v, const float *s, size_t n, uint8_t *o)
{
    return (void)s, pack_float(STZ_DTYPE_BF16, v, n, o);
}

static void deq_f32(const uint8_t *in, size_t n, float *y) { stz_to_f32(STZ_DTYPE_F32, in, n, y, NULL); }
static void deq_f16(const uint8_t *in, size_t n, float *y) { stz_to_f32(STZ_DTYPE_F16, in, n, y, NULL); }
static void deq_bf16(const uint8_t *in, size_t n, float *y) { stz_to_f32(STZ_DTYPE_BF16, in, n, y, NULL); }

/* ---- the 32-blocks with an F16 scale: Q8_0, Q5_0, Q4_0 -------------------- */

/* The blocks' codes q (lo..lo + 2^bits - 1) from values v that are exactly
 * code * scale: the first element that is not, or -1. *h: the F16 scale. */
static long block_codes(const float *x, float s, int lo, int8_t q[STZ_GGML_QK], uint16_t *h)
{
    *h = stz_f32_to_f16(s);
    if (stz_f16_to_f32(*h) != s)
        return 0; /* the scale is not an F16 value */
    for (int j = 0; j < STZ_GGML_QK; j++) {
        long c = lrintf(s != 0 ? x[j] / s : 0);
        if (c < lo || c > -lo - 1 || (float)c * s != x[j])
            return j;
        q[j] = (int8_t)c;
    }
    return -1;
}

/* Q8_0: d (F16), 32 signed bytes. */
static long pack_q8_0(const float *v, const float *scales, size_t n, uint8_t *out)
{
    for (size_t b = 0; b < n / STZ_GGML_QK; b++) {
        int8_t q[STZ_GGML_QK];
        uint16_t h;
        long at = block_codes(v + b * STZ_GGML_QK, scales[b], -128, q, &h);
        if (at >= 0)
            return (long)(b * STZ_GGML_QK) + at;
        uint8_t *o = out + b * 34;
        stz_put_le16(o, h);
        memcpy(o + 2, q, STZ_GGML_QK);
    }
    return -1;
}

void stz_ggml_put_nibbles(const int8_t *L, int lo, int bits, uint8_t *qh, uint8_t *qs)
{
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        unsigned a = (unsigned)(L[j] - lo), b = (unsigned)(L[j + 16] - lo);
        qs[j] = (uint8_t)((a & 15) | (b & 15) << 4);
        h |= (a >> 4 & 1) << j | (b >> 4 & 1) << (j + 16);
    }
    if (bits == 5)
        stz_put_le32(qh, h);
}

/* Q4_0 (d, 16 bytes of nibbles) and Q5_0 (d, 32 high bits, 16 bytes of
 * nibbles), codes stored as code + 2^(bits-1). */
static long pack_q4_q5(int bits, const float *v, const float *scales, size_t n, uint8_t *out)
{
    int lo = -(1 << (bits - 1));
    size_t bb = bits == 5 ? 22 : 18;
    for (size_t b = 0; b < n / STZ_GGML_QK; b++) {
        int8_t q[STZ_GGML_QK];
        uint16_t h;
        long at = block_codes(v + b * STZ_GGML_QK, scales[b], lo, q, &h);
        if (at >= 0)
            return (long)(b * STZ_GGML_QK) + at;
        uint8_t *o = out + b * bb;
        stz_put_le16(o, h);
        stz_ggml_put_nibbles(q, lo, bits, o + 2, o + (bits == 5 ? 6 : 2));
    }
    return -1;
}
static long pack_q4_0(const float *v, const float *s, size_t n, uint8_t *o) { return pack_q4_q5(4, v, s, n, o); }
static long pack_q5_0(const float *v, const float *s, size_t n, uint8_t *o) { return pack_q4_q5(5, v, s, n, o); }

static void deq_q8_0(const uint8_t *in, size_t n, float *y)
{
    for (size_t b = 0; b < n / STZ_GGML_QK; b++, in += 34) {
        float d = stz_f16_to_f32(stz_le16(in));
        for (int j = 0; j < STZ_GGML_QK; j++)
            *y++ = (float)(int8_t)in[2 + j] * d;
    }
}

/* The 32-blocks of nibbles: Q4_0 / Q5_0 (d; value (code - 2^(bits-1)) * d)
 * and Q4_1 / Q5_1 (d, m; value code * d + m). The 5-bit types keep the
 * fifth bits in a 32-bit word before the nibbles; element j is in byte j's
 * low nibble, element j + 16 in its high one. */
static void deq_nibbles(int bits, int with_min, const uint8_t *in, size_t n, float *y)
{
    size_t head = with_min ? 4 : 2, qso = head + (bits == 5 ? 4 : 0);
    int off = with_min ? 0 : 1 << (bits - 1);
    for (size_t b = 0; b < n / STZ_GGML_QK; b++, in += qso + 16, y += STZ_GGML_QK) {
        float d = stz_f16_to_f32(stz_le16(in)), m = with_min ? stz_f16_to_f32(stz_le16(in + 2)) : 0;
        uint32_t qh = bits == 5 ? stz_le32(in + head) : 0;
        const uint8_t *qs = in + qso;
        for (int j = 0; j < 16; j++) {
            int a = (qs[j] & 15) | (int)((qh >> j) & 1) << 4, c = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            if (with_min)
                y[j] = (float)a * d + m, y[j + 16] = (float)c * d + m;
            else
                y[j] = (float)(a - off) * d, y[j + 16] = (float)(c - off) * d;
        }
    }
}
static void deq_q4_0(const uint8_t *in, size_t n, float *y) { deq_nibbles(4, 0, in, n, y); }
static void deq_q5_0(const uint8_t *in, size_t n, float *y) { deq_nibbles(5, 0, in, n, y); }
static void deq_q4_1(const uint8_t *in, size_t n, float *y) { deq_nibbles(4, 1, in, n, y); }
static void deq_q5_1(const uint8_t *in, size_t n, float *y) { deq_nibbles(5, 1, in, n, y); }

/* ---- the super-blocks of 256: Q2_K .. Q6_K, IQ4_XS; and IQ4_NL ---------------- */

#define QK_K 256

/* Q4_K / Q5_K: the 6-bit scale and minimum of sub-block j from the 12 packed bytes. */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63, *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Q2_K: scales[16] (4-bit scale, 4-bit minimum), qs[64], d, dmin. */
static void deq_q2_k(const uint8_t *in, size_t n, float *y)
{
    for (size_t b = 0; b < n / QK_K; b++, in += 84) {
        const uint8_t *sc = in, *q = in + 16;
        float d = stz_f16_to_f32(stz_le16(in + 80)), min = stz_f16_to_f32(stz_le16(in + 82));
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int k = 0; k < 2; k++, is++) {
                    float dl = d * (float)(sc[is] & 0xF), ml = min * (float)(sc[is] >> 4);
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * (float)((q[l + 16 * k] >> shift) & 3) - ml;
                }
    }
}

/* Q3_K: hmask[32], qs[64], scales[12] (16 6-bit scales, offset 32), d. */
static void deq_q3_k(const uint8_t *in, size_t n, float *y)
{
    for (size_t b = 0; b < n / QK_K; b++, in += 110) {
        const uint8_t *hm = in, *q = in + 32, *s = in + 96;
        float d = stz_f16_to_f32(stz_le16(in + 108));
        int8_t sc[16];
        for (int j = 0; j < 16; j++) {
            int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4, hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
            sc[j] = (int8_t)((lo | hi << 4) - 32);
        }
        int is = 0;
        uint8_t m = 1;
        for (int half = 0; half < 2; half++, q += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1)
                for (int k = 0; k < 2; k++, is++) {
                    float dl = d * (float)sc[is];
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * (float)(((q[l + 16 * k] >> shift) & 3) - ((hm[l + 16 * k] & m) ? 0 : 4));
                }
    }
}

/* Q4_K: d, dmin, scales[12], qs[128]; Q5_K adds qh[32] before qs. */
static void deq_q4_q5_k(int bits, const uint8_t *in, size_t n, float *y)
{
    size_t bb = bits == 5 ? 176 : 144;
    for (size_t b = 0; b < n / QK_K; b++, in += bb) {
        float d = stz_f16_to_f32(stz_le16(in)), min = stz_f16_to_f32(stz_le16(in + 2));
        const uint8_t *scales = in + 4, *qh = in + 16, *q = in + (bits == 5 ? 48 : 16);
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < 8; j += 2, q += 32, u1 <<= 2, u2 <<= 2) {
            uint8_t sc, m;
            scale_min_k4(j, scales, &sc, &m);
            float d1 = d * (float)sc, m1 = min * (float)m;
            scale_min_k4(j + 1, scales, &sc, &m);
            float d2 = d * (float)sc, m2 = min * (float)m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((q[l] & 0xF) + (bits == 5 && (qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((q[l] >> 4) + (bits == 5 && (qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}
static void deq_q4_k(const uint8_t *in, size_t n, float *y) { deq_q4_q5_k(4, in, n, y); }
static void deq_q5_k(const uint8_t *in, size_t n, float *y) { deq_q4_q5_k(5, in, n, y); }

/* Q6_K: ql[128], qh[64], scales[16] (signed), d. */
static void deq_q6_k(const uint8_t *in, size_t n, float *y)
{
    for (size_t b = 0; b < n / QK_K; b++, in += 210) {
        const uint8_t *ql = in, *qh = in + 128;
        const int8_t *sc = (const int8_t *)(in + 192);
        float d = stz_f16_to_f32(stz_le16(in + 208));
        for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8)
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32;
                int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32;
                int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[l] = d * (float)sc[is] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
    }
}

const int8_t stz_iq4nl_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* 2 * half elements from the nibbles qs[half] (element j low, j + half
 * high), each the level its nibble indexes times d. */
static void nibble_levels(const int8_t *levels, const uint8_t *qs, int half, float d, float *y)
{
    for (int j = 0; j < half; j++)
        y[j] = d * (float)levels[qs[j] & 0xF], y[j + half] = d * (float)levels[qs[j] >> 4];
}

/* IQ4_NL: d, 16 bytes of nibbles. */
static void deq_iq4_nl(const uint8_t *in, size_t n, float *y)
{
    for (size_t b = 0; b < n / STZ_GGML_QK; b++, in += 18, y += STZ_GGML_QK)
        nibble_levels(stz_iq4nl_levels, in + 2, 16, stz_f16_to_f32(stz_le16(in)), y);
}

/* IQ4_XS: d, scales_h (2 high bits per sub-block), scales_l[4] (4 low
 * bits), qs[128]; sub-block scales offset 32. */
static void deq_iq4_xs(const uint8_t *in, size_t n, float *y)
{
    for (size_t b = 0; b < n / QK_K; b++, in += 136) {
        float d = stz_f16_to_f32(stz_le16(in));
        unsigned sh = stz_le16(in + 2);
        for (int ib = 0; ib < 8; ib++, y += 32) {
            int ls = ((in[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (int)((sh >> (2 * ib)) & 3) << 4;
            nibble_levels(stz_iq4nl_levels, in + 8 + 16 * ib, 16, d * (float)(ls - 32), y);
        }
    }
}

/* ---- read only: the ternary types and the FP4 ones ------------------------ */

/* TQ2_0: qs[64], d; element e is the bits 2 * ((e % 128) / 32) of byte
 * 32 * (e / 128) + e % 32, and y = (q - 1) d. */
static void deq_tq2_0(const uint8_t *in, size_t n, float *y)
{
    for (size_t b = 0; b < n / QK_K; b++, in += 66) {
        float d = stz_f16_to_f32(stz_le16(in + 64));
        for (int e = 0; e < QK_K; e++)
            *y++ = (float)(((in[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3) - 1) * d;
    }
}

/* The trit k (0 the most significant) of a TQ1_0 byte q: the byte holds
 * ceil(t * 256 / 243) for five trits t read as a base-3 fraction, so the
 * trit is the integer part of 3 * (q * 3^k mod 256) / 256. */
static inline int trit(uint8_t q, int k)
{
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    return (int)(((unsigned)(uint8_t)(q * pow3[k]) * 3) >> 8);
}

/* TQ1_0: qs[48] (the first 32 bytes five trits each, trit k of byte m
 * element 32 k + m; the next 16 the same by 16s from element 160), qh[4]
 * (four trits each, trit k of byte m element 240 + 4 k + m), d. */
static void deq_tq1_0(const uint8_t *in, size_t n, float *y)
{
    for (size_t b = 0; b < n / QK_K; b++, in += 54, y += QK_K) {
        float d = stz_f16_to_f32(stz_le16(in + 52));
        for (int k = 0; k < 5; k++)
            for (int m = 0; m < 32; m++)
                y[32 * k + m] = (float)(trit(in[m], k) - 1) * d;
        for (int k = 0; k < 5; k++)
            for (int m = 0; m < 16; m++)
                y[160 + 16 * k + m] = (float)(trit(in[32 + m], k) - 1) * d;
        for (int k = 0; k < 4; k++)
            for (int m = 0; m < 4; m++)
                y[240 + 4 * k + m] = (float)(trit(in[48 + m], k) - 1) * d;
    }
}

/* E2M1 (FP4) values doubled, by code (ggml's kvalues_mxfp4). */
static const int8_t fp4_levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* MXFP4: e (E8M0: 2^(e - 127), halved for the doubled levels), qs[16]. */
static void deq_mxfp4(const uint8_t *in, size_t n, float *y)
{
    for (size_t b = 0; b < n / 32; b++, in += 17, y += 32)
        nibble_levels(fp4_levels, in + 1, 16, ldexpf(1.0f, (int)in[0] - 128), y);
}

/* UE4M3 (4 exponent bits, bias 7, 3 mantissa bits; 0 and 0x7f are 0),
 * halved for the doubled levels. */
static float ue4m3_half(uint8_t x)
{
    int e = (x >> 3) & 0xF, m = x & 7;
    if (x == 0 || x == 0x7F)
        return 0.0f;
    return (e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m, -9)) * 0.5f;
}

/* NVFP4: d[4] (UE4M3, one per sub-block of 16), qs[32] (8 bytes per
 * sub-block, element j in byte j's low nibble, j + 8 in its high one). */
static void deq_nvfp4(const uint8_t *in, size_t n, float *y)
{
    for (size_t b = 0; b < n / 64; b++, in += 36)
        for (int s = 0; s < 4; s++, y += 16)
            nibble_levels(fp4_levels, in + 4 + 8 * s, 8, ue4m3_half(in[s]), y);
}

/* ---- the table --------------------------------------------------------- */

/* Floats: converted (F16 past its range is an error, as a scale would be). */
static int conv_float(stz_dtype d, const float *x, size_t n, uint8_t *out)
{
    if (stz_from_f32(d, x, n, out, NULL))
        return -1;
    for (size_t i = 0; d == STZ_DTYPE_F16 && i < n; i++)
        if ((stz_le16(out + 2 * i) & 0x7c00) == 0x7c00)
            return -1;
    return 0;
}
static int conv_f32(int t, const float *x, const float *w, size_t n, uint8_t *o)
{
    return (void)t, (void)w, conv_float(STZ_DTYPE_F32, x, n, o);
}
static int conv_f16(int t, const float *x, const float *w, size_t n, uint8_t *o)
{
    return (void)t, (void)w, conv_float(STZ_DTYPE_F16, x, n, o);
}
static int conv_bf16(int t, const float *x, const float *w, size_t n, uint8_t *o)
{
    return (void)t, (void)w, conv_float(STZ_DTYPE_BF16, x, n, o);
}
#define Q32  stz_ggml_quant32
#define Q256 stz_ggml_quant256

#define ROW(ty, nm, blk, by, pk, dq, qz, b, lb)                                                                        \
    .type = ty, .name = nm, .block = blk, .bytes = by, .pack = pk, .dequantize_ref = dq, .quantize = qz, .bits = b,    \
    .lib = lb
// clang-format off
#define F(n, o, l) {n, o, l, STZ_FIELD_BYTES}
// clang-format on
// clang-format off
#define H(n, o) {n, o, 2, STZ_FIELD_F16}
// clang-format on
// clang-format off
#define C(n, o, l) {n, o, l, STZ_FIELD_CODES}
// clang-format on

/* Every ggml type a GGUF file may hold. 31-33 and 36-38 were withdrawn
 * from GGUF files. Read but not written: tq1_0, tq2_0, mxfp4, nvfp4, and
 * through llama.cpp's library the IQ1-IQ3 types. */
static const stz_ggml_traits types[] = {
    {ROW(STZ_GGML_F32, "f32", 1, 4, pack_f32, deq_f32, conv_f32, 32, 0), .ftype = 0},
    {ROW(STZ_GGML_F16, "f16", 1, 2, pack_f16, deq_f16, conv_f16, 16, 0), .ftype = 1, .policy = 13, .tune = 1},
    {ROW(STZ_GGML_Q4_0, "q4_0", 32, 18, pack_q4_0, deq_q4_0, Q32, 4, 0), .ftype = 2, .policy = 1, .tune = 9,
     .fields = {H("d", 0), F("qs", 2, 16)}},
    {ROW(STZ_GGML_Q4_1, "q4_1", 32, 20, NULL, deq_q4_1, Q32, 4, 0), .ftype = 3, .policy = 2, .tune = 8,
     .fields = {H("d", 0), H("m", 2), F("qs", 4, 16)}},
    {ROW(STZ_GGML_Q5_0, "q5_0", 32, 22, pack_q5_0, deq_q5_0, Q32, 5, 0), .ftype = 8, .policy = 3, .tune = 6,
     .codes = STZ_CODES_Q5, .fields = {H("d", 0), C("qh", 2, 4), C("qs", 6, 16)}},
    {ROW(STZ_GGML_Q5_1, "q5_1", 32, 24, NULL, deq_q5_1, Q32, 5, 0), .ftype = 9, .policy = 4, .tune = 5,
     .codes = STZ_CODES_Q5, .fields = {H("d", 0), H("m", 2), C("qh", 4, 4), C("qs", 8, 16)}},
    {ROW(STZ_GGML_Q8_0, "q8_0", 32, 34, pack_q8_0, deq_q8_0, Q32, 8, 0), .ftype = 7, .policy = 5, .tune = 2,
     .fields = {H("d", 0), F("qs", 2, 32)}},
    {ROW(9, "q8_1", 32, 36, NULL, NULL, NULL, 0, 0)},
    {ROW(STZ_GGML_Q2_K, "q2_k", 256, 84, NULL, deq_q2_k, Q256, 2, 0), .ftype = 10, .policy = 7, .tune = 13,
     .fields = {F("scales", 0, 16), F("qs", 16, 64), H("d", 80), H("dmin", 82)}},
    {ROW(STZ_GGML_Q3_K, "q3_k", 256, 110, NULL, deq_q3_k, Q256, 3, 0), .ftype = 12, .policy = 8, .tune = 12,
     .fields = {F("hmask", 0, 32), F("qs", 32, 64), F("scales", 96, 12), H("d", 108)}},
    {ROW(STZ_GGML_Q4_K, "q4_k", 256, 144, NULL, deq_q4_k, Q256, 4, 0), .ftype = 15, .policy = 9, .tune = 7,
     .codes = STZ_CODES_Q4_K, .fields = {H("d", 0), H("dmin", 2), F("scales", 4, 12), C("qs", 16, 128)}},
    {ROW(STZ_GGML_Q5_K, "q5_k", 256, 176, NULL, deq_q5_k, Q256, 5, 0), .ftype = 17, .policy = 10, .tune = 4,
     .codes = STZ_CODES_Q5_K,
     .fields = {H("d", 0), H("dmin", 2), F("scales", 4, 12), C("qh", 16, 32), C("qs", 48, 128)}},
    {ROW(STZ_GGML_Q6_K, "q6_k", 256, 210, NULL, deq_q6_k, Q256, 6, 0), .ftype = 18, .policy = 11, .tune = 3,
     .codes = STZ_CODES_Q6_K, .fields = {C("ql", 0, 128), C("qh", 128, 64), F("scales", 192, 16), H("d", 208)}},
    {ROW(15, "q8_k", 256, 292, NULL, NULL, NULL, 0, 0)},
    {ROW(16, "iq2_xxs", 256, 66, NULL, NULL, NULL, 0, 1)},
    {ROW(17, "iq2_xs", 256, 74, NULL, NULL, NULL, 0, 1)},
    {ROW(18, "iq3_xxs", 256, 98, NULL, NULL, NULL, 0, 1)},
    {ROW(19, "iq1_s", 256, 50, NULL, NULL, NULL, 0, 1)},
    {ROW(STZ_GGML_IQ4_NL, "iq4_nl", 32, 18, NULL, deq_iq4_nl, Q32, 4, 0), .ftype = 25, .policy = 6, .tune = 10,
     .fields = {H("d", 0), F("qs", 2, 16)}},
    {ROW(21, "iq3_s", 256, 110, NULL, NULL, NULL, 0, 1)},
    {ROW(22, "iq2_s", 256, 82, NULL, NULL, NULL, 0, 1)},
    {ROW(STZ_GGML_IQ4_XS, "iq4_xs", 256, 136, NULL, deq_iq4_xs, Q256, 4, 0), .ftype = 30, .policy = 12, .tune = 11,
     .fields = {H("d", 0), F("scales_h", 2, 2), F("scales_l", 4, 4), F("qs", 8, 128)}},
    {ROW(24, "i8", 1, 1, NULL, NULL, NULL, 0, 0)},
    {ROW(25, "i16", 1, 2, NULL, NULL, NULL, 0, 0)},
    {ROW(26, "i32", 1, 4, NULL, NULL, NULL, 0, 0)},
    {ROW(27, "i64", 1, 8, NULL, NULL, NULL, 0, 0)},
    {ROW(28, "f64", 1, 8, NULL, NULL, NULL, 0, 0)},
    {ROW(29, "iq1_m", 256, 56, NULL, NULL, NULL, 0, 1)},
    {ROW(STZ_GGML_BF16, "bf16", 1, 2, pack_bf16, deq_bf16, conv_bf16, 16, 0), .ftype = 32, .policy = 14},
    {ROW(34, "tq1_0", 256, 54, NULL, deq_tq1_0, NULL, 0, 0)},
    {ROW(35, "tq2_0", 256, 66, NULL, deq_tq2_0, NULL, 0, 0)},
    {ROW(39, "mxfp4", 32, 17, NULL, deq_mxfp4, NULL, 0, 0)},
    {ROW(40, "nvfp4", 64, 36, NULL, deq_nvfp4, NULL, 0, 0)},
};
#define NTYPES (sizeof types / sizeof types[0])
#undef ROW
#undef F
#undef H
#undef C

const stz_ggml_traits *stz_ggml_traits_of_policy(int k)
{
    for (size_t i = 0; k > 0 && i < NTYPES; i++)
        if (types[i].policy == k)
            return &types[i];
    return NULL;
}

const stz_ggml_traits *stz_ggml_traits_of(int type)
{
    for (size_t i = 0; i < NTYPES; i++)
        if (types[i].type == type)
            return &types[i];
    return NULL;
}

char *stz_ggml_type_names(char *buf, size_t cap, int lib)
{
    size_t at = 0;
    buf[0] = 0;
    for (size_t i = 0; i < NTYPES && at < cap; i++)
        if (lib ? types[i].lib : types[i].dequantize_ref != NULL)
            at += (size_t)snprintf(buf + at, cap - at, "%s%s", at ? ", " : "", types[i].name);
    return buf;
}

const char *stz_ggml_type_written(size_t i)
{
    for (size_t k = 0; k < NTYPES; k++)
        if (types[k].quantize && i-- == 0)
            return types[k].name;
    return NULL;
}

int stz_ggml_is_block(int type)
{
    const stz_ggml_traits *t = stz_ggml_traits_of(type);
    return t && t->quantize && t->block > 1;
}

const char *stz_ggml_type_name(int type)
{
    const stz_ggml_traits *t = stz_ggml_traits_of(type);
    return t ? t->name : NULL;
}

int stz_ggml_type_parse(const char *s)
{
    if (!strcmp(s, "auto"))
        return STZ_GGML_AUTO;
    for (size_t i = 0; i < NTYPES; i++)
        if (types[i].quantize && !strcmp(types[i].name, s))
            return types[i].type;
    return -2;
}

uint64_t stz_ggml_row_bytes(int type, uint64_t n)
{
    const stz_ggml_traits *t = stz_ggml_traits_of(type);
    return t ? (n + t->block - 1) / t->block * t->bytes : 0;
}

uint32_t stz_ggml_block(int type)
{
    const stz_ggml_traits *t = stz_ggml_traits_of(type);
    return t ? t->block : 0;
}

int stz_ggml_quantize_row(int type, const float *x, const float *w, size_t n, uint8_t *out)
{
    const stz_ggml_traits *t = stz_ggml_traits_of(type);
    return t && t->quantize && n % t->block == 0 ? t->quantize(type, x, w, n, out) : -1;
}

int stz_ggml_can_decode(const stz_ggml_traits *t, char *why, size_t n)
{
    if (t->dequantize_ref || (t->lib && stz_ggml_lib_decoder(t, why, n)))
        return 1;
    if (!t->lib)
        snprintf(why, n, "stz has no decoder for it");
    return 0;
}

void stz_ggml_decode(const stz_ggml_traits *t, const uint8_t *in, size_t n, float *y)
{
    if (t->dequantize_ref)
        t->dequantize_ref(in, n, y);
    else
        stz_ggml_lib_decoder(t, NULL, 0)(in, y, (int64_t)n);
}

int stz_ggml_dequantize_row(int type, const uint8_t *in, size_t n, float *y)
{
    const stz_ggml_traits *t = stz_ggml_traits_of(type);
    if (!t || n % t->block || !stz_ggml_can_decode(t, NULL, 0))
        return -1;
    stz_ggml_decode(t, in, n, y);
    return 0;
}

int stz_ggml_fit(int type, uint64_t n, int pad)
{
    if (pad && stz_ggml_is_block(type) && n % STZ_GGML_QK)
        return stz_ggml_block(type) == STZ_GGML_QK ? type : stz_ggml_fallback(type, STZ_GGML_QK);
    return stz_ggml_fallback(type, n);
}

int stz_ggml_fallback(int type, uint64_t n)
{
    uint32_t b = stz_ggml_block(type);
    if (b && n % b == 0)
        return type;
    if (b == 256 && n % STZ_GGML_QK == 0)
        return type == STZ_GGML_Q4_K   ? STZ_GGML_Q5_0
               : type == STZ_GGML_Q5_K ? STZ_GGML_Q5_1
               : type == STZ_GGML_Q6_K ? STZ_GGML_Q8_0
                                       : STZ_GGML_IQ4_NL;
    return STZ_GGML_F16;
}
