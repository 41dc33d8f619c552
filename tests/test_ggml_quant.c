/* stz's quantizers for llama.cpp's block types (quant/ggml_quant.c):
 * representable blocks come back exactly, zero/constant/outlier blocks,
 * weights steer the search, error bounds on normal rows, rows of a tensor
 * with an odd row count, NaN/Inf refused, and the function clones give the
 * bytes of the baseline build. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "core/stz_core.h"
#include "stz_kernels.h"
#include "quant/ggml_types.h"
#include "stz_quant.h"
#include "stz_tune.h"
#include "test_util.h"
#include "kernel_copies.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t seed = 11;
static float frand(void) { return tu_normal(&seed); }
static int irand(int n) { return (int)((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 33) % n; }

static const int types[] = {STZ_GGML_Q4_0, STZ_GGML_Q4_1, STZ_GGML_Q5_0, STZ_GGML_Q5_1, STZ_GGML_Q8_0, STZ_GGML_IQ4_NL,
                            STZ_GGML_Q2_K, STZ_GGML_Q3_K, STZ_GGML_Q4_K, STZ_GGML_Q5_K, STZ_GGML_Q6_K, STZ_GGML_IQ4_XS};
#define NTYPES (sizeof types / sizeof types[0])
#define N      1024

/* Weighted squared error of quantizing x[n] to `type`, and its square norm. */
static double werr(int type, const float *x, const float *w, size_t n, double *norm)
{
    static uint8_t q[N * 2];
    static float y[N];
    assert_int_equal(stz_ggml_quantize_row(type, x, w, n, q), 0);
    assert_int_equal(stz_ggml_dequantize_row(type, q, n, y), 0);
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++)
        e += (w ? w[i] : 1) * ((double)x[i] - y[i]) * ((double)x[i] - y[i]), r += (w ? w[i] : 1) * (double)x[i] * x[i];
    if (norm)
        *norm = r;
    return e;
}

/* Blocks of the 32-block types whose largest element sits on an extreme code
 * (asym: the smallest on 0 and the largest on the top code) with a power of
 * two scale: the search lands on them and gives them back bit for bit. */
static void test_representable_blocks(void **state)
{
    (void)state;
    static const struct {
        int type, lo, hi, nl, asym;
    } b32[] = {{STZ_GGML_Q4_0, -8, 7, 0, 0},   {STZ_GGML_Q5_0, -16, 15, 0, 0}, {STZ_GGML_Q8_0, -128, 127, 0, 0},
               {STZ_GGML_IQ4_NL, 0, 15, 1, 0}, {STZ_GGML_Q4_1, 0, 15, 0, 1},   {STZ_GGML_Q5_1, 0, 31, 0, 1}};
    static const int lev[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    for (size_t k = 0; k < sizeof b32 / sizeof b32[0]; k++)
        for (int rep = 0; rep < 50; rep++) {
            float x[32], y[32], d = ldexpf(1, -irand(10) - 2), m = b32[k].asym ? -ldexpf(1, -irand(6)) : 0;
            uint8_t q[34];
            for (int j = 0; j < 32; j++) {
                int c = b32[k].lo + irand(b32[k].hi - b32[k].lo + 1);
                x[j] = d * (float)(b32[k].nl ? lev[c] : c) + m;
            }
            int at = irand(32), at2 = (at + 1 + irand(31)) % 32;
            x[at] = d * (float)(b32[k].nl                ? (rep & 1 ? lev[0] : lev[15])
                                : rep & 1 || b32[k].asym ? b32[k].lo
                                                         : b32[k].hi) +
                    m;
            if (b32[k].asym)
                x[at2] = d * (float)b32[k].hi + m;
            assert_int_equal(stz_ggml_quantize_row(b32[k].type, x, NULL, 32, q), 0);
            stz_ggml_dequantize_row(b32[k].type, q, 32, y);
            for (int j = 0; j < 32; j++) /* as numbers: a zero code under a negative scale is -0 */
                if (x[j] != y[j])
                    fail_msg("%s: a representable block came back changed (repeat %d, element %d)",
                             stz_ggml_type_name(b32[k].type), rep, j);
        }
}

/* All zeros give zeros; a constant block stays close (exact for the
 * symmetric 32-blocks); an outlier does not spoil its block more than
 * absmax rounding would. */
static void test_hard_blocks(void **state)
{
    (void)state;
    for (size_t k = 0; k < NTYPES; k++) {
        int t = types[k];
        float x[256] = {0}, y[256];
        uint8_t q[300];
        assert_int_equal(stz_ggml_quantize_row(t, x, NULL, 256, q), 0);
        stz_ggml_dequantize_row(t, q, 256, y);
        assert_memory_equal(x, y, sizeof x);
        for (int i = 0; i < 256; i++)
            x[i] = 0.375f;
        double norm, e = werr(t, x, NULL, 256, &norm);
        if (stz_ggml_block(t) == 32 && t != STZ_GGML_Q4_1 && t != STZ_GGML_Q5_1 && t != STZ_GGML_IQ4_NL)
            assert_true(e == 0);
        if (!(e <= 1e-4 * norm))
            fail_msg("%s: constant block, relative error %g", stz_ggml_type_name(t), e / norm);
        for (int i = 0; i < 256; i++)
            x[i] = 0.01f * frand();
        x[irand(256)] = 5.0f;
        e = werr(t, x, NULL, 256, &norm);
        int bits = stz_ggml_traits_of(t)->bits;
        /* absmax: every element within half a step of 5 / 2^(bits-1) */
        double step = 5.0 / ((1 << (bits - 1)) - 1);
        if (!(e <= 256 * step * step / 4))
            fail_msg("%s: outlier block error %g", stz_ggml_type_name(t), e);
    }
}

/* Relative RMS error on normal rows, each type under a bound (measured
 * figures plus 5%: q4_0 0.080, q8_0 0.0046, q4_k 0.069, q6_k 0.016, ...;
 * llama.cpp's own quantizers give 0.08-0.09, 0.0045, 0.07-0.075, 0.017 on
 * such rows). A block written with a field in the wrong place breaks it. */
static void test_error_bounds(void **state)
{
    (void)state;
    static const double bound[NTYPES] = {0.0845, 0.0726, 0.0419, 0.0348, 0.0049, 0.0769,
                                         0.274,  0.151,  0.0730, 0.0359, 0.0173, 0.0774};
    static float x[N * 16];
    for (int i = 0; i < N * 16; i++)
        x[i] = 0.02f * frand();
    for (size_t k = 0; k < NTYPES; k++) {
        double e = 0, r = 0, rr;
        for (int row = 0; row < 16; row++)
            e += werr(types[k], x + row * N, NULL, N, &rr), r += rr;
        double rel = sqrt(e / r);
        print_message("  %-7s relative RMS error %.5f (bound %.4f)\n", stz_ggml_type_name(types[k]), rel, bound[k]);
        if (!(rel <= bound[k]))
            fail_msg("%s: relative RMS error %.5f over %.4f", stz_ggml_type_name(types[k]), rel, bound[k]);
    }
}

/* Importance weights steer the search: weighted by w, the error of the
 * weighted search is lower than the unweighted search's, over many rows
 * (w: a few columns 100x the rest, as an importance matrix has them). */
static void test_weights_steer(void **state)
{
    (void)state;
    static float x[N * 8], w[N];
    for (int i = 0; i < N * 8; i++)
        x[i] = 0.02f * frand();
    for (int i = 0; i < N; i++)
        w[i] = irand(8) ? 1.0f : 100.0f;
    for (size_t k = 0; k < NTYPES; k++) {
        double ew = 0, e1 = 0, unused;
        for (int row = 0; row < 8; row++) {
            ew += werr(types[k], x + row * N, w, N, &unused);
            float *xr = x + row * N; /* the unweighted search's blocks, measured weighted */
            static uint8_t q[N * 2];
            static float y[N];
            stz_ggml_quantize_row(types[k], xr, NULL, N, q);
            stz_ggml_dequantize_row(types[k], q, N, y);
            for (int i = 0; i < N; i++)
                e1 += w[i] * ((double)xr[i] - y[i]) * ((double)xr[i] - y[i]);
        }
        print_message("  %-7s weighted error %.4g with the weights, %.4g without\n", stz_ggml_type_name(types[k]), ew,
                      e1);
        if (!(ew < 0.95 * e1))
            fail_msg("%s: weights do not lower the weighted error (%g vs %g)", stz_ggml_type_name(types[k]), ew, e1);
    }
}

/* A tensor of 3 rows quantized whole is its rows quantized one by one; a
 * NaN is refused; rows that are not whole blocks are refused. */
static void test_tensor_rows(void **state)
{
    (void)state;
    float x[3 * 512];
    for (int i = 0; i < 3 * 512; i++)
        x[i] = frand();
    for (size_t k = 0; k < NTYPES; k++) {
        stz_decision d = {.action = STZ_ACTION_GGML, .ggml_type = types[k]};
        stz_qmem m;
        stz_err err;
        assert_int_equal(stz_quantize_tensor(&d, x, NULL, 3, 512, &m, &err), STZ_OK);
        size_t rb = (size_t)stz_ggml_row_bytes(types[k], 512);
        assert_int_equal(m.len[STZ_PART_VALUES], 3 * rb);
        assert_null(m.part[STZ_PART_SCALES]);
        for (int r = 0; r < 3; r++) {
            uint8_t q[600];
            stz_ggml_quantize_row(types[k], x + r * 512, NULL, 512, q);
            assert_memory_equal(q, m.part[STZ_PART_VALUES] + r * rb, rb);
        }
        assert_true(m.err2 > 0 && m.err2 < m.norm2);
        stz_qmem_free(&m);
        x[700] = NAN;
        assert_int_equal(stz_quantize_tensor(&d, x, NULL, 3, 512, &m, &err), STZ_E_NUMERIC);
        x[700] = 1;
        assert_int_equal(stz_quantize_tensor(&d, x, NULL, 3, 480, &m, &err),
                         stz_ggml_block(types[k]) == 32 ? STZ_OK : STZ_E_ARG);
        stz_qmem_free(&m);
        uint8_t q[600];
        assert_int_equal(stz_ggml_quantize_row(types[k], x, NULL, 48, q), -1);
    }
    assert_int_equal(stz_ggml_quantize_row(9 /* q8_1 */, x, NULL, 32, (uint8_t[64]){0}), -1);
}

/* Rows that are not whole 32-blocks ("pad"): the whole blocks as a row of
 * them, then the rest zero-padded with importance 0; read back, the first
 * values of the decoded blocks. 256-block types refuse such rows. */
static void test_padded_rows(void **state)
{
    (void)state;
    static const size_t widths[] = {1, 31, 33, 100, 172};
    float x[3 * 172], y[172], full[192], px[32], pw[32];
    for (int i = 0; i < 3 * 172; i++)
        x[i] = frand();
    for (size_t k = 0; k < NTYPES; k++)
        for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
            size_t n = widths[wi], whole = n / 32 * 32, rb = (size_t)stz_ggml_row_bytes(types[k], n);
            stz_decision d = {.action = STZ_ACTION_GGML, .ggml_type = types[k], .pad = 1};
            stz_qmem m;
            stz_err err;
            stz_status st = stz_quantize_tensor(&d, x, NULL, 3, n, &m, &err);
            if (stz_ggml_block(types[k]) == 256) {
                assert_int_equal(st, STZ_E_ARG);
                continue;
            }
            assert_int_equal(st, STZ_OK);
            assert_int_equal(rb, (n + 31) / 32 * stz_ggml_traits_of(types[k])->bytes);
            assert_int_equal(m.len[STZ_PART_VALUES], 3 * rb);
            for (int r = 0; r < 3; r++) {
                const uint8_t *row = m.part[STZ_PART_VALUES] + r * rb;
                uint8_t q[6 * 34];
                memset(px, 0, sizeof px), memset(pw, 0, sizeof pw);
                for (size_t i = whole; i < n; i++)
                    px[i - whole] = x[r * n + i], pw[i - whole] = 1;
                assert_int_equal(whole ? stz_ggml_quantize_row(types[k], x + r * n, NULL, whole, q) : 0, 0);
                assert_int_equal(stz_ggml_quantize_row(types[k], px, pw, 32, q + stz_ggml_row_bytes(types[k], whole)),
                                 0);
                assert_memory_equal(q, row, rb);
                stz_qf_dequantize_row(&m.fmt, row, NULL, NULL, n, y);
                assert_int_equal(stz_ggml_dequantize_row(types[k], row, (n + 31) / 32 * 32, full), 0);
                assert_memory_equal(y, full, n * sizeof *y);
            }
            stz_qmem_free(&m);
        }
}

/* The type llama.cpp's quantize falls back to for rows that are not whole blocks. */
static void test_fallback(void **state)
{
    (void)state;
    assert_int_equal(stz_ggml_fallback(STZ_GGML_Q4_K, 512), STZ_GGML_Q4_K);
    assert_int_equal(stz_ggml_fallback(STZ_GGML_Q4_K, 64), STZ_GGML_Q5_0);
    assert_int_equal(stz_ggml_fallback(STZ_GGML_Q5_K, 96), STZ_GGML_Q5_1);
    assert_int_equal(stz_ggml_fallback(STZ_GGML_Q6_K, 64), STZ_GGML_Q8_0);
    assert_int_equal(stz_ggml_fallback(STZ_GGML_Q2_K, 64), STZ_GGML_IQ4_NL);
    assert_int_equal(stz_ggml_fallback(STZ_GGML_IQ4_XS, 64), STZ_GGML_IQ4_NL);
    assert_int_equal(stz_ggml_fallback(STZ_GGML_Q4_K, 172), STZ_GGML_F16);
    assert_int_equal(stz_ggml_fallback(STZ_GGML_Q8_0, 172), STZ_GGML_F16);
}

/* The library's clones (AVX2 where the machine has it) write the bytes of
 * the baseline build. */
static void test_clones_same_bytes(void **state)
{
    (void)state;
    static float x[N], w[N];
    static uint8_t a[N * 2], b[N * 2];
    for (int i = 0; i < N; i++)
        x[i] = frand(), w[i] = (float)(1 + irand(50));
    for (size_t k = 0; k < NTYPES; k++)
        for (int wt = 0; wt < 2; wt++) {
            const float *ww = wt ? w : NULL;
            int big = stz_ggml_block(types[k]) == 256;
            assert_int_equal(stz_ggml_quantize_row(types[k], x, ww, N, a), 0);
            assert_int_equal((big ? plain_ggml_quant256 : plain_ggml_quant32)(types[k], x, ww, N, b), 0);
            assert_memory_equal(a, b, stz_ggml_row_bytes(types[k], N));
#if STZ_X86_CLONES
            assert_int_equal((big ? avx2_ggml_quant256 : avx2_ggml_quant32)(types[k], x, ww, N, b), 0);
            assert_memory_equal(a, b, stz_ggml_row_bytes(types[k], N));
#endif
        }
}

/* One row per type (quant/ggml_types.c): numbers below the limit export's
 * table of counts takes, fields in block order that tile the block exactly,
 * and for each type stz writes an action that maps back to it and a file
 * type of its own. */
static void test_rows(void **state)
{
    (void)state;
    int ftypes[STZ_GGML_TYPE_LIMIT], nft = 0;
    for (int ty = -8; ty < 2 * STZ_GGML_TYPE_LIMIT; ty++) {
        const stz_ggml_traits *t = stz_ggml_traits_of(ty);
        if (!t)
            continue;
        assert_true(ty >= 0 && ty < STZ_GGML_TYPE_LIMIT && t->type == ty && t->block && t->bytes);
        uint32_t at = 0;
        for (const stz_ggml_field *f = t->fields; f < t->fields + STZ_GGML_FIELDS && f->name; f++) {
            assert_int_equal(f->off, at);
            assert_true(f->len && (f->kind != STZ_FIELD_F16 || f->len == 2));
            at += f->len;
        }
        assert_true(at == 0 || at == t->bytes);
        assert_true(!t->codes || at); /* whole codes come from fields */
        if (!t->quantize) {
            assert_int_equal(t->policy, 0);
            continue;
        }
        if (t->type != STZ_GGML_F32) {
            stz_action a; /* its policy action: (ggml, the type), named as the type */
            int at_type;
            assert_true(t->policy > 0);
            assert_int_equal(stz_action_parse(t->name, &a, &at_type), 0);
            assert_int_equal(a, STZ_ACTION_GGML);
            assert_int_equal(at_type, ty);
        }
        assert_true(t->block == 1 || at); /* every block type stz writes is split into planes when packed */
        for (int k = 0; k < nft; k++)
            assert_int_not_equal(ftypes[k], t->ftype);
        ftypes[nft++] = t->ftype;
    }
    assert_int_equal(nft, 15);
}

/* stz tune --gguf's list comes from the rows that offer their type to tune,
 * each writable, in the order of their rank. */
static void test_tune_list(void **state)
{
    (void)state;
    stz_tune_cand *c = NULL; /* a list naming the set, parsed before anything asked for the set */
    size_t nc = 0;
    stz_err err;
    assert_int_equal(stz_tune_parse_candidates("gguf", &c, &nc, &err), STZ_OK);
    assert_int_equal(nc, 14);
    assert_string_equal(c[13].name, "q2_k");
    free(c);
    int ranks = 0;
    for (int ty = 0; ty < STZ_GGML_TYPE_LIMIT; ty++) {
        const stz_ggml_traits *t = stz_ggml_traits_of(ty);
        if (t && t->tune) {
            assert_true(t->quantize && t->policy);
            ranks |= 1 << t->tune;
        }
    }
    assert_int_equal(ranks, (1 << 14) - 2); /* 1 to 13, each once */
    assert_string_equal(stz_tune_candidate_set("gguf"),
                        "keep,f16,q8_0,q6_k,q5_k,q5_1,q5_0,q4_k,q4_1,q4_0,iq4_nl,iq4_xs,q3_k,q2_k");
    assert_null(stz_tune_candidate_set("none"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_representable_blocks),
        cmocka_unit_test(test_hard_blocks),
        cmocka_unit_test(test_error_bounds),
        cmocka_unit_test(test_weights_steer),
        cmocka_unit_test(test_tensor_rows),
        cmocka_unit_test(test_fallback),
        cmocka_unit_test(test_clones_same_bytes),
        cmocka_unit_test(test_padded_rows),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_tune_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
