/* Block-wise symmetric quantization kernels (scalar reference) and float
 * conversions. See stz_quant.h for the exact definitions. */
#include "core/stz_core.h"
#include "stz_kernels.h"
#include "stz_quant.h"

#include <math.h>
#include <string.h>

/* The smallest value of the scale dtype that is >= s (s >= 0), or -1 if
 * none is finite. */
static float round_up_scale(float s, stz_dtype sd)
{
    if (sd == STZ_DTYPE_F32)
        return s;
    uint16_t h = stz_f32_to_f16(s);
    float r = stz_f16_to_f32(h);
    if (r < s)
        r = stz_f16_to_f32((uint16_t)(h + 1)); /* next F16 up (s >= 0) */
    return isinf(r) ? -1.0f : r;
}

/* Nearest value of the scale dtype (either sign); -1 flag via isinf. */
static float round_scale(float s, stz_dtype sd) { return sd == STZ_DTYPE_F32 ? s : stz_f16_to_f32(stz_f32_to_f16(s)); }

/* round half away from zero, as a cheap conversion the compiler vectorises */
static inline int rnd(float v) { return (int)(v + (v < 0 ? -0.5f : 0.5f)); }

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Quantizes one block x[n] to q[n] in [lo, hi] with scale s (0: zeros). */
static void quant_block(const float *x, size_t n, float s, int lo, int hi, int8_t *q)
{
    float inv = s != 0 ? 1.0f / s : 0.0f;
    for (size_t i = 0; i < n; i++)
        q[i] = (int8_t)clampi(rnd(x[i] * inv), lo, hi);
}

static double block_sse(const float *x, size_t n, float s, int lo, int hi)
{
    float inv = s != 0 ? 1.0f / s : 0.0f;
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        float d = x[i] - (float)clampi(rnd(x[i] * inv), lo, hi) * s;
        e += (double)d * d;
    }
    return e;
}

/* Chooses the scale of one block; returns 0 or -1 if it cannot be stored. */
static int block_scale(const float *x, size_t n, int qmax, stz_qmethod m, stz_dtype sd, float *scale, int *lo)
{
    float amax = 0, vmax = 0;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) > amax)
            amax = fabsf(x[i]), vmax = x[i];
    *lo = -qmax;
    if (amax == 0) {
        *scale = 0;
        return 0;
    }
    float s = round_up_scale(amax / (float)qmax, sd);
    if (s < 0)
        return -1;
    if (s == 0) /* amax / qmax underflows the scale dtype: smallest step */
        s = sd == STZ_DTYPE_F32 ? 1e-45f : stz_f16_to_f32(1);
    *scale = s;
    if (m != STZ_QMETHOD_MSE)
        return 0;
    /* Clip search over [-(qmax+1), qmax]: candidate steps map the largest
     * magnitude to qmax or to -(qmax+1) (negative scale when it is
     * positive), shrunk by up to 28% in steps of 4%. */
    double best = block_sse(x, n, s, -qmax, qmax);
    for (int neg = 0; neg < 2; neg++)
        for (int f = 0; f < 8; f++) {
            float c = (1.0f - 0.04f * (float)f) * (neg ? -vmax / (float)(qmax + 1) : amax / (float)qmax);
            c = round_scale(c, sd);
            if (c == 0 || isinf(c))
                continue;
            double e = block_sse(x, n, c, -qmax - 1, qmax);
            if (e < best)
                best = e, *scale = c, *lo = -qmax - 1;
        }
    return 0;
}

int stz_q8_quantize_ref(const float *x, size_t n, size_t block, stz_qmethod m, stz_dtype sd, int8_t *q, float *scales)
{
    for (size_t b = 0, i = 0; i < n; b++, i += block) {
        size_t len = n - i < block ? n - i : block;
        int lo;
        if (block_scale(x + i, len, 127, m, sd, &scales[b], &lo))
            return -1;
        quant_block(x + i, len, scales[b], lo, 127, q + i);
    }
    return 0;
}

int stz_q4_quantize_ref(const float *x, size_t n, size_t block, stz_qmethod m, stz_dtype sd, uint8_t *q, float *scales)
{
    int8_t tmp[256];
    memset(q, 0, stz_q_row_bytes(4, n));
    for (size_t b = 0, i = 0; i < n; b++, i += block) {
        size_t len = n - i < block ? n - i : block;
        int lo;
        if (block_scale(x + i, len, 7, m, sd, &scales[b], &lo))
            return -1;
        for (size_t k = 0; k < len; k += sizeof tmp) { /* bounded stack for any block size */
            size_t piece = len - k < sizeof tmp ? len - k : sizeof tmp;
            quant_block(x + i + k, piece, scales[b], lo, 7, tmp);
            for (size_t j = 0; j < piece; j++) {
                size_t e = i + k + j; /* element index in the row: its pair is e / 2 */
                q[e / 2] |= (uint8_t)((tmp[j] & 0x0f) << (e & 1 ? 0 : 4));
            }
        }
    }
    return 0;
}

void stz_q8_dequantize_ref(const int8_t *q, const float *scales, size_t n, size_t block, float *y)
{
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += block) {
        size_t end = n - i0 < block ? n : i0 + block;
        float s = scales[b];
        for (size_t i = i0; i < end; i++)
            y[i] = (float)q[i] * s;
    }
}

/* Element i is the high nibble of byte i/2 when i is even, the low one when
 * odd, as 4-bit two's complement. */
static inline float nibble(const uint8_t *q, size_t i)
{
    uint8_t byte = q[i / 2];
    return (float)(i & 1 ? (int8_t)(uint8_t)(byte << 4) >> 4 : (int8_t)byte >> 4);
}

void stz_q4_dequantize_ref(const uint8_t *q, const float *scales, size_t n, size_t block, float *y)
{
    for (size_t b = 0, i0 = 0; i0 < n; b++, i0 += block) {
        size_t end = n - i0 < block ? n : i0 + block, i = i0;
        float s = scales[b];
        if (i & 1) /* a block starting mid-byte */
            y[i] = nibble(q, i) * s, i++;
        for (; i + 1 < end; i += 2) { /* whole bytes */
            uint8_t byte = q[i / 2];
            y[i] = (float)((int8_t)byte >> 4) * s;
            y[i + 1] = (float)((int8_t)(uint8_t)(byte << 4) >> 4) * s;
        }
        if (i < end)
            y[i] = nibble(q, i) * s;
    }
}

/* ---- float conversions ------------------------------------------------ */

/* BF16 to F32 in a loop the compiler vectorises (a little-endian load). */
STZ_CLONES("arch=x86-64-v4", "avx2", "default")
static void bf16_to_f32(const uint8_t *src, size_t n, float *dst)
{
    for (size_t i = 0; i < n; i++) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
#else
        uint16_t h = stz_le16(src + 2 * i);
#endif
        dst[i] = stz_bf16_to_f32(h);
    }
}

stz_status stz_to_f32(stz_dtype d, const uint8_t *src, size_t n, float *dst, stz_err *err)
{
    switch (d) {
    case STZ_DTYPE_BF16: bf16_to_f32(src, n, dst); return STZ_OK;
    case STZ_DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = stz_f16_to_f32(stz_le16(src + 2 * i));
        return STZ_OK;
    case STZ_DTYPE_F32:
        for (size_t i = 0; i < n; i++) {
            uint32_t u = stz_le32(src + 4 * i);
            memcpy(&dst[i], &u, 4);
        }
        return STZ_OK;
    case STZ_DTYPE_F64:
        for (size_t i = 0; i < n; i++) {
            uint64_t u = stz_le64(src + 8 * i);
            double v;
            memcpy(&v, &u, 8);
            dst[i] = (float)v;
        }
        return STZ_OK;
    default: return stz_err_set(err, STZ_E_DTYPE, "cannot convert %s to F32", stz_dtype_name(d));
    }
}

stz_status stz_from_f32(stz_dtype d, const float *src, size_t n, uint8_t *dst, stz_err *err)
{
    switch (d) {
    case STZ_DTYPE_BF16:
        for (size_t i = 0; i < n; i++)
            stz_put_le16(dst + 2 * i, stz_f32_to_bf16(src[i]));
        return STZ_OK;
    case STZ_DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            stz_put_le16(dst + 2 * i, stz_f32_to_f16(src[i]));
        return STZ_OK;
    case STZ_DTYPE_F32:
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &src[i], 4);
            stz_put_le32(dst + 4 * i, u);
        }
        return STZ_OK;
    case STZ_DTYPE_F64:
        for (size_t i = 0; i < n; i++) {
            double v = src[i];
            uint64_t u;
            memcpy(&u, &v, 8);
            stz_put_le64(dst + 8 * i, u);
        }
        return STZ_OK;
    default: return stz_err_set(err, STZ_E_DTYPE, "cannot convert F32 to %s", stz_dtype_name(d));
    }
}
