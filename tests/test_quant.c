/* INT8 / INT4 kernels of the first version against their definition:
 * bounds, packing order, hard blocks, mse never worse than absmax; the
 * ggml block types' packers and reference dequantizers against the
 * layouts of ggml-common.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "stz_eval.h"
#include "stz_kernels.h"
#include "core/stz_core.h"
#include "quant/ggml_types.h"
#include "quant/quant_tensor.h"
#include "stz_policy.h"
#include "stz_pack.h"
#include "stz_pipeline.h"
#include "stz_quant.h"
#include "stz_safetensors.h"
#include "stz_synth.h"
#include "test_util.h"

#include <math.h>

static uint64_t seed = 7;
/* roughly normal values */
static float frand(void) { return tu_normal(&seed); }

/* ---- kernels --------------------------------------------------------- */

static void check_row(const float *x, size_t n, size_t block, int bits, stz_qmethod m, stz_dtype sd)
{
    size_t nb = stz_q_blocks(n, block);
    uint8_t *q = malloc(n + 2);
    float *sc = malloc(nb * sizeof *sc), *y = malloc(n * sizeof *y);
    int rc = bits == 8 ? stz_q8_quantize_ref(x, n, block, m, sd, (int8_t *)q, sc)
                       : stz_q4_quantize_ref(x, n, block, m, sd, q, sc);
    assert_int_equal(rc, 0);
    if (bits == 8)
        stz_q8_dequantize_ref((int8_t *)q, sc, n, block, y);
    else
        stz_q4_dequantize_ref(q, sc, n, block, y);
    for (size_t b = 0; b < nb; b++) {
        float s = sc[b];
        if (sd == STZ_DTYPE_F16) /* representable in the scale dtype */
            assert_true(stz_f16_to_f32(stz_f32_to_f16(s)) == s);
        for (size_t i = b * block; i < n && i < (b + 1) * block; i++) {
            if (m == STZ_QMETHOD_ABSMAX && fabsf(x[i] - y[i]) > fabsf(s) * 0.5f * (1 + 1e-6f) + 1e-30f)
                fail_msg("bits %d n %zu block %zu elem %zu: |%g - %g| > scale %g / 2", bits, n, block, i, x[i], y[i],
                         s);
            if (s == 0)
                assert_true(y[i] == 0 && x[i] == 0);
        }
    }
    if (bits == 4 && n % 2) /* padding nibble is zero */
        assert_int_equal(q[n / 2] & 0x0f, 0);
    free(q), free(sc), free(y);
}

static void test_kernel_bounds_odd_lengths(void **state)
{
    (void)state;
    static const size_t lens[] = {1, 2, 3, 5, 7, 31, 127, 128, 129, 255, 256, 257, 1000, 1023};
    static const size_t blocks[] = {1, 3, 32, 128};
    float *x = malloc(2048 * sizeof *x);
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (size_t bi = 0; bi < sizeof blocks / sizeof blocks[0]; bi++)
            for (int bits = 4; bits <= 8; bits += 4)
                for (int sd = 0; sd < 2; sd++)
                    for (int m = 0; m < 2; m++) {
                        for (size_t i = 0; i < lens[li]; i++)
                            x[i] = frand() * 0.05f;
                        check_row(x, lens[li], blocks[bi], bits, (stz_qmethod)m, sd ? STZ_DTYPE_F32 : STZ_DTYPE_F16);
                    }
    free(x);
}

static void test_hard_blocks(void **state)
{
    (void)state;
    float x[300];
    for (int bits = 4; bits <= 8; bits += 4) {
        memset(x, 0, sizeof x); /* all zero: scale 0, zeros, never NaN */
        check_row(x, 300, 128, bits, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F16);
        for (int i = 0; i < 300; i++)
            x[i] = 0.25f; /* constant */
        check_row(x, 300, 128, bits, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F16);
        check_row(x, 300, 128, bits, STZ_QMETHOD_MSE, STZ_DTYPE_F16);
        for (int i = 0; i < 300; i++)
            x[i] = frand() * 1e-3f;
        x[5] = 40.0f; /* a huge outlier in the first block only */
        x[200] = -1e-9f;
        check_row(x, 300, 128, bits, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F16);
        for (int i = 0; i < 300; i++)
            x[i] = ldexpf(frand(), -30); /* scales in F16's subnormal range */
        check_row(x, 300, 64, bits, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F16);
    }
    /* a scale above F16's range needs F32 */
    float big[4] = {1e7f, -2e7f, 3.0f, 0};
    int8_t q8[4];
    float sc;
    assert_int_equal(stz_q8_quantize_ref(big, 4, 4, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F16, q8, &sc), -1);
    assert_int_equal(stz_q8_quantize_ref(big, 4, 4, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F32, q8, &sc), 0);
    assert_int_equal(q8[1], -127);
}

static void test_int4_packing_order(void **state)
{
    (void)state;
    float x[5] = {7, -7, 1, 0, 3}; /* F32 scale exactly 1 */
    uint8_t q[3];
    float sc;
    assert_int_equal(stz_q4_quantize_ref(x, 5, 8, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F32, q, &sc), 0);
    assert_true(sc == 1.0f);
    assert_int_equal(q[0], 0x79); /* 7 high, -7 (0x9) low: first value in the high nibble */
    assert_int_equal(q[1], 0x10);
    assert_int_equal(q[2], 0x30); /* odd length: zero low nibble */
    float y[5];
    stz_q4_dequantize_ref(q, &sc, 5, 8, y);
    for (int i = 0; i < 5; i++)
        assert_true(y[i] == x[i]);
    /* mse may use -8 */
    float z[2] = {-8, 3};
    assert_int_equal(stz_q4_quantize_ref(z, 2, 2, STZ_QMETHOD_MSE, STZ_DTYPE_F32, q, &sc), 0);
    stz_q4_dequantize_ref(q, &sc, 2, 2, y);
    assert_true(y[0] == -8 && y[1] == 3);
}

static void test_mse_never_worse(void **state)
{
    (void)state;
    float x[4096], y[4096], sc[64];
    uint8_t q[4096];
    for (int bits = 4; bits <= 8; bits += 4) {
        double e[2] = {0, 0};
        for (int m = 0; m < 2; m++) {
            seed = 99;
            for (int i = 0; i < 4096; i++)
                x[i] = frand() * frand() * 0.1f; /* heavy tails */
            if (bits == 8) {
                stz_q8_quantize_ref(x, 4096, 128, (stz_qmethod)m, STZ_DTYPE_F16, (int8_t *)q, sc);
                stz_q8_dequantize_ref((int8_t *)q, sc, 4096, 128, y);
            } else {
                stz_q4_quantize_ref(x, 4096, 128, (stz_qmethod)m, STZ_DTYPE_F16, q, sc);
                stz_q4_dequantize_ref(q, sc, 4096, 128, y);
            }
            for (int i = 0; i < 4096; i++)
                e[m] += (double)(x[i] - y[i]) * (x[i] - y[i]);
        }
        assert_true(e[1] <= e[0]);
        if (bits == 4)
            assert_true(e[1] < 0.9 * e[0]); /* and clearly better for INT4 */
    }
}

/* ---- ggml block types ------------------------------------------------- */

/* One block of each type written by hand from ggml-common.h (F16 d = 0.5,
 * codes chosen per element) decodes to code * d; packing those values gives
 * the same bytes back; a value off the grid is refused at its index. */
static void test_ggml_blocks_by_hand(void **state)
{
    (void)state;
    static const int types[] = {STZ_GGML_Q4_0, STZ_GGML_Q5_0, STZ_GGML_Q8_0};
    for (size_t k = 0; k < 3; k++) {
        const stz_ggml_traits *t = stz_ggml_traits_of(types[k]);
        assert_non_null(t);
        assert_non_null(t->pack);
        assert_non_null(t->dequantize_ref);
        uint8_t blk[34] = {0}, back[34];
        float want[32], got[32], scale = 0.5f;
        stz_put_le16(blk, 0x3800); /* 0.5 */
        for (int j = 0; j < 32; j++) {
            int code; /* stored form per ggml-common.h */
            if (t->type == STZ_GGML_Q8_0) {
                code = (j * 37) % 256 - 128;
                blk[2 + j] = (uint8_t)(int8_t)code;
            } else {
                int bits = t->type == STZ_GGML_Q5_0 ? 5 : 4, u = (j * 7 + 3) % (1 << bits);
                uint8_t *qs = blk + (bits == 5 ? 6 : 2);
                qs[j % 16] |= (uint8_t)((u & 15) << (j < 16 ? 0 : 4));
                if (bits == 5 && (u >> 4))
                    blk[2 + j / 8] |= (uint8_t)(1u << (j % 8)); /* qh: bit j, little-endian */
                code = u - (1 << (bits - 1));
            }
            want[j] = (float)code * scale;
        }
        t->dequantize_ref(blk, 32, got);
        assert_memory_equal(got, want, sizeof want);
        assert_int_equal(t->pack(want, &scale, 32, back), -1);
        assert_memory_equal(back, blk, t->bytes);
        want[11] += 0.25f; /* between two codes */
        assert_int_equal(t->pack(want, &scale, 32, back), 11);
        float bad = 0.1f; /* not an F16 value */
        assert_int_equal(t->pack(want, &bad, 32, back), 0);
    }
}

/* Every type's row size; the names parse back for the types stz writes. */
static void test_ggml_table(void **state)
{
    (void)state;
    assert_int_equal(stz_ggml_row_bytes(STZ_GGML_Q4_0, 64), 36);
    assert_int_equal(stz_ggml_row_bytes(12, 512), 288); /* q4_k */
    assert_int_equal(stz_ggml_row_bytes(STZ_GGML_BF16, 3), 6);
    assert_int_equal(stz_ggml_row_bytes(31, 32), 0); /* withdrawn */
    assert_null(stz_ggml_type_name(31));
    static const int writes[] = {STZ_GGML_F32,  STZ_GGML_F16,  STZ_GGML_BF16, STZ_GGML_Q4_0,   STZ_GGML_Q4_1,
                                 STZ_GGML_Q5_0, STZ_GGML_Q5_1, STZ_GGML_Q8_0, STZ_GGML_IQ4_NL, STZ_GGML_Q2_K,
                                 STZ_GGML_Q3_K, STZ_GGML_Q4_K, STZ_GGML_Q5_K, STZ_GGML_Q6_K,   STZ_GGML_IQ4_XS};
    for (size_t k = 0; k < sizeof writes / sizeof writes[0]; k++) {
        assert_int_equal(stz_ggml_type_parse(stz_ggml_type_name(writes[k])), writes[k]);
        stz_action a; /* every type stz writes is a policy's action of its name, but F32 */
        int type;
        assert_int_equal(stz_action_parse(stz_ggml_type_name(writes[k]), &a, &type),
                         writes[k] == STZ_GGML_F32 ? -1 : 0);
        assert_int_equal(a, writes[k] == STZ_GGML_F32 ? STZ_ACTION_COUNT : STZ_ACTION_GGML);
        assert_int_equal(type, writes[k] == STZ_GGML_F32 ? -1 : writes[k]);
    }
    assert_int_equal(stz_ggml_type_parse("q8_1"), -2); /* a type stz does not write */
    assert_int_equal(stz_ggml_type_parse("iq2_xxs"), -2);
    assert_int_equal(stz_ggml_type_parse("auto"), STZ_GGML_AUTO);
}

/* An F16 value in [0.01, 1) from the generator. */
static uint16_t f16_scale(void)
{
    float v = 0.01f +
              0.99f * (float)((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 40) / (float)(1 << 24);
    return stz_f32_to_f16(v);
}

/* Element e of one block, written from ggml-common.h's block definitions
 * element by element (the dequantizers work a block at a time). */
static float slow_q_1(int bits, const uint8_t *b, int e)
{
    float d = stz_f16_to_f32(stz_le16(b)), m = stz_f16_to_f32(stz_le16(b + 2));
    const uint8_t *qs = b + (bits == 5 ? 8 : 4);
    int code = e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
    if (bits == 5)
        code |= (int)((stz_le32(b + 4) >> e) & 1) << 4;
    return (float)code * d + m;
}

static float slow_q2_q3_k(int type, const uint8_t *b, int e)
{
    int half = e / 128, group = (e % 128) / 32, k = (e % 32) / 16, l = e % 16, is = half * 8 + group * 2 + k;
    const uint8_t *qs = type == 10 ? b + 16 : b + 32;
    int code = (qs[half * 32 + k * 16 + l] >> (2 * group)) & 3;
    if (type == 10) {
        float d = stz_f16_to_f32(stz_le16(b + 80)), min = stz_f16_to_f32(stz_le16(b + 82));
        return d * (float)(b[is] & 15) * (float)code - min * (float)(b[is] >> 4);
    }
    /* Q3_K: the 16 scales are 6 bits: low nibbles in bytes 0-7 (scale j and j + 8),
     * high pairs in bytes 8-11 (bits 2*(j/4) of byte 8 + j%4) */
    const uint8_t *s = b + 96;
    uint32_t a[3] = {stz_le32(s), stz_le32(s + 4), stz_le32(s + 8)};
    uint32_t lo = (((is % 8) < 4 ? a[0] : a[1]) >> (8 * (is % 4) + 4 * (is / 8))) & 0xF;
    uint32_t hi = (a[2] >> (8 * (is % 4) + 2 * (is / 4))) & 3;
    int sc = (int)(lo | hi << 4) - 32;
    int hbit = (b[k * 16 + l] >> (half * 4 + group)) & 1;
    return stz_f16_to_f32(stz_le16(b + 108)) * (float)sc * (float)(code - (hbit ? 0 : 4));
}

static float slow_q4_q5_k(int type, const uint8_t *b, int e)
{
    int sub = e / 32, l = e % 32;
    const uint8_t *s = b + 4, *qs = b + (type == 13 ? 48 : 16);
    /* 6-bit scale and minimum of sub-block j: j < 4 in bytes j and j + 4; else the
     * low 4 bits in byte j + 4 (scale low nibble, minimum high), the high 2 bits
     * in the top of bytes j - 4 (scale) and j (minimum) */
    int sc = sub < 4 ? s[sub] & 63 : (s[sub + 4] & 15) | (s[sub - 4] >> 6) << 4;
    int mn = sub < 4 ? s[sub + 4] & 63 : (s[sub + 4] >> 4) | (s[sub] >> 6) << 4;
    int byte = qs[(sub / 2) * 32 + l], code = sub % 2 ? byte >> 4 : byte & 15;
    if (type == 13)
        code += ((b[16 + l] >> sub) & 1) << 4;
    float d = stz_f16_to_f32(stz_le16(b)), min = stz_f16_to_f32(stz_le16(b + 2));
    return d * (float)sc * (float)code - min * (float)mn;
}

static float slow_q6_k(const uint8_t *b, int e)
{
    int half = e / 128, quarter = (e % 128) / 32, l = e % 32;
    int byte = b[half * 64 + (quarter % 2) * 32 + l], lo = quarter < 2 ? byte & 15 : byte >> 4;
    int hi = (b[128 + half * 32 + l] >> (2 * quarter)) & 3;
    int8_t sc = (int8_t)b[192 + half * 8 + l / 16 + 2 * quarter];
    return stz_f16_to_f32(stz_le16(b + 208)) * (float)sc * (float)((lo | hi << 4) - 32);
}

static float slow_iq4(int type, const uint8_t *b, int e)
{
    static const int8_t lv[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    float d = stz_f16_to_f32(stz_le16(b));
    if (type == 20)
        return d * (float)lv[e < 16 ? b[2 + e] & 15 : b[2 + e - 16] >> 4];
    int ib = e / 32, j = e % 32;
    int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((stz_le16(b + 2) >> (2 * ib)) & 3) << 4;
    int byte = b[8 + 16 * ib + j % 16];
    return d * (float)(ls - 32) * (float)lv[j < 16 ? byte & 15 : byte >> 4];
}

/* Every type stz reads but does not write, on random blocks (their F16
 * fields set to scales in [0.01, 1)): the dequantizer gives, bit for bit,
 * what the element-by-element definitions give. */
static void test_ggml_dequantizers(void **state)
{
    (void)state;
    static const int types[] = {3, 7, 10, 11, 12, 13, 14, 20, 23};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const stz_ggml_traits *t = stz_ggml_traits_of(types[k]);
        assert_non_null(t->dequantize_ref);
        for (int rep = 0; rep < 20; rep++) {
            uint8_t b[292];
            float got[256];
            for (uint32_t i = 0; i < t->bytes; i++)
                b[i] = (uint8_t)((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 56);
            int type = t->type;
            if (type == 3 || type == 7 || type == 12 || type == 13) /* d, m / dmin first */
                stz_put_le16(b, f16_scale()), stz_put_le16(b + 2, f16_scale());
            else if (type == 10)
                stz_put_le16(b + 80, f16_scale()), stz_put_le16(b + 82, f16_scale());
            else if (type == 11)
                stz_put_le16(b + 108, f16_scale());
            else if (type == 14)
                stz_put_le16(b + 208, f16_scale());
            else
                stz_put_le16(b, f16_scale());
            t->dequantize_ref(b, t->block, got);
            for (int e = 0; e < (int)t->block; e++) {
                float want = type == 3 || type == 7     ? slow_q_1(type == 7 ? 5 : 4, b, e)
                             : type == 10 || type == 11 ? slow_q2_q3_k(type, b, e)
                             : type == 12 || type == 13 ? slow_q4_q5_k(type, b, e)
                             : type == 14               ? slow_q6_k(b, e)
                                                        : slow_iq4(type, b, e);
                if (memcmp(&want, &got[e], sizeof want))
                    fail_msg("%s element %d: %.9g, wanted %.9g", t->name, e, got[e], want);
            }
        }
    }
}

/* ---- error feedback ------------------------------------------------------ */

/* A quantized tensor's values as a reader decodes its stored parts. */
static void qmem_values(const stz_qmem *m, size_t rows, size_t cols, float *y)
{
    size_t rb = stz_qf_bytes(&m->fmt, cols), nb = stz_q_blocks(cols, m->fmt.block), ns = rows * nb;
    float *sc = calloc(ns * 2 + 1, sizeof *sc), *mn = sc + ns;
    for (int k = STZ_PART_SCALES; !m->fmt.ggml && k <= STZ_PART_MINS; k++)
        for (size_t i = 0; m->part[k] && i < ns; i++) {
            float *dst = k == STZ_PART_SCALES ? sc : mn;
            if (m->dtype[k] == STZ_DTYPE_U8)
                dst[i] = stz_qf_scale_value(m->fmt.scale_base, m->part[k][i]);
            else
                assert_int_equal(
                    stz_to_f32(m->dtype[k], m->part[k] + i * (m->dtype[k] == STZ_DTYPE_F16 ? 2 : 4), 1, dst + i, NULL),
                    STZ_OK);
        }
    if (m->fmt.method == STZ_QMETHOD_TRELLIS)
        assert_int_equal(stz_trellis_dequantize_rows(&m->fmt, m->part[STZ_PART_VALUES], 0, rows, 0, rows, sc, cols, y),
                         0);
    for (size_t r = 0; m->fmt.method != STZ_QMETHOD_TRELLIS && r < rows; r++)
        stz_qf_dequantize_row(&m->fmt, m->part[STZ_PART_VALUES] + r * rb, sc + r * nb, mn + r * nb, cols, y + r * cols);
    free(sc);
}

/* The layer's output error: sum over rows of (w - y)^T H (w - y). */
static double output_error(const float *W, const float *Y, const float *H, size_t rows, size_t cols)
{
    double e = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t i = 0; i < cols; i++)
            for (size_t j = 0; j < cols; j++)
                e += ((double)W[r * cols + i] - Y[r * cols + i]) * H[i * cols + j] *
                     ((double)W[r * cols + j] - Y[r * cols + j]);
    return e;
}

/* output_error with H dampened as feedback dampens it: 1% of the mean
 * diagonal added to it, a column no token reached given the mean. */
static double damped_output_error(const float *W, const float *Y, const float *H, size_t rows, size_t cols)
{
    double mean = 0, e = output_error(W, Y, H, rows, cols);
    for (size_t j = 0; j < cols; j++)
        mean += H[j * cols + j];
    mean /= (double)cols;
    for (size_t j = 0; j < cols; j++)
        for (size_t r = 0; r < rows; r++) {
            double d = (double)W[r * cols + j] - Y[r * cols + j];
            e += d * d * (0.01 * mean + (H[j * cols + j] > 0 ? 0 : mean));
        }
    return e;
}

/* The output error feedback reports (the sum of the errors it fed, each
 * a step of it) and the one stz_quant_output_error computes (on 1 and 3
 * threads, the same) against this test's own. */
static void check_output_errors(const stz_qmem *fb, const float *W, const float *y, const float *H, size_t rows,
                                size_t cols)
{
    double want = damped_output_error(W, y, H, rows, cols), got1, got3;
    stz_err err;
    assert_int_equal(stz_quant_output_error(W, y, H, rows, cols, 1, &got1, &err), STZ_OK);
    assert_int_equal(stz_quant_output_error(W, y, H, rows, cols, 3, &got3, &err), STZ_OK);
    assert_true(got1 == got3);
    if (fabs(got1 - want) > 1e-4 * want || fabs(fb->err_out - want) > 1e-3 * want)
        fail_msg("output error: computed %.9g, feedback's %.9g, expected %.9g", got1, fb->err_out, want);
}

/* Error feedback, for stz's methods and llama.cpp's types: the layer's
 * output error well under plain rounding's (weighted by the same
 * importance) on inputs with correlated columns, and the one it reports
 * exact; the same bytes on 1 and 3 threads; values as a reader decodes
 * them; a column no token reached; NaN and non-block decisions refused. */
static void test_feedback(void **state)
{
    (void)state;
    enum { R = 40, C = 256, T = 1024 };
    float *X = malloc(T * C * sizeof *X), *H = calloc(C * C, sizeof *H), *W = malloc(R * C * sizeof *W),
          *y = malloc(R * C * sizeof *y), *yp = malloc(R * C * sizeof *yp), w[C];
    for (int t = 0; t < T; t++) { /* neighbouring columns correlated, column scales 0.5..2.5 */
        float prev = frand();
        for (int j = 0; j < C; j++)
            X[t * C + j] = (prev = 0.7f * prev + 0.7f * frand()) * (0.5f + 2.0f * (float)(j % 7) / 6);
        X[t * C + 5] = 0; /* a dead input */
    }
    for (int i = 0; i < C; i++)
        for (int j = 0; j < C; j++)
            for (int t = 0; t < T; t++)
                H[i * C + j] += X[t * C + i] * X[t * C + j];
    for (int i = 0; i < C; i++)
        w[i] = H[i * C + i];
    for (int i = 0; i < R * C; i++)
        W[i] = frand() * 0.05f;
    const stz_decision ds[] = {
        {.action = STZ_ACTION_INT3, .block_size = 32, .method = STZ_QMETHOD_MSE, .scale_dtype = STZ_DTYPE_F16},
        {.action = STZ_ACTION_INT4, .block_size = 64, .method = STZ_QMETHOD_ASYM, .scale_dtype = STZ_DTYPE_F32},
        {.action = STZ_ACTION_INT3, .block_size = 48, .method = STZ_QMETHOD_NL, .scale_dtype = STZ_DTYPE_U8},
        {.action = STZ_ACTION_INT2, .block_size = 32, .method = STZ_QMETHOD_NL_FIT, .scale_dtype = STZ_DTYPE_F16},
        {.action = STZ_ACTION_INT8, .block_size = 128, .method = STZ_QMETHOD_ABSMAX, .scale_dtype = STZ_DTYPE_F16},
        {.action = STZ_ACTION_INT3, .block_size = 32, .method = STZ_QMETHOD_TRELLIS, .scale_dtype = STZ_DTYPE_F16},
        {.action = STZ_ACTION_INT2, .block_size = 64, .method = STZ_QMETHOD_TRELLIS, .scale_dtype = STZ_DTYPE_U8},
        {.action = STZ_ACTION_GGML, .ggml_type = STZ_GGML_Q4_0},
        {.action = STZ_ACTION_GGML, .ggml_type = STZ_GGML_Q5_1},
        {.action = STZ_ACTION_GGML, .ggml_type = STZ_GGML_IQ4_NL},
        {.action = STZ_ACTION_GGML, .ggml_type = STZ_GGML_Q2_K},
        {.action = STZ_ACTION_GGML, .ggml_type = STZ_GGML_Q3_K},
        {.action = STZ_ACTION_GGML, .ggml_type = STZ_GGML_Q4_K},
        {.action = STZ_ACTION_GGML, .ggml_type = STZ_GGML_Q6_K},
        {.action = STZ_ACTION_GGML, .ggml_type = STZ_GGML_IQ4_XS}};
    for (size_t k = 0; k < sizeof ds / sizeof *ds; k++) {
        stz_qmem plain, fb, fb3;
        stz_err err;
        assert_int_equal(stz_quantize_tensor(&ds[k], W, w, R, C, &plain, &err), STZ_OK);
        assert_int_equal(stz_quantize_tensor_feedback(&ds[k], W, H, NULL, R, C, 1, &fb, y, &err), STZ_OK);
        assert_int_equal(stz_quantize_tensor_feedback(&ds[k], W, H, NULL, R, C, 3, &fb3, NULL, &err), STZ_OK);
        for (int p = 0; p < STZ_PART_COUNT;
             p++) { /* the same layout as without feedback, the same bytes on 3 threads */
            assert_int_equal(fb.len[p], plain.len[p]);
            assert_int_equal(fb3.len[p], fb.len[p]);
            if (fb.len[p])
                assert_memory_equal(fb3.part[p], fb.part[p], fb.len[p]);
        }
        qmem_values(&fb, R, C, yp);
        assert_memory_equal(yp, y, R * C * sizeof *y);
        double ef = output_error(W, y, H, R, C);
        check_output_errors(&fb, W, y, H, R, C);
        qmem_values(&plain, R, C, yp);
        double ep = output_error(W, yp, H, R, C);
        print_message("  %-10s output error with feedback %.3g, without %.3g (%.2fx)\n",
                      stz_action_name(ds[k].action, ds[k].ggml_type), ef, ep, ef / ep);
        if (!(ef < 0.8 * ep))
            fail_msg("%s: feedback does not lower the output error enough (%g vs %g)",
                     stz_action_name(ds[k].action, ds[k].ggml_type), ef, ep);
        stz_qmem_free(&plain), stz_qmem_free(&fb), stz_qmem_free(&fb3);
    }
    stz_qmem m;
    stz_err err;
    stz_decision svd = {.action = STZ_ACTION_SVD, .svd_rank = 4},
                 f16 = {.action = STZ_ACTION_GGML, .ggml_type = STZ_GGML_F16};
    assert_int_equal(stz_quantize_tensor_feedback(&svd, W, H, NULL, R, C, 1, &m, NULL, &err), STZ_E_ARG);
    assert_int_equal(stz_quantize_tensor_feedback(&f16, W, H, NULL, R, C, 1, &m, NULL, &err), STZ_E_ARG);
    W[77] = NAN;
    assert_int_equal(stz_quantize_tensor_feedback(&ds[0], W, H, NULL, R, C, 1, &m, NULL, &err), STZ_E_NUMERIC);
    free(X), free(H), free(W), free(y), free(yp);
}

/* ---- the method "trellis" ------------------------------------------------ */

/* code() as docs/FORMAT.md defines it. */
static float trellis_value(uint32_t s)
{
    uint32_t x = s * 34038481u + 76625530u;
    return (float)((int)((x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24)) - 510) / 256.0f;
}

/* The squared error of a circular stream c[n] of `bits`-bit codes against
 * x (scales sc), decoded as docs/FORMAT.md says; its values into y. */
static double stream_error(const uint8_t *c, size_t n, int bits, const float *x, const float *sc, float *y)
{
    double e = 0;
    for (size_t t = 0; t < n; t++) {
        uint32_t s = 0;
        for (int i = STZ_TRELLIS_L / bits - 1; i >= 0; i--)
            s = s << bits | c[(t + n * (size_t)i - (size_t)i) % n];
        y[t] = trellis_value(s) * sc[t];
        e += ((double)x[t] - y[t]) * ((double)x[t] - y[t]);
    }
    return e;
}

/* A segment's column against every stream of its length (3 bits, 6 rows:
 * 2^18): the codes decode to the values it gives, and no stream that ends
 * on the same last 9 bits (the circular path's tail) is nearer. Then a
 * matrix of two segments (128 + 172 rows): the same bytes on 1 and 3
 * threads, with and without feedback, decoded as the quantizer saw it;
 * too few rows refused. */
static void test_trellis(void **state)
{
    (void)state;
    enum { N = 6, B = 3 };
    float x[N], sc[N], y[N], yr[N];
    uint8_t codes[N], c[N];
    stz_trellis_work *w = stz_trellis_work_new();
    assert_non_null(w);
    for (int trial = 0; trial < 4; trial++) {
        for (int t = 0; t < N; t++)
            x[t] = frand(), sc[t] = trial & 1 ? 1.5f : 0.5f + 0.25f * (float)t;
        stz_trellis_column(w, B, x, sc, N, codes, y);
        double got = stream_error(codes, N, B, x, sc, yr), best = INFINITY;
        assert_memory_equal(y, yr, sizeof y);
        for (uint32_t v = 0; v < 1u << (N * B); v++) {
            for (int t = 0; t < N; t++)
                c[t] = (uint8_t)((v >> (B * t)) & 7);
            if (!memcmp(c + N - 3, codes + N - 3, 3))
                best = fmin(best, stream_error(c, N, B, x, sc, yr));
        }
        if (got > best * (1 + 1e-5))
            fail_msg("trial %d: the trellis path's error %.9g, the best stream with its tail %.9g", trial, got, best);
    }
    stz_trellis_work_free(w);

    enum { R = 300, C = 40 };
    float *W = malloc(R * C * sizeof *W), *H = calloc(C * C, sizeof *H), *Y = malloc(R * C * sizeof *Y),
          *Yr = malloc(R * C * sizeof *Yr);
    for (int i = 0; i < R * C; i++)
        W[i] = frand() * 0.05f;
    for (int i = 0; i < C; i++)
        for (int j = 0; j < C; j++)
            H[i * C + j] = (i == j ? 2.0f : 0.0f) + 1.0f / (float)(1 + abs(i - j));
    stz_decision d = {
        .action = STZ_ACTION_INT3, .block_size = 16, .method = STZ_QMETHOD_TRELLIS, .scale_dtype = STZ_DTYPE_U8};
    stz_qmem a, b;
    stz_err err;
    assert_int_equal(stz_trellis_segments(R), 2);
    for (int fed = 0; fed < 2; fed++) {
        if (fed) {
            assert_int_equal(stz_quantize_tensor_feedback(&d, W, H, NULL, R, C, 1, &a, Y, &err), STZ_OK);
            assert_int_equal(stz_quantize_tensor_feedback(&d, W, H, NULL, R, C, 3, &b, NULL, &err), STZ_OK);
        } else {
            assert_int_equal(stz_quantize_tensor_y(&d, W, NULL, R, C, &a, Y, &err), STZ_OK);
            assert_int_equal(stz_trellis_tensor(&d, W, NULL, R, C, 3, &b, NULL, &err), STZ_OK);
        }
        assert_int_equal(a.len[STZ_PART_VALUES], R * stz_qf_row_bytes(3, C));
        for (int p = 0; p < STZ_PART_COUNT; p++) {
            assert_int_equal(a.len[p], b.len[p]);
            if (a.len[p])
                assert_memory_equal(a.part[p], b.part[p], a.len[p]);
        }
        qmem_values(&a, R, C, Yr);
        assert_memory_equal(Yr, Y, R * C * sizeof *Y);
        float s100[100 * 3]; /* rows 100-199 alone: from inside a segment, across into the next */
        for (int i = 0; i < 100 * 3; i++)
            s100[i] = stz_qf_scale_value(a.fmt.scale_base, a.part[STZ_PART_SCALES][100 * 3 + i]);
        assert_int_equal(stz_trellis_dequantize_rows(&a.fmt, a.part[STZ_PART_VALUES], 0, R, 100, 100, s100, C, Yr), 0);
        assert_memory_equal(Yr, Y + 100 * C, 100 * C * sizeof *Y);
        assert_true(a.cosine > 0.95);
        stz_qmem_free(&a), stz_qmem_free(&b);
    }
    assert_int_equal(stz_quantize_tensor(&d, W, NULL, 3, C, &a, &err), STZ_E_ARG);
    assert_true(stz_trellis_fits(3, 4) && !stz_trellis_fits(3, 3) && stz_trellis_fits(2, 6) && !stz_trellis_fits(2, 5));
    assert_true(!stz_trellis_fits(5, 1000) && !stz_trellis_fits(1, 1000));
    free(W), free(H), free(Y), free(Yr);
}

/* ||Xq Y^T - X W^T||^2: how far rows Y on inputs Xq are from rows W on X. */
static double drift_error(const float *X, const float *Xq, const float *W, const float *Y, size_t T, size_t rows,
                          size_t cols)
{
    double e = 0;
    for (size_t t = 0; t < T; t++)
        for (size_t r = 0; r < rows; r++) {
            double d = 0;
            for (size_t j = 0; j < cols; j++)
                d += (double)Xq[t * cols + j] * Y[r * cols + j] - (double)X[t * cols + j] * W[r * cols + j];
            e += d * d;
        }
    return e;
}

/* Asymmetric calibration (D): when the inputs drifted from X to Xq, the
 * rows quantized with D keep the original outputs X W^T far better than
 * without; a D of zeros changes no byte; the same bytes on 1 and 3 threads. */
static void test_feedback_drift(void **state)
{
    (void)state;
    enum { R = 24, C = 256, T = 768 };
    float *X = malloc(T * C * sizeof *X), *Xq = malloc(T * C * sizeof *Xq), *H = calloc(C * C, sizeof *H),
          *D = calloc(C * C, sizeof *D), *Z = calloc(C * C, sizeof *Z), *W = malloc(R * C * sizeof *W),
          *y = malloc(R * C * sizeof *y), *yn = malloc(R * C * sizeof *yn);
    for (int t = 0; t < T; t++) {
        float prev = frand();
        for (int j = 0; j < C; j++) { /* correlated columns; Xq: X scaled per column, plus noise */
            X[t * C + j] = prev = 0.7f * prev + 0.7f * frand();
            Xq[t * C + j] = X[t * C + j] * (1.0f + 0.15f * (float)(j % 5 - 2)) + 0.1f * frand();
        }
    }
    for (int i = 0; i < C; i++)
        for (int j = 0; j < C; j++)
            for (int t = 0; t < T; t++) {
                H[i * C + j] += Xq[t * C + i] * Xq[t * C + j];
                D[i * C + j] += (X[t * C + i] - Xq[t * C + i]) * Xq[t * C + j];
            }
    for (int i = 0; i < R * C; i++)
        W[i] = frand() * 0.05f;
    const stz_decision ds[] = {
        {.action = STZ_ACTION_INT3, .block_size = 32, .method = STZ_QMETHOD_MSE, .scale_dtype = STZ_DTYPE_F16},
        {.action = STZ_ACTION_GGML, .ggml_type = STZ_GGML_Q4_K},
        {.action = STZ_ACTION_GGML, .ggml_type = STZ_GGML_IQ4_NL}};
    for (size_t k = 0; k < sizeof ds / sizeof *ds; k++) {
        stz_qmem a, a3, n, z;
        stz_err err;
        assert_int_equal(stz_quantize_tensor_feedback(&ds[k], W, H, D, R, C, 1, &a, y, &err), STZ_OK);
        assert_int_equal(stz_quantize_tensor_feedback(&ds[k], W, H, D, R, C, 3, &a3, NULL, &err), STZ_OK);
        assert_int_equal(stz_quantize_tensor_feedback(&ds[k], W, H, NULL, R, C, 1, &n, yn, &err), STZ_OK);
        assert_int_equal(stz_quantize_tensor_feedback(&ds[k], W, H, Z, R, C, 1, &z, NULL, &err), STZ_OK);
        for (int p = 0; p < STZ_PART_COUNT; p++) {
            assert_int_equal(a3.len[p], a.len[p]);
            if (a.len[p])
                assert_memory_equal(a3.part[p], a.part[p], a.len[p]);
            assert_int_equal(z.len[p], n.len[p]);
            if (n.len[p])
                assert_memory_equal(z.part[p], n.part[p], n.len[p]);
        }
        double ea = drift_error(X, Xq, W, y, T, R, C), en = drift_error(X, Xq, W, yn, T, R, C);
        print_message("  %-10s drift: outputs' error with D %.4g, without %.4g (%.2fx)\n",
                      stz_action_name(ds[k].action, ds[k].ggml_type), ea, en, ea / en);
        if (!(ea < 0.5 * en))
            fail_msg("%s: D does not keep the original outputs (%g vs %g)",
                     stz_action_name(ds[k].action, ds[k].ggml_type), ea, en);
        stz_qmem_free(&a), stz_qmem_free(&a3), stz_qmem_free(&n), stz_qmem_free(&z);
    }
    free(X), free(Xq), free(H), free(D), free(Z), free(W), free(y), free(yn);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel_bounds_odd_lengths),
        cmocka_unit_test(test_hard_blocks),
        cmocka_unit_test(test_int4_packing_order),
        cmocka_unit_test(test_mse_never_worse),
        cmocka_unit_test(test_ggml_blocks_by_hand),
        cmocka_unit_test(test_ggml_table),
        cmocka_unit_test(test_ggml_dequantizers),
        cmocka_unit_test(test_feedback),
        cmocka_unit_test(test_trellis),
        cmocka_unit_test(test_feedback_drift),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
