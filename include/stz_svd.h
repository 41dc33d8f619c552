/*
 * stz_svd.h - rank-reduced SVD of a matrix, W ~= U diag(S) Vh.
 *
 * W is m x n, row-major F32. Exact: LAPACK sgesdd. Randomized (Halko,
 * Martinsson, Tropp 2011): a seeded Gaussian test matrix with oversampling,
 * q power iterations, each step renormalised by LU (sgetrf), the last basis
 * made orthonormal by QR (sgeqrf + sorgqr), then the SVD of the small
 * projected matrix. The rank is given, or the smallest that
 * keeps `energy` of the squared singular values, or the smallest whose
 * relative Frobenius error is at most `max_error`.
 */
#ifndef STZ_SVD_H
#define STZ_SVD_H

#include "stz.h"
#include "stz_experimental.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { STZ_SVD_EXACT = 0, STZ_SVD_RANDOMIZED = 1 } stz_svd_method;

typedef struct {
    stz_svd_method method;
    size_t rank;       /* > 0: this rank; 0: use energy or max_error */
    double energy;     /* in (0, 1]: keep this share of sum(S^2) */
    double max_error;  /* in [0, 1): ||W - W_r||_F / ||W||_F at most this */
    size_t oversample; /* randomized: extra columns (default 10) */
    int power_iters;   /* randomized: q (default 1) */
    uint64_t seed;
    int threads; /* OpenBLAS threads, >= 1: stz_svd sets OpenBLAS's (process-wide) count to it */
} stz_svd_params;

// clang-format off
#define STZ_SVD_PARAMS_DEFAULT {.method = STZ_SVD_EXACT, .oversample = 10, .power_iters = 1, .seed = 1, .threads = 1}
// clang-format on

typedef struct {
    size_t m, n, rank;
    float *U;         /* m x rank, row-major */
    float *S;         /* rank, descending */
    float *Vh;        /* rank x n, row-major */
    double rel_error; /* ||W - U S Vh||_F / ||W||_F before any quantization */
} stz_svd_result;

/* Factors W. On success *res owns U, S, Vh (free with stz_svd_result_free).
 * Errors: STZ_E_ARG (rank 0 or >= min(m, n), energy / max_error out of
 * range, none or several of rank / energy / max_error), STZ_E_NUMERIC
 * (NaN or Inf in W), STZ_E_NOMEM, STZ_E_LAPACK (a routine returned
 * info != 0; the message names it). */
STZ_API stz_status stz_svd_factor(const float *W, size_t m, size_t n, const stz_svd_params *p, stz_svd_result *res,
                                  stz_err *err);
STZ_API void stz_svd_result_free(stz_svd_result *res);

/* W (m x n) = U (m x r) @ diag(S) @ Vh (r x n), the same bits on every CPU
 * (stz's products, not OpenBLAS: reading SVD factors back is exact). Pass m
 * rows of U to rebuild those rows of W. STZ_E_NOMEM if its m x r work
 * buffer cannot be allocated (W is then untouched). */
STZ_API stz_status stz_svd_reconstruct(const float *U, const float *S, const float *Vh, size_t m, size_t n, size_t r,
                                       float *W);

#ifdef __cplusplus
}
#endif
#endif
