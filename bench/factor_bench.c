/* The cost of the same bits everywhere, kernel by kernel: stz's products
 * (core/matmul.c) against OpenBLAS sgemm on the Qwen2-0.5B shapes, and
 * error feedback's factorisation (stz_cholesky + stz_tri_inverse) against
 * LAPACK's dpotrf + dtrtri, on `threads` threads; best of 3 each.
 * Usage: factor_bench [THREADS] */
#include "core/stz_core.h"

#include <cblas.h>
#include <lapacke.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void openblas_set_num_threads(int num_threads);

static double since(double t0, double best)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double dt = (double)t.tv_sec + (double)t.tv_nsec * 1e-9 - t0;
    return dt < best ? dt : best;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float *filled(size_t n, unsigned seed)
{
    float *a = malloc(n * sizeof *a);
    for (size_t i = 0; i < n; i++)
        a[i] = (float)((i * 2654435761u + seed) % 2001) / 1000.0f - 1.0f;
    return a;
}

/* Y (n, out) = X (n, k) @ W (out, k)^T: GFLOP/s of stz and of sgemm */
static void product(size_t n, size_t k, size_t out, int threads)
{
    float *X = filled(n * k, 1), *W = filled(out * k, 2), *Y = malloc(n * out * sizeof *Y);
    double best_s = 1e9, best_b = 1e9, flop = 2.0 * (double)n * (double)k * (double)out;
    nanosleep(&(struct timespec){0, 300000000}, NULL); /* OpenBLAS's idle threads spin a while: let them sleep */
    for (int r = 0; r < 3; r++) {
        double t = now();
        stz_mm_nt(Y, out, X, k, W, k, n, k, out, threads);
        best_s = since(t, best_s);
    }
    for (int r = 0; r < 3; r++) {
        double t = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)out, (int)k, 1, X, (int)k, W, (int)k, 0, Y,
                    (int)out);
        best_b = since(t, best_b);
    }
    printf("| X (%zu, %zu) @ W (%zu, %zu)^T | %.1f | %.1f | %.2fx |\n", n, k, out, k, flop / best_s * 1e-9,
           flop / best_b * 1e-9, best_s / best_b);
    free(X), free(W), free(Y);
}

/* H (c, c) += X (n, c)^T @ X: stz_mm_gram against ssyrk (the upper triangle) */
static void gram(size_t n, size_t c, int threads)
{
    float *X = filled(n * c, 4), *H = calloc(c * c, sizeof *H);
    double best_s = 1e9, best_b = 1e9, flop = (double)n * (double)c * (double)(c + 1);
    nanosleep(&(struct timespec){0, 300000000}, NULL);
    for (int r = 0; r < 3; r++) {
        double t = now();
        stz_mm_gram(H, X, n, c, threads);
        best_s = since(t, best_s);
    }
    for (int r = 0; r < 3; r++) {
        double t = now();
        cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)c, (int)n, 1, X, (int)c, 1, H, (int)c);
        best_b = since(t, best_b);
    }
    printf("| H (%zu, %zu) += X (%zu, %zu)^T X | %.1f | %.1f | %.2fx |\n", c, c, n, c, flop / best_s * 1e-9,
           flop / best_b * 1e-9, best_s / best_b);
    free(X), free(H);
}

static void factor(size_t n, int threads)
{
    size_t rows = n + 64;
    float *X = filled(rows * n, 3), *H = calloc(n * n, sizeof *H);
    stz_mm_gram(H, X, rows, n, threads);
    double *A = malloc(n * n * sizeof *A), *B = malloc(n * n * sizeof *B), *Xi = malloc(n * n * sizeof *Xi);
    double best_s = 1e9, best_l = 1e9;
    nanosleep(&(struct timespec){0, 300000000}, NULL);
    for (int r = 0; r < 3; r++) {
        for (size_t i = 0; i < n * n; i++)
            A[i] = H[i] + (i % (n + 1) == 0 ? 1.0 : 0.0);
        double t = now();
        if (stz_cholesky(A, n, threads))
            abort();
        if (stz_tri_inverse(A, Xi, n, threads))
            abort();
        best_s = since(t, best_s);
    }
    for (int r = 0; r < 3; r++) {
        for (size_t i = 0; i < n * n; i++)
            B[i] = H[i] + (i % (n + 1) == 0 ? 1.0 : 0.0);
        double t = now();
        if (LAPACKE_dpotrf(LAPACK_ROW_MAJOR, 'L', (lapack_int)n, B, (lapack_int)n) ||
            LAPACKE_dtrtri(LAPACK_ROW_MAJOR, 'L', 'N', (lapack_int)n, B, (lapack_int)n))
            abort();
        best_l = since(t, best_l);
    }
    printf("| Cholesky + inverse, n = %zu | %.2f s | %.2f s | %.2fx |\n", n, best_s, best_l, best_s / best_l);
    free(X), free(H), free(A), free(B), free(Xi);
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    openblas_set_num_threads(threads);
    printf(
        "kernels: %s, %d thread(s)\n\n| product | stz GFLOP/s | OpenBLAS GFLOP/s | time ratio |\n|---|---|---|---|\n",
        stz_mm_kernels(), threads);
    product(512, 896, 896, threads);
    product(512, 896, 4864, threads);
    product(512, 4864, 896, threads);
    product(512, 896, 151936 / 8, threads);
    product(1, 896, 4864, threads);
    gram(512, 896, threads);
    gram(512, 4864, threads);
    printf("\n| factorisation | stz | LAPACK | ratio |\n|---|---|---|---|\n");
    factor(896, threads);
    factor(4864, threads);
    return 0;
}
