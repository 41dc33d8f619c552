/* INT8 / INT4 kernels of the first version against their definition:
 * bounds, packing order, hard blocks, mse never worse than absmax; the
 * ggml block types' packers and reference dequantizers against the
 * layouts of ggml-common.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "stz_eval.h"
#include "core/stz_core.h"
#include "quant/ggml_types.h"
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
                fail_msg("bits %d n %zu block %zu elem %zu: |%g - %g| > scale %g / 2", bits, n, block, i, x[i], y[i], s);
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
    static const int writes[] = {STZ_GGML_F32, STZ_GGML_F16, STZ_GGML_BF16, STZ_GGML_Q4_0, STZ_GGML_Q5_0, STZ_GGML_Q8_0};
    for (size_t k = 0; k < 6; k++)
        assert_int_equal(stz_ggml_type_parse(stz_ggml_type_name(writes[k])), writes[k]);
    assert_int_equal(stz_ggml_type_parse("q4_k"), -2); /* read, not written */
    assert_int_equal(stz_ggml_type_parse("auto"), STZ_GGML_AUTO);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
