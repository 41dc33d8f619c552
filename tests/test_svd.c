/* Rank-reduced SVD: known spectra, rank selection, wide and tall matrices,
 * randomized against exact, INT8 factors, and failures. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "stz_quant.h"
#include "stz_kernels.h"
#include "stz_svd.h"
#include "svd/svd_internal.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t seed = 3;
static float gauss(void)
{
    float s = 0;
    for (int k = 0; k < 12; k++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        s += (float)(seed >> 40) / (float)(1 << 24);
    }
    return s - 6.0f;
}

/* Random orthonormal columns: Q (rows x cols). */
static float *orthonormal(size_t rows, size_t cols)
{
    float *Q = malloc(rows * cols * sizeof *Q), *tau = malloc(cols * sizeof *tau);
    for (size_t i = 0; i < rows * cols; i++)
        Q[i] = gauss();
    assert_int_equal(LAPACKE_sgeqrf(LAPACK_ROW_MAJOR, (int)rows, (int)cols, Q, (int)cols, tau), 0);
    assert_int_equal(LAPACKE_sorgqr(LAPACK_ROW_MAJOR, (int)rows, (int)cols, (int)cols, Q, (int)cols, tau), 0);
    free(tau);
    return Q;
}

/* W (m x n) = A (m x k) diag(s) B^T (k x n) with orthonormal A, B. */
static float *with_spectrum(size_t m, size_t n, const double *s, size_t k)
{
    float *A = orthonormal(m, k), *B = orthonormal(n, k), *W = calloc(m * n, sizeof *W);
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++) {
            double v = 0;
            for (size_t t = 0; t < k; t++)
                v += (double)A[i * k + t] * s[t] * B[j * k + t];
            W[i * n + j] = (float)v;
        }
    free(A), free(B);
    return W;
}

static double rel_err(const float *W, const stz_svd_result *r, size_t m, size_t n)
{
    float *R = malloc(m * n * sizeof *R);
    assert_int_equal(stz_svd_reconstruct(r->U, r->S, r->Vh, m, n, r->rank, R), STZ_OK);
    double d = 0, t = 0;
    for (size_t i = 0; i < m * n; i++)
        d += ((double)W[i] - R[i]) * ((double)W[i] - R[i]), t += (double)W[i] * W[i];
    free(R);
    return sqrt(d / t);
}

static void test_known_spectrum(void **state)
{
    (void)state;
    size_t shapes[2][2] = {{120, 40}, {40, 120}}; /* tall and wide */
    for (int sh = 0; sh < 2; sh++) {
        size_t m = shapes[sh][0], n = shapes[sh][1], k = 40;
        double s[40], total = 0;
        for (size_t i = 0; i < k; i++)
            s[i] = pow(0.85, (double)i) * 10, total += s[i] * s[i];
        float *W = with_spectrum(m, n, s, k);
        /* exact, and randomized with 3 power iterations: without the
         * renormalisation of each step (s_0 / s_39)^7 ~ 1e19 would leave
         * nothing but the first singular direction in float */
        for (size_t r = 1; r < k; r += 7)
            for (int meth = 0; meth < 2; meth++) {
                stz_svd_params p = STZ_SVD_PARAMS_DEFAULT;
                p.rank = r, p.method = (stz_svd_method)meth, p.power_iters = 3;
                stz_svd_result res;
                stz_err err;
                assert_int_equal(stz_svd_factor(W, m, n, &p, &res, &err), STZ_OK);
                assert_int_equal(res.rank, r);
                double dropped = 0;
                for (size_t i = r; i < k; i++)
                    dropped += s[i] * s[i];
                /* squared error = sum of the dropped squared singular values */
                double want = sqrt(dropped / total), got = rel_err(W, &res, m, n);
                if (fabs(got - want) > 1e-3 * want + 1e-5)
                    fail_msg("%zux%zu rank %zu method %d: error %.6f, dropped spectrum says %.6f", m, n, r, meth, got,
                             want);
                /* exact sums the dropped spectrum; randomized has only the kept
                 * one, so its estimate ||W||^2 - sum(kept S^2) is as good as
                 * float S: about 1e-6 of the total energy */
                if (meth ? fabs(res.rel_error * res.rel_error - want * want) > 1e-6
                         : fabs(res.rel_error - want) > 1e-3 * want + 1e-5)
                    fail_msg("rank %zu method %d: estimated error %.6f, actual %.6f", r, meth, res.rel_error, want);
                for (size_t i = 0; i < r; i++)
                    assert_true(fabs(res.S[i] - s[i]) < 1e-3 * s[0]);
                stz_svd_result_free(&res);
            }
        free(W);
    }
}

static void test_exact_low_rank(void **state)
{
    (void)state;
    double s[6] = {5, 4, 3, 2, 1, 0.5};
    size_t shapes[2][2] = {{70, 50}, {50, 70}}; /* tall and wide */
    for (int sh = 0; sh < 2; sh++) {
        size_t m = shapes[sh][0], n = shapes[sh][1];
        float *W = with_spectrum(m, n, s, 6);
        for (int meth = 0; meth < 2; meth++) {
            stz_svd_params p = STZ_SVD_PARAMS_DEFAULT;
            p.rank = 6, p.method = (stz_svd_method)meth;
            stz_svd_result res;
            stz_err err;
            assert_int_equal(stz_svd_factor(W, m, n, &p, &res, &err), STZ_OK);
            double e = rel_err(W, &res, m, n);
            if (e > 1e-4) /* exactly rank 6: almost exact */
                fail_msg("%zu x %zu method %d: error %g", m, n, meth, e);
            stz_svd_result_free(&res);
        }
        free(W);
    }
}

static void test_energy_and_max_error(void **state)
{
    (void)state;
    double s[30], total = 0;
    for (int i = 0; i < 30; i++)
        s[i] = 30 - i, total += s[i] * s[i];
    float *W = with_spectrum(90, 60, s, 30);
    for (int meth = 0; meth < 2; meth++)
        for (int which = 0; which < 2; which++)
            for (double target = 0.5; target < 0.99; target += 0.12) {
                stz_svd_params p = STZ_SVD_PARAMS_DEFAULT;
                p.method = (stz_svd_method)meth;
                if (which)
                    p.max_error = 1 - target;
                else
                    p.energy = target;
                stz_svd_result res;
                stz_err err;
                assert_int_equal(stz_svd_factor(W, 90, 60, &p, &res, &err), STZ_OK);
                /* the smallest rank that meets the target */
                size_t want = 0;
                double kept = 0;
                while (want < 30) {
                    kept += s[want] * s[want], want++;
                    if (which ? sqrt((total - kept) / total) <= 1 - target + 1e-9 : kept >= target * total * (1 - 1e-9))
                        break;
                }
                if (res.rank != want)
                    fail_msg("method %d %s %.2f: rank %zu, smallest meeting it %zu", meth,
                             which ? "max_error" : "energy", target, res.rank, want);
                stz_svd_result_free(&res);
            }
    free(W);
}

static void test_randomized_close_to_exact(void **state)
{
    (void)state;
    /* weight-like: a slowly decaying spectrum plus noise, 600 x 300 and
     * its transpose; the default q = 1 and the q = 2 */
    size_t m = 600, n = 300;
    float *W = malloc(m * n * sizeof *W), *Wt = malloc(m * n * sizeof *Wt);
    double s[300];
    for (int i = 0; i < 300; i++)
        s[i] = 1.0 / sqrt(1.0 + i);
    float *L = with_spectrum(m, n, s, 300);
    for (size_t i = 0; i < m * n; i++)
        W[i] = L[i] + 0.002f * gauss();
    for (size_t i = 0; i < m; i++)
        for (size_t j = 0; j < n; j++)
            Wt[j * m + i] = W[i * n + j];
    free(L);
    for (int q = 1; q <= 2; q++)
        for (int tr = 0; tr < 2; tr++) {
            size_t rows = tr ? n : m, cols = tr ? m : n;
            double err[2];
            for (int meth = 0; meth < 2; meth++) {
                stz_svd_params p = STZ_SVD_PARAMS_DEFAULT;
                p.rank = 64, p.method = (stz_svd_method)meth, p.power_iters = q;
                stz_svd_result res;
                stz_err e;
                assert_int_equal(stz_svd_factor(tr ? Wt : W, rows, cols, &p, &res, &e), STZ_OK);
                err[meth] = rel_err(tr ? Wt : W, &res, rows, cols);
                assert_true(fabs(res.rel_error - err[meth]) < 1e-3 * err[meth]);
                stz_svd_result_free(&res);
            }
            if (err[1] > 1.05 * err[0])
                fail_msg("%zu x %zu, q = %d: randomized error %.5f > 1.05 x exact %.5f", rows, cols, q, err[1], err[0]);
        }
    free(W), free(Wt);
}

static void test_int8_factors_bound(void **state)
{
    (void)state;
    /* Quantizing the factors adds at most a bounded error: with per-row
     * absmax INT8 each factor entry moves by at most half a step. */
    double s[20];
    for (int i = 0; i < 20; i++)
        s[i] = 8.0 / (1 + i);
    float *W = with_spectrum(80, 64, s, 20);
    stz_svd_params p = STZ_SVD_PARAMS_DEFAULT;
    p.rank = 10;
    stz_svd_result r;
    stz_err err;
    assert_int_equal(stz_svd_factor(W, 80, 64, &p, &r, &err), STZ_OK);
    size_t k = r.rank;
    int8_t *q = malloc(80 * 64);
    float sc[80], *U2 = malloc(80 * k * sizeof *U2), *V2 = malloc(k * 64 * sizeof *V2), S2[10], ss;
    for (size_t i = 0; i < 80; i++) {
        stz_q8_quantize_ref(r.U + i * k, k, k, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F32, q, &sc[i]);
        stz_q8_dequantize_ref(q, &sc[i], k, k, U2 + i * k);
    }
    for (size_t i = 0; i < k; i++) {
        stz_q8_quantize_ref(r.Vh + i * 64, 64, 64, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F32, q, &sc[i]);
        stz_q8_dequantize_ref(q, &sc[i], 64, 64, V2 + i * 64);
    }
    stz_q8_quantize_ref(r.S, k, k, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F32, q, &ss);
    stz_q8_dequantize_ref(q, &ss, k, k, S2);
    stz_svd_result r2 = {80, 64, k, U2, S2, V2, 0};
    double before = rel_err(W, &r, 80, 64), after = rel_err(W, &r2, 80, 64);
    /* stated bound: INT8 factors add less than 3% relative error here
     * (three factors, each entry within 1/254 of its row's largest) */
    assert_true(after >= before - 1e-6);
    if (after > before + 0.03)
        fail_msg("INT8 factors: error %.5f -> %.5f", before, after);
    /* and per-row scales beat one scale for all of U */
    float su;
    int8_t *qa = malloc(80 * k);
    float *U3 = malloc(80 * k * sizeof *U3);
    stz_q8_quantize_ref(r.U, 80 * k, 80 * k, STZ_QMETHOD_ABSMAX, STZ_DTYPE_F32, qa, &su);
    stz_q8_dequantize_ref(qa, &su, 80 * k, 80 * k, U3);
    stz_svd_result r3 = {80, 64, k, U3, S2, V2, 0};
    assert_true(rel_err(W, &r3, 80, 64) > after);
    free(qa), free(U3), free(q), free(U2), free(V2), free(W);
    stz_svd_result_free(&r);
}

static void test_rejections(void **state)
{
    (void)state;
    float W[12 * 8];
    for (int i = 0; i < 96; i++)
        W[i] = gauss();
    stz_svd_params p = STZ_SVD_PARAMS_DEFAULT;
    stz_svd_result r;
    stz_err err;
    assert_int_equal(stz_svd_factor(W, 12, 8, &p, &r, &err), STZ_E_ARG); /* rank 0 / nothing given */
    p.rank = 8;
    assert_int_equal(stz_svd_factor(W, 12, 8, &p, &r, &err), STZ_E_ARG); /* rank >= min(m, n) */
    assert_non_null(strstr(err.msg, "min(m, n)"));
    p.rank = 20;
    assert_int_equal(stz_svd_factor(W, 8, 12, &p, &r, &err), STZ_E_ARG);
    p.rank = 2, p.energy = 0.5;
    assert_int_equal(stz_svd_factor(W, 12, 8, &p, &r, &err), STZ_E_ARG); /* two targets */
    p.rank = 0, p.energy = 1.5;
    assert_int_equal(stz_svd_factor(W, 12, 8, &p, &r, &err), STZ_E_ARG);
    p.energy = 0, p.rank = 2;
    W[7] = INFINITY;
    assert_int_equal(stz_svd_factor(W, 12, 8, &p, &r, &err), STZ_E_NUMERIC);
    /* LAPACK's own failures are reported with the routine's name */
    W[7] = NAN;
    assert_int_equal(stz_svd_factor_unchecked(W, 12, 8, &p, &r, &err), STZ_E_LAPACK);
    assert_non_null(strstr(err.msg, "sgesdd"));
    p.method = STZ_SVD_RANDOMIZED;
    assert_int_equal(stz_svd_factor_unchecked(W, 12, 8, &p, &r, &err), STZ_E_LAPACK);
    assert_non_null(strstr(err.msg, "LAPACK"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_spectrum),       cmocka_unit_test(test_exact_low_rank),
        cmocka_unit_test(test_energy_and_max_error), cmocka_unit_test(test_randomized_close_to_exact),
        cmocka_unit_test(test_int8_factors_bound),   cmocka_unit_test(test_rejections),
    };
    return cmocka_run_group_tests_name("svd", tests, NULL, NULL);
}
