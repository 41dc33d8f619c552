/* The products and elementary functions with the same bits everywhere
 * (core/matmul.c, core/stz_math.c): every instruction set's copy and every
 * thread count give the bits of the order the headers state, computed here
 * one scalar operation at a time; the blocked Cholesky factor and
 * triangular inverse equal their unblocked definitions bit for bit; the
 * functions are accurate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/stz_core.h"
#include "core/stz_math.h"

static const char *const copies[] = {"generic", "avx2", "avx512"};
static const size_t sizes[] = {1, 2, 3, 5, 7, 15, 16, 17, 31, 33, 47, 48, 49, 64, 100, 129};
#define NSIZES (sizeof sizes / sizeof *sizes)

static uint64_t state = 12345;

static float rnd(void)
{
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((int64_t)(state >> 11) % 2000001 - 1000000) / 250000.0f;
}

static float *rnd_fill(size_t n)
{
    float *a = malloc((n + 1) * sizeof *a);
    for (size_t i = 0; i < n; i++)
        a[i] = rnd();
    return a;
}

/* The stated order of stz_mm_nt, one scalar operation at a time. */
static float nt_ref(const float *x, const float *w, size_t k)
{
    float s[16] = {0};
    for (size_t p = 0; p < k; p++)
        s[p % 16] += x[p] * w[p];
    for (int half = 8; half; half /= 2)
        for (int m = 0; m < half; m++)
            s[m] += s[m + half];
    return s[0];
}

static int same_bits(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

static void test_nt_every_copy_and_thread_count(void **st)
{
    (void)st;
    for (size_t c = 0; c < 3; c++) {
        if (stz_mm_use(copies[c]))
            continue;
        for (size_t a = 0; a < NSIZES; a += 2)
            for (size_t b = 0; b < NSIZES; b += 3) {
                size_t n = sizes[a], k = sizes[b], out = sizes[(a + b) % NSIZES] + 40;
                float *X = rnd_fill(n * k), *W = rnd_fill(out * k), *Y = malloc(n * out * sizeof *Y);
                for (int threads = 1; threads <= 3; threads += 2) {
                    stz_mm_nt(Y, out, X, k, W, k, n, k, out, threads);
                    for (size_t i = 0; i < n; i++)
                        for (size_t j = 0; j < out; j++) {
                            float want = nt_ref(X + i * k, W + j * k, k);
                            if (!same_bits(&want, &Y[i * out + j], sizeof want))
                                fail_msg("%s, %zu x %zu x %zu, %d threads: (%zu, %zu) %.9g, want %.9g", copies[c], n, k,
                                         out, threads, i, j, Y[i * out + j], want);
                        }
                }
                free(X), free(W), free(Y);
            }
    }
    stz_mm_use("generic");
}

static void test_nn_every_copy_split_sums(void **st)
{
    (void)st;
    for (size_t c = 0; c < 3; c++) {
        if (stz_mm_use(copies[c]))
            continue;
        for (size_t a = 0; a < NSIZES; a += 2)
            for (size_t b = 1; b < NSIZES; b += 3) {
                size_t n = sizes[a], k = sizes[b], out = sizes[(a + 2 * b) % NSIZES] + 50;
                float *A = rnd_fill(n * k), *B = rnd_fill(k * out), *Y = rnd_fill(n * out);
                float *Y0 = malloc(n * out * sizeof *Y0), *want = malloc(n * out * sizeof *want);
                memcpy(Y0, Y, n * out * sizeof *Y);
                for (size_t i = 0; i < n; i++) /* the start, then each product in order of p */
                    for (size_t j = 0; j < out; j++) {
                        float s = Y0[i * out + j];
                        for (size_t p = 0; p < k; p++)
                            s += A[i * k + p] * B[p * out + j];
                        want[i * out + j] = s;
                    }
                size_t k1 = k / 3; /* in two calls: the bits of one */
                stz_mm_nn(Y, out, A, k, 1, B, out, n, k1, out, 1, 1);
                stz_mm_nn(Y, out, A + k1, k, 1, B + k1 * out, out, n, k - k1, out, 1, 3);
                if (!same_bits(Y, want, n * out * sizeof *Y))
                    fail_msg("%s, %zu x %zu x %zu: not the stated order", copies[c], n, k, out);
                free(A), free(B), free(Y), free(Y0), free(want);
            }
    }
    stz_mm_use("generic");
}

static void test_gram_symmetric_as_nn(void **st)
{
    (void)st;
    size_t n = 37, c = 70;
    float *X = rnd_fill(n * c), *H = calloc(c * c, sizeof *H), *G = calloc(c * c, sizeof *G);
    stz_mm_gram(H, X, n, c, 2);
    stz_mm_nn(G, c, X, 1, c, X, c, c, n, c, 1, 1); /* X^T (c, n) @ X (n, c) */
    assert_true(same_bits(H, G, c * c * sizeof *H));
    free(X), free(H), free(G);
}

/* The unblocked right-looking Cholesky factor, and forward substitution. */
static int chol_ref(double *A, size_t n)
{
    for (size_t j = 0; j < n; j++) {
        if (!(A[j * n + j] > 0))
            return -1;
        A[j * n + j] = sqrt(A[j * n + j]);
        for (size_t i = j + 1; i < n; i++)
            A[i * n + j] /= A[j * n + j];
        for (size_t i = j + 1; i < n; i++)
            for (size_t k = j + 1; k <= i; k++)
                A[i * n + k] -= A[i * n + j] * A[k * n + j];
    }
    return 0;
}

static void inverse_ref(const double *L, double *X, size_t n)
{
    memset(X, 0, n * n * sizeof *X);
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++) {
            double s = 0;
            for (size_t p = j; p < i; p++)
                s += L[i * n + p] * X[p * n + j];
            X[i * n + j] = -s / L[i * n + i];
        }
        X[i * n + i] = 1 / L[i * n + i];
    }
}

static void test_cholesky_and_inverse_as_unblocked(void **st)
{
    (void)st;
    const size_t ns[] = {1, 2, 63, 64, 65, 130, 200};
    for (size_t c = 0; c < 3; c++) {
        if (stz_mm_use(copies[c]))
            continue;
        for (size_t t = 0; t < sizeof ns / sizeof *ns; t++) {
            size_t n = ns[t], rows = n + 7;
            float *X = rnd_fill(rows * n), *H = calloc(n * n, sizeof *H);
            stz_mm_gram(H, X, rows, n, 1);
            double *A = malloc(n * n * sizeof *A), *R = malloc(n * n * sizeof *R);
            double *I = malloc(n * n * sizeof *I), *IR = malloc(n * n * sizeof *IR);
            for (size_t i = 0; i < n * n; i++)
                A[i] = R[i] = H[i] + (i % (n + 1) == 0 ? 1.0 : 0.0);
            assert_int_equal(stz_cholesky(A, n, 2), 0);
            assert_int_equal(chol_ref(R, n), 0);
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j <= i; j++)
                    if (!same_bits(&A[i * n + j], &R[i * n + j], sizeof *A))
                        fail_msg("%s, n = %zu: L(%zu, %zu) %.17g, want %.17g", copies[c], n, i, j, A[i * n + j],
                                 R[i * n + j]);
            stz_tri_inverse(A, I, n, 3);
            inverse_ref(R, IR, n);
            for (size_t i = 0; i < n; i++)
                for (size_t j = 0; j <= i; j++)
                    if (!same_bits(&I[i * n + j], &IR[i * n + j], sizeof *I))
                        fail_msg("%s, n = %zu: inverse (%zu, %zu) %.17g, want %.17g", copies[c], n, i, j, I[i * n + j],
                                 IR[i * n + j]);
            free(X), free(H), free(A), free(R), free(I), free(IR);
        }
    }
    double bad[4] = {1, 2, 2, 1}; /* not positive definite */
    assert_int_equal(stz_cholesky(bad, 2, 1), -1);
    /* a signal stops both between their blocks (issue 56: seconds on an 8192-wide one) */
    size_t n = 600;
    double *A = calloc(n * n, sizeof *A), *X = malloc(n * n * sizeof *X);
    for (size_t i = 0; i < n; i++)
        A[i * n + i] = 4;
    stz_interrupt_request();
    assert_int_equal(stz_cholesky(A, n, 1), -3);
    assert_int_equal(stz_tri_inverse(A, X, n, 1), -3);
    stz_interrupt_clear();
    for (size_t i = 0; i < n; i++) /* its first panel was factored in place */
        A[i * n + i] = 4;
    assert_int_equal(stz_cholesky(A, n, 1), 0);
    assert_int_equal(stz_tri_inverse(A, X, n, 1), 0);
    assert_true(X[0] == 0.5 && X[n * n - 1] == 0.5);
    free(A), free(X);
    stz_mm_use("generic");
}

static double ulps(float got, double want)
{
    float w = (float)want;
    return fabs((double)got - want) / (double)(nextafterf(fabsf(w), INFINITY) - fabsf(w));
}

static void test_functions_accurate(void **st)
{
    (void)st;
    double worst = 0;
    for (float x = -103.0f; x < 88.7f; x += 0.0137f)
        if (exp(x) > 1.2e-38) { /* normal results */
            double u = ulps(stz_expf(x), exp(x));
            worst = u > worst ? u : worst;
        }
    assert_true(worst <= 2.0);
    assert_true(stz_expf(0) == 1.0f && stz_expf(-200) == 0 && isinf(stz_expf(100)) && isnan(stz_expf(NAN)));
    assert_true(stz_expf(-100.0f) > 0 && stz_expf(-100.0f) < 1.2e-38f); /* subnormal */
    for (double x = -700; x < 700; x += 0.731) {
        assert_true(fabs(stz_exp(x) - exp(x)) <= 4e-16 * exp(x));
        double y = exp(x / 20);
        assert_true(fabs(stz_log(y) - log(y)) <= 4e-16 * fabs(log(y)) + 1e-300);
    }
    assert_true(stz_log(1) == 0 && isinf(stz_log(0)) && isnan(stz_log(-1)));
    for (double x = -40000; x < 40000; x += 3.7) {
        double s, c;
        stz_sincos(x, &s, &c);
        assert_true(fabs(s - sin(x)) < 1e-12 && fabs(c - cos(x)) < 1e-12);
    }
    assert_true(fabs(stz_pow(10000, -0.25) - 0.1) < 1e-16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nt_every_copy_and_thread_count),
        cmocka_unit_test(test_nn_every_copy_split_sums),
        cmocka_unit_test(test_gram_symmetric_as_nn),
        cmocka_unit_test(test_cholesky_and_inverse_as_unblocked),
        cmocka_unit_test(test_functions_accurate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
